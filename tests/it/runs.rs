//! Runs: the event sequence, validation, busy, cancel, the tool loop, resume rules.

use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

use crate::support::{event_type, is_run_end, TestServer};

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(event_type).collect()
}

#[test]
fn a_message_streams_the_reply_and_stores_it() {
    let server = TestServer::start();
    let id = server.create_session(json!({}));
    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    let response = server.post(&format!("/api/sessions/{id}/messages"), json!({ "content": "hello brave new world" }));
    assert_eq!(response.status, 202, "{}", response.text);
    let run_id = response.json["runId"].as_str().unwrap().to_string();
    let events = stream.collect_until(is_run_end);

    let kinds = types(&events);
    assert_eq!(&kinds[..2], ["session.updated", "run.started"]);
    assert_eq!(events[0]["event"]["session"]["status"], "running");
    assert_eq!(events[1]["event"]["runId"], run_id.as_str());
    let started = events
        .iter()
        .position(|e| event_type(e) == "message.started" && e["event"]["message"]["role"] == "assistant")
        .unwrap();
    let assistant_id = events[started]["event"]["message"]["id"].as_str().unwrap();
    let deltas: Vec<&Value> = events.iter().filter(|e| event_type(e) == "message.delta").collect();
    assert_eq!(deltas[0]["event"]["channel"], "reasoning", "a short reasoning delta comes first");
    let text: String = deltas
        .iter()
        .filter(|d| d["event"]["channel"] == "text")
        .map(|d| {
            assert_eq!(d["event"]["messageId"], assistant_id);
            d["event"]["delta"].as_str().unwrap()
        })
        .collect();
    assert_eq!(text, "Echo: hello brave new world");
    assert_eq!(deltas.iter().filter(|d| d["event"]["channel"] == "text").count(), 5, "a word per delta");
    let completed = events
        .iter()
        .find(|e| event_type(e) == "message.completed" && e["event"]["message"]["id"] == assistant_id)
        .unwrap();
    assert_eq!(completed["event"]["message"]["content"], "Echo: hello brave new world");

    let finished = events.last().unwrap();
    assert_eq!(event_type(finished), "run.finished");
    assert_eq!(finished["event"]["status"], "completed");
    let usage = &finished["event"]["usage"];
    assert!(usage["outputTokens"].as_u64().unwrap() > 0);
    assert_eq!(
        usage["totalTokens"].as_u64().unwrap(),
        usage["inputTokens"].as_u64().unwrap() + usage["outputTokens"].as_u64().unwrap()
    );
    // Seqs are strictly increasing.
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");

    crate::support::wait_until("the session to go idle", || {
        server.get(&format!("/api/sessions/{id}")).json["session"]["status"] == "idle"
    });
    let session = server.get(&format!("/api/sessions/{id}")).json["session"].clone();
    assert_eq!(session["messageCount"], 2);
    assert_eq!(session["messages"][0]["role"], "user");
    assert_eq!(session["messages"][1]["role"], "assistant");
    assert_eq!(session["messages"][1]["content"], "Echo: hello brave new world");
    assert_eq!(session["messages"][1]["model"], "builtin/echo");
}

#[test]
fn message_validation_follows_the_limits() {
    let server = TestServer::start();
    let id = server.create_session(json!({}));
    let path = format!("/api/sessions/{id}/messages");
    server.post(&path, json!({ "content": "" })).assert_error(400, "invalid_message");
    server.post(&path, json!({})).assert_error(400, "invalid_message");
    server.post(&path, json!({ "content": 5 })).assert_error(400, "invalid_message");
    server.post(&path, json!({ "content": "x".repeat(200_001) })).assert_error(413, "message_too_large");

    let png = base64::engine::general_purpose::STANDARD.encode([0x89, b'P', b'N', b'G', 1, 2, 3]);
    let image = |mime: &str, data: &str| json!({ "mimeType": mime, "data": data });
    server
        .post(&path, json!({ "content": "", "images": [image("image/bmp", &png)] }))
        .assert_error(400, "invalid_images");
    server
        .post(&path, json!({ "content": "", "images": [image("image/png", "!!not base64!!")] }))
        .assert_error(400, "invalid_images");
    server.post(&path, json!({ "content": "x", "images": "nope" })).assert_error(400, "invalid_images");
    let seven: Vec<Value> = (0..7).map(|_| image("image/png", &png)).collect();
    server.post(&path, json!({ "content": "x", "images": seven })).assert_error(413, "message_too_large");
    let big = base64::engine::general_purpose::STANDARD.encode(vec![0u8; 4_000_001]);
    server
        .post(&path, json!({ "content": "x", "images": [image("image/png", &big)] }))
        .assert_error(413, "message_too_large");
    // Each under 4 MB, together over 12 MB, the body still under the 16 MiB limit.
    let part = base64::engine::general_purpose::STANDARD.encode(vec![0u8; 3_030_000]);
    let too_much: Vec<Value> = (0..4).map(|_| image("image/png", &part)).collect();
    server.post(&path, json!({ "content": "x", "images": too_much })).assert_error(413, "message_too_large");
    assert_eq!(server.get(&format!("/api/sessions/{id}")).json["session"]["messageCount"], 0, "nothing stored");

    // Empty text is fine with an image, and a data: prefix is stripped.
    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    let with_prefix = format!("data:image/png;base64,{png}");
    let response = server.post(
        &path,
        json!({ "content": "", "images": [{ "mimeType": "image/png", "data": with_prefix, "name": "dot.png" }] }),
    );
    assert_eq!(response.status, 202, "{}", response.text);
    stream.collect_until(is_run_end);
    let stored = &server.get(&format!("/api/sessions/{id}")).json["session"]["messages"][0];
    assert_eq!(stored["images"][0]["data"], png.as_str());
    assert_eq!(stored["images"][0]["name"], "dot.png");
}

#[test]
fn a_second_message_during_a_run_is_session_busy() {
    let server = TestServer::start_with(|config| config.builtin.delay_ms = 50);
    let id = server.create_session(json!({}));
    let path = format!("/api/sessions/{id}/messages");
    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    assert_eq!(server.post(&path, json!({ "content": "one two three four" })).status, 202);
    server.post(&path, json!({ "content": "again" })).assert_error(409, "session_busy");
    stream.collect_until(is_run_end);
    crate::support::wait_until("the run to release the session", || server.stats().active_runs == 0);
    assert_eq!(server.post(&path, json!({ "content": "now it is free" })).status, 202);
    stream.collect_until(is_run_end);
}

#[test]
fn cancel_ends_a_streaming_run_within_a_second() {
    let server = TestServer::start_with(|config| config.builtin.delay_ms = 300);
    let id = server.create_session(json!({}));
    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    let words = "word ".repeat(100);
    assert_eq!(server.post(&format!("/api/sessions/{id}/messages"), json!({ "content": words })).status, 202);
    // Wait for the first text delta, then cancel mid-stream.
    stream.collect_until(|e| event_type(e) == "message.delta" && e["event"]["channel"] == "text");
    let asked = Instant::now();
    let response = server.post(&format!("/api/sessions/{id}/cancel"), json!({}));
    assert_eq!(response.status, 200);
    assert_eq!(response.json["cancelled"], true);
    let events = stream.collect_until(is_run_end);
    assert!(asked.elapsed() < Duration::from_secs(1), "took {:?}", asked.elapsed());
    let finished = events.last().unwrap();
    assert_eq!(event_type(finished), "run.finished");
    assert_eq!(finished["event"]["status"], "cancelled");
    // What was streamed before the cancel is kept.
    let completed = events.iter().find(|e| event_type(e) == "message.completed").unwrap();
    assert!(completed["event"]["message"]["content"].as_str().unwrap().starts_with("Echo:"));

    // Idempotent: a second cancel is fine and cancels nothing.
    let again = server.post(&format!("/api/sessions/{id}/cancel"), json!({}));
    assert_eq!(again.status, 200);
    assert_eq!(again.json["cancelled"], false);
    crate::support::wait_until("status cancelled", || {
        server.get(&format!("/api/sessions/{id}")).json["session"]["status"] == "cancelled"
    });
}

#[test]
fn tool_lines_drive_the_whole_loop() {
    let server = TestServer::start();
    let id = server.create_session(json!({}));
    let events = server.run_to_end(&id, "look around\n/tool first_tool {\"path\":\".\"}\n/tool second_tool");
    let kinds = types(&events);
    let tool_started: Vec<&Value> = events.iter().filter(|e| event_type(e) == "tool.started").collect();
    assert_eq!(tool_started.len(), 2);
    assert_eq!(tool_started[0]["event"]["call"]["name"], "first_tool");
    assert_eq!(tool_started[0]["event"]["call"]["arguments"]["path"], ".");
    let finished: Vec<&Value> = events.iter().filter(|e| event_type(e) == "tool.finished").collect();
    assert_eq!(finished.len(), 2);
    assert_eq!(finished[0]["event"]["result"]["ok"], false, "no such tool yet: an error result");
    assert_eq!(finished[0]["event"]["result"]["callId"], tool_started[0]["event"]["call"]["id"]);
    // Order for each call: tool.started, tool.finished, then the tool message.
    let first_started = kinds.iter().position(|k| *k == "tool.started").unwrap();
    assert_eq!(kinds[first_started + 1], "tool.finished");
    assert_eq!(kinds[first_started + 2], "message.started");
    assert_eq!(event_type(events.last().unwrap()), "run.finished");
    assert_eq!(events.last().unwrap()["event"]["status"], "completed");

    let messages = server.get(&format!("/api/sessions/{id}")).json["session"]["messages"].clone();
    let roles: Vec<&str> = messages.as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "tool", "assistant"]);
    assert_eq!(messages[1]["toolCalls"].as_array().unwrap().len(), 2);
    assert_eq!(messages[2]["toolName"], "first_tool");
    assert_eq!(messages[2]["toolCallId"], messages[1]["toolCalls"][0]["id"]);
    assert!(messages[4]["content"].as_str().unwrap().starts_with("Tool results: first_tool failed"));
}

#[test]
fn max_steps_bounds_the_provider_calls() {
    // One step: the model asks for a tool, and there is no step left to read the result.
    let server = TestServer::start_with(|config| config.agent.max_steps = 1);
    let id = server.create_session(json!({}));
    let events = server.run_to_end(&id, "/tool anything");
    let finished = events.last().unwrap();
    assert_eq!(event_type(finished), "run.finished");
    assert_eq!(finished["event"]["status"], "max_steps");
    assert_eq!(events.iter().filter(|e| event_type(e) == "tool.started").count(), 1);
}

#[test]
fn resume_is_refused_unless_interrupted_or_failed() {
    let server = TestServer::start();
    let id = server.create_session(json!({}));
    server.post(&format!("/api/sessions/{id}/resume"), json!({})).assert_error(409, "not_resumable");
    server.run_to_end(&id, "hi");
    server.post(&format!("/api/sessions/{id}/resume"), json!({})).assert_error(409, "not_resumable");
}
