//! Plugins: manifests read and checked, a broken one reported without stopping anything, and
//! the web assets served as static files with no way out of `web/`.

use std::fs;
use std::path::Path;

use serde_json::{json, Value};

use crate::support::TestServer;

fn plugin(dir: &Path, name: &str, manifest: Value, files: &[(&str, &str)]) {
    let root = dir.join(name);
    fs::create_dir_all(root.join("web")).unwrap();
    fs::write(root.join("plugin.json"), manifest.to_string()).unwrap();
    for (path, content) in files {
        let file = root.join(path);
        fs::create_dir_all(file.parent().unwrap()).unwrap();
        fs::write(file, content).unwrap();
    }
}

fn with_plugins(setup: impl FnOnce(&Path)) -> (TestServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path());
    let plugins = dir.path().to_path_buf();
    let server = TestServer::start_with(move |config| {
        config.plugins.dir = Some(plugins);
        config.auth.token = Some("secret".into());
    });
    (server, dir)
}

#[test]
fn plugins_are_listed_a_broken_one_is_reported_and_assets_are_served_without_escapes() {
    let (server, dir) = with_plugins(|dir| {
        let manifest = json!({ "id": "hello", "name": "Hello", "version": "1.2.0", "description": "Says hello",
            "web": { "entry": "index.js", "stylesheet": "css/style.css" } });
        plugin(dir, "hello", manifest, &[("web/index.js", "export default 1;\n"), ("web/css/style.css", "body{}\n")]);
        plugin(dir, "broken", json!({ "id": "Broken!", "name": "x", "version": "1" }), &[]);
        fs::create_dir_all(dir.join("not-a-plugin")).unwrap();
        fs::write(dir.join("secret.txt"), "outside web/").unwrap();
    });
    let client = server.client().with_token(Some("secret"));
    let listed = client.get("/api/plugins");
    assert_eq!(listed.status, 200, "{}", listed.text);
    let plugins = listed.json["plugins"].as_array().unwrap();
    assert_eq!(plugins.len(), 2, "{plugins:?}");
    let broken = plugins.iter().find(|p| p["status"] == "failed").unwrap();
    assert_eq!(broken["id"], "broken");
    assert!(broken["error"].as_str().unwrap().contains("id"), "{broken}");
    let hello = plugins.iter().find(|p| p["id"] == "hello").unwrap();
    assert_eq!(hello["status"], "active");
    assert_eq!(
        hello["web"],
        json!({ "entry": "/plugins/hello/web/index.js", "stylesheet": "/plugins/hello/web/css/style.css" })
    );
    assert_eq!(client.get("/api/health").json["plugins"], 1);
    assert_eq!(client.get("/api/bootstrap").json["plugins"], listed.json["plugins"]);

    // The broken plugin is a notice in the log (replayed from the start).
    let mut events = crate::support::SseClient::open(&server.base, "/api/events", Some("secret"), Some(0));
    let replayed = events.drain_events();
    assert!(
        replayed.iter().any(
            |e| e["event"]["type"] == "notice" && e["event"]["message"].as_str().unwrap().contains("plugin broken")
        ),
        "{replayed:#?}"
    );

    // Assets: no token needed, the right type, nothing outside web/.
    let anonymous = server.client().with_token(None);
    let entry = anonymous.get("/plugins/hello/web/index.js");
    assert_eq!(entry.status, 200);
    assert_eq!(entry.text, "export default 1;\n");
    assert_eq!(entry.header("content-type"), Some("text/javascript; charset=utf-8"));
    assert_eq!(
        anonymous.get("/plugins/hello/web/css/style.css").header("content-type"),
        Some("text/css; charset=utf-8")
    );
    std::os::unix::fs::symlink(dir.path().join("secret.txt"), dir.path().join("hello/web/link.txt")).unwrap();
    for (path, status) in [
        // The client resolves the dots itself: this one asks for /plugins/hello/plugin.json.
        ("/plugins/hello/web/../plugin.json", 404),
        ("/plugins/hello/web/%2e%2e/plugin.json", 404),
        ("/plugins/hello/web/link.txt", 403),
        ("/plugins/hello/web/css", 403),
        ("/plugins/hello/web/missing.js", 404),
        ("/plugins/broken/web/x.js", 404),
        ("/plugins/nope/web/index.js", 404),
        ("/plugins/hello/plugin.json", 404),
    ] {
        let answer = anonymous.get(path);
        assert_eq!(answer.status, status, "{path}: {}", answer.text);
        assert!(!answer.text.contains("outside web/"), "{path} leaked a file");
    }
    assert_eq!(anonymous.send("POST", "/plugins/hello/web/index.js", Some(b"{}")).status, 405);
    // Dots sent as they are, on a raw socket.
    for raw in [
        "/plugins/hello/web/../plugin.json",
        "/plugins/hello/web/css/../../plugin.json",
        "/plugins/hello/web//etc/passwd",
    ] {
        let answer = raw_get(&server.base, raw);
        assert!(answer.starts_with("HTTP/1.1 403"), "{raw}: {answer}");
        assert!(!answer.contains("\"version\""), "{raw} leaked the manifest");
    }
}

fn raw_get(base: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut socket = std::net::TcpStream::connect(base.trim_start_matches("http://")).unwrap();
    socket.set_read_timeout(Some(crate::support::WAIT)).unwrap();
    write!(socket, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = socket.read_to_string(&mut answer);
    answer
}
