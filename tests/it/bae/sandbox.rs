//! A session's remote sandbox with the local driver: start from an allowed image, exec, stop,
//! the refusals with their codes, the lifecycle events, and close stopping it.

use serde_json::{json, Value};

use super::support::{send, types, Bae, Harness};

fn call(harness: &mut Harness, method: &str, params: Value) -> Value {
    harness.call(method, params).last().unwrap().clone()
}

#[test]
fn a_remote_sandbox_starts_runs_commands_stops_and_close_stops_it_too() {
    let bae = Bae::start();
    let body = json!({ "name": "boxed", "primary_provider": "fake", "allowed_tools": [], "available_sandboxes": ["alpine:3.19"] });
    let profile = bae.admin_send("POST", "/admin/v1/profiles", Some(body));
    assert_eq!(profile.status, 201, "{}", profile.text);
    let (_, key) = bae.client_key(profile.json["id"].as_str().unwrap());
    let mut harness = Harness::open(bae.base(), &key, &[]);

    let code = |answer: &Value| answer["error"]["code"].clone();
    assert_eq!(code(&call(&mut harness, "session.execRemoteSandbox", json!({ "command": "true" }))), -32013);
    assert_eq!(code(&call(&mut harness, "session.stopRemoteSandbox", json!({}))), -32013);
    assert_eq!(code(&call(&mut harness, "session.startRemoteSandbox", json!({ "image": " " }))), -32602);
    let refused = call(&mut harness, "session.startRemoteSandbox", json!({ "image": "python:3.12" }));
    assert_eq!(code(&refused), -32011);
    assert_eq!(
        refused["error"]["message"],
        "sandbox_image_not_allowed: image \"python:3.12\" is not in this session profile's available_sandboxes"
    );

    let started = call(&mut harness, "session.startRemoteSandbox", json!({ "image": "alpine:3.19" }));
    let sandbox_id = started["result"]["sandbox_id"].as_str().unwrap_or_else(|| panic!("{started}")).to_string();
    assert_eq!(started["result"]["image"], "alpine:3.19");
    assert!(started["result"]["started_at"].is_string());
    assert_eq!(code(&call(&mut harness, "session.startRemoteSandbox", json!({ "image": "alpine:3.19" }))), -32000);
    let ran = call(&mut harness, "session.execRemoteSandbox", json!({ "command": "echo hi; echo no >&2; exit 3" }));
    assert_eq!(ran["result"], json!({ "stdout": "hi\n", "stderr": "no\n", "exit_code": 3 }), "{ran}");
    assert_eq!(code(&call(&mut harness, "session.execRemoteSandbox", json!({}))), -32602);

    let stopped = call(&mut harness, "session.stopRemoteSandbox", json!({}));
    assert_eq!(stopped["result"], json!({ "stopped": true, "image": "alpine:3.19", "sandbox_id": sandbox_id }));
    // Started again, then the session closes: the sandbox stops with it.
    call(&mut harness, "session.startRemoteSandbox", json!({ "image": "alpine:3.19" }));
    let path = format!("/api/v1/sessions/{}", harness.session_id);
    assert_eq!(send(bae.base(), "DELETE", &path, Some(&harness.session_key), None).status, 200);

    let events: Vec<Value> = harness
        .events()
        .into_iter()
        .filter(|e| e["event_type"].as_str().unwrap().starts_with("session.sandbox"))
        .collect();
    assert_eq!(
        types(&events),
        [
            "session.sandbox.start",
            "session.sandbox.running",
            "session.sandbox.stop",
            "session.sandbox.stopped",
            "session.sandbox.start",
            "session.sandbox.running",
            "session.sandbox.stop",
            "session.sandbox.stopped"
        ]
    );
    assert_eq!(events[0]["payload"], json!({ "image": "alpine:3.19", "dispatch": "remote" }));
    assert_eq!(events[1]["payload"]["sandbox_id"], sandbox_id.as_str());
    assert_eq!(events[2]["payload"]["reason"], "explicit");
    assert_eq!(events[6]["payload"]["reason"], "session_close");
    assert!(events[1]["payload"]["unsandboxed"].is_boolean());
    assert!(!bae.server.data_dir.join("sandboxes").join(&sandbox_id).exists(), "stop removed the sandbox");
}

#[test]
fn an_auto_mode_sandbox_tool_runs_inside_the_turn() {
    use crate::fake_provider::anthropic;
    let bae = Bae::start();
    let body = json!({ "name": "auto", "primary_provider": "fake", "allowed_tools": [], "available_sandboxes": ["alpine:3.19"] });
    let profile = bae.admin_send("POST", "/admin/v1/profiles", Some(body));
    let (_, key) = bae.client_key(profile.json["id"].as_str().unwrap());
    let shell = json!({ "name": "shell", "description": "Run a command",
        "input_schema": { "type": "object", "properties": { "command": { "type": "string" } }, "required": ["command"] } });
    let opened = send(
        bae.base(),
        "POST",
        "/api/v1/sessions",
        Some(&key),
        Some(json!({ "tools": [], "sandbox_tools": [shell] })),
    );
    assert_eq!(opened.status, 201, "{}", opened.text);
    let mut harness = Harness {
        base: bae.base().to_string(),
        session_id: opened.json["session_id"].as_str().unwrap().to_string(),
        session_key: opened.json["session_key"].as_str().unwrap().to_string(),
        next_id: 1,
    };
    assert_eq!(call(&mut harness, "session.registerDriver", json!({}))["result"]["registered"], true);

    // No sandbox yet: the call's result says so and the turn goes on.
    bae.fake.script([
        anthropic::tool_answer("tu_1", "shell", json!({ "command": "echo hi" })),
        anthropic::text_answer("No sandbox."),
    ]);
    let frames = harness.send_message(json!("run it"));
    assert_eq!(frames.last().unwrap()["result"]["message"]["content"][0]["text"], "No sandbox.", "{frames:?}");
    let asked = &bae.fake.requests()[0].body["tools"];
    assert_eq!(asked[0]["name"], "shell", "the model sees the sandbox tool");
    let second = &bae.fake.requests()[1].body["messages"];
    let result = second.as_array().unwrap().last().unwrap()["content"][0].clone();
    assert_eq!(result["is_error"], true);
    assert!(result["content"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with("sandbox error: no remote sandbox is running for tool 'shell'"));

    call(&mut harness, "session.startRemoteSandbox", json!({ "image": "alpine:3.19" }));
    bae.fake.script([
        anthropic::tool_answer("tu_2", "shell", json!({ "command": "echo hi; echo e >&2; exit 2" })),
        anthropic::text_answer("Ran."),
    ]);
    let frames = harness.send_message(json!("run it again"));
    let events = frames.last().unwrap()["result"]["events"].as_array().unwrap().clone();
    assert_eq!(
        types(&events),
        [
            "client.message.send",
            "provider.request",
            "provider.response",
            "tool.call",
            "sandbox.request",
            "sandbox.response",
            "tool.result",
            "provider.request",
            "provider.response",
            "server.message.send"
        ]
    );
    assert_eq!(events[3]["payload"]["dispatch"], "sandbox");
    assert_eq!(events[4]["payload"]["command"], "echo hi; echo e >&2; exit 2");
    assert_eq!(events[5]["payload"]["result"], json!({ "stdout": "hi\n", "stderr": "e\n", "exit_code": 2 }));
    assert_eq!(events[6]["payload"]["content"], json!([{ "type": "text", "text": "hi\n[stderr]\ne\n[exit_code: 2]" }]));
    assert_eq!(events[6]["payload"]["is_error"], true);
}
