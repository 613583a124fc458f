//! Named pools of reusable threads for short-lived work: a client connection
//! (`kestrel-conn`), a turn (`kestrel-run`), a session actor's busy spell
//! (`kestrel-session`), a provider call (`kestrel-upstream`), a session's slow step
//! (`kestrel-slow`).
//!
//! On a small VM starting and ending a thread costs about 50 µs of CPU, as much as a BAE
//! turn's whole HTTP exchange; a BAE client's turn used to start four. A pool hands the work
//! to a thread that finished its last job instead, and starts one only when none is idle.
//! A thread idle for `KEEP` ends, so a burst leaves nothing behind. Jobs are blocking and
//! may run for minutes; the pool never queues one behind another: every job gets a thread
//! at once, a reused one or a new one.
//!
//! The claim protocol: `idle` counts threads waiting for a job. A spawner takes one from it
//! before sending its job, so every job sent has a thread that will take it; a thread whose
//! wait times out must take itself from `idle` the same way before it may end, and if a
//! spawner got there first, a job is on its way and it waits for that instead.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, Sender};

/// Every pool thread's stack: handlers, turns and actors run on them, and an overflow would
/// abort the whole process, so this is std's default, set here so `RUST_MIN_STACK` cannot
/// shrink it. Only reserved, not committed, until used.
const STACK: usize = 2 * 1024 * 1024;

/// How long an idle thread waits for work before it ends.
const KEEP: Duration = Duration::from_secs(10);

type Job = Box<dyn FnOnce() + Send + 'static>;

/// A pool of threads that all carry one name.
pub struct Pool {
    name: &'static str,
    state: OnceLock<State>,
}

struct State {
    idle: AtomicUsize,
    jobs: Sender<Job>,
    inbox: Receiver<Job>,
}

/// One client connection's gate (`http/gate.rs`), for as long as the connection lasts.
pub static CONNECTIONS: Pool = Pool::new("kestrel-conn");
/// A turn's worker.
pub static RUNS: Pool = Pool::new("kestrel-run");
/// A session actor, while it has work.
pub static SESSIONS: Pool = Pool::new("kestrel-session");
/// The reader of one provider response.
pub static UPSTREAM: Pool = Pool::new("kestrel-upstream");
/// A session's slow step, off its actor: a checkpoint's walk, a restore, an image pull, a
/// container start or stop.
pub static SLOW: Pool = Pool::new("kestrel-slow");

impl Pool {
    pub const fn new(name: &'static str) -> Pool {
        Pool { name, state: OnceLock::new() }
    }

    /// Runs `job` on an idle thread of the pool, or on a new one. Fails only if no thread
    /// can be started.
    pub fn spawn(&'static self, job: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
        let state = self.state();
        let claimed = state.idle.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok();
        if claimed {
            // Every claimed thread is waiting on the inbox, which lives as long as the pool.
            let _ = state.jobs.send(Box::new(job));
            return Ok(());
        }
        std::thread::Builder::new().name(self.name.into()).stack_size(STACK).spawn(move || self.work(Box::new(job)))?;
        Ok(())
    }

    /// Threads waiting for a job right now (for tests and health checks).
    pub fn idle(&self) -> usize {
        self.state.get().map_or(0, |state| state.idle.load(Ordering::Acquire))
    }

    fn state(&self) -> &State {
        self.state.get_or_init(|| {
            let (jobs, inbox) = unbounded();
            State { idle: AtomicUsize::new(0), jobs, inbox }
        })
    }

    /// A pool thread: its first job, then whatever it is handed until it has waited `KEEP`.
    fn work(&'static self, first: Job) {
        let state = self.state();
        let mut job = first;
        loop {
            // A job that panics has logged it (the panic hook); the thread goes on.
            if catch_unwind(AssertUnwindSafe(job)).is_err() {
                log::error!("a {} job panicked", self.name);
            }
            state.idle.fetch_add(1, Ordering::AcqRel);
            job = loop {
                match state.inbox.recv_timeout(KEEP) {
                    Ok(next) => break next,
                    Err(RecvTimeoutError::Timeout) => {
                        let retired =
                            state.idle.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok();
                        if retired {
                            return;
                        }
                        // A spawner claimed this thread: its job is on the way.
                    }
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static TEST: Pool = Pool::new("kestrel-test-pool");

    #[test]
    fn a_finished_thread_takes_the_next_job_and_every_job_runs() {
        let (done_tx, done) = unbounded();
        let tx = done_tx.clone();
        TEST.spawn(move || tx.send(std::thread::current().id()).unwrap()).unwrap();
        let first = done.recv_timeout(Duration::from_secs(5)).unwrap();
        // Wait on the pool's own count, with a deadline, until the thread is idle again.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while TEST.idle() == 0 {
            assert!(std::time::Instant::now() < deadline, "the thread never became idle");
            std::thread::yield_now();
        }
        let tx = done_tx.clone();
        TEST.spawn(move || tx.send(std::thread::current().id()).unwrap()).unwrap();
        assert_eq!(done.recv_timeout(Duration::from_secs(5)).unwrap(), first, "the idle thread was reused");

        // Blocking jobs never wait for each other: eight at once all start.
        let gate = std::sync::Arc::new(std::sync::Barrier::new(9));
        for _ in 0..8 {
            let (gate, tx) = (std::sync::Arc::clone(&gate), done_tx.clone());
            TEST.spawn(move || {
                gate.wait();
                tx.send(std::thread::current().id()).unwrap();
            })
            .unwrap();
        }
        gate.wait();
        let ids: std::collections::HashSet<_> =
            (0..8).map(|_| done.recv_timeout(Duration::from_secs(5)).unwrap()).collect();
        assert_eq!(ids.len(), 8);
    }

    #[test]
    fn a_panicking_job_leaves_its_thread_working() {
        static PANICS: Pool = Pool::new("kestrel-test-panics");
        PANICS.spawn(|| panic!("on purpose")).unwrap();
        let (tx, done) = unbounded();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while PANICS.idle() == 0 {
            assert!(std::time::Instant::now() < deadline, "the thread did not survive the panic");
            std::thread::yield_now();
        }
        PANICS.spawn(move || tx.send(()).unwrap()).unwrap();
        done.recv_timeout(Duration::from_secs(5)).unwrap();
    }
}
