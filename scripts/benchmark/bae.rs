//! The BAE client API: open a session, register as a driver, and run one `sendMessage` turn
//! against a fake Messages endpoint, sequentially and with 16 clients at once; beside it, the
//! fake endpoint's own latency for the same request, measured in the same run.
//!
//! `fake-messages` mode answers every POST at once with one small Messages answer.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use super::client::Connection;
use super::{report, Spawned};

/// The client counts of the concurrent rows: 16 is held to a target, 64 is reported.
const CONCURRENT: [usize; 2] = [16, 64];

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

/// A config whose provider `fake` is the fake Messages API at `host`.
pub fn fake_provider_config(host: &str) -> String {
    format!("[providers.fake]\nwire = \"anthropic\"\nbase_url = \"http://{host}/v1\"\nmodels = [{{ name = \"claude-x\" }}]\n")
}

/// The BAE rows of the table.
pub fn rows(quick: bool) {
    let fake = Spawned::helper("fake-messages");
    let mut kestrel = Spawned::kestrel_with_config(&[], &fake_provider_config(&fake.host));
    let admin = kestrel.next_host();
    let key = client_key(&admin, &kestrel.data_dir());
    let turns = if quick { 100 } else { 400 };

    let provider = provider_latencies(&fake.host, turns);
    let sequential: Vec<(Duration, Duration)> = (0..turns).map(|_| one_turn(&kestrel.host, &key)).collect();
    let (mut opens, mut sends): (Vec<f64>, Vec<f64>) =
        sequential.iter().map(|(open, send)| (ms(*open), ms(*send))).unzip();
    let fake_p50 = percentile(&mut provider.clone(), 0.5);

    let open_p50 = percentile(&mut opens, 0.5);
    let sessions_per_s = 1000.0 / (opens.iter().sum::<f64>() / opens.len() as f64);
    report::vs_target("BAE open + registerDriver, sequential: p50", open_p50, "ms", 3.0, "≤ 3 ms");
    report::info("  sessions/s (open + registerDriver, one client)", sessions_per_s, "/s");
    let (p50, p99) = (percentile(&mut sends, 0.5), percentile(&mut sends, 0.99));
    report::vs_floor("BAE sendMessage turn, sequential: p50 (floor: the fake alone)", p50, "ms", fake_p50);
    report::vs_floor("  p99 (floor: the fake alone)", p99, "ms", percentile(&mut provider.clone(), 0.99));
    let turns_per_s = 1000.0 / (sends.iter().sum::<f64>() / sends.len() as f64);
    report::info("  turns/s (one client)", turns_per_s, "/s");
    for clients in CONCURRENT {
        let (mut latencies, elapsed, errors) =
            concurrent_turns(&kestrel.host, &key, clients, if quick { 1 } else { 2 });
        let rate = latencies.len() as f64 / elapsed.as_secs_f64();
        let (p50, p99) = (percentile(&mut latencies, 0.5), percentile(&mut latencies, 0.99));
        match clients {
            16 => {
                report::vs_target(&format!("BAE sendMessage turn, {clients} clients: p99"), p99, "ms", 20.0, "≤ 20 ms")
            }
            _ => report::info(&format!("BAE sendMessage turn, {clients} clients: p99"), p99, "ms"),
        }
        report::info(&format!("  p50 ({clients} clients)"), p50, "ms");
        report::info(&format!("  turns/s ({clients} clients)"), rate, "/s");
        report::vs_target(&format!("  turns that failed ({clients} clients)"), errors as f64, "", 1.0, "0");
    }
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

pub fn percentile(values: &mut [f64], at: f64) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    let index = ((values.len() as f64 - 1.0) * at).round() as usize;
    values[index.min(values.len() - 1)]
}

/// A profile on the fake and a client key for it, through the admin API.
pub fn client_key(admin: &str, data_dir: &std::path::Path) -> String {
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

/// A session opened with `key` on `connection`'s server and registered as a driver: its id and
/// its session key.
pub fn open_registered(connection: &mut Connection, key: &str) -> (String, String) {
    let opened = connection.request_as("POST", "/api/v1/sessions", Some(key), b"{}").unwrap();
    assert_eq!(opened.status, 201, "{}", String::from_utf8_lossy(&opened.body));
    let opened: serde_json::Value = serde_json::from_slice(&opened.body).unwrap();
    let (session, session_key) =
        (opened["session_id"].as_str().unwrap().to_string(), opened["session_key"].as_str().unwrap().to_string());
    let register = br#"{"jsonrpc":"2.0","id":1,"method":"session.registerDriver","params":{}}"#;
    let registered =
        connection.request_as("POST", &format!("/api/v1/sessions/{session}/rpc"), Some(&session_key), register);
    assert!(String::from_utf8_lossy(&registered.unwrap().body).contains("\"registered\":true"));
    (session, session_key)
}

/// One client's open + registerDriver, then one sendMessage turn to its terminal frame.
pub fn one_turn(host: &str, key: &str) -> (Duration, Duration) {
    let started = Instant::now();
    let mut connection = Connection::open(host).unwrap();
    let (session, session_key) = open_registered(&mut connection, key);
    let (rpc, session_key) = (format!("/api/v1/sessions/{session}/rpc"), session_key.as_str());
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

/// `clients` clients each opening sessions and running turns for `seconds`: every turn's
/// latency, the time they all took, and how many turns failed.
fn concurrent_turns(host: &str, key: &str, clients: usize, seconds: u64) -> (Vec<f64>, Duration, usize) {
    let barrier = Arc::new(Barrier::new(clients + 1));
    let clients: Vec<_> = (0..clients)
        .map(|_| {
            let (host, key, barrier) = (host.to_string(), key.to_string(), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                let until = Instant::now() + Duration::from_secs(seconds);
                let (mut latencies, mut failed) = (Vec::new(), 0);
                while Instant::now() < until {
                    match std::panic::catch_unwind(|| one_turn(&host, &key)) {
                        Ok((_, turn)) => latencies.push(ms(turn)),
                        Err(_) => failed += 1,
                    }
                }
                (latencies, failed)
            })
        })
        .collect();
    barrier.wait();
    let started = Instant::now();
    let (mut latencies, mut failed) = (Vec::new(), 0);
    for client in clients {
        let (mine, lost) = client.join().unwrap();
        latencies.extend(mine);
        failed += lost;
    }
    (latencies, started.elapsed(), failed)
}
