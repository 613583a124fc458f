//! The PostgreSQL store's groundwork, on a private cluster (`pg_cluster.rs`): `kestrel migrate`
//! applies the versioned schema once however many processes start at once (an advisory
//! lock), and every way a URL can be wrong stops with one line naming the problem and never
//! the password.

use std::process::{Command, Output};

use crate::pg_cluster::{self, PASSWORD};

pub(crate) fn migrate(url: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kestrel"))
        .args(["migrate", "--database-url", url])
        .env_remove("KESTREL_DATABASE_URL")
        .output()
        .unwrap()
}

/// The server started with `url` in its environment (until it fails, or stops), logging at `log`.
pub(crate) fn serve(url: &str, data: &std::path::Path, log: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kestrel"))
        .env("KESTREL_DATABASE_URL", url)
        .env("KESTREL_ADDR", "127.0.0.1:0")
        .env("KESTREL_ADMIN_ADDR", "127.0.0.1:0")
        .env("KESTREL_DATA_DIR", data)
        .env("KESTREL_WORKSPACE", data)
        .env("RUST_LOG", log)
        .output()
        .unwrap()
}

fn text(output: &Output) -> (String, String) {
    (String::from_utf8_lossy(&output.stdout).into_owned(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn migrations_apply_once_when_four_processes_start_together() {
    let Some(database) = pg_cluster::database() else { return };
    let children: Vec<std::process::Child> = (0..4)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_kestrel"))
                .args(["migrate", "--database-url", &database.url])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs: Vec<Output> = children.into_iter().map(|child| child.wait_with_output().unwrap()).collect();
    let said: Vec<String> = outputs.iter().map(|output| text(output).0).collect();
    for (output, line) in outputs.iter().zip(&said) {
        assert!(output.status.success(), "{line} {}", text(output).1);
        assert!(!line.contains(PASSWORD), "{line}");
        assert!(line.contains(":***@"), "the URL is shown redacted: {line}");
    }
    let every: Vec<i32> = kestrel::store::postgres::VERSIONS.iter().map(|(version, _)| *version).collect();
    let applied = format!("applied {every:?}");
    assert_eq!(said.iter().filter(|line| line.contains(&applied)).count(), 1, "{said:?}");
    assert_eq!(said.iter().filter(|line| line.contains("nothing to apply")).count(), 3, "{said:?}");

    let mut client = kestrel::store::postgres::connect(&database.url).unwrap();
    let versions: Vec<i32> =
        client.query("SELECT version FROM schema_migrations", &[]).unwrap().iter().map(|row| row.get(0)).collect();
    assert_eq!(versions, every);
    let tables: Vec<String> = client
        .query("SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1", &[])
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let tables_wanted =
        ["sessions", "messages", "events", "blobs", "bae_sessions", "webhook_deliveries", "schedules", "audit"];
    for table in tables_wanted.into_iter().chain(["cluster_nodes", "session_leases"]) {
        assert!(tables.iter().any(|t| t == table), "{table} in {tables:?}");
    }
    let again = migrate(&database.url);
    assert!(text(&again).0.contains("nothing to apply"), "{:?}", text(&again));
}

#[test]
fn the_session_list_moves_are_recorded_as_the_sqlite_store_records_them() {
    let Some(database) = pg_cluster::database() else { return };
    assert!(migrate(&database.url).status.success());
    let mut client = kestrel::store::postgres::connect(&database.url).unwrap();
    client
        .batch_execute(
            "INSERT INTO sessions (id, tenant, title, model, workspace, status, created_at, updated_at)
                 VALUES ('s1', 't', 'a', 'm', '/', 'idle', '2026-01-01', '2026-01-01');
             UPDATE sessions SET node = 'n1' WHERE id = 's1';
             UPDATE sessions SET title = 'b', updated_at = '2026-01-02' WHERE id = 's1';
             DELETE FROM sessions WHERE id = 's1';",
        )
        .unwrap();
    let moves: Vec<(String, Option<String>)> = client
        .query("SELECT session_id, from_updated_at FROM session_moves ORDER BY tick", &[])
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let at = |text: &str| Some(text.to_string());
    // Born, moved by the title (not by the node, which the list does not show), gone.
    assert_eq!(moves, [("s1".into(), None), ("s1".into(), at("2026-01-01")), ("s1".into(), at("2026-01-02"))]);
}

#[test]
fn every_wrong_url_stops_with_one_line_naming_the_problem_and_never_the_password() {
    let Some(database) = pg_cluster::database() else { return };
    let port = database.port;
    let cases = [
        (format!("postgres://kestrel:{PASSWORD}@127.0.0.1:{port}/no_such_database"), "the database does not exist"),
        (
            format!("postgres://kestrel:wrong-{PASSWORD}@127.0.0.1:{port}/{}", database.name),
            "refused the user or its password",
        ),
        (format!("postgres://kestrel:{PASSWORD}@127.0.0.1:1/{}", database.name), "cannot be reached"),
        (format!("postgres://kestrel:{PASSWORD}@127.0.0.1:notaport/x"), "is not a PostgreSQL URL"),
    ];
    let data = tempfile::tempdir().unwrap();
    for (url, problem) in cases {
        // `kestrel migrate`, and the server's start with the URL in its environment.
        for output in [migrate(&url), serve(&url, data.path(), "off")] {
            let (stdout, stderr) = text(&output);
            assert_eq!(output.status.code(), Some(1), "{url}: {stdout} {stderr}");
            assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
            assert!(stderr.contains(problem), "{problem}: {stderr}");
            assert!(!stderr.contains(PASSWORD) && !stdout.contains(PASSWORD), "the password leaked: {stderr}");
        }
    }
}

/// A statement stuck behind a lock is cancelled by the statement timeout (here the URL's own,
/// 500 ms, in place of the 30 s default): the request answers `503` with `Retry-After`, never
/// hangs, and once the lock is gone the same request answers.
#[test]
fn a_stuck_statement_is_cancelled_and_answered_503() {
    use serde_json::json;
    let Some(database) = pg_cluster::database() else { return };
    let url = format!("{}?options=-c%20statement_timeout%3D500", database.url);
    let server = crate::support::TestServer::start_with(|config| config.store.url = Some(url));
    let id = server.create_session(json!({}));
    let mut holder = kestrel::store::postgres::connect(&database.url).unwrap();
    let mut lock = holder.transaction().unwrap();
    lock.batch_execute("LOCK TABLE sessions IN ACCESS EXCLUSIVE MODE").unwrap();
    let started = std::time::Instant::now();
    let stuck = server.get(&format!("/api/sessions/{id}"));
    assert_eq!(stuck.status, 503, "{}", stuck.text);
    assert_eq!(stuck.header("retry-after"), Some("2"));
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "{:?}", started.elapsed());
    lock.rollback().unwrap();
    assert_eq!(server.get(&format!("/api/sessions/{id}")).status, 200);
}

#[test]
fn without_a_url_migrate_brings_the_data_dirs_sqlite_file_up_to_date() {
    let data = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_kestrel"))
        .args(["migrate", "--data-dir"])
        .arg(data.path())
        .env_remove("KESTREL_DATABASE_URL")
        .output()
        .unwrap();
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stdout} {stderr}");
    assert!(stdout.starts_with("SQLite at ") && stdout.trim_end().ends_with("kestrel.db: up to date"), "{stdout}");
    // The file it made is one a server starts on.
    let workspace = tempfile::tempdir().unwrap();
    let server = crate::support::TestServer::from_config(crate::support::test_config(data.path(), workspace.path()));
    assert_eq!(server.get("/api/health").status, 200);
}

/// The modules whose subject is not the store: the console in a browser, Markdown, HTTP
/// parsing, the terminal, model wire formats and their timeouts, the source's invariants, the
/// OpenAPI documents, SQLite's own migrations, the crash loop and fuzzer (whose own servers
/// take `--store`, see `scripts/crashloop`), and this file and the cluster's (PostgreSQL
/// already). Every other
/// integration test touches the store, and runs on PostgreSQL too.
const NOT_STORAGE: &[&str] = &[
    "providers::",
    "hammer::",
    "console::",
    "console_permissions::",
    "browser::",
    "markdown::",
    "edge::",
    "terminal::",
    "invariants::",
    "openapi::",
    "migrate::",
    "postgres::",
    "cluster::",
    "cluster_nodes::",
    "local_model::",
];

/// The integration suite is parameterized by store: this runs this test binary once more with
/// `KESTREL_TEST_STORE=postgres`, so every server of every storage test keeps its state in a
/// database of the run's cluster (a restart reopens the same one), and every one must pass.
#[test]
fn the_storage_tests_pass_on_postgres_too() {
    if crate::support::on_postgres() || pg_cluster::database().is_none() {
        return;
    }
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.env("KESTREL_TEST_STORE", "postgres").env("KESTREL_PG_RUN", pg_cluster::run_key());
    for module in NOT_STORAGE {
        command.args(["--skip", module]);
    }
    // One test at a time: the pass runs beside the rest of this binary's tests, and the
    // machine (two cores in CI) is not to be loaded past what the SQLite pass alone sees.
    command.args(["--test-threads", "1"]);
    let output = command.output().unwrap();
    let (out, err) = text(&output);
    let failed: Vec<&str> = out.lines().filter(|line| line.ends_with("... FAILED")).collect();
    let summary = out.lines().filter(|line| line.starts_with("test result:")).collect::<Vec<_>>();
    // What each failure printed: the section libtest writes after "failures:".
    let why = out.split_once("\nfailures:\n").map_or("", |(_, rest)| rest);
    let why: String = why.chars().take(6000).collect();
    assert!(output.status.success(), "on PostgreSQL: {failed:#?} {summary:?}\n{why}\n{}", tail(&err));
    assert!(out.contains(" passed;") && !out.contains(" 0 passed;"), "the pass ran tests: {summary:?}");
    println!("on PostgreSQL: {summary:?}");
}

/// The last lines of a long output.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(80)..].join("\n")
}

/// `pg_ctl restart -m fast` (every connection cut) while a run streams and a client keeps
/// reading: every request in the gap is answered, `200` or `503` with `Retry-After`; the run's
/// writes wait for the database and the run completes on the same stream; everything
/// acknowledged before is there after, and new writes work without a restart of Kestrel.
#[test]
fn a_database_restart_mid_run_is_waited_out_and_requests_in_the_gap_answer_503() {
    use crate::support::{event_type, is_run_end, TestServer};
    use serde_json::json;
    use std::sync::atomic::{AtomicBool, Ordering};
    let Some(cluster) = pg_cluster::private() else { return };
    let url = cluster.url.clone();
    let server = TestServer::start_with(|config| {
        config.store.url = Some(url);
        config.builtin.delay_ms = 20;
    });
    let acknowledged: Vec<String> = (0..5).map(|_| server.create_session(json!({}))).collect();
    let id = server.create_session(json!({}));
    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    let words = "word ".repeat(150);
    assert_eq!(server.post(&format!("/api/sessions/{id}/messages"), json!({ "content": words })).status, 202);
    stream.collect_until(|e| event_type(e) == "message.delta");

    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let poller = {
        let (client, stop, path) = (server.client(), std::sync::Arc::clone(&stop), format!("/api/sessions/{id}"));
        std::thread::spawn(move || {
            let mut answers = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let response = client.get(&path);
                answers.push((response.status, response.header("retry-after").map(str::to_string)));
            }
            answers
        })
    };
    cluster.restart();
    // Back: a read answers again (its pool finds its connections cut and makes new ones).
    crate::support::wait_until("a read after the restart", || server.get(&format!("/api/sessions/{id}")).status == 200);
    stop.store(true, Ordering::Relaxed);
    let answers = poller.join().unwrap();
    assert!(!answers.is_empty());
    for (status, retry_after) in &answers {
        assert!(matches!(status, 200 | 503), "{answers:?}");
        if *status == 503 {
            assert_eq!(retry_after.as_deref(), Some("2"), "{answers:?}");
        }
    }

    let events = stream.collect_until(is_run_end);
    let end = events.last().unwrap();
    assert_eq!(event_type(end), "run.finished", "{end}");
    assert_eq!(end["event"]["status"], "completed", "{end}");
    for session in acknowledged.iter().chain([&id]) {
        assert_eq!(server.get(&format!("/api/sessions/{session}")).status, 200, "{session} kept");
    }
    let detail = server.get(&format!("/api/sessions/{id}")).json;
    let texts = detail["session"]["messages"].to_string();
    assert!(texts.matches("word").count() >= 300, "the question and the whole answer are stored: {texts:.600}");
    assert_eq!(server.post("/api/sessions", json!({})).status, 201, "a write after the restart");
    println!(
        "answers during the restart: {} ({} of them 503)",
        answers.len(),
        answers.iter().filter(|a| a.0 == 503).count()
    );
}

/// Every event a stream replays from the start up to the one with seq `last` (or, with no
/// `last`, up to a title change to `marker`, made now): seq and type.
fn replayed(server: &crate::support::TestServer, last: Option<u64>) -> Vec<(u64, String)> {
    let mut stream = crate::support::SseClient::open(&server.base, "/api/events", server.token.as_deref(), Some(0));
    let marked = last.is_none().then(|| {
        let id = server.create_session(serde_json::json!({}));
        server.patch(&format!("/api/sessions/{id}"), serde_json::json!({ "title": "marker" }));
    });
    let mut events = Vec::new();
    while let Some((seq, event)) = stream.next_event(crate::support::WAIT) {
        let kind = crate::support::event_type(&event).to_string();
        let done = match last {
            Some(last) => seq >= last,
            None => marked.is_some() && event.to_string().contains("\"marker\""),
        };
        events.push((seq, kind));
        if done {
            return events;
        }
    }
    panic!("the replay stopped at {:?}", events.last());
}

/// A SQLite data dir with sessions of both doors, runs, a checkpoint and its files moves to
/// PostgreSQL with `kestrel migrate --from sqlite`: a server on the database lists the same
/// sessions with the same transcripts, replays the same log with the same seqs, restores the
/// checkpoint from the database's blobs, and takes the BAE keys and session as they were; a
/// second copy into the now non-empty database is refused.
#[test]
fn a_sqlite_data_dir_with_both_doors_sessions_moves_to_postgres_whole() {
    use crate::bae::support::{Bae, Harness};
    use serde_json::json;
    let Some(database) = pg_cluster::database() else { return };
    let mut bae = Bae::start();
    let server = &bae.server;
    std::fs::write(server.workspace.join("kept.txt"), "as it was").unwrap();
    let id = server.create_session(json!({ "title": "moved" }));
    server.run_to_end(&id, "hello from sqlite");
    let checkpoint = server.post(&format!("/api/sessions/{id}/checkpoints"), json!({}));
    assert_eq!(checkpoint.status, 201, "{}", checkpoint.text);
    let checkpoint = checkpoint.json["checkpoint"]["id"].as_str().unwrap().to_string();
    let (_, key) = bae.key_for("movers", &["lookup"]);
    let harness = Harness::open(bae.base(), &key, &["lookup"]);
    let log = replayed(server, None);
    let before = (server.get("/api/sessions").json, server.get(&format!("/api/sessions/{id}")).json, harness.events());
    bae.server.stop();

    let copy = Command::new(env!("CARGO_BIN_EXE_kestrel"))
        .args(["migrate", "--from", "sqlite", "--database-url", &database.url, "--data-dir"])
        .arg(&bae.server.data_dir)
        .env_remove("KESTREL_DATABASE_URL")
        .output()
        .unwrap();
    let (said, err) = text(&copy);
    assert!(copy.status.success(), "{said} {err}");
    assert!(said.contains("sessions 3") && said.contains("blobs 1") && !said.contains(PASSWORD), "{said}");

    let url = database.url.clone();
    bae.restart_with(|config| config.store.url = Some(url));
    let harness = Harness { base: bae.base().to_string(), ..harness };
    let server = &bae.server;
    let after = (server.get("/api/sessions").json, server.get(&format!("/api/sessions/{id}")).json, harness.events());
    assert_eq!(after.0, before.0, "the session list");
    assert_eq!(after.1, before.1, "the transcript");
    assert_eq!(after.2, before.2, "the BAE session's events, read with its session key");
    // Token deltas live in the first server's ring, never in the log: the log is the rest.
    let logged: Vec<(u64, String)> = log.iter().filter(|(_, kind)| kind != "message.delta").cloned().collect();
    assert_eq!(replayed(server, logged.last().map(|(seq, _)| *seq)), logged, "the log, seq for seq");
    std::fs::write(server.workspace.join("kept.txt"), "changed").unwrap();
    let restored = server.post(&format!("/api/sessions/{id}/checkpoints/{checkpoint}/restore"), json!({}));
    assert_eq!(restored.status, 200, "{}", restored.text);
    assert_eq!(std::fs::read_to_string(server.workspace.join("kept.txt")).unwrap(), "as it was");
    assert_eq!(server.post("/api/sessions", json!({})).status, 201, "new writes");
    bae.server.stop();

    let again = Command::new(env!("CARGO_BIN_EXE_kestrel"))
        .args(["migrate", "--from", "sqlite", "--database-url", &database.url, "--data-dir"])
        .arg(&bae.server.data_dir)
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(text(&again).1.contains("already holds"), "{:?}", text(&again));
}

/// PostgreSQL's text holds no NUL (SQLite's does): a title with one
/// is refused with `400 invalid_body` before anything commits, and the server, its
/// connections and the session go on as before.
#[test]
fn a_nul_character_is_refused_with_400_and_nothing_commits() {
    use serde_json::json;
    let Some(database) = pg_cluster::database() else { return };
    let url = database.url.clone();
    let server = crate::support::TestServer::start_with(|config| config.store.url = Some(url));
    server.post("/api/sessions", json!({ "title": "a\u{0}b" })).assert_error(400, "invalid_body");
    let id = server.create_session(json!({ "title": "clean" }));
    server.patch(&format!("/api/sessions/{id}"), json!({ "title": "x\u{0}" })).assert_error(400, "invalid_body");
    let listed = server.get("/api/sessions").json;
    assert_eq!(listed["sessions"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed["sessions"][0]["title"], "clean");
    // A message's NUL is inside its JSON body (escaped), which PostgreSQL keeps.
    let events = server.run_to_end(&id, "before\u{0}after");
    assert_eq!(crate::support::event_type(events.last().unwrap()), "run.finished");
    let detail = server.get(&format!("/api/sessions/{id}")).json;
    assert!(detail["session"]["messages"].to_string().contains("before\\u0000after"), "{detail}");
}
