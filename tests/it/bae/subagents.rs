//! Remote subagents in BAE turns with the local sandbox driver: launches that succeed, fail,
//! time out and are cancelled, their events after the turn, the status tool reporting each
//! once, the in-band refusals, and close cancelling what still runs (with the session's MCP
//! server and sandbox) so that no process is left behind.

use std::time::Instant;

use serde_json::{json, Value};

use super::support::{send, types, Bae, Frames, Harness};
use crate::fake_provider::anthropic;
use crate::support::WAIT;

const IMAGE: &str = "alpine:3.19";

/// The harnesses the tests declare; `hang` carries `marker` so its process can be found.
fn declaration(marker: &str) -> Value {
    json!({
        "name": "launch_subagent",
        "description": "Launch a CLI subagent in the background.",
        "input_schema": { "type": "object",
            "properties": { "harness": { "type": "string" }, "model": { "type": "string" }, "prompt": { "type": "string" } },
            "required": ["harness", "model", "prompt"] },
        "image": IMAGE,
        "subagents": [
            { "harness": "echo", "command_template": "echo model={model}; cat", "prompt_via": "stdin" },
            { "harness": "fail", "command_template": "echo bad >&2; exit 3 # {model}" },
            { "harness": "slow", "command_template": "sleep 30 # {model}", "timeout_secs": 1 },
            { "harness": "hang", "command_template": format!("export KESTREL_TEST_MARK={marker}; setsid sleep 301 & sleep 300; echo {{model}}") },
            { "harness": "arg", "command_template": "printf '%s|' {model} {prompt}", "prompt_via": "arg" }
        ]
    })
}

/// A session whose client declares the subagents, registered as a driver, with its remote
/// sandbox started (unless `images` leaves the declared image out).
fn open(bae: &Bae, marker: &str, images: &[&str]) -> Harness {
    let body = json!({ "name": format!("sub-{marker}"), "primary_provider": "fake", "allowed_tools": [], "available_sandboxes": images });
    let profile = bae.admin_send("POST", "/admin/v1/profiles", Some(body));
    assert_eq!(profile.status, 201, "{}", profile.text);
    let (_, key) = bae.client_key(profile.json["id"].as_str().unwrap());
    Harness::open_with(bae.base(), &key, json!({ "tools": [], "subagent_tools": [declaration(marker)] }))
}

fn start_sandbox(harness: &mut Harness, image: &str) {
    let started = harness.call("session.startRemoteSandbox", json!({ "image": image }));
    assert!(started.last().unwrap()["result"]["sandbox_id"].is_string(), "{started:?}");
}

fn launch(id: &str, harness: &str, model: &str, prompt: &str) -> Value {
    json!({ "type": "tool_use", "id": id, "name": "launch_subagent", "input": { "harness": harness, "model": model, "prompt": prompt } })
}

fn calls(blocks: Value) -> crate::fake_provider::Reply {
    anthropic::answer(blocks, "tool_use", 10, 5)
}

/// The tool results the model was sent in request `index`, by call id: (JSON text parsed,
/// is_error).
fn results(bae: &Bae, index: usize) -> Vec<(String, Value, bool)> {
    let request = &bae.fake.requests()[index].body;
    let last = request["messages"].as_array().unwrap().last().unwrap().clone();
    last["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|block| {
            let text = block["content"][0]["text"].as_str().unwrap();
            let parsed = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
            (block["tool_use_id"].as_str().unwrap().to_string(), parsed, block["is_error"] == true)
        })
        .collect()
}

fn offered(bae: &Bae, index: usize) -> Vec<String> {
    let tools = bae.fake.requests()[index].body["tools"].clone();
    tools.as_array().map(|t| t.iter().map(|t| t["name"].as_str().unwrap().to_string()).collect()).unwrap_or_default()
}

/// A subscription, and every event it has brought so far.
struct Watch {
    frames: Frames,
    seen: Vec<Value>,
}

impl Watch {
    /// The `kind` event of `subagent_id`, already seen or arriving within `WAIT`: tasks end
    /// in any order.
    fn wait_for(&mut self, kind: &str, subagent_id: &str) -> Value {
        let deadline = Instant::now() + WAIT;
        let matches = |event: &Value| event["event_type"] == kind && event["payload"]["subagent_id"] == subagent_id;
        loop {
            if let Some(event) = self.seen.iter().find(|e| matches(e)) {
                return event.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(frame) = self.frames.next(left) else {
                panic!("no {kind} for {subagent_id} within {WAIT:?}: {:?}", types(&self.seen))
            };
            self.seen.push(frame["params"].clone());
        }
    }
}

/// Whether a process whose command line or environment holds `marker` runs (the `hang`
/// harness exports it, so its children carry it too).
fn running(marker: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
        let holds = |file: &str| {
            let bytes = std::fs::read(entry.path().join(file)).unwrap_or_default();
            String::from_utf8_lossy(&bytes).contains(marker)
        };
        let alive = !std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default().contains(") Z ");
        alive && (holds("cmdline") || holds("environ"))
    })
}

/// Waits (within `WAIT`) for no process with `marker` to be left.
fn gone(marker: &str) -> bool {
    let deadline = Instant::now() + WAIT;
    while running(marker) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::yield_now();
    }
    true
}

#[test]
fn subagents_succeed_fail_time_out_and_are_cancelled_and_each_ending_is_reported_once() {
    let marker = format!("kestrel-sub-{}-a", std::process::id());
    let bae = Bae::start();
    let mut harness = open(&bae, &marker, &[IMAGE]);
    start_sandbox(&mut harness, IMAGE);
    let mut watch = Watch { frames: harness.start("session.subscribe", json!({})), seen: Vec::new() };

    bae.fake.script([
        calls(json!([
            launch("tu_echo", "echo", "m'1", "hello there"),
            launch("tu_fail", "fail", "m", "p"),
            launch("tu_slow", "slow", "m", "p"),
            launch("tu_hang", "hang", "m", "p"),
            launch("tu_arg", "arg", "it's", "a; rm -rf / ${x}"),
        ])),
        anthropic::text_answer("Launched."),
    ]);
    let frames = harness.send_message(json!("start them"));
    let result = &frames.last().unwrap()["result"];
    assert_eq!(result["message"]["content"][0]["text"], "Launched.", "{frames:?}");
    // The turn's own events: the calls and their results, not the tasks' lifecycle.
    let own = types(result["events"].as_array().unwrap());
    assert!(!own.iter().any(|t| t.starts_with("session.subagent")), "{own:?}");
    assert_eq!(own.iter().filter(|t| *t == "tool.result").count(), 5);

    assert_eq!(offered(&bae, 0), ["launch_subagent"], "the status tool waits for a task");
    assert_eq!(offered(&bae, 1), ["launch_subagent", "remote_subagent_status"]);
    let started = results(&bae, 1);
    let mut ids = std::collections::HashMap::new();
    for (call, reply, is_error) in &started {
        assert!(!is_error, "{call}: {reply}");
        assert_eq!(reply["status"], "started");
        assert!(reply["subagent_id"].as_str().unwrap().starts_with("sba_"), "{reply}");
        ids.insert(call.trim_start_matches("tu_").to_string(), reply["subagent_id"].as_str().unwrap().to_string());
    }
    assert_eq!(started[0].1["model"], "m'1");

    let completed = watch.wait_for("session.subagent.completed", &ids["echo"]);
    assert_eq!(
        completed["payload"],
        json!({ "dispatch": "remote", "subagent_id": ids["echo"], "harness": "echo", "model": "m'1", "detail": null, "exit_code": 0 })
    );
    let failed = watch.wait_for("session.subagent.failed", &ids["fail"]);
    assert_eq!((&failed["payload"]["reason"], &failed["payload"]["exit_code"]), (&json!("nonzero_exit"), &json!(3)));
    let timed_out = watch.wait_for("session.subagent.failed", &ids["slow"]);
    assert_eq!(
        (&timed_out["payload"]["reason"], &timed_out["payload"]["exit_code"]),
        (&json!("timeout"), &Value::Null)
    );
    watch.wait_for("session.subagent.completed", &ids["arg"]);
    assert!(running(&marker), "the hanging one still runs");

    let cancel = |harness: &mut Harness, id: &str| harness.call("session.cancelSubagent", json!({ "subagent_id": id }));
    let cancelled = cancel(&mut harness, &ids["hang"]);
    assert_eq!(
        cancelled.last().unwrap()["result"],
        json!({ "cancelled": true, "subagent_id": ids["hang"], "was_running": true })
    );
    let event = watch.wait_for("session.subagent.cancelled", &ids["hang"]);
    assert_eq!(event["payload"]["reason"], "explicit");
    assert!(event["payload"].get("exit_code").is_none(), "{event}");
    assert!(gone(&marker), "cancel killed the process");
    assert_eq!(cancel(&mut harness, &ids["hang"]).last().unwrap()["result"]["was_running"], false);
    let unknown = cancel(&mut harness, "sba_nope");
    assert_eq!(
        unknown.last().unwrap()["error"],
        json!({ "code": -32014, "message": "subagent_not_found: no tracked subagent \"sba_nope\" for this session" })
    );
    assert_eq!(cancel(&mut harness, " ").last().unwrap()["error"]["code"], -32602);

    // Every ending, in launch order, once.
    let status = json!({ "type": "tool_use", "id": "tu_s1", "name": "remote_subagent_status", "input": {} });
    bae.fake.script([calls(json!([status])), anthropic::text_answer("Reported.")]);
    harness.send_message(json!("how did they do?"));
    let (_, report, is_error) = results(&bae, 3).remove(0);
    assert!(!is_error);
    let entries = report["subagents"].as_array().unwrap();
    let summary: Vec<(&str, &str)> =
        entries.iter().map(|e| (e["harness"].as_str().unwrap(), e["status"].as_str().unwrap())).collect();
    assert_eq!(
        summary,
        [("echo", "completed"), ("fail", "failed"), ("slow", "timed_out"), ("hang", "cancelled"), ("arg", "completed")]
    );
    assert_eq!(entries[0]["stdout"], "model=m'1\nhello there", "{report}");
    assert_eq!((&entries[1]["stderr"], &entries[1]["exit_code"]), (&json!("bad\n"), &json!(3)));
    assert_eq!((&entries[2]["stdout"], &entries[2]["reason"]), (&Value::Null, &json!("timeout")));
    assert_eq!(entries[3]["reason"], "explicit");
    assert_eq!(entries[4]["stdout"], "it's|a; rm -rf / ${x}|", "each value one quoted word");
    assert_eq!(entries[0]["truncated"], false);

    // Reported once: the map is empty, the status tool is no longer offered.
    let again = json!({ "type": "tool_use", "id": "tu_s2", "name": "remote_subagent_status", "input": { "subagent_id": ids["echo"] } });
    bae.fake.script([calls(json!([again])), anthropic::text_answer("Gone.")]);
    harness.send_message(json!("and the echo one?"));
    assert_eq!(offered(&bae, 4), ["launch_subagent"]);
    let (_, gone_reply, is_error) = results(&bae, 5).remove(0);
    assert_eq!((gone_reply, is_error), (json!({ "error": "unknown subagent_id" }), true));
}

#[test]
fn refused_launches_are_in_band_errors_and_start_nothing() {
    let marker = format!("kestrel-sub-{}-b", std::process::id());
    let bae = Bae::start_with(|config| config.bae.max_subagents_per_session = 1);
    let mut harness = open(&bae, &marker, &[IMAGE, "other:1"]);

    bae.fake.script([calls(json!([launch("tu_nobox", "hang", "m", "p")])), anthropic::text_answer("No sandbox.")]);
    harness.send_message(json!("try"));
    start_sandbox(&mut harness, "other:1");
    bae.fake.script([calls(json!([launch("tu_image", "hang", "m", "p")])), anthropic::text_answer("Wrong image.")]);
    harness.send_message(json!("try again"));
    harness.call("session.stopRemoteSandbox", json!({}));
    start_sandbox(&mut harness, IMAGE);
    bae.fake.script([
        calls(json!([
            launch("tu_who", "nobody", "m", "p"),
            launch("tu_blank", "hang", "m", " "),
            launch("tu_one", "hang", "m", "p"),
            launch("tu_two", "hang", "m", "p"),
        ])),
        anthropic::text_answer("Capped."),
    ]);
    harness.send_message(json!("and now"));

    let error = |index: usize, at: usize| {
        let (_, reply, is_error) = results(&bae, index).remove(at);
        assert!(is_error, "{reply}");
        reply["error"].as_str().unwrap().to_string()
    };
    assert_eq!(
        error(1, 0),
        "no remote sandbox is running for tool 'launch_subagent'; call session.startRemoteSandbox first"
    );
    assert_eq!(
        error(3, 0),
        "remote sandbox image mismatch: subagent declared \"alpine:3.19\" but the running sandbox uses \"other:1\""
    );
    assert_eq!(error(5, 0), "unknown harness \"nobody\"");
    assert_eq!(error(5, 1), "launch_subagent requires string \"harness\", \"model\", and \"prompt\"");
    assert_eq!(results(&bae, 5)[2].1["status"], "started");
    assert_eq!(error(5, 3), "subagent limit reached (max 1 per session)");
    let lifecycle: Vec<String> =
        types(&harness.events()).into_iter().filter(|t| t.starts_with("session.subagent")).collect();
    assert_eq!(lifecycle, ["session.subagent.start", "session.subagent.running"], "only the one launch");
    assert!(running(&marker));

    // Another session (another client's) cannot see or cancel it.
    let started = results(&bae, 5)[2].1["subagent_id"].as_str().unwrap().to_string();
    let (_, other) = bae.key_for("other", &[]);
    let mut stranger = Harness::open_with(bae.base(), &other, json!({ "tools": [] }));
    let refused = stranger.call("session.cancelSubagent", json!({ "subagent_id": started }));
    assert_eq!(refused.last().unwrap()["error"]["code"], -32014);
    assert!(running(&marker), "still running");
}

#[test]
fn close_stops_the_subagent_the_sandbox_and_the_mcp_server_and_leaves_no_process() {
    let marker = format!("kestrel-sub-{}-c", std::process::id());
    let mcp_marker = format!("{marker}-mcp");
    let tiny =
        kestrel::config::bae::McpServer::stdio("tiny", "python3", vec![crate::mcp::TINY.into(), mcp_marker.clone()]);
    let everything = kestrel::config::bae::McpServer::stdio(
        "everything",
        "node",
        vec![crate::mcp::everything().to_string_lossy().into_owned(), "stdio".into()],
    );
    let bae = Bae::start_with(move |config| config.bae.file.mcp.servers.extend([tiny, everything]));
    let body = json!({ "name": "all", "primary_provider": "fake", "allowed_tools": [], "available_sandboxes": [IMAGE],
        "mcp_servers": ["tiny", "everything"] });
    let profile = bae.admin_send("POST", "/admin/v1/profiles", Some(body));
    let (_, key) = bae.client_key(profile.json["id"].as_str().unwrap());
    let body = json!({ "tools": [], "subagent_tools": [declaration(&marker)] });
    let mut harness = Harness::open_with(bae.base(), &key, body);
    start_sandbox(&mut harness, IMAGE);

    // One turn: the real MCP server's echo (both servers have one: the later server's is
    // offered, once), and a subagent that keeps running.
    let echo = json!({ "type": "tool_use", "id": "tu_mcp", "name": "echo", "input": { "message": "from bae" } });
    bae.fake.script([calls(json!([echo, launch("tu_hang", "hang", "m", "p")])), anthropic::text_answer("Both.")]);
    let frames = harness.send_message(json!("go"));
    let echoes = offered(&bae, 0).into_iter().filter(|name| name == "echo").count();
    assert_eq!(echoes, 1);
    let events = frames.last().unwrap()["result"]["events"].as_array().unwrap().clone();
    let response = events.iter().find(|e| e["event_type"] == "mcp.response").expect("an mcp.response");
    assert_eq!(response["payload"]["server_name"], "everything");
    let messages = bae.fake.requests()[1].body["messages"].clone();
    let sent = messages.as_array().unwrap().last().unwrap()["content"].clone();
    assert_eq!((&sent[0]["tool_use_id"], &sent[0]["content"][0]["text"]), (&json!("tu_mcp"), &json!("Echo: from bae")));
    assert_eq!(sent[1]["tool_use_id"], "tu_hang");
    assert!(running(&marker) && running(&mcp_marker), "the subagent and the MCP server run");

    let path = format!("/api/v1/sessions/{}", harness.session_id);
    let closed = send(bae.base(), "DELETE", &path, Some(&harness.session_key), None);
    assert_eq!(closed.status, 200, "{}", closed.text);
    assert!(gone(&marker), "close killed the subagent");
    assert!(gone(&mcp_marker), "close killed the MCP server");
    let tail: Vec<Value> = harness
        .events()
        .into_iter()
        .skip_while(|e| e["event_type"] != "session.close")
        .filter(|e| e["event_type"] != "session.sandbox.stop")
        .collect();
    assert_eq!(types(&tail), ["session.close", "session.subagent.cancelled", "session.sandbox.stopped"]);
    assert_eq!(tail[1]["payload"]["reason"], "session_close");
    assert_eq!(tail[2]["payload"]["reason"], "session_close");
    let sandboxes = bae.server.data_dir.join("sandboxes");
    let left = std::fs::read_dir(&sandboxes)
        .map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("lsb_")).count())
        .unwrap_or(0);
    assert_eq!(left, 0, "the sandbox directory is gone");
}

#[test]
fn a_local_subagent_report_is_checked_and_becomes_the_lifecycle_event() {
    let bae = Bae::start();
    let (_, key) = bae.key_for("local", &["launch_subagent", "local_subagent_status"]);
    let mut harness = Harness::open(bae.base(), &key, &["launch_subagent"]);
    let report = |harness: &mut Harness, params: Value| {
        harness.call("session.reportLocalSubagent", params).last().unwrap().clone()
    };
    let base = json!({ "subagent_id": "sba_local", "harness": "claude", "model": "m", "detail": null });
    let with = |extra: Value| {
        let mut params = base.clone();
        params.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        params
    };
    // BAE's Python SDK sends exit_code null for non-terminal states: accepted.
    let ok = report(&mut harness, with(json!({ "state": "start", "exit_code": null })));
    assert_eq!(ok["result"], json!({ "reported": true }));
    report(&mut harness, with(json!({ "state": "failed", "reason": "timeout", "exit_code": 124, "detail": "slow" })));
    report(&mut harness, with(json!({ "state": "cancelled", "reason": "explicit" })));
    for (bad, message) in [
        (
            with(json!({ "state": "paused" })),
            "\"state\" must be \"start\", \"running\", \"completed\", \"failed\", or \"cancelled\"",
        ),
        (
            with(json!({ "state": "start", "harness": " " })),
            "\"subagent_id\", \"harness\", and \"model\" must be non-empty strings",
        ),
        (with(json!({ "state": "start", "detail": 5 })), "\"detail\" must be a string or null"),
        (with(json!({ "state": "failed", "exit_code": "1" })), "\"exit_code\" must be an integer"),
    ] {
        let answer = report(&mut harness, bad);
        assert_eq!(answer["error"], json!({ "code": -32602, "message": format!("Invalid params: {message}") }));
    }
    let events: Vec<Value> = harness
        .events()
        .into_iter()
        .filter(|e| e["event_type"].as_str().unwrap().starts_with("session.subagent"))
        .collect();
    assert_eq!(types(&events), ["session.subagent.start", "session.subagent.failed", "session.subagent.cancelled"]);
    assert_eq!(
        events[1]["payload"],
        json!({ "dispatch": "local", "subagent_id": "sba_local", "harness": "claude", "model": "m", "detail": "slow", "reason": "timeout", "exit_code": 124 })
    );
    assert_eq!(
        events[2]["payload"],
        json!({ "dispatch": "local", "subagent_id": "sba_local", "harness": "claude", "model": "m", "detail": null, "reason": "explicit" })
    );

    // Not a driver: -32001 before any params check.
    let (_, other) = bae.key_for("other", &[]);
    let mut stranger = Harness::open_unregistered(bae.base(), &other, json!({ "tools": [] }));
    let refused = report(&mut stranger, json!({ "state": "nonsense" }));
    assert_eq!(refused["error"]["code"], -32001);
}

/// The binary with the fake as its provider and `extra` config; kills -9 it with a subagent
/// running, and finds no process of the subagent left.
fn killed_mid_subagent_leaves_nothing(extra: &str, image: &str, marker: &str) {
    let fake = crate::fake_provider::FakeProvider::start();
    let (data, workspace) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let config = format!(
        "[providers.fake]\nwire = \"anthropic\"\nbase_url = \"{}\"\nmodels = [{{ name = \"claude-x\" }}]\n{extra}",
        fake.base_url
    );
    let (mut child, base, admin) = crate::support::spawn_binary(data.path(), workspace.path(), &config);
    let admin_key = std::fs::read_to_string(data.path().join("admin-key")).unwrap().trim().to_string();
    let body = json!({ "name": "k", "primary_provider": "fake", "allowed_tools": [], "available_sandboxes": [image] });
    let profile = send(&admin, "POST", "/admin/v1/profiles", Some(&admin_key), Some(body));
    let body = json!({ "name": "k", "profile_id": profile.json["id"] });
    let key =
        send(&admin, "POST", "/admin/v1/keys", Some(&admin_key), Some(body)).json["key"].as_str().unwrap().to_string();
    let mut declared = declaration(marker);
    declared["image"] = json!(image);
    let mut harness = Harness::open_with(&base, &key, json!({ "tools": [], "subagent_tools": [declared] }));
    start_sandbox(&mut harness, image);
    fake.script([calls(json!([launch("tu_hang", "hang", "m", "p")])), anthropic::text_answer("Running.")]);
    harness.send_message(json!("start it"));
    assert!(running(marker), "the subagent runs");

    let _ = child.kill();
    let _ = child.wait();
    // What ran under the killed server dies with it (`setpriv`, bubblewrap); what that
    // started, at the next start (the `KESTREL_COMMAND` sweep).
    let (mut again, _, _) = crate::support::spawn_binary(data.path(), workspace.path(), &config);
    let left = gone(marker);
    let _ = again.kill();
    let _ = again.wait();
    assert!(left, "a server killed with SIGKILL left its subagent running past the next start");
}

#[test]
fn a_server_killed_with_sigkill_leaves_no_subagent_behind() {
    // The local driver (under bubblewrap when it works here, else unisolated).
    let marker = format!("kestrel-sub-{}-k1", std::process::id());
    killed_mid_subagent_leaves_nothing("", IMAGE, &marker);
    // The docker driver: the CLI dies with the server, and so does what it ran.
    let bin = tempfile::tempdir().unwrap();
    let docker = super::sandbox::fake_docker(bin.path());
    let extra = format!("[bae]\nsandbox_driver = \"docker\"\ndocker_cli = \"{}\"\n", docker.display());
    let marker = format!("kestrel-sub-{}-k2", std::process::id());
    killed_mid_subagent_leaves_nothing(&extra, "present:1", &marker);
}
