//! BAE's server-run calls under `kill -9`: a call that was running when the server died is
//! recorded in the session's history as an error result, never run again, and the session's
//! next turn works.

use serde_json::{json, Value};

use super::support::{send, types, Harness};
use crate::support::{spawn_binary, wait_until};

/// The real binary on `data`, with the offline model answering BAE turns; its base URL and
/// its admin API's.
fn start(data: &std::path::Path, workspace: &std::path::Path) -> (std::process::Child, String, String) {
    spawn_binary(data, workspace, "[builtin]\ndelay_ms = 0\n")
}

/// A session whose client declares an auto-mode sandbox tool `shell`, its sandbox started.
fn sandboxed_session(base: &str, admin: &str, data: &std::path::Path) -> Harness {
    let admin_key = std::fs::read_to_string(data.join("admin-key")).unwrap().trim().to_string();
    let body = json!({ "name": "crash", "primary_provider": "builtin/echo", "available_sandboxes": ["alpine:3.19"] });
    let profile = send(admin, "POST", "/admin/v1/profiles", Some(&admin_key), Some(body));
    assert_eq!(profile.status, 201, "{}", profile.text);
    let body = json!({ "name": "crash", "profile_id": profile.json["id"] });
    let key = send(admin, "POST", "/admin/v1/keys", Some(&admin_key), Some(body));
    let key = key.json["key"].as_str().unwrap().to_string();
    let shell = json!({ "name": "shell", "description": "Run a command",
        "input_schema": { "type": "object", "properties": { "command": { "type": "string" } } } });
    let mut harness = Harness::open_with(base, &key, json!({ "tools": [], "sandbox_tools": [shell] }));
    let started = harness.call("session.startRemoteSandbox", json!({ "image": "alpine:3.19" }));
    assert!(started.last().unwrap()["result"].is_object(), "{started:?}");
    harness
}

/// Every file named `name` under `root`.
fn found(root: &std::path::Path, name: &str) -> Vec<std::path::PathBuf> {
    let mut hits = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            match entry.file_type() {
                Ok(kind) if kind.is_dir() => dirs.push(path),
                Ok(_) if entry.file_name() == name => hits.push(path),
                _ => {}
            }
        }
    }
    hits
}

#[test]
fn a_sandbox_call_running_at_kill_9_is_recorded_as_an_error_result_and_never_run_again() {
    let data = tempfile::tempdir().unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let (mut child, base, admin) = start(data.path(), workspace.path());
    let mut harness = sandboxed_session(&base, &admin, data.path());
    let command = json!({ "command": "echo started >> ran.log; sleep 5; echo finished >> ran.log" });
    let line = format!("/tool shell {command}");
    let turn = harness.start("session.sendMessage", json!({ "message": { "role": "user", "content": line } }));
    wait_until("the command to start", || {
        found(data.path(), "ran.log")
            .iter()
            .any(|log| std::fs::read_to_string(log).is_ok_and(|l| l.contains("started")))
    });
    child.kill().unwrap();
    child.wait().unwrap();
    drop(turn);

    let (mut child, base, _) = start(data.path(), workspace.path());
    harness.base = base;
    let events = harness.events();
    let result = events.iter().rev().find(|e| e["event_type"] == "tool.result").expect("the killed call's result");
    assert_eq!(result["payload"]["is_error"], true, "{result}");
    assert_eq!(
        result["payload"]["content"],
        json!([{ "type": "text", "text": kestrel::api::bae::core::INTERRUPTED_RESULT }])
    );
    let tail: Vec<String> = types(&events).into_iter().rev().take(3).collect();
    assert_eq!(tail, ["server.message.send", "tool.result", "server.message.send"], "{events:?}");

    // The session goes on: a new turn answers, and the killed command never ran again.
    let registered = harness.call("session.registerDriver", json!({}));
    assert_eq!(registered.last().unwrap()["result"]["registered"], true, "{registered:?}");
    let frames = harness.send_message(json!("still there?"));
    let answer: &Value = &frames.last().unwrap()["result"]["message"];
    assert!(answer["content"].to_string().contains("still there?"), "{frames:?}");
    let logs = found(data.path(), "ran.log");
    assert_eq!(logs.len(), 1, "{logs:?}");
    let ran = std::fs::read_to_string(&logs[0]).unwrap();
    assert_eq!(ran, "started\n", "started once, killed with the server, never run again");
    child.kill().unwrap();
    child.wait().unwrap();
}
