//! `scripts/bench` runs this: Kestrel's throughput, fan-out, memory and writer figures, each
//! beside a floor measured the same way in the same run. See the README's Performance section.
//!
//! Kestrel runs as a child process (the release binary), so its RSS is its own; the floor is a
//! bare tiny_http server with a thread per request, also a child process (this program, run
//! with `floor-server`).

mod bae;
mod client;
mod cluster;
#[allow(dead_code)]
#[path = "../../tests/it/pg_cluster.rs"]
mod pg_cluster;
mod relay;
mod report;
mod scale;
mod stores;
mod streams;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use client::{follow_stream, open_stream, Connection};
use kestrel::domain::{Message, Role, SessionRecord, SessionStatus, SessionSummary};
use kestrel::store::{Store, WriteOp};

const CLIENTS: usize = 32;
const ROUNDS: usize = 3;
const ROUND: Duration = Duration::from_secs(2);
const DELTAS: usize = 10_000;
const WRITER_EVENTS: usize = 1_000_000;
/// Events a reconnect is behind in the log-replay row.
const LOGGED_EVENTS: usize = 50_000;

/// What to run, from the command line: `[bae | scale | relay | streams] [--scale] [--save FILE]
/// [--compare FILE]`.
struct Args {
    /// `bae`, `scale`, `relay` or `streams`: only those rows.
    only: Option<String>,
    /// The scale rows too (`--scale`).
    scale: bool,
    save: Option<String>,
    compare: Option<String>,
    /// `--store postgres`: the store-bound rows on SQLite and on PostgreSQL, side by side.
    store: Option<String>,
    /// `--cluster N`: the cluster's rows, with 1 to N nodes on one PostgreSQL database.
    cluster: Option<usize>,
}

fn args() -> Args {
    let mut args = Args { only: None, scale: false, save: None, compare: None, store: None, cluster: None };
    let mut given = std::env::args().skip(1);
    while let Some(arg) = given.next() {
        match arg.as_str() {
            "bae" | "scale" | "relay" | "streams" => args.only = Some(arg),
            "--scale" => args.scale = true,
            "--save" => args.save = given.next(),
            "--compare" => args.compare = given.next(),
            "--store" => args.store = given.next(),
            "--cluster" => args.cluster = given.next().and_then(|n| n.parse().ok()).filter(|n| *n >= 1),
            other => {
                eprintln!("usage: benchmark [bae | scale | relay | streams] [--scale] [--store postgres] [--cluster N] [--save FILE] [--compare FILE] ({other:?}?)");
                std::process::exit(2);
            }
        }
    }
    args
}

fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("floor-server") => return floor_server(),
        Some("fake-provider") => return relay::fake_provider(),
        Some("bare-relay") => return relay::bare_relay(),
        Some("fake-messages") => return bae::fake_messages(),
        Some("probe") => return scale::probe(),
        Some("bytes-floor") => return scale::bytes_floor(),
        Some("prune") => return scale::prune_only(),
        _ => {}
    }
    let args = args();
    let quick = std::env::var("BENCH_QUICK").is_ok();
    println!("kestrel benchmark ({}); medians of {ROUNDS} rounds where a round repeats", report::machine());
    println!();
    report::header();
    if let Some(nodes) = args.cluster {
        cluster::rows(nodes, quick);
    } else if let Some(store) = &args.store {
        assert_eq!(store, "postgres", "--store postgres (SQLite is every other row's store)");
        stores::rows(quick);
    } else {
        everyday(&args, quick);
    }
    finish(&args);
}

/// The rows of the table but the store comparison's.
fn everyday(args: &Args, quick: bool) {
    match args.only.as_deref() {
        Some("bae") => bae::rows(quick),
        Some("scale") => scale::rows(quick),
        Some("relay") => relay::rows(),
        Some("streams") => streams::rows(quick),
        _ => {
            everyday_rows(quick);
            if args.scale {
                scale::rows(quick);
            }
        }
    }
    println!();
    println!("ratio = kestrel / floor (or target): above 1 is better for rates, below 1 for times and memory.");
    println!("floor: a bare tiny_http server with a thread per request: a fixed JSON body for");
    println!("requests; for streams, pre-built frames of the same size broadcast to every open");
    println!("stream, with no bus, seq, store or filtering. For the writer: the same rows inserted");
    println!("by one rusqlite connection in 4096-row transactions. For the log replay: the same");
    println!("events read straight from the log table by one rusqlite connection. For the relay:");
    println!("a bare relay that reads the provider's SSE, parses it and writes SSE frames, with no");
    println!("store, bus or seq. The scale rows' floors are said in the README.");
}

/// Saves the figures, or compares them with a saved run's.
fn finish(args: &Args) {
    if let Some(path) = &args.save {
        report::save(path);
    }
    if let Some(path) = &args.compare {
        if report::compare(path) {
            std::process::exit(1);
        }
    }
}

/// The rows on small, fresh data.
fn everyday_rows(quick: bool) {
    let floor = Spawned::floor();
    let kestrel = Spawned::kestrel(&[]);
    create_sessions(&kestrel.host, 100);
    let mut health = Vec::new();
    let mut sessions = Vec::new();
    let mut floor_rates = Vec::new();
    for _ in 0..ROUNDS {
        floor_rates.push(requests_per_second(&floor.host, "/"));
        health.push(requests_per_second(&kestrel.host, "/api/health"));
        sessions.push(requests_per_second(&kestrel.host, "/api/sessions"));
    }
    let floor_rate = median(&mut floor_rates);
    for (label, rates) in [
        ("GET /api/health, 32 keep-alive clients", &mut health),
        ("GET /api/sessions (100 stored), 32 clients", &mut sessions),
    ] {
        report::vs_floor(label, median(rates), "req/s", floor_rate);
    }
    drop(kestrel);

    let fanouts: &[usize] = if quick { &[1, 100] } else { &[1, 100, 1000] };
    for &subscribers in fanouts {
        let kestrel = Spawned::kestrel(&[("KESTREL_BUILTIN_DELAY_MS", "0")]);
        let (elapsed, events, reconnects) = fan_out(&kestrel.host, FanOutTarget::Kestrel, subscribers);
        drop(kestrel);
        let floor = Spawned::floor();
        let (floor_elapsed, floor_events, _) = fan_out(&floor.host, FanOutTarget::Floor, subscribers);
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        report::vs_floor(
            &format!("{DELTAS} deltas to {subscribers} SSE stream(s): last run.finished"),
            ms(elapsed),
            "ms",
            ms(floor_elapsed),
        );
        let rate = events as f64 / elapsed.as_secs_f64();
        let floor_rate = floor_events as f64 / floor_elapsed.as_secs_f64();
        report::vs_floor(&format!("  events/s delivered ({subscribers} streams)"), rate, "ev/s", floor_rate);
        report::info(&format!("  drop-and-replay reconnects ({subscribers} streams)"), reconnects as f64, "");
    }

    streams::rows(quick);

    let logged = if quick { LOGGED_EVENTS * 2 / 5 } else { LOGGED_EVENTS };
    let (replayed, read) = log_replay(logged);
    report::vs_floor(
        &format!("reconnect {logged} events back: replay from the log"),
        replayed.as_secs_f64() * 1000.0,
        "ms",
        read.as_secs_f64() * 1000.0,
    );

    relay::rows();

    settle_disk();
    bae::rows(quick);

    settle_disk();
    let events = if quick { WRITER_EVENTS / 10 } else { WRITER_EVENTS };
    let writer = writer_events_per_second(events);
    let raw = raw_sqlite_events_per_second(events);
    report::vs_floor(&format!("writer thread: {events} small events"), writer, "ev/s", raw);
}

/// `count` events in the log (a session's title patched `count` times, four clients at
/// once), then a stream with `Last-Event-ID: 0`: the time until the `count`th event arrives,
/// and the time to read the same rows straight from the database.
fn log_replay(count: usize) -> (Duration, Duration) {
    let kestrel = fill_log(&[], count);
    settle_disk();
    let started = Instant::now();
    let mut reader = open_stream(&kestrel.host, "/api/events", Some(0)).unwrap();
    client::read_events(&mut reader, count);
    let replayed = started.elapsed();
    let database = kestrel._data.as_ref().unwrap().path().join("data").join("kestrel.db");
    let conn = rusqlite::Connection::open_with_flags(&database, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let started = Instant::now();
    let mut statement = conn.prepare("SELECT seq, body FROM events ORDER BY seq LIMIT ?1").unwrap();
    let rows = statement
        .query_map([count as i64], |row| Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?)))
        .unwrap()
        .count();
    let read = started.elapsed();
    assert_eq!(rows, count);
    (replayed, read)
}

/// A Kestrel child (with `env`) whose log holds `count` events (a session's title patched
/// `count` times, four clients at once), all logged by the time this returns.
fn fill_log(env: &[(&str, &str)], count: usize) -> Spawned {
    let kestrel = Spawned::kestrel(env);
    let id = create_sessions(&kestrel.host, 1).remove(0);
    std::thread::scope(|scope| {
        for client in 0..4 {
            let (host, id) = (&kestrel.host, &id);
            scope.spawn(move || {
                let mut connection = Connection::open(host).unwrap();
                for i in (client..count).step_by(4) {
                    let body = format!(r#"{{"title":"t{i}"}}"#);
                    let response =
                        connection.request("PATCH", &format!("/api/sessions/{id}"), body.as_bytes()).unwrap();
                    assert_eq!(response.status, 200);
                }
            });
        }
    });
    // The PATCHes are answered before their events are logged: wait until the log has them
    // all (a marker published after them reaches a live stream only once they are logged),
    // so the row times the replay, not the bus catching up.
    let live = open_stream(&kestrel.host, "/api/events", None).unwrap();
    let mut connection = Connection::open(&kestrel.host).unwrap();
    let marked = connection.request("PATCH", &format!("/api/sessions/{id}"), br#"{"title":"marker"}"#).unwrap();
    assert_eq!(marked.status, 200);
    assert!(follow_stream(&kestrel.host, "/api/events", live, "\"marker\"").finished);
    kestrel
}

/// Flushes what earlier rows left for the disk to write (`sync`), so that a row whose
/// commits wait on fsync does not pay for the previous row's files.
fn settle_disk() {
    let _ = Command::new("sync").status();
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    values[values.len() / 2]
}

/// A server child process, killed on drop.
struct Spawned {
    child: Child,
    host: String,
    /// The rest of the child's stdout (Kestrel prints its admin address next).
    stdout: BufReader<std::process::ChildStdout>,
    _data: Option<tempfile::TempDir>,
}

impl Spawned {
    fn kestrel(env: &[(&str, &str)]) -> Spawned {
        Spawned::kestrel_with_config(env, "")
    }

    /// The release binary with `config` as its config file, on a fresh data dir.
    fn kestrel_with_config(env: &[(&str, &str)], config: &str) -> Spawned {
        let data = tempfile::tempdir().unwrap();
        let mut command = Spawned::kestrel_command(&data.path().join("data"), data.path(), config);
        command.envs(env.iter().copied());
        Spawned::wait_ready(command, Some(data))
    }

    /// The release binary on a data dir and workspace of the caller's, with `config`.
    fn kestrel_on(data: &std::path::Path, workspace: &std::path::Path, config: &str) -> Spawned {
        Spawned::wait_ready(Spawned::kestrel_command(data, workspace, config), None)
    }

    /// The command starting the release binary on `data` and `workspace`, with `config` written
    /// beside the data dir.
    fn kestrel_command(data: &std::path::Path, workspace: &std::path::Path, config: &str) -> Command {
        let config_path = data.with_extension("toml");
        std::fs::write(&config_path, config).unwrap();
        let mut command = Command::new(Spawned::binary());
        command
            .arg("--config")
            .arg(&config_path)
            .env("KESTREL_ADDR", "127.0.0.1:0")
            .env("KESTREL_DATA_DIR", data)
            .env("KESTREL_ADMIN_ADDR", "127.0.0.1:0")
            .env("KESTREL_WORKSPACE", workspace)
            .env("RUST_LOG", "error");
        command
    }

    fn binary() -> std::path::PathBuf {
        std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().join("kestrel")
    }

    fn floor() -> Spawned {
        Spawned::helper("floor-server")
    }

    /// This program in one of its server modes.
    fn helper(mode: &str) -> Spawned {
        Spawned::helper_with(mode, &[])
    }

    /// This program in one of its server modes, with more environment.
    fn helper_with(mode: &str, env: &[(&str, &str)]) -> Spawned {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command.arg(mode).envs(env.iter().copied());
        Spawned::wait_ready(command, None)
    }

    fn wait_ready(mut command: Command, data: Option<tempfile::TempDir>) -> Spawned {
        let mut child = command.stdout(Stdio::piped()).spawn().expect("server starts");
        let mut line = String::new();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        stdout.read_line(&mut line).unwrap();
        let host = line.trim().rsplit("http://").next().unwrap().to_string();
        Spawned { child, host, stdout, _data: data }
    }

    /// The next address the child printed (Kestrel's admin API, after its main address).
    fn next_host(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().rsplit("http://").next().unwrap().to_string()
    }

    fn data_dir(&self) -> std::path::PathBuf {
        self._data.as_ref().expect("a kestrel child has a data dir").path().join("data")
    }

    /// Stops the child with SIGTERM and waits for it to exit.
    fn stop(mut self) {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let _ = self.child.wait();
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The floor: tiny_http with a thread per request. `/` answers a fixed JSON body the size of
/// a health answer; `/stream` is a bare event stream and `POST /go` sends `DELTAS` frames the
/// size of Kestrel's deltas to every open stream, then a `run.finished` frame: fan-out with no
/// bus, no seq, no store, no filtering.
fn floor_server() {
    use std::io::Write;
    type Streams = Arc<std::sync::Mutex<Vec<crossbeam_channel::Sender<Arc<str>>>>>;
    let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").unwrap());
    println!("floor listening on http://{}", server.server_addr().to_ip().unwrap());
    let streams: Streams = Arc::default();
    let body = br#"{"name":"kestrel","plugins":0,"protocol":"1.0","sessions":0,"status":"ok","uptimeMs":1234,"version":"0.1.0"}"#;
    for request in server.incoming_requests() {
        let streams = Arc::clone(&streams);
        std::thread::spawn(move || match request.url() {
            "/stream" => {
                let (tx, rx) = crossbeam_channel::unbounded::<Arc<str>>();
                streams.lock().unwrap().push(tx);
                let mut socket = request.into_writer();
                let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
                let _ = socket.write_all(head.as_bytes()).and_then(|_| socket.flush());
                while let Ok(frame) = rx.recv() {
                    let mut burst = frame.to_string();
                    while let Ok(more) = rx.try_recv() {
                        burst.push_str(&more);
                        if burst.len() > 64 * 1024 {
                            break;
                        }
                    }
                    let chunk = format!("{:x}\r\n{burst}\r\n", burst.len());
                    if socket.write_all(chunk.as_bytes()).and_then(|_| socket.flush()).is_err() {
                        break;
                    }
                }
            }
            "/go" => {
                let subscribers = streams.lock().unwrap().clone();
                let _ = request.respond(tiny_http::Response::empty(202));
                for seq in 1..=DELTAS as u64 + 1 {
                    let kind = if seq > DELTAS as u64 { "run.finished" } else { "message.delta" };
                    let frame: Arc<str> = Arc::from(format!(
                        "id: {seq}\ndata: {{\"seq\":{seq},\"at\":\"2026-01-01T00:00:00.000Z\",\"event\":{{\"type\":\"{kind}\",\"sessionId\":\"ses_0123456789abcdef0123456789abcdef\",\"messageId\":\"msg_0123456789abcdef0123456789abcdef\",\"channel\":\"text\",\"delta\":\" w\"}}}}\n\n"
                    ));
                    for subscriber in &subscribers {
                        let _ = subscriber.send(Arc::clone(&frame));
                    }
                }
                streams.lock().unwrap().clear();
            }
            _ => {
                let header = tiny_http::Header::from_bytes("Content-Type", "application/json").unwrap();
                let _ = request.respond(tiny_http::Response::from_data(&body[..]).with_header(header));
            }
        });
    }
}

fn requests_per_second(host: &str, path: &str) -> f64 {
    let barrier = Arc::new(Barrier::new(CLIENTS + 1));
    let workers: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (host, path, barrier) = (host.to_string(), path.to_string(), Arc::clone(&barrier));
            std::thread::spawn(move || {
                let mut connection = Connection::open(&host).unwrap();
                barrier.wait();
                let deadline = Instant::now() + ROUND;
                let mut done = 0u64;
                while Instant::now() < deadline {
                    let response = connection.request("GET", &path, b"").unwrap();
                    assert_eq!(response.status, 200);
                    done += 1;
                }
                done
            })
        })
        .collect();
    barrier.wait();
    let started = Instant::now();
    let total: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    total as f64 / started.elapsed().as_secs_f64()
}

fn create_sessions(host: &str, count: usize) -> Vec<String> {
    let mut connection = Connection::open(host).unwrap();
    (0..count)
        .map(|i| {
            let body = format!(r#"{{"title":"bench {i}"}}"#);
            let response = connection.request("POST", "/api/sessions", body.as_bytes()).unwrap();
            assert_eq!(response.status, 201);
            let json: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
            json["session"]["id"].as_str().unwrap().to_string()
        })
        .collect()
}

/// Where a fan-out measurement streams from and how it is started.
enum FanOutTarget {
    /// A Kestrel session: its event stream, started by a message of `DELTAS` words.
    Kestrel,
    /// The floor's `/stream`, started by `POST /go`.
    Floor,
}

/// One burst of `DELTAS` events watched by `subscribers` streams; the time until the last
/// stream has `run.finished`, the events delivered, and the reconnects that drops caused.
/// Streams are opened one after another, then all wait on a barrier.
fn fan_out(host: &str, target: FanOutTarget, subscribers: usize) -> (Duration, u64, u64) {
    let (path, trigger_path, trigger_body) = match target {
        FanOutTarget::Kestrel => {
            let session = create_sessions(host, 1).remove(0);
            let words = "w ".repeat(DELTAS - 1);
            (
                format!("/api/sessions/{session}/events"),
                format!("/api/sessions/{session}/messages"),
                serde_json::json!({ "content": words }).to_string(),
            )
        }
        FanOutTarget::Floor => ("/stream".to_string(), "/go".to_string(), String::new()),
    };
    let ready = Arc::new(Barrier::new(subscribers + 1));
    let readers: Vec<_> = (0..subscribers)
        .map(|_| {
            let reader = open_stream(host, &path, None).expect("a stream opens");
            let (host, path, ready) = (host.to_string(), path.clone(), Arc::clone(&ready));
            std::thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || {
                    ready.wait();
                    let outcome = follow_stream(&host, &path, reader, "\"run.finished\"");
                    (Instant::now(), outcome)
                })
                .unwrap()
        })
        .collect();
    ready.wait();
    let started = Instant::now();
    let response = Connection::open(host).unwrap().request("POST", &trigger_path, trigger_body.as_bytes()).unwrap();
    assert_eq!(response.status, 202);
    let mut last = started;
    let (mut events, mut reconnects, mut unfinished) = (0, 0, 0);
    for reader in readers {
        let (finished, outcome) = reader.join().unwrap();
        last = last.max(finished);
        events += outcome.events;
        reconnects += outcome.reconnects;
        unfinished += u64::from(!outcome.finished);
    }
    assert_eq!(unfinished, 0, "{unfinished} subscriber(s) never saw run.finished");
    (last - started, events, reconnects)
}

fn session_op(id: &str) -> WriteOp {
    let now = kestrel::time::now_rfc3339();
    WriteOp::InsertSession(SessionRecord {
        summary: SessionSummary {
            id: id.into(),
            title: "bench".into(),
            created_at: now.clone(),
            updated_at: now,
            status: SessionStatus::Idle,
            model: "builtin/echo".into(),
            message_count: 0,
            workspace: "/".into(),
            forked_from: None,
        },
        tenant: "default".into(),
        system_prompt: None,
    })
}

fn small_message(i: usize) -> Message {
    let mut message = Message::text_of(Role::User, format!("event {i}"));
    message.id = format!("m{i}");
    message
}

/// Small appends pushed through the writer thread as fast as one producer can queue them.
fn writer_events_per_second(count: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let (store, writer) = Store::open(dir.path()).unwrap();
    writer_rate(&store, writer, count)
}

/// `count` small messages appended to one session through `store`, each its own detached
/// write; events per second until the last has committed. Stops the writer.
fn writer_rate(store: &Store, writer: kestrel::store::WriterHandle, count: usize) -> f64 {
    store.write(vec![session_op("s")]).unwrap();
    let started = Instant::now();
    let base = kestrel::time::now_millis();
    for i in 0..count {
        // Each a millisecond later, as appends are: each moves the session (a walk's move).
        let op = WriteOp::AppendMessage {
            session_id: "s".into(),
            message: small_message(i),
            updated_at: kestrel::time::rfc3339_from_millis(base + i as i64),
        };
        store.write_detached(vec![op]).unwrap();
    }
    store.write(vec![]).unwrap(); // returns once everything before it has committed
    let rate = count as f64 / started.elapsed().as_secs_f64();
    writer.shutdown();
    rate
}

/// The same rows straight into SQLite from one connection: what the writer thread costs.
fn raw_sqlite_events_per_second(count: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let conn = rusqlite::Connection::open(dir.path().join("raw.db")).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    conn.pragma_update(None, "synchronous", "FULL").unwrap();
    conn.execute_batch(include_str!("../../src/store/migrations/0001_init.sql")).unwrap();
    conn.execute(
        "INSERT INTO sessions (id, tenant, title, model, workspace, status, created_at, updated_at) VALUES ('s','t','b','m','/','idle','x','x')",
        [],
    )
    .unwrap();
    let base = kestrel::time::now_millis();
    let started = Instant::now();
    let mut conn = conn;
    for batch in (0..count).collect::<Vec<_>>().chunks(4096) {
        let tx = conn.transaction().unwrap();
        for &i in batch {
            let message = small_message(i);
            let body = serde_json::to_string(&message).unwrap();
            tx.prepare_cached("INSERT INTO messages (id, session_id, role, body) VALUES (?1, 's', 'user', ?2)")
                .unwrap()
                .execute(rusqlite::params![message.id, body])
                .unwrap();
            tx.prepare_cached("UPDATE sessions SET message_count = message_count + 1, updated_at = ?1 WHERE id = 's'")
                .unwrap()
                .execute([kestrel::time::rfc3339_from_millis(base + i as i64)])
                .unwrap();
        }
        tx.commit().unwrap();
    }
    count as f64 / started.elapsed().as_secs_f64()
}
