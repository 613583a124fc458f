//! `scripts/crashloop --cluster 3 N`: N points of `kill -9` of a random node of a cluster of
//! node processes on one PostgreSQL database, under load, each killed node started again.
//!
//! The load: a few sessions, each sending messages one after another at a node chosen per
//! request (plain text, a `run_command` that needs an approval, given at another node, and
//! appends a unique token to `commands.log`, and a `write_file`), every send with an
//! Idempotency-Key, each turn followed by polling and resumed when a node's death
//! interrupted it. One watcher follows the global `/api/events`, reconnecting at another
//! node with `Last-Event-ID` whenever its node dies. At the end:
//!
//! - **lost**: messages whose 202 arrived and are not in their transcript, and logged events
//!   (after the watcher's first) the watcher never saw;
//! - **double**: messages stored more than once, commands run more than once, and events the
//!   watcher saw twice;
//! - **gap**: places where the watcher's seqs did not rise.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::random::Random;
use super::server::Kestrel;

const SESSIONS: usize = 3;
const SECRET: &str = "crashloop-cluster-secret";
const LEASE_MS: u64 = 1_000;

/// What a cluster crash loop saw.
#[derive(Default, Debug)]
pub struct Report {
    pub points: usize,
    pub nodes: usize,
    pub acknowledged: usize,
    pub resumed: usize,
    pub approvals: usize,
    pub events_seen: usize,
    pub lost: Vec<String>,
    pub double: Vec<String>,
    pub gap: Vec<String>,
}

impl Report {
    pub fn failures(&self) -> usize {
        self.lost.len() + self.double.len() + self.gap.len()
    }

    pub fn print(&self) {
        println!("crashloop --cluster {}: {} points, each a kill -9 of a random node", self.nodes, self.points);
        println!("  messages acknowledged (202)          {:>8}", self.acknowledged);
        println!("  interrupted turns resumed            {:>8}", self.resumed);
        println!("  approvals given                      {:>8}", self.approvals);
        println!("  events the global stream delivered   {:>8}", self.events_seen);
        println!(
            "  lost / double / gap                  {:>8}",
            format!("{}/{}/{}", self.lost.len(), self.double.len(), self.gap.len())
        );
        for failure in self.lost.iter().chain(&self.double).chain(&self.gap).take(20) {
            println!("    {failure}");
        }
    }
}

/// The nodes' addresses, as they are now (a restarted node listens on a new port).
type Hosts = Arc<RwLock<Vec<String>>>;

struct Node {
    server: Option<Kestrel>,
    data: PathBuf,
    config: String,
}

pub fn run(binary: &Path, nodes: usize, points: usize, seed: u64) -> Report {
    let cluster = crate::pg_cluster::private().expect("PostgreSQL (Debian's postgresql) is installed");
    let database = cluster.database();
    let root = tempfile::tempdir().expect("a temporary directory");
    let workspace = root.path().join("workspace");
    std::fs::create_dir_all(&workspace).expect("the workspace");
    let mut random = Random(seed | 1);
    let mut cluster_nodes: Vec<Node> = (0..nodes)
        .map(|n| {
            let config = format!(
                "[store]\nurl = \"{database}\"\n[cluster]\nsecret = \"{SECRET}\"\nnode_id = \"node-{n}\"\n\
                 lease_ms = {LEASE_MS}\n[server]\nsse_ping_interval_ms = 200\n[builtin]\ndelay_ms = 3\n\
                 [agent.permissions]\nrun_command = \"ask\"\nwrite_file = \"auto\"\n"
            );
            let data = root.path().join(format!("node-{n}"));
            let server =
                Kestrel::start_with(binary, &data, &workspace, &config, &[("KESTREL_DATABASE_URL", &database)]);
            Node { server: Some(server), data, config }
        })
        .collect();
    let hosts: Hosts =
        Arc::new(RwLock::new(cluster_nodes.iter().map(|n| n.server.as_ref().unwrap().host.clone()).collect()));
    let stop = Arc::new(AtomicBool::new(false));
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let counts = Arc::new(Counts::default());
    let watcher = {
        let (hosts, stop) = (Arc::clone(&hosts), Arc::clone(&stop));
        std::thread::spawn(move || watch(&hosts, &stop))
    };
    let drivers: Vec<_> = (0..SESSIONS)
        .map(|index| {
            let (hosts, stop, ledger, counts) = (hosts.clone(), stop.clone(), ledger.clone(), counts.clone());
            let seed = random.next();
            std::thread::spawn(move || drive(&hosts, &stop, &ledger, &counts, index, seed))
        })
        .collect();
    let mut report = Report { nodes, ..Report::default() };
    for _ in 0..points {
        // Some load first, on every node.
        let target = counts.turns.load(Ordering::SeqCst) + 1 + (random.next() % 3) as usize;
        let deadline = Instant::now() + Duration::from_secs(60);
        while counts.turns.load(Ordering::SeqCst) < target && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(random.next() % 400));
        let victim = (random.next() % nodes as u64) as usize;
        let node = &mut cluster_nodes[victim];
        if let Some(server) = node.server.take() {
            server.kill_9();
        }
        let server =
            Kestrel::start_with(binary, &node.data, &workspace, &node.config, &[("KESTREL_DATABASE_URL", &database)]);
        hosts.write().unwrap_or_else(|e| e.into_inner())[victim] = server.host.clone();
        node.server = Some(server);
        report.points += 1;
    }
    stop.store(true, Ordering::SeqCst);
    let sessions: Vec<String> = drivers.into_iter().filter_map(|driver| driver.join().ok()).collect();
    let seen = watcher.join().unwrap_or_default();
    check(&database, &hosts, &sessions, &ledger, &seen, &workspace, &mut report);
    report.resumed = counts.resumed.load(Ordering::SeqCst);
    report.approvals = counts.approvals.load(Ordering::SeqCst);
    for node in &mut cluster_nodes {
        if let Some(server) = node.server.take() {
            server.stop();
        }
    }
    report
}

/// Every send: its session, its body, and whether its 202 arrived.
#[derive(Default)]
struct Ledger {
    sends: HashMap<String, (String, Value, bool)>,
}

#[derive(Default)]
struct Counts {
    turns: AtomicUsize,
    resumed: AtomicUsize,
    approvals: AtomicUsize,
}

/// One request at a node chosen per request; a node that does not answer (killed, or
/// starting) is passed over, and a 503 is tried again, as a balancer and a client would.
fn call(
    hosts: &Hosts,
    random: &mut Random,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: Option<&Value>,
) -> Option<(u16, Value)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let host = {
            let hosts = hosts.read().unwrap_or_else(|e| e.into_inner());
            hosts[(random.next() % hosts.len() as u64) as usize].clone()
        };
        let mut request = ureq::request(method, &format!("http://{host}{path}")).timeout(Duration::from_secs(10));
        if let Some(key) = key {
            request = request.set("Idempotency-Key", key);
        }
        let sent = match body {
            Some(body) => request.send_json(body.clone()),
            None => request.call(),
        };
        match sent {
            Ok(answer) | Err(ureq::Error::Status(_, answer)) if answer.status() != 503 => {
                let status = answer.status();
                return Some((status, answer.into_json().unwrap_or(Value::Null)));
            }
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    None
}

/// Sends on one session until told to stop; its id.
fn drive(hosts: &Hosts, stop: &AtomicBool, ledger: &Mutex<Ledger>, counts: &Counts, index: usize, seed: u64) -> String {
    let mut random = Random(seed | 1);
    let created = call(hosts, &mut random, "POST", "/api/sessions", Some(&format!("create-{index}")), Some(&json!({})));
    let session = created.and_then(|(_, body)| body["session"]["id"].as_str().map(String::from)).expect("a session");
    for n in 0.. {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let token = format!("tok-{index}-{n}");
        let body = json!({ "content": super::crashloop::message(&mut random, &token) });
        ledger
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .sends
            .insert(token.clone(), (session.clone(), body.clone(), false));
        let path = format!("/api/sessions/{session}/messages");
        match call(hosts, &mut random, "POST", &path, Some(&token), Some(&body)) {
            Some((202, _)) => {
                if let Some(send) = ledger.lock().unwrap_or_else(|e| e.into_inner()).sends.get_mut(&token) {
                    send.2 = true;
                }
            }
            // Refused (the session busy with a resumed turn): nothing was stored.
            _ => drop(ledger.lock().unwrap_or_else(|e| e.into_inner()).sends.remove(&token)),
        }
        follow(hosts, &mut random, &session, counts);
    }
    session
}

/// Polls the session until its turn is over, approving what it asks (at any node) and
/// resuming it when a node's death interrupted it.
fn follow(hosts: &Hosts, random: &mut Random, session: &str, counts: &Counts) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let Some((200, detail)) = call(hosts, random, "GET", &format!("/api/sessions/{session}"), None, None) else {
            continue;
        };
        match detail["session"]["status"].as_str() {
            Some("running") => {}
            Some("interrupted") => {
                let resumed =
                    call(hosts, random, "POST", &format!("/api/sessions/{session}/resume"), None, Some(&json!({})));
                if matches!(resumed, Some((202, _))) {
                    counts.resumed.fetch_add(1, Ordering::SeqCst);
                }
                continue;
            }
            _ => {
                counts.turns.fetch_add(1, Ordering::SeqCst);
                return;
            }
        }
        for id in pending_approvals(hosts, random, session) {
            let path = format!("/api/sessions/{session}/approvals/{id}");
            if matches!(call(hosts, random, "POST", &path, None, Some(&json!({ "approved": true }))), Some((200, _))) {
                counts.approvals.fetch_add(1, Ordering::SeqCst);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The approvals the session's stream has asked and not seen resolved, from a replay of it
/// read for a moment at some node.
fn pending_approvals(hosts: &Hosts, random: &mut Random, session: &str) -> Vec<String> {
    let host = {
        let hosts = hosts.read().unwrap_or_else(|e| e.into_inner());
        hosts[(random.next() % hosts.len() as u64) as usize].clone()
    };
    let request = ureq::get(&format!("http://{host}/api/sessions/{session}/events"))
        .set("Last-Event-ID", "0")
        .timeout(Duration::from_secs(5));
    let Ok(answer) = request.call() else { return Vec::new() };
    let mut pending: Vec<String> = Vec::new();
    // The replay, then pings (every 200 ms): read for a moment.
    let until = Instant::now() + Duration::from_millis(300);
    for line in BufReader::new(answer.into_reader()).lines().map_while(Result::ok) {
        if Instant::now() > until {
            break;
        }
        let Some(envelope) = line.strip_prefix("data: ").and_then(|data| serde_json::from_str::<Value>(data).ok())
        else {
            continue;
        };
        match envelope["event"]["type"].as_str() {
            Some("approval.requested") => {
                pending.extend(envelope["event"]["approval"]["id"].as_str().map(String::from))
            }
            Some("approval.resolved") => pending.retain(|id| envelope["event"]["approvalId"] != id.as_str()),
            _ => {}
        }
    }
    pending
}

/// Follows `/api/events` until told to stop, from node to node; every (seq, type) delivered.
fn watch(hosts: &Hosts, stop: &AtomicBool) -> Vec<(u64, String)> {
    let mut seen: Vec<(u64, String)> = Vec::new();
    let mut at = 0;
    while !stop.load(Ordering::SeqCst) {
        let host = {
            let hosts = hosts.read().unwrap_or_else(|e| e.into_inner());
            at = (at + 1) % hosts.len();
            hosts[at].clone()
        };
        let mut request = ureq::get(&format!("http://{host}/api/events"));
        if let Some((last, _)) = seen.last() {
            request = request.set("Last-Event-ID", &last.to_string());
        }
        let Ok(answer) = request.call() else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        // A line at least every ping (200 ms); a failed read means the node died.
        for line in BufReader::new(answer.into_reader()).lines().map_while(Result::ok) {
            if stop.load(Ordering::SeqCst) {
                return seen;
            }
            let Some(envelope) = line.strip_prefix("data: ").and_then(|data| serde_json::from_str::<Value>(data).ok())
            else {
                continue;
            };
            let kind = envelope["event"]["type"].as_str().unwrap_or_default().to_string();
            seen.push((envelope["seq"].as_u64().unwrap_or(0), kind));
        }
    }
    seen
}

/// The end: transcripts against the ledger, commands against their tokens, the watcher's
/// events against the log.
fn check(
    database: &str,
    hosts: &Hosts,
    sessions: &[String],
    ledger: &Mutex<Ledger>,
    seen: &[(u64, String)],
    workspace: &Path,
    report: &mut Report,
) {
    let mut random = Random(7);
    let ledger = ledger.lock().unwrap_or_else(|e| e.into_inner());
    report.acknowledged = ledger.sends.values().filter(|send| send.2).count();
    for session in sessions {
        let Some((200, detail)) = call(hosts, &mut random, "GET", &format!("/api/sessions/{session}"), None, None)
        else {
            report.lost.push(format!("{session}: the transcript could not be read"));
            continue;
        };
        let said: Vec<String> = detail["session"]["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["role"] == "user")
            .filter_map(|m| m["content"].as_str().map(String::from))
            .collect();
        for (token, (_, body, acknowledged)) in ledger.sends.iter().filter(|(_, send)| &send.0 == session) {
            let copies = said.iter().filter(|content| body["content"] == content.as_str()).count();
            match (acknowledged, copies) {
                (true, 0) => report.lost.push(format!("{token}: acknowledged, not stored")),
                (_, 2..) => report.double.push(format!("{token}: stored {copies} times")),
                _ => {}
            }
        }
    }
    let log = std::fs::read_to_string(workspace.join("commands.log")).unwrap_or_default();
    let mut runs: HashMap<&str, usize> = HashMap::new();
    for token in log.lines().map(str::trim).filter(|t| !t.is_empty()) {
        *runs.entry(token).or_default() += 1;
    }
    for (token, count) in runs.into_iter().filter(|(_, count)| *count > 1) {
        report.double.push(format!("command {token} ran {count} times"));
    }
    report.events_seen = seen.len();
    check_stream(database, seen, report);
}

/// The watcher's events: rising, none twice, and every logged event after its first.
fn check_stream(database: &str, seen: &[(u64, String)], report: &mut Report) {
    for pair in seen.windows(2) {
        if pair[1].0 <= pair[0].0 {
            report.gap.push(format!("seq {} after {}", pair[1].0, pair[0].0));
        }
    }
    let mut once = HashSet::new();
    for (seq, _) in seen {
        if !once.insert(*seq) {
            report.double.push(format!("event {seq} delivered twice"));
        }
    }
    let (Some((first, _)), Some((last, _))) = (seen.first(), seen.last()) else { return };
    let Ok(mut db) = postgres::Client::connect(database, postgres::NoTls) else {
        report.lost.push("the log could not be read".into());
        return;
    };
    let logged = db
        .query("SELECT seq FROM events WHERE seq > $1 AND seq <= $2 ORDER BY seq", &[&(*first as i64), &(*last as i64)])
        .map(|rows| rows.iter().map(|row| row.get::<_, i64>(0) as u64).collect::<Vec<_>>())
        .unwrap_or_default();
    for seq in logged.into_iter().filter(|seq| !once.contains(seq)) {
        report.lost.push(format!("logged event {seq} never reached the global stream"));
    }
}
