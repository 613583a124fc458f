//! The MCP client against a tiny stdio server (paging, errors, garbage, a slow call, a crash)
//! and a tiny Streamable HTTP server (JSON and event-stream answers, the session id, headers
//! with `${VAR}`).

use std::collections::BTreeMap;
use std::time::Duration;

use kestrel::config::bae::{McpServer, McpTransport};
use kestrel::mcp::{McpClient, McpError};
use serde_json::{json, Value};

pub const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/mcp_fixtures/tiny_server.py");

fn stdio_server() -> McpServer {
    stdio_server_marked("unmarked")
}

/// The tiny server with `marker` as an extra argument, to find its process by.
fn stdio_server_marked(marker: &str) -> McpServer {
    McpServer {
        name: "tiny".into(),
        transport: McpTransport::Stdio,
        command: Some("python3".into()),
        args: vec![TINY.into(), marker.into()],
        url: None,
        headers: BTreeMap::new(),
    }
}

fn no_env(_: &str) -> Option<String> {
    None
}

/// Whether a process running the tiny server with `marker` is alive.
pub fn tiny_alive(marker: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        cmdline.contains("tiny_server.py") && cmdline.contains(marker)
    })
}

#[test]
fn a_stdio_server_pages_its_tools_and_every_failure_is_an_error_not_a_hang() {
    let mut client = McpClient::connect(&stdio_server(), &no_env).unwrap();
    let names: Vec<&str> = client.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["echo", "fails", "garbage", "slow", "crash"], "both pages");
    assert_eq!(client.tools[0].description, "Echoes its arguments");
    assert_eq!(client.tools[1].description, "");
    assert_eq!(client.tools[1].input_schema, json!({ "type": "object" }));

    let second = Duration::from_secs(10);
    let echoed = client.call("echo", json!({ "text": "hi" }), second).unwrap();
    assert_eq!(echoed.content, vec![json!({ "type": "text", "text": "{\"text\": \"hi\"}" })]);
    assert!(!echoed.is_error);
    let failed = client.call("fails", json!({}), second).unwrap();
    assert!(failed.is_error);
    let garbage = client.call("garbage", json!({}), second).unwrap_err();
    assert_eq!(garbage, McpError::Protocol { code: -32602, message: "bad arguments".into() });
    assert_eq!(garbage.to_string(), "MCP protocol error: [-32602] bad arguments");
    let slow = client.call("slow", json!({}), Duration::from_millis(300)).unwrap_err();
    assert_eq!(slow, McpError::Timeout(Duration::from_millis(300)));
    // The late answer to the slow call is skipped; the connection goes on.
    assert!(!client.call("echo", json!({}), second).unwrap().is_error);

    let crashed = client.call("crash", json!({}), second).unwrap_err();
    assert!(matches!(crashed, McpError::Transport(ref why) if why.contains("crashed")), "{crashed:?}");
    assert!(matches!(client.call("echo", json!({}), second), Err(McpError::Transport(_))));
    drop(client);

    // A connection dropped while its server runs kills it.
    let marker = format!("marker-{}", std::process::id());
    let client = McpClient::connect(&stdio_server_marked(&marker), &no_env).unwrap();
    assert!(tiny_alive(&marker));
    drop(client);
    assert!(!tiny_alive(&marker), "the server outlived its connection");
}

#[test]
fn a_server_that_is_not_there_or_not_mcp_fails_to_connect() {
    let mut missing = stdio_server();
    missing.command = Some("/nonexistent/mcp-server".into());
    assert!(matches!(McpClient::connect(&missing, &no_env), Err(McpError::Transport(_))));
    let mut silent = stdio_server();
    silent.command = Some("/bin/true".into());
    silent.args = Vec::new();
    assert!(matches!(McpClient::connect(&silent, &no_env), Err(McpError::Transport(_))));
}

/// A Streamable HTTP MCP server: JSON for the handshake and the listing, an event stream for
/// calls; records every request's headers.
/// A request the HTTP server saw: its JSON-RPC method and its headers (names lower-cased).
type Seen = (String, Vec<(String, String)>);

fn http_server() -> (String, crossbeam_channel::Receiver<Seen>) {
    let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
    let url = format!("http://{}/mcp", server.server_addr().to_ip().unwrap());
    let (seen_tx, seen) = crossbeam_channel::unbounded();
    std::thread::spawn(move || {
        for mut request in server.incoming_requests() {
            let mut body = String::new();
            let _ = std::io::Read::read_to_string(request.as_reader(), &mut body);
            let message: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            let headers = request
                .headers()
                .iter()
                .map(|h| (h.field.to_string().to_ascii_lowercase(), h.value.to_string()))
                .collect();
            let method = message["method"].as_str().unwrap_or_default().to_string();
            let _ = seen_tx.send((method.clone(), headers));
            let id = message["id"].clone();
            let header = |name: &str, value: &str| tiny_http::Header::from_bytes(name, value).unwrap();
            let response = match method.as_str() {
                "initialize" => tiny_http::Response::from_string(json!({ "jsonrpc": "2.0", "id": id, "result": { "protocolVersion": "2024-11-05", "capabilities": {} } }).to_string())
                    .with_header(header("Content-Type", "application/json"))
                    .with_header(header("Mcp-Session-Id", "session-7")),
                "notifications/initialized" => tiny_http::Response::from_string("").with_status_code(202),
                "tools/list" => tiny_http::Response::from_string(json!({ "jsonrpc": "2.0", "id": id, "result": { "tools": [{ "name": "remote_echo" }] } }).to_string())
                    .with_header(header("Content-Type", "application/json")),
                _ => {
                    let progress = json!({ "jsonrpc": "2.0", "method": "notifications/progress", "params": {} });
                    let result = json!({ "jsonrpc": "2.0", "id": id, "result": { "content": [{ "type": "text", "text": "streamed" }] } });
                    tiny_http::Response::from_string(format!("event: message\ndata: {progress}\n\nevent: message\ndata: {result}\n\n"))
                        .with_header(header("Content-Type", "text/event-stream"))
                }
            };
            let _ = request.respond(response);
        }
    });
    (url, seen)
}

#[test]
fn a_streamable_http_server_answers_in_json_and_in_an_event_stream_with_its_session() {
    let (url, seen) = http_server();
    let mut headers = BTreeMap::new();
    headers.insert("Authorization".to_string(), "Bearer ${MCP_TEST_TOKEN}".to_string());
    let server = McpServer {
        name: "remote".into(),
        transport: McpTransport::Http,
        command: None,
        args: Vec::new(),
        url: Some(url),
        headers,
    };
    let env = |name: &str| (name == "MCP_TEST_TOKEN").then(|| "tok-123".to_string());
    let mut client = McpClient::connect(&server, &env).unwrap();
    assert_eq!(client.tools[0].name, "remote_echo");
    let result = client.call("remote_echo", json!({}), Duration::from_secs(5)).unwrap();
    assert_eq!(result.content, vec![json!({ "type": "text", "text": "streamed" })]);

    let requests: Vec<Seen> = seen.try_iter().collect();
    let methods: Vec<&str> = requests.iter().map(|(m, _)| m.as_str()).collect();
    assert_eq!(methods, ["initialize", "notifications/initialized", "tools/list", "tools/call"]);
    let header = |at: usize, name: &str| requests[at].1.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    assert_eq!(header(0, "authorization").as_deref(), Some("Bearer tok-123"));
    assert_eq!(header(0, "mcp-session-id"), None);
    assert_eq!(header(3, "mcp-session-id").as_deref(), Some("session-7"), "the session id goes back");
    assert!(header(3, "accept").unwrap().contains("text/event-stream"));

    // A header whose variable is not set: no connection, and the error names the header only.
    let unset = |_: &str| None;
    let Err(error) = McpClient::connect(&server, &unset) else { panic!("connected without its token") };
    assert!(error.to_string().contains("Authorization"), "{error}");
}

/// The reference MCP server from npm, installed once under `target/mcp-servers` (`.ci/run`
/// installs it first; a fresh checkout's `cargo test` installs it here).
pub fn everything() -> std::path::PathBuf {
    let prefix = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/mcp-servers");
    let entry = prefix.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    if !entry.exists() {
        let status = std::process::Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--silent", "--prefix"])
            .arg(&prefix)
            .arg("@modelcontextprotocol/server-everything@2026.8.31")
            .status()
            .expect("npm runs");
        assert!(status.success(), "npm could not install the reference MCP server");
    }
    entry
}

#[test]
fn the_reference_server_from_npm_works_over_stdio_and_streamable_http() {
    let entry = everything();
    let stdio = McpServer {
        name: "everything".into(),
        transport: McpTransport::Stdio,
        command: Some("node".into()),
        args: vec![entry.to_string_lossy().into_owned(), "stdio".into()],
        url: None,
        headers: BTreeMap::new(),
    };
    let mut client = McpClient::connect(&stdio, &no_env).unwrap();
    assert!(client.tools.iter().any(|t| t.name == "echo"), "{:?}", client.tools);
    let echo = client.tools.iter().find(|t| t.name == "echo").unwrap();
    assert_eq!(echo.input_schema["properties"]["message"]["type"], "string");
    let answer = client.call("echo", json!({ "message": "hi" }), Duration::from_secs(10)).unwrap();
    assert_eq!(answer.content, vec![json!({ "type": "text", "text": "Echo: hi" })]);
    // Bad arguments are the tool's error, not a broken connection.
    let bad = client.call("echo", json!({}), Duration::from_secs(10));
    assert!(matches!(&bad, Ok(result) if result.is_error) || matches!(&bad, Err(McpError::Protocol { .. })), "{bad:?}");
    assert!(!client.call("echo", json!({ "message": "again" }), Duration::from_secs(10)).unwrap().is_error);
    drop(client);

    // The same server over Streamable HTTP, on a port of its own.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut http_server = std::process::Command::new("node")
        .arg(&entry)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait for its own word that it listens.
    let mut stderr = std::io::BufReader::new(http_server.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("listening") {
        line.clear();
        assert!(std::io::BufRead::read_line(&mut stderr, &mut line).unwrap() > 0, "the HTTP server did not start");
    }
    let http = McpServer {
        name: "everything-http".into(),
        transport: McpTransport::Http,
        command: None,
        args: Vec::new(),
        url: Some(format!("http://127.0.0.1:{port}/mcp")),
        headers: BTreeMap::new(),
    };
    let outcome = McpClient::connect(&http, &no_env)
        .and_then(|mut client| client.call("echo", json!({ "message": "over http" }), Duration::from_secs(10)));
    let _ = http_server.kill();
    let _ = http_server.wait();
    assert_eq!(outcome.unwrap().content, vec![json!({ "type": "text", "text": "Echo: over http" })]);
}

#[test]
fn kestrel_sessions_get_the_mcp_servers_tools_under_the_usual_permissions() {
    let server = crate::support::TestServer::start_with(|config| {
        config.mcp.servers.push(stdio_server_marked("kestrel"));
        config.agent.permissions.insert("mcp__tiny__echo".into(), kestrel::engine::tools::Permission::Auto);
        config.agent.permissions.insert("mcp__tiny__crash".into(), kestrel::engine::tools::Permission::Auto);
    });
    crate::support::wait_until("the MCP tools to be listed", || {
        let tools = server.get("/api/bootstrap").json["tools"].clone();
        tools.as_array().unwrap().iter().any(|t| t["name"] == "mcp__tiny__echo")
    });
    let tools = server.get("/api/bootstrap").json["tools"].clone();
    let echo = tools.as_array().unwrap().iter().find(|t| t["name"] == "mcp__tiny__echo").unwrap().clone();
    assert_eq!((echo["category"].as_str(), echo["permission"].as_str()), (Some("mcp"), Some("auto")));
    let fails = tools.as_array().unwrap().iter().find(|t| t["name"] == "mcp__tiny__fails").unwrap().clone();
    assert_eq!(fails["permission"], "ask", "ask unless the config says otherwise");

    let id = server.create_session(json!({}));
    let result = |line: &str| {
        let events = server.run_to_end(&id, line);
        let finished = events.iter().find(|e| crate::support::event_type(e) == "tool.finished");
        finished.unwrap_or_else(|| panic!("{events:#?}"))["event"]["result"].clone()
    };
    let echoed = result(r#"/tool mcp__tiny__echo {"text": "hi"}"#);
    assert_eq!((echoed["ok"].as_bool(), echoed["content"].as_str()), (Some(true), Some("{\"text\": \"hi\"}")));
    // A crash is an error result; the next call connects again.
    let crashed = result("/tool mcp__tiny__crash {}");
    assert_eq!(crashed["ok"], false);
    assert!(crashed["content"].as_str().unwrap().contains("MCP error"), "{crashed}");
    assert_eq!(result(r#"/tool mcp__tiny__echo {"text": "back"}"#)["content"], "{\"text\": \"back\"}");

    // An `ask` tool waits for a person.
    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    assert_eq!(
        server.post(&format!("/api/sessions/{id}/messages"), json!({ "content": "/tool mcp__tiny__fails {}" })).status,
        202
    );
    stream.collect_until(|e| crate::support::event_type(e) == "approval.requested");
    server.post(&format!("/api/sessions/{id}/cancel"), json!({}));
    stream.collect_until(crate::support::is_run_end);
}
