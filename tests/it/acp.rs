//! `kestrel acp` driven by the official ACP client (npm `@agentclientprotocol/sdk`, unchanged)
//! over stdio, on an embedded server: a prompt streamed as message and thought chunks, a tool
//! call approved in the editor (with its diff), one rejected, a cancel while the editor is
//! asked, and after the process ends a new one that lists and reloads the session.

use std::process::Command;

use serde_json::{json, Value};

use crate::support::npm_package;

/// Runs the client script's `phase` against `kestrel acp --data-dir data`; its report.
fn drive(phase: &str, cwd: &std::path::Path, data: &std::path::Path) -> Value {
    let data = data.to_string_lossy();
    drive_with(phase, cwd, &["--data-dir", &data])
}

/// Runs the client script's `phase` against `kestrel acp <args>`; its report.
fn drive_with(phase: &str, cwd: &std::path::Path, args: &[&str]) -> Value {
    let sdk =
        npm_package("acp-sdk", "@agentclientprotocol/sdk@2.4.0", "@agentclientprotocol/sdk/dist/v1/stable/acp.js");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/acp_fixtures/client.mjs");
    let output = Command::new("node")
        .arg(script)
        .arg(&sdk)
        .arg(phase)
        .arg(cwd)
        .arg(env!("CARGO_BIN_EXE_kestrel"))
        .args(args)
        .env_remove("KESTREL_URL")
        .env("KESTREL_BUILTIN_DELAY_MS", "0")
        .current_dir(cwd)
        .output()
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{phase}: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn of_kind<'a>(updates: &'a Value, kind: &str) -> Vec<&'a Value> {
    updates.as_array().unwrap().iter().filter(|u| u["sessionUpdate"] == kind).collect()
}

fn text_of(updates: &Value, kind: &str) -> String {
    of_kind(updates, kind).iter().map(|u| u["content"]["text"].as_str().unwrap_or("")).collect()
}

#[test]
fn an_editor_prompts_approves_rejects_cancels_and_reloads_a_session() {
    let workspace = tempfile::tempdir().unwrap();
    let cwd = workspace.path().canonicalize().unwrap();
    let data = tempfile::tempdir().unwrap();

    let first = drive("first", &cwd, data.path());
    assert_eq!(first["initialize"]["protocolVersion"], 1);
    assert_eq!(first["initialize"]["agentCapabilities"]["loadSession"], true);

    let hello = &first["hello"];
    assert_eq!(hello["stopReason"], "end_turn");
    assert_eq!(text_of(&hello["updates"], "agent_message_chunk"), "Echo: hello there");
    assert!(!text_of(&hello["updates"], "agent_thought_chunk").is_empty(), "reasoning comes as thought chunks");

    // Approved: the call, then its update with the file's diff; the file is there.
    let approved = &first["approved"];
    assert_eq!(approved["stopReason"], "end_turn");
    let call = of_kind(&approved["updates"], "tool_call")[0];
    assert_eq!((&call["kind"], &call["status"]), (&json!("edit"), &json!("pending")));
    assert_eq!(call["title"], "write_file: approved.txt");
    let done = of_kind(&approved["updates"], "tool_call_update").into_iter().find(|u| u["status"] == "completed");
    let diff =
        done.expect("a completed update")["content"].as_array().unwrap().iter().find(|c| c["type"] == "diff").cloned();
    let expected_path = cwd.join("approved.txt").to_string_lossy().into_owned();
    assert_eq!(diff, Some(json!({ "type": "diff", "path": expected_path, "oldText": null, "newText": "one\n" })));
    assert_eq!(std::fs::read_to_string(cwd.join("approved.txt")).unwrap(), "one\n");

    // Rejected: the call fails and the file is not written.
    let rejected = &first["rejected"];
    assert_eq!(rejected["stopReason"], "end_turn");
    assert!(of_kind(&rejected["updates"], "tool_call_update").iter().any(|u| u["status"] == "failed"));
    assert!(!cwd.join("rejected.txt").exists());

    // Cancelled while the editor was asked.
    assert_eq!(first["cancelled"]["stopReason"], "cancelled");
    assert!(!cwd.join("cancelled.txt").exists());
    let permissions = first["permissions"].as_array().unwrap();
    assert_eq!(permissions.len(), 3);
    assert_eq!(permissions[0]["options"], json!(["allow_once", "allow_always", "reject_once"]));
    assert_eq!(permissions[0]["toolCall"]["rawInput"]["path"], "approved.txt");

    // A new process on the same data dir: listed, reloaded, and it goes on.
    let second = drive("reload", &cwd, data.path());
    let listed = second["listed"].as_array().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((&listed[0]["sessionId"], &listed[0]["cwd"]), (&first["sessionId"], &json!(cwd)));
    let replayed = &second["replayed"];
    let said: Vec<&str> =
        of_kind(replayed, "user_message_chunk").iter().map(|u| u["content"]["text"].as_str().unwrap()).collect();
    assert_eq!(said[0], "hello there");
    assert_eq!(said.len(), 4);
    assert!(text_of(replayed, "agent_message_chunk").starts_with("Echo: hello there"));
    assert!(of_kind(replayed, "tool_call").iter().any(|c| c["rawInput"]["path"] == "approved.txt"));
    assert_eq!(second["after"]["stopReason"], "end_turn");
    assert_eq!(text_of(&second["after"]["updates"], "agent_message_chunk"), "Echo: still there?");
}

#[test]
fn a_running_server_with_a_token_is_a_backend_too() {
    let server = crate::support::TestServer::start_with(|config| {
        config.auth.tokens = vec![kestrel::config::TokenConfig::new("acme", "acme-token")];
    });
    let cwd = server.workspace.canonicalize().unwrap();
    let report = drive_with("hello", &cwd, &["--url", &server.base, "--token", "acme-token"]);
    assert_eq!(text_of(&report["hello"]["updates"], "agent_message_chunk"), "Echo: hello there");
    let session = report["sessionId"].as_str().unwrap();
    let acme = server.client().with_token(Some("acme-token"));
    let stored = acme.get(&format!("/api/sessions/{session}")).json["session"].clone();
    assert_eq!(stored["messages"][0]["content"], "hello there");
    assert_eq!(stored["workspace"], json!(cwd));
}
