//! One fire of a schedule: its message sent to its session (or a new one), or the reason it
//! was skipped; announced as `schedule.fired` / `schedule.skipped` and recorded with the
//! schedule's next fire in one write.

use crate::domain::Event;
use crate::engine::{EngineError, NewMessage, NewSession};
use crate::store::{ScheduleWrite, WriteOp};

use super::scheduler::Context;
use super::{Fire, FireOutcome, Schedule, Target};

/// What a fire did, before it is recorded.
enum Sent {
    Fired { session_id: String, run_id: String },
    Skipped { session_id: Option<String>, reason: String },
}

/// Fires `schedule`, due at `due_ms`; records it with `next_at`. `None` when the schedule was
/// deleted meanwhile (nothing is recorded then).
pub(super) fn fire(context: &Context, schedule: &Schedule, due_ms: i64, next_at: Option<i64>) -> Option<Fire> {
    let sent = send(context, schedule);
    let record = record(context, schedule, due_ms, sent);
    let written =
        context.engine.store().write(vec![WriteOp::Schedule(ScheduleWrite::Fired { fire: record.clone(), next_at })]);
    match written {
        Ok(()) => {}
        Err(crate::store::StoreError::NotFound) => return None,
        Err(error) => log::error!("schedule {}: its fire was not recorded: {error}", schedule.id),
    }
    context.engine.announce(&schedule.tenant, announcement(&record));
    Some(record)
}

/// A fire that did not happen, recorded with `next_at` and announced (a start's missed
/// fires, a fire too soon after the last). `None` when the schedule was deleted meanwhile.
pub(super) fn skip(
    context: &Context,
    schedule: &Schedule,
    due_ms: i64,
    reason: &str,
    next_at: Option<i64>,
) -> Option<Fire> {
    let sent = Sent::Skipped { session_id: None, reason: reason.to_string() };
    let record = record(context, schedule, due_ms, sent);
    let fired = ScheduleWrite::Fired { fire: record.clone(), next_at };
    match context.engine.store().write(vec![WriteOp::Schedule(fired)]) {
        Ok(()) => {}
        Err(crate::store::StoreError::NotFound) => return None,
        Err(error) => log::error!("schedule {}: its skip was not recorded: {error}", schedule.id),
    }
    context.engine.announce(&schedule.tenant, announcement(&record));
    Some(record)
}

/// The reason of a fire skipped for coming too soon after the last (`too_soon`).
pub(super) const MIN_INTERVAL: &str = "min_interval";

/// When `schedule` last fired less than `schedules.min_interval_secs` before `now_ms`: the
/// first time it may fire again. `None`: it may fire now.
pub(super) fn too_soon(context: &Context, schedule: &Schedule, now_ms: i64) -> Option<i64> {
    let last = schedule.last_fired_at.as_deref()?;
    let last_ms = chrono::DateTime::parse_from_rfc3339(last).ok()?.timestamp_millis();
    let allowed_from = last_ms.saturating_add(context.min_interval_ms);
    (now_ms < allowed_from).then_some(allowed_from)
}

fn record(context: &Context, schedule: &Schedule, due_ms: i64, sent: Sent) -> Fire {
    let (outcome, session_id, run_id, reason) = match sent {
        Sent::Fired { session_id, run_id } => (FireOutcome::Fired, Some(session_id), Some(run_id), None),
        Sent::Skipped { session_id, reason } => (FireOutcome::Skipped, session_id, None, Some(reason)),
    };
    Fire {
        seq: 0,
        schedule_id: schedule.id.clone(),
        due_at: crate::time::rfc3339_from_millis(due_ms),
        at: crate::time::rfc3339_from_millis(context.clock.now_ms()),
        outcome,
        reason,
        session_id,
        run_id,
    }
}

fn send(context: &Context, schedule: &Schedule) -> Sent {
    let engine = &context.engine;
    let session_id = match &schedule.target {
        Target::SessionId(id) => id.clone(),
        Target::Session(spec) => {
            let title = spec.title.clone().or_else(|| Some(format!("Scheduled: {}", schedule.cron)));
            let new =
                NewSession { title, model: spec.model.clone(), system_prompt: None, workspace: spec.workspace.clone() };
            match engine.create_session(&schedule.tenant, new, None) {
                Ok(detail) => detail.summary.id,
                Err(error) => return Sent::Skipped { session_id: None, reason: reason(&error) },
            }
        }
    };
    let message = NewMessage { content: schedule.message.clone(), images: Vec::new(), response_format: None };
    match engine.send_message(&schedule.tenant, &session_id, message, None, (context.plan)()) {
        Ok(run_id) => Sent::Fired { session_id, run_id },
        Err(error) => Sent::Skipped { session_id: Some(session_id), reason: reason(&error) },
    }
}

/// Why a fire was skipped, as a code.
fn reason(error: &EngineError) -> String {
    match error {
        EngineError::SessionBusy => "session_busy".into(),
        EngineError::SessionNotFound => "session_not_found".into(),
        EngineError::BudgetExceeded(_) => "budget_exceeded".into(),
        EngineError::SessionLimit(_) => "session_limit".into(),
        EngineError::ShuttingDown => "shutting_down".into(),
        EngineError::InvalidModel(_) => "invalid_model".into(),
        EngineError::InvalidWorkspace(_) | EngineError::WorkspaceForbidden(_) => "invalid_workspace".into(),
        other => {
            log::warn!("a schedule's fire failed: {other}");
            "failed".into()
        }
    }
}

fn announcement(fire: &Fire) -> Event {
    let (schedule_id, due_at) = (fire.schedule_id.clone(), fire.due_at.clone());
    match (&fire.outcome, &fire.session_id, &fire.run_id) {
        (FireOutcome::Fired, Some(session_id), Some(run_id)) => {
            Event::ScheduleFired { schedule_id, session_id: session_id.clone(), run_id: run_id.clone(), due_at }
        }
        _ => Event::ScheduleSkipped {
            schedule_id,
            session_id: fire.session_id.clone(),
            reason: fire.reason.clone().unwrap_or_default(),
            due_at,
        },
    }
}
