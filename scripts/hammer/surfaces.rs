//! The surfaces a hostile workspace, sandbox command or MCP server reach: restores raced by a
//! directory swapped for a link to the outside, captures raced by a FIFO, sandbox commands
//! that flood, leave background processes or outlive their timeout, and an MCP server that
//! floods, sends an over-long line, hangs, crashes or starts a `setsid` grandchild.
//!
//! - `crash`: rounds of start, all of that at once, `kill -9` at a random moment, restart. Each
//!   round: the outside is unchanged, the database passes `integrity_check`, and every process
//!   the killed server had started (MCP servers and their grandchildren, sandbox commands and
//!   what they left) is gone once the next server has started.
//! - `fuzz`: random operations on the same surfaces against one server: every request is
//!   answered (no hang) with a status it may have (no 5xx but `checkpoint_timeout`), the
//!   server stays up, its memory stays under `RSS_LIMIT`, and no sandbox command outlives its
//!   call.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::random::Random;
use super::server::{integrity_ok, Kestrel};
use super::wire::{Client, Outcome};

const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/mcp_fixtures/tiny_server.py");
/// Files in the tree a restore writes, races and deletes.
const FILES: usize = 300;
/// The most the server's resident memory may reach during a fuzz run.
const RSS_LIMIT: u64 = 768 * 1024 * 1024;

fn config() -> String {
    let tools = ["echo", "flood", "long_line", "hang", "crash", "spawn", "counter"];
    let permissions: String = tools.iter().map(|tool| format!("\"mcp__tiny__{tool}\" = \"auto\"\n")).collect();
    format!(
        "[builtin]\ndelay_ms = 0\n[checkpoints]\ncapture_timeout_secs = 30\n\
         [bae]\nsandbox_exec_timeout_secs = 2\nsandbox_output_limit_bytes = 65536\n\
         [agent.permissions]\n{permissions}\
         [[mcp.servers]]\nname = \"tiny\"\ntransport = \"stdio\"\ncommand = \"python3\"\nargs = [{TINY:?}, \"hammer\"]\nscope = \"server\"\ntimeout_secs = 2\n"
    )
}

#[derive(Default, Debug)]
pub struct Report {
    pub rounds: usize,
    pub operations: usize,
    pub by_kind: BTreeMap<&'static str, usize>,
    pub swaps: usize,
    pub processes_checked: usize,
    pub peak_rss: u64,
    pub failures: Vec<String>,
}

impl Report {
    pub fn print(&self, what: &str) {
        println!("surfaces {what}: {} rounds, {} operations", self.rounds, self.operations);
        let kinds: Vec<String> = self.by_kind.iter().map(|(k, n)| format!("{k}: {n}")).collect();
        println!("  operations: {}", kinds.join(", "));
        println!("  directory swaps raced against restores {:>8}", self.swaps);
        println!("  processes checked gone after restart   {:>8}", self.processes_checked);
        println!("  peak server RSS                        {:>8} MiB", self.peak_rss / (1024 * 1024));
        println!("  failures                               {:>8}", self.failures.len());
        for failure in self.failures.iter().take(20) {
            println!("    {failure}");
        }
    }
}

/// What the surfaces need on a live server: a Kestrel session and its workspace, a BAE
/// session with its remote sandbox started.
struct Setup {
    kestrel: String,
    bae: String,
    session_key: String,
    checkpoint: String,
}

/// The workspace's tree: `d/f0000…` with `content`.
fn fill(workspace: &Path, content: &str) {
    let dir = workspace.join("d");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("the tree");
    for n in 0..FILES {
        std::fs::write(dir.join(format!("f{n:04}")), content).expect("a file");
    }
}

/// The field `pointer` of an answer, or what the answer was.
fn field(outcome: &Outcome, step: &str, pointer: &str) -> Result<String, String> {
    let value = outcome.json();
    value.pointer(pointer).and_then(Value::as_str).map(str::to_string).ok_or_else(|| format!("{step}: {value}"))
}

fn setup(server: &Kestrel, data: &Path, workspace: &Path) -> Result<Setup, String> {
    let mut client = Client::new(&server.host);
    fill(workspace, "checkpointed");
    let kestrel = field(&client.request("POST", "/api/sessions", &[], b"{}"), "a session", "/session/id")?;
    let made = client.request("POST", &format!("/api/sessions/{kestrel}/checkpoints"), &[], b"{}");
    let checkpoint = field(&made, "a checkpoint", "/checkpoint/id")?;
    fill(workspace, "changed since");
    let admin_key = std::fs::read_to_string(data.join("data/admin-key")).map_err(|e| format!("the admin key: {e}"))?;
    let bearer = format!("Bearer {}", admin_key.trim());
    let json = [("Authorization", bearer.as_str()), ("Content-Type", "application/json")];
    let mut admin = Client::new(&server.admin);
    let body = json!({ "name": format!("surfaces-{}", uuid_like()), "primary_provider": "builtin/echo", "available_sandboxes": ["alpine:3.19"] });
    let profile =
        field(&admin.request("POST", "/admin/v1/profiles", &json, body.to_string().as_bytes()), "a profile", "/id")?;
    let body = json!({ "name": "surfaces", "profile_id": profile });
    let key = field(&admin.request("POST", "/admin/v1/keys", &json, body.to_string().as_bytes()), "a key", "/key")?;
    let client_key = format!("Bearer {key}");
    let opened = client.request(
        "POST",
        "/api/v1/sessions",
        &[("Authorization", &client_key), ("Content-Type", "application/json")],
        b"{\"tools\":[]}",
    );
    let (bae, session_key) =
        (field(&opened, "a BAE session", "/session_id")?, field(&opened, "a BAE session", "/session_key")?);
    let setup = Setup { kestrel, bae, session_key, checkpoint };
    rpc(&server.host, &setup, "session.registerDriver", json!({}));
    rpc(&server.host, &setup, "session.startRemoteSandbox", json!({ "image": "alpine:3.19" }));
    Ok(setup)
}

fn uuid_like() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{nanos:x}")
}

/// One JSON-RPC call on the BAE session; its one frame.
fn rpc(host: &str, setup: &Setup, method: &str, params: Value) -> Outcome {
    let mut client = Client::new(host);
    client.deadline = Duration::from_secs(20);
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
    let bearer = format!("Bearer {}", setup.session_key);
    let path = format!("/api/v1/sessions/{}/rpc", setup.bae);
    client.request(
        "POST",
        &path,
        &[("Authorization", &bearer), ("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    )
}

/// Sends `line` to the Kestrel session and waits (polling, with a deadline) for its run.
fn run_line(host: &str, session: &str, line: &str) -> Outcome {
    let mut client = Client::new(host);
    client.deadline = Duration::from_secs(60);
    let body = json!({ "content": line }).to_string();
    let sent = client.request("POST", &format!("/api/sessions/{session}/messages"), &[], body.as_bytes());
    if sent.status() != Some(202) {
        return sent;
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    while Instant::now() < deadline {
        let detail = client.request("GET", &format!("/api/sessions/{session}"), &[], b"");
        if detail.status().is_none() || detail.json()["session"]["status"] != "running" {
            return detail;
        }
    }
    Outcome::Hung
}

/// A thread that keeps exchanging `workspace/d` with a link to `outside`.
struct Racer {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<usize>,
}

impl Racer {
    fn start(workspace: &Path, outside: &Path) -> Racer {
        let stop = Arc::new(AtomicBool::new(false));
        let (real, link, target, stopped) =
            (workspace.join("d"), workspace.join("d.link"), outside.to_path_buf(), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            let mut swaps = 0;
            while !stopped.load(Ordering::Relaxed) {
                match std::fs::symlink_metadata(&link) {
                    Ok(meta) if meta.file_type().is_symlink() => {}
                    Ok(_) => {
                        let _ = std::fs::rename(&link, link.with_extension(format!("spare{swaps}")));
                        continue;
                    }
                    Err(_) => {
                        let _ = std::os::unix::fs::symlink(&target, &link);
                        continue;
                    }
                }
                for _ in 0..2 {
                    let flags = nix::fcntl::RenameFlags::RENAME_EXCHANGE;
                    if nix::fcntl::renameat2(nix::fcntl::AT_FDCWD, &real, nix::fcntl::AT_FDCWD, &link, flags).is_ok() {
                        swaps += 1;
                    }
                    std::thread::yield_now();
                }
            }
            swaps
        });
        Racer { stop, thread }
    }

    fn finish(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or(0)
    }
}

/// Every file under `root` with its bytes (links as their target).
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut found = BTreeMap::new();
    for entry in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let path = entry.path();
        let bytes = std::fs::read(&path).unwrap_or_default();
        found.insert(path, bytes);
    }
    found
}

/// Live processes whose `KESTREL_COMMAND` marks them as started by a server of this data dir
/// (a session's marker or the node's), by pid.
fn marked_processes(sessions: &[&str], node_prefix: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else { continue };
        let zombie = std::fs::read_to_string(entry.path().join("stat")).is_ok_and(|s| s.contains(") Z "));
        let environ = String::from_utf8_lossy(&environ);
        let marker = environ.split('\0').find_map(|var| var.strip_prefix("KESTREL_COMMAND="));
        let ours = marker.is_some_and(|m| m.starts_with(node_prefix) || sessions.iter().any(|s| m.starts_with(s)));
        if ours && !zombie {
            pids.push(pid);
        }
    }
    pids
}

/// Of `pids`, those still alive a second on: a process sent `SIGKILL` just before the
/// answer is still exiting for a moment (on a busy machine, a few milliseconds), and is not
/// one that outlived its command.
fn still_alive(mut pids: Vec<i32>) -> Vec<i32> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    while !pids.is_empty() && std::time::Instant::now() < deadline {
        pids.retain(|pid| alive(*pid));
        // Polled: a process that is not our child cannot be waited for.
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    pids
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| !stat.contains(") Z "))
}

/// The surfaces under `kill -9`.
pub fn crash(binary: &Path, rounds: usize, seed: u64) -> Report {
    let root = tempfile::tempdir().expect("a temporary directory");
    let (data, workspace, outside) =
        (root.path().join("state"), root.path().join("workspace"), root.path().join("outside"));
    std::fs::create_dir_all(&workspace).expect("the workspace");
    std::fs::create_dir_all(&outside).expect("the outside");
    for n in 0..FILES {
        std::fs::write(outside.join(format!("f{n:04}")), "outside").expect("bait");
    }
    let before = snapshot(&outside);
    let mut random = Random(seed | 1);
    let mut report = Report::default();
    for round in 0..rounds {
        let server = Kestrel::start(binary, &data, &workspace, &config());
        let setup = match setup(&server, &data, &workspace) {
            Ok(setup) => setup,
            Err(why) => {
                report.failures.push(format!("round {round}: the surfaces could not be set up: {why}"));
                continue;
            }
        };
        let racer = Racer::start(&workspace, &outside);
        let host = server.host.clone();
        let load = spawn_load(&host, &setup);
        std::thread::sleep(Duration::from_millis(200 + random.next() % 1500));
        let ours = [setup.kestrel.as_str(), setup.bae.as_str()];
        let left = marked_processes(&ours, &kestrel::tools::orphans::node_marker(&data.join("data")));
        server.kill_9();
        report.swaps += racer.finish();
        for thread in load {
            let _ = thread.join();
        }
        if snapshot(&outside) != before {
            report.failures.push(format!("round {round}: the outside changed under a raced restore"));
        }
        if !integrity_ok(&data) {
            report.failures.push(format!("round {round}: integrity_check failed after kill -9"));
        }
        // The next start sweeps what the killed server left.
        let next = Kestrel::start(binary, &data, &workspace, &config());
        let deadline = Instant::now() + Duration::from_secs(30);
        while left.iter().any(|&pid| alive(pid)) && Instant::now() < deadline {
            std::thread::yield_now();
        }
        report.processes_checked += left.len();
        for pid in left.iter().filter(|&&pid| alive(pid)) {
            report.failures.push(format!("round {round}: process {pid} outlived the killed server and its restart"));
        }
        drop(next);
        report.rounds += 1;
    }
    report
}

/// Restores, captures, sandbox commands and MCP calls, each on a thread, until the server dies.
fn spawn_load(host: &str, setup: &Setup) -> Vec<std::thread::JoinHandle<()>> {
    let mut threads = Vec::new();
    let (h, session, checkpoint) = (host.to_string(), setup.kestrel.clone(), setup.checkpoint.clone());
    threads.push(std::thread::spawn(move || {
        let mut client = Client::new(&h);
        client.deadline = Duration::from_secs(60);
        let path = format!("/api/sessions/{session}/checkpoints/{checkpoint}/restore");
        while client.request("POST", &path, &[], b"{}").status().is_some() {}
    }));
    let (h, bae, key) = (host.to_string(), setup.bae.clone(), setup.session_key.clone());
    threads.push(std::thread::spawn(move || {
        let setup = Setup { kestrel: String::new(), bae, session_key: key, checkpoint: String::new() };
        let command =
            "sleep 300 & nohup sleep 301 >/dev/null 2>&1 & setsid sleep 302 & head -c 100000 /dev/zero; sleep 10";
        while rpc(&h, &setup, "session.execRemoteSandbox", json!({ "command": command })).status().is_some() {}
    }));
    let (h, session) = (host.to_string(), setup.kestrel.clone());
    threads.push(std::thread::spawn(move || {
        let mut client = Client::new(&h);
        let mut session = session;
        // A second Kestrel session for the MCP calls (the first is busy restoring).
        if let Some(id) = client.request("POST", "/api/sessions", &[], b"{}").json()["session"]["id"].as_str() {
            session = id.to_string();
        }
        for line in
            ["/tool mcp__tiny__spawn {}", "/tool mcp__tiny__flood {\"count\": 50000}", "/tool mcp__tiny__hang {}"]
        {
            if run_line(&h, &session, line).status().is_none() {
                return;
            }
        }
    }));
    threads
}

/// The surfaces under random operations.
pub fn fuzz(binary: &Path, operations: usize, seed: u64) -> Report {
    let root = tempfile::tempdir().expect("a temporary directory");
    let (data, workspace) = (root.path().join("state"), root.path().join("workspace"));
    std::fs::create_dir_all(&workspace).expect("the workspace");
    let server = Kestrel::start(binary, &data, &workspace, &config());
    let mut random = Random(seed | 1);
    let mut report = Report { rounds: 1, ..Report::default() };
    let setup = match setup(&server, &data, &workspace) {
        Ok(setup) => setup,
        Err(why) => {
            report.failures.push(format!("the surfaces could not be set up: {why}"));
            return report;
        }
    };
    let pid = server.pid();
    for op in 0..operations {
        let kind = random.pick(&["exec", "mcp", "checkpoint", "restore"]);
        *report.by_kind.entry(kind).or_default() += 1;
        let outcome = match kind {
            "exec" => {
                rpc(&server.host, &setup, "session.execRemoteSandbox", json!({ "command": random.pick(COMMANDS) }))
            }
            "mcp" => run_line(&server.host, &setup.kestrel, random.pick(MCP_LINES)),
            "checkpoint" => {
                hostile_entry(&workspace, &mut random);
                Client::new(&server.host).request(
                    "POST",
                    &format!("/api/sessions/{}/checkpoints", setup.kestrel),
                    &[],
                    b"{}",
                )
            }
            _ => {
                let path = format!("/api/sessions/{}/checkpoints/{}/restore", setup.kestrel, setup.checkpoint);
                Client::new(&server.host).request("POST", &path, &[], b"{}")
            }
        };
        report.operations += 1;
        match outcome.status() {
            None => report.failures.push(format!("op {op} ({kind}): no answer")),
            Some(status) if status >= 500 && !outcome_is_timeout(&outcome) => {
                report.failures.push(format!("op {op} ({kind}): {status} {}", outcome.json()))
            }
            _ => {}
        }
        if kind == "exec" {
            let left = still_alive(marked_processes(&[setup.bae.as_str()], "\0"));
            if !left.is_empty() {
                report.failures.push(format!("op {op}: sandbox processes outlived their command: {left:?}"));
            }
        }
        report.peak_rss = report.peak_rss.max(rss(pid));
    }
    if report.peak_rss > RSS_LIMIT {
        report.failures.push(format!("the server's memory reached {} MiB", report.peak_rss / (1024 * 1024)));
    }
    let mut client = Client::new(&server.host);
    if client.request("GET", "/api/health", &[], b"").status() != Some(200) {
        report.failures.push("the server is not healthy at the end".into());
    }
    report
}

const COMMANDS: &[&str] = &[
    "head -c 30000000 /dev/zero | tr '\\0' x",
    "printf '\\377\\376\\000bin'",
    "sleep 300 & echo bg",
    "setsid sleep 300 & nohup sleep 301 >/dev/null 2>&1 & echo escaped",
    "sleep 30",
    "yes | head -c 5000000 >&2",
    "exec 1>&-; sleep 1",
    "echo fine",
];

const MCP_LINES: &[&str] = &[
    "/tool mcp__tiny__echo {\"text\": \"hi\"}",
    "/tool mcp__tiny__flood {\"count\": 100000}",
    "/tool mcp__tiny__long_line {}",
    "/tool mcp__tiny__hang {}",
    "/tool mcp__tiny__crash {}",
    "/tool mcp__tiny__counter {}",
];

/// A FIFO, a link out, or a file, put somewhere in the workspace.
fn hostile_entry(workspace: &Path, random: &mut Random) {
    let path = workspace.join(format!("hostile{}", random.below(4)));
    let _ = std::fs::remove_file(&path);
    match random.below(3) {
        0 => {
            let _ = nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600));
        }
        1 => {
            let _ = std::os::unix::fs::symlink("/etc/passwd", &path);
        }
        _ => {
            let _ = std::fs::write(&path, "plain");
        }
    }
}

/// A 503 `checkpoint_timeout` is a documented answer, not a failure.
fn outcome_is_timeout(outcome: &Outcome) -> bool {
    outcome.json()["error"]["code"] == "checkpoint_timeout"
}

/// The resident memory of `pid`, in bytes.
fn rss(pid: Option<u32>) -> u64 {
    let Some(pid) = pid else { return 0 };
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}
