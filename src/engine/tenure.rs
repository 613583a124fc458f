//! A session's tenure on this node, when the node is one of a cluster's (docs/cluster.md).
//!
//! The engine knows leases only through `Leases`, which the cluster's node implements: an
//! operation that would make a session live here claims the session's lease first
//! (`Registry::send`), so a session is in this node's registry only while this node holds
//! its lease. The node tells the engine three things back:
//!
//! - `take_over`: it took a lease it did not hold, so the last holder (another node, or this
//!   node's previous process) may have left the session mid-turn. What it left is ended as a
//!   restart ends it: a running turn is stored `interrupted` (a resume re-asks its approvals
//!   and runs no started tool again), and each door records its own half-done work
//!   (`DoorShared::taken_over`).
//! - `evict`: it lost a lease. The session's turn stops and its door lets go of what only
//!   this node had (`SessionDoor::evicted`); its writes were refused from the moment the
//!   lease was lost (fencing, `store/cluster.rs`).
//! - `let_go_if_idle`: whether an idle session's lease may be given up, decided under the
//!   registry's lock so that no operation makes the session live meanwhile.

use std::sync::{Arc, Weak};

use super::registry::Registry;
use super::{Engine, EngineError, Shared};
use crate::domain::SessionStatus;
use crate::store::{StoreError, WriteOp};

/// A cluster's session leases, as the engine sees them.
pub trait Leases: Send + Sync {
    /// Holds the session's lease, claiming it if this node does not hold it yet; `Fenced`
    /// when another node holds it.
    fn acquire(&self, session_id: &str) -> Result<(), StoreError>;
    /// Whether this node holds the session's lease.
    fn holds(&self, session_id: &str) -> bool;
    /// A session whose lease this node lost has no actor here any more: nothing of this
    /// node's can still write it.
    fn settled(&self, session_id: &str);
}

/// The evicted actor of a session has left (`Registry::retire`).
pub(super) fn left(shared: &Shared, session_id: &str) {
    if let Some(leases) = shared.leases.get() {
        leases.settled(session_id);
    }
}

/// Claims the session's lease when the engine is clustered.
pub(super) fn acquire(shared: &Shared, session_id: &str) -> Result<(), EngineError> {
    match shared.leases.get() {
        Some(leases) => leases.acquire(session_id).map_err(EngineError::Store),
        None => Ok(()),
    }
}

/// Whether this node may run the session: always, when it is not clustered.
pub(super) fn holds(shared: &Shared, session_id: &str) -> bool {
    shared.leases.get().is_none_or(|leases| leases.holds(session_id))
}

/// An engine that does not keep the engine alive (the cluster's node holds one, and the
/// engine holds the node).
#[derive(Clone)]
pub struct WeakEngine(Weak<Shared>);

impl WeakEngine {
    pub fn upgrade(&self) -> Option<Engine> {
        self.0.upgrade().map(|shared| Engine { shared })
    }
}

impl Engine {
    /// Makes every operation that would make a session live claim its lease from `leases`.
    pub fn serve_leases(&self, leases: Arc<dyn Leases>) {
        if self.shared.leases.set(leases).is_err() {
            log::warn!("the engine already had its leases; the second set is ignored");
        }
    }

    pub fn downgrade(&self) -> WeakEngine {
        WeakEngine(Arc::downgrade(&self.shared))
    }

    /// Claims the session's lease for this node now (a door that keeps something of a
    /// session outside its actor, such as MCP connections made at open, claims before).
    pub fn hold_lease(&self, session_id: &str) -> Result<(), EngineError> {
        acquire(&self.shared, session_id)
    }

    /// This node has just taken the session's lease from whoever held it before: ends what
    /// that holder left (see the module doc). A session that no longer exists has nothing.
    pub fn take_over(&self, session_id: &str) -> Result<(), EngineError> {
        let Some(record) = self.shared.store.readers().session(session_id)? else {
            return Ok(());
        };
        if record.summary.status == SessionStatus::Running {
            let at = crate::time::now_rfc3339();
            self.shared.store.write(vec![WriteOp::InterruptTurn { session_id: session_id.to_string(), at }])?;
            log::info!("session {session_id}: the turn its last holder left running is interrupted");
            if let Some(record) = self.shared.store.readers().session(session_id)? {
                self.shared.publish_summary(&record);
            }
        }
        for door in &self.shared.doors {
            door.taken_over(self, &record)?;
        }
        Ok(())
    }

    /// This node lost the session's lease: stops its turn and lets its door's state go;
    /// whether an actor of the session is still leaving (`Leases::settled` follows).
    pub fn evict(&self, session_id: &str) -> bool {
        match self.shared.store.readers().session(session_id) {
            Ok(Some(record)) => Registry::evict(&self.shared, &record),
            Ok(None) => false,
            Err(error) => {
                log::warn!("session {session_id} was not evicted: {error}");
                false
            }
        }
    }

    /// Runs `let_go` (giving the session's lease up) if the session is idle here; whether it
    /// ran. Nothing makes the session live on this node while `let_go` runs.
    pub fn let_go_if_idle(&self, session_id: &str, let_go: &mut dyn FnMut()) -> bool {
        self.shared.sessions.let_go_if_idle(&self.shared, session_id, let_go)
    }
}
