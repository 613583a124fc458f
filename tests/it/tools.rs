//! The agent's workspace tools and approvals, driven over HTTP by builtin/echo's `/tool` lines.

use std::collections::BTreeMap;
use std::fs;
use std::time::{Duration, Instant};

use kestrel::config::{ModelConfig, ProviderConfig, Wire};
use kestrel::engine::tools::Permission;
use serde_json::{json, Value};

use crate::support::{event_type, is_run_end, SseClient, TestServer};

/// A server whose every tool runs without asking, unless `ask` names it.
fn server(ask: &[&str]) -> TestServer {
    let ask: Vec<String> = ask.iter().map(|s| s.to_string()).collect();
    TestServer::start_with(move |config| {
        let mut permissions = BTreeMap::new();
        for tool in ["write_file", "edit_file", "run_command"] {
            let permission = if ask.iter().any(|a| a == tool) { Permission::Ask } else { Permission::Auto };
            permissions.insert(tool.to_string(), permission);
        }
        config.agent.permissions = permissions;
    })
}

fn tool_line(name: &str, arguments: Value) -> String {
    format!("/tool {name} {arguments}")
}

/// Runs one tool call through the echo model; returns its `tool.finished` result.
fn call(server: &TestServer, session: &str, name: &str, arguments: Value) -> Value {
    let events = server.run_to_end(session, &tool_line(name, arguments));
    result_of(&events)
}

fn result_of(events: &[Value]) -> Value {
    let finished = events.iter().find(|e| event_type(e) == "tool.finished").unwrap_or_else(|| panic!("{events:#?}"));
    finished["event"]["result"].clone()
}

fn content(result: &Value) -> &str {
    result["content"].as_str().unwrap()
}

#[test]
fn read_file_numbers_lines_pages_and_describes_binaries() {
    let server = server(&[]);
    fs::write(server.workspace.join("poem.txt"), "one\ntwo\nthree\nfour\n").unwrap();
    fs::write(server.workspace.join("blob.bin"), [0u8, 159, 146, 150]).unwrap();
    let session = server.create_session(json!({}));

    let result = call(&server, &session, "read_file", json!({ "path": "poem.txt" }));
    assert_eq!(result["ok"], true);
    assert_eq!(content(&result), "     1\tone\n     2\ttwo\n     3\tthree\n     4\tfour");
    let page = call(&server, &session, "read_file", json!({ "path": "poem.txt", "offset": 2, "limit": 2 }));
    assert!(content(&page).starts_with("     2\ttwo\n     3\tthree\n[lines 2-3 of 4"), "{}", content(&page));
    let binary = call(&server, &session, "read_file", json!({ "path": "blob.bin" }));
    assert_eq!(binary["ok"], true);
    assert!(content(&binary).contains("binary file"), "{}", content(&binary));
    let missing = call(&server, &session, "read_file", json!({ "path": "nope.txt" }));
    assert_eq!(missing["ok"], false);
    assert!(content(&missing).contains("does not exist"));
    let no_path = call(&server, &session, "read_file", json!({}));
    assert!(content(&no_path).contains("`path` is required"));
}

#[test]
fn list_find_and_search_skip_ignored_and_binary_files() {
    let server = server(&[]);
    let ws = &server.workspace;
    fs::create_dir_all(ws.join("src/nested")).unwrap();
    fs::create_dir_all(ws.join("target/debug")).unwrap();
    fs::create_dir_all(ws.join("node_modules/pkg")).unwrap();
    fs::write(ws.join("src/main.rs"), "fn main() {\n    println!(\"needle\");\n}\n").unwrap();
    fs::write(ws.join("src/nested/lib.rs"), "// NEEDLE in caps\n").unwrap();
    fs::write(ws.join("target/debug/build.rs"), "needle in target\n").unwrap();
    fs::write(ws.join("node_modules/pkg/index.js"), "needle in deps\n").unwrap();
    fs::write(ws.join("image.bin"), b"needle\0binary").unwrap();
    let session = server.create_session(json!({}));

    let listing = call(&server, &session, "list_directory", json!({}));
    let lines: Vec<&str> = content(&listing).lines().collect();
    assert_eq!(&lines[..3], ["node_modules/", "src/", "target/"], "directories first, by name");
    assert!(lines.contains(&"image.bin (13 bytes)"));
    let not_dir = call(&server, &session, "list_directory", json!({ "path": "src/main.rs" }));
    assert_eq!(not_dir["ok"], false);

    let found = call(&server, &session, "find_files", json!({ "pattern": "**/*.rs" }));
    assert_eq!(content(&found), "src/main.rs\nsrc/nested/lib.rs");
    let several = call(&server, &session, "find_files", json!({ "pattern": ["*.bin", "lib.rs"] }));
    assert_eq!(content(&several), "image.bin\nsrc/nested/lib.rs");
    let bad_glob = call(&server, &session, "find_files", json!({ "pattern": "[" }));
    assert_eq!(bad_glob["ok"], false);

    let hits = call(&server, &session, "search_text", json!({ "pattern": "needle" }));
    assert_eq!(content(&hits), "src/main.rs:2:     println!(\"needle\");");
    let caseless =
        call(&server, &session, "search_text", json!({ "pattern": "needle", "caseInsensitive": true, "glob": "*.rs" }));
    assert_eq!(content(&caseless), "src/main.rs:2:     println!(\"needle\");\nsrc/nested/lib.rs:1: // NEEDLE in caps");
    let scoped = call(&server, &session, "search_text", json!({ "pattern": "(?i)needle", "path": "src/nested" }));
    assert_eq!(content(&scoped), "src/nested/lib.rs:1: // NEEDLE in caps");
    let bad_regex = call(&server, &session, "search_text", json!({ "pattern": "(" }));
    assert_eq!(bad_regex["ok"], false);
    assert!(content(&bad_regex).contains("regular expression"));
}

#[test]
fn write_and_edit_change_files_and_report_a_diff() {
    let server = server(&[]);
    let session = server.create_session(json!({}));
    let written = call(
        &server,
        &session,
        "write_file",
        json!({ "path": "deep/new dir/notes.md", "content": "alpha\nbeta\nbeta\n" }),
    );
    assert_eq!(written["ok"], true, "{written}");
    assert_eq!(written["data"]["created"], true);
    assert_eq!(fs::read_to_string(server.workspace.join("deep/new dir/notes.md")).unwrap(), "alpha\nbeta\nbeta\n");

    let ambiguous = call(
        &server,
        &session,
        "edit_file",
        json!({ "path": "deep/new dir/notes.md", "oldString": "beta", "newString": "gamma" }),
    );
    assert_eq!(ambiguous["ok"], false);
    assert!(content(&ambiguous).contains("appears 2 times"), "{}", content(&ambiguous));
    let absent = call(
        &server,
        &session,
        "edit_file",
        json!({ "path": "deep/new dir/notes.md", "oldString": "delta", "newString": "x" }),
    );
    assert!(content(&absent).contains("not found"));
    let edited = call(
        &server,
        &session,
        "edit_file",
        json!({ "path": "deep/new dir/notes.md", "oldString": "alpha", "newString": "ALPHA" }),
    );
    assert_eq!(edited["ok"], true);
    assert_eq!(
        edited["data"]["diff"],
        "--- a/deep/new dir/notes.md\n+++ b/deep/new dir/notes.md\n@@ -1,3 +1,3 @@\n-alpha\n+ALPHA\n beta\n beta\n"
    );
    let all = call(
        &server,
        &session,
        "edit_file",
        json!({ "path": "deep/new dir/notes.md", "oldString": "beta", "newString": "gamma", "replaceAll": true }),
    );
    assert_eq!(all["data"]["replacements"], 2);
    assert_eq!(fs::read_to_string(server.workspace.join("deep/new dir/notes.md")).unwrap(), "ALPHA\ngamma\ngamma\n");
    // The diff is for clients; the model sees only the summary.
    let messages = server.get(&format!("/api/sessions/{session}")).json["session"]["messages"].clone();
    let stored = messages.as_array().unwrap().iter().rev().find(|m| m["role"] == "tool").unwrap();
    assert!(!stored["content"].as_str().unwrap().contains("+++"), "{stored}");
}

#[test]
fn run_command_reports_exit_codes_interleaves_output_and_hides_secrets() {
    // A provider key named by a variable the test process already has (setting one here would
    // race with the other tests' threads): the command must not see it. Cargo sets the first
    // for every test process.
    let secret = ["CARGO_MANIFEST_DIR", "HOME", "PWD"]
        .into_iter()
        .find(|name| std::env::var(name).is_ok_and(|value| !value.is_empty()))
        .expect("some variable is set");
    let server = TestServer::start_with(move |config| {
        config.agent.permissions.insert("run_command".into(), Permission::Auto);
        config.agent.tool_output_limit_chars = 2_000;
        let mut provider = ProviderConfig::new(Wire::Openai, "http://127.0.0.1:9/v1");
        provider.api_key_env = Some(secret.into());
        provider.models.push(ModelConfig::named("m"));
        config.providers.insert("hidden".into(), provider);
    });
    let session = server.create_session(json!({}));
    let result =
        call(&server, &session, "run_command", json!({ "command": "echo out; echo err >&2; echo out2; exit 3" }));
    assert_eq!(result["ok"], false);
    assert_eq!(result["data"]["exitCode"], 3);
    assert_eq!(content(&result), "exit code 3\nout\nerr\nout2\n");
    let env = call(&server, &session, "run_command", json!({ "command": format!("echo \"key=[${secret}]\"; pwd") }));
    assert_eq!(env["ok"], true);
    assert!(content(&env).contains("key=[]"), "{}", content(&env));
    assert!(content(&env).contains(server.workspace.canonicalize().unwrap().to_str().unwrap()));
    let long = call(&server, &session, "run_command", json!({ "command": "yes abcdefghij | head -c 100000" }));
    assert!(content(&long).contains("[output truncated"), "the model's copy is capped");
    assert!(content(&long).chars().count() < 2_100);
}

#[test]
fn a_command_that_outlives_its_timeout_is_killed() {
    let server = server(&[]);
    let session = server.create_session(json!({}));
    let started = Instant::now();
    let result = call(&server, &session, "run_command", json!({ "command": "echo begun; sleep 30", "timeoutSecs": 1 }));
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(result["ok"], false);
    assert_eq!(result["data"]["timedOut"], true);
    assert!(content(&result).starts_with("timed out after 1 s"), "{}", content(&result));
    assert!(content(&result).contains("begun"));
}

#[test]
fn cancel_kills_a_running_command_and_its_whole_process_group() {
    let server = server(&[]);
    let session = server.create_session(json!({}));
    let mut stream = server.events(&format!("/api/sessions/{session}/events"));
    let line = tool_line("run_command", json!({ "command": "sleep 30 & echo $! > child.pid; wait" }));
    let second = tool_line("write_file", json!({ "path": "after-cancel.txt", "content": "must not exist" }));
    server.post(&format!("/api/sessions/{session}/messages"), json!({ "content": format!("{line}\n{second}") }));
    stream.collect_until(|e| event_type(e) == "tool.started");
    let pid_file = server.workspace.join("child.pid");
    crate::support::wait_until("the command to start its child", || {
        fs::read_to_string(&pid_file).is_ok_and(|p| !p.trim().is_empty())
    });
    // The child's `$!` is a pid of the command's sandbox (its own PID namespace) when it has
    // one: the host sees the command's processes by the session's marker instead.
    assert!(marked_processes(&session) >= 2, "the shell and its child carry the marker");
    let asked = Instant::now();
    assert_eq!(server.post(&format!("/api/sessions/{session}/cancel"), json!({})).json["cancelled"], true);
    let events = stream.collect_until(is_run_end);
    assert!(asked.elapsed() < Duration::from_secs(1), "took {:?}", asked.elapsed());
    assert_eq!(events.last().unwrap()["event"]["status"], "cancelled");
    let killed = result_of(&events);
    assert_eq!(killed["data"]["cancelled"], true);
    crate::support::wait_until("the grandchild to die", || marked_processes(&session) == 0);
    assert_eq!(events.iter().filter(|e| event_type(e) == "tool.started").count(), 0, "the second call never started");
    assert!(!server.workspace.join("after-cancel.txt").exists());
    // The call that never ran is answered, so the transcript stays valid for the next turn.
    let messages = server.get(&format!("/api/sessions/{session}")).json["session"]["messages"].clone();
    let last = messages.as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["role"], "tool");
    assert!(last["content"].as_str().unwrap().contains("cancelled the run before this tool call ran"));
}

/// How many live processes carry `session`'s `KESTREL_COMMAND` marker.
fn marked_processes(session: &str) -> usize {
    crate::sandbox::marked(session).len()
}

fn approval_path(session: &str, approval: &Value) -> String {
    format!("/api/sessions/{session}/approvals/{}", approval["id"].as_str().unwrap())
}

/// Sends a tool line that needs approval and returns the stream and the approval request.
fn start_asking(server: &TestServer, session: &str, line: &str) -> (SseClient, Value) {
    let mut stream = server.events(&format!("/api/sessions/{session}/events"));
    assert_eq!(server.post(&format!("/api/sessions/{session}/messages"), json!({ "content": line })).status, 202);
    let events = stream.collect_until(|e| event_type(e) == "approval.requested");
    let approval = events.last().unwrap()["event"]["approval"].clone();
    (stream, approval)
}

#[test]
fn an_approved_call_runs_and_a_denied_one_carries_the_note() {
    let server = server(&["write_file"]);
    let session = server.create_session(json!({}));
    let line = tool_line("write_file", json!({ "path": "approved.txt", "content": "yes" }));
    let (mut stream, approval) = start_asking(&server, &session, &line);
    assert_eq!(approval["toolName"], "write_file");
    assert_eq!(approval["arguments"]["path"], "approved.txt");
    assert!(!server.workspace.join("approved.txt").exists(), "nothing runs before the answer");
    let response = server.post(&approval_path(&session, &approval), json!({ "approved": true }));
    assert_eq!(response.status, 200);
    assert_eq!(response.json, json!({ "resolved": true }));
    let events = stream.collect_until(is_run_end);
    let resolved = events.iter().find(|e| event_type(e) == "approval.resolved").unwrap();
    assert_eq!(resolved["event"]["approved"], true);
    assert_eq!(resolved["event"]["approvalId"], approval["id"]);
    assert_eq!(result_of(&events)["ok"], true);
    assert_eq!(fs::read_to_string(server.workspace.join("approved.txt")).unwrap(), "yes");
    // Answering twice: the approval is gone.
    server
        .post(&approval_path(&session, &approval), json!({ "approved": true }))
        .assert_error(404, "approval_not_found");

    let line = tool_line("write_file", json!({ "path": "denied.txt", "content": "no" }));
    let (mut stream, approval) = start_asking(&server, &session, &line);
    server
        .post(&approval_path(&session, &approval), json!({ "approved": "yes" }))
        .assert_error(400, "invalid_decision");
    server
        .post(&approval_path(&session, &approval), json!({ "approved": false, "note": 5 }))
        .assert_error(400, "invalid_decision");
    server
        .post(&format!("/api/sessions/{session}/approvals/apr_unknown"), json!({ "approved": true }))
        .assert_error(404, "approval_not_found");
    let other = server.create_session(json!({}));
    server.post(&approval_path(&other, &approval), json!({ "approved": true })).assert_error(404, "approval_not_found");
    let response = server.post(&approval_path(&session, &approval), json!({ "approved": false, "note": "wrong file" }));
    assert_eq!(response.status, 200);
    let events = stream.collect_until(is_run_end);
    let denied = result_of(&events);
    assert_eq!(denied["ok"], false);
    assert!(content(&denied).contains("denied") && content(&denied).contains("wrong file"), "{denied}");
    assert!(!server.workspace.join("denied.txt").exists());
    assert_eq!(events.last().unwrap()["event"]["status"], "completed", "the model got the denial and answered");
}

#[test]
fn cancel_while_waiting_for_an_approval_ends_the_run() {
    let server = server(&["run_command"]);
    let session = server.create_session(json!({}));
    let line = tool_line("run_command", json!({ "command": "touch ran.txt" }));
    let (mut stream, approval) = start_asking(&server, &session, &line);
    let asked = Instant::now();
    assert_eq!(server.post(&format!("/api/sessions/{session}/cancel"), json!({})).json["cancelled"], true);
    let events = stream.collect_until(is_run_end);
    assert!(asked.elapsed() < Duration::from_secs(1));
    assert_eq!(events.last().unwrap()["event"]["status"], "cancelled");
    let resolved = events.iter().find(|e| event_type(e) == "approval.resolved").unwrap();
    assert_eq!(resolved["event"]["approved"], false);
    server
        .post(&approval_path(&session, &approval), json!({ "approved": true }))
        .assert_error(404, "approval_not_found");
    assert!(!server.workspace.join("ran.txt").exists());
}

#[test]
fn a_denied_tool_is_not_offered_and_cannot_run() {
    let server = TestServer::start_with(|config| {
        config.agent.permissions.insert("run_command".into(), Permission::Deny);
    });
    let tools = server.get("/api/bootstrap").json["tools"].clone();
    let names: Vec<&str> = tools.as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["read_file", "list_directory", "find_files", "search_text", "write_file", "edit_file"]);
    let write = tools.as_array().unwrap().iter().find(|t| t["name"] == "write_file").unwrap();
    assert_eq!(write["permission"], "ask");
    assert_eq!(write["category"], "filesystem");
    assert_eq!(write["parameters"]["type"], "object");
    let session = server.create_session(json!({}));
    let result = call(&server, &session, "run_command", json!({ "command": "touch x" }));
    assert_eq!(result["ok"], false);
    assert!(content(&result).contains("disabled"));
    assert!(!server.workspace.join("x").exists());
}

#[test]
fn tools_refuse_paths_outside_the_workspace() {
    let server = server(&[]);
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("secret.txt"), "top secret").unwrap();
    std::os::unix::fs::symlink("/etc", server.workspace.join("etc-link")).unwrap();
    std::os::unix::fs::symlink(outside.path(), server.workspace.join("outside-dir")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret.txt"), server.workspace.join("secret-link")).unwrap();
    let session = server.create_session(json!({}));
    let attempts = [
        ("read_file", json!({ "path": "../secret.txt" })),
        ("read_file", json!({ "path": "/etc/passwd" })),
        ("read_file", json!({ "path": "etc-link/passwd" })),
        ("read_file", json!({ "path": "secret-link" })),
        ("list_directory", json!({ "path": "outside-dir" })),
        ("find_files", json!({ "pattern": "*", "path": "outside-dir" })),
        ("search_text", json!({ "pattern": "secret", "path": "outside-dir" })),
        ("write_file", json!({ "path": "outside-dir/planted.txt", "content": "x" })),
        ("write_file", json!({ "path": "a/../../planted.txt", "content": "x" })),
        ("edit_file", json!({ "path": "secret-link", "oldString": "top", "newString": "no" })),
    ];
    for (tool, arguments) in attempts {
        let result = call(&server, &session, tool, arguments.clone());
        assert_eq!(result["ok"], false, "{tool} {arguments}: {result}");
        let text = content(&result);
        assert!(text.contains("outside the workspace") || text.contains("absolute"), "{tool} {arguments}: {text}");
    }
    assert!(!outside.path().join("planted.txt").exists());
    assert_eq!(fs::read_to_string(outside.path().join("secret.txt")).unwrap(), "top secret");
    // Odd but legal names work.
    let odd = "spaced name ü #1 'quoted'.txt";
    let written = call(&server, &session, "write_file", json!({ "path": odd, "content": "fine" }));
    assert_eq!(written["ok"], true, "{written}");
    assert_eq!(content(&call(&server, &session, "read_file", json!({ "path": odd }))), "     1\tfine");
}

#[test]
fn a_provider_driven_edit_is_approved_and_only_its_content_reaches_the_model() {
    use crate::fake_provider::{openai, FakeProvider, Reply};
    let fake = FakeProvider::start();
    let arguments = json!({ "path": "lib.rs", "oldString": "old_name", "newString": "new_name" }).to_string();
    let mut first = openai::chunk(
        json!({ "tool_calls": [{ "index": 0, "id": "call_edit", "type": "function", "function": { "name": "edit_file", "arguments": arguments } }] }),
        None,
    );
    first.push_str(&openai::chunk(json!({}), Some("tool_calls")));
    first.push_str(openai::DONE);
    let second = openai::text(&[], &["Renamed."], &openai::usage(1, 1, 0, 0));
    fake.script([Reply::stream(first.as_bytes(), 2), Reply::stream(second.as_bytes(), 1)]);
    let base_url = fake.base_url.clone();
    let server = TestServer::start_with(move |config| {
        let mut provider = ProviderConfig::new(Wire::Openai, base_url);
        provider.models.push(ModelConfig::named("m"));
        config.providers.insert("fake".into(), provider);
    });
    fs::write(server.workspace.join("lib.rs"), "fn old_name() {}\n").unwrap();
    let session = server.create_session(json!({ "model": "fake/m" }));
    let (mut stream, approval) = start_asking(&server, &session, "rename it");
    assert_eq!(approval["callId"], "call_edit");
    server.post(&approval_path(&session, &approval), json!({ "approved": true }));
    let events = stream.collect_until(is_run_end);
    let result = result_of(&events);
    assert!(result["data"]["diff"].as_str().unwrap().contains("+fn new_name() {}"));
    assert_eq!(fs::read_to_string(server.workspace.join("lib.rs")).unwrap(), "fn new_name() {}\n");
    let follow_up = &fake.requests()[1].body;
    let tool_message = follow_up["messages"].as_array().unwrap().iter().find(|m| m["role"] == "tool").unwrap();
    assert_eq!(tool_message["content"], "Edited lib.rs: 1 replacement(s).");
    assert!(!follow_up.to_string().contains("+++"), "the diff never reaches the model");
    assert_eq!(events.last().unwrap()["event"]["status"], "completed");
}
