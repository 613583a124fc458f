//! Webhooks (docs/webhooks.md): endpoints per tenant, through the API or the config file,
//! each subscribed to event types. Deliveries come from a durable outbox the store writes in
//! the same transaction as each event (`store/webhooks.rs`), so a crash between the two neither
//! loses nor invents one; the `kestrel-webhooks` thread sends them (`deliver.rs`), signed per
//! Standard Webhooks (`sign.rs`), retried with backoff and jitter, fairly across tenants and
//! endpoints (`shares.rs`), to addresses checked again at every connection (`target.rs`)
//! against one table of special-purpose addresses (`special.rs`).

mod deliver;
mod registry;
mod shares;
pub mod sign;
pub mod special;
pub mod target;

pub use deliver::{start, Render, WebhookSender};
pub use registry::{NewWebhook, WebhookError, Webhooks, MAX_PER_TENANT};

/// The event types an endpoint may subscribe to.
pub const EVENT_TYPES: &[&str] = &[
    "session.created",
    "session.deleted",
    "run.started",
    "run.finished",
    "run.failed",
    "approval.requested",
    "approval.resolved",
    "message.completed",
    "tool.finished",
    "schedule.fired",
    "schedule.skipped",
];

/// An endpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Webhook {
    pub id: String,
    pub tenant: String,
    pub url: String,
    pub description: Option<String>,
    /// `whsec_` and the base64 of the key (Standard Webhooks' form).
    pub secret: String,
    pub events: Vec<String>,
    pub source: Source,
    pub enabled: bool,
    /// Failed attempts in a row, since the last success.
    pub failures: u32,
    pub disabled_reason: Option<String>,
    pub created_at: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Api,
    Config,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Api => "api",
            Source::Config => "config",
        }
    }

    pub fn parse(text: &str) -> Option<Source> {
        match text {
            "api" => Some(Source::Api),
            "config" => Some(Source::Config),
            _ => None,
        }
    }
}

/// One event for one endpoint, and how its sending went.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// The `webhook-id` header: the same for every attempt, so a receiver can drop repeats.
    pub id: String,
    pub webhook_id: String,
    pub seq: u64,
    pub kind: String,
    pub at: String,
    pub session_id: Option<String>,
    /// The event as the log keeps it, and its stored form.
    pub body: String,
    pub form: i64,
    pub state: DeliveryState,
    pub attempts: u32,
    /// When it is tried next (ms since the epoch).
    pub next_at: i64,
    /// When it was made (ms): retries stop `retry_period` after it.
    pub created_ms: i64,
    pub last_status: Option<u16>,
    pub last_error: Option<String>,
    pub last_latency_ms: Option<u64>,
    pub delivered_at: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryState {
    Pending,
    Delivered,
    /// Retried for the whole retry period, or its endpoint was disabled.
    Failed,
}

impl DeliveryState {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Failed => "failed",
        }
    }

    pub fn parse(text: &str) -> Option<DeliveryState> {
        match text {
            "pending" => Some(DeliveryState::Pending),
            "delivered" => Some(DeliveryState::Delivered),
            "failed" => Some(DeliveryState::Failed),
            _ => None,
        }
    }
}

/// One try of a delivery.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    pub n: u32,
    pub at: String,
    /// The endpoint's HTTP status, when it answered.
    pub status: Option<u16>,
    /// What went wrong, for people (a refused address, a timeout, a status that is not 2xx).
    pub error: Option<String>,
    pub latency_ms: u64,
}

/// Settings (`[webhooks]`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// The first retry's delay; each next one doubles, with jitter.
    pub retry_base_delay_ms: u64,
    /// How long a delivery is retried, from its event.
    pub retry_period_ms: u64,
    /// Failed attempts in a row after which an endpoint is disabled.
    pub disable_after_failures: u32,
    /// Loopback, private and link-local addresses allowed (tests, a private network).
    pub allow_private_targets: bool,
    pub timeout_ms: u64,
    /// Deliveries in flight at once.
    pub senders: usize,
    /// Deliveries of one tenant in flight at once (at most `senders`).
    pub senders_per_tenant: usize,
}
