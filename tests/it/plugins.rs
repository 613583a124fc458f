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
    write!(socket, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = socket.read_to_string(&mut answer);
    answer
}

const TOOL_SCRIPT: &str = r#"input=$(cat)
case "$input" in
  *fail*) echo "it went wrong" >&2; exit 3 ;;
  *slow*) sleep 5 ;;
esac
printf '{"ok": true, "content": "ran in %s", "data": {"got": %s, "dir": "%s"}}' "$(pwd)" "$input" "$KESTREL_PLUGIN_DIR"
"#;

#[test]
fn a_plugin_tool_runs_as_a_subprocess_with_the_rules_of_a_built_in_one() {
    let dir = tempfile::tempdir().unwrap();
    let tool = |name: &str, permission: &str, timeout: u64| {
        json!({ "name": name, "description": "A plugin tool", "permission": permission, "timeoutSecs": timeout,
                "parameters": { "type": "object", "properties": { "mode": { "type": "string" } } },
                "command": ["/bin/sh", "{pluginDir}/tool.sh"] })
    };
    let manifest = json!({ "id": "kit", "name": "Kit", "version": "0.1.0",
        "tools": [tool("kit_run", "auto", 1), tool("kit_asked", "ask", 5)] });
    plugin(dir.path(), "kit", manifest, &[("tool.sh", TOOL_SCRIPT)]);
    // A later plugin may not take a tool name that is already taken.
    let clash = json!({ "id": "clash", "name": "Clash", "version": "1", "tools": [tool("kit_run", "auto", 1)] });
    plugin(dir.path(), "zz-clash", clash, &[("tool.sh", TOOL_SCRIPT)]);
    let plugins = dir.path().to_path_buf();
    let server = TestServer::start_with(move |config| config.plugins.dir = Some(plugins));
    let listed = server.get("/api/plugins").json;
    assert_eq!(listed["plugins"][0]["tools"], json!(["kit_run", "kit_asked"]));
    assert_eq!(listed["plugins"][1]["status"], "failed", "{listed}");
    let schemas = server.get("/api/bootstrap").json["tools"].clone();
    let kit = schemas.as_array().unwrap().iter().find(|t| t["name"] == "kit_run").unwrap().clone();
    assert_eq!((kit["permission"].as_str(), kit["category"].as_str()), (Some("auto"), Some("plugin:kit")));

    let id = server.create_session(json!({}));
    let result = |line: &str| {
        let events = server.run_to_end(&id, line);
        let finished = events.iter().find(|e| crate::support::event_type(e) == "tool.finished");
        finished.unwrap_or_else(|| panic!("{events:#?}"))["event"]["result"].clone()
    };
    let ran = result(r#"/tool kit_run {"mode": "fine"}"#);
    assert_eq!(ran["ok"], true, "{ran}");
    let workspace = server.workspace.canonicalize().unwrap();
    assert_eq!(ran["content"], format!("ran in {}", workspace.display()));
    assert_eq!(ran["data"]["got"], json!({ "mode": "fine" }), "the arguments arrive as JSON on stdin");
    assert_eq!(ran["data"]["dir"], dir.path().join("kit").to_string_lossy().as_ref());

    let failed = result(r#"/tool kit_run {"mode": "fail"}"#);
    assert_eq!(failed["ok"], false);
    assert!(failed["error"].as_str().unwrap().contains("exit code 3: it went wrong"), "{failed}");
    let slow = result(r#"/tool kit_run {"mode": "slow"}"#);
    assert_eq!(slow["ok"], false);
    assert!(slow["error"].as_str().unwrap().contains("timed out after 1 s"), "{slow}");

    // An `ask` tool waits for a person, like a built-in one.
    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    let sent = server.post(&format!("/api/sessions/{id}/messages"), json!({ "content": "/tool kit_asked {}" }));
    assert_eq!(sent.status, 202);
    let asked = stream.collect_until(|e| crate::support::event_type(e) == "approval.requested").pop().unwrap();
    let approval = asked["event"]["approval"]["id"].as_str().unwrap().to_string();
    let decided = server.post(&format!("/api/sessions/{id}/approvals/{approval}"), json!({ "approved": false }));
    assert_eq!(decided.status, 200);
    let denied = stream.collect_until(|e| crate::support::event_type(e) == "tool.finished").pop().unwrap();
    assert_eq!(denied["event"]["result"]["ok"], false);
    stream.collect_until(crate::support::is_run_end);
}

#[test]
fn hot_reload_announces_a_burst_of_saves_once_and_a_manifest_change_reloads_the_list() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = json!({ "id": "live", "name": "Live", "version": "1", "web": { "entry": "index.js" } });
    plugin(dir.path(), "live", manifest, &[("web/index.js", "v1")]);
    let plugins = dir.path().to_path_buf();
    let server = TestServer::start_with(move |config| {
        config.plugins.dir = Some(plugins);
        config.plugins.hot_reload = true;
    });
    let revision = |server: &TestServer| server.get("/api/plugins").json["plugins"][0]["web"]["revision"].clone();
    let before = revision(&server);
    assert!(before.as_str().is_some_and(|r| !r.is_empty()), "a revision while hot reload watches");

    let mut stream = crate::support::SseClient::open(&server.base, "/api/plugins/events", None, None);
    let (name, ready) = next_named(&mut stream, crate::support::WAIT).expect("the ready frame");
    assert_eq!(name, "ready");
    assert_eq!(ready["enabled"], true);
    assert_eq!(ready["plugins"][0]["id"], "live");

    // A burst of saves: one event, within two seconds, with the new revision.
    let saved = std::time::Instant::now();
    // Saves spread over more than one poll (shaping the input, not waiting for the server).
    for version in ["v2", "v3", "v4"] {
        fs::write(dir.path().join("live/web/index.js"), version).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(120));
    }
    fs::write(dir.path().join("live/web/extra.css"), "a{}").unwrap();
    let (name, changed) = next_named(&mut stream, crate::support::WAIT).expect("plugins.changed");
    assert!(saved.elapsed() < std::time::Duration::from_secs(2), "seen after {:?}", saved.elapsed());
    assert_eq!(name, "plugins.changed");
    assert_eq!(changed["type"], "plugins.changed");
    assert_eq!(changed["plugins"], json!([{ "id": "live", "revision": revision(&server) }]));
    assert_ne!(changed["plugins"][0]["revision"], before);
    assert!(changed["at"].as_str().is_some());
    assert!(next_named(&mut stream, std::time::Duration::from_millis(800)).is_none(), "the burst was one event");

    // A new manifest is read again: the list follows, and so do its tools.
    let tool = json!({ "name": "live_tool", "description": "d", "parameters": { "type": "object" },
                       "command": ["/bin/sh", "-c", "echo reloaded"], "permission": "auto" });
    let renamed = json!({ "id": "live", "name": "Live, renamed", "version": "2", "web": { "entry": "index.js" }, "tools": [tool] });
    fs::write(dir.path().join("live/plugin.json"), renamed.to_string()).unwrap();
    crate::support::wait_until("the manifest change to be picked up", || {
        server.get("/api/plugins").json["plugins"][0]["version"] == "2"
    });
    assert_eq!(server.get("/api/plugins").json["plugins"][0]["name"], "Live, renamed");
    let tools = server.get("/api/bootstrap").json["tools"].clone();
    assert!(tools.as_array().unwrap().iter().any(|t| t["name"] == "live_tool"), "{tools}");
    let id = server.create_session(json!({}));
    let events = server.run_to_end(&id, "/tool live_tool {}");
    let finished = events.iter().find(|e| crate::support::event_type(e) == "tool.finished").unwrap();
    assert_eq!(finished["event"]["result"]["content"], "reloaded\n", "{finished}");
}

#[test]
fn with_hot_reload_off_the_stream_says_so_and_stays_idle() {
    let dir = tempfile::tempdir().unwrap();
    plugin(
        dir.path(),
        "still",
        json!({ "id": "still", "name": "Still", "version": "1", "web": { "entry": "a.js" } }),
        &[("web/a.js", "1")],
    );
    let plugins = dir.path().to_path_buf();
    let server = TestServer::start_with(move |config| config.plugins.dir = Some(plugins));
    assert!(server.get("/api/plugins").json["plugins"][0]["web"].get("revision").is_none());
    let mut stream = crate::support::SseClient::open(&server.base, "/api/plugins/events", None, None);
    let (_, ready) = next_named(&mut stream, crate::support::WAIT).unwrap();
    assert_eq!(ready["enabled"], false);
    fs::write(dir.path().join("still/web/a.js"), "2").unwrap();
    assert!(next_named(&mut stream, std::time::Duration::from_millis(800)).is_none(), "nothing is watched");
}

/// The next named frame (pings skipped), or `None` when none comes within `within`.
fn next_named(stream: &mut crate::support::SseClient, within: std::time::Duration) -> Option<(String, Value)> {
    let deadline = std::time::Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match stream.next_item(left)? {
            crate::support::SseItem::Named(name, data) => return Some((name, data)),
            _ if left.is_zero() => return None,
            _ => {}
        }
    }
}

/// `web` as a link to `/` (or to anything): the plugin fails at load and nothing is served;
/// a link inside a real `web/`, even to a file of the plugin's own, is refused, never
/// followed; and with hot reload the watcher never walks the link's target.
#[test]
fn a_web_link_fails_the_plugin_and_no_link_inside_web_is_followed() {
    let (server, dir) = with_plugins(|dir| {
        let manifest = json!({ "id": "rooted", "name": "Rooted", "version": "1.0.0", "web": { "entry": "index.js" } });
        fs::create_dir_all(dir.join("rooted")).unwrap();
        fs::write(dir.join("rooted/plugin.json"), manifest.to_string()).unwrap();
        std::os::unix::fs::symlink("/", dir.join("rooted/web")).unwrap();
        let manifest = json!({ "id": "inner", "name": "Inner", "version": "1.0.0", "web": { "entry": "index.js" } });
        plugin(dir, "inner", manifest, &[("web/index.js", "export default 2;\n"), ("notes.txt", "the plugin's own")]);
        std::os::unix::fs::symlink(dir.join("inner/notes.txt"), dir.join("inner/web/notes.txt")).unwrap();
        std::os::unix::fs::symlink("/etc", dir.join("inner/web/etc")).unwrap();
    });
    let client = server.client().with_token(Some("secret"));
    let plugins = client.get("/api/plugins").json["plugins"].as_array().unwrap().clone();
    let rooted = plugins.iter().find(|p| p["id"] == "rooted").unwrap();
    assert_eq!(rooted["status"], "failed", "{rooted}");
    assert!(rooted["error"].as_str().unwrap().contains("web must be a directory"), "{rooted}");
    let anonymous = server.client().with_token(None);
    for path in ["/plugins/rooted/web/proc/self/environ", "/plugins/rooted/web/etc/passwd"] {
        let answer = anonymous.get(path);
        assert_eq!(answer.status, 404, "{path}: {}", answer.text);
    }
    assert_eq!(anonymous.get("/plugins/inner/web/index.js").text, "export default 2;\n");
    assert_eq!(anonymous.get("/plugins/inner/web/notes.txt").status, 403, "a link is not followed");
    assert_eq!(anonymous.get("/plugins/inner/web/etc/passwd").status, 403);
    drop(dir);
}

#[test]
fn a_revision_never_walks_through_a_link() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("linked")).unwrap();
    std::os::unix::fs::symlink("/", dir.path().join("linked/web")).unwrap();
    fs::create_dir_all(dir.path().join("empty/web")).unwrap();
    fs::create_dir_all(dir.path().join("inner/web")).unwrap();
    std::os::unix::fs::symlink("/usr", dir.path().join("inner/web/usr")).unwrap();
    fs::create_dir_all(dir.path().join("dangling/web")).unwrap();
    std::os::unix::fs::symlink("/nonexistent", dir.path().join("dangling/web/usr")).unwrap();
    let revision = |name: &str| kestrel::plugins::revision(&dir.path().join(name));
    assert_eq!(revision("linked"), revision("nope"), "a linked web/ is no tree at all");
    assert_eq!(revision("inner"), revision("dangling"), "what a link inside points at is not walked");
    assert_ne!(revision("inner"), revision("empty"));
}
