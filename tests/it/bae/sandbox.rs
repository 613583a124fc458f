//! A session's remote sandbox with the local driver: start from an allowed image, exec, stop,
//! the refusals with their codes, the lifecycle events, and close stopping it. And the Docker
//! driver's command lines, against a `docker` written for the tests that records its
//! arguments and answers like the real CLI, with image provisioning in the background.

use serde_json::{json, Value};

use super::support::{send, types, Bae, Harness};

fn call(harness: &mut Harness, method: &str, params: Value) -> Value {
    harness.call(method, params).last().unwrap().clone()
}

#[test]
fn a_remote_sandbox_starts_runs_commands_stops_and_close_stops_it_too() {
    let bae = Bae::start();
    let body = json!({ "name": "boxed", "primary_provider": "fake", "allowed_tools": [], "available_sandboxes": ["alpine:3.19"] });
    let profile = bae.admin_send("POST", "/admin/v1/profiles", Some(body));
    assert_eq!(profile.status, 201, "{}", profile.text);
    let (_, key) = bae.client_key(profile.json["id"].as_str().unwrap());
    let mut harness = Harness::open(bae.base(), &key, &[]);

    let code = |answer: &Value| answer["error"]["code"].clone();
    assert_eq!(code(&call(&mut harness, "session.execRemoteSandbox", json!({ "command": "true" }))), -32013);
    assert_eq!(code(&call(&mut harness, "session.stopRemoteSandbox", json!({}))), -32013);
    assert_eq!(code(&call(&mut harness, "session.startRemoteSandbox", json!({ "image": " " }))), -32602);
    let refused = call(&mut harness, "session.startRemoteSandbox", json!({ "image": "python:3.12" }));
    assert_eq!(code(&refused), -32011);
    assert_eq!(
        refused["error"]["message"],
        "sandbox_image_not_allowed: image \"python:3.12\" is not in this session profile's available_sandboxes"
    );

    let started = call(&mut harness, "session.startRemoteSandbox", json!({ "image": "alpine:3.19" }));
    let sandbox_id = started["result"]["sandbox_id"].as_str().unwrap_or_else(|| panic!("{started}")).to_string();
    assert_eq!(started["result"]["image"], "alpine:3.19");
    assert!(started["result"]["started_at"].is_string());
    assert_eq!(code(&call(&mut harness, "session.startRemoteSandbox", json!({ "image": "alpine:3.19" }))), -32000);
    let ran = call(&mut harness, "session.execRemoteSandbox", json!({ "command": "echo hi; echo no >&2; exit 3" }));
    assert_eq!(
        ran["result"],
        json!({ "stdout": "hi\n", "stderr": "no\n", "exit_code": 3, "truncated": false }),
        "{ran}"
    );
    assert_eq!(code(&call(&mut harness, "session.execRemoteSandbox", json!({}))), -32602);

    let stopped = call(&mut harness, "session.stopRemoteSandbox", json!({}));
    assert_eq!(stopped["result"], json!({ "stopped": true, "image": "alpine:3.19", "sandbox_id": sandbox_id }));
    // Started again, then the session closes: the sandbox stops with it.
    call(&mut harness, "session.startRemoteSandbox", json!({ "image": "alpine:3.19" }));
    let path = format!("/api/v1/sessions/{}", harness.session_id);
    assert_eq!(send(bae.base(), "DELETE", &path, Some(&harness.session_key), None).status, 200);

    let mut events: Vec<Value> = harness
        .events()
        .into_iter()
        .filter(|e| e["event_type"].as_str().unwrap().starts_with("session.sandbox"))
        .collect();
    // At registration: the profile's images, which the local driver always has.
    let available = events.remove(0);
    assert_eq!(available["event_type"], "session.sandbox.available");
    assert_eq!(available["payload"], json!({ "images": [{ "name": "alpine:3.19", "status": "available" }] }));
    assert_eq!(
        types(&events),
        [
            "session.sandbox.start",
            "session.sandbox.running",
            "session.sandbox.stop",
            "session.sandbox.stopped",
            "session.sandbox.start",
            "session.sandbox.running",
            "session.sandbox.stop",
            "session.sandbox.stopped"
        ]
    );
    assert_eq!(events[0]["payload"], json!({ "image": "alpine:3.19", "dispatch": "remote" }));
    assert_eq!(events[1]["payload"]["sandbox_id"], sandbox_id.as_str());
    assert_eq!(events[2]["payload"]["reason"], "explicit");
    assert_eq!(events[6]["payload"]["reason"], "session_close");
    assert!(events[1]["payload"]["unsandboxed"].is_boolean());
    assert!(!bae.server.data_dir.join("sandboxes").join(&sandbox_id).exists(), "stop removed the sandbox");
}

#[test]
fn an_auto_mode_sandbox_tool_runs_inside_the_turn() {
    use crate::fake_provider::anthropic;
    let bae = Bae::start();
    let body = json!({ "name": "auto", "primary_provider": "fake", "allowed_tools": [], "available_sandboxes": ["alpine:3.19"] });
    let profile = bae.admin_send("POST", "/admin/v1/profiles", Some(body));
    let (_, key) = bae.client_key(profile.json["id"].as_str().unwrap());
    let shell = json!({ "name": "shell", "description": "Run a command",
        "input_schema": { "type": "object", "properties": { "command": { "type": "string" } }, "required": ["command"] } });
    let mut harness = Harness::open_with(bae.base(), &key, json!({ "tools": [], "sandbox_tools": [shell] }));

    // No sandbox yet: the call's result says so and the turn goes on.
    bae.fake.script([
        anthropic::tool_answer("tu_1", "shell", json!({ "command": "echo hi" })),
        anthropic::text_answer("No sandbox."),
    ]);
    let frames = harness.send_message(json!("run it"));
    assert_eq!(frames.last().unwrap()["result"]["message"]["content"][0]["text"], "No sandbox.", "{frames:?}");
    let asked = &bae.fake.requests()[0].body["tools"];
    assert_eq!(asked[0]["name"], "shell", "the model sees the sandbox tool");
    let second = &bae.fake.requests()[1].body["messages"];
    let result = second.as_array().unwrap().last().unwrap()["content"][0].clone();
    assert_eq!(result["is_error"], true);
    assert!(result["content"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with("sandbox error: no remote sandbox is running for tool 'shell'"));

    call(&mut harness, "session.startRemoteSandbox", json!({ "image": "alpine:3.19" }));
    bae.fake.script([
        anthropic::tool_answer("tu_2", "shell", json!({ "command": "echo hi; echo e >&2; exit 2" })),
        anthropic::text_answer("Ran."),
    ]);
    let frames = harness.send_message(json!("run it again"));
    let events = frames.last().unwrap()["result"]["events"].as_array().unwrap().clone();
    assert_eq!(
        types(&events),
        [
            "client.message.send",
            "provider.request",
            "provider.response",
            "tool.call",
            "sandbox.request",
            "sandbox.response",
            "tool.result",
            "provider.request",
            "provider.response",
            "server.message.send"
        ]
    );
    assert_eq!(events[3]["payload"]["dispatch"], "sandbox");
    assert_eq!(events[4]["payload"]["command"], "echo hi; echo e >&2; exit 2");
    assert_eq!(
        events[5]["payload"]["result"],
        json!({ "stdout": "hi\n", "stderr": "e\n", "exit_code": 2, "truncated": false })
    );
    assert_eq!(events[6]["payload"]["content"], json!([{ "type": "text", "text": "hi\n[stderr]\ne\n[exit_code: 2]" }]));
    assert_eq!(events[6]["payload"]["is_error"], true);
}

/// A `docker` that records each call's arguments (`[a][b]…` a line) and answers like the CLI:
/// `present:1` is there, `broken:1` cannot be pulled, `slow:1` is inspected only once the
/// test writes to the `gate` FIFO; `exec` runs the command here.
pub fn fake_docker(dir: &std::path::Path) -> std::path::PathBuf {
    let (log, gate, program) = (dir.join("calls.log"), dir.join("gate"), dir.join("docker"));
    let made = std::process::Command::new("mkfifo").arg(&gate).status().unwrap();
    assert!(made.success());
    let script = format!(
        r#"#!/bin/sh
for a in "$@"; do printf '[%s]' "$a" >> {log}; done; echo >> {log}
case "$1" in
  image) [ "$3" = "present:1" ] && exit 0
         [ "$3" = "slow:1" ] && {{ cat {gate} > /dev/null; exit 0; }}
         echo "Error: No such image: $3" >&2; exit 1 ;;
  pull) [ "$2" = "broken:1" ] && {{ echo "Error response from daemon: manifest for broken:1 not found" >&2; exit 1; }}
        echo "pulled $2"; exit 0 ;;
  run) echo "c0ffee1234"; exit 0 ;;
  exec) shift; [ "$1" = "-i" ] && shift; [ "$1" = "-e" ] && {{ export "$2"; shift 2; }}; shift; exec "$@" ;;
  stop) echo "$2"; exit 0 ;;
esac
exit 2
"#,
        log = log.display(),
        gate = gate.display()
    );
    std::fs::write(&program, script).unwrap();
    std::fs::set_permissions(&program, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    program
}

/// The recorded calls, a line each.
pub fn calls_made(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("calls.log")).unwrap_or_default().lines().map(str::to_string).collect()
}

/// `/admin/v1/sandbox-status` once `ready` holds of its items, within `WAIT`.
fn status_when(bae: &Bae, ready: impl Fn(&Value) -> bool) -> Value {
    let deadline = std::time::Instant::now() + crate::support::WAIT;
    loop {
        let status = bae.admin_send("GET", "/admin/v1/sandbox-status", None);
        assert_eq!(status.status, 200, "{}", status.text);
        if ready(&status.json["items"]) {
            return status.json["items"].clone();
        }
        assert!(std::time::Instant::now() < deadline, "sandbox status never settled: {}", status.text);
        std::thread::yield_now();
    }
}

fn image_status(items: &Value, image: &str) -> Value {
    let images = items[0]["images"].as_array().unwrap();
    images.iter().find(|i| i["name"] == image).cloned().unwrap_or(Value::Null)
}

#[test]
fn the_docker_driver_runs_bae_s_command_lines_and_provisions_images_in_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let program = fake_docker(dir.path());
    let docker = move |config: &mut kestrel::Config| {
        config.bae.sandbox_driver = "docker".into();
        config.bae.docker_cli = program.clone();
    };
    let mut bae = Bae::start_with(docker.clone());
    let images = ["present:1", "pulled:1", "broken:1", "slow:1"];
    let body =
        json!({ "name": "docker", "primary_provider": "fake", "allowed_tools": [], "available_sandboxes": images });
    let profile = bae.admin_send("POST", "/admin/v1/profiles", Some(body));
    assert_eq!(profile.status, 201, "{}", profile.text);
    let profile_id = profile.json["id"].as_str().unwrap().to_string();

    // The admin call did not wait; the slow image stays pending until its inspect returns.
    let settled = |items: &Value| image_status(items, "broken:1")["status"] == "error";
    let items = status_when(&bae, settled);
    assert_eq!(items[0]["profile_id"], profile_id.as_str());
    let names: Vec<&str> = items[0]["images"].as_array().unwrap().iter().map(|i| i["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["broken:1", "present:1", "pulled:1", "slow:1"], "by image name");
    assert_eq!(image_status(&items, "present:1"), json!({ "name": "present:1", "status": "available" }));
    assert_eq!(image_status(&items, "pulled:1")["status"], "available");
    assert_eq!(
        image_status(&items, "broken:1"),
        json!({ "name": "broken:1", "status": "error", "detail": "Error response from daemon: manifest for broken:1 not found" })
    );
    assert_eq!(image_status(&items, "slow:1"), json!({ "name": "slow:1", "status": "pending" }));

    // A driver registering sees the same, in the profile's order.
    let declaration = json!({ "name": "launch_subagent", "image": "present:1",
        "subagents": [{ "harness": "cat", "command_template": "cat; echo ' as' {model}" }] });
    let (_, key) = bae.client_key(&profile_id);
    let mut harness = Harness::open_with(bae.base(), &key, json!({ "tools": [], "subagent_tools": [declaration] }));
    let available = harness.events().into_iter().find(|e| e["event_type"] == "session.sandbox.available");
    let available = available.expect("session.sandbox.available at registration");
    let statuses: Vec<&str> =
        available["payload"]["images"].as_array().unwrap().iter().map(|i| i["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["available", "available", "error", "pending"]);
    assert_eq!(available["payload"]["images"][0]["name"], "present:1");
    std::fs::write(dir.path().join("gate"), "go").unwrap();
    status_when(&bae, |items| image_status(items, "slow:1")["status"] == "available");

    let provisioned = calls_made(dir.path());
    assert_eq!(
        provisioned,
        [
            "[image][inspect][present:1]",
            "[image][inspect][pulled:1]",
            "[pull][pulled:1]",
            "[image][inspect][broken:1]",
            "[pull][broken:1]",
            "[image][inspect][slow:1]"
        ]
    );

    // Start, exec, a subagent, stop: each exactly as BAE runs it.
    call(&mut harness, "session.startRemoteSandbox", json!({ "image": "present:1" }));
    let ran = call(&mut harness, "session.execRemoteSandbox", json!({ "command": "echo 'hi there'" }));
    assert_eq!(ran["result"], json!({ "stdout": "hi there\n", "stderr": "", "exit_code": 0, "truncated": false }));
    use crate::fake_provider::anthropic;
    let launch = json!([{ "type": "tool_use", "id": "tu_1", "name": "launch_subagent",
        "input": { "harness": "cat", "model": "o'k", "prompt": "the prompt" } }]);
    bae.fake.script([anthropic::answer(launch, "tool_use", 10, 5), anthropic::text_answer("ok")]);
    let watch = harness.start("session.subscribe", json!({}));
    harness.send_message(json!("go"));
    let deadline = std::time::Instant::now() + crate::support::WAIT;
    while watch
        .next(deadline.saturating_duration_since(std::time::Instant::now()))
        .is_some_and(|frame| frame["params"]["event_type"] != "session.subagent.completed")
    {}
    let status = json!([{ "type": "tool_use", "id": "tu_2", "name": "remote_subagent_status", "input": {} }]);
    bae.fake.script([anthropic::answer(status, "tool_use", 10, 5), anthropic::text_answer("ok")]);
    harness.send_message(json!("and?"));
    let messages = bae.fake.requests()[3].body["messages"].clone();
    let reply = messages.as_array().unwrap().last().unwrap()["content"][0]["content"][0]["text"].clone();
    let reply: Value = serde_json::from_str(reply.as_str().unwrap()).unwrap();
    assert_eq!(reply["subagents"][0]["stdout"], "the prompt as o'k\n", "{reply}");
    call(&mut harness, "session.stopRemoteSandbox", json!({}));
    let marker = regex::Regex::new(r"KESTREL_COMMAND=[^\]]+:c0ffee1234:[0-9a-f]{32}").unwrap();
    let session_calls: Vec<String> = calls_made(dir.path())
        .into_iter()
        .skip(provisioned.len())
        .map(|line| marker.replace_all(&line, "KESTREL_COMMAND=<marker>").into_owned())
        .collect();
    assert_eq!(
        session_calls,
        [
            "[image][inspect][present:1]",
            "[run][-d][--rm][present:1][sleep][infinity]",
            "[exec][-e][KESTREL_COMMAND=<marker>][c0ffee1234][sh][-c][echo 'hi there'][sh]",
            r#"[exec][-i][-e][KESTREL_COMMAND=<marker>][c0ffee1234][sh][-c][cat; echo ' as' "$1"][sh][o'k]"#,
            "[stop][c0ffee1234]"
        ]
    );

    // At start every live profile's images are provisioned again.
    bae.restart_with(docker);
    status_when(&bae, |items| image_status(items, "broken:1")["status"] == "error");
    let again: Vec<String> = calls_made(dir.path()).into_iter().skip(provisioned.len() + session_calls.len()).collect();
    assert_eq!(again[0], "[image][inspect][present:1]", "{again:?}");
}

/// A session of a profile offering `alpine:3.19`, its remote sandbox started; whether the
/// driver isolates commands.
fn sandboxed(bae: &Bae) -> (Harness, bool) {
    let body = json!({ "name": "hardened", "primary_provider": "fake", "allowed_tools": [], "available_sandboxes": ["alpine:3.19"] });
    let profile = bae.admin_send("POST", "/admin/v1/profiles", Some(body));
    assert_eq!(profile.status, 201, "{}", profile.text);
    let (_, key) = bae.client_key(profile.json["id"].as_str().unwrap());
    let mut harness = Harness::open(bae.base(), &key, &[]);
    call(&mut harness, "session.startRemoteSandbox", json!({ "image": "alpine:3.19" }));
    let running = harness.events().into_iter().find(|e| e["event_type"] == "session.sandbox.running").unwrap();
    let isolated = !running["payload"]["unsandboxed"].as_bool().unwrap();
    (harness, isolated)
}

fn exec(harness: &mut Harness, command: &str) -> Value {
    let ran = call(harness, "session.execRemoteSandbox", json!({ "command": command }));
    ran["result"].clone()
}

#[test]
fn a_sandbox_command_sees_no_server_secret_and_under_bubblewrap_no_host_secret() {
    // A provider key the server reads from its environment, set in this process only.
    let secret_name = format!("KESTREL_IT_SANDBOX_KEY_{}", std::process::id());
    std::env::set_var(&secret_name, "sk-ant-sandbox-secret");
    let bae = Bae::start();
    let (mut harness, isolated) = sandboxed(&bae);
    let env = exec(&mut harness, "env");
    std::env::remove_var(&secret_name);
    let stdout = env["stdout"].as_str().unwrap();
    assert!(!stdout.contains("sk-ant-sandbox-secret") && !stdout.contains(&secret_name), "{stdout}");
    let names: Vec<&str> = stdout.lines().filter_map(|line| line.split('=').next()).collect();
    for name in &names {
        let allowed =
            ["PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ", "KESTREL_COMMAND", "PWD", "SHLVL", "_"];
        assert!(allowed.contains(name), "{name} reached the sandbox: {stdout}");
    }
    let data_dir = bae.server.data_dir.display().to_string();
    let admin_key = std::fs::read_to_string(bae.server.data_dir.join("admin-key")).unwrap();
    if isolated {
        // The data dir (the admin key, the key secret, the database) is not there at all.
        for file in ["admin-key", "bae-key-secret", "kestrel.db"] {
            let read = exec(&mut harness, &format!("cat {data_dir}/{file}"));
            assert_ne!(read["exit_code"], 0, "{file} was readable: {read}");
        }
        let shadow = exec(&mut harness, "cat /etc/shadow; ls /root /home");
        assert!(shadow["stdout"].as_str().unwrap().trim().is_empty(), "{shadow}");
    } else {
        eprintln!("bubblewrap is not available here: only the unsandboxed environment was checked");
    }
    assert!(!stdout.contains(admin_key.trim()));
}

#[test]
fn a_sandbox_command_is_capped_converted_and_cannot_outlive_its_timeout() {
    let bae = Bae::start_with(|config| {
        config.bae.sandbox_output_limit_bytes = 1000;
        config.bae.sandbox_exec_timeout_secs = 2;
    });
    let (mut harness, _) = sandboxed(&bae);
    let flood = exec(&mut harness, "head -c 50000000 /dev/zero | tr '\\0' x; echo done >&2");
    assert_eq!(flood["stdout"].as_str().unwrap().len(), 1000, "capped");
    assert_eq!(flood["stderr"], "done\n");
    assert_eq!(flood["truncated"], true);
    assert_eq!(flood["exit_code"], 0);
    let binary = exec(&mut harness, r"printf '\377\376ok'");
    assert_eq!(binary["stdout"], "\u{FFFD}\u{FFFD}ok", "an explicit lossy conversion, not an empty stdout");
    // The background keeps the output pipe open: the command still ends, and what it started
    // ends with it (or at the timeout), whichever way it left its group.
    let mark = format!("kestrel-bg-{}", std::process::id());
    let script = format!("export MARK={mark}; sleep 120 & nohup sleep 121 & setsid sleep 122 & echo bg");
    let background = exec(&mut harness, &script);
    assert_eq!(background["stdout"], "bg\n", "{background}");
    let hung = exec(&mut harness, &format!("export MARK={mark}; setsid sleep 123 & sleep 124"));
    assert_eq!(hung["exit_code"], -1, "killed at its timeout: {hung}");
    let deadline = std::time::Instant::now() + crate::support::WAIT;
    while processes_with(&mark) > 0 {
        assert!(std::time::Instant::now() < deadline, "a background process outlived its command");
        std::thread::yield_now();
    }
}

/// Live processes whose environment holds `text`.
pub fn processes_with(text: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|entry| {
            let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
            let alive = !std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default().contains(") Z ");
            alive && String::from_utf8_lossy(&environ).contains(text)
        })
        .count()
}

/// A `docker` whose `run` hangs (a registry or engine that never answers); `image inspect`
/// finds every image. Each call is recorded as `fake_docker`'s are.
fn hanging_docker(dir: &std::path::Path) -> std::path::PathBuf {
    let (log, program) = (dir.join("calls.log"), dir.join("docker"));
    let script = format!(
        "#!/bin/sh\nfor a in \"$@\"; do printf '[%s]' \"$a\" >> {log}; done; echo >> {log}\n\
         case \"$1\" in image) exit 0 ;; run) sleep 29.731; echo late ;; stop) exit 0 ;; esac\nexit 2\n",
        log = log.display()
    );
    std::fs::write(&program, script).unwrap();
    std::fs::set_permissions(&program, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    program
}

/// How long `f` took, and what it gave.
fn timed<T>(f: impl FnOnce() -> T) -> (std::time::Duration, T) {
    let started = std::time::Instant::now();
    let value = f();
    (started.elapsed(), value)
}

#[test]
fn while_a_sandbox_start_hangs_the_session_answers_everything_else_and_close_cancels_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let program = hanging_docker(dir.path());
    let bae = Bae::start_with(|config| {
        config.bae.sandbox_driver = "docker".into();
        config.bae.docker_cli = program.clone();
    });
    let body = json!({ "name": "hanging", "primary_provider": "fake", "allowed_tools": [], "available_sandboxes": ["slow:1"] });
    let profile = bae.admin_send("POST", "/admin/v1/profiles", Some(body));
    let (_, key) = bae.client_key(profile.json["id"].as_str().unwrap());
    let mut harness = Harness::open(bae.base(), &key, &[]);
    // The reply's head comes with its result, so the start waits on a thread of its own.
    let (base, session, session_key) = (harness.base.clone(), harness.session_id.clone(), harness.session_key.clone());
    let start = std::thread::spawn(move || {
        let body = json!({ "jsonrpc": "2.0", "id": 99, "method": "session.startRemoteSandbox", "params": { "image": "slow:1" } });
        super::support::Frames::post(&base, &session, &session_key, &body.to_string()).until_terminal()
    });
    crate::support::wait_until("docker run to hang", || calls_made(dir.path()).iter().any(|c| c.starts_with("[run]")));

    let limit = std::time::Duration::from_millis(100);
    let (took, events) = timed(|| harness.get("/events?limit=200"));
    assert!(took < limit && events.status == 200, "events: {took:?} {}", events.text);
    let (took, participants) = timed(|| harness.get("/participants"));
    assert!(took < limit && participants.status == 200, "participants: {took:?} {}", participants.text);
    let (took, registered) = timed(|| harness.call("session.registerDriver", json!({})));
    assert!(took < limit, "registerDriver: {took:?}");
    assert_eq!(registered.last().unwrap()["result"]["registered"], true, "{registered:?}");
    let (took, cancelled) = timed(|| harness.call("session.cancelSubagent", json!({ "subagent_id": "sba_none" })));
    assert!(took < limit, "cancelSubagent: {took:?}");
    assert!(cancelled.last().unwrap()["error"].is_object(), "an unknown subagent: {cancelled:?}");
    assert!(!start.is_finished(), "the start is still under way");

    let (took, closed) = timed(|| harness.close());
    assert!(took < limit && closed.status == 200, "close: {took:?} {}", closed.text);
    let answer = start.join().unwrap();
    let error = &answer.last().unwrap()["error"];
    assert_eq!(error["code"], -32012, "the cancelled start failed (sandbox_start_failed): {answer:?}");
    assert!(error["message"].as_str().unwrap().contains("closed before its sandbox started"), "{error}");
    // The cancel kills the hung `docker run` (its own sleep, by its unique length) at once.
    let hung = || {
        std::fs::read_dir("/proc").unwrap().flatten().any(|p| {
            std::fs::read(p.path().join("cmdline")).is_ok_and(|c| c.starts_with(b"sleep\x0029.731"))
                && std::fs::read_to_string(p.path().join("stat")).is_ok_and(|s| !s.contains(") Z "))
        })
    };
    crate::support::wait_until("the hung docker run to be killed", || !hung());
}
