//! Opening, joining and closing sessions, keys bound to their session, and the history.

use serde_json::{json, Value};

use super::support::{assert_problem, send, types, Bae, Harness};
use crate::fake_provider::anthropic;

#[test]
fn a_session_records_exactly_what_happened_and_replays_it() {
    let bae = Bae::start();
    let (key_id, key) = bae.key_for("main", &["get_current_time"]);
    let opened = send(bae.base(), "POST", "/api/v1/sessions", Some(&key), Some(json!({ "client_version": "1.0.0" })));
    assert_eq!(opened.status, 201, "{}", opened.text);
    let session = opened.json["session_id"].as_str().unwrap();
    let session_key = opened.json["session_key"].as_str().unwrap();
    assert!(session.starts_with("ses_") && session.len() == 36);
    assert!(session_key.starts_with("bae_ses_") && session_key.len() == 8 + 48);
    assert_eq!(
        opened.json["profile"],
        json!({ "id": opened.json["profile"]["id"], "name": "main", "allowed_tools": ["get_current_time"], "mcp_servers": [],
                "provider": { "provider": "anthropic", "model": "claude-x" } })
    );
    assert!(!opened.text.contains("auth_token"));
    let mut harness =
        Harness { base: bae.base().into(), session_id: session.into(), session_key: session_key.into(), next_id: 1 };
    let registered = harness.call("session.registerDriver", json!({}));
    assert_eq!(registered, vec![json!({ "jsonrpc": "2.0", "id": 1, "result": { "registered": true } })]);
    harness.call("session.registerDriver", json!({}));
    bae.fake.script([anthropic::text_answer("It is noon.")]);
    let frames = harness.send_message(json!("What time is it?"));
    let terminal = frames.last().unwrap();
    assert_eq!(
        terminal["result"]["message"],
        json!({ "role": "assistant", "content": [{ "type": "text", "text": "It is noon." }] })
    );
    let closed = send(bae.base(), "DELETE", &format!("/api/v1/sessions/{session}"), Some(session_key), None);
    assert_eq!(closed.status, 200);

    let events = harness.events();
    assert_eq!(
        types(&events),
        [
            "session.open",
            "session.driver.register",
            "client.message.send",
            "provider.request",
            "provider.response",
            "server.message.send",
            "session.close"
        ]
    );
    assert_eq!(
        events[0]["payload"],
        json!({ "client_version": "1.0.0", "tools": [], "sandbox_tools": [], "subagent_tools": [] })
    );
    assert_eq!(events[2]["payload"], json!({ "role": "user", "content": "What time is it?" }));
    assert_eq!(events[6]["payload"], json!({ "reason": "client_close" }));
    for event in &events {
        assert_eq!(event["session_id"], session);
        assert_eq!(event["client_key_id"], key_id.as_str());
        let id = event["id"].as_str().unwrap();
        assert!(id.starts_with("evt_") && id.len() == 36);
        let at = event["created_at"].as_str().unwrap();
        assert!(at.len() == 24 && at.ends_with('Z'), "{at}");
    }
    // The turn's result carried the same events, in order, as the history.
    let result_ids: Vec<&Value> = terminal["result"]["events"].as_array().unwrap().iter().map(|e| &e["id"]).collect();
    let history_ids: Vec<&Value> = events[2..6].iter().map(|e| &e["id"]).collect();
    assert_eq!(result_ids, history_ids);
    // A closed session's history stays readable; closing again is a conflict.
    assert_eq!(harness.get("/events").status, 200);
    let again = send(bae.base(), "DELETE", &format!("/api/v1/sessions/{session}"), Some(session_key), None);
    assert_problem(&again, 409, "session_closed");
    assert_eq!(again.json["detail"], "session is already closed");
}

#[test]
fn every_kind_of_bad_key_is_a_401_with_bae_wording() {
    let bae = Bae::start();
    let (_, key) = bae.key_for("main", &[]);
    let one = Harness::open(bae.base(), &key, &[]);
    let other = Harness::open(bae.base(), &key, &[]);
    let path = "/api/v1/sessions";
    let cases: [(Option<&str>, &str); 3] = [
        (None, "missing Authorization header"),
        (Some("Basic abc"), "Authorization header must be a Bearer token"),
        (Some("Bearer bae_0000"), "invalid client key"),
    ];
    for (header, detail) in cases {
        let mut request = ureq::post(&format!("{}{path}", bae.base())).set("Content-Type", "application/json");
        if let Some(header) = header {
            request = request.set("Authorization", header);
        }
        let response = match request.send_string("{") {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("{e}"),
        };
        let status = response.status();
        let body: Value = serde_json::from_str(&response.into_string().unwrap()).unwrap();
        assert_eq!((status, body["type"].as_str(), body["detail"].as_str()), (401, Some("unauthorized"), Some(detail)));
    }
    // `Bearer ` with no token: HTTP trims a header value's trailing blanks, so it arrives as
    // `Bearer`, which is not a bearer header at all (BAE's server answers the same).
    let raw = crate::support::raw(
        bae.base(),
        b"POST /api/v1/sessions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer \r\nContent-Type: application/json\r\n\
          Content-Length: 2\r\nConnection: close\r\n\r\n{}",
    );
    assert_eq!((raw.status, raw.json["type"].as_str()), (401, Some("unauthorized")), "{raw:?}");
    // A session key opens nothing, and works only for its own session.
    assert_problem(&send(bae.base(), "POST", path, Some(&one.session_key), Some(json!({}))), 401, "unauthorized");
    let foreign =
        send(bae.base(), "GET", &format!("/api/v1/sessions/{}/events", other.session_id), Some(&one.session_key), None);
    assert_problem(&foreign, 401, "unauthorized");
    assert_eq!(foreign.json["detail"], "invalid session key");
    let missing = send(bae.base(), "GET", "/api/v1/sessions/ses_nope/participants", Some(&one.session_key), None);
    assert_problem(&missing, 401, "unauthorized");
    let rpc = send(
        bae.base(),
        "POST",
        &format!("/api/v1/sessions/{}/rpc", other.session_id),
        Some(&one.session_key),
        Some(json!({})),
    );
    assert_problem(&rpc, 401, "unauthorized");
    // A client key is not a session key either.
    assert_problem(
        &send(bae.base(), "GET", &format!("/api/v1/sessions/{}/events", one.session_id), Some(&key), None),
        401,
        "unauthorized",
    );
}

#[test]
fn open_refuses_bad_bodies_tools_and_profiles_in_order() {
    let bae = Bae::start();
    let profile = bae.profile("main", &["allowed"]);
    let (_, key) = bae.client_key(&profile);
    let open = |body: Value| send(bae.base(), "POST", "/api/v1/sessions", Some(&key), Some(body));
    let not_allowed = open(json!({ "tools": [{ "name": "allowed" }, { "name": "forbidden" }] }));
    assert_problem(&not_allowed, 403, "tool_not_allowed");
    let bad_mode = open(json!({ "compaction": { "mode": "sometimes" } }));
    assert_problem(&bad_mode, 400, "bad_request");
    assert!(bad_mode.json["detail"].as_str().unwrap().starts_with("invalid compaction config: "));
    let no_size = open(json!({ "compaction": { "mode": "auto" } }));
    assert_eq!(no_size.json["detail"], "invalid compaction config: missing field `size`");
    assert_problem(&open(json!({ "compaction": { "mode": "auto", "size": 999 } })), 400, "bad_request");
    let bad_field = open(json!({ "tools": "nope" }));
    assert!(bad_field.json["detail"].as_str().unwrap().starts_with("invalid request body: "), "{}", bad_field.text);
    assert_problem(&open(json!({ "tools": [{ "name": "remote_subagent_status" }] })), 422, "reserved_tool_name");
    let harness = |fields: Value| {
        let mut entry = json!({ "harness": "x", "command_template": "run {model}" });
        entry.as_object_mut().unwrap().extend(fields.as_object().unwrap().clone());
        entry
    };
    let declared = |name: &str, image: &str, subagents: Value| json!({ "subagent_tools": [{ "name": name, "image": image, "subagents": subagents }] });
    for bad in [
        declared(" ", "img", json!([harness(json!({}))])),
        declared("launch", " ", json!([harness(json!({}))])),
        declared("launch", "img", json!([])),
        declared("launch", "img", json!([harness(json!({ "harness": " " }))])),
        declared("launch", "img", json!([harness(json!({})), harness(json!({}))])),
        declared("launch", "img", json!([harness(json!({ "command_template": "x {oops}" }))])),
        declared("launch", "img", json!([harness(json!({ "command_template": "x } y" }))])),
        declared("launch", "img", json!([harness(json!({ "prompt_via": "arg" }))])),
        declared(
            "launch",
            "img",
            json!([harness(json!({ "prompt_via": "arg", "command_template": "{prompt} {prompt}" }))]),
        ),
        declared("launch", "img", json!([harness(json!({ "command_template": "x {prompt}" }))])),
        declared("launch", "img", json!([harness(json!({ "prompt_via": "file" }))])),
        declared("launch", "img", json!([harness(json!({ "timeout_secs": 0 }))])),
        // A placeholder a shell would read again: inside quotes, where `$(…)` in a value runs.
        declared("launch", "img", json!([harness(json!({ "command_template": "echo \"M={model}\"" }))])),
        declared("launch", "img", json!([harness(json!({ "command_template": "echo 'M={model}'" }))])),
    ] {
        assert_problem(&open(bad.clone()), 422, "invalid_subagent_tools");
    }
    let reserved = declared("remote_subagent_status", "img", json!([harness(json!({}))]));
    assert_problem(&open(reserved), 422, "reserved_tool_name");
    let good = declared(
        "launch",
        "img",
        json!([harness(json!({ "prompt_via": "arg", "command_template": "c {model} {prompt}" }))]),
    );
    assert_eq!(open(good).status, 201, "subagent tools are not allowlisted");
    assert_eq!(open(json!({ "compaction": { "mode": "auto", "size": 1000 } })).status, 201);
    assert_eq!(open(json!({ "compaction": { "mode": "client", "prompt": "focus" } })).status, 201);
    let before = bae.admin_send("GET", "/admin/v1/sessions", None).json["items"].as_array().unwrap().len();

    // A primary provider that is not configured: 422, and an audit row in error.
    bae.admin_send(
        "PUT",
        &format!("/admin/v1/profiles/{profile}"),
        Some(json!({ "name": "main", "primary_provider": "ghost" })),
    );
    let unavailable = open(json!({}));
    assert_problem(&unavailable, 422, "primary_provider_unavailable");
    let errors = bae.admin_send("GET", "/admin/v1/sessions?state=error", None).json;
    let audit = &errors["items"][0];
    let audit_events =
        bae.admin_send("GET", &format!("/admin/v1/sessions/{}/events", audit["id"].as_str().unwrap()), None).json;
    assert_eq!(
        audit_events["items"][0]["payload"],
        json!({ "reason": "primary_provider_unavailable", "profile_id": profile, "primary_provider": "ghost" })
    );
    assert_eq!(bae.admin_send("GET", "/admin/v1/sessions", None).json["items"].as_array().unwrap().len(), before + 1);
}

#[test]
fn join_checks_in_order_and_mints_a_key_per_joiner() {
    let bae = Bae::start();
    let profile = bae.profile("main", &["a", "b"]);
    let (_, first) = bae.client_key(&profile);
    let (second_id, second) = bae.client_key(&profile);
    let (_, stranger) = bae.key_for("other", &[]);
    let owner = Harness::open(bae.base(), &first, &["a"]);
    let join = |key: &str, session: &str, body: Value| {
        send(bae.base(), "POST", &format!("/api/v1/sessions/{session}/join"), Some(key), Some(body))
    };
    assert_problem(&join("bae_nope", &owner.session_id, json!({})), 401, "unauthorized");
    let with_compaction = join(&second, "ses_missing", json!({ "compaction": null }));
    assert_problem(&with_compaction, 400, "bad_request");
    assert_eq!(
        with_compaction.json["detail"],
        "compaction is a session-level setting fixed at creation and cannot be set on join"
    );
    assert_problem(&join(&second, "ses_missing", json!({})), 404, "not_found");
    assert_problem(&join(&stranger, &owner.session_id, json!({})), 403, "profile_mismatch");
    assert_problem(&join(&second, &owner.session_id, json!({ "tools": [{ "name": "zzz" }] })), 403, "tool_not_allowed");

    let joined = join(&second, &owner.session_id, json!({ "tools": [{ "name": "b" }] }));
    assert_eq!(joined.status, 201, "{}", joined.text);
    assert_ne!(joined.json["session_key"], json!(owner.session_key));
    let again = join(&second, &owner.session_id, json!({}));
    assert_ne!(again.json["session_key"], joined.json["session_key"]);
    let events = owner.events();
    assert_eq!(types(&events), ["session.open", "session.driver.register", "session.join", "session.join"]);
    assert_eq!(events[2]["client_key_id"], second_id.as_str());
    assert_eq!(events[2]["payload"]["tools"], json!(["b"]));

    send(bae.base(), "DELETE", &format!("/api/v1/sessions/{}", owner.session_id), Some(&owner.session_key), None);
    let late = join(&second, &owner.session_id, json!({}));
    assert_problem(&late, 409, "session_closed");
    assert_eq!(late.json["detail"], "session is already closed");
}

#[test]
fn revoking_a_key_closes_the_sessions_it_alone_held() {
    let bae = Bae::start();
    let profile = bae.profile("main", &[]);
    let (first_id, first) = bae.client_key(&profile);
    let (second_id, second) = bae.client_key(&profile);
    let alone = Harness::open(bae.base(), &first, &[]);
    let shared = Harness::open(bae.base(), &first, &[]);
    let joiner = Harness::join(bae.base(), &shared.session_id, &second, &[]);

    assert_eq!(bae.admin_send("DELETE", &format!("/admin/v1/keys/{second_id}"), None).status, 204);
    assert_eq!(joiner.get("/events").status, 401, "a revoked key's session key still works");
    let states = |id: &str| {
        let sessions = bae.admin_send("GET", "/admin/v1/sessions", None).json;
        sessions["items"].as_array().unwrap().iter().find(|s| s["id"] == id).unwrap()["state"].clone()
    };
    assert_eq!(states(&shared.session_id), "open", "the creator still holds the shared session");

    assert_eq!(bae.admin_send("DELETE", &format!("/admin/v1/keys/{first_id}"), None).status, 204);
    assert_eq!(states(&alone.session_id), "closed");
    assert_eq!(states(&shared.session_id), "closed");
    let events = bae.admin_send("GET", &format!("/admin/v1/sessions/{}/events", alone.session_id), None).json;
    let last = events["items"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (last["event_type"].as_str(), last["payload"].clone()),
        (Some("session.close"), json!({ "reason": "client_key_revoked" }))
    );
    assert_eq!(last["client_key_id"], first_id.as_str());
    assert_problem(&send(bae.base(), "POST", "/api/v1/sessions", Some(&first), Some(json!({}))), 401, "unauthorized");
}

#[test]
fn participants_are_the_registered_drivers() {
    let bae = Bae::start();
    let profile = bae.profile("main", &[]);
    let (first_id, first) = bae.client_key(&profile);
    let (second_id, second) = bae.client_key(&profile);
    let owner = Harness::open(bae.base(), &first, &[]);
    let session = owner.session_id.clone();
    let joined = send(bae.base(), "POST", &format!("/api/v1/sessions/{session}/join"), Some(&second), Some(json!({})));
    let observer_key = joined.json["session_key"].as_str().unwrap().to_string();
    let drivers = owner.get("/participants").json;
    assert_eq!(drivers, json!({ "drivers": [first_id] }));
    Harness::join(bae.base(), &session, &second, &[]);
    let mut expected = vec![first_id, second_id];
    expected.sort();
    assert_eq!(owner.get("/participants").json, json!({ "drivers": expected }));
    let seen = send(bae.base(), "GET", &format!("/api/v1/sessions/{session}/participants"), Some(&observer_key), None);
    assert_eq!(seen.json["drivers"].as_array().unwrap().len(), 2);
}
