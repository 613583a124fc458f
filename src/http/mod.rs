//! The HTTP edge: Kestrel's own accept loop and connection gate in front of tiny_http.
//!
//! Owns the only `tiny_http` import. tiny_http 0.12 parses requests and serializes responses,
//! but left alone it lets one request abort the process (it drains an unread body with
//! `vec![0; declared_length]`), lets slow clients hold threads forever (no read deadlines) and
//! stops accepting for good when file descriptors run out. So Kestrel owns the sockets:
//!
//! - `listen.rs` (`kestrel-accept`): accepts TCP connections, caps how many are open, and never
//!   dies on an accept error.
//! - `gate.rs` (`kestrel-conn`, one per connection): reads each request head under a deadline,
//!   screens it (`head.rs`), decodes a chunked body (`chunked.rs`), refuses what tiny_http
//!   would mishandle, forwards the rest to
//!   tiny_http over a private Unix socket, runs the handler on the request tiny_http parsed,
//!   and writes the reply straight to the client's socket.
//! - `backend.rs` (`kestrel-http`): the tiny_http server on that Unix socket and the
//!   dispatcher that hands each parsed request back to its gate; restarted if it ever dies.
//! - `origin.rs`: which browsers' requests are answered (`Host`, `Origin`, a body's media
//!   type), screened by the gate for every listener before any door sees the request.
//! - `peer.rs`: the user owning a loopback client's socket, for a door that serves only the
//!   server's own user (a server with no token).
//! - `sse.rs`: event-stream bodies.
//!
//! This module knows nothing of routes or JSON shapes: the handler decides those, error
//! bodies included (`Handler::edge_error`).

pub mod access;
mod backend;
mod chunked;
mod gate;
mod head;
mod listen;
pub mod origin;
pub mod peer;
pub mod request_id;
mod respond;
mod sse;
mod stream;

use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

pub use listen::{bind, raise_open_file_limit, FileLimit};
pub use sse::EventStream;
pub(crate) use stream::BURST_BYTES;
pub use stream::{Frames, Framing, JsonLines, Stream, StreamBody};

/// What a handler answers.
pub enum Reply {
    Json {
        status: u16,
        body: Vec<u8>,
        headers: Vec<(&'static str, String)>,
    },
    Empty {
        status: u16,
    },
    /// A whole NDJSON body (a 200 of one or a few lines, sent with its length).
    Ndjson(Vec<u8>),
    /// A static file: its bytes, content type and `Cache-Control` (a 200), and the headers
    /// that confine what it may do in a browser (`Content-Security-Policy`, …).
    File {
        content_type: &'static str,
        body: Vec<u8>,
        cache_control: &'static str,
        policy: &'static [(&'static str, &'static str)],
    },
    /// A body streamed for as long as it lasts: server-sent events or NDJSON.
    Stream(Stream),
    /// Another node's answer, relayed (`cluster/forward.rs`): its status, content type, body
    /// and the headers a client reads.
    Relayed {
        status: u16,
        content_type: String,
        body: Vec<u8>,
        headers: Vec<(&'static str, String)>,
    },
}

impl Reply {
    /// The size of the body it sends; `None` for a stream.
    pub fn body_len(&self) -> Option<u64> {
        match self {
            Reply::Json { body, .. } | Reply::Ndjson(body) | Reply::File { body, .. } | Reply::Relayed { body, .. } => {
                Some(body.len() as u64)
            }
            Reply::Empty { .. } => Some(0),
            Reply::Stream(_) => None,
        }
    }

    /// The status this reply is sent with (a stream's is 200).
    pub fn status(&self) -> u16 {
        match self {
            Reply::Json { status, .. } | Reply::Empty { status } | Reply::Relayed { status, .. } => *status,
            Reply::Ndjson(_) | Reply::File { .. } | Reply::Stream(_) => 200,
        }
    }
}

/// Why a body could not be read.
#[derive(Debug)]
pub enum BodyError {
    TooLarge {
        limit: usize,
    },
    /// The body ended before its Content-Length: the client stopped sending and the body
    /// deadline passed, or it closed.
    Truncated {
        expected: usize,
        received: usize,
    },
    Io(std::io::Error),
}

/// A request the edge refused before any handler saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EdgeError {
    /// Not well-formed HTTP/1.x, or not ASCII where tiny_http needs ASCII.
    BadRequest(String),
    /// The head passed `HttpConfig::max_head_bytes` or `head::MAX_HEADERS` lines.
    HeadTooLarge,
    /// A `Transfer-Encoding` other than `chunked`.
    LengthRequired,
    /// An `Expect` other than `100-continue`.
    ExpectationFailed,
    /// HTTP/2 or later.
    VersionNotSupported,
    /// The declared body is larger than `body_limit_bytes`.
    BodyTooLarge { limit: usize },
    /// The head or the body did not arrive before its deadline.
    Timeout,
    /// Every connection slot is taken.
    TooManyConnections,
    /// The server is stopping, or its HTTP backend is restarting.
    Unavailable,
    /// A node-to-node call that does not carry the cluster's secret (`cluster/forward.rs`).
    Forbidden,
    /// A request a web page may have sent: a foreign `Host`, a cross-origin `Origin`, or a
    /// body that is not of its door's media type (`origin.rs`).
    Refused(origin::Refusal),
}

impl EdgeError {
    pub fn status(&self) -> u16 {
        match self {
            EdgeError::BadRequest(_) => 400,
            EdgeError::HeadTooLarge => 431,
            EdgeError::LengthRequired => 411,
            EdgeError::ExpectationFailed => 417,
            EdgeError::VersionNotSupported => 505,
            EdgeError::BodyTooLarge { .. } => 413,
            EdgeError::Timeout => 408,
            EdgeError::TooManyConnections | EdgeError::Unavailable => 503,
            EdgeError::Forbidden => 403,
            EdgeError::Refused(origin::Refusal::Host | origin::Refusal::Origin) => 403,
            EdgeError::Refused(origin::Refusal::MediaType { .. }) => 415,
        }
    }
}

impl std::fmt::Display for EdgeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EdgeError::BadRequest(why) => write!(f, "malformed request: {why}"),
            EdgeError::HeadTooLarge => write!(f, "the request head is too large"),
            EdgeError::LengthRequired => {
                write!(f, "send the body with Content-Length or Transfer-Encoding: chunked, and no other coding")
            }
            EdgeError::ExpectationFailed => write!(f, "only `Expect: 100-continue` is supported"),
            EdgeError::VersionNotSupported => write!(f, "this server speaks HTTP/1.0 and HTTP/1.1 only"),
            EdgeError::BodyTooLarge { limit } => write!(f, "the request body is larger than {limit} bytes"),
            EdgeError::Timeout => write!(f, "the request did not arrive in time"),
            EdgeError::TooManyConnections => write!(f, "too many open connections; retry shortly"),
            EdgeError::Unavailable => write!(f, "the server is not accepting requests right now"),
            EdgeError::Forbidden => write!(f, "this call between nodes does not carry the cluster's secret"),
            EdgeError::Refused(refusal) => write!(f, "{refusal}"),
        }
    }
}

pub trait Handler: Send + Sync + 'static {
    fn handle(&self, request: &mut Request) -> Reply;
    /// The answer when `handle` panicked; the panic itself is logged by the edge.
    fn internal_error(&self) -> Reply;
    /// The answer to a request the edge refused; `path` is the request's path when it could be
    /// read, so each protocol can answer in its own error shape.
    fn edge_error(&self, path: Option<&str>, error: &EdgeError) -> Reply;
    /// What the route of `method` `path` is, for the screening of browsers' requests
    /// (`origin.rs`): an API route taking JSON bodies unless the door says otherwise.
    fn exposure(&self, _method: &str, _path: &str) -> origin::Exposure {
        origin::Exposure::Api { bodies: origin::JSON }
    }
}

/// One request, as tiny_http parsed it, with its path split from its decoded query.
pub struct Request {
    inner: tiny_http::Request,
    method: String,
    path: String,
    query: Vec<(String, String)>,
    body_limit: usize,
    /// The route template the handler matched, for metrics.
    route: &'static str,
    /// The connection's other end.
    peer: Arc<peer::PeerUser>,
    /// The body, when it was read ahead (`buffered_body`) for whoever reads it next.
    buffered: Option<Vec<u8>>,
}

impl Request {
    fn new(inner: tiny_http::Request, body_limit: usize, peer: Arc<peer::PeerUser>) -> Request {
        let (path, query) = split_url(inner.url());
        let method = inner.method().as_str().to_ascii_uppercase();
        Request { method, inner, path, query, body_limit, route: "(unmatched)", peer, buffered: None }
    }

    /// Who sent the request: the user owning the client's socket, on the loopback.
    pub fn peer(&self) -> &peer::PeerUser {
        &self.peer
    }

    /// Says which route template this request matched (metrics label it by that, never by
    /// its path).
    pub fn set_route(&mut self, template: &'static str) {
        self.route = template;
    }

    pub fn route(&self) -> &'static str {
        self.route
    }

    pub fn method(&self) -> &str {
        &self.method
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// The path and query as the client sent them (not decoded).
    pub fn url(&self) -> &str {
        self.inner.url()
    }

    /// Every header, as `(name, value)`.
    pub fn headers(&self) -> impl Iterator<Item = (&str, &str)> {
        self.inner.headers().iter().map(|h| (h.field.as_str().as_str(), h.value.as_str()))
    }

    /// The first query parameter named `name`, percent-decoded.
    pub fn query(&self, name: &str) -> Option<&str> {
        self.query.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.inner
            .headers()
            .iter()
            .find(|h| h.field.as_str().as_str().eq_ignore_ascii_case(name))
            .map(|h| h.value.as_str())
    }

    /// Reads the whole body, refusing one past the configured limit without reading it all.
    /// The gate already refused a declared length past the limit; this is the second check.
    /// A body read ahead (`buffered_body`) is handed out once, as it was read.
    pub fn read_body(&mut self) -> Result<Vec<u8>, BodyError> {
        match self.buffered.take() {
            Some(body) => Ok(body),
            None => self.read_whole_body(),
        }
    }

    /// The whole body, read now as `read_body` reads it and kept for the next `read_body`: a
    /// door that judges a body while it admits the request (BAE's join) leaves it whole for
    /// the handler, or for the node of a cluster the request is then forwarded to.
    pub fn buffered_body(&mut self) -> Result<&[u8], BodyError> {
        if self.buffered.is_none() {
            self.buffered = Some(self.read_whole_body()?);
        }
        Ok(self.buffered.as_deref().unwrap_or_default())
    }

    fn read_whole_body(&mut self) -> Result<Vec<u8>, BodyError> {
        let limit = self.body_limit;
        if self.inner.body_length().is_some_and(|length| length > limit) {
            return Err(BodyError::TooLarge { limit });
        }
        let mut body = Vec::new();
        self.inner.as_reader().take(limit as u64 + 1).read_to_end(&mut body).map_err(BodyError::Io)?;
        if body.len() > limit {
            return Err(BodyError::TooLarge { limit });
        }
        let expected = self.inner.body_length().unwrap_or(0);
        if body.len() < expected {
            return Err(BodyError::Truncated { expected, received: body.len() });
        }
        Ok(body)
    }
}

/// The edge's limits and deadlines.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    pub body_limit: usize,
    pub ping_interval: Duration,
    /// A client that makes no progress reading a response for this long is cut off.
    pub write_timeout: Duration,
    /// The whole request head must arrive within this, from its first byte.
    pub header_timeout: Duration,
    /// The whole body must arrive within this, from the end of the head.
    pub body_timeout: Duration,
    /// How long an idle keep-alive connection waits for its next request.
    pub keep_alive_timeout: Duration,
    /// Request heads larger than this are refused with 431.
    pub max_head_bytes: usize,
    /// Connections open at once; past it new ones get a 503 and are closed.
    pub max_connections: usize,
    /// A private directory for the Unix socket between the gates and tiny_http.
    pub runtime_dir: PathBuf,
    /// The names and origins answered beyond the loopback's and the request's own.
    pub origin: origin::Policy,
}

/// Counters a test or an operator can read, and what shutdown waits on.
#[derive(Default)]
pub struct Gauges {
    /// Open client connections (gate threads).
    connections: Mutex<usize>,
    connections_done: Condvar,
    /// Exchanges between reading a head and finishing its reply.
    requests: AtomicUsize,
    streams: AtomicUsize,
    /// Connections refused because every slot was taken.
    refused: AtomicUsize,
    /// Times the tiny_http backend was found dead and replaced.
    backend_restarts: AtomicUsize,
}

impl Gauges {
    pub fn open_streams(&self) -> usize {
        self.streams.load(Ordering::Relaxed)
    }

    pub fn open_requests(&self) -> usize {
        self.requests.load(Ordering::Relaxed)
    }

    pub fn open_connections(&self) -> usize {
        *self.connections.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn refused_connections(&self) -> usize {
        self.refused.load(Ordering::Relaxed)
    }

    pub fn backend_restarts(&self) -> usize {
        self.backend_restarts.load(Ordering::Relaxed)
    }

    /// Takes a connection slot unless `max` are taken.
    fn try_open_connection(&self, max: usize) -> bool {
        let mut open = self.connections.lock().unwrap_or_else(|e| e.into_inner());
        if *open >= max {
            return false;
        }
        *open += 1;
        crate::metrics::get().open_connections.inc();
        true
    }

    fn close_connection(&self) {
        let mut open = self.connections.lock().unwrap_or_else(|e| e.into_inner());
        *open = open.saturating_sub(1);
        crate::metrics::get().open_connections.dec();
        self.connections_done.notify_all();
    }
}

/// The running edge: an accept thread per listener, the tiny_http backend and every
/// connection. Each listener has its own front door (the admin port's comes next); the
/// connection cap, deadlines and backend are shared.
pub struct HttpServer {
    edge: Arc<gate::Edge>,
    accepts: Vec<listen::Acceptor>,
    addrs: Vec<SocketAddr>,
}

impl HttpServer {
    /// Starts serving each listener with its handler.
    pub fn start(listeners: Vec<(TcpListener, Arc<dyn Handler>)>, config: HttpConfig) -> std::io::Result<HttpServer> {
        let gauges = Arc::new(Gauges::default());
        let backends = backend::Backends::start(&config.runtime_dir, Arc::clone(&gauges))?;
        let edge = Arc::new(gate::Edge::new(config, backends, gauges));
        let mut accepts = Vec::new();
        let mut addrs = Vec::new();
        for (listener, handler) in listeners {
            addrs.push(listener.local_addr()?);
            accepts.push(listen::Acceptor::start(listener, handler, Arc::clone(&edge))?);
        }
        Ok(HttpServer { edge, accepts, addrs })
    }

    /// The first listener's address (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addrs[0]
    }

    /// Every listener's address, in the order they were given.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    pub fn gauges(&self) -> &Arc<Gauges> {
        self.edge.gauges()
    }

    /// Stops accepting and closes idle keep-alive connections; requests being handled go on.
    pub fn stop_accepting(&mut self) {
        for accept in self.accepts.drain(..) {
            accept.stop();
        }
        self.edge.stop();
    }

    /// Waits (at most `grace`) for every connection to finish, then stops the backend.
    pub fn wait_for_requests(&self, grace: Duration) {
        let gauges = self.edge.gauges();
        let guard = gauges.connections.lock().unwrap_or_else(|e| e.into_inner());
        let (left, timeout) = gauges
            .connections_done
            .wait_timeout_while(guard, grace, |open| *open > 0)
            .unwrap_or_else(|e| e.into_inner());
        if timeout.timed_out() {
            log::warn!("{} connection(s) still open after {grace:?}", *left);
        }
        drop(left);
        self.edge.stop_backend();
    }
}

/// A log for errors that come in storms (every pending connection fails the same way): the
/// first is logged, then at most one line every ten seconds with a count of the rest.
#[derive(Default)]
pub(crate) struct Quiet {
    state: Mutex<(Option<std::time::Instant>, usize)>,
}

impl Quiet {
    pub fn error(&self, message: std::fmt::Arguments<'_>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        if state.0.is_some_and(|last| now.duration_since(last) < Duration::from_secs(10)) {
            state.1 += 1;
            return;
        }
        log::error!("{message} ({} similar errors since the last report)", state.1);
        *state = (Some(now), 0);
    }
}

/// Splits `/a/b?x=1&y=%20` into the path and its decoded query pairs.
fn split_url(url: &str) -> (String, Vec<(String, String)>) {
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    let pairs = query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(key), percent_decode(value))
        })
        .collect();
    (path.to_string(), pairs)
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex_value(bytes[i + 1]), hex_value(bytes[i + 2])) {
                (Some(high), Some(low)) => {
                    out.push(high << 4 | low);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            byte => out.push(byte),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex_value(digit: u8) -> Option<u8> {
    (digit as char).to_digit(16).map(|value| value as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_and_decodes_queries() {
        let (path, query) = split_url("/api/x?path=a%20b%2Fc&token=t+1&flag&bad=%zz&end=%4");
        assert_eq!(path, "/api/x");
        assert_eq!(
            query,
            vec![
                ("path".into(), "a b/c".into()),
                ("token".into(), "t 1".into()),
                ("flag".into(), "".into()),
                ("bad".into(), "%zz".into()),
                ("end".into(), "%4".into()),
            ]
        );
    }
}
