//! The provider relay: how much slower a stream is when it goes provider → Kestrel → SSE
//! subscriber than when a client reads it straight from the provider.
//!
//! `fake-provider` mode serves an OpenAI-style stream of `RELAY_DELTAS` small deltas as fast as
//! it can (64 KiB writes). The direct figure POSTs the same request to it and reads the whole
//! body; the relay figure runs a Kestrel session on it and waits for `run.finished` on the
//! session's event stream.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::client::{follow_stream, open_stream, Connection};
use super::{median, Spawned};

pub const RELAY_DELTAS: usize = 20_000;

/// The body every request to the fake provider gets.
fn stream_body() -> String {
    let mut body = String::with_capacity(RELAY_DELTAS * 160);
    for i in 0..RELAY_DELTAS {
        let piece = if i == 0 { "w" } else { " w" };
        body.push_str(&format!(
            "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"fast\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{piece}\"}},\"finish_reason\":null}}]}}\n\n"
        ));
    }
    body.push_str("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"fast\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n");
    body.push_str("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"fast\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":20000,\"total_tokens\":20010}}\n\n");
    body.push_str("data: [DONE]\n\n");
    body
}

/// The `fake-provider` mode: answers every request with the stream, as fast as it can.
pub fn fake_provider() {
    let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
    println!("fake provider listening on http://{}", server.server_addr().to_ip().unwrap());
    let body: Arc<str> = Arc::from(stream_body());
    for mut request in server.incoming_requests() {
        let body = Arc::clone(&body);
        std::thread::spawn(move || {
            let _ = std::io::copy(request.as_reader(), &mut std::io::sink());
            let mut socket = request.into_writer();
            let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
            let _ = socket.write_all(head.as_bytes());
            for piece in body.as_bytes().chunks(64 * 1024) {
                let chunk = [format!("{:x}\r\n", piece.len()).as_bytes(), piece, b"\r\n"].concat();
                if socket.write_all(&chunk).is_err() {
                    return;
                }
            }
            let _ = socket.write_all(b"0\r\n\r\n").and_then(|_| socket.flush());
        });
    }
}

/// Medians of three: (direct read, relay to an SSE subscriber).
pub fn measure() -> (Duration, Duration) {
    let fake = Spawned::helper("fake-provider");
    let config = format!(
        "[providers.fake]\nwire = \"openai\"\nbase_url = \"http://{}/v1\"\n[[providers.fake.models]]\nname = \"fast\"\n",
        fake.host
    );
    let kestrel = Spawned::kestrel_with_config(&[], &config);
    let mut direct = Vec::new();
    let mut relay = Vec::new();
    for _ in 0..3 {
        direct.push(read_directly(&fake.host).as_secs_f64());
        relay.push(relay_once(&kestrel.host).as_secs_f64());
    }
    (Duration::from_secs_f64(median(&mut direct)), Duration::from_secs_f64(median(&mut relay)))
}

fn read_directly(host: &str) -> Duration {
    let body = r#"{"model":"fast","stream":true,"messages":[{"role":"user","content":"go"}]}"#;
    let started = Instant::now();
    let response = Connection::open(host).unwrap().request("POST", "/v1/chat/completions", body.as_bytes()).unwrap();
    let elapsed = started.elapsed();
    assert_eq!(response.status, 200);
    assert!(response.body.ends_with(b"data: [DONE]\n\n"));
    elapsed
}

fn relay_once(host: &str) -> Duration {
    let mut connection = Connection::open(host).unwrap();
    let created = connection.request("POST", "/api/sessions", br#"{"model":"fake/fast"}"#).unwrap();
    assert_eq!(created.status, 201);
    let created: serde_json::Value = serde_json::from_slice(&created.body).unwrap();
    let session = created["session"]["id"].as_str().unwrap().to_string();
    let path = format!("/api/sessions/{session}/events");
    let body = serde_json::json!({ "content": "go" }).to_string();
    let reader = open_stream(host, &path, None).unwrap();
    let started = Instant::now();
    let response = connection.request("POST", &format!("/api/sessions/{session}/messages"), body.as_bytes()).unwrap();
    assert_eq!(response.status, 202);
    let outcome = follow_stream(host, &path, reader, "\"run.finished\"");
    assert!(outcome.finished, "the relay never finished");
    started.elapsed()
}
