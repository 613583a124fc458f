//! Durability: restarts on the same data dir, a kill -9 mid-run, and the resume rules.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

use crate::support::{event_type, is_run_end, test_config, TestServer};

#[test]
fn sessions_and_transcripts_survive_a_restart_and_seqs_keep_rising() {
    let mut server = TestServer::start();
    let id = server.create_session(json!({ "title": "durable" }));
    let events = server.run_to_end(&id, "keep this");
    let last_seq = events.last().unwrap()["seq"].as_u64().unwrap();

    server.restart(|_| {});
    let session = server.get(&format!("/api/sessions/{id}")).json["session"].clone();
    assert_eq!(session["title"], "durable");
    assert_eq!(session["status"], "idle");
    assert_eq!(session["messages"][0]["content"], "keep this");
    assert_eq!(session["messages"][1]["content"], "Echo: keep this");

    // A client's old Last-Event-ID can never replay the wrong events: new seqs start above.
    let events = server.run_to_end(&id, "after restart");
    assert!(events[0]["seq"].as_u64().unwrap() > last_seq);
    assert_eq!(server.get("/api/health").json["sessions"], 1);
}

#[test]
fn a_run_killed_mid_stream_is_interrupted_on_boot_and_resumes() {
    let data = tempfile::tempdir().unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kestrel"))
        .env("KESTREL_ADDR", "127.0.0.1:0")
        .env("KESTREL_DATA_DIR", data.path())
        .env("KESTREL_WORKSPACE", workspace.path())
        .env("KESTREL_BUILTIN_DELAY_MS", "200")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let base = line.trim().rsplit(' ').next().unwrap().to_string();
    let client = crate::support::Client { base: base.clone(), token: None };
    let id = client.post("/api/sessions", json!({})).json["session"]["id"].as_str().unwrap().to_string();
    let mut stream = crate::support::SseClient::open(&base, &format!("/api/sessions/{id}/events"), None, None);
    let accepted = client.post(&format!("/api/sessions/{id}/messages"), json!({ "content": "a long answer to lose" }));
    assert_eq!(accepted.status, 202);
    stream.collect_until(|e| event_type(e) == "message.delta" && e["event"]["channel"] == "text");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let server = TestServer::from_config(test_config(data.path(), workspace.path()));
    let session = server.get(&format!("/api/sessions/{id}")).json["session"].clone();
    assert_eq!(session["status"], "interrupted");
    assert_eq!(session["messages"][0]["content"], "a long answer to lose", "the acknowledged message survived");

    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    let resumed = server.post(&format!("/api/sessions/{id}/resume"), json!({}));
    assert_eq!(resumed.status, 202, "{}", resumed.text);
    let events = stream.collect_until(is_run_end);
    assert_eq!(events.last().unwrap()["event"]["status"], "completed");
    let session = server.get(&format!("/api/sessions/{id}")).json["session"].clone();
    assert_eq!(session["status"], "idle");
    assert_eq!(session["messages"][1]["content"], "Echo: a long answer to lose");
}

#[test]
fn a_tool_call_without_a_result_is_answered_with_an_error_on_resume_never_rerun() {
    let mut server = TestServer::start();
    let id = server.create_session(json!({}));
    server.stop();
    // The state a crash leaves when it strikes while a tool runs: the assistant message with
    // the call is stored, its result is not, and the session was running.
    let db = rusqlite::Connection::open(server.data_dir.join("kestrel.db")).unwrap();
    let call = json!({ "id": "call_pending", "name": "dangerous_tool", "arguments": { "rm": "-rf" } });
    let user = json!({ "id": "msg_u", "role": "user", "content": "/tool dangerous_tool", "createdAt": "2026-01-01T00:00:00.000Z" });
    let assistant = json!({ "id": "msg_a", "role": "assistant", "content": "", "toolCalls": [call], "createdAt": "2026-01-01T00:00:00.001Z" });
    for message in [&user, &assistant] {
        db.execute(
            "INSERT INTO messages (id, session_id, role, body) VALUES (?1, ?2, ?3, ?4)",
            rusqlite::params![message["id"].as_str(), id, message["role"].as_str(), message.to_string()],
        )
        .unwrap();
    }
    // The call had begun executing: its start mark was committed before it ran.
    db.execute(
        "INSERT INTO tool_call_starts (session_id, call_id, started_at) VALUES (?1, 'call_pending', 'x')",
        [&id],
    )
    .unwrap();
    db.execute("UPDATE sessions SET status = 'running', message_count = 2 WHERE id = ?1", [&id]).unwrap();
    drop(db);

    server.restart(|_| {});
    assert_eq!(server.get(&format!("/api/sessions/{id}")).json["session"]["status"], "interrupted");
    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    assert_eq!(server.post(&format!("/api/sessions/{id}/resume"), json!({})).status, 202);
    let events = stream.collect_until(is_run_end);
    assert!(!events.iter().any(|e| event_type(e) == "tool.started"), "the call is never executed again");
    let messages: Vec<Value> =
        server.get(&format!("/api/sessions/{id}")).json["session"]["messages"].as_array().unwrap().clone();
    let result = &messages[2];
    assert_eq!(result["role"], "tool");
    assert_eq!(result["toolCallId"], "call_pending");
    assert!(result["content"].as_str().unwrap().contains("Verify the state of the workspace"));
    assert_eq!(result["meta"]["ok"], false);
    assert_eq!(messages[3]["role"], "assistant");
    assert!(messages[3]["content"].as_str().unwrap().contains("dangerous_tool failed"));
}
