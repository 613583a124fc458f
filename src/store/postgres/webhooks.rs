//! Webhook endpoints, the outbox of their deliveries and each attempt in PostgreSQL
//! (`store/webhooks.rs` says what each write means). `enqueue` runs in the log append's
//! transaction, so an event and its deliveries commit together.

use super::super::contract::Busy;
use super::super::rows::{self, ATTEMPT_COLUMNS, DELIVERY_COLUMNS, WEBHOOK_COLUMNS};
use super::super::webhooks::WebhookWrite;
use super::super::{LoggedEvent, StoreError};
use super::conn::{decode, Tx};
use super::Postgres;
use crate::domain::STORED_FORM;
use crate::webhooks::{Attempt, Delivery, DeliveryState, Webhook};

pub(super) fn apply(tx: &mut Tx<'_>, write: &WebhookWrite) -> Result<(), StoreError> {
    match write {
        WebhookWrite::Insert(webhook) => insert(tx, webhook),
        WebhookWrite::Delete { tenant, id } => {
            found(tx.exec("DELETE FROM webhooks WHERE tenant = $1 AND id = $2", &[tenant, id])?)
        }
        WebhookWrite::SyncConfig(webhooks) => sync_config(tx, webhooks),
        WebhookWrite::Attempted { delivery_id, attempt, state, next_at, disable_after } => {
            attempted(tx, delivery_id, attempt, (*state, *next_at), *disable_after)
        }
        WebhookWrite::Redeliver { tenant, webhook_id, delivery_id, now_ms } => found(tx.exec(
            "UPDATE webhook_deliveries SET state = 'pending', next_at = $3, created_ms = $3
             WHERE id = $2 AND webhook_id = $4 AND webhook_id IN (SELECT id FROM webhooks WHERE tenant = $1)",
            &[tenant, delivery_id, now_ms, webhook_id],
        )?),
        WebhookWrite::Enable { tenant, id } => found(tx.exec(
            "UPDATE webhooks SET enabled = 1, failures = 0, disabled_reason = NULL WHERE tenant = $1 AND id = $2",
            &[tenant, id],
        )?),
    }
}

fn found(changed: u64) -> Result<(), StoreError> {
    match changed {
        0 => Err(StoreError::NotFound),
        _ => Ok(()),
    }
}

fn insert(tx: &mut Tx<'_>, webhook: &Webhook) -> Result<(), StoreError> {
    tx.exec(
        "INSERT INTO webhooks (id, tenant, url, description, secret, source, enabled, failures, disabled_reason,
                               created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        &[
            &webhook.id,
            &webhook.tenant,
            &webhook.url,
            &webhook.description,
            &webhook.secret,
            &webhook.source.as_str(),
            &i64::from(webhook.enabled),
            &i64::from(webhook.failures),
            &webhook.disabled_reason,
            &webhook.created_at,
        ],
    )?;
    subscribe(tx, webhook)
}

fn subscribe(tx: &mut Tx<'_>, webhook: &Webhook) -> Result<(), StoreError> {
    tx.exec(
        "INSERT INTO webhook_events (type, webhook_id) SELECT kind, $2 FROM unnest($1::text[]) AS kind
         ON CONFLICT DO NOTHING",
        &[&webhook.events, &webhook.id],
    )?;
    Ok(())
}

fn sync_config(tx: &mut Tx<'_>, webhooks: &[Webhook]) -> Result<(), StoreError> {
    let ids: Vec<String> = webhooks.iter().map(|webhook| webhook.id.clone()).collect();
    tx.exec("DELETE FROM webhooks WHERE source = 'config' AND NOT (id = ANY($1))", &[&ids])?;
    for webhook in webhooks {
        let kept = tx.exec(
            "UPDATE webhooks SET tenant = $2, url = $3, description = $4, secret = $5 WHERE id = $1 AND source = 'config'",
            &[&webhook.id, &webhook.tenant, &webhook.url, &webhook.description, &webhook.secret],
        )?;
        if kept == 0 {
            insert(tx, webhook)?;
            continue;
        }
        tx.exec("DELETE FROM webhook_events WHERE webhook_id = $1", &[&webhook.id])?;
        subscribe(tx, webhook)?;
    }
    Ok(())
}

fn attempted(
    tx: &mut Tx<'_>,
    delivery_id: &str,
    attempt: &Attempt,
    (state, next_at): (DeliveryState, i64),
    disable_after: u32,
) -> Result<(), StoreError> {
    let status = attempt.status.map(i64::from);
    let latency = attempt.latency_ms as i64;
    tx.exec(
        "INSERT INTO webhook_attempts (delivery_id, n, at, status, error, latency_ms) VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (delivery_id, n) DO UPDATE
         SET at = excluded.at, status = excluded.status, error = excluded.error, latency_ms = excluded.latency_ms",
        &[&delivery_id, &i64::from(attempt.n), &attempt.at, &status, &attempt.error, &latency],
    )?;
    let delivered_at = (state == DeliveryState::Delivered).then_some(&attempt.at);
    found(tx.exec(
        "UPDATE webhook_deliveries SET state = $2, attempts = $3, next_at = $4, last_status = $5, last_error = $6,
                                       last_latency_ms = $7, delivered_at = coalesce($8, delivered_at)
         WHERE id = $1",
        &[
            &delivery_id,
            &state.as_str(),
            &i64::from(attempt.n),
            &next_at,
            &status,
            &attempt.error,
            &latency,
            &delivered_at,
        ],
    )?)?;
    tx.exec(
        "UPDATE webhooks SET failures = CASE WHEN $2 THEN failures + 1 ELSE 0 END
         WHERE id = (SELECT webhook_id FROM webhook_deliveries WHERE id = $1)",
        &[&delivery_id, &attempt.error.is_some()],
    )?;
    tx.exec(
        "UPDATE webhooks SET enabled = 0,
             disabled_reason = 'disabled after ' || failures || ' failed attempts in a row; the last: ' || $2::text
         WHERE id = (SELECT webhook_id FROM webhook_deliveries WHERE id = $1) AND enabled = 1 AND failures >= $3",
        &[&delivery_id, &attempt.error, &i64::from(disable_after)],
    )?;
    Ok(())
}

/// The deliveries of a log append's events, in its transaction: one per event and endpoint
/// of the event's tenant subscribed to its type. One cheap read when no endpoint is enabled.
pub(super) fn enqueue(tx: &mut Tx<'_>, first: u64, entries: &[Option<LoggedEvent>]) -> Result<(), StoreError> {
    let hooked: bool = tx.one("SELECT EXISTS (SELECT 1 FROM webhooks WHERE enabled = 1)", &[])?.get(0);
    if !hooked {
        return Ok(());
    }
    let events: Vec<(i64, &LoggedEvent)> = entries
        .iter()
        .enumerate()
        .filter_map(|(offset, event)| event.as_ref().map(|event| ((first + offset as u64) as i64, event)))
        .filter(|(_, event)| event.tenant.is_some())
        .collect();
    let seqs: Vec<i64> = events.iter().map(|(seq, _)| *seq).collect();
    let kinds: Vec<&str> = events.iter().map(|(_, e)| e.kind.as_str()).collect();
    let ats: Vec<&str> = events.iter().map(|(_, e)| e.at.as_str()).collect();
    let sessions: Vec<Option<&str>> = events.iter().map(|(_, e)| e.session_id.as_deref()).collect();
    let bodies: Vec<&str> = events.iter().map(|(_, e)| e.body.as_str()).collect();
    let tenants: Vec<Option<&str>> = events.iter().map(|(_, e)| e.tenant.as_deref()).collect();
    tx.exec(
        "INSERT INTO webhook_deliveries (id, webhook_id, seq, type, at, session_id, body, form, next_at, created_ms)
         SELECT 'msg_' || e.seq || '_' || w.id, w.id, e.seq, e.type, e.at, e.session_id, e.body, $7, $8, $8
         FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
              AS e(seq, type, at, session_id, body, tenant)
         JOIN webhook_events s ON s.type = e.type
         JOIN webhooks w ON w.id = s.webhook_id AND w.tenant = e.tenant AND w.enabled = 1
         ON CONFLICT DO NOTHING",
        &[&seqs, &kinds, &ats, &sessions, &bodies, &tenants, &STORED_FORM, &crate::time::now_millis()],
    )?;
    Ok(())
}

/// The endpoint's columns and its event types.
fn webhook_columns() -> String {
    format!("{WEBHOOK_COLUMNS}, (SELECT string_agg(type, ' ') FROM webhook_events WHERE webhook_id = w.id)")
}

impl super::super::contract::WebhookReads for Postgres {
    fn webhooks_of(&self, tenant: &str) -> Result<Vec<Webhook>, StoreError> {
        self.with(|conn| {
            let sql =
                format!("SELECT {} FROM webhooks w WHERE w.tenant = $1 ORDER BY w.created_at, w.id", webhook_columns());
            decode(conn.query(&sql, &[&tenant])?, rows::webhook)
        })
    }

    fn webhook(&self, id: &str) -> Result<Option<Webhook>, StoreError> {
        self.with(|conn| {
            let sql = format!("SELECT {} FROM webhooks w WHERE w.id = $1", webhook_columns());
            conn.opt(&sql, &[&id])?.map(|row| rows::webhook(&row)).transpose()
        })
    }

    fn due_deliveries(
        &self,
        now_ms: i64,
        limit: usize,
        busy: &Busy<'_>,
    ) -> Result<Vec<(String, Delivery)>, StoreError> {
        self.with(|conn| {
            let sql = format!(
                "SELECT {DELIVERY_COLUMNS}, (SELECT w.tenant FROM webhooks w WHERE w.id = d.webhook_id)
                 FROM webhook_deliveries d
                 WHERE d.state = 'pending' AND d.next_at <= $1
                   AND d.webhook_id IN (SELECT id FROM webhooks WHERE enabled = 1 AND NOT (tenant = ANY($3)))
                   AND NOT (d.webhook_id = ANY($4))
                 ORDER BY d.next_at, d.seq LIMIT $2"
            );
            let (tenants, webhooks) = (busy.tenants.to_vec(), busy.webhooks.to_vec());
            decode(conn.query(&sql, &[&now_ms, &(limit as i64), &tenants, &webhooks])?, rows::due_delivery)
        })
    }

    fn next_delivery_at(&self) -> Result<Option<i64>, StoreError> {
        self.with(|conn| {
            let sql = "SELECT min(next_at) FROM webhook_deliveries WHERE state = 'pending'
                         AND webhook_id IN (SELECT id FROM webhooks WHERE enabled = 1)";
            Ok(conn.one(sql, &[])?.get(0))
        })
    }

    fn any_enabled_webhook(&self) -> Result<bool, StoreError> {
        self.with(|conn| Ok(conn.one("SELECT EXISTS (SELECT 1 FROM webhooks WHERE enabled = 1)", &[])?.get(0)))
    }

    fn deliveries(&self, webhook_id: &str, limit: usize) -> Result<Vec<(Delivery, Vec<Attempt>)>, StoreError> {
        self.with(|conn| {
            let sql = format!(
                "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries WHERE webhook_id = $1 ORDER BY seq DESC LIMIT $2"
            );
            let deliveries = decode(conn.query(&sql, &[&webhook_id, &(limit as i64)])?, rows::delivery)?;
            let attempts = format!("SELECT {ATTEMPT_COLUMNS} FROM webhook_attempts WHERE delivery_id = $1 ORDER BY n");
            deliveries
                .into_iter()
                .map(|delivery| {
                    let tries = decode(conn.query(&attempts, &[&delivery.id])?, rows::attempt)?;
                    Ok((delivery, tries))
                })
                .collect()
        })
    }
}
