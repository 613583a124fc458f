//! Durability: restarts on the same data dir, a kill -9 mid-run, and the resume rules.

use std::process::Child;

use serde_json::{json, Value};

use crate::support::{event_type, is_run_end, spawn_binary, test_config, TestServer};

#[test]
fn sessions_and_transcripts_survive_a_restart_and_seqs_keep_rising() {
    let mut server = TestServer::start();
    let id = server.create_session(json!({ "title": "durable" }));
    let events = server.run_to_end(&id, "keep this");
    let last_seq = events.last().unwrap()["seq"].as_u64().unwrap();

    server.restart(|_| {});
    let session = server.get(&format!("/api/sessions/{id}")).json["session"].clone();
    assert_eq!(session["title"], "durable");
    assert_eq!(session["status"], "idle");
    assert_eq!(session["messages"][0]["content"], "keep this");
    assert_eq!(session["messages"][1]["content"], "Echo: keep this");

    // A client's old Last-Event-ID can never replay the wrong events: new seqs start above.
    let events = server.run_to_end(&id, "after restart");
    assert!(events[0]["seq"].as_u64().unwrap() > last_seq);
    assert_eq!(server.get("/api/health").json["sessions"], 1);
}

#[test]
fn a_run_killed_mid_stream_is_interrupted_on_boot_and_resumes() {
    let data = tempfile::tempdir().unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let (mut child, base, _) = spawn_binary(data.path(), workspace.path(), "[builtin]\ndelay_ms = 200\n");
    let client = crate::support::Client { base: base.clone(), token: None };
    let id = client.post("/api/sessions", json!({})).json["session"]["id"].as_str().unwrap().to_string();
    let mut stream = crate::support::SseClient::open(&base, &format!("/api/sessions/{id}/events"), None, None);
    let accepted = client.post(&format!("/api/sessions/{id}/messages"), json!({ "content": "a long answer to lose" }));
    assert_eq!(accepted.status, 202);
    stream.collect_until(|e| event_type(e) == "message.delta" && e["event"]["channel"] == "text");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let server = TestServer::from_config(test_config(data.path(), workspace.path()));
    let session = server.get(&format!("/api/sessions/{id}")).json["session"].clone();
    assert_eq!(session["status"], "interrupted");
    assert_eq!(session["messages"][0]["content"], "a long answer to lose", "the acknowledged message survived");

    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    let resumed = server.post(&format!("/api/sessions/{id}/resume"), json!({}));
    assert_eq!(resumed.status, 202, "{}", resumed.text);
    let events = stream.collect_until(is_run_end);
    assert_eq!(events.last().unwrap()["event"]["status"], "completed");
    let session = server.get(&format!("/api/sessions/{id}")).json["session"].clone();
    assert_eq!(session["status"], "idle");
    assert_eq!(session["messages"][1]["content"], "Echo: a long answer to lose");
}

#[test]
fn a_tool_call_without_a_result_is_answered_with_an_error_on_resume_never_rerun() {
    let mut server = TestServer::start();
    let id = server.create_session(json!({}));
    server.stop();
    // The state a crash leaves when it strikes while a tool runs: the assistant message with
    // the call is stored, its result is not, and the session was running.
    let mut db = crate::support::Db::open(&server.data_dir);
    // Rows in the store's own form: a message is its blocks.
    let call =
        json!({ "type": "tool_call", "id": "call_pending", "name": "dangerous_tool", "arguments": { "rm": "-rf" } });
    let text = json!({ "type": "text", "text": "/tool dangerous_tool" });
    let user = json!({ "id": "msg_u", "role": "user", "blocks": [text], "created_at": "2026-01-01T00:00:00.000Z" });
    let assistant =
        json!({ "id": "msg_a", "role": "assistant", "blocks": [call], "created_at": "2026-01-01T00:00:00.001Z" });
    for message in [&user, &assistant] {
        let (message_id, role) = (message["id"].as_str().unwrap(), message["role"].as_str().unwrap());
        db.exec(
            "INSERT INTO messages (id, session_id, role, body) VALUES (?1, ?2, ?3, ?4)",
            &[message_id, &id, role, &message.to_string()],
        );
    }
    // The call had begun executing: its start mark was committed before it ran.
    db.exec("INSERT INTO tool_call_starts (session_id, call_id, started_at) VALUES (?1, 'call_pending', 'x')", &[&id]);
    db.exec("UPDATE sessions SET status = 'running', message_count = 2 WHERE id = ?1", &[&id]);
    drop(db);

    server.restart(|_| {});
    assert_eq!(server.get(&format!("/api/sessions/{id}")).json["session"]["status"], "interrupted");
    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    assert_eq!(server.post(&format!("/api/sessions/{id}/resume"), json!({})).status, 202);
    let events = stream.collect_until(is_run_end);
    assert!(!events.iter().any(|e| event_type(e) == "tool.started"), "the call is never executed again");
    let messages: Vec<Value> =
        server.get(&format!("/api/sessions/{id}")).json["session"]["messages"].as_array().unwrap().clone();
    let result = &messages[2];
    assert_eq!(result["role"], "tool");
    assert_eq!(result["toolCallId"], "call_pending");
    assert!(result["content"].as_str().unwrap().contains("Verify the state of the workspace"));
    assert_eq!(result["meta"]["ok"], false);
    assert_eq!(messages[3]["role"], "assistant");
    assert!(messages[3]["content"].as_str().unwrap().contains("dangerous_tool failed"));
}

type Running = (tempfile::TempDir, tempfile::TempDir, Child, String, crate::support::Client, String);

/// The binary with `run_command` on `auto`, and one session on it.
fn binary_running_commands(agent: &str) -> Running {
    let data = tempfile::tempdir().unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let config = format!("[agent]\n{agent}\n[agent.permissions]\nrun_command = \"auto\"\n[builtin]\ndelay_ms = 1\n");
    let config = config.as_str();
    let (child, base, _) = spawn_binary(data.path(), workspace.path(), config);
    let client = crate::support::Client { base: base.clone(), token: None };
    let id = client.post("/api/sessions", json!({})).json["session"]["id"].as_str().unwrap().to_string();
    (data, workspace, child, base, client, id)
}

#[test]
fn a_command_in_flight_at_kill_9_is_not_run_again_and_the_model_is_told_to_verify() {
    let (data, workspace, mut child, base, client, id) = binary_running_commands("");
    let mut stream = crate::support::SseClient::open(&base, &format!("/api/sessions/{id}/events"), None, None);
    let command = json!({ "command": "echo started >> runs.log; sleep 3; echo finished >> runs.log" });
    let line = format!("/tool run_command {command}");
    assert_eq!(client.post(&format!("/api/sessions/{id}/messages"), json!({ "content": line })).status, 202);
    stream.collect_until(|e| event_type(e) == "tool.started");
    let log = workspace.path().join("runs.log");
    crate::support::wait_until("the command to start", || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("started"))
    });
    child.kill().unwrap();
    child.wait().unwrap();

    let server = TestServer::from_config(test_config(data.path(), workspace.path()));
    assert_eq!(server.get(&format!("/api/sessions/{id}")).json["session"]["status"], "interrupted");
    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    assert_eq!(server.post(&format!("/api/sessions/{id}/resume"), json!({})).status, 202);
    let events = stream.collect_until(is_run_end);
    assert!(!events.iter().any(|e| event_type(e) == "tool.started"), "not executed again");
    let messages: Vec<Value> =
        server.get(&format!("/api/sessions/{id}")).json["session"]["messages"].as_array().unwrap().clone();
    let result = messages.iter().find(|m| m["role"] == "tool").unwrap();
    assert!(result["content"].as_str().unwrap().contains("Verify the state of the workspace"));
    assert_eq!(result["meta"]["interrupted"], true);
    // Started exactly once, and it died with the server: it never finished.
    let runs = std::fs::read_to_string(&log).unwrap();
    assert_eq!(runs.matches("started").count(), 1, "{runs}");
    assert!(!runs.contains("finished"), "{runs}");
}

#[test]
fn an_approval_pending_at_kill_9_is_asked_again_on_resume_and_runs_once() {
    let data = tempfile::tempdir().unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let (mut child, base, _) = spawn_binary(data.path(), workspace.path(), "[builtin]\ndelay_ms = 1\n");
    let client = crate::support::Client { base: base.clone(), token: None };
    let id = client.post("/api/sessions", json!({})).json["session"]["id"].as_str().unwrap().to_string();
    let mut stream = crate::support::SseClient::open(&base, &format!("/api/sessions/{id}/events"), None, None);
    let line = format!("/tool run_command {}", json!({ "command": "echo ran >> approved.log" }));
    assert_eq!(client.post(&format!("/api/sessions/{id}/messages"), json!({ "content": line })).status, 202);
    let before = stream.collect_until(|e| event_type(e) == "approval.requested");
    let old_approval = before.last().unwrap()["event"]["approval"]["id"].as_str().unwrap().to_string();
    child.kill().unwrap();
    child.wait().unwrap();

    let server = TestServer::from_config(test_config(data.path(), workspace.path()));
    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    assert_eq!(server.post(&format!("/api/sessions/{id}/resume"), json!({})).status, 202);
    let asked = stream.collect_until(|e| event_type(e) == "approval.requested");
    let approval = asked.last().unwrap()["event"]["approval"].clone();
    assert_ne!(approval["id"], old_approval.as_str(), "a new request for the same call");
    assert_eq!(approval["toolName"], "run_command");
    server
        .post(&format!("/api/sessions/{id}/approvals/{old_approval}"), json!({ "approved": true }))
        .assert_error(404, "approval_not_found");
    let answer = server.post(
        &format!("/api/sessions/{id}/approvals/{}", approval["id"].as_str().unwrap()),
        json!({ "approved": true }),
    );
    assert_eq!(answer.status, 200);
    let events = stream.collect_until(is_run_end);
    assert_eq!(events.last().unwrap()["event"]["status"], "completed");
    assert_eq!(std::fs::read_to_string(workspace.path().join("approved.log")).unwrap(), "ran\n", "ran exactly once");
}

#[test]
fn a_graceful_shutdown_during_an_approval_leaves_a_resumable_session() {
    let mut server = TestServer::start();
    let id = server.create_session(json!({}));
    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    let line = format!("/tool write_file {}", json!({ "path": "later.txt", "content": "ok" }));
    server.post(&format!("/api/sessions/{id}/messages"), json!({ "content": line }));
    stream.collect_until(|e| event_type(e) == "approval.requested");
    server.restart(|_| {});
    assert_eq!(server.get(&format!("/api/sessions/{id}")).json["session"]["status"], "interrupted");
    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    assert_eq!(server.post(&format!("/api/sessions/{id}/resume"), json!({})).status, 202);
    let asked = stream.collect_until(|e| event_type(e) == "approval.requested");
    let approval_id = asked.last().unwrap()["event"]["approval"]["id"].as_str().unwrap().to_string();
    server.post(&format!("/api/sessions/{id}/approvals/{approval_id}"), json!({ "approved": true }));
    stream.collect_until(is_run_end);
    assert_eq!(std::fs::read_to_string(server.workspace.join("later.txt")).unwrap(), "ok");
}

#[test]
fn a_second_server_in_the_same_process_cannot_take_a_data_dir_in_use() {
    let server = TestServer::start();
    let config = crate::support::test_config(&server.data_dir, &server.workspace);
    let error = kestrel::Server::start(config).err().expect("the data dir is taken");
    let message = error.to_string();
    assert!(message.contains("in use by another Kestrel server"), "{message}");
    assert!(message.contains(&format!("pid {}", std::process::id())), "{message}");
}

#[test]
fn an_answer_cut_off_by_shutdown_is_stored_as_partial_and_resume_answers_again() {
    let mut server = TestServer::start_with(|config| config.builtin.delay_ms = 20);
    let id = server.create_session(json!({}));
    let words: Vec<String> = (1..=100).map(|i| format!("w{i}")).collect();
    let text = words.join(" ");
    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    assert_eq!(server.post(&format!("/api/sessions/{id}/messages"), json!({ "content": text })).status, 202);
    let deltas = std::cell::Cell::new(0);
    stream.collect_until(|event| {
        if event_type(event) == "message.delta" && event["event"]["channel"] == "text" {
            deltas.set(deltas.get() + 1);
        }
        deltas.get() >= 17
    });
    server.restart(|config| config.builtin.delay_ms = 0);

    let session = server.get(&format!("/api/sessions/{id}")).json["session"].clone();
    assert_eq!(session["status"], "interrupted");
    let cut = session["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(cut["role"], "assistant");
    assert_eq!(cut["meta"]["partial"], true, "{cut}");
    assert_eq!(cut["meta"]["interrupted"], true, "{cut}");
    assert!(cut["content"].as_str().unwrap().split(' ').count() < 100, "{cut}");

    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    assert_eq!(server.post(&format!("/api/sessions/{id}/resume"), json!({})).status, 202);
    let run = stream.collect_until(is_run_end);
    assert_eq!(run.last().unwrap()["event"]["status"], "completed");
    let session = server.get(&format!("/api/sessions/{id}")).json["session"].clone();
    let last = session["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["content"], format!("Echo: {text}"), "the whole answer, again");
    assert!(last["meta"].get("partial").is_none(), "{last}");
}

#[test]
fn an_answer_the_user_cancels_is_kept_as_partial_but_not_interrupted() {
    let server = TestServer::start_with(|config| config.builtin.delay_ms = 20);
    let id = server.create_session(json!({}));
    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    let long = "word ".repeat(100);
    assert_eq!(server.post(&format!("/api/sessions/{id}/messages"), json!({ "content": long.trim() })).status, 202);
    stream.collect_until(|event| event_type(event) == "message.delta" && event["event"]["channel"] == "text");
    assert_eq!(server.post(&format!("/api/sessions/{id}/cancel"), json!({})).json["cancelled"], true);
    stream.collect_until(is_run_end);
    let session = server.get(&format!("/api/sessions/{id}")).json["session"].clone();
    assert_eq!(session["status"], "cancelled");
    let cut = session["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(cut["meta"]["partial"], true);
    assert!(cut["meta"].get("interrupted").is_none(), "a user's cancel is not an interruption: {cut}");
    server.post(&format!("/api/sessions/{id}/resume"), json!({})).assert_error(409, "not_resumable");
}

/// Whether a process is gone (or a zombie waiting to be reaped).
fn dead(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())) {
        Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

#[test]
fn a_command_and_what_it_started_do_not_outlive_a_kill_9() {
    // Unsandboxed on purpose: this is the fallback's guarantee (the death signal, then the
    // marker's sweep at start), and the host must see the shell's own pids. A sandboxed
    // command's tree dies with the server at once (`sandbox.rs`).
    let (data, workspace, mut child, _, client, id) = binary_running_commands("sandbox = \"off\"");
    let command = "echo $$ > shell.pid; (sleep 30; echo late >> late.txt) & echo $! > background.pid; \
                   echo started > started.txt; sleep 30; echo late >> late.txt";
    let line = format!("/tool run_command {}", json!({ "command": command }));
    assert_eq!(client.post(&format!("/api/sessions/{id}/messages"), json!({ "content": line })).status, 202);
    let read = |name: &str| std::fs::read_to_string(workspace.path().join(name)).unwrap_or_default();
    crate::support::wait_until("the command to start", || read("started.txt").contains("started"));
    let (shell, background) = (read("shell.pid"), read("background.pid"));
    child.kill().unwrap();
    child.wait().unwrap();

    // The kernel kills the command's shell with the server...
    crate::support::wait_until("the shell to die with the server", || dead(&shell));
    // ...and the next start kills what the shell left behind.
    assert!(!dead(&background), "a grandchild is not covered by the death signal");
    let server = TestServer::from_config(test_config(data.path(), workspace.path()));
    crate::support::wait_until("the background process to be killed at start", || dead(&background));
    assert!(!workspace.path().join("late.txt").exists(), "nothing ran after the crash");
    assert_eq!(server.get(&format!("/api/sessions/{id}")).json["session"]["status"], "interrupted");
}

#[test]
fn a_clean_shutdown_kills_what_commands_left_running_in_the_background() {
    // Unsandboxed on purpose: in a sandbox (its own PID namespace) nothing a command starts
    // outlives it, so only an unsandboxed command can leave a process for the shutdown.
    let mut server = TestServer::start_with(|config| {
        config.agent.permissions.insert("run_command".into(), kestrel::engine::tools::Permission::Auto);
        config.agent.sandbox = kestrel::domain::SandboxMode::Off;
    });
    let id = server.create_session(json!({}));
    let command = "(sleep 30; echo late > late.txt) > /dev/null 2>&1 & echo $! > background.pid";
    let events = server.run_to_end(&id, &format!("/tool run_command {}", json!({ "command": command })));
    assert_eq!(event_type(events.last().unwrap()), "run.finished");
    let background = std::fs::read_to_string(server.workspace.join("background.pid")).unwrap();
    assert!(!dead(&background), "the command returned and left its background process running");
    server.stop();
    crate::support::wait_until("the background process to be killed", || dead(&background));
    assert!(!server.workspace.join("late.txt").exists());
}

#[test]
fn reconnects_on_both_sides_of_a_restart_get_every_event_but_deltas_exactly_once_in_order() {
    let mut server = TestServer::start();
    let id = server.create_session(json!({}));
    let path = format!("/api/sessions/{id}/events");
    let before = server.run_to_end(&id, "the first run, before the restart");
    let start = before[0]["seq"].as_u64().unwrap() - 1;

    // First reconnect, from before the first run: the client reads half and goes away.
    let mut first = crate::support::SseClient::open(&server.base, &path, None, Some(start));
    let replayed = first.drain_events();
    assert_eq!(replayed, before, "the ring has it all, deltas included");
    let seen = replayed[replayed.len() / 2]["seq"].as_u64().unwrap();
    first.disconnect();

    server.restart(|_| {});
    let after = server.run_to_end(&id, "the second run, after the restart");

    // Second reconnect, from the last id the client saw: the rest of the first run comes from
    // the log (no deltas: they were never stored), then the second run from the new ring.
    let mut second = crate::support::SseClient::open(&server.base, &path, None, Some(seen));
    let replayed = second.drain_events();
    let not_delta = |e: &&Value| event_type(e) != "message.delta";
    let expected: Vec<&Value> = before
        .iter()
        .filter(|e| e["seq"].as_u64().unwrap() > seen)
        .filter(not_delta)
        .chain(after.iter().filter(not_delta))
        .collect();
    let got: Vec<&Value> = replayed.iter().filter(not_delta).collect();
    assert_eq!(got, expected, "every event but deltas, once, in order, byte for byte");
    assert!(replayed.windows(2).all(|w| w[0]["seq"].as_u64() < w[1]["seq"].as_u64()));
}

/// 200,000 logged notices of the default tenant, written through the store's own path.
fn a_long_log(data: &std::path::Path) {
    use kestrel::domain::{Event, NoticeLevel};
    use kestrel::store::{LoggedEvent, WriteOp};
    let (store, writer) = crate::support::open_store(data);
    for chunk in 0..50 {
        let entries = (0..4_000)
            .map(|n| {
                let event =
                    Event::Notice { level: NoticeLevel::Info, message: format!("n{chunk}.{n}"), session_id: None };
                Some(LoggedEvent {
                    seq: 0,
                    tenant: Some("default".into()),
                    session_id: None,
                    actor: None,
                    kind: "notice".into(),
                    at: "2026-01-01T00:00:00.000Z".into(),
                    body: serde_json::to_string(&event).unwrap(),
                    form: kestrel::domain::STORED_FORM,
                })
            })
            .collect();
        store.write(vec![WriteOp::AppendLog { entries, floor: 0, keep: u64::MAX, live: Vec::new() }]).unwrap();
    }
    writer.shutdown();
}

/// A log far past a lowered capacity is trimmed while the server serves; killed with -9 in
/// the middle of it, the next start goes on from where the last step committed, the database
/// stays whole, and what is left are the newest events.
#[test]
fn a_log_trimmed_past_its_capacity_survives_kill_9_mid_trim() {
    let root = tempfile::tempdir().unwrap();
    let (data, workspace) = (root.path().join("data"), root.path().join("workspace"));
    std::fs::create_dir_all(&workspace).unwrap();
    a_long_log(&data);
    let mut db = crate::support::Db::open(&data);
    let mut span = || -> (i64, i64, i64) {
        let count = db.integer("SELECT count(*) FROM events", &[]);
        (count, db.integer("SELECT min(seq) FROM events", &[]), db.integer("SELECT max(seq) FROM events", &[]))
    };
    let config = "[server]\nevent_log_events = 1000\n";
    let (mut child, base, _) = spawn_binary(&data, &workspace, config);
    // A logged event sets how far the log is to be trimmed; the idle writer does the rest.
    let created = ureq::post(&format!("{base}/api/sessions")).send_json(json!({})).unwrap();
    assert_eq!(created.status(), 201);
    crate::support::wait_until("the trim under way", || span().0 < 200_000);
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let (left, _, _) = span();
    assert!(left > 0, "the log is not emptied");

    let (mut child, base, _) = spawn_binary(&data, &workspace, config);
    let created = ureq::post(&format!("{base}/api/sessions")).send_json(json!({})).unwrap();
    assert_eq!(created.status(), 201);
    // Capacity counts seqs (deltas take seqs too, and a start after a crash skips a run of
    // them), so the log is within it when its seqs span no more than it.
    crate::support::wait_until("the log within its capacity", || {
        let (_, first, last) = span();
        last - first < 1_010
    });
    let (count, first, last) = span();
    assert!((1..=1_010).contains(&count), "the newest are kept: {count} events, seqs {first}..={last}");
    assert!(crate::support::Db::open(&data).intact(), "the database checks out whole");
    assert_eq!(ureq::get(&format!("{base}/api/health")).call().unwrap().status(), 200);
    child.kill().unwrap();
    child.wait().unwrap();
}
