//! Forks over HTTP: the transcript up to a message with ids of its own, `forkedFrom` kept
//! across a restart, a shared workspace or a copy put back from the checkpoints (beside the
//! source, under its `.kestrel-forks`, or where asked), and the refusals.

use std::fs;

use kestrel::engine::tools::Permission;
use serde_json::{json, Value};

use crate::support::{event_type, TestServer};

fn server() -> TestServer {
    TestServer::start_with(|config| {
        config.agent.permissions.insert("write_file".into(), Permission::Auto);
    })
}

fn write(path: &str, content: &str) -> String {
    format!("/tool write_file {}", json!({ "path": path, "content": content }))
}

fn session(server: &TestServer, id: &str) -> Value {
    let answer = server.get(&format!("/api/sessions/{id}"));
    assert_eq!(answer.status, 200, "{}", answer.text);
    answer.json["session"].clone()
}

fn messages(session: &Value) -> Vec<Value> {
    session["messages"].as_array().unwrap().clone()
}

fn fork(server: &TestServer, id: &str, body: Value) -> Value {
    let forked = server.post(&format!("/api/sessions/{id}/fork"), body);
    assert_eq!(forked.status, 201, "{}", forked.text);
    forked.json
}

#[test]
fn a_fork_keeps_the_transcript_up_to_a_message_and_where_it_came_from_across_a_restart() {
    let mut server = server();
    let id = server.create_session(json!({ "title": "origin" }));
    server.run_to_end(&id, "first question");
    server.run_to_end(&id, "second question");
    let source = messages(&session(&server, &id));
    assert_eq!(source.len(), 4);
    let cut = source[1]["id"].as_str().unwrap().to_string();

    let forked = fork(&server, &id, json!({ "messageId": cut }));
    let copy = &forked["session"];
    let fork_id = copy["id"].as_str().unwrap().to_string();
    assert_ne!(fork_id, id);
    assert_eq!(copy["title"], "origin (fork)");
    assert_eq!(copy["forkedFrom"], json!({ "sessionId": id, "messageId": cut }));
    assert_eq!(copy["workspace"], session(&server, &id)["workspace"], "the workspace is shared by default");
    assert!(forked.get("copiedFrom").is_none(), "{forked}");
    let kept = messages(copy);
    assert_eq!(kept.len(), 2);
    for (copied, original) in kept.iter().zip(&source) {
        assert_ne!(copied["id"], original["id"], "a copy has an id of its own");
        assert_eq!((&copied["role"], &copied["content"]), (&original["role"], &original["content"]));
    }

    // The fork goes on alone; the source is untouched.
    let events = server.run_to_end(&fork_id, "a different second question");
    assert!(events.iter().any(|e| event_type(e) == "run.finished"), "{events:#?}");
    assert_eq!(messages(&session(&server, &fork_id)).len(), 4);
    assert_eq!(messages(&session(&server, &id)), source);

    // The whole transcript without `messageId`; the list shows both.
    let whole = fork(&server, &id, json!({ "workspace": "share" }));
    assert_eq!(messages(&whole["session"]).len(), 4);
    assert_eq!(whole["session"]["forkedFrom"]["messageId"], source[3]["id"]);
    let listed = server.get("/api/sessions").json["sessions"].as_array().unwrap().len();
    assert_eq!(listed, 3);

    server.restart(|_| {});
    let again = session(&server, &fork_id);
    assert_eq!(again["forkedFrom"], json!({ "sessionId": id, "messageId": cut }));
    assert_eq!(messages(&again).len(), 4);
    assert!(session(&server, &id).get("forkedFrom").is_none());
}

#[test]
fn a_copy_holds_the_files_as_they_were_at_the_message_and_the_source_keeps_its_own() {
    let server = server();
    let id = server.create_session(json!({}));
    server.run_to_end(&id, &write("a.txt", "one\n"));
    let after_first = messages(&session(&server, &id)).last().unwrap()["id"].clone();
    server.run_to_end(&id, &[write("a.txt", "two\n"), write("b/new.txt", "new\n")].join("\n"));

    // At the end of the first run: the second run's automatic checkpoint holds those files.
    let forked = fork(&server, &id, json!({ "messageId": after_first, "workspace": "copy" }));
    let (copied_from, fork_id) = (&forked["copiedFrom"], forked["session"]["id"].as_str().unwrap());
    assert_eq!(copied_from["kind"], "auto", "{forked}");
    let directory = std::path::PathBuf::from(forked["session"]["workspace"].as_str().unwrap());
    // The source's workspace is a root: the copy goes under its `.kestrel-forks`.
    assert_eq!(directory, server.workspace.canonicalize().unwrap().join(".kestrel-forks").join(fork_id));
    assert_eq!(fs::read_to_string(directory.join("a.txt")).unwrap(), "one\n");
    assert!(!directory.join("b").exists());
    assert_eq!(fs::read_to_string(server.workspace.join("a.txt")).unwrap(), "two\n");

    // The fork's tools work in its copy.
    server.run_to_end(fork_id, &write("a.txt", "forked\n"));
    assert_eq!(fs::read_to_string(directory.join("a.txt")).unwrap(), "forked\n");
    assert_eq!(fs::read_to_string(server.workspace.join("a.txt")).unwrap(), "two\n");

    // With no later checkpoint, the files as they are now; the source's own checkpoints
    // leave the copies out.
    let now = fork(&server, &id, json!({ "workspace": "copy" }));
    assert_eq!(now["copiedFrom"]["kind"], "manual", "{now}");
    let now_directory = std::path::PathBuf::from(now["session"]["workspace"].as_str().unwrap());
    assert_eq!(fs::read_to_string(now_directory.join("b/new.txt")).unwrap(), "new\n");
    let checkpoint = server.post(&format!("/api/sessions/{id}/checkpoints"), json!({}));
    assert_eq!(checkpoint.json["checkpoint"]["fileCount"], 2, "{}", checkpoint.text);
}

#[test]
fn a_copy_goes_beside_the_source_or_where_asked_inside_the_roots() {
    let server = server();
    let project = server.workspace.join("project");
    fs::create_dir_all(&project).unwrap();
    fs::write(project.join("readme.md"), "hello\n").unwrap();
    let id = server.create_session(json!({ "workspace": project }));

    let beside = fork(&server, &id, json!({ "workspace": "copy" }));
    let directory = std::path::PathBuf::from(beside["session"]["workspace"].as_str().unwrap());
    let name = directory.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(directory.parent().unwrap(), server.workspace.canonicalize().unwrap());
    assert!(name.starts_with("project-fork-") && name.len() == "project-fork-".len() + 8, "{name}");
    assert_eq!(fs::read_to_string(directory.join("readme.md")).unwrap(), "hello\n");

    let asked = server.workspace.join("copies").join("mine");
    fs::create_dir_all(asked.parent().unwrap()).unwrap();
    let placed = fork(&server, &id, json!({ "workspace": "copy", "path": asked }));
    assert_eq!(placed["session"]["workspace"], json!(asked.canonicalize().unwrap()));
    assert_eq!(fs::read_to_string(asked.join("readme.md")).unwrap(), "hello\n");

    // Refusals: an existing directory, a link in the new name's place, outside the roots, a
    // relative path, a path with a share, bad shapes, unknown sessions and messages.
    let path = format!("/api/sessions/{id}/fork");
    server.post(&path, json!({ "workspace": "copy", "path": asked })).assert_error(400, "invalid_body");
    let link = server.workspace.join("copies").join("link");
    std::os::unix::fs::symlink(std::env::temp_dir(), &link).unwrap();
    server.post(&path, json!({ "workspace": "copy", "path": link })).assert_error(400, "invalid_body");
    let outside = tempfile::tempdir().unwrap();
    let elsewhere = outside.path().join("fork");
    server.post(&path, json!({ "workspace": "copy", "path": elsewhere })).assert_error(403, "forbidden");
    assert!(!elsewhere.exists());
    server.post(&path, json!({ "workspace": "copy", "path": "relative/dir" })).assert_error(400, "invalid_body");
    server.post(&path, json!({ "workspace": "share", "path": asked })).assert_error(400, "invalid_body");
    server.post(&path, json!({ "workspace": "clone" })).assert_error(400, "invalid_body");
    server.post(&path, json!({ "messageId": 7 })).assert_error(400, "invalid_body");
    server.post(&path, json!({ "messageId": "msg_nope" })).assert_error(404, "message_not_found");
    server.post("/api/sessions/ses_nope/fork", json!({})).assert_error(404, "session_not_found");
    assert_eq!(server.get("/api/sessions").json["sessions"].as_array().unwrap().len(), 3);
}

#[test]
fn the_console_forks_from_a_message_into_a_copy_and_opens_the_fork() {
    let Some(browser) = crate::browser::browser() else { return };
    let server = server();
    browser.open(&format!("{}/", server.base));
    browser.wait_for("the console", "document.querySelector('#new-session')");
    let id = crate::console::create_session_in_page(&browser, "Origin");
    crate::console::send_in_page(&browser, &write("a.txt", "one\n"));
    browser.wait_for("the first run's end", "document.querySelectorAll('.run-end.completed').length >= 1");
    crate::console::send_in_page(&browser, &write("a.txt", "two\n"));
    browser.wait_for("the second run's end", "document.querySelectorAll('.run-end.completed').length >= 2");

    // Fork from the second user message, with a copy of the files as they were then.
    browser.eval("document.querySelectorAll('article.message.user button.fork')[1].click();", json!([]));
    browser.wait_for("the fork dialog", "document.querySelector('.dialog input[type=checkbox]')");
    browser.click(".dialog input[type=checkbox]");
    browser.click(".dialog button.primary");
    browser.wait_for(
        "the fork's view",
        &format!("location.hash.startsWith('#/s/') && !location.hash.endsWith('{id}') && document.querySelector('.session-title')"),
    );
    let hash = browser.eval("return location.hash;", json!([]));
    let fork_id = hash.as_str().unwrap().trim_start_matches("#/s/").to_string();
    let fork = session(&server, &fork_id);
    assert_eq!(fork["forkedFrom"]["sessionId"], id.as_str());
    let kept = messages(&fork);
    assert_eq!(kept.last().unwrap()["role"], "user");
    assert_eq!(kept.last().unwrap()["content"], write("a.txt", "two\n"));
    let directory = std::path::PathBuf::from(fork["workspace"].as_str().unwrap());
    assert_eq!(fs::read_to_string(directory.join("a.txt")).unwrap(), "one\n", "as before the second run");
    assert_eq!(fs::read_to_string(server.workspace.join("a.txt")).unwrap(), "two\n");
    browser.wait_for(
        "the fork's transcript",
        &format!("document.querySelectorAll('article.message.user').length === {}", 2),
    );
}
