//! Scheduled runs over HTTP, fired by a clock the test moves (never a sleep): a fire into a
//! session, a skip while it is busy, a new session per fire, run now, pause and resume,
//! deletion, the refusals, and missed fires after a restart following `catchUp`.

use std::sync::Arc;
use std::time::Duration;

use kestrel::clock::{ManualClock, SharedClock};
use kestrel::engine::tools::Permission;
use serde_json::{json, Value};

use crate::support::{event_type, TestServer};

pub(crate) fn at(text: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(text).unwrap().timestamp_millis()
}

fn server(clock: &Arc<ManualClock>) -> TestServer {
    let clock = SharedClock(clock.clone());
    TestServer::start_with(|config| {
        config.clock = clock;
        config.agent.permissions.insert("run_command".into(), Permission::Ask);
        // One test fires every ten seconds.
        config.schedules.min_interval_secs = 10;
    })
}

fn create(server: &TestServer, body: Value) -> Value {
    let created = server.post("/api/schedules", body);
    assert_eq!(created.status, 201, "{}", created.text);
    created.json["schedule"].clone()
}

/// The next schedule event of `schedule` on `stream`.
pub(crate) fn next_fire(stream: &mut crate::support::SseClient, schedule: &str) -> Value {
    let events = stream.collect_until(|e| {
        matches!(event_type(e), "schedule.fired" | "schedule.skipped") && e["event"]["scheduleId"] == schedule
    });
    events.last().unwrap()["event"].clone()
}

#[test]
fn a_schedule_fires_into_its_session_by_the_clock_and_skips_while_the_session_is_busy() {
    let clock = ManualClock::at(at("2026-03-02T07:59:30Z"));
    let server = server(&clock);
    let id = server.create_session(json!({ "title": "mornings" }));
    let body = json!({ "cron": "0 9 * * *", "timezone": "Europe/Oslo", "sessionId": id, "message": "good morning" });
    let schedule = create(&server, body);
    let schedule_id = schedule["id"].as_str().unwrap().to_string();
    // Nine in Oslo in winter is eight UTC.
    assert_eq!(schedule["nextFireAt"], "2026-03-02T08:00:00.000Z");
    assert_eq!((&schedule["paused"], &schedule["catchUp"]), (&json!(false), &json!("none")));
    let mut stream = server.events("/api/events");

    clock.advance(Duration::from_secs(30));
    let fired = next_fire(&mut stream, &schedule_id);
    assert_eq!(fired["type"], "schedule.fired", "{fired}");
    assert_eq!((&fired["sessionId"], &fired["dueAt"]), (&json!(id), &json!("2026-03-02T08:00:00.000Z")));
    let run_id = fired["runId"].clone();
    stream.collect_until(|e| event_type(e) == "run.finished" && e["event"]["runId"] == run_id);
    let messages = server.get(&format!("/api/sessions/{id}")).json["session"]["messages"].clone();
    assert_eq!(messages[0]["content"], "good morning");
    let shown = server.get(&format!("/api/schedules/{schedule_id}")).json;
    assert_eq!(shown["schedule"]["nextFireAt"], "2026-03-03T08:00:00.000Z");
    assert_eq!(shown["schedule"]["lastFiredAt"], "2026-03-02T08:00:00.000Z");
    assert_eq!((&shown["fires"][0]["outcome"], &shown["fires"][0]["runId"]), (&json!("fired"), &run_id));

    // A run waiting for an approval keeps the session busy: the next fire is skipped.
    let asking = server.post(
        &format!("/api/sessions/{id}/messages"),
        json!({ "content": "/tool run_command {\"command\":\"true\"}" }),
    );
    assert_eq!(asking.status, 202, "{}", asking.text);
    let approval = stream.collect_until(|e| event_type(e) == "approval.requested").pop().unwrap();
    clock.advance(Duration::from_secs(86_400));
    let skipped = next_fire(&mut stream, &schedule_id);
    assert_eq!(
        (&skipped["type"], &skipped["reason"]),
        (&json!("schedule.skipped"), &json!("session_busy")),
        "{skipped}"
    );
    let fires = server.get(&format!("/api/schedules/{schedule_id}")).json["fires"].clone();
    assert_eq!((&fires[0]["outcome"], &fires[0]["reason"]), (&json!("skipped"), &json!("session_busy")));
    let approval_id = approval["event"]["approval"]["id"].as_str().unwrap();
    let denied = server.post(&format!("/api/sessions/{id}/approvals/{approval_id}"), json!({ "approved": false }));
    assert_eq!(denied.status, 200, "{}", denied.text);
}

#[test]
fn new_sessions_run_now_pause_resume_delete_and_the_refusals() {
    let clock = ManualClock::at(at("2026-03-02T12:00:00Z"));
    let server = server(&clock);
    let spec = json!({ "title": "Nightly" });
    let schedule =
        create(&server, json!({ "cron": "*/10 * * * * *", "session": spec, "message": { "content": "report" } }));
    let id = schedule["id"].as_str().unwrap().to_string();
    assert_eq!(schedule["nextFireAt"], "2026-03-02T12:00:10.000Z", "six fields: seconds first");

    let ran = server.post(&format!("/api/schedules/{id}/run"), json!({}));
    assert_eq!(ran.status, 200, "{}", ran.text);
    let session_id = ran.json["fire"]["sessionId"].as_str().unwrap().to_string();
    assert_eq!(ran.json["fire"]["outcome"], "fired");
    assert_eq!(server.get(&format!("/api/sessions/{session_id}")).json["session"]["title"], "Nightly");

    let paused = server.post(&format!("/api/schedules/{id}/pause"), json!({}));
    assert_eq!(
        (&paused.json["schedule"]["paused"], &paused.json["schedule"]["nextFireAt"]),
        (&json!(true), &Value::Null)
    );
    let mut stream = server.events("/api/events");
    clock.advance(Duration::from_secs(60));
    let resumed = server.post(&format!("/api/schedules/{id}/resume"), json!({}));
    assert_eq!(resumed.json["schedule"]["nextFireAt"], "2026-03-02T12:01:10.000Z", "{}", resumed.text);
    clock.advance(Duration::from_secs(10));
    let fired = next_fire(&mut stream, &id);
    assert_eq!((&fired["type"], &fired["dueAt"]), (&json!("schedule.fired"), &json!("2026-03-02T12:01:10.000Z")));
    let fires = server.get(&format!("/api/schedules/{id}")).json["fires"].as_array().unwrap().len();
    assert_eq!(fires, 2, "run now and one timed fire; none while paused");

    // Refusals.
    let bad = |body: Value, status: u16, code: &str| server.post("/api/schedules", body).assert_error(status, code);
    bad(json!({ "cron": "0 9 * *", "sessionId": session_id, "message": "x" }), 400, "invalid_schedule");
    bad(
        json!({ "cron": "0 9 * * *", "timezone": "Mars/Olympus", "sessionId": session_id, "message": "x" }),
        400,
        "invalid_schedule",
    );
    bad(json!({ "cron": "0 0 31 2 *", "sessionId": session_id, "message": "x" }), 400, "invalid_schedule");
    bad(
        json!({ "cron": "0 9 * * *", "sessionId": session_id, "session": {}, "message": "x" }),
        400,
        "invalid_schedule",
    );
    bad(json!({ "cron": "0 9 * * *", "sessionId": session_id, "message": " " }), 400, "invalid_schedule");
    bad(
        json!({ "cron": "0 9 * * *", "sessionId": session_id, "message": "x", "catchUp": "all" }),
        400,
        "invalid_schedule",
    );
    bad(json!({ "cron": "0 9 * * *", "session": { "model": "nope/none" }, "message": "x" }), 400, "invalid_model");
    bad(json!({ "cron": "0 9 * * *", "sessionId": "ses_nope", "message": "x" }), 404, "session_not_found");
    server.get("/api/schedules/sch_nope").assert_error(404, "schedule_not_found");

    let deleted = server.delete(&format!("/api/schedules/{id}"));
    assert_eq!(deleted.status, 200, "{}", deleted.text);
    server.get(&format!("/api/schedules/{id}")).assert_error(404, "schedule_not_found");
    server.post(&format!("/api/schedules/{id}/run"), json!({})).assert_error(404, "schedule_not_found");
    assert_eq!(server.get("/api/schedules").json["schedules"], json!([]));
}

#[test]
fn fires_missed_while_the_server_was_down_follow_catch_up() {
    let clock = ManualClock::at(at("2026-03-02T10:30:00Z"));
    let mut server = server(&clock);
    let quiet = server.create_session(json!({}));
    let eager = server.create_session(json!({}));
    let hourly = |session: &str, catch_up: &str| json!({ "cron": "0 * * * *", "sessionId": session, "message": "hourly", "catchUp": catch_up });
    let none = create(&server, hourly(&quiet, "none"))["id"].as_str().unwrap().to_string();
    let latest = create(&server, hourly(&eager, "latest"))["id"].as_str().unwrap().to_string();

    server.stop();
    clock.advance(Duration::from_secs(3 * 3600));
    let shared = SharedClock(clock.clone());
    server.restart(|config| config.clock = shared);
    // The start's fires are logged: a stream from the beginning replays them.
    let mut stream = crate::support::SseClient::open(&server.base, "/api/events", None, Some(0));
    let skipped = next_fire(&mut stream, &none);
    assert_eq!((&skipped["type"], &skipped["reason"]), (&json!("schedule.skipped"), &json!("missed")), "{skipped}");
    assert_eq!(skipped["dueAt"], "2026-03-02T11:00:00.000Z", "the first fire it missed");
    let mut stream = crate::support::SseClient::open(&server.base, "/api/events", None, Some(0));
    let fired = next_fire(&mut stream, &latest);
    assert_eq!(fired["type"], "schedule.fired", "{fired}");
    assert_eq!(fired["dueAt"], "2026-03-02T13:00:00.000Z", "the latest fire it missed, once");
    for id in [&none, &latest] {
        let shown = server.get(&format!("/api/schedules/{id}")).json;
        assert_eq!(shown["schedule"]["nextFireAt"], "2026-03-02T14:00:00.000Z");
        assert_eq!(shown["fires"].as_array().unwrap().len(), 1, "{shown}");
    }
}

#[test]
fn the_console_schedules_this_session_runs_it_now_pauses_and_deletes() {
    let Some(browser) = crate::browser::browser() else { return };
    let clock = ManualClock::at(at("2026-03-02T12:00:00Z"));
    let server = server(&clock);
    browser.open(&format!("{}/", server.base));
    browser.wait_for("the console", "document.querySelector('#new-session')");
    let id = crate::console::create_session_in_page(&browser, "Scheduled");
    browser.click(".tab[data-tab=schedules]");
    browser.wait_for("the schedule form", "document.querySelector('.schedule-form input[name=cron]')");
    browser.type_into(".schedule-form input[name=cron]", "30 12 * * *");
    browser.eval("document.querySelector('.schedule-form input[name=timezone]').value = 'UTC';", json!([]));
    browser.type_into(".schedule-form input[name=message]", "lunch report");
    browser.click(".schedule-form button[type=submit]");
    browser.wait_for("the listed schedule", "document.querySelector('.schedules-list li[data-id] .next')");
    let listed = server.get("/api/schedules").json["schedules"].clone();
    assert_eq!((&listed[0]["sessionId"], &listed[0]["cron"]), (&json!(id), &json!("30 12 * * *")));
    assert_eq!(listed[0]["nextFireAt"], "2026-03-02T12:30:00.000Z");

    browser.click(".schedules-list li[data-id] button[data-action=run]");
    browser.wait_for("the run's answer", "document.querySelectorAll('article.message.assistant').length >= 1");
    browser.eval("document.querySelector('.schedules-list li[data-id] button[data-action=pause]').click();", json!([]));
    browser.wait_for(
        "the paused schedule",
        "document.querySelector('.schedules-list li[data-id] button[data-action=resume]')",
    );
    assert_eq!(server.get("/api/schedules").json["schedules"][0]["paused"], true);
    // By script: the run's toast may still cover the button.
    browser
        .eval("document.querySelector('.schedules-list li[data-id] button[data-action=delete]').click();", json!([]));
    browser.wait_for("the confirmation", "document.querySelector('.dialog button.danger')");
    browser.click(".dialog button.danger");
    browser.wait_for("the empty list", "!document.querySelector('.schedules-list li[data-id]')");
    assert_eq!(server.get("/api/schedules").json["schedules"], json!([]));
}
