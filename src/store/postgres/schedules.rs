//! Scheduled runs and their fires in PostgreSQL (`store/schedules.rs` says what each write
//! means).

use super::super::rows::{self, FIRE_COLUMNS, SCHEDULE_COLUMNS};
use super::super::schedules::{ScheduleWrite, FIRES_KEPT};
use super::super::StoreError;
use super::conn::{decode, Tx};
use super::Postgres;
use crate::schedule::{Fire, FireOutcome, Schedule};

pub(super) fn apply(tx: &mut Tx<'_>, write: &ScheduleWrite) -> Result<(), StoreError> {
    match write {
        ScheduleWrite::Insert(schedule) => insert(tx, schedule),
        ScheduleWrite::SetPaused { tenant, id, paused, next_at, updated_at } => found(tx.exec(
            "UPDATE schedules SET paused = $3, next_at = $4, updated_at = $5 WHERE tenant = $1 AND id = $2",
            &[tenant, id, &i64::from(*paused), next_at, updated_at],
        )?),
        ScheduleWrite::Delete { tenant, id } => {
            found(tx.exec("DELETE FROM schedules WHERE tenant = $1 AND id = $2", &[tenant, id])?)
        }
        ScheduleWrite::Fired { fire, next_at } => record_fire(tx, fire, *next_at),
    }
}

fn found(changed: u64) -> Result<(), StoreError> {
    match changed {
        0 => Err(StoreError::NotFound),
        _ => Ok(()),
    }
}

fn insert(tx: &mut Tx<'_>, schedule: &Schedule) -> Result<(), StoreError> {
    let target = serde_json::to_string(&schedule.target).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let message = serde_json::json!({ "content": schedule.message }).to_string();
    tx.exec(
        "INSERT INTO schedules (id, tenant, cron, timezone, target, message, catch_up, paused, next_at,
                                last_fired_at, created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        &[
            &schedule.id,
            &schedule.tenant,
            &schedule.cron,
            &schedule.timezone,
            &target,
            &message,
            &schedule.catch_up.as_str(),
            &i64::from(schedule.paused),
            &schedule.next_at,
            &schedule.last_fired_at,
            &schedule.created_at,
            &schedule.updated_at,
        ],
    )?;
    Ok(())
}

fn record_fire(tx: &mut Tx<'_>, fire: &Fire, next_at: Option<i64>) -> Result<(), StoreError> {
    let last_fired = (fire.outcome == FireOutcome::Fired).then_some(&fire.at);
    found(tx.exec(
        "UPDATE schedules SET next_at = CASE WHEN paused = 1 THEN NULL ELSE $2::bigint END,
                              last_fired_at = coalesce($3, last_fired_at)
         WHERE id = $1",
        &[&fire.schedule_id, &next_at, &last_fired],
    )?)?;
    tx.exec(
        "INSERT INTO schedule_fires (schedule_id, due_at, at, outcome, reason, session_id, run_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        &[
            &fire.schedule_id,
            &fire.due_at,
            &fire.at,
            &fire.outcome.as_str(),
            &fire.reason,
            &fire.session_id,
            &fire.run_id,
        ],
    )?;
    tx.exec(
        "DELETE FROM schedule_fires WHERE schedule_id = $1 AND seq <=
           (SELECT seq FROM schedule_fires WHERE schedule_id = $1 ORDER BY seq DESC LIMIT 1 OFFSET $2)",
        &[&fire.schedule_id, &FIRES_KEPT],
    )?;
    Ok(())
}

impl super::super::contract::ScheduleReads for Postgres {
    fn schedules_of(&self, tenant: &str) -> Result<Vec<Schedule>, StoreError> {
        self.with(|conn| {
            let sql = format!("SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE tenant = $1 ORDER BY created_at, id");
            decode(conn.query(&sql, &[&tenant])?, rows::schedule)
        })
    }

    fn schedule(&self, id: &str) -> Result<Option<Schedule>, StoreError> {
        self.with(|conn| {
            let sql = format!("SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE id = $1");
            conn.opt(&sql, &[&id])?.map(|row| rows::schedule(&row)).transpose()
        })
    }

    fn active_schedules(&self) -> Result<Vec<Schedule>, StoreError> {
        self.with(|conn| {
            let sql = format!("SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE paused = 0 AND next_at IS NOT NULL");
            decode(conn.query(&sql, &[])?, rows::schedule)
        })
    }

    fn fires(&self, schedule_id: &str, limit: usize) -> Result<Vec<Fire>, StoreError> {
        self.with(|conn| {
            let sql =
                format!("SELECT {FIRE_COLUMNS} FROM schedule_fires WHERE schedule_id = $1 ORDER BY seq DESC LIMIT $2");
            decode(conn.query(&sql, &[&schedule_id, &(limit as i64)])?, rows::fire)
        })
    }
}
