//! Model calls that end without an answer still count against their scope's budget
//! (docs/permissions.md, "Calls with no answer"): a run cancelled mid-stream, a BAE turn whose
//! session is closed while its call is in flight, and a stream that breaks after its output
//! began are each counted at an estimate, so sending and cancelling again and again cannot
//! spend without limit. Before, each of them was counted at 0 tokens and $0.

use serde_json::{json, Value};

use crate::bae::support::{Bae, Harness};
use crate::fake_provider::{openai, FakeProvider, Reply, Step};
use crate::support::{event_type, is_run_end, wait_until, TestServer};
use kestrel::config::{ModelConfig, ProviderConfig, Wire};
use kestrel::domain::ModelPricing;
use kestrel::policy::Budget;

/// How many cancelled calls a test makes at most before it gives up on the budget refusing.
const TRIES: usize = 12;

fn tokens_per_day(limit: u64) -> Budget {
    Budget { tokens_per_day: Some(limit), ..Budget::default() }
}

/// A dollar an input token and two an output token, so a scope's `dayCost - dayTokens` is the
/// output tokens it was counted.
fn dollar_a_token() -> ModelPricing {
    ModelPricing {
        input_per_million: 1_000_000.0,
        output_per_million: 2_000_000.0,
        cached_input_per_million: None,
        currency: "USD".into(),
    }
}

/// A scope's spending as `/api/usage` or `/admin/v1/usage` shows it: (tokens, cost) today.
fn spending(usage: &Value) -> (u64, f64) {
    (usage["dayTokens"].as_u64().unwrap_or(0), usage["dayCost"].as_f64().unwrap_or(0.0))
}

/// The output tokens a cost at `dollar_a_token` prices says were counted.
fn output_tokens(tokens: u64, cost: f64) -> u64 {
    (cost.round() as u64).saturating_sub(tokens)
}

/// A tenant sends messages and cancels each run once its text streams, until its
/// `tokens_per_day` refuses the next: each cancelled call is counted at its estimated input
/// plus what streamed (a quarter of its bytes, at the model's prices), and the spending passes
/// the limit by that one call at most.
#[test]
fn runs_cancelled_mid_stream_count_against_the_tenant_s_budget_until_it_refuses_them() {
    // One cancelled call counts its input (the tools' schemas make it a few thousand tokens),
    // so this limit takes a few of them.
    const LIMIT: u64 = 6_000;
    let server = TestServer::start_with(|config| {
        config.builtin.delay_ms = 50;
        config.builtin.pricing = Some(dollar_a_token());
        config.agent.budget = tokens_per_day(LIMIT);
    });
    let session = server.create_session(json!({}));
    let mut stream = server.events(&format!("/api/sessions/{session}/events"));
    let words = "word ".repeat(400);
    let spent = || spending(&server.get("/api/usage").json["usage"]);
    let mut counted = Vec::new();
    let (mut tokens, mut cost) = (0, 0.0);
    while tokens < LIMIT && counted.len() < TRIES {
        let sent = server.post(&format!("/api/sessions/{session}/messages"), json!({ "content": words }));
        assert_eq!(sent.status, 202, "{} of {LIMIT} tokens spent: {}", tokens, sent.text);
        stream.collect_until(|e| event_type(e) == "message.delta" && e["event"]["channel"] == "text");
        let cancelled = server.post(&format!("/api/sessions/{session}/cancel"), json!({}));
        assert_eq!(cancelled.json["cancelled"], true, "{}", cancelled.text);
        let events = stream.collect_until(is_run_end);
        assert_eq!(events.last().unwrap()["event"]["status"], "cancelled", "{:?}", events.last());
        // What streamed before the cancel is the partial answer kept.
        let kept = events.iter().rfind(|e| event_type(e) == "message.completed").expect("the partial answer");
        let message = &kept["event"]["message"];
        assert_eq!(message["meta"]["partial"], true, "{message}");
        let streamed = message["content"].as_str().unwrap().len() + message["reasoning"].as_str().unwrap_or("").len();

        let (now_tokens, now_cost) = spent();
        let (call_tokens, call_cost) = (now_tokens - tokens, now_cost - cost);
        assert_eq!(
            output_tokens(call_tokens, call_cost),
            (streamed as u64).div_ceil(4),
            "a cancelled call's output is what streamed, a token per four bytes ({streamed} bytes): \
             {call_tokens} tokens, ${call_cost}"
        );
        counted.push(call_tokens);
        (tokens, cost) = (now_tokens, now_cost);
    }
    assert!(
        tokens >= LIMIT,
        "{} runs cancelled mid-stream were counted {counted:?}: {tokens} of {LIMIT} tokens, so the budget never \
         stopped them",
        counted.len()
    );
    assert!(counted.len() > 1, "the limit took several cancelled calls: {counted:?}");
    assert!(counted.iter().all(|call| *call > 0), "every cancelled call counts: {counted:?}");
    let last = counted.last().copied().unwrap_or(0);
    assert!(tokens - last < LIMIT, "spending passed the limit by one call at most: {counted:?}");

    let refused = server.post(&format!("/api/sessions/{session}/messages"), json!({ "content": "again" }));
    refused.assert_error(429, "budget_exceeded");
}

/// A BAE client opens sessions and closes each while its turn's model call is in flight, until
/// the profile's `tokens_per_day` refuses the next turn. A call cut before its whole answer came
/// counts its estimated input and its whole output limit (`max_tokens`, 8,192 for Anthropic):
/// its output is never seen before the answer ends.
#[test]
fn bae_turns_closed_mid_call_count_against_the_profile_s_budget_until_it_refuses_them() {
    const LIMIT: u64 = 20_000;
    const MAX_TOKENS: u64 = 8_192;
    let bae = Bae::start_with(|config| {
        let fake = config.providers.get_mut("fake").expect("the fake provider");
        fake.models[0].pricing = Some(dollar_a_token());
    });
    let body = json!({ "name": "metered", "primary_provider": "fake", "budget": { "tokens_per_day": LIMIT } });
    let profile = bae.admin_send("POST", "/admin/v1/profiles", Some(body));
    assert_eq!(profile.status, 201, "{}", profile.text);
    let profile_id = profile.json["id"].as_str().unwrap().to_string();
    let (_, key) = bae.client_key(&profile_id);
    let spent = || {
        let usage = bae.admin_send("GET", &format!("/admin/v1/usage?profile_id={profile_id}"), None);
        spending(&usage.json["items"][0])
    };
    let mut counted = Vec::new();
    let (mut tokens, mut cost) = (0, 0.0);
    while tokens < LIMIT && counted.len() < TRIES {
        // The provider takes the request and says 200, then sends nothing more.
        let stalled = Reply { status: 200, headers: vec![], steps: vec![Step::Stall] }
            .with_header("Content-Type", "application/json");
        bae.fake.script([stalled]);
        let mut harness = Harness::open(bae.base(), &key, &[]);
        let turn = harness.start("session.sendMessage", json!({ "message": { "role": "user", "content": "hello" } }));
        assert_eq!(turn.status, 200);
        bae.fake.wait_for_requests(counted.len() + 1);
        assert_eq!(harness.close().status, 200, "the close");
        turn.until_terminal();
        wait_until("the abandoned call to be counted against the profile", || spent().0 > tokens);

        let (now_tokens, now_cost) = spent();
        let (call_tokens, call_cost) = (now_tokens - tokens, now_cost - cost);
        assert_eq!(output_tokens(call_tokens, call_cost), MAX_TOKENS, "{call_tokens} tokens, ${call_cost}");
        assert!(call_tokens > MAX_TOKENS, "its input counts too: {call_tokens}");
        counted.push(call_tokens);
        (tokens, cost) = (now_tokens, now_cost);
    }
    assert!(tokens >= LIMIT, "{counted:?}: {tokens} of {LIMIT} tokens");
    assert!(counted.len() > 1, "the limit took several closed turns: {counted:?}");
    let last = counted.last().copied().unwrap_or(0);
    assert!(tokens - last < LIMIT, "spending passed the limit by one call at most: {counted:?}");

    let requests = bae.fake.requests().len();
    let mut harness = Harness::open(bae.base(), &key, &[]);
    let refused = harness.send_message(json!("again"));
    let error = &refused.last().unwrap()["error"]["message"];
    assert!(error.as_str().is_some_and(|m| m.starts_with("budget_exceeded:")), "{refused:?}");
    assert_eq!(bae.fake.requests().len(), requests, "the refused turn asked no model");
}

/// A provider's stream that breaks after some text (no finish, no usage) fails the run; the
/// call still counts its estimated input and what streamed, at the model's prices, and a
/// spent budget refuses the next run.
#[test]
fn a_run_whose_stream_breaks_after_its_output_began_is_counted() {
    let fake = FakeProvider::start();
    let cut = openai::chunk(json!({ "role": "assistant", "content": "" }), None)
        + &openai::chunk(json!({ "content": "a partial " }), None)
        + &openai::chunk(json!({ "content": "answer" }), None);
    fake.script([Reply::stream(cut.as_bytes(), 3)]);
    let server = TestServer::start_with(|config| {
        let mut provider = ProviderConfig::new(Wire::Openai, fake.base_url.clone());
        provider.retry_base_delay_ms = 1;
        provider.models = vec![ModelConfig { pricing: Some(dollar_a_token()), ..ModelConfig::named("m") }];
        config.providers.insert("local".into(), provider);
        config.agent.budget = tokens_per_day(1);
    });
    let session = server.create_session(json!({ "model": "local/m" }));
    let events = server.run_to_end(&session, "hi");
    let end = events.last().unwrap();
    assert_eq!(event_type(end), "run.failed", "{end}");
    assert_eq!(fake.requests().len(), 1, "no retry once output began");

    let (tokens, cost) = spending(&server.get("/api/usage").json["usage"]);
    let streamed = "a partial answer".len() as u64;
    assert_eq!(output_tokens(tokens, cost), streamed.div_ceil(4), "{tokens} tokens, ${cost}");
    assert!(tokens > streamed.div_ceil(4), "its input counts too: {tokens}");
    server
        .post(&format!("/api/sessions/{session}/messages"), json!({ "content": "again" }))
        .assert_error(429, "budget_exceeded");
}
