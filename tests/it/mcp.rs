//! The MCP client against a tiny stdio server (paging, errors, garbage, a slow call, a crash,
//! a hung server, floods, an over-long line, its environment and process tree) and a tiny
//! Streamable HTTP server (JSON and event-stream answers, the session id, headers with
//! `${VAR}`); Kestrel sessions' MCP tools, their names and their connection scopes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kestrel::config::bae::{McpScope, McpServer};
use kestrel::mcp::{McpClient, McpError, Spawning};
use serde_json::{json, Value};

use crate::support::WAIT;

pub const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/mcp_fixtures/tiny_server.py");

fn stdio_server() -> McpServer {
    stdio_server_marked("unmarked")
}

/// The tiny server with `marker` as an extra argument, to find its process by.
pub fn stdio_server_marked(marker: &str) -> McpServer {
    McpServer::stdio("tiny", "python3", vec![TINY.into(), marker.into()])
}

fn no_env() -> kestrel::mcp::SharedEnv {
    Arc::new(|_: &str| None)
}

fn connect(server: &McpServer) -> Result<McpClient, McpError> {
    McpClient::connect(server, no_env(), Spawning { marker: "test".into(), ..Spawning::default() })
}

/// Whether a process running the tiny server with `marker` is alive.
pub fn tiny_alive(marker: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        let alive = !std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default().contains(") Z ");
        alive && cmdline.contains("tiny_server.py") && cmdline.contains(marker)
    })
}

/// Whether process `pid` is alive (not gone, not a zombie).
pub fn pid_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| !stat.contains(") Z "))
}

/// Waits (within `WAIT`) until `condition` holds.
fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !condition() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::yield_now();
    }
}

fn text_of(result: &kestrel::mcp::CallResult) -> String {
    result.content[0]["text"].as_str().unwrap_or_default().to_string()
}

#[test]
fn a_stdio_server_pages_its_tools_and_every_failure_is_an_error_not_a_hang() {
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut server = stdio_server();
    server.env.insert("TINY_LOG".into(), log.path().display().to_string());
    let client = connect(&server).unwrap();
    let tools = client.tools();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names[..5], ["echo", "fails", "garbage", "slow", "crash"], "both pages");
    assert_eq!(tools[0].description, "Echoes its arguments");
    assert_eq!(tools[1].description, "");
    assert_eq!(tools[1].input_schema, json!({ "type": "object" }));

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
    // The late answer to the slow call is dropped; the connection goes on, and the server was
    // told the call was cancelled.
    assert!(!client.call("echo", json!({}), second).unwrap().is_error);
    eventually("the server to hear of the cancel", || {
        std::fs::read_to_string(log.path()).unwrap_or_default().starts_with("cancelled ")
    });

    let crashed = client.call("crash", json!({}), second).unwrap_err();
    assert!(matches!(crashed, McpError::Transport(ref why) if why.contains("crashed")), "{crashed:?}");
    assert!(!client.call("echo", json!({}), second).unwrap().is_error, "a crashed server is started again");
    drop(client);

    // A connection dropped while its server runs kills it.
    let marker = format!("marker-{}", std::process::id());
    let client = connect(&stdio_server_marked(&marker)).unwrap();
    assert!(tiny_alive(&marker));
    drop(client);
    assert!(!tiny_alive(&marker), "the server outlived its connection");
}

#[test]
fn a_hung_server_is_dropped_and_the_next_call_gets_a_new_one() {
    let marker = format!("hung-{}", std::process::id());
    let client = connect(&stdio_server_marked(&marker)).unwrap();
    let hung = client.call("hang", json!({}), Duration::from_millis(300)).unwrap_err();
    assert_eq!(hung, McpError::Timeout(Duration::from_millis(300)));
    // The server did not answer the ping after the timeout: it was killed, and the next
    // call, which a hung connection would also time out, is answered by a new process.
    eventually("the hung server to be killed", || !tiny_alive(&marker));
    let echoed = client.call("echo", json!({ "text": "back" }), Duration::from_secs(10)).unwrap();
    assert_eq!(text_of(&echoed), "{\"text\": \"back\"}");
    assert!(tiny_alive(&marker), "a new server answers");
}

#[test]
fn floods_and_an_overlong_line_are_bounded() {
    let marker = format!("flood-{}", std::process::id());
    let client = connect(&stdio_server_marked(&marker)).unwrap();
    // 400,000 notifications (about 60 MB) before the answer: each is dropped as it is read.
    let flooded = client.call("flood", json!({ "count": 400000 }), Duration::from_secs(60)).unwrap();
    assert_eq!(text_of(&flooded), "after the flood");
    // A line past the 16 MiB limit drops the connection with a clear error.
    let long = client.call("long_line", json!({}), Duration::from_secs(60)).unwrap_err();
    assert!(matches!(&long, McpError::Transport(why) if why.contains("longer than")), "{long:?}");
    eventually("the server to be killed", || !tiny_alive(&marker));
    assert_eq!(text_of(&client.call("echo", json!({}), Duration::from_secs(10)).unwrap()), "{}");
}

#[test]
fn a_stdio_server_gets_a_scrubbed_environment_and_its_configured_env() {
    let secret = format!("KESTREL_IT_MCP_SECRET_{}", std::process::id());
    let mut server = stdio_server();
    server.env.insert("GREETING".into(), "hello ${KESTREL_IT_MCP_NAME}".into());
    let env: kestrel::mcp::SharedEnv = Arc::new(|name: &str| match name {
        "KESTREL_IT_MCP_NAME" => Some("world".into()),
        _ => None,
    });
    std::env::set_var(&secret, "sk-mcp-secret");
    let client = McpClient::connect(&server, env, Spawning { marker: "test".into(), ..Spawning::default() }).unwrap();
    let shown = client.call("env", json!({}), Duration::from_secs(10));
    std::env::remove_var(&secret);
    let environment: Value = serde_json::from_str(&text_of(&shown.unwrap())).unwrap();
    assert_eq!(environment["GREETING"], "hello world");
    assert!(environment["KESTREL_COMMAND"].as_str().unwrap().starts_with("test:mcp-"));
    assert!(environment.get(&secret).is_none(), "a server secret reached the MCP server");
    for name in environment.as_object().unwrap().keys() {
        let allowed = ["PATH", "HOME", "USER", "LOGNAME", "TMPDIR", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ"];
        // What a launcher script sets on its own (pyenv's `python3` shim is a shell script).
        let launcher = ["PWD", "SHLVL", "OLDPWD", "_"].contains(&name.as_str())
            || name.trim_start_matches('_').starts_with("PYENV");
        let ours = name == "GREETING" || name == "KESTREL_COMMAND";
        assert!(allowed.contains(&name.as_str()) || ours || launcher, "{name} passed");
    }
    // A variable that is not set: no connection, and the error names the entry only.
    server.env.remove("GREETING");
    server.env.insert("TOKEN".into(), "${KESTREL_IT_UNSET}".into());
    let Err(error) = connect(&server) else { panic!("connected without its variable") };
    assert!(error.to_string().contains("env TOKEN"), "{error}");
}

#[test]
fn close_kills_the_whole_tree_and_ends_a_call_in_flight() {
    let marker = format!("tree-{}", std::process::id());
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut server = stdio_server_marked(&marker);
    server.env.insert("TINY_LOG".into(), log.path().display().to_string());
    let client = Arc::new(connect(&server).unwrap());
    let grandchild: i32 = text_of(&client.call("spawn", json!({}), Duration::from_secs(10)).unwrap()).parse().unwrap();
    assert!(pid_alive(grandchild));
    let (done_tx, done) = crossbeam_channel::bounded(1);
    let calling = Arc::clone(&client);
    std::thread::spawn(move || {
        let _ = done_tx.send(calling.call("hang", json!({}), Duration::from_secs(120)));
    });
    eventually("the call to be in flight", || {
        std::fs::read_to_string(log.path()).unwrap_or_default().contains("hanging")
    });
    client.close();
    let ended = done.recv_timeout(Duration::from_secs(10)).expect("the call in flight ended at the close");
    assert!(ended.is_err(), "{ended:?}");
    eventually("the server and its setsid grandchild to be killed", || !tiny_alive(&marker) && !pid_alive(grandchild));
    assert_eq!(client.call("echo", json!({}), Duration::from_secs(1)), Err(McpError::Closed));
}

#[test]
fn a_server_that_is_not_there_or_not_mcp_fails_to_connect() {
    let mut missing = stdio_server();
    missing.command = Some("/nonexistent/mcp-server".into());
    assert!(matches!(connect(&missing), Err(McpError::Transport(_))));
    let mut silent = stdio_server();
    silent.command = Some("/bin/true".into());
    silent.args = Vec::new();
    assert!(matches!(connect(&silent), Err(McpError::Transport(_))));
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
    let server = McpServer { headers, ..McpServer::http("remote", &url) };
    let env: kestrel::mcp::SharedEnv = Arc::new(|name: &str| (name == "MCP_TEST_TOKEN").then(|| "tok-123".to_string()));
    let client = McpClient::connect(&server, env, Spawning::default()).unwrap();
    assert_eq!(client.tools()[0].name, "remote_echo");
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
    let Err(error) = connect(&server) else { panic!("connected without its token") };
    assert!(error.to_string().contains("Authorization"), "{error}");
}

/// The reference MCP server from npm, installed once under `target/mcp-servers` (`.ci/run`
/// installs it first; a fresh checkout's `cargo test` installs it here).
pub fn everything() -> std::path::PathBuf {
    crate::support::npm_package(
        "mcp-servers",
        "@modelcontextprotocol/server-everything@2026.8.31",
        "@modelcontextprotocol/server-everything/dist/index.js",
    )
}

#[test]
fn the_reference_server_from_npm_works_over_stdio_and_streamable_http() {
    let entry = everything();
    let stdio = McpServer::stdio("everything", "node", vec![entry.to_string_lossy().into_owned(), "stdio".into()]);
    let client = connect(&stdio).unwrap();
    let tools = client.tools();
    assert!(tools.iter().any(|t| t.name == "echo"), "{tools:?}");
    let echo = tools.iter().find(|t| t.name == "echo").unwrap();
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
    let http = McpServer::http("everything-http", &format!("http://127.0.0.1:{port}/mcp"));
    let outcome = connect(&http)
        .and_then(|client| client.call("echo", json!({ "message": "over http" }), Duration::from_secs(10)));
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

/// The text of the `tool.finished` result of running `line` in session `id`.
fn tool_text(client: &crate::support::Client, id: &str, line: &str) -> String {
    let mut stream = crate::support::SseClient::open(
        &client.base,
        &format!("/api/sessions/{id}/events"),
        client.token.as_deref(),
        None,
    );
    let sent = client.post(&format!("/api/sessions/{id}/messages"), json!({ "content": line }));
    assert_eq!(sent.status, 202, "{}", sent.text);
    let events = stream.collect_until(crate::support::is_run_end);
    let finished = events.iter().find(|e| crate::support::event_type(e) == "tool.finished");
    finished.unwrap_or_else(|| panic!("{events:#?}"))["event"]["result"]["content"].as_str().unwrap().to_string()
}

fn counting_server(scope: McpScope) -> crate::support::TestServer {
    crate::support::TestServer::start_with(move |config| {
        let mut server = stdio_server_marked("counting");
        server.scope = scope;
        config.mcp.servers.push(server);
        config.agent.permissions.insert("mcp__tiny__counter".into(), kestrel::engine::tools::Permission::Auto);
        config.auth.tokens.push(kestrel::config::TokenConfig::new("a", "token-a"));
        config.auth.tokens.push(kestrel::config::TokenConfig::new("b", "token-b"));
    })
}

fn wait_for_tool(client: &crate::support::Client, name: &str) {
    crate::support::wait_until("the MCP tools to be listed", || {
        let tools = client.get("/api/bootstrap").json["tools"].clone();
        tools.as_array().unwrap().iter().any(|t| t["name"] == name)
    });
}

#[test]
fn by_default_each_tenant_has_its_own_connection_and_state() {
    let server = counting_server(McpScope::Tenant);
    let (a, b) = (server.client().with_token(Some("token-a")), server.client().with_token(Some("token-b")));
    wait_for_tool(&a, "mcp__tiny__counter");
    let (a1, a2) = (a.post("/api/sessions", json!({})), a.post("/api/sessions", json!({})));
    let (a1, a2) = (
        a1.json["session"]["id"].as_str().unwrap().to_string(),
        a2.json["session"]["id"].as_str().unwrap().to_string(),
    );
    let b1 = b.post("/api/sessions", json!({})).json["session"]["id"].as_str().unwrap().to_string();
    assert_eq!(tool_text(&a, &a1, "/tool mcp__tiny__counter {}"), "1");
    assert_eq!(tool_text(&a, &a2, "/tool mcp__tiny__counter {}"), "2", "one tenant's sessions share");
    assert_eq!(tool_text(&b, &b1, "/tool mcp__tiny__counter {}"), "1", "another tenant never sees that state");
}

#[test]
fn session_scope_gives_each_session_its_own_server_until_it_is_deleted_and_server_scope_shares_one() {
    let server = counting_server(McpScope::Session);
    let a = server.client().with_token(Some("token-a"));
    wait_for_tool(&a, "mcp__tiny__counter");
    let first = a.post("/api/sessions", json!({})).json["session"]["id"].as_str().unwrap().to_string();
    let second = a.post("/api/sessions", json!({})).json["session"]["id"].as_str().unwrap().to_string();
    assert_eq!(tool_text(&a, &first, "/tool mcp__tiny__counter {}"), "1");
    assert_eq!(tool_text(&a, &first, "/tool mcp__tiny__counter {}"), "2");
    assert_eq!(tool_text(&a, &second, "/tool mcp__tiny__counter {}"), "1");
    // Its server's process carries the session's marker, and goes with the session.
    let marked = |session: &str| crate::bae::sandbox::processes_with(&format!("KESTREL_COMMAND={session}:mcp-"));
    assert_eq!(marked(&first), 1);
    assert_eq!(a.send("DELETE", &format!("/api/sessions/{first}"), None).status, 204);
    eventually("the deleted session's server to end", || marked(&first) == 0);
    assert_eq!(marked(&second), 1);

    let shared = counting_server(McpScope::Server);
    let (a, b) = (shared.client().with_token(Some("token-a")), shared.client().with_token(Some("token-b")));
    wait_for_tool(&a, "mcp__tiny__counter");
    let on_a = a.post("/api/sessions", json!({})).json["session"]["id"].as_str().unwrap().to_string();
    let on_b = b.post("/api/sessions", json!({})).json["session"]["id"].as_str().unwrap().to_string();
    assert_eq!(tool_text(&a, &on_a, "/tool mcp__tiny__counter {}"), "1");
    assert_eq!(tool_text(&b, &on_b, "/tool mcp__tiny__counter {}"), "2", "scope = \"server\" shares one");
}

/// `a/b`, `a_b` and `a.b` would all be `mcp__tiny__a_b`: each gets a name of its own, every
/// name reaches the model once, and no plugin may take an `mcp__` name.
#[test]
fn colliding_tool_names_become_distinct_and_none_is_sent_twice() {
    let fake = crate::fake_provider::FakeProvider::start();
    let mut provider = kestrel::config::ProviderConfig::new(kestrel::config::Wire::Openai, fake.base_url.clone());
    provider.models = vec![kestrel::config::ModelConfig::named("gpt-x")];
    let server = crate::support::TestServer::start_with(move |config| {
        let mut tiny = stdio_server_marked("names");
        tiny.env.insert("TINY_TOOLS".into(), "a/b,a_b,a.b".into());
        config.mcp.servers.push(tiny);
        config.providers.insert("fake".into(), provider);
    });
    crate::support::wait_until("the MCP tools to be listed", || {
        let tools = server.get("/api/bootstrap").json["tools"].clone();
        tools.as_array().unwrap().iter().filter(|t| t["name"].as_str().unwrap().starts_with("mcp__tiny__a_b")).count()
            == 3
    });
    let tools = server.get("/api/bootstrap").json["tools"].clone();
    let names: Vec<String> =
        tools.as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_string()).collect();
    let distinct: std::collections::HashSet<&String> = names.iter().collect();
    assert_eq!(distinct.len(), names.len(), "{names:?}");
    assert!(names.iter().all(|name| name.len() <= 64));
    use crate::fake_provider::{openai, Reply};
    fake.script([Reply::stream(openai::text(&[], &["ok"], &openai::usage(10, 1, 0, 0)).as_bytes(), 3)]);
    let id = server.create_session(json!({ "model": "fake/gpt-x" }));
    server.run_to_end(&id, "hello");
    let sent = fake.requests()[0].body["tools"].clone();
    let sent: Vec<&str> = sent.as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
    let distinct: std::collections::HashSet<&&str> = sent.iter().collect();
    assert_eq!(distinct.len(), sent.len(), "a tool name reached the provider twice: {sent:?}");
}

/// `kill -9` of the server: its MCP server dies with it (the death signal of the thread it was
/// started from, which lives as long as the server), and what that server started outside its
/// process group (a `setsid` grandchild) is killed by the sweep at the next start.
#[test]
fn after_kill_9_the_mcp_server_dies_and_the_next_start_sweeps_its_grandchildren() {
    let (data, workspace) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let marker = format!("killed-{}", std::process::id());
    let config = format!(
        "[agent.permissions]\n\"mcp__tiny__spawn\" = \"auto\"\n[[mcp.servers]]\nname = \"tiny\"\ntransport = \"stdio\"\ncommand = \"python3\"\nargs = [{:?}, {:?}]\nscope = \"server\"\n",
        TINY, marker
    );
    let (mut child, base, _) = crate::support::spawn_binary(data.path(), workspace.path(), &config);
    let client = crate::support::Client { base: base.clone(), token: None };
    crate::support::wait_until("the MCP tools to be listed", || {
        let tools = client.get("/api/bootstrap").json["tools"].clone();
        tools.as_array().unwrap().iter().any(|t| t["name"] == "mcp__tiny__spawn")
    });
    let id = client.post("/api/sessions", json!({})).json["session"]["id"].as_str().unwrap().to_string();
    let grandchild: i32 = tool_text(&client, &id, "/tool mcp__tiny__spawn {}").parse().unwrap();
    assert!(tiny_alive(&marker) && pid_alive(grandchild));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    eventually("the MCP server to die with the server", || !tiny_alive(&marker));
    assert!(pid_alive(grandchild), "a setsid grandchild outlives a SIGKILL (it left every group)");
    let (mut again, _, _) = crate::support::spawn_binary(data.path(), workspace.path(), &config);
    eventually("the next start to sweep the grandchild", || !pid_alive(grandchild));
    let _ = again.kill();
    let _ = again.wait();
}
