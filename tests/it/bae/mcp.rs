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
    let server = kestrel::config::bae::McpServer::stdio("tiny", "python3", vec![TINY.into(), marker.clone()]);
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

/// A profile may name a server from Kestrel's own `[[mcp.servers]]`: the admin API lists it
/// (its secrets masked), a BAE session gets a connection of its own (no state shared with
/// Kestrel's sessions or another BAE session), and close ends its process and a call in
/// flight within seconds.
#[test]
fn a_kestrel_server_named_by_a_profile_is_listed_private_to_the_session_and_ended_by_close() {
    let marker = format!("bae-scoped-{}", std::process::id());
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut server = kestrel::config::bae::McpServer::stdio("kestrels", "python3", vec![TINY.into(), marker.clone()]);
    server.env.insert("TINY_LOG".into(), log.path().display().to_string());
    server.env.insert("API_TOKEN".into(), "never-shown".into());
    server.scope = kestrel::config::bae::McpScope::Server;
    let bae = Bae::start_with(move |config| config.mcp.servers.push(server));
    let listed = bae.admin_send("GET", "/admin/v1/mcp-servers", None);
    assert_eq!(listed.json["items"], json!([{ "name": "kestrels", "transport": "stdio" }]), "{}", listed.text);
    let shown = bae.admin_send("GET", "/admin/v1/config", None);
    assert_eq!(shown.json["mcp"]["servers"][0]["env"]["API_TOKEN"], "••••••••", "{}", shown.text);
    assert!(!shown.text.contains("never-shown"));

    let body =
        json!({ "name": "scoped", "primary_provider": "fake", "allowed_tools": [], "mcp_servers": ["kestrels"] });
    let profile = bae.admin_send("POST", "/admin/v1/profiles", Some(body));
    let (_, key) = bae.client_key(profile.json["id"].as_str().unwrap());
    let count = |harness: &mut Harness, id: &str| {
        let call = json!([{ "type": "tool_use", "id": id, "name": "counter", "input": {} }]);
        bae.fake.script([anthropic::answer(call, "tool_use", 10, 5), anthropic::text_answer("Counted.")]);
        let frames = harness.send_message(json!("count"));
        let result = frames.iter().find(|f| f["params"]["event_type"] == "tool.result").unwrap().clone();
        result["params"]["payload"]["content"][0]["text"].as_str().unwrap().to_string()
    };
    let mut first = Harness::open(bae.base(), &key, &[]);
    let mut second = Harness::open(bae.base(), &key, &[]);
    assert_eq!(count(&mut first, "tu_1"), "1");
    assert_eq!(count(&mut first, "tu_2"), "2");
    assert_eq!(count(&mut second, "tu_3"), "1", "another session's server state is its own");

    // A call hangs the session's server; close ends the process and the turn within seconds.
    let hang = json!([{ "type": "tool_use", "id": "tu_h", "name": "hang", "input": {} }]);
    bae.fake.script([anthropic::answer(hang, "tool_use", 10, 5), anthropic::text_answer("Never.")]);
    let turn = first.start("session.sendMessage", json!({ "message": { "content": "hang" } }));
    let deadline = std::time::Instant::now() + crate::support::WAIT;
    while !std::fs::read_to_string(log.path()).unwrap_or_default().contains("hanging") {
        assert!(std::time::Instant::now() < deadline, "the call never started");
        std::thread::yield_now();
    }
    let started = std::time::Instant::now();
    assert_eq!(first.close().status, 200);
    turn.wait_end();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(15),
        "the call outlived the close: {:?}",
        started.elapsed()
    );
    let gone = std::time::Instant::now() + crate::support::WAIT;
    let first_servers = format!("KESTREL_COMMAND={}:mcp-", first.session_id);
    while super::sandbox::processes_with(&first_servers) > 0 {
        assert!(std::time::Instant::now() < gone, "the closed session's server still runs");
        std::thread::yield_now();
    }
    let second_servers = format!("KESTREL_COMMAND={}:mcp-", second.session_id);
    assert_eq!(super::sandbox::processes_with(&second_servers), 1, "the other session's server runs on");
    assert!(count_alive(&marker) >= 2, "and so does Kestrel's own");
}

/// Live tiny servers with `marker` (a Kestrel-wide one and each BAE session's own).
fn count_alive(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|entry| {
            let cmdline =
                String::from_utf8_lossy(&std::fs::read(entry.path().join("cmdline")).unwrap_or_default()).into_owned();
            let alive = !std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default().contains(") Z ");
            alive && cmdline.contains("tiny_server.py") && cmdline.contains(marker)
        })
        .count()
}
