//! Stored rows as records, for every backend: each backend reads its rows through `Cells`
//! (typed access to a row's columns by index) and the decoders here turn them into the
//! engine's records, so both stores read the same columns the same way. A backend's query
//! selects the columns each decoder's `*_COLUMNS` names, in that order.

use serde_json::Value;

use super::bae::{BaeSessionRecord, BaeState, KeyRecord, ProfileRecord};
use super::checkpoints::{CheckpointEntry, CheckpointKind, CheckpointRecord};
use super::{LoggedEvent, StoreError, UnsettledCall};
use crate::auth::keys::KeyRole;
use crate::domain::{SessionRecord, SessionStatus, SessionSummary};
use crate::policy::{AuditEntry, Outcome, Rule, Source};
use crate::schedule::{CatchUp, Fire, FireOutcome, Schedule, Target};
use crate::webhooks::{Attempt, Delivery, DeliveryState, Webhook};

/// A row's columns, by index. Integers are 64-bit in both stores.
pub(crate) trait Cells {
    fn text(&self, index: usize) -> Result<String, StoreError>;
    fn opt_text(&self, index: usize) -> Result<Option<String>, StoreError>;
    fn int(&self, index: usize) -> Result<i64, StoreError>;
    fn opt_int(&self, index: usize) -> Result<Option<i64>, StoreError>;
}

fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(what.to_string())
}

fn json<T: serde::de::DeserializeOwned>(row: &impl Cells, index: usize, what: &str) -> Result<T, StoreError> {
    serde_json::from_str(&row.text(index)?).map_err(|e| corrupt(format!("{what}: {e}")))
}

fn unsigned(value: i64) -> u64 {
    value.max(0) as u64
}

fn small<T: TryFrom<i64>>(value: i64, what: &str) -> Result<T, StoreError> {
    T::try_from(value).map_err(|_| corrupt(format!("{what} {value} out of range")))
}

/// A session's summary, what lists show: `summary` reads these.
pub(crate) const SUMMARY_COLUMNS: &str =
    "id, title, model, workspace, status, created_at, updated_at, message_count, forked_from";

/// A whole session: the summary's columns, then `tenant` and `system_prompt`.
pub(crate) const SESSION_COLUMNS: &str =
    "id, title, model, workspace, status, created_at, updated_at, message_count, forked_from, tenant, system_prompt";

/// A session's summary from a row of `SUMMARY_COLUMNS` (or `SESSION_COLUMNS`, which start so).
/// Lists read only these: a page of sessions skips the columns only a whole session needs.
pub(crate) fn summary(row: &impl Cells) -> Result<SessionSummary, StoreError> {
    let status = row.text(4)?;
    let status = SessionStatus::parse(&status).ok_or_else(|| corrupt(format!("session status {status:?}")))?;
    let forked_from = match row.opt_text(8)? {
        Some(text) => Some(serde_json::from_str(&text).map_err(|e| corrupt(format!("session forked_from: {e}")))?),
        None => None,
    };
    Ok(SessionSummary {
        id: row.text(0)?,
        title: row.text(1)?,
        model: row.text(2)?,
        workspace: row.text(3)?,
        status,
        created_at: row.text(5)?,
        updated_at: row.text(6)?,
        message_count: unsigned(row.int(7)?),
        forked_from,
    })
}

pub(crate) fn session(row: &impl Cells) -> Result<SessionRecord, StoreError> {
    Ok(SessionRecord { summary: summary(row)?, tenant: row.text(9)?, system_prompt: row.opt_text(10)? })
}

pub(crate) const EVENT_COLUMNS: &str = "seq, tenant, session_id, type, at, body, actor, form";

pub(crate) fn logged_event(row: &impl Cells) -> Result<LoggedEvent, StoreError> {
    Ok(LoggedEvent {
        seq: unsigned(row.int(0)?),
        tenant: row.opt_text(1)?,
        session_id: row.opt_text(2)?,
        kind: row.text(3)?,
        at: row.text(4)?,
        body: row.text(5)?,
        actor: row.opt_text(6)?,
        form: row.int(7)?,
    })
}

/// `session_id, actor, call` of a tool call's start mark.
pub(crate) fn unsettled_call(row: &impl Cells) -> Result<UnsettledCall, StoreError> {
    let session_id = row.text(0)?;
    let call = serde_json::from_str(row.opt_text(2)?.as_deref().unwrap_or("null"))
        .map_err(|e| corrupt(format!("the mark of a call of {session_id}: {e}")))?;
    Ok(UnsettledCall { actor: row.opt_text(1)?, session_id, call })
}

pub(crate) const PROFILE_COLUMNS: &str = "seq, id, name, primary_provider, fallback_providers, mcp_servers,
     allowed_tools, available_sandboxes, created_at, updated_at, budget";

pub(crate) fn profile(row: &impl Cells) -> Result<(u64, ProfileRecord), StoreError> {
    let budget = match row.opt_text(10)? {
        Some(_) => Some(json(row, 10, "profile budget")?),
        None => None,
    };
    Ok((
        unsigned(row.int(0)?),
        ProfileRecord {
            id: row.text(1)?,
            name: row.text(2)?,
            primary_provider: row.text(3)?,
            fallback_providers: json(row, 4, "profile fallbacks")?,
            mcp_servers: json(row, 5, "profile MCP servers")?,
            allowed_tools: json(row, 6, "profile tools")?,
            available_sandboxes: json(row, 7, "profile sandboxes")?,
            created_at: row.text(8)?,
            updated_at: row.text(9)?,
            budget,
        },
    ))
}

pub(crate) const KEY_COLUMNS: &str =
    "seq, id, name, role, prefix, profile_id, client_id, session_id, created_at, last_used_at";

pub(crate) fn key(row: &impl Cells) -> Result<(u64, KeyRecord), StoreError> {
    let role = row.text(3)?;
    let role = KeyRole::parse(&role).ok_or_else(|| corrupt(format!("key role {role:?}")))?;
    Ok((
        unsigned(row.int(0)?),
        KeyRecord {
            id: row.text(1)?,
            name: row.text(2)?,
            role,
            prefix: row.text(4)?,
            profile_id: row.opt_text(5)?,
            client_id: row.opt_text(6)?,
            session_id: row.opt_text(7)?,
            created_at: row.text(8)?,
            last_used_at: row.opt_text(9)?,
        },
    ))
}

pub(crate) const BAE_SESSION_COLUMNS: &str = "seq, id, creator_key_id, profile_id, state, client_version,
     client_tools, sandbox_tools, subagent_tools, compaction, created_at, closed_at";

pub(crate) fn bae_session(row: &impl Cells) -> Result<(u64, BaeSessionRecord), StoreError> {
    let state = row.text(4)?;
    let state = BaeState::parse(&state).ok_or_else(|| corrupt(format!("session state {state:?}")))?;
    let compaction: Option<Value> = row.opt_text(9)?.and_then(|text| serde_json::from_str(&text).ok());
    Ok((
        unsigned(row.int(0)?),
        BaeSessionRecord {
            id: row.text(1)?,
            creator_key_id: row.text(2)?,
            profile_id: row.text(3)?,
            state,
            client_version: row.opt_text(5)?,
            client_tools: json(row, 6, "client tools")?,
            sandbox_tools: json(row, 7, "sandbox tools")?,
            subagent_tools: json(row, 8, "subagent tools")?,
            compaction,
            created_at: row.text(10)?,
            closed_at: row.opt_text(11)?,
        },
    ))
}

pub(crate) const CHECKPOINT_COLUMNS: &str =
    "id, session_id, label, kind, created_at, run_id, file_count, total_bytes, message_count";

pub(crate) fn checkpoint(row: &impl Cells) -> Result<CheckpointRecord, StoreError> {
    Ok(CheckpointRecord {
        id: row.text(0)?,
        session_id: row.text(1)?,
        label: row.opt_text(2)?,
        kind: CheckpointKind::parse(&row.text(3)?)?,
        created_at: row.text(4)?,
        run_id: row.opt_text(5)?,
        file_count: unsigned(row.int(6)?),
        total_bytes: unsigned(row.int(7)?),
        message_count: unsigned(row.int(8)?),
    })
}

/// `path, digest, size, mode` of a manifest's entry.
pub(crate) fn checkpoint_entry(row: &impl Cells) -> Result<CheckpointEntry, StoreError> {
    Ok(CheckpointEntry {
        path: row.text(0)?,
        digest: row.opt_text(1)?,
        size: unsigned(row.int(2)?),
        mode: small(row.int(3)?, "file mode")?,
    })
}

pub(crate) const RULE_COLUMNS: &str =
    "id, tenant, session_id, tool, pattern, arguments, outcome, source, created_at, created_by";

pub(crate) fn rule(row: &impl Cells) -> Result<Rule, StoreError> {
    let (outcome, source) = (row.text(6)?, row.text(7)?);
    let (Some(outcome), Some(source)) = (Outcome::parse(&outcome), Source::parse(&source)) else {
        return Err(corrupt(format!("rule outcome {outcome:?} or source {source:?}")));
    };
    Ok(Rule {
        id: row.text(0)?,
        tenant: Some(row.text(1)?),
        session_id: row.opt_text(2)?,
        tool: row.text(3)?,
        pattern: row.opt_text(4)?,
        arguments: row.opt_text(5)?,
        outcome,
        source,
        created_at: row.text(8)?,
        created_by: row.opt_text(9)?,
    })
}

pub(crate) const AUDIT_COLUMNS: &str =
    "seq, at, tenant, session_id, run_id, call_id, tool, decision, decided_by, rule_id, actor, note, arguments, edited";

pub(crate) fn audit_entry(row: &impl Cells) -> Result<AuditEntry, StoreError> {
    Ok(AuditEntry {
        seq: unsigned(row.int(0)?),
        at: row.text(1)?,
        tenant: row.text(2)?,
        session_id: row.opt_text(3)?,
        run_id: row.opt_text(4)?,
        call_id: row.opt_text(5)?,
        tool: row.text(6)?,
        decision: row.text(7)?,
        decided_by: row.text(8)?,
        rule_id: row.opt_text(9)?,
        actor: row.opt_text(10)?,
        note: row.opt_text(11)?,
        arguments: row.text(12)?,
        edited: row.opt_text(13)?,
    })
}

pub(crate) const SCHEDULE_COLUMNS: &str =
    "id, tenant, cron, timezone, target, message, catch_up, paused, next_at, last_fired_at, created_at, updated_at";

pub(crate) fn schedule(row: &impl Cells) -> Result<Schedule, StoreError> {
    let target: Target = json(row, 4, "schedule target")?;
    let (message, catch_up) = (row.text(5)?, row.text(6)?);
    let message = serde_json::from_str::<Value>(&message).ok();
    let (Some(content), Some(catch_up)) =
        (message.as_ref().and_then(|m| m["content"].as_str()), CatchUp::parse(&catch_up))
    else {
        return Err(corrupt(format!("schedule message or catch_up {catch_up:?}")));
    };
    Ok(Schedule {
        id: row.text(0)?,
        tenant: row.text(1)?,
        cron: row.text(2)?,
        timezone: row.text(3)?,
        target,
        message: content.to_string(),
        catch_up,
        paused: row.int(7)? != 0,
        next_at: row.opt_int(8)?,
        last_fired_at: row.opt_text(9)?,
        created_at: row.text(10)?,
        updated_at: row.text(11)?,
    })
}

pub(crate) const FIRE_COLUMNS: &str = "seq, schedule_id, due_at, at, outcome, reason, session_id, run_id";

pub(crate) fn fire(row: &impl Cells) -> Result<Fire, StoreError> {
    let outcome = row.text(4)?;
    let outcome = FireOutcome::parse(&outcome).ok_or_else(|| corrupt(format!("fire outcome {outcome:?}")))?;
    Ok(Fire {
        seq: unsigned(row.int(0)?),
        schedule_id: row.text(1)?,
        due_at: row.text(2)?,
        at: row.text(3)?,
        outcome,
        reason: row.opt_text(5)?,
        session_id: row.opt_text(6)?,
        run_id: row.opt_text(7)?,
    })
}

/// The endpoint's columns; a backend appends its aggregate of the endpoint's event types
/// (space-separated) as the eleventh.
pub(crate) const WEBHOOK_COLUMNS: &str = "w.id, w.tenant, w.url, w.description, w.secret, w.source, w.enabled,
     w.failures, w.disabled_reason, w.created_at";

pub(crate) fn webhook(row: &impl Cells) -> Result<Webhook, StoreError> {
    let source = row.text(5)?;
    let source =
        crate::webhooks::Source::parse(&source).ok_or_else(|| corrupt(format!("webhook source {source:?}")))?;
    let mut events: Vec<String> = row.opt_text(10)?.unwrap_or_default().split(' ').map(str::to_string).collect();
    events.retain(|kind| !kind.is_empty());
    events.sort();
    Ok(Webhook {
        id: row.text(0)?,
        tenant: row.text(1)?,
        url: row.text(2)?,
        description: row.opt_text(3)?,
        secret: row.text(4)?,
        events,
        source,
        enabled: row.int(6)? != 0,
        failures: small(row.int(7)?, "webhook failures")?,
        disabled_reason: row.opt_text(8)?,
        created_at: row.text(9)?,
    })
}

pub(crate) const DELIVERY_COLUMNS: &str = "id, webhook_id, seq, type, at, session_id, body, form, state, attempts,
     next_at, created_ms, last_status, last_error, last_latency_ms, delivered_at";

/// A due delivery: `DELIVERY_COLUMNS`, then its endpoint's tenant.
pub(crate) fn due_delivery(row: &impl Cells) -> Result<(String, Delivery), StoreError> {
    Ok((row.text(16)?, delivery(row)?))
}

pub(crate) fn delivery(row: &impl Cells) -> Result<Delivery, StoreError> {
    let state = row.text(8)?;
    let state = DeliveryState::parse(&state).ok_or_else(|| corrupt(format!("delivery state {state:?}")))?;
    Ok(Delivery {
        id: row.text(0)?,
        webhook_id: row.text(1)?,
        seq: unsigned(row.int(2)?),
        kind: row.text(3)?,
        at: row.text(4)?,
        session_id: row.opt_text(5)?,
        body: row.text(6)?,
        form: row.int(7)?,
        state,
        attempts: small(row.int(9)?, "delivery attempts")?,
        next_at: row.int(10)?,
        created_ms: row.int(11)?,
        last_status: row.opt_int(12)?.map(|status| small(status, "delivery status")).transpose()?,
        last_error: row.opt_text(13)?,
        last_latency_ms: row.opt_int(14)?.map(unsigned),
        delivered_at: row.opt_text(15)?,
    })
}

pub(crate) const ATTEMPT_COLUMNS: &str = "n, at, status, error, latency_ms";

pub(crate) fn attempt(row: &impl Cells) -> Result<Attempt, StoreError> {
    Ok(Attempt {
        n: small(row.int(0)?, "attempt number")?,
        at: row.text(1)?,
        status: row.opt_int(2)?.map(|status| small(status, "attempt status")).transpose()?,
        error: row.opt_text(3)?,
        latency_ms: unsigned(row.int(4)?),
    })
}
