//! Where a session may work: inside the allowed roots, never over the server's own files.

use std::fs;

use serde_json::{json, Value};

use crate::support::{event_type, test_config, TestServer};

fn tool_result(server: &TestServer, session: &str, name: &str, arguments: Value) -> Value {
    let events = server.run_to_end(session, &format!("/tool {name} {arguments}"));
    let finished = events.iter().find(|e| event_type(e) == "tool.finished").unwrap_or_else(|| panic!("{events:#?}"));
    finished["event"]["result"].clone()
}

#[test]
fn a_tenant_cannot_choose_a_workspace_outside_the_roots() {
    let server = TestServer::start_with(|config| {
        config.auth.tokens.push(kestrel::config::TokenConfig::new("a", "token-a"));
        config.auth.tokens.push(kestrel::config::TokenConfig::new("b", "token-b"));
    });
    let b = server.client().with_token(Some("token-b"));
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/", server.workspace.join("to-root")).unwrap();
    let data_dir = server.data_dir.to_str().unwrap().to_string();
    let link = server.workspace.join("to-root").to_str().unwrap().to_string();
    for workspace in
        ["/", "/proc/self", "/proc", "/etc", data_dir.as_str(), outside.path().to_str().unwrap(), link.as_str()]
    {
        let response = b.post("/api/sessions", json!({ "workspace": workspace }));
        response.assert_error(403, "forbidden");
    }
    // Inside the default workspace is fine, and so is the default itself.
    fs::create_dir(server.workspace.join("project")).unwrap();
    let inside = b.post("/api/sessions", json!({ "workspace": server.workspace.join("project") }));
    assert_eq!(inside.status, 201, "{}", inside.text);
    let id = inside.json["session"]["id"].as_str().unwrap().to_string();
    // PATCH checks the same way.
    b.patch_json(&format!("/api/sessions/{id}"), json!({ "workspace": "/" })).assert_error(403, "forbidden");
    b.patch_json(&format!("/api/sessions/{id}"), json!({ "workspace": link })).assert_error(403, "forbidden");
    let moved = b.patch_json(&format!("/api/sessions/{id}"), json!({ "workspace": server.workspace }));
    assert_eq!(moved.status, 200, "{}", moved.text);
    assert_eq!(moved.json["session"]["workspace"], server.workspace.canonicalize().unwrap().to_str().unwrap());
}

#[test]
fn the_data_dir_and_the_config_file_are_out_of_reach_inside_the_default_workspace() {
    // The way `cargo run --release` starts: data and config inside the start directory.
    let root = tempfile::tempdir().unwrap();
    let data_dir = root.path().join("kestrel-data");
    let config_file = root.path().join("kestrel.toml");
    fs::write(&config_file, "[auth]\ntoken = \"config-file-secret\"\n").unwrap();
    fs::write(root.path().join("notes.txt"), "ordinary notes\n").unwrap();
    let mut config = test_config(&data_dir, root.path());
    config.file = Some(config_file);
    config.agent.permissions.insert("write_file".into(), kestrel::engine::tools::Permission::Auto);
    let server = TestServer::from_config(config);
    let id = server.create_session(json!({}));

    for path in
        ["kestrel-data/kestrel.db", "kestrel-data/kestrel.db-wal", "kestrel.toml", "./kestrel-data/../kestrel.toml"]
    {
        let result = tool_result(&server, &id, "read_file", json!({ "path": path }));
        assert_eq!(result["ok"], false, "{path}: {result}");
        assert!(result["content"].as_str().unwrap().contains("protected"), "{result}");
        server.get(&format!("/api/sessions/{id}/file?path={path}")).assert_error(403, "forbidden");
    }
    server.get(&format!("/api/sessions/{id}/files?path=kestrel-data")).assert_error(403, "forbidden");
    let written = tool_result(&server, &id, "write_file", json!({ "path": "kestrel.toml", "content": "x" }));
    assert_eq!(written["ok"], false);
    let searched = tool_result(&server, &id, "search_text", json!({ "pattern": "secret|notes" }));
    let text = searched["content"].as_str().unwrap();
    assert!(text.contains("notes.txt") && !text.contains("config-file-secret"), "{text}");
    let found = tool_result(&server, &id, "find_files", json!({ "pattern": "**/*" }));
    let text = found["content"].as_str().unwrap();
    assert!(text.contains("notes.txt") && !text.contains("kestrel.db") && !text.contains("kestrel.toml"), "{text}");
    assert!(fs::read_to_string(root.path().join("kestrel.toml")).unwrap().contains("config-file-secret"));
}

#[test]
fn each_tenant_has_its_own_roots_and_old_sessions_are_checked_again() {
    let acme_root = tempfile::tempdir().unwrap();
    let acme_path = acme_root.path().to_path_buf();
    let mut server = TestServer::start_with(move |config| {
        let mut acme = kestrel::config::TokenConfig::new("acme", "token-acme");
        acme.workspace_roots = Some(vec![acme_path]);
        config.auth.tokens.push(acme);
        config.auth.tokens.push(kestrel::config::TokenConfig::new("globex", "token-globex"));
    });
    let acme = server.client().with_token(Some("token-acme"));
    let globex = server.client().with_token(Some("token-globex"));
    // Acme's sessions default to its own root; the shared default workspace is not its.
    let created = acme.post("/api/sessions", json!({}));
    assert_eq!(created.status, 201, "{}", created.text);
    assert_eq!(created.json["session"]["workspace"], acme_root.path().canonicalize().unwrap().to_str().unwrap());
    acme.post("/api/sessions", json!({ "workspace": server.workspace })).assert_error(403, "forbidden");
    globex.post("/api/sessions", json!({ "workspace": acme_root.path() })).assert_error(403, "forbidden");
    let globex_session = globex.post("/api/sessions", json!({}));
    assert_eq!(globex_session.status, 201);
    let globex_id = globex_session.json["session"]["id"].as_str().unwrap().to_string();

    // Tighten the global roots: globex's stored session is outside them now.
    let elsewhere = tempfile::tempdir().unwrap();
    let roots = vec![elsewhere.path().to_path_buf()];
    server.restart(move |config| {
        config.agent.workspace_roots = roots;
        config.auth.tokens.push(kestrel::config::TokenConfig::new("globex", "token-globex"));
    });
    let globex = server.client().with_token(Some("token-globex"));
    globex.get(&format!("/api/sessions/{globex_id}/files")).assert_error(403, "forbidden");
}
