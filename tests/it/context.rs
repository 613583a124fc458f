//! Long sessions: a small `contextWindow` makes a run compact the older history into a summary
//! before its provider call, keeping the recent turns (a tool call with its result) verbatim.

use serde_json::{json, Value};

use crate::support::{event_type, TestServer};

fn text(words: usize, seed: &str) -> String {
    (0..words).map(|i| format!("{seed}{i}")).collect::<Vec<_>>().join(" ")
}

#[test]
fn a_small_context_window_compacts_the_older_turns_and_keeps_the_recent_ones() {
    let server = TestServer::start_with(|config| {
        config.builtin.context_window = 1_500;
        config.builtin.delay_ms = 0;
    });
    let id = server.create_session(json!({}));
    // Turns of about 300 tokens, each with a tool call and its result, until one's provider
    // call would pass 80% of the window and the history is compacted first.
    let mut turns = 0;
    let (before, events) = loop {
        let before = server.get(&format!("/api/sessions/{id}")).json["session"]["messages"].as_array().unwrap().clone();
        let events = server.run_to_end(&id, &format!("{}\n/tool list_directory {{}}", text(60, &format!("t{turns}w"))));
        turns += 1;
        if events.iter().any(|e| event_type(e) == "context.compacted") {
            break (before, events);
        }
        assert!(turns < 12, "no compaction after {turns} turns");
    };
    assert!(turns >= 3, "compacted after {turns} turns: there must be older turns to summarize");
    let compacted = events.iter().find(|e| event_type(e) == "context.compacted").unwrap();
    let compacted = &compacted["event"];
    let (removed, kept) = (compacted["removedMessages"].as_u64().unwrap(), compacted["keptMessages"].as_u64().unwrap());
    assert!(compacted["tokensAfter"].as_u64() < compacted["tokensBefore"].as_u64(), "{compacted}");
    assert_eq!(events.last().unwrap()["event"]["type"], "run.finished", "the run goes on after it");

    let session = server.get(&format!("/api/sessions/{id}")).json["session"].clone();
    let messages = session["messages"].as_array().unwrap();
    let summary = &messages[0];
    assert_eq!(summary["meta"]["compactionSummary"], true, "{summary}");
    assert!(summary["content"].as_str().unwrap().starts_with("Summary of the earlier conversation"));
    assert_eq!(summary["meta"]["removedMessages"], removed);
    // The kept turns follow the summary as they were (the same ids): the previous turn, then
    // this turn's own message, then its answers.
    let kept_ids: Vec<&Value> = messages[1..=kept as usize].iter().map(|m| &m["id"]).collect();
    let before_ids: Vec<&Value> = before[removed as usize..].iter().map(|m| &m["id"]).collect();
    assert_eq!(kept_ids[..before_ids.len()], before_ids[..]);
    assert_eq!(kept as usize, before_ids.len() + 1, "the previous turn and this turn's message");
    assert_eq!(messages[1]["role"], "user", "the kept part starts at a turn");
    let calls = messages.iter().filter(|m| !m["toolCalls"].is_null() && m["toolCalls"] != json!([])).count();
    let results = messages.iter().filter(|m| m["role"] == "tool").count();
    assert_eq!(calls, results, "no tool call is separated from its result: {messages:#?}");
    assert!(messages.iter().all(|m| m["hidden"].is_null()));

    // The replaced messages are still stored, for audit.
    let audit = server.get(&format!("/api/sessions/{id}?compacted=true")).json["session"]["messages"].clone();
    let hidden: Vec<&Value> = audit.as_array().unwrap().iter().filter(|m| m["hidden"] == true).collect();
    assert_eq!(hidden.len() as u64, removed);
    assert_eq!(hidden[0]["id"], before[0]["id"]);
}

#[test]
fn a_single_turn_past_the_window_has_nothing_to_summarize_and_goes_on() {
    // A model whose window is smaller than one turn: the history never fits, but with one
    // turn there is nothing before the kept turns to summarize, so nothing happens.
    let server = TestServer::start_with(|config| {
        config.builtin.context_window = 10;
        config.builtin.delay_ms = 0;
    });
    let id = server.create_session(json!({}));
    let events = server.run_to_end(&id, &text(50, "only"));
    assert!(events.iter().all(|e| event_type(e) != "context.compacted"));
    assert_eq!(events.last().unwrap()["event"]["type"], "run.finished");
    assert_eq!(server.get(&format!("/api/sessions/{id}")).json["session"]["messageCount"], 2);
}

/// A fake OpenAI-style model with a 1,000-token window, reporting the usage it is given.
fn fake_server(fake: &crate::fake_provider::FakeProvider) -> TestServer {
    use kestrel::config::{ModelConfig, ProviderConfig, Wire};
    let mut provider = ProviderConfig::new(Wire::Openai, fake.base_url.clone());
    provider.api_key = Some("sk-test".into());
    provider.retry_base_delay_ms = 10;
    provider.models = vec![ModelConfig { context_window: Some(1_000), ..ModelConfig::named("small") }];
    TestServer::start_with(move |config| {
        config.providers.insert("local".into(), provider);
    })
}

fn answer(text: &str, prompt_tokens: u64) -> crate::fake_provider::Reply {
    use crate::fake_provider::{openai, Reply};
    Reply::stream(openai::text(&[], &[text], &openai::usage(prompt_tokens, 10, 0, 0)).as_bytes(), 3)
}

#[test]
fn the_provider_s_usage_triggers_it_a_failed_summary_changes_nothing_and_the_model_sees_the_summary() {
    use crate::fake_provider::{FakeProvider, Reply};
    let fake = FakeProvider::start();
    let server = fake_server(&fake);
    let id = server.create_session(json!({ "model": "local/small" }));
    fake.script([answer("one", 100), answer("two", 200), answer("three", 900)]);
    for content in ["first", "second", "third"] {
        server.run_to_end(&id, content);
    }
    // 910 reported tokens and a new message pass 80% of 1,000: the summary is asked for, and
    // the model refuses; the run goes on with the whole history.
    fake.script([Reply::error(400, "no summaries today"), answer("four", 950)]);
    let events = server.run_to_end(&id, "fourth");
    let notice = events.iter().find(|e| event_type(e) == "notice").expect("a notice says why");
    assert!(notice["event"]["message"].as_str().unwrap().contains("could not be compacted"), "{notice}");
    assert!(events.iter().all(|e| event_type(e) != "context.compacted"));
    assert_eq!(events.last().unwrap()["event"]["type"], "run.finished");
    let asked = fake.requests();
    let full = asked.last().unwrap().body["messages"].as_array().unwrap().len();
    assert_eq!(full, 7, "the call after the failed summary sends the whole history");
    assert_eq!(server.get(&format!("/api/sessions/{id}")).json["session"]["messageCount"], 8);

    // The next turn compacts: the summary replaces all but the last turn and this one.
    fake.script([answer("SUMMARY TEXT", 300), answer("five", 400)]);
    let events = server.run_to_end(&id, "fifth");
    assert!(events.iter().any(|e| event_type(e) == "context.compacted"), "{events:#?}");
    let asked = fake.requests();
    let summary_request = &asked[asked.len() - 2].body["messages"];
    assert_eq!(summary_request[0]["content"], "first", "the summary request holds the older turns");
    let last = &asked.last().unwrap().body["messages"];
    assert_eq!(last[0]["role"], "user");
    assert_eq!(last[0]["content"], "Summary of the earlier conversation:\n\nSUMMARY TEXT");
    assert_eq!(last[1]["content"], "fourth", "the kept turns follow, as they were");
}

#[test]
fn a_rewind_to_a_turn_a_compaction_kept_puts_back_that_turn_s_files() {
    let server = TestServer::start_with(|config| {
        config.builtin.context_window = 1_500;
        config.builtin.delay_ms = 0;
        config.agent.permissions.insert("write_file".into(), kestrel::engine::tools::Permission::Auto);
    });
    let id = server.create_session(json!({}));
    let mut turn = 0;
    loop {
        let line = json!({ "path": "f.txt", "content": format!("v{turn}") });
        let events = server.run_to_end(&id, &format!("{}\n/tool write_file {line}", text(60, &format!("t{turn}w"))));
        turn += 1;
        if events.iter().any(|e| event_type(e) == "context.compacted") {
            break;
        }
        assert!(turn < 12, "no compaction");
    }
    // The first kept message (after the summary) is the user message of turn `kept`.
    let messages = server.get(&format!("/api/sessions/{id}")).json["session"]["messages"].clone();
    let kept = &messages[1];
    let kept_turn: usize = kept["content"].as_str().unwrap().split('w').next().unwrap()[1..].parse().unwrap();
    let rewound = server.post(&format!("/api/sessions/{id}/rewind"), json!({ "messageId": kept["id"] }));
    assert_eq!(rewound.status, 200, "{}", rewound.text);
    assert_eq!(rewound.json["restored"]["kind"], "auto", "{}", rewound.text);
    let expected = format!("v{}", kept_turn - 1);
    assert_eq!(std::fs::read_to_string(server.workspace.join("f.txt")).unwrap(), expected);
}
