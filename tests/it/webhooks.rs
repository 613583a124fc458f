//! Webhooks over HTTP, received by a Node server that verifies every delivery with the official
//! Standard Webhooks library: signatures and payloads, the deliveries API and redelivery,
//! retries with the same `webhook-id`, an endpoint disabled after failing (with a notice) and
//! enabled again, the refusals (inside addresses among them), and a kill -9 after the events
//! committed: exactly the committed events are delivered after the restart.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Lines};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{event_type, npm_package, TestServer, WAIT};

/// The Node receiver, and its report lines as they come.
struct Receiver {
    child: Child,
    port: u16,
    lines: mpsc::Receiver<Value>,
}

impl Receiver {
    fn start() -> Receiver {
        let library = npm_package("standardwebhooks", "standardwebhooks@1.1.1", "standardwebhooks/dist/index.js");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/webhook_fixtures/receiver.mjs");
        let mut child =
            Command::new("node").arg(script).arg(library).stdout(Stdio::piped()).spawn().expect("node runs");
        let mut reader: Lines<BufReader<ChildStdout>> = BufReader::new(child.stdout.take().unwrap()).lines();
        let first: Value = serde_json::from_str(&reader.next().unwrap().unwrap()).unwrap();
        let port = first["listening"].as_u64().expect("the receiver's port") as u16;
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in reader.map_while(Result::ok) {
                if sender.send(serde_json::from_str(&line).unwrap()).is_err() {
                    return;
                }
            }
        });
        Receiver { child, port, lines }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    /// Sets the secret it verifies with and how many deliveries it fails first.
    fn control(&self, body: Value) {
        let answered = ureq::post(&format!("http://127.0.0.1:{}/__control", self.port)).send_json(body);
        assert_eq!(answered.unwrap().status(), 204);
        self.next(|line| line.get("control").is_some());
    }

    /// The next report line that `wanted` takes, within the deadline.
    fn next(&self, wanted: impl Fn(&Value) -> bool) -> Value {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = self.lines.recv_timeout(left).expect("a report from the receiver before the deadline");
            if wanted(&line) {
                return line;
            }
        }
    }

    /// The next verified delivery of event type `kind`.
    fn verified(&self, kind: &str) -> Value {
        let line = self.next(|line| line["verified"] == true && line["payload"]["type"] == kind);
        assert_eq!(line["verified"], true, "{line}");
        line
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn server(adjust: impl FnOnce(&mut kestrel::Config)) -> TestServer {
    TestServer::start_with(|config| {
        config.webhooks.allow_private_targets = true;
        config.webhooks.retry_base_delay_ms = 20;
        adjust(config);
    })
}

fn create(server: &TestServer, receiver: &Receiver, events: Value) -> Value {
    let created = server.post("/api/webhooks", json!({ "url": receiver.url(), "events": events, "description": "ci" }));
    assert_eq!(created.status, 201, "{}", created.text);
    let webhook = created.json["webhook"].clone();
    receiver.control(json!({ "secret": webhook["secret"] }));
    webhook
}

#[test]
fn deliveries_are_signed_per_standard_webhooks_listed_and_redelivered_with_the_same_id() {
    let receiver = Receiver::start();
    let server = server(|_| {});
    let events = json!(["session.created", "run.finished", "schedule.fired", "session.deleted"]);
    let webhook = create(&server, &receiver, events);
    let id = webhook["id"].as_str().unwrap().to_string();
    assert!(webhook["secret"].as_str().unwrap().starts_with("whsec_"));
    let shown = server.get(&format!("/api/webhooks/{id}")).json["webhook"].clone();
    assert!(shown.get("secret").is_none(), "the secret is shown once: {shown}");
    assert_eq!(shown["events"], json!(["run.finished", "schedule.fired", "session.created", "session.deleted"]));

    let session = server.create_session(json!({ "title": "hooked" }));
    let created = receiver.verified("session.created");
    let payload = &created["payload"];
    assert_eq!(payload["data"]["sessionId"], session.as_str());
    assert_eq!(payload["data"]["event"]["session"]["title"], "hooked", "the event in Kestrel's shape: {payload}");
    assert!(payload["timestamp"].as_str().unwrap().ends_with('Z'));
    server.run_to_end(&session, "hello");
    let finished = receiver.verified("run.finished");
    assert_eq!(finished["payload"]["data"]["event"]["status"], "completed");

    let path = format!("/api/webhooks/{id}/deliveries");
    let created_delivery = |server: &TestServer| {
        let listed = server.get(&path).json["deliveries"].clone();
        listed.as_array().unwrap().iter().find(|d| d["type"] == "session.created").cloned().unwrap_or_default()
    };
    crate::support::wait_until("the delivery recorded", || created_delivery(&server)["state"] == "delivered");
    let first = created_delivery(&server);
    assert_eq!(first["id"], created["id"]);
    assert_eq!(first["state"], "delivered");
    assert_eq!((&first["attempts"][0]["n"], &first["attempts"][0]["status"]), (&json!(1), &json!(204)));
    assert!(first["attempts"][0]["latencyMs"].is_u64());

    let redeliver = format!("/api/webhooks/{id}/deliveries/{}/redeliver", first["id"].as_str().unwrap());
    assert_eq!(server.post(&redeliver, json!({})).status, 202);
    let again = receiver.verified("session.created");
    assert_eq!(again["id"], created["id"], "a redelivery keeps its webhook-id");

    // A schedule's fire.
    let schedule = server.post("/api/schedules", json!({ "cron": "0 9 * * *", "sessionId": session, "message": "m" }));
    let schedule_id = schedule.json["schedule"]["id"].as_str().unwrap().to_string();
    assert_eq!(server.post(&format!("/api/schedules/{schedule_id}/run"), json!({})).status, 200);
    // Deliveries go out in parallel: the run may end before its fire's delivery is in.
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let line = receiver.next(|line| line["verified"] == true);
        seen.push(line["payload"].clone());
    }
    let fired = seen.iter().find(|p| p["type"] == "schedule.fired").expect("the fire's delivery");
    assert_eq!(fired["data"]["event"]["scheduleId"], schedule_id.as_str());
    assert!(seen.iter().any(|p| p["type"] == "run.finished"), "{seen:?}");

    server.delete(&format!("/api/sessions/{session}"));
    receiver.verified("session.deleted");
}

#[test]
fn a_failing_endpoint_is_retried_with_the_same_id_then_disabled_with_a_notice_and_enabled_again() {
    let receiver = Receiver::start();
    let server = server(|config| config.webhooks.disable_after_failures = 4);
    let id = create(&server, &receiver, json!(["session.created"]))["id"].as_str().unwrap().to_string();

    // Two failures, then through: three attempts of one delivery, one webhook-id.
    receiver.control(json!({ "fail": 2 }));
    server.create_session(json!({}));
    let refused = receiver.next(|line| line["status"] == 503);
    let delivered = receiver.verified("session.created");
    assert_eq!(delivered["id"], refused["id"]);
    // The receiver reports before its answer is recorded here.
    let path = format!("/api/webhooks/{id}/deliveries");
    crate::support::wait_until("the delivery recorded", || {
        server.get(&path).json["deliveries"][0]["state"] == "delivered"
    });
    let deliveries = server.get(&path).json["deliveries"].clone();
    let statuses: Vec<&Value> = deliveries[0]["attempts"].as_array().unwrap().iter().map(|a| &a["status"]).collect();
    assert_eq!(statuses, [&json!(503), &json!(503), &json!(204)]);
    assert!(deliveries[0]["attempts"][0]["error"].as_str().unwrap().contains("503"));

    // Failing on: disabled after four in a row, with a notice.
    receiver.control(json!({ "fail": 1000 }));
    let mut stream = server.events("/api/events");
    server.create_session(json!({}));
    let notice =
        stream.collect_until(|e| event_type(e) == "notice" && e["event"]["message"].as_str().unwrap().contains(&id));
    assert!(notice.last().unwrap()["event"]["message"].as_str().unwrap().contains("disabled"));
    let shown = server.get(&format!("/api/webhooks/{id}")).json["webhook"].clone();
    assert_eq!((&shown["enabled"], &shown["failures"]), (&json!(false), &json!(4)), "{shown}");
    assert!(shown["disabledReason"].as_str().unwrap().contains("503"));

    receiver.control(json!({ "fail": 0 }));
    let enabled = server.post(&format!("/api/webhooks/{id}/enable"), json!({}));
    assert_eq!(enabled.json["webhook"]["enabled"], true, "{}", enabled.text);
    receiver.verified("session.created");
}

#[test]
fn inside_addresses_unknown_events_and_other_tenants_are_refused() {
    let tenants = |config: &mut kestrel::Config| {
        config.auth.tokens = vec![
            kestrel::config::TokenConfig::new("acme", "acme-token"),
            kestrel::config::TokenConfig::new("globex", "globex-token"),
        ];
    };
    let server = TestServer::start_with(tenants);
    let acme = server.client().with_token(Some("acme-token"));
    for url in ["http://127.0.0.1:9/hook", "http://localhost/hook", "http://[::1]/", "http://169.254.169.254/latest"] {
        let refused = acme.post("/api/webhooks", json!({ "url": url, "events": ["run.finished"] }));
        refused.assert_error(400, "invalid_webhook");
        assert!(refused.text.contains("public addresses only"), "{url}: {}", refused.text);
    }
    for (body, what) in [
        (json!({ "url": "ftp://example.com/", "events": ["run.finished"] }), "a scheme"),
        (json!({ "url": "https://example.com/", "events": [] }), "no events"),
        (json!({ "url": "https://example.com/", "events": ["message.delta"] }), "an unknown type"),
        (json!({ "url": "https://example.com/", "events": "run.finished" }), "a string"),
    ] {
        let refused = acme.post("/api/webhooks", body);
        assert_eq!(refused.json["error"]["code"], "invalid_webhook", "{what}: {}", refused.text);
    }

    // Made on a server that allows inside addresses, then refused at the connection by one
    // that does not: the check is at every connection.
    let receiver = Receiver::start();
    let mut server = server_with_tenants(tenants);
    let acme = server.client().with_token(Some("acme-token"));
    let made = acme.post("/api/webhooks", json!({ "url": receiver.url(), "events": ["session.created"] }));
    let id = made.json["webhook"]["id"].as_str().unwrap().to_string();
    let globex = server.client().with_token(Some("globex-token"));
    globex.get(&format!("/api/webhooks/{id}")).assert_error(404, "webhook_not_found");
    globex.get(&format!("/api/webhooks/{id}/deliveries")).assert_error(404, "webhook_not_found");
    assert_eq!(globex.get("/api/webhooks").json["webhooks"], json!([]));
    server.restart(|config| {
        tenants(config);
        config.webhooks.retry_base_delay_ms = 20;
    });
    let acme = server.client().with_token(Some("acme-token"));
    acme.post("/api/sessions", json!({}));
    let first_attempt =
        || acme.get(&format!("/api/webhooks/{id}/deliveries")).json["deliveries"][0]["attempts"][0].clone();
    crate::support::wait_until("an attempt recorded", || !first_attempt().is_null());
    let attempt = first_attempt();
    // Another tenant cannot send the delivery again, nor can it be named under another endpoint.
    let delivery = acme.get(&format!("/api/webhooks/{id}/deliveries")).json["deliveries"][0]["id"].clone();
    let redeliver = format!("/api/webhooks/{id}/deliveries/{}/redeliver", delivery.as_str().unwrap());
    let globex = server.client().with_token(Some("globex-token"));
    globex.post(&redeliver, json!({})).assert_error(404, "webhook_not_found");
    let mismatched = format!("/api/webhooks/wh_nope/deliveries/{}/redeliver", delivery.as_str().unwrap());
    acme.post(&mismatched, json!({})).assert_error(404, "webhook_not_found");
    assert!(attempt["error"].as_str().unwrap().contains("not sent to"), "{attempt}");
    assert!(receiver.lines.recv_timeout(Duration::from_millis(0)).is_err(), "nothing reached the receiver");
}

fn server_with_tenants(tenants: impl FnOnce(&mut kestrel::Config)) -> TestServer {
    server(tenants)
}

#[test]
fn a_kill_9_after_the_events_committed_still_delivers_exactly_them() {
    let receiver = Receiver::start();
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    // The endpoint takes every delivery and never answers: none is delivered, none has an
    // attempt recorded, so none waits out a retry delay after the restart.
    receiver.control(json!({ "secret": secret, "hang": 1_000_000 }));
    let data = tempfile::tempdir().unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let config = format!(
        "[webhooks]\nallow_private_targets = true\nretry_base_delay_ms = 20\ntimeout_ms = 60000\n\n[[webhooks.endpoints]]\nname = \"ci\"\n\
         url = \"{}\"\nevents = [\"session.created\"]\nsecret = \"{secret}\"\n",
        receiver.url()
    );
    let (mut child, base, _) = crate::support::spawn_binary(data.path(), workspace.path(), &config);
    let client = crate::support::Client { base: base.clone(), token: None };
    let mut sessions = BTreeSet::new();
    for _ in 0..20 {
        let created = client.post("/api/sessions", json!({}));
        assert_eq!(created.status, 201, "{}", created.text);
        sessions.insert(created.json["session"]["id"].as_str().unwrap().to_string());
    }
    // Every session's event is committed with its delivery; none has gone through yet.
    receiver.next(|line| line["hung"] == true);
    child.kill().unwrap();
    child.wait().unwrap();

    receiver.control(json!({ "hang": 0 }));
    let (mut child, _, _) = crate::support::spawn_binary(data.path(), workspace.path(), &config);
    // The committed events, as the log holds them: a session's `session.created` follows its
    // commit, so the kill may have come between the two for the last ones.
    let committed: BTreeSet<String> = crate::support::Db::open(data.path())
        .texts("SELECT session_id FROM events WHERE type = 'session.created'", &[])
        .into_iter()
        .collect();
    assert!(committed.is_subset(&sessions) && committed.len() >= 4, "{committed:?}");
    let mut delivered = BTreeSet::new();
    let mut ids = BTreeSet::new();
    while delivered.len() < committed.len() {
        let line = receiver.verified("session.created");
        ids.insert(line["id"].as_str().unwrap().to_string());
        delivered.insert(line["payload"]["data"]["sessionId"].as_str().unwrap().to_string());
    }
    assert_eq!(delivered, committed, "exactly the committed events");
    assert_eq!(ids.len(), committed.len(), "one webhook-id per event");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn bae_turn_ends_go_to_an_endpoint_of_the_bae_tenant() {
    use crate::bae::support::{Bae, Harness};
    let receiver = Receiver::start();
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    receiver.control(json!({ "secret": secret }));
    let url = receiver.url();
    let bae = Bae::start_with(|config| {
        config.webhooks.allow_private_targets = true;
        config.webhooks.endpoints = vec![kestrel::config::EndpointConfig {
            name: "bae-turns".into(),
            tenant: "@bae".into(),
            url,
            events: vec!["run.finished".into()],
            description: None,
            secret: secret.into(),
        }];
    });
    let (_, key) = bae.key_for("main", &[]);
    let mut harness = Harness::open(bae.base(), &key, &[]);
    bae.fake.script([crate::fake_provider::anthropic::text_answer("hi")]);
    harness.send_message(json!("hello"));
    let ended = receiver.verified("run.finished");
    assert_eq!(ended["payload"]["data"]["sessionId"], harness.session_id.as_str());
    assert_eq!(ended["payload"]["data"]["event"]["status"], "completed", "{ended}");
}

#[test]
fn a_silent_endpoint_times_out_and_a_flood_of_an_answer_is_not_read() {
    let receiver = Receiver::start();
    let server = server(|config| config.webhooks.timeout_ms = 300);
    let id = create(&server, &receiver, json!(["session.created"]))["id"].as_str().unwrap().to_string();
    receiver.control(json!({ "hang": 1, "huge": true }));
    server.create_session(json!({}));
    let hung = receiver.next(|line| line["hung"] == true);
    let delivered = receiver.verified("session.created");
    assert_eq!(delivered["id"], hung["id"], "the retry after the timeout");
    let path = format!("/api/webhooks/{id}/deliveries");
    crate::support::wait_until("the delivery recorded", || {
        server.get(&path).json["deliveries"][0]["state"] == "delivered"
    });
    let attempts = server.get(&path).json["deliveries"][0]["attempts"].clone();
    assert!(attempts[0]["error"].as_str().unwrap().contains("timed out"), "{attempts}");
    assert!(attempts[0]["latencyMs"].as_u64().unwrap() >= 300);
    assert_eq!(attempts[1]["status"], 200, "the flood's status is enough: {attempts}");
}
