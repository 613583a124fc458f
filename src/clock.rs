//! The time schedules fire by: the system's, or one a test moves by hand (`ManualClock`), so
//! a schedule's firing is tested by moving the clock, never by sleeping. `Config::clock`
//! holds it; only the scheduler reads it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

pub trait Clock: Send + Sync {
    /// Now, in milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
    /// How long a waiter for `deadline_ms` should block: the system clock's gap to it; `None`
    /// for a clock that only moves when told, and says so (`on_change`).
    fn wait_hint(&self, deadline_ms: i64) -> Option<Duration>;
    /// Registers `wake`, called whenever the clock is moved by hand (never by the system's).
    fn on_change(&self, wake: Box<dyn Fn() + Send + Sync>);
}

/// The system's clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        crate::time::now_millis()
    }

    fn wait_hint(&self, deadline_ms: i64) -> Option<Duration> {
        Some(Duration::from_millis(deadline_ms.saturating_sub(self.now_ms()).max(0) as u64))
    }

    fn on_change(&self, _: Box<dyn Fn() + Send + Sync>) {}
}

/// A clock that moves only when told: for tests, and for replaying a day of schedules.
pub struct ManualClock {
    now: Mutex<i64>,
    wakers: Mutex<Vec<Box<dyn Fn() + Send + Sync>>>,
}

impl ManualClock {
    pub fn at(now_ms: i64) -> Arc<ManualClock> {
        Arc::new(ManualClock { now: Mutex::new(now_ms), wakers: Mutex::default() })
    }

    /// Moves the clock forward and wakes every waiter.
    pub fn advance(&self, by: Duration) {
        *self.now.lock().unwrap_or_else(|e| e.into_inner()) += by.as_millis() as i64;
        for wake in self.wakers.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            wake();
        }
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        *self.now.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait_hint(&self, _: i64) -> Option<Duration> {
        None
    }

    fn on_change(&self, wake: Box<dyn Fn() + Send + Sync>) {
        self.wakers.lock().unwrap_or_else(|e| e.into_inner()).push(wake);
    }
}

/// The clock a server uses, in its `Config` (the system's by default).
#[derive(Clone)]
pub struct SharedClock(pub Arc<dyn Clock>);

impl Default for SharedClock {
    fn default() -> Self {
        SharedClock(Arc::new(SystemClock))
    }
}

impl std::fmt::Debug for SharedClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedClock({})", crate::time::rfc3339_from_millis(self.0.now_ms()))
    }
}
