//! The HTTP edge: routing errors, body limits, JSON errors, health, bootstrap, config.

use serde_json::json;

use crate::support::TestServer;

#[test]
fn unknown_routes_are_404_and_wrong_methods_405_with_allow() {
    let server = TestServer::start();
    server.get("/api/nope").assert_error(404, "not_found");
    server.get("/elsewhere").assert_error(404, "not_found");
    server.get("/api/sessions/x/y/z").assert_error(404, "not_found");

    let response = server.client().send("DELETE", "/api/health", None);
    response.assert_error(405, "method_not_allowed");
    assert_eq!(response.header("allow"), Some("GET"));
    let response = server.client().send("PUT", "/api/sessions", None);
    response.assert_error(405, "method_not_allowed");
    assert_eq!(response.header("allow"), Some("GET, POST"));
    let response = server.client().send("POST", "/api/sessions/abc", None);
    assert_eq!(response.header("allow"), Some("GET, PATCH, DELETE"));
}

#[test]
fn bodies_past_the_limit_are_413_and_bad_json_is_400() {
    let server = TestServer::start_with(|config| config.server.body_limit_bytes = 1024);
    let big = json!({ "title": "x".repeat(2000) });
    server.post("/api/sessions", big).assert_error(413, "payload_too_large");

    server.client().post_raw("/api/sessions", b"{not json").assert_error(400, "invalid_json");
    server.client().post_raw("/api/sessions", b"[1,2]").assert_error(400, "invalid_body");

    let response = server.post("/api/sessions", json!({ "workspace": 42 }));
    response.assert_error(400, "invalid_body");
    assert!(response.json["error"]["message"].as_str().unwrap().contains("workspace"));
}

#[test]
fn health_is_public_and_bootstrap_lists_the_builtin_model() {
    let server = TestServer::start_with(|config| config.auth.token = Some("t0ken".into()));
    let anonymous = server.client().with_token(None);
    let health = anonymous.get("/api/health");
    assert_eq!(health.status, 200);
    assert_eq!(health.json["status"], "ok");
    assert_eq!(health.json["name"], "kestrel");
    assert_eq!(health.json["protocol"], "1.0");
    assert!(health.json["uptimeMs"].is_u64());
    assert_eq!(health.json["sessions"], 0);

    anonymous.get("/api/bootstrap").assert_error(401, "unauthorized");
    let bootstrap = server.get("/api/bootstrap");
    assert_eq!(bootstrap.status, 200);
    assert_eq!(bootstrap.json["protocol"], "1.0");
    let models = bootstrap.json["models"].as_array().unwrap();
    assert!(models.iter().any(|m| m["id"] == "builtin/echo" && m["supportsTools"] == true));
    assert_eq!(bootstrap.json["features"]["streaming"], true);
    assert_eq!(bootstrap.json["features"]["persistence"], true);
    assert!(bootstrap.json["tools"].is_array());
    assert_eq!(bootstrap.json["plugins"], json!([]));
}

#[test]
fn config_is_shown_without_secrets() {
    let server = TestServer::start_with(|config| {
        config.auth.token = Some("main-secret-value".into());
        config.auth.tokens.push(kestrel::config::TokenConfig::new("acme", "acme-secret-value"));
    });
    let response = server.get("/api/config");
    assert_eq!(response.status, 200);
    assert!(!response.text.contains("secret-value"), "{}", response.text);
    assert_eq!(response.json["auth"]["tokens"][0]["tenant"], "acme");
    // Keys are shown as they are written in the TOML file.
    assert_eq!(response.json["server"]["body_limit_bytes"], 16 * 1024 * 1024);
    assert_eq!(response.json["auth"]["tokenConfigured"], true);
}

#[test]
fn a_non_loopback_address_needs_a_token_or_an_explicit_opt_out() {
    let data = tempfile::tempdir().unwrap();
    let mut config = crate::support::test_config(&data.path().join("data"), data.path());
    config.server.addr = "0.0.0.0:0".into();
    let error = kestrel::Server::start(config.clone()).err().expect("refused");
    assert!(error.to_string().contains("without a token"), "{error}");

    config.server.allow_unauthenticated = true;
    let server = kestrel::Server::start(config.clone()).expect("starts when told to");
    server.shutdown();

    config.server.allow_unauthenticated = false;
    config.auth.token = Some("t".into());
    kestrel::Server::start(config).expect("starts with a token").shutdown();
}

#[test]
fn an_internal_failure_is_a_generic_500() {
    let mut server = TestServer::start();
    let id = server.create_session(json!({}));
    server.stop();
    // A row no version of the server writes: reading it fails inside the store.
    crate::support::Db::open(&server.data_dir).exec("UPDATE sessions SET status = 'melted' WHERE id = ?1", &[&id]);
    server.restart(|_| {});
    let response = server.get(&format!("/api/sessions/{id}"));
    response.assert_error(500, "internal_error");
    assert_eq!(response.json["error"]["message"], "internal server error");
    assert!(!response.text.contains("melted"), "the detail goes to the log, not the client");
    // The server is still serving.
    assert_eq!(server.get("/api/health").status, 200);
}
