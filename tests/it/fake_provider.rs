//! A fake LLM provider at the network edge: its own tiny_http server on an ephemeral port,
//! speaking the OpenAI Chat Completions and Anthropic Messages streaming formats as the vendors
//! document them. Each request takes the next scripted reply; every request is recorded so
//! tests can assert on what Kestrel sent.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// How a reply's bytes go out.
#[derive(Clone)]
pub enum Step {
    /// One write (one HTTP chunk), flushed.
    Write(Vec<u8>),
    Sleep(Duration),
    /// Send nothing more until the client goes away or the fake stops.
    Stall,
}

#[derive(Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub steps: Vec<Step>,
}

impl Reply {
    /// A 200 event stream sent as `pieces` writes of roughly equal size.
    pub fn stream(body: &[u8], pieces: usize) -> Reply {
        let size = body.len().div_ceil(pieces.max(1)).max(1);
        let steps = body.chunks(size).map(|piece| Step::Write(piece.to_vec())).collect();
        Reply { status: 200, headers: Vec::new(), steps }
    }

    /// A 200 event stream written one byte at a time: every line, CRLF and UTF-8 character is
    /// split across reads.
    pub fn byte_by_byte(body: &[u8]) -> Reply {
        Reply::stream(body, body.len())
    }

    /// A whole (non-streamed) JSON answer.
    pub fn json(status: u16, body: &Value) -> Reply {
        let steps = vec![Step::Write(body.to_string().into_bytes())];
        Reply { status, headers: vec![("Content-Type".into(), "application/json".into())], steps }
    }

    /// An error answer with a JSON body in the vendors' `{"error": {...}}` shape.
    pub fn error(status: u16, message: &str) -> Reply {
        let body = json!({ "error": { "type": "api_error", "message": message } }).to_string();
        Reply { status, headers: Vec::new(), steps: vec![Step::Write(body.into_bytes())] }
    }

    pub fn with_header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn then(mut self, step: Step) -> Reply {
        self.steps.push(step);
        self
    }
}

/// A request the fake received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

pub struct FakeProvider {
    pub base_url: String,
    script: Arc<Mutex<VecDeque<Reply>>>,
    /// What was received, and a signal for each arrival.
    requests: Arc<(Mutex<Vec<Recorded>>, std::sync::Condvar)>,
    stopping: Arc<AtomicBool>,
    server: Arc<tiny_http::Server>,
}

impl FakeProvider {
    pub fn start() -> FakeProvider {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").unwrap());
        let base_url = format!("http://{}/v1", server.server_addr().to_ip().unwrap());
        let fake = FakeProvider {
            base_url,
            script: Arc::default(),
            requests: Arc::default(),
            stopping: Arc::default(),
            server: Arc::clone(&server),
        };
        let (script, requests, stopping) =
            (Arc::clone(&fake.script), Arc::clone(&fake.requests), Arc::clone(&fake.stopping));
        std::thread::spawn(move || {
            for mut request in server.incoming_requests() {
                let mut body = String::new();
                let _ = request.as_reader().read_to_string(&mut body);
                let recorded = Recorded {
                    path: request.url().to_string(),
                    headers: request.headers().iter().map(|h| (h.field.to_string(), h.value.to_string())).collect(),
                    body: serde_json::from_str(&body).unwrap_or(Value::Null),
                };
                requests.0.lock().unwrap().push(recorded);
                requests.1.notify_all();
                let reply = script
                    .lock()
                    .unwrap()
                    .pop_front()
                    .unwrap_or_else(|| Reply::error(500, "the fake has no reply scripted"));
                let stopping = Arc::clone(&stopping);
                std::thread::spawn(move || send(request, reply, &stopping));
            }
        });
        fake
    }

    /// Queues replies for the next requests, in order.
    pub fn script(&self, replies: impl IntoIterator<Item = Reply>) {
        self.script.lock().unwrap().extend(replies);
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.0.lock().unwrap().clone()
    }

    /// Waits until `count` requests have arrived; fails the test after `WAIT`.
    pub fn wait_for_requests(&self, count: usize) {
        let (requests, arrived) = &*self.requests;
        let received = requests.lock().unwrap();
        let (received, timeout) =
            arrived.wait_timeout_while(received, crate::support::WAIT, |received| received.len() < count).unwrap();
        assert!(!timeout.timed_out(), "the fake got {} requests, not {count}", received.len());
    }
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::Relaxed);
        self.server.unblock();
    }
}

fn send(request: tiny_http::Request, reply: Reply, stopping: &AtomicBool) {
    let mut socket = request.into_writer();
    let reason = match reply.status {
        200 => "OK",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        _ => "Status",
    };
    let given = reply.headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("content-type"));
    let content_type = match (given, reply.status) {
        (true, _) => String::new(),
        (false, 200) => "Content-Type: text/event-stream\r\n".to_string(),
        (false, _) => "Content-Type: application/json\r\n".to_string(),
    };
    let mut head = format!("HTTP/1.1 {} {reason}\r\n{content_type}Transfer-Encoding: chunked\r\n", reply.status);
    for (name, value) in &reply.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    if socket.write_all(head.as_bytes()).and_then(|_| socket.flush()).is_err() {
        return;
    }
    for step in reply.steps {
        match step {
            Step::Write(bytes) => {
                let chunk = [format!("{:x}\r\n", bytes.len()).into_bytes(), bytes, b"\r\n".to_vec()].concat();
                if socket.write_all(&chunk).and_then(|_| socket.flush()).is_err() {
                    return;
                }
            }
            Step::Sleep(duration) => std::thread::sleep(duration),
            Step::Stall => {
                let until = Instant::now() + Duration::from_secs(30);
                while !stopping.load(Ordering::Relaxed) && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(20));
                }
                return;
            }
        }
    }
    let _ = socket.write_all(b"0\r\n\r\n").and_then(|_| socket.flush());
}

/// Builders for the vendors' streams, event by event, exactly as documented.
pub mod openai {
    use serde_json::{json, Value};

    pub fn frame(chunk: Value) -> String {
        format!("data: {chunk}\n\n")
    }

    pub fn chunk(delta: Value, finish_reason: Option<&str>) -> String {
        frame(json!({
            "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "fake",
            "choices": [{ "index": 0, "delta": delta, "finish_reason": finish_reason }],
        }))
    }

    pub fn usage(prompt: u64, completion: u64, cached: u64, reasoning: u64) -> String {
        frame(json!({
            "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "fake", "choices": [],
            "usage": {
                "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": { "cached_tokens": cached },
                "completion_tokens_details": { "reasoning_tokens": reasoning },
            },
        }))
    }

    pub const DONE: &str = "data: [DONE]\n\n";

    /// Reasoning pieces, then text pieces, then a stop and usage.
    pub fn text(reasoning: &[&str], text: &[&str], usage_chunk: &str) -> String {
        let mut body = chunk(json!({ "role": "assistant", "content": "" }), None);
        for piece in reasoning {
            body.push_str(&chunk(json!({ "reasoning_content": piece }), None));
        }
        for piece in text {
            body.push_str(&chunk(json!({ "content": piece }), None));
        }
        body.push_str(&chunk(json!({}), Some("stop")));
        body.push_str(usage_chunk);
        body.push_str(DONE);
        body
    }
}

pub mod anthropic {
    use serde_json::{json, Value};

    /// A whole Messages answer (what a non-streamed request gets).
    pub fn answer(content: Value, stop_reason: &str, input: u64, output: u64) -> super::Reply {
        super::Reply::json(
            200,
            &json!({
                "id": "msg_1", "type": "message", "role": "assistant", "model": "fake", "content": content,
                "stop_reason": stop_reason, "stop_sequence": null,
                "usage": { "input_tokens": input, "output_tokens": output },
            }),
        )
    }

    /// A whole Messages answer of one text block.
    pub fn text_answer(text: &str) -> super::Reply {
        answer(json!([{ "type": "text", "text": text }]), "end_turn", 10, 5)
    }

    /// A whole Messages answer calling one tool.
    pub fn tool_answer(id: &str, name: &str, input: Value) -> super::Reply {
        answer(json!([{ "type": "tool_use", "id": id, "name": name, "input": input }]), "tool_use", 10, 5)
    }

    pub fn event(name: &str, data: Value) -> String {
        format!("event: {name}\r\ndata: {data}\r\n\r\n")
    }

    pub fn message_start(input: u64, cache_read: u64, cache_creation: u64) -> String {
        event(
            "message_start",
            json!({ "type": "message_start", "message": {
                "id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "fake",
                "stop_reason": null, "stop_sequence": null,
                "usage": { "input_tokens": input, "cache_read_input_tokens": cache_read,
                           "cache_creation_input_tokens": cache_creation, "output_tokens": 1 },
            }}),
        )
    }

    pub fn block_start(index: u64, block: Value) -> String {
        event("content_block_start", json!({ "type": "content_block_start", "index": index, "content_block": block }))
    }

    pub fn block_delta(index: u64, delta: Value) -> String {
        event("content_block_delta", json!({ "type": "content_block_delta", "index": index, "delta": delta }))
    }

    pub fn block_stop(index: u64) -> String {
        event("content_block_stop", json!({ "type": "content_block_stop", "index": index }))
    }

    pub fn message_end(stop_reason: &str, output: u64) -> String {
        event(
            "message_delta",
            json!({ "type": "message_delta",
            "delta": { "stop_reason": stop_reason, "stop_sequence": null }, "usage": { "output_tokens": output } }),
        ) + &event("message_stop", json!({ "type": "message_stop" }))
    }

    pub fn ping() -> String {
        event("ping", json!({ "type": "ping" }))
    }

    pub fn text(index: u64, pieces: &[&str]) -> String {
        let mut body = block_start(index, json!({ "type": "text", "text": "" }));
        for piece in pieces {
            body.push_str(&block_delta(index, json!({ "type": "text_delta", "text": piece })));
        }
        body + &block_stop(index)
    }
}
