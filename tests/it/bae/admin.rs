//! The admin API and the server's BAE bootstrap: health, meta, the admin key, profiles and
//! keys with their lifecycles, pagination, sessions, and the read-only views.

use serde_json::{json, Value};

use super::support::{assert_problem, send, Bae, Harness};

#[test]
fn health_meta_and_no_admin_routes_on_the_client_port() {
    let bae = Bae::start();
    let health = send(bae.base(), "GET", "/healthz", None, None);
    assert_eq!((health.status, health.text.as_str()), (200, ""));
    let meta = send(bae.base(), "GET", "/api/v1/meta", None, None);
    assert_eq!(meta.json, json!({ "version": env!("CARGO_PKG_VERSION"), "api_versions": ["v1"] }));
    let absent = send(bae.base(), "GET", "/admin/v1/profiles", Some(&bae.admin_key), None);
    assert_eq!(absent.status, 404);
    // Kestrel's routes are still there beside BAE's.
    assert_eq!(send(bae.base(), "GET", "/api/health", None, None).status, 200);
}

#[test]
fn the_admin_key_is_minted_once_into_a_private_file_and_guards_every_route() {
    use std::os::unix::fs::PermissionsExt;
    let mut bae = Bae::start();
    let file = bae.server.data_dir.join("admin-key");
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(bae.admin_key.starts_with("bae_admin_") && bae.admin_key.len() == "bae_admin_".len() + 48);
    for path in
        ["/admin/v1/profiles", "/admin/v1/keys", "/admin/v1/sessions", "/admin/v1/config", "/admin/v1/providers"]
    {
        assert_problem(&send(&bae.admin, "GET", path, None, None), 401, "unauthorized");
        assert_problem(&send(&bae.admin, "GET", path, Some("bae_admin_wrong"), None), 401, "unauthorized");
        assert_eq!(bae.admin_send("GET", path, None).status, 200);
    }
    let missing = send(&bae.admin, "GET", "/admin/v1/keys", None, None);
    assert_eq!(missing.json["detail"], "missing Authorization header");
    assert_eq!(
        send(&bae.admin, "GET", "/admin/v1/keys", Some("bae_admin_x"), None).json["detail"],
        "invalid admin key"
    );

    // A restart keeps the key; a rotation replaces it.
    let first = bae.admin_key.clone();
    bae.server.restart(|config| config.bae.admin_addr = "127.0.0.1:0".into());
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), first);
    bae.server.restart(|config| {
        config.bae.admin_addr = "127.0.0.1:0".into();
        config.bae.rotate_admin_key = true;
    });
    let rotated = std::fs::read_to_string(&file).unwrap().trim().to_string();
    assert_ne!(rotated, first);
    let admin = format!("http://{}", bae.server.server.as_ref().unwrap().admin_addr().unwrap());
    assert_eq!(send(&admin, "GET", "/admin/v1/keys", Some(&first), None).status, 401);
    assert_eq!(send(&admin, "GET", "/admin/v1/keys", Some(&rotated), None).status, 200);
}

#[test]
fn admin_auth_can_be_disabled_for_local_development() {
    let bae = Bae::start_with(|config| config.bae.dangerously_disable_admin_auth = true);
    assert_eq!(send(&bae.admin, "GET", "/admin/v1/profiles", None, None).status, 200);
    assert!(!bae.server.data_dir.join("admin-key").exists());
}

#[test]
fn profile_and_key_lifecycle() {
    let bae = Bae::start();
    let created = bae.admin_send(
        "POST",
        "/admin/v1/profiles",
        Some(json!({ "name": "main", "primary_provider": "fake", "fallback_providers": ["nope"], "allowed_tools": ["t"] })),
    );
    assert_eq!(created.status, 201, "{}", created.text);
    let id = created.json["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("pro_") && id.len() == 36);
    let view = bae.admin_send("GET", &format!("/admin/v1/profiles/{id}"), None).json;
    assert_eq!(view["fallback_providers"], json!(["nope"]));
    assert_eq!(view["mcp_servers"], json!([]));
    assert_eq!(view["available_sandboxes"], json!([]));

    let duplicate =
        bae.admin_send("POST", "/admin/v1/profiles", Some(json!({ "name": "main", "primary_provider": "x" })));
    assert_problem(&duplicate, 409, "duplicate_name");
    assert_problem(
        &bae.admin_send("POST", "/admin/v1/profiles", Some(json!({ "name": " ", "primary_provider": "x" }))),
        400,
        "bad_request",
    );
    let bad = bae.admin_send(
        "POST",
        "/admin/v1/profiles",
        Some(json!({ "name": "b", "primary_provider": "x", "mcp_servers": [1] })),
    );
    assert_problem(&bad, 400, "bad_request");

    let replaced = bae.admin_send(
        "PUT",
        &format!("/admin/v1/profiles/{id}"),
        Some(json!({ "name": "main2", "primary_provider": "fake" })),
    );
    assert_eq!(replaced.status, 200, "{}", replaced.text);
    assert_eq!(replaced.json["allowed_tools"], json!([]));
    assert!(replaced.json["updated_at"].as_str() >= view["updated_at"].as_str());

    let key = bae.admin_send("POST", "/admin/v1/keys", Some(json!({ "name": "ci", "profile_id": id })));
    assert_eq!(key.status, 201, "{}", key.text);
    let plaintext = key.json["key"].as_str().unwrap();
    assert!(plaintext.starts_with("bae_") && plaintext.len() == 4 + 48);
    assert_eq!(key.json["prefix"], &plaintext[..8]);
    let listed = bae.admin_send("GET", "/admin/v1/keys", None);
    assert_eq!(listed.json["items"].as_array().unwrap().len(), 1);
    assert!(!listed.text.contains(plaintext), "a listed key shows its plaintext");

    assert_problem(&bae.admin_send("DELETE", &format!("/admin/v1/profiles/{id}"), None), 409, "profile_in_use");
    let key_id = key.json["id"].as_str().unwrap();
    assert_eq!(bae.admin_send("DELETE", &format!("/admin/v1/keys/{key_id}"), None).status, 204);
    assert_problem(&bae.admin_send("DELETE", &format!("/admin/v1/keys/{key_id}"), None), 404, "not_found");
    assert_eq!(bae.admin_send("DELETE", &format!("/admin/v1/profiles/{id}"), None).status, 204);
    assert_problem(&bae.admin_send("GET", &format!("/admin/v1/profiles/{id}"), None), 404, "not_found");
    // A deleted profile's name stays taken, and keys cannot be made for it.
    let reuse = bae.admin_send("POST", "/admin/v1/profiles", Some(json!({ "name": "main2", "primary_provider": "x" })));
    assert_problem(&reuse, 409, "duplicate_name");
    let orphan = bae.admin_send("POST", "/admin/v1/keys", Some(json!({ "name": "k", "profile_id": id })));
    assert_problem(&orphan, 422, "profile_unavailable");
    assert_problem(
        &bae.admin_send("POST", "/admin/v1/keys", Some(json!({ "name": "", "profile_id": id }))),
        400,
        "bad_request",
    );
}

#[test]
fn lists_page_by_an_opaque_cursor() {
    let bae = Bae::start();
    for i in 0..5 {
        bae.profile(&format!("p{i}"), &[]);
    }
    let mut names = Vec::new();
    let mut cursor = String::new();
    let mut pages = 0;
    loop {
        let page = bae.admin_send("GET", &format!("/admin/v1/profiles?limit=2&cursor={cursor}"), None);
        assert_eq!(page.status, 200, "{}", page.text);
        pages += 1;
        names.extend(page.json["items"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap().to_string()));
        match page.json["next_cursor"].as_str() {
            Some(next) => cursor = next.to_string(),
            None => break,
        }
    }
    assert_eq!(
        (pages, names),
        (3, vec!["p0", "p1", "p2", "p3", "p4"].into_iter().map(String::from).collect::<Vec<_>>())
    );
    for bad in ["?cursor=abc", "?limit=0", "?limit=-1", "?limit=x"] {
        assert_problem(&bae.admin_send("GET", &format!("/admin/v1/profiles{bad}"), None), 400, "bad_request");
    }
    let clamped = bae.admin_send("GET", "/admin/v1/profiles?limit=100000", None);
    assert_eq!(clamped.json["items"].as_array().unwrap().len(), 5);
    let huge = bae.admin_send("GET", "/admin/v1/profiles?limit=99999999999999999999999", None);
    assert_eq!(huge.json["items"].as_array().unwrap().len(), 5, "any positive limit: {}", huge.text);
    // A cursor past every seq (even past what an integer holds) is an empty last page.
    for past in ["9223372036854775807", "18446744073709551615", "4197428821125273556800"] {
        let page = bae.admin_send("GET", &format!("/admin/v1/profiles?cursor={past}"), None);
        assert_eq!((page.status, page.json["items"].as_array().map(Vec::len)), (200, Some(0)), "{past}: {}", page.text);
        assert_eq!(page.json["next_cursor"], serde_json::Value::Null);
    }
}

#[test]
fn sessions_list_filters_by_state_and_events_match_the_client_port() {
    let bae = Bae::start();
    let (_, key) = bae.key_for("main", &[]);
    let mut open = Harness::open(bae.base(), &key, &[]);
    let closed = Harness::open(bae.base(), &key, &[]);
    let response =
        send(bae.base(), "DELETE", &format!("/api/v1/sessions/{}", closed.session_id), Some(&closed.session_key), None);
    assert_eq!(response.json, json!({ "session_id": closed.session_id, "state": "closed" }));
    bae.fake.script([crate::fake_provider::anthropic::text_answer("hello")]);
    open.send_message(json!("hi"));

    let all = bae.admin_send("GET", "/admin/v1/sessions", None).json;
    assert_eq!(all["items"].as_array().unwrap().len(), 2);
    let only_closed = bae.admin_send("GET", "/admin/v1/sessions?state=closed", None).json;
    let ids: Vec<&Value> = only_closed["items"].as_array().unwrap().iter().map(|s| &s["id"]).collect();
    assert_eq!(ids, [&json!(closed.session_id)]);
    assert!(only_closed["items"][0]["closed_at"].is_string());
    assert_eq!(bae.admin_send("GET", "/admin/v1/sessions?state=", None).json["items"].as_array().unwrap().len(), 2);
    assert_eq!(bae.admin_send("GET", "/admin/v1/sessions?state=error", None).json["items"], json!([]));
    assert_problem(&bae.admin_send("GET", "/admin/v1/sessions?state=weird", None), 400, "bad_request");

    let admin_events = bae.admin_send("GET", &format!("/admin/v1/sessions/{}/events", open.session_id), None);
    let client_events = open.get("/events");
    assert_eq!(admin_events.text, client_events.text, "the two ports differ");
    let closed_events = bae.admin_send("GET", &format!("/admin/v1/sessions/{}/events", closed.session_id), None);
    let closed_types: Vec<&str> =
        closed_events.json["items"].as_array().unwrap().iter().map(|e| e["event_type"].as_str().unwrap()).collect();
    assert_eq!(closed_types, ["session.open", "session.driver.register", "session.close"]);
    assert_problem(&bae.admin_send("GET", "/admin/v1/sessions/ses_nope/events", None), 404, "not_found");
}

#[test]
fn read_only_views_list_providers_and_mask_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bae-config.toml");
    std::fs::write(
        &file,
        r#"
        [[providers.entries]]
        name = "gw"
        provider = "openai"
        model = "gpt-x"
        auth_token = "${SOME_SECRET_VAR}"
        base_url = "http://127.0.0.1:9"

        [[mcp.servers]]
        name = "files"
        transport = "http"
        url = "http://127.0.0.1:9/mcp"
        headers = { Authorization = "Bearer ${TOKEN}" }
        "#,
    )
    .unwrap();
    let path = file.clone();
    let bae = Bae::start_with(move |config| {
        config.bae.config_file = Some(path.clone());
        config.bae.file = kestrel::config::bae::BaeFile::read(&path).unwrap();
        for (name, provider) in config.bae.file.providers() {
            config.providers.insert(name, provider);
        }
    });
    let providers = bae.admin_send("GET", "/admin/v1/providers", None).json;
    let gw = providers["items"].as_array().unwrap().iter().find(|p| p["name"] == "gw").unwrap().clone();
    assert_eq!(gw, json!({ "name": "gw", "provider": "openai", "model": "gpt-x", "base_url": "http://127.0.0.1:9" }));
    let names: Vec<&str> = providers["items"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert!(
        names.contains(&"fake") && names.contains(&"fake/claude-x") && names.contains(&"builtin/echo"),
        "{names:?}"
    );
    let mcp = bae.admin_send("GET", "/admin/v1/mcp-servers", None).json;
    assert_eq!(mcp, json!({ "items": [{ "name": "files", "transport": "http" }] }));
    let config = bae.admin_send("GET", "/admin/v1/config", None);
    assert_eq!(config.json["mcp"]["servers"][0]["headers"], json!({ "Authorization": "••••••••" }));
    assert!(config.json["providers"]["entries"].as_array().unwrap().iter().all(|e| e["auth_token"] == "••••••••"));
    assert!(!config.text.contains("TOKEN}") && !config.text.contains("SOME_SECRET_VAR"), "{}", config.text);
    assert_eq!(config.json["telemetry"]["service_name"], "baesrv");
    assert_eq!(bae.admin_send("GET", "/admin/v1/sandbox-status", None).json, json!({ "items": [] }));
}

/// Names (of profiles, keys, the providers and servers a profile lists) are held to 200
/// characters with no control or bidirectional formatting character, so none can forge a log
/// line or show reversed.
#[test]
fn admin_names_are_bounded_and_free_of_control_and_bidi_characters() {
    let bae = Bae::start();
    let profile = |name: &str| {
        let body = json!({ "name": name, "primary_provider": "fake" });
        bae.admin_send("POST", "/admin/v1/profiles", Some(body))
    };
    for bad in [
        "x".repeat(10 * 1024 * 1024),
        "nul\0".into(),
        "ansi \u{1b}[31mred".into(),
        "rlo \u{202e}txt".into(),
        "line\nbreak".into(),
        "x".repeat(201),
    ] {
        assert_problem(&profile(&bad), 400, "bad_request");
    }
    let listed = bae.admin_send(
        "POST",
        "/admin/v1/profiles",
        Some(json!({ "name": "lists", "primary_provider": "fake", "mcp_servers": ["ok", "bad\u{1b}"] })),
    );
    assert_problem(&listed, 400, "bad_request");
    let good = profile(&"é".repeat(200));
    assert_eq!(good.status, 201, "{}", good.text);
    let profile_id = good.json["id"].as_str().unwrap().to_string();
    for bad in ["key\u{2066}", "key\r\nforged"] {
        let key = bae.admin_send("POST", "/admin/v1/keys", Some(json!({ "name": bad, "profile_id": profile_id })));
        assert_problem(&key, 400, "bad_request");
    }
    let key = bae.admin_send("POST", "/admin/v1/keys", Some(json!({ "name": "fine name", "profile_id": profile_id })));
    assert_eq!(key.status, 201, "{}", key.text);
}
