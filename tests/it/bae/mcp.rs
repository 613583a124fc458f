//! MCP in BAE turns: a session connects to its profile's servers at open, the model sees their
//! tools beside the client's, calls are dispatched with `mcp.request` / `mcp.response` around
//! them, a mixed turn pauses for the client with the MCP result stashed, and close kills the
//! server.

use serde_json::json;

use super::support::{types, Bae, Harness};
use crate::fake_provider::anthropic;

use crate::mcp::{tiny_alive, TINY};

#[test]
fn a_mixed_turn_runs_the_mcp_call_pauses_for_the_client_and_close_kills_the_server() {
    let marker = format!("bae-{}", std::process::id());
    let server = kestrel::config::bae::McpServer {
        name: "tiny".into(),
        transport: kestrel::config::bae::McpTransport::Stdio,
        command: Some("python3".into()),
        args: vec![TINY.into(), marker.clone()],
        url: None,
        headers: Default::default(),
    };
    let bae = Bae::start_with(move |config| config.bae.file.mcp.servers.push(server));
    let body = json!({ "name": "mixed", "primary_provider": "fake", "allowed_tools": ["lookup"], "mcp_servers": ["tiny", "not-configured"] });
    let profile = bae.admin_send("POST", "/admin/v1/profiles", Some(body));
    assert_eq!(profile.status, 201, "{}", profile.text);
    let (_, key) = bae.client_key(profile.json["id"].as_str().unwrap());
    let mut harness = Harness::open(bae.base(), &key, &["lookup"]);
    assert!(tiny_alive(&marker), "connected at open");

    let answer = anthropic::answer(
        json!([
            { "type": "tool_use", "id": "tu_m", "name": "echo", "input": { "text": "hi" } },
            { "type": "tool_use", "id": "tu_c", "name": "lookup", "input": {} },
        ]),
        "tool_use",
        10,
        5,
    );
    bae.fake.script([answer, anthropic::text_answer("Both done.")]);
    let paused = harness.send_message(json!("do both"));
    let result = &paused.last().unwrap()["result"];
    let events = result["events"].as_array().unwrap();
    assert_eq!(
        types(events),
        [
            "client.message.send",
            "provider.request",
            "provider.response",
            "tool.call",
            "tool.call",
            "mcp.request",
            "mcp.response",
            "tool.result",
            "server.message.send"
        ]
    );
    assert_eq!(events[3]["payload"]["server_name"], "tiny");
    assert_eq!(
        events[5]["payload"],
        json!({ "method": "tools/call", "server_name": "tiny", "tool": "echo", "input": { "text": "hi" } })
    );
    assert_eq!(events[6]["payload"]["ok"], true);
    assert_eq!(events[7]["payload"]["content"], json!([{ "type": "text", "text": "{\"text\": \"hi\"}" }]));
    // The model saw the MCP tool beside the client's.
    let tools: Vec<String> = bae.fake.requests()[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    assert!(tools.contains(&"lookup".to_string()) && tools.contains(&"echo".to_string()), "{tools:?}");

    // The client answers its call; the provider gets both results.
    let frames = harness.send_message(json!([{ "type": "tool_result", "tool_use_id": "tu_c", "content": "found" }]));
    assert_eq!(frames.last().unwrap()["result"]["message"]["content"][0]["text"], "Both done.");
    let resumed = &bae.fake.requests()[1].body["messages"];
    let results = resumed.as_array().unwrap().last().unwrap()["content"].as_array().unwrap().clone();
    let ids: Vec<&str> = results.iter().map(|r| r["tool_use_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["tu_m", "tu_c"]);

    // A call that crashes the server is an error result, not a dead turn.
    let crash = anthropic::answer(
        json!([{ "type": "tool_use", "id": "tu_x", "name": "crash", "input": {} }]),
        "tool_use",
        10,
        5,
    );
    bae.fake.script([crash, anthropic::text_answer("It broke.")]);
    let frames = harness.send_message(json!("crash it"));
    assert_eq!(frames.last().unwrap()["result"]["message"]["content"][0]["text"], "It broke.", "{frames:?}");
    let mcp_error = frames.iter().find(|f| f["params"]["event_type"] == "tool.result").unwrap();
    assert_eq!(mcp_error["params"]["payload"]["is_error"], true);
    assert!(mcp_error["params"]["payload"]["content"][0]["text"].as_str().unwrap().starts_with("MCP error:"));

    let closed = harness.close();
    assert_eq!(closed.status, 200, "{}", closed.text);
    assert!(!tiny_alive(&marker), "close killed the server");
}
