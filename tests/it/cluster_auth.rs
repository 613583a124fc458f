//! A cluster's node authenticates a request by its door, with the tenant's rate limit, before
//! it looks a session's lease up, claims it or forwards the request (docs/cluster.md,
//! Forwarding): a caller it does not know moves no lease, whichever door its path names. Nor
//! does a caller it knows, for a session that is not the caller's: another tenant's (or, at
//! BAE's door, another profile's or another key's) session is answered where the request
//! landed, as the door answers it, and is neither claimed nor forwarded.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use serde_json::json;

use crate::bae::support::send as bae_send;
use crate::pg_cluster;
use crate::support::{Client, SseClient, TestServer};

const SECRET: &str = "cluster-secret-3b8d";
const USER: &str = "user-token";
/// A tenant allowed one request now and then (a bucket of one, refilled every 1000 s).
const LIMITED: &str = "limited-token";

/// A node of the cluster on `url` with a plain tenant (and an admin token of it), a
/// rate-limited one and a victim; its leases last long enough that none runs out during the
/// test.
fn node(url: &str, id: &str) -> TestServer {
    node_with(url, id, |_| {})
}

/// `node`, then `adjust` on its config.
fn node_with(url: &str, id: &str, adjust: impl FnOnce(&mut kestrel::Config)) -> TestServer {
    TestServer::start_with(|config| {
        config.store.url = Some(url.to_string());
        config.cluster.secret = Some(SECRET.into());
        config.cluster.node_id = Some(id.into());
        config.cluster.lease_ms = 30_000;
        config.auth.tokens.push(kestrel::config::TokenConfig::new("default", USER));
        let mut limited = kestrel::config::TokenConfig::new("limited", LIMITED);
        limited.budget = Some(kestrel::policy::Budget { requests_per_second: Some(0.001), ..Default::default() });
        config.auth.tokens.push(limited);
        let mut admin = kestrel::config::TokenConfig::new("default", ADMIN);
        admin.admin = true;
        config.auth.tokens.push(admin);
        config.auth.tokens.push(kestrel::config::TokenConfig::new("victim", VICTIM));
        adjust(config);
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

/// Another tenant than `USER`'s, whose sessions `USER` must not reach.
const VICTIM: &str = "victim-token";
/// An admin token of `USER`'s tenant: admin for the server's views, still its tenant's for
/// sessions.
const ADMIN: &str = "admin-token";

/// A TCP relay in front of a node, set as its advertised URL, that keeps every byte another
/// node sends it: so a test sees what was forwarded to that node.
struct Tap {
    url: String,
    target: Arc<Mutex<Option<String>>>,
    heard: Arc<Mutex<Vec<u8>>>,
}

impl Tap {
    fn start() -> Tap {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (target, heard) = (Arc::new(Mutex::new(None::<String>)), Arc::new(Mutex::new(Vec::new())));
        let (to, kept) = (target.clone(), heard.clone());
        std::thread::spawn(move || {
            for inbound in listener.incoming().flatten() {
                let Some(address) = to.lock().unwrap().clone() else { continue };
                let Ok(outbound) = TcpStream::connect(address) else { continue };
                let (mut from_node, mut to_node) = (inbound.try_clone().unwrap(), outbound.try_clone().unwrap());
                let kept = kept.clone();
                std::thread::spawn(move || {
                    let mut buffer = [0u8; 8192];
                    while let Ok(read @ 1..) = from_node.read(&mut buffer) {
                        kept.lock().unwrap().extend_from_slice(&buffer[..read]);
                        if to_node.write_all(&buffer[..read]).is_err() {
                            break;
                        }
                    }
                    let _ = to_node.shutdown(std::net::Shutdown::Write);
                });
                let (mut answers, mut back) = (outbound, inbound);
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut answers, &mut back);
                    let _ = back.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        Tap { url, target, heard }
    }

    /// Sends what the tap hears on to the node at `base`.
    fn to(&self, base: &str) {
        *self.target.lock().unwrap() = Some(base.trim_start_matches("http://").to_string());
    }

    /// How many times the requests the tap passed on named `id`.
    fn times(&self, id: &str) -> usize {
        String::from_utf8_lossy(&self.heard.lock().unwrap()).matches(id).count()
    }
}

/// A call on each route of the Kestrel door that names a session, naming `id`, with a body.
fn session_calls(id: &str) -> Vec<(&'static str, String, Option<&'static [u8]>)> {
    let json: &'static [u8] = b"{}";
    vec![
        ("GET", format!("/api/sessions/{id}"), None),
        ("PATCH", format!("/api/sessions/{id}"), Some(br#"{"title":"mine now"}"#.as_slice())),
        ("DELETE", format!("/api/sessions/{id}"), None),
        ("POST", format!("/api/sessions/{id}/messages"), Some(br#"{"content":"steer"}"#.as_slice())),
        ("POST", format!("/api/sessions/{id}/cancel"), Some(json)),
        ("POST", format!("/api/sessions/{id}/resume"), Some(json)),
        ("POST", format!("/api/sessions/{id}/fork"), Some(json)),
        ("GET", format!("/api/sessions/{id}/events"), None),
        ("POST", format!("/api/sessions/{id}/approvals/apr_0"), Some(br#"{"approved":true}"#.as_slice())),
        ("GET", format!("/api/sessions/{id}/files"), None),
        ("GET", format!("/api/sessions/{id}/file?path=README.md"), None),
        ("GET", format!("/api/sessions/{id}/checkpoints"), None),
        ("POST", format!("/api/sessions/{id}/checkpoints"), Some(json)),
        ("POST", format!("/api/sessions/{id}/checkpoints/chk_0/restore"), Some(json)),
        ("POST", format!("/api/sessions/{id}/rewind"), Some(br#"{"messageId":"msg_0"}"#.as_slice())),
        ("GET", format!("/api/sessions/{id}/rules"), None),
        ("POST", format!("/api/sessions/{id}/rules"), Some(br#"{"tool":"*","outcome":"allow"}"#.as_slice())),
        ("DELETE", format!("/api/sessions/{id}/rules/rul_0"), None),
    ]
}

/// Whether node `node` holds none of `sessions`' leases.
fn holds_none(database: &str, node: &str, sessions: &[String]) -> bool {
    let held = leases_of(database, node);
    !sessions.iter().any(|session| held.contains(session))
}

#[test]
fn a_tenant_naming_another_tenants_sessions_is_answered_404_where_it_lands_and_moves_no_lease() {
    let Some(database) = pg_cluster::database() else { return };
    let tap = Tap::start();
    let mut a = node_with(&database.url, "node-a", |config| config.cluster.advertise_url = Some(tap.url.clone()));
    tap.to(&a.base);
    let b = node(&database.url, "node-b");
    // The victim's sessions: some no node holds (a creation claims nothing), some node A
    // holds while a stream at A follows each.
    let victim_at_a = a.client().with_token(Some(VICTIM));
    let free: Vec<String> = (0..3).map(|_| create(&victim_at_a)).collect();
    let held: Vec<String> = (0..3).map(|_| create(&victim_at_a)).collect();
    let _following: Vec<SseClient> = held
        .iter()
        .map(|id| SseClient::open(&a.base, &format!("/api/sessions/{id}/events"), Some(VICTIM), None))
        .collect();
    let mut held_sorted = held.clone();
    held_sorted.sort();
    assert_eq!(leases_of(&database.url, "node-a"), held_sorted);

    // Another tenant at node B, by its plain token and by its admin token, names them (and a
    // session that does not exist) on every session route: each is a 404 at B, as the door
    // answers it alone; B claims nothing and forwards nothing to A.
    let unknown = format!("ses_{}", "0".repeat(32));
    let attacked: Vec<String> = free.iter().chain(&held).chain([&unknown]).cloned().collect();
    let intrude = |at: &TestServer, token: &str, ids: &[String]| {
        let intruder = at.client().with_token(Some(token));
        for id in ids {
            for (method, path, body) in session_calls(id) {
                let answer = intruder.send(method, &path, body);
                let refused = (answer.status, answer.json["error"]["code"].as_str());
                assert_eq!(refused, (404, Some("session_not_found")), "{method} {path}: {}", answer.text);
            }
        }
    };
    intrude(&b, USER, &attacked);
    intrude(&b, ADMIN, &attacked);
    assert_eq!(leases_of(&database.url, "node-b"), Vec::<String>::new(), "B claimed no lease");
    assert_eq!(leases_of(&database.url, "node-a"), held_sorted, "A's leases stay A's");
    for id in &attacked {
        assert_eq!(tap.times(id), 0, "nothing naming {id} was forwarded to A");
    }

    // The victim's own requests are still served wherever its sessions are: B claims a free
    // one for a message, and forwards a read and a message of one A holds to A.
    let victim_at_b = b.client().with_token(Some(VICTIM));
    let sent = victim_at_b.post(&format!("/api/sessions/{}/messages", free[0]), json!({ "content": "at B" }));
    assert_eq!(sent.status, 202, "{}", sent.text);
    assert_eq!(leases_of(&database.url, "node-b"), vec![free[0].clone()]);
    assert_eq!(victim_at_b.get(&format!("/api/sessions/{}", held[1])).status, 200);
    let sent = victim_at_b.post(&format!("/api/sessions/{}/messages", held[0]), json!({ "content": "to A" }));
    assert_eq!(sent.status, 202, "{}", sent.text);
    assert!(tap.times(&held[0]) > 0 && tap.times(&held[1]) > 0, "the victim's calls were forwarded to A");
    assert!(leases_of(&database.url, "node-a").contains(&held[0]), "served by its holder");

    // BAE: a client key joins only sessions of its own profile. At B, a join of a session of
    // another profile (opened, so held, at A) is refused in the spec's order (a `compaction`
    // key is a 400 before the session is looked up, a missing session a 404, another
    // profile's a 403) and a session key reaches only its own session (401): B neither
    // forwards any of them nor claims the session.
    let bae_admin = format!("http://{}", a.server.as_ref().unwrap().admin_addr().expect("an admin API"));
    let admin_key = std::fs::read_to_string(a.data_dir.join("admin-key")).unwrap().trim().to_string();
    let client_key = |name: &str| {
        let profile = json!({ "name": name, "primary_provider": "builtin/echo" });
        let profile = bae_send(&bae_admin, "POST", "/admin/v1/profiles", Some(&admin_key), Some(profile));
        assert_eq!(profile.status, 201, "{}", profile.text);
        let key = json!({ "name": name, "profile_id": profile.json["id"] });
        let key = bae_send(&bae_admin, "POST", "/admin/v1/keys", Some(&admin_key), Some(key));
        assert_eq!(key.status, 201, "{}", key.text);
        key.json["key"].as_str().unwrap().to_string()
    };
    let (theirs, mine) = (client_key("victim"), client_key("intruder"));
    let opened = bae_send(&a.base, "POST", "/api/v1/sessions", Some(&theirs), Some(json!({})));
    assert_eq!(opened.status, 201, "{}", opened.text);
    let bae_session = opened.json["session_id"].as_str().unwrap().to_string();
    let own = bae_send(&b.base, "POST", "/api/v1/sessions", Some(&mine), Some(json!({})));
    assert_eq!(own.status, 201, "{}", own.text);
    let own_key = own.json["session_key"].as_str().unwrap().to_string();
    let bae_refusals = || {
        let forwarded = tap.times(&bae_session);
        let join = format!("/api/v1/sessions/{bae_session}/join");
        let joins = [
            (join.clone(), json!({}), 403, "profile_mismatch"),
            (join.clone(), json!({ "compaction": null }), 400, "bad_request"),
            (format!("/api/v1/sessions/ses_{}/join", "0".repeat(32)), json!({}), 404, "not_found"),
        ];
        for (path, body, status, kind) in joins {
            let refused = bae_send(&b.base, "POST", &path, Some(&mine), Some(body));
            assert_eq!((refused.status, refused.json["type"].as_str()), (status, Some(kind)), "{}", refused.text);
        }
        for (method, route) in [("POST", "rpc"), ("GET", "participants"), ("GET", "events"), ("DELETE", "")] {
            let path = format!("/api/v1/sessions/{bae_session}/{route}").trim_end_matches('/').to_string();
            let body =
                (method == "POST").then(|| json!({ "jsonrpc": "2.0", "id": 1, "method": "session.registerDriver" }));
            let refused = bae_send(&b.base, method, &path, Some(&own_key), body);
            let shown = (refused.status, refused.json["type"].as_str());
            assert_eq!(shown, (401, Some("unauthorized")), "{path}: {}", refused.text);
        }
        assert!(
            holds_none(&database.url, "node-b", std::slice::from_ref(&bae_session)),
            "B claimed no other profile's session"
        );
        assert_eq!(tap.times(&bae_session), forwarded, "nothing naming the BAE session was forwarded to A");
    };
    bae_refusals();
    // The profile's own key joins at B: the join, its body read as B admitted it, is
    // forwarded to A, which holds the session.
    let join = format!("/api/v1/sessions/{bae_session}/join");
    let joined = bae_send(&b.base, "POST", &join, Some(&theirs), Some(json!({ "client_version": "9.9.9" })));
    assert_eq!(joined.status, 201, "{}", joined.text);
    assert!(tap.times(&bae_session) > 0 && tap.times("9.9.9") > 0, "the join and its body went to A");
    assert!(holds_none(&database.url, "node-b", std::slice::from_ref(&bae_session)));

    // Once A has stopped (giving its leases up), no node holds the victim's sessions: another
    // tenant's and another profile's requests at B still claim none of them.
    a.stop();
    assert_eq!(leases_of(&database.url, "node-a"), Vec::<String>::new());
    intrude(&b, USER, &held);
    assert!(holds_none(&database.url, "node-b", &held), "B claimed none of A's former sessions");
    bae_refusals();
    // The profile's own key still joins, here.
    let joined = bae_send(&b.base, "POST", &join, Some(&theirs), Some(json!({})));
    assert_eq!(joined.status, 201, "{}", joined.text);
}
