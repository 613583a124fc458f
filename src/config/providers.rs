//! Model providers: the wire format each speaks, where it is, its key, its retries and
//! fallbacks, and its models (with their limits and prices).

use serde::{Deserialize, Serialize};

/// The wire format a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Wire {
    /// OpenAI Chat Completions (`POST {base_url}/chat/completions`).
    Openai,
    /// Anthropic Messages (`POST {base_url}/messages`).
    Anthropic,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    pub wire: Wire,
    /// Up to and including the version segment: `https://api.openai.com/v1`.
    pub base_url: String,
    /// The environment variable holding the API key. The key never appears in the API,
    /// logs, events or errors.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// A key given directly (providers registered from OPENAI_API_KEY / ANTHROPIC_API_KEY).
    #[serde(default, skip)]
    pub api_key: Option<String>,
    /// A key that may hold `${VAR}`, resolved at each call (BAE config files' `auth_token`).
    #[serde(default, skip)]
    pub api_key_template: Option<String>,
    /// Providers tried in order when this one fails before producing output.
    #[serde(default)]
    pub fallbacks: Vec<String>,
    /// Longest a whole request may take.
    #[serde(default = "defaults::timeout_secs")]
    pub timeout_secs: u64,
    /// Longest silence inside a stream.
    #[serde(default = "defaults::idle_timeout_secs")]
    pub idle_timeout_secs: u64,
    /// Retries of a 429, 408, 5xx or connection error before any output, per provider.
    #[serde(default = "defaults::max_retries")]
    pub max_retries: u32,
    /// First backoff; it doubles with each retry.
    #[serde(default = "defaults::retry_base_delay_ms")]
    pub retry_base_delay_ms: u64,
    /// Longest wait before a retry; a provider asking for more is skipped for its fallback.
    #[serde(default = "defaults::retry_max_wait_secs")]
    pub retry_max_wait_secs: u64,
    pub models: Vec<ModelConfig>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Sent upstream as the model name.
    pub name: String,
    #[serde(default)]
    pub label: Option<String>,
    #[serde(default)]
    pub context_window: Option<u64>,
    #[serde(default = "defaults::yes")]
    pub supports_tools: bool,
    #[serde(default)]
    pub supports_reasoning: bool,
    /// `max_tokens` of each request; Anthropic requires one (default 8192), OpenAI-style
    /// servers get none unless it is set.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Prices per million tokens; `run.finished` usage and the session detail then carry the
    /// cost, and `/metrics` counts it.
    #[serde(default)]
    pub pricing: Option<crate::domain::ModelPricing>,
}

impl ProviderConfig {
    /// A provider with every optional setting at its default and no models yet.
    pub fn new(wire: Wire, base_url: impl Into<String>) -> ProviderConfig {
        ProviderConfig {
            wire,
            base_url: base_url.into(),
            api_key_env: None,
            api_key: None,
            api_key_template: None,
            fallbacks: Vec::new(),
            timeout_secs: defaults::timeout_secs(),
            idle_timeout_secs: defaults::idle_timeout_secs(),
            max_retries: defaults::max_retries(),
            retry_base_delay_ms: defaults::retry_base_delay_ms(),
            retry_max_wait_secs: defaults::retry_max_wait_secs(),
            models: Vec::new(),
        }
    }
}

impl ModelConfig {
    /// A model with tools on, reasoning off, and no label, window or token limit.
    pub fn named(name: impl Into<String>) -> ModelConfig {
        ModelConfig {
            name: name.into(),
            label: None,
            context_window: None,
            supports_tools: true,
            supports_reasoning: false,
            max_tokens: None,
            pricing: None,
        }
    }
}

mod defaults {
    pub fn timeout_secs() -> u64 {
        600
    }
    pub fn idle_timeout_secs() -> u64 {
        60
    }
    pub fn max_retries() -> u32 {
        2
    }
    pub fn retry_base_delay_ms() -> u64 {
        500
    }
    pub fn retry_max_wait_secs() -> u64 {
        30
    }
    pub fn yes() -> bool {
        true
    }
}
