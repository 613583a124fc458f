//! What the server shows of its own config (issue 35, findings 5 and 9): `GET /api/config` is
//! for admin tokens only, and shows no secret; a store URL's password, in any form the
//! PostgreSQL client accepts, never appears in the config view, the server's start-up error
//! line or `kestrel migrate`'s output.

use std::process::Output;

use kestrel::config::TokenConfig;

use crate::pg_cluster::{self, PASSWORD};
use crate::support::TestServer;

#[test]
fn the_config_is_for_admin_tokens_and_shows_no_secret() {
    let variable = format!("KESTREL_TEST_CONFIG_VIEW_{}", uuid::Uuid::new_v4().simple());
    std::env::set_var(&variable, "root-token-from-the-environment");
    let server = TestServer::start_with(|config| {
        let mut root = TokenConfig::new("ops", "unused");
        root.token = None;
        root.token_env = Some(variable.clone());
        root.admin = true;
        config.auth.tokens = vec![TokenConfig::new("acme", "acme-token-secret"), root];
        config.auth.token = Some("default-token-secret".into());
    });
    let acme = server.client().with_token(Some("acme-token-secret"));
    acme.get("/api/config").assert_error(403, "forbidden");
    server.client().with_token(None).get("/api/config").assert_error(401, "unauthorized");

    // An admin token, and the single `auth.token`, which is its operator's.
    for token in ["root-token-from-the-environment", "default-token-secret"] {
        let view = server.client().with_token(Some(token)).get("/api/config");
        assert_eq!(view.status, 200, "{}", view.text);
        for secret in ["acme-token-secret", "default-token-secret", "root-token-from-the-environment"] {
            assert!(!view.text.contains(secret), "{secret} shown: {}", view.text);
        }
    }
    let admin = server.client().with_token(Some("root-token-from-the-environment"));
    let view = admin.get("/api/config");
    let tenants: Vec<&str> =
        view.json["auth"]["tokens"].as_array().unwrap().iter().filter_map(|t| t["tenant"].as_str()).collect();
    assert_eq!(tenants, ["acme", "ops"], "an admin sees every tenant's settings");
}

#[test]
fn a_server_without_tokens_shows_its_config_to_its_one_user() {
    let server = TestServer::start();
    let view = server.get("/api/config");
    assert_eq!(view.status, 200, "{}", view.text);
    assert!(view.json["server"].is_object(), "{}", view.text);
}

/// The URL of `database` with the password given as a query parameter named `name`.
fn with_password_parameter(database: &pg_cluster::Database, name: &str) -> String {
    format!(
        "postgres://{}@127.0.0.1:{}/{}?sslmode=disable&{name}={PASSWORD}&application_name=kestrel-test",
        pg_cluster::USER,
        database.port,
        database.name
    )
}

#[test]
fn a_password_given_as_a_query_parameter_is_not_in_the_config_view() {
    let Some(database) = pg_cluster::database() else { return };
    let url = with_password_parameter(&database, "password");
    let server = TestServer::start_with(|config| config.store.url = Some(url));
    let view = server.get("/api/config");
    assert_eq!(view.status, 200, "{}", view.text);
    let shown = view.json["store"]["url"].as_str().unwrap_or_default().to_string();
    assert!(!view.text.contains(PASSWORD), "the password is shown: {shown}");
    assert!(shown.contains("sslmode=disable") && shown.contains("application_name=kestrel-test"), "{shown}");
    assert!(shown.contains(&format!("127.0.0.1:{}", database.port)), "the address stays readable: {shown}");
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

#[test]
fn a_password_in_any_parameter_stays_out_of_start_up_and_migrate_errors() {
    let data = tempfile::tempdir().unwrap();
    // Nothing listens on port 1: every start fails, after showing the URL it could not reach.
    let urls = [
        format!("postgres://kestrel@127.0.0.1:1/kestrel?password={PASSWORD}"),
        format!("postgres://kestrel@127.0.0.1:1/kestrel?sslmode=disable&PassWord={PASSWORD}"),
        format!("postgres://kestrel@127.0.0.1:1/kestrel?pass%77ord={PASSWORD}"),
        format!("postgres://kestrel@127.0.0.1:1/kestrel?sslpassword={PASSWORD}&sslmode=disable"),
        format!("postgres://kestrel:{PASSWORD}@127.0.0.1:1/kestrel?sslkey=/k/{PASSWORD}"),
        format!("host=127.0.0.1 port=1 user=kestrel password={PASSWORD} dbname=kestrel"),
        format!("host=127.0.0.1 port=1 password='{PASSWORD} x' user=kestrel"),
        format!("postgres://kestrel@127.0.0.1:1/kestrel#{PASSWORD}"),
        format!("postgres://kestrel@[::1/kestrel?password={PASSWORD}"),
    ];
    for url in urls {
        let (migrate, serve) = (crate::postgres::migrate(&url), crate::postgres::serve(&url, data.path(), "debug"));
        for (what, output) in [("migrate", migrate), ("serve", serve)] {
            let said = text(&output);
            assert_eq!(output.status.code(), Some(1), "{what} {url}: {said}");
            assert!(!said.contains(PASSWORD), "{what} showed the password of {url}: {said}");
            assert!(said.contains("PostgreSQL") || said.contains("store.url"), "{what} {url}: {said}");
        }
    }
}
