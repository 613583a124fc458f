//! Budgets and rate limits (docs/permissions.md) through both doors: a run stopped before
//! its next model call, new runs refused over budget and across a restart, runs at once,
//! requests per second with `Retry-After`, and the usage counters.

use serde_json::json;

use crate::bae::support::{assert_problem, send, Bae, Harness};
use crate::fake_provider::anthropic;
use crate::support::{event_type, is_run_end, TestServer};
use kestrel::config::TokenConfig;
use kestrel::policy::Budget;

fn tokens_per_day(limit: u64) -> Budget {
    Budget { tokens_per_day: Some(limit), ..Budget::default() }
}

#[test]
fn a_run_crossing_its_tenant_s_budget_stops_before_its_next_model_call_and_new_runs_get_429() {
    let configure = |config: &mut kestrel::Config| {
        config.builtin.delay_ms = 0;
        config.agent.budget = tokens_per_day(1);
    };
    let mut server = TestServer::start_with(configure);
    let session = server.create_session(json!({}));
    // Nothing spent: the run starts; its first model call passes the budget, its tool runs,
    // and it stops before the model would be asked again.
    let events = server.run_to_end(&session, "/tool list_directory {}");
    let finished = events.iter().find(|e| event_type(e) == "tool.finished").expect("the tool ran");
    assert_eq!(finished["event"]["result"]["ok"], true);
    let end = events.last().unwrap();
    assert_eq!(end["event"]["status"], "budget_exceeded", "{end}");
    let notice = events.iter().find(|e| event_type(e) == "notice").expect("a notice says why");
    assert!(notice["event"]["message"].as_str().unwrap().contains("budget exceeded"), "{notice}");
    let starts =
        events.iter().filter(|e| event_type(e) == "message.started" && e["event"]["message"]["role"] == "assistant");
    assert_eq!(starts.count(), 1, "one model call, not two");

    let usage = server.get("/api/usage");
    assert_eq!(usage.status, 200, "{}", usage.text);
    let spent = usage.json["usage"]["dayTokens"].as_u64().unwrap();
    assert!(spent > 1, "{}", usage.text);
    assert_eq!(usage.json["usage"]["monthTokens"].as_u64(), Some(spent));
    assert_eq!(usage.json["usage"]["budget"]["tokens_per_day"], 1);
    assert_eq!(usage.json["usage"]["scope"], "tenant:default");

    let refused = server.post(&format!("/api/sessions/{session}/messages"), json!({ "content": "again" }));
    refused.assert_error(429, "budget_exceeded");
    server.restart(configure);
    let refused = server.post(&format!("/api/sessions/{session}/messages"), json!({ "content": "again" }));
    refused.assert_error(429, "budget_exceeded");
    assert_eq!(server.get("/api/usage").json["usage"]["dayTokens"].as_u64(), Some(spent), "counters survive");
    let audit = server.get("/api/audit").json["entries"].clone();
    let by_budget: Vec<&serde_json::Value> =
        audit.as_array().unwrap().iter().filter(|e| e["decidedBy"] == "budget").collect();
    assert_eq!(by_budget.len(), 3, "the stop and both refusals: {audit:#}");
    assert!(by_budget.iter().all(|e| e["decision"] == "denied" && e["note"].as_str().unwrap().contains("tokens")));
    // A bigger budget lets it run again.
    server.restart(|config| config.agent.budget = tokens_per_day(spent + 1_000_000));
    assert_eq!(server.run_to_end(&session, "again").last().unwrap()["event"]["status"], "completed");
}

#[test]
fn runs_at_once_and_requests_per_second_are_limited_per_tenant() {
    let server = TestServer::start_with(|config| {
        config.builtin.delay_ms = 0;
        let mut a = TokenConfig::new("a", "token-a");
        a.budget = Some(Budget { max_concurrent_runs: Some(1), ..Budget::default() });
        let mut b = TokenConfig::new("b", "token-b");
        b.budget = Some(Budget { requests_per_second: Some(0.01), ..Budget::default() });
        config.auth.tokens = vec![a, b];
    });
    let a = server.client().with_token(Some("token-a"));
    let create = |client: &crate::support::Client| {
        let created = client.post("/api/sessions", json!({}));
        assert_eq!(created.status, 201, "{}", created.text);
        created.json["session"]["id"].as_str().unwrap().to_string()
    };
    let (first, second) = (create(&a), create(&a));
    // The first run waits on a person; the second may not start meanwhile.
    let mut stream =
        crate::support::SseClient::open(&server.base, &format!("/api/sessions/{first}/events"), Some("token-a"), None);
    let content = "/tool run_command {\"command\":\"echo waiting\"}";
    assert_eq!(a.post(&format!("/api/sessions/{first}/messages"), json!({ "content": content })).status, 202);
    let asked = stream.collect_until(|e| event_type(e) == "approval.requested");
    let approval = asked.last().unwrap()["event"]["approval"]["id"].as_str().unwrap().to_string();
    a.post(&format!("/api/sessions/{second}/messages"), json!({ "content": "hi" }))
        .assert_error(429, "budget_exceeded");
    assert_eq!(a.get("/api/usage").json["usage"]["runningRuns"], 1);
    let approved = a.post(&format!("/api/sessions/{first}/approvals/{approval}"), json!({ "approved": true }));
    assert_eq!(approved.status, 200);
    stream.collect_until(is_run_end);
    crate::support::wait_until("the run's slot is free", || a.get("/api/usage").json["usage"]["runningRuns"] == 0);
    assert_eq!(a.post(&format!("/api/sessions/{second}/messages"), json!({ "content": "hi" })).status, 202);

    // One request a hundred seconds for b: the second is refused with Retry-After; a is not.
    let b = server.client().with_token(Some("token-b"));
    assert_eq!(b.get("/api/sessions").status, 200);
    let limited = b.get("/api/sessions");
    limited.assert_error(429, "rate_limited");
    let retry: u64 = limited.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=100).contains(&retry), "{retry}");
    assert_eq!(a.get("/api/sessions").status, 200);
}

/// A BAE profile with a budget: turns over it end in BAE's generic error, the profile's
/// usage is on the admin port, and its requests are rate limited.
#[test]
fn a_bae_profile_s_budget_refuses_turns_over_it_and_limits_its_requests() {
    let bae = Bae::start();
    let body = json!({ "name": "metered", "primary_provider": "fake", "budget": { "tokens_per_day": 10 } });
    let profile = bae.admin_send("POST", "/admin/v1/profiles", Some(body));
    assert_eq!(profile.status, 201, "{}", profile.text);
    let profile_id = profile.json["id"].as_str().unwrap().to_string();
    let viewed = bae.admin_send("GET", &format!("/admin/v1/profiles/{profile_id}"), None);
    assert_eq!(viewed.json["budget"], json!({ "tokens_per_day": 10 }));
    let (_, key) = bae.client_key(&profile_id);
    let mut harness = Harness::open(bae.base(), &key, &[]);
    bae.fake.script([anthropic::text_answer("hi")]);
    let first = harness.send_message(json!("hello"));
    assert_eq!(first.last().unwrap()["result"]["message"]["content"][0]["text"], "hi", "{first:?}");
    let refused = harness.send_message(json!("again"));
    let error = &refused.last().unwrap()["error"];
    assert_eq!(error["code"], -32000, "{refused:?}");
    assert!(error["message"].as_str().unwrap().starts_with("budget_exceeded:"), "{error}");

    let audit = bae.admin_send("GET", "/admin/v1/audit", None);
    let refusals = audit.json["items"].as_array().unwrap().iter().filter(|e| e["decidedBy"] == "budget").count();
    assert_eq!(refusals, 1, "{}", audit.text);
    let usage = bae.admin_send("GET", &format!("/admin/v1/usage?profile_id={profile_id}"), None);
    assert_eq!(usage.status, 200, "{}", usage.text);
    let item = &usage.json["items"][0];
    assert_eq!((item["profile_id"].as_str(), item["dayTokens"].as_u64()), (Some(profile_id.as_str()), Some(15)));
    let everyone = bae.admin_send("GET", "/admin/v1/usage", None);
    assert!(everyone.json["items"].as_array().unwrap().iter().any(|i| i["profile_id"] == profile_id.as_str()));

    // Bad budgets are refused.
    let bad = [
        json!({ "tokens_per_day": -1 }),
        json!({ "cost_per_day": "a lot" }),
        json!({ "whatever": 1 }),
        json!([null, null]),
    ];
    for budget in bad {
        let body = json!({ "name": "bad", "primary_provider": "fake", "budget": budget });
        assert_problem(&bae.admin_send("POST", "/admin/v1/profiles", Some(body)), 400, "bad_request");
    }

    let limited = json!({ "name": "limited", "primary_provider": "fake", "budget": { "requests_per_second": 0.01 } });
    let limited = bae.admin_send("POST", "/admin/v1/profiles", Some(limited));
    let (_, key) = bae.client_key(limited.json["id"].as_str().unwrap());
    let open = |key: &str| send(bae.base(), "POST", "/api/v1/sessions", Some(key), Some(json!({})));
    assert_eq!(open(&key).status, 201);
    let refused = open(&key);
    assert_problem(&refused, 429, "rate_limited");
    assert!(refused.header("retry-after").is_some_and(|s| s.parse::<u64>().is_ok()));
}

/// A BAE turn whose first model call passes its profile's budget runs the MCP call the model
/// asked for, then stops before asking the model again: `session.error` `budget_exceeded`,
/// the session still open.
#[test]
fn a_bae_turn_crossing_its_budget_stops_before_its_next_model_call() {
    use crate::mcp::TINY;
    let marker = format!("budget-{}", std::process::id());
    let server = kestrel::config::bae::McpServer::stdio("tiny", "python3", vec![TINY.into(), marker]);
    let bae = Bae::start_with(move |config| config.bae.file.mcp.servers.push(server));
    let body = json!({ "name": "metered", "primary_provider": "fake", "mcp_servers": ["tiny"], "budget": { "tokens_per_day": 10 } });
    let profile = bae.admin_send("POST", "/admin/v1/profiles", Some(body));
    assert_eq!(profile.status, 201, "{}", profile.text);
    let (_, key) = bae.client_key(profile.json["id"].as_str().unwrap());
    let mut harness = Harness::open(bae.base(), &key, &[]);
    let call = json!([{ "type": "tool_use", "id": "tu_m", "name": "echo", "input": { "text": "hi" } }]);
    bae.fake.script([anthropic::answer(call, "tool_use", 10, 5), anthropic::text_answer("never asked")]);
    let frames = harness.send_message(json!("echo hi"));
    let events: Vec<&serde_json::Value> =
        frames.iter().filter(|f| f["method"] == "session.event").map(|f| &f["params"]).collect();
    let fault = events.iter().find(|e| e["event_type"] == "session.error").expect("a session.error");
    assert_eq!(fault["payload"]["reason"], "budget_exceeded", "{fault}");
    assert!(fault["payload"]["detail"].as_str().unwrap().contains("tokens used today"), "{fault}");
    assert!(events.iter().any(|e| e["event_type"] == "mcp.response"), "the MCP call ran");
    // BAE's terminal error of a turn whose loop ended in a fault.
    let terminal = &frames.last().unwrap()["error"];
    assert_eq!((terminal["code"].as_i64(), terminal["message"].as_str()), (Some(-32000), Some("session loop failed")));
    assert_eq!(bae.fake.requests().len(), 1, "the model was not asked again");
    let session = bae.admin_send("GET", "/admin/v1/sessions", None);
    assert_eq!(session.json["items"][0]["state"], "open", "{}", session.text);
}
