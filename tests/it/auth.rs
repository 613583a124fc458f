//! Tokens and tenants: who may call, and who sees what.

use serde_json::json;

use crate::support::{event_type, SseClient, TestServer};

fn two_tenants() -> TestServer {
    TestServer::start_with(|config| {
        for (tenant, token) in [("acme", "acme-token"), ("globex", "globex-token")] {
            config.auth.tokens.push(kestrel::config::TokenConfig::new(tenant, token));
        }
    })
}

#[test]
fn every_route_but_health_needs_the_token() {
    let server = TestServer::start_with(|config| config.auth.token = Some("s3cret".into()));
    let anonymous = server.client().with_token(None);
    anonymous.get("/api/sessions").assert_error(401, "unauthorized");
    anonymous.post("/api/sessions", json!({})).assert_error(401, "unauthorized");
    server.client().with_token(Some("wrong")).get("/api/sessions").assert_error(401, "unauthorized");
    server.client().with_token(Some("s3cre")).get("/api/sessions").assert_error(401, "unauthorized");
    assert_eq!(anonymous.get("/api/health").status, 200);
    assert_eq!(server.get("/api/sessions").status, 200);
    // EventSource cannot set headers, so the token may come in the query.
    assert_eq!(anonymous.get("/api/sessions?token=s3cret").status, 200);
    let stream = SseClient::open(&server.base, "/api/events?token=s3cret", None, None);
    assert_eq!(stream.status, 200);
    let refused = SseClient::open(&server.base, "/api/events", None, None);
    assert_eq!(refused.status, 401);
}

#[test]
fn tenants_see_only_their_own_sessions_and_events() {
    let server = two_tenants();
    let acme = server.client().with_token(Some("acme-token"));
    let globex = server.client().with_token(Some("globex-token"));

    let created = acme.post("/api/sessions", json!({ "title": "acme work" }));
    assert_eq!(created.status, 201);
    let acme_session = created.json["session"]["id"].as_str().unwrap().to_string();
    let globex_session = globex.post("/api/sessions", json!({})).json["session"]["id"].as_str().unwrap().to_string();

    let listed = acme.get("/api/sessions").json;
    let ids: Vec<&str> = listed["sessions"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [acme_session.as_str()]);

    globex.assert_session_hidden(&acme_session);
    let path = format!("/api/sessions/{acme_session}");

    // The all-sessions stream of one tenant carries nothing of the other's.
    let mut globex_events = SseClient::open(&server.base, "/api/events", Some("globex-token"), None);
    let mut acme_events = SseClient::open(&server.base, "/api/events", Some("acme-token"), None);
    assert_eq!(acme.post(&format!("{path}/messages"), json!({ "content": "secret plans" })).status, 202);
    let acme_run = acme_events.collect_until(crate::support::is_run_end);
    assert!(acme_run.iter().all(|e| e["event"]["sessionId"] == acme_session.as_str()));
    assert_eq!(event_type(acme_run.last().unwrap()), "run.finished");

    let globex_path = format!("/api/sessions/{globex_session}/messages");
    assert_eq!(globex.post(&globex_path, json!({ "content": "ours" })).status, 202);
    let globex_run = globex_events.collect_until(crate::support::is_run_end);
    assert!(
        globex_run.iter().all(|e| e["event"]["sessionId"] == globex_session.as_str()),
        "globex saw another tenant's events: {globex_run:#?}"
    );
    assert!(!globex_run.iter().any(|e| e.to_string().contains("secret plans")));
}
