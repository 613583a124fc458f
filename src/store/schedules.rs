//! Scheduled runs and their fires (`crate::schedule`).

use rusqlite::{params, OptionalExtension, Row, Transaction};

use super::StoreError;
use crate::schedule::{CatchUp, Fire, FireOutcome, Schedule, Target};

/// The fires each schedule keeps; older ones are dropped as new ones come.
pub const FIRES_KEPT: i64 = 100;

/// A change to the schedules.
#[derive(Debug, Clone)]
pub enum ScheduleWrite {
    Insert(Schedule),
    /// Pauses or resumes a tenant's schedule, with its next fire; `NotFound` when it has none.
    SetPaused {
        tenant: String,
        id: String,
        paused: bool,
        next_at: Option<i64>,
        updated_at: String,
    },
    /// Removes a tenant's schedule and its fires; `NotFound` when it has none by that id.
    Delete {
        tenant: String,
        id: String,
    },
    /// Records a fire (or a skip) and when the schedule fires next; `NotFound` when the
    /// schedule was deleted meanwhile.
    Fired {
        fire: Fire,
        next_at: Option<i64>,
    },
}

pub(super) fn apply(tx: &Transaction<'_>, write: &ScheduleWrite) -> Result<(), StoreError> {
    match write {
        ScheduleWrite::Insert(schedule) => insert(tx, schedule),
        ScheduleWrite::SetPaused { tenant, id, paused, next_at, updated_at } => {
            let changed = tx
                .prepare_cached(
                    "UPDATE schedules SET paused = ?3, next_at = ?4, updated_at = ?5 WHERE tenant = ?1 AND id = ?2",
                )?
                .execute(params![tenant, id, *paused as i64, next_at, updated_at])?;
            found(changed)
        }
        ScheduleWrite::Delete { tenant, id } => {
            let deleted =
                tx.prepare_cached("DELETE FROM schedules WHERE tenant = ?1 AND id = ?2")?.execute([tenant, id])?;
            found(deleted)
        }
        ScheduleWrite::Fired { fire, next_at } => record_fire(tx, fire, *next_at),
    }
}

fn found(changed: usize) -> Result<(), StoreError> {
    match changed {
        0 => Err(StoreError::NotFound),
        _ => Ok(()),
    }
}

fn insert(tx: &Transaction<'_>, schedule: &Schedule) -> Result<(), StoreError> {
    let target = serde_json::to_string(&schedule.target).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let message = serde_json::json!({ "content": schedule.message }).to_string();
    tx.prepare_cached(
        "INSERT INTO schedules (id, tenant, cron, timezone, target, message, catch_up, paused, next_at,
                                last_fired_at, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
    )?
    .execute(params![
        schedule.id,
        schedule.tenant,
        schedule.cron,
        schedule.timezone,
        target,
        message,
        schedule.catch_up.as_str(),
        schedule.paused as i64,
        schedule.next_at,
        schedule.last_fired_at,
        schedule.created_at,
        schedule.updated_at,
    ])?;
    Ok(())
}

fn record_fire(tx: &Transaction<'_>, fire: &Fire, next_at: Option<i64>) -> Result<(), StoreError> {
    let last_fired = (fire.outcome == FireOutcome::Fired).then_some(&fire.at);
    let changed = tx
        .prepare_cached(
            "UPDATE schedules SET next_at = CASE WHEN paused = 1 THEN NULL ELSE ?2 END,
                                  last_fired_at = coalesce(?3, last_fired_at)
             WHERE id = ?1",
        )?
        .execute(params![fire.schedule_id, next_at, last_fired])?;
    found(changed)?;
    tx.prepare_cached(
        "INSERT INTO schedule_fires (schedule_id, due_at, at, outcome, reason, session_id, run_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        fire.schedule_id,
        fire.due_at,
        fire.at,
        fire.outcome.as_str(),
        fire.reason,
        fire.session_id,
        fire.run_id
    ])?;
    tx.prepare_cached(
        "DELETE FROM schedule_fires WHERE schedule_id = ?1 AND seq <=
           (SELECT seq FROM schedule_fires WHERE schedule_id = ?1 ORDER BY seq DESC LIMIT 1 OFFSET ?2)",
    )?
    .execute(params![fire.schedule_id, FIRES_KEPT])?;
    Ok(())
}

const COLUMNS: &str =
    "id, tenant, cron, timezone, target, message, catch_up, paused, next_at, last_fired_at, created_at, updated_at";

fn schedule(row: &Row<'_>) -> rusqlite::Result<Result<Schedule, StoreError>> {
    let (target, message, catch_up): (String, String, String) = (row.get(4)?, row.get(5)?, row.get(6)?);
    let target: Target = match serde_json::from_str(&target) {
        Ok(target) => target,
        Err(error) => return Ok(Err(StoreError::Corrupt(format!("schedule target: {error}")))),
    };
    let message = serde_json::from_str::<serde_json::Value>(&message).ok();
    let (Some(content), Some(catch_up)) =
        (message.as_ref().and_then(|m| m["content"].as_str()), CatchUp::parse(&catch_up))
    else {
        return Ok(Err(StoreError::Corrupt(format!("schedule message or catch_up {catch_up:?}"))));
    };
    Ok(Ok(Schedule {
        id: row.get(0)?,
        tenant: row.get(1)?,
        cron: row.get(2)?,
        timezone: row.get(3)?,
        target,
        message: content.to_string(),
        catch_up,
        paused: row.get::<_, i64>(7)? != 0,
        next_at: row.get(8)?,
        last_fired_at: row.get(9)?,
        created_at: row.get(10)?,
        updated_at: row.get(11)?,
    }))
}

fn fire(row: &Row<'_>) -> rusqlite::Result<Result<Fire, StoreError>> {
    let outcome: String = row.get(4)?;
    let Some(outcome) = FireOutcome::parse(&outcome) else {
        return Ok(Err(StoreError::Corrupt(format!("fire outcome {outcome:?}"))));
    };
    Ok(Ok(Fire {
        seq: row.get::<_, i64>(0)? as u64,
        schedule_id: row.get(1)?,
        due_at: row.get(2)?,
        at: row.get(3)?,
        outcome,
        reason: row.get(5)?,
        session_id: row.get(6)?,
        run_id: row.get(7)?,
    }))
}

impl super::contract::ScheduleReads for super::sqlite::Sqlite {
    fn schedules_of(&self, tenant: &str) -> Result<Vec<Schedule>, StoreError> {
        self.with(|conn| {
            let sql = format!("SELECT {COLUMNS} FROM schedules WHERE tenant = ?1 ORDER BY created_at, id");
            let mut statement = conn.prepare_cached(&sql)?;
            let rows = statement.query_map([tenant], schedule)?;
            rows.map(|row| row?).collect()
        })
    }

    fn schedule(&self, id: &str) -> Result<Option<Schedule>, StoreError> {
        self.with(|conn| {
            let sql = format!("SELECT {COLUMNS} FROM schedules WHERE id = ?1");
            conn.prepare_cached(&sql)?.query_row([id], schedule).optional()?.transpose()
        })
    }

    fn active_schedules(&self) -> Result<Vec<Schedule>, StoreError> {
        self.with(|conn| {
            let sql = format!("SELECT {COLUMNS} FROM schedules WHERE paused = 0 AND next_at IS NOT NULL");
            let mut statement = conn.prepare_cached(&sql)?;
            let rows = statement.query_map([], schedule)?;
            rows.map(|row| row?).collect()
        })
    }

    fn fires(&self, schedule_id: &str, limit: usize) -> Result<Vec<Fire>, StoreError> {
        self.with(|conn| {
            let mut statement = conn.prepare_cached(
                "SELECT seq, schedule_id, due_at, at, outcome, reason, session_id, run_id FROM schedule_fires
                 WHERE schedule_id = ?1 ORDER BY seq DESC LIMIT ?2",
            )?;
            let rows = statement.query_map(params![schedule_id, limit as i64], fire)?;
            rows.map(|row| row?).collect()
        })
    }
}
