//! The real binary's log: no credential at any level (ureq's debug dump of an Anthropic
//! request, an MCP server's configured header, a token in a query), and one line per request
//! with its route template, status, duration, bytes and request id, in text and JSON.

use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use crate::fake_provider::{anthropic, FakeProvider, Reply};
use crate::support::{event_type, is_run_end, Client, SseClient, WAIT};

/// The binary with `env` and a config file, its stderr collected line by line.
struct Logged {
    child: Child,
    base: String,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Logged {
    fn start(data: &std::path::Path, workspace: &std::path::Path, config: &str, env: &[(&str, &str)]) -> Logged {
        let config_path = data.join("kestrel.toml");
        std::fs::write(&config_path, config).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_kestrel"));
        command
            .arg("--config")
            .arg(&config_path)
            .env("KESTREL_ADDR", "127.0.0.1:0")
            .env("KESTREL_DATA_DIR", data)
            .env("KESTREL_ADMIN_ADDR", "")
            .env("KESTREL_WORKSPACE", workspace)
            .env_remove("OPENAI_API_KEY")
            .env_remove("ANTHROPIC_API_KEY")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let collected = Arc::clone(&lines);
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                collected.lock().unwrap().push(line);
            }
        });
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let base = stdout.next().unwrap().unwrap().rsplit(' ').next().unwrap().to_string();
        std::thread::spawn(move || for _ in stdout {});
        Logged { child, base, lines }
    }

    /// Waits (within `WAIT`) for a line `matches` accepts.
    fn wait_for(&self, what: &str, matches: impl Fn(&str) -> bool) -> String {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            if let Some(line) = self.lines.lock().unwrap().iter().find(|line| matches(line)) {
                return line.clone();
            }
            assert!(std::time::Instant::now() < deadline, "no log line {what}: {:#?}", self.lines.lock().unwrap());
            std::thread::yield_now();
        }
    }

    fn all(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Streamable HTTP MCP server that answers everything with a listing of nothing.
fn quiet_mcp() -> String {
    let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
    let url = format!("http://{}/mcp", server.server_addr().to_ip().unwrap());
    std::thread::spawn(move || {
        for mut request in server.incoming_requests() {
            let mut body = String::new();
            let _ = std::io::Read::read_to_string(request.as_reader(), &mut body);
            let message: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            let answer = json!({ "jsonrpc": "2.0", "id": message["id"], "result": { "tools": [], "protocolVersion": "2024-11-05" } });
            let header = tiny_http::Header::from_bytes("Content-Type", "application/json").unwrap();
            let _ = request.respond(tiny_http::Response::from_string(answer.to_string()).with_header(header));
        }
    });
    url
}

#[test]
fn a_debug_log_never_shows_a_provider_key_an_mcp_header_or_a_token() {
    let (data, workspace) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let fake = FakeProvider::start();
    let mut answer = anthropic::message_start(5, 0, 0);
    answer.push_str(&anthropic::text(0, &["Hi."]));
    answer.push_str(&anthropic::message_end("end_turn", 2));
    fake.script([Reply::stream(answer.as_bytes(), 2)]);
    let config = format!(
        "[auth]\ntoken = \"kestrel-token-secret\"\n[[mcp.servers]]\nname = \"remote\"\ntransport = \"http\"\nurl = {:?}\nheaders = {{ X-Tenant-Pass = \"${{MCP_PASS}}\" }}\n",
        quiet_mcp()
    );
    let env = [
        ("RUST_LOG", "debug"),
        ("ANTHROPIC_API_KEY", "sk-ant-debug-secret"),
        ("ANTHROPIC_BASE_URL", fake.base_url.as_str()),
        ("MCP_PASS", "mcp-pass-secret"),
    ];
    let server = Logged::start(data.path(), workspace.path(), &config, &env);
    let client = Client { base: server.base.clone(), token: Some("kestrel-token-secret".into()) };
    server.wait_for("of the MCP server's listing", |line| line.contains("MCP server \"remote\""));
    let id = client.post("/api/sessions", json!({ "model": "anthropic/claude-sonnet-4-5" })).json["session"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut stream =
        SseClient::open(&server.base, &format!("/api/sessions/{id}/events"), Some("kestrel-token-secret"), None);
    assert_eq!(client.post(&format!("/api/sessions/{id}/messages"), json!({ "content": "hello" })).status, 202);
    let events = stream.collect_until(is_run_end);
    assert_eq!(event_type(events.last().unwrap()), "run.finished", "{events:#?}");
    // A token in a query (as EventSource clients send it) never reaches the log either.
    let _ = Client { base: server.base.clone(), token: None }.get("/api/sessions?token=kestrel-token-secret");
    server.wait_for("of ureq's request dump", |line| line.contains("x-api-key: ***"));
    server.wait_for("of the MCP header", |line| line.to_ascii_lowercase().contains("x-tenant-pass: ***"));
    let log = server.all();
    for secret in ["sk-ant-debug-secret", "mcp-pass-secret", "kestrel-token-secret"] {
        assert!(!log.contains(secret), "{secret} reached the log:\n{log}");
    }
}

#[test]
fn every_request_gets_one_line_with_its_template_status_duration_bytes_and_id() {
    let (data, workspace) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    for format in ["text", "json"] {
        let server =
            Logged::start(data.path(), workspace.path(), "", &[("RUST_LOG", "info"), ("KESTREL_LOG_FORMAT", format)]);
        let client = Client { base: server.base.clone(), token: None };
        let created = client.post("/api/sessions", json!({}));
        let id = created.json["session"]["id"].as_str().unwrap().to_string();
        let asked = client.send_with_headers(
            "GET",
            &format!("/api/sessions/{id}?verbose=secretish"),
            None,
            &[("X-Request-Id", "trace-me-7")],
        );
        assert_eq!(asked.status, 200);
        let line = server.wait_for("for the request", |line| line.contains("trace-me-7"));
        assert!(!line.contains(&id) && !line.contains("secretish"), "ids and queries stay out: {line}");
        match format {
            "json" => {
                let fields: Value = serde_json::from_str(&line).unwrap();
                assert_eq!(fields["target"], "kestrel::request");
                assert_eq!(fields["method"], "GET");
                assert_eq!(fields["route"], "/api/sessions/{id}");
                assert_eq!(fields["status"], 200);
                assert_eq!(fields["request_id"], "trace-me-7");
                assert_eq!(fields["bytes"].as_str().unwrap().parse::<usize>().unwrap(), asked.text.len());
                assert!(fields["duration_ms"].as_str().unwrap().parse::<f64>().is_ok(), "{line}");
            }
            _ => {
                assert!(line.contains("kestrel::request] GET /api/sessions/{id} 200"), "{line}");
                assert!(line.contains(&format!("bytes={}", asked.text.len())), "{line}");
                assert!(line.contains("request_id=trace-me-7") && line.contains("duration_ms="), "{line}");
            }
        }
        // A stream's line is written when it ends.
        let stream = SseClient::open(&server.base, "/api/events", None, None);
        stream.disconnect();
        server.wait_for("for the stream", |line| line.contains("/api/events") && line.contains("200"));
    }
}
