//! Budgets under concurrency (issue 35, finding 6), through both doors: many runs opened at
//! once on many sessions pass their scope's `tokens_per_day` by at most one model call's
//! usage, and every call made is counted (docs/permissions.md, "Runs at once").

use std::sync::{Arc, Barrier};

use serde_json::{json, Value};

use crate::bae::support::{Bae, Harness};
use crate::fake_provider::anthropic;
use crate::support::{wait_until, TestServer};
use kestrel::domain::ModelPricing;
use kestrel::policy::Budget;

const LIMIT: u64 = 100;

fn tokens_per_day(limit: u64) -> Budget {
    Budget { tokens_per_day: Some(limit), ..Budget::default() }
}

/// Runs `each` on `n` threads released together, and returns what each returned.
pub(crate) fn at_once<T: Send>(n: usize, each: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let barrier = Arc::new(Barrier::new(n));
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..n)
            .map(|i| {
                let (barrier, each) = (Arc::clone(&barrier), &each);
                std::thread::Builder::new()
                    .stack_size(256 * 1024)
                    .spawn_scoped(scope, move || {
                        barrier.wait();
                        each(i)
                    })
                    .expect("a client thread")
            })
            .collect();
        threads.into_iter().map(|thread| thread.join().expect("a client thread ends")).collect()
    })
}

/// `n` Kestrel sessions of one tenant each get a message at once; the builtin model answers.
fn kestrel_messages_at_once(n: usize) {
    let server = TestServer::start_with(|config| {
        config.builtin.delay_ms = 1;
        config.agent.budget = tokens_per_day(LIMIT);
    });
    let sessions: Vec<String> = (0..n).map(|_| server.create_session(json!({}))).collect();
    let client = server.client();
    let answers = at_once(n, |i| {
        let sent = client.post(&format!("/api/sessions/{}/messages", sessions[i]), json!({ "content": "hello there" }));
        (sent.status, sent.json["error"]["code"].clone())
    });
    for (status, code) in &answers {
        assert!(*status == 202 || (*status == 429 && code == "budget_exceeded"), "{status} {code}");
    }
    wait_until("every run ended", || server.get("/api/usage").json["usage"]["runningRuns"] == 0);

    // Every model call the runs made, from the transcripts: each answer carries its usage.
    let mut calls = Vec::new();
    for session in &sessions {
        let detail = server.get(&format!("/api/sessions/{session}"));
        let messages = detail.json["session"]["messages"].as_array().cloned().unwrap_or_default();
        for message in messages.iter().filter(|m| m["role"] == "assistant") {
            let usage = &message["meta"]["usage"];
            calls.push(usage["inputTokens"].as_u64().unwrap() + usage["outputTokens"].as_u64().unwrap());
        }
    }
    let spent = server.get("/api/usage").json["usage"]["dayTokens"].as_u64().unwrap();
    assert_spent_within_one_call(spent, &calls, n);
}

/// `n` BAE sessions of one profile each get `sendMessage` at once; the fake answers.
fn bae_messages_at_once(n: usize) {
    let bae = Bae::start();
    let body = json!({ "name": "metered", "primary_provider": "fake", "budget": { "tokens_per_day": LIMIT } });
    let profile = bae.admin_send("POST", "/admin/v1/profiles", Some(body));
    assert_eq!(profile.status, 201, "{}", profile.text);
    let profile_id = profile.json["id"].as_str().unwrap().to_string();
    let (_, key) = bae.client_key(&profile_id);
    // Each answer is 15 tokens (10 in, 5 out); more are scripted than could ever be asked.
    bae.fake.script((0..n).map(|_| anthropic::text_answer("hi")));
    let harnesses: Vec<std::sync::Mutex<Harness>> =
        (0..n).map(|_| std::sync::Mutex::new(Harness::open(bae.base(), &key, &[]))).collect();
    let ends = at_once(n, |i| {
        let frames = harnesses[i].lock().unwrap().send_message(json!("hello"));
        frames.last().cloned().unwrap_or(Value::Null)
    });
    for end in &ends {
        let answered = end["result"]["message"]["content"][0]["text"] == "hi";
        let refused = end["error"]["message"].as_str().is_some_and(|m| m.starts_with("budget_exceeded:"));
        let stopped = end["error"]["message"] == "session loop failed";
        assert!(answered || refused || stopped, "{end}");
    }
    let calls: Vec<u64> = bae.fake.requests().iter().map(|_| 15).collect();
    let usage = bae.admin_send("GET", &format!("/admin/v1/usage?profile_id={profile_id}"), None);
    let spent = usage.json["items"][0]["dayTokens"].as_u64().unwrap_or(0);
    assert_spent_within_one_call(spent, &calls, n);
}

/// What was counted is what the calls used, and it passes the limit by one call at most.
fn assert_spent_within_one_call(spent: u64, calls: &[u64], runs: usize) {
    let used: u64 = calls.iter().sum();
    let largest = calls.iter().copied().max().unwrap_or(0);
    assert_eq!(spent, used, "every call is counted: {} calls for {runs} runs", calls.len());
    assert!(
        spent <= LIMIT + largest,
        "{runs} runs at once spent {spent} tokens in {} calls; the limit is {LIMIT}, one call at most {largest}",
        calls.len()
    );
    assert!(spent >= LIMIT.min(largest), "the budget was used: {spent}");
}

#[test]
fn fifty_kestrel_messages_at_once_pass_the_budget_by_one_call_at_most() {
    kestrel_messages_at_once(50);
}

#[test]
fn five_hundred_kestrel_messages_at_once_pass_the_budget_by_one_call_at_most() {
    kestrel_messages_at_once(500);
}

#[test]
fn fifty_bae_messages_at_once_pass_the_profile_s_budget_by_one_call_at_most() {
    bae_messages_at_once(50);
}

#[test]
fn five_hundred_bae_messages_at_once_pass_the_profile_s_budget_by_one_call_at_most() {
    bae_messages_at_once(500);
}

/// A BAE profile's calls cost what the prices of the model that answered say, so its
/// `cost_per_day` holds (its calls were counted at no cost: they were priced by a name no
/// model's id matched).
#[test]
fn a_bae_profile_s_calls_cost_what_their_model_s_prices_say() {
    let bae = Bae::start_with(|config| {
        let fake = config.providers.get_mut("fake").expect("the fake provider");
        // A dollar an input token, two an output token.
        let pricing = ModelPricing {
            input_per_million: 1_000_000.0,
            output_per_million: 2_000_000.0,
            cached_input_per_million: None,
            currency: "USD".into(),
        };
        fake.models[0].pricing = Some(pricing);
    });
    let body = json!({ "name": "priced", "primary_provider": "fake", "budget": { "cost_per_day": 15.0 } });
    let profile = bae.admin_send("POST", "/admin/v1/profiles", Some(body));
    assert_eq!(profile.status, 201, "{}", profile.text);
    let profile_id = profile.json["id"].as_str().unwrap().to_string();
    let (_, key) = bae.client_key(&profile_id);
    bae.fake.script([anthropic::text_answer("hi")]);
    let mut harness = Harness::open(bae.base(), &key, &[]);
    let first = harness.send_message(json!("hello"));
    assert_eq!(first.last().unwrap()["result"]["message"]["content"][0]["text"], "hi", "{first:?}");
    let usage = bae.admin_send("GET", &format!("/admin/v1/usage?profile_id={profile_id}"), None);
    assert_eq!(usage.json["items"][0]["dayCost"].as_f64(), Some(20.0), "10 in at $1, 5 out at $2: {}", usage.text);
    let refused = harness.send_message(json!("again"));
    let error = &refused.last().unwrap()["error"]["message"];
    assert!(error.as_str().is_some_and(|m| m.starts_with("budget_exceeded:")), "{refused:?}");
}
