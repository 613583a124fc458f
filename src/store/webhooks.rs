//! Webhook endpoints, the outbox of their deliveries, and each attempt (`crate::webhooks`).
//! `enqueue` runs inside the log append's transaction: an event and its deliveries commit
//! together or not at all.

use rusqlite::{params, OptionalExtension, Transaction};

use super::contract::Busy;
use super::rows::{self, ATTEMPT_COLUMNS, DELIVERY_COLUMNS, WEBHOOK_COLUMNS};
use super::{LoggedEvent, StoreError};
use crate::domain::STORED_FORM;
use crate::webhooks::{Attempt, Delivery, DeliveryState, Webhook};

/// A change to the webhooks.
#[derive(Debug, Clone)]
pub enum WebhookWrite {
    Insert(Webhook),
    /// Removes a tenant's endpoint with its deliveries; `NotFound` when it has none.
    Delete {
        tenant: String,
        id: String,
    },
    /// Makes the config file's endpoints these: new ones added, changed ones rewritten, gone
    /// ones deleted.
    SyncConfig(Vec<Webhook>),
    /// A delivery was tried: the attempt, the delivery's new state, and the endpoint's count of
    /// failures in a row (disabled at `disable_after`, with `disabled_reason`).
    Attempted {
        delivery_id: String,
        attempt: Attempt,
        state: DeliveryState,
        next_at: i64,
        disable_after: u32,
    },
    /// Sends a delivery again from now, for a whole retry period; `NotFound` when the tenant's
    /// endpoint has no such delivery.
    Redeliver {
        tenant: String,
        webhook_id: String,
        delivery_id: String,
        now_ms: i64,
    },
    /// Enables an endpoint again (its failures forgotten); `NotFound` when the tenant has none.
    Enable {
        tenant: String,
        id: String,
    },
}

pub(super) fn apply(tx: &Transaction<'_>, write: &WebhookWrite) -> Result<(), StoreError> {
    match write {
        WebhookWrite::Insert(webhook) => insert(tx, webhook),
        WebhookWrite::Delete { tenant, id } => {
            found(tx.prepare_cached("DELETE FROM webhooks WHERE tenant = ?1 AND id = ?2")?.execute([tenant, id])?)
        }
        WebhookWrite::SyncConfig(webhooks) => sync_config(tx, webhooks),
        WebhookWrite::Attempted { delivery_id, attempt, state, next_at, disable_after } => {
            attempted(tx, delivery_id, attempt, (*state, *next_at), *disable_after)
        }
        WebhookWrite::Redeliver { tenant, webhook_id, delivery_id, now_ms } => found(
            tx.prepare_cached(
                "UPDATE webhook_deliveries SET state = 'pending', next_at = ?3, created_ms = ?3
                 WHERE id = ?2 AND webhook_id = ?4 AND webhook_id IN (SELECT id FROM webhooks WHERE tenant = ?1)",
            )?
            .execute(params![tenant, delivery_id, now_ms, webhook_id])?,
        ),
        WebhookWrite::Enable { tenant, id } => found(
            tx.prepare_cached(
                "UPDATE webhooks SET enabled = 1, failures = 0, disabled_reason = NULL WHERE tenant = ?1 AND id = ?2",
            )?
            .execute([tenant, id])?,
        ),
    }
}

fn found(changed: usize) -> Result<(), StoreError> {
    match changed {
        0 => Err(StoreError::NotFound),
        _ => Ok(()),
    }
}

fn insert(tx: &Transaction<'_>, webhook: &Webhook) -> Result<(), StoreError> {
    tx.prepare_cached(
        "INSERT INTO webhooks (id, tenant, url, description, secret, source, enabled, failures, disabled_reason,
                               created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?
    .execute(params![
        webhook.id,
        webhook.tenant,
        webhook.url,
        webhook.description,
        webhook.secret,
        webhook.source.as_str(),
        webhook.enabled as i64,
        webhook.failures,
        webhook.disabled_reason,
        webhook.created_at,
    ])?;
    let mut subscribe = tx.prepare_cached("INSERT OR IGNORE INTO webhook_events (type, webhook_id) VALUES (?1, ?2)")?;
    for kind in &webhook.events {
        subscribe.execute([kind, &webhook.id])?;
    }
    Ok(())
}

fn sync_config(tx: &Transaction<'_>, webhooks: &[Webhook]) -> Result<(), StoreError> {
    let mut current = tx.prepare_cached("SELECT id FROM webhooks WHERE source = 'config'")?;
    let ids: Vec<String> = current.query_map([], |row| row.get(0))?.collect::<rusqlite::Result<_>>()?;
    for id in ids.iter().filter(|id| !webhooks.iter().any(|w| &w.id == *id)) {
        tx.prepare_cached("DELETE FROM webhooks WHERE id = ?1")?.execute([id])?;
    }
    for webhook in webhooks {
        let kept = tx
            .prepare_cached(
                "UPDATE webhooks SET tenant = ?2, url = ?3, description = ?4, secret = ?5 WHERE id = ?1 AND source = 'config'",
            )?
            .execute(params![webhook.id, webhook.tenant, webhook.url, webhook.description, webhook.secret])?;
        if kept == 0 {
            insert(tx, webhook)?;
            continue;
        }
        tx.prepare_cached("DELETE FROM webhook_events WHERE webhook_id = ?1")?.execute([&webhook.id])?;
        let mut subscribe =
            tx.prepare_cached("INSERT OR IGNORE INTO webhook_events (type, webhook_id) VALUES (?1, ?2)")?;
        for kind in &webhook.events {
            subscribe.execute([kind, &webhook.id])?;
        }
    }
    Ok(())
}

fn attempted(
    tx: &Transaction<'_>,
    delivery_id: &str,
    attempt: &Attempt,
    (state, next_at): (DeliveryState, i64),
    disable_after: u32,
) -> Result<(), StoreError> {
    tx.prepare_cached(
        "INSERT OR REPLACE INTO webhook_attempts (delivery_id, n, at, status, error, latency_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        delivery_id,
        attempt.n,
        attempt.at,
        attempt.status,
        attempt.error,
        attempt.latency_ms as i64
    ])?;
    let delivered_at = (state == DeliveryState::Delivered).then_some(&attempt.at);
    let changed = tx
        .prepare_cached(
            "UPDATE webhook_deliveries SET state = ?2, attempts = ?3, next_at = ?4, last_status = ?5, last_error = ?6,
                                           last_latency_ms = ?7, delivered_at = coalesce(?8, delivered_at)
             WHERE id = ?1",
        )?
        .execute(params![
            delivery_id,
            state.as_str(),
            attempt.n,
            next_at,
            attempt.status,
            attempt.error,
            attempt.latency_ms as i64,
            delivered_at
        ])?;
    found(changed)?;
    let failed = attempt.error.is_some();
    tx.prepare_cached(
        "UPDATE webhooks SET failures = CASE WHEN ?2 THEN failures + 1 ELSE 0 END
         WHERE id = (SELECT webhook_id FROM webhook_deliveries WHERE id = ?1)",
    )?
    .execute(params![delivery_id, failed])?;
    tx.prepare_cached(
        "UPDATE webhooks SET enabled = 0,
             disabled_reason = 'disabled after ' || failures || ' failed attempts in a row; the last: ' || ?2
         WHERE id = (SELECT webhook_id FROM webhook_deliveries WHERE id = ?1) AND enabled = 1 AND failures >= ?3",
    )?
    .execute(params![delivery_id, attempt.error, disable_after])?;
    Ok(())
}

/// The deliveries of the events of a log append, in its transaction: one per event and
/// endpoint of the event's tenant subscribed to its type. One cheap read when no endpoint is.
pub(super) fn enqueue(tx: &Transaction<'_>, first: u64, entries: &[Option<LoggedEvent>]) -> Result<(), StoreError> {
    let hooked: bool =
        tx.prepare_cached("SELECT EXISTS (SELECT 1 FROM webhooks WHERE enabled = 1)")?.query_row([], |r| r.get(0))?;
    if !hooked {
        return Ok(());
    }
    let now = crate::time::now_millis();
    let mut insert = tx.prepare_cached(
        "INSERT OR IGNORE INTO webhook_deliveries (id, webhook_id, seq, type, at, session_id, body, form, next_at,
                                                   created_ms)
         SELECT 'msg_' || ?1 || '_' || w.id, w.id, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7
         FROM webhook_events e JOIN webhooks w ON w.id = e.webhook_id
         WHERE e.type = ?2 AND w.tenant = ?8 AND w.enabled = 1",
    )?;
    for (offset, entry) in entries.iter().enumerate() {
        let Some(event) = entry else { continue };
        let Some(tenant) = &event.tenant else { continue };
        let seq = (first + offset as u64) as i64;
        insert.execute(params![seq, event.kind, event.at, event.session_id, event.body, STORED_FORM, now, tenant])?;
    }
    Ok(())
}

/// The endpoint's columns and its event types.
fn webhook_columns() -> String {
    format!("{WEBHOOK_COLUMNS}, (SELECT group_concat(type, ' ') FROM webhook_events WHERE webhook_id = w.id)")
}

impl super::contract::WebhookReads for super::sqlite::Sqlite {
    fn webhooks_of(&self, tenant: &str) -> Result<Vec<Webhook>, StoreError> {
        self.with(|conn| {
            let sql =
                format!("SELECT {} FROM webhooks w WHERE w.tenant = ?1 ORDER BY w.created_at, w.id", webhook_columns());
            let mut statement = conn.prepare_cached(&sql)?;
            let rows = statement.query_map([tenant], |row| Ok(rows::webhook(row)))?;
            rows.map(|row| row?).collect()
        })
    }

    fn webhook(&self, id: &str) -> Result<Option<Webhook>, StoreError> {
        self.with(|conn| {
            let sql = format!("SELECT {} FROM webhooks w WHERE w.id = ?1", webhook_columns());
            conn.prepare_cached(&sql)?.query_row([id], |row| Ok(rows::webhook(row))).optional()?.transpose()
        })
    }

    fn due_deliveries(
        &self,
        now_ms: i64,
        limit: usize,
        busy: &Busy<'_>,
    ) -> Result<Vec<(String, Delivery)>, StoreError> {
        let webhooks = serde_json::json!(busy.webhooks).to_string();
        let tenants = serde_json::json!(busy.tenants).to_string();
        self.with(|conn| {
            let sql = format!(
                "SELECT {DELIVERY_COLUMNS}, (SELECT w.tenant FROM webhooks w WHERE w.id = d.webhook_id)
                 FROM webhook_deliveries d
                 WHERE d.state = 'pending' AND d.next_at <= ?1
                   AND d.webhook_id IN (SELECT id FROM webhooks
                                        WHERE enabled = 1 AND tenant NOT IN (SELECT value FROM json_each(?3)))
                   AND d.webhook_id NOT IN (SELECT value FROM json_each(?4))
                 ORDER BY d.next_at, d.seq LIMIT ?2"
            );
            let mut statement = conn.prepare_cached(&sql)?;
            let rows = statement
                .query_map(params![now_ms, limit as i64, tenants, webhooks], |row| Ok(rows::due_delivery(row)))?;
            rows.map(|row| row?).collect()
        })
    }

    fn next_delivery_at(&self) -> Result<Option<i64>, StoreError> {
        self.with(|conn| {
            let sql = "SELECT min(next_at) FROM webhook_deliveries WHERE state = 'pending'
                         AND webhook_id IN (SELECT id FROM webhooks WHERE enabled = 1)";
            Ok(conn.prepare_cached(sql)?.query_row([], |row| row.get(0))?)
        })
    }

    fn any_enabled_webhook(&self) -> Result<bool, StoreError> {
        self.with(|conn| {
            let sql = "SELECT EXISTS (SELECT 1 FROM webhooks WHERE enabled = 1)";
            Ok(conn.prepare_cached(sql)?.query_row([], |row| row.get(0))?)
        })
    }

    fn deliveries(&self, webhook_id: &str, limit: usize) -> Result<Vec<(Delivery, Vec<Attempt>)>, StoreError> {
        self.with(|conn| {
            let sql = format!(
                "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries WHERE webhook_id = ?1 ORDER BY seq DESC LIMIT ?2"
            );
            let mut statement = conn.prepare_cached(&sql)?;
            let deliveries: Vec<Delivery> = statement
                .query_map(params![webhook_id, limit as i64], |row| Ok(rows::delivery(row)))?
                .map(|row| row?)
                .collect::<Result<_, StoreError>>()?;
            let mut attempts = conn.prepare_cached(&format!(
                "SELECT {ATTEMPT_COLUMNS} FROM webhook_attempts WHERE delivery_id = ?1 ORDER BY n"
            ))?;
            deliveries
                .into_iter()
                .map(|delivery| {
                    let tries = attempts
                        .query_map([&delivery.id], |row| Ok(rows::attempt(row)))?
                        .map(|row| row?)
                        .collect::<Result<Vec<_>, StoreError>>()?;
                    Ok((delivery, tries))
                })
                .collect()
        })
    }
}
