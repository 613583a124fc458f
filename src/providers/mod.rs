//! Model providers: one trait, one implementation per wire format, and the model registry.
//!
//! Runs on a run's worker thread: `complete` blocks until the model has answered, calling
//! `on_delta` for each streamed piece. It must return promptly (within a second) once the
//! `CancelToken` is cancelled. Only this module may import `ureq`.
//!
//! - `sse.rs`: the one SSE parser both wire formats use.
//! - `openai.rs`, `anthropic.rs`: request bodies and stream decoders, one file per wire format.
//! - `transport.rs`: one streamed HTTP call, interruptible by cancel and by silence.
//! - `route.rs`: a model's route: the provider, its retries, then its fallbacks.
//! - `builtin.rs`: `builtin/echo`.

mod anthropic;
mod builtin;
mod exchange;
mod openai;
mod route;
mod sse;
mod transport;

use std::collections::HashMap;
use std::sync::Arc;

use crate::cancel::CancelToken;
use crate::config::Config;
use crate::domain::{Message, ModelInfo, ToolCall, ToolSchema, Usage};

pub use builtin::{EchoProvider, ECHO_MODEL_ID};
pub use exchange::{Exchanged, Refused, Target};

/// Everything a provider needs for one call. The model is the one the provider was resolved
/// for.
pub struct CompletionRequest<'a> {
    pub system_prompt: Option<&'a str>,
    pub messages: &'a [Message],
    pub tools: &'a [ToolSchema],
}

impl<'a> CompletionRequest<'a> {
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

#[derive(Debug)]
pub enum ProviderError {
    /// The token was cancelled; whatever was streamed so far is all there is.
    Cancelled,
    /// The provider answered with an error, or the stream broke. The message never contains
    /// a key or a header.
    Failed(String),
}

impl std::fmt::Display for ProviderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProviderError::Cancelled => write!(f, "cancelled"),
            ProviderError::Failed(message) => write!(f, "{message}"),
        }
    }
}

impl std::error::Error for ProviderError {}

pub trait Provider: Send + Sync {
    fn complete(
        &self,
        request: &CompletionRequest<'_>,
        on_delta: &mut dyn FnMut(Delta<'_>),
        cancel: &CancelToken,
    ) -> Result<Completion, ProviderError>;

    /// What an attempt is made against. Providers with no wire of their own are `builtin`.
    fn target(&self) -> Target {
        Target { wire: "builtin", base_url: None, model: String::new(), max_tokens: None }
    }

    /// One non-streamed attempt, with the answer's body as the provider sent it. A provider
    /// with no wire of its own answers through `complete`, its body in the Messages shape.
    fn exchange(&self, request: &CompletionRequest<'_>, cancel: &CancelToken) -> Result<Exchanged, Refused> {
        match self.complete(request, &mut |_| {}, cancel) {
            Ok(completion) => {
                let body = exchange::messages_body(&self.target().model, &completion);
                Ok(Exchanged { completion, body })
            }
            Err(ProviderError::Cancelled) => Err(Refused { cancelled: true, ..Refused::new(None, "cancelled", None) }),
            Err(ProviderError::Failed(why)) => Err(Refused::new(None, why, None)),
        }
    }
}

/// What a wire decoder has assembled so far; also tells whether output has started.
#[derive(Default)]
struct StreamState {
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
    provider: Arc<dyn Provider>,
}

/// Every model the server can run, by id (`<provider>/<name>`). Built at start, then read-only.
pub struct ModelRegistry {
    models: Vec<RegisteredModel>,
    by_id: HashMap<String, usize>,
    default_model: String,
}

impl ModelRegistry {
    /// A registry holding only the built-in `builtin/echo`.
    pub fn with_builtin(echo: EchoProvider) -> ModelRegistry {
        let mut registry =
            ModelRegistry { models: Vec::new(), by_id: HashMap::new(), default_model: ECHO_MODEL_ID.to_string() };
        registry.register(builtin::echo_model_info(echo.context_window, echo.pricing.clone()), Arc::new(echo));
        registry
    }

    /// `builtin/echo` plus every model of every configured provider.
    pub fn from_config(
        config: &Config,
        echo: EchoProvider,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ModelRegistry, SetupError> {
        let mut registry = ModelRegistry::with_builtin(echo);
        for (info, provider) in route::build(&config.providers, env)? {
            registry.register(info, provider);
        }
        Ok(registry)
    }

    pub fn register(&mut self, info: ModelInfo, provider: Arc<dyn Provider>) {
        self.by_id.insert(info.id.clone(), self.models.len());
        self.models.push(RegisteredModel { info, provider });
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

    /// The provider that runs a model.
    pub fn resolve(&self, id: &str) -> Option<Arc<dyn Provider>> {
        Some(Arc::clone(&self.models[*self.by_id.get(id)?].provider))
    }
}
