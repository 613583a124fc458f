//! Session CRUD and its validation.

use serde_json::json;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::support::{event_type, wait_until, TestServer, WAIT};

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
    let left = crate::support::Db::open(&server.data_dir).integer("SELECT count(*) FROM messages", &[]);
    assert_eq!(left, 0, "the transcript is gone");
}

#[test]
fn unknown_session_ids_are_404_on_every_session_route() {
    let server = TestServer::start();
    server.client().assert_session_hidden("ses_missing");
}

/// Walks `/api/sessions` a page at a time, following `nextCursor`; the ids in order.
fn walk(client: &crate::support::Client, limit: usize) -> Vec<String> {
    let mut ids = Vec::new();
    let mut path = format!("/api/sessions?limit={limit}");
    loop {
        let page = client.get(&path);
        assert_eq!(page.status, 200, "{}", page.text);
        let sessions = page.json["sessions"].as_array().unwrap();
        assert!(sessions.len() <= limit);
        ids.extend(sessions.iter().map(|s| s["id"].as_str().unwrap().to_owned()));
        match page.json.get("nextCursor").and_then(|c| c.as_str()) {
            Some(cursor) => {
                assert_eq!(sessions.len(), limit, "only the last page is short");
                path = format!("/api/sessions?limit={limit}&cursor={cursor}");
            }
            None => return ids,
        }
    }
}

#[test]
fn paging_walks_most_recent_first_and_ends_without_a_cursor() {
    let server = TestServer::start();
    let ids: Vec<String> = (0..25).map(|i| server.create_session(json!({ "title": format!("s{i}") }))).collect();
    let whole = server.get("/api/sessions").json;
    assert!(whole.get("nextCursor").is_none(), "the whole list has no cursor");
    let whole: Vec<String> =
        whole["sessions"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(whole.len(), 25);
    // Unchanged sessions page in exactly the order of the whole list, at every page size.
    for limit in [1, 7, 25, 1000] {
        assert_eq!(walk(&server.client(), limit), whole, "limit {limit}");
    }
    let mut sorted = whole.clone();
    sorted.sort();
    let mut created = ids.clone();
    created.sort();
    assert_eq!(sorted, created);
    let first = server.get("/api/sessions?cursor=").status;
    assert_eq!(first, 400, "an empty cursor is not one the server gave");
}

#[test]
fn a_walk_lists_every_session_once_while_sessions_are_updated_and_created() {
    let server = TestServer::start();
    let before: Vec<String> = (0..120).map(|i| server.create_session(json!({ "title": format!("s{i}") }))).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let patched = Arc::new(AtomicUsize::new(0));
    let churn = {
        let (client, before, stop, patched) = (server.client(), before.clone(), stop.clone(), patched.clone());
        std::thread::spawn(move || {
            // Patching moves a session to the top of the order, from below a walk's place
            // to above it; creating adds sessions the walk did not start with.
            let mut created = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let n = patched.load(Ordering::Relaxed);
                let id = &before[(n * 37) % before.len()];
                let answer = client.patch_json(&format!("/api/sessions/{id}"), json!({ "title": format!("p{n}") }));
                assert_eq!(answer.status, 200, "{}", answer.text);
                patched.fetch_add(1, Ordering::Relaxed);
                if n % 5 == 0 {
                    created.push(
                        client.post("/api/sessions", json!({})).json["session"]["id"].as_str().unwrap().to_owned(),
                    );
                }
            }
            created
        })
    };
    wait_until("the churn has begun", || patched.load(Ordering::Relaxed) > 0);
    // Enough walks that each one sees updates between its pages.
    let mut walks = 0;
    let deadline = std::time::Instant::now() + WAIT;
    while walks < 6 && std::time::Instant::now() < deadline {
        let listed = walk(&server.client(), 9);
        let mut unique = listed.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), listed.len(), "a session was listed twice");
        for id in &before {
            assert!(listed.contains(id), "{id} was skipped");
        }
        walks += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let created = churn.join().unwrap();
    assert_eq!(walks, 6);
    // A walk started after the churn sees the created ones too, in the whole list's order.
    let listed = walk(&server.client(), 50);
    assert_eq!(listed.len(), before.len() + created.len());
    let whole = server.get("/api/sessions").json;
    let whole: Vec<&str> = whole["sessions"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(listed, whole);
}

#[test]
fn paging_rejects_bad_limits_and_cursors_and_keeps_to_the_tenant() {
    let server = TestServer::start_with(|config| {
        for (tenant, token) in [("acme", "acme-token"), ("globex", "globex-token")] {
            config.auth.tokens.push(kestrel::config::TokenConfig::new(tenant, token));
        }
    });
    let acme = server.client().with_token(Some("acme-token"));
    let globex = server.client().with_token(Some("globex-token"));
    let acme_ids: Vec<String> = (0..4)
        .map(|_| acme.post("/api/sessions", json!({})).json["session"]["id"].as_str().unwrap().to_owned())
        .collect();
    let globex_id = globex.post("/api/sessions", json!({})).json["session"]["id"].as_str().unwrap().to_owned();
    for limit in ["0", "1001", "-1", "ten", "1.5", "", "99999999999999999999999", "%00", "1e3"] {
        acme.get(&format!("/api/sessions?limit={limit}")).assert_error(400, "invalid_query");
    }
    for cursor in ["%%%", "bm90IGpzb24", "e30", "eyJhc09mIjoxLCJ0IjowLCJwb3MiOiIiLCJpZCI6IiJ9"] {
        acme.get(&format!("/api/sessions?limit=2&cursor={cursor}")).assert_error(400, "invalid_cursor");
    }
    use base64::Engine as _;
    let forge = |cursor: serde_json::Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(cursor.to_string());
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    // From the future, long expired, a negative start, the wrong types: refused.
    for forged in [
        json!({ "asOf": 1, "t": now + 3_600_000, "pos": "~", "id": "" }),
        json!({ "asOf": 1, "t": now - 16 * 60_000, "pos": "~", "id": "" }),
        json!({ "asOf": -5, "t": now, "pos": "~", "id": "" }),
        json!({ "asOf": "1", "t": now, "pos": 3, "id": null }),
    ] {
        acme.get(&format!("/api/sessions?limit=2&cursor={}", forge(forged))).assert_error(400, "invalid_cursor");
    }
    // Well formed but made up (a clock far ahead, a place of any text, a megabyte of it):
    // answered from the tenant's own sessions, never an error of the server.
    for forged in [
        json!({ "asOf": i64::MAX, "t": now, "pos": "~", "id": "" }),
        json!({ "asOf": 0, "t": now, "pos": "\u{0}' OR 1=1 --", "id": "%" }),
        json!({ "asOf": 3, "t": now, "pos": "z".repeat(1 << 20), "id": "z" }),
    ] {
        let answer =
            acme.send_with_headers("GET", &format!("/api/sessions?limit=3&cursor={}", forge(forged)), None, &[]);
        assert!(matches!(answer.status, 200 | 431 | 414), "{}: {}", answer.status, answer.text);
        if answer.status == 200 {
            for session in answer.json["sessions"].as_array().unwrap() {
                assert!(acme_ids.contains(&session["id"].as_str().unwrap().to_owned()), "only acme's sessions");
            }
        }
    }
    // A cursor from one tenant's walk, presented by another, walks only the other's sessions.
    let page = acme.get("/api/sessions?limit=1");
    let cursor = page.json["nextCursor"].as_str().unwrap();
    let crossed = globex.get(&format!("/api/sessions?limit=10&cursor={cursor}"));
    assert_eq!(crossed.status, 200);
    for session in crossed.json["sessions"].as_array().unwrap() {
        assert_eq!(session["id"], globex_id.as_str(), "acme's sessions reached globex");
    }
    let mut walked = walk(&acme, 3);
    walked.sort();
    let mut expected = acme_ids.clone();
    expected.sort();
    assert_eq!(walked, expected);
}

#[test]
fn the_whole_list_answers_every_change_at_once() {
    let server = TestServer::start();
    let (a, b) = (server.create_session(json!({ "title": "a" })), server.create_session(json!({ "title": "b" })));
    let titles = || -> Vec<(String, String, u64)> {
        let listed = server.get("/api/sessions").json;
        listed["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let field = |name: &str| s[name].as_str().unwrap().to_owned();
                (field("id"), field("title"), s["messageCount"].as_u64().unwrap())
            })
            .collect()
    };
    assert_eq!(titles().len(), 2);
    // Each change shows in the next answer, however soon after the last it comes.
    for n in 0..5 {
        assert_eq!(server.patch(&format!("/api/sessions/{a}"), json!({ "title": format!("a{n}") })).status, 200);
        assert!(titles().contains(&(a.clone(), format!("a{n}"), 0)), "rename {n}");
    }
    server.run_to_end(&b, "hello");
    assert!(titles().contains(&(b.clone(), "b".into(), 2)), "the run's messages are counted");
    assert_eq!(server.delete(&format!("/api/sessions/{b}")).status, 204);
    assert_eq!(titles(), [(a.clone(), "a4".into(), 0)], "a deletion shows");
    let c = server.create_session(json!({ "title": "c" }));
    assert_eq!(titles()[0].0, c, "a creation shows");
}

#[test]
fn a_sessions_detail_answers_every_change_at_once() {
    let server = TestServer::start();
    let id = server.create_session(json!({}));
    let path = format!("/api/sessions/{id}");
    let detail = || server.get(&path).json["session"].clone();
    assert_eq!(detail()["messages"], json!([]));
    for n in 0..5 {
        assert_eq!(server.patch(&path, json!({ "systemPrompt": format!("p{n}") })).status, 200);
        assert_eq!(detail()["systemPrompt"], format!("p{n}"), "prompt {n}");
    }
    server.run_to_end(&id, "first");
    assert_eq!(detail()["messages"].as_array().unwrap().len(), 2);
    server.run_to_end(&id, "second");
    let messages = detail()["messages"].as_array().unwrap().clone();
    assert_eq!(messages.len(), 4);
    let second = messages[2]["id"].as_str().unwrap();
    let rewound = server.post(&format!("{path}/rewind"), json!({ "messageId": second }));
    assert_eq!(rewound.status, 200, "{}", rewound.text);
    assert_eq!(detail()["messages"].as_array().unwrap().len(), 2, "a rewind shows");
}
