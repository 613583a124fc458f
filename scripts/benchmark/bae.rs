//! The BAE client API: open a session, register as a driver, and run one `sendMessage` turn
//! against a fake Messages endpoint, sequentially and with 16 clients at once; beside it, the
//! fake endpoint's own latency for the same request, measured in the same run.
//!
//! `fake-messages` mode answers every POST at once with one small Messages answer.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use super::client::Connection;
use super::{row, Spawned};

const CONCURRENT: usize = 16;

const ANSWER: &str = r#"{"id":"msg_1","type":"message","role":"assistant","model":"fake","content":[{"type":"text","text":"It is noon."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":4}}"#;

/// The `fake-messages` mode: each answer at once, in turn on one thread (a thread per request
/// would cost the shared CPU more than the answer does).
pub fn fake_messages() {
    let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
    println!("fake messages listening on http://{}", server.server_addr().to_ip().unwrap());
    for mut request in server.incoming_requests() {
        let mut body = Vec::new();
        let _ = std::io::Read::read_to_end(request.as_reader(), &mut body);
        let header = tiny_http::Header::from_bytes("Content-Type", "application/json").unwrap();
        let _ = request.respond(tiny_http::Response::from_string(ANSWER).with_header(header));
    }
}

/// The BAE rows of the table.
pub fn rows(quick: bool) {
    let fake = Spawned::helper("fake-messages");
    let config = format!(
        "[providers.fake]\nwire = \"anthropic\"\nbase_url = \"http://{}/v1\"\nmodels = [{{ name = \"claude-x\" }}]\n",
        fake.host
    );
    let mut kestrel = Spawned::kestrel_with_config(&[], &config);
    let admin = kestrel.next_host();
    let key = client_key(&admin, &kestrel.data_dir());
    let turns = if quick { 100 } else { 400 };

    let provider = provider_latencies(&fake.host, turns);
    let sequential: Vec<(Duration, Duration)> = (0..turns).map(|_| one_turn(&kestrel.host, &key)).collect();
    let (mut opens, mut sends): (Vec<f64>, Vec<f64>) =
        sequential.iter().map(|(open, send)| (ms(*open), ms(*send))).unzip();
    let concurrent = concurrent_turns(&kestrel.host, &key, if quick { 1 } else { 2 });
    let fake_p50 = percentile(&mut provider.clone(), 0.5);

    let open_p50 = percentile(&mut opens, 0.5);
    let sessions_per_s = 1000.0 / (opens.iter().sum::<f64>() / opens.len() as f64);
    row("BAE open + registerDriver, sequential: p50", format!("{open_p50:.2} ms"), "≤ 3 ms".into(), open_p50 / 3.0);
    row("  sessions/s (open + registerDriver, one client)", format!("{sessions_per_s:.0} /s"), "-".into(), f64::NAN);
    let (p50, p99) = (percentile(&mut sends, 0.5), percentile(&mut sends, 0.99));
    row(
        "BAE sendMessage turn, sequential: p50",
        format!("{p50:.2} ms"),
        format!("{fake_p50:.2} ms fake"),
        p50 / fake_p50,
    );
    row("  p99", format!("{p99:.2} ms"), format!("{:.2} ms fake", percentile(&mut provider.clone(), 0.99)), f64::NAN);
    let turns_per_s = 1000.0 / (sends.iter().sum::<f64>() / sends.len() as f64);
    row("  turns/s (one client)", format!("{turns_per_s:.0} /s"), "-".into(), f64::NAN);
    let (mut latencies, elapsed) = concurrent;
    let rate = latencies.len() as f64 / elapsed.as_secs_f64();
    let (p50, p99) = (percentile(&mut latencies, 0.5), percentile(&mut latencies, 0.99));
    row(
        &format!("BAE sendMessage turn, {CONCURRENT} clients: p99"),
        format!("{p99:.2} ms"),
        "≤ 20 ms".into(),
        p99 / 20.0,
    );
    row(&format!("  p50, turns/s ({CONCURRENT} clients)"), format!("{p50:.2} ms, {rate:.0}/s"), "-".into(), f64::NAN);
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

fn percentile(values: &mut [f64], at: f64) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    let index = ((values.len() as f64 - 1.0) * at).round() as usize;
    values[index.min(values.len() - 1)]
}

/// A profile on the fake and a client key for it, through the admin API.
fn client_key(admin: &str, data_dir: &std::path::Path) -> String {
    let admin_key = std::fs::read_to_string(data_dir.join("admin-key")).unwrap().trim().to_string();
    let mut connection = Connection::open(admin).unwrap();
    let profile = br#"{"name":"bench","primary_provider":"fake","allowed_tools":[]}"#;
    let created = connection.request_as("POST", "/admin/v1/profiles", Some(&admin_key), profile).unwrap();
    let profile: serde_json::Value = serde_json::from_slice(&created.body).unwrap();
    let body = serde_json::json!({ "name": "bench", "profile_id": profile["id"] }).to_string();
    let key = connection.request_as("POST", "/admin/v1/keys", Some(&admin_key), body.as_bytes()).unwrap();
    let key: serde_json::Value = serde_json::from_slice(&key.body).unwrap();
    key["key"].as_str().unwrap().to_string()
}

/// One client's open + registerDriver, then one sendMessage turn to its terminal frame.
fn one_turn(host: &str, key: &str) -> (Duration, Duration) {
    let started = Instant::now();
    let mut connection = Connection::open(host).unwrap();
    let opened = connection.request_as("POST", "/api/v1/sessions", Some(key), b"{}").unwrap();
    assert_eq!(opened.status, 201, "{}", String::from_utf8_lossy(&opened.body));
    let opened: serde_json::Value = serde_json::from_slice(&opened.body).unwrap();
    let (session, session_key) = (opened["session_id"].as_str().unwrap(), opened["session_key"].as_str().unwrap());
    let rpc = format!("/api/v1/sessions/{session}/rpc");
    let register = br#"{"jsonrpc":"2.0","id":1,"method":"session.registerDriver","params":{}}"#;
    let registered = connection.request_as("POST", &rpc, Some(session_key), register).unwrap();
    assert!(String::from_utf8_lossy(&registered.body).contains("\"registered\":true"));
    let open = started.elapsed();
    let send = br#"{"jsonrpc":"2.0","id":2,"method":"session.sendMessage","params":{"message":{"content":"What time is it?"}}}"#;
    let started = Instant::now();
    // A turn's stream ends its connection.
    let answer = connection.request_as("POST", &rpc, Some(session_key), send).unwrap();
    let turn = started.elapsed();
    assert!(String::from_utf8_lossy(&answer.body).contains("It is noon."), "{}", String::from_utf8_lossy(&answer.body));
    (open, turn)
}

/// The fake's own answer time for the same kind of request, sequentially.
fn provider_latencies(host: &str, count: usize) -> Vec<f64> {
    let mut connection = Connection::open(host).unwrap();
    let body = br#"{"model":"claude-x","max_tokens":8192,"messages":[{"role":"user","content":[{"type":"text","text":"What time is it?"}]}]}"#;
    (0..count)
        .map(|_| {
            let started = Instant::now();
            let answer = connection.request("POST", "/v1/messages", body).unwrap();
            assert_eq!(answer.status, 200);
            ms(started.elapsed())
        })
        .collect()
}

/// `CONCURRENT` clients each opening sessions and running turns for `seconds`: every turn's
/// latency, and the time they all took.
fn concurrent_turns(host: &str, key: &str, seconds: u64) -> (Vec<f64>, Duration) {
    let barrier = Arc::new(Barrier::new(CONCURRENT + 1));
    let clients: Vec<_> = (0..CONCURRENT)
        .map(|_| {
            let (host, key, barrier) = (host.to_string(), key.to_string(), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                let until = Instant::now() + Duration::from_secs(seconds);
                let mut latencies = Vec::new();
                while Instant::now() < until {
                    latencies.push(ms(one_turn(&host, &key).1));
                }
                latencies
            })
        })
        .collect();
    barrier.wait();
    let started = Instant::now();
    let latencies = clients.into_iter().flat_map(|client| client.join().unwrap()).collect();
    (latencies, started.elapsed())
}
