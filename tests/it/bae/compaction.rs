//! Compaction: `session.compact` (prompt precedence, its events and result, the paused-turn
//! rules, failures that leave the history as it was) and `auto` sessions.

use std::time::Duration;

use serde_json::{json, Value};

use super::support::{notified, types, Bae, Harness};
use crate::fake_provider::{anthropic, Reply, Step};
use crate::support::WAIT;

fn open_with(bae: &Bae, key: &str, compaction: Value, tools: &[&str]) -> Harness {
    let tools: Vec<Value> = tools.iter().map(|name| json!({ "name": name })).collect();
    Harness::open_with(bae.base(), key, json!({ "tools": tools, "compaction": compaction }))
}

/// The text of the last message the provider was sent in request `index`.
fn last_prompt(bae: &Bae, index: usize) -> String {
    let messages = bae.fake.requests()[index].body["messages"].clone();
    let last = messages.as_array().unwrap().last().unwrap().clone();
    match &last["content"] {
        Value::String(text) => text.clone(),
        blocks => blocks.as_array().unwrap().iter().filter_map(|b| b["text"].as_str()).collect(),
    }
}

#[test]
fn compact_summarizes_the_history_and_the_next_turn_starts_from_the_summary() {
    let bae = Bae::start();
    let (_, key) = bae.key_for("main", &[]);
    let mut harness = open_with(&bae, &key, json!({ "mode": "client", "prompt": "session prompt" }), &[]);
    bae.fake.script([anthropic::text_answer("one"), anthropic::text_answer("two")]);
    harness.send_message(json!("first"));
    harness.send_message(json!("second"));
    bae.fake.script([anthropic::answer(json!([{ "type": "text", "text": "SUMMARY" }]), "end_turn", 420, 9)]);
    let frames = harness.call("session.compact", json!({}));
    assert_eq!(
        types(&notified(&frames)),
        [
            "session.compaction.started",
            "provider.request",
            "provider.response",
            "server.message.send",
            "server.message.send",
            "session.compaction.completed"
        ]
    );
    let events = notified(&frames);
    let completed = &frames.last().unwrap()["result"];
    assert_eq!(completed, &events[5], "the result is the completed event");
    assert_eq!(completed["event_type"], "session.compaction.completed");
    let payload = &completed["payload"];
    assert_eq!(payload["preamble_event_id"], events[3]["id"]);
    assert_eq!(payload["summary_event_id"], events[4]["id"]);
    assert_eq!(
        (
            payload["compacted_message_count"].as_u64(),
            payload["input_tokens"].as_u64(),
            payload["summary_tokens"].as_u64()
        ),
        (Some(4), Some(420), Some(9))
    );
    assert_eq!(events[3]["payload"]["synthetic"], "compaction_preamble");
    assert!(events[4]["payload"].get("synthetic").is_none());
    assert_eq!(events[4]["payload"]["content"][0]["text"], "SUMMARY");
    assert_eq!(last_prompt(&bae, 2), "session prompt", "the session's prompt is the default");

    bae.fake.script([anthropic::text_answer("three")]);
    harness.send_message(json!("third"));
    let messages = bae.fake.requests()[3].body["messages"].clone();
    let texts: Vec<String> = messages
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"][0]["text"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(texts.len(), 3, "{messages}");
    assert_eq!(&texts[1..], ["SUMMARY", "third"]);
    assert_eq!(messages[0]["role"], "user");

    // The call's own prompt wins.
    bae.fake.script([anthropic::text_answer("S2")]);
    harness.call("session.compact", json!({ "prompt": "mine" }));
    assert_eq!(last_prompt(&bae, 4), "mine");
    let bad = harness.call("session.compact", json!({ "prompt": 5 }));
    assert_eq!(bad.last().unwrap()["error"]["code"], -32602);
}

#[test]
fn a_failed_compaction_leaves_the_history_as_it_was() {
    let bae = Bae::start();
    let (_, key) = bae.key_for("main", &[]);
    let mut harness = open_with(&bae, &key, Value::Null, &[]);
    bae.fake.script([anthropic::text_answer("one")]);
    harness.send_message(json!("first"));
    let cases = [
        // The fake is a Kestrel provider: a 500 is tried three times (two retries).
        (Reply::error(500, "down"), "compaction failed: all 3 providers failed"),
        (
            anthropic::answer(json!([{ "type": "text", "text": "cut" }]), "max_tokens", 1, 1),
            "compaction failed: summary truncated: stop_reason max_tokens",
        ),
        (
            anthropic::answer(json!([{ "type": "text", "text": "  " }]), "end_turn", 1, 1),
            "compaction failed: empty summary",
        ),
    ];
    for (reply, message) in cases {
        bae.fake.script([reply]);
        let frames = harness.call("session.compact", json!({ "prompt": null }));
        assert_eq!(frames.last().unwrap()["error"], json!({ "code": -32000, "message": message }));
    }
    bae.fake.script([anthropic::text_answer("two")]);
    harness.send_message(json!("second"));
    let sent = bae.fake.requests().last().unwrap().body["messages"].as_array().unwrap().len();
    assert_eq!(sent, 3, "the history was changed by a failed compaction");
}

#[test]
fn compact_never_waits_on_a_paused_turn_but_reclaims_an_expired_one() {
    let bae = Bae::start();
    let (_, key) = bae.key_for("main", &["t"]);
    let mut harness = open_with(&bae, &key, Value::Null, &["t"]);
    bae.fake.script([anthropic::tool_answer("tu", "t", json!({}))]);
    harness.send_message(json!("pause"));
    let refused = harness.call("session.compact", json!({}));
    assert_eq!(
        refused.last().unwrap()["error"],
        json!({ "code": -32020, "message": "turn in progress: resolve the paused turn before compacting" })
    );

    let bae = Bae::start_with(|config| config.bae.turn_timeout_secs = 0);
    let (owner_id, key) = bae.key_for("main", &["t"]);
    let mut harness = open_with(&bae, &key, Value::Null, &["t"]);
    bae.fake.script([anthropic::tool_answer("tu", "t", json!({})), anthropic::text_answer("SUMMARY")]);
    harness.send_message(json!("pause"));
    let frames = harness.call("session.compact", json!({}));
    let events = notified(&frames);
    assert_eq!(
        types(&events)[..4],
        ["session.error", "server.message.send", "tool.result", "session.compaction.started"]
    );
    assert_eq!(events[0]["payload"], json!({ "reason": "driver_turn_abandoned", "owner_client_key_id": owner_id }));
    assert_eq!(events[1]["payload"]["synthetic"], "abandoned_tool_results");
    assert_eq!(events[1]["payload"]["content"][0]["tool_use_id"], "tu");
    assert_eq!(
        events[2]["payload"],
        json!({ "tool_use_id": "tu", "dispatch": "client", "content": "Client tool call was abandoned before returning a result." })
    );
    assert_eq!(frames.last().unwrap()["result"]["event_type"], "session.compaction.completed");
}

#[test]
fn a_compact_queued_behind_a_turn_that_then_pauses_fails_at_once() {
    let bae = Bae::start();
    let (_, key) = bae.key_for("main", &["t"]);
    let mut harness = open_with(&bae, &key, Value::Null, &["t"]);
    let slow_pause = anthropic::tool_answer("tu", "t", json!({}));
    let slow_pause =
        Reply { steps: [vec![Step::Sleep(Duration::from_millis(300))], slow_pause.steps].concat(), ..slow_pause };
    bae.fake.script([slow_pause]);
    let turn = harness.start("session.sendMessage", json!({ "message": { "content": "pause slowly" } }));
    let first = turn.next(WAIT).expect("the turn starts");
    assert_eq!(first["params"]["event_type"], "provider.request");
    let compact = harness.start("session.compact", json!({}));
    let frames = compact.until_terminal();
    assert_eq!(frames.last().unwrap()["error"]["code"], -32020);
    assert_eq!(turn.until_terminal().last().unwrap()["result"]["message"]["content"][0]["dispatch"], "client");
}

#[test]
fn an_auto_session_compacts_after_a_turn_past_its_size_and_backs_off_after_a_failure() {
    let bae = Bae::start();
    let (_, key) = bae.key_for("main", &[]);
    let mut harness = open_with(&bae, &key, json!({ "mode": "auto", "size": 1000 }), &[]);
    bae.fake.script([anthropic::answer(json!([{ "type": "text", "text": "small" }]), "end_turn", 500, 400)]);
    let small = harness.send_message(json!("one"));
    assert!(!types(small.last().unwrap()["result"]["events"].as_array().unwrap())
        .iter()
        .any(|t| t.starts_with("session.compaction")));

    bae.fake.script([
        anthropic::answer(json!([{ "type": "text", "text": "big" }]), "end_turn", 900, 200),
        anthropic::text_answer("SUMMARY"),
    ]);
    let big = harness.send_message(json!("two"));
    let result = &big.last().unwrap()["result"];
    assert_eq!(result["message"]["content"][0]["text"], "big", "the turn's answer is still the result");
    let events = types(result["events"].as_array().unwrap());
    assert_eq!(events.last().unwrap(), "session.compaction.completed", "{events:?}");
    assert!(last_prompt(&bae, 2).starts_with("Summarize the conversation"), "the built-in prompt");

    // A failed automatic attempt: later automatic triggers back off.
    bae.fake.script([
        anthropic::answer(json!([{ "type": "text", "text": "big again" }]), "end_turn", 2000, 1),
        Reply::error(500, "x"),
    ]);
    let failed = harness.send_message(json!("three"));
    let events = types(failed.last().unwrap()["result"]["events"].as_array().unwrap());
    assert!(
        events.contains(&"session.compaction.started".to_string())
            && !events.contains(&"session.compaction.completed".to_string())
    );
    bae.fake.script([anthropic::answer(json!([{ "type": "text", "text": "big once more" }]), "end_turn", 2000, 1)]);
    let later = harness.send_message(json!("four"));
    assert!(!types(later.last().unwrap()["result"]["events"].as_array().unwrap())
        .iter()
        .any(|t| t.starts_with("session.compaction")));
    // A client may still compact at once.
    bae.fake.script([anthropic::text_answer("S")]);
    assert_eq!(
        harness.call("session.compact", json!({})).last().unwrap()["result"]["event_type"],
        "session.compaction.completed"
    );
}
