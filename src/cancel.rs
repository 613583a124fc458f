//! Cancellation that a blocked thread can wait on.
//!
//! A run's worker sleeps between streamed deltas, waits for approvals and reads from sockets;
//! each of those waits must end within a second of `POST /cancel`. A `CancelToken` is the
//! receiving end of a channel nobody ever sends on: cancelling drops the only sender, which
//! wakes every waiter at once (`recv` reports disconnection). No polling, no lost wake-ups.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender, TryRecvError};

/// Why a run was told to stop; the run records a different status for each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelReason {
    /// A client asked (`POST /cancel`, a session delete).
    User,
    /// The server is shutting down; the run is stored as `interrupted` so it can be resumed.
    Shutdown,
}

/// The sender to drop on cancel, and why it was dropped.
type CancelState = Arc<Mutex<(Option<Sender<()>>, Option<CancelReason>)>>;

/// The owner's side: cancels once, from any thread.
#[derive(Clone)]
pub struct Canceller {
    state: CancelState,
    token: CancelToken,
}

/// The worker's side: cheap to clone, waits or checks.
#[derive(Clone)]
pub struct CancelToken {
    rx: Receiver<()>,
    reason: CancelState,
}

impl Canceller {
    pub fn new() -> Canceller {
        // Capacity 0: nothing is ever sent; the channel exists only to be disconnected.
        let (tx, rx) = bounded(0);
        let state = Arc::new(Mutex::new((Some(tx), None)));
        Canceller { token: CancelToken { rx, reason: Arc::clone(&state) }, state }
    }

    /// Cancels; returns false if it was already cancelled (the first reason wins).
    pub fn cancel(&self, reason: CancelReason) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match state.0.take() {
            Some(sender) => {
                state.1 = Some(reason);
                drop(sender);
                true
            }
            None => false,
        }
    }

    pub fn token(&self) -> CancelToken {
        self.token.clone()
    }
}

impl Default for Canceller {
    fn default() -> Self {
        Canceller::new()
    }
}

impl CancelToken {
    pub fn is_cancelled(&self) -> bool {
        matches!(self.rx.try_recv(), Err(TryRecvError::Disconnected))
    }

    /// Sleeps up to `timeout`; returns true as soon as the token is cancelled.
    pub fn wait(&self, timeout: Duration) -> bool {
        matches!(self.rx.recv_timeout(timeout), Err(RecvTimeoutError::Disconnected))
    }

    /// The receiver, for `select!` beside other channels; it disconnects on cancel.
    pub fn receiver(&self) -> &Receiver<()> {
        &self.rx
    }

    pub fn reason(&self) -> Option<CancelReason> {
        self.reason.lock().unwrap_or_else(|e| e.into_inner()).1
    }
}

/// Whether a cancel channel has fired: a message sent on it, or its sender gone (a
/// `CancelToken`'s receiver, a sandbox step's cancel). `crossbeam_channel::never()` never does.
pub fn fired(cancel: &Receiver<()>) -> bool {
    !matches!(cancel.try_recv(), Err(TryRecvError::Empty))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn cancel_wakes_a_waiter_and_keeps_the_first_reason() {
        let canceller = Canceller::new();
        let token = canceller.token();
        assert!(!token.is_cancelled());
        let waiter = std::thread::spawn(move || {
            let started = Instant::now();
            (token.wait(Duration::from_secs(10)), started.elapsed(), token.reason())
        });
        assert!(canceller.cancel(CancelReason::User));
        assert!(!canceller.cancel(CancelReason::Shutdown));
        let (cancelled, waited, reason) = waiter.join().unwrap();
        assert!(cancelled);
        assert!(waited < Duration::from_secs(5));
        assert_eq!(reason, Some(CancelReason::User));
    }

    #[test]
    fn a_channel_has_fired_once_sent_on_or_dropped_and_never_does_not() {
        let canceller = Canceller::new();
        assert!(!fired(canceller.token().receiver()));
        canceller.cancel(CancelReason::Shutdown);
        assert!(fired(canceller.token().receiver()));
        let (sender, receiver) = bounded(1);
        assert!(!fired(&receiver));
        sender.send(()).unwrap();
        assert!(fired(&receiver));
        assert!(!fired(&crossbeam_channel::never()));
    }
}
