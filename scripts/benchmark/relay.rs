//! The provider relay: a stream going provider → Kestrel → SSE subscriber, beside the same
//! stream through a bare relay.
//!
//! `fake-provider` mode serves an OpenAI-style stream of `RELAY_DELTAS` small deltas as fast as
//! it can (64 KiB writes). `bare-relay` mode is the floor: on `GET /relay` it POSTs the same
//! request to the provider (`BARE_RELAY_PROVIDER`), reads the SSE, parses each chunk's JSON and
//! writes each delta to its client as an SSE frame shaped like Kestrel's, then a
//! `run.finished` frame: no store, no bus, no seq. The relay figure runs a Kestrel session on
//! the provider and waits for `run.finished` on the session's event stream.
//!
//! Time to first token: a provider in this process sends one delta and waits; the figure is
//! the time from its write of that delta to the subscriber's read of the delta frame, through
//! Kestrel and through the bare relay.

use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::client::{follow_stream, open_stream, read_chunk, read_head, Connection};
use super::{median, report, Spawned};

/// Time-to-first-token rounds.
const FIRST_TOKENS: usize = 200;

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

/// The relay rows: the whole stream, and the time to its first token.
pub fn rows() {
    let fake = Spawned::helper("fake-provider");
    let bare = Spawned::helper_with("bare-relay", &[("BARE_RELAY_PROVIDER", &fake.host)]);
    let kestrel = Spawned::kestrel_with_config(&[], &provider_config(&fake.host));
    let (mut floor, mut relay) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        floor.push(through_bare_relay(&bare.host).as_secs_f64() * 1000.0);
        relay.push(relay_once(&kestrel.host).as_secs_f64() * 1000.0);
    }
    drop((kestrel, bare, fake));
    report::vs_floor(
        &format!("{RELAY_DELTAS} provider deltas relayed to SSE (floor: a bare relay)"),
        median(&mut relay),
        "ms",
        median(&mut floor),
    );
    let (mut through_kestrel, mut through_bare) = first_tokens();
    let percentile = super::bae::percentile;
    let p99 = percentile(&mut through_kestrel, 0.99);
    report::vs_floor(
        "time to first token added (provider write → client read): p50",
        percentile(&mut through_kestrel, 0.5),
        "ms",
        percentile(&mut through_bare, 0.5),
    );
    report::vs_floor("  p99", p99, "ms", percentile(&mut through_bare, 0.99));
    report::vs_target("  p99, target", p99, "ms", 1.0, "< 1 ms");
}

fn provider_config(host: &str) -> String {
    format!(
        "[providers.fake]\nwire = \"openai\"\nbase_url = \"http://{host}/v1\"\n[[providers.fake.models]]\nname = \"fast\"\n"
    )
}

const REQUEST: &str = r#"{"model":"fast","stream":true,"messages":[{"role":"user","content":"go"}]}"#;

/// `GET /relay` on the bare relay: the time until its `run.finished` frame.
fn through_bare_relay(host: &str) -> Duration {
    let started = Instant::now();
    let reader = open_stream(host, "/relay", None).unwrap();
    let outcome = follow_stream(host, "/relay", reader, "\"run.finished\"");
    assert!(outcome.finished && outcome.events as usize > RELAY_DELTAS, "the bare relay fell short");
    started.elapsed()
}

/// The `bare-relay` mode.
pub fn bare_relay() {
    let provider = std::env::var("BARE_RELAY_PROVIDER").expect("BARE_RELAY_PROVIDER");
    let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
    println!("bare relay listening on http://{}", server.server_addr().to_ip().unwrap());
    for request in server.incoming_requests() {
        let provider = provider.clone();
        std::thread::spawn(move || {
            let mut client = std::io::BufWriter::with_capacity(64 * 1024, request.into_writer());
            let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
            let _ = client.write_all(head.as_bytes()).and_then(|_| client.flush());
            let _ = relay_to(&provider, &mut client);
        });
    }
}

/// Reads the provider's stream and writes its deltas to `client`, a chunk of SSE frames for
/// each chunk read.
fn relay_to(provider: &str, client: &mut impl Write) -> std::io::Result<()> {
    let mut upstream = TcpStream::connect(provider)?;
    upstream.set_nodelay(true)?;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {provider}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{REQUEST}",
        REQUEST.len()
    );
    upstream.write_all(head.as_bytes())?;
    let mut reader = BufReader::with_capacity(64 * 1024, upstream);
    read_head(&mut reader)?;
    let (mut seq, mut pending, mut frames) = (0u64, String::new(), String::new());
    while let Some(chunk) = read_chunk(&mut reader)? {
        pending.push_str(&String::from_utf8_lossy(&chunk));
        let mut start = 0;
        while let Some(end) = pending[start..].find("\n\n") {
            let event = &pending[start..start + end];
            start += end + 2;
            let Some(data) = event.strip_prefix("data: ").filter(|data| *data != "[DONE]") else { continue };
            let parsed: serde_json::Value = serde_json::from_str(data).map_err(std::io::Error::other)?;
            let Some(delta) = parsed["choices"][0]["delta"]["content"].as_str() else { continue };
            seq += 1;
            let frame = serde_json::json!({
                "seq": seq,
                "at": "2026-01-01T00:00:00.000Z",
                "event": {
                    "type": "message.delta",
                    "sessionId": "ses_0123456789abcdef0123456789abcdef",
                    "messageId": "msg_0123456789abcdef0123456789abcdef",
                    "channel": "text",
                    "delta": delta,
                },
            });
            frames.push_str(&format!("id: {seq}\ndata: {frame}\n\n"));
        }
        pending.drain(..start);
        send_frames(&mut frames, client)?;
    }
    frames.push_str(&format!("id: {}\ndata: {{\"event\":{{\"type\":\"run.finished\"}}}}\n\n", seq + 1));
    send_frames(&mut frames, client)?;
    client.write_all(b"0\r\n\r\n")?;
    client.flush()
}

fn send_frames(frames: &mut String, client: &mut impl Write) -> std::io::Result<()> {
    if !frames.is_empty() {
        write!(client, "{:x}\r\n{frames}\r\n", frames.len())?;
        client.flush()?;
        frames.clear();
    }
    Ok(())
}

/// The first-token figures, in milliseconds: (through Kestrel, through the bare relay).
fn first_tokens() -> (Vec<f64>, Vec<f64>) {
    let (provider, sent, finish) = slow_provider();
    let kestrel = Spawned::kestrel_with_config(&[], &provider_config(&provider));
    let bare = Spawned::helper_with("bare-relay", &[("BARE_RELAY_PROVIDER", &provider)]);
    let mut connection = Connection::open(&kestrel.host).unwrap();
    let created = connection.request("POST", "/api/sessions", br#"{"model":"fake/fast"}"#).unwrap();
    let created: serde_json::Value = serde_json::from_slice(&created.body).unwrap();
    let session = created["session"]["id"].as_str().unwrap().to_string();
    let mut events = open_stream(&kestrel.host, &format!("/api/sessions/{session}/events"), None).unwrap();
    let (mut through_kestrel, mut through_bare) = (Vec::new(), Vec::new());
    let added = |read: Instant| {
        let sent_at = sent.recv_timeout(Duration::from_secs(10)).expect("the provider sent its first delta");
        read.saturating_duration_since(sent_at).as_secs_f64() * 1000.0
    };
    for _ in 0..FIRST_TOKENS {
        let path = format!("/api/sessions/{session}/messages");
        assert_eq!(connection.request("POST", &path, br#"{"content":"go"}"#).unwrap().status, 202);
        through_kestrel.push(added(read_until(&mut events, "\"message.delta\"")));
        finish.send(()).unwrap();
        read_until(&mut events, "\"run.finished\"");

        let mut relayed = open_stream(&bare.host, "/relay", None).unwrap();
        through_bare.push(added(read_until(&mut relayed, "\"message.delta\"")));
        finish.send(()).unwrap();
        read_until(&mut relayed, "\"run.finished\"");
    }
    (through_kestrel, through_bare)
}

/// Reads a stream until a chunk holds `needle`: when that chunk arrived.
fn read_until(reader: &mut BufReader<TcpStream>, needle: &str) -> Instant {
    loop {
        let chunk = read_chunk(reader).unwrap().expect("the stream goes on");
        let at = Instant::now();
        if String::from_utf8_lossy(&chunk).contains(needle) {
            return at;
        }
    }
}

/// An OpenAI-style provider in this process: each answer sends one delta, says when on
/// `sent`, and finishes once told on `finish`. Its sockets are `TCP_NODELAY`, as real
/// providers' front servers set them (else Nagle holds the delta for the reader's delayed
/// ACK). Its address and the two channels.
fn slow_provider() -> (String, crossbeam_channel::Receiver<Instant>, crossbeam_channel::Sender<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let (sent_tx, sent) = crossbeam_channel::unbounded();
    let (finish, finish_rx) = crossbeam_channel::unbounded::<()>();
    std::thread::spawn(move || {
        for socket in listener.incoming().flatten() {
            let (sent_tx, finish_rx) = (sent_tx.clone(), finish_rx.clone());
            std::thread::spawn(move || answer_slowly(socket, &sent_tx, &finish_rx));
        }
    });
    (host, sent, finish)
}

/// Every request on one connection (clients keep it alive), answered as `slow_provider` says.
fn answer_slowly(
    socket: TcpStream,
    sent: &crossbeam_channel::Sender<Instant>,
    finish: &crossbeam_channel::Receiver<()>,
) {
    socket.set_nodelay(true).unwrap();
    let mut writer = socket.try_clone().unwrap();
    let mut reader = BufReader::new(socket);
    let chunk = |text: &str| format!("{:x}\r\n{text}\r\n", text.len());
    let data = |delta: &str, finish: &str| {
        format!("data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"fast\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n")
    };
    while let Ok((_, headers)) = read_head(&mut reader) {
        let length =
            headers.iter().find(|(name, _)| name == "content-length").and_then(|(_, v)| v.parse().ok()).unwrap_or(0);
        let mut body = vec![0; length];
        if std::io::Read::read_exact(&mut reader, &mut body).is_err() {
            return;
        }
        let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
        let first = chunk(&data(r#"{"content":"first"}"#, "null"));
        if writer.write_all(head.as_bytes()).and_then(|_| writer.write_all(first.as_bytes())).is_err() {
            return;
        }
        let _ = sent.send(Instant::now());
        let _ = finish.recv_timeout(Duration::from_secs(10));
        let last = chunk(&(data("{}", "\"stop\"") + "data: [DONE]\n\n")) + "0\r\n\r\n";
        if writer.write_all(last.as_bytes()).is_err() {
            return;
        }
    }
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
