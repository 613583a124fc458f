//! Smaller ways hostile or unlucky input used to get a 500, a panic or a wedged session.

use serde_json::json;

use crate::support::{SseClient, TestServer};

#[test]
fn an_overlong_path_is_a_bad_path_not_a_server_error() {
    let server = TestServer::start();
    let id = server.create_session(json!({}));
    let long_name = "a".repeat(300);
    let deep = "d/".repeat(2100);
    for route in ["file", "files"] {
        for path in [&long_name, &deep] {
            server.get(&format!("/api/sessions/{id}/{route}?path={path}")).assert_error(400, "invalid_path");
        }
    }
}

#[test]
fn last_event_id_is_plain_decimal_digits() {
    let server = TestServer::start();
    let id = server.create_session(json!({}));
    for bad in ["+5", "-1", "5x", "0x10", "1e3", "99999999999999999999999"] {
        let header =
            SseClient::open_with_header(&server.base, &format!("/api/sessions/{id}/events"), "Last-Event-ID", bad);
        assert_eq!(header, 400, "Last-Event-ID: {bad}");
        let query = server.get(&format!("/api/sessions/{id}/events?lastEventId={}", bad.replace('+', "%2B")));
        query.assert_error(400, "invalid_body");
    }
    let fine = SseClient::open(&server.base, &format!("/api/sessions/{id}/events"), None, Some(5));
    assert_eq!(fine.status, 200);
}

#[test]
fn routes_that_only_check_a_session_do_not_read_its_transcript() {
    let mut server = TestServer::start();
    let id = server.create_session(json!({}));
    server.run_to_end(&id, "hello");
    server.stop();
    // Damage the stored transcript: a route that decodes it fails, one that does not is fine.
    crate::support::Db::open(&server.data_dir)
        .exec("UPDATE messages SET body = 'not json' WHERE session_id = ?1", &[&id]);
    server.restart(|_| {});
    server.get(&format!("/api/sessions/{id}")).assert_error(500, "internal_error");
    let stream = SseClient::open(&server.base, &format!("/api/sessions/{id}/events"), None, None);
    assert_eq!(stream.status, 200, "the event stream only checks the session exists");
    assert_eq!(server.post(&format!("/api/sessions/{id}/cancel"), json!({})).status, 200);
    assert_eq!(server.get(&format!("/api/sessions/{id}/files")).status, 200);
    server
        .post(&format!("/api/sessions/{id}/approvals/apr_x"), json!({ "approved": true }))
        .assert_error(404, "approval_not_found");
}

#[test]
fn fifos_and_devices_are_refused_by_every_file_tool_and_route_without_blocking() {
    let server = TestServer::start_with(|config| {
        for tool in ["write_file", "edit_file"] {
            config.agent.permissions.insert(tool.into(), kestrel::engine::tools::Permission::Auto);
        }
    });
    let fifo = server.workspace.join("pipe");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    std::fs::write(server.workspace.join("plain.txt"), "pipe dreams\n").unwrap();
    let id = server.create_session(json!({}));
    server.get(&format!("/api/sessions/{id}/file?path=pipe")).assert_error(400, "invalid_path");
    let listing = server.get(&format!("/api/sessions/{id}/files"));
    assert_eq!(listing.status, 200, "a listing names a FIFO without opening it");
    for (tool, arguments) in [
        ("read_file", json!({ "path": "pipe" })),
        ("write_file", json!({ "path": "pipe", "content": "x" })),
        ("edit_file", json!({ "path": "pipe", "oldString": "a", "newString": "b" })),
    ] {
        let result = tool_result(&server, &id, tool, arguments);
        assert_eq!(result["ok"], false, "{tool}: {result}");
        assert!(result["content"].as_str().unwrap().contains("not a regular file"), "{tool}: {result}");
    }
    let searched = tool_result(&server, &id, "search_text", json!({ "pattern": "pipe" }));
    assert!(searched["content"].as_str().unwrap().contains("plain.txt"), "{searched}");
    assert_eq!(server.get(&format!("/api/sessions/{id}")).json["session"]["status"], "idle");
}

fn tool_result(server: &TestServer, session: &str, name: &str, arguments: serde_json::Value) -> serde_json::Value {
    let events = server.run_to_end(session, &format!("/tool {name} {arguments}"));
    let finished = events
        .iter()
        .find(|e| crate::support::event_type(e) == "tool.finished")
        .unwrap_or_else(|| panic!("{events:#?}"));
    finished["event"]["result"].clone()
}

/// The data dir is its owner's alone (0700), and so are the database and its WAL files and
/// the key files (0600), fresh or made so at start.
#[test]
fn the_data_dir_the_database_and_the_key_files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    let mut server = TestServer::start();
    let id = server.create_session(json!({}));
    server.run_to_end(&id, "hello");
    let data = server.data_dir.clone();
    assert_eq!(mode(&data), 0o700);
    // On PostgreSQL the database is the server's to keep private; the data dir's files are.
    let database: &[&str] = match crate::support::on_postgres() {
        true => &[],
        false => &["kestrel.db", "kestrel.db-wal", "kestrel.db-shm"],
    };
    for file in database.iter().chain(&["admin-key", "bae-key-secret"]) {
        assert_eq!(mode(&data.join(file)), 0o600, "{file}");
    }
    // An older install's looser modes are tightened at the next start.
    server.stop();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    for file in database {
        std::fs::set_permissions(data.join(file), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    server.restart(|_| {});
    assert_eq!(mode(&data), 0o700);
    for file in database {
        assert_eq!(mode(&data.join(file)), 0o600, "{file}");
    }
}
