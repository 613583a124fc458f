//! `kestrel acp` against another local user (issue 35, findings 1 and 16): the server it
//! embeds answers only its own process (a token minted at start, kept in memory), its sessions
//! work only in the editor's project directories, and a token given to any client command is
//! read from `KESTREL_TOKEN` or `--token-file`, never needed on the command line, where every
//! local user can read it in `/proc/<pid>/cmdline`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};

use crossbeam_channel::{unbounded, Receiver};
use serde_json::{json, Value};

use crate::support::{TestServer, WAIT};

/// `kestrel acp` as an editor runs it: protocol lines on its stdin and stdout.
struct Acp {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<Value>,
    /// What it says on stderr, a line at a time.
    said: Receiver<String>,
    next_id: u64,
}

impl Acp {
    fn start(cwd: &std::path::Path, args: &[&str]) -> Acp {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kestrel"))
            .arg("acp")
            .args(args)
            .current_dir(cwd)
            .env_remove("KESTREL_URL")
            .env_remove("KESTREL_TOKEN")
            .env("KESTREL_BUILTIN_DELAY_MS", "0")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (said_tx, said) = unbounded();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = said_tx.send(line);
            }
        });
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = unbounded();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(message) = serde_json::from_str::<Value>(&line) {
                    if sender.send(message).is_err() {
                        return;
                    }
                }
            }
        });
        let mut acp = Acp { child, stdin, lines, said, next_id: 0 };
        let initialized = acp.call("initialize", json!({ "protocolVersion": 1, "clientCapabilities": {} }));
        assert_eq!(initialized["result"]["protocolVersion"], 1, "{initialized}");
        acp
    }

    /// Sends a request; its answer (`result` or `error`), skipping notifications.
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let line = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }).to_string();
        writeln!(self.stdin, "{line}").unwrap();
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let message = self.lines.recv_timeout(left).unwrap_or_else(|_| panic!("no answer to {method}"));
            if message["id"] == id && message.get("method").is_none() {
                return message;
            }
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The port of the server it started, from the line it says so on (a port other users
    /// find in /proc/net/tcp anyway).
    fn port(&self) -> u16 {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = self.said.recv_timeout(left).expect("a line naming the embedded server's address");
            if let Some(port) = line.split("http://127.0.0.1:").nth(1).and_then(|rest| rest.split(' ').next()) {
                return port.parse().unwrap();
            }
        }
    }
}

impl Drop for Acp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn status_of(result: Result<ureq::Response, ureq::Error>) -> u16 {
    match result {
        Ok(response) => response.status(),
        Err(ureq::Error::Status(status, _)) => status,
        Err(error) => panic!("{error}"),
    }
}

/// Splits a `/proc/<pid>/cmdline` or `environ` into its entries, and `NAME=value` entries
/// into their values too.
fn words_of(path: &str) -> Vec<String> {
    let bytes = std::fs::read(path).unwrap_or_default();
    let mut words = Vec::new();
    for entry in bytes.split(|&b| b == 0).filter(|e| !e.is_empty()) {
        let entry = String::from_utf8_lossy(entry).into_owned();
        if let Some((_, value)) = entry.split_once('=') {
            words.push(value.to_string());
        }
        words.push(entry);
    }
    words
}

#[test]
fn the_embedded_server_admits_only_the_process_that_started_it() {
    let workspace = tempfile::tempdir().unwrap();
    let cwd = workspace.path().canonicalize().unwrap();
    std::fs::write(cwd.join("notes.txt"), "private notes\n").unwrap();
    let data = tempfile::tempdir().unwrap();
    let mut acp = Acp::start(&cwd, &["--data-dir", &data.path().to_string_lossy()]);
    let created = acp.call("session/new", json!({ "cwd": cwd, "mcpServers": [] }));
    let session = created["result"]["sessionId"].as_str().unwrap_or_else(|| panic!("{created}")).to_string();

    let (pid, port) = (acp.pid(), acp.port());
    let base = format!("http://127.0.0.1:{port}");
    let get = |path: &str| status_of(ureq::get(&format!("{base}{path}")).timeout(WAIT).call());
    let post = |path: &str, body: Value| status_of(ureq::post(&format!("{base}{path}")).timeout(WAIT).send_json(body));
    // Another local user, who found the port in /proc/net/tcp and has no token.
    assert_eq!(get("/api/sessions"), 401);
    assert_eq!(get(&format!("/api/sessions/{session}")), 401);
    assert_eq!(get(&format!("/api/sessions/{session}/file?path=notes.txt")), 401);
    assert_eq!(get(&format!("/api/sessions/{session}/events")), 401);
    assert_eq!(get("/api/config"), 401);
    assert_eq!(post("/api/sessions", json!({ "workspace": "/" })), 401);
    let command = json!({ "content": "/tool run_command {\"command\":\"id\"}" });
    assert_eq!(post(&format!("/api/sessions/{session}/messages"), command), 401);
    assert_eq!(post(&format!("/api/sessions/{session}/approvals/apr_1"), json!({ "approved": true })), 401);
    // Nothing the process shows other users of itself is the token.
    let mut candidates = words_of(&format!("/proc/{pid}/cmdline"));
    candidates.extend(words_of(&format!("/proc/{pid}/environ")));
    assert!(!candidates.iter().any(|word| word.starts_with("KESTREL_TOKEN") || word == "--token"));
    for candidate in candidates.iter().filter(|word| !word.is_empty() && word.is_ascii()) {
        let tried = ureq::get(&format!("{base}/api/sessions"))
            .set("Authorization", &format!("Bearer {}", candidate.trim()))
            .timeout(WAIT)
            .call();
        assert_eq!(status_of(tried), 401, "{candidate:?} from /proc is a token");
    }
    // The editor, meanwhile, works as before.
    let prompt = json!({ "sessionId": session, "prompt": [{ "type": "text", "text": "hello" }] });
    let answered = acp.call("session/prompt", prompt);
    assert_eq!(answered["result"]["stopReason"], "end_turn", "{answered}");
}

#[test]
fn the_embedded_servers_sessions_work_only_in_the_editors_projects() {
    let workspace = tempfile::tempdir().unwrap();
    let cwd = workspace.path().canonicalize().unwrap();
    std::fs::create_dir(cwd.join("sub")).unwrap();
    let data = tempfile::tempdir().unwrap();
    let data_arg = data.path().to_string_lossy().into_owned();
    let mut acp = Acp::start(&cwd, &["--data-dir", &data_arg]);
    // By default the one project is the directory the editor started it in.
    for inside in [cwd.clone(), cwd.join("sub")] {
        let created = acp.call("session/new", json!({ "cwd": inside, "mcpServers": [] }));
        assert!(created["result"]["sessionId"].is_string(), "{inside:?}: {created}");
    }
    let parent = cwd.parent().unwrap().to_path_buf();
    for outside in [json!("/"), json!("/etc"), json!(parent), json!("sub"), json!(cwd.join("sub/../..")), json!(null)] {
        let refused = acp.call("session/new", json!({ "cwd": outside, "mcpServers": [] }));
        assert_eq!(refused["error"]["code"], -32602, "{outside}: {refused}");
    }
    drop(acp);

    // `--root` names the projects, as many as the editor has.
    let other = tempfile::tempdir().unwrap();
    let other = other.path().canonicalize().unwrap();
    let third = tempfile::tempdir().unwrap();
    let third = third.path().canonicalize().unwrap();
    let mut acp = Acp::start(
        &cwd,
        &["--data-dir", &data_arg, "--root", &other.to_string_lossy(), "--root", &third.to_string_lossy()],
    );
    for inside in [&other, &third] {
        let created = acp.call("session/new", json!({ "cwd": inside, "mcpServers": [] }));
        assert!(created["result"]["sessionId"].is_string(), "{inside:?}: {created}");
    }
    let refused = acp.call("session/new", json!({ "cwd": cwd, "mcpServers": [] }));
    assert_eq!(refused["error"]["code"], -32602, "the start directory is no root once roots are named: {refused}");
}

/// Runs a client subcommand; its exit code, stdout and stderr.
fn kestrel(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kestrel"));
    command.args(args).env_remove("KESTREL_TOKEN").env_remove("KESTREL_URL");
    for (name, value) in env {
        command.env(name, value);
    }
    let output = command.output().unwrap();
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.code().unwrap_or(-1), text(&output.stdout), text(&output.stderr))
}

#[test]
fn a_token_comes_from_a_file_or_the_environment_and_on_the_command_line_it_is_warned_about() {
    let server = TestServer::start_with(|config| {
        config.auth.tokens = vec![kestrel::config::TokenConfig::new("acme", "acme-token-on-disk")];
    });
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "acme-token-on-disk\n").unwrap();
    let file_arg = file.to_string_lossy().into_owned();
    let base = server.base.as_str();

    let (code, out, err) = kestrel(&["sessions", "--json", "--url", base, "--token-file", &file_arg], &[]);
    assert_eq!(code, 0, "{out} {err}");
    assert!(!err.contains("warning"), "{err}");
    let (code, out, err) = kestrel(&["sessions", "--json", "--url", base], &[("KESTREL_TOKEN", "acme-token-on-disk")]);
    assert_eq!(code, 0, "{out} {err}");
    assert!(!err.contains("warning"), "{err}");
    let (code, out, err) = kestrel(&["sessions", "--json", "--url", base, "--token", "acme-token-on-disk"], &[]);
    assert_eq!(code, 0, "--token still works: {out} {err}");
    assert!(err.contains("warning") && err.contains("--token-file") && err.contains("KESTREL_TOKEN"), "{err}");
    assert!(!err.contains("acme-token-on-disk"), "the warning does not repeat the token: {err}");
    // A file that cannot be read, or both ways at once, is a usage error.
    let missing = dir.path().join("missing").to_string_lossy().into_owned();
    assert_eq!(kestrel(&["sessions", "--url", base, "--token-file", &missing], &[]).0, 2);
    let both = ["sessions", "--url", base, "--token", "x", "--token-file", &file_arg];
    assert_eq!(kestrel(&both, &[]).0, 2);

    // `kestrel acp` against a running server, with its token from the file: not in its cmdline.
    let cwd = server.workspace.canonicalize().unwrap();
    let mut acp = Acp::start(&cwd, &["--url", base, "--token-file", &file_arg]);
    let created = acp.call("session/new", json!({ "cwd": cwd, "mcpServers": [] }));
    assert!(created["result"]["sessionId"].is_string(), "{created}");
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", acp.pid())).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains("acme-token-on-disk"));
}
