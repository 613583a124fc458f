//! A minimal raw HTTP/1.1 client for the benchmark: keep-alive requests and SSE readers.
//! Raw sockets, so the client costs the same against Kestrel and against the floor.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;

pub struct Connection {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    host: String,
}

pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Connection {
    pub fn open(host: &str) -> std::io::Result<Connection> {
        let stream = TcpStream::connect(host)?;
        stream.set_nodelay(true)?;
        Ok(Connection { reader: BufReader::new(stream.try_clone()?), writer: stream, host: host.to_string() })
    }

    pub fn request(&mut self, method: &str, path: &str, body: &[u8]) -> std::io::Result<Response> {
        self.request_as(method, path, None, body)
    }

    /// A request with `Authorization: Bearer <key>` when a key is given.
    pub fn request_as(
        &mut self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: &[u8],
    ) -> std::io::Result<Response> {
        let auth = key.map(|key| format!("Authorization: Bearer {key}\r\n")).unwrap_or_default();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.host,
            body.len()
        );
        self.writer.write_all(head.as_bytes())?;
        self.writer.write_all(body)?;
        read_response(&mut self.reader)
    }
}

fn read_response(reader: &mut BufReader<TcpStream>) -> std::io::Result<Response> {
    let (status, headers) = read_head(reader)?;
    let length = header(&headers, "content-length").and_then(|v| v.parse::<usize>().ok());
    let chunked = header(&headers, "transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    let mut body = Vec::new();
    if chunked {
        while let Some(chunk) = read_chunk(reader)? {
            body.extend_from_slice(&chunk);
        }
    } else if let Some(length) = length {
        body.resize(length, 0);
        reader.read_exact(&mut body)?;
    }
    Ok(Response { status, body })
}

pub fn read_head(reader: &mut BufReader<TcpStream>) -> std::io::Result<(u16, Vec<(String, String)>)> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let status = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            return Ok((status, headers));
        }
        if let Some((name, value)) = trimmed.split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
    }
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
}

/// One chunk of a chunked body; `None` at the terminating chunk.
pub fn read_chunk(reader: &mut BufReader<TcpStream>) -> std::io::Result<Option<Vec<u8>>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let size = usize::from_str_radix(line.trim(), 16).map_err(std::io::Error::other)?;
    let mut chunk = vec![0; size + 2];
    reader.read_exact(&mut chunk)?;
    chunk.truncate(size);
    Ok(if size == 0 { None } else { Some(chunk) })
}

/// Reads SSE frames until `count` of them carried an `id:`.
pub fn read_events(reader: &mut BufReader<TcpStream>, count: usize) {
    let mut seen = 0;
    let mut pending = String::new();
    while seen < count {
        let chunk = read_chunk(reader).unwrap().expect("the replay goes on");
        pending.push_str(&String::from_utf8_lossy(&chunk));
        // One pass over the chunk, one drain: a replay page arrives as one large chunk.
        let mut start = 0;
        while let Some(end) = pending[start..].find("\n\n") {
            seen += usize::from(pending[start..start + end].starts_with("id: "));
            start += end + 2;
        }
        pending.drain(..start);
    }
}

/// What one SSE subscriber saw.
pub struct StreamOutcome {
    pub events: u64,
    pub reconnects: u64,
    pub finished: bool,
}

/// Opens an SSE stream and calls `ready` once the head has arrived.
pub fn open_stream(host: &str, path: &str, last_event_id: Option<u64>) -> std::io::Result<BufReader<TcpStream>> {
    let mut stream = TcpStream::connect(host)?;
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n");
    if let Some(id) = last_event_id {
        request.push_str(&format!("Last-Event-ID: {id}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes())?;
    let mut reader = BufReader::with_capacity(64 * 1024, stream);
    let (status, _) = read_head(&mut reader)?;
    if status != 200 {
        return Err(std::io::Error::other(format!("stream answered {status}")));
    }
    Ok(reader)
}

/// Reads a stream until an event containing `until` arrives, reconnecting with
/// `Last-Event-ID` whenever the server drops the stream (a subscriber that fell behind).
pub fn follow_stream(host: &str, path: &str, mut reader: BufReader<TcpStream>, until: &str) -> StreamOutcome {
    let mut outcome = StreamOutcome { events: 0, reconnects: 0, finished: false };
    let mut last_id = None;
    let mut pending = String::new();
    loop {
        match read_chunk(&mut reader) {
            Ok(Some(chunk)) => {
                pending.push_str(&String::from_utf8_lossy(&chunk));
                // One pass over the chunk and one drain: a batch of events arrives as one chunk,
                // and draining frame by frame would move the rest of it once per frame.
                let mut start = 0;
                while let Some(end) = pending[start..].find("\n\n") {
                    let frame = &pending[start..start + end + 2];
                    start += end + 2;
                    if let Some(id) = frame.strip_prefix("id: ").and_then(|rest| rest.split('\n').next()) {
                        last_id = id.parse().ok();
                        outcome.events += 1;
                        if frame.contains(until) {
                            outcome.finished = true;
                            return outcome;
                        }
                    }
                }
                pending.drain(..start);
            }
            Ok(None) | Err(_) => {
                outcome.reconnects += 1;
                pending.clear();
                match open_stream(host, path, last_id) {
                    Ok(new_reader) => reader = new_reader,
                    Err(_) => return outcome,
                }
            }
        }
    }
}
