//! `Webhooks`, what the API calls: endpoints made (with a secret shown once), listed, deleted
//! and enabled again; their deliveries listed and redelivered; the config file's endpoints
//! kept in step with the store at start.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam_channel::Sender;

use super::target::{self, TargetError};
use super::{sign, Attempt, Delivery, Settings, Source, Webhook, EVENT_TYPES};

use crate::store::{Store, StoreError, WebhookWrite, WriteOp, BAE_TENANT};

/// Endpoints a tenant may have.
pub const MAX_PER_TENANT: usize = 50;
/// The longest description.
const MAX_DESCRIPTION: usize = 500;
/// Deliveries listed at most.
pub const DELIVERIES_SHOWN: usize = 100;

/// An endpoint, as asked for.
pub struct NewWebhook {
    pub url: String,
    pub events: Vec<String>,
    pub description: Option<String>,
}

#[derive(Debug)]
pub enum WebhookError {
    /// Events or a description that cannot be taken: why.
    Invalid(String),
    Target(TargetError),
    NotFound,
    TooMany,
    Store(StoreError),
}

impl std::fmt::Display for WebhookError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WebhookError::Invalid(why) => write!(f, "{why}"),
            WebhookError::Target(error) => write!(f, "{error}"),
            WebhookError::NotFound => write!(f, "no webhook or delivery with that id"),
            WebhookError::TooMany => write!(f, "a tenant may have at most {MAX_PER_TENANT} webhooks"),
            WebhookError::Store(error) => write!(f, "{error}"),
        }
    }
}

impl From<StoreError> for WebhookError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::NotFound => WebhookError::NotFound,
            error => WebhookError::Store(error),
        }
    }
}

#[derive(Clone)]
pub struct Webhooks {
    store: Store,
    settings: Arc<Settings>,
    /// Wakes the sender: a delivery is due now.
    wake: Sender<()>,
    /// Set while an endpoint wants BAE's turn ends, which the engine then logs.
    quiet_ends: Arc<AtomicBool>,
}

impl Webhooks {
    pub(super) fn new(
        store: Store,
        settings: Arc<Settings>,
        wake: Sender<()>,
        quiet_ends: Arc<AtomicBool>,
    ) -> Webhooks {
        let webhooks = Webhooks { store, settings, wake, quiet_ends };
        webhooks.watch_quiet_ends();
        webhooks
    }

    /// Whether BAE's turn ends must be logged: an enabled endpoint of the BAE tenant wants
    /// `run.finished`.
    fn watch_quiet_ends(&self) {
        let wanted = self.store.readers().webhooks_of(BAE_TENANT).is_ok_and(|webhooks| {
            webhooks.iter().any(|webhook| webhook.enabled && webhook.events.iter().any(|e| e == "run.finished"))
        });
        self.quiet_ends.store(wanted, Ordering::Relaxed);
    }

    pub fn create(&self, tenant: &str, new: NewWebhook) -> Result<Webhook, WebhookError> {
        let url = target::check(&new.url, self.settings.allow_private_targets).map_err(WebhookError::Target)?;
        let events = checked_events(new.events)?;
        if new.description.as_ref().is_some_and(|d| d.chars().count() > MAX_DESCRIPTION) {
            return Err(WebhookError::Invalid(format!("`description` is longer than {MAX_DESCRIPTION} characters")));
        }
        if self.store.readers().webhooks_of(tenant)?.len() >= MAX_PER_TENANT {
            return Err(WebhookError::TooMany);
        }
        let webhook = Webhook {
            id: crate::domain::new_id("wh"),
            tenant: tenant.to_string(),
            url,
            description: new.description,
            secret: sign::new_secret(),
            events,
            source: Source::Api,
            enabled: true,
            failures: 0,
            disabled_reason: None,
            created_at: crate::time::now_rfc3339(),
        };
        self.store.write(vec![WriteOp::Webhook(WebhookWrite::Insert(webhook.clone()))])?;
        self.watch_quiet_ends();
        let _ = self.wake.try_send(());
        Ok(webhook)
    }

    pub fn list(&self, tenant: &str) -> Result<Vec<Webhook>, WebhookError> {
        Ok(self.store.readers().webhooks_of(tenant)?)
    }

    pub fn get(&self, tenant: &str, id: &str) -> Result<Webhook, WebhookError> {
        let found = self.store.readers().webhook(id)?;
        found.filter(|webhook| webhook.tenant == tenant).ok_or(WebhookError::NotFound)
    }

    pub fn delete(&self, tenant: &str, id: &str) -> Result<(), WebhookError> {
        let webhook = self.get(tenant, id)?;
        if webhook.source == Source::Config {
            return Err(WebhookError::Invalid("a config file's webhook is removed from the config file".into()));
        }
        let delete = WebhookWrite::Delete { tenant: tenant.into(), id: id.into() };
        self.store.write(vec![WriteOp::Webhook(delete)])?;
        self.watch_quiet_ends();
        Ok(())
    }

    /// An endpoint's deliveries, newest first, with their attempts.
    pub fn deliveries(&self, tenant: &str, id: &str) -> Result<Vec<(Delivery, Vec<Attempt>)>, WebhookError> {
        self.get(tenant, id)?;
        Ok(self.store.readers().deliveries(id, DELIVERIES_SHOWN)?)
    }

    /// Sends a delivery again, now, for a whole retry period.
    pub fn redeliver(&self, tenant: &str, id: &str, delivery_id: &str) -> Result<(), WebhookError> {
        // One write, checked in its own WHERE: the tenant's endpoint, and its delivery.
        let now_ms = crate::time::now_millis();
        let (tenant, webhook_id, delivery_id) = (tenant.into(), id.into(), delivery_id.into());
        let again = WebhookWrite::Redeliver { tenant, webhook_id, delivery_id, now_ms };
        self.store.write(vec![WriteOp::Webhook(again)])?;
        let _ = self.wake.try_send(());
        Ok(())
    }

    /// Enables a disabled endpoint: its pending deliveries go out again.
    pub fn enable(&self, tenant: &str, id: &str) -> Result<Webhook, WebhookError> {
        self.store.write(vec![WriteOp::Webhook(WebhookWrite::Enable { tenant: tenant.into(), id: id.into() })])?;
        let _ = self.wake.try_send(());
        self.watch_quiet_ends();
        self.get(tenant, id)
    }

    /// Makes the stored config endpoints the config file's.
    pub fn sync_config(&self, endpoints: &[crate::config::EndpointConfig]) -> Result<(), WebhookError> {
        let mut webhooks = Vec::new();
        for endpoint in endpoints {
            let name = &endpoint.name;
            let invalid = |why: String| WebhookError::Invalid(format!("webhook endpoint {name}: {why}"));
            let url = target::check(&endpoint.url, self.settings.allow_private_targets)
                .map_err(|error| invalid(error.to_string()))?;
            if sign::key_of(&endpoint.secret).is_none() {
                return Err(invalid("`secret` must be whsec_ and the base64 of 24 to 64 bytes".into()));
            }
            webhooks.push(Webhook {
                id: format!("wh_config_{name}"),
                tenant: endpoint.tenant.clone(),
                url,
                description: endpoint.description.clone(),
                secret: endpoint.secret.clone(),
                events: checked_events(endpoint.events.clone()).map_err(|error| invalid(error.to_string()))?,
                source: Source::Config,
                enabled: true,
                failures: 0,
                disabled_reason: None,
                created_at: crate::time::now_rfc3339(),
            });
        }
        self.store.write(vec![WriteOp::Webhook(WebhookWrite::SyncConfig(webhooks))])?;
        self.watch_quiet_ends();
        let _ = self.wake.try_send(());
        Ok(())
    }
}

/// The event types asked for, each known, once each, sorted.
fn checked_events(mut events: Vec<String>) -> Result<Vec<String>, WebhookError> {
    if events.is_empty() {
        return Err(WebhookError::Invalid("`events` must name at least one event type".into()));
    }
    if let Some(unknown) = events.iter().find(|kind| !EVENT_TYPES.contains(&kind.as_str())) {
        let known = EVENT_TYPES.join(", ");
        return Err(WebhookError::Invalid(format!("`events`: {unknown:?} is not an event type; they are {known}")));
    }
    events.sort();
    events.dedup();
    Ok(events)
}
