//! The `kestrel-webhooks` thread and its `kestrel-webhook-send` workers: the dispatcher reads
//! the outbox for deliveries due (every `POLL` while an endpoint is enabled, or at once when
//! woken; with none it only waits to be woken, by a new or enabled endpoint) and hands each to a
//! free worker, which signs it, POSTs it (no redirects, addresses checked at the connection,
//! the whole attempt, connection, head and body, within `timeout_ms`, the answer read at most
//! `ANSWER_READ` bytes), and records the attempt with what comes next: done, a retry after a
//! doubling delay with jitter, or failed once the retry period is over. An endpoint failing
//! `disable_after_failures` times in a row is disabled, with a notice.
//!
//! Fairness (`shares.rs`): an endpoint has one delivery in flight at most, a tenant
//! `senders_per_tenant`; the outbox is read past the endpoints and tenants that may start no
//! more, so one tenant's hanging endpoints never hold every sender and the other tenants'
//! deliveries go out on the rest, and a free worker goes first to the tenant with the fewest
//! deliveries in flight. A job is handed over only to a free worker: at most `senders` are in
//! flight, and the job channel holds that many.

use std::io::Read;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, unbounded, Receiver, Sender};

use super::registry::Webhooks;
use super::shares::Shares;
use super::target::GuardedResolver;
use super::{sign, Attempt, Delivery, DeliveryState, Settings};
use crate::bus::Bus;
use crate::domain::{Event, NoticeLevel};
use crate::store::{Busy, LoggedEvent, Store, WebhookWrite, WriteOp};

/// Appends an event as the door renders it (Kestrel's wire form); `false` when it has none.
pub type Render = fn(&Event, &mut Vec<u8>) -> bool;

/// How often the outbox is read when nothing wakes the dispatcher.
const POLL: Duration = Duration::from_millis(100);
/// How often it is read while no endpoint is enabled.
const IDLE_POLL: Duration = Duration::from_secs(60);
/// The most of an endpoint's answer read (then the connection is dropped).
const ANSWER_READ: u64 = 64 * 1024;
/// The longest wait between two attempts.
const MAX_DELAY_MS: u64 = 3_600_000;
/// Deliveries read from the outbox at once.
const BATCH: usize = 64;

/// The dispatcher and its workers, stopped and joined by `shutdown` (or when dropped).
pub struct WebhookSender {
    stop: Sender<()>,
    threads: Vec<JoinHandle<()>>,
}

struct Worker {
    store: Store,
    settings: Arc<Settings>,
    render: Render,
    bus: Bus,
    agent: ureq::Agent,
}

/// Starts the sender; the handle the API uses to change endpoints comes with it.
pub fn start(
    store: Store,
    settings: Settings,
    render: Render,
    (bus, quiet_ends): (Bus, Arc<std::sync::atomic::AtomicBool>),
) -> std::io::Result<(Webhooks, WebhookSender)> {
    let settings = Arc::new(settings);
    let (wake_tx, wake) = bounded(1);
    let (stop, stopped) = bounded::<()>(0);
    // The dispatcher hands a job only to a free worker, so it never waits for room.
    let (jobs_tx, jobs) = bounded::<Delivery>(settings.senders);
    let (done_tx, done) = unbounded::<String>();
    let mut threads = Vec::new();
    for _ in 0..settings.senders {
        let worker = Worker::new(store.clone(), Arc::clone(&settings), render, bus.clone());
        let (jobs, done_tx) = (jobs.clone(), done_tx.clone());
        let thread = std::thread::Builder::new().name("kestrel-webhook-send".into()).spawn(move || {
            for delivery in jobs {
                let id = delivery.id.clone();
                worker.send(delivery);
                let _ = done_tx.send(id);
            }
        })?;
        threads.push(thread);
    }
    let shares = Shares::new(settings.senders, settings.senders_per_tenant);
    let mut dispatcher = Dispatcher { store: store.clone(), shares };
    let thread = std::thread::Builder::new()
        .name("kestrel-webhooks".into())
        .spawn(move || dispatcher.run(&jobs_tx, (&wake, &done, &stopped)))?;
    threads.push(thread);
    Ok((Webhooks::new(store, settings, wake_tx, quiet_ends), WebhookSender { stop, threads }))
}

impl WebhookSender {
    pub fn shutdown(mut self) {
        self.stop_all();
    }

    fn stop_all(&mut self) {
        // Dropping the sender disconnects the dispatcher's stop channel; the workers end when
        // the dispatcher drops their job channel, after the attempts in flight.
        let (dropped, _) = bounded(0);
        drop(std::mem::replace(&mut self.stop, dropped));
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl Drop for WebhookSender {
    fn drop(&mut self) {
        self.stop_all();
    }
}

struct Dispatcher {
    store: Store,
    /// What is in flight, by endpoint and tenant; only this thread changes it.
    shares: Shares,
}

impl Dispatcher {
    fn run(
        &mut self,
        jobs: &Sender<Delivery>,
        (wake, done, stopped): (&Receiver<()>, &Receiver<String>, &Receiver<()>),
    ) {
        loop {
            self.dispatch(jobs);
            // No enabled endpoint: no delivery can appear until the API makes or enables one,
            // which wakes this thread; the idle read is only a backstop.
            let poll = match self.store.readers().any_enabled_webhook() {
                Ok(false) => IDLE_POLL,
                _ => POLL,
            };
            select! {
                recv(stopped) -> _ => return,
                recv(wake) -> _ => {}
                recv(done) -> id => {
                    if let Ok(id) = id {
                        self.shares.end(&id);
                    }
                }
                default(poll) => {}
            }
        }
    }

    /// Hands due deliveries to the free workers, fairly: level by level, first to the tenants
    /// with nothing in flight, then to those with one, and so on to their share; so a free
    /// worker goes to the tenant with the fewest deliveries in flight that has one due,
    /// however many of other tenants' come before it in the outbox. Each read leaves out the
    /// busy endpoints and the tenants at the level; a batch read whole may hide more, so it is
    /// read again (each read starts at least one, or every worker is busy).
    fn dispatch(&mut self, jobs: &Sender<Delivery>) {
        for level in 1..=self.shares.per_tenant() {
            loop {
                if self.shares.full() {
                    return;
                }
                let (webhooks, tenants) = (self.shares.busy_webhooks(), self.shares.tenants_at(level));
                let busy = Busy { webhooks: &webhooks, tenants: &tenants };
                let due = match self.store.readers().due_deliveries(crate::time::now_millis(), BATCH, &busy) {
                    Ok(due) => due,
                    Err(error) => return log::error!("the webhook outbox was not read: {error}"),
                };
                let whole_batch = due.len() == BATCH;
                let mut started = false;
                for (tenant, delivery) in due {
                    let below = self.shares.of_tenant(&tenant) < level;
                    if !below || !self.shares.may_start(&delivery.id, &delivery.webhook_id, &tenant) {
                        continue;
                    }
                    let (id, webhook) = (delivery.id.clone(), delivery.webhook_id.clone());
                    if jobs.try_send(delivery).is_err() {
                        return;
                    }
                    self.shares.start(&id, &webhook, &tenant);
                    started = true;
                }
                if !whole_batch || !started {
                    break;
                }
            }
        }
    }
}

impl Worker {
    fn new(store: Store, settings: Arc<Settings>, render: Render, bus: Bus) -> Worker {
        let agent = ureq::AgentBuilder::new()
            .resolver(GuardedResolver::system(settings.allow_private_targets))
            .redirects(0)
            .timeout(Duration::from_millis(settings.timeout_ms))
            .user_agent(concat!("kestrel-webhooks/", env!("CARGO_PKG_VERSION")))
            .build();
        Worker { store, settings, render, bus, agent }
    }

    fn send(&self, delivery: Delivery) {
        let webhook = match self.store.readers().webhook(&delivery.webhook_id) {
            Ok(Some(webhook)) if webhook.enabled => webhook,
            Ok(_) => return,
            Err(error) => return log::error!("webhook {} was not read: {error}", delivery.webhook_id),
        };
        let body = self.body(&delivery);
        let started = Instant::now();
        let answer = sign::key_of(&webhook.secret)
            .ok_or_else(|| (None, "the endpoint's secret is not usable".to_string()))
            .and_then(|key| self.post(&webhook.url, &delivery.id, &key, &body));
        let latency_ms = started.elapsed().as_millis() as u64;
        let n = delivery.attempts + 1;
        let at = crate::time::now_rfc3339();
        let (status, error) = match answer {
            Ok(status) => (Some(status), None),
            Err((status, error)) => (status, Some(error)),
        };
        let attempt = Attempt { n, at, status, error, latency_ms };
        let failed = attempt.error.is_some();
        let (state, next_at) = self.next(&delivery, &attempt);
        let disable_after = self.settings.disable_after_failures;
        let write =
            WebhookWrite::Attempted { delivery_id: delivery.id.clone(), attempt, state, next_at, disable_after };
        if let Err(error) = self.store.write(vec![WriteOp::Webhook(write)]) {
            return log::error!("delivery {}: its attempt was not recorded: {error}", delivery.id);
        }
        // Only a failure can have disabled it.
        if failed {
            self.tell_if_disabled(&webhook.id);
        }
    }

    /// `{type, timestamp, data: {sessionId, seq, event}}`, the event in Kestrel's shape (or as
    /// the log keeps it, for an event no Kestrel stream shows).
    fn body(&self, delivery: &Delivery) -> Vec<u8> {
        let head = serde_json::json!({ "type": delivery.kind, "timestamp": delivery.at });
        let mut body = head.to_string().into_bytes();
        body.pop();
        body.extend_from_slice(br#","data":{"sessionId":"#);
        body.extend_from_slice(serde_json::to_string(&delivery.session_id).unwrap_or_default().as_bytes());
        body.extend_from_slice(format!(r#","seq":{},"event":"#, delivery.seq).as_bytes());
        let logged = LoggedEvent {
            seq: delivery.seq,
            tenant: None,
            session_id: delivery.session_id.clone(),
            actor: None,
            kind: delivery.kind.clone(),
            at: delivery.at.clone(),
            body: delivery.body.clone(),
            form: delivery.form,
        };
        let rendered = crate::store::decode_event(&logged).is_ok_and(|event| (self.render)(&event, &mut body));
        if !rendered {
            body.extend_from_slice(delivery.body.as_bytes());
        }
        body.extend_from_slice(b"}}");
        body
    }

    /// One POST: the status of a 2xx answer, or the status (if any) and what went wrong.
    fn post(&self, url: &str, id: &str, key: &[u8], body: &[u8]) -> Result<u16, (Option<u16>, String)> {
        let timestamp = crate::time::now_millis() / 1000;
        let request = self
            .agent
            .post(url)
            .set("content-type", "application/json")
            .set("webhook-id", id)
            .set("webhook-timestamp", &timestamp.to_string())
            .set("webhook-signature", &sign::signature(key, id, timestamp, body));
        let response = match request.send_bytes(body) {
            Ok(response) => response,
            Err(ureq::Error::Status(status, response)) => {
                drain(response);
                return Err((Some(status), format!("the endpoint answered {status}")));
            }
            Err(ureq::Error::Transport(error)) => return Err((None, error.to_string())),
        };
        let status = response.status();
        drain(response);
        match status {
            200..=299 => Ok(status),
            status => Err((Some(status), format!("the endpoint answered {status}; redirects are not followed"))),
        }
    }

    /// What follows an attempt: done, a retry, or failed past the retry period.
    fn next(&self, delivery: &Delivery, attempt: &Attempt) -> (DeliveryState, i64) {
        let now = crate::time::now_millis();
        if attempt.error.is_none() {
            return (DeliveryState::Delivered, now);
        }
        let delay = retry_delay(self.settings.retry_base_delay_ms, attempt.n);
        let next_at = now + delay as i64;
        match next_at > delivery.created_ms + self.settings.retry_period_ms as i64 {
            true => (DeliveryState::Failed, now),
            false => (DeliveryState::Pending, next_at),
        }
    }

    /// Publishes a notice once an endpoint's attempt disabled it.
    fn tell_if_disabled(&self, id: &str) {
        let Ok(Some(webhook)) = self.store.readers().webhook(id) else { return };
        if webhook.enabled || webhook.failures != self.settings.disable_after_failures {
            return;
        }
        let reason = webhook.disabled_reason.unwrap_or_default();
        let message = format!("webhook {} ({}) is disabled: {reason}", webhook.id, webhook.url);
        log::warn!("{message}");
        let notice = Event::Notice { level: NoticeLevel::Warn, message, session_id: None };
        self.bus.publish(Some(&webhook.tenant), notice);
    }
}

/// The delay before attempt `n + 1`: the base doubled `n - 1` times, at most an hour, times a
/// random factor in [0.5, 1.5) so endpoints that fail together are not retried together.
fn retry_delay(base_ms: u64, n: u32) -> u64 {
    let doubled = base_ms.saturating_mul(1u64 << (n.saturating_sub(1)).min(30)).min(MAX_DELAY_MS);
    let mut random = [0u8; 2];
    let _ = getrandom::getrandom(&mut random);
    let factor = 0.5 + f64::from(u16::from_le_bytes(random)) / 65_536.0;
    ((doubled as f64) * factor).max(1.0) as u64
}

/// Reads at most `ANSWER_READ` of an answer and drops the rest with the connection.
fn drain(response: ureq::Response) {
    let _ = std::io::copy(&mut response.into_reader().take(ANSWER_READ), &mut std::io::sink());
}

#[cfg(test)]
mod tests {
    #[test]
    fn delays_double_within_their_jitter_up_to_an_hour() {
        for n in 1..=6u32 {
            let delay = super::retry_delay(1_000, n);
            let middle = 1_000u64 << (n - 1);
            assert!(delay >= middle / 2 && delay < middle * 3 / 2, "attempt {n}: {delay}");
        }
        assert!(super::retry_delay(1_000, 40) < super::MAX_DELAY_MS * 3 / 2);
    }
}
