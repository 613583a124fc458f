//! A configured provider's HTTP side, shared by the wire formats that speak HTTP: its base
//! URL, key (resolved per call when it is a `${VAR}` template), client and timeouts, and one
//! attempt against it, streamed (server-sent events read by the wire's decoder, deltas as they
//! come) or whole (one JSON body, kept as it came for whoever records it). No key ever reaches
//! an error: whatever an upstream echoes back is redacted.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::sse::SseParser;
use super::transport::{self, CallError, HttpCall, Refusal};
use super::{Answer, Completion, Delta, StreamState};
use crate::cancel::CancelToken;
use crate::config::{ProviderConfig, TemplateError};

/// The largest whole answer read.
const BODY_LIMIT: u64 = 32 * 1024 * 1024;

/// One configured provider's endpoint.
pub struct Endpoint {
    pub(super) name: String,
    pub(super) config: ProviderConfig,
    api_key: Option<String>,
    agent: ureq::Agent,
}

/// Reads a streamed answer, one server-sent event at a time.
pub(super) trait Decoder {
    /// Handles one event; false once the answer is complete.
    fn on_event(&mut self, event: &super::sse::SseEvent, on_delta: &mut dyn FnMut(Delta<'_>)) -> Result<bool, Refusal>;
    fn finish(self: Box<Self>) -> StreamState;
}

/// What a wire format sends for one attempt, and how it reads the answer.
pub(super) struct Exchange {
    /// Appended to the base URL (`/messages`, `/chat/completions`).
    pub path: &'static str,
    /// The wire's own headers; `key_header` carries the key, as `prefix` + key.
    pub headers: Vec<(&'static str, String)>,
    pub key_header: (&'static str, &'static str),
    /// The request body, streamed or not as the attempt is.
    pub body: Value,
    pub decoder: Box<dyn Decoder>,
    /// Reads a whole answer's JSON.
    pub read: fn(&Value) -> Result<Completion, Refusal>,
}

impl Endpoint {
    pub(super) fn new(
        name: &str,
        config: &ProviderConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Endpoint, super::SetupError> {
        use super::SetupError;
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
        Ok(Endpoint { name: name.into(), config: config.clone(), api_key, agent })
    }

    /// The base URL before the version segment, as BAE shows it.
    pub(super) fn shown_base(&self) -> String {
        let base = self.config.base_url.trim_end_matches('/');
        base.strip_suffix("/v1").unwrap_or(base).to_string()
    }

    /// One attempt: streamed, the body read event by event, or whole.
    pub(super) fn attempt(
        &self,
        exchange: Exchange,
        streamed: bool,
        on_delta: &mut dyn FnMut(Delta<'_>),
        cancel: &CancelToken,
    ) -> Result<Answer, CallError> {
        let key = self.key().map_err(|error| Refusal::fatal(error.to_string()))?;
        let accept = if streamed { "text/event-stream" } else { "application/json" };
        let mut headers = vec![("Content-Type", "application/json".to_string()), ("Accept", accept.into())];
        let (header, prefix) = exchange.key_header;
        headers.extend(key.map(|key| (header, format!("{prefix}{key}"))));
        headers.extend(exchange.headers);
        let url = format!("{}{}", self.config.base_url.trim_end_matches('/'), exchange.path);
        let call = HttpCall { url, headers, body: exchange.body.to_string() };
        let deadline = Instant::now() + Duration::from_secs(self.config.timeout_secs.max(1));
        let answer = match streamed {
            true => self.stream(call, exchange.decoder, on_delta, deadline, cancel),
            false => self.whole(call, exchange.read, deadline, cancel),
        };
        answer.map_err(|error| match error {
            CallError::Refused(refusal) => CallError::Refused(self.redacted(refusal)),
            cancelled => cancelled,
        })
    }

    fn stream(
        &self,
        call: HttpCall,
        mut decoder: Box<dyn Decoder>,
        on_delta: &mut dyn FnMut(Delta<'_>),
        deadline: Instant,
        cancel: &CancelToken,
    ) -> Result<Answer, CallError> {
        let idle = Duration::from_secs(self.config.idle_timeout_secs.max(1));
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
            return Err(Refusal::transient("the stream ended before the answer was complete").into());
        }
        Ok(Answer { completion: state.into_completion(), body: None })
    }

    fn whole(
        &self,
        call: HttpCall,
        read: fn(&Value) -> Result<Completion, Refusal>,
        deadline: Instant,
        cancel: &CancelToken,
    ) -> Result<Answer, CallError> {
        let body = transport::fetch(&self.agent, call, cancel, deadline, BODY_LIMIT)?;
        let text = || Some(String::from_utf8_lossy(&body).into_owned());
        let value: Value = serde_json::from_slice(&body).map_err(|e| Refusal {
            status: Some(200),
            body: text(),
            ..Refusal::fatal(format!("provider returned a body that is not JSON: {e}"))
        })?;
        let completion = read(&value).map_err(|refusal| Refusal { status: Some(200), body: text(), ..refusal })?;
        Ok(Answer { completion, body: Some(value) })
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

    /// `text` with the key, as it would be sent, replaced.
    pub(super) fn redact(&self, text: &str) -> String {
        match self.key().ok().flatten().filter(|key| key.len() >= 4) {
            Some(key) => text.replace(&key, "[redacted]"),
            None => text.to_string(),
        }
    }

    fn redacted(&self, refusal: Refusal) -> Refusal {
        Refusal { error: self.redact(&refusal.error), body: refusal.body.map(|body| self.redact(&body)), ..refusal }
    }
}

/// A provider's key template that did not resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    pub provider: String,
    pub cause: TemplateError,
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "provider `{}`: {}", self.provider, self.cause)
    }
}
