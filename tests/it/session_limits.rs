//! How many sessions a tenant may have and how often a schedule may fire (issue 35, findings
//! 10 and 17): `agent.max_sessions_per_tenant` at create, fork and a schedule's fire, exact
//! under concurrent creates; `schedules.min_interval_secs` at a schedule's create and at each
//! fire; fires at the whole second. Schedules fire by a clock the test moves.

use std::time::Duration;

use kestrel::clock::{ManualClock, SharedClock};
use serde_json::{json, Value};

use crate::schedules::{at, next_fire};
use crate::support::TestServer;

fn schedule_of(server: &TestServer, id: &str) -> Value {
    let shown = server.get(&format!("/api/schedules/{id}"));
    assert_eq!(shown.status, 200, "{}", shown.text);
    shown.json
}

#[test]
fn a_tenant_past_its_sessions_gets_429_at_create_fork_and_a_schedule_s_fire() {
    let clock = ManualClock::at(at("2026-03-02T12:00:00Z"));
    let shared = SharedClock(clock.clone());
    let server = TestServer::start_with(|config| {
        config.clock = shared;
        config.agent.max_sessions_per_tenant = 3;
    });
    let first = server.create_session(json!({}));
    let schedule = server
        .post("/api/schedules", json!({ "cron": "0 * * * *", "session": { "title": "hourly" }, "message": "report" }));
    assert_eq!(schedule.status, 201, "{}", schedule.text);
    let schedule_id = schedule.json["schedule"]["id"].as_str().unwrap().to_string();
    server.create_session(json!({}));
    server.create_session(json!({}));

    let refused = server.post("/api/sessions", json!({}));
    refused.assert_error(429, "session_limit");
    assert!(refused.json["error"]["message"].as_str().unwrap().contains('3'), "{}", refused.text);
    server.post(&format!("/api/sessions/{first}/fork"), json!({})).assert_error(429, "session_limit");
    let mut stream = server.events("/api/events");
    clock.advance(Duration::from_secs(3600));
    let skipped = next_fire(&mut stream, &schedule_id);
    assert_eq!(
        (&skipped["type"], &skipped["reason"]),
        (&json!("schedule.skipped"), &json!("session_limit")),
        "{skipped}"
    );
    assert_eq!(server.get("/api/sessions").json["sessions"].as_array().unwrap().len(), 3);

    // A deleted session makes room again.
    assert_eq!(server.delete(&format!("/api/sessions/{first}")).status, 204);
    let ran = server.post(&format!("/api/schedules/{schedule_id}/run"), json!({}));
    assert_eq!(ran.json["fire"]["outcome"], "fired", "{}", ran.text);
    server.post("/api/sessions", json!({})).assert_error(429, "session_limit");
}

#[test]
fn creates_at_once_never_pass_the_tenant_s_sessions() {
    let server = TestServer::start_with(|config| config.agent.max_sessions_per_tenant = 5);
    let client = server.client();
    let statuses = crate::budget_races::at_once(40, |_| client.post("/api/sessions", json!({})).status);
    assert_eq!(statuses.iter().filter(|s| **s == 201).count(), 5, "{statuses:?}");
    assert!(statuses.iter().all(|s| *s == 201 || *s == 429), "{statuses:?}");
    assert_eq!(server.get("/api/sessions").json["sessions"].as_array().unwrap().len(), 5);
}

#[test]
fn a_schedule_firing_more_often_than_the_minimum_is_refused_and_a_fire_too_soon_is_skipped() {
    let clock = ManualClock::at(at("2026-03-02T12:00:30Z"));
    let shared = SharedClock(clock.clone());
    let mut server = TestServer::start_with(|config| config.clock = shared.clone());
    let session = server.create_session(json!({}));
    // Every second, every ten seconds, twice a minute: more often than the 60 s default.
    for cron in ["* * * * * *", "*/10 * * * * *", "0,30 * * * * *"] {
        let refused = server.post("/api/schedules", json!({ "cron": cron, "sessionId": session, "message": "m" }));
        refused.assert_error(400, "invalid_schedule");
        assert!(refused.json["error"]["message"].as_str().unwrap().contains("60"), "{}", refused.text);
    }
    let minutely = json!({ "cron": "0 * * * * *", "session": {}, "message": "m" });
    assert_eq!(server.post("/api/schedules", minutely).status, 201);

    // A schedule made under a smaller minimum fires no more often than the minimum of the
    // server it runs on: one fire, then one skip, then nothing until a minute has passed.
    server.stop();
    server.restart(|config| {
        config.clock = shared.clone();
        config.schedules.min_interval_secs = 1;
    });
    let flood = server.post("/api/schedules", json!({ "cron": "* * * * * *", "session": {}, "message": "m" }));
    assert_eq!(flood.status, 201, "{}", flood.text);
    let flood_id = flood.json["schedule"]["id"].as_str().unwrap().to_string();
    server.stop();
    server.restart(|config| config.clock = shared.clone());
    let sessions_before = server.get("/api/sessions").json["sessions"].as_array().unwrap().len();
    let mut stream = server.events("/api/events");
    clock.advance(Duration::from_secs(1));
    assert_eq!(next_fire(&mut stream, &flood_id)["type"], "schedule.fired");
    clock.advance(Duration::from_secs(1));
    let skipped = next_fire(&mut stream, &flood_id);
    assert_eq!(
        (&skipped["type"], &skipped["reason"]),
        (&json!("schedule.skipped"), &json!("min_interval")),
        "{skipped}"
    );
    let shown = schedule_of(&server, &flood_id);
    assert_eq!(shown["schedule"]["nextFireAt"], "2026-03-02T12:01:31.000Z", "{shown}");
    for _ in 0..30 {
        clock.advance(Duration::from_secs(1));
    }
    clock.advance(Duration::from_secs(29));
    assert_eq!(next_fire(&mut stream, &flood_id)["type"], "schedule.fired");
    let fires = schedule_of(&server, &flood_id)["fires"].as_array().unwrap().clone();
    let outcomes: Vec<&str> = fires.iter().map(|f| f["outcome"].as_str().unwrap()).collect();
    assert_eq!(outcomes, ["fired", "skipped", "fired"], "newest first: {fires:#?}");
    let sessions_after = server.get("/api/sessions").json["sessions"].as_array().unwrap().len();
    // The minutely schedule fired once meanwhile (at 12:01:00), the flood twice.
    assert_eq!(sessions_after, sessions_before + 3);
}

#[test]
fn a_schedule_fires_at_the_whole_second_whatever_the_milliseconds_of_its_creation() {
    let clock = ManualClock::at(at("2026-03-02T12:00:00.640Z"));
    let shared = SharedClock(clock.clone());
    let server = TestServer::start_with(|config| config.clock = shared);
    let session = server.create_session(json!({}));
    let created = server.post("/api/schedules", json!({ "cron": "* * * * *", "sessionId": session, "message": "m" }));
    assert_eq!(created.status, 201, "{}", created.text);
    let id = created.json["schedule"]["id"].as_str().unwrap().to_string();
    assert_eq!(created.json["schedule"]["nextFireAt"], "2026-03-02T12:01:00.000Z");
    let mut stream = server.events("/api/events");
    // To 12:01:00.000 exactly: the fire is due now, not 640 ms later.
    clock.advance(Duration::from_millis(59_360));
    let fired = next_fire(&mut stream, &id);
    assert_eq!((&fired["type"], &fired["dueAt"]), (&json!("schedule.fired"), &json!("2026-03-02T12:01:00.000Z")));
    let shown = schedule_of(&server, &id);
    assert_eq!(shown["schedule"]["nextFireAt"], "2026-03-02T12:02:00.000Z");
    assert_eq!(shown["schedule"]["lastFiredAt"], "2026-03-02T12:01:00.000Z");
}
