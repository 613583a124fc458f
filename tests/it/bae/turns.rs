//! Turns: client tools that pause and resume, the merge rules, provider failures and
//! fallbacks, the loop limit, and what the provider is sent.

use serde_json::{json, Value};

use super::support::{notified, types, Bae, Harness};
use crate::fake_provider::{anthropic, Reply};

fn last(frames: &[Value]) -> &Value {
    frames.last().unwrap()
}

#[test]
fn a_client_tool_pauses_the_turn_and_its_result_resumes_it() {
    let bae = Bae::start();
    let (key_id, key) = bae.key_for("main", &["get_current_time"]);
    let mut harness = Harness::open(bae.base(), &key, &["get_current_time"]);
    bae.fake.script([
        anthropic::tool_answer("tu_1", "get_current_time", json!({})),
        anthropic::text_answer("It is 18:26."),
    ]);
    let mut ran = Vec::new();
    let calls = harness.converse(json!("What time is it?"), |name, input| {
        ran.push((name.to_string(), input.clone()));
        json!("2026-07-06T18:26:10Z")
    });
    assert_eq!(ran, [("get_current_time".to_string(), json!({}))]);
    let paused = last(&calls[0]);
    assert_eq!(
        paused["result"]["message"],
        json!({ "role": "assistant", "content": [{ "type": "tool_use", "id": "tu_1", "name": "get_current_time", "input": {}, "dispatch": "client" }] })
    );
    assert_eq!(
        types(paused["result"]["events"].as_array().unwrap()),
        ["client.message.send", "provider.request", "provider.response", "tool.call", "server.message.send"]
    );
    let resumed = last(&calls[1]);
    assert_eq!(resumed["result"]["message"]["content"][0]["text"], "It is 18:26.");
    assert_eq!(
        types(resumed["result"]["events"].as_array().unwrap()),
        ["client.message.send", "tool.result", "provider.request", "provider.response", "server.message.send"]
    );
    let tool_result = &resumed["result"]["events"][1];
    assert_eq!(
        tool_result["payload"],
        json!({ "tool_use_id": "tu_1", "dispatch": "client", "content": "2026-07-06T18:26:10Z" })
    );
    assert_eq!(tool_result["client_key_id"], key_id.as_str());

    // What the provider got: the tool, then the history with the result; no dispatch tags.
    let requests = bae.fake.requests();
    assert_eq!(requests[0].path, "/v1/messages");
    assert_eq!(requests[0].body["tools"][0]["name"], "get_current_time");
    assert!(requests[0].body.get("stream").is_none(), "attempts are not streamed");
    let second = &requests[1].body["messages"];
    assert_eq!(
        second[1]["content"][0],
        json!({ "type": "tool_use", "id": "tu_1", "name": "get_current_time", "input": {} })
    );
    assert_eq!(
        second[2]["content"][0],
        json!({ "type": "tool_result", "tool_use_id": "tu_1", "content": "2026-07-06T18:26:10Z" })
    );
    // provider.request records the history with its dispatch tags.
    let request_event = &resumed["result"]["events"][2]["payload"];
    assert_eq!(request_event["messages"][1]["content"][0]["dispatch"], "client");
    assert_eq!((request_event["attempt"].as_u64(), request_event["kind"].as_str()), (Some(0), Some("primary")));
    assert_eq!(request_event["provider"], "anthropic");
}

#[test]
fn notifications_leave_out_what_the_caller_sent() {
    let bae = Bae::start();
    let (_, key) = bae.key_for("main", &[]);
    let mut harness = Harness::open(bae.base(), &key, &[]);
    bae.fake.script([anthropic::text_answer("hi")]);
    let frames = harness.send_message(json!("hello"));
    assert_eq!(types(&notified(&frames)), ["provider.request", "provider.response", "server.message.send"]);
    assert_eq!(frames.len(), 4);
    let terminal = last(&frames);
    assert_eq!(types(terminal["result"]["events"].as_array().unwrap())[0], "client.message.send");
    // A notification (no id) streams its events and gets no terminal frame.
    bae.fake.script([anthropic::text_answer("again")]);
    let body =
        json!({ "jsonrpc": "2.0", "method": "session.sendMessage", "params": { "message": { "content": "x" } } });
    let stream = super::support::Frames::post(bae.base(), &harness.session_id, &harness.session_key, &body.to_string());
    let frames = stream.until_terminal();
    assert!(frames.iter().all(|f| f.get("id").is_none()), "{frames:?}");
    assert_eq!(types(&notified(&frames)), ["provider.request", "provider.response", "server.message.send"]);
}

#[test]
fn a_resume_must_answer_exactly_the_paused_calls() {
    let bae = Bae::start();
    let (_, key) = bae.key_for("main", &["t"]);
    let two_calls = anthropic::answer(
        json!([{ "type": "tool_use", "id": "a", "name": "t", "input": {} }, { "type": "tool_use", "id": "b", "name": "t", "input": {} }]),
        "tool_use",
        1,
        1,
    );
    let cases = [
        (
            json!([{ "type": "tool_result", "tool_use_id": "a", "content": "x" }]),
            "no tool_result for tool_use id \"b\"",
        ),
        (
            json!([{ "type": "tool_result", "tool_use_id": "a", "content": "x" }, { "type": "tool_result", "tool_use_id": "a", "content": "y" }, { "type": "tool_result", "tool_use_id": "b", "content": "z" }]),
            "client returned a duplicate tool_result for id \"a\"",
        ),
        (json!([]), "no tool_result for tool_use id \"a\""),
    ];
    for (content, detail) in cases {
        let mut harness = Harness::open(bae.base(), &key, &["t"]);
        bae.fake.script([two_calls.clone()]);
        harness.send_message(json!("go"));
        let requests_before = bae.fake.requests().len();
        let refused = harness.send_message(content);
        assert_eq!(
            last(&refused)["error"],
            json!({ "code": -32000, "message": format!("tool result merge invalid: {detail}") })
        );
        assert_eq!(bae.fake.requests().len(), requests_before, "the provider was called");
        let events = harness.events();
        let fault = events.last().unwrap();
        assert_eq!(fault["payload"], json!({ "reason": "tool_result_merge_invalid", "detail": detail }));
        let after = harness.send_message(json!("more"));
        assert_eq!(last(&after)["error"]["message"], "session is error, not open");
    }
}

#[test]
fn a_plain_message_abandons_the_paused_calls_and_the_session_goes_on() {
    let bae = Bae::start();
    let (_, key) = bae.key_for("main", &["t"]);
    let mut harness = Harness::open(bae.base(), &key, &["t"]);
    bae.fake.script([anthropic::tool_answer("a", "t", json!({})), anthropic::text_answer("ok, something else")]);
    harness.send_message(json!("use t"));
    let frames = harness.send_message(json!("never mind"));
    let result = &last(&frames)["result"];
    assert_eq!(result["message"]["content"][0]["text"], "ok, something else");
    let sent = &result["events"][0]["payload"]["content"];
    assert_eq!(
        sent,
        &json!([{ "type": "tool_result", "tool_use_id": "a", "content": "Client tool call was abandoned before returning a result.", "is_error": true }, { "type": "text", "text": "never mind" }])
    );
    let provider_messages = &bae.fake.requests()[1].body["messages"];
    assert_eq!(provider_messages[2]["content"][0]["is_error"], true);
    assert_eq!(provider_messages[2]["content"][1]["text"], "never mind");
}

#[test]
fn tool_results_with_no_paused_turn_are_refused_and_nothing_is_recorded() {
    let bae = Bae::start();
    let (_, key) = bae.key_for("main", &["t"]);
    let mut harness = Harness::open(bae.base(), &key, &["t"]);
    let before = harness.events().len();
    let frames = harness.send_message(json!([{ "type": "tool_result", "tool_use_id": "x", "content": "late" }]));
    assert_eq!(
        last(&frames)["error"]["message"],
        "tool result merge invalid: no paused turn is awaiting tool results (it may have timed out and been retired)"
    );
    assert_eq!(harness.events().len(), before);
    bae.fake.script([anthropic::text_answer("still open")]);
    assert!(last(&harness.send_message(json!("hi")))["result"].is_object());
}

#[test]
fn a_failing_primary_falls_back_and_all_failing_ends_the_session() {
    let bae = Bae::start_with(|config| {
        // One attempt per provider, as BAE makes (a provider of BAE's own config file never
        // retries; this one is Kestrel's, told not to).
        config.providers.get_mut("fake").unwrap().max_retries = 0;
        let mut backup =
            kestrel::config::ProviderConfig::new(kestrel::config::Wire::Anthropic, "http://127.0.0.1:9/v1".to_string());
        backup.models = vec![kestrel::config::ModelConfig::named("claude-y")];
        config.providers.insert("dead".into(), backup);
    });
    let profile = bae.admin_send(
        "POST",
        "/admin/v1/profiles",
        Some(json!({ "name": "p", "primary_provider": "fake", "fallback_providers": ["missing", "fake/claude-x"] })),
    );
    let (_, key) = bae.client_key(profile.json["id"].as_str().unwrap());
    let mut harness = Harness::open(bae.base(), &key, &[]);
    bae.fake.script([Reply::error(500, "boom"), anthropic::text_answer("from the fallback")]);
    let frames = harness.send_message(json!("hi"));
    let result = &last(&frames)["result"];
    assert_eq!(result["message"]["content"][0]["text"], "from the fallback");
    let events = result["events"].as_array().unwrap();
    assert_eq!(
        types(events),
        [
            "client.message.send",
            "provider.request",
            "provider.response",
            "session.error",
            "provider.request",
            "provider.response",
            "server.message.send"
        ]
    );
    let failed = &events[2]["payload"];
    assert_eq!((failed["ok"].as_bool(), failed["status"].as_u64()), (Some(false), Some(500)));
    assert_eq!(failed["error"], "provider returned HTTP 500");
    assert!(failed["body"].as_str().unwrap().contains("boom"));
    assert_eq!(events[3]["payload"]["reason"], "provider_call_failed");
    assert_eq!(
        (events[4]["payload"]["attempt"].as_u64(), events[4]["payload"]["kind"].as_str()),
        (Some(1), Some("fallback"))
    );
    assert_eq!(events[5]["payload"]["status"], 200);
    assert_eq!(events[5]["payload"]["body"]["content"][0]["text"], "from the fallback");

    // Everything fails: a result (not an error) with the provider-unavailable message.
    bae.fake.script([Reply::error(500, "a"), Reply::error(503, "b")]);
    let frames = harness.send_message(json!("again"));
    let result = &last(&frames)["result"];
    assert_eq!(
        result["message"],
        json!({ "role": "assistant", "content": [{ "type": "text", "text": "The provider is currently unavailable." }] })
    );
    let events = result["events"].as_array().unwrap();
    assert_eq!(events.last().unwrap()["payload"], json!({ "reason": "all_providers_failed", "attempts": 2 }));
    assert!(!types(events).contains(&"server.message.send".to_string()));
    assert_eq!(last(&harness.send_message(json!("more")))["error"]["message"], "session is error, not open");
}

#[test]
fn a_model_that_never_stops_calling_unknown_tools_hits_the_loop_limit() {
    let bae = Bae::start_with(|config| config.bae.loop_limit = 3);
    let (_, key) = bae.key_for("main", &[]);
    let mut harness = Harness::open(bae.base(), &key, &[]);
    bae.fake.script((0..3).map(|i| anthropic::tool_answer(&format!("u{i}"), "unknown_tool", json!({}))));
    let frames = harness.send_message(json!("loop"));
    let events = last(&frames)["result"]["events"].as_array().unwrap().clone();
    assert_eq!(events.last().unwrap()["payload"], json!({ "reason": "loop_limit", "max_iterations": 3 }));
    let call = events.iter().find(|e| e["event_type"] == "tool.call").unwrap();
    assert_eq!(
        (call["payload"]["dispatch"].as_str(), call["payload"]["server_name"].clone()),
        (Some("mcp"), Value::Null)
    );
    let result = events.iter().find(|e| e["event_type"] == "tool.result").unwrap();
    assert_eq!(result["payload"]["is_error"], true);
    assert_eq!(result["payload"]["content"][0]["text"], "no MCP server is configured for tool 'unknown_tool'");
    // The unknown tool's rounds were sent to the provider in memory, with their results.
    assert_eq!(bae.fake.requests()[2].body["messages"].as_array().unwrap().len(), 5);
}

#[test]
fn an_openai_provider_takes_the_same_turn() {
    let bae = Bae::start_with(|config| {
        let fake = config.providers["fake"].base_url.clone();
        let mut openai = kestrel::config::ProviderConfig::new(kestrel::config::Wire::Openai, fake);
        openai.models = vec![kestrel::config::ModelConfig::named("gpt-x")];
        config.providers.insert("oa".into(), openai);
    });
    let profile = bae.admin_send(
        "POST",
        "/admin/v1/profiles",
        Some(json!({ "name": "o", "primary_provider": "oa", "allowed_tools": ["t"] })),
    );
    let (_, key) = bae.client_key(profile.json["id"].as_str().unwrap());
    let mut harness = Harness::open(bae.base(), &key, &["t"]);
    let call = json!({ "choices": [{ "message": { "role": "assistant", "content": null,
        "tool_calls": [{ "id": "call_1", "type": "function", "function": { "name": "t", "arguments": "{\"x\":1}" } }] }, "finish_reason": "tool_calls" }],
        "usage": { "prompt_tokens": 3, "completion_tokens": 2 } });
    let answer =
        json!({ "choices": [{ "message": { "role": "assistant", "content": "done" }, "finish_reason": "stop" }] });
    bae.fake.script([Reply::json(200, &call), Reply::json(200, &answer)]);
    let calls =
        harness.converse(json!("go"), |_, input| json!([{ "type": "text", "text": format!("got {}", input["x"]) }]));
    assert_eq!(last(&calls[1])["result"]["message"]["content"][0]["text"], "done");
    let requests = bae.fake.requests();
    assert_eq!(requests[0].path, "/v1/chat/completions");
    let messages = &requests[1].body["messages"];
    assert_eq!(messages[1]["tool_calls"][0]["function"]["arguments"], "{\"x\":1}");
    assert_eq!(messages[2], json!({ "role": "tool", "tool_call_id": "call_1", "content": "got 1" }));
}

/// A message is held to the Kestrel door's limits (`-32602` past them), and a long history
/// is not copied into the event log at every turn: `provider.request` keeps the stored
/// messages by id, and reading the events back shows them whole.
#[test]
fn messages_are_capped_and_the_history_is_logged_once_not_per_turn() {
    let bae = super::support::Bae::start();
    let (_, key) = bae.key_for("history", &[]);
    let mut harness = super::support::Harness::open(bae.base(), &key, &[]);
    let huge = "x".repeat(200_001);
    let refused = harness.send_message(json!(huge));
    let error = &refused.last().unwrap()["error"];
    assert_eq!(error["code"], -32602, "{error}");
    assert!(error["message"].as_str().unwrap().contains("message too large"), "{error}");

    let long = "y".repeat(150_000);
    bae.fake.script((0..6).map(|_| crate::fake_provider::anthropic::text_answer("ok")));
    harness.send_message(json!(long));
    for _ in 0..5 {
        harness.send_message(json!("two words"));
    }
    let mut db = crate::support::Db::open(&bae.server.data_dir);
    let logged = db.integer(
        "SELECT sum(length(body)) FROM events WHERE type = 'provider.request' AND session_id = ?1",
        &[&harness.session_id],
    );
    assert!(logged < 60_000, "six provider requests took {logged} bytes of log: the history was copied");
    // Read back, the last request shows the whole history, the long message first.
    let events = harness.events();
    let requests: Vec<&Value> = events.iter().filter(|e| e["event_type"] == "provider.request").collect();
    assert_eq!(requests.len(), 6);
    let messages = requests[5]["payload"]["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 11, "five turns of two messages and the new one");
    assert_eq!(messages[0]["content"].as_str().map(str::len), Some(150_000), "{}", messages[0]);
    assert_eq!(messages[10]["content"], "two words");
}

#[test]
fn a_kestrel_provider_s_failures_are_retried_in_a_bae_turn_and_each_attempt_is_recorded() {
    let bae = Bae::start();
    let (_, key) = bae.key_for("main", &[]);
    let mut harness = Harness::open(bae.base(), &key, &[]);
    bae.fake.script([Reply::error(503, "busy"), Reply::error(429, "slow down"), anthropic::text_answer("third time")]);
    let frames = harness.send_message(json!("hi"));
    let result = &last(&frames)["result"];
    assert_eq!(result["message"]["content"][0]["text"], "third time");
    let events = result["events"].as_array().unwrap();
    assert_eq!(
        types(events),
        [
            "client.message.send",
            "provider.request",
            "provider.response",
            "session.error",
            "provider.request",
            "provider.response",
            "provider.request",
            "provider.response",
            "server.message.send"
        ]
    );
    let attempts: Vec<(u64, &str)> = events
        .iter()
        .filter(|e| e["event_type"] == "provider.request")
        .map(|e| (e["payload"]["attempt"].as_u64().unwrap(), e["payload"]["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(attempts, [(0, "primary"), (1, "primary"), (2, "primary")], "retries of the primary stay primary");
    assert_eq!(events[5]["payload"]["status"], 429);
    assert_eq!(events[3]["payload"]["reason"], "provider_call_failed", "the first failure, once");
    assert_eq!(bae.fake.requests().len(), 3);
}

#[test]
fn a_kestrel_provider_s_own_fallbacks_serve_a_bae_turn() {
    let spare = crate::fake_provider::FakeProvider::start();
    let spare_url = spare.base_url.clone();
    let bae = Bae::start_with(move |config| {
        let mut backup = kestrel::config::ProviderConfig::new(kestrel::config::Wire::Anthropic, spare_url);
        backup.models = vec![kestrel::config::ModelConfig::named("claude-x")];
        config.providers.insert("spare".into(), backup);
        let fake = config.providers.get_mut("fake").unwrap();
        fake.max_retries = 0;
        fake.fallbacks = vec!["spare".into()];
    });
    let (_, key) = bae.key_for("main", &[]);
    let mut harness = Harness::open(bae.base(), &key, &[]);
    bae.fake.script([Reply::error(500, "down")]);
    spare.script([anthropic::text_answer("from the spare")]);
    let frames = harness.send_message(json!("hi"));
    let result = &last(&frames)["result"];
    assert_eq!(result["message"]["content"][0]["text"], "from the spare");
    let requests: Vec<&Value> =
        result["events"].as_array().unwrap().iter().filter(|e| e["event_type"] == "provider.request").collect();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        (requests[1]["payload"]["attempt"].as_u64(), requests[1]["payload"]["kind"].as_str()),
        (Some(1), Some("fallback"))
    );
    assert_eq!(spare.requests().len(), 1, "the provider's configured fallback was asked");
}
