//! Model providers: one path every model call of either door takes, and one trait a wire
//! format implements.
//!
//! A call runs on its turn's worker thread and blocks until the model has answered (streamed
//! pieces go to the caller as they come). It returns promptly (within a second) once the
//! `CancelToken` is cancelled. Only this module may import `ureq`.
//!
//! - `call.rs`: the one path: a route of candidates (a model's provider, its fallbacks, a BAE
//!   profile's chain), retries with backoff and `Retry-After`, metrics, cost, and what each
//!   attempt was, for a door that records attempts.
//! - `anthropic.rs`, `openai.rs`, `builtin.rs`: the wire formats, each one `Wire`.
//! - `http.rs`: a configured provider's endpoint and one HTTP attempt (streamed or whole).
//! - `transport.rs`: the HTTP call itself, interruptible by cancel and by silence.
//! - `sse.rs`: the one SSE parser both HTTP wire formats use.

mod anthropic;
mod builtin;
mod call;
mod http;
mod openai;
mod sse;
mod transport;

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use crate::cancel::CancelToken;
use crate::config::{Config, ModelConfig};
use crate::domain::{Message, ModelInfo, ResponseFormat, ToolCall, ToolSchema, Usage};

pub use builtin::{Echo, ECHO_MODEL_ID};
pub use call::{Answered, CallFailed, Route, Watch};
pub use http::{Endpoint, KeyError};
pub use transport::{CallError, Refusal};

/// A model wire format: how one attempt is sent and its answer read. Each is one file
/// (`anthropic.rs`, `openai.rs`, `builtin.rs`); `call.rs` does everything around an attempt.
pub trait Wire: Send + Sync {
    /// Its name, as events and the admin API show it: `anthropic`, `openai`, `builtin`.
    fn name(&self) -> &'static str;
    /// The `max_tokens` sent for a model that sets `configured` (some wires require one).
    fn max_tokens(&self, configured: Option<u32>) -> Option<u32> {
        configured
    }
    /// One attempt: streamed (each piece to `on_delta` as it comes) or whole (the answer's
    /// body kept as it came). `endpoint` is the configured provider; a wire with no server
    /// has none.
    fn attempt(
        &self,
        attempt: &Attempt<'_>,
        on_delta: &mut dyn FnMut(Delta<'_>),
        cancel: &CancelToken,
    ) -> Result<Answer, CallError>;
    /// How its answers say they were cut at the token limit, for people.
    fn cut_at_limit(&self) -> &'static str;
}

/// The wire a configured provider speaks.
fn wire_of(wire: crate::config::Wire) -> Arc<dyn Wire> {
    match wire {
        crate::config::Wire::Anthropic => Arc::new(anthropic::Anthropic),
        crate::config::Wire::Openai => Arc::new(openai::OpenAi),
    }
}

/// One attempt's inputs.
pub struct Attempt<'a> {
    pub request: &'a CompletionRequest<'a>,
    pub model: &'a ModelConfig,
    pub endpoint: Option<&'a Endpoint>,
    pub streamed: bool,
}

/// What one attempt got: the answer, and its body as the provider sent it (whole answers;
/// a wire with no server writes one in the Messages shape).
pub struct Answer {
    pub completion: Completion,
    pub body: Option<Value>,
}

/// What an attempt is made against, as events and the admin API show it (never a key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The wire format: `anthropic`, `openai` or `builtin`.
    pub wire: &'static str,
    /// The provider's base URL before the version segment, as BAE shows it.
    pub base_url: Option<String>,
    /// The model name sent upstream.
    pub model: String,
    pub max_tokens: Option<u32>,
}

/// Everything a provider needs for one call. The model is the one the provider was resolved
/// for.
pub struct CompletionRequest<'a> {
    pub system_prompt: Option<&'a str>,
    pub messages: &'a [Message],
    pub tools: &'a [ToolSchema],
    /// What the final answer must be (`engine/structured.rs`).
    pub response_format: Option<&'a ResponseFormat>,
}

impl<'a> CompletionRequest<'a> {
    /// The system prompt a wire sends: the session's, and for a structured answer on a wire
    /// with no native structured output (`native` false) the instruction to answer in it.
    pub fn system_text(&self, native: bool) -> Option<std::borrow::Cow<'a, str>> {
        let instruction = self.response_format.filter(|_| !native).map(ResponseFormat::instruction);
        match (self.system_prompt, instruction) {
            (prompt, None) => prompt.map(std::borrow::Cow::Borrowed),
            (None, Some(instruction)) => Some(instruction.into()),
            (Some(prompt), Some(instruction)) => Some(format!("{prompt}\n\n{instruction}").into()),
        }
    }

    /// The tools to offer, each name once (the first of a name wins): providers refuse a
    /// request naming a tool twice, whichever door or server put the two there.
    pub fn distinct_tools(&self) -> Vec<&'a ToolSchema> {
        let mut seen = std::collections::HashSet::new();
        let tools: Vec<&ToolSchema> = self.tools.iter().filter(|tool| seen.insert(tool.name.as_str())).collect();
        if tools.len() < self.tools.len() {
            log::warn!("{} tool(s) offered twice under one name were sent once", self.tools.len() - tools.len());
        }
        tools
    }
}

/// One streamed piece of the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delta<'a> {
    Text(&'a str),
    Reasoning(&'a str),
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
    ToolCalls,
    ContentFilter,
    Other(String),
}

impl Finish {
    pub fn as_str(&self) -> &str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::ToolCalls => "tool_calls",
            Finish::ContentFilter => "content_filter",
            Finish::Other(other) => other,
        }
    }
}

/// A finished answer. Text and reasoning are also streamed; they are repeated here whole.
#[derive(Debug, Clone, Default)]
pub struct Completion {
    pub text: String,
    pub reasoning: String,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Usage,
    pub finish: Option<Finish>,
}

/// What a wire decoder has assembled so far.
#[derive(Default)]
pub(crate) struct StreamState {
    text: String,
    reasoning: String,
    tool_calls: Vec<ToolCall>,
    usage: Option<Usage>,
    finish: Option<Finish>,
}

impl StreamState {
    fn text(&mut self, piece: &str, on_delta: &mut dyn FnMut(Delta<'_>)) {
        self.text.push_str(piece);
        on_delta(Delta::Text(piece));
    }

    fn reasoning(&mut self, piece: &str, on_delta: &mut dyn FnMut(Delta<'_>)) {
        self.reasoning.push_str(piece);
        on_delta(Delta::Reasoning(piece));
    }

    fn into_completion(self) -> Completion {
        Completion {
            text: self.text,
            reasoning: self.reasoning,
            tool_calls: self.tool_calls,
            usage: self.usage.unwrap_or_default(),
            finish: self.finish,
        }
    }
}

/// Why the configured providers could not be set up.
#[derive(Debug)]
pub enum SetupError {
    UnknownFallback { provider: String, fallback: String },
    MissingKey { provider: String, variable: String },
    NoModels(String),
    BadUrl { provider: String, url: String },
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SetupError::UnknownFallback { provider, fallback } => {
                write!(f, "provider `{provider}` falls back to `{fallback}`, which is not configured")
            }
            SetupError::MissingKey { provider, variable } => {
                write!(f, "provider `{provider}`: the environment variable {variable} is not set")
            }
            SetupError::NoModels(provider) => write!(f, "provider `{provider}` declares no models"),
            SetupError::BadUrl { provider, url } => {
                write!(f, "provider `{provider}`: base_url {url:?} is not an http(s) URL")
            }
        }
    }
}

impl std::error::Error for SetupError {}

struct RegisteredModel {
    info: ModelInfo,
    route: Route,
}

/// Every model the server can run, by id (`<provider>/<name>`). Built at start, then read-only.
pub struct ModelRegistry {
    models: Vec<RegisteredModel>,
    by_id: HashMap<String, usize>,
    default_model: String,
}

impl ModelRegistry {
    /// A registry holding only the built-in `builtin/echo`.
    pub fn with_builtin(echo: Echo) -> ModelRegistry {
        let mut registry =
            ModelRegistry { models: Vec::new(), by_id: HashMap::new(), default_model: ECHO_MODEL_ID.to_string() };
        let info = builtin::echo_model_info(echo.context_window, echo.pricing.clone());
        registry.register(info, Route::builtin(Arc::new(echo)));
        registry
    }

    /// `builtin/echo` plus every model of every configured provider.
    pub fn from_config(
        config: &Config,
        echo: Echo,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ModelRegistry, SetupError> {
        let mut registry = ModelRegistry::with_builtin(echo);
        for (info, route) in call::build(&config.providers, env)? {
            registry.register(info, route);
        }
        Ok(registry)
    }

    pub fn register(&mut self, info: ModelInfo, route: Route) {
        self.by_id.insert(info.id.clone(), self.models.len());
        self.models.push(RegisteredModel { info, route });
    }

    /// Makes `id` the default if it is registered; returns whether it was.
    pub fn set_default(&mut self, id: &str) -> bool {
        let known = self.by_id.contains_key(id);
        if known {
            self.default_model = id.to_string();
        }
        known
    }

    pub fn default_model(&self) -> &str {
        &self.default_model
    }

    pub fn contains(&self, id: &str) -> bool {
        self.by_id.contains_key(id)
    }

    pub fn infos(&self) -> impl Iterator<Item = &ModelInfo> {
        self.models.iter().map(|model| &model.info)
    }

    /// The model a name means: a model id, or a provider's name for its first model.
    pub fn model_named(&self, name: &str) -> Option<&ModelInfo> {
        match self.by_id.get(name) {
            Some(index) => Some(&self.models[*index].info),
            None => self.infos().find(|info| info.provider == name),
        }
    }

    /// The route a model's calls take: its provider, then its provider's fallbacks.
    pub fn route(&self, id: &str) -> Option<Route> {
        Some(self.models[*self.by_id.get(id)?].route.clone())
    }

    /// The route a named model (`model_named`) takes.
    pub fn route_named(&self, name: &str) -> Option<Route> {
        self.route(&self.model_named(name)?.id)
    }
}
