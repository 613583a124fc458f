//! Webhook deliveries under a hostile tenant (issue 35, finding 7): one tenant's endpoints
//! that accept and never answer hold at most their tenant's share of the senders and one
//! sender each, so another tenant's deliveries arrive at once; and an attempt ends at
//! `timeout_ms` however slowly an endpoint drips its answer.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{unbounded, Receiver};
use kestrel::config::TokenConfig;
use serde_json::{json, Value};

use crate::support::{wait_until, TestServer, WAIT};

/// A request's path, and its body (read by its `Content-Length`).
fn read_request(stream: &TcpStream) -> Option<(String, Vec<u8>)> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let path = line.split_whitespace().nth(1)?.to_string();
    let mut length = 0;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).ok()? == 0 {
            return None;
        }
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((path, body))
}

#[derive(Default)]
struct Held {
    /// Connections open now, by request path, and the most ever open at once (in all, and
    /// on one path).
    open: HashMap<String, usize>,
    most: usize,
    most_on_one_path: usize,
    sockets: Vec<TcpStream>,
    /// Dropped: every connection is closed at once.
    closed: bool,
}

/// An endpoint that reads each request and never answers, until it is dropped.
struct Hanging {
    port: u16,
    held: Arc<Mutex<Held>>,
}

impl Hanging {
    fn start() -> Hanging {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let held = Arc::new(Mutex::new(Held::default()));
        let shared = Arc::clone(&held);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let held = Arc::clone(&shared);
                std::thread::spawn(move || {
                    let Some((path, _)) = read_request(&stream) else { return };
                    {
                        let mut held = held.lock().unwrap();
                        if held.closed {
                            let _ = stream.shutdown(Shutdown::Both);
                            return;
                        }
                        held.sockets.push(stream.try_clone().unwrap());
                        let on_path = {
                            let count = held.open.entry(path.clone()).or_insert(0);
                            *count += 1;
                            *count
                        };
                        let open: usize = held.open.values().sum();
                        held.most = held.most.max(open);
                        held.most_on_one_path = held.most_on_one_path.max(on_path);
                    }
                    // Held until the sender gives up or the endpoint is dropped.
                    let _ = (&stream).read_to_end(&mut Vec::new());
                    *held.lock().unwrap().open.get_mut(&path).unwrap() -= 1;
                });
            }
        });
        Hanging { port, held }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn open_now(&self) -> usize {
        self.held.lock().unwrap().open.values().sum()
    }
}

impl Drop for Hanging {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap();
        held.closed = true;
        for socket in held.sockets.drain(..) {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }
}

/// An endpoint that answers 200 at once and hands over each body it got.
struct Prompt {
    port: u16,
    bodies: Receiver<Value>,
}

impl Prompt {
    fn start() -> Prompt {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (sender, bodies) = unbounded();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let Some((_, body)) = read_request(&stream) else { continue };
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                if sender.send(serde_json::from_slice(&body).unwrap_or(Value::Null)).is_err() {
                    return;
                }
            }
        });
        Prompt { port, bodies }
    }
}

/// An endpoint that sends its answer a byte at a time, every 100 ms: its head (`/head`) or,
/// after a whole head, its body (`/body`).
fn dripping() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                let Some((path, _)) = read_request(&stream) else { return };
                let start: &[u8] = match path.as_str() {
                    "/head" => b"HTTP/1.1 200 OK\r\nX-Drip: ",
                    _ => b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n",
                };
                let mut sent = stream.write_all(start).is_ok();
                for _ in 0..1200 {
                    if !sent {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                    sent = stream.write_all(b"a").and_then(|_| stream.flush()).is_ok();
                }
            });
        }
    });
    port
}

fn create_webhook(client: &crate::support::Client, url: &str) -> String {
    let created = client.post("/api/webhooks", json!({ "url": url, "events": ["session.created"] }));
    assert_eq!(created.status, 201, "{}", created.text);
    created.json["webhook"]["id"].as_str().unwrap().to_string()
}

#[test]
fn forty_hanging_endpoints_of_one_tenant_do_not_delay_another_tenant_s_deliveries() {
    let server = TestServer::start_with(|config| {
        config.webhooks.allow_private_targets = true;
        // Far longer than the test waits for anything: no attempt of A's ends meanwhile.
        config.webhooks.timeout_ms = 300_000;
        config.auth.tokens = vec![TokenConfig::new("a", "token-a"), TokenConfig::new("b", "token-b")];
    });
    // Dropped before the server, so the senders A's endpoints hold are let go.
    let hanging = Hanging::start();
    let prompt = Prompt::start();
    let a = server.client().with_token(Some("token-a"));
    let b = server.client().with_token(Some("token-b"));
    let a_hooks: Vec<String> = (0..40).map(|i| create_webhook(&a, &hanging.url(&format!("/a/{i}")))).collect();
    // Three events of A's: 120 deliveries, three for each endpoint.
    for _ in 0..3 {
        assert_eq!(a.post("/api/sessions", json!({})).status, 201);
    }
    wait_until("A's endpoints hold senders", || hanging.open_now() >= 2);

    create_webhook(&b, &format!("http://127.0.0.1:{}/b", prompt.port));
    let created = b.post("/api/sessions", json!({}));
    assert_eq!(created.status, 201, "{}", created.text);
    let session = created.json["session"]["id"].clone();
    let delivered = prompt.bodies.recv_timeout(WAIT).expect("B's delivery arrives while A's endpoints hang");
    assert_eq!((&delivered["type"], &delivered["data"]["sessionId"]), (&json!("session.created"), &session));

    // None of A's attempts ended (none timed out): B's came first.
    for hook in &a_hooks {
        let deliveries = a.get(&format!("/api/webhooks/{hook}/deliveries")).json["deliveries"].clone();
        for delivery in deliveries.as_array().unwrap() {
            assert_eq!(delivery["attempts"], json!([]), "{delivery}");
        }
    }
    let held = hanging.held.lock().unwrap();
    assert!(held.most <= 2, "A held {} of the 4 senders; its share is 2", held.most);
    assert_eq!(held.most_on_one_path, 1, "one delivery at a time per endpoint");
}

#[test]
fn an_attempt_ends_at_its_timeout_however_slowly_the_endpoint_drips() {
    let server = TestServer::start_with(|config| {
        config.webhooks.allow_private_targets = true;
        config.webhooks.timeout_ms = 1_000;
    });
    let port = dripping();
    let client = server.client();
    let head = create_webhook(&client, &format!("http://127.0.0.1:{port}/head"));
    let body = create_webhook(&client, &format!("http://127.0.0.1:{port}/body"));
    server.create_session(json!({}));
    // Each drip would last two minutes; the attempts end at their one-second timeout.
    let attempt = |hook: &str| {
        let deliveries = client.get(&format!("/api/webhooks/{hook}/deliveries")).json["deliveries"].clone();
        deliveries[0]["attempts"][0].clone()
    };
    wait_until("both attempts are recorded", || !attempt(&head).is_null() && !attempt(&body).is_null());
    let (head, body) = (attempt(&head), attempt(&body));
    assert!(head["error"].as_str().unwrap().contains("timed out"), "{head}");
    for attempt in [&head, &body] {
        let latency = attempt["latencyMs"].as_u64().unwrap();
        assert!(latency < WAIT.as_millis() as u64, "{attempt}");
    }
}
