//! The terminal client (`kestrel chat`, `sessions`, `send`, `events`, `health`): the binary
//! run against a real server, over the public protocol, with its exit codes.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Output, Stdio};

use serde_json::{json, Value};

use crate::support::{TestServer, WAIT};

/// The binary aimed at `server`.
fn kestrel(server: &TestServer) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kestrel"));
    command.env("KESTREL_URL", &server.base).env_remove("KESTREL_TOKEN").stdin(Stdio::null());
    command
}

fn run(server: &TestServer, args: &[&str]) -> Output {
    kestrel(server).args(args).output().unwrap()
}

pub(crate) fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub(crate) fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn send_waits_for_the_reply_and_prints_it_or_its_json() {
    let server = TestServer::start();
    let id = server.create_session(json!({ "title": "cli" }));
    let plain = run(&server, &["send", &id, "hello there", "--wait"]);
    assert_eq!(plain.status.code(), Some(0), "{}", stderr(&plain));
    assert_eq!(stdout(&plain).trim(), "Echo: hello there");

    let json = run(&server, &["send", &id, "again", "--wait", "--json"]);
    assert_eq!(json.status.code(), Some(0), "{}", stderr(&json));
    let outcome: Value = serde_json::from_str(stdout(&json).trim()).unwrap();
    assert_eq!(outcome["status"], "completed");
    assert_eq!(outcome["reply"], "Echo: again");
    assert!(outcome["runId"].as_str().unwrap().starts_with("run"), "{outcome}");
    assert!(outcome["usage"]["outputTokens"].as_u64().unwrap() > 0, "{outcome}");
    assert_eq!(outcome["messages"].as_array().unwrap().last().unwrap()["role"], "assistant");

    // Without --wait: the run id, at once.
    let queued = run(&server, &["send", &id, "third", "--json"]);
    let accepted: Value = serde_json::from_str(stdout(&queued).trim()).unwrap();
    assert!(accepted["runId"].is_string());

    let listed = run(&server, &["sessions", "list", "--json"]);
    let sessions: Value = serde_json::from_str(&stdout(&listed)).unwrap();
    assert_eq!(sessions[0]["id"], id.as_str());
    let shown = run(&server, &["sessions", "show", &id]);
    assert!(stdout(&shown).contains("assistant: Echo: hello there"), "{}", stdout(&shown));

    // A fork at the first answer, in a copy of the files.
    let first_answer = sessions_detail(&server, &id)["messages"][1]["id"].as_str().unwrap().to_string();
    let forked = run(&server, &["sessions", "fork", &id, "--message", &first_answer, "--copy", "--json"]);
    assert_eq!(forked.status.code(), Some(0), "{}", stderr(&forked));
    let forked: Value = serde_json::from_str(&stdout(&forked)).unwrap();
    assert_eq!(forked["session"]["forkedFrom"], json!({ "sessionId": id, "messageId": first_answer }));
    assert_eq!(forked["session"]["messages"].as_array().unwrap().len(), 2);
    assert_eq!(forked["copiedFrom"]["kind"], "manual");
    let plain = run(&server, &["sessions", "fork", &id]);
    assert!(stdout(&plain).starts_with(&format!("forked {id} into ses_")), "{}", stdout(&plain));
    let path_alone = run(&server, &["sessions", "fork", &id, "--path", "/tmp/x"]);
    assert_eq!(path_alone.status.code(), Some(2), "--path needs --copy");
}

#[test]
fn send_with_a_schema_prints_the_structured_value_or_fails_with_its_errors() {
    let server = TestServer::start();
    let id = server.create_session(json!({}));
    let dir = tempfile::tempdir().unwrap();
    let schema = dir.path().join("schema.json");
    let required = json!({ "type": "object", "properties": { "n": { "type": "integer" } }, "required": ["n"] });
    std::fs::write(&schema, required.to_string()).unwrap();
    let schema = schema.to_str().unwrap();

    let plain = run(&server, &["send", &id, "{\"n\": 7}", "--schema", schema]);
    assert_eq!(plain.status.code(), Some(0), "{}", stderr(&plain));
    assert_eq!(stdout(&plain).trim(), "{\"n\":7}");
    let json = run(&server, &["send", &id, "{\"n\": 8}", "--schema", schema, "--json"]);
    let outcome: Value = serde_json::from_str(stdout(&json).trim()).unwrap();
    assert_eq!((&outcome["status"], &outcome["structured"]), (&json!("completed"), &json!({ "n": 8 })));

    let invalid = run(&server, &["send", &id, "{\"n\": \"eight\"}", "--schema", schema]);
    assert_eq!(invalid.status.code(), Some(1));
    assert!(stderr(&invalid).contains("structured_output_invalid"), "{}", stderr(&invalid));
    let missing = run(&server, &["send", &id, "{}", "--schema", "/nonexistent/schema.json"]);
    assert_eq!(missing.status.code(), Some(2), "{}", stderr(&missing));
}

fn sessions_detail(server: &TestServer, id: &str) -> Value {
    server.get(&format!("/api/sessions/{id}")).json["session"].clone()
}

#[test]
fn events_tails_a_stream_as_json_lines_from_a_seq() {
    let server = TestServer::start();
    let id = server.create_session(json!({}));
    server.run_to_end(&id, "one");
    let mut child = kestrel(&server).args(["events", &id, "--since", "0"]).stdout(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut envelopes: Vec<Value> = Vec::new();
    while !envelopes.last().is_some_and(|e| e["event"]["type"] == "run.finished") {
        let line = lines.next().expect("a line before the run's end").unwrap();
        envelopes.push(serde_json::from_str(&line).unwrap());
    }
    let seqs: Vec<u64> = envelopes.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "in order: {seqs:?}");
    assert!(envelopes.iter().all(|e| e["event"]["sessionId"] == id.as_str() || e["event"]["sessionId"].is_null()));
    let _ = child.kill();
    let _ = child.wait();

    // From a later seq: nothing at or before it.
    let middle = seqs[seqs.len() / 2];
    let mut child =
        kestrel(&server).args(["events", &id, "--since", &middle.to_string()]).stdout(Stdio::piped()).spawn().unwrap();
    let first: Value =
        serde_json::from_str(&BufReader::new(child.stdout.take().unwrap()).lines().next().unwrap().unwrap()).unwrap();
    assert_eq!(first["seq"].as_u64(), Some(middle + 1));
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn exit_codes_tell_usage_denial_and_failure_apart() {
    let server = TestServer::start_with(|config| config.auth.token = Some("sekret".into()));
    let health = run(&server, &["health"]);
    assert_eq!(health.status.code(), Some(0), "health is public: {}", stderr(&health));
    assert!(stdout(&health).starts_with("ok "), "{}", stdout(&health));

    let denied = run(&server, &["sessions"]);
    assert_eq!(denied.status.code(), Some(3));
    assert_eq!(stderr(&denied).lines().count(), 1, "one line: {}", stderr(&denied));
    assert!(stderr(&denied).contains("unauthorized"), "{}", stderr(&denied));

    let authorized = kestrel(&server).args(["sessions", "show", "ses_nope"]).env("KESTREL_TOKEN", "sekret").output();
    let missing = authorized.unwrap();
    assert_eq!(missing.status.code(), Some(3), "{}", stderr(&missing));
    assert!(stderr(&missing).contains("session_not_found"), "{}", stderr(&missing));

    assert_eq!(run(&server, &["send"]).status.code(), Some(2), "missing arguments");
    assert_eq!(run(&server, &["sessions", "frob"]).status.code(), Some(2));
    let odd_id = run(&server, &["sessions", "rm", "../api"]);
    assert_eq!(odd_id.status.code(), Some(2), "an id cannot change the route");
    let nowhere = kestrel(&server).args(["health", "--url", "http://127.0.0.1:1"]).output().unwrap();
    assert_eq!(nowhere.status.code(), Some(1));
    assert!(stderr(&nowhere).contains("cannot reach"), "{}", stderr(&nowhere));
    for command in [&["chat", "--help"][..], &["send", "--help"], &["events", "--help"], &["sessions", "--help"]] {
        let help = run(&server, command);
        assert_eq!(help.status.code(), Some(0));
        assert!(stdout(&help).contains("Usage: kestrel"), "{}", stdout(&help));
    }
}

/// `chat` with `input` piped in; its output once it has left.
pub(crate) fn chat(server: &TestServer, args: &[&str], input: &str) -> Output {
    let mut child = kestrel(server)
        .arg("chat")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    // A chat that does not leave within `WAIT` is killed (and the test then fails on it).
    let (done, finished) = crossbeam_channel::bounded::<()>(1);
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    std::thread::spawn(move || {
        if finished.recv_timeout(WAIT).is_err() {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
    });
    let output = child.wait_with_output().unwrap();
    let _ = done.send(());
    output
}

#[test]
fn chat_streams_the_reply_and_answers_an_approval_from_stdin() {
    let server = TestServer::start();
    let workspace = server.workspace.to_string_lossy().into_owned();
    let input = "/tool write_file {\"path\":\"note.txt\",\"content\":\"from the chat\"}\ny\nlooks right\n";
    let output = chat(&server, &["--workspace", &workspace], input);
    assert_eq!(output.status.code(), Some(0), "{}\n{}", stdout(&output), stderr(&output));
    let printed = stdout(&output);
    assert!(printed.contains("? write_file wants to run"), "{printed}");
    assert!(printed.contains("✓ write_file"), "{printed}");
    assert_eq!(std::fs::read_to_string(server.workspace.join("note.txt")).unwrap(), "from the chat");
    // The session is the one the chat made; its transcript has the call and the approval's note.
    let listed = server.get("/api/sessions");
    let id = listed.json["sessions"][0]["id"].as_str().unwrap().to_string();
    assert!(stderr(&output).contains(&id), "the chat names its session: {}", stderr(&output));

    // A denied call: the model hears it, the file is not written.
    let input = "/tool write_file {\"path\":\"no.txt\",\"content\":\"x\"}\nn\n\nplain words\n";
    let output = chat(&server, &[&id], input);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(!server.workspace.join("no.txt").exists());
    assert!(stdout(&output).contains("Echo: plain words"), "{}", stdout(&output));
}

/// `[a]lways` remembers the call for the session, `[e]dit` runs edited arguments (and an edit
/// the rules deny is refused, and asked again), and each call says the rule that decided it.
#[test]
fn chat_answers_always_and_edit_and_shows_the_deciding_rule() {
    let server = TestServer::start_with(|config| {
        config.agent.rules = vec![kestrel::policy::RuleSpec {
            tool: "run_command".into(),
            pattern: Some("rm *".into()),
            outcome: kestrel::policy::Outcome::Deny,
        }];
    });
    std::fs::write(server.workspace.join("marker"), "kept").unwrap();
    let workspace = server.workspace.to_string_lossy().into_owned();
    let input = [
        "/tool run_command {\"command\":\"echo one\"}",
        "a",
        "",
        "/tool run_command {\"command\":\"echo one\"}",
        "/tool run_command {\"command\":\"echo two\"}",
        "e",
        "not json",
        "{\"command\":\"rm -rf marker\"}",
        "",
        "e",
        "{\"command\":\"echo edited-by-cli\"}",
        "edited",
    ]
    .join("\n");
    let output = chat(&server, &["--workspace", &workspace], &format!("{input}\n"));
    let (printed, errors) = (stdout(&output), stderr(&output));
    assert_eq!(output.status.code(), Some(0), "{printed}\n{errors}");
    assert!(printed.contains("[y]es / [n]o / [a]lways for this session / [e]dit"), "{printed}");
    assert!(printed.contains("[allow: rule allow run_command echo one]"), "the remembered rule decided: {printed}");
    assert_eq!(
        printed.matches("? run_command wants to run").count(),
        2,
        "the remembered call was not asked: {printed}"
    );
    assert!(printed.contains("not a JSON object"), "{printed}");
    assert!(errors.contains("denied"), "the refused edit is said: {errors}");
    assert!(printed.contains("edited-by-cli"), "{printed}");
    assert_eq!(std::fs::read_to_string(server.workspace.join("marker")).unwrap(), "kept");
    let id = server.get("/api/sessions").json["sessions"][0]["id"].as_str().unwrap().to_string();
    let rules = server.get(&format!("/api/sessions/{id}/rules"));
    assert_eq!(rules.json["rules"][0]["match"], "echo one", "{}", rules.text);
}

/// The input ending mid-question never hangs the chat: at the note it means no note (the
/// approved write happens), at y/n a denial; either way the chat leaves once the run ends.
#[test]
fn the_end_of_the_input_answers_a_pending_approval_and_the_chat_leaves() {
    let server = TestServer::start();
    let workspace = server.workspace.to_string_lossy().into_owned();
    let input = "/tool write_file {\"path\":\"approved.txt\",\"content\":\"yes\"}\ny\n";
    let output = chat(&server, &["--workspace", &workspace], input);
    assert_eq!(output.status.code(), Some(0), "{}\n{}", stdout(&output), stderr(&output));
    assert!(!stderr(&output).contains("cancelling"), "{}", stderr(&output));
    assert_eq!(std::fs::read_to_string(server.workspace.join("approved.txt")).unwrap(), "yes");

    let input = "/tool write_file {\"path\":\"unanswered.txt\",\"content\":\"no\"}\n";
    let output = chat(&server, &["--workspace", &workspace], input);
    assert_eq!(output.status.code(), Some(0), "{}\n{}", stdout(&output), stderr(&output));
    assert!(stdout(&output).contains("denied"), "{}", stdout(&output));
    assert!(!server.workspace.join("unanswered.txt").exists());
}

#[test]
fn ctrl_c_cancels_the_run_and_the_chat_goes_on() {
    let server = TestServer::start_with(|config| {
        config.agent.permissions.insert("run_command".into(), kestrel::engine::tools::Permission::Auto);
    });
    let mut child = kestrel(&server)
        .arg("chat")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "/tool run_command {{\"command\":\"sleep 30\"}}").unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("⚙ run_command") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the chat ended before the tool started");
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    while !line.contains("cancelled") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the run's end was not shown");
    }
    writeln!(stdin, "still here").unwrap();
    drop(stdin);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(rest.contains("Echo: still here"), "{rest}");
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

#[test]
fn sessions_list_walks_every_page() {
    let server = TestServer::start();
    // More than one page of the CLI's walk (500).
    let mut ids: Vec<String> = (0..520).map(|_| server.create_session(serde_json::json!({}))).collect();
    let listed = run(&server, &["sessions", "list", "--json"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    let sessions: Value = serde_json::from_str(&stdout(&listed)).unwrap();
    let mut walked: Vec<String> =
        sessions.as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(walked[0], *ids.last().unwrap(), "the most recent first");
    walked.sort();
    ids.sort();
    assert_eq!(walked, ids);
    let plain = stdout(&run(&server, &["sessions"]));
    assert_eq!(plain.lines().count(), 520);
}
