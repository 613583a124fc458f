//! Idempotency-Key: a retried create or send returns the first answer and stores nothing new.

use serde_json::{json, Value};

use crate::support::{is_run_end, Client, Response, TestServer};

fn post_with_key(client: &Client, path: &str, key: &str, body: Value) -> Response {
    client.send_with_headers("POST", path, Some(body.to_string().as_bytes()), &[("Idempotency-Key", key)])
}

#[test]
fn a_repeated_create_returns_the_first_answer_and_creates_nothing() {
    let server = TestServer::start();
    let client = server.client();
    let first = post_with_key(&client, "/api/sessions", "create-1", json!({ "title": "once" }));
    assert_eq!(first.status, 201, "{}", first.text);
    assert!(first.header("idempotency-replayed").is_none());
    let again = post_with_key(&client, "/api/sessions", "create-1", json!({ "title": "once" }));
    assert_eq!(again.status, 201);
    assert_eq!(again.text, first.text, "byte for byte");
    assert_eq!(again.header("idempotency-replayed"), Some("true"));
    assert_eq!(server.get("/api/sessions").json["sessions"].as_array().unwrap().len(), 1);

    let other = post_with_key(&client, "/api/sessions", "create-1", json!({ "title": "different" }));
    other.assert_error(409, "idempotency_conflict");
    let id = first.json["session"]["id"].as_str().unwrap();
    let elsewhere =
        post_with_key(&client, &format!("/api/sessions/{id}/messages"), "create-1", json!({ "title": "once" }));
    elsewhere.assert_error(409, "idempotency_conflict");
    for bad in ["", &"k".repeat(256)] {
        post_with_key(&client, "/api/sessions", bad, json!({})).assert_error(400, "invalid_idempotency_key");
    }
}

#[test]
fn keys_belong_to_a_tenant() {
    let server = TestServer::start_with(|config| {
        config.auth.tokens.push(kestrel::config::TokenConfig::new("a", "token-a"));
        config.auth.tokens.push(kestrel::config::TokenConfig::new("b", "token-b"));
    });
    let a = server.client().with_token(Some("token-a"));
    let b = server.client().with_token(Some("token-b"));
    let from_a = post_with_key(&a, "/api/sessions", "shared", json!({}));
    let from_b = post_with_key(&b, "/api/sessions", "shared", json!({}));
    assert_eq!((from_a.status, from_b.status), (201, 201));
    assert_ne!(from_a.json["session"]["id"], from_b.json["session"]["id"], "b never sees a's answer");
    assert!(from_b.header("idempotency-replayed").is_none());
}

#[test]
fn a_repeated_send_returns_the_same_run_stores_one_message_and_survives_a_restart() {
    let mut server = TestServer::start();
    let id = server.create_session(json!({}));
    let path = format!("/api/sessions/{id}/messages");
    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    let first = post_with_key(&server.client(), &path, "send-1", json!({ "content": "only once" }));
    assert_eq!(first.status, 202);
    stream.collect_until(is_run_end);
    let again = post_with_key(&server.client(), &path, "send-1", json!({ "content": "only once" }));
    assert_eq!((again.status, again.json["runId"].clone()), (202, first.json["runId"].clone()));
    server.restart(|_| {});
    let after_restart = post_with_key(&server.client(), &path, "send-1", json!({ "content": "only once" }));
    assert_eq!(after_restart.json["runId"], first.json["runId"]);
    let session = server.get(&format!("/api/sessions/{id}")).json["session"].clone();
    assert_eq!(session["messageCount"], 2, "one user message and its answer: {session}");
}

#[test]
fn a_failed_request_keeps_no_answer_so_its_key_can_be_retried() {
    let server = TestServer::start_with(|config| config.builtin.delay_ms = 50);
    let id = server.create_session(json!({}));
    let path = format!("/api/sessions/{id}/messages");
    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    assert_eq!(server.post(&path, json!({ "content": "busy busy busy" })).status, 202);
    post_with_key(&server.client(), &path, "retry-me", json!({ "content": "next" })).assert_error(409, "session_busy");
    stream.collect_until(is_run_end);
    let retried = post_with_key(&server.client(), &path, "retry-me", json!({ "content": "next" }));
    assert_eq!(retried.status, 202, "{}", retried.text);
    assert!(retried.header("idempotency-replayed").is_none());
}

#[test]
fn concurrent_repeats_create_exactly_one_session() {
    let server = TestServer::start();
    let client = server.client();
    let answers: Vec<Response> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..16)
            .map(|_| scope.spawn(|| post_with_key(&client, "/api/sessions", "racy", json!({ "title": "race" }))))
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    assert!(answers.iter().all(|a| a.status == 201 && a.text == answers[0].text));
    assert_eq!(answers.iter().filter(|a| a.header("idempotency-replayed").is_none()).count(), 1);
    assert_eq!(server.get("/api/sessions").json["sessions"].as_array().unwrap().len(), 1);
}

#[test]
fn an_answer_older_than_a_day_is_forgotten() {
    let mut server = TestServer::start();
    let first = post_with_key(&server.client(), "/api/sessions", "old", json!({}));
    server.stop();
    crate::support::Db::open(&server.data_dir)
        .exec("UPDATE idempotency SET created_ms = created_ms - 25 * 3600 * 1000", &[]);
    server.restart(|_| {});
    let later = post_with_key(&server.client(), "/api/sessions", "old", json!({}));
    assert_eq!(later.status, 201);
    assert_ne!(later.json["session"]["id"], first.json["session"]["id"], "a new session, a day later");
}
