//! Several nodes on one PostgreSQL database (docs/cluster.md): membership through the
//! database, the admin view of it, and what a cluster needs to start.

use serde_json::Value;

use crate::pg_cluster;
use crate::support::{wait_until, TestServer};

const SECRET: &str = "cluster-secret-7f3a";
const ADMIN: &str = "admin-token";
const USER: &str = "user-token";

/// A node of the cluster on `url`, with an admin token and a plain one.
fn node(url: &str, id: &str) -> TestServer {
    TestServer::start_with(|config| {
        config.store.url = Some(url.to_string());
        config.cluster.secret = Some(SECRET.into());
        config.cluster.node_id = Some(id.into());
        config.cluster.lease_ms = 900;
        let mut admin = kestrel::config::TokenConfig::new("default", ADMIN);
        admin.admin = true;
        config.auth.tokens.push(admin);
        config.auth.tokens.push(kestrel::config::TokenConfig::new("default", USER));
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
