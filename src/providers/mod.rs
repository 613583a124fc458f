//! Model providers: one trait, one implementation per wire format, and the model registry.
//!
//! Runs on a run's worker thread: `complete` blocks until the model has answered, calling
//! `on_delta` for each streamed piece. It must return promptly (within a second) once the
//! `CancelToken` is cancelled. Only this module may import `ureq`.

mod builtin;

use std::collections::HashMap;
use std::sync::Arc;

use crate::cancel::CancelToken;
use crate::domain::{ChatMessage, ModelInfo, ToolCall, ToolSchema, Usage};

pub use builtin::{EchoProvider, ECHO_MODEL_ID};

/// Everything a provider needs for one call.
pub struct CompletionRequest<'a> {
    /// The model's name upstream (without the provider prefix).
    pub model: &'a str,
    pub system_prompt: Option<&'a str>,
    pub messages: &'a [ChatMessage],
    pub tools: &'a [ToolSchema],
}

/// One streamed piece of the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delta<'a> {
    Text(&'a str),
    Reasoning(&'a str),
}

/// A finished answer. Text and reasoning are also streamed; they are repeated here whole.
#[derive(Debug, Clone, Default)]
pub struct Completion {
    pub text: String,
    pub reasoning: String,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Usage,
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
}

struct RegisteredModel {
    info: ModelInfo,
    /// The name sent upstream.
    upstream_name: String,
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
        let mut registry = ModelRegistry {
            models: Vec::new(),
            by_id: HashMap::new(),
            default_model: ECHO_MODEL_ID.to_string(),
        };
        registry.register(builtin::echo_model_info(), "echo".into(), Arc::new(echo));
        registry
    }

    pub fn register(
        &mut self,
        info: ModelInfo,
        upstream_name: String,
        provider: Arc<dyn Provider>,
    ) {
        self.by_id.insert(info.id.clone(), self.models.len());
        self.models.push(RegisteredModel {
            info,
            upstream_name,
            provider,
        });
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

    /// The provider and upstream name for a model id.
    pub fn resolve(&self, id: &str) -> Option<(Arc<dyn Provider>, &str)> {
        let model = &self.models[*self.by_id.get(id)?];
        Some((Arc::clone(&model.provider), model.upstream_name.as_str()))
    }
}
