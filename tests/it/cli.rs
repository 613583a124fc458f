//! The `kestrel` binary itself: arguments, the refusal to serve unauthenticated, clean exits.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

fn kestrel(data: &std::path::Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kestrel"));
    command
        .env("KESTREL_DATA_DIR", data.join("data"))
        .env("KESTREL_ADMIN_ADDR", "127.0.0.1:0")
        .env("KESTREL_WORKSPACE", data)
        .env_remove("KESTREL_TOKEN")
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

#[test]
fn a_public_address_without_a_token_is_refused_with_a_reason() {
    let data = tempfile::tempdir().unwrap();
    let output = kestrel(data.path()).env("KESTREL_ADDR", "0.0.0.0:0").output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("without a token") && stderr.contains("--allow-unauthenticated"), "{stderr}");
}

#[test]
fn an_admin_address_off_the_loopback_or_not_a_literal_is_refused_at_start() {
    for (name, addr, why) in [
        ("KESTREL_ADMIN_ADDR", "0.0.0.0:8081", "not a loopback address"),
        ("BAE_ADMIN_ADDR", "192.0.2.1:8081", "not a loopback address"),
        ("KESTREL_ADMIN_ADDR", "localhost:8081", "not an IP:port literal"),
    ] {
        let data = tempfile::tempdir().unwrap();
        let mut command = kestrel(data.path());
        command.env_remove("KESTREL_ADMIN_ADDR").env(name, addr).env("KESTREL_ADDR", "127.0.0.1:0");
        let output = command.output().unwrap();
        assert!(!output.status.success(), "{name}={addr} was served");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(why), "{name}={addr}: {stderr}");
    }
}

#[test]
fn allow_unauthenticated_serves_and_sigterm_stops_cleanly() {
    let data = tempfile::tempdir().unwrap();
    let mut child =
        kestrel(data.path()).env("KESTREL_ADDR", "0.0.0.0:0").arg("--allow-unauthenticated").spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let port = line.trim().rsplit(':').next().unwrap().to_string();
    let health = crate::support::Client { base: format!("http://127.0.0.1:{port}"), token: None }.get("/api/health");
    assert_eq!(health.status, 200);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "a clean shutdown exits 0: {status:?}");
}

#[test]
fn bad_arguments_and_bad_config_files_exit_with_a_message() {
    let data = tempfile::tempdir().unwrap();
    let output = kestrel(data.path()).arg("--frobnicate").output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("unexpected argument '--frobnicate'"));

    let config = data.path().join("bad.toml");
    std::fs::write(&config, "[server]\naddres = \"x\"\n").unwrap();
    let output = kestrel(data.path()).arg("--config").arg(&config).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("addres"), "the unknown key is named: {stderr}");

    let version = kestrel(data.path()).arg("--version").output().unwrap();
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("kestrel "));
}

/// Starts the binary on `data` and returns it with its base URL.
fn serving(data: &std::path::Path) -> (std::process::Child, String) {
    let mut child = kestrel(data).env("KESTREL_ADDR", "127.0.0.1:0").spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let port = line.trim().rsplit(':').next().unwrap().to_string();
    (child, format!("http://127.0.0.1:{port}"))
}

#[test]
fn a_second_server_on_the_same_data_dir_exits_at_once_naming_the_first() {
    let data = tempfile::tempdir().unwrap();
    let (mut first, base) = serving(data.path());
    let second = kestrel(data.path()).env("KESTREL_ADDR", "127.0.0.1:0").output().unwrap();
    assert!(!second.status.success());
    let stderr = String::from_utf8_lossy(&second.stderr);
    let dir = data.path().join("data").canonicalize().unwrap();
    assert!(stderr.contains(dir.to_str().unwrap()), "names the data dir: {stderr}");
    assert!(stderr.contains(&format!("pid {}", first.id())), "names the other process: {stderr}");
    assert_eq!(crate::support::Client { base, token: None }.get("/api/health").status, 200, "the first goes on");
    // kill -9 leaves no stale lock behind.
    first.kill().unwrap();
    first.wait().unwrap();
    let (mut third, base) = serving(data.path());
    assert_eq!(crate::support::Client { base, token: None }.get("/api/health").status, 200);
    third.kill().unwrap();
    third.wait().unwrap();
}

#[test]
fn the_server_is_not_dumpable_so_its_environment_is_closed_to_its_users_processes() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    // Only root can start the server as another user; elsewhere there is nothing to compare.
    let me = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m)).unwrap_or(1);
    if me != 0 {
        eprintln!("skipped: needs root to run the server as an unprivileged user");
        return;
    }
    let data = tempfile::tempdir().unwrap();
    std::fs::set_permissions(data.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    // A copy the unprivileged user can reach, wherever the checkout lives.
    let binary = data.path().join("kestrel");
    std::fs::copy(env!("CARGO_BIN_EXE_kestrel"), &binary).unwrap();
    let mut child = Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "--"])
        .arg(&binary)
        .env("KESTREL_DATA_DIR", data.path().join("data"))
        .env("KESTREL_ADMIN_ADDR", "127.0.0.1:0")
        .env("KESTREL_WORKSPACE", data.path())
        .env("KESTREL_ADDR", "127.0.0.1:0")
        .env("OPENAI_API_KEY", "sk-not-for-other-processes")
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(line.contains("listening"), "{line}");
    // A dumpable process's /proc entries belong to its user (65534), who could read its
    // environment; a non-dumpable one's belong to root.
    let owner = std::fs::metadata(format!("/proc/{}/environ", child.id())).unwrap().uid();
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(owner, 0, "/proc/<pid>/environ is closed to the server's own user");
}

#[test]
fn a_default_workspace_inside_the_data_dir_is_refused_at_start() {
    let data = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(data.path().join("data/sessions")).unwrap();
    let output = kestrel(data.path())
        .env("KESTREL_ADDR", "127.0.0.1:0")
        .env("KESTREL_WORKSPACE", data.path().join("data/sessions"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("inside") && stderr.contains("protect"), "{stderr}");
}

#[test]
fn an_unknown_sandbox_driver_is_refused_at_start() {
    let data = tempfile::tempdir().unwrap();
    let output =
        kestrel(data.path()).env("KESTREL_ADDR", "127.0.0.1:0").env("BAE_SANDBOX_DRIVER", "apple").output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("sandbox_driver") && stderr.contains("apple"), "{stderr}");
}

#[test]
fn the_docker_driver_runs_the_docker_found_on_path() {
    let data = tempfile::tempdir().unwrap();
    let bin = data.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    crate::bae::sandbox::fake_docker(&bin);
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut command = kestrel(data.path());
    command.env("KESTREL_ADDR", "127.0.0.1:0").env("BAE_SANDBOX_DRIVER", "docker").env("PATH", path);
    let mut child = command.spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let (mut first, mut admin) = (String::new(), String::new());
    out.read_line(&mut first).unwrap();
    out.read_line(&mut admin).unwrap();
    let admin = admin.trim().rsplit(' ').next().unwrap().to_string();
    let key = std::fs::read_to_string(data.path().join("data/admin-key")).unwrap();
    let body =
        serde_json::json!({ "name": "p", "primary_provider": "builtin/echo", "available_sandboxes": ["present:1"] });
    let created = ureq::post(&format!("{admin}/admin/v1/profiles"))
        .set("Authorization", &format!("Bearer {}", key.trim()))
        .send_json(body);
    assert_eq!(created.map(|r| r.status()).unwrap_or(0), 201);
    // Provisioning runs in the background: wait for its status to settle.
    let deadline = std::time::Instant::now() + crate::support::WAIT;
    let status = loop {
        let status: serde_json::Value = ureq::get(&format!("{admin}/admin/v1/sandbox-status"))
            .set("Authorization", &format!("Bearer {}", key.trim()))
            .call()
            .unwrap()
            .into_json()
            .unwrap();
        let image = status["items"][0]["images"][0].clone();
        if image["status"] != "pending" || std::time::Instant::now() > deadline {
            break image;
        }
        std::thread::yield_now();
    };
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(status["status"], "available", "{status}");
    assert_eq!(crate::bae::sandbox::calls_made(&bin), ["[image][inspect][present:1]"]);
}

#[test]
fn json_logs_are_one_object_a_line_and_every_response_has_a_request_id() {
    let data = tempfile::tempdir().unwrap();
    let mut child = kestrel(data.path())
        .env("KESTREL_ADDR", "127.0.0.1:0")
        .env("KESTREL_LOG_FORMAT", "json")
        .env("RUST_LOG", "info")
        .env("KESTREL_TOKEN", "log-secret-token-value")
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let base = format!("http://127.0.0.1:{}", line.trim().rsplit(':').next().unwrap());
    let client = crate::support::Client { base: base.clone(), token: Some("log-secret-token-value".into()) };

    let kept = client.send_with_headers("GET", "/api/health", None, &[("X-Request-Id", "trace-abc.1")]);
    assert_eq!(kept.header("x-request-id"), Some("trace-abc.1"), "a sane incoming id is kept");
    let replaced = client.send_with_headers("GET", "/api/sessions", None, &[("X-Request-Id", "no spaces!")]);
    let fresh = replaced.header("x-request-id").unwrap();
    assert!(fresh.len() == 32 && fresh.bytes().all(|b| b.is_ascii_hexdigit()), "{fresh}");
    let refused = client.with_token(None).get("/api/sessions");
    assert_eq!(refused.status, 401);
    assert!(refused.header("x-request-id").is_some(), "errors carry one too");
    let created = client.post("/api/sessions", serde_json::json!({ "title": "private title words" }));
    assert_eq!(created.status, 201);
    // A stream's head carries one as well.
    let id = created.json["session"]["id"].as_str().unwrap();
    let stream = ureq::get(&format!("{base}/api/sessions/{id}/events?token=log-secret-token-value")).call().unwrap();
    assert!(stream.header("x-request-id").is_some());
    drop(stream);

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let output = child.wait_with_output().unwrap();
    let log = String::from_utf8(output.stderr).unwrap();
    assert!(log.lines().count() >= 3, "{log}");
    for line in log.lines() {
        let entry: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(entry["ts"].is_string() && entry["level"].is_string() && entry["message"].is_string(), "{line}");
    }
    assert!(!log.contains("log-secret-token-value"), "a secret reached the log");
    assert!(!log.contains("private title words"), "user text reached the log at info");
}
