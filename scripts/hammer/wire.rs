//! A small HTTP/1.1 client over a raw socket: it sends exactly the bytes it is given (so it can
//! send what no well-behaved client would), reads one response with a deadline, and keeps the
//! connection open when the server does.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// One response, or why there was none.
#[derive(Debug)]
pub enum Outcome {
    Answered {
        status: u16,
        head: String,
        body: Vec<u8>,
    },
    /// The server closed the connection without answering.
    Closed,
    /// Nothing arrived before the deadline.
    Hung,
}

impl Outcome {
    pub fn status(&self) -> Option<u16> {
        match self {
            Outcome::Answered { status, .. } => Some(*status),
            _ => None,
        }
    }

    pub fn json(&self) -> serde_json::Value {
        match self {
            Outcome::Answered { body, .. } => serde_json::from_slice(body).unwrap_or(serde_json::Value::Null),
            _ => serde_json::Value::Null,
        }
    }

    /// An NDJSON body's frames, in order (what is not JSON is skipped).
    pub fn ndjson(&self) -> Vec<serde_json::Value> {
        match self {
            Outcome::Answered { body, .. } => {
                body.split(|&b| b == b'\n').filter_map(|line| serde_json::from_slice(line).ok()).collect()
            }
            _ => Vec::new(),
        }
    }
}

/// `Host: localhost`, unless the caller sends a Host of its own.
fn default_host(headers: &[(&str, &str)]) -> &'static str {
    match headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("host")) {
        true => "",
        false => "Host: localhost\r\n",
    }
}

/// A keep-alive connection that reconnects when the server closed it.
pub struct Client {
    host: String,
    socket: Option<TcpStream>,
    pub deadline: Duration,
}

impl Client {
    pub fn new(host: &str) -> Client {
        Client { host: host.to_string(), socket: None, deadline: Duration::from_secs(15) }
    }

    /// A request built from its parts, with `Content-Length` for the body.
    pub fn request(&mut self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Outcome {
        let mut bytes = format!("{method} {path} HTTP/1.1\r\n{}", default_host(headers)).into_bytes();
        for (name, value) in headers {
            bytes.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
        // A body is JSON unless the caller says otherwise (the server refuses any other type).
        if !body.is_empty() && !headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("content-type")) {
            bytes.extend_from_slice(b"Content-Type: application/json\r\n");
        }
        if !body.is_empty() || method == "POST" || method == "PATCH" {
            bytes.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
        }
        bytes.extend_from_slice(b"\r\n");
        bytes.extend_from_slice(body);
        self.send(&bytes, method.eq_ignore_ascii_case("HEAD"))
    }

    /// Sends `bytes` as they are on a new connection and reads one response.
    pub fn raw(&mut self, bytes: &[u8]) -> Outcome {
        self.socket = None;
        let outcome = self.send(bytes, bytes.starts_with(b"HEAD "));
        self.socket = None;
        outcome
    }

    fn send(&mut self, bytes: &[u8], head_only: bool) -> Outcome {
        for attempt in 0..2 {
            let socket = match self.socket.take() {
                Some(socket) => socket,
                None => match TcpStream::connect(&self.host) {
                    Ok(socket) => socket,
                    Err(_) => return Outcome::Closed,
                },
            };
            let reused = attempt == 0;
            if (&socket).write_all(bytes).is_err() {
                continue; // a kept connection the server had closed: once more on a new one
            }
            match read_response(&socket, self.deadline, head_only) {
                Got::Response { status, head, body, keep } => {
                    if keep {
                        self.socket = Some(socket);
                    }
                    return Outcome::Answered { status, head, body };
                }
                Got::Closed if reused => continue,
                Got::Closed => return Outcome::Closed,
                Got::Hung => return Outcome::Hung,
            }
        }
        Outcome::Closed
    }

    /// Opens an event stream and returns its status once the head arrived, then hangs up.
    pub fn stream_status(&self, path: &str, headers: &[(&str, &str)]) -> Outcome {
        self.head_status("GET", path, headers, b"")
    }

    /// Sends a request on a new connection and returns its status once the head arrived,
    /// then hangs up: for replies that stream for as long as the client listens.
    pub fn head_status(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Outcome {
        let Ok(socket) = TcpStream::connect(&self.host) else { return Outcome::Closed };
        let mut request = format!("{method} {path} HTTP/1.1\r\n{}", default_host(headers));
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        if !body.is_empty() && !headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("content-type")) {
            request.push_str("Content-Type: application/json\r\n");
        }
        if !body.is_empty() || method == "POST" {
            request.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        request.push_str("\r\n");
        let mut bytes = request.into_bytes();
        bytes.extend_from_slice(body);
        if (&socket).write_all(&bytes).is_err() {
            return Outcome::Closed;
        }
        match read_head(&socket, self.deadline) {
            Some((status, head, _)) => Outcome::Answered { status, head, body: Vec::new() },
            None => Outcome::Hung,
        }
    }
}

enum Got {
    Response { status: u16, head: String, body: Vec<u8>, keep: bool },
    Closed,
    Hung,
}

fn read_response(socket: &TcpStream, wait: Duration, head_only: bool) -> Got {
    let deadline = Instant::now() + wait;
    let Some((status, head, mut body)) = read_head(socket, wait) else {
        return if Instant::now() >= deadline { Got::Hung } else { Got::Closed };
    };
    let lower = head.to_ascii_lowercase();
    let length = lower
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok());
    let chunked = lower.contains("transfer-encoding: chunked");
    // A 1xx is not the answer; a HEAD answer has no body whatever its length says.
    if (100..200).contains(&status) || head_only {
        return Got::Response { status, head, body, keep: false };
    }
    let mut chunk = [0u8; 16 * 1024];
    let mut socket = socket;
    loop {
        let done = match length {
            Some(length) => body.len() >= length,
            None if chunked => body.ends_with(b"0\r\n\r\n"),
            None => false,
        };
        if done {
            break;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Got::Hung;
        }
        let _ = socket.set_read_timeout(Some(left));
        match socket.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Got::Hung
            }
            Err(_) => break,
        }
    }
    let keep = length.is_some_and(|l| body.len() == l) && !lower.contains("connection: close");
    if chunked {
        body = dechunk(&body);
    }
    Got::Response { status, head, body, keep }
}

/// The status line and headers, and whatever body bytes came with them.
fn read_head(mut socket: &TcpStream, wait: Duration) -> Option<(u16, String, Vec<u8>)> {
    let deadline = Instant::now() + wait;
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&bytes[..end]).into_owned();
            let status = head.split_whitespace().nth(1)?.parse().ok()?;
            return Some((status, head, bytes[end + 4..].to_vec()));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        let _ = socket.set_read_timeout(Some(left));
        match socket.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => bytes.extend_from_slice(&chunk[..n]),
        }
    }
}

impl Client {
    /// Opens an event stream and collects the envelopes it sends until it has been quiet for a
    /// moment (what a `lastEventId` replay hands over), then hangs up.
    pub fn replay(&self, path: &str) -> Vec<serde_json::Value> {
        let Ok(mut socket) = TcpStream::connect(&self.host) else { return Vec::new() };
        let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
        if socket.write_all(request.as_bytes()).is_err() {
            return Vec::new();
        }
        let mut bytes = Vec::new();
        let mut chunk = [0u8; 16 * 1024];
        let deadline = Instant::now() + Duration::from_secs(3);
        let _ = socket.set_read_timeout(Some(Duration::from_millis(150)));
        while Instant::now() < deadline {
            match socket.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => bytes.extend_from_slice(&chunk[..n]),
            }
        }
        String::from_utf8_lossy(&bytes)
            .lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .filter_map(|data| serde_json::from_str(data).ok())
            .collect()
    }
}

/// The data of a chunked body (what is malformed is cut off).
fn dechunk(mut framed: &[u8]) -> Vec<u8> {
    let mut data = Vec::new();
    while let Some(line_end) = framed.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&framed[..line_end]).ok().and_then(|s| usize::from_str_radix(s.trim(), 16).ok());
        let Some(size) = size.filter(|&s| s > 0) else { break };
        let start = line_end + 2;
        let Some(chunk) = framed.get(start..start + size) else { break };
        data.extend_from_slice(chunk);
        framed = framed.get(start + size + 2..).unwrap_or_default();
    }
    data
}
