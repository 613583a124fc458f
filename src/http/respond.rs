//! Writing replies to the client's socket, on the gate's thread.
//!
//! JSON and empty replies are serialized by tiny_http (`Response::raw_print`) straight onto the
//! client's socket; tiny_http's own side of the connection never writes. A streamed reply gets
//! its head and chunks from `stream.rs`, with a `kestrel-watch` thread that blocks on the
//! socket's read side and stops the stream the moment the client closes.

use std::io::{BufWriter, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;

use super::gate::Edge;
use super::head::{Head, Version};
use super::{EdgeError, Handler, Reply, Request, Stream};

/// The watcher only waits on a socket.
const WATCH_STACK: usize = 64 * 1024;

/// Writes a JSON or empty reply. `keep_alive` false adds `Connection: close`.
pub fn reply(
    tcp: &TcpStream,
    reply: Reply,
    head: &Head,
    request: &Request,
    keep_alive: bool,
    request_id: String,
) -> std::io::Result<()> {
    let head_only = head.method.eq_ignore_ascii_case("HEAD");
    let (status, body, headers) = match reply {
        Reply::Json { status, body, headers } => {
            let mut all = vec![("Content-Type", "application/json".to_string())];
            all.extend(headers);
            (status, body, all)
        }
        Reply::Empty { status } => (status, Vec::new(), Vec::new()),
        Reply::Ndjson(body) => (200, body, vec![("Content-Type", "application/x-ndjson".to_string())]),
        Reply::File { content_type, body, cache_control, policy } => {
            let mut headers = vec![
                ("Content-Type", content_type.to_string()),
                ("Cache-Control", cache_control.to_string()),
                ("X-Content-Type-Options", "nosniff".to_string()),
            ];
            headers.extend(policy.iter().map(|(name, value)| (*name, value.to_string())));
            (200, body, headers)
        }
        Reply::Relayed { status, content_type, body, headers } => {
            let mut all = vec![("Content-Type", content_type)];
            all.extend(headers);
            (status, body, all)
        }
        Reply::Stream(_) => unreachable!("streams are written by `stream`"),
    };
    let mut headers = headers;
    headers.push(("X-Request-Id", request_id));
    write_response(tcp, status, body, &headers, head.version, request.inner.headers(), head_only, keep_alive)
}

/// Writes the handler's answer to a request the edge refused, always closing.
pub fn refusal(tcp: &TcpStream, handler: &dyn Handler, path: Option<&str>, error: &EdgeError) {
    let (status, body, headers) = match handler.edge_error(path, error) {
        Reply::Json { status, body, headers } => {
            let mut all = vec![("Content-Type", "application/json".to_string())];
            all.extend(headers);
            (status, body, all)
        }
        Reply::Empty { status } => (status, Vec::new(), Vec::new()),
        Reply::Ndjson(_) | Reply::File { .. } | Reply::Stream(_) | Reply::Relayed { .. } => {
            (error.status(), Vec::new(), Vec::new())
        }
    };
    let mut headers = headers;
    headers.push(("X-Request-Id", super::request_id::for_request(None)));
    if matches!(error, EdgeError::TooManyConnections | EdgeError::Unavailable) {
        headers.push(("Retry-After", "1".to_string()));
    }
    if let Err(error) = write_response(tcp, status, body, &headers, Version::Http11, &[], false, false) {
        log::debug!("a refusal was not delivered: {error}");
    }
}

#[allow(clippy::too_many_arguments)]
fn write_response(
    tcp: &TcpStream,
    status: u16,
    body: Vec<u8>,
    headers: &[(&'static str, String)],
    version: Version,
    request_headers: &[tiny_http::Header],
    head_only: bool,
    keep_alive: bool,
) -> std::io::Result<()> {
    // The whole body is in memory: always a Content-Length, never tiny_http's chunking of
    // bodies past 32 KiB, so clients can show progress and check completeness.
    let mut response = tiny_http::Response::from_data(body).with_status_code(status).with_chunked_threshold(usize::MAX);
    for (name, value) in headers {
        response.add_header(header(name, value));
    }
    let version = match version {
        Version::Http10 => tiny_http::HTTPVersion(1, 0),
        Version::Http11 => tiny_http::HTTPVersion(1, 1),
    };
    let mut bytes = Vec::with_capacity(512);
    response.raw_print(&mut bytes, version, request_headers, head_only, None)?;
    if !keep_alive {
        // tiny_http refuses a `Connection` header from callers (it used to close connections
        // itself), so it goes in right after the status line.
        if let Some(line_end) = bytes.windows(2).position(|w| w == b"\r\n") {
            bytes.splice(line_end + 2..line_end + 2, b"Connection: close\r\n".iter().copied());
        }
    }
    let mut tcp = tcp;
    tcp.write_all(&bytes)?;
    tcp.flush()
}

/// Lets tiny_http's request go without tiny_http writing anything: the reply went to the
/// client directly. Dropping it lets tiny_http read the connection's next head.
pub fn release(request: Request) {
    drop(request.inner.into_writer());
}

/// Writes a streamed reply until it ends, then closes the connection.
pub fn stream(tcp: &TcpStream, stream: Stream, version: Version, edge: &Edge) {
    let gauges = edge.gauges();
    gauges.streams.fetch_add(1, Ordering::Relaxed);
    let framing = match stream.framing {
        super::Framing::EventStream => "sse",
        super::Framing::Ndjson => "ndjson",
    };
    let open = crate::metrics::get().open_streams.with_label_values(&[framing]);
    open.inc();
    let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
    std::thread::scope(|scope| {
        let watcher = std::thread::Builder::new().name("kestrel-watch".into()).stack_size(WATCH_STACK).spawn_scoped(
            scope,
            move || {
                wait_for_close(tcp);
                drop(stop_tx);
            },
        );
        if let Err(error) = watcher {
            log::error!("cannot start a stream watcher: {error}");
            return;
        }
        let access = stream.access.clone();
        let mut writer = BufWriter::with_capacity(64 * 1024 + 64, Counted { tcp, bytes: 0 });
        if let Err(error) = stream.write_to(&mut writer, version, edge.config.ping_interval, &stop_rx) {
            log::debug!("stream ended: {error}");
        }
        let _ = writer.flush();
        if let Some(access) = access {
            access.done(200, Some(writer.get_ref().bytes));
        }
        // Wakes the watcher, which is blocked on a read.
        let _ = tcp.shutdown(std::net::Shutdown::Both);
    });
    gauges.streams.fetch_sub(1, Ordering::Relaxed);
    open.dec();
}

/// The client's socket, counting what is written to it.
struct Counted<'a> {
    tcp: &'a TcpStream,
    bytes: u64,
}

impl Write for Counted<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let written = self.tcp.write(buf)?;
        self.bytes += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.tcp.flush()
    }
}

/// Blocks until the client closes its side (or resets); what it sends meanwhile is dropped.
fn wait_for_close(mut tcp: &TcpStream) {
    let _ = tcp.set_read_timeout(None);
    let mut discard = [0u8; 512];
    loop {
        match tcp.read(&mut discard) {
            Ok(0) => return,
            Ok(_) => {}
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

fn header(name: &str, value: &str) -> tiny_http::Header {
    tiny_http::Header::from_bytes(name.as_bytes(), value.as_bytes()).unwrap_or_else(|()| {
        // Header values come from our own code; one that is not ASCII is a bug worth a log,
        // not a panic on a client's connection.
        log::error!("dropping a response header with a non-ASCII value: {name}");
        tiny_http::Header::from_bytes(&b"X-Invalid-Header"[..], &b"1"[..]).expect("ASCII")
    })
}
