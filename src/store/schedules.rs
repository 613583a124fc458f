//! Scheduled runs and their fires (`crate::schedule`).

use rusqlite::{params, OptionalExtension, Transaction};

use super::rows::{self, FIRE_COLUMNS, SCHEDULE_COLUMNS};
use super::StoreError;
use crate::schedule::{Fire, FireOutcome, Schedule};

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

impl super::contract::ScheduleReads for super::sqlite::Sqlite {
    fn schedules_of(&self, tenant: &str) -> Result<Vec<Schedule>, StoreError> {
        self.with(|conn| {
            let sql = format!("SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE tenant = ?1 ORDER BY created_at, id");
            let mut statement = conn.prepare_cached(&sql)?;
            let rows = statement.query_map([tenant], |row| Ok(rows::schedule(row)))?;
            rows.map(|row| row?).collect()
        })
    }

    fn schedule(&self, id: &str) -> Result<Option<Schedule>, StoreError> {
        self.with(|conn| {
            let sql = format!("SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE id = ?1");
            conn.prepare_cached(&sql)?.query_row([id], |row| Ok(rows::schedule(row))).optional()?.transpose()
        })
    }

    fn active_schedules(&self) -> Result<Vec<Schedule>, StoreError> {
        self.with(|conn| {
            let sql = format!("SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE paused = 0 AND next_at IS NOT NULL");
            let mut statement = conn.prepare_cached(&sql)?;
            let rows = statement.query_map([], |row| Ok(rows::schedule(row)))?;
            rows.map(|row| row?).collect()
        })
    }

    fn fires(&self, schedule_id: &str, limit: usize) -> Result<Vec<Fire>, StoreError> {
        self.with(|conn| {
            let mut statement = conn.prepare_cached(&format!(
                "SELECT {FIRE_COLUMNS} FROM schedule_fires WHERE schedule_id = ?1 ORDER BY seq DESC LIMIT ?2"
            ))?;
            let rows = statement.query_map(params![schedule_id, limit as i64], |row| Ok(rows::fire(row)))?;
            rows.map(|row| row?).collect()
        })
    }
}
