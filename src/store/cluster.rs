//! What several nodes on one database share (docs/cluster.md): each node's row and heartbeat,
//! and session leases. A live session is owned by one node at a time through its lease row: a
//! claim is compare-and-set (it takes a free or expired lease, or keeps the caller's own), the
//! owner renews its leases while it holds them, and every claim by another node takes a new
//! epoch. Times are the database's clock.
//!
//! Fencing: the node's `LeaseBook` says which sessions it holds and at which epoch. The
//! writer checks each batch against the lease rows in the batch's own transaction (with the
//! rows locked for share, so a claim by another node waits for the commit or the check waits
//! for the claim): a write that names a session held by another node, or one this node held
//! at an epoch that is no longer the row's or whose lease ran out, is refused as `Fenced`.
//! A session no node holds may be written by any node (a rename of an idle session).
//!
//! The book also keeps, by this node's own clock, when each lease it holds may run out: a
//! claim or renewal's start, plus the lease, minus a margin (`cluster::Node` works it out).
//! Past that instant the node neither writes the session nor publishes its events nor sends
//! its frames (`Standing::Lapsed`), until a renewal says the lease is still its own; no
//! round trip to the database is needed to stop, so a node that was paused or cut off says
//! nothing more the moment it wakes.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use super::{StoreError, WriteOp};

/// A node as the cluster sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRow {
    pub id: String,
    pub advertise_url: String,
    pub started_at: String,
    pub heartbeat_at: String,
    /// Milliseconds since its last heartbeat, by the database's clock.
    pub heartbeat_age_ms: i64,
    /// Sessions it holds an unexpired lease of.
    pub live_sessions: i64,
}

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The caller holds the lease now, at this epoch.
    Held { epoch: i64 },
    /// Another node holds it.
    Owned(Owner),
}

/// The node holding a session's lease, and where to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub node_id: String,
    /// `None` when the node has no row (it never started, or its row was removed).
    pub advertise_url: Option<String>,
    pub epoch: i64,
    pub expired: bool,
}

/// Membership and leases, for a store several nodes share.
pub trait Membership: Send + Sync {
    /// Writes this node's row with the database's time as its heartbeat.
    fn heartbeat(&self, node: &str, advertise_url: &str) -> Result<(), StoreError>;
    /// Every node's row, by id.
    fn nodes(&self) -> Result<Vec<NodeRow>, StoreError>;
    /// Takes the session's lease for `lease_ms` if it is free, expired or already `node`'s.
    /// `MissingSession` when there is no such session.
    fn claim(&self, session_id: &str, node: &str, lease_ms: u64) -> Result<Claim, StoreError>;
    /// Extends every unexpired lease `node` holds; the ones it still holds, with their epochs.
    fn renew(&self, node: &str, lease_ms: u64) -> Result<Vec<(String, i64)>, StoreError>;
    /// Gives the lease up, if `node` still holds it at `epoch`.
    fn release(&self, session_id: &str, node: &str, epoch: i64) -> Result<bool, StoreError>;
    /// Sessions whose lease ran out (whichever node held it) or is held by `node`, at most
    /// `limit`: what a sweeper takes over, so that what their holder left is ended without
    /// waiting for the next operation (a node that restarts finds its old process's leases
    /// under its own id, and skips the ones it holds now).
    fn orphans(&self, node: &str, limit: i64) -> Result<Vec<String>, StoreError>;
    /// Calls `on_commit` with the log's last seq whenever another node commits events, on a
    /// `kestrel-listen` thread, until the listener is shut down.
    fn follow_log(
        &self,
        on_commit: super::postgres::listen::OnCommit,
    ) -> Result<super::postgres::listen::Listener, StoreError>;
    /// The log's last seq now, whichever node took it.
    fn log_position(&self) -> Result<u64, StoreError>;
    /// The value of `name` every node uses: `proposed` if no node set one before (the first
    /// node to start sets it), the one set before otherwise.
    fn agree(&self, name: &str, proposed: &str) -> Result<String, StoreError>;
    /// Who holds the session's lease, if any row says so.
    fn owner(&self, session_id: &str) -> Result<Option<Owner>, StoreError>;
}

/// A lease this node holds: its epoch, and when it may run out by this node's clock.
#[derive(Debug, Clone, Copy)]
struct Held {
    epoch: i64,
    until: Instant,
}

/// Where this node stands on a session, by its book and its own clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// It holds the lease, and by its clock until this instant at least.
    Held(Instant),
    /// It holds the lease, but by its clock the lease may have run out: it says nothing of
    /// the session until a renewal (or a claim) says the lease is still its own, or the next
    /// heartbeat finds it lost.
    Lapsed,
    /// It lost the lease and may still be acting on the session (see `LeaseBook::lost`).
    Lost,
    /// It holds no lease of the session.
    Free,
}

impl Standing {
    /// Whether this node may publish the session's events: not while a lease it had may have
    /// run out or is lost. A session no node holds is anyone's to announce (the writer fences
    /// what another node holds).
    pub fn may_publish(self) -> bool {
        match self {
            Standing::Held(_) | Standing::Free => true,
            Standing::Lapsed | Standing::Lost => false,
        }
    }
}

/// The sessions this node holds, at which epoch: what its writes are fenced by.
#[derive(Debug)]
pub struct LeaseBook {
    node: String,
    held: RwLock<HashMap<String, Held>>,
    /// Sessions whose lease this node lost while it may still have been acting on them: no
    /// write of this node touches them, even once no node holds them, until this node claims
    /// them again or what it was doing has stopped (`settle`).
    lost: RwLock<std::collections::HashSet<String>>,
}

impl LeaseBook {
    pub fn new(node: &str) -> Arc<LeaseBook> {
        Arc::new(LeaseBook { node: node.to_string(), held: RwLock::default(), lost: RwLock::default() })
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    /// This node holds the session's lease at `epoch`, until `until` by its clock at least.
    pub fn hold(&self, session_id: &str, epoch: i64, until: Instant) {
        self.write().insert(session_id.to_string(), Held { epoch, until });
        self.lost.write().unwrap_or_else(|e| e.into_inner()).remove(session_id);
    }

    /// A renewal kept these leases (session, epoch) until `until` at least: each one held
    /// here at that epoch lasts that long (a later instant a claim gave is kept).
    pub fn extend(&self, renewed: &[(String, i64)], until: Instant) {
        let mut held = self.write();
        for (session, epoch) in renewed {
            if let Some(lease) = held.get_mut(session).filter(|lease| lease.epoch == *epoch) {
                lease.until = lease.until.max(until);
            }
        }
    }

    /// Where this node stands on the session now.
    pub fn standing(&self, session_id: &str) -> Standing {
        let held = self.held.read().unwrap_or_else(|e| e.into_inner()).get(session_id).copied();
        match held {
            Some(lease) if Instant::now() < lease.until => Standing::Held(lease.until),
            Some(_) => Standing::Lapsed,
            None if self.was_lost(session_id) => Standing::Lost,
            None => Standing::Free,
        }
    }

    /// The lease was lost: the session is forgotten and fenced off (see `lost`).
    pub fn lose(&self, session_id: &str) {
        self.lost.write().unwrap_or_else(|e| e.into_inner()).insert(session_id.to_string());
        self.write().remove(session_id);
    }

    /// What this node was doing on a session whose lease it lost has stopped.
    pub fn settle(&self, session_id: &str) {
        self.lost.write().unwrap_or_else(|e| e.into_inner()).remove(session_id);
    }

    fn was_lost(&self, session_id: &str) -> bool {
        self.lost.read().unwrap_or_else(|e| e.into_inner()).contains(session_id)
    }

    /// Forgets the session; its epoch, if it was held.
    pub fn drop_session(&self, session_id: &str) -> Option<i64> {
        self.write().remove(session_id).map(|lease| lease.epoch)
    }

    pub fn epoch(&self, session_id: &str) -> Option<i64> {
        self.held.read().unwrap_or_else(|e| e.into_inner()).get(session_id).map(|lease| lease.epoch)
    }

    pub fn held(&self) -> Vec<(String, i64)> {
        let held = self.held.read().unwrap_or_else(|e| e.into_inner());
        held.iter().map(|(session, lease)| (session.clone(), lease.epoch)).collect()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Held>> {
        self.held.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a write may touch `session_id`, given its lease row (node, epoch, unexpired);
    /// `Fenced` if not. A lease this node holds must also not have run out by its own clock.
    pub fn admits(&self, session_id: &str, row: Option<(&str, i64, bool)>) -> Result<(), StoreError> {
        let mine = self.held.read().unwrap_or_else(|e| e.into_inner()).get(session_id).copied();
        let admitted = match (row, mine) {
            (None, None) => !self.was_lost(session_id),
            (None, Some(_)) => false,
            (Some((node, _, live)), None) => (node == self.node || !live) && !self.was_lost(session_id),
            (Some((node, epoch, live)), Some(held)) => {
                node == self.node && epoch == held.epoch && live && Instant::now() < held.until
            }
        };
        match admitted {
            true => Ok(()),
            false => Err(StoreError::Fenced(session_id.to_string())),
        }
    }
}

/// The sessions the ops write to, each once.
pub fn sessions_written<'a>(ops: impl Iterator<Item = &'a WriteOp>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let mut sessions: Vec<String> = Vec::new();
    let mut add = |id: &'a str| {
        if seen.insert(id) {
            sessions.push(id.to_string());
        }
    };
    for op in ops {
        match op {
            WriteOp::UpdateSession { id, .. } | WriteOp::DeleteSession { id } => add(id),
            WriteOp::AppendMessage { session_id, .. }
            | WriteOp::ReleaseTurn { session_id, .. }
            | WriteOp::InterruptTurn { session_id, .. }
            | WriteOp::MarkCallStarted { session_id, .. }
            | WriteOp::SettleCall { session_id, .. }
            | WriteOp::TruncateMessages { session_id, .. }
            | WriteOp::CompactHistory { session_id, .. } => add(session_id),
            WriteOp::ClaimTurn(claim) => add(&claim.session_id),
            WriteOp::InsertCheckpoint { record, .. } => add(&record.session_id),
            // Deltas too: they are not kept, but other nodes stream them (`live`).
            WriteOp::AppendLog { entries, live, .. } => {
                for event in entries.iter().flatten().chain(live.iter().map(|(_, delta)| delta)) {
                    if let Some(session) = &event.session_id {
                        add(session);
                    }
                }
            }
            WriteOp::InsertSession(_)
            | WriteOp::SessionRoom { .. }
            | WriteOp::RecoverTurns { .. }
            | WriteOp::RecordIdempotent(_)
            | WriteOp::Bae(_)
            | WriteOp::Policy(_)
            | WriteOp::Schedule(_)
            | WriteOp::Webhook(_) => {}
        }
    }
    sessions
}

/// A delta of `session` as a log append streams it to other nodes (for tests).
#[cfg(test)]
pub(crate) fn streamed_delta(session: &str) -> super::LoggedEvent {
    super::LoggedEvent {
        seq: 0,
        tenant: Some("t".into()),
        session_id: Some(session.into()),
        actor: None,
        kind: "message.delta".into(),
        at: "now".into(),
        body: "{}".into(),
        form: crate::domain::STORED_FORM,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Long past any test's end, by this node's clock.
    fn later() -> Instant {
        Instant::now() + std::time::Duration::from_secs(3600)
    }

    #[test]
    fn a_write_is_admitted_only_where_no_other_node_holds_the_session_and_this_one_holds_what_it_thinks() {
        let book = LeaseBook::new("a");
        // Held by no one: any node may write (an idle session's rename).
        assert!(book.admits("s", None).is_ok());
        assert!(book.admits("s", Some(("b", 4, false))).is_ok(), "an expired lease of another node");
        assert!(book.admits("s", Some(("b", 4, true))).is_err(), "a live lease of another node");
        book.hold("s", 7, later());
        assert!(book.admits("s", Some(("a", 7, true))).is_ok());
        assert!(book.admits("s", Some(("a", 7, false))).is_err(), "its own lease ran out");
        assert!(book.admits("s", Some(("a", 9, true))).is_err(), "claimed again since, at another epoch");
        assert!(book.admits("s", Some(("b", 8, false))).is_err(), "taken over, then let go");
        assert!(book.admits("s", None).is_err(), "released by another");
        assert_eq!(book.drop_session("s"), Some(7));
        assert!(book.admits("s", None).is_ok());
        // A lease lost while the node may still act on the session: nothing it writes is
        // kept, even once no node holds the session, until it has stopped or claims again.
        book.hold("s", 11, later());
        book.lose("s");
        assert!(book.admits("s", None).is_err(), "released by its new holder, still fenced here");
        assert!(book.admits("s", Some(("b", 12, false))).is_err());
        book.settle("s");
        assert!(book.admits("s", None).is_ok());
        book.lose("s");
        book.hold("s", 13, later());
        assert!(book.admits("s", Some(("a", 13, true))).is_ok(), "claimed again");
    }

    #[test]
    fn a_lease_that_may_have_run_out_by_this_nodes_clock_admits_nothing_until_a_renewal_says_otherwise() {
        let book = LeaseBook::new("a");
        assert_eq!(book.standing("s"), Standing::Free);
        let until = later();
        book.hold("s", 7, until);
        assert_eq!(book.standing("s"), Standing::Held(until));
        assert!(Standing::Held(until).may_publish() && Standing::Free.may_publish());
        // Its clock passed the lease's end (a pause, a late renewal): the database still
        // says the lease is live, and still nothing is written or published.
        book.hold("s", 7, Instant::now());
        assert_eq!(book.standing("s"), Standing::Lapsed);
        assert!(!Standing::Lapsed.may_publish());
        assert!(book.admits("s", Some(("a", 7, true))).is_err(), "refused by this node's own clock");
        // A renewal of another epoch says nothing of this one; one of this epoch extends it.
        book.extend(&[("s".to_string(), 6)], later());
        assert_eq!(book.standing("s"), Standing::Lapsed);
        book.extend(&[("s".to_string(), 7), ("t".to_string(), 7)], until);
        assert_eq!(book.standing("s"), Standing::Held(until));
        assert!(book.admits("s", Some(("a", 7, true))).is_ok());
        assert_eq!(book.standing("t"), Standing::Free, "a renewal holds nothing this node did not");
        // A renewal that started before a later claim does not shorten it.
        book.extend(&[("s".to_string(), 7)], Instant::now());
        assert_eq!(book.standing("s"), Standing::Held(until));
        // Lost: nothing, until it has settled.
        book.lose("s");
        assert_eq!(book.standing("s"), Standing::Lost);
        assert!(!Standing::Lost.may_publish());
        book.settle("s");
        assert_eq!(book.standing("s"), Standing::Free);
    }

    #[test]
    fn a_delta_names_its_session_for_the_fence_though_it_is_not_kept() {
        let append = WriteOp::AppendLog {
            entries: vec![None, Some(streamed_delta("kept")), None],
            floor: 0,
            keep: 10,
            live: vec![(0, streamed_delta("streamed")), (2, streamed_delta("kept"))],
        };
        assert_eq!(sessions_written([append].iter()), ["kept", "streamed"]);
    }
}
