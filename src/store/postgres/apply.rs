//! Each `WriteOp` in PostgreSQL's SQL, inside the writer's transaction. The log's seqs come
//! from the `seq_last` row of `meta`, taken with its lock (`take_seqs`): a transaction that
//! appends holds it until it commits, so seqs are committed in order by every process.

use super::super::housekeeping::Trim;
use super::super::{IdempotentAnswer, LoggedEvent, SessionPatch, StoreError, WriteOp, IDEMPOTENCY_TTL_MS};
use super::conn::Tx;
use crate::domain::{Message, SessionStatus, STORED_FORM};

/// Applies one op; a log append answers with its first seq.
pub(super) fn apply(tx: &mut Tx<'_>, op: &WriteOp, trim: &mut Trim) -> Result<Option<u64>, StoreError> {
    match op {
        WriteOp::SessionRoom { tenant, max } => {
            // The nodes of a cluster count a tenant's sessions in turn: the lock is held to
            // the commit, so the next one's count sees this insert.
            tx.exec("SELECT pg_advisory_xact_lock(hashtext('kestrel.sessions:' || $1))", &[tenant])?;
            let count: i64 = tx.one("SELECT count(*) FROM sessions WHERE tenant = $1", &[tenant])?.get(0);
            if count as u64 >= *max {
                return Err(StoreError::SessionLimit(*max));
            }
        }
        WriteOp::InsertSession(record) => {
            let s = &record.summary;
            let forked_from = s.forked_from.as_ref().map(|from| serde_json::json!(from).to_string());
            tx.exec(
                "INSERT INTO sessions (id, tenant, title, model, system_prompt, workspace, status,
                                       created_at, updated_at, message_count, forked_from)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                &[
                    &s.id,
                    &record.tenant,
                    &s.title,
                    &s.model,
                    &record.system_prompt,
                    &s.workspace,
                    &s.status.as_str(),
                    &s.created_at,
                    &s.updated_at,
                    &(s.message_count as i64),
                    &forked_from,
                ],
            )?;
        }
        WriteOp::UpdateSession { id, patch, updated_at } => update_session(tx, id, patch, updated_at)?,
        WriteOp::DeleteSession { id } => {
            tx.exec("DELETE FROM sessions WHERE id = $1", &[id])?;
            tx.exec("DELETE FROM events WHERE session_id = $1", &[id])?;
        }
        WriteOp::AppendMessage { session_id, message, updated_at } => {
            insert_message(tx, session_id, message)?;
            let changed = tx.exec(
                "UPDATE sessions SET message_count = message_count + 1, updated_at = $2 WHERE id = $1",
                &[session_id, updated_at],
            )?;
            if changed == 0 {
                return Err(StoreError::MissingSession);
            }
        }
        WriteOp::ClaimTurn(claim) => {
            let claimed = tx.exec(
                "UPDATE sessions SET status = $4, run_id = $2, node = $3, updated_at = $5
                 WHERE id = $1 AND status <> $4",
                &[&claim.session_id, &claim.run_id, &claim.node, &SessionStatus::Running.as_str(), &claim.at],
            )?;
            if claimed == 0 {
                let exists = tx.opt("SELECT 1 FROM sessions WHERE id = $1", &[&claim.session_id])?;
                return Err(if exists.is_some() { StoreError::Busy } else { StoreError::MissingSession });
            }
        }
        WriteOp::ReleaseTurn { session_id, run_id, status, at } => {
            tx.exec(
                "UPDATE sessions SET status = $3, run_id = NULL, node = NULL, updated_at = $4
                 WHERE id = $1 AND run_id IS NOT DISTINCT FROM $2",
                &[session_id, run_id, &status.as_str(), at],
            )?;
        }
        WriteOp::InterruptTurn { session_id, at } => {
            tx.exec(
                "UPDATE sessions SET status = 'interrupted', run_id = NULL, node = NULL, updated_at = $2
                 WHERE id = $1 AND status = $3",
                &[session_id, at, &SessionStatus::Running.as_str()],
            )?;
        }
        WriteOp::RecoverTurns { node, at } => {
            tx.exec(
                "UPDATE sessions SET status = 'interrupted', run_id = NULL, node = NULL, updated_at = $2
                 WHERE status = $3 AND (node = $1 OR node IS NULL)",
                &[node, at, &SessionStatus::Running.as_str()],
            )?;
        }
        WriteOp::MarkCallStarted { session_id, call, actor, at } => {
            let body = serde_json::to_string(call).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            tx.exec(
                "INSERT INTO tool_call_starts (session_id, call_id, started_at, call, actor, settled)
                 VALUES ($1, $2, $3, $4, $5, 0) ON CONFLICT DO NOTHING",
                &[session_id, &call.id, at, &body, actor],
            )?;
        }
        WriteOp::SettleCall { session_id, call_id } => {
            tx.exec(
                "UPDATE tool_call_starts SET settled = 1 WHERE session_id = $1 AND call_id = $2",
                &[session_id, call_id],
            )?;
        }
        WriteOp::RecordIdempotent(record) => record_idempotent(tx, record)?,
        WriteOp::AppendLog { entries, floor, keep, live } => {
            if entries.is_empty() {
                return Ok(None);
            }
            let first = take_seqs(tx, entries.len() as u64, *floor)?;
            // Before the commit's pointer to what it logged (`writer.rs`): a node hears of
            // these first, in seq order with the logged ones.
            super::listen::notify_live(tx, first, live)?;
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
            let removed = tx.exec(
                "DELETE FROM messages WHERE session_id = $1
                 AND ord >= (SELECT ord FROM messages WHERE id = $2 AND session_id = $1)",
                &[session_id, from_message_id],
            )?;
            tx.exec(
                "UPDATE sessions SET message_count = message_count - $2, updated_at = $3 WHERE id = $1",
                &[session_id, &(removed as i64), updated_at],
            )?;
        }
    }
    Ok(None)
}

/// Messages appended one after another in a transaction, held back to be written together:
/// one insert for all of them and one update of each session's count (a row updated once,
/// not once per message: each update of a row in a transaction leaves a version that the
/// next must step over). Written before any other op, so the order of effects is kept.
#[derive(Default)]
pub(super) struct Appends<'a> {
    held: Vec<(&'a str, &'a Message, &'a str)>,
}

impl<'a> Appends<'a> {
    /// Holds `op` back if it appends a message; whether it did.
    pub(super) fn take(&mut self, op: &'a WriteOp) -> bool {
        match op {
            WriteOp::AppendMessage { session_id, message, updated_at } => {
                self.held.push((session_id, message, updated_at));
                true
            }
            _ => false,
        }
    }

    /// Writes what is held.
    pub(super) fn flush(&mut self, tx: &mut Tx<'_>) -> Result<(), StoreError> {
        if self.held.is_empty() {
            return Ok(());
        }
        let held = std::mem::take(&mut self.held);
        let (mut ids, mut sessions, mut roles, mut bodies) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (session_id, message, _) in &held {
            let (role, body) = encoded(message)?;
            ids.push(message.id.as_str());
            sessions.push(*session_id);
            roles.push(role);
            bodies.push(body);
        }
        tx.exec(
            "INSERT INTO messages (id, session_id, role, body, form)
             SELECT id, session_id, role, body, $5
             FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS m(id, session_id, role, body, n)
             ORDER BY n",
            &[&ids, &sessions, &roles, &bodies, &STORED_FORM],
        )?;
        // Each session once: how many it was given, and the last time.
        let mut counts: Vec<(&str, i64, &str)> = Vec::new();
        for (session_id, _, updated_at) in &held {
            match counts.iter_mut().find(|(id, _, _)| id == session_id) {
                Some(entry) => (entry.1, entry.2) = (entry.1 + 1, updated_at),
                None => counts.push((session_id, 1, updated_at)),
            }
        }
        for (session_id, count, updated_at) in counts {
            let changed = tx.exec(
                "UPDATE sessions SET message_count = message_count + $2, updated_at = $3 WHERE id = $1",
                &[&session_id, &count, &updated_at],
            )?;
            if changed == 0 {
                return Err(StoreError::MissingSession);
            }
        }
        Ok(())
    }
}

/// `count` consecutive seqs above `floor` and every seq taken before; the first.
fn take_seqs(tx: &mut Tx<'_>, count: u64, floor: u64) -> Result<u64, StoreError> {
    let last: i64 = tx
        .one(
            "UPDATE meta SET value = greatest(value, $1) + $2 WHERE key = 'seq_last' RETURNING value",
            &[&(floor as i64), &(count as i64)],
        )?
        .get(0);
    Ok(last as u64 + 1 - count)
}

/// Inserts the kept entries in one statement, the batch's first entry at seq `first`.
fn append_events(tx: &mut Tx<'_>, first: u64, entries: &[Option<LoggedEvent>]) -> Result<(), StoreError> {
    let kept: Vec<(i64, &LoggedEvent)> = entries
        .iter()
        .enumerate()
        .filter_map(|(offset, event)| event.as_ref().map(|event| ((first + offset as u64) as i64, event)))
        .collect();
    if kept.is_empty() {
        return Ok(());
    }
    let seqs: Vec<i64> = kept.iter().map(|(seq, _)| *seq).collect();
    let tenants: Vec<Option<&str>> = kept.iter().map(|(_, e)| e.tenant.as_deref()).collect();
    let sessions: Vec<Option<&str>> = kept.iter().map(|(_, e)| e.session_id.as_deref()).collect();
    let kinds: Vec<&str> = kept.iter().map(|(_, e)| e.kind.as_str()).collect();
    let ats: Vec<&str> = kept.iter().map(|(_, e)| e.at.as_str()).collect();
    let bodies: Vec<&str> = kept.iter().map(|(_, e)| e.body.as_str()).collect();
    let actors: Vec<Option<&str>> = kept.iter().map(|(_, e)| e.actor.as_deref()).collect();
    tx.exec(
        "INSERT INTO events (seq, tenant, session_id, type, at, body, actor, form)
         SELECT seq, tenant, session_id, type, at, body, actor, $8
         FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[])
              AS e(seq, tenant, session_id, type, at, body, actor)",
        &[&seqs, &tenants, &sessions, &kinds, &ats, &bodies, &actors, &STORED_FORM],
    )?;
    Ok(())
}

/// A message's role and body as the `messages` table keeps them.
fn encoded(message: &Message) -> Result<(String, String), StoreError> {
    let corrupt = |e: serde_json::Error| StoreError::Corrupt(e.to_string());
    let role = serde_json::to_value(message.role).map_err(corrupt)?;
    Ok((role.as_str().unwrap_or("").to_string(), serde_json::to_string(message).map_err(corrupt)?))
}

fn insert_message(tx: &mut Tx<'_>, session_id: &str, message: &Message) -> Result<(), StoreError> {
    let (role, body) = encoded(message)?;
    tx.exec(
        "INSERT INTO messages (id, session_id, role, body, form) VALUES ($1, $2, $3, $4, $5)",
        &[&message.id, &session_id, &role, &body, &STORED_FORM],
    )?;
    Ok(())
}

/// Marks the replaced messages, then puts the summary before the kept ones by moving those
/// after it (same ids, new places, same order).
fn compact_history(
    tx: &mut Tx<'_>,
    session_id: &str,
    summary: &Message,
    hidden: &[String],
    kept: &[String],
) -> Result<(), StoreError> {
    let corrupt = |e: serde_json::Error| StoreError::Corrupt(e.to_string());
    for id in hidden {
        let row = tx.one("SELECT body, form FROM messages WHERE id = $1 AND session_id = $2", &[id, &session_id])?;
        let mut message = super::super::decode_message(row.get(0), row.get(1))?;
        message.meta.get_or_insert_with(Default::default).insert("compacted".into(), serde_json::Value::Bool(true));
        let body = serde_json::to_string(&message).map_err(corrupt)?;
        tx.exec("UPDATE messages SET body = $2, form = $3 WHERE id = $1", &[id, &body, &STORED_FORM])?;
    }
    insert_message(tx, session_id, summary)?;
    for id in kept {
        tx.exec(
            "WITH moved AS (DELETE FROM messages WHERE id = $1 AND session_id = $2 RETURNING id, session_id, role, body, form)
             INSERT INTO messages (id, session_id, role, body, form) SELECT id, session_id, role, body, form FROM moved",
            &[id, &session_id],
        )?;
    }
    tx.exec("UPDATE sessions SET message_count = message_count + 1 WHERE id = $1", &[&session_id])?;
    Ok(())
}

fn record_idempotent(tx: &mut Tx<'_>, record: &IdempotentAnswer) -> Result<(), StoreError> {
    tx.exec("DELETE FROM idempotency WHERE created_ms < $1", &[&(record.created_ms - IDEMPOTENCY_TTL_MS)])?;
    tx.exec(
        "INSERT INTO idempotency (tenant, key, fingerprint, status, body, created_ms) VALUES ($1, $2, $3, $4, $5, $6)",
        &[
            &record.tenant,
            &record.key,
            &record.fingerprint,
            &i64::from(record.status),
            &record.body,
            &record.created_ms,
        ],
    )?;
    Ok(())
}

fn update_session(tx: &mut Tx<'_>, id: &str, patch: &SessionPatch, updated_at: &str) -> Result<(), StoreError> {
    let prompt_given = patch.system_prompt.is_some();
    let prompt = patch.system_prompt.clone().flatten();
    tx.exec(
        "UPDATE sessions SET
             title = coalesce($2, title),
             model = coalesce($3, model),
             system_prompt = CASE WHEN $4 THEN $5 ELSE system_prompt END,
             status = coalesce($6, status),
             workspace = coalesce($8, workspace),
             updated_at = $7
         WHERE id = $1",
        &[
            &id,
            &patch.title,
            &patch.model,
            &prompt_given,
            &prompt,
            &patch.status.map(|s| s.as_str()),
            &updated_at,
            &patch.workspace,
        ],
    )?;
    Ok(())
}
