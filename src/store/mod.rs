//! Durable state: one SQLite file in the data dir.
//!
//! Owns the only `rusqlite` import in the crate. One writer thread owns the write connection
//! and takes `WriteOp` batches over a channel (see `writer.rs`); readers borrow connections
//! from a small pool on the calling thread (see `reader.rs`). The database runs in WAL mode
//! with `synchronous=FULL`: a write whose reply has arrived survives a power cut.

mod bae;
mod checkpoints;
pub mod cluster;
#[cfg(test)]
pub mod conformance;
mod contract;
mod group_commit;
mod housekeeping;
mod lock;
mod migrate;
mod policy;
pub mod postgres;
mod reader;
mod rows;
pub(crate) mod schedules;
mod sqlite;
mod webhooks;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crossbeam_channel::{bounded, Receiver};

use crate::domain::{Message, SessionRecord, SessionStatus, ToolCall};

pub use bae::{BaeSessionRecord, BaeState, BaeWrite, EventPage, KeyRecord, Page, ProfileRecord, BAE_TENANT};
pub use checkpoints::{CheckpointEntry, CheckpointKind, CheckpointRecord, Manifest};
pub use contract::{
    Backend, BaeReads, Busy, CheckpointReads, Claims, Committed, LogReads, PolicyReads, Reads, Recovery, Reply,
    ScheduleReads, Seqs, SessionReads, TurnClaim, WebhookReads, Writes,
};
pub use policy::{AuditQuery, PolicyWrite};
pub use reader::EventQuery;
pub use schedules::ScheduleWrite;
pub use sqlite::Sqlite;
pub use webhooks::WebhookWrite;
pub use writer::WriterHandle;

/// The database file's name inside the data dir.
pub const DB_FILE: &str = "kestrel.db";

/// The `Retry-After` of a 503 answered while the database is away, in seconds.
pub const RETRY_AFTER_SECS: u64 = 2;

#[derive(Debug)]
pub enum StoreError {
    /// The backend refused a statement or a commit.
    Backend(String),
    /// The data dir could not be created or opened.
    Io(std::io::Error),
    /// The writer thread has stopped; the server is shutting down.
    Closed,
    /// A stored row could not be decoded.
    Corrupt(String),
    /// Another server holds the data dir (`holder` is its pid when it wrote one).
    Locked { dir: PathBuf, holder: Option<u32> },
    /// The write names a session that no longer exists (deleted a moment before).
    MissingSession,
    /// The write would repeat a unique key.
    Conflict(String),
    /// The row the write changes does not exist (or was soft-deleted).
    NotFound,
    /// The profile still has this many active client keys.
    InUse(u64),
    /// The tenant has this many sessions already, as many as it may (`WriteOp::SessionRoom`).
    SessionLimit(u64),
    /// A turn already holds the session (a claim lost its compare-and-set).
    Busy,
    /// The database cannot be reached for now (a restart, a failover, a timed-out
    /// statement); worth trying again in a moment.
    Unavailable(String),
    /// The write holds text the database cannot keep (a NUL character, in PostgreSQL).
    Unrepresentable(String),
    /// The PostgreSQL database could not be opened (its URL, server, user or database).
    Connect(self::postgres::PgError),
    /// This node no longer holds the lease of the session the write names (`cluster.rs`):
    /// another node owns it, or the lease ran out. Nothing of the write is kept.
    Fenced(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Backend(message) => write!(f, "store: {message}"),
            StoreError::Busy => write!(f, "a turn holds the session"),
            StoreError::Unavailable(why) => write!(f, "the database is unavailable for now: {why}"),
            StoreError::Connect(error) => write!(f, "{error}"),
            StoreError::Unrepresentable(why) => write!(f, "text the database cannot keep: {why}"),
            StoreError::Fenced(session) => write!(f, "this node no longer holds session {session}'s lease"),
            StoreError::Io(error) => write!(f, "data dir: {error}"),
            StoreError::Closed => write!(f, "the store is closed"),
            StoreError::Corrupt(message) => write!(f, "corrupt row: {message}"),
            StoreError::MissingSession => write!(f, "the session does not exist"),
            StoreError::Conflict(message) => write!(f, "conflict: {message}"),
            StoreError::NotFound => write!(f, "no such row"),
            StoreError::InUse(count) => write!(f, "still used by {count} active key(s)"),
            StoreError::SessionLimit(max) => write!(f, "the tenant has {max} sessions, as many as it may"),
            StoreError::Locked { dir, holder } => {
                write!(f, "the data dir {} is in use by another Kestrel server", dir.display())?;
                match holder {
                    Some(pid) => write!(f, " (pid {pid}); stop it first, or give this one another data dir"),
                    None => write!(f, "; stop it first, or give this one another data dir"),
                }
            }
        }
    }
}

impl std::error::Error for StoreError {}

impl StoreError {
    /// The same error again, for each write of a batch that failed as one (an I/O error
    /// becomes its message).
    pub(crate) fn again(&self) -> StoreError {
        match self {
            StoreError::Backend(why) => StoreError::Backend(why.clone()),
            StoreError::Io(error) => StoreError::Backend(error.to_string()),
            StoreError::Closed => StoreError::Closed,
            StoreError::Corrupt(why) => StoreError::Corrupt(why.clone()),
            StoreError::Locked { dir, holder } => StoreError::Locked { dir: dir.clone(), holder: *holder },
            StoreError::MissingSession => StoreError::MissingSession,
            StoreError::Conflict(why) => StoreError::Conflict(why.clone()),
            StoreError::NotFound => StoreError::NotFound,
            StoreError::InUse(count) => StoreError::InUse(*count),
            StoreError::SessionLimit(max) => StoreError::SessionLimit(*max),
            StoreError::Busy => StoreError::Busy,
            StoreError::Unavailable(why) => StoreError::Unavailable(why.clone()),
            StoreError::Connect(error) => StoreError::Backend(error.to_string()),
            StoreError::Unrepresentable(why) => StoreError::Unrepresentable(why.clone()),
            StoreError::Fenced(session) => StoreError::Fenced(session.clone()),
        }
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(error: rusqlite::Error) -> Self {
        use rusqlite::ffi;
        if let rusqlite::Error::SqliteFailure(failure, _) = &error {
            match failure.extended_code {
                // Every foreign key in the schema points at `sessions`.
                ffi::SQLITE_CONSTRAINT_FOREIGNKEY => return StoreError::MissingSession,
                ffi::SQLITE_CONSTRAINT_PRIMARYKEY | ffi::SQLITE_CONSTRAINT_UNIQUE => {
                    return StoreError::Conflict(error.to_string())
                }
                _ => {}
            }
        }
        StoreError::Backend(error.to_string())
    }
}

/// What may change about a session. `None` leaves a field alone.
#[derive(Debug, Clone, Default)]
pub struct SessionPatch {
    pub title: Option<String>,
    pub model: Option<String>,
    /// `Some(None)` clears the prompt.
    pub system_prompt: Option<Option<String>>,
    pub status: Option<SessionStatus>,
    /// A new workspace, already checked and canonical.
    pub workspace: Option<String>,
}

/// One change to the database. A batch of ops sent together commits atomically.
#[derive(Debug, Clone)]
pub enum WriteOp {
    /// Fails the write with `SessionLimit(max)` when `tenant` has `max` sessions or more; it
    /// goes before the `InsertSession` it guards, in the same write, so the count and the
    /// insert commit together (one writer per process; PostgreSQL takes a lock per tenant
    /// first, so the nodes of a cluster count in turn).
    SessionRoom {
        tenant: String,
        max: u64,
    },
    InsertSession(SessionRecord),
    UpdateSession {
        id: String,
        patch: SessionPatch,
        updated_at: String,
    },
    DeleteSession {
        id: String,
    },
    /// Appends to a transcript, bumping the session's message count and `updated_at`.
    AppendMessage {
        session_id: String,
        message: Message,
        updated_at: String,
    },
    /// Claims the session's turn (`Claims::claim_turn`): fails the batch with `Busy` if a
    /// turn holds it.
    ClaimTurn(TurnClaim),
    /// Ends the turn `run_id` holds with `status`; nothing if another run holds the session.
    ReleaseTurn {
        session_id: String,
        run_id: String,
        status: SessionStatus,
        at: String,
    },
    /// Ends, as `interrupted`, the session's turn whichever node ran it: this node has just
    /// taken the session's lease from a holder that can no longer run it (`engine/tenure.rs`).
    InterruptTurn {
        session_id: String,
        at: String,
    },
    /// Ends, as `interrupted`, the turns `node` held and those no node owns (`Recovery`).
    RecoverTurns {
        node: String,
        at: String,
    },
    /// Records that a tool call is about to execute. Committed before the tool runs, so a call
    /// without this mark provably never ran. The mark keeps the call and whom its turn acted
    /// for; it stays unsettled until `SettleCall`.
    MarkCallStarted {
        session_id: String,
        call: Box<ToolCall>,
        actor: Option<String>,
        at: String,
    },
    /// The call's result is recorded: its mark is settled.
    SettleCall {
        session_id: String,
        call_id: String,
    },
    /// The answer to a request sent with an Idempotency-Key; also drops expired answers.
    RecordIdempotent(IdempotentAnswer),
    /// Appends a batch to the event log: each entry takes the next seq (above `floor` and
    /// every seq committed before, see `Seqs`), a logged one (`Some`, its `seq` ignored) is
    /// kept, and events more than `keep` seqs older than the last are dropped (never a BAE
    /// session's: that is its history). At most one per batch.
    AppendLog {
        entries: Vec<Option<LoggedEvent>>,
        floor: u64,
        keep: u64,
        /// Entries not kept (deltas) that the other nodes of a cluster stream live: each
        /// one's place in `entries` and its form; the commit hands them, with their seqs, to
        /// the other nodes (`postgres/listen.rs`) and keeps none. Empty alone.
        live: Vec<(usize, LoggedEvent)>,
    },
    /// A change to the BAE client API's own tables.
    Bae(BaeWrite),
    /// Drops a message and every later one of its session (a rewind).
    TruncateMessages {
        session_id: String,
        from_message_id: String,
        updated_at: String,
    },
    /// A compaction: `summary` goes before the `kept` messages (moved after it, in order),
    /// and the `hidden` ones are marked `meta.compacted`.
    CompactHistory {
        session_id: String,
        summary: Message,
        hidden: Vec<String>,
        kept: Vec<String>,
    },
    /// A checkpoint's manifest (its blobs are written before).
    InsertCheckpoint {
        record: CheckpointRecord,
        manifest: Manifest,
    },
    /// A change to the permission rules or the audit log.
    Policy(PolicyWrite),
    /// A change to the scheduled runs.
    Schedule(ScheduleWrite),
    /// A change to the webhooks or their deliveries.
    Webhook(WebhookWrite),
}

/// An event as the log keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LoggedEvent {
    pub seq: u64,
    pub tenant: Option<String>,
    pub session_id: Option<String>,
    /// Whom the event is attributed to (a BAE client key id), if anyone.
    pub actor: Option<String>,
    /// The event's `type`.
    pub kind: String,
    /// When it was published (RFC 3339).
    pub at: String,
    /// The event's JSON, in the stored form `form`.
    pub body: String,
    pub form: i64,
}

/// A stored message's body, in its stored form.
pub(crate) fn decode_message(body: &str, form: i64) -> Result<Message, StoreError> {
    match form {
        crate::domain::STORED_FORM => serde_json::from_str(body).map_err(|e| StoreError::Corrupt(e.to_string())),
        other => Err(StoreError::Corrupt(format!("a message in stored form {other}, which this server does not read"))),
    }
}

/// A logged event's body, in its stored form.
pub fn decode_event(logged: &LoggedEvent) -> Result<crate::domain::Event, StoreError> {
    match logged.form {
        crate::domain::STORED_FORM => crate::domain::Event::from_stored(&logged.kind, &logged.body)
            .map_err(|e| StoreError::Corrupt(e.to_string())),
        other => Err(StoreError::Corrupt(format!("an event in stored form {other}, which this server does not read"))),
    }
}

/// Where a walk of a tenant's sessions is (migration 0012 tells how a walk stays stable):
/// its start (`as_of`, a tick of `session_moves`; `None` for a first page, which starts the
/// walk) and, after its first page, the place of the last session listed (`after`: that
/// session's `updated_at` as of the start, and its id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionWalk {
    pub as_of: Option<i64>,
    pub after: Option<(String, String)>,
}

/// A page of a walk: the walk's start and the sessions listed.
#[derive(Debug, Clone, PartialEq)]
pub struct WalkPage {
    pub as_of: i64,
    pub sessions: Vec<Walked>,
}

/// A session as a walk lists it: its place (`updated_at` as of the walk's start) and summary.
#[derive(Debug, Clone, PartialEq)]
pub struct Walked {
    pub position: String,
    pub summary: crate::domain::SessionSummary,
}

/// A walk's page: the sessions found, by place (most recent first, ties by id, descending),
/// at most `limit`.
pub(crate) fn walked_page(as_of: i64, mut page: Vec<Walked>, limit: usize) -> WalkPage {
    page.sort_by(|a, b| (&b.position, &b.summary.id).cmp(&(&a.position, &a.summary.id)));
    page.truncate(limit);
    WalkPage { as_of, sessions: page }
}

/// How long a walk may last: moves are kept a minute longer than this.
pub const WALK_TTL_MS: i64 = 15 * 60 * 1000;

/// A call marked as started whose result was never recorded (`ReaderPool::unsettled_calls`).
#[derive(Debug, Clone)]
pub struct UnsettledCall {
    pub session_id: String,
    /// Whom the call's turn acted for (a BAE client key id), if anyone.
    pub actor: Option<String>,
    pub call: ToolCall,
}

/// How long an Idempotency-Key's answer is kept: 24 hours.
pub const IDEMPOTENCY_TTL_MS: i64 = 24 * 60 * 60 * 1000;

/// A stored answer to a request sent with an Idempotency-Key.
#[derive(Debug, Clone)]
pub struct IdempotentAnswer {
    pub tenant: String,
    pub key: String,
    pub fingerprint: String,
    pub status: u16,
    pub body: Vec<u8>,
    /// Milliseconds since the epoch.
    pub created_ms: i64,
}

enum WriterMsg {
    Write { ops: Vec<WriteOp>, reply: Option<Reply> },
    Shutdown,
}

/// A cheap, cloneable handle on the store's backend.
#[derive(Clone)]
pub struct Store {
    backend: Arc<dyn Backend>,
    /// Where checkpoint contents go when the backend keeps them (`None`: files in the data
    /// dir).
    blobs: Option<Arc<dyn crate::checkpoints::blobs::Blobs>>,
    /// Membership and leases, with this node's lease book, when it is one of a cluster.
    cluster: Option<(Arc<dyn cluster::Membership>, Arc<cluster::LeaseBook>)>,
}

/// The data dir, made if missing, readable only by its owner (0700): every tenant's
/// transcripts, the key files and the database are in it.
fn make_private(data_dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(data_dir)?;
    std::fs::set_permissions(data_dir, std::fs::Permissions::from_mode(0o700))
}

/// A database file readable only by its owner (0600): made empty when `create` and missing
/// (SQLite then gives its WAL and shared-memory files the same mode), made private if there.
fn private_file(path: &Path, create: bool) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    if create {
        std::fs::OpenOptions::new().write(true).create(true).truncate(false).mode(0o600).open(path)?;
    }
    match std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound && !create => Ok(()),
        other => other,
    }
}

impl Store {
    /// A handle on `backend`.
    pub fn new(backend: Arc<dyn Backend>) -> Store {
        Store { backend, blobs: None, cluster: None }
    }

    /// Where checkpoint contents go, if the backend keeps them itself.
    pub fn blobs(&self) -> Option<Arc<dyn crate::checkpoints::blobs::Blobs>> {
        self.blobs.clone()
    }

    /// Locks `data_dir` for this process, opens the PostgreSQL database at `url` (applying
    /// migrations) with `pool` connections for readers, and starts its writer thread;
    /// checkpoint contents live in the database.
    /// The data dir is still this process's alone (its lock, its process markers).
    pub fn open_postgres(data_dir: &Path, url: &str, pool: u32) -> Result<(Store, WriterHandle), StoreError> {
        Store::postgres_of(data_dir, url, pool, None)
    }

    /// As `open_postgres`, for node `node` of a cluster: its writes are fenced by its leases
    /// (`cluster.rs`).
    pub fn open_cluster_node(
        data_dir: &Path,
        url: &str,
        pool: u32,
        node: &str,
    ) -> Result<(Store, WriterHandle), StoreError> {
        Store::postgres_of(data_dir, url, pool, Some(cluster::LeaseBook::new(node)))
    }

    fn postgres_of(
        data_dir: &Path,
        url: &str,
        pool: u32,
        book: Option<Arc<cluster::LeaseBook>>,
    ) -> Result<(Store, WriterHandle), StoreError> {
        make_private(data_dir).map_err(StoreError::Io)?;
        let lock = lock::DataDirLock::acquire(data_dir)?;
        let (backend, handle) = self::postgres::Postgres::open(url, pool, Some(lock), book.clone())?;
        let blobs = backend.blobs();
        let cluster = book.map(|book| (backend.membership(), book));
        Ok((Store { backend: Arc::new(backend), blobs: Some(blobs), cluster }, handle))
    }

    /// Membership and leases, and this node's lease book, when it is one of a cluster.
    pub fn cluster(&self) -> Option<&(Arc<dyn cluster::Membership>, Arc<cluster::LeaseBook>)> {
        self.cluster.as_ref()
    }

    /// Batches queued for the backend and not yet taken.
    pub fn queue_depth(&self) -> usize {
        self.backend.queue_depth()
    }

    /// Locks `data_dir` for this process, opens (creating if needed) the SQLite database in
    /// it, applies migrations and starts the writer thread. The returned handle stops the
    /// writer; the app does that last.
    pub fn open(data_dir: &Path) -> Result<(Store, WriterHandle), StoreError> {
        make_private(data_dir).map_err(StoreError::Io)?;
        let lock = lock::DataDirLock::acquire(data_dir)?;
        let path: PathBuf = data_dir.join(DB_FILE);
        for file in [DB_FILE, "kestrel.db-wal", "kestrel.db-shm"] {
            private_file(&data_dir.join(file), file == DB_FILE).map_err(StoreError::Io)?;
        }
        let (backend, handle) = Sqlite::open(&path, Some(lock))?;
        Ok((Store::new(Arc::new(backend)), handle))
    }

    /// Commits `ops` in one transaction and returns once it is durable.
    pub fn write(&self, ops: Vec<WriteOp>) -> Result<(), StoreError> {
        self.backend.submit_and_wait(ops).map(|_| ())
    }

    /// Queues `ops` and returns a receiver for the commit's outcome without waiting for it.
    pub fn write_pending(&self, ops: Vec<WriteOp>) -> Result<Receiver<Result<Committed, StoreError>>, StoreError> {
        let (reply, outcome) = bounded(1);
        self.backend.submit(ops, Some(reply))?;
        Ok(outcome)
    }

    /// Queues `ops` with nobody waiting; a failure is logged by the backend.
    pub fn write_detached(&self, ops: Vec<WriteOp>) -> Result<(), StoreError> {
        self.backend.submit(ops, None)
    }

    pub fn readers(&self) -> &dyn Reads {
        &*self.backend
    }

    /// The highest event seq allocated so far.
    pub fn last_seq(&self) -> Result<u64, StoreError> {
        self.backend.last_seq()
    }

    /// Claims a session's turn (see `Claims`).
    pub fn claim_turn(&self, claim: &TurnClaim, with: Vec<WriteOp>) -> Result<(), StoreError> {
        self.backend.claim_turn(claim, with)
    }

    /// Ends what `node` left running (see `Recovery`).
    pub fn recover(&self, node: &str) -> Result<Vec<String>, StoreError> {
        self.backend.recover(node, &crate::time::now_rfc3339())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_in_a_form_this_server_does_not_read_is_refused_not_misread() {
        let logged = |form| LoggedEvent {
            seq: 1,
            tenant: None,
            session_id: None,
            actor: None,
            kind: "notice".into(),
            at: "now".into(),
            body: r#"{"type":"notice","level":"info","message":"m"}"#.into(),
            form,
        };
        assert!(decode_event(&logged(crate::domain::STORED_FORM)).is_ok());
        assert!(matches!(decode_event(&logged(2)), Err(StoreError::Corrupt(_))));
        let body = serde_json::to_string(&Message::text_of(crate::domain::Role::User, "hi")).unwrap();
        assert!(decode_message(&body, crate::domain::STORED_FORM).is_ok());
        assert!(matches!(decode_message(&body, 0), Err(StoreError::Corrupt(_))));
    }
}
