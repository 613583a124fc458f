//! run_command's sandbox (docs/sandbox.md), over HTTP with the real server: a command changes
//! only its workspace (nothing in `read-only`), reads none of the server's files nor a home's
//! secrets, sees a private `/tmp` and no other process, has no network unless allowed, a
//! tenant's own setting wins over the server's, its whole tree dies at its timeout, its cancel
//! and the server's kill -9; where bubblewrap cannot run, commands run unsandboxed and
//! `/api/bootstrap` and every `run.started` say so.
//!
//! bubblewrap is installed here and in CI (`.ci/run`), so these tests exercise it; on a host
//! where it cannot run they check the honest fallback instead.

use std::net::TcpListener;
use std::path::{Path, PathBuf};

use kestrel::config::TokenConfig;
use kestrel::domain::SandboxMode;
use kestrel::engine::tools::Permission;
use kestrel::Config;
use serde_json::{json, Value};

use crate::support::{event_type, is_run_end, wait_until, Client, SseClient, TestServer};

/// Whether bubblewrap can make a sandbox on this host at all; `KESTREL_REQUIRE_BWRAP=1` (set by
/// `.ci/run`) makes a host where it cannot a failure, not a fallback to check.
fn bwrap_works() -> bool {
    let works = std::process::Command::new("bwrap")
        .args(["--ro-bind", "/", "/", "--unshare-all", "true"])
        .status()
        .is_ok_and(|status| status.success());
    let required = std::env::var("KESTREL_REQUIRE_BWRAP").is_ok_and(|v| v == "1");
    assert!(works || !required, "KESTREL_REQUIRE_BWRAP=1 but bubblewrap cannot run here");
    works
}

/// A directory outside `/tmp` and every home (both of which the sandbox replaces), so what is
/// checked there is the sandbox's read-only host, not a private tmpfs.
fn outside_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// A server whose commands run without asking.
fn server(adjust: impl FnOnce(&mut Config)) -> TestServer {
    TestServer::start_with(|config| {
        config.agent.permissions.insert("run_command".into(), Permission::Auto);
        adjust(config);
    })
}

/// A tenant's token that sets the tenant's own sandbox.
fn tenant(name: &str, mode: Option<SandboxMode>, network: Option<bool>) -> TokenConfig {
    let mut token = TokenConfig::new(name, format!("token-{name}"));
    token.sandbox = mode;
    token.sandbox_network = network;
    token
}

/// `server`'s client with `tenant`'s token (`None`: the server's own).
fn client(server: &TestServer, tenant: Option<&str>) -> Client {
    match tenant {
        Some(name) => server.client().with_token(Some(&format!("token-{name}"))),
        None => server.client(),
    }
}

/// A new session of `client`'s tenant.
fn session(client: &Client) -> String {
    let created = client.post("/api/sessions", json!({}));
    assert_eq!(created.status, 201, "{}", created.text);
    created.json["session"]["id"].as_str().unwrap().to_string()
}

/// The events of a run that calls `run_command` with `arguments`.
fn command_run(server: &TestServer, client: &Client, session: &str, arguments: Value) -> Vec<Value> {
    let path = format!("/api/sessions/{session}/events");
    let mut stream = SseClient::open(&server.base, &path, client.token.as_deref(), None);
    let line = format!("/tool run_command {arguments}");
    let sent = client.post(&format!("/api/sessions/{session}/messages"), json!({ "content": line }));
    assert_eq!(sent.status, 202, "{}", sent.text);
    stream.collect_until(is_run_end)
}

/// The result of `command` run in `session`.
fn run(server: &TestServer, client: &Client, session: &str, command: &str) -> Value {
    result_of(&command_run(server, client, session, json!({ "command": command })))
}

fn result_of(events: &[Value]) -> Value {
    let finished = events.iter().find(|e| event_type(e) == "tool.finished").unwrap_or_else(|| panic!("{events:#?}"));
    finished["event"]["result"].clone()
}

fn output(result: &Value) -> &str {
    result["content"].as_str().unwrap()
}

/// The `sandbox` a run's `run.started` carried.
fn announced(events: &[Value]) -> Value {
    let started = events.iter().find(|e| event_type(e) == "run.started").unwrap_or_else(|| panic!("{events:#?}"));
    started["event"]["sandbox"].clone()
}

/// Live processes (by host pid, zombies left out) whose `KESTREL_COMMAND` marker names
/// `session`.
pub(crate) fn marked(session: &str) -> Vec<i32> {
    let prefix = format!("KESTREL_COMMAND={session}:");
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<i32>().ok()) else { continue };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else { continue };
        let alive = std::fs::read_to_string(entry.path().join("stat")).is_ok_and(|stat| !stat.contains(") Z "));
        if alive && environ.split(|&b| b == 0).any(|var| var.starts_with(prefix.as_bytes())) {
            pids.push(pid);
        }
    }
    pids
}

/// Files a failing test may have left where it must not write, removed when dropped.
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A file of the test user's home, removed when dropped.
struct HomeFile(PathBuf);

impl HomeFile {
    fn new(content: &str) -> HomeFile {
        let home = std::env::var("HOME").expect("HOME is set");
        let path = Path::new(&home).join(format!(".kestrel-sandbox-test-{}", uuid::Uuid::new_v4().simple()));
        std::fs::write(&path, content).unwrap();
        HomeFile(path)
    }
}

impl Drop for HomeFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn a_command_changes_only_its_workspace_and_reads_none_of_the_servers_files_or_a_homes_secrets() {
    // The data dir inside the workspace (as the default workspace, the start directory, often
    // holds it), the config file beside it: neither under /tmp nor a home.
    let outside = outside_dir();
    let workspace = outside.path().join("project");
    let data_dir = workspace.join("kestrel-data");
    std::fs::create_dir_all(&data_dir).unwrap();
    let config_file = outside.path().join("kestrel.toml");
    std::fs::write(&config_file, "# SECRET-IN-CONFIG\n").unwrap();
    let home_secret = HomeFile::new("SECRET-IN-HOME");
    let host_tmp = std::env::temp_dir().join(format!("kestrel-sandbox-host-{}", uuid::Uuid::new_v4().simple()));
    std::fs::write(&host_tmp, "SECRET-IN-TMP").unwrap();
    let (ws, data, config_path) = (workspace.clone(), data_dir.clone(), config_file.clone());
    let server = server(move |config| {
        config.agent.workspace = Some(ws);
        config.server.data_dir = data;
        config.file = Some(config_path);
    });
    let client = client(&server, None);
    let bootstrap = client.get("/api/bootstrap").json;
    if !bwrap_works() {
        assert_eq!(bootstrap["sandbox"]["mode"], "off", "{bootstrap}");
        assert!(bootstrap["sandbox"]["reason"].is_string(), "{bootstrap}");
        return;
    }
    assert_eq!(
        bootstrap["sandbox"],
        json!({ "requested": "workspace-write", "mode": "workspace-write", "network": false }),
        "the default: sandboxed, no network"
    );
    let id = session(&client);
    let home_escape = Path::new(&std::env::var("HOME").unwrap()).join(format!("kestrel-escape-{id}"));
    let tmp_escape = std::env::temp_dir().join(format!("kestrel-escape-{id}"));
    let outside_escape = outside.path().join("escape.txt");
    let _cleanup = Cleanup(vec![home_escape.clone(), tmp_escape.clone(), host_tmp.clone()]);
    let script = format!(
        "echo made > inside.txt; echo x > {}; echo x > {}; echo x > {}; true",
        outside_escape.display(),
        home_escape.display(),
        tmp_escape.display()
    );
    let events = command_run(&server, &client, &id, json!({ "command": script }));
    assert_eq!(announced(&events), bootstrap["sandbox"], "every run says how its commands are contained");
    assert_eq!(result_of(&events)["data"]["sandbox"], "workspace-write");
    assert_eq!(std::fs::read_to_string(workspace.join("inside.txt")).unwrap(), "made\n", "the workspace is writable");
    assert!(!outside_escape.exists(), "a directory outside the workspace is read-only");
    assert!(!home_escape.exists(), "a home is not the host's");
    assert!(!tmp_escape.exists(), "/tmp is private");

    // Nothing of the server's, nothing of a home, nothing in the host's /tmp.
    // The lock file is in the data dir on either store (SQLite's file is too, when it is the store).
    assert!(data_dir.join("kestrel.lock").exists(), "the data dir holds the server's files");
    let reads = format!(
        "ls -A kestrel-data | wc -l; cat kestrel-data/kestrel.lock kestrel-data/kestrel.db {} {} {} 2>/dev/null; cat /proc/{}/environ 2>/dev/null; true",
        config_file.display(),
        home_secret.0.display(),
        host_tmp.display(),
        std::process::id()
    );
    let read = run(&server, &client, &id, &reads);
    assert_eq!(output(&read), "exit code 0\n0\n", "nothing secret was read");
    // Root inside (the tests run as root) has no capability to uncover the host.
    let remounted = outside.path().join("remounted.txt");
    let uncover = format!(
        "umount -l /tmp 2>/dev/null; mount -o remount,bind,rw / 2>/dev/null; cat {} 2>/dev/null; echo x 2>/dev/null > {}; true",
        host_tmp.display(),
        remounted.display()
    );
    assert_eq!(output(&run(&server, &client, &id, &uncover)), "exit code 0\n");
    assert!(!remounted.exists(), "the host stayed read-only");
    // The sandbox's /proc is its own: no process but its own, the server's environment out of reach.
    let processes = run(&server, &client, &id, "ls /proc | grep -c '^[0-9]'");
    let count: usize = output(&processes).lines().nth(1).unwrap().trim().parse().unwrap();
    assert!(count < 10, "{}", output(&processes));
}

#[test]
fn a_read_only_sandbox_keeps_the_workspace_as_it_was() {
    let server = server(|config| config.agent.sandbox = SandboxMode::ReadOnly);
    std::fs::write(server.workspace.join("notes.txt"), "kept\n").unwrap();
    let client = client(&server, None);
    let bootstrap = client.get("/api/bootstrap").json;
    assert_eq!(bootstrap["sandbox"]["requested"], "read-only", "{bootstrap}");
    if !bwrap_works() {
        return assert_eq!(bootstrap["sandbox"]["mode"], "off", "{bootstrap}");
    }
    assert_eq!(bootstrap["sandbox"]["mode"], "read-only", "{bootstrap}");
    let id = session(&client);
    let result = run(&server, &client, &id, "cat notes.txt; echo changed > notes.txt; echo new > new.txt");
    assert_eq!(result["ok"], false, "the writes failed: {result}");
    assert!(output(&result).contains("kept"), "the workspace is readable: {}", output(&result));
    assert_eq!(std::fs::read_to_string(server.workspace.join("notes.txt")).unwrap(), "kept\n");
    assert!(!server.workspace.join("new.txt").exists());
}

#[test]
fn a_sandboxed_command_reaches_no_network_unless_its_tenant_allows_it() {
    let server = server(|config| {
        config.auth.tokens = vec![tenant("closed", None, None), tenant("open", None, Some(true))];
    });
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let connect =
        format!("python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 5); print('connected')\"");
    let (closed, open) = (client(&server, Some("closed")), client(&server, Some("open")));
    assert_eq!(open.get("/api/bootstrap").json["sandbox"]["network"], true);
    if !bwrap_works() {
        return;
    }
    assert_eq!(closed.get("/api/bootstrap").json["sandbox"]["network"], false);
    let refused = run(&server, &closed, &session(&closed), &connect);
    assert_eq!(refused["ok"], false, "{refused}");
    assert!(!output(&refused).contains("connected"));
    assert!(listener.accept().is_err(), "no connection reached the host's listener");
    let id = session(&open);
    let allowed = run(&server, &open, &id, &connect);
    assert_eq!(allowed["ok"], true, "{allowed}");
    assert!(output(&allowed).contains("connected"));
    listener.set_nonblocking(false).unwrap();
    listener.accept().expect("the allowed command's connection");
    assert_eq!(allowed["data"]["sandbox"], "workspace-write", "still sandboxed, with the network");
    let written = run(&server, &open, &id, &format!("echo x > {}/x", outside_dir().path().display()));
    assert_eq!(written["ok"], false, "the network is all it was given: {written}");
}

#[test]
fn a_tenants_own_sandbox_setting_overrides_the_servers() {
    let server = server(|config| {
        config.auth.tokens = vec![
            tenant("strict", Some(SandboxMode::ReadOnly), None),
            tenant("trusted", Some(SandboxMode::Off), None),
            tenant("plain", None, None),
        ];
    });
    let outside = outside_dir();
    let bootstrap = |name: &str| client(&server, Some(name)).get("/api/bootstrap").json["sandbox"].clone();
    assert_eq!(bootstrap("trusted"), json!({ "requested": "off", "mode": "off", "network": true }));
    assert_eq!(bootstrap("strict")["requested"], "read-only");
    assert_eq!(bootstrap("plain")["requested"], "workspace-write", "the server's setting");
    // The trusted tenant's commands run unsandboxed, as its operator chose.
    let trusted = client(&server, Some("trusted"));
    let escape = outside.path().join("trusted.txt");
    let events = command_run(
        &server,
        &trusted,
        &session(&trusted),
        json!({ "command": format!("echo x > {}", escape.display()) }),
    );
    assert_eq!(announced(&events)["mode"], "off");
    assert!(escape.exists(), "the trusted tenant is not sandboxed");
    if !bwrap_works() {
        return;
    }
    assert_eq!(bootstrap("strict")["mode"], "read-only");
    let strict = client(&server, Some("strict"));
    let refused = run(&server, &strict, &session(&strict), "echo x > strict.txt");
    assert_eq!(refused["ok"], false, "{refused}");
    assert!(!server.workspace.join("strict.txt").exists());
    let plain = client(&server, Some("plain"));
    let plain_session = session(&plain);
    let written = run(&server, &plain, &plain_session, "echo x > plain.txt");
    assert_eq!(written["ok"], true, "{written}");
    let blocked =
        run(&server, &plain, &plain_session, &format!("echo x > {}", outside.path().join("plain.txt").display()));
    assert_eq!(blocked["ok"], false, "{blocked}");
    assert!(!outside.path().join("plain.txt").exists());
}

#[test]
fn where_bubblewrap_cannot_run_commands_run_unsandboxed_and_every_run_says_so() {
    let server = server(|config| config.agent.sandbox_bwrap = "/nonexistent/kestrel/bwrap".into());
    let client = client(&server, None);
    let bootstrap = client.get("/api/bootstrap").json;
    let sandbox = &bootstrap["sandbox"];
    assert_eq!(
        (&sandbox["requested"], &sandbox["mode"], &sandbox["network"]),
        (&json!("workspace-write"), &json!("off"), &json!(true))
    );
    let reason = sandbox["reason"].as_str().unwrap();
    assert!(reason.contains("/nonexistent/kestrel/bwrap") && reason.contains("not found"), "{reason}");
    let outside = outside_dir();
    let escape = outside.path().join("unsandboxed.txt");
    let events = command_run(
        &server,
        &client,
        &session(&client),
        json!({ "command": format!("echo x > {}", escape.display()) }),
    );
    assert_eq!(&announced(&events), sandbox, "the run says it is unsandboxed, and why");
    assert_eq!(result_of(&events)["data"]["sandbox"], "off");
    assert!(escape.exists(), "the command ran, unsandboxed, as said");
    // Unsandboxed, a timeout still kills the command's whole tree, what left its group too.
    let id = session(&client);
    let events = command_run(&server, &client, &id, json!({ "command": TREE, "timeoutSecs": 1 }));
    assert_eq!(result_of(&events)["data"]["timedOut"], true);
    wait_until("the unsandboxed command's tree to die", || marked(&id).is_empty());
}

/// A command that starts a tree (a background child, one in a session of its own, a
/// `nohup` one), says so in `started.txt`, and waits.
const TREE: &str = "sleep 300 & setsid sleep 301 & nohup sleep 302 > /dev/null 2>&1 & echo started > started.txt; wait";

#[test]
fn a_sandboxed_commands_whole_tree_dies_at_its_timeout_and_at_a_cancel() {
    let server = server(|_| {});
    let client = client(&server, None);
    let id = session(&client);
    let tree = TREE;
    let events = command_run(&server, &client, &id, json!({ "command": tree, "timeoutSecs": 1 }));
    let result = result_of(&events);
    assert_eq!(result["data"]["timedOut"], true, "{result}");
    wait_until("the timed-out command's tree to die", || marked(&id).is_empty());

    std::fs::remove_file(server.workspace.join("started.txt")).unwrap();
    let path = format!("/api/sessions/{id}/events");
    let mut stream = SseClient::open(&server.base, &path, None, None);
    let line = format!("/tool run_command {}", json!({ "command": tree }));
    assert_eq!(client.post(&format!("/api/sessions/{id}/messages"), json!({ "content": line })).status, 202);
    wait_until("the command to start its tree", || server.workspace.join("started.txt").exists());
    assert!(!marked(&id).is_empty(), "the tree carries the session's marker");
    assert_eq!(client.post(&format!("/api/sessions/{id}/cancel"), json!({})).json["cancelled"], true);
    let events = stream.collect_until(is_run_end);
    assert_eq!(result_of(&events)["data"]["cancelled"], true);
    wait_until("the cancelled command's tree to die", || marked(&id).is_empty());
}

#[test]
fn a_sandboxed_command_and_what_it_started_die_with_a_killed_server() {
    if !bwrap_works() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let config = "[agent.permissions]\nrun_command = \"auto\"\n[builtin]\ndelay_ms = 1\n";
    let (mut child, base, _) = crate::support::spawn_binary(data.path(), workspace.path(), config);
    let client = Client { base: base.clone(), token: None };
    let id = session(&client);
    let command = "sleep 300 & setsid sleep 301 & echo started > started.txt; wait";
    let line = format!("/tool run_command {}", json!({ "command": command }));
    assert_eq!(client.post(&format!("/api/sessions/{id}/messages"), json!({ "content": line })).status, 202);
    wait_until("the command to start", || workspace.path().join("started.txt").exists());
    assert!(!marked(&id).is_empty());
    child.kill().unwrap();
    child.wait().unwrap();
    // No restart needed: the sandbox ends with the server, and everything in it.
    wait_until("every process of the command to die with the server", || marked(&id).is_empty());
}

#[test]
fn the_console_says_when_commands_run_unsandboxed() {
    let Some(browser) = crate::browser::browser() else { return };
    let server = server(|config| config.agent.sandbox_bwrap = "/nonexistent/kestrel/bwrap".into());
    browser.open(&format!("{}/", server.base));
    browser.wait_for("the console", "document.querySelector('#new-session')");
    browser.wait_for("the notice", "document.querySelector('#sandbox-notice.warn')");
    let notice = browser.text("#sandbox-notice");
    assert!(notice.starts_with("Commands run unsandboxed: bubblewrap (/nonexistent/kestrel/bwrap)"), "{notice}");
    if !bwrap_works() {
        return;
    }
    let sandboxed = server_with_console_checked(&browser);
    assert_eq!(sandboxed, serde_json::Value::Bool(false), "no notice while commands are sandboxed");
}

/// Whether the console of a server whose commands are sandboxed shows a sandbox notice.
fn server_with_console_checked(browser: &crate::browser::Browser) -> Value {
    let server = server(|_| {});
    browser.open(&format!("{}/", server.base));
    browser.wait_for("the console", "document.querySelector('#new-session')");
    browser.eval("return document.querySelector('#sandbox-notice') !== null;", json!([]))
}
