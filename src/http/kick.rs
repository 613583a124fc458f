//! Works around a queueing flaw in tiny_http's connection pool.
//!
//! tiny_http serves each connection on a thread from its own pool. When several connections
//! arrive while an idle pool thread is waking up, all but one are queued, and a queued
//! connection waits until some pool thread finishes its current connection. A pool thread is
//! held for as long as its client keeps the connection open: every event stream and every idle
//! keep-alive connection holds one. Under a burst of stream clients (a page of tabs, a
//! reconnect storm after a restart) new connections could wait forever.
//!
//! The kicker unsticks that queue from outside. It connects to our own listener and resets the
//! connection at once. If every pool thread is busy, tiny_http starts a new thread for the kick;
//! the kick ends immediately and that thread moves on to the oldest queued connection. A kick
//! that rescues a connection makes a request arrive, so the kicker kicks again at once while
//! requests keep arriving after kicks, and otherwise every `IDLE_INTERVAL`.
//!
//! Runs on the `kestrel-kick` thread; it stops when its stop channel is dropped.

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

const IDLE_INTERVAL: Duration = Duration::from_millis(100);
/// How long a rescued connection has to show up as a request before the kicker calms down.
const SETTLE: Duration = Duration::from_millis(2);
/// The most kicks in a row before the kicker rests for an interval.
const MAX_BURST: usize = 256;

pub struct Kicker {
    stop_tx: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Kicker {
    /// `requests` is the count of requests tiny_http has handed over, bumped by the accept loop.
    pub fn start(addr: SocketAddr, requests: Arc<AtomicU64>) -> std::io::Result<Kicker> {
        let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
        let thread =
            std::thread::Builder::new().name("kestrel-kick".into()).spawn(move || run(addr, &requests, &stop_rx))?;
        Ok(Kicker { stop_tx: Some(stop_tx), thread: Some(thread) })
    }

    pub fn stop(&mut self) {
        drop(self.stop_tx.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(addr: SocketAddr, requests: &AtomicU64, stop: &Receiver<()>) {
    loop {
        let mut burst = 0;
        loop {
            let before = requests.load(Ordering::Relaxed);
            kick(addr);
            if sleep(stop, SETTLE) {
                return;
            }
            burst += 1;
            if requests.load(Ordering::Relaxed) == before || burst == MAX_BURST {
                break;
            }
        }
        if sleep(stop, IDLE_INTERVAL) {
            return;
        }
    }
}

/// Sleeps; true when told to stop.
fn sleep(stop: &Receiver<()>, duration: Duration) -> bool {
    matches!(stop.recv_timeout(duration), Err(RecvTimeoutError::Disconnected))
}

fn kick(addr: SocketAddr) {
    if let Ok(stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
        // Linger 0: close with a reset, so kicks leave no TIME_WAIT sockets behind.
        let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    }
}
