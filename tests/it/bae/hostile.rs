//! The BAE doors under attack: absurd and truncated bodies, wrong types in every method's
//! params, keys and ids of other sessions and of the other front door, and a kill -9 in the
//! middle of a turn.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Child;

use serde_json::{json, Value};

use super::support::{assert_problem, send, Bae, Frames, Harness};
use crate::fake_provider::{anthropic, Step};
use crate::support::WAIT;

fn host_of(base: &str) -> String {
    base.trim_start_matches("http://").to_string()
}

/// Writes `raw` on a fresh connection, half-closes it, and reads everything that comes back.
fn raw_exchange(base: &str, raw: &[u8]) -> String {
    let mut socket = TcpStream::connect(host_of(base)).unwrap();
    socket.set_read_timeout(Some(WAIT)).unwrap();
    socket.write_all(raw).unwrap();
    let _ = socket.shutdown(std::net::Shutdown::Write);
    let mut answer = Vec::new();
    let _ = socket.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

/// The JSON body of a raw HTTP answer.
fn body_of(answer: &str) -> Value {
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("");
    serde_json::from_str(body).unwrap_or(Value::Null)
}

#[test]
fn absurd_truncated_and_nested_bodies_are_refused_and_serving_goes_on() {
    let bae = Bae::start();
    let (_, key) = bae.key_for("hostile", &[]);
    let harness = Harness::open(bae.base(), &key, &[]);
    let rpc = format!("/api/v1/sessions/{}/rpc", harness.session_id);

    // A claimed length of a terabyte, on the client door and on the admin door: 413 problems.
    for (base, path, bearer) in
        [(bae.base(), rpc.as_str(), &harness.session_key), (&bae.admin, "/admin/v1/profiles", &bae.admin_key)]
    {
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {bearer}\r\nContent-Type: application/json\r\nContent-Length: 1000000000000\r\n\r\n{{"
        );
        let answer = raw_exchange(base, head.as_bytes());
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
        let problem = body_of(&answer);
        assert_eq!(
            (problem["type"].as_str(), problem["status"].as_u64()),
            (Some("payload_too_large"), Some(413)),
            "{answer}"
        );
    }

    // A body cut short by a client that goes away: no answer owed, nothing stored, no wedge.
    let head = format!(
        "POST /api/v1/sessions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n{{\"tools\":["
    );
    let answer = raw_exchange(bae.base(), head.as_bytes());
    assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 400"), "{answer}");

    // JSON nested far past any sane depth, as a JSON-RPC body and as an open body.
    let nested = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let frames = Frames::post(bae.base(), &harness.session_id, &harness.session_key, &nested).until_terminal();
    assert_eq!(frames.last().unwrap()["error"]["code"], -32700, "{frames:?}");
    let deep: Value = serde_json::from_str(&format!("{}1{}", "[".repeat(100), "]".repeat(100))).unwrap();
    let opened = send(bae.base(), "POST", "/api/v1/sessions", Some(&key), Some(json!({ "tools": deep })));
    assert_problem(&opened, 400, "bad_request");

    // Still serving, on both doors.
    assert_eq!(send(bae.base(), "GET", "/healthz", None, None).status, 200);
    assert_eq!(bae.admin_send("GET", "/admin/v1/profiles", None).status, 200);
}

#[test]
fn wrong_types_in_every_methods_params_are_invalid_params() {
    let bae = Bae::start();
    let (_, key) = bae.key_for("types", &["lookup"]);
    let mut harness = Harness::open(bae.base(), &key, &["lookup"]);
    let cases = [
        ("session.registerDriver", json!("not an object")),
        ("session.sendMessage", json!({})),
        ("session.sendMessage", json!({ "message": 5 })),
        ("session.sendMessage", json!({ "message": { "content": 5 } })),
        ("session.sendMessage", json!({ "message": { "content": [{ "type": "tool_result" }] } })),
        ("session.sendMessage", json!({ "message": { "role": "user", "content": [42] } })),
        ("session.compact", json!({ "prompt": 5 })),
        ("session.subscribe", json!({ "since_event_id": { "id": 1 } })),
        ("session.updateClientTools", json!({ "tools": "lookup" })),
        ("session.updateClientTools", json!({ "tools": [{ "name": 7 }] })),
    ];
    for (method, params) in cases {
        let frames = harness.call(method, params.clone());
        let last = frames.last().unwrap();
        assert_eq!(last["error"]["code"], -32602, "{method} {params}: {frames:?}");
        assert_eq!(last["id"], harness.next_id - 1, "{method}: the error answers the request's id");
    }
    // None of it was recorded, and the session still takes a turn.
    bae.fake.script([anthropic::text_answer("Still here.")]);
    let frames = harness.send_message(json!("hello"));
    assert_eq!(frames.last().unwrap()["result"]["message"]["content"][0]["text"], "Still here.", "{frames:?}");
    let sent: Vec<Value> = harness.events().into_iter().filter(|e| e["event_type"] == "client.message.send").collect();
    assert_eq!(sent.len(), 1, "{sent:?}");
}

#[test]
fn keys_and_ids_of_other_sessions_and_of_the_other_door_are_refused() {
    // The Kestrel door with a token, so that what a BAE key may do there is a real question.
    let bae = Bae::start_with(|config| config.auth.token = Some("kestrel-token".into()));
    let (_, key) = bae.key_for("mine", &[]);
    let mine = Harness::open(bae.base(), &key, &[]);
    let theirs = Harness::open(bae.base(), &key, &[]);

    // My session key on their session, on every session route: 401, never their data.
    let register = json!({ "jsonrpc": "2.0", "id": 1, "method": "session.registerDriver", "params": {} });
    let paths = [
        ("GET", format!("/api/v1/sessions/{}/participants", theirs.session_id), None),
        ("GET", format!("/api/v1/sessions/{}/events", theirs.session_id), None),
        ("POST", format!("/api/v1/sessions/{}/rpc", theirs.session_id), Some(register.clone())),
        ("DELETE", format!("/api/v1/sessions/{}", theirs.session_id), None),
    ];
    for (method, path, body) in paths {
        let response = send(bae.base(), method, &path, Some(&mine.session_key), body);
        assert_problem(&response, 401, "unauthorized");
    }
    // Their session is untouched: still open, its one driver still there.
    let participants = theirs.get("/participants");
    assert_eq!(participants.status, 200, "{}", participants.text);

    // The Kestrel door neither lists nor serves BAE sessions, and keys do not cross doors.
    let kestrel = bae.server.client().with_token(Some("kestrel-token"));
    let listed = kestrel.get("/api/sessions");
    assert_eq!(listed.status, 200, "{}", listed.text);
    assert!(!listed.text.contains(&mine.session_id), "{}", listed.text);
    kestrel.get(&format!("/api/sessions/{}", mine.session_id)).assert_error(404, "session_not_found");
    for bae_key in [&key, &mine.session_key, &bae.admin_key] {
        kestrel.with_token(Some(bae_key)).get("/api/sessions").assert_error(401, "unauthorized");
    }
    let opened = send(bae.base(), "POST", "/api/v1/sessions", Some("kestrel-token"), Some(json!({})));
    assert_problem(&opened, 401, "unauthorized");
    // A client key is not an admin key, and the admin key opens no session.
    assert_problem(&send(&bae.admin, "GET", "/admin/v1/profiles", Some(&key), None), 401, "unauthorized");
    let opened = send(bae.base(), "POST", "/api/v1/sessions", Some(&bae.admin_key), Some(json!({})));
    assert_problem(&opened, 401, "unauthorized");
}

/// A server process, killed when dropped so that a failing test leaves none behind.
struct Spawned(Child);

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The binary on `data` with the fake as its provider; the process, its client and admin URLs.
fn spawn_binary(data: &Path, workspace: &Path, fake_url: &str) -> (Spawned, String, String) {
    let config = format!(
        "[providers.fake]\nwire = \"anthropic\"\nbase_url = \"{fake_url}\"\nmodels = [{{ name = \"claude-x\" }}]\n"
    );
    let (child, base, admin) = crate::support::spawn_binary(data, workspace, &config);
    (Spawned(child), base, admin)
}

#[test]
fn a_kill_9_mid_turn_keeps_every_event_already_streamed_and_the_session_goes_on() {
    let fake = crate::fake_provider::FakeProvider::start();
    let (data, workspace) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (child, base, admin) = spawn_binary(data.path(), workspace.path(), &fake.base_url);
    let admin_key = std::fs::read_to_string(data.path().join("admin-key")).unwrap().trim().to_string();
    let profile = json!({ "name": "crash", "primary_provider": "fake", "allowed_tools": [] });
    let profile = send(&admin, "POST", "/admin/v1/profiles", Some(&admin_key), Some(profile));
    let created = json!({ "name": "crash", "profile_id": profile.json["id"] });
    let key = send(&admin, "POST", "/admin/v1/keys", Some(&admin_key), Some(created)).json["key"]
        .as_str()
        .unwrap()
        .to_string();

    let mut driver = Harness::open(&base, &key, &[]);
    let mut observer = Harness::join(&base, &driver.session_id, &key, &[]);
    let watch = observer.start("session.subscribe", json!({}));
    // The provider holds its answer past the kill.
    let mut held = anthropic::text_answer("never heard");
    held.steps = vec![Step::Stall];
    fake.script([held]);
    let _turn = driver.start("session.sendMessage", json!({ "message": { "content": "remember me" } }));
    let mut seen = Vec::new();
    while !seen.iter().any(|f: &Value| f["params"]["event_type"] == "provider.request") {
        seen.push(watch.next(WAIT).expect("the observer sees the turn begin"));
    }
    // The provider has the request (its stalled reply is used up), then kill -9, and wait
    // until the process is gone.
    fake.wait_for_requests(1);
    drop(child);

    let (_child, base, _) = spawn_binary(data.path(), workspace.path(), &fake.base_url);
    driver.base = base.clone();
    // Every event the observer was streamed is in the log, in order, with the same ids.
    let logged = driver.events();
    let ids: Vec<&Value> = logged.iter().map(|e| &e["id"]).collect();
    for frame in seen.iter().filter(|f| f["method"] == "session.event") {
        assert!(ids.contains(&&frame["params"]["id"]), "{frame} was streamed but not kept: {logged:?}");
    }
    // The session is still open; drivers register again, as with BAE, and the turn goes on.
    let unregistered = driver.call("session.sendMessage", json!({ "message": { "content": "again" } }));
    assert_eq!(unregistered.last().unwrap()["error"]["code"], -32001, "{unregistered:?}");
    assert_eq!(driver.call("session.registerDriver", json!({})).last().unwrap()["result"]["registered"], true);
    fake.script([anthropic::text_answer("Back.")]);
    let frames = driver.send_message(json!("again"));
    assert_eq!(frames.last().unwrap()["result"]["message"]["content"][0]["text"], "Back.", "{frames:?}");
    let asked = fake.requests().last().unwrap().body.clone();
    assert!(asked.to_string().contains("remember me"), "the message sent before the kill is in the history: {asked}");
}

#[test]
fn a_turn_paused_at_a_restart_is_paused_again_for_its_owner() {
    let mut bae = Bae::start();
    let profile = bae.profile("main", &["lookup"]);
    let ((_, key), (_, other_key)) = (bae.client_key(&profile), bae.client_key(&profile));
    let mut owner = Harness::open(bae.base(), &key, &["lookup"]);
    let session = owner.session_id.clone();
    bae.fake.script([anthropic::tool_answer("tu_1", "lookup", json!({ "q": "x" }))]);
    let paused = owner.send_message(json!("look it up"));
    assert_eq!(paused.last().unwrap()["result"]["message"]["content"][0]["id"], "tu_1", "{paused:?}");

    bae.restart();
    owner.base = bae.base().to_string();
    let mut other = Harness::join(bae.base(), &session, &other_key, &["lookup"]);
    assert_eq!(owner.call("session.registerDriver", json!({})).last().unwrap()["result"]["registered"], true);
    // Another driver waits for the owner (its deadline starts again at the restart)...
    let queued = other.start("session.sendMessage", json!({ "message": { "content": "me next" } }));
    assert!(queued.silent_for(std::time::Duration::from_millis(300)), "a queued driver hears nothing");
    // ...and the owner's result resumes the turn as if nothing had happened.
    bae.fake.script([anthropic::text_answer("Found it."), anthropic::text_answer("Your turn.")]);
    let results = json!([{ "type": "tool_result", "tool_use_id": "tu_1", "content": "x is 1" }]);
    let resumed = owner.send_message(results);
    assert_eq!(resumed.last().unwrap()["result"]["message"]["content"][0]["text"], "Found it.", "{resumed:?}");
    let asked = &bae.fake.requests()[1].body["messages"];
    assert_eq!(asked[1]["content"][0]["id"], "tu_1");
    assert_eq!(asked[2]["content"][0], json!({ "type": "tool_result", "tool_use_id": "tu_1", "content": "x is 1" }));
    let next = queued.until_terminal();
    assert_eq!(next.last().unwrap()["result"]["message"]["content"][0]["text"], "Your turn.", "{next:?}");
}

#[test]
fn a_bae_config_files_keys_come_from_the_environment_and_never_reach_an_event() {
    let fake = crate::fake_provider::FakeProvider::start();
    let (data, workspace) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let bae_config = data.path().join("bae-config.toml");
    let base_url = fake.base_url.trim_end_matches("/v1");
    std::fs::write(
        &bae_config,
        format!(
            "[[providers.entries]]\nname = \"unset\"\nprovider = \"anthropic\"\nmodel = \"claude-x\"\n\
             auth_token = \"${{KESTREL_TEST_UNSET_KEY}}\"\nbase_url = \"{base_url}\"\n\n\
             [[providers.entries]]\nname = \"gw\"\nprovider = \"anthropic\"\nmodel = \"claude-x\"\n\
             auth_token = \"${{KESTREL_TEST_GW_KEY}}\"\nbase_url = \"{base_url}\"\n"
        ),
    )
    .unwrap();
    let bae_config = bae_config.to_str().unwrap();
    let env =
        [("BAE_CONFIG", bae_config), ("KESTREL_TEST_GW_KEY", "sk-gw-secret-0123"), ("KESTREL_TEST_UNSET_KEY", "-")];
    let (child, base, admin) = crate::support::spawn_binary_with(data.path(), workspace.path(), "", &env);
    let _child = Spawned(child);
    let admin_key = std::fs::read_to_string(data.path().join("admin-key")).unwrap().trim().to_string();
    let profile =
        json!({ "name": "p", "primary_provider": "unset", "fallback_providers": ["gw"], "allowed_tools": [] });
    let profile = send(&admin, "POST", "/admin/v1/profiles", Some(&admin_key), Some(profile));
    let key = json!({ "name": "k", "profile_id": profile.json["id"] });
    let key =
        send(&admin, "POST", "/admin/v1/keys", Some(&admin_key), Some(key)).json["key"].as_str().unwrap().to_string();

    let mut harness = Harness::open(&base, &key, &[]);
    fake.script([anthropic::text_answer("Through the gateway.")]);
    let frames = harness.send_message(json!("hello"));
    assert_eq!(frames.last().unwrap()["result"]["message"]["content"][0]["text"], "Through the gateway.", "{frames:?}");
    // The primary's key is missing: that attempt fails naming the variable; the fallback's key
    // is read from the environment at the call and sent as the vendor's header.
    let requests = fake.requests();
    assert_eq!(requests.len(), 1, "the primary never reached the provider");
    assert_eq!(requests[0].header("x-api-key"), Some("sk-gw-secret-0123"));
    let events = harness.events();
    let failed = events.iter().find(|e| e["event_type"] == "provider.response").unwrap();
    assert_eq!(failed["payload"]["ok"], false, "{failed}");
    assert!(failed["payload"]["error"].as_str().unwrap().contains("KESTREL_TEST_UNSET_KEY"), "{failed}");
    let everything =
        serde_json::to_string(&events).unwrap() + &send(&admin, "GET", "/admin/v1/config", Some(&admin_key), None).text;
    assert!(!everything.contains("sk-gw-secret"), "the key reached an event or the config view");
}

/// A JSON-RPC id comes back exactly as written: integers past 2^53 and past 2^64 are never
/// re-read as floats.
#[test]
fn a_json_rpc_id_comes_back_exactly_as_written() {
    let bae = Bae::start();
    let (_, key) = bae.key_for("ids", &[]);
    let harness = Harness::open(bae.base(), &key, &[]);
    let url = format!("{}/api/v1/sessions/{}/rpc", bae.base(), harness.session_id);
    for id in ["9007199254740993", "18446744073709551616", "-99999999999999999999999"] {
        let body = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"session.registerDriver","params":{{}}}}"#);
        let answer = ureq::post(&url)
            .set("Authorization", &format!("Bearer {}", harness.session_key))
            .set("Content-Type", "application/json")
            .send_string(&body)
            .unwrap()
            .into_string()
            .unwrap();
        assert!(answer.contains(&format!("\"id\":{id},")), "{id}: {answer}");
    }
}
