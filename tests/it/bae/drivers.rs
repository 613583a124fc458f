//! Several drivers on one session: the registration gate, FIFO turns, ownership of a paused
//! turn and its deadline, per-turn tool scoping; watchers with replay and unsubscribe.

use std::time::Duration;

use serde_json::{json, Value};

use super::support::{notified, send, types, Bae, Frames, Harness};
use crate::fake_provider::anthropic;
use crate::support::WAIT;

/// Long enough to see that a queued caller really is silent.
const QUIET: Duration = Duration::from_millis(300);

fn result(frames: &[Value]) -> &Value {
    &frames.last().unwrap()["result"]
}

fn two_drivers(
    bae: &Bae,
    tools: &[&str],
    first_tools: &[&str],
    second_tools: &[&str],
) -> (Harness, Harness, String, String) {
    let profile = bae.profile("main", tools);
    let (first_id, first) = bae.client_key(&profile);
    let (second_id, second) = bae.client_key(&profile);
    let a = Harness::open(bae.base(), &first, first_tools);
    let b = Harness::join(bae.base(), &a.session_id, &second, second_tools);
    (a, b, first_id, second_id)
}

#[test]
fn only_registered_drivers_may_send_and_registration_needs_an_open_session() {
    let bae = Bae::start();
    let (_, key) = bae.key_for("main", &[]);
    let opened = send(bae.base(), "POST", "/api/v1/sessions", Some(&key), Some(json!({})));
    let mut harness = Harness {
        base: bae.base().into(),
        session_id: opened.json["session_id"].as_str().unwrap().into(),
        session_key: opened.json["session_key"].as_str().unwrap().into(),
        next_id: 1,
    };
    let refused = harness.send_message(json!("hi"));
    assert_eq!(
        refused.last().unwrap()["error"],
        json!({ "code": -32001, "message": "call session.registerDriver before session.sendMessage" })
    );
    let compact = harness.call("session.compact", json!({}));
    assert_eq!(compact.last().unwrap()["error"]["message"], "call session.registerDriver before session.compact");
    let tools = harness.call("session.updateClientTools", json!({ "tools": [] }));
    assert_eq!(tools.last().unwrap()["error"]["code"], -32001);
    assert!(bae.fake.requests().is_empty());
    send(bae.base(), "DELETE", &format!("/api/v1/sessions/{}", harness.session_id), Some(&harness.session_key), None);
    let late = harness.call("session.registerDriver", json!({}));
    assert_eq!(late.last().unwrap()["error"], json!({ "code": -32000, "message": "session is closed, not open" }));
}

#[test]
fn two_drivers_take_turns_in_arrival_order_and_a_queued_one_hears_nothing() {
    let bae = Bae::start();
    let (mut a, mut b, a_id, b_id) = two_drivers(&bae, &["t"], &["t"], &[]);
    bae.fake.script([anthropic::tool_answer("tu_a", "t", json!({}))]);
    let paused = a.send_message(json!("a asks"));
    assert_eq!(result(&paused)["message"]["content"][0]["dispatch"], "client");

    // B arrives while A's turn is paused: it waits, with headers and zero bytes.
    let queued = b.start("session.sendMessage", json!({ "message": { "content": "b asks" } }));
    assert_eq!(queued.status, 200);
    assert!(queued.silent_for(QUIET), "a queued driver heard something");

    // A, the owner, continues first; B's turn runs once A's is over.
    bae.fake.script([anthropic::text_answer("done for a"), anthropic::text_answer("done for b")]);
    let resumed = a.send_message(json!([{ "type": "tool_result", "tool_use_id": "tu_a", "content": "ok" }]));
    assert_eq!(result(&resumed)["message"]["content"][0]["text"], "done for a");
    let b_frames = queued.until_terminal();
    assert_eq!(result(&b_frames)["message"]["content"][0]["text"], "done for b");
    // B's stream carries only what happened once it held the gate.
    assert!(notified(&b_frames).iter().all(|e| e["client_key_id"] == b_id.as_str()), "{b_frames:?}");

    let history = a.events();
    let turns: Vec<(String, String)> = history
        .iter()
        .filter(|e| e["event_type"] == "client.message.send")
        .map(|e| (e["client_key_id"].as_str().unwrap().to_string(), e["payload"]["content"].to_string()))
        .collect();
    assert_eq!(
        turns.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        [a_id.as_str(), a_id.as_str(), b_id.as_str()]
    );
    // Each turn's provider call saw only its acting driver's tools.
    let requests = bae.fake.requests();
    assert_eq!(requests[0].body["tools"][0]["name"], "t");
    assert!(requests[2].body.get("tools").is_none_or(|t| t.as_array().unwrap().is_empty()), "{:?}", requests[2].body);
}

#[test]
fn a_paused_turn_past_its_deadline_is_reclaimed_by_the_next_driver() {
    let bae = Bae::start_with(|config| config.bae.turn_timeout_secs = 0);
    let (mut a, mut b, a_id, _) = two_drivers(&bae, &["t"], &["t"], &[]);
    bae.fake.script([anthropic::tool_answer("tu_a", "t", json!({})), anthropic::text_answer("b's answer")]);
    a.send_message(json!("a asks"));
    let frames = b.send_message(json!("b takes over"));
    let result = result(&frames);
    assert_eq!(result["message"]["content"][0]["text"], "b's answer");
    // The abandonment is recorded before B's turn, attributed to A, and is not B's event.
    assert_eq!(types(result["events"].as_array().unwrap())[0], "client.message.send");
    let sent = &result["events"][0]["payload"]["content"];
    assert_eq!(sent[0]["content"], "Client tool call was abandoned before returning a result.");
    assert_eq!(sent[1], json!({ "type": "text", "text": "b takes over" }));
    let history = a.events();
    let abandoned = history.iter().find(|e| e["payload"]["reason"] == "driver_turn_abandoned").unwrap();
    assert_eq!(abandoned["payload"]["owner_client_key_id"], a_id.as_str());
    assert_eq!(abandoned["client_key_id"], a_id.as_str());
    // A comes back late with its result: the pause is gone.
    let late = a.send_message(json!([{ "type": "tool_result", "tool_use_id": "tu_a", "content": "late" }]));
    assert!(late.last().unwrap()["error"]["message"].as_str().unwrap().contains("no paused turn"));
}

#[test]
fn a_watcher_sees_every_turn_live_and_a_replay_has_no_gap_and_no_duplicate() {
    let bae = Bae::start();
    let (mut a, mut b, _, _) = two_drivers(&bae, &[], &[], &[]);
    let watch = b.start("session.subscribe", json!({}));
    bae.fake.script([anthropic::text_answer("one")]);
    a.send_message(json!("first"));
    let mut live = Vec::new();
    while live.last().is_none_or(|e: &Value| e["event_type"] != "server.message.send") {
        let frame = watch.next(WAIT).expect("a live event");
        assert_eq!(frame["method"], "session.event");
        live.push(frame["params"].clone());
    }
    // The watcher gets the sender's own message too.
    assert_eq!(types(&live), ["client.message.send", "provider.request", "provider.response", "server.message.send"]);

    // Replay from the middle, then live: nothing missed, nothing twice.
    let since = live[1]["id"].as_str().unwrap().to_string();
    let replay = b.start("session.subscribe", json!({ "since_event_id": since }));
    bae.fake.script([anthropic::text_answer("two")]);
    a.send_message(json!("second"));
    let mut seen = Vec::new();
    while seen.len() < 2 + 4 {
        seen.push(replay.next(WAIT).expect("a replayed or live event")["params"].clone());
    }
    let ids: Vec<&str> = seen.iter().map(|e| e["id"].as_str().unwrap()).collect();
    let mut unique = ids.clone();
    unique.dedup();
    assert_eq!(ids, unique);
    assert_eq!(
        types(&seen),
        [
            "provider.response",
            "server.message.send",
            "client.message.send",
            "provider.request",
            "provider.response",
            "server.message.send"
        ]
    );
    // An id of another session, or no id at all, replays from the start.
    let (_, other_key) = bae.key_for("other", &[]);
    let other = Harness::open(bae.base(), &other_key, &[]);
    let foreign = other.events()[0]["id"].as_str().unwrap().to_string();
    let from_start = b.start("session.subscribe", json!({ "since_event_id": foreign }));
    assert_eq!(from_start.next(WAIT).unwrap()["params"]["event_type"], "session.open");
    let bogus = b.start("session.subscribe", json!({ "since_event_id": "evt_bogus" }));
    let first = bogus.next(WAIT).unwrap()["params"].clone();
    assert_eq!(
        (first["event_type"].as_str(), first["session_id"].as_str()),
        (Some("session.open"), Some(a.session_id.as_str()))
    );

    // Unsubscribe, from any connection, ends every watcher without a terminal frame.
    let done = a.call("session.unsubscribe", json!({}));
    assert_eq!(done.last().unwrap()["result"], json!({ "unsubscribed": true }));
    for stream in [&watch, &replay, &from_start, &bogus] {
        stream.wait_end();
    }
}

#[test]
fn closing_the_session_ends_watchers_and_wakes_queued_drivers() {
    let bae = Bae::start();
    let (mut a, mut b, _, _) = two_drivers(&bae, &["t"], &["t"], &[]);
    let watch = b.start("session.subscribe", json!({}));
    bae.fake.script([anthropic::tool_answer("tu", "t", json!({}))]);
    a.send_message(json!("pause"));
    let queued = b.start("session.sendMessage", json!({ "message": { "content": "waiting" } }));
    assert!(queued.silent_for(QUIET));
    let closed = send(bae.base(), "DELETE", &format!("/api/v1/sessions/{}", a.session_id), Some(&a.session_key), None);
    assert_eq!(closed.status, 200);
    let frames = queued.until_terminal();
    assert_eq!(frames.last().unwrap()["error"], json!({ "code": -32000, "message": "session is closed, not open" }));
    let mut last = Value::Null;
    while let Some(frame) = watch.next(WAIT) {
        last = frame;
    }
    assert_eq!(last["params"]["event_type"], "session.close");
}

#[test]
fn update_client_tools_replaces_the_callers_tools_for_the_next_turn() {
    let bae = Bae::start();
    let (_, key) = bae.key_for("main", &["a", "b"]);
    let mut harness = Harness::open(bae.base(), &key, &["a"]);
    let bad = harness.call("session.updateClientTools", json!({ "tools": [{ "name": "zzz" }] }));
    assert_eq!(
        bad.last().unwrap()["error"],
        json!({ "code": -32015, "message": "tool_not_allowed: tool \"zzz\" is not in the profile's allowlist" })
    );
    let reserved =
        harness.call("session.updateClientTools", json!({ "tools": [{ "name": "remote_subagent_status" }] }));
    assert_eq!(reserved.last().unwrap()["error"]["code"], -32015);
    let missing = harness.call("session.updateClientTools", json!({}));
    assert_eq!(missing.last().unwrap()["error"]["code"], -32602);
    let blank = harness.call("session.updateClientTools", json!({ "tools": [{ "name": " " }] }));
    assert_eq!(blank.last().unwrap()["error"]["code"], -32602);
    let ok = harness.call("session.updateClientTools", json!({ "tools": [{ "name": "b", "description": "B" }] }));
    assert_eq!(ok.last().unwrap()["result"], json!({ "updated": true }));
    bae.fake.script([anthropic::text_answer("fine")]);
    harness.send_message(json!("go"));
    let tools = &bae.fake.requests()[0].body["tools"];
    assert_eq!(tools.as_array().unwrap().len(), 1);
    assert_eq!((tools[0]["name"].as_str(), tools[0]["description"].as_str()), (Some("b"), Some("B")));
}

#[test]
fn json_rpc_envelope_errors_and_unknown_methods_answer_200_ndjson() {
    let bae = Bae::start();
    let (_, key) = bae.key_for("main", &[]);
    let harness = Harness::open(bae.base(), &key, &[]);
    let post = |body: &str| Frames::post(bae.base(), &harness.session_id, &harness.session_key, body);
    let cases: [(&str, Value); 7] = [
        ("{not json", json!({ "jsonrpc": "2.0", "id": null, "error": { "code": -32700, "message": "Parse error" } })),
        (
            "[]",
            json!({ "jsonrpc": "2.0", "id": null, "error": { "code": -32600, "message": "Invalid Request: batch requests are not supported" } }),
        ),
        ("\"x\"", json!({ "jsonrpc": "2.0", "id": null, "error": { "code": -32600, "message": "Invalid Request" } })),
        (
            r#"{"jsonrpc":"1.0","id":7,"method":"m"}"#,
            json!({ "jsonrpc": "2.0", "id": 7, "error": { "code": -32600, "message": "Invalid Request: missing or wrong \"jsonrpc\" version" } }),
        ),
        (
            r#"{"jsonrpc":"2.0","id":"s","method":5}"#,
            json!({ "jsonrpc": "2.0", "id": "s", "error": { "code": -32600, "message": "Invalid Request: missing \"method\"" } }),
        ),
        (
            r#"{"jsonrpc":"2.0","id":{"k":1},"method":"session.nope"}"#,
            json!({ "jsonrpc": "2.0", "id": { "k": 1 }, "error": { "code": -32601, "message": "Method not found: session.nope" } }),
        ),
        (
            r#"{"jsonrpc":"2.0","id":9,"method":"session.cancelSubagent","params":{"subagent_id":"x"}}"#,
            json!({ "jsonrpc": "2.0", "id": 9, "error": { "code": -32014, "message": "subagent_not_found: no tracked subagent \"x\" for this session" } }),
        ),
    ];
    for (body, expected) in cases {
        let frames = post(body);
        assert_eq!(frames.status, 200);
        assert_eq!(frames.until_terminal(), vec![expected], "{body}");
    }
    // Notifications with bad envelopes get no frame at all.
    let silent = post(r#"{"jsonrpc":"2.0","method":"session.nope"}"#);
    silent.wait_end();
    assert!(silent.next(Duration::ZERO).is_none());
    let params = post(r#"{"jsonrpc":"2.0","id":3,"method":"session.sendMessage","params":{}}"#).until_terminal();
    assert_eq!(params[0]["error"], json!({ "code": -32602, "message": "Invalid params: missing \"message\"" }));
}

#[test]
fn a_local_sandbox_report_is_checked_and_becomes_the_lifecycle_event() {
    let bae = Bae::start();
    let profile = bae.profile("local", &[]);
    let ((_, key), (_, other_key)) = (bae.client_key(&profile), bae.client_key(&profile));
    let mut harness = Harness::open(bae.base(), &key, &[]);
    let report = |harness: &mut Harness, params: serde_json::Value| {
        harness.call("session.reportLocalSandbox", params).last().unwrap().clone()
    };
    let running = report(&mut harness, json!({ "state": "running", "image": "python:3.12", "container_id": "abc123" }));
    assert_eq!(running["result"], json!({ "reported": true }), "{running}");
    let stopped = report(&mut harness, json!({ "state": "stopped", "image": null, "unsandboxed": true }));
    assert_eq!(stopped["result"]["reported"], true, "{stopped}");
    let failed = report(&mut harness, json!({ "state": "error", "image": "any/unregistered:tag", "detail": "oom" }));
    assert_eq!(failed["result"]["reported"], true);
    for bad in [
        json!({ "state": "paused", "image": "x" }),
        json!({ "state": "running" }),
        json!({ "state": "running", "image": null }),
        json!({ "state": "running", "image": "x", "unsandboxed": "yes" }),
        json!({ "state": "running", "image": "x", "container_id": 7 }),
    ] {
        let answer = report(&mut harness, bad.clone());
        assert_eq!(answer["error"]["code"], -32602, "{bad}: {answer}");
    }
    let events: Vec<serde_json::Value> = harness
        .events()
        .into_iter()
        .filter(|e| e["event_type"].as_str().unwrap().starts_with("session.sandbox"))
        .collect();
    assert_eq!(types(&events), ["session.sandbox.running", "session.sandbox.stopped", "session.sandbox.error"]);
    assert_eq!(
        events[0]["payload"],
        json!({ "dispatch": "local", "image": "python:3.12", "unsandboxed": false, "container_id": "abc123", "detail": null })
    );
    assert_eq!(events[1]["payload"]["unsandboxed"], true);
    assert_eq!(events[2]["payload"]["detail"], "oom");

    // Only a registered driver may report: another client that joined but did not register.
    let joined = super::support::send(
        bae.base(),
        "POST",
        &format!("/api/v1/sessions/{}/join", harness.session_id),
        Some(&other_key),
        Some(json!({})),
    );
    assert_eq!(joined.status, 201, "{}", joined.text);
    let body =
        r#"{"jsonrpc":"2.0","id":1,"method":"session.reportLocalSandbox","params":{"state":"running","image":"x"}}"#;
    let session_key = joined.json["session_key"].as_str().unwrap();
    let frames = Frames::post(bae.base(), &harness.session_id, session_key, body).until_terminal();
    assert_eq!(frames.last().unwrap()["error"]["code"], -32001, "{frames:?}");
}
