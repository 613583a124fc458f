//! `[webhooks]`: how deliveries are retried and where they may go, and the config file's own
//! endpoints (`[[webhooks.endpoints]]`), kept in step with the store at every start.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebhooksConfig {
    /// The first retry's delay; each next one doubles (up to an hour), with jitter.
    pub retry_base_delay_ms: u64,
    /// How long a delivery is retried, from its event.
    pub retry_period_hours: u64,
    /// Failed attempts in a row after which an endpoint is disabled.
    pub disable_after_failures: u32,
    /// Send to loopback, private and link-local addresses too (a private network, tests).
    pub allow_private_targets: bool,
    /// How long one attempt may take.
    pub timeout_ms: u64,
    /// Deliveries sent at once.
    pub senders: usize,
    /// Deliveries of one tenant sent at once; unset: half of `senders` (at least one), so one
    /// tenant's slow endpoints never hold every sender.
    pub senders_per_tenant: Option<usize>,
    pub endpoints: Vec<EndpointConfig>,
}

impl Default for WebhooksConfig {
    fn default() -> Self {
        WebhooksConfig {
            retry_base_delay_ms: 5_000,
            retry_period_hours: 24,
            disable_after_failures: 50,
            allow_private_targets: false,
            timeout_ms: 10_000,
            senders: 4,
            senders_per_tenant: None,
            endpoints: Vec::new(),
        }
    }
}

/// An endpoint the config file declares.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    /// Its id is `wh_config_<name>`: stable across restarts, so its deliveries stay its own.
    pub name: String,
    /// Whose events it gets (`@bae` for the BAE door's).
    #[serde(default = "default_tenant")]
    pub tenant: String,
    pub url: String,
    pub events: Vec<String>,
    #[serde(default)]
    pub description: Option<String>,
    /// `whsec_…`; never shown by `/api/config`.
    #[serde(skip_serializing)]
    pub secret: String,
}

fn default_tenant() -> String {
    super::DEFAULT_TENANT.to_string()
}

impl WebhooksConfig {
    pub fn settings(&self) -> crate::webhooks::Settings {
        crate::webhooks::Settings {
            retry_base_delay_ms: self.retry_base_delay_ms.max(1),
            retry_period_ms: self.retry_period_hours.max(1) * 3_600_000,
            disable_after_failures: self.disable_after_failures.max(1),
            allow_private_targets: self.allow_private_targets,
            timeout_ms: self.timeout_ms.max(100),
            senders: self.senders.clamp(1, 64),
            senders_per_tenant: self.senders_per_tenant.unwrap_or(self.senders / 2).clamp(1, self.senders.clamp(1, 64)),
        }
    }
}
