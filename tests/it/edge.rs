//! The HTTP edge under hostile clients: lying lengths, stalls, garbage, floods of connections.
//! Each test here failed against the edge that let tiny_http own the sockets.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::support::{host_of, raw, read_answer, wait_until, SseClient, TestServer, WAIT};

#[test]
fn a_declared_length_past_the_limit_is_413_and_never_read() {
    // The unauthenticated health check, a 401 and a 404: tiny_http aborted the process on each
    // when it tried to drain the declared body into one allocation.
    let server = TestServer::start_with(|config| config.auth.token = Some("t0ken".into()));
    for (path, length) in [
        ("/api/health", "999999999999"),
        ("/api/bootstrap", "4611686018427387904"),
        ("/api/nope", "9999999999999999999"),
    ] {
        let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {length}\r\n\r\nabc");
        let answer = raw(&server.base, request.as_bytes());
        answer.assert_error(413, "payload_too_large");
        assert!(answer.closed, "the connection is closed after a 413");
        assert!(answer.head.to_ascii_lowercase().contains("connection: close"), "{}", answer.head);
    }
    // More than 19 digits is not a length at all.
    let request = b"GET /api/health HTTP/1.1\r\nContent-Length: 18446744073709551616\r\n\r\n";
    raw(&server.base, request).assert_error(400, "bad_request");
    assert_eq!(server.client().with_token(None).get("/api/health").status, 200, "the server lives on");
}

#[test]
fn garbage_non_ascii_and_http2_get_a_status_instead_of_a_silent_close_or_a_hang() {
    let server = TestServer::start();
    let cases: [(&[u8], u16, &str); 8] = [
        (b"GET /caf\xc3\xa9 HTTP/1.1\r\nHost: localhost\r\n\r\n", 400, "bad_request"),
        (b"GET /api/health HTTP/1.1\r\nX-Name: caf\xc3\xa9\r\n\r\n", 400, "bad_request"),
        (b"GET /api/health HTTP/2.0\r\n\r\n", 505, "http_version_not_supported"),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505, "http_version_not_supported"),
        (b"HELLO\r\n\r\n", 400, "bad_request"),
        (b"POST /api/sessions HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 411, "length_required"),
        (b"GET /api/health HTTP/1.1\r\nExpect: 200-ok\r\n\r\n", 417, "expectation_failed"),
        (b"GET /api/health HTTP/1.1\r\nContent-Length: +5\r\n\r\n", 400, "bad_request"),
    ];
    for (request, status, code) in cases {
        let answer = raw(&server.base, request);
        answer.assert_error(status, code);
        assert!(answer.closed, "{}", String::from_utf8_lossy(request));
    }
    // A request line that is garbage is refused before the rest of a head arrives.
    let mut socket = TcpStream::connect(host_of(&server.base)).unwrap();
    socket.write_all(b"\xff\xfe GARBAGE\r\n").unwrap();
    read_answer(&mut socket, WAIT).assert_error(400, "bad_request");
    // A head past `max_header_bytes` is 431.
    let big = format!("GET /api/health HTTP/1.1\r\nX-Big: {}\r\n\r\n", "a".repeat(20_000));
    raw(&server.base, big.as_bytes()).assert_error(431, "header_too_large");
    assert_eq!(server.get("/api/health").status, 200);
}

#[test]
fn stalled_heads_and_bodies_are_cut_off_at_their_deadlines() {
    let server = TestServer::start_with(|config| {
        config.server.header_timeout_ms = 300;
        config.server.body_timeout_ms = 300;
    });
    let host = host_of(&server.base);
    // A head that never ends, and one that trickles a byte at a time: both hit the deadline,
    // which counts from the first byte, not per read.
    let mut stalled = TcpStream::connect(&host).unwrap();
    stalled.write_all(b"GET /api/health HTTP/1.1\r\nHost: localhost\r\n").unwrap();
    read_answer(&mut stalled, WAIT).assert_error(408, "request_timeout");

    // Each byte comes well within a per-read timeout, and the whole head would take about five
    // seconds: only a deadline for the whole head cuts the connection before it is sent.
    let mut trickle = TcpStream::connect(&host).unwrap();
    let mut cut_off = false;
    for byte in b"GET /api/health HTTP/1.1\r\nX-Slow: ".iter().chain([b'a'; 220].iter()) {
        if trickle.write_all(&[*byte]).is_err() {
            cut_off = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(cut_off, "the server cut the connection at the head's deadline, before the trickle ended");

    // A small body (read by the gate) and a large one (streamed to tiny_http) that stop halfway.
    let mut small = TcpStream::connect(&host).unwrap();
    small
        .write_all(
            b"POST /api/sessions HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"title\":",
        )
        .unwrap();
    read_answer(&mut small, WAIT).assert_error(408, "request_timeout");
    let mut large = TcpStream::connect(&host).unwrap();
    large
        .write_all(b"POST /api/sessions HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 200000\r\n\r\n")
        .unwrap();
    large.write_all(&[b' '; 100_000]).unwrap();
    read_answer(&mut large, WAIT).assert_error(408, "request_timeout");
    let sessions = server.get("/api/sessions");
    assert_eq!(sessions.json["sessions"].as_array().unwrap().len(), 0, "nothing half-sent was created");
}

#[test]
fn hundreds_of_stalled_connections_are_all_dropped_and_streams_outlive_the_deadlines() {
    let server = TestServer::start_with(|config| {
        config.server.header_timeout_ms = 300;
        config.server.keep_alive_timeout_ms = 300;
    });
    let mut stream = server.events("/api/events");
    let stalled: Vec<TcpStream> = (0..300)
        .map(|i| {
            let mut socket = TcpStream::connect(host_of(&server.base)).unwrap();
            if i % 2 == 0 {
                socket.write_all(b"GET /api/health HTTP/1.1\r\n").unwrap();
            }
            socket
        })
        .collect();
    wait_until("the stalled connections to be dropped", || server.stats().open_connections == 1);
    drop(stalled);
    // Five pings 200 ms apart take the stream past both deadlines; cut at either, it would
    // have ended after the first.
    let mut pings = 0;
    while pings < 5 {
        match stream.next_item(WAIT) {
            Some(crate::support::SseItem::Comment(_)) => pings += 1,
            Some(_) => {}
            None => panic!("the stream ended after {pings} pings"),
        }
    }
    assert_eq!(server.stats().open_streams, 1);
}

#[test]
fn an_idle_keep_alive_connection_is_closed_after_its_timeout() {
    let server = TestServer::start_with(|config| config.server.keep_alive_timeout_ms = 200);
    let mut socket = TcpStream::connect(host_of(&server.base)).unwrap();
    socket.write_all(b"GET /api/health HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let answer = read_answer(&mut socket, WAIT);
    assert_eq!(answer.status, 200);
    assert!(answer.closed, "closed once idle past the keep-alive timeout");
    wait_until("the connection to be gone", || server.stats().open_connections == 0);
}

#[test]
fn keep_alive_and_pipelined_requests_are_answered_in_order() {
    let server = TestServer::start();
    let mut socket = TcpStream::connect(host_of(&server.base)).unwrap();
    let body = br#"{"title":"piped"}"#;
    let mut requests = Vec::new();
    requests.extend_from_slice(b"GET /api/health HTTP/1.1\r\nHost: localhost\r\n\r\n");
    requests.extend_from_slice(
        format!(
            "POST /api/sessions HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    requests.extend_from_slice(body);
    requests.extend_from_slice(b"GET /api/nope HTTP/1.1\r\nConnection: close\r\n\r\n");
    socket.write_all(&requests).unwrap();
    let mut text = String::new();
    socket.set_read_timeout(Some(WAIT)).unwrap();
    socket.read_to_string(&mut text).unwrap();
    let statuses: Vec<&str> = text.match_indices("HTTP/1.1 ").map(|(at, _)| &text[at + 9..at + 12]).collect();
    assert_eq!(statuses, ["200", "201", "404"], "{text}");
}

#[test]
fn past_the_connection_cap_a_client_gets_503_and_serving_goes_on() {
    let server = TestServer::start_with(|config| config.server.max_connections = 8);
    let idle: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(host_of(&server.base)).unwrap()).collect();
    wait_until("eight connections open", || server.stats().open_connections == 8);
    let answer = raw(&server.base, b"GET /api/health HTTP/1.1\r\nHost: localhost\r\n\r\n");
    answer.assert_error(503, "unavailable");
    assert!(answer.head.contains("Retry-After: 1"), "{}", answer.head);
    assert_eq!(server.stats().refused_connections, 1);
    drop(idle);
    wait_until("the idle connections to close", || server.stats().open_connections == 0);
    assert_eq!(server.get("/api/health").status, 200);
}

#[test]
fn a_stream_closed_by_its_client_gives_its_thread_back_at_once() {
    // Pings every minute: only noticing the close itself can free these streams in time.
    let server = TestServer::start_with(|config| config.server.sse_ping_interval_ms = 60_000);
    for _ in 0..200 {
        let stream = SseClient::open(&server.base, "/api/events", None, None);
        assert_eq!(stream.status, 200);
        stream.disconnect();
    }
    wait_until("every stream to end", || server.stats().open_streams == 0);
    wait_until("every subscriber to go", || server.stats().bus_subscribers == 0);
    wait_until("every connection to close", || server.stats().open_connections == 0);
}

#[test]
fn an_unreachable_backend_is_replaced_and_requests_go_on() {
    let server = TestServer::start();
    assert_eq!(server.get("/api/health").status, 200);
    // The socket tiny_http listens on vanishes: new connections cannot reach it.
    std::fs::remove_file(server.data_dir.join("run/http-1.sock")).unwrap();
    assert_eq!(server.get("/api/health").status, 200);
    assert_eq!(server.stats().backend_restarts, 1);
    assert!(server.data_dir.join("run/http-2.sock").exists());
}

/// The release of the `kestrel` binary under `ulimit -n files`, on port 0; returns the child,
/// its base URL and its stderr (the log, at info).
fn kestrel_with_file_limit(files: u32, data: &std::path::Path, config: &str) -> (Reaped, String) {
    use std::io::BufRead;
    let config_path = data.join("kestrel.toml");
    std::fs::write(&config_path, config).unwrap();
    let mut child = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("ulimit -n {files} && exec \"$0\" --config \"$1\""))
        .arg(env!("CARGO_BIN_EXE_kestrel"))
        .arg(&config_path)
        .env("KESTREL_DATA_DIR", data.join("data"))
        .env("KESTREL_ADMIN_ADDR", "127.0.0.1:0")
        .env("KESTREL_WORKSPACE", data)
        .env("KESTREL_ADDR", "127.0.0.1:0")
        .env_remove("KESTREL_TOKEN")
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let port = line.trim().rsplit(':').next().unwrap().to_string();
    // The log is read as it is written: a pipe nobody drains would block the server's writes.
    let mut stderr = child.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
    (Reaped(Some(child), Some(log)), format!("http://127.0.0.1:{port}"))
}

/// A child process that is killed if the test fails before it stops it, and the thread that
/// collects its log.
struct Reaped(Option<std::process::Child>, Option<std::thread::JoinHandle<String>>);

impl Reaped {
    fn alive(&mut self) -> bool {
        self.0.as_mut().is_some_and(|child| child.try_wait().is_ok_and(|status| status.is_none()))
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Health answers 200 on a fresh connection before `WAIT` runs out.
fn eventually_healthy(base: &str) -> bool {
    let deadline = Instant::now() + WAIT * 2;
    while Instant::now() < deadline {
        let ok = ureq::get(&format!("{base}/api/health")).timeout(Duration::from_secs(2)).call();
        if ok.is_ok_and(|r| r.status() == 200) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// SIGTERM, then the log the server wrote.
fn stop(mut child: Reaped) -> String {
    let mut process = child.0.take().expect("a running child");
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(process.id() as i32), nix::sys::signal::Signal::SIGTERM);
    let _ = process.wait();
    child.1.take().map(|log| log.join().unwrap_or_default()).unwrap_or_default()
}

#[test]
fn under_a_low_file_limit_connections_past_the_budget_get_503() {
    let data = tempfile::tempdir().unwrap();
    let (child, base) = kestrel_with_file_limit(256, data.path(), "");
    // 256 descriptors: a quarter and 64 more in reserve, four per connection, so 32 connections.
    let idle: Vec<TcpStream> = (0..32).map(|_| TcpStream::connect(host_of(&base)).unwrap()).collect();
    let refused: Vec<u16> = (0..40)
        .map(|_| {
            let mut socket = TcpStream::connect(host_of(&base)).unwrap();
            let _ = socket.write_all(b"GET /api/health HTTP/1.1\r\nHost: localhost\r\n\r\n");
            read_answer(&mut socket, WAIT).status
        })
        .collect();
    assert!(refused.iter().all(|&status| status == 503), "{refused:?}");
    drop(idle);
    assert!(eventually_healthy(&base));
    let log = stop(child);
    assert!(log.contains("open-file limit: soft 256 (was 256), hard 256; up to 32 connections"), "{log}");
}

#[test]
fn running_out_of_file_descriptors_never_stops_the_listener() {
    // A cap far above what 128 descriptors allow: accept, the Unix connections to tiny_http and
    // tiny_http's own accept and clones all run out in turn.
    let data = tempfile::tempdir().unwrap();
    let (mut child, base) = kestrel_with_file_limit(128, data.path(), "[server]\nmax_connections = 5000\n");
    let flood: Vec<TcpStream> = (0..400)
        .filter_map(|_| {
            let mut socket = TcpStream::connect(host_of(&base)).ok()?;
            let _ = socket.write_all(b"GET /api/health HTTP/1.1\r\nHost: localhost\r\n\r\n");
            Some(socket)
        })
        .collect();
    assert!(flood.len() > 200, "the kernel queues connections the server cannot take");
    drop(flood);
    assert!(eventually_healthy(&base), "serving resumed once descriptors were free");
    assert!(child.alive(), "the process is alive");
    // And again: the listener survives repeated exhaustion.
    let flood: Vec<TcpStream> = (0..400).filter_map(|_| TcpStream::connect(host_of(&base)).ok()).collect();
    drop(flood);
    assert!(eventually_healthy(&base));
    let log = stop(child);
    // tiny_http's accept thread panics when it cannot clone a socket; when it did, the backend
    // was replaced.
    let tiny_http_died = log.contains("refined_tcp_stream.rs") || log.contains("accept loop ended");
    assert!(!tiny_http_died || log.contains("replaces generation"), "{log}");
}

#[test]
fn a_large_body_a_route_does_not_read_is_not_waited_for() {
    // Default deadlines (a minute for a body): the answer must not wait for them.
    let server = TestServer::start();
    for (path, status) in [("/api/events", 400), ("/api/nope", 404), ("/api/health", 200)] {
        let mut socket = TcpStream::connect(host_of(&server.base)).unwrap();
        socket
            .write_all(
                format!("GET {path} HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 200000\r\n\r\n")
                    .as_bytes(),
            )
            .unwrap();
        socket.write_all(&[b'x'; 100_000]).unwrap();
        let answer = read_answer(&mut socket, WAIT);
        assert!(answer.closed, "{path}: closed without waiting for the rest of the body");
        assert_eq!(answer.status, status, "{path}: {answer:?}");
    }
    wait_until("every connection to close", || server.stats().open_connections == 0);
}

/// `body` in chunks of `size` bytes.
fn chunked(body: &[u8], size: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for piece in body.chunks(size) {
        out.extend_from_slice(format!("{:x};ext=1\r\n", piece.len()).as_bytes());
        out.extend_from_slice(piece);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\nX-Trailer: ignored\r\n\r\n");
    out
}

#[test]
fn chunked_bodies_are_decoded_within_the_limit() {
    let server = TestServer::start_with(|config| config.server.body_limit_bytes = 300_000);
    let head = "POST /api/sessions HTTP/1.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
    let mut request = head.as_bytes().to_vec();
    request.extend_from_slice(&chunked(br#"{"title":"in chunks"}"#, 5));
    request.extend_from_slice(b"GET /api/health HTTP/1.1\r\nConnection: close\r\n\r\n");
    let mut socket = TcpStream::connect(host_of(&server.base)).unwrap();
    socket.write_all(&request).unwrap();
    let mut text = String::new();
    socket.set_read_timeout(Some(WAIT)).unwrap();
    socket.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 201"), "{text}");
    assert!(text.contains("in chunks") && text.contains("HTTP/1.1 200"), "the pipelined request after it: {text}");

    // A large message in chunks goes through the streamed path to the engine.
    let id = server.create_session(serde_json::json!({}));
    let content = "w ".repeat(100_000);
    let body = serde_json::json!({ "content": content.trim() }).to_string();
    let mut request =
        format!("POST /api/sessions/{id}/messages HTTP/1.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").into_bytes();
    request.extend_from_slice(&chunked(body.as_bytes(), 7000));
    assert_eq!(raw(&server.base, &request).status, 202);

    // Past the limit, and broken framing.
    let mut too_big = head.as_bytes().to_vec();
    too_big.extend_from_slice(&chunked(&vec![b' '; 400_000], 65_536));
    raw(&server.base, &too_big).assert_error(413, "payload_too_large");
    let broken = format!("{head}5\r\nabc\r\n0\r\n\r\n");
    raw(&server.base, broken.as_bytes()).assert_error(400, "bad_request");
}
