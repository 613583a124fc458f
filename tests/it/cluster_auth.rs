//! A cluster's node authenticates a request by its door, with the tenant's rate limit, before
//! it looks a session's lease up, claims it or forwards the request (docs/cluster.md,
//! Forwarding): a caller it does not know moves no lease, whichever door its path names.

use serde_json::json;

use crate::pg_cluster;
use crate::support::{Client, SseClient, TestServer};

const SECRET: &str = "cluster-secret-3b8d";
const USER: &str = "user-token";
/// A tenant allowed one request now and then (a bucket of one, refilled every 1000 s).
const LIMITED: &str = "limited-token";

/// A node of the cluster on `url` with a plain tenant and a rate-limited one; its leases
/// last long enough that none runs out during the test.
fn node(url: &str, id: &str) -> TestServer {
    TestServer::start_with(|config| {
        config.store.url = Some(url.to_string());
        config.cluster.secret = Some(SECRET.into());
        config.cluster.node_id = Some(id.into());
        config.cluster.lease_ms = 30_000;
        config.auth.tokens.push(kestrel::config::TokenConfig::new("default", USER));
        let mut limited = kestrel::config::TokenConfig::new("limited", LIMITED);
        limited.budget = Some(kestrel::policy::Budget { requests_per_second: Some(0.001), ..Default::default() });
        config.auth.tokens.push(limited);
    })
}

fn create(client: &Client) -> String {
    let created = client.post("/api/sessions", json!({ "model": "builtin/echo" }));
    assert_eq!(created.status, 201, "{}", created.text);
    created.json["session"]["id"].as_str().unwrap().to_string()
}

/// The lease rows node `node` holds, as the database has them.
fn leases_of(database: &str, node: &str) -> Vec<String> {
    let mut db = postgres::Client::connect(database, postgres::NoTls).unwrap();
    let rows = db.query("SELECT session_id FROM session_leases WHERE node_id = $1 ORDER BY session_id", &[&node]);
    rows.unwrap().iter().map(|row| row.get(0)).collect()
}

#[test]
fn a_node_authenticates_a_request_with_its_tenants_rate_limit_before_it_claims_or_forwards() {
    let Some(database) = pg_cluster::database() else { return };
    let (a, b) = (node(&database.url, "node-a"), node(&database.url, "node-b"));
    let at_a = a.client().with_token(Some(USER));
    // Sessions no node holds yet (a creation claims nothing), and sessions node A holds
    // while a stream at A follows each.
    let free: Vec<String> = (0..10).map(|_| create(&at_a)).collect();
    let held: Vec<String> = (0..3).map(|_| create(&at_a)).collect();
    let _following: Vec<SseClient> = held
        .iter()
        .map(|id| SseClient::open(&a.base, &format!("/api/sessions/{id}/events"), Some(USER), None))
        .collect();
    assert_eq!(leases_of(&database.url, "node-a"), {
        let mut held = held.clone();
        held.sort();
        held
    });

    // At node B, with no token, a wrong one, or one of another shape, through either door:
    // every request is a 401 in its door's shape, and B takes no lease.
    let anonymous = b.client().with_token(None);
    let wrong = b.client().with_token(Some("not-a-token"));
    for id in free.iter().chain(&held) {
        let kestrel_calls: [(&Client, &str, String); 4] = [
            (&anonymous, "POST", format!("/api/sessions/{id}/messages")),
            (&wrong, "POST", format!("/api/sessions/{id}/cancel")),
            (&anonymous, "GET", format!("/api/sessions/{id}/events")),
            (&wrong, "DELETE", format!("/api/sessions/{id}")),
        ];
        for (client, method, path) in &kestrel_calls {
            let body = (*method == "POST").then_some(br#"{"content":"let me in"}"#.as_slice());
            client.send(method, path, body).assert_error(401, "unauthorized");
        }
        let bae_calls: [(&Client, &str, String); 3] = [
            (&anonymous, "POST", format!("/api/v1/sessions/{id}/rpc")),
            (&wrong, "POST", format!("/api/v1/sessions/{id}/join")),
            (&anonymous, "DELETE", format!("/api/v1/sessions/{id}")),
        ];
        for (client, method, path) in &bae_calls {
            let body = (*method == "POST").then_some(br#"{"jsonrpc":"2.0","id":1,"method":"x"}"#.as_slice());
            let refused = client.send(method, path, body);
            assert_eq!((refused.status, refused.json["type"].as_str()), (401, Some("unauthorized")), "{path}");
        }
    }
    assert_eq!(leases_of(&database.url, "node-b"), Vec::<String>::new(), "B claimed no lease");
    assert_eq!(leases_of(&database.url, "node-a").len(), held.len(), "A's leases stay A's");

    // The tenant's rate limit comes before the lease too: once it is spent, a message for a
    // session no node holds is a 429 at B, and B claims nothing for it.
    let limited = b.client().with_token(Some(LIMITED));
    let own = create(&a.client().with_token(Some(LIMITED)));
    assert_eq!(limited.get(&format!("/api/sessions/{own}")).status, 200, "the one request its bucket holds");
    let refused = limited.post(&format!("/api/sessions/{own}/messages"), json!({ "content": "over the limit" }));
    refused.assert_error(429, "rate_limited");
    assert!(refused.header("retry-after").is_some(), "{}", refused.text);
    assert_eq!(leases_of(&database.url, "node-b"), Vec::<String>::new(), "B claimed nothing past the limit");

    // An authenticated caller is still served wherever the session is: B claims a free
    // session for a message, and forwards one for a session A holds to A.
    let at_b = b.client().with_token(Some(USER));
    let sent = at_b.post(&format!("/api/sessions/{}/messages", free[0]), json!({ "content": "at B" }));
    assert_eq!(sent.status, 202, "{}", sent.text);
    assert_eq!(leases_of(&database.url, "node-b"), vec![free[0].clone()]);
    let sent = at_b.post(&format!("/api/sessions/{}/messages", held[0]), json!({ "content": "to A" }));
    assert_eq!(sent.status, 202, "{}", sent.text);
    assert!(leases_of(&database.url, "node-a").contains(&held[0]), "served by its holder");
}
