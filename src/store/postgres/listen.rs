//! Hearing of what other nodes log (docs/cluster.md, streams): in a cluster, the writer's
//! transaction that logs an event also notifies `CHANNEL` with the log's last seq, delivered
//! by PostgreSQL at its commit. The `kestrel-listen` thread listens on its own connection and
//! hands each pointer on; the bus reads the rows back in seq order (`BusMsg::Remote`). The
//! payload is only a pointer: the events table is the truth, so a notification lost while the
//! connection was down costs nothing, and a reconnect hands on the log's last seq at once.
//!
//! Deltas are never stored: the transaction that takes their seqs notifies `LIVE_CHANNEL`
//! with the deltas themselves (`live.rs`: payloads under PostgreSQL's 8000 bytes, a larger
//! delta in parts), before its pointer, and the bus streams them in seq order with the
//! logged events. A delta heard after its node has streamed a later event is dropped, never
//! sent out of order.

use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};
use postgres::fallible_iterator::FallibleIterator;

use super::super::{LoggedEvent, StoreError};
use super::conn::Tx;

/// The channel commits that log an event notify.
pub const CHANNEL: &str = "kestrel_events";
/// The channel of deltas, which are not logged.
pub const LIVE_CHANNEL: &str = "kestrel_live";

/// What the thread hears.
pub enum Heard {
    /// Events were logged up to this seq.
    Logged(u64),
    /// Deltas another node streamed, with their seqs.
    Live(Vec<LoggedEvent>),
}

/// How often the thread looks up from its connection to see whether it should stop.
const POLL: Duration = Duration::from_millis(250);
/// How long it waits before connecting again after losing its connection.
const RECONNECT: Duration = Duration::from_secs(1);

/// Called with what each commit of another node logged or streamed.
pub type OnCommit = Box<dyn Fn(Heard) + Send>;

/// Hands `live` (deltas at their places after `first`) to the other nodes at the commit.
pub(super) fn notify_live(tx: &mut Tx<'_>, first: u64, live: &[(usize, LoggedEvent)]) -> Result<(), StoreError> {
    for payload in super::live::payloads(first, live) {
        tx.exec("SELECT pg_notify($1, $2)", &[&LIVE_CHANNEL, &payload])?;
    }
    Ok(())
}

/// The running `kestrel-listen` thread.
pub struct Listener {
    stop: Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl Listener {
    pub fn start(url: &str, on_commit: OnCommit) -> Result<Listener, StoreError> {
        let (stop, stopped) = bounded(1);
        let url = url.to_string();
        let thread = std::thread::Builder::new()
            .name("kestrel-listen".into())
            .spawn(move || run(&url, &on_commit, &stopped))
            .map_err(StoreError::Io)?;
        Ok(Listener { stop, thread: Some(thread) })
    }

    pub fn shutdown(mut self) {
        let _ = self.stop.send(());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(url: &str, on_commit: &OnCommit, stopped: &Receiver<()>) {
    loop {
        match listen(url, on_commit, stopped) {
            Ok(()) => return,
            Err(error) => log::warn!("the cluster's commit notifications were lost ({error}); listening again"),
        }
        if !matches!(stopped.recv_timeout(RECONNECT), Err(RecvTimeoutError::Timeout)) {
            return;
        }
    }
}

/// Listens until told to stop (`Ok`) or the connection fails.
fn listen(url: &str, on_commit: &OnCommit, stopped: &Receiver<()>) -> Result<(), StoreError> {
    let mut client = super::connect(url).map_err(StoreError::Connect)?;
    client
        .batch_execute(&format!("LISTEN {CHANNEL}; LISTEN {LIVE_CHANNEL}"))
        .map_err(|e| StoreError::Unavailable(e.to_string()))?;
    // Whatever was committed while this connection was not listening.
    let row = client
        .query_one("SELECT value FROM meta WHERE key = 'seq_last'", &[])
        .map_err(|e| StoreError::Unavailable(e.to_string()))?;
    on_commit(Heard::Logged(row.get::<_, i64>(0) as u64));
    let mut assembly = super::live::Assembly::default();
    loop {
        let mut notifications = client.notifications();
        let mut heard = notifications.timeout_iter(POLL);
        loop {
            if !matches!(stopped.try_recv(), Err(crossbeam_channel::TryRecvError::Empty)) {
                return Ok(());
            }
            match heard.next() {
                Ok(Some(notification)) => match notification.channel() {
                    LIVE_CHANNEL => {
                        let live = assembly.hear(notification.payload());
                        if !live.is_empty() {
                            on_commit(Heard::Live(live));
                        }
                    }
                    _ => {
                        if let Ok(seq) = notification.payload().parse::<u64>() {
                            on_commit(Heard::Logged(seq));
                        }
                    }
                },
                // Quiet for `POLL`: look up, then listen again.
                Ok(None) => break,
                Err(error) => return Err(StoreError::Unavailable(error.to_string())),
            }
        }
    }
}
