//! BAE's server-run calls (MCP, a sandbox tool's command, a subagent launch) go through the
//! engine's permission step and its audit log, and stop with their turn: a server rule or a
//! `[bae] rules` rule that denies a call holds for a BAE profile's call and is audited, an
//! `ask` is a denial (BAE has nobody to ask), a closed session's or an abandoned turn's
//! sandbox command is killed at once, and a SIGTERM does not wait for an MCP call in flight.
//! And the MCP client's cancel under it: `notifications/cancelled` over stdio and HTTP.

use std::io::Write;
use std::time::{Duration, Instant};

use kestrel::config::bae::McpServer;
use kestrel::policy::{Outcome, RuleSpec};
use serde_json::{json, Value};

use super::support::{send, Bae, Harness};
use crate::fake_provider::anthropic;
use crate::mcp::TINY;
use crate::support::{wait_until, WAIT};

fn rule(tool: &str, pattern: Option<&str>, outcome: Outcome) -> RuleSpec {
    RuleSpec { tool: tool.into(), pattern: pattern.map(str::to_string), outcome }
}

/// The `@bae` tenant's audit entries, oldest first, through the admin API.
fn bae_audit(bae: &Bae) -> Vec<Value> {
    let audit = bae.admin_send("GET", "/admin/v1/audit?tenant=@bae", None);
    assert_eq!(audit.status, 200, "{}", audit.text);
    audit.json["items"].as_array().unwrap().clone()
}

/// The entry for `call_id`, with `decision`.
fn entry<'a>(entries: &'a [Value], call_id: &str) -> &'a Value {
    entries
        .iter()
        .find(|e| e["callId"] == call_id)
        .unwrap_or_else(|| panic!("no audit entry for {call_id}: {entries:?}"))
}

/// The turn's own events (`result.events` of its terminal frame).
fn turn_events(frames: &[Value]) -> Vec<Value> {
    frames.last().unwrap()["result"]["events"].as_array().cloned().unwrap_or_else(|| panic!("{frames:?}"))
}

/// The `tool.result` of `call_id` among `events`.
fn result_of<'a>(events: &'a [Value], call_id: &str) -> &'a Value {
    events
        .iter()
        .find(|e| e["event_type"] == "tool.result" && e["payload"]["tool_use_id"] == call_id)
        .unwrap_or_else(|| panic!("no tool.result for {call_id}: {events:?}"))
}

fn text_of(result: &Value) -> String {
    result["payload"]["content"][0]["text"].as_str().unwrap_or_default().to_string()
}

#[test]
fn a_server_rule_denying_an_mcp_tool_holds_for_a_bae_call_and_both_decisions_are_audited() {
    let record = tempfile::NamedTempFile::new().unwrap();
    let mut tiny = McpServer::stdio("tiny", "python3", vec![TINY.into()]);
    tiny.env.insert("TINY_RECORD".into(), record.path().display().to_string());
    let bae = Bae::start_with(move |config| {
        config.bae.file.mcp.servers.push(tiny);
        config.agent.rules = vec![rule("mcp__tiny__record", None, Outcome::Deny)];
        // A tool's own permission under its judged name is the default where no rule applies.
        config.agent.permissions.insert("mcp__tiny__counter".into(), kestrel::engine::tools::Permission::Ask);
    });
    let body = json!({ "name": "ruled", "primary_provider": "fake", "allowed_tools": [], "mcp_servers": ["tiny"] });
    let profile = bae.admin_send("POST", "/admin/v1/profiles", Some(body));
    assert_eq!(profile.status, 201, "{}", profile.text);
    let (_, key) = bae.client_key(profile.json["id"].as_str().unwrap());
    let mut harness = Harness::open(bae.base(), &key, &[]);

    let calls = json!([
        { "type": "tool_use", "id": "tu_r", "name": "record", "input": { "token": "never-recorded" } },
        { "type": "tool_use", "id": "tu_e", "name": "echo", "input": { "text": "hi" } },
        { "type": "tool_use", "id": "tu_c", "name": "counter", "input": {} },
    ]);
    bae.fake.script([anthropic::answer(calls, "tool_use", 10, 5), anthropic::text_answer("Done.")]);
    let frames = harness.send_message(json!("record it"));
    assert_eq!(frames.last().unwrap()["result"]["message"]["content"][0]["text"], "Done.", "{frames:?}");
    let events = turn_events(&frames);

    // The denied call never reached its server: no `mcp.request`, nothing recorded, and its
    // result, in BAE's shape, tells the model why.
    let denied = result_of(&events, "tu_r");
    assert_eq!(denied["payload"]["is_error"], true, "{denied}");
    assert_eq!(denied["payload"]["dispatch"], "mcp");
    assert_eq!(denied["payload"]["server_name"], "tiny");
    let why = text_of(denied);
    assert!(why.contains("denied by a permission rule (config:server:0)"), "{why}");
    let requests: Vec<&Value> = events.iter().filter(|e| e["event_type"] == "mcp.request").collect();
    let sent: Vec<&Value> = requests.iter().map(|e| &e["payload"]["tool"]).collect();
    assert_eq!(sent, [&json!("echo")], "only the allowed call went to the server");
    assert_eq!(std::fs::read_to_string(record.path()).unwrap(), "", "the denied call ran");
    let allowed = result_of(&events, "tu_e");
    assert_eq!(allowed["payload"]["is_error"], false, "{allowed}");
    let second = &bae.fake.requests()[1].body["messages"];
    let results = second.as_array().unwrap().last().unwrap()["content"].clone();
    assert_eq!(results[0]["tool_use_id"], "tu_r");
    assert_eq!(results[0]["is_error"], true, "the model is told: {results}");

    // Both decisions are in the audit log, under the names the rules judged.
    let entries = bae_audit(&bae);
    let denial = entry(&entries, "tu_r");
    assert_eq!(denial["tenant"], "@bae");
    assert_eq!(denial["sessionId"], harness.session_id.as_str());
    assert_eq!(denial["tool"], "mcp__tiny__record");
    assert_eq!((denial["decision"].as_str(), denial["decidedBy"].as_str()), (Some("denied"), Some("rule")));
    assert_eq!(denial["ruleId"], "config:server:0");
    assert!(denial["arguments"].as_str().unwrap().contains("never-recorded"), "{denial}");
    let allowance = entry(&entries, "tu_e");
    assert_eq!(allowance["tool"], "mcp__tiny__echo");
    assert_eq!((allowance["decision"].as_str(), allowance["decidedBy"].as_str()), (Some("allowed"), Some("default")));
    assert!(allowance.get("ruleId").is_none(), "{allowance}");
    let asked = entry(&entries, "tu_c");
    assert_eq!((asked["tool"].as_str(), asked["decision"].as_str()), (Some("mcp__tiny__counter"), Some("denied")));
    assert_eq!(asked["decidedBy"], "default");
    assert!(text_of(result_of(&events, "tu_c")).contains("nobody to ask"), "{events:?}");
}

/// The sandbox tool `shell` and the subagent tool `launch_subagent` of the image
/// `alpine:3.19`, declared at open; the session's sandbox started.
fn sandboxed(bae: &Bae) -> Harness {
    let body = json!({ "name": "boxed", "primary_provider": "fake", "allowed_tools": [], "available_sandboxes": ["alpine:3.19"] });
    let profile = bae.admin_send("POST", "/admin/v1/profiles", Some(body));
    assert_eq!(profile.status, 201, "{}", profile.text);
    let (_, key) = bae.client_key(profile.json["id"].as_str().unwrap());
    let shell = json!({ "name": "shell", "description": "Run a command",
        "input_schema": { "type": "object", "properties": { "command": { "type": "string" } }, "required": ["command"] } });
    let launch = json!({ "name": "launch_subagent", "image": "alpine:3.19",
        "subagents": [{ "harness": "cat", "command_template": "cat" }] });
    let body = json!({ "tools": [], "sandbox_tools": [shell], "subagent_tools": [launch] });
    let mut harness = Harness::open_with(bae.base(), &key, body);
    let started = harness.call("session.startRemoteSandbox", json!({ "image": "alpine:3.19" }));
    assert!(started.last().unwrap()["result"]["sandbox_id"].is_string(), "{started:?}");
    harness
}

#[test]
fn bae_rules_match_a_sandbox_command_and_an_ask_rule_is_a_denial_with_its_reason() {
    let bae = Bae::start_with(|config| {
        config.bae.rules = vec![rule("sandbox__*", Some("rm *"), Outcome::Deny)];
        config.agent.rules = vec![rule("subagent__*", None, Outcome::Ask)];
    });
    let mut harness = sandboxed(&bae);
    let calls = json!([
        { "type": "tool_use", "id": "tu_rm", "name": "shell", "input": { "command": "touch made; rm -rf made" } },
        { "type": "tool_use", "id": "tu_ok", "name": "shell", "input": { "command": "echo fine" } },
        { "type": "tool_use", "id": "tu_sub", "name": "launch_subagent",
          "input": { "harness": "cat", "model": "m", "prompt": "p" } },
    ]);
    bae.fake.script([anthropic::answer(calls, "tool_use", 10, 5), anthropic::text_answer("Done.")]);
    let frames = harness.send_message(json!("go"));
    let events = turn_events(&frames);

    let rm = result_of(&events, "tu_rm");
    assert_eq!(
        (rm["payload"]["dispatch"].as_str(), rm["payload"]["is_error"].as_bool()),
        (Some("sandbox"), Some(true))
    );
    assert!(text_of(rm).contains("denied by a permission rule (config:@bae:0)"), "{rm}");
    let commands: Vec<&Value> =
        events.iter().filter(|e| e["event_type"] == "sandbox.request").map(|e| &e["payload"]["command"]).collect();
    assert_eq!(commands, [&json!("echo fine")], "only the allowed command ran");
    assert_eq!(text_of(result_of(&events, "tu_ok")), "fine\n");
    let asked = result_of(&events, "tu_sub");
    assert_eq!(asked["payload"]["is_error"], true, "{asked}");
    let why = text_of(asked);
    assert!(why.contains("config:server:0") && why.contains("nobody to ask"), "{why}");
    assert!(
        !events.iter().any(|e| e["event_type"].as_str().unwrap().starts_with("session.subagent")),
        "the subagent was launched: {events:?}"
    );

    let entries = bae_audit(&bae);
    let denial = entry(&entries, "tu_rm");
    assert_eq!((denial["tool"].as_str(), denial["decision"].as_str()), (Some("sandbox__shell"), Some("denied")));
    assert_eq!(denial["ruleId"], "config:@bae:0");
    let allowance = entry(&entries, "tu_ok");
    assert_eq!((allowance["tool"].as_str(), allowance["decision"].as_str()), (Some("sandbox__shell"), Some("allowed")));
    let ask = entry(&entries, "tu_sub");
    assert_eq!((ask["tool"].as_str(), ask["decision"].as_str()), (Some("subagent__launch_subagent"), Some("denied")));
    assert_eq!((ask["decidedBy"].as_str(), ask["ruleId"].as_str()), (Some("rule"), Some("config:server:0")));
    assert!(ask["note"].as_str().unwrap().contains("nobody to ask"), "{ask}");

    // `[bae] rules` are the `@bae` tenant's: no Kestrel tenant sees them.
    let listed = bae.server.get("/api/rules");
    assert_eq!(listed.status, 200, "{}", listed.text);
    assert!(!listed.text.contains("@bae") && !listed.text.contains("sandbox__"), "{}", listed.text);
}

/// Whether a live process runs `sleep <seconds>` (a length no other test uses).
fn sleeping(seconds: &str) -> bool {
    let wanted = format!("sleep\0{seconds}");
    std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let alive = !std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default().contains(") Z ");
        alive && cmdline.starts_with(wanted.as_bytes())
    })
}

/// Waits at most `limit` for the `sleep <seconds>` to be gone; how long it took.
fn gone_within(seconds: &str, limit: Duration) -> Duration {
    let started = Instant::now();
    while sleeping(seconds) {
        assert!(started.elapsed() < limit, "the command still runs {limit:?} after it was stopped");
        std::thread::yield_now();
    }
    started.elapsed()
}

/// A sleep length for this test process and `n`, so no other test's command is mistaken
/// for it.
fn unique_sleep(n: u32) -> String {
    format!("{}.{}", 90 + n, std::process::id())
}

/// A change to a test server's config.
type Adjust = Box<dyn Fn(&mut kestrel::Config)>;

#[test]
fn closing_a_bae_session_mid_exec_ends_the_exec_within_two_seconds() {
    // With the local driver, and with a container CLI whose `stop` leaves a command running
    // (as `docker stop` does for its grace period): the exec itself is killed either way.
    let dir = tempfile::tempdir().unwrap();
    let program = super::sandbox::fake_docker(dir.path());
    let drivers: [(&str, Adjust); 2] = [
        ("local", Box::new(|_| {})),
        (
            "docker",
            Box::new(move |config| {
                config.bae.sandbox_driver = "docker".into();
                config.bae.docker_cli = program.clone();
            }),
        ),
    ];
    for (n, (driver, adjust)) in drivers.into_iter().enumerate() {
        let bae = Bae::start_with(|config| adjust(config));
        let image = if driver == "docker" { "present:1" } else { "alpine:3.19" };
        let body =
            json!({ "name": "exec", "primary_provider": "fake", "allowed_tools": [], "available_sandboxes": [image] });
        let profile = bae.admin_send("POST", "/admin/v1/profiles", Some(body));
        let (_, key) = bae.client_key(profile.json["id"].as_str().unwrap());
        let shell = json!({ "name": "shell", "description": "Run a command",
            "input_schema": { "type": "object", "properties": { "command": { "type": "string" } } } });
        let mut harness = Harness::open_with(bae.base(), &key, json!({ "tools": [], "sandbox_tools": [shell] }));
        let started = harness.call("session.startRemoteSandbox", json!({ "image": image }));
        assert!(started.last().unwrap()["result"]["sandbox_id"].is_string(), "{driver}: {started:?}");

        let seconds = unique_sleep(n as u32);
        bae.fake.script([
            anthropic::tool_answer("tu_1", "shell", json!({ "command": format!("sleep {seconds}") })),
            anthropic::text_answer("Never."),
        ]);
        let turn = harness.start("session.sendMessage", json!({ "message": { "content": "sleep" } }));
        wait_until("the command to start", || sleeping(&seconds));
        assert_eq!(harness.close().status, 200);
        let took = gone_within(&seconds, Duration::from_secs(2));
        eprintln!("{driver}: the exec ended {took:?} after the close");
        turn.wait_end();
    }
}

#[test]
fn closing_a_session_kills_its_exec_remote_sandbox_command_within_two_seconds() {
    // A container CLI whose `stop` leaves the command running: only the exec's own kill
    // ends it in time.
    let dir = tempfile::tempdir().unwrap();
    let program = super::sandbox::fake_docker(dir.path());
    let bae = Bae::start_with(move |config| {
        config.bae.sandbox_driver = "docker".into();
        config.bae.docker_cli = program.clone();
    });
    let body =
        json!({ "name": "rpc", "primary_provider": "fake", "allowed_tools": [], "available_sandboxes": ["present:1"] });
    let profile = bae.admin_send("POST", "/admin/v1/profiles", Some(body));
    let (_, key) = bae.client_key(profile.json["id"].as_str().unwrap());
    let mut harness = Harness::open(bae.base(), &key, &[]);
    let started = harness.call("session.startRemoteSandbox", json!({ "image": "present:1" }));
    assert!(started.last().unwrap()["result"]["sandbox_id"].is_string(), "{started:?}");
    let seconds = unique_sleep(7);
    // The reply's head comes with its result, so the exec waits on a thread of its own.
    let (base, session, session_key) = (harness.base.clone(), harness.session_id.clone(), harness.session_key.clone());
    let command = format!("sleep {seconds}");
    let exec = std::thread::spawn(move || {
        let body = json!({ "jsonrpc": "2.0", "id": 9, "method": "session.execRemoteSandbox", "params": { "command": command } });
        super::support::Frames::post(&base, &session, &session_key, &body.to_string()).until_terminal()
    });
    wait_until("the command to start", || sleeping(&seconds));
    assert_eq!(harness.close().status, 200);
    gone_within(&seconds, Duration::from_secs(2));
    let answer = exec.join().unwrap();
    assert_eq!(answer.last().unwrap()["result"]["exit_code"], -1, "killed: {answer:?}");
}

#[test]
fn a_turn_whose_client_went_away_kills_its_sandbox_command() {
    let bae = Bae::start();
    let mut harness = sandboxed(&bae);
    let seconds = unique_sleep(5);
    // No answer after the call: the cancelled turn never asks again.
    bae.fake.script([anthropic::tool_answer("tu_1", "shell", json!({ "command": format!("sleep {seconds}") }))]);
    // The turn's request on a socket of its own, closed once the command runs.
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "session.sendMessage",
        "params": { "message": { "role": "user", "content": "sleep" } } })
    .to_string();
    let host = crate::support::host_of(bae.base());
    let mut socket = std::net::TcpStream::connect(&host).unwrap();
    let head = format!(
        "POST /api/v1/sessions/{}/rpc HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        harness.session_id,
        harness.session_key,
        body.len()
    );
    socket.write_all(head.as_bytes()).unwrap();
    socket.write_all(body.as_bytes()).unwrap();
    wait_until("the command to start", || sleeping(&seconds));
    drop(socket);
    gone_within(&seconds, WAIT);
    // The session goes on: the next turn answers.
    bae.fake.script([anthropic::text_answer("Still here.")]);
    let frames = harness.send_message(json!("again"));
    assert_eq!(frames.last().unwrap()["result"]["message"]["content"][0]["text"], "Still here.", "{frames:?}");
}

/// The server's shutdown grace (`app::SHUTDOWN_GRACE`): how long a stop waits for runs.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

#[test]
fn sigterm_mid_mcp_call_exits_within_the_shutdown_grace() {
    let (data, workspace) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let log = data.path().join("tiny.log");
    // The call's own timeout is far past the grace: only a cancel ends it in time.
    let config = format!(
        "[builtin]\ndelay_ms = 0\n\n[[mcp.servers]]\nname = \"tiny\"\ntransport = \"stdio\"\ncommand = \"python3\"\n\
         args = [\"{TINY}\"]\ntimeout_secs = 600\nenv = {{ TINY_LOG = \"{}\" }}\n",
        log.display()
    );
    let (mut child, base, admin) = crate::support::spawn_binary(data.path(), workspace.path(), &config);
    let admin_key = std::fs::read_to_string(data.path().join("admin-key")).unwrap().trim().to_string();
    let body = json!({ "name": "hang", "primary_provider": "builtin/echo", "mcp_servers": ["tiny"] });
    let profile = send(&admin, "POST", "/admin/v1/profiles", Some(&admin_key), Some(body));
    assert_eq!(profile.status, 201, "{}", profile.text);
    let body = json!({ "name": "hang", "profile_id": profile.json["id"] });
    let key =
        send(&admin, "POST", "/admin/v1/keys", Some(&admin_key), Some(body)).json["key"].as_str().unwrap().to_string();
    let mut harness = Harness::open(&base, &key, &[]);
    let turn = harness.start("session.sendMessage", json!({ "message": { "content": "/tool hang {}" } }));
    wait_until("the MCP call to hang", || std::fs::read_to_string(&log).unwrap_or_default().contains("hanging"));

    let signalled = Instant::now();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if signalled.elapsed() >= SHUTDOWN_GRACE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the server was still running {SHUTDOWN_GRACE:?} after SIGTERM, waiting on the MCP call");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!("exited {:?} after SIGTERM", signalled.elapsed());
    assert!(status.success(), "a clean shutdown: {status:?}");
    drop(turn);

    // The next start records the call the shutdown cut as interrupted, never run again.
    let (mut child, base, _) = crate::support::spawn_binary(data.path(), workspace.path(), &config);
    harness.base = base;
    let events = harness.events();
    let result = events.iter().rev().find(|e| e["event_type"] == "tool.result").expect("the cut call's result");
    assert_eq!(result["payload"]["is_error"], true, "{result}");
    assert_eq!(text_of(result), kestrel::api::bae::core::INTERRUPTED_RESULT);
    let hung = std::fs::read_to_string(&log).unwrap();
    assert_eq!(hung.matches("hanging").count(), 1, "run once: {hung}");
    child.kill().unwrap();
    child.wait().unwrap();
}

/// `record` holds its answer `sleep` seconds after it recorded `token`; the test cancels in
/// between. Returns the call's outcome and how long it took from the cancel.
fn cancel_record_mid_call(client: &kestrel::mcp::McpClient, record: &std::path::Path) -> (bool, Duration) {
    let (cancel, cancelled) = crossbeam_channel::bounded::<()>(0);
    let path = record.to_path_buf();
    let canceller = std::thread::spawn(move || {
        wait_until("the call to start", || std::fs::read_to_string(&path).unwrap_or_default().contains("mid-call"));
        let at = Instant::now();
        drop(cancel);
        at
    });
    let outcome =
        client.call_until("record", json!({ "token": "mid-call", "sleep": 3 }), Duration::from_secs(60), &cancelled);
    let at = canceller.join().unwrap();
    (matches!(outcome, Err(kestrel::mcp::McpError::Cancelled)), at.elapsed())
}

#[test]
fn a_cancelled_stdio_mcp_call_stops_waiting_and_tells_the_server() {
    let (log, record) = (tempfile::NamedTempFile::new().unwrap(), tempfile::NamedTempFile::new().unwrap());
    let mut server = McpServer::stdio("tiny", "python3", vec![TINY.into()]);
    server.env.insert("TINY_LOG".into(), log.path().display().to_string());
    server.env.insert("TINY_RECORD".into(), record.path().display().to_string());
    let spawning = kestrel::mcp::Spawning { marker: "test".into(), ..Default::default() };
    let env: kestrel::mcp::SharedEnv = std::sync::Arc::new(|_: &str| None);
    let client = kestrel::mcp::McpClient::connect(&server, env, spawning).unwrap();
    let (cancelled, waited) = cancel_record_mid_call(&client, record.path());
    assert!(cancelled, "the call ended as cancelled");
    assert!(waited < Duration::from_secs(2), "the caller waited {waited:?} past the cancel");
    // Once its tool's delay is over the server reads the notification; the connection goes on.
    wait_until("the server to hear of the cancel", || {
        std::fs::read_to_string(log.path()).unwrap_or_default().starts_with("cancelled ")
    });
    let echoed = client.call("echo", json!({ "text": "after" }), Duration::from_secs(10)).unwrap();
    assert!(!echoed.is_error);
    // A call whose cancel came first is not sent.
    let (cancel, cancelled) = crossbeam_channel::bounded::<()>(0);
    drop(cancel);
    let outcome = client.call_until("record", json!({ "token": "never-sent" }), WAIT, &cancelled);
    assert_eq!(outcome.unwrap_err(), kestrel::mcp::McpError::Cancelled);
    assert!(!std::fs::read_to_string(record.path()).unwrap().contains("never-sent"));
}

#[test]
fn a_cancelled_streamable_http_mcp_call_stops_waiting_and_tells_the_server() {
    // A server that answers `tools/call` only when the test says so, and reports every
    // message it is sent.
    let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
    let url = format!("http://{}/mcp", server.server_addr().to_ip().unwrap());
    let (seen_tx, seen) = crossbeam_channel::unbounded::<Value>();
    let (release_tx, release) = crossbeam_channel::unbounded::<()>();
    std::thread::spawn(move || {
        for mut request in server.incoming_requests() {
            let mut body = String::new();
            let _ = request.as_reader().read_to_string(&mut body);
            let message: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            let _ = seen_tx.send(message.clone());
            let release = release.clone();
            std::thread::spawn(move || {
                let id = message["id"].clone();
                let json = |result: Value| {
                    let text = json!({ "jsonrpc": "2.0", "id": id, "result": result }).to_string();
                    let header = tiny_http::Header::from_bytes("Content-Type", "application/json").unwrap();
                    tiny_http::Response::from_string(text).with_header(header)
                };
                let response = match message["method"].as_str().unwrap_or_default() {
                    "initialize" => json(json!({ "protocolVersion": "2024-11-05", "capabilities": {} })),
                    "tools/list" => json(json!({ "tools": [{ "name": "held" }] })),
                    "tools/call" => {
                        let _ = release.recv_timeout(WAIT);
                        json(json!({ "content": [] }))
                    }
                    _ => tiny_http::Response::from_string("").with_status_code(202),
                };
                let _ = request.respond(response);
            });
        }
    });
    let env: kestrel::mcp::SharedEnv = std::sync::Arc::new(|_: &str| None);
    let client = kestrel::mcp::McpClient::connect(&McpServer::http("remote", &url), env, Default::default()).unwrap();
    let (cancel, cancelled) = crossbeam_channel::bounded::<()>(0);
    let waiting = seen.clone();
    let canceller = std::thread::spawn(move || {
        while let Ok(message) = waiting.recv_timeout(WAIT) {
            if message["method"] == "tools/call" {
                let at = Instant::now();
                drop(cancel);
                return Some((at, message["id"].clone()));
            }
        }
        None
    });
    let outcome = client.call_until("held", json!({}), Duration::from_secs(60), &cancelled);
    let (at, id) = canceller.join().unwrap().expect("the call reached the server");
    assert_eq!(outcome.unwrap_err(), kestrel::mcp::McpError::Cancelled);
    assert!(at.elapsed() < Duration::from_secs(2), "the caller waited {:?} past the cancel", at.elapsed());
    let told = seen.recv_timeout(WAIT).expect("a notification after the call");
    assert_eq!(told["method"], "notifications/cancelled", "{told}");
    assert_eq!(told["params"]["requestId"], id);
    drop(release_tx);
}
