//! Live sessions by id (`Registry`): the only shared map of per-session state, and it holds
//! only inboxes (or, for an idle session, what its door keeps, with no thread).
//!
//! Operations are sent while its lock is held (a send on an unbounded channel never blocks),
//! and an actor leaves the registry only under that lock and only with an empty inbox, so no
//! operation is ever sent to an actor that has stopped reading.
//!
//! In a cluster, a session is in this node's registry only while this node holds its lease:
//! an operation that would make it live claims the lease first (`tenure.rs`), and the check
//! that the lease is still held is made again under the lock, where an idle session's lease is
//! given up (`Registry::let_go_if_idle`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, Sender};

use super::plan::SessionDoor;
use super::session::{Op, SessionActor, SessionMsg};
use super::{tenure, EngineError, Shared};
use crate::domain::SessionRecord;

/// A session in the registry: an actor running, or what an idle session's door keeps between
/// requests (a BAE session's drivers, a paused turn) with no thread.
pub(super) enum Slot {
    Live(Sender<SessionMsg>),
    Dormant(Box<dyn SessionDoor>),
    /// An actor told to stop because another node took the session's lease: it takes no
    /// operation until it has left, so nothing of its last turn is written under a lease
    /// this node claims again.
    Leaving(Sender<SessionMsg>),
}

/// Live sessions by id: the only shared map.
#[derive(Default)]
pub(crate) struct Registry {
    actors: Mutex<HashMap<String, Slot>>,
    /// Signalled whenever an actor leaves.
    left: Condvar,
    pub(super) stopping: AtomicBool,
    /// Sessions with a turn running (for `Stats` and shutdown).
    pub(super) turns: AtomicUsize,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Slot>> {
        self.actors.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn active_turns(&self) -> usize {
        self.turns.load(Ordering::Relaxed)
    }

    /// Sends `op` to the session's actor, starting one if the session has none. In a cluster
    /// the session's lease is claimed first; if another node holds it, nothing is sent.
    pub fn send(shared: &Arc<Shared>, record: &SessionRecord, op: Op) -> Result<(), EngineError> {
        let id = &record.summary.id;
        tenure::acquire(shared, id)?;
        let registry = &shared.sessions;
        let mut actors = registry.lock();
        if registry.stopping.load(Ordering::SeqCst) {
            return Err(EngineError::ShuttingDown);
        }
        // Given up a moment ago by `let_go_if_idle`, which decides under this lock.
        if !tenure::holds(shared, id) {
            return Err(EngineError::Store(crate::store::StoreError::Fenced(id.clone())));
        }
        Registry::deliver(shared, &mut actors, record, op)
    }

    /// Sends `op` under the lock, starting an actor (with what the session's door kept) when
    /// none runs.
    fn deliver(
        shared: &Arc<Shared>,
        actors: &mut HashMap<String, Slot>,
        record: &SessionRecord,
        op: Op,
    ) -> Result<(), EngineError> {
        let id = &record.summary.id;
        let (op, door) = match actors.remove(id) {
            Some(Slot::Live(actor)) => match actor.send(SessionMsg::Op(op)) {
                Ok(()) => {
                    actors.insert(id.clone(), Slot::Live(actor));
                    return Ok(());
                }
                // An actor whose thread died (a bug, logged where it happened): start another.
                Err(unsent) => match unsent.0 {
                    SessionMsg::Op(op) => (op, None),
                    SessionMsg::Turn(_) | SessionMsg::Done(_) => unreachable!("an op was sent"),
                },
            },
            Some(Slot::Dormant(door)) => (op, Some(door)),
            Some(leaving @ Slot::Leaving(_)) => {
                actors.insert(id.clone(), leaving);
                return Err(EngineError::Store(crate::store::StoreError::Fenced(id.clone())));
            }
            None => (op, None),
        };
        let (tx, inbox) = unbounded();
        let _ = tx.send(SessionMsg::Op(op));
        let mut actor = SessionActor::new(Arc::clone(shared), record, inbox, tx.clone());
        actor.door = door;
        match crate::workers::SESSIONS.spawn(move || actor.run()) {
            Ok(_) => {
                actors.insert(id.clone(), Slot::Live(tx));
                Ok(())
            }
            Err(error) => {
                log::error!("cannot start a session thread: {error}");
                Err(EngineError::Overloaded)
            }
        }
    }

    /// Sends `op` to the session's actor if it has one; hands it back if not.
    pub fn send_if_live(&self, id: &str, op: Op) -> Result<(), Op> {
        let actors = self.lock();
        match actors.get(id) {
            Some(Slot::Live(actor)) => actor.send(SessionMsg::Op(op)).map_err(|e| match e.0 {
                SessionMsg::Op(op) => op,
                SessionMsg::Turn(_) | SessionMsg::Done(_) => unreachable!("an op was sent"),
            }),
            _ => Err(op),
        }
    }

    /// Runs `let_go` (which gives the session's lease up) if the session is not in the map,
    /// under the lock that `send` checks the lease under; whether it ran.
    pub(super) fn let_go_if_idle(&self, shared: &Shared, id: &str, let_go: &mut dyn FnMut()) -> bool {
        let actors = self.lock();
        let idle =
            !actors.contains_key(id) && !shared.bus.followed(id) && !shared.doors.iter().any(|door| door.keeps(id));
        if idle {
            let_go();
        }
        idle
    }

    /// The lease of the session went to another node: its turn is stopped and what its door
    /// keeps is let go (`Op::Evict`), with no lease claimed for it.
    /// Whether an actor is leaving (`tenure::left` follows once it has).
    pub(super) fn evict(shared: &Arc<Shared>, record: &SessionRecord) -> bool {
        let id = &record.summary.id;
        let mut actors = shared.sessions.lock();
        let mut leaving = matches!(actors.get(id), Some(Slot::Leaving(_)));
        if !leaving && actors.contains_key(id) {
            match Registry::deliver(shared, &mut actors, record, Op::Evict) {
                Ok(()) => {
                    if let Some(Slot::Live(actor)) = actors.remove(id) {
                        actors.insert(id.clone(), Slot::Leaving(actor));
                        leaving = true;
                    }
                }
                Err(error) => log::warn!("session {id}: its state was not let go: {error}"),
            }
        }
        drop(actors);
        for door in &shared.doors {
            door.let_go(id);
        }
        leaving
    }

    /// Takes an idle actor out of the map, unless something is waiting in its inbox. What its
    /// door keeps stays behind, with no thread, when there is any.
    pub(super) fn retire(
        &self,
        id: &str,
        inbox: &Receiver<SessionMsg>,
        door: &mut Option<Box<dyn SessionDoor>>,
    ) -> bool {
        let mut actors = self.lock();
        if !inbox.is_empty() {
            return false;
        }
        match door.take().filter(|door| door.worth_keeping()) {
            Some(door) => actors.insert(id.to_string(), Slot::Dormant(door)),
            None => actors.remove(id),
        };
        self.left.notify_all();
        true
    }

    /// Refuses new operations, tells every actor to stop its turn, and waits (at most `grace`)
    /// for them all to leave.
    pub fn shutdown(&self, grace: Duration) {
        self.stopping.store(true, Ordering::SeqCst);
        let mut actors = self.lock();
        actors.retain(|_, slot| !matches!(slot, Slot::Dormant(_)));
        for slot in actors.values() {
            if let Slot::Live(actor) | Slot::Leaving(actor) = slot {
                let _ = actor.send(SessionMsg::Op(Op::Shutdown));
            }
        }
        let deadline = Instant::now() + grace;
        while actors.values().any(|slot| !matches!(slot, Slot::Dormant(_))) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                log::warn!("{} session(s) did not stop within {grace:?}", actors.len());
                return;
            }
            actors = self.left.wait_timeout(actors, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}
