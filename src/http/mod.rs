//! The HTTP edge: tiny_http's accept loop, one thread per request or stream.
//!
//! Owns the only `tiny_http` import. The `kestrel-http` thread takes requests from tiny_http
//! and spawns a `kestrel-req` thread for each; that thread asks the `Handler` for a `Reply`
//! and writes it. An event stream keeps its thread until the client leaves or the bus closes.
//! This module knows nothing of routes or JSON shapes: the handler decides those.

pub mod auth;
mod kick;
mod sse;

use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

pub use sse::EventStream;

/// What a handler answers.
pub enum Reply {
    Json { status: u16, body: Vec<u8>, headers: Vec<(&'static str, String)> },
    Empty { status: u16 },
    Events(EventStream),
}

/// Why a body could not be read.
#[derive(Debug)]
pub enum BodyError {
    TooLarge { limit: usize },
    Io(std::io::Error),
}

pub trait Handler: Send + Sync + 'static {
    fn handle(&self, request: &mut Request) -> Reply;
    /// The answer when `handle` panicked; the panic itself is logged by the edge.
    fn internal_error(&self) -> Reply;
}

/// One request, with its path split from its decoded query.
pub struct Request {
    inner: tiny_http::Request,
    method: String,
    path: String,
    query: Vec<(String, String)>,
    body_limit: usize,
}

impl Request {
    pub fn method(&self) -> &str {
        &self.method
    }

    pub fn path(&self) -> &str {
        &self.path
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
    pub fn read_body(&mut self) -> Result<Vec<u8>, BodyError> {
        let limit = self.body_limit;
        if self.inner.body_length().is_some_and(|length| length > limit) {
            return Err(BodyError::TooLarge { limit });
        }
        let mut body = Vec::new();
        self.inner.as_reader().take(limit as u64 + 1).read_to_end(&mut body).map_err(BodyError::Io)?;
        if body.len() > limit {
            return Err(BodyError::TooLarge { limit });
        }
        Ok(body)
    }
}

/// Binds the listener. Linux copies these options to every accepted socket, which is the only
/// way to set them: tiny_http offers no hook for its sockets.
///
/// - `TCP_NODELAY`: without it, a response that tiny_http writes in two pieces waits for the
///   client's delayed ACK, 40 ms per request on a keep-alive connection.
/// - a send timeout (`write_timeout`): a client that stops reading (a stalled network, a
///   frozen tab) fills its socket buffer and would block the thread writing to it forever;
///   with the timeout the write fails and the thread ends.
pub fn bind(addr: SocketAddr, write_timeout: Duration) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_nodelay(true)?;
    socket.set_write_timeout(Some(write_timeout))?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

/// Counts live request threads so shutdown can wait for them, and streams for the gauges.
#[derive(Default)]
pub struct Gauges {
    /// Requests handed over by tiny_http since start.
    accepted: Arc<AtomicU64>,
    requests: Mutex<usize>,
    requests_done: Condvar,
    streams: AtomicUsize,
}

impl Gauges {
    pub fn open_streams(&self) -> usize {
        self.streams.load(Ordering::Relaxed)
    }

    pub fn open_requests(&self) -> usize {
        *self.requests.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub struct HttpConfig {
    pub body_limit: usize,
    pub ping_interval: Duration,
}

pub struct HttpServer {
    server: Arc<tiny_http::Server>,
    accept: Option<JoinHandle<()>>,
    kicker: kick::Kicker,
    gauges: Arc<Gauges>,
    addr: SocketAddr,
}

impl HttpServer {
    /// Starts serving `listener` on the `kestrel-http` thread.
    pub fn start(listener: TcpListener, handler: Arc<dyn Handler>, config: HttpConfig) -> std::io::Result<HttpServer> {
        let addr = listener.local_addr()?;
        let server = tiny_http::Server::from_listener(listener, None).map_err(std::io::Error::other)?;
        let server = Arc::new(server);
        let gauges = Arc::new(Gauges::default());
        let accept = {
            let server = Arc::clone(&server);
            let gauges = Arc::clone(&gauges);
            std::thread::Builder::new()
                .name("kestrel-http".into())
                .spawn(move || accept_loop(&server, handler, &gauges, &config))?
        };
        // Kicks go to loopback when the listener is bound to every address.
        let kick_addr = match addr.ip() {
            ip if ip.is_unspecified() && addr.is_ipv4() => SocketAddr::from(([127, 0, 0, 1], addr.port())),
            ip if ip.is_unspecified() => SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, addr.port())),
            _ => addr,
        };
        let kicker = kick::Kicker::start(kick_addr, Arc::clone(&gauges.accepted))?;
        Ok(HttpServer { server, accept: Some(accept), kicker, gauges, addr })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn gauges(&self) -> &Arc<Gauges> {
        &self.gauges
    }

    /// Stops accepting; requests already being handled go on.
    pub fn stop_accepting(&mut self) {
        self.kicker.stop();
        self.server.unblock();
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }

    /// Waits (at most `grace`) for every request thread to finish.
    pub fn wait_for_requests(&self, grace: Duration) {
        let guard = self.gauges.requests.lock().unwrap_or_else(|e| e.into_inner());
        let (left, timeout) = self
            .gauges
            .requests_done
            .wait_timeout_while(guard, grace, |open| *open > 0)
            .unwrap_or_else(|e| e.into_inner());
        if timeout.timed_out() {
            log::warn!("{} request(s) still open after {grace:?}", *left);
        }
    }
}

fn accept_loop(server: &tiny_http::Server, handler: Arc<dyn Handler>, gauges: &Arc<Gauges>, config: &HttpConfig) {
    for request in server.incoming_requests() {
        gauges.accepted.fetch_add(1, Ordering::Relaxed);
        let handler = Arc::clone(&handler);
        let gauges_for_thread = Arc::clone(gauges);
        let body_limit = config.body_limit;
        let ping = config.ping_interval;
        *gauges.requests.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        let spawned = std::thread::Builder::new().name("kestrel-req".into()).spawn(move || {
            serve(request, handler.as_ref(), body_limit, ping, &gauges_for_thread);
            let mut open = gauges_for_thread.requests.lock().unwrap_or_else(|e| e.into_inner());
            *open -= 1;
            gauges_for_thread.requests_done.notify_all();
        });
        if let Err(error) = spawned {
            log::error!("cannot spawn a request thread: {error}");
            *gauges.requests.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        }
    }
}

fn serve(raw: tiny_http::Request, handler: &dyn Handler, body_limit: usize, ping: Duration, gauges: &Gauges) {
    let (path, query) = split_url(raw.url());
    let mut request =
        Request { method: raw.method().as_str().to_ascii_uppercase(), inner: raw, path, query, body_limit };
    let reply = catch_unwind(AssertUnwindSafe(|| handler.handle(&mut request))).unwrap_or_else(|_| {
        log::error!("handler panicked on {} {}", request.method, request.path);
        handler.internal_error()
    });
    let result = match reply {
        Reply::Json { status, body, headers } => {
            let mut response = tiny_http::Response::from_data(body).with_status_code(status);
            response.add_header(header("Content-Type", "application/json"));
            for (name, value) in headers {
                response.add_header(header(name, &value));
            }
            request.inner.respond(response)
        }
        Reply::Empty { status } => request.inner.respond(tiny_http::Response::empty(status)),
        Reply::Events(stream) => {
            gauges.streams.fetch_add(1, Ordering::Relaxed);
            let result = stream.write_to(request.inner.into_writer(), ping);
            gauges.streams.fetch_sub(1, Ordering::Relaxed);
            result
        }
    };
    if let Err(error) = result {
        log::debug!("response not delivered: {error}");
    }
}

fn header(name: &str, value: &str) -> tiny_http::Header {
    tiny_http::Header::from_bytes(name.as_bytes(), value.as_bytes()).expect("static header names are valid")
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
