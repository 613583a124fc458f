//! Structured answers over HTTP: `responseFormat` on a message; OpenAI's native
//! `response_format`, Anthropic's instruction, the echo; the parsed value in `meta.structured`
//! (kept across a restart), one repair, `structured_output_invalid`, and the refusals.

use kestrel::config::{ModelConfig, ProviderConfig, Wire};
use serde_json::{json, Value};

use crate::fake_provider::{anthropic, openai, FakeProvider, Reply};
use crate::support::{event_type, is_run_end, TestServer};

fn format() -> Value {
    json!({
        "type": "json_schema",
        "name": "trip",
        "schema": {
            "type": "object",
            "properties": { "city": { "type": "string" }, "days": { "type": "integer", "minimum": 1 } },
            "required": ["city", "days"],
        },
    })
}

fn provider(wire: Wire, fake: &FakeProvider) -> ProviderConfig {
    let mut provider = ProviderConfig::new(wire, fake.base_url.clone());
    provider.api_key = Some("sk-test".into());
    provider.retry_base_delay_ms = 10;
    provider.models = vec![ModelConfig { context_window: Some(32_768), ..ModelConfig::named("m") }];
    provider
}

/// Sends `body` to a new session of `model`; the session id and the run's events.
fn run(server: &TestServer, model: &str, body: Value) -> (String, Vec<Value>) {
    let id = server.create_session(json!({ "model": model, "systemPrompt": "Plan trips." }));
    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    let sent = server.post(&format!("/api/sessions/{id}/messages"), body);
    assert_eq!(sent.status, 202, "{}", sent.text);
    (id.clone(), stream.collect_until(is_run_end))
}

fn messages(server: &TestServer, id: &str) -> Vec<Value> {
    server.get(&format!("/api/sessions/{id}")).json["session"]["messages"].as_array().unwrap().clone()
}

#[test]
fn the_echo_answers_with_a_valid_value_that_is_kept_across_a_restart() {
    let mut server = TestServer::start();
    let (id, events) = run(
        &server,
        "builtin/echo",
        json!({ "content": "{\"city\": \"Oslo\", \"days\": 3}", "responseFormat": format() }),
    );
    assert_eq!(event_type(events.last().unwrap()), "run.finished", "{events:#?}");
    assert_eq!(events.last().unwrap()["event"]["status"], "completed");
    let stored = messages(&server, &id);
    assert_eq!(stored.len(), 2);
    assert_eq!(stored[0]["meta"]["responseFormat"], format(), "the format is kept with the message");
    assert_eq!(stored[1]["meta"]["structured"], json!({ "city": "Oslo", "days": 3 }));
    let completed = events.iter().rev().find(|e| event_type(e) == "message.completed").unwrap();
    assert_eq!(completed["event"]["message"]["meta"]["structured"]["city"], "Oslo");

    server.restart(|_| {});
    assert_eq!(messages(&server, &id)[1]["meta"]["structured"], json!({ "city": "Oslo", "days": 3 }));
}

#[test]
fn an_answer_still_invalid_after_one_repair_fails_the_run_with_its_errors() {
    let server = TestServer::start();
    let (id, events) =
        run(&server, "builtin/echo", json!({ "content": "{\"city\": \"Oslo\"}", "responseFormat": format() }));
    let failed = events.last().unwrap();
    assert_eq!(event_type(failed), "run.failed", "{events:#?}");
    let error = failed["event"]["error"].as_str().unwrap();
    assert!(error.starts_with("structured_output_invalid: "), "{error}");
    // The echo answers the repair request with its text: the last answer's errors.
    assert!(error.contains("not JSON"), "{error}");
    let stored = messages(&server, &id);
    let roles: Vec<&str> = stored.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant", "user", "assistant"]);
    assert!(stored[1]["meta"]["structuredErrors"][0].as_str().unwrap().contains("days"), "{}", stored[1]);
    assert_eq!(stored[2]["meta"]["structuredRepair"], true);
    assert!(stored[2]["content"].as_str().unwrap().contains("\"days\" is a required property"));
    assert!(stored[3]["meta"]["structuredErrors"].is_array());
    assert_eq!(server.get(&format!("/api/sessions/{id}")).json["session"]["status"], "error");
}

#[test]
fn openai_gets_the_schema_natively_and_its_answer_is_parsed() {
    let fake = FakeProvider::start();
    let body = openai::text(&[], &["{\"city\": ", "\"Lima\", \"days\": 5}"], &openai::usage(30, 9, 0, 0));
    fake.script([Reply::stream(body.as_bytes(), 3)]);
    let server = TestServer::start_with(|config| {
        config.providers.insert("oa".into(), provider(Wire::Openai, &fake));
    });
    let (id, events) = run(&server, "oa/m", json!({ "content": "Plan Lima.", "responseFormat": format() }));
    assert_eq!(events.last().unwrap()["event"]["status"], "completed", "{events:#?}");
    assert_eq!(messages(&server, &id)[1]["meta"]["structured"], json!({ "city": "Lima", "days": 5 }));

    let request = &fake.requests()[0].body;
    let schema = format()["schema"].clone();
    assert_eq!(
        request["response_format"],
        json!({ "type": "json_schema", "json_schema": { "name": "trip", "schema": schema, "strict": false } })
    );
    assert_eq!(request["messages"][0], json!({ "role": "system", "content": "Plan trips." }), "no instruction");
}

#[test]
fn anthropic_is_instructed_and_one_repair_turns_prose_into_a_valid_answer() {
    let fake = FakeProvider::start();
    let prose = anthropic::message_start(20, 0, 0)
        + &anthropic::text(0, &["Sure! Lima for ", "five days."])
        + &anthropic::message_end("end_turn", 6);
    let fenced = anthropic::message_start(40, 0, 0)
        + &anthropic::text(0, &["```json\n{\"city\": \"Lima\",", " \"days\": 5}\n```"])
        + &anthropic::message_end("end_turn", 9);
    fake.script([Reply::stream(prose.as_bytes(), 2), Reply::stream(fenced.as_bytes(), 2)]);
    let server = TestServer::start_with(|config| {
        config.providers.insert("an".into(), provider(Wire::Anthropic, &fake));
    });
    let (id, events) = run(&server, "an/m", json!({ "content": "Plan Lima.", "responseFormat": format() }));
    assert_eq!(events.last().unwrap()["event"]["status"], "completed", "{events:#?}");
    let stored = messages(&server, &id);
    assert_eq!(stored.len(), 4);
    assert!(stored[1]["meta"]["structuredErrors"][0].as_str().unwrap().starts_with("not JSON"));
    assert_eq!(stored[3]["meta"]["structured"], json!({ "city": "Lima", "days": 5 }));

    let requests = fake.requests();
    assert_eq!(requests.len(), 2);
    let system = requests[0].body["system"].as_str().unwrap();
    assert!(system.starts_with("Plan trips.\n\nYour final answer must be only a JSON value"), "{system}");
    assert!(system.contains("\"required\":[\"city\",\"days\"]"), "{system}");
    assert!(requests[0].body.get("output_format").is_none());
    let repair = requests[1].body["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(repair["role"], "user");
    assert!(repair.to_string().contains("Answer again with only the JSON value."), "{repair}");
}

#[test]
fn formats_that_cannot_be_used_are_refused_before_anything_is_stored() {
    let server = TestServer::start();
    let id = server.create_session(json!({}));
    let path = format!("/api/sessions/{id}/messages");
    let mut wrong_type = format();
    wrong_type["type"] = json!("json_object");
    let mut broken = format();
    broken["schema"] = json!({ "type": 12 });
    let mut bad_name = format();
    bad_name["name"] = json!("a trip");
    for (what, format) in [
        ("a type that is not json_schema", wrong_type),
        ("a schema that does not compile", broken),
        ("a schema that is not an object", json!({ "type": "json_schema", "schema": "object" })),
        ("a name with a space", bad_name),
        ("not an object", json!("json")),
    ] {
        let refused = server.post(&path, json!({ "content": "{}", "responseFormat": format }));
        assert_eq!(
            (refused.status, refused.json["error"]["code"].as_str()),
            (400, Some("invalid_response_format")),
            "{what}: {}",
            refused.text
        );
    }
    assert!(messages(&server, &id).is_empty());
}
