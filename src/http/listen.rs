//! The listening socket, the accept loop, and the open-file budget it keeps within.
//!
//! Runs on the `kestrel-accept` thread. The loop never ends on an error: a failed `accept`
//! (out of file descriptors, a connection reset before it was taken) is logged, waited out
//! briefly and retried, and a panic in one iteration is caught. Past `max_connections` a new
//! connection gets a 503 and is closed at once, so the server stays within its file limit
//! instead of failing somewhere deeper. Shutdown shuts the listening socket down, which wakes
//! `accept` with an error the loop recognizes as the end.

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::gate::Edge;
use super::{Handler, Quiet};

/// File descriptors one connection holds: its TCP socket, both ends of its Unix connection to
/// tiny_http, and tiny_http's clone of its end.
pub const FDS_PER_CONNECTION: u64 = 4;

/// Connections allowed when the file limit would allow more: each costs two threads.
pub const MAX_AUTO_CONNECTIONS: u64 = 16_384;

/// The open-file limit before and after `raise_open_file_limit`.
#[derive(Debug, Clone, Copy)]
pub struct FileLimit {
    pub soft_before: u64,
    pub soft: u64,
    pub hard: u64,
}

impl FileLimit {
    /// Connections that fit the limit, leaving a quarter of it (and at least 64) for SQLite,
    /// provider calls, commands and files.
    pub fn connection_budget(&self) -> usize {
        let reserve = 64 + self.soft / 4;
        let budget = self.soft.saturating_sub(reserve) / FDS_PER_CONNECTION;
        budget.clamp(1, MAX_AUTO_CONNECTIONS) as usize
    }
}

/// Raises the soft open-file limit to the hard one, logging both. The limit is per process,
/// so this is done once per `Server::start`; raising an already raised limit changes nothing.
pub fn raise_open_file_limit() -> FileLimit {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        log::warn!("cannot read the open-file limit; assuming 1024");
        return FileLimit { soft_before: 1024, soft: 1024, hard: 1024 };
    };
    let mut limit = FileLimit { soft_before: soft, soft, hard };
    if soft < hard {
        match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => limit.soft = hard,
            Err(error) => log::warn!("cannot raise the open-file limit from {soft} to {hard}: {error}"),
        }
    }
    log::info!(
        "open-file limit: soft {} (was {}), hard {}; up to {} connections",
        limit.soft,
        limit.soft_before,
        limit.hard,
        limit.connection_budget()
    );
    limit
}

/// Binds the listener with `SO_REUSEADDR`, so a restart does not wait out TIME_WAIT.
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

pub struct Acceptor {
    listener: Arc<TcpListener>,
    thread: Option<JoinHandle<()>>,
    edge: Arc<Edge>,
}

impl Acceptor {
    /// Accepts on `listener`, serving each connection with `handler`.
    pub fn start(listener: TcpListener, handler: Arc<dyn Handler>, edge: Arc<Edge>) -> std::io::Result<Acceptor> {
        let listener = Arc::new(listener);
        let thread = spawn(Arc::clone(&listener), handler, Arc::clone(&edge))?;
        Ok(Acceptor { listener, thread: Some(thread), edge })
    }

    /// Stops the loop and waits for it; connections already accepted go on.
    pub fn stop(mut self) {
        self.edge.stopping.store(true, Ordering::SeqCst);
        // On Linux, shutting a listening socket down makes a blocked `accept` return an error.
        let _ = socket2::SockRef::from(&*self.listener).shutdown(std::net::Shutdown::Both);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn spawn(listener: Arc<TcpListener>, handler: Arc<dyn Handler>, edge: Arc<Edge>) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name("kestrel-accept".into()).spawn(move || {
        let errors = Quiet::default();
        while !edge.stopping.load(Ordering::SeqCst) {
            let outcome = catch_unwind(AssertUnwindSafe(|| accept_one(&listener, &handler, &edge, &errors)));
            if outcome.is_err() {
                log::error!("the accept loop panicked; it goes on");
            }
        }
    })
}

fn accept_one(listener: &TcpListener, handler: &Arc<dyn Handler>, edge: &Arc<Edge>, errors: &Quiet) {
    match listener.accept() {
        Ok((stream, _peer)) => {
            if edge.stopping.load(Ordering::SeqCst) {
                return;
            }
            if !edge.gauges().try_open_connection(edge.config.max_connections) {
                edge.gauges().refused.fetch_add(1, Ordering::Relaxed);
                refuse(stream, handler.as_ref());
                return;
            }
            if let Err((error, stream)) = Edge::spawn_gate(edge, stream, handler) {
                log::error!("cannot start a connection thread: {error}");
                edge.gauges().close_connection();
                refuse(stream, handler.as_ref());
            }
        }
        Err(_) if edge.stopping.load(Ordering::SeqCst) => {}
        Err(error) => {
            let pause = match error.raw_os_error() {
                // Out of descriptors or memory: wait for connections to close.
                Some(nix::libc::EMFILE | nix::libc::ENFILE | nix::libc::ENOBUFS | nix::libc::ENOMEM) => {
                    Duration::from_millis(50)
                }
                // The client gave up before we took it, or a signal: just go on.
                Some(nix::libc::ECONNABORTED | nix::libc::EINTR | nix::libc::EPROTO) => Duration::ZERO,
                _ => Duration::from_millis(10),
            };
            errors.error(format_args!("accept failed: {error}"));
            std::thread::sleep(pause);
        }
    }
}

/// Answers a connection there is no room for with a 503 and closes it. What the client already
/// sent is read first (without waiting), so the close does not reset the connection before the
/// client has read the answer.
fn refuse(stream: TcpStream, handler: &dyn Handler) {
    let _ = stream.set_nonblocking(true);
    let _ = (&stream).read(&mut [0u8; 4096]);
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
    super::respond::refusal(&stream, handler, None, &super::EdgeError::TooManyConnections);
    let _ = stream.shutdown(std::net::Shutdown::Write);
}
