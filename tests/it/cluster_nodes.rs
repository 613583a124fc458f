//! Several node processes of the real binary on one real PostgreSQL (docs/cluster.md): a
//! node killed with `kill -9` mid-run or mid-approval, a node paused past its lease with
//! SIGSTOP, and idle leases given up so that the next node to be asked takes the session.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::pg_cluster;
use crate::support::{event_type, is_run_end, spawn_binary_with, wait_until, Client, SseClient};

const SECRET: &str = "cluster-secret-9c1e";
const TOKEN: &str = "node-test-token";
/// Short leases, so that a dead node's sessions are taken over within seconds.
const LEASE_MS: u64 = 1_500;

/// One node: the real binary with its own data dir, on the shared database and workspace.
struct NodeProcess {
    child: Child,
    base: String,
    /// Its admin API (BAE's `/admin/v1`).
    admin: String,
    data: tempfile::TempDir,
    /// What it was started with, to start it again.
    config: String,
    database: String,
    workspace: std::path::PathBuf,
    /// Environment variables it was started with, beside the database's.
    env: Vec<(String, String)>,
}

impl NodeProcess {
    fn spawn(database: &str, id: &str, workspace: &Path, extra: &str) -> NodeProcess {
        NodeProcess::spawn_with_env(database, id, workspace, extra, &[])
    }

    /// `spawn`, with environment variables set for it (`KESTREL_*` overrides).
    fn spawn_with_env(database: &str, id: &str, workspace: &Path, extra: &str, env: &[(&str, &str)]) -> NodeProcess {
        let data = tempfile::tempdir().unwrap();
        let config = format!(
            "[store]\nurl = \"{database}\"\n\
             [cluster]\nsecret = \"{SECRET}\"\nnode_id = \"{id}\"\nlease_ms = {LEASE_MS}\n\
             [[auth.tokens]]\ntenant = \"default\"\ntoken = \"{TOKEN}\"\nadmin = true\n\
             [builtin]\ndelay_ms = 1\n{extra}"
        );
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let (database, workspace) = (database.to_string(), workspace.to_path_buf());
        let (child, base, admin) = NodeProcess::start(&data, &config, &database, &workspace, &env);
        NodeProcess { child, base, admin, data, config, database, workspace, env }
    }

    /// The binary on `data`, with the cluster's database whatever store the rest of the
    /// run uses.
    fn start(
        data: &tempfile::TempDir,
        config: &str,
        database: &str,
        workspace: &Path,
        env: &[(String, String)],
    ) -> (Child, String, String) {
        let mut all = vec![("KESTREL_DATABASE_URL", database)];
        all.extend(env.iter().map(|(name, value)| (name.as_str(), value.as_str())));
        spawn_binary_with(data.path(), workspace, config, &all)
    }

    /// Stops it as an operator would (SIGTERM: a clean shutdown), then starts it again on the
    /// same data dir, as the same node.
    fn restart(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        self.child.wait().unwrap();
        let (child, base, admin) =
            NodeProcess::start(&self.data, &self.config, &self.database, &self.workspace, &self.env);
        (self.child, self.base, self.admin) = (child, base, admin);
    }

    fn client(&self) -> Client {
        Client { base: self.base.clone(), token: Some(TOKEN.to_string()) }
    }

    fn events(&self, session: &str) -> SseClient {
        SseClient::open(&self.base, &format!("/api/sessions/{session}/events"), Some(TOKEN), None)
    }

    fn kill_9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, signal).unwrap();
    }

    /// `node`'s last heartbeat, as this node lists it.
    fn heartbeat_of(&self, node: &str) -> Option<String> {
        let view = self.client().get("/api/cluster").json;
        let nodes = view["nodes"].as_array().cloned().unwrap_or_default();
        nodes.iter().find(|n| n["id"] == node).and_then(|n| n["heartbeatAt"].as_str().map(str::to_string))
    }

    /// Waits until `node` has written `count` more heartbeats (each renewal and sweep is one).
    fn wait_heartbeats(&self, node: &str, count: usize) {
        let mut last = self.heartbeat_of(node);
        for _ in 0..count {
            wait_until("the next heartbeat", || {
                let now = self.heartbeat_of(node);
                let newer = now.is_some() && now != last;
                if newer {
                    last = now;
                }
                newer
            });
        }
    }

    /// The live sessions each node holds, as this node lists them.
    fn holders(&self) -> Vec<(String, i64)> {
        let view = self.client().get("/api/cluster").json;
        let nodes = view["nodes"].as_array().cloned().unwrap_or_default();
        nodes.iter().map(|n| (n["id"].as_str().unwrap().to_string(), n["liveSessions"].as_i64().unwrap())).collect()
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn nodes(database: &str, workspace: &Path, count: usize, extra: &str) -> Vec<NodeProcess> {
    (1..=count).map(|n| NodeProcess::spawn(database, &format!("n{n}"), workspace, extra)).collect()
}

fn create_session(node: &NodeProcess) -> String {
    let created = node.client().post("/api/sessions", json!({ "model": "builtin/echo" }));
    assert_eq!(created.status, 201, "{}", created.text);
    created.json["session"]["id"].as_str().unwrap().to_string()
}

/// The session's status as `node` answers it, waiting out the 503s of a holder that died
/// and whose lease has not run out yet.
fn status_at(node: &NodeProcess, session: &str, wanted: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let read = node.client().get(&format!("/api/sessions/{session}"));
        if read.status == 200 && read.json["session"]["status"] == wanted {
            return read.json["session"].clone();
        }
        assert!(read.status == 200 || read.status == 503, "{} {}", read.status, read.text);
        assert!(Instant::now() < deadline, "session {session} never became {wanted}: {}", read.text);
        std::thread::yield_now();
    }
}

/// The session's status in the database, read there: a request at a node would be sent on
/// to a holder that is paused, and wait for it.
fn stored_status(database: &str, session: &str) -> String {
    let mut db = postgres::Client::connect(database, postgres::NoTls).unwrap();
    db.query_one("SELECT status FROM sessions WHERE id = $1", &[&session]).unwrap().get(0)
}

/// Two nodes running commands without asking, and a session at the first whose command
/// (`sleep_secs` long, writing `started` and `finished` to `runs.log`) has started.
fn command_started_at_first_node(database: &str, sleep_secs: u32) -> (tempfile::TempDir, Vec<NodeProcess>, String) {
    let workspace = tempfile::tempdir().unwrap();
    let extra = "[agent.permissions]\nrun_command = \"auto\"\n";
    let cluster = nodes(database, workspace.path(), 2, extra);
    let id = create_session(&cluster[0]);
    let mut stream = cluster[0].events(&id);
    let command = format!("echo started >> runs.log; sleep {sleep_secs}; echo finished >> runs.log");
    let line = format!("/tool run_command {}", json!({ "command": command }));
    let sent = cluster[0].client().post(&format!("/api/sessions/{id}/messages"), json!({ "content": line }));
    assert_eq!(sent.status, 202, "{}", sent.text);
    stream.collect_until(|e| event_type(e) == "tool.started");
    let log = workspace.path().join("runs.log");
    wait_until("the command to start", || std::fs::read_to_string(&log).is_ok_and(|l| l.contains("started")));
    (workspace, cluster, id)
}

#[test]
fn an_owner_killed_mid_approval_is_taken_over_and_the_approval_is_asked_again_at_another_node() {
    let Some(database) = pg_cluster::database() else { return };
    let workspace = tempfile::tempdir().unwrap();
    let mut cluster = nodes(&database.url, workspace.path(), 3, "");
    let id = create_session(&cluster[0]);
    let mut at_first = cluster[0].events(&id);
    let line = format!("/tool run_command {}", json!({ "command": "echo ran >> approved.log" }));
    let sent = cluster[0].client().post(&format!("/api/sessions/{id}/messages"), json!({ "content": line }));
    assert_eq!(sent.status, 202, "{}", sent.text);
    let asked = at_first.collect_until(|e| event_type(e) == "approval.requested");
    let old_approval = asked.last().unwrap()["event"]["approval"]["id"].as_str().unwrap().to_string();
    cluster[0].kill_9();

    // A surviving node's sweeper takes the session over once the lease runs out: the run
    // that was waiting is interrupted, with no operation needed.
    status_at(&cluster[1], &id, "interrupted");
    let mut at_third = cluster[2].events(&id);
    let resumed = cluster[1].client().post(&format!("/api/sessions/{id}/resume"), json!({}));
    assert_eq!(resumed.status, 202, "{}", resumed.text);
    let asked = at_third.collect_until(|e| event_type(e) == "approval.requested");
    let approval = asked.last().unwrap()["event"]["approval"].clone();
    assert_ne!(approval["id"], old_approval.as_str(), "a new request for the same call");
    cluster[2]
        .client()
        .post(&format!("/api/sessions/{id}/approvals/{old_approval}"), json!({ "approved": true }))
        .assert_error(404, "approval_not_found");
    let answered = cluster[1].client().post(
        &format!("/api/sessions/{id}/approvals/{}", approval["id"].as_str().unwrap()),
        json!({ "approved": true }),
    );
    assert_eq!(answered.status, 200, "approved at another node than the one that asked: {}", answered.text);
    let events = at_third.collect_until(is_run_end);
    assert_eq!(events.last().unwrap()["event"]["status"], "completed", "{events:?}");
    let log = std::fs::read_to_string(workspace.path().join("approved.log")).unwrap();
    assert_eq!(log, "ran\n", "the approved command ran exactly once");
}

#[test]
fn an_owner_killed_mid_command_is_taken_over_and_resume_runs_no_tool_twice() {
    let Some(database) = pg_cluster::database() else { return };
    let (workspace, mut cluster, id) = command_started_at_first_node(&database.url, 30);
    let log = workspace.path().join("runs.log");
    cluster[0].kill_9();

    status_at(&cluster[1], &id, "interrupted");
    let mut stream = cluster[1].events(&id);
    let resumed = cluster[1].client().post(&format!("/api/sessions/{id}/resume"), json!({}));
    assert_eq!(resumed.status, 202, "{}", resumed.text);
    let events = stream.collect_until(is_run_end);
    assert!(!events.iter().any(|e| event_type(e) == "tool.started"), "not run again: {events:?}");
    let session = cluster[1].client().get(&format!("/api/sessions/{id}")).json["session"].clone();
    let messages = session["messages"].as_array().unwrap();
    let result = messages.iter().find(|m| m["role"] == "tool").unwrap();
    assert_eq!(result["meta"]["interrupted"], true, "{result}");
    let runs = std::fs::read_to_string(&log).unwrap();
    assert_eq!(runs.matches("started").count(), 1, "{runs}");
}

#[test]
fn idle_leases_are_given_up_and_the_next_node_asked_takes_the_session() {
    let Some(database) = pg_cluster::database() else { return };
    let workspace = tempfile::tempdir().unwrap();
    // Pings often, so that a stream whose client left is noticed soon.
    let cluster = nodes(&database.url, workspace.path(), 2, "[server]\nsse_ping_interval_ms = 200\n");
    let id = create_session(&cluster[0]);
    let sent = cluster[0].client().post(&format!("/api/sessions/{id}/messages"), json!({ "content": "at n1" }));
    assert_eq!(sent.status, 202, "{}", sent.text);
    status_at(&cluster[0], &id, "idle");
    // Two heartbeats after its turn the session is idle at n1, which gives its lease up.
    wait_until("n1 to give the idle session up", || cluster[1].holders().iter().all(|(_, live)| *live == 0));
    let sent = cluster[1].client().post(&format!("/api/sessions/{id}/messages"), json!({ "content": "at n2" }));
    assert_eq!(sent.status, 202, "{}", sent.text);
    assert_eq!(cluster[0].holders(), vec![("n1".to_string(), 0), ("n2".to_string(), 1)], "n2 took it");
    wait_until("the turn at n2 to end", || {
        cluster[0].client().get(&format!("/api/sessions/{id}")).json["session"]["messageCount"] == 4
    });
    // A session followed by a stream stays where its stream is.
    let mut stream = cluster[1].events(&id);
    let sent = cluster[1].client().post(&format!("/api/sessions/{id}/messages"), json!({ "content": "followed" }));
    assert_eq!(sent.status, 202, "{}", sent.text);
    stream.collect_until(is_run_end);
    cluster[0].wait_heartbeats("n2", 3);
    assert_eq!(cluster[0].holders(), vec![("n1".to_string(), 0), ("n2".to_string(), 1)]);
    stream.disconnect();
    wait_until("n2 to give it up once nobody follows it", || cluster[0].holders().iter().all(|(_, live)| *live == 0));
}

#[test]
fn a_node_paused_past_its_lease_is_fenced_and_its_late_writes_are_refused() {
    let Some(database) = pg_cluster::database() else { return };
    // A command that outlives the pause: the run at n1 would record its result after it.
    let (workspace, cluster, id) = command_started_at_first_node(&database.url, 4);
    let log = workspace.path().join("runs.log");
    cluster[0].signal(nix::sys::signal::Signal::SIGSTOP);

    // n2 takes the session over while n1 sleeps: the turn is interrupted.
    wait_until("n2 to take the session over", || stored_status(&database.url, &id) == "interrupted");
    let taken = status_at(&cluster[1], &id, "interrupted");
    let count = taken["messageCount"].as_u64().unwrap();
    wait_until("the command to finish", || std::fs::read_to_string(&log).is_ok_and(|l| l.contains("finished")));
    cluster[0].signal(nix::sys::signal::Signal::SIGCONT);

    // n1 wakes, its command done, and tries to record the result: refused, since the lease
    // is gone. Its next heartbeats find the lease lost and stop the turn.
    cluster[1].wait_heartbeats("n1", 2);
    let read = cluster[1].client().get(&format!("/api/sessions/{id}"));
    assert_eq!(read.json["session"]["status"], "interrupted", "{}", read.text);
    assert_eq!(read.json["session"]["messageCount"].as_u64(), Some(count), "n1's late result was refused");
    // The new owner resumes it; the command that finished at n1 is not run again.
    let mut at_second = cluster[1].events(&id);
    let resumed = cluster[1].client().post(&format!("/api/sessions/{id}/resume"), json!({}));
    assert_eq!(resumed.status, 202, "{}", resumed.text);
    let events = at_second.collect_until(is_run_end);
    assert!(!events.iter().any(|e| event_type(e) == "tool.started"), "not run again: {events:?}");
    let runs = std::fs::read_to_string(&log).unwrap();
    assert_eq!(runs.matches("started").count(), 1, "{runs}");
}

#[test]
fn an_owner_killed_mid_bae_turn_leaves_the_session_usable_at_another_node_with_keys_known_there() {
    use crate::bae::support::{send, Harness};
    use crate::fake_provider::{anthropic, FakeProvider, Reply, Step};
    let Some(database) = pg_cluster::database() else { return };
    let fake = FakeProvider::start();
    let provider = format!(
        "[providers.fake]\nwire = \"anthropic\"\nbase_url = \"{}\"\nretry_base_delay_ms = 1\n\
         [[providers.fake.models]]\nname = \"claude-x\"\n",
        fake.base_url
    );
    let workspace = tempfile::tempdir().unwrap();
    let mut cluster = nodes(&database.url, workspace.path(), 2, &provider);
    // The admin key the first node minted, used at the second: keys are hashed under one
    // secret for the whole cluster.
    let admin_key = std::fs::read_to_string(cluster[0].data.path().join("admin-key")).unwrap();
    let admin = |body: Value, path: &str| {
        let response = send(&cluster[1].admin, "POST", path, Some(admin_key.trim()), Some(body));
        assert_eq!(response.status, 201, "{}", response.text);
        response.json
    };
    let profile =
        admin(json!({ "name": "main", "primary_provider": "fake", "allowed_tools": [] }), "/admin/v1/profiles");
    let key = admin(json!({ "name": "c", "profile_id": profile["id"] }), "/admin/v1/keys");
    let key = key["key"].as_str().unwrap();

    // Opened at the first node, whose turn then waits on the model.
    let mut client = Harness::open(&cluster[0].base, key, &[]);
    fake.script([Reply { status: 200, headers: Vec::new(), steps: vec![Step::Stall] }]);
    let cut = client.start("session.sendMessage", json!({ "message": { "role": "user", "content": "first" } }));
    fake.wait_for_requests(1);
    cluster[0].kill_9();
    let frames = cut.until_terminal();
    assert!(!frames.iter().any(|f| f["result"]["message"].is_object()), "the turn did not answer: {frames:?}");

    // The second node takes the session over; the client registers again there (drivers are
    // process memory, as after a restart) and the session goes on.
    wait_until("the session to leave the dead node", || {
        let mut db = postgres::Client::connect(&database.url, postgres::NoTls).unwrap();
        let holder = db.query_opt("SELECT node_id FROM session_leases WHERE session_id = $1", &[&client.session_id]);
        holder.unwrap().is_none_or(|row| row.get::<_, String>(0) != "n1")
    });
    client.base = cluster[1].base.clone();
    let registered = client.call("session.registerDriver", json!({}));
    assert_eq!(registered.last().unwrap()["result"]["registered"], true, "{registered:?}");
    fake.script([anthropic::text_answer("after the failover")]);
    let frames = client.send_message(json!("second"));
    let answer = &frames.last().unwrap()["result"]["message"]["content"][0]["text"];
    assert_eq!(answer, "after the failover", "{frames:?}");
    // The second turn is recorded whole. The cut turn was never answered: its message and
    // provider request are stored in one commit that overlaps the provider call (as on one
    // node), so the kill came before it (nothing of the turn) or after it (both), and no
    // answer of it was ever recorded.
    let kinds: Vec<Value> = client.events().iter().map(|e| e["event_type"].clone()).collect();
    let turn = ["client.message.send", "provider.request", "provider.response", "server.message.send"];
    assert_eq!(kinds[kinds.len() - 4..], turn.map(Value::from), "{kinds:?}");
    let cut: Vec<&Value> =
        kinds[..kinds.len() - 4].iter().filter(|k| *k != "session.open" && *k != "session.driver.register").collect();
    assert!(cut.is_empty() || cut == [&json!("client.message.send"), &json!("provider.request")], "{kinds:?}");
}

/// The global stream at `node`, from the start or after `last_event_id`.
fn global_stream(node: &NodeProcess, last_event_id: Option<u64>) -> SseClient {
    SseClient::open(&node.base, "/api/events", Some(TOKEN), last_event_id)
}

#[test]
fn the_global_stream_at_any_node_carries_every_nodes_events_in_seq_order_and_replays_anywhere() {
    let Some(database) = pg_cluster::database() else { return };
    let workspace = tempfile::tempdir().unwrap();
    let cluster = nodes(&database.url, workspace.path(), 3, "");
    let mut at_third = global_stream(&cluster[2], None);
    // A session runs at each of the first two nodes, at once. The second echoes one word of
    // 12,000 characters: a delta too large for one notification, sent in parts.
    let ids: Vec<String> = cluster[..2].iter().map(create_session).collect();
    let long_word = "ü".repeat(6_000);
    for ((node, id), content) in cluster.iter().zip(&ids).zip(["hello", long_word.as_str()]) {
        let sent = node.client().post(&format!("/api/sessions/{id}/messages"), json!({ "content": content }));
        assert_eq!(sent.status, 202, "{}", sent.text);
    }
    let mut seen: Vec<(u64, Value)> = Vec::new();
    let mut finished = 0;
    while finished < 2 {
        let (seq, event) = at_third.next_event(Duration::from_secs(10)).expect("the third node streams both runs");
        finished += usize::from(event_type(&event) == "run.finished");
        seen.push((seq, event));
    }
    assert!(seen.windows(2).all(|pair| pair[0].0 < pair[1].0), "seqs rise at the third node");
    for id in &ids {
        let of_session: Vec<&str> =
            seen.iter().filter(|(_, e)| e["event"]["sessionId"] == id.as_str()).map(|(_, e)| event_type(e)).collect();
        // Deltas too, streamed live by the node that ran the turn.
        for kind in ["session.created", "run.started", "message.delta", "message.completed", "run.finished"] {
            assert!(of_session.contains(&kind), "{kind} of {id} at the third node: {of_session:?}");
        }
    }
    let long_delta = format!(" {long_word}");
    assert!(
        seen.iter()
            .any(|(_, e)| e["event"]["sessionId"] == ids[1].as_str() && e["event"]["delta"] == long_delta.as_str()),
        "the large delta arrived whole at the third node"
    );
    // Reconnecting at another node after any event replays every logged event after it, in
    // the same order, with no gap and no duplicate (and that node's own deltas from its
    // memory; another node's deltas are not logged).
    let (cut, _) = seen[seen.len() / 3];
    let logged = |events: &[(u64, Value)]| -> Vec<u64> {
        events.iter().filter(|(seq, e)| *seq > cut && event_type(e) != "message.delta").map(|(seq, _)| *seq).collect()
    };
    let expected = logged(&seen);
    let mut at_second = global_stream(&cluster[1], Some(cut));
    let mut replayed: Vec<(u64, Value)> = Vec::new();
    while replayed.last().map(|(seq, _)| *seq) != expected.last().copied() {
        replayed.push(at_second.next_event(Duration::from_secs(10)).expect("the replay"));
    }
    assert!(replayed.windows(2).all(|pair| pair[0].0 < pair[1].0), "seqs rise in the replay");
    assert_eq!(logged(&replayed), expected);
}

/// Three nodes; a session the first holds (its stream claimed it) after a turn there, and the
/// session's stream at the second node, relayed from the first.
fn relayed_at_second(database: &str, extra: &str) -> (tempfile::TempDir, Vec<NodeProcess>, String, SseClient) {
    let workspace = tempfile::tempdir().unwrap();
    let cluster = nodes(database, workspace.path(), 3, extra);
    let id = create_session(&cluster[0]);
    let mut at_first = cluster[0].events(&id);
    let sent = cluster[0].client().post(&format!("/api/sessions/{id}/messages"), json!({ "content": "one" }));
    assert_eq!(sent.status, 202, "{}", sent.text);
    at_first.collect_until(is_run_end);
    let at_second = cluster[1].events(&id);
    (workspace, cluster, id, at_second)
}

/// What the user said in a session, as a read of it answers.
fn said(read: &Value) -> Vec<&str> {
    let messages = read["session"]["messages"].as_array().unwrap();
    messages.iter().filter(|m| m["role"] == "user").filter_map(|m| m["content"].as_str()).collect()
}

/// Sends a message to `session` at `node` until it is accepted (202), through the retryable
/// 503s (each with `Retry-After`) of a holder whose lease has not run out yet or a writer
/// connecting again; its run id.
fn message_when_served(node: &NodeProcess, session: &str, content: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let sent = node.client().post(&format!("/api/sessions/{session}/messages"), json!({ "content": content }));
        match sent.status {
            202 => return sent.json["runId"].as_str().unwrap().to_string(),
            503 => assert!(sent.header("Retry-After").is_some(), "{}", sent.text),
            other => panic!("{other}: {}", sent.text),
        }
        assert!(Instant::now() < deadline, "the message was never served");
        std::thread::yield_now();
    }
}

#[test]
fn a_stream_relayed_from_a_holder_that_dies_goes_on_from_the_next_holder_losing_nothing() {
    let Some(database) = pg_cluster::database() else { return };
    let (_workspace, mut cluster, id, mut at_second) = relayed_at_second(&database.url, "");
    // Then the first node dies.
    cluster[0].kill_9();
    // A message at the third node: refused as retryable until the dead node's lease runs out.
    let run = message_when_served(&cluster[2], &id, "two");
    // The stream at the second node went on from the new holder.
    let events = at_second.collect_until(|e| is_run_end(e) && e["event"]["runId"] == run.as_str());
    assert_eq!(events.last().unwrap()["event"]["type"], "run.finished", "{events:?}");
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|pair| pair[0] < pair[1]), "seqs rise across the change of holder: {seqs:?}");
    // Every logged event of the session after the stream opened reached it: a replay from
    // the log at the third node has no other.
    let first = seqs[0];
    let mut replay = SseClient::open(&cluster[2].base, &format!("/api/sessions/{id}/events"), Some(TOKEN), Some(first));
    let logged = |events: &[Value]| -> Vec<u64> {
        let logged = events.iter().filter(|e| event_type(e) != "message.delta" && e["seq"].as_u64() > Some(first));
        logged.map(|e| e["seq"].as_u64().unwrap()).collect()
    };
    let replayed = replay.collect_until(|e| is_run_end(e) && e["event"]["runId"] == run.as_str());
    assert_eq!(logged(&events), logged(&replayed));
}

#[test]
fn a_stream_relayed_from_a_paused_holder_goes_on_from_the_next_holder_after_a_lease_of_silence() {
    let Some(database) = pg_cluster::database() else { return };
    let (_workspace, cluster, id, mut at_second) = relayed_at_second(&database.url, "");
    // Then the first node is paused, its sockets open.
    cluster[0].signal(nix::sys::signal::Signal::SIGSTOP);
    // Its lease runs out and another node holds the session (the relay's reopen or a sweep
    // claims it): a message at the third node is then served by that holder.
    wait_until("the paused node's session to be taken over", || {
        cluster[2].holders().iter().any(|(node, live)| node != "n1" && *live == 1)
    });
    let sent = cluster[2].client().post(&format!("/api/sessions/{id}/messages"), json!({ "content": "two" }));
    assert_eq!(sent.status, 202, "{}", sent.text);
    let run = sent.json["runId"].as_str().unwrap().to_string();
    // The relay stopped waiting on the silent holder after a lease of silence and went on
    // from the new one: the run reaches the second node's stream (within `WAIT`, where the
    // paused holder's stream would have kept it for the 600 s a forwarded answer may take).
    let events = at_second.collect_until(|e| is_run_end(e) && e["event"]["runId"] == run.as_str());
    assert_eq!(events.last().unwrap()["event"]["type"], "run.finished", "{events:?}");
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|pair| pair[0] < pair[1]), "no event twice, none out of order: {seqs:?}");
    // The paused node wakes to a lost lease (and a database connection cut while it slept
    // in a transaction: a retryable 503 until its writer has connected again); a message
    // sent there is served by the holder, and the stream goes on.
    cluster[0].signal(nix::sys::signal::Signal::SIGCONT);
    let run = message_when_served(&cluster[0], &id, "three");
    let after = at_second.collect_until(|e| is_run_end(e) && e["event"]["runId"] == run.as_str());
    assert_eq!(after.last().unwrap()["event"]["type"], "run.finished", "{after:?}");
    assert!(after[0]["seq"].as_u64() > seqs.last().copied(), "the stream goes on after what it passed on");
}

/// The events of `stream` after the first that says the session was taken over (its turn
/// stored `interrupted` by its next holder), up to the end of run `until`.
fn after_the_take_over(events: &[Value]) -> &[Value] {
    let taken = events
        .iter()
        .position(|e| event_type(e) == "session.updated" && e["event"]["session"]["status"] == "interrupted");
    &events[taken.map_or(events.len(), |at| at + 1)..]
}

/// Collects `stream`'s events until run `run` ends there, waiting at most `within` for it.
fn until_run_ends(stream: &mut SseClient, run: &str, within: Duration) -> Vec<Value> {
    let deadline = Instant::now() + within;
    let mut events = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Some((_, event)) = stream.next_event(left) else {
            panic!("run {run} did not end on the stream within {within:?}; it had {events:#?}")
        };
        let ended = is_run_end(&event) && event["event"]["runId"] == run;
        events.push(event);
        if ended {
            return events;
        }
    }
}

#[test]
fn a_holder_paused_past_its_lease_sends_nothing_more_and_a_third_nodes_stream_moves_on_within_a_lease() {
    let Some(database) = pg_cluster::database() else { return };
    let workspace = tempfile::tempdir().unwrap();
    // The SSE ping interval is the default (15 s): a relay that waited three of them would
    // keep the client on the silent holder for 45 s. The echo streams a word each 40 ms, so
    // the first node's turn is still streaming when it wakes.
    let slow = [("KESTREL_BUILTIN_DELAY_MS", "40")];
    let cluster: Vec<NodeProcess> = (1..=3)
        .map(|n| NodeProcess::spawn_with_env(&database.url, &format!("n{n}"), workspace.path(), "", &slow))
        .collect();
    let id = create_session(&cluster[0]);
    // The first node holds the session (its stream claimed it); the client streams at the
    // other two are relayed from it.
    let _at_first = cluster[0].events(&id);
    let (mut at_second, mut at_third) = (cluster[1].events(&id), cluster[2].events(&id));
    let long = vec!["word"; 2_000].join(" ");
    let sent = cluster[0].client().post(&format!("/api/sessions/{id}/messages"), json!({ "content": long }));
    assert_eq!(sent.status, 202, "{}", sent.text);
    let old_run = sent.json["runId"].as_str().unwrap().to_string();
    let texts = |e: &Value| event_type(e) == "message.delta" && e["event"]["channel"] == "text";
    let streaming = at_third.collect_until(texts);
    let old_message = streaming.last().unwrap()["event"]["messageId"].as_str().unwrap().to_string();
    at_second.collect_until(texts);

    // The holder is paused mid-answer, its sockets open; another node takes the session over.
    cluster[0].signal(nix::sys::signal::Signal::SIGSTOP);
    wait_until("the paused node's session to be taken over", || stored_status(&database.url, &id) == "interrupted");
    // The new holder's run reaches the third node's stream within a lease and 5 s: its relay
    // gave up on the silent holder after a lease period and went on from the new one.
    let run = message_when_served(&cluster[1], &id, "two");
    let within = Duration::from_millis(LEASE_MS) + Duration::from_secs(5);
    let mut third = until_run_ends(&mut at_third, &run, within);
    let mut second = until_run_ends(&mut at_second, &run, within);
    for events in [&third, &second] {
        assert_eq!(event_type(events.last().unwrap()), "run.finished", "{events:#?}");
    }

    // The paused holder wakes with its turn mid-answer and a run it still thinks it has, and
    // finds at its next heartbeat that it lost the lease. Nothing it does meanwhile reaches
    // a client: after the take-over, no frame of its run and no delta of its message at
    // either node, up to the end of a run after its wake.
    cluster[0].signal(nix::sys::signal::Signal::SIGCONT);
    cluster[1].wait_heartbeats("n1", 3);
    let last = message_when_served(&cluster[2], &id, "three");
    third.extend(until_run_ends(&mut at_third, &last, within));
    second.extend(until_run_ends(&mut at_second, &last, within));
    for (node, events) in [("n3", &third), ("n2", &second)] {
        let after = after_the_take_over(events);
        assert!(!after.is_empty(), "the take-over reached the stream at {node}: {events:#?}");
        let stale: Vec<&Value> = after
            .iter()
            .filter(|e| {
                let event = &e["event"];
                event["runId"] == old_run.as_str()
                    || event["messageId"] == old_message.as_str()
                    || event["message"]["id"] == old_message.as_str()
            })
            .collect();
        assert!(stale.is_empty(), "the paused holder's frames reached the stream at {node}: {stale:#?}");
    }
}

#[test]
fn a_request_forwarded_to_a_paused_holder_is_a_retryable_503_once_its_lease_runs_out_and_kept_once() {
    let Some(database) = pg_cluster::database() else { return };
    let workspace = tempfile::tempdir().unwrap();
    let cluster = nodes(&database.url, workspace.path(), 2, "");
    let id = create_session(&cluster[0]);
    // The first node holds the session while its stream follows it; then it is paused, its
    // sockets open, and a message sent at the second node is forwarded to it.
    let _following = cluster[0].events(&id);
    // A read of the session at the same time is forwarded there too.
    cluster[0].signal(nix::sys::signal::Signal::SIGSTOP);
    let reader = {
        let (client, path) = (cluster[1].client(), format!("/api/sessions/{id}"));
        std::thread::spawn(move || client.get(&path))
    };
    let sent = cluster[1].client().post(&format!("/api/sessions/{id}/messages"), json!({ "content": "two" }));
    // Neither is held until the paused node wakes: once its lease ran out, a retryable 503.
    for answer in [sent, reader.join().unwrap()] {
        assert_eq!(answer.status, 503, "{}", answer.text);
        assert!(answer.header("Retry-After").is_some(), "{}", answer.text);
    }
    // Sent again, it is served by the node that takes the session over.
    let run = message_when_served(&cluster[1], &id, "two");
    let mut replay = SseClient::open(&cluster[1].base, &format!("/api/sessions/{id}/events"), Some(TOKEN), Some(0));
    replay.collect_until(|e| is_run_end(e) && e["event"]["runId"] == run.as_str());
    // The paused node wakes with the first message still in its socket: whatever it does
    // with it now is refused, since its lease is gone. It is stored once.
    cluster[0].signal(nix::sys::signal::Signal::SIGCONT);
    cluster[1].wait_heartbeats("n1", 2);
    let read = cluster[1].client().get(&format!("/api/sessions/{id}"));
    assert_eq!(said(&read.json), ["two"], "{}", read.text);
}

/// Per-request node choice, as a round-robin load balancer makes it: each request goes to the
/// next node, and a node that does not answer (being restarted) is passed over for the next,
/// as a balancer's passive health check does.
struct RoundRobin {
    bases: std::sync::Arc<std::sync::RwLock<Vec<String>>>,
    next: std::sync::atomic::AtomicUsize,
}

/// An answer: status, body, and whether it says to retry (`Retry-After`).
struct Answered {
    status: u16,
    json: Value,
    retry_after: bool,
}

impl RoundRobin {
    fn new(cluster: &[NodeProcess]) -> RoundRobin {
        let bases = cluster.iter().map(|node| node.base.clone()).collect();
        RoundRobin { bases: std::sync::Arc::new(std::sync::RwLock::new(bases)), next: Default::default() }
    }

    fn next_base(&self) -> String {
        let bases = self.bases.read().unwrap();
        bases[self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % bases.len()].clone()
    }

    fn send(&self, method: &str, path: &str, body: Option<Value>, key: Option<&str>) -> Answered {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let base = self.next_base();
            let mut request = ureq::request(method, &format!("{base}{path}"))
                .timeout(Duration::from_secs(20))
                .set("Authorization", &format!("Bearer {TOKEN}"));
            if let Some(key) = key {
                request = request.set("Idempotency-Key", key);
            }
            let sent = match &body {
                Some(body) => request.send_json(body.clone()),
                None => request.call(),
            };
            match sent {
                Ok(answer) | Err(ureq::Error::Status(_, answer)) => {
                    let (status, retry_after) = (answer.status(), answer.header("Retry-After").is_some());
                    let json = answer.into_json().unwrap_or(Value::Null);
                    return Answered { status, json, retry_after };
                }
                Err(ureq::Error::Transport(_)) => {
                    assert!(Instant::now() < deadline, "no node answered {method} {path}");
                }
            }
        }
    }

    /// `send`, again while the answer is a retryable 503 (counted in `retried`).
    fn send_retrying(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        key: Option<&str>,
        retried: &Counter,
    ) -> Answered {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let answer = self.send(method, path, body.clone(), key);
            if answer.status != 503 {
                return answer;
            }
            assert!(answer.retry_after, "a 503 says when to retry: {}", answer.json);
            retried.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            assert!(Instant::now() < deadline, "{method} {path} stayed unavailable");
            std::thread::yield_now();
        }
    }
}

type Counter = std::sync::atomic::AtomicUsize;

#[test]
fn three_nodes_behind_round_robin_serve_the_walkthrough() {
    let Some(database) = pg_cluster::database() else { return };
    let workspace = tempfile::tempdir().unwrap();
    let cluster = nodes(&database.url, workspace.path(), 3, "");
    let balancer = RoundRobin::new(&cluster);
    let retried = Counter::default();
    let created =
        balancer.send_retrying("POST", "/api/sessions", Some(json!({ "title": "walkthrough" })), None, &retried);
    assert_eq!(created.status, 201, "{}", created.json);
    let id = created.json["session"]["id"].as_str().unwrap().to_string();
    let path = format!("/api/sessions/{id}/events");
    let mut stream = SseClient::open(&balancer.next_base(), &path, Some(TOKEN), None);
    let body = json!({ "content": "hello walkthrough" });
    let sent = balancer.send_retrying("POST", &format!("/api/sessions/{id}/messages"), Some(body), None, &retried);
    assert_eq!(sent.status, 202, "{}", sent.json);
    let events = stream.collect_until(is_run_end);
    assert!(events.iter().any(|e| e["event"]["delta"] == " walkthrough"), "a streamed delta: {events:?}");
    assert_eq!(event_type(events.last().unwrap()), "run.finished");
    let first = events[0]["seq"].as_u64().unwrap();
    let mut replay = SseClient::open(&balancer.next_base(), &path, Some(TOKEN), Some(first));
    let replayed = replay.collect_until(is_run_end);
    let after = |events: &[Value]| -> Vec<u64> {
        events.iter().filter_map(|e| e["seq"].as_u64()).filter(|seq| *seq > first).collect()
    };
    assert_eq!(after(&replayed), after(&events), "the replay at another node");
    for _ in 0..3 {
        let read = balancer.send("GET", &format!("/api/sessions/{id}"), None, None);
        assert_eq!(read.json["session"]["messages"][1]["content"], "Echo: hello walkthrough", "{}", read.json);
    }
    assert_eq!(retried.load(std::sync::atomic::Ordering::Relaxed), 0, "nothing to retry with every node up");
}

/// One client of the rolling restart: its own session, a message at a time (each with an
/// Idempotency-Key, so a retry never sends it twice), each turn waited for and resumed if a
/// node's shutdown interrupted it. What it was told was accepted, in order.
fn keep_talking(
    balancer: &RoundRobin,
    stop: &std::sync::atomic::AtomicBool,
    retried: &Counter,
    done: &Counter,
) -> (String, Vec<String>) {
    let created = balancer.send_retrying(
        "POST",
        "/api/sessions",
        Some(json!({})),
        Some(&uuid::Uuid::new_v4().to_string()),
        retried,
    );
    assert_eq!(created.status, 201, "{}", created.json);
    let id = created.json["session"]["id"].as_str().unwrap().to_string();
    let mut accepted = Vec::new();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let content = format!("message {}", accepted.len());
        let key = uuid::Uuid::new_v4().to_string();
        let path = format!("/api/sessions/{id}/messages");
        let body = json!({ "content": content.clone() });
        let sent = balancer.send_retrying("POST", &path, Some(body), Some(&key), retried);
        assert_eq!(sent.status, 202, "{}", sent.json);
        accepted.push(content.clone());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let read = balancer.send_retrying("GET", &format!("/api/sessions/{id}"), None, None, retried);
            match read.json["session"]["status"].as_str() {
                Some("idle") => break,
                Some("interrupted") => {
                    let resumed = balancer.send_retrying(
                        "POST",
                        &format!("/api/sessions/{id}/resume"),
                        Some(json!({})),
                        None,
                        retried,
                    );
                    assert!(matches!(resumed.status, 202 | 409), "{} {}", resumed.status, resumed.json);
                }
                Some("running") => {}
                other => panic!("session {id} is {other:?}: {}", read.json),
            }
            assert!(Instant::now() < deadline, "the turn of {content} never ended");
            std::thread::yield_now();
        }
        done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    (id, accepted)
}

#[test]
fn a_rolling_restart_of_every_node_under_load_fails_no_request_and_loses_nothing() {
    let Some(database) = pg_cluster::database() else { return };
    let workspace = tempfile::tempdir().unwrap();
    let mut cluster = nodes(&database.url, workspace.path(), 3, "");
    let balancer = std::sync::Arc::new(RoundRobin::new(&cluster));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (retried, done) = (std::sync::Arc::new(Counter::default()), std::sync::Arc::new(Counter::default()));
    let clients: Vec<_> = (0..3)
        .map(|_| {
            let (balancer, stop, retried, done) = (balancer.clone(), stop.clone(), retried.clone(), done.clone());
            std::thread::spawn(move || keep_talking(&balancer, &stop, &retried, &done))
        })
        .collect();
    let progressed = |at_least: usize| {
        wait_until("the clients to get turns done", || done.load(std::sync::atomic::Ordering::Relaxed) >= at_least)
    };
    progressed(6);
    for (at, node) in cluster.iter_mut().enumerate() {
        node.restart();
        balancer.bases.write().unwrap()[at] = node.base.clone();
        let now = done.load(std::sync::atomic::Ordering::Relaxed);
        progressed(now + 6);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for client in clients {
        let (id, accepted) = client.join().expect("a client met an answer that was neither success nor retryable");
        let read = balancer.send("GET", &format!("/api/sessions/{id}"), None, None);
        assert_eq!(said(&read.json), accepted, "every accepted message once, in order");
    }
    println!("retryable 503s during the rolling restart: {}", retried.load(std::sync::atomic::Ordering::Relaxed));
}
