//! Session CRUD and its validation.

use serde_json::json;

use crate::support::{event_type, TestServer, WAIT};

#[test]
fn create_uses_defaults_and_get_returns_the_detail() {
    let server = TestServer::start();
    let response = server.post("/api/sessions", json!({}));
    assert_eq!(response.status, 201, "{}", response.text);
    let session = &response.json["session"];
    assert_eq!(session["model"], "builtin/echo");
    assert_eq!(session["status"], "idle");
    assert_eq!(session["title"], "New session");
    assert_eq!(session["messageCount"], 0);
    assert_eq!(session["messages"], json!([]));
    let workspace = server.workspace.canonicalize().unwrap();
    assert_eq!(session["workspace"], workspace.to_str().unwrap());

    let id = session["id"].as_str().unwrap();
    let fetched = server.get(&format!("/api/sessions/{id}"));
    assert_eq!(fetched.status, 200);
    assert_eq!(fetched.json["session"]["id"], id);
    assert_eq!(fetched.json["session"]["createdAt"], session["createdAt"]);
}

#[test]
fn create_validates_model_workspace_title_and_prompt() {
    let server = TestServer::start();
    server.post("/api/sessions", json!({ "model": "nope/none" })).assert_error(400, "invalid_model");
    server.post("/api/sessions", json!({ "workspace": "relative/dir" })).assert_error(400, "invalid_body");
    server.post("/api/sessions", json!({ "workspace": "/definitely/not/here" })).assert_error(400, "invalid_body");
    let file = server.workspace.join("a-file");
    std::fs::write(&file, "x").unwrap();
    server.post("/api/sessions", json!({ "workspace": file })).assert_error(400, "invalid_body");
    server.post("/api/sessions", json!({ "title": "   " })).assert_error(400, "invalid_title");
    server.post("/api/sessions", json!({ "title": 7 })).assert_error(400, "invalid_title");
    server.post("/api/sessions", json!({ "systemPrompt": ["x"] })).assert_error(400, "invalid_prompt");

    let elsewhere = server.workspace.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let response =
        server.post("/api/sessions", json!({ "workspace": elsewhere, "title": "Mine", "systemPrompt": "Be brief." }));
    assert_eq!(response.status, 201, "{}", response.text);
    assert_eq!(response.json["session"]["workspace"], elsewhere.canonicalize().unwrap().to_str().unwrap());
    assert_eq!(response.json["session"]["systemPrompt"], "Be brief.");
}

#[test]
fn list_is_most_recently_updated_first() {
    let server = TestServer::start();
    let first = server.create_session(json!({ "title": "first" }));
    let second = server.create_session(json!({ "title": "second" }));
    let third = server.create_session(json!({ "title": "third" }));
    // Touching the first moves it to the top.
    std::thread::sleep(std::time::Duration::from_millis(5));
    assert_eq!(server.patch(&format!("/api/sessions/{first}"), json!({ "title": "first again" })).status, 200);
    let listed = server.get("/api/sessions").json;
    let ids: Vec<&str> = listed["sessions"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [first.as_str(), third.as_str(), second.as_str()]);
    assert!(listed["sessions"][0].get("messages").is_none(), "summaries carry no transcript");
}

#[test]
fn patch_changes_title_model_and_prompt_and_announces_it() {
    let server = TestServer::start();
    let id = server.create_session(json!({ "systemPrompt": "old" }));
    let path = format!("/api/sessions/{id}");
    let mut stream = server.events(&format!("{path}/events"));

    let response = server.patch(&path, json!({ "title": "Renamed", "model": "builtin/echo", "systemPrompt": "new" }));
    assert_eq!(response.status, 200, "{}", response.text);
    assert_eq!(response.json["session"]["title"], "Renamed");
    assert_eq!(response.json["session"]["systemPrompt"], "new");
    let (_, event) = stream.next_event(WAIT).expect("session.updated");
    assert_eq!(event_type(&event), "session.updated");
    assert_eq!(event["event"]["session"]["title"], "Renamed");

    let cleared = server.patch(&path, json!({ "systemPrompt": null }));
    assert_eq!(cleared.status, 200);
    assert!(cleared.json["session"].get("systemPrompt").is_none());

    server.patch(&path, json!({ "title": "" })).assert_error(400, "invalid_title");
    server.patch(&path, json!({ "title": null })).assert_error(400, "invalid_title");
    server.patch(&path, json!({ "title": "x".repeat(201) })).assert_error(400, "invalid_title");
    server.patch(&path, json!({ "model": "ghost/model" })).assert_error(400, "invalid_model");
    server.patch(&path, json!({ "model": 3 })).assert_error(400, "invalid_model");
    server.patch(&path, json!({ "systemPrompt": 3 })).assert_error(400, "invalid_prompt");
    server.patch(&path, json!({ "systemPrompt": "x".repeat(100_001) })).assert_error(400, "invalid_prompt");
    server.patch("/api/sessions/ses_unknown", json!({ "title": "x" })).assert_error(404, "session_not_found");
    assert_eq!(server.get(&path).json["session"]["title"], "Renamed", "rejected patches change nothing");
}

#[test]
fn delete_removes_the_transcript_and_emits_session_deleted() {
    let server = TestServer::start();
    let id = server.create_session(json!({}));
    let events = server.run_to_end(&id, "remember me");
    assert_eq!(event_type(events.last().unwrap()), "run.finished");
    let mut all = server.events("/api/events");

    let response = server.delete(&format!("/api/sessions/{id}"));
    assert_eq!(response.status, 204);
    assert_eq!(response.text, "");
    let deleted = all.collect_until(|e| event_type(e) == "session.deleted");
    assert_eq!(deleted.last().unwrap()["event"]["sessionId"], id.as_str());

    server.get(&format!("/api/sessions/{id}")).assert_error(404, "session_not_found");
    server.delete(&format!("/api/sessions/{id}")).assert_error(404, "session_not_found");
    assert_eq!(server.get("/api/sessions").json["sessions"], json!([]));
    let db = rusqlite::Connection::open(server.data_dir.join("kestrel.db")).unwrap();
    let left: i64 = db.query_row("SELECT count(*) FROM messages", [], |row| row.get(0)).unwrap();
    assert_eq!(left, 0, "the transcript is gone");
}

#[test]
fn unknown_session_ids_are_404_on_every_session_route() {
    let server = TestServer::start();
    server.client().assert_session_hidden("ses_missing");
}
