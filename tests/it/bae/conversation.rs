//! A whole conversation the way BAE's harnesses hold one: two drivers with their own tools
//! taking turns, an observer following live, and everything still there after a restart.

use serde_json::{json, Value};

use super::support::{send, types, Bae, Harness};
use crate::fake_provider::anthropic;
use crate::support::WAIT;

#[test]
fn two_drivers_and_an_observer_hold_a_multi_turn_tool_conversation() {
    let mut bae = Bae::start();
    let profile = bae.profile("team", &["get_current_time", "read_file"]);
    let (a_id, a_key) = bae.client_key(&profile);
    let (b_id, b_key) = bae.client_key(&profile);
    let (_, watcher_key) = bae.client_key(&profile);
    let mut a = Harness::open(bae.base(), &a_key, &["get_current_time"]);
    let mut b = Harness::join(bae.base(), &a.session_id, &b_key, &["read_file"]);
    let joined = send(
        bae.base(),
        "POST",
        &format!("/api/v1/sessions/{}/join", a.session_id),
        Some(&watcher_key),
        Some(json!({})),
    );
    let mut observer = Harness {
        base: bae.base().into(),
        session_id: a.session_id.clone(),
        session_key: joined.json["session_key"].as_str().unwrap().into(),
        next_id: 1,
    };
    let live = observer.start("session.subscribe", json!({}));

    bae.fake.script([
        anthropic::tool_answer("tu_1", "get_current_time", json!({})),
        anthropic::text_answer("It is noon."),
        // B's turn: B's tool, and A's tool too, which in B's turn no client runs.
        anthropic::answer(
            json!([{ "type": "tool_use", "id": "tu_2", "name": "read_file", "input": { "path": "notes.txt" } },
                   { "type": "tool_use", "id": "tu_3", "name": "get_current_time", "input": {} }]),
            "tool_use",
            10,
            5,
        ),
        anthropic::text_answer("The notes say hello."),
        anthropic::tool_answer("tu_4", "get_current_time", json!({})),
        anthropic::text_answer("Still noon."),
    ]);
    let mut ran = Vec::new();
    let first = a.converse(json!("What time is it?"), |name, _| {
        ran.push(format!("a:{name}"));
        json!("12:00")
    });
    let second = b.converse(json!("Read my notes"), |name, input| {
        ran.push(format!("b:{name}:{}", input["path"].as_str().unwrap_or("")));
        json!([{ "type": "text", "text": "hello" }])
    });
    let third = a.converse(json!("And now?"), |name, _| {
        ran.push(format!("a:{name}"));
        json!("12:01")
    });
    assert_eq!(ran, ["a:get_current_time", "b:read_file:notes.txt", "a:get_current_time"]);
    assert_eq!(first.len(), 2);
    assert_eq!(second[0].last().unwrap()["result"]["message"]["content"][1]["dispatch"], "mcp");
    assert_eq!(third.last().unwrap().last().unwrap()["result"]["message"]["content"][0]["text"], "Still noon.");

    // The observer saw every event after it subscribed, in order, as the history has them.
    let history = a.events();
    let start = history.iter().position(|e| e["event_type"] == "client.message.send").unwrap();
    let mut seen = Vec::new();
    while seen.len() < history.len() - start {
        seen.push(live.next(WAIT).expect("the observer's next event")["params"].clone());
    }
    assert_eq!(seen, history[start..].to_vec());
    let authors: Vec<&str> = history
        .iter()
        .filter(|e| e["event_type"] == "client.message.send")
        .map(|e| e["client_key_id"].as_str().unwrap())
        .collect();
    assert_eq!(authors, [a_id.as_str(), a_id.as_str(), b_id.as_str(), b_id.as_str(), a_id.as_str(), a_id.as_str()]);
    // In B's turn the server answered the call no client of that turn could run.
    let unrouted =
        history.iter().find(|e| e["event_type"] == "tool.result" && e["payload"]["tool_use_id"] == "tu_3").unwrap();
    assert_eq!(unrouted["payload"]["is_error"], true);
    let merged = history.iter().filter(|e| e["event_type"] == "client.message.send").nth(3).unwrap();
    let ids: Vec<&Value> = merged["payload"]["content"].as_array().unwrap().iter().map(|b| &b["tool_use_id"]).collect();
    assert_eq!(ids, [&json!("tu_2"), &json!("tu_3")], "the server's result is merged in the call's order");

    // A restart keeps the session open and its history; drivers register again.
    drop(live);
    bae.restart();
    a.base = bae.base().to_string();
    let after = a.events();
    assert_eq!(types(&after), types(&history));
    let refused = a.send_message(json!("hello again"));
    assert_eq!(refused.last().unwrap()["error"]["code"], -32001);
    assert_eq!(a.get("/participants").json, json!({ "drivers": [] }));
    a.call("session.registerDriver", json!({}));
    bae.fake.script([anthropic::text_answer("Welcome back.")]);
    let resumed = a.send_message(json!("hello again"));
    assert_eq!(resumed.last().unwrap()["result"]["message"]["content"][0]["text"], "Welcome back.");
    let messages = bae.fake.requests().last().unwrap().body["messages"].as_array().unwrap().len();
    assert_eq!(messages, 13, "the whole conversation reached the provider after the restart");
}
