//! `/metrics` after a walkthrough: every family is there, the counters moved, the labels are
//! templates and names (never an id or user text), and the route is guarded on both ports.

use serde_json::json;

use crate::support::{is_run_end, TestServer};

const FAMILIES: &[&str] = &[
    "kestrel_http_requests_total",
    "kestrel_http_request_duration_seconds",
    "kestrel_http_open_connections",
    "kestrel_http_open_streams",
    "kestrel_runs_started_total",
    "kestrel_runs_finished_total",
    "kestrel_run_duration_seconds",
    "kestrel_tool_calls_total",
    "kestrel_tool_call_duration_seconds",
    "kestrel_approvals_pending",
    "kestrel_provider_calls_total",
    "kestrel_provider_retries_total",
    "kestrel_provider_fallbacks_total",
    "kestrel_provider_time_to_first_token_seconds",
    "kestrel_provider_tokens_total",
    "kestrel_writer_queue_depth",
    "kestrel_writer_batch_size",
    "kestrel_writer_commit_seconds",
    "kestrel_bus_subscribers",
    "kestrel_bus_dropped_subscribers_total",
    "kestrel_sessions",
    "kestrel_active_runs",
];

/// The value of the sample `name{labels}` (labels as the text format writes them, sorted).
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .map_or(0.0, |value| value.trim().parse().unwrap())
}

#[test]
fn every_family_is_there_after_a_walkthrough_with_bounded_labels() {
    let server = TestServer::start_with(|config| config.auth.token = Some("metrics-token".into()));
    let before = server.get("/metrics").text;
    let id = server.create_session(json!({ "title": "metrics walk" }));
    let secret_words = "zebra-quartz-unique-words";
    let run = server.run_to_end(&id, secret_words);
    assert_eq!(run.last().unwrap()["event"]["type"], "run.finished");
    let tool = server.run_to_end(&id, "/tool list_directory {\"path\":\".\"}");
    assert!(tool.iter().any(|e| e["event"]["type"] == "tool.finished"), "{tool:?}");
    // A tool name the model makes up is no label.
    let made_up = server.run_to_end(&id, "/tool zz_made_up_tool {}");
    assert!(made_up.iter().any(|e| e["event"]["type"] == "tool.finished"), "{made_up:?}");
    server.get(&format!("/api/sessions/{id}"));
    server.get("/api/sessions/ses_doesnotexist");

    let scraped = server.get("/metrics");
    assert_eq!(scraped.status, 200, "{}", scraped.text);
    assert!(scraped.header("content-type").unwrap().starts_with("text/plain; version=0.0.4"));
    let text = scraped.text;
    for family in FAMILIES {
        assert!(text.contains(&format!("# TYPE {family} ")), "{family} missing:\n{text}");
    }
    // The counters moved by at least what this test did (other tests share the process).
    let delta = |series: &str| sample(&text, series) - sample(&before, series);
    assert!(delta("kestrel_runs_started_total") >= 3.0);
    assert!(delta(r#"kestrel_runs_finished_total{status="completed"}"#) >= 3.0);
    let list_directory = delta(r#"kestrel_tool_calls_total{outcome="ok",tool="list_directory"}"#)
        + delta(r#"kestrel_tool_calls_total{outcome="error",tool="list_directory"}"#);
    assert!(list_directory >= 1.0, "{text}");
    assert!(delta(r#"kestrel_provider_calls_total{model="echo",outcome="ok",provider="builtin"}"#) >= 5.0, "{text}");
    let get_session = r#"kestrel_http_requests_total{method="GET",route="/api/sessions/{id}",status="404"}"#;
    assert!(delta(get_session) >= 1.0, "{text}");
    assert!(sample(&text, r#"kestrel_sessions{status="idle"}"#) >= 1.0);
    // Bounded labels: no session id, run id or message text is ever a label value.
    assert!(!text.contains("ses_"), "an id in a label:\n{text}");
    let started = run.iter().find(|e| e["event"]["type"] == "run.started").expect("run.started");
    let run_id = started["event"]["runId"].as_str().unwrap();
    assert!(!text.contains(run_id), "a run id in a label");
    assert!(!text.contains(secret_words), "user text in a label");
    assert!(!text.contains("zz_made_up_tool"), "a made-up tool name in a label");
    assert!(delta(r#"kestrel_tool_calls_total{outcome="error",tool="(unknown)"}"#) >= 1.0, "{text}");

    // Guarded: the token on the main port, the admin key on the admin port.
    assert_eq!(server.client().with_token(None).get("/metrics").status, 401);
    let admin = format!("http://{}", server.admin_addr().unwrap());
    let refused = ureq::get(&format!("{admin}/metrics")).call();
    assert!(matches!(refused, Err(ureq::Error::Status(401, _))));
    let key = std::fs::read_to_string(server.data_dir.join("admin-key")).unwrap();
    let scraped = ureq::get(&format!("{admin}/metrics")).set("Authorization", &format!("Bearer {}", key.trim())).call();
    let body = scraped.expect("the admin key scrapes").into_string().unwrap();
    assert!(body.contains("# TYPE kestrel_sessions gauge"));
}

#[test]
fn a_pending_approval_is_counted_until_it_is_answered() {
    let server = TestServer::start();
    let id = server.create_session(json!({}));
    let mut stream = server.events(&format!("/api/sessions/{id}/events"));
    let sent = server.post(
        &format!("/api/sessions/{id}/messages"),
        json!({ "content": "/tool write_file {\"path\":\"a.txt\",\"content\":\"x\"}" }),
    );
    assert_eq!(sent.status, 202);
    let asked = stream.collect_until(|e| e["event"]["type"] == "approval.requested");
    let approval = asked.last().unwrap()["event"]["approval"]["id"].as_str().unwrap().to_string();
    let waiting = sample(&server.get("/metrics").text, "kestrel_approvals_pending");
    assert!(waiting >= 1.0, "the approval is pending: {waiting}");
    let answered = server.post(&format!("/api/sessions/{id}/approvals/{approval}"), json!({ "approved": true }));
    assert_eq!(answered.status, 200);
    stream.collect_until(is_run_end);
}

#[test]
fn a_priced_model_reports_its_cost_in_the_run_the_session_and_the_metrics() {
    let server = TestServer::start_with(|config| {
        config.builtin.pricing = Some(kestrel::domain::ModelPricing {
            input_per_million: 3.0,
            output_per_million: 15.0,
            cached_input_per_million: None,
            currency: "EUR".into(),
        });
    });
    let bootstrap = server.get("/api/bootstrap");
    let echo = &bootstrap.json["models"][0];
    assert_eq!(echo["pricing"], json!({ "inputPerMillion": 3.0, "outputPerMillion": 15.0, "currency": "EUR" }));
    let before =
        sample(&server.get("/metrics").text, r#"kestrel_cost_total{currency="EUR",model="echo",provider="builtin"}"#);

    let id = server.create_session(json!({}));
    let events = server.run_to_end(&id, "price this answer please");
    let usage = &events.last().unwrap()["event"]["usage"];
    let (input, output) = (usage["inputTokens"].as_f64().unwrap(), usage["outputTokens"].as_f64().unwrap());
    let expected = (input * 3.0 + output * 15.0) / 1_000_000.0;
    assert_eq!(usage["cost"]["currency"], "EUR");
    assert!((usage["cost"]["amount"].as_f64().unwrap() - expected).abs() < 1e-12, "{usage}");

    server.run_to_end(&id, "and again");
    let detail = server.get(&format!("/api/sessions/{id}"));
    let total = &detail.json["session"]["usage"];
    assert!(total["cost"]["amount"].as_f64().unwrap() > expected, "two runs cost more than one: {total}");
    let after =
        sample(&server.get("/metrics").text, r#"kestrel_cost_total{currency="EUR",model="echo",provider="builtin"}"#);
    assert!(after - before >= total["cost"]["amount"].as_f64().unwrap() * 0.999, "{before} -> {after}");
}
