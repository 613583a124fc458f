//! Several nodes on one PostgreSQL database (docs/cluster.md): membership through the
//! database, the admin view of it, and what a cluster needs to start.

use serde_json::Value;

use crate::pg_cluster;
use crate::support::{wait_until, TestServer};

const SECRET: &str = "cluster-secret-7f3a";
const ADMIN: &str = "admin-token";
pub(crate) const USER: &str = "user-token";
const OTHER_TENANT: &str = "other-tenant-token";

/// A node of the cluster on `url`, with an admin token and a plain one.
fn node(url: &str, id: &str) -> TestServer {
    node_leasing(url, id, 900)
}

/// A node whose leases last `lease_ms`.
pub(crate) fn node_leasing(url: &str, id: &str, lease_ms: u64) -> TestServer {
    TestServer::start_with(|config| {
        config.store.url = Some(url.to_string());
        config.cluster.secret = Some(SECRET.into());
        config.cluster.node_id = Some(id.into());
        config.cluster.lease_ms = lease_ms;
        let mut admin = kestrel::config::TokenConfig::new("default", ADMIN);
        admin.admin = true;
        config.auth.tokens.push(admin);
        config.auth.tokens.push(kestrel::config::TokenConfig::new("default", USER));
        config.auth.tokens.push(kestrel::config::TokenConfig::new("other", OTHER_TENANT));
    })
}

fn cluster_view(server: &TestServer, token: &str) -> (u16, Value) {
    let response = server.client().with_token(Some(token)).get("/api/cluster");
    (response.status, response.json)
}

#[test]
fn nodes_find_one_another_through_the_database_and_an_admin_sees_each_heartbeat() {
    let Some(database) = pg_cluster::database() else { return };
    let nodes: Vec<TestServer> = ["node-1", "node-2", "node-3"].iter().map(|id| node(&database.url, id)).collect();

    // Every node lists all three, each at the address it serves on, holding no session yet.
    for server in &nodes {
        let (status, view) = cluster_view(server, ADMIN);
        assert_eq!(status, 200, "{view}");
        assert_eq!(view["clustered"], true);
        let listed: Vec<(&str, &str, i64)> = view["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                (n["id"].as_str().unwrap(), n["advertiseUrl"].as_str().unwrap(), n["liveSessions"].as_i64().unwrap())
            })
            .collect();
        let expected: Vec<(&str, &str, i64)> =
            ["node-1", "node-2", "node-3"].iter().zip(&nodes).map(|(id, s)| (*id, s.base.as_str(), 0)).collect();
        assert_eq!(listed, expected);
    }
    let (_, view) = cluster_view(&nodes[1], ADMIN);
    assert_eq!(view["node"], "node-2");
    assert_eq!(view["leaseMs"], 900);

    // Not for a plain token; nor is the secret in the config view.
    let (status, body) = cluster_view(&nodes[0], USER);
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("forbidden")), "{body}");
    let config = nodes[0].client().with_token(Some(ADMIN)).get("/api/config").text;
    assert!(!config.contains(SECRET) && config.contains("\"secret\":\"***\""), "{config}");

    // Heartbeats go on while a node runs and stop when it stops: its row ages past a lease.
    let age = |view: &Value, id: &str| {
        view["nodes"].as_array().unwrap().iter().find(|n| n["id"] == id).unwrap()["heartbeatAgeMs"].as_i64().unwrap()
    };
    let mut nodes = nodes;
    let mut stopped = nodes.pop().unwrap();
    stopped.stop();
    wait_until("the stopped node's heartbeat to age past a lease", || {
        let (_, view) = cluster_view(&nodes[0], ADMIN);
        age(&view, "node-3") > 900
    });
    wait_until("a running node's heartbeat to be renewed past the first", || {
        let (_, view) = cluster_view(&nodes[0], ADMIN);
        age(&view, "node-2") < 900
    });
    drop(stopped);
}

#[test]
fn a_cluster_needs_postgresql_and_says_so() {
    let (data, workspace) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut config = crate::support::test_config(data.path(), workspace.path());
    config.store.url = None;
    config.cluster.secret = Some(SECRET.into());
    let error = kestrel::Server::start(config).err().expect("no cluster on SQLite").to_string();
    assert!(error.contains("[cluster] needs the PostgreSQL store"), "{error}");
    assert!(!error.contains(SECRET));
}

/// Each node's id and how many sessions' leases it holds, as the admin view lists them.
fn live_sessions(server: &TestServer) -> Vec<(String, i64)> {
    let (_, view) = cluster_view(server, ADMIN);
    let nodes = view["nodes"].as_array().cloned().unwrap_or_default();
    nodes.iter().map(|n| (n["id"].as_str().unwrap().to_string(), n["liveSessions"].as_i64().unwrap())).collect()
}

#[test]
fn a_session_held_by_one_node_is_served_there_from_any_node_streams_included() {
    let Some(database) = pg_cluster::database() else { return };
    // Leases long enough that a busy machine's late renewal does not move the session.
    let (a, mut b) = (node_leasing(&database.url, "node-a", 10_000), node_leasing(&database.url, "node-b", 10_000));
    let (at_a, at_b) = (a.client().with_token(Some(USER)), b.client().with_token(Some(USER)));
    let created = at_a.post("/api/sessions", serde_json::json!({ "model": "builtin/echo" }));
    assert_eq!(created.status, 201, "{}", created.text);
    let id = created.json["session"]["id"].as_str().unwrap().to_string();

    // A message at node A: A claims the session and runs the turn.
    let mut at_a_stream =
        crate::support::SseClient::open(&a.base, &format!("/api/sessions/{id}/events"), Some(USER), None);
    let sent = at_a.post(&format!("/api/sessions/{id}/messages"), serde_json::json!({ "content": "first, at A" }));
    assert_eq!(sent.status, 202, "{}", sent.text);
    at_a_stream.collect_until(crate::support::is_run_end);
    assert_eq!(live_sessions(&b), vec![("node-a".to_string(), 1), ("node-b".to_string(), 0)]);

    // At node B, the stream and the next message are A's, relayed: B takes no lease.
    let mut at_b_stream =
        crate::support::SseClient::open(&b.base, &format!("/api/sessions/{id}/events"), Some(USER), None);
    let sent = at_b.post(&format!("/api/sessions/{id}/messages"), serde_json::json!({ "content": "second, at B" }));
    assert_eq!(sent.status, 202, "{}", sent.text);
    let run = sent.json["runId"].as_str().unwrap().to_string();
    let events =
        at_b_stream.collect_until(|event| crate::support::is_run_end(event) && event["event"]["runId"] == run.as_str());
    assert_eq!(events.last().unwrap()["event"]["type"], "run.finished", "{events:?}");
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|pair| pair[0] < pair[1]), "seqs in order through the relay: {seqs:?}");
    assert!(
        events.iter().any(|e| e["event"]["message"]["content"].to_string().contains("second, at B")),
        "the relayed stream carries the message sent at B: {events:?}"
    );
    assert_eq!(live_sessions(&a), vec![("node-a".to_string(), 1), ("node-b".to_string(), 0)]);
    // A read at B is A's answer too: both messages and both answers.
    let read = at_b.get(&format!("/api/sessions/{id}"));
    assert_eq!((read.status, read.json["session"]["messageCount"].as_u64()), (200, Some(4)), "{}", read.text);

    // A call between nodes with a wrong secret is refused, in the door's error shape.
    let wrong = at_a.send_with_headers(
        "POST",
        &format!("/api/sessions/{id}/messages"),
        Some(br#"{"content":"forged"}"#),
        &[("Kestrel-Cluster-Secret", "not-the-secret")],
    );
    wrong.assert_error(403, "forbidden");
    assert!(!wrong.text.contains(SECRET));

    // When A stops it gives its leases up, and B takes the session at its next operation.
    drop(at_b_stream);
    let mut a = a;
    a.stop();
    let sent = at_b.post(&format!("/api/sessions/{id}/messages"), serde_json::json!({ "content": "third, at B" }));
    assert_eq!(sent.status, 202, "{}", sent.text);
    wait_until("node B to hold the session", || live_sessions(&b).contains(&("node-b".to_string(), 1)));
    wait_until("the third turn to end at B", || {
        at_b.get(&format!("/api/sessions/{id}")).json["session"]["messageCount"].as_u64() == Some(6)
    });
    b.stop();
}

#[test]
fn a_bae_session_opened_at_one_node_takes_a_driver_and_its_turns_at_another() {
    use crate::bae::support::{Bae, Harness};
    use crate::fake_provider::anthropic;
    let Some(database) = pg_cluster::database() else { return };
    let bae_node = |id: &str| {
        Bae::start_with(|config| {
            config.store.url = Some(database.url.clone());
            config.cluster.secret = Some(SECRET.into());
            config.cluster.node_id = Some(id.into());
            config.cluster.lease_ms = 10_000;
            let mut admin = kestrel::config::TokenConfig::new("default", ADMIN);
            admin.admin = true;
            config.auth.tokens.push(admin);
        })
    };
    let (a, b) = (bae_node("bae-a"), bae_node("bae-b"));
    let profile = a.profile("main", &[]);
    let ((_, first), (second_id, second)) = (a.client_key(&profile), a.client_key(&profile));

    // Opened at A (A claims it), joined at B: the join and B's calls are A's, relayed.
    let mut at_a = Harness::open(a.base(), &first, &[]);
    let mut at_b = Harness::join(b.base(), &at_a.session_id, &second, &[]);
    a.fake.script([anthropic::text_answer("to a"), anthropic::text_answer("to b")]);
    let answer = |frames: &[Value]| frames.last().unwrap()["result"]["message"]["content"][0]["text"].clone();
    assert_eq!(answer(&at_a.send_message(serde_json::json!("a asks"))), "to a");
    let from_b = at_b.send_message(serde_json::json!("b asks"));
    assert_eq!(answer(&from_b), "to b", "{from_b:?}");

    // Both turns ran where the session lives; B's provider was never asked.
    assert_eq!(a.fake.requests().len(), 2);
    assert!(b.fake.requests().is_empty());
    // The history, read at B, names each driver's message once, in order.
    let sent: Vec<String> = at_b
        .events()
        .iter()
        .filter(|e| e["event_type"] == "client.message.send")
        .map(|e| e["client_key_id"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(sent[1], second_id);
    assert_eq!(live_sessions(&b.server), vec![("bae-a".to_string(), 1), ("bae-b".to_string(), 0)]);
}

#[test]
fn forwarding_keeps_tenants_apart_and_a_dead_holder_is_a_retryable_503() {
    let Some(database) = pg_cluster::database() else { return };
    let (a, b) = (node_leasing(&database.url, "node-a", 10_000), node_leasing(&database.url, "node-b", 10_000));
    let (at_a, at_b) = (a.client().with_token(Some(USER)), b.client().with_token(Some(USER)));
    let id = at_a.post("/api/sessions", serde_json::json!({ "model": "builtin/echo" })).json["session"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let sent = at_a.post(&format!("/api/sessions/{id}/messages"), serde_json::json!({ "content": "at A" }));
    assert_eq!(sent.status, 202, "{}", sent.text);

    // Another tenant's token at B: forwarded with the token, and A's answer hides the session.
    let intruder = b.client().with_token(Some(OTHER_TENANT));
    intruder.get(&format!("/api/sessions/{id}")).assert_error(404, "session_not_found");
    let forged = intruder.post(&format!("/api/sessions/{id}/messages"), serde_json::json!({ "content": "x" }));
    forged.assert_error(404, "session_not_found");
    // A forged secret is refused at B too, before any lease is looked at.
    let forged = at_b.send_with_headers(
        "GET",
        &format!("/api/sessions/{id}"),
        None,
        &[("Kestrel-Cluster-Secret", &format!("{SECRET}x"))],
    );
    forged.assert_error(403, "forbidden");

    // A holder that died without giving its lease up: its address answers nothing. Until the
    // lease runs out, B answers 503 with Retry-After, and no request of any shape wedges it.
    let held = at_a.post("/api/sessions", serde_json::json!({ "model": "builtin/echo" })).json["session"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut db = postgres::Client::connect(&database.url, postgres::NoTls).unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gone = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    db.execute(
        "INSERT INTO cluster_nodes (id, advertise_url, started_at, heartbeat_at) VALUES ('ghost', $1, now(), now())",
        &[&gone],
    )
    .unwrap();
    db.execute(
        "INSERT INTO session_leases (session_id, node_id, epoch, expires_at)
         VALUES ($1, 'ghost', nextval('lease_epochs'), now() + interval '1 hour')",
        &[&held],
    )
    .unwrap();
    for (method, path) in [("POST", "messages"), ("GET", "events"), ("GET", "")] {
        let body = (method == "POST").then_some(br#"{"content":"to the ghost"}"#.as_slice());
        let path = format!("/api/sessions/{held}/{path}").trim_end_matches('/').to_string();
        let answer = at_b.send(method, &path, body);
        answer.assert_error(503, "unavailable");
        assert_eq!(answer.header("retry-after"), Some("2"), "{method} {path}");
    }
    assert_eq!(b.get("/api/health").status, 200);
    // Once the lease has run out, B takes the session at the next message.
    db.execute("UPDATE session_leases SET expires_at = now() WHERE session_id = $1", &[&held]).unwrap();
    let sent = at_b.post(&format!("/api/sessions/{held}/messages"), serde_json::json!({ "content": "now B" }));
    assert_eq!(sent.status, 202, "{}", sent.text);
    drop(a);
}
