//! Idempotency-Key: a request repeated with the same key gets the first answer and creates
//! nothing new.
//!
//! Runs on request threads. A key is claimed in memory while its request is handled, so a
//! concurrent repeat waits for the first instead of racing it; the answer is stored in the
//! same transaction as what the request created (see `Engine::create_session`,
//! `Engine::send_message`), so a crash can never leave a creation without its answer. Only
//! successes are stored: a request that failed may be retried with the same key.

use std::collections::HashSet;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{EngineError, Shared};
use crate::domain::SessionDetail;
use crate::store::{IdempotentAnswer, WriteOp};

/// How long a repeat waits for the first request with its key to finish.
const IN_FLIGHT_WAIT: Duration = Duration::from_secs(30);

/// What was created, for rendering the answer before it is stored.
pub enum Created<'a> {
    Session(&'a SessionDetail),
    Run(&'a str),
}

/// An answer renderer: the status and body the front door sends for what was created.
pub type Render = Box<dyn FnOnce(Created<'_>) -> (u16, Vec<u8>) + Send>;

/// A request's key, its fingerprint and how to render its answer.
pub struct Idempotent {
    pub tenant: String,
    pub key: String,
    pub fingerprint: String,
    pub render: Render,
}

impl Idempotent {
    /// The write that stores the answer next to what was created.
    pub(super) fn record(self, created: Created<'_>) -> WriteOp {
        let (status, body) = (self.render)(created);
        WriteOp::RecordIdempotent(IdempotentAnswer {
            tenant: self.tenant,
            key: self.key,
            fingerprint: self.fingerprint,
            status,
            body,
            created_ms: crate::time::now_millis(),
        })
    }
}

/// What a key lookup found.
pub enum Lookup<'a> {
    /// The key's first answer, to send again.
    Replay { status: u16, body: Vec<u8> },
    /// A new key, claimed until the returned guard is dropped.
    Fresh(Claim<'a>),
}

/// Keys whose request is being handled right now.
#[derive(Default)]
pub struct Claims {
    held: Mutex<HashSet<(String, String)>>,
    released: Condvar,
}

/// A claimed key; dropping it lets a waiting repeat go on.
pub struct Claim<'a> {
    claims: &'a Claims,
    id: (String, String),
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.claims.held.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.id);
        self.claims.released.notify_all();
    }
}

impl Shared {
    /// Claims `key` for `tenant`, or finds its stored answer; a stored answer for another
    /// request is a conflict.
    pub(super) fn idempotency(&self, tenant: &str, key: &str, fingerprint: &str) -> Result<Lookup<'_>, EngineError> {
        let id = (tenant.to_string(), key.to_string());
        let deadline = Instant::now() + IN_FLIGHT_WAIT;
        let mut held = self.claims.held.lock().unwrap_or_else(|e| e.into_inner());
        while held.contains(&id) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(EngineError::IdempotencyInFlight);
            }
            held = self.claims.released.wait_timeout(held, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        held.insert(id.clone());
        drop(held);
        // The claim is held while the store is read, so no repeat can slip in between.
        let claim = Claim { claims: &self.claims, id };
        match self.store.readers().idempotent(tenant, key, crate::time::now_millis())? {
            None => Ok(Lookup::Fresh(claim)),
            Some(answer) if answer.fingerprint == fingerprint => {
                Ok(Lookup::Replay { status: answer.status, body: answer.body })
            }
            Some(_) => Err(EngineError::IdempotencyConflict),
        }
    }
}
