//! `scripts/crashloop N`: N rounds of start, load, `kill -9` at a random moment, check.
//!
//! The load is a few sessions, each sending messages one after another: plain text, a
//! `run_command` that needs an approval (the driver approves it) and appends a unique token to
//! `commands.log`, and a `write_file` that runs without asking. Every send carries an
//! Idempotency-Key. After each kill the checks are:
//!
//! - `PRAGMA integrity_check` is ok;
//! - every message whose 202 arrived is in its session's transcript;
//! - every send whose answer was lost is retried with its key: the message is then stored
//!   exactly once;
//! - no token appears twice in `commands.log` (no command ran twice);
//! - the first event after the restart has a higher seq than any seen before;
//! - every `interrupted` session resumes (`202`) and its run finishes.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::random::Random;
use super::server::{integrity_ok, Kestrel};
use super::wire::{Client, Outcome};

const SESSIONS: usize = 3;
const CONFIG: &str = "[builtin]\ndelay_ms = 3\n[agent.permissions]\nrun_command = \"ask\"\nwrite_file = \"auto\"\n";

/// What a crash loop saw; `failures` lists every broken promise.
#[derive(Default, Debug)]
pub struct Report {
    pub rounds: usize,
    pub acknowledged: usize,
    pub retried: usize,
    pub approvals: usize,
    pub commands_run: usize,
    pub resumed: usize,
    pub integrity_checks: usize,
    pub failures: Vec<String>,
}

impl Report {
    pub fn print(&self) {
        println!("crashloop: {} rounds, each ended by kill -9", self.rounds);
        println!("  messages acknowledged (202)          {:>8}", self.acknowledged);
        println!("  sends retried with their key         {:>8}", self.retried);
        println!("  approvals given                      {:>8}", self.approvals);
        println!("  commands run (tokens in the log)     {:>8}", self.commands_run);
        println!("  interrupted sessions resumed         {:>8}", self.resumed);
        println!("  integrity checks passed              {:>8}", self.integrity_checks);
        println!("  failures                             {:>8}", self.failures.len());
        for failure in self.failures.iter().take(20) {
            println!("    {failure}");
        }
    }
}

/// Every send so far, by token: its session and whether its 202 arrived.
#[derive(Default)]
struct Ledger {
    sends: HashMap<String, Send>,
}

#[derive(Clone)]
struct Send {
    session: String,
    body: Value,
    acknowledged: bool,
}

pub fn run(binary: &Path, rounds: usize, seed: u64) -> Report {
    let mut root = tempfile::tempdir().expect("a temporary directory");
    // HAMMER_KEEP=1 keeps the data dir and workspace for a post-mortem.
    if std::env::var_os("HAMMER_KEEP").is_some() {
        root.disable_cleanup(true);
        println!("keeping {}", root.path().display());
    }
    let (data, workspace) = (root.path().join("state"), root.path().join("workspace"));
    std::fs::create_dir_all(&workspace).expect("the workspace");
    let mut random = Random(seed | 1);
    let mut report = Report::default();
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let mut sessions = Vec::new();
    let mut max_seq = 0;
    for round in 0..rounds {
        let server = Kestrel::start(binary, &data, &workspace, CONFIG);
        if sessions.is_empty() {
            sessions = (0..SESSIONS).map(|_| create_session(&server.host)).collect();
        }
        check_after_restart(&server.host, &sessions, &ledger, &mut max_seq, &mut report);
        let stop = Arc::new(AtomicBool::new(false));
        let seen_seq = Arc::new(AtomicU64::new(max_seq));
        let drivers: Vec<_> = sessions
            .iter()
            .enumerate()
            .map(|(index, session)| {
                let (host, session, ledger, stop, seen) = (
                    server.host.clone(),
                    session.clone(),
                    Arc::clone(&ledger),
                    Arc::clone(&stop),
                    Arc::clone(&seen_seq),
                );
                let seed = random.next();
                std::thread::spawn(move || drive(&host, &session, &ledger, &stop, &seen, round, index, seed))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100 + random.next() % 1400));
        server.kill_9();
        stop.store(true, Ordering::SeqCst);
        for driver in drivers {
            report.approvals += driver.join().unwrap_or(0);
        }
        max_seq = max_seq.max(seen_seq.load(Ordering::SeqCst));
        if integrity_ok(&data) {
            report.integrity_checks += 1;
        } else {
            report.failures.push(format!("round {round}: integrity_check failed after kill -9"));
        }
        report.rounds += 1;
    }
    // One last start to check the last kill, then a clean stop.
    let server = Kestrel::start(binary, &data, &workspace, CONFIG);
    check_after_restart(&server.host, &sessions, &ledger, &mut max_seq, &mut report);
    if !server.stop() {
        report.failures.push("the final SIGTERM did not exit cleanly".into());
    }
    check_commands(&workspace, &mut report);
    let ledger = ledger.lock().unwrap_or_else(|e| e.into_inner());
    report.acknowledged = ledger.sends.values().filter(|s| s.acknowledged).count();
    report
}

/// Sends messages on one session until told to stop or the server is gone; answers approvals.
/// Returns how many approvals it gave.
#[allow(clippy::too_many_arguments)]
fn drive(
    host: &str,
    session: &str,
    ledger: &Mutex<Ledger>,
    stop: &AtomicBool,
    seen_seq: &AtomicU64,
    round: usize,
    index: usize,
    seed: u64,
) -> usize {
    let mut random = Random(seed | 1);
    let mut client = Client::new(host);
    client.deadline = Duration::from_secs(5);
    let mut approvals = 0;
    for n in 0.. {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let token = format!("tok-{round}-{index}-{n}");
        let body = json!({ "content": message(&mut random, &token) });
        ledger
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .sends
            .insert(token.clone(), Send { session: session.to_string(), body: body.clone(), acknowledged: false });
        let path = format!("/api/sessions/{session}/messages");
        let answer = client.request("POST", &path, &[("Idempotency-Key", &token)], body.to_string().as_bytes());
        match answer.status() {
            Some(202) => {
                let mut ledger = ledger.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(send) = ledger.sends.get_mut(&token) {
                    send.acknowledged = true;
                }
            }
            Some(status) => {
                // Refused (409 while a resumed run finishes): answered, so nothing to retry.
                ledger.lock().unwrap_or_else(|e| e.into_inner()).sends.remove(&token);
                if status == 409 && follow_run(host, session, seen_seq).is_none() {
                    break;
                }
                continue;
            }
            None => break, // the server is gone: the send stays unanswered, to retry later
        }
        match follow_run(host, session, seen_seq) {
            Some(given) => approvals += given,
            None => break,
        }
    }
    approvals
}

/// One message of the load, carrying `token`: plain text, a `run_command` that appends the
/// token to `commands.log` (asking for an approval), or a `write_file` of it.
pub fn message(random: &mut Random, token: &str) -> String {
    match random.next() % 3 {
        0 => format!("plain {token}"),
        1 => format!(
            "/tool run_command {}",
            json!({ "command": format!("sleep 0.0{}; echo {token} >> commands.log", random.next() % 10) })
        ),
        _ => format!("/tool write_file {}", json!({ "path": format!("files/{token}.txt"), "content": token })),
    }
}

/// Watches a session's events until its run ends, approving whatever it asks; `None` when
/// the server went away first.
fn follow_run(host: &str, session: &str, seen_seq: &AtomicU64) -> Option<usize> {
    let mut client = Client::new(host);
    client.deadline = Duration::from_secs(2);
    let mut approvals = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        // The transcript is the source of truth; a poll keeps this driver simple and the
        // server's own SSE path is exercised by the fan-out benchmark.
        let detail = client.request("GET", &format!("/api/sessions/{session}"), &[], b"");
        let Outcome::Answered { .. } = &detail else { return None };
        let status = detail.json()["session"]["status"].as_str().unwrap_or("").to_string();
        if status != "running" {
            return Some(approvals);
        }
        for approval in pending_approvals(&client.stream_events(session, seen_seq)) {
            let path = format!("/api/sessions/{session}/approvals/{approval}");
            if client.request("POST", &path, &[], br#"{"approved":true}"#).status() == Some(200) {
                approvals += 1;
            }
        }
    }
    Some(approvals)
}

fn pending_approvals(events: &[Value]) -> Vec<String> {
    let mut pending: Vec<String> = Vec::new();
    for event in events {
        match event["event"]["type"].as_str() {
            Some("approval.requested") => {
                pending.push(event["event"]["approval"]["id"].as_str().unwrap_or("").to_string());
            }
            Some("approval.resolved") => {
                let id = event["event"]["approvalId"].as_str().unwrap_or("");
                pending.retain(|p| p != id);
            }
            _ => {}
        }
    }
    pending
}

/// After a restart: transcripts hold what was acknowledged, lost answers are retried with
/// their key, seqs rise, interrupted sessions resume.
fn check_after_restart(
    host: &str,
    sessions: &[String],
    ledger: &Mutex<Ledger>,
    max_seq: &mut u64,
    report: &mut Report,
) {
    let mut client = Client::new(host);
    // A new session makes an event whose seq must be above everything seen before the kill.
    let probe = create_session(host);
    let seq = client.stream_events(&probe, &AtomicU64::new(0)).iter().filter_map(|e| e["seq"].as_u64()).max();
    match seq {
        Some(seq) if seq <= *max_seq => report.failures.push(format!("seq {seq} reused (had seen {max_seq})")),
        Some(seq) => *max_seq = seq,
        None => {}
    }
    let unanswered: Vec<(String, Send)> = {
        let ledger = ledger.lock().unwrap_or_else(|e| e.into_inner());
        ledger.sends.iter().filter(|(_, s)| !s.acknowledged).map(|(t, s)| (t.clone(), s.clone())).collect()
    };
    for session in sessions {
        resume_if_interrupted(&mut client, host, session, report);
    }
    for (token, send) in unanswered {
        let path = format!("/api/sessions/{}/messages", send.session);
        let answer = client.request("POST", &path, &[("Idempotency-Key", &token)], send.body.to_string().as_bytes());
        if answer.status() == Some(202) {
            report.retried += 1;
            if let Some(send) = ledger.lock().unwrap_or_else(|e| e.into_inner()).sends.get_mut(&token) {
                send.acknowledged = true;
            }
            let _ = follow_run(host, &send.session, &AtomicU64::new(0));
        }
    }
    let ledger = ledger.lock().unwrap_or_else(|e| e.into_inner());
    for session in sessions {
        let answer = client.request("GET", &format!("/api/sessions/{session}"), &[], b"");
        if answer.status() != Some(200) {
            report.failures.push(format!("{session}: the transcript could not be read: {answer:?}"));
            continue;
        }
        let detail = answer.json();
        let contents: Vec<String> = detail["session"]["messages"]
            .as_array()
            .map(|m| {
                m.iter()
                    .filter(|m| m["role"] == "user")
                    .filter_map(|m| m["content"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        for (token, send) in ledger.sends.iter().filter(|(_, s)| s.acknowledged && &s.session == session) {
            let copies = contents.iter().filter(|c| c.contains(token.as_str())).count();
            if copies != 1 {
                report.failures.push(format!("{token}: acknowledged, stored {copies} times ({:?})", send.body));
            }
        }
    }
}

fn resume_if_interrupted(client: &mut Client, host: &str, session: &str, report: &mut Report) {
    let detail = client.request("GET", &format!("/api/sessions/{session}"), &[], b"").json();
    if detail["session"]["status"] != "interrupted" {
        return;
    }
    let resumed = client.request("POST", &format!("/api/sessions/{session}/resume"), &[], b"");
    if resumed.status() != Some(202) {
        report.failures.push(format!("{session}: interrupted but resume answered {:?}", resumed.status()));
        return;
    }
    match follow_run(host, session, &AtomicU64::new(0)) {
        Some(given) => {
            report.resumed += 1;
            report.approvals += given;
        }
        None => report.failures.push(format!("{session}: the resumed run never finished")),
    }
}

/// No token in `commands.log` twice.
fn check_commands(workspace: &Path, report: &mut Report) {
    let log = std::fs::read_to_string(workspace.join("commands.log")).unwrap_or_default();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for token in log.lines().map(str::trim).filter(|t| !t.is_empty()) {
        *counts.entry(token).or_default() += 1;
    }
    report.commands_run = counts.len();
    for (token, count) in counts.into_iter().filter(|(_, n)| *n > 1) {
        report.failures.push(format!("command {token} ran {count} times"));
    }
}

fn create_session(host: &str) -> String {
    let answer = Client::new(host).request("POST", "/api/sessions", &[], b"{}");
    answer.json()["session"]["id"].as_str().expect("a session is created").to_string()
}

impl Client {
    /// The envelopes the session's stream replays from the ring right now (`lastEventId=0`),
    /// read for a moment; records the highest seq in `seen`.
    fn stream_events(&self, session: &str, seen: &AtomicU64) -> Vec<Value> {
        let events = self.replay(&format!("/api/sessions/{session}/events?lastEventId=0"));
        if let Some(max) = events.iter().filter_map(|e| e["seq"].as_u64()).max() {
            seen.fetch_max(max, Ordering::SeqCst);
        }
        events
    }
}
