//! `--scale` (or `scale` alone): Kestrel on a large data dir, each figure beside a floor or
//! a target measured in the same run.
//!
//! The fixture is built once and cached under `target/bench-scale` (`bench-scale-quick` with
//! `BENCH_QUICK`, a tenth the size), through the store's own write path (`Store::open` and
//! `WriteOp`s, as the server writes) and, for the BAE session, through the server itself:
//! - 100,000 sessions: 20,000 in the `default` tenant (three of them with 10,000 messages)
//!   and 80,000 in the `bulk` tenant;
//! - 10,000,000 logged events (`message.completed`, about 300 bytes each) of `bulk`'s
//!   sessions;
//! - a BAE session of 5,000 turns (10,000 messages);
//! - a 20,000-file, 83 MB workspace in 200 directories.
//!
//! Each run copies the data dir (the pruning row destroys it) and measures on the copy.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kestrel::domain::{Event, Message, Role, SessionRecord, SessionStatus, SessionSummary};
use kestrel::store::{LoggedEvent, Store, WriteOp};

use super::bae::percentile;
use super::client::{open_stream, read_events, Connection};
use super::{median, report, Spawned};

const VERSION: &str = "kestrel-bench-scale 4";
const DEFAULT_TOKEN: &str = "bench-default-token";
const BULK_TOKEN: &str = "bench-bulk-token";

/// The fixture's size: the full one, or a tenth of it.
#[derive(Clone, Copy)]
struct Size {
    default_sessions: usize,
    bulk_sessions: usize,
    big_sessions: usize,
    big_messages: usize,
    events: usize,
    bae_turns: usize,
    files: usize,
}

const FULL: Size = Size {
    default_sessions: 20_000,
    bulk_sessions: 80_000,
    big_sessions: 3,
    big_messages: 10_000,
    events: 10_000_000,
    bae_turns: 5_000,
    files: 20_000,
};

const QUICK: Size = Size {
    default_sessions: 2_000,
    bulk_sessions: 8_000,
    big_sessions: 1,
    big_messages: 1_000,
    events: 1_000_000,
    bae_turns: 500,
    files: 2_000,
};

/// What the rows need to know of a built fixture.
#[derive(serde::Serialize, serde::Deserialize)]
struct Facts {
    version: String,
    big: Vec<String>,
    bae_session: String,
    bae_key: String,
}

/// The fixture's place: `target/bench-scale[-quick]`.
fn root(quick: bool) -> PathBuf {
    let target = std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().parent().unwrap().to_path_buf();
    target.join(if quick { "bench-scale-quick" } else { "bench-scale" })
}

/// The pruning row alone, on a fresh copy of the fixture (`benchmark prune [quick]`).
pub fn prune_only() {
    let quick = std::env::args().nth(2).as_deref() == Some("quick");
    let (size, root) = (if quick { QUICK } else { FULL }, root(quick));
    fixture(&root, size);
    let (data, workspace) = (root.join("run/data"), root.join("workspace"));
    copy_data(&root.join("data"), &data);
    report::header();
    prune(&data, &workspace, size);
}

pub fn rows(quick: bool) {
    let size = if quick { QUICK } else { FULL };
    let root = root(quick);
    let facts = fixture(&root, size);
    let (data, workspace) = (root.join("run/data"), root.join("workspace"));
    println!("  (copying the fixture's data dir)");
    copy_data(&root.join("data"), &data);

    startup(&data, &workspace);
    let kestrel = Spawned::kestrel_on(&data, &workspace, &config(size.events * 2));
    let floor = Spawned::floor();
    let floor_rate = super::requests_per_second(&floor.host, "/");
    drop(floor);
    session_list(&kestrel.host, size, floor_rate);
    big_session(&kestrel.host, &facts);
    bae_history(&kestrel.host, &data, &facts);
    replay(&kestrel.host, &data, if quick { &[50_000, 100_000] } else { &[50_000, 1_000_000] });
    checkpoints(&kestrel.host, &root, &workspace);
    kestrel.stop();
    prune(&data, &workspace, size);
}

fn config(keep_events: usize) -> String {
    format!(
        "[server]\nevent_log_events = {keep_events}\n\n[[auth.tokens]]\ntenant = \"default\"\ntoken = \"{DEFAULT_TOKEN}\"\n\n[[auth.tokens]]\ntenant = \"bulk\"\ntoken = \"{BULK_TOKEN}\"\n"
    )
}

/// The cached fixture, built first if missing or of another version.
fn fixture(root: &Path, size: Size) -> Facts {
    let facts_path = root.join("fixture.json");
    if let Ok(Ok(facts)) = std::fs::read(&facts_path).map(|bytes| serde_json::from_slice::<Facts>(&bytes)) {
        if facts.version == VERSION {
            return facts;
        }
    }
    println!("  (building the scale fixture under {}: once, it is cached)", root.display());
    let started = Instant::now();
    let _ = std::fs::remove_dir_all(root);
    std::fs::create_dir_all(root).unwrap();
    let data = root.join("data");
    let big = store_sessions_and_events(&data, size);
    write_workspace(&root.join("workspace"), size.files);
    let (bae_session, bae_key) = bae_session(&data, &root.join("workspace"), size.bae_turns);
    let facts = Facts { version: VERSION.into(), big, bae_session, bae_key };
    std::fs::write(&facts_path, serde_json::to_vec(&facts).unwrap()).unwrap();
    println!("  (built in {:.0} s)", started.elapsed().as_secs_f64());
    facts
}

fn session(id: String, tenant: &str, updated_ms: i64, message_count: u64) -> WriteOp {
    let at = kestrel::time::rfc3339_from_millis(updated_ms);
    WriteOp::InsertSession(SessionRecord {
        summary: SessionSummary {
            id,
            title: format!("a session of {tenant}, as long as a title typically is"),
            created_at: at.clone(),
            updated_at: at,
            status: SessionStatus::Idle,
            model: "builtin/echo".into(),
            message_count,
            workspace: "/srv/project".into(),
            forked_from: None,
        },
        tenant: tenant.into(),
        system_prompt: None,
    })
}

/// Writes in chunks: detached, with a waited write every so often to bound the queue.
fn write_all(store: &Store, ops: impl Iterator<Item = WriteOp>, per_write: usize) {
    let mut chunk = Vec::with_capacity(per_write);
    let mut written = 0;
    for op in ops {
        chunk.push(op);
        if chunk.len() == per_write {
            written += 1;
            let ops = std::mem::take(&mut chunk);
            match written % 32 {
                0 => store.write(ops).map(drop).unwrap(),
                _ => store.write_detached(ops).unwrap(),
            }
        }
    }
    store.write(chunk).unwrap();
}

/// Sessions, the big sessions' messages and the log; the big sessions' ids.
fn store_sessions_and_events(data: &Path, size: Size) -> Vec<String> {
    std::fs::create_dir_all(data).unwrap();
    let (store, writer) = Store::open(data).unwrap();
    let now = kestrel::time::now_millis();
    // Spread over the last weeks, not in creation order.
    let updated = |i: usize, n: usize| now - 3_600_000 - ((i * 7_919) % n) as i64 * 1_000;
    let big: Vec<String> = (0..size.big_sessions).map(|i| format!("ses_{:032x}", i)).collect();
    let default = (0..size.default_sessions).map(|i| {
        let messages = if i < size.big_sessions { size.big_messages as u64 } else { 0 };
        session(format!("ses_{:032x}", i), "default", updated(i, size.default_sessions), messages)
    });
    write_all(&store, default, 2_000);
    let bulk_id = |i: usize| format!("ses_{:032x}", (1 << 40) + i);
    let bulk = (0..size.bulk_sessions).map(|i| session(bulk_id(i), "bulk", updated(i, size.bulk_sessions), 0));
    write_all(&store, bulk, 2_000);
    for id in &big {
        let messages = (0..size.big_messages).map(|n| {
            let role = if n % 2 == 0 { Role::User } else { Role::Assistant };
            let text = format!("message {n}: {}", "a sentence of an ordinary length in a conversation. ".repeat(4));
            WriteOp::AppendMessage {
                session_id: id.clone(),
                message: Message::text_of(role, text),
                updated_at: kestrel::time::rfc3339_from_millis(now - 3_600_000),
            }
        });
        write_all(&store, messages, 1_000);
    }
    let at = kestrel::time::rfc3339_from_millis(now - 3_600_000);
    let events = (0..size.events).map(|n| {
        let session_id = bulk_id(n % size.bulk_sessions);
        let message = Message::text_of(Role::Assistant, format!("event {n}: a short answer"));
        let event = Event::MessageCompleted { session_id: session_id.clone(), message };
        Some(LoggedEvent {
            seq: 0,
            tenant: Some("bulk".into()),
            session_id: Some(session_id),
            actor: None,
            kind: "message.completed".into(),
            at: at.clone(),
            body: serde_json::to_string(&event).unwrap(),
            form: kestrel::domain::STORED_FORM,
        })
    });
    let mut entries = Vec::with_capacity(4_096);
    let appends = events.filter_map(|entry| {
        entries.push(entry);
        (entries.len() == 4_096).then(|| WriteOp::AppendLog {
            entries: std::mem::take(&mut entries),
            floor: 0,
            keep: u64::MAX,
            live: Vec::new(),
        })
    });
    write_all(&store, appends, 1);
    if !entries.is_empty() {
        store.write(vec![WriteOp::AppendLog { entries, floor: 0, keep: u64::MAX, live: Vec::new() }]).unwrap();
    }
    writer.shutdown();
    big
}

/// `files` files of 1–7.3 KB (4.15 KB on average: 83 MB for 20,000), 100 to a directory.
fn write_workspace(workspace: &Path, files: usize) {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let line = "fn handle(request: &Request) -> Result<Reply, Problem> { todo!() } // a line of code\n";
    for n in 0..files {
        let dir = workspace.join(format!("d{:03}", n / 100));
        if n % 100 == 0 {
            std::fs::create_dir_all(&dir).unwrap();
        }
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let length = 1_000 + (state >> 33) as usize % 6_300;
        let mut content = format!("// file {n}\n");
        while content.len() < length {
            content.push_str(line);
        }
        content.truncate(length);
        std::fs::write(dir.join(format!("f{:03}.rs", n % 100)), content).unwrap();
    }
}

/// A BAE session of `turns` turns against a fake Messages endpoint, through the server.
fn bae_session(data: &Path, workspace: &Path, turns: usize) -> (String, String) {
    let fake = Spawned::helper("fake-messages");
    // The log's capacity above the fixture's events, or this server would trim them.
    let config = format!(
        "[server]\nevent_log_events = 1000000000\n\n[providers.fake]\nwire = \"anthropic\"\nbase_url = \"http://{}/v1\"\nmodels = [{{ name = \"claude-x\" }}]\n",
        fake.host
    );
    let mut kestrel = Spawned::kestrel_on(data, workspace, &config);
    let admin = kestrel.next_host();
    let key = super::bae::client_key(&admin, data);
    let (session, session_key) = super::bae::open_registered(&mut Connection::open(&kestrel.host).unwrap(), &key);
    let rpc = format!("/api/v1/sessions/{session}/rpc");
    let send = br#"{"jsonrpc":"2.0","id":2,"method":"session.sendMessage","params":{"message":{"content":"What time is it?"}}}"#;
    for _ in 0..turns {
        let mut turn = Connection::open(&kestrel.host).unwrap();
        let answer = turn.request_as("POST", &rpc, Some(&session_key), send).unwrap();
        assert!(String::from_utf8_lossy(&answer.body).contains("It is noon."));
    }
    kestrel.stop();
    (session, session_key)
}

fn copy_data(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    let copied = std::process::Command::new("cp").arg("-a").arg(from).arg(to).status().unwrap();
    assert!(copied.success());
    super::settle_disk();
}

/// Time from spawning the server to its first `/api/health` 200, three times.
fn startup(data: &Path, workspace: &Path) {
    let mut times = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        let kestrel = Spawned::kestrel_on(data, workspace, &config(usize::MAX / 4));
        let mut connection = Connection::open(&kestrel.host).unwrap();
        assert_eq!(connection.request("GET", "/api/health", b"").unwrap().status, 200);
        times.push(started.elapsed().as_secs_f64() * 1000.0);
        kestrel.stop();
    }
    report::vs_target(
        "start-up on the scale data dir: first /api/health 200",
        median(&mut times),
        "ms",
        1000.0,
        "< 1 s",
    );
}

/// `clients` keep-alive clients asking `path` for `ROUND`: the rate and every latency (ms).
fn load(host: &str, path: &str, token: &str, clients: usize) -> (f64, Vec<f64>) {
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(clients + 1));
    let workers: Vec<_> = (0..clients)
        .map(|_| {
            let (host, path, token, barrier) = (host.to_string(), path.to_string(), token.to_string(), barrier.clone());
            std::thread::spawn(move || {
                let mut connection = Connection::open(&host).unwrap();
                barrier.wait();
                let until = Instant::now() + super::ROUND;
                let mut latencies = Vec::new();
                while Instant::now() < until {
                    let started = Instant::now();
                    let answer = connection.request_as("GET", &path, Some(&token), b"").unwrap();
                    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
                    latencies.push(started.elapsed().as_secs_f64() * 1000.0);
                }
                latencies
            })
        })
        .collect();
    barrier.wait();
    let started = Instant::now();
    let latencies: Vec<f64> = workers.into_iter().flat_map(|w| w.join().unwrap()).collect();
    (latencies.len() as f64 / started.elapsed().as_secs_f64(), latencies)
}

fn get_json(host: &str, path: &str, token: &str) -> serde_json::Value {
    let answer = Connection::open(host).unwrap().request_as("GET", path, Some(token), b"").unwrap();
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    serde_json::from_slice(&answer.body).unwrap()
}

fn session_list(host: &str, size: Size, floor_rate: f64) {
    // A cursor half-way through `bulk`'s sessions.
    let (mut path, mut walked) = ("/api/sessions?limit=1000".to_string(), 0);
    while walked < size.bulk_sessions / 2 {
        let page = get_json(host, &path, BULK_TOKEN);
        walked += page["sessions"].as_array().unwrap().len();
        path = format!("/api/sessions?limit=1000&cursor={}", page["nextCursor"].as_str().unwrap());
    }
    let deep = path.replace("limit=1000", "limit=100");
    for (label, path) in [("first page", "/api/sessions?limit=100".to_string()), ("deep page", deep)] {
        let (rate, mut latencies) = load(host, &path, BULK_TOKEN, 32);
        let p95 = percentile(&mut latencies, 0.95);
        let sessions = size.bulk_sessions + size.default_sessions;
        report::vs_floor(
            &format!("session list, {label} of 100 ({sessions} stored), 32 clients"),
            rate,
            "req/s",
            floor_rate,
        );
        report::vs_target(&format!("  p95 ({label})"), p95, "ms", 20.0, "< 20 ms");
    }
    // Read once alone first: the first answer reads the list cold, the rest are kept answers.
    let started = Instant::now();
    get_json(host, "/api/sessions", DEFAULT_TOKEN);
    let cold = started.elapsed().as_secs_f64() * 1000.0;
    let (_, mut latencies) = load(host, "/api/sessions", DEFAULT_TOKEN, 16);
    let p95 = percentile(&mut latencies, 0.95);
    let label = format!("whole session list ({} sessions), 16 clients: p95", size.default_sessions);
    report::vs_target(&label, p95, "ms", 250.0, "< 250 ms");
    report::info("  the first answer, read alone from a data dir just copied", cold, "ms");
    // The same while a session is renamed every 50 ms: the cached answer is read again.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut latencies = std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut connection = Connection::open(host).unwrap();
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let body = format!(r#"{{"title":"renamed {n}"}}"#);
                let path = format!("/api/sessions/ses_{:032x}", size.big_sessions);
                let answer = connection.request_as("PATCH", &path, Some(DEFAULT_TOKEN), body.as_bytes()).unwrap();
                assert_eq!(answer.status, 200);
                n += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let (_, latencies) = load(host, "/api/sessions", DEFAULT_TOKEN, 16);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        latencies
    });
    let p95 = percentile(&mut latencies, 0.95);
    report::info("  p95 while a session is renamed every 50 ms", p95, "ms");
}

fn big_session(host: &str, facts: &Facts) {
    let path = format!("/api/sessions/{}", facts.big[0]);
    let messages = get_json(host, &path, DEFAULT_TOKEN)["session"]["messages"].as_array().unwrap().len();
    let (_, mut latencies) = load(host, &path, DEFAULT_TOKEN, 8);
    let p95 = percentile(&mut latencies, 0.95);
    report::vs_target(
        &format!("GET /api/sessions/:id ({messages} messages), 8 clients: p95"),
        p95,
        "ms",
        50.0,
        "< 50 ms",
    );
}

fn bae_history(host: &str, data: &Path, facts: &Facts) {
    let first = format!("/api/v1/sessions/{}/events?limit=100", facts.bae_session);
    // The pages there are, counted in the log (walking them all costs minutes).
    let db = rusqlite::Connection::open_with_flags(data.join("kestrel.db"), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap();
    let events: usize = db
        .query_row("SELECT count(*) FROM events WHERE session_id = ?1", [&facts.bae_session], |row| row.get(0))
        .unwrap();
    let total = events.div_ceil(100);
    let mut deep = first.clone();
    for _ in 0..total / 2 {
        let page = get_json(host, &deep, &facts.bae_key);
        let Some(cursor) = page["next_cursor"].as_str() else { break };
        deep = format!("{first}&cursor={cursor}");
    }
    let floor = Spawned::helper("bytes-floor");
    for (label, path) in [("first page", first), ("middle page", deep)] {
        let (_, mut latencies) = load(host, &path, &facts.bae_key, 8);
        let p95 = percentile(&mut latencies, 0.95);
        report::vs_target(
            &format!("BAE history ({total} pages of 100), {label}, 8 clients: p95"),
            p95,
            "ms",
            50.0,
            "< 50 ms",
        );
        // BAE's `provider.request` carries every message the model was sent: a page's size
        // grows with how far into the session it is, and so does the floor of answering it.
        let bytes =
            Connection::open(host).unwrap().request_as("GET", &path, Some(&facts.bae_key), b"").unwrap().body.len();
        let (_, mut floors) = load(&floor.host, &format!("/bytes/{bytes}"), "", 8);
        let floor_p95 = percentile(&mut floors, 0.95);
        report::vs_floor(
            &format!("  the same, beside answering {:.1} MB bare", bytes as f64 / 1e6),
            p95,
            "ms",
            floor_p95,
        );
    }
}

/// The floor of answering a body of a given size: a bare keep-alive HTTP/1.1 server, a
/// thread per connection, that answers `GET /bytes/N` with N bytes of JSON in one write,
/// with Nagle off as Kestrel's edge has it.
pub fn bytes_floor() {
    use std::io::{BufRead, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    println!("floor listening on http://{}", listener.local_addr().unwrap());
    for socket in listener.incoming().flatten() {
        std::thread::spawn(move || {
            socket.set_nodelay(true).unwrap();
            let mut reader = std::io::BufReader::new(socket.try_clone().unwrap());
            let mut socket = socket;
            loop {
                let (mut line, mut size) = (String::new(), 2usize);
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                if let Some(rest) = line.split(' ').nth(1).and_then(|path| path.strip_prefix("/bytes/")) {
                    size = rest.parse().unwrap_or(2).max(2);
                }
                while line != "\r\n" {
                    line.clear();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                }
                let mut answer =
                    format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {size}\r\n\r\n")
                        .into_bytes();
                let body = answer.len();
                answer.resize(body + size, b' ');
                (answer[body], answer[body + size - 1]) = (b'[', b']');
                if socket.write_all(&answer).is_err() {
                    return;
                }
            }
        });
    }
}

/// A reconnect `count` events back on `bulk`'s stream, beside reading the same rows.
fn replay(host: &str, data: &Path, counts: &[usize]) {
    let db = rusqlite::Connection::open_with_flags(data.join("kestrel.db"), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap();
    let last: i64 = db.query_row("SELECT max(seq) FROM events WHERE tenant = 'bulk'", [], |row| row.get(0)).unwrap();
    for &count in counts {
        let after: i64 = db
            .query_row(
                "SELECT seq FROM events WHERE tenant = 'bulk' AND seq <= ?1 ORDER BY seq DESC LIMIT 1 OFFSET ?2",
                rusqlite::params![last, count as i64],
                |row| row.get(0),
            )
            .unwrap();
        super::settle_disk();
        let started = Instant::now();
        let mut statement = db
            .prepare("SELECT seq, tenant, session_id, type, at, body FROM events WHERE seq > ?1 AND tenant = 'bulk' ORDER BY seq LIMIT ?2")
            .unwrap();
        let read = statement
            .query_map(rusqlite::params![after, count as i64], |row| {
                Ok((row.get::<_, i64>(0)?, row.get::<_, String>(5)?))
            })
            .unwrap()
            .count();
        let floor = started.elapsed().as_secs_f64() * 1000.0;
        assert_eq!(read, count);
        let started = Instant::now();
        let mut stream = open_stream_as(host, "/api/events", after as u64, BULK_TOKEN);
        read_events(&mut stream, count);
        let replayed = started.elapsed().as_secs_f64() * 1000.0;
        report::vs_floor(&format!("reconnect {count} events back on a 10M-event log: replay"), replayed, "ms", floor);
    }
}

fn open_stream_as(host: &str, path: &str, last_event_id: u64, token: &str) -> std::io::BufReader<std::net::TcpStream> {
    let path = format!("{path}?token={token}");
    open_stream(host, &path, Some(last_event_id)).unwrap()
}

/// The workspace checkpointed first (beside `tar` of it to a synced file) and unchanged.
fn checkpoints(host: &str, root: &Path, workspace: &Path) {
    // Both read from the page cache: it is warmed first.
    let warm = std::process::Command::new("tar").arg("cf").arg("/dev/null").arg("-C").arg(workspace).arg(".").status();
    assert!(warm.unwrap().success());
    // A capture of many new files syncs them with `syncfs`, which also writes out whatever
    // else is dirty on the filesystem: the data dir copied just before, gigabytes of it.
    super::settle_disk();
    let archive = root.join("run/workspace.tar");
    let started = Instant::now();
    let tarred = std::process::Command::new("tar").arg("cf").arg(&archive).arg("-C").arg(workspace).arg(".").status();
    assert!(tarred.unwrap().success());
    std::fs::File::open(&archive).unwrap().sync_all().unwrap();
    let tar_ms = started.elapsed().as_secs_f64() * 1000.0;
    let mut connection = Connection::open(host).unwrap();
    let created = connection.request_as("POST", "/api/sessions", Some(DEFAULT_TOKEN), b"{}").unwrap();
    let created: serde_json::Value = serde_json::from_slice(&created.body).unwrap();
    let path = format!("/api/sessions/{}/checkpoints", created["session"]["id"].as_str().unwrap());
    let mut take = || {
        let started = Instant::now();
        let answer = connection.request_as("POST", &path, Some(DEFAULT_TOKEN), b"{}").unwrap();
        assert_eq!(answer.status, 201, "{}", String::from_utf8_lossy(&answer.body));
        started.elapsed().as_secs_f64() * 1000.0
    };
    super::settle_disk();
    let first = take();
    let mut unchanged: Vec<f64> = (0..3).map(|_| take()).collect();
    let files = walk_count(workspace);
    report::vs_floor(
        &format!("checkpoint of a {files}-file workspace, first (floor: tar + fsync)"),
        first,
        "ms",
        tar_ms,
    );
    report::vs_target("  the same, unchanged since the last", median(&mut unchanged), "ms", 100.0, "< 100 ms");
}

fn walk_count(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|entry| if entry.path().is_dir() { walk_count(&entry.path()) } else { 1 })
        .sum()
}

/// The server restarted with a capacity of a tenth of the log, serving writes while it drops
/// the rest: how long that takes, and the writer's commit times meanwhile.
fn prune(data: &Path, workspace: &Path, size: Size) {
    let keep = size.events / 10;
    let kestrel = Spawned::kestrel_on(data, workspace, &config(keep));
    let db = rusqlite::Connection::open_with_flags(data.join("kestrel.db"), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap();
    let before = commit_histogram(&kestrel.host);
    let started = Instant::now();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let latencies: Vec<f64> = std::thread::scope(|scope| {
        let writers: Vec<_> = (0..4)
            .map(|client| {
                let (host, stop) = (&kestrel.host, &stop);
                scope.spawn(move || {
                    let mut connection = Connection::open(host).unwrap();
                    let mut latencies = Vec::new();
                    let mut n = 0;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let session = (size.big_sessions + client * 1000 + n % 1000) % size.default_sessions;
                        let path = format!("/api/sessions/ses_{session:032x}");
                        let body = format!(r#"{{"title":"t{n}"}}"#);
                        let started = Instant::now();
                        let answer =
                            connection.request_as("PATCH", &path, Some(DEFAULT_TOKEN), body.as_bytes()).unwrap();
                        assert_eq!(answer.status, 200);
                        latencies.push(started.elapsed().as_secs_f64() * 1000.0);
                        n += 1;
                    }
                    latencies
                })
            })
            .collect();
        // Done when the log is within its capacity (a little over: what came meanwhile). The
        // BAE session's events are never dropped, and seqs also number deltas, which are not
        // kept: each droppable tenant's oldest event is what tells.
        let oldest = "SELECT max(seq) - min(coalesce((SELECT min(seq) FROM events WHERE tenant = 'bulk'), max(seq)),
                                             coalesce((SELECT min(seq) FROM events WHERE tenant = 'default'), max(seq)))
                      FROM events";
        loop {
            let span: i64 = db.query_row(oldest, [], |row| row.get(0)).unwrap();
            if (span as usize) < keep + keep / 10 || started.elapsed() > Duration::from_secs(600) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writers.into_iter().flat_map(|w| w.join().unwrap()).collect()
    });
    let took = started.elapsed().as_secs_f64() * 1000.0;
    let after = commit_histogram(&kestrel.host);
    kestrel.stop();
    let mut latencies = latencies;
    let commits = after.count - before.count;
    let over_50 = commits - (after.at_most(0.05) - before.at_most(0.05));
    let p99_bound = after.bound_of(0.99, &before);
    report::info(
        &format!("pruning the log {}M → {}M events while serving writes", size.events / 1_000_000, keep / 1_000_000),
        took,
        "ms",
    );
    report::vs_target("  writer commits over 50 ms meanwhile", over_50, "", 1.0, "0");
    report::info("  writer commit p99 meanwhile (histogram bound)", p99_bound * 1000.0, "ms");
    report::info("  PATCH p99 meanwhile (4 clients)", percentile(&mut latencies, 0.99), "ms");
}

/// `kestrel_writer_commit_seconds` from `/api/metrics`: cumulative bucket counts.
struct Histogram {
    buckets: Vec<(f64, f64)>,
    count: f64,
}

impl Histogram {
    fn at_most(&self, bound: f64) -> f64 {
        self.buckets.iter().find(|(le, _)| (*le - bound).abs() < 1e-9).map_or(0.0, |(_, count)| *count)
    }

    /// The smallest bucket bound under which `share` of the commits since `before` fall.
    fn bound_of(&self, share: f64, before: &Histogram) -> f64 {
        let total = self.count - before.count;
        for (le, count) in &self.buckets {
            if count - before.at_most(*le) >= share * total {
                return *le;
            }
        }
        f64::INFINITY
    }
}

fn commit_histogram(host: &str) -> Histogram {
    let answer = Connection::open(host).unwrap().request_as("GET", "/metrics", Some(DEFAULT_TOKEN), b"").unwrap();
    let text = String::from_utf8_lossy(&answer.body);
    let mut histogram = Histogram { buckets: Vec::new(), count: 0.0 };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("kestrel_writer_commit_seconds_bucket{le=\"") {
            let (le, count) = rest.split_once("\"} ").unwrap();
            if let (Ok(le), Ok(count)) = (le.parse::<f64>(), count.trim().parse::<f64>()) {
                histogram.buckets.push((le, count));
            }
        } else if let Some(count) = line.strip_prefix("kestrel_writer_commit_seconds_count ") {
            histogram.count = count.trim().parse().unwrap_or(0.0);
        }
    }
    histogram
}

/// `probe HOST PATH TOKEN CLIENTS`: one `load`, printed (for looking into a row).
pub fn probe() {
    let args: Vec<String> = std::env::args().skip(2).collect();
    let (rate, mut latencies) = load(&args[0], &args[1], &args[2], args[3].parse().unwrap());
    let p50 = percentile(&mut latencies, 0.5);
    println!("{rate:.0} req/s, p50 {p50:.2} ms, p95 {:.2} ms", percentile(&mut latencies, 0.95));
}
