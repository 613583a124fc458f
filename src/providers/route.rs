//! Configured providers and the route a model's calls take through them.
//!
//! A `WireClient` is one configured provider: its wire format, base URL, key and limits. A
//! `ModelRoute` is what the registry hands the engine for a model: the model's own provider,
//! then the providers in its `fallbacks`. Before any output, 429/408/5xx and connection
//! errors are retried with backoff (honouring `retry-after`, but a provider asking for longer
//! than `retry_max_wait_secs` is skipped at once), and when a provider gives up the next one is
//! tried. Once output has started, a failure fails the run: the user has already seen part of
//! an answer, and a second answer from elsewhere would not continue it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::anthropic::{self, AnthropicStream};
use super::openai::{self, OpenAiStream};
use super::sse::SseParser;
use super::transport::{self, CallError, HttpCall};
use super::{Completion, CompletionRequest, Delta, Provider, ProviderError, SetupError, StreamState};
use crate::cancel::CancelToken;
use crate::config::{ModelConfig, ProviderConfig, Wire};
use crate::domain::ModelInfo;

/// Anthropic requires `max_tokens`; this is used when a model sets none.
pub(super) const ANTHROPIC_DEFAULT_MAX_TOKENS: u32 = 8192;

pub(super) struct WireClient {
    name: String,
    pub(super) config: ProviderConfig,
    api_key: Option<String>,
    pub(super) agent: ureq::Agent,
}

struct Candidate {
    client: Arc<WireClient>,
    model: ModelConfig,
}

pub(super) struct ModelRoute {
    candidates: Vec<Candidate>,
}

/// A configured model: what clients see of it, and the route its calls take.
pub(super) type RoutedModel = (ModelInfo, Arc<dyn Provider>);

/// Builds every configured model's info and route.
pub(super) fn build(
    providers: &BTreeMap<String, ProviderConfig>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<RoutedModel>, SetupError> {
    let mut clients = BTreeMap::new();
    for (name, config) in providers {
        clients.insert(name.clone(), Arc::new(WireClient::new(name, config, env)?));
    }
    let mut models = Vec::new();
    for (name, config) in providers {
        for fallback in &config.fallbacks {
            if !clients.contains_key(fallback) {
                return Err(SetupError::UnknownFallback { provider: name.clone(), fallback: fallback.clone() });
            }
        }
        for model in &config.models {
            let mut candidates = vec![Candidate { client: Arc::clone(&clients[name]), model: model.clone() }];
            for fallback in &config.fallbacks {
                let client = &clients[fallback];
                // The fallback's model of the same name, else its first model.
                let same = client.config.models.iter().find(|m| m.name == model.name);
                let chosen = same.or(client.config.models.first()).expect("checked: every provider has models");
                candidates.push(Candidate { client: Arc::clone(client), model: chosen.clone() });
            }
            let info = ModelInfo {
                id: format!("{name}/{}", model.name),
                provider: name.clone(),
                label: model.label.clone(),
                description: None,
                context_window: model.context_window,
                supports_tools: model.supports_tools,
                supports_reasoning: Some(model.supports_reasoning),
                pricing: model.pricing.clone(),
            };
            models.push((info, Arc::new(ModelRoute { candidates }) as Arc<dyn Provider>));
        }
    }
    Ok(models)
}

impl WireClient {
    fn new(
        name: &str,
        config: &ProviderConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<WireClient, SetupError> {
        if !(config.base_url.starts_with("http://") || config.base_url.starts_with("https://")) {
            return Err(SetupError::BadUrl { provider: name.into(), url: config.base_url.clone() });
        }
        if config.models.is_empty() {
            return Err(SetupError::NoModels(name.into()));
        }
        let api_key = match (&config.api_key, &config.api_key_env) {
            (Some(key), _) => Some(key.clone()),
            (None, Some(variable)) => Some(
                env(variable)
                    .filter(|k| !k.is_empty())
                    .ok_or_else(|| SetupError::MissingKey { provider: name.into(), variable: variable.clone() })?,
            ),
            (None, None) => None,
        };
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(10))
            // A socket read that waits this long fails; see transport.rs for why that matters.
            .timeout_read(Duration::from_secs(config.idle_timeout_secs.max(1)))
            .timeout(Duration::from_secs(config.timeout_secs.max(1)))
            .build();
        Ok(WireClient { name: name.into(), config: config.clone(), api_key, agent })
    }

    /// One call to this provider. Errors carry whether output had started.
    fn call(
        &self,
        request: &CompletionRequest<'_>,
        model: &ModelConfig,
        on_delta: &mut dyn FnMut(Delta<'_>),
        cancel: &CancelToken,
    ) -> Result<StreamState, CallError> {
        let base = self.config.base_url.trim_end_matches('/');
        let mut headers =
            vec![("Content-Type", "application/json".to_string()), ("Accept", "text/event-stream".into())];
        let key = self.key().map_err(|error| CallError::Fatal(error.to_string()))?;
        let (url, body) = match self.config.wire {
            Wire::Openai => {
                if let Some(key) = &key {
                    headers.push(("Authorization", format!("Bearer {key}")));
                }
                let body = openai::request_body(request, &model.name, model.max_tokens, model.supports_tools);
                (format!("{base}/chat/completions"), body)
            }
            Wire::Anthropic => {
                if let Some(key) = key {
                    headers.push(("x-api-key", key));
                }
                headers.push(("anthropic-version", anthropic::API_VERSION.into()));
                let max_tokens = model.max_tokens.unwrap_or(ANTHROPIC_DEFAULT_MAX_TOKENS);
                let body = anthropic::request_body(request, &model.name, max_tokens, model.supports_tools);
                (format!("{base}/messages"), body)
            }
        };
        let call = HttpCall { url, headers, body: body.to_string() };
        let idle = Duration::from_secs(self.config.idle_timeout_secs.max(1));
        let deadline = Instant::now() + Duration::from_secs(self.config.timeout_secs.max(1));
        let mut decoder = Decoder::new(self.config.wire);
        let mut parser = SseParser::default();
        let mut done = false;
        transport::stream(&self.agent, call, cancel, idle, deadline, &mut |bytes| {
            for event in parser.feed(bytes) {
                if !decoder.on_event(&event, on_delta)? {
                    done = true;
                    return Ok(false);
                }
            }
            Ok(true)
        })?;
        if !done {
            if let Some(event) = parser.finish() {
                done = !decoder.on_event(&event, on_delta)?;
            }
        }
        let state = decoder.finish();
        if !done && state.finish.is_none() {
            return Err(CallError::Transient {
                message: "the stream ended before the answer was complete".into(),
                retry_after: None,
            });
        }
        Ok(state)
    }

    /// The key for the next call: the configured one, or its `${VAR}` template resolved now.
    /// The error names a missing variable, never a value.
    pub(super) fn key(&self) -> Result<Option<String>, KeyError> {
        match &self.config.api_key_template {
            Some(template) => crate::config::resolve_template(template, &|name| std::env::var(name).ok())
                .map(Some)
                .map_err(|cause| KeyError { provider: self.name.clone(), cause }),
            None => Ok(self.api_key.clone()),
        }
    }

    /// The key as it would be sent, if it can be resolved: what redaction looks for.
    pub(super) fn resolved_key(&self) -> Option<String> {
        self.key().ok().flatten()
    }

    /// A failure as the run reports it: the provider's name, the status and message, and
    /// never the key, even if an upstream echoed it back.
    fn describe(&self, message: &str) -> String {
        let mut text = format!("provider `{}`: {message}", self.name);
        if let Some(key) = self.resolved_key().filter(|k| k.len() >= 4) {
            text = text.replace(&key, "[redacted]");
        }
        text
    }
}

enum Decoder {
    Openai(OpenAiStream),
    Anthropic(AnthropicStream),
}

impl Decoder {
    fn new(wire: Wire) -> Decoder {
        match wire {
            Wire::Openai => Decoder::Openai(OpenAiStream::default()),
            Wire::Anthropic => Decoder::Anthropic(AnthropicStream::default()),
        }
    }

    fn on_event(
        &mut self,
        event: &super::sse::SseEvent,
        on_delta: &mut dyn FnMut(Delta<'_>),
    ) -> Result<bool, CallError> {
        match self {
            Decoder::Openai(stream) => stream.on_event(event, on_delta),
            Decoder::Anthropic(stream) => stream.on_event(event, on_delta),
        }
    }

    fn finish(self) -> StreamState {
        match self {
            Decoder::Openai(stream) => stream.finish(),
            Decoder::Anthropic(stream) => stream.finish(),
        }
    }
}

impl Provider for ModelRoute {
    fn target(&self) -> super::Target {
        let own = &self.candidates[0];
        own.client.target(&own.model)
    }

    /// One attempt against the model's own provider: BAE walks fallbacks itself.
    fn exchange(
        &self,
        request: &CompletionRequest<'_>,
        cancel: &CancelToken,
    ) -> Result<super::Exchanged, super::Refused> {
        let own = &self.candidates[0];
        own.client.exchange(request, &own.model, cancel)
    }

    fn complete(
        &self,
        request: &CompletionRequest<'_>,
        on_delta: &mut dyn FnMut(Delta<'_>),
        cancel: &CancelToken,
    ) -> Result<Completion, ProviderError> {
        let mut failures = Vec::new();
        let metrics = crate::metrics::get();
        for (index, candidate) in self.candidates.iter().enumerate() {
            let client = &candidate.client;
            if index > 0 {
                metrics.provider_fallback(&client.name, &candidate.model.name);
            }
            let mut retries = 0;
            loop {
                let mut started = false;
                let mut watch = |delta: Delta<'_>| {
                    started = true;
                    on_delta(delta);
                };
                let error = match client.call(request, &candidate.model, &mut watch, cancel) {
                    Ok(state) => return Ok(state.into_completion()),
                    Err(CallError::Cancelled) => return Err(ProviderError::Cancelled),
                    Err(error) => error,
                };
                let (message, retry_after, transient) = match error {
                    CallError::Transient { message, retry_after } => (message, retry_after, true),
                    CallError::Fatal(message) => (message, None, false),
                    CallError::Cancelled => unreachable!("returned above"),
                };
                let described = client.describe(&message);
                if started {
                    return Err(ProviderError::Failed(described));
                }
                log::warn!("{described}");
                failures.push(described);
                if !transient || retries >= client.config.max_retries {
                    break;
                }
                let backoff =
                    Duration::from_millis(client.config.retry_base_delay_ms.saturating_mul(1 << retries.min(16)));
                let wait = retry_after.unwrap_or(backoff);
                if wait > Duration::from_secs(client.config.retry_max_wait_secs) {
                    log::info!("provider `{}` asks to wait {wait:?}; trying the next provider", client.name);
                    break;
                }
                if cancel.wait(wait) {
                    return Err(ProviderError::Cancelled);
                }
                metrics.provider_retry(&client.name, &candidate.model.name);
                retries += 1;
            }
        }
        Err(ProviderError::Failed(failures.pop().unwrap_or_else(|| "no provider could be reached".into())))
    }
}

/// A provider's key template that did not resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    pub provider: String,
    pub cause: crate::config::TemplateError,
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "provider `{}`: {}", self.provider, self.cause)
    }
}
