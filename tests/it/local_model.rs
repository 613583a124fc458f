//! Opt-in (`KESTREL_LOCAL_MODEL=1`): a real small LLM on this machine's CPU, started by
//! `scripts/local-model` (SmolLM2-135M-Instruct under llama-cpp-python's OpenAI-compatible
//! server; the first run installs it, which takes minutes), answers a Kestrel session and a
//! BAE turn through an ordinary `openai` provider. Skipped, saying so, without the variable.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kestrel::config::{ModelConfig, ProviderConfig, Wire};
use serde_json::json;

use crate::bae::support::{Bae, Harness};
use crate::support::event_type;

const MODEL: &str = "local/smollm2-135m";

/// The model server, killed when the test ends.
struct LocalModel(Child);

impl Drop for LocalModel {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `scripts/local-model` on a free port and waits (up to 15 minutes, for a first
/// install) for its server to say it is listening.
fn start_local_model() -> (LocalModel, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/local-model"))
        .arg(port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("scripts/local-model runs");
    let stderr = child.stderr.take().unwrap();
    let (ready_tx, ready_rx) = crossbeam_channel::bounded(1);
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("Uvicorn running on") {
                let _ = ready_tx.send(());
            }
        }
    });
    let started = Instant::now();
    ready_rx.recv_timeout(Duration::from_secs(900)).expect("the local model server came up");
    eprintln!("local model ready after {:?}", started.elapsed());
    (LocalModel(child), port)
}

#[test]
fn a_real_local_model_answers_a_kestrel_session_and_a_bae_turn() {
    if std::env::var("KESTREL_LOCAL_MODEL").as_deref() != Ok("1") {
        eprintln!("skipped: set KESTREL_LOCAL_MODEL=1 to run a real local model (scripts/local-model)");
        return;
    }
    let (_model, port) = start_local_model();
    let bae = Bae::start_with(|config| {
        let mut provider = ProviderConfig::new(Wire::Openai, format!("http://127.0.0.1:{port}/v1"));
        provider.timeout_secs = 300;
        provider.idle_timeout_secs = 120;
        let model = ModelConfig { supports_tools: false, max_tokens: Some(48), ..ModelConfig::named("smollm2-135m") };
        provider.models = vec![model];
        config.providers.insert("local".into(), provider);
    });

    // A Kestrel session: a streamed, non-empty answer and a clean run.finished.
    let server = &bae.server;
    let id = server.create_session(json!({ "model": MODEL, "title": "local model" }));
    let started = Instant::now();
    let events = server.run_to_end(&id, "Say hello in one short sentence.");
    let took = started.elapsed();
    let end = events.last().unwrap();
    assert_eq!(event_type(end), "run.finished", "{end}");
    assert_eq!(end["event"]["status"], "completed");
    let streamed: String = events
        .iter()
        .filter(|e| event_type(e) == "message.delta" && e["event"]["channel"] == "text")
        .map(|e| e["event"]["delta"].as_str().unwrap())
        .collect();
    assert!(!streamed.trim().is_empty(), "no streamed text: {events:?}");
    let tokens = end["event"]["usage"]["outputTokens"].as_u64().unwrap_or(0);
    eprintln!("Kestrel run: {took:?}, {tokens} output tokens, {} deltas: {streamed:?}", events.len());

    // A BAE turn on the same model.
    let body = json!({ "name": "local", "primary_provider": MODEL, "allowed_tools": [] });
    let profile = bae.admin_send("POST", "/admin/v1/profiles", Some(body));
    assert_eq!(profile.status, 201, "{}", profile.text);
    let key = bae.client_key(profile.json["id"].as_str().unwrap()).1;
    let mut harness = Harness::open(bae.base(), &key, &[]);
    let started = Instant::now();
    let frames = harness.send_message(json!("Name one colour."));
    let terminal = frames.last().unwrap();
    let text = terminal["result"]["message"]["content"][0]["text"].as_str().unwrap_or_default();
    assert!(!text.trim().is_empty(), "no answer: {terminal}");
    eprintln!("BAE turn: {:?}: {text:?}", started.elapsed());
    let closed = harness.close();
    assert_eq!(closed.status, 200, "{}", closed.text);
}
