//! What the engine may ask of a store, and what every backend must keep: the contract the
//! conformance suite (`conformance/`) checks. SQLite (`sqlite.rs`) is the first backend; the
//! contract is written for a database several Kestrel processes ("nodes") share.
//!
//! - **Writes** (`Writes`): a batch of `WriteOp`s commits atomically or not at all, and its
//!   reply comes only once it is durable. Batches of one node commit in the order they were
//!   submitted.
//! - **Seqs** (`Seqs`): every event of the log gets its seq inside the transaction that commits
//!   it, above every seq committed before by any node, so commit order is seq order and no
//!   reader ever sees seq N+1 before N. A batch's entries take consecutive seqs; an entry that
//!   is not kept (a token delta) takes its seq and leaves a gap in the log.
//! - **Claims** (`Claims`): a session's turn is claimed by compare-and-set: a claim succeeds
//!   only if no turn holds the session, and names the run and the node. A release only ends the
//!   claim of the run that holds it (a stale node cannot end another's turn).
//! - **Recovery** (`Recovery`): at start, a node ends only the turns it held itself (and those
//!   of rows written before turns had owners), as `interrupted`; another node's live turns are
//!   left alone.
//! - **Reads** (`Reads`): what is read was committed; a read never waits for a write.

use std::collections::{HashMap, HashSet};

use crossbeam_channel::Sender;

use super::AuditQuery;
use super::{
    BaeSessionRecord, BaeState, CheckpointEntry, CheckpointRecord, EventQuery, IdempotentAnswer, KeyRecord,
    LoggedEvent, Page, ProfileRecord, SessionWalk, StoreError, UnsettledCall, WalkPage, WriteOp,
};
use crate::auth::keys::KeyRole;
use crate::domain::{Message, SessionRecord, SessionStatus, SessionSummary};
use crate::policy::{AuditEntry, Rule, Spent};
use crate::schedule::{Fire, Schedule};
use crate::webhooks::{Attempt, Delivery, Webhook};

/// What a committed batch reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Committed {
    /// The seq of the first entry of the batch's log append, if it had one.
    pub first_seq: Option<u64>,
}

/// Where a batch's outcome goes.
pub type Reply = Sender<Result<Committed, StoreError>>;

/// Batches of changes.
pub trait Writes: Send + Sync {
    /// Queues `ops` to commit in one transaction; `reply` hears how it went once it is durable
    /// (with no reply, a failure is logged). An error here means nothing was queued.
    fn submit(&self, ops: Vec<WriteOp>, reply: Option<Reply>) -> Result<(), StoreError>;
    /// Batches queued and not yet taken by the backend.
    fn queue_depth(&self) -> usize;

    /// Queues `ops` and waits until they are durable.
    fn submit_and_wait(&self, ops: Vec<WriteOp>) -> Result<Committed, StoreError> {
        let (reply, outcome) = crossbeam_channel::bounded(1);
        self.submit(ops, Some(reply))?;
        outcome.recv().unwrap_or(Err(StoreError::Closed))
    }
}

/// The event log's seqs. Appending is a `WriteOp::AppendLog` in a batch (so the events commit
/// with the changes they announce); its seqs are allocated in that batch's transaction, and
/// `Committed::first_seq` says where they start.
pub trait Seqs: Send + Sync {
    /// The highest seq allocated so far, 0 in a new store.
    fn last_seq(&self) -> Result<u64, StoreError>;
}

/// Who runs a session's turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnClaim {
    pub session_id: String,
    pub run_id: String,
    /// The node (process) that runs it.
    pub node: String,
    pub at: String,
}

/// Compare-and-set claims of a session's turn.
pub trait Claims: Writes {
    /// Marks the session `running` under `claim`, committing `with` in the same transaction,
    /// if no turn holds it; `StoreError::Busy` (and nothing committed) if one does: a batch
    /// that starts with `WriteOp::ClaimTurn`.
    fn claim_turn(&self, claim: &TurnClaim, with: Vec<WriteOp>) -> Result<(), StoreError> {
        let mut ops = vec![WriteOp::ClaimTurn(claim.clone())];
        ops.extend(with);
        self.submit_and_wait(ops).map(|_| ())
    }
}

/// What a node does at start.
pub trait Recovery: Send + Sync {
    /// Ends, as `interrupted`, every turn `node` held when it stopped, and every turn of a row
    /// no node owns (written before claims had owners); another node's turns are left alone.
    /// Returns the sessions it ended.
    fn recover(&self, node: &str, at: &str) -> Result<Vec<String>, StoreError>;
}

/// Reads of sessions, transcripts, tool call marks and idempotent answers.
pub trait SessionReads: Send + Sync {
    fn session(&self, id: &str) -> Result<Option<SessionRecord>, StoreError>;
    /// A tenant's sessions, most recently updated first.
    fn sessions_of(&self, tenant: &str) -> Result<Vec<SessionSummary>, StoreError>;
    /// A number that changes whenever a session is created, deleted, or changes a field of
    /// its summary, its system prompt or its messages: while it stays, `sessions_of`,
    /// `session` and `messages` answer the same.
    fn sessions_version(&self) -> Result<i64, StoreError>;
    /// Up to `limit` of a tenant's sessions that existed at the walk's start, after its place,
    /// ordered by `updated_at` as of the start (most recent first, ties by id, descending). A
    /// session updated since keeps its place, so a walk lists every session once.
    fn sessions_page(&self, tenant: &str, walk: &SessionWalk, limit: usize) -> Result<WalkPage, StoreError>;
    /// A session's messages, in order.
    fn messages(&self, session_id: &str) -> Result<Vec<Message>, StoreError>;
    /// The session's messages with these ids, by id (the ones that are gone are left out).
    fn messages_by_id(&self, session_id: &str, ids: &[String]) -> Result<HashMap<String, Message>, StoreError>;
    /// The ids of the session's tool calls that were marked as started.
    fn started_calls(&self, session_id: &str) -> Result<HashSet<String>, StoreError>;
    /// The calls of `tenant`'s sessions marked as started and never settled, oldest first.
    fn unsettled_calls(&self, tenant: &str) -> Result<Vec<UnsettledCall>, StoreError>;
    /// The answer stored for a tenant's Idempotency-Key, unless it expired before `now_ms`.
    fn idempotent(&self, tenant: &str, key: &str, now_ms: i64) -> Result<Option<IdempotentAnswer>, StoreError>;
    /// How many sessions have each status.
    fn sessions_by_status(&self) -> Result<Vec<(SessionStatus, u64)>, StoreError>;
    fn session_count(&self) -> Result<u64, StoreError>;
}

/// Reads of the event log.
pub trait LogReads: Send + Sync {
    /// Logged events with `after < seq < before` that `query` admits, in seq order, at most
    /// `limit`.
    fn events(&self, query: &EventQuery<'_>, limit: usize) -> Result<Vec<LoggedEvent>, StoreError>;
    /// Every tenant's logged events with `after < seq <= upto`, in seq order, at most `limit`:
    /// what other nodes of a cluster logged, for this node's bus.
    fn events_between(&self, after: u64, upto: u64, limit: usize) -> Result<Vec<LoggedEvent>, StoreError>;
    /// A page of a BAE session's events of these kinds, oldest first.
    fn bae_events(
        &self,
        session_id: &str,
        kinds: &[&str],
        after: u64,
        limit: usize,
    ) -> Result<Page<LoggedEvent>, StoreError>;
    /// The session a logged event belongs to.
    fn event_session(&self, seq: u64) -> Result<Option<String>, StoreError>;
    /// Whom the session's last event of `kind` was attributed to.
    fn bae_last_actor(&self, session_id: &str, kind: &str) -> Result<Option<String>, StoreError>;
}

/// Reads of the BAE client API's own tables.
pub trait BaeReads: Send + Sync {
    fn bae_profile(&self, id: &str) -> Result<Option<ProfileRecord>, StoreError>;
    fn bae_profiles(&self, after: u64, limit: usize) -> Result<Page<ProfileRecord>, StoreError>;
    fn bae_key_by_digest(&self, role: KeyRole, digest: &str) -> Result<Option<KeyRecord>, StoreError>;
    fn bae_client_keys(&self, after: u64, limit: usize) -> Result<Page<KeyRecord>, StoreError>;
    fn bae_admin_key_exists(&self) -> Result<bool, StoreError>;
    fn bae_session_key_count(&self, session_id: &str) -> Result<u64, StoreError>;
    fn bae_sessions_of_key(&self, client_id: &str) -> Result<Vec<String>, StoreError>;
    fn bae_session(&self, id: &str) -> Result<Option<BaeSessionRecord>, StoreError>;
    fn bae_sessions(
        &self,
        after: u64,
        limit: usize,
        state: Option<BaeState>,
    ) -> Result<Page<BaeSessionRecord>, StoreError>;
}

/// Reads of checkpoints.
pub trait CheckpointReads: Send + Sync {
    fn checkpoints(&self, session_id: &str) -> Result<Vec<CheckpointRecord>, StoreError>;
    fn checkpoint(&self, session_id: &str, id: &str) -> Result<Option<CheckpointRecord>, StoreError>;
    fn checkpoint_of_run(&self, session_id: &str, run_id: &str) -> Result<Option<CheckpointRecord>, StoreError>;
    /// The first automatic checkpoint taken after message `index` of the session.
    fn first_auto_checkpoint_after(&self, session_id: &str, index: u64)
        -> Result<Option<CheckpointRecord>, StoreError>;
    fn checkpoint_entries(&self, id: &str) -> Result<Vec<CheckpointEntry>, StoreError>;
    /// Whether any checkpoint refers to the blob.
    fn blob_referenced(&self, digest: &str) -> Result<bool, StoreError>;
}

/// Reads of permission rules and the audit log.
pub trait PolicyReads: Send + Sync {
    /// A tenant's stored rules: those of the tenant, and with `session_id` that session's too,
    /// oldest first.
    fn rules_of(&self, tenant: &str, session_id: Option<&str>) -> Result<Vec<Rule>, StoreError>;
    /// A session's own stored rules, oldest first.
    fn session_rules(&self, session_id: &str) -> Result<Vec<Rule>, StoreError>;
    /// What `scope` spent in the day and month periods named (`policy::periods`).
    fn spent(&self, scope: &str, day: &str, month: &str) -> Result<Spent, StoreError>;
    /// Audit entries `query` admits, in seq order, at most `limit`.
    fn audit(&self, query: &AuditQuery<'_>, limit: usize) -> Result<Vec<AuditEntry>, StoreError>;
}

/// Reads of scheduled runs.
pub trait ScheduleReads: Send + Sync {
    /// A tenant's schedules, oldest first.
    fn schedules_of(&self, tenant: &str) -> Result<Vec<Schedule>, StoreError>;
    fn schedule(&self, id: &str) -> Result<Option<Schedule>, StoreError>;
    /// Every schedule that will fire: not paused, with a next fire.
    fn active_schedules(&self) -> Result<Vec<Schedule>, StoreError>;
    /// A schedule's fires, newest first, at most `limit`.
    fn fires(&self, schedule_id: &str, limit: usize) -> Result<Vec<Fire>, StoreError>;
}

/// What a read of due deliveries leaves out: endpoints with a delivery in flight, and tenants
/// with as many in flight as they may have (`webhooks/deliver.rs`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Busy<'a> {
    pub webhooks: &'a [String],
    pub tenants: &'a [String],
}

/// Reads of webhook endpoints and their deliveries.
pub trait WebhookReads: Send + Sync {
    /// A tenant's endpoints, oldest first.
    fn webhooks_of(&self, tenant: &str) -> Result<Vec<Webhook>, StoreError>;
    fn webhook(&self, id: &str) -> Result<Option<Webhook>, StoreError>;
    /// Pending deliveries of enabled endpoints due by `now_ms`, soonest first, each with its
    /// endpoint's tenant; none of the endpoints or tenants `busy` names.
    fn due_deliveries(&self, now_ms: i64, limit: usize, busy: &Busy<'_>)
        -> Result<Vec<(String, Delivery)>, StoreError>;
    /// When the next pending delivery of an enabled endpoint is due.
    fn next_delivery_at(&self) -> Result<Option<i64>, StoreError>;
    /// Whether any endpoint is enabled (without one, no delivery can be made or sent).
    fn any_enabled_webhook(&self) -> Result<bool, StoreError>;
    /// An endpoint's deliveries, newest first, each with its attempts.
    fn deliveries(&self, webhook_id: &str, limit: usize) -> Result<Vec<(Delivery, Vec<Attempt>)>, StoreError>;
}

/// Every read.
pub trait Reads:
    SessionReads + LogReads + BaeReads + CheckpointReads + PolicyReads + ScheduleReads + WebhookReads
{
}

impl<T> Reads for T where
    T: SessionReads + LogReads + BaeReads + CheckpointReads + PolicyReads + ScheduleReads + WebhookReads
{
}

/// A store backend: everything above.
pub trait Backend: Reads + Writes + Seqs + Claims + Recovery {}

impl<T: Reads + Writes + Seqs + Claims + Recovery> Backend for T {}
