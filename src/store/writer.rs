//! The writer actor: the only thread that writes to SQLite.
//!
//! Runs on the `kestrel-store` thread the loop of `group_commit.rs` (a batch of whatever is
//! queued, one transaction, replies after the commit); this is how a batch commits in
//! SQLite. It exits on `Shutdown` after committing everything queued before it; the app
//! stops it last.

use std::path::Path;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};

use super::contract::Committed;
use super::housekeeping::{MoveMarks, Trim, TRIM_STEP_COMMIT, TRIM_STEP_IDLE};
use super::lock::DataDirLock;
use super::{SessionPatch, StoreError, WriteOp, WriterMsg};
use crate::domain::STORED_FORM;

pub(super) struct Writer {
    conn: Connection,
    /// How far the oldest events have been dropped, and how far they should be.
    trim: Trim,
    /// The last move's tick at each prune, oldest first: ticks no later than one marked more
    /// than `MOVES_KEPT` ago are older than any walk.
    move_marks: MoveMarks,
}

pub struct WriterHandle {
    writer_tx: Sender<WriterMsg>,
    thread: Option<JoinHandle<()>>,
    /// Released when the handle goes, after the writer's last commit.
    _lock: Option<DataDirLock>,
}

impl WriterHandle {
    /// A handle on the writer `thread` listening on `writer_tx`; `lock` goes with it.
    pub(super) fn new(writer_tx: Sender<WriterMsg>, thread: JoinHandle<()>, lock: Option<DataDirLock>) -> WriterHandle {
        WriterHandle { writer_tx, thread: Some(thread), _lock: lock }
    }

    /// Commits everything queued so far, then stops the thread and waits for it.
    pub fn shutdown(mut self) {
        let _ = self.writer_tx.send(WriterMsg::Shutdown);
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                log::error!("the store writer thread panicked");
            }
        }
    }
}

impl Writer {
    pub(super) fn open(path: &Path) -> Result<Writer, StoreError> {
        let mut conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // FULL in WAL mode fsyncs the log on every commit: acknowledged means durable.
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        super::migrate::migrate(&mut conn)?;
        let move_marks = MoveMarks::open(&conn)?;
        Ok(Writer { conn, trim: Trim::default(), move_marks })
    }

    pub(super) fn spawn(
        self,
        inbox: Receiver<WriterMsg>,
        writer_tx: Sender<WriterMsg>,
        lock: Option<DataDirLock>,
    ) -> Result<WriterHandle, StoreError> {
        let thread = std::thread::Builder::new()
            .name("kestrel-store".into())
            .spawn(move || super::group_commit::run(self, inbox))
            .map_err(StoreError::Io)?;
        Ok(WriterHandle { writer_tx, thread: Some(thread), _lock: lock })
    }

    /// One step of trimming in a transaction of its own.
    fn trim_idle_step(&mut self) {
        let mut trim = self.trim;
        let stepped =
            self.conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(StoreError::from).and_then(
                |tx| {
                    trim.step(&tx, TRIM_STEP_IDLE)?;
                    Ok(tx.commit()?)
                },
            );
        self.trim.settle(stepped, trim);
    }

    /// Commits every message's ops in one transaction, which takes the write lock at its
    /// start; what each message's log append was given. A transaction that only allocates
    /// seqs (token deltas: nothing is kept) skips the sync: losing it to a power cut loses
    /// nothing anyone could have read.
    fn sqlite_transaction(&mut self, messages: &[&[WriteOp]]) -> Result<Vec<Committed>, StoreError> {
        let only_seqs = messages
            .iter()
            .copied()
            .flatten()
            .all(|op| matches!(op, WriteOp::AppendLog { entries, .. } if entries.iter().all(Option::is_none)));
        if only_seqs {
            self.conn.pragma_update(None, "synchronous", "OFF")?;
        }
        let outcome = self.commit(messages.iter().copied());
        if only_seqs {
            self.conn.pragma_update(None, "synchronous", "FULL")?;
        }
        outcome
    }

    fn commit<'a>(&mut self, messages: impl Iterator<Item = &'a [WriteOp]>) -> Result<Vec<Committed>, StoreError> {
        let mut trim = self.trim;
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut seqs = SeqCursor::default();
        let mut committed = Vec::new();
        for ops in messages {
            let mut first_seq = None;
            for op in ops {
                if let Some(first) = apply(&tx, op, &mut trim, &mut seqs)? {
                    first_seq = Some(first);
                }
            }
            committed.push(Committed { first_seq });
        }
        seqs.store(&tx)?;
        trim.step(&tx, TRIM_STEP_COMMIT)?;
        let mark = self.move_marks.prune(&tx)?;
        tx.commit()?;
        if let Some(mark) = mark {
            self.move_marks.keep(mark);
        }
        self.trim = trim;
        Ok(committed)
    }
}

impl super::group_commit::Committer for Writer {
    fn transaction(&mut self, messages: &[&[WriteOp]]) -> Result<Vec<Committed>, StoreError> {
        self.sqlite_transaction(messages)
    }

    fn trim_behind(&self) -> bool {
        self.trim.behind()
    }

    fn trim_while_idle(&mut self) {
        self.trim_idle_step()
    }
}

/// The log's seqs within one transaction. The last seq allocated is the larger of
/// `meta.seq_last` and the log's last seq: an allocation that ends with a kept event needs no
/// write of its own (the event is the record), one that ends with a delta writes `seq_last`,
/// and deleting a session's events keeps their seqs in `seq_last` first.
#[derive(Default)]
struct SeqCursor {
    last: Option<u64>,
    /// Whether `seq_last` must be written: the last seq allocated is not a kept event's.
    unrecorded: bool,
}

/// The last seq allocated: what `seq_last` says, or the log's last if higher.
pub(super) const LAST_SEQ: &str = "SELECT max(coalesce((SELECT value FROM meta WHERE key = 'seq_last'), 0),
                               coalesce((SELECT max(seq) FROM events), 0))";

impl SeqCursor {
    /// `count` consecutive seqs above `floor` and every seq allocated before; the first.
    /// `last_kept`: whether the last of them goes to a kept event.
    fn take(&mut self, tx: &Transaction<'_>, count: u64, floor: u64, last_kept: bool) -> Result<u64, StoreError> {
        let last = match self.last {
            Some(last) => last,
            None => tx.prepare_cached(LAST_SEQ)?.query_row([], |row| row.get::<_, i64>(0))? as u64,
        };
        let first = last.max(floor) + 1;
        self.last = Some(first + count - 1);
        self.unrecorded = !last_kept;
        Ok(first)
    }

    fn store(&self, tx: &Transaction<'_>) -> Result<(), StoreError> {
        if let (true, Some(last)) = (self.unrecorded, self.last) {
            tx.prepare_cached(
                "INSERT INTO meta (key, value) VALUES ('seq_last', ?1)
                 ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value)",
            )?
            .execute([last as i64])?;
        }
        Ok(())
    }
}

/// Keeps the log's last seq in `seq_last` before events are deleted, so it never goes back.
fn remember_last_seq(tx: &Transaction<'_>) -> Result<(), StoreError> {
    tx.prepare_cached(&format!(
        "INSERT INTO meta (key, value) VALUES ('seq_last', ({LAST_SEQ}))
         ON CONFLICT (key) DO UPDATE SET value = excluded.value"
    ))?
    .execute([])?;
    Ok(())
}

/// Applies one op; a log append answers with its first seq.
fn apply(tx: &Transaction<'_>, op: &WriteOp, trim: &mut Trim, seqs: &mut SeqCursor) -> Result<Option<u64>, StoreError> {
    match op {
        WriteOp::SessionRoom { tenant, max } => {
            // Counted on the index by tenant, inside the write that inserts.
            let count: i64 = tx
                .prepare_cached("SELECT count(*) FROM sessions WHERE tenant = ?1")?
                .query_row([tenant], |row| row.get(0))?;
            if count as u64 >= *max {
                return Err(StoreError::SessionLimit(*max));
            }
        }
        WriteOp::InsertSession(record) => {
            let s = &record.summary;
            tx.prepare_cached(
                "INSERT INTO sessions (id, tenant, title, model, system_prompt, workspace, status,
                                       created_at, updated_at, message_count, forked_from)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            )?
            .execute(params![
                s.id,
                record.tenant,
                s.title,
                s.model,
                record.system_prompt,
                s.workspace,
                s.status.as_str(),
                s.created_at,
                s.updated_at,
                s.message_count as i64,
                s.forked_from.as_ref().map(|from| serde_json::json!(from).to_string())
            ])?;
        }
        WriteOp::UpdateSession { id, patch, updated_at } => update_session(tx, id, patch, updated_at)?,
        WriteOp::DeleteSession { id } => {
            tx.prepare_cached("DELETE FROM sessions WHERE id = ?1")?.execute([id])?;
            // The transcript goes, and so does what the log says of it; not its seqs.
            remember_last_seq(tx)?;
            tx.prepare_cached("DELETE FROM events WHERE session_id = ?1")?.execute([id])?;
        }
        WriteOp::AppendMessage { session_id, message, updated_at } => {
            let body = serde_json::to_string(message).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            let role = serde_json::to_value(message.role).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            tx.prepare_cached("INSERT INTO messages (id, session_id, role, body, form) VALUES (?1, ?2, ?3, ?4, ?5)")?
                .execute(params![message.id, session_id, role.as_str().unwrap_or(""), body, STORED_FORM])?;
            let changed = tx
                .prepare_cached("UPDATE sessions SET message_count = message_count + 1, updated_at = ?2 WHERE id = ?1")?
                .execute(params![session_id, updated_at])?;
            if changed == 0 {
                return Err(StoreError::Backend(format!("no session {session_id}")));
            }
        }
        WriteOp::ClaimTurn(claim) => {
            let claimed = tx
                .prepare_cached(
                    "UPDATE sessions SET status = ?4, run_id = ?2, node = ?3, updated_at = ?5
                     WHERE id = ?1 AND status != ?4",
                )?
                .execute(params![claim.session_id, claim.run_id, claim.node, super::sqlite::running(), claim.at])?;
            if claimed == 0 {
                let exists: Option<i64> = tx
                    .prepare_cached("SELECT 1 FROM sessions WHERE id = ?1")?
                    .query_row([&claim.session_id], |r| r.get(0))
                    .optional()?;
                return Err(if exists.is_some() { StoreError::Busy } else { StoreError::MissingSession });
            }
        }
        WriteOp::ReleaseTurn { session_id, run_id, status, at } => {
            tx.prepare_cached(
                "UPDATE sessions SET status = ?3, run_id = NULL, node = NULL, updated_at = ?4
                 WHERE id = ?1 AND run_id IS ?2",
            )?
            .execute(params![session_id, run_id, status.as_str(), at])?;
        }
        WriteOp::InterruptTurn { session_id, at } => {
            tx.prepare_cached(
                "UPDATE sessions SET status = 'interrupted', run_id = NULL, node = NULL, updated_at = ?2
                 WHERE id = ?1 AND status = ?3",
            )?
            .execute(params![session_id, at, super::sqlite::running()])?;
        }
        WriteOp::RecoverTurns { node, at } => {
            tx.prepare_cached(
                "UPDATE sessions SET status = 'interrupted', run_id = NULL, node = NULL, updated_at = ?2
                 WHERE status = ?3 AND (node = ?1 OR node IS NULL)",
            )?
            .execute(params![node, at, super::sqlite::running()])?;
        }
        WriteOp::MarkCallStarted { session_id, call, actor, at } => {
            let body = serde_json::to_string(call).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            tx.prepare_cached(
                "INSERT OR IGNORE INTO tool_call_starts (session_id, call_id, started_at, call, actor, settled)
                 VALUES (?1, ?2, ?3, ?4, ?5, 0)",
            )?
            .execute(params![session_id, call.id, at, body, actor])?;
        }
        WriteOp::SettleCall { session_id, call_id } => {
            tx.prepare_cached("UPDATE tool_call_starts SET settled = 1 WHERE session_id = ?1 AND call_id = ?2")?
                .execute(params![session_id, call_id])?;
        }
        WriteOp::RecordIdempotent(record) => record_idempotent(tx, record)?,
        // A single node has no other node to hand `live` events to.
        WriteOp::AppendLog { entries, floor, keep, live: _ } => {
            if entries.is_empty() {
                return Ok(None);
            }
            let last_kept = entries.last().is_some_and(Option::is_some);
            let first = seqs.take(tx, entries.len() as u64, *floor, last_kept)?;
            append_events(tx, first, entries)?;
            super::webhooks::enqueue(tx, first, entries)?;
            trim.goal = trim.goal.max((first + entries.len() as u64 - 1).saturating_sub(*keep));
            return Ok(Some(first));
        }
        WriteOp::Bae(write) => super::bae::apply(tx, write)?,
        WriteOp::Policy(write) => super::policy::apply(tx, write)?,
        WriteOp::Schedule(write) => super::schedules::apply(tx, write)?,
        WriteOp::Webhook(write) => super::webhooks::apply(tx, write)?,
        WriteOp::InsertCheckpoint { record, manifest } => super::checkpoints::insert(tx, record, manifest)?,
        WriteOp::CompactHistory { session_id, summary, hidden, kept } => {
            compact_history(tx, session_id, summary, hidden, kept)?
        }
        WriteOp::TruncateMessages { session_id, from_message_id, updated_at } => {
            let removed = tx
                .prepare_cached(
                    "DELETE FROM messages WHERE session_id = ?1
                     AND rowid >= (SELECT rowid FROM messages WHERE id = ?2 AND session_id = ?1)",
                )?
                .execute(params![session_id, from_message_id])?;
            tx.prepare_cached("UPDATE sessions SET message_count = message_count - ?2, updated_at = ?3 WHERE id = ?1")?
                .execute(params![session_id, removed as i64, updated_at])?;
        }
    }
    Ok(None)
}

/// Marks the replaced messages, then puts the summary before the kept ones by moving those
/// after it (same ids, new rowids, same order).
fn compact_history(
    tx: &Transaction<'_>,
    session_id: &str,
    summary: &crate::domain::Message,
    hidden: &[String],
    kept: &[String],
) -> Result<(), StoreError> {
    let corrupt = |e: serde_json::Error| StoreError::Corrupt(e.to_string());
    for id in hidden {
        let (body, form): (String, i64) = tx
            .prepare_cached("SELECT body, form FROM messages WHERE id = ?1 AND session_id = ?2")?
            .query_row(params![id, session_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
        let mut message = super::decode_message(&body, form)?;
        message.meta.get_or_insert_with(Default::default).insert("compacted".into(), serde_json::Value::Bool(true));
        let body = serde_json::to_string(&message).map_err(corrupt)?;
        tx.prepare_cached("UPDATE messages SET body = ?2, form = ?3 WHERE id = ?1")?.execute(params![
            id,
            body,
            STORED_FORM
        ])?;
    }
    let insert = |id: &str, role: &str, body: &str, form: i64| -> Result<(), StoreError> {
        tx.prepare_cached("INSERT INTO messages (id, session_id, role, body, form) VALUES (?1, ?2, ?3, ?4, ?5)")?
            .execute(params![id, session_id, role, body, form])?;
        Ok(())
    };
    let role = serde_json::to_value(summary.role).map_err(corrupt)?;
    insert(&summary.id, role.as_str().unwrap_or(""), &serde_json::to_string(summary).map_err(corrupt)?, STORED_FORM)?;
    for id in kept {
        let (role, body, form): (String, String, i64) = tx
            .prepare_cached("SELECT role, body, form FROM messages WHERE id = ?1 AND session_id = ?2")?
            .query_row(params![id, session_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        tx.prepare_cached("DELETE FROM messages WHERE id = ?1")?.execute([id])?;
        insert(id, &role, &body, form)?;
    }
    tx.prepare_cached("UPDATE sessions SET message_count = message_count + 1 WHERE id = ?1")?.execute([session_id])?;
    Ok(())
}

fn record_idempotent(tx: &Transaction<'_>, record: &super::IdempotentAnswer) -> Result<(), StoreError> {
    // Expired answers go as new ones come; the index makes this a range delete.
    tx.prepare_cached("DELETE FROM idempotency WHERE created_ms < ?1")?
        .execute([record.created_ms - super::IDEMPOTENCY_TTL_MS])?;
    tx.prepare_cached(
        "INSERT INTO idempotency (tenant, key, fingerprint, status, body, created_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        record.tenant,
        record.key,
        record.fingerprint,
        record.status,
        record.body,
        record.created_ms
    ])?;
    Ok(())
}

/// Inserts the kept entries, the batch's first entry at seq `first`.
fn append_events(tx: &Transaction<'_>, first: u64, entries: &[Option<super::LoggedEvent>]) -> Result<(), StoreError> {
    let mut insert = tx.prepare_cached(
        "INSERT INTO events (seq, tenant, session_id, type, at, body, actor, form) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?;
    for (offset, event) in entries.iter().enumerate() {
        let Some(event) = event else { continue };
        insert.execute(params![
            (first + offset as u64) as i64,
            event.tenant,
            event.session_id,
            event.kind,
            event.at,
            event.body,
            event.actor,
            STORED_FORM
        ])?;
    }
    Ok(())
}

fn update_session(tx: &Transaction<'_>, id: &str, patch: &SessionPatch, updated_at: &str) -> Result<(), StoreError> {
    let prompt_given = patch.system_prompt.is_some();
    let prompt = patch.system_prompt.clone().flatten();
    tx.prepare_cached(
        "UPDATE sessions SET
             title = coalesce(?2, title),
             model = coalesce(?3, model),
             system_prompt = CASE WHEN ?4 THEN ?5 ELSE system_prompt END,
             status = coalesce(?6, status),
             workspace = coalesce(?8, workspace),
             updated_at = ?7
         WHERE id = ?1",
    )?
    .execute(params![
        id,
        patch.title,
        patch.model,
        prompt_given,
        prompt,
        patch.status.map(|s| s.as_str()),
        updated_at,
        patch.workspace
    ])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::domain::{Message, Role, SessionRecord, SessionStatus, SessionSummary};
    use crate::store::{Store, StoreError, WriteOp};

    fn session(id: &str) -> WriteOp {
        WriteOp::InsertSession(SessionRecord {
            summary: SessionSummary {
                id: id.into(),
                title: "t".into(),
                created_at: "2026-01-01T00:00:00.000Z".into(),
                updated_at: "2026-01-01T00:00:00.000Z".into(),
                status: SessionStatus::Running,
                model: "builtin/echo".into(),
                message_count: 0,
                workspace: "/".into(),
                forked_from: None,
            },
            tenant: "t".into(),
            system_prompt: None,
        })
    }

    fn append(session_id: &str) -> WriteOp {
        WriteOp::AppendMessage {
            session_id: session_id.into(),
            message: Message::text_of(Role::User, "hi"),
            updated_at: "2026-01-01T00:00:01.000Z".into(),
        }
    }

    #[test]
    fn one_failing_write_in_a_batch_does_not_fail_its_neighbours() {
        let dir = tempfile::tempdir().unwrap();
        let (store, writer) = Store::open(dir.path()).unwrap();
        store.write(vec![session("s1")]).unwrap();
        // Queue many writes at once so they share a batch; one appends to a missing session.
        let pending: Vec<_> = (0..200)
            .map(|i| store.write_pending(vec![append(if i == 100 { "missing" } else { "s1" })]).unwrap())
            .collect();
        let outcomes: Vec<Result<_, StoreError>> = pending.into_iter().map(|rx| rx.recv().unwrap()).collect();
        assert!(outcomes[100].is_err());
        assert_eq!(outcomes.iter().filter(|o| o.is_ok()).count(), 199);
        let record = store.readers().session("s1").unwrap().unwrap();
        assert_eq!(record.summary.message_count, 199);
        assert_eq!(store.readers().messages("s1").unwrap().len(), 199);
        writer.shutdown();
    }

    /// Opens the store again. Another test's child process, between its fork and its exec,
    /// can hold a copy of the lock's descriptor for a moment: wait that out, with a deadline.
    fn reopen(dir: &std::path::Path) -> (Store, crate::store::WriterHandle) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match Store::open(dir) {
                Err(StoreError::Locked { .. }) if std::time::Instant::now() < deadline => std::thread::yield_now(),
                opened => return opened.unwrap(),
            }
        }
    }

    #[test]
    fn recovery_and_a_reopen_keep_everything() {
        let dir = tempfile::tempdir().unwrap();
        let (store, writer) = Store::open(dir.path()).unwrap();
        store.write(vec![session("s1"), append("s1")]).unwrap();
        store.write_detached(vec![append("s1")]).unwrap();
        writer.shutdown(); // commits the detached write before stopping
        let (store, writer) = reopen(dir.path());
        assert_eq!(store.recover("node-a").unwrap(), ["s1"], "a running row no node owns is this node's");
        let record = store.readers().session("s1").unwrap().unwrap();
        assert_eq!(record.summary.status, SessionStatus::Interrupted);
        assert_eq!(record.summary.message_count, 2);
        writer.shutdown();
    }
}
