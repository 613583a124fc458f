//! Real providers end to end: Kestrel → the fake provider's wire formats → Kestrel's events.

use std::time::{Duration, Instant};

use base64::Engine as _;
use kestrel::config::{ModelConfig, ProviderConfig, Wire};
use serde_json::{json, Value};

use crate::fake_provider::{anthropic, openai, FakeProvider, Reply, Step};
use crate::support::{event_type, is_run_end, TestServer};

const KEY: &str = "sk-test-very-secret-key";

fn provider(wire: Wire, fake: &FakeProvider, models: &[&str]) -> ProviderConfig {
    let mut provider = ProviderConfig::new(wire, fake.base_url.clone());
    provider.api_key = Some(KEY.into());
    provider.timeout_secs = 30;
    provider.idle_timeout_secs = 5;
    provider.retry_base_delay_ms = 10;
    provider.retry_max_wait_secs = 5;
    provider.models = models
        .iter()
        .map(|name| ModelConfig { context_window: Some(32_768), supports_reasoning: true, ..ModelConfig::named(*name) })
        .collect();
    provider
}

fn server_with(providers: Vec<(&str, ProviderConfig)>) -> TestServer {
    TestServer::start_with(|config| {
        for (name, provider) in providers {
            config.providers.insert(name.to_string(), provider);
        }
    })
}

/// Runs one message in a new session of `model`; returns the session id and the run's events.
fn run(server: &TestServer, model: &str, body: Value) -> (String, Vec<Value>) {
    let id = server.create_session(json!({ "model": model, "systemPrompt": "You are terse." }));
    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    let response = server.post(&format!("/api/sessions/{id}/messages"), body);
    assert_eq!(response.status, 202, "{}", response.text);
    let events = stream.collect_until(is_run_end);
    (id, events)
}

fn deltas(events: &[Value], channel: &str) -> String {
    events
        .iter()
        .filter(|e| event_type(e) == "message.delta" && e["event"]["channel"] == channel)
        .map(|e| e["event"]["delta"].as_str().unwrap())
        .collect()
}

fn assert_no_key(events: &[Value], server: &TestServer) {
    for event in events {
        assert!(!event.to_string().contains(KEY), "the key leaked into {event}");
    }
    assert!(!server.get("/api/config").text.contains(KEY), "the key leaked into /api/config");
}

#[test]
fn openai_text_reasoning_and_usage_survive_a_byte_by_byte_stream() {
    let fake = FakeProvider::start();
    let body = openai::text(&["Thinking ", "hard…"], &["Hé", "llo ", "🦀 world"], &openai::usage(120, 7, 100, 3));
    fake.script([Reply::byte_by_byte(body.as_bytes())]);
    let server = server_with(vec![("local", provider(Wire::Openai, &fake, &["qwen-test"]))]);
    let png = base64::engine::general_purpose::STANDARD.encode(b"\x89PNG fake");
    let (id, events) = run(
        &server,
        "local/qwen-test",
        json!({ "content": "describe", "images": [{ "mimeType": "image/png", "data": png }] }),
    );

    assert_eq!(deltas(&events, "reasoning"), "Thinking hard…");
    assert_eq!(deltas(&events, "text"), "Héllo 🦀 world");
    let finished = events.last().unwrap();
    assert_eq!(event_type(finished), "run.finished", "{finished}");
    assert_eq!(
        finished["event"]["usage"],
        json!({ "inputTokens": 120, "outputTokens": 7, "totalTokens": 127, "cachedInputTokens": 100, "reasoningTokens": 3 })
    );
    let stored = &server.get(&format!("/api/sessions/{id}")).json["session"]["messages"][1];
    assert_eq!(stored["content"], "Héllo 🦀 world");
    assert_eq!(stored["reasoning"], "Thinking hard…");
    assert_eq!(stored["model"], "local/qwen-test");

    let request = &fake.requests()[0];
    assert_eq!(request.path, "/v1/chat/completions");
    assert_eq!(request.header("authorization"), Some(format!("Bearer {KEY}").as_str()));
    assert_eq!(request.body["model"], "qwen-test");
    assert_eq!(request.body["stream"], true);
    assert_eq!(request.body["stream_options"]["include_usage"], true);
    assert_eq!(request.body["messages"][0], json!({ "role": "system", "content": "You are terse." }));
    let user = &request.body["messages"][1];
    assert_eq!(user["role"], "user");
    assert_eq!(user["content"][0], json!({ "type": "text", "text": "describe" }));
    assert_eq!(user["content"][1]["image_url"]["url"], format!("data:image/png;base64,{png}"));
    let tools = request.body["tools"].as_array().unwrap();
    let read_file = tools.iter().find(|t| t["function"]["name"] == "read_file").expect("read_file is offered");
    assert_eq!(read_file["type"], "function");
    assert_eq!(read_file["function"]["parameters"]["required"], json!(["path"]));
    assert_no_key(&events, &server);
}

#[test]
fn openai_parallel_tool_calls_assemble_from_pieces_and_results_go_back() {
    let fake = FakeProvider::start();
    let mut first = openai::chunk(json!({ "role": "assistant", "content": null }), None);
    first.push_str(&openai::chunk(
        json!({ "tool_calls": [{ "index": 0, "id": "call_a", "type": "function", "function": { "name": "lookup", "arguments": "" } }] }),
        None,
    ));
    for piece in ["{\"qu", "ery\": \"ru", "st\", \"li", "mit\": 3}"] {
        first.push_str(&openai::chunk(
            json!({ "tool_calls": [{ "index": 0, "function": { "arguments": piece } }] }),
            None,
        ));
    }
    first.push_str(&openai::chunk(
        json!({ "tool_calls": [{ "index": 1, "id": "call_b", "type": "function", "function": { "name": "other", "arguments": "{}" } }] }),
        None,
    ));
    first.push_str(&openai::chunk(json!({}), Some("tool_calls")));
    first.push_str(&openai::usage(50, 20, 0, 0));
    first.push_str(openai::DONE);
    let second = openai::text(&[], &["All ", "done."], &openai::usage(80, 5, 40, 0));
    fake.script([Reply::stream(first.as_bytes(), 17), Reply::stream(second.as_bytes(), 3)]);
    let server = server_with(vec![("local", provider(Wire::Openai, &fake, &["m"]))]);
    let (_, events) = run(&server, "local/m", json!({ "content": "use tools" }));

    let calls: Vec<&Value> =
        events.iter().filter(|e| event_type(e) == "tool.started").map(|e| &e["event"]["call"]).collect();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0]["id"], "call_a");
    assert_eq!(calls[0]["arguments"], json!({ "query": "rust", "limit": 3 }));
    assert_eq!(calls[1]["name"], "other");
    assert_eq!(deltas(&events, "text"), "All done.");
    let usage = &events.last().unwrap()["event"]["usage"];
    assert_eq!(usage["inputTokens"], 130, "usage sums both provider calls");
    assert_eq!(usage["outputTokens"], 25);
    assert_eq!(usage["cachedInputTokens"], 40);

    let follow_up = &fake.requests()[1].body["messages"];
    let assistant = &follow_up[2];
    assert_eq!(assistant["role"], "assistant");
    assert_eq!(assistant["tool_calls"][0]["id"], "call_a");
    assert_eq!(assistant["tool_calls"][0]["type"], "function");
    let arguments: Value =
        serde_json::from_str(assistant["tool_calls"][0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({ "query": "rust", "limit": 3 }));
    assert_eq!(follow_up[3]["role"], "tool");
    assert_eq!(follow_up[3]["tool_call_id"], "call_a");
    assert!(follow_up[3]["content"].as_str().unwrap().contains("Unknown tool"));
    assert_eq!(follow_up[4]["tool_call_id"], "call_b");
}

#[test]
fn anthropic_thinking_text_and_tool_use_with_cache_usage() {
    let fake = FakeProvider::start();
    let mut first = anthropic::message_start(10, 200, 30);
    first.push_str(&anthropic::ping());
    first.push_str(&anthropic::block_start(0, json!({ "type": "thinking", "thinking": "" })));
    first.push_str(&anthropic::block_delta(0, json!({ "type": "thinking_delta", "thinking": "Let me look ✓" })));
    first.push_str(&anthropic::block_delta(0, json!({ "type": "signature_delta", "signature": "sig" })));
    first.push_str(&anthropic::block_stop(0));
    first.push_str(&anthropic::text(1, &["Checking ", "now."]));
    first.push_str(&anthropic::block_start(
        2,
        json!({ "type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {} }),
    ));
    for piece in ["{\"pa", "th\": \"src/", "main.rs\"}"] {
        first.push_str(&anthropic::block_delta(2, json!({ "type": "input_json_delta", "partial_json": piece })));
    }
    first.push_str(&anthropic::block_stop(2));
    first.push_str(&anthropic::message_end("tool_use", 40));
    let mut second = anthropic::message_start(300, 0, 0);
    second.push_str(&anthropic::text(0, &["Fine."]));
    second.push_str(&anthropic::message_end("end_turn", 3));
    fake.script([Reply::byte_by_byte(first.as_bytes()), Reply::stream(second.as_bytes(), 2)]);
    let mut config = provider(Wire::Anthropic, &fake, &["claude-test"]);
    config.models[0].max_tokens = Some(1234);
    let server = server_with(vec![("claude", config)]);
    let jpeg = base64::engine::general_purpose::STANDARD.encode(b"\xff\xd8 fake jpeg");
    let (_, events) = run(
        &server,
        "claude/claude-test",
        json!({ "content": "look", "images": [{ "mimeType": "image/jpeg", "data": jpeg }] }),
    );

    assert_eq!(deltas(&events, "reasoning"), "Let me look ✓");
    assert_eq!(deltas(&events, "text"), "Checking now.Fine.");
    let call = &events.iter().find(|e| event_type(e) == "tool.started").unwrap()["event"]["call"];
    assert_eq!(call["id"], "toolu_1");
    assert_eq!(call["arguments"], json!({ "path": "src/main.rs" }));
    let usage = &events.last().unwrap()["event"]["usage"];
    assert_eq!(usage["inputTokens"], 240 + 300, "input counts cache reads and writes");
    assert_eq!(usage["cachedInputTokens"], 200);
    assert_eq!(usage["outputTokens"], 43);

    let requests = fake.requests();
    let first_request = &requests[0];
    assert_eq!(first_request.path, "/v1/messages");
    assert_eq!(first_request.header("x-api-key"), Some(KEY));
    assert_eq!(first_request.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(first_request.body["system"], "You are terse.");
    assert_eq!(first_request.body["max_tokens"], 1234);
    assert_eq!(first_request.body["model"], "claude-test");
    let content = &first_request.body["messages"][0]["content"];
    assert_eq!(content[0]["source"], json!({ "type": "base64", "media_type": "image/jpeg", "data": jpeg }));
    assert_eq!(content[1], json!({ "type": "text", "text": "look" }));
    let follow_up = &requests[1].body["messages"];
    assert_eq!(follow_up[1]["role"], "assistant");
    assert_eq!(
        follow_up[1]["content"][1],
        json!({ "type": "tool_use", "id": "toolu_1", "name": "read_file", "input": { "path": "src/main.rs" } })
    );
    assert_eq!(follow_up[2]["role"], "user");
    assert_eq!(follow_up[2]["content"][0]["type"], "tool_result");
    assert_eq!(follow_up[2]["content"][0]["tool_use_id"], "toolu_1");
    assert_eq!(follow_up[2]["content"][0]["is_error"], true);
    assert_no_key(&events, &server);
}

#[test]
fn a_429_is_retried_after_the_hinted_delay() {
    let fake = FakeProvider::start();
    let ok = openai::text(&[], &["second try"], &openai::usage(1, 2, 0, 0));
    fake.script([Reply::error(429, "slow down").with_header("retry-after-ms", "50"), Reply::stream(ok.as_bytes(), 1)]);
    let server = server_with(vec![("local", provider(Wire::Openai, &fake, &["m"]))]);
    let (_, events) = run(&server, "local/m", json!({ "content": "hi" }));
    assert_eq!(deltas(&events, "text"), "second try");
    assert_eq!(event_type(events.last().unwrap()), "run.finished");
    assert_eq!(fake.requests().len(), 2);
}

#[test]
fn a_500_before_output_falls_back_to_the_next_provider() {
    let primary = FakeProvider::start();
    let backup = FakeProvider::start();
    primary.script([Reply::error(500, "boom"), Reply::error(503, "still down")]);
    let mut answer = anthropic::message_start(5, 0, 0);
    answer.push_str(&anthropic::text(0, &["from the backup"]));
    answer.push_str(&anthropic::message_end("end_turn", 2));
    backup.script([Reply::stream(answer.as_bytes(), 4)]);
    let mut main = provider(Wire::Openai, &primary, &["shared-name"]);
    main.max_retries = 1;
    main.fallbacks = vec!["backup".into()];
    let server =
        server_with(vec![("main", main), ("backup", provider(Wire::Anthropic, &backup, &["other", "shared-name"]))]);
    let (_, events) = run(&server, "main/shared-name", json!({ "content": "hi" }));
    assert_eq!(deltas(&events, "text"), "from the backup");
    assert_eq!(event_type(events.last().unwrap()), "run.finished");
    assert_eq!(primary.requests().len(), 2, "one try and one retry");
    assert_eq!(backup.requests()[0].body["model"], "shared-name", "the fallback's model of the same name");
}

#[test]
fn a_retry_after_past_the_cap_goes_straight_to_the_fallback() {
    let primary = FakeProvider::start();
    let backup = FakeProvider::start();
    primary.script([Reply::error(429, "come back in two minutes").with_header("retry-after", "120")]);
    let ok = openai::text(&[], &["backup answered"], &openai::usage(1, 1, 0, 0));
    backup.script([Reply::stream(ok.as_bytes(), 1)]);
    let mut main = provider(Wire::Openai, &primary, &["m"]);
    main.fallbacks = vec!["backup".into()];
    let server = server_with(vec![("main", main), ("backup", provider(Wire::Openai, &backup, &["b"]))]);
    let started = Instant::now();
    let (_, events) = run(&server, "main/m", json!({ "content": "hi" }));
    assert!(started.elapsed() < Duration::from_secs(5), "no two-minute wait");
    assert_eq!(deltas(&events, "text"), "backup answered");
    assert_eq!(primary.requests().len(), 1);
    assert_eq!(backup.requests()[0].body["model"], "b", "the fallback's first model");
}

#[test]
fn absurd_retry_hints_neither_panic_nor_stall() {
    // `inf` panicked in Duration::from_secs_f64; it now means "longer than the cap".
    let primary = FakeProvider::start();
    let backup = FakeProvider::start();
    primary.script([Reply::error(429, "never").with_header("retry-after", "inf")]);
    let ok = openai::text(&[], &["backup answered"], &openai::usage(1, 1, 0, 0));
    backup.script([Reply::stream(ok.as_bytes(), 1)]);
    let mut main = provider(Wire::Openai, &primary, &["m"]);
    main.fallbacks = vec!["backup".into()];
    let server = server_with(vec![("main", main), ("backup", provider(Wire::Openai, &backup, &["b"]))]);
    let (_, events) = run(&server, "main/m", json!({ "content": "hi" }));
    assert_eq!(deltas(&events, "text"), "backup answered");

    // NaN is no hint at all: the ordinary backoff applies and the retry succeeds.
    let fake = FakeProvider::start();
    let ok = openai::text(&[], &["retried"], &openai::usage(1, 1, 0, 0));
    fake.script([
        Reply::error(503, "busy").with_header("retry-after-ms", "NaN").with_header("retry-after", "-5"),
        Reply::stream(ok.as_bytes(), 1),
    ]);
    let mut local = provider(Wire::Openai, &fake, &["m"]);
    local.retry_base_delay_ms = 10;
    let server = server_with(vec![("local", local)]);
    let (_, events) = run(&server, "local/m", json!({ "content": "hi" }));
    assert_eq!(deltas(&events, "text"), "retried");
    assert_eq!(fake.requests().len(), 2);
}

#[test]
fn an_error_event_after_output_fails_the_run_with_the_providers_message() {
    let fake = FakeProvider::start();
    let mut body = anthropic::message_start(5, 0, 0);
    body.push_str(&anthropic::block_start(0, json!({ "type": "text", "text": "" })));
    body.push_str(&anthropic::block_delta(0, json!({ "type": "text_delta", "text": "partial" })));
    body.push_str(&anthropic::event(
        "error",
        json!({ "type": "error", "error": { "type": "overloaded_error", "message": "Overloaded" } }),
    ));
    fake.script([Reply::stream(body.as_bytes(), 3)]);
    let server = server_with(vec![("claude", provider(Wire::Anthropic, &fake, &["c"]))]);
    let (id, events) = run(&server, "claude/c", json!({ "content": "hi" }));
    let failed = events.last().unwrap();
    assert_eq!(event_type(failed), "run.failed");
    let error = failed["event"]["error"].as_str().unwrap();
    assert!(error.contains("Overloaded") && error.contains("claude"), "{error}");
    assert_eq!(fake.requests().len(), 1, "no retry once output has started");
    assert_no_key(&events, &server);
    assert_eq!(server.get(&format!("/api/sessions/{id}")).json["session"]["status"], "error");
}

#[test]
fn a_stream_that_stalls_past_the_idle_timeout_fails() {
    let fake = FakeProvider::start();
    let start = openai::chunk(json!({ "content": "begun" }), None);
    fake.script([Reply::stream(start.as_bytes(), 1).then(Step::Stall)]);
    let mut config = provider(Wire::Openai, &fake, &["m"]);
    config.idle_timeout_secs = 1;
    let server = server_with(vec![("local", config)]);
    let started = Instant::now();
    let (_, events) = run(&server, "local/m", json!({ "content": "hi" }));
    let failed = events.last().unwrap();
    assert_eq!(event_type(failed), "run.failed");
    assert!(failed["event"]["error"].as_str().unwrap().contains("sent nothing for 1 s"), "{failed}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn cancel_ends_a_run_while_the_provider_is_silent() {
    let fake = FakeProvider::start();
    fake.script([Reply::stream(b": waiting\n\n", 1).then(Step::Stall)]);
    let server = server_with(vec![("local", provider(Wire::Openai, &fake, &["m"]))]);
    let id = server.create_session(json!({ "model": "local/m" }));
    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    assert_eq!(server.post(&format!("/api/sessions/{id}/messages"), json!({ "content": "hi" })).status, 202);
    stream.collect_until(|e| event_type(e) == "message.started" && e["event"]["message"]["role"] == "assistant");
    crate::support::wait_until("the provider to be called", || !fake.requests().is_empty());
    let asked = Instant::now();
    assert_eq!(server.post(&format!("/api/sessions/{id}/cancel"), json!({})).json["cancelled"], true);
    let events = stream.collect_until(is_run_end);
    assert!(asked.elapsed() < Duration::from_secs(1), "took {:?}", asked.elapsed());
    assert_eq!(events.last().unwrap()["event"]["status"], "cancelled");
}

#[test]
fn bootstrap_lists_configured_models_and_a_missing_key_stops_start() {
    let fake = FakeProvider::start();
    let server = server_with(vec![("local", provider(Wire::Openai, &fake, &["one", "two"]))]);
    let models = server.get("/api/bootstrap").json["models"].clone();
    let local: Vec<&Value> = models.as_array().unwrap().iter().filter(|m| m["provider"] == "local").collect();
    assert_eq!(local.len(), 2);
    assert_eq!(local[0]["id"], "local/one");
    assert_eq!(local[0]["contextWindow"], 32_768);
    assert!(models.as_array().unwrap().iter().any(|m| m["id"] == "builtin/echo"));

    let data = tempfile::tempdir().unwrap();
    let mut config = crate::support::test_config(&data.path().join("data"), data.path());
    let mut keyless = provider(Wire::Openai, &fake, &["m"]);
    keyless.api_key = None;
    keyless.api_key_env = Some("KESTREL_TEST_SURELY_UNSET_KEY".into());
    config.providers.insert("keyless".into(), keyless);
    let error = kestrel::Server::start(config).err().expect("refused");
    assert!(error.to_string().contains("KESTREL_TEST_SURELY_UNSET_KEY"), "{error}");
}

#[test]
fn a_provider_that_cannot_be_reached_falls_back() {
    let backup = FakeProvider::start();
    let ok = openai::text(&[], &["reached"], &openai::usage(1, 1, 0, 0));
    backup.script([Reply::stream(ok.as_bytes(), 1)]);
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url = format!("http://{}/v1", closed.local_addr().unwrap());
    drop(closed); // nothing listens there now: connections are refused
    let mut main = provider(Wire::Openai, &backup, &["m"]);
    main.base_url = dead_url;
    main.fallbacks = vec!["backup".into()];
    let server = server_with(vec![("main", main), ("backup", provider(Wire::Openai, &backup, &["m"]))]);
    let (_, events) = run(&server, "main/m", json!({ "content": "hi" }));
    assert_eq!(deltas(&events, "text"), "reached");
    assert_eq!(backup.requests().len(), 1);
}

#[test]
fn a_stream_that_trickles_past_the_request_timeout_fails() {
    let fake = FakeProvider::start();
    // Never silent for long, so only the whole-request timeout can end it.
    let mut reply = Reply::stream(openai::chunk(json!({ "content": "slow" }), None).as_bytes(), 1);
    for _ in 0..40 {
        reply = reply.then(Step::Sleep(Duration::from_millis(100))).then(Step::Write(b": keep-alive\n\n".to_vec()));
    }
    fake.script([reply]);
    let mut config = provider(Wire::Openai, &fake, &["m"]);
    config.timeout_secs = 1;
    let server = server_with(vec![("local", config)]);
    let started = Instant::now();
    let (_, events) = run(&server, "local/m", json!({ "content": "hi" }));
    let failed = events.last().unwrap();
    assert_eq!(event_type(failed), "run.failed");
    assert!(failed["event"]["error"].as_str().unwrap().contains("longer than its timeout"), "{failed}");
    assert!(started.elapsed() < Duration::from_secs(3));
}
