//! The gate: one `kestrel-conn` thread per client connection, between the socket and tiny_http.
//!
//! For each request on its connection the gate reads the head under a deadline
//! (`header_timeout` from its first byte; for that first byte, `header_timeout` on a new
//! connection and `keep_alive_timeout` between requests), screens it
//! (`head.rs`) and what a web page may have sent (`origin.rs`), reads a small body itself or
//! streams a large one to tiny_http on a scoped `kestrel-body` thread under `body_timeout`, forwards the head over its Unix connection to the
//! backend, waits for the request tiny_http parses from it, runs the handler on this thread and
//! writes the reply straight to the client (`respond.rs`). Requests on one connection are served
//! one at a time, so replies can never interleave.
//!
//! **Invariant:** no byte reaches tiny_http before its head has been screened, so the declared
//! length tiny_http sees is never past `body_limit` and its body reader never waits on a client
//! beyond the body deadline (the gate closes the Unix side when the deadline passes).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::ScopedJoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use super::backend::{out_of_descriptors, wait_kicking, Backend, Backends, CONN_HEADER, DISPATCH_DEADLINE};
use super::chunked;
use super::head::{self, Head};
use super::{respond, EdgeError, Gauges, Handler, HttpConfig, Quiet, Reply, Stream};

/// Bodies up to this size are read by the gate and forwarded with their head in one write;
/// larger ones stream through a `kestrel-body` thread.
const INLINE_BODY: usize = 64 * 1024;

/// What every gate shares.
pub struct Edge {
    pub config: HttpConfig,
    backends: Arc<Backends>,
    gauges: Arc<Gauges>,
    pub stopping: AtomicBool,
    next_id: AtomicU64,
    /// Errors every connection would log at once.
    quiet: Quiet,
    /// Open connections, for closing the idle ones at shutdown.
    links: [Mutex<HashMap<u64, Arc<Link>>>; 16],
}

/// What the shutdown sweep needs of a connection.
pub struct Link {
    pub tcp: TcpStream,
    /// Waiting for the first byte of a next request: safe to close.
    idle: AtomicBool,
}

impl Edge {
    pub fn new(config: HttpConfig, backends: Arc<Backends>, gauges: Arc<Gauges>) -> Edge {
        Edge {
            config,
            backends,
            gauges,
            stopping: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
            quiet: Quiet::default(),
            links: Default::default(),
        }
    }

    pub fn gauges(&self) -> &Arc<Gauges> {
        &self.gauges
    }

    fn links(&self, id: u64) -> MutexGuard<'_, HashMap<u64, Arc<Link>>> {
        self.links[(id % 16) as usize].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the gate of a connection whose slot is already taken, serving it with `handler`
    /// (its listener's); hands the stream back if the thread cannot start.
    pub fn spawn_gate(
        edge: &Arc<Edge>,
        tcp: TcpStream,
        handler: &Arc<dyn Handler>,
    ) -> Result<(), (std::io::Error, TcpStream)> {
        let setup = tcp.set_nodelay(true).and_then(|()| tcp.set_write_timeout(Some(edge.config.write_timeout)));
        if let Err(error) = setup {
            log::debug!("a connection closed before it was set up: {error}");
            edge.gauges.close_connection();
            return Ok(());
        }
        let id = edge.next_id.fetch_add(1, Ordering::Relaxed);
        let peer = Arc::new(super::peer::PeerUser::new(tcp.local_addr().ok(), tcp.peer_addr().ok()));
        let link = Arc::new(Link { tcp, idle: AtomicBool::new(false) });
        let requests = edge.backends.routes().register(id);
        edge.links(id).insert(id, Arc::clone(&link));
        let gate = Gate {
            edge: Arc::clone(edge),
            handler: Arc::clone(handler),
            id,
            link,
            buffer: Vec::new(),
            requests,
            backend: None,
            served: 0,
            peer,
        };
        let spawned = crate::workers::CONNECTIONS.spawn(move || gate.run());
        match spawned {
            Ok(_) => Ok(()),
            Err(error) => {
                edge.backends.routes().unregister(id);
                let link = edge.links(id).remove(&id).expect("registered above");
                match Arc::try_unwrap(link) {
                    Ok(link) => Err((error, link.tcp)),
                    Err(_) => Ok(()), // not reachable: the gate never ran
                }
            }
        }
    }

    /// Marks the edge as stopping and closes every connection that is waiting for a request;
    /// the others close after their current reply.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        for shard in &self.links {
            for link in shard.lock().unwrap_or_else(|e| e.into_inner()).values() {
                if link.idle.load(Ordering::SeqCst) {
                    let _ = link.tcp.shutdown(std::net::Shutdown::Both);
                }
            }
        }
    }

    pub fn stop_backend(&self) {
        self.backends.stop();
    }
}

/// Whether a connection goes on after an exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    KeepAlive,
    Close,
}

/// Why reading stopped.
enum ReadEnd {
    /// The client closed, reset, or never sent a next request in time.
    Closed,
    /// The deadline passed.
    Timeout,
}

/// How a request head read ended when it did not produce a head.
enum HeadEnd {
    Closed,
    Refused(Option<String>, EdgeError),
}

/// A request's body as the gate has it.
enum Body {
    /// All of it, to go with the head in one write.
    Inline(Vec<u8>),
    /// What was read so far (a chunked body: all of it), to stream with the rest.
    Streamed(Vec<u8>),
}

/// How taking a body ended when it did not produce one.
enum BodyEnd {
    Closed,
    Refused(EdgeError),
}

/// What serving a request left to do.
enum Served {
    Done(Next),
    /// An event stream to write; tiny_http's side of the connection can go.
    Stream(Box<Stream>),
}

/// How a large body's forwarding ended.
pub enum Forwarded {
    /// Every byte went to tiny_http; these bytes came after it (a pipelined request).
    Complete(Vec<u8>),
    Incomplete,
}

struct Gate {
    edge: Arc<Edge>,
    /// What the connection's listener serves: a protocol's front door.
    handler: Arc<dyn Handler>,
    id: u64,
    link: Arc<Link>,
    /// Bytes read from the client and not used yet.
    buffer: Vec<u8>,
    requests: Receiver<tiny_http::Request>,
    /// This connection's Unix connection to tiny_http, opened at its first request.
    backend: Option<(Arc<Backend>, UnixStream)>,
    /// Requests read on this connection so far.
    served: usize,
    /// Who is on the other end, looked up the first time a request asks.
    peer: Arc<super::peer::PeerUser>,
}

impl Gate {
    fn run(mut self) {
        loop {
            match catch_unwind(AssertUnwindSafe(|| self.exchange())) {
                Ok(Next::KeepAlive) if !self.edge.stopping.load(Ordering::SeqCst) => {}
                Ok(_) => break,
                Err(_) => {
                    log::error!("a connection thread panicked; the connection is closed");
                    break;
                }
            }
        }
        self.edge.backends.routes().unregister(self.id);
        self.edge.links(self.id).remove(&self.id);
        let _ = self.link.tcp.shutdown(std::net::Shutdown::Both);
        self.edge.gauges.close_connection();
    }

    fn tcp(&self) -> &TcpStream {
        &self.link.tcp
    }

    /// One request and its reply.
    fn exchange(&mut self) -> Next {
        let mut head = match self.read_head() {
            Ok(head) => head,
            Err(HeadEnd::Closed) => return Next::Close,
            Err(HeadEnd::Refused(path, error)) => return self.refuse(path.as_deref(), &error),
        };
        // Before anything else is done for it (no `100 Continue`, no body read): a request a
        // web page may have sent is refused on its head alone.
        let exposure = self.handler.exposure(&head.method, head.path());
        if let Err(refusal) = super::origin::screen(&self.edge.config.origin, &head.headers, exposure) {
            return self.refuse(Some(head.path()), &EdgeError::Refused(refusal));
        }
        let edge = Arc::clone(&self.edge);
        let _open = Counted::new(&edge.gauges.requests);
        if head.expect_continue
            && (head.content_length > 0 || head.chunked)
            && self.tcp().write_all(b"HTTP/1.1 100 Continue\r\n\r\n").is_err()
        {
            return Next::Close;
        }
        let body_deadline = Instant::now() + self.edge.config.body_timeout;
        let body = match self.take_body(&mut head, body_deadline) {
            Ok(body) => body,
            Err(BodyEnd::Closed) => return Next::Close,
            Err(BodyEnd::Refused(error)) => return self.refuse(Some(head.path()), &error),
        };
        let mut forwarded = head.forwarded(CONN_HEADER, self.id);
        let (inline, carried) = match body {
            Body::Inline(bytes) => {
                forwarded.extend_from_slice(&bytes);
                (true, Vec::new())
            }
            Body::Streamed(carried) => (false, carried),
        };
        let Some((backend, unix)) = self.take_backend() else {
            return self.refuse(Some(head.path()), &EdgeError::Unavailable);
        };
        if let Err(error) = (&unix).write_all(&forwarded) {
            log::warn!("cannot forward a request to the HTTP backend: {error}");
            self.edge.backends.suspect(backend.generation);
            return self.refuse(Some(head.path()), &EdgeError::Unavailable);
        }
        let link = Arc::clone(&self.link);
        let served = std::thread::scope(|scope| {
            let forwarder = (!inline).then(|| {
                let (tcp, unix, length) = (&link.tcp, &unix, head.content_length);
                std::thread::Builder::new()
                    .name("kestrel-body".into())
                    .spawn_scoped(scope, move || forward_body(tcp, unix, carried, length, body_deadline))
            });
            match forwarder {
                Some(Ok(handle)) => self.serve(&head, &backend, Some(handle)),
                Some(Err(error)) => {
                    log::error!("cannot start a body thread: {error}");
                    Served::Done(Next::Close)
                }
                None => self.serve(&head, &backend, None),
            }
        });
        match served {
            Served::Done(Next::KeepAlive) => {
                self.backend = Some((backend, unix));
                Next::KeepAlive
            }
            Served::Done(Next::Close) => Next::Close,
            Served::Stream(stream) => {
                // tiny_http is done with this connection: its socket and pool thread go back
                // before a stream that may last for hours.
                drop(unix);
                respond::stream(&self.link.tcp, *stream, head.version, &self.edge);
                Next::Close
            }
        }
    }

    /// Waits for tiny_http's parse of the forwarded head, runs the handler and replies; an
    /// event stream is handed back to be written once tiny_http's side is released.
    fn serve(&mut self, head: &Head, backend: &Backend, forwarder: Option<ScopedJoinHandle<'_, Forwarded>>) -> Served {
        let Some(request) = wait_kicking(&self.requests, backend, DISPATCH_DEADLINE) else {
            self.edge.backends.suspect(backend.generation);
            if let Some(forwarder) = forwarder {
                let _ = self.tcp().shutdown(std::net::Shutdown::Read);
                let _ = forwarder.join();
            }
            return Served::Done(self.refuse(Some(head.path()), &EdgeError::Unavailable));
        };
        let mut request = super::Request::new(request, self.edge.config.body_limit, Arc::clone(&self.peer));
        let handler = self.handler.as_ref();
        let started = std::time::Instant::now();
        let id = super::request_id::for_request(request.header("X-Request-Id"));
        let reply = super::request_id::within(&id, || {
            catch_unwind(AssertUnwindSafe(|| handler.handle(&mut request))).unwrap_or_else(|_| {
                log::error!("handler panicked on {} {}", request.method(), request.path());
                handler.internal_error()
            })
        });
        crate::metrics::get().http(request.route(), request.method(), reply.status(), started.elapsed());
        let access = super::access::Pending {
            method: request.method().to_string(),
            route: request.route(),
            started,
            request_id: id.clone(),
        };
        let (status, bytes) = (reply.status(), reply.body_len());
        let body_done = forwarder.as_ref().is_none_or(|f| f.is_finished());
        if let Reply::Stream(mut stream) = reply {
            stream.request_id = Some(id);
            stream.access = Some(access);
            if !body_done {
                // A stream asked for with a large body still arriving: refused. The read side
                // goes first, so the body thread stops and tiny_http's drain ends.
                let _ = self.tcp().shutdown(std::net::Shutdown::Read);
                respond::release(request);
                let error = EdgeError::BadRequest("an event stream request cannot carry a body".into());
                return Served::Done(self.refuse(Some(head.path()), &error));
            }
            respond::release(request);
            return Served::Stream(Box::new(stream));
        }
        let keep_alive = head.keep_alive && body_done && !self.edge.stopping.load(Ordering::SeqCst);
        let written = respond::reply(self.tcp(), reply, head, &request, keep_alive, id);
        access.done(status, bytes.filter(|_| written.is_ok()));
        // A body the handler did not read is not waited for: the client has its answer.
        if forwarder.as_ref().is_some_and(|f| !f.is_finished()) {
            let _ = self.tcp().shutdown(std::net::Shutdown::Read);
        }
        respond::release(request);
        let rest = match forwarder.map(|f| f.join()) {
            Some(Ok(Forwarded::Complete(rest))) => Some(rest),
            Some(_) => None,
            None => Some(Vec::new()),
        };
        match (written, rest) {
            (Ok(()), Some(rest)) if keep_alive => {
                self.buffer.splice(0..0, rest);
                Served::Done(Next::KeepAlive)
            }
            _ => Served::Done(Next::Close),
        }
    }

    /// Writes the edge's refusal and closes the connection.
    fn refuse(&mut self, path: Option<&str>, error: &EdgeError) -> Next {
        crate::metrics::get().http("(refused)", "other", error.status(), std::time::Duration::ZERO);
        super::access::line("-", super::access::REFUSED, error.status(), None, std::time::Duration::ZERO, "-");
        respond::refusal(self.tcp(), self.handler.as_ref(), path, error);
        linger(self.tcp());
        Next::Close
    }

    /// This connection's link to the backend, opened on first use (or after a replacement). A
    /// backend that cannot be reached is suspected, and the replacement, if any, tried once.
    fn take_backend(&mut self) -> Option<(Arc<Backend>, UnixStream)> {
        let current = self.edge.backends.current();
        if let Some((backend, unix)) = self.backend.take() {
            if backend.generation == current.generation {
                return Some((backend, unix));
            }
        }
        match current.connect() {
            Ok(unix) => return Some((current, unix)),
            Err(error) if out_of_descriptors(&error) => {
                self.edge.quiet.error(format_args!("cannot reach the HTTP backend: {error}"));
                return None;
            }
            Err(error) => self.edge.quiet.error(format_args!("cannot reach the HTTP backend: {error}")),
        }
        self.edge.backends.suspect(current.generation);
        let replacement = self.edge.backends.current();
        if replacement.generation == current.generation {
            return None;
        }
        let unix = replacement.connect().ok()?;
        Some((replacement, unix))
    }

    /// Reads one request head: waits `header_timeout` for a new connection's first byte and
    /// `keep_alive_timeout` for a later request's, then at most `header_timeout` for the rest.
    fn read_head(&mut self) -> Result<Head, HeadEnd> {
        let config = &self.edge.config;
        let (max_head, body_limit) = (config.max_head_bytes, config.body_limit);
        let (keep_alive_timeout, header_timeout) = (config.keep_alive_timeout, config.header_timeout);
        // Empty lines before a request line are allowed (RFC 9112 §2.2).
        while self.buffer.starts_with(b"\r\n") {
            self.buffer.drain(..2);
        }
        if self.buffer.is_empty() {
            self.link.idle.store(true, Ordering::SeqCst);
            // A new connection gets the head's deadline for its first byte: one that sends
            // nothing holds a connection slot no longer than one that sends too slowly.
            let wait = if self.served == 0 { header_timeout } else { keep_alive_timeout };
            let first = if self.edge.stopping.load(Ordering::SeqCst) {
                Err(ReadEnd::Closed)
            } else {
                self.fill(Instant::now() + wait)
            };
            self.link.idle.store(false, Ordering::SeqCst);
            first.map_err(|_| HeadEnd::Closed)?;
        }
        let deadline = Instant::now() + header_timeout;
        let (mut line_checked, mut line_scanned) = (false, 0);
        // Bytes already searched, so a head trickling in a byte at a time costs linear time.
        let mut scanned = 0;
        loop {
            let found = head::head_end(&self.buffer[scanned..]).map(|end| scanned + end);
            scanned = self.buffer.len().saturating_sub(3);
            if let Some(end) = found {
                if end > max_head {
                    return Err(HeadEnd::Refused(head::rough_path(&self.buffer), EdgeError::HeadTooLarge));
                }
                let parsed = head::parse(&self.buffer[..end], body_limit)
                    .map_err(|error| HeadEnd::Refused(head::rough_path(&self.buffer), error))?;
                self.buffer.drain(..end);
                self.served += 1;
                return Ok(parsed);
            }
            if !line_checked {
                let from = line_scanned;
                line_scanned = self.buffer.len();
                if let Some(line_end) = self.buffer[from..].iter().position(|&b| b == b'\n').map(|at| from + at) {
                    // A bad request line is refused at once, not after the header deadline.
                    head::check_request_line(&self.buffer[..=line_end])
                        .map_err(|error| HeadEnd::Refused(head::rough_path(&self.buffer), error))?;
                    line_checked = true;
                }
            }
            if self.buffer.len() > max_head {
                return Err(HeadEnd::Refused(head::rough_path(&self.buffer), EdgeError::HeadTooLarge));
            }
            match self.fill(deadline) {
                Ok(()) => {}
                Err(ReadEnd::Timeout) => {
                    return Err(HeadEnd::Refused(head::rough_path(&self.buffer), EdgeError::Timeout))
                }
                Err(ReadEnd::Closed) => return Err(HeadEnd::Closed),
            }
        }
    }

    /// What the request's body is: read here when it is small or chunked, or the bytes already
    /// read of a large one, whose rest a `kestrel-body` thread streams to tiny_http. A chunked
    /// body is decoded whole (within the limit) and then goes on as if it had a length.
    fn take_body(&mut self, head: &mut Head, deadline: Instant) -> Result<Body, BodyEnd> {
        if head.chunked {
            let body = self.read_chunked(deadline)?;
            head.content_length = body.len();
            return Ok(if body.len() <= INLINE_BODY { Body::Inline(body) } else { Body::Streamed(body) });
        }
        if head.content_length <= INLINE_BODY {
            return match self.read_body(head.content_length, deadline) {
                Ok(body) => Ok(Body::Inline(body)),
                Err(ReadEnd::Timeout) => Err(BodyEnd::Refused(EdgeError::Timeout)),
                Err(ReadEnd::Closed) => Err(BodyEnd::Closed),
            };
        }
        Ok(Body::Streamed(std::mem::take(&mut self.buffer)))
    }

    /// A chunked body, decoded, read before `deadline`.
    fn read_chunked(&mut self, deadline: Instant) -> Result<Vec<u8>, BodyEnd> {
        let mut decoder = chunked::Decoder::default();
        loop {
            match decoder.feed(&mut self.buffer, self.edge.config.body_limit).map_err(BodyEnd::Refused)? {
                chunked::Progress::Done => return Ok(decoder.body),
                chunked::Progress::Partial => match self.fill(deadline) {
                    Ok(()) => {}
                    Err(ReadEnd::Timeout) => return Err(BodyEnd::Refused(EdgeError::Timeout)),
                    Err(ReadEnd::Closed) => return Err(BodyEnd::Closed),
                },
            }
        }
    }

    /// A body of `length` bytes, at most `INLINE_BODY`, read before `deadline`.
    fn read_body(&mut self, length: usize, deadline: Instant) -> Result<Vec<u8>, ReadEnd> {
        while self.buffer.len() < length {
            self.fill(deadline)?;
        }
        let rest = self.buffer.split_off(length);
        Ok(std::mem::replace(&mut self.buffer, rest))
    }

    /// Reads whatever the client sends next into the buffer, waiting until `deadline`.
    fn fill(&mut self, deadline: Instant) -> Result<(), ReadEnd> {
        let mut chunk = [0u8; 8192];
        let read = read_before(&self.link.tcp, &mut chunk, deadline)?;
        self.buffer.extend_from_slice(&chunk[..read]);
        Ok(())
    }
}

/// One read from `tcp` that gives up at `deadline`; 0 bytes (the client closed) is `Closed`.
fn read_before(mut tcp: &TcpStream, into: &mut [u8], deadline: Instant) -> Result<usize, ReadEnd> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ReadEnd::Timeout);
        }
        tcp.set_read_timeout(Some(left)).map_err(|_| ReadEnd::Closed)?;
        match tcp.read(into) {
            Ok(0) => return Err(ReadEnd::Closed),
            Ok(read) => return Ok(read),
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Err(ReadEnd::Timeout)
            }
            Err(_) => return Err(ReadEnd::Closed),
        }
    }
}

/// Streams a large body to tiny_http: what was already read, then the rest from the client,
/// all before `deadline`. If it cannot, tiny_http's side is closed so its reader sees the end.
fn forward_body(
    tcp: &TcpStream,
    mut unix: &UnixStream,
    carried: Vec<u8>,
    length: usize,
    deadline: Instant,
) -> Forwarded {
    let from_carried = carried.len().min(length);
    if unix.write_all(&carried[..from_carried]).is_err() {
        return Forwarded::Incomplete;
    }
    let mut left = length - from_carried;
    let mut chunk = vec![0u8; 64 * 1024];
    while left > 0 {
        let want = left.min(chunk.len());
        let read = match read_before(tcp, &mut chunk[..want], deadline) {
            Ok(read) => read,
            Err(_) => {
                let _ = unix.shutdown(std::net::Shutdown::Write);
                return Forwarded::Incomplete;
            }
        };
        if unix.write_all(&chunk[..read]).is_err() {
            return Forwarded::Incomplete;
        }
        left -= read;
    }
    Forwarded::Complete(carried[from_carried..].to_vec())
}

/// After a refusal: stop sending, then read and discard what the client is still sending for
/// a moment, so closing does not reset the connection before the client reads the answer.
fn linger(tcp: &TcpStream) {
    let _ = tcp.shutdown(std::net::Shutdown::Write);
    let deadline = Instant::now() + Duration::from_millis(500);
    let mut discarded = 0usize;
    let mut chunk = [0u8; 8192];
    while discarded < 1024 * 1024 {
        match read_before(tcp, &mut chunk, deadline) {
            Ok(read) => discarded += read,
            Err(_) => break,
        }
    }
}

/// Counts something while it is alive.
struct Counted<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Counted<'a> {
    fn new(counter: &'a std::sync::atomic::AtomicUsize) -> Counted<'a> {
        counter.fetch_add(1, Ordering::Relaxed);
        Counted(counter)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
