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
    wait_until("every run ended", || server.get("/api/usage").json["usage"]["runningRuns"] == 0);
    let stopped_by_budget = sessions_stopped_by_the_budget(&server);

    // How each message ended, and every model call the runs made, from the transcripts: each
    // answer carries its usage.
    let mut ends = Ends::default();
    let mut calls = Vec::new();
    for (session, (status, code)) in sessions.iter().zip(&answers) {
        let detail = server.get(&format!("/api/sessions/{session}"));
        let messages = detail.json["session"]["messages"].as_array().cloned().unwrap_or_default();
        let answers: Vec<&Value> = messages.iter().filter(|m| m["role"] == "assistant").collect();
        for message in &answers {
            let usage = &message["meta"]["usage"];
            calls.push(usage["inputTokens"].as_u64().unwrap() + usage["outputTokens"].as_u64().unwrap());
        }
        let end = match (*status, code.as_str(), detail.json["session"]["status"].as_str()) {
            (429, Some("budget_exceeded"), _) => End::Refused,
            (202, _, Some("idle")) if answers.len() == 1 && answers[0]["meta"]["partial"].is_null() => End::Answered,
            (202, _, Some("idle")) if answers.is_empty() && stopped_by_budget.contains(session) => End::Stopped,
            _ => End::Other,
        };
        ends.count(end, &json!({ "status": status, "code": code, "session": detail.json["session"] }));
    }
    ends.assert_only_budget_ends(n);
    assert_eq!(calls.len(), ends.answered, "each answered run made one model call, and no other run made one");
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
    let turns = at_once(n, |i| harnesses[i].lock().unwrap().send_message(json!("hello")));
    let mut ends = Ends::default();
    for frames in &turns {
        ends.count(bae_end(frames), frames.last().unwrap_or(&Value::Null));
    }
    ends.assert_only_budget_ends(n);
    let calls: Vec<u64> = bae.fake.requests().iter().map(|_| 15).collect();
    assert_eq!(calls.len(), ends.answered, "each answered turn made one model call, and no other turn made one");
    let usage = bae.admin_send("GET", &format!("/admin/v1/usage?profile_id={profile_id}"), None);
    let spent = usage.json["items"][0]["dayTokens"].as_u64().unwrap_or(0);
    assert_spent_within_one_call(spent, &calls, n);
}

/// How a message sent at once ended.
#[derive(Debug, Clone, Copy, PartialEq)]
enum End {
    /// Answered by one model call.
    Answered,
    /// Refused at once: the budget was spent when it came (Kestrel `429 budget_exceeded`,
    /// BAE `budget_exceeded: …`).
    Refused,
    /// Accepted while calls were in flight, then stopped before its model call because they
    /// spent the budget meanwhile (docs/permissions.md: "runs accepted while calls are in flight
    /// may end with `budget_exceeded` without a model call"): a `budget_exceeded` stop.
    Stopped,
    /// Anything else: a crash, a provider failure, a run that never ended. None is allowed.
    Other,
}

/// How many messages ended which way, and the first of each unexpected end.
#[derive(Default)]
struct Ends {
    answered: usize,
    refused: usize,
    stopped: usize,
    others: Vec<String>,
}

impl Ends {
    fn count(&mut self, end: End, shown: &Value) {
        match end {
            End::Answered => self.answered += 1,
            End::Refused => self.refused += 1,
            End::Stopped => self.stopped += 1,
            End::Other => self.others.push(shown.to_string()),
        }
    }

    /// Every message was answered or stopped by the budget; none failed otherwise.
    fn assert_only_budget_ends(&self, n: usize) {
        let Ends { answered, refused, stopped, others } = self;
        assert!(
            others.is_empty(),
            "{} of {n} messages ended neither answered nor stopped by the budget ({answered} answered, {refused} \
             refused, {stopped} stopped); the first: {}",
            others.len(),
            others[0]
        );
        assert_eq!(answered + refused + stopped, n);
        assert!(*answered > 0, "some messages were answered before the budget was spent");
        assert!(refused + stopped > 0, "the budget stopped the rest");
    }
}

/// How a BAE `sendMessage` ended, from its frames.
fn bae_end(frames: &[Value]) -> End {
    let end = frames.last().cloned().unwrap_or(Value::Null);
    let error = end["error"]["message"].as_str();
    let budget_fault = crate::bae::support::notified(frames)
        .iter()
        .any(|e| e["event_type"] == "session.error" && e["payload"]["reason"] == "budget_exceeded");
    match error {
        None if end["result"]["message"]["content"][0]["text"] == "hi" => End::Answered,
        Some(message) if message.starts_with("budget_exceeded:") => End::Refused,
        // BAE's terminal error of a turn whose loop ended in a fault: legitimate only when the
        // fault was the budget's.
        Some("session loop failed") if budget_fault => End::Stopped,
        _ => End::Other,
    }
}

/// The sessions whose run the budget stopped, from the audit log: one entry each.
fn sessions_stopped_by_the_budget(server: &TestServer) -> std::collections::HashSet<String> {
    let mut stopped = std::collections::HashSet::new();
    let mut after = 0;
    loop {
        let page = server.get(&format!("/api/audit?after={after}"));
        assert_eq!(page.status, 200, "{}", page.text);
        for entry in page.json["entries"].as_array().unwrap() {
            if entry["decidedBy"] == "budget" && entry["runId"].is_string() {
                stopped.insert(entry["sessionId"].as_str().unwrap().to_string());
            }
        }
        match page.json["nextAfter"].as_u64() {
            Some(next) => after = next,
            None => return stopped,
        }
    }
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
