//! The HTTP edge's shared pieces: a listener per front door, and streamed replies in SSE or
//! NDJSON framing.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};

use crossbeam_channel::{unbounded, Sender};
use kestrel::http::{EdgeError, Framing, HttpConfig, HttpServer, JsonLines, Reply, Request, Stream};
use serde_json::{json, Value};

use crate::support::WAIT;

/// A front door that streams the lines it is handed, as NDJSON.
struct Lines {
    /// Where the next stream's sender goes, so the test decides what it says.
    senders: Mutex<Vec<Sender<Value>>>,
}

/// A front door that says which door it is.
struct Door(&'static str);

fn json_reply(status: u16, value: Value) -> Reply {
    Reply::Json { status, body: value.to_string().into_bytes(), headers: Vec::new() }
}

impl kestrel::http::Handler for Lines {
    fn handle(&self, _request: &mut Request) -> Reply {
        let (sender, lines) = unbounded();
        self.senders.lock().unwrap().push(sender);
        Reply::Stream(Stream::new(Framing::Ndjson, JsonLines::new(lines)))
    }
    fn internal_error(&self) -> Reply {
        json_reply(500, json!({}))
    }
    fn edge_error(&self, _path: Option<&str>, error: &EdgeError) -> Reply {
        json_reply(error.status(), json!({ "edge": error.to_string() }))
    }
}

impl kestrel::http::Handler for Door {
    fn handle(&self, request: &mut Request) -> Reply {
        json_reply(200, json!({ "door": self.0, "path": request.path() }))
    }
    fn internal_error(&self) -> Reply {
        json_reply(500, json!({}))
    }
    fn edge_error(&self, _path: Option<&str>, error: &EdgeError) -> Reply {
        json_reply(error.status(), json!({ "door": self.0, "edge": error.to_string() }))
    }
}

fn config(dir: &std::path::Path) -> HttpConfig {
    HttpConfig {
        body_limit: 1024,
        ping_interval: std::time::Duration::from_millis(100),
        write_timeout: WAIT,
        header_timeout: WAIT,
        body_timeout: WAIT,
        keep_alive_timeout: WAIT,
        max_head_bytes: 16 * 1024,
        max_connections: 100,
        runtime_dir: dir.join("run"),
        origin: Default::default(),
    }
}

#[test]
fn each_listener_serves_its_own_front_door_and_ndjson_streams_line_by_line() {
    let dir = tempfile::tempdir().unwrap();
    let lines = Arc::new(Lines { senders: Mutex::new(Vec::new()) });
    let bind = || kestrel::http::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listeners: Vec<(std::net::TcpListener, Arc<dyn kestrel::http::Handler>)> =
        vec![(bind(), lines.clone()), (bind(), Arc::new(Door("second")))];
    let mut server = HttpServer::start(listeners, config(dir.path())).unwrap();
    let (first, second) = (server.addrs()[0], server.addrs()[1]);

    // The second door answers its own requests, and its own refusals.
    let mut socket = TcpStream::connect(second).unwrap();
    socket.write_all(b"GET /who HTTP/1.1\r\nConnection: close\r\n\r\n").unwrap();
    let answer = crate::support::read_answer(&mut socket, WAIT);
    assert_eq!(answer.json, json!({ "door": "second", "path": "/who" }));
    let refused = crate::support::raw(&format!("http://{second}"), b"GET / HTTP/2.0\r\n\r\n");
    assert_eq!((refused.status, refused.json["door"].clone()), (505, json!("second")));

    // The first streams NDJSON: headers at once, even with nothing to say yet, then a line per
    // value, and the end when its source ends.
    let socket = TcpStream::connect(first).unwrap();
    (&socket).write_all(b"GET /rpc HTTP/1.1\r\n\r\n").unwrap();
    socket.set_read_timeout(Some(WAIT)).unwrap();
    let mut reader = BufReader::new(socket);
    let mut head = String::new();
    while !head.ends_with("\r\n\r\n") {
        reader.read_line(&mut head).unwrap();
    }
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("Content-Type: application/x-ndjson"), "{head}");
    crate::support::wait_until("the stream's source", || !lines.senders.lock().unwrap().is_empty());
    let sender = lines.senders.lock().unwrap().pop().unwrap();
    for i in 0..3 {
        sender.send(json!({ "jsonrpc": "2.0", "i": i })).unwrap();
    }
    drop(sender);
    let mut body = Vec::new();
    reader.read_to_end(&mut body).unwrap();
    let text = String::from_utf8(body).unwrap();
    let values: Vec<Value> = dechunk(&text).lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(values, (0..3).map(|i| json!({ "jsonrpc": "2.0", "i": i })).collect::<Vec<_>>());
    assert!(text.ends_with("0\r\n\r\n"), "the stream ended on purpose: {text:?}");
    server.stop_accepting();
    server.wait_for_requests(WAIT);
}

/// The data of a chunked body.
fn dechunk(mut framed: &str) -> String {
    let mut data = String::new();
    while let Some((size, rest)) = framed.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap();
        if size == 0 {
            break;
        }
        data.push_str(&rest[..size]);
        framed = &rest[size + 2..];
    }
    data
}
