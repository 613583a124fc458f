//! BAE's server-run calls under `kill -9`: rounds of start, BAE turns whose calls run on the
//! server (a sandbox tool's command, an MCP tool, a subagent launch), `kill -9` at a random
//! moment, restart. Every call leaves a unique token where it ran: the sandbox command and
//! the subagent's process in `bae-runs.log` of the sandbox's directory, the MCP tool in the
//! tiny server's `TINY_RECORD` file. After each restart:
//!
//! - no token appears twice anywhere (no call ran twice);
//! - every server-run call the sessions announced has its result (the killed ones recorded
//!   as the error BAE's crash rule gives them);
//! - each session of the killed round answers a new `sendMessage` (it stayed usable).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::random::Random;
use super::server::{integrity_ok, Kestrel};
use super::wire::{Client, Outcome};

const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/mcp_fixtures/tiny_server.py");
/// BAE sessions driven at once each round.
const SESSIONS: usize = 2;
/// What the killed calls' results say (`engine::bae::INTERRUPTED_RESULT`).
const INTERRUPTED: &str = "the server stopped before this call finished; it was not run again";

fn config(record: &Path) -> String {
    format!(
        "[builtin]\ndelay_ms = 0\n[bae]\nsandbox_exec_timeout_secs = 10\n\
         [[mcp.servers]]\nname = \"tiny\"\ntransport = \"stdio\"\ncommand = \"python3\"\nargs = [{TINY:?}]\n\
         timeout_secs = 10\nenv = {{ TINY_RECORD = {:?} }}\n",
        record.display().to_string()
    )
}

#[derive(Default, Debug)]
pub struct Report {
    pub rounds: usize,
    /// Calls sent, by kind.
    pub calls: BTreeMap<&'static str, usize>,
    /// Distinct tokens found where the calls ran.
    pub executions: usize,
    pub double_executions: usize,
    /// Killed calls found recorded with the crash rule's error result.
    pub recorded_interrupted: usize,
    /// Sessions of a killed round that answered a new turn after the restart.
    pub usable_after_restart: usize,
    pub failures: Vec<String>,
}

impl Report {
    pub fn print(&self) {
        println!("bae crashloop: {} rounds, each ended by kill -9", self.rounds);
        let calls: Vec<String> = self.calls.iter().map(|(k, n)| format!("{k}: {n}")).collect();
        println!("  server-run calls sent: {}", calls.join(", "));
        println!("  executions (distinct tokens)         {:>8}", self.executions);
        println!("  double executions                    {:>8}", self.double_executions);
        println!("  killed calls recorded as errors      {:>8}", self.recorded_interrupted);
        println!("  sessions usable after the restart    {:>8}", self.usable_after_restart);
        println!("  failures                             {:>8}", self.failures.len());
        for failure in self.failures.iter().take(20) {
            println!("    {failure}");
        }
    }
}

/// A BAE session the loop drives: its id and session key.
#[derive(Clone)]
struct Session {
    id: String,
    key: String,
}

pub fn run(binary: &Path, rounds: usize, seed: u64) -> Report {
    let root = tempfile::tempdir().expect("a temporary directory");
    let (data, workspace, record) =
        (root.path().join("state"), root.path().join("workspace"), root.path().join("mcp-runs.log"));
    std::fs::create_dir_all(&workspace).expect("the workspace");
    let mut random = Random(seed | 1);
    let mut report = Report::default();
    // Every run log's latest content, by path (a sandbox's directory outlives its server).
    let mut logs: HashMap<PathBuf, String> = HashMap::new();
    let mut killed: Vec<Session> = Vec::new();
    let mut client_key = None;
    for round in 0..=rounds {
        let server = Kestrel::start(binary, &data, &workspace, &config(&record));
        for session in std::mem::take(&mut killed) {
            check_after_restart(&server.host, &session, &mut report);
        }
        if round == rounds {
            drop(server);
            break;
        }
        let key = match &client_key {
            Some(key) => key,
            None => client_key.insert(client_key_for(&server, &data)),
        };
        let sessions: Vec<Session> = (0..SESSIONS).filter_map(|_| open(&server.host, key)).collect();
        if sessions.len() != SESSIONS {
            report.failures.push(format!("round {round}: the BAE sessions could not be opened"));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let drivers: Vec<_> = sessions
            .iter()
            .enumerate()
            .map(|(index, session)| {
                let (host, session, stop, seed) =
                    (server.host.clone(), session.clone(), Arc::clone(&stop), random.next());
                std::thread::spawn(move || drive(&host, &session, &stop, round, index, seed))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300 + random.next() % 1500));
        server.kill_9();
        stop.store(true, Ordering::SeqCst);
        for driver in drivers {
            for (kind, count) in driver.join().unwrap_or_default() {
                *report.calls.entry(kind).or_default() += count;
            }
        }
        if !integrity_ok(&data) {
            report.failures.push(format!("round {round}: integrity_check failed after kill -9"));
        }
        read_logs(&data, &record, &mut logs);
        killed = sessions;
        report.rounds += 1;
    }
    read_logs(&data, &record, &mut logs);
    count_tokens(&logs, &mut report);
    report
}

/// A profile offering the sandbox image and the tiny MCP server, and a client key for it.
fn client_key_for(server: &Kestrel, data: &Path) -> String {
    let admin_key = std::fs::read_to_string(data.join("data/admin-key")).expect("the admin key");
    let bearer = format!("Bearer {}", admin_key.trim());
    let headers = [("Authorization", bearer.as_str()), ("Content-Type", "application/json")];
    let mut admin = Client::new(&server.admin);
    let body = json!({ "name": "bae-crash", "primary_provider": "builtin/echo",
        "available_sandboxes": ["alpine:3.19"], "mcp_servers": ["tiny"] });
    let profile = admin.request("POST", "/admin/v1/profiles", &headers, body.to_string().as_bytes()).json();
    let body = json!({ "name": "bae-crash", "profile_id": profile["id"] });
    let key = admin.request("POST", "/admin/v1/keys", &headers, body.to_string().as_bytes()).json();
    key["key"].as_str().expect("a client key").to_string()
}

/// Opens a session declaring a sandbox tool and a subagent tool, registers, starts its sandbox.
fn open(host: &str, client_key: &str) -> Option<Session> {
    let shell = json!({ "name": "shell", "input_schema": { "type": "object", "properties": { "command": { "type": "string" } } } });
    let subagent = json!({ "name": "launch_subagent", "image": "alpine:3.19", "subagents": [
        { "harness": "sh", "command_template": "echo {prompt} >> bae-runs.log; sleep 2", "prompt_via": "arg" }] });
    let body = json!({ "tools": [], "sandbox_tools": [shell], "subagent_tools": [subagent] });
    let bearer = format!("Bearer {client_key}");
    let headers = [("Authorization", bearer.as_str()), ("Content-Type", "application/json")];
    let opened = Client::new(host).request("POST", "/api/v1/sessions", &headers, body.to_string().as_bytes()).json();
    let session =
        Session { id: opened["session_id"].as_str()?.to_string(), key: opened["session_key"].as_str()?.to_string() };
    rpc(host, &session, "session.registerDriver", json!({}));
    rpc(host, &session, "session.startRemoteSandbox", json!({ "image": "alpine:3.19" }));
    Some(session)
}

/// One JSON-RPC call; its frames' JSON, in order.
fn rpc(host: &str, session: &Session, method: &str, params: Value) -> Outcome {
    let mut client = Client::new(host);
    client.deadline = Duration::from_secs(30);
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
    let bearer = format!("Bearer {}", session.key);
    let headers = [("Authorization", bearer.as_str()), ("Content-Type", "application/json")];
    client.request("POST", &format!("/api/v1/sessions/{}/rpc", session.id), &headers, body.to_string().as_bytes())
}

/// Sends turns whose calls run on the server until told to stop or the server is gone;
/// returns the calls sent by kind.
fn drive(
    host: &str,
    session: &Session,
    stop: &AtomicBool,
    round: usize,
    index: usize,
    seed: u64,
) -> Vec<(&'static str, usize)> {
    let mut random = Random(seed | 1);
    let mut sent: BTreeMap<&'static str, usize> = BTreeMap::new();
    for n in 0.. {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let token = format!("bae-{round}-{index}-{n}");
        let pause = format!("0.{}", random.next() % 5);
        let (kind, line) = match random.next() % 3 {
            0 => (
                "sandbox",
                format!("/tool shell {}", json!({ "command": format!("echo {token} >> bae-runs.log; sleep {pause}") })),
            ),
            1 => ("mcp", format!("/tool record {}", json!({ "token": token, "sleep": pause }))),
            _ => (
                "subagent",
                format!("/tool launch_subagent {}", json!({ "harness": "sh", "model": "m", "prompt": token })),
            ),
        };
        *sent.entry(kind).or_default() += 1;
        let message = json!({ "message": { "role": "user", "content": line } });
        if rpc(host, session, "session.sendMessage", message).status().is_none() {
            break;
        }
    }
    sent.into_iter().collect()
}

/// After a restart: every server-run call announced has a result, and a new turn answers.
fn check_after_restart(host: &str, session: &Session, report: &mut Report) {
    let events = session_events(host, session);
    let mut open_calls: Vec<String> = Vec::new();
    for event in &events {
        let payload = &event["payload"];
        match event["event_type"].as_str() {
            Some("tool.call") if payload["dispatch"] != "client" => {
                open_calls.push(payload["id"].as_str().unwrap_or_default().to_string())
            }
            Some("tool.result") => {
                let id = payload["tool_use_id"].as_str().unwrap_or_default();
                open_calls.retain(|open| open != id);
                if payload["content"][0]["text"] == INTERRUPTED {
                    report.recorded_interrupted += 1;
                }
            }
            _ => {}
        }
    }
    for call in open_calls {
        report.failures.push(format!("{}: call {call} was announced and has no result", session.id));
    }
    rpc(host, session, "session.registerDriver", json!({}));
    let message = json!({ "message": { "role": "user", "content": "still there?" } });
    let answered = rpc(host, session, "session.sendMessage", message);
    let last = answered.ndjson().pop().unwrap_or_default();
    match last["result"]["message"].is_object() {
        true => report.usable_after_restart += 1,
        false => report.failures.push(format!("{}: no answer after the restart: {last}", session.id)),
    }
}

/// Every event of the session, following the cursor.
fn session_events(host: &str, session: &Session) -> Vec<Value> {
    let mut client = Client::new(host);
    let bearer = format!("Bearer {}", session.key);
    let mut all = Vec::new();
    let mut cursor = String::new();
    loop {
        let path = format!("/api/v1/sessions/{}/events?limit=200&cursor={cursor}", session.id);
        let page = client.request("GET", &path, &[("Authorization", bearer.as_str())], b"").json();
        all.extend(page["items"].as_array().cloned().unwrap_or_default());
        match page["next_cursor"].as_str() {
            Some(next) => cursor = next.to_string(),
            None => return all,
        }
    }
}

/// The run logs as they are now: the MCP record and each sandbox's `bae-runs.log`.
fn read_logs(data: &Path, record: &Path, logs: &mut HashMap<PathBuf, String>) {
    let sandboxes = data.join("data/sandboxes");
    let found =
        std::fs::read_dir(&sandboxes).into_iter().flatten().flatten().map(|entry| entry.path().join("bae-runs.log"));
    for path in found.chain([record.to_path_buf()]) {
        if let Ok(text) = std::fs::read_to_string(&path) {
            logs.insert(path, text);
        }
    }
}

fn count_tokens(logs: &HashMap<PathBuf, String>, report: &mut Report) {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for token in logs.values().flat_map(|text| text.lines()).map(str::trim).filter(|t| !t.is_empty()) {
        *counts.entry(token).or_default() += 1;
    }
    report.executions = counts.len();
    for (token, count) in counts.into_iter().filter(|(_, n)| *n > 1) {
        report.double_executions += 1;
        report.failures.push(format!("call {token} ran {count} times"));
    }
}
