//! A BAE client for the tests, behaving like BAE's own harness: open or join, register as a
//! driver, send, dispatch the client's own tool calls, resume. Plus the admin side (profiles,
//! keys) and an NDJSON reader that follows a stream as it arrives.

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver};
use serde_json::{json, Value};

use crate::fake_provider::FakeProvider;
use crate::support::{Response, TestServer, WAIT};
use kestrel::config::{ModelConfig, ProviderConfig, Wire};

/// The fake as a Kestrel provider: Anthropic's wire, model `claude-x`, retries at once.
fn fake_provider(base_url: String) -> ProviderConfig {
    let mut provider = ProviderConfig::new(Wire::Anthropic, base_url);
    provider.models = vec![ModelConfig::named("claude-x")];
    provider.retry_base_delay_ms = 1;
    provider
}

/// A server with the fake provider configured as `fake` (model `fake/claude-x`), its admin
/// key, and a profile helper.
pub struct Bae {
    pub server: TestServer,
    pub admin: String,
    pub admin_key: String,
    pub fake: FakeProvider,
}

impl Bae {
    pub fn start() -> Bae {
        Bae::start_with(|_| {})
    }

    pub fn start_with(adjust: impl FnOnce(&mut kestrel::Config)) -> Bae {
        let fake = FakeProvider::start();
        let base_url = fake.base_url.clone();
        let server = TestServer::start_with(|config| {
            config.providers.insert("fake".into(), fake_provider(base_url));
            adjust(config);
        });
        let admin = format!("http://{}", server.server.as_ref().unwrap().admin_addr().expect("an admin API"));
        let admin_key =
            std::fs::read_to_string(server.data_dir.join("admin-key")).unwrap_or_default().trim().to_string();
        Bae { server, admin, admin_key, fake }
    }

    /// Restarts on the same data dir, the fake still configured.
    pub fn restart(&mut self) {
        self.restart_with(|_| {})
    }

    /// Restarts on the same data dir, the fake still configured, then `adjust`.
    pub fn restart_with(&mut self, adjust: impl FnOnce(&mut kestrel::Config)) {
        let base_url = self.fake.base_url.clone();
        self.server.restart(|config| {
            config.providers.insert("fake".into(), fake_provider(base_url));
            adjust(config);
        });
        let admin = self.server.server.as_ref().unwrap().admin_addr().expect("an admin API");
        self.admin = format!("http://{admin}");
    }

    pub fn base(&self) -> &str {
        &self.server.base
    }

    pub fn admin_send(&self, method: &str, path: &str, body: Option<Value>) -> Response {
        send(&self.admin, method, path, Some(&self.admin_key), body)
    }

    /// A profile allowing `tools`, its primary the fake; returns its id.
    pub fn profile(&self, name: &str, tools: &[&str]) -> String {
        let body = json!({ "name": name, "primary_provider": "fake", "allowed_tools": tools });
        let response = self.admin_send("POST", "/admin/v1/profiles", Some(body));
        assert_eq!(response.status, 201, "{}", response.text);
        response.json["id"].as_str().unwrap().to_string()
    }

    /// A client key for a profile: (its id, the key).
    pub fn client_key(&self, profile: &str) -> (String, String) {
        let body = json!({ "name": "test", "profile_id": profile });
        let response = self.admin_send("POST", "/admin/v1/keys", Some(body));
        assert_eq!(response.status, 201, "{}", response.text);
        (response.json["id"].as_str().unwrap().to_string(), response.json["key"].as_str().unwrap().to_string())
    }

    /// A profile with `tools` and a key for it.
    pub fn key_for(&self, name: &str, tools: &[&str]) -> (String, String) {
        let profile = self.profile(name, tools);
        self.client_key(&profile)
    }
}

/// One HTTP request with an optional bearer key and JSON body.
pub fn send(base: &str, method: &str, path: &str, key: Option<&str>, body: Option<Value>) -> Response {
    let mut request = ureq::request(method, &format!("{base}{path}")).timeout(WAIT);
    if let Some(key) = key {
        request = request.set("Authorization", &format!("Bearer {key}"));
    }
    let result = match body {
        Some(body) => request.set("Content-Type", "application/json").send_string(&body.to_string()),
        None => request.call(),
    };
    let response = match result {
        Ok(response) => response,
        Err(ureq::Error::Status(_, response)) => response,
        Err(error) => panic!("{method} {path}: {error}"),
    };
    let status = response.status();
    let headers = response
        .headers_names()
        .into_iter()
        .map(|n| (n.clone(), response.header(&n).unwrap_or("").to_string()))
        .collect();
    let content_type = response.header("content-type").map(str::to_string);
    let text = response.into_string().unwrap_or_default();
    crate::openapi::check(base, method, path, status, content_type.as_deref(), &text);
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    Response { status, text, json, headers }
}

/// Asserts an RFC 7807 problem.
pub fn assert_problem(response: &Response, status: u16, slug: &str) {
    assert_eq!(response.status, status, "{}", response.text);
    assert_eq!(response.json["type"], slug, "{}", response.text);
    assert_eq!(response.json["status"], status, "{}", response.text);
    assert!(response.json["title"].as_str().is_some_and(|t| !t.is_empty()), "{}", response.text);
    assert!(response.json["detail"].is_string(), "{}", response.text);
}

/// An NDJSON reply read as it arrives, a frame at a time, on its own thread.
pub struct Frames {
    pub status: u16,
    frames: Receiver<Value>,
    ended: Receiver<()>,
}

impl Frames {
    /// Posts one JSON-RPC body to a session's `/rpc`.
    pub fn post(base: &str, session: &str, key: &str, body: &str) -> Frames {
        let url = format!("{base}/api/v1/sessions/{session}/rpc");
        let result = ureq::post(&url)
            .set("Authorization", &format!("Bearer {key}"))
            .set("Content-Type", "application/json")
            .send_string(body);
        let response = match result {
            Ok(response) => response,
            Err(ureq::Error::Status(_, response)) => response,
            Err(error) => panic!("rpc: {error}"),
        };
        let status = response.status();
        let (frames_tx, frames) = unbounded();
        let (ended_tx, ended) = unbounded::<()>();
        let reader = BufReader::new(response.into_reader());
        std::thread::spawn(move || {
            for line in reader.lines() {
                let Ok(line) = line else { break };
                if line.is_empty() {
                    continue;
                }
                let frame =
                    serde_json::from_str(&line).unwrap_or_else(|e| panic!("a frame that is not JSON ({e}): {line}"));
                if frames_tx.send(frame).is_err() {
                    break;
                }
            }
            drop(ended_tx);
        });
        Frames { status, frames, ended }
    }

    /// The next frame within `timeout`.
    pub fn next(&self, timeout: Duration) -> Option<Value> {
        self.frames.recv_timeout(timeout).ok()
    }

    /// Whether nothing arrives (and the stream stays open) for `quiet`.
    pub fn silent_for(&self, quiet: Duration) -> bool {
        crossbeam_channel::select! {
            recv(self.frames) -> _ => false,
            recv(self.ended) -> _ => false,
            default(quiet) => true,
        }
    }

    /// Every frame up to and including the terminal one (one with a non-null id), or to the
    /// end of the stream.
    pub fn until_terminal(&self) -> Vec<Value> {
        let deadline = Instant::now() + WAIT;
        let mut all = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            crossbeam_channel::select! {
                recv(self.frames) -> frame => match frame {
                    Ok(frame) => {
                        let terminal = frame.get("id").is_some_and(|id| !id.is_null());
                        all.push(frame);
                        if terminal {
                            return all;
                        }
                    }
                    Err(_) => return all,
                },
                default(left) => panic!("no terminal frame within {WAIT:?}; got {all:?}"),
            }
        }
    }

    /// Waits for the stream to end; fails the test if it does not within `WAIT`.
    pub fn wait_end(&self) {
        let ended = self.ended.recv_timeout(WAIT);
        assert!(matches!(ended, Err(crossbeam_channel::RecvTimeoutError::Disconnected)), "the stream did not end");
    }
}

/// A client of one session, like BAE's SDK harness.
pub struct Harness {
    pub base: String,
    pub session_id: String,
    pub session_key: String,
    pub next_id: u64,
}

impl Harness {
    /// Opens a session with these client tools, then registers as a driver.
    pub fn open(base: &str, client_key: &str, tools: &[&str]) -> Harness {
        let response = send(base, "POST", "/api/v1/sessions", Some(client_key), Some(open_body(tools)));
        assert_eq!(response.status, 201, "{}", response.text);
        Harness::registered(base, &response)
    }

    /// Joins a session with these client tools, then registers as a driver.
    pub fn join(base: &str, session_id: &str, client_key: &str, tools: &[&str]) -> Harness {
        let path = format!("/api/v1/sessions/{session_id}/join");
        let response = send(base, "POST", &path, Some(client_key), Some(open_body(tools)));
        assert_eq!(response.status, 201, "{}", response.text);
        Harness::registered(base, &response)
    }

    /// Opens a session with this body, then registers as a driver.
    pub fn open_with(base: &str, client_key: &str, body: Value) -> Harness {
        let response = send(base, "POST", "/api/v1/sessions", Some(client_key), Some(body));
        assert_eq!(response.status, 201, "{}", response.text);
        Harness::registered(base, &response)
    }

    /// Opens a session with this body, not registering as a driver.
    pub fn open_unregistered(base: &str, client_key: &str, body: Value) -> Harness {
        let response = send(base, "POST", "/api/v1/sessions", Some(client_key), Some(body));
        assert_eq!(response.status, 201, "{}", response.text);
        Harness::of(base, &response)
    }

    fn of(base: &str, response: &Response) -> Harness {
        Harness {
            base: base.to_string(),
            session_id: response.json["session_id"].as_str().unwrap().to_string(),
            session_key: response.json["session_key"].as_str().unwrap().to_string(),
            next_id: 1,
        }
    }

    fn registered(base: &str, response: &Response) -> Harness {
        let mut harness = Harness::of(base, response);
        let frames = harness.call("session.registerDriver", json!({}));
        assert_eq!(frames.last().unwrap()["result"]["registered"], true, "{frames:?}");
        harness
    }

    /// Starts a call; the stream is read as it arrives.
    pub fn start(&mut self, method: &str, params: Value) -> Frames {
        let body = json!({ "jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params });
        self.next_id += 1;
        Frames::post(&self.base, &self.session_id, &self.session_key, &body.to_string())
    }

    /// A call, read to its terminal frame.
    pub fn call(&mut self, method: &str, params: Value) -> Vec<Value> {
        let frames = self.start(method, params);
        assert_eq!(frames.status, 200);
        frames.until_terminal()
    }

    /// `sendMessage` with `content`, to its terminal frame.
    /// Closes the session with its key.
    pub fn close(&self) -> Response {
        send(&self.base, "DELETE", &format!("/api/v1/sessions/{}", self.session_id), Some(&self.session_key), None)
    }

    pub fn send_message(&mut self, content: Value) -> Vec<Value> {
        self.call("session.sendMessage", json!({ "message": { "role": "user", "content": content } }))
    }

    /// The harness loop: send, run every `dispatch: "client"` tool call with `run`, send the
    /// results, until an answer calls no client tool. Returns every call's frames.
    pub fn converse(&mut self, content: Value, mut run: impl FnMut(&str, &Value) -> Value) -> Vec<Vec<Value>> {
        let mut calls = vec![self.send_message(content)];
        loop {
            let terminal = calls.last().unwrap().last().unwrap().clone();
            let content = terminal["result"]["message"]["content"].as_array().cloned().unwrap_or_default();
            let ours: Vec<&Value> =
                content.iter().filter(|b| b["type"] == "tool_use" && b["dispatch"] == "client").collect();
            if ours.is_empty() {
                return calls;
            }
            let results: Vec<Value> = ours
                .iter()
                .map(|b| json!({ "type": "tool_result", "tool_use_id": b["id"], "content": run(b["name"].as_str().unwrap(), &b["input"]) }))
                .collect();
            calls.push(self.send_message(Value::Array(results)));
        }
    }

    pub fn get(&self, path: &str) -> Response {
        send(&self.base, "GET", &format!("/api/v1/sessions/{}{path}", self.session_id), Some(&self.session_key), None)
    }

    /// Every event of the session, following the cursor.
    pub fn events(&self) -> Vec<Value> {
        let mut all = Vec::new();
        let mut cursor = String::new();
        loop {
            let page = self.get(&format!("/events?limit=200&cursor={cursor}"));
            assert_eq!(page.status, 200, "{}", page.text);
            all.extend(page.json["items"].as_array().unwrap().iter().cloned());
            match page.json["next_cursor"].as_str() {
                Some(next) => cursor = next.to_string(),
                None => return all,
            }
        }
    }
}

fn open_body(tools: &[&str]) -> Value {
    let tools: Vec<Value> = tools
        .iter()
        .map(|name| json!({ "name": name, "description": format!("the {name} tool"), "input_schema": { "type": "object", "properties": {} } }))
        .collect();
    json!({ "client_version": "1.0.0", "tools": tools })
}

/// The `event_type`s of event views, in order.
pub fn types(events: &[Value]) -> Vec<String> {
    events.iter().map(|e| e["event_type"].as_str().unwrap_or("?").to_string()).collect()
}

/// The event views a call streamed as notifications.
pub fn notified(frames: &[Value]) -> Vec<Value> {
    frames.iter().filter(|f| f["method"] == "session.event").map(|f| f["params"].clone()).collect()
}
