//! The one path every model call takes, from either door.
//!
//! A `Route` is a list of candidates, each a wire format, an endpoint (none for `builtin`)
//! and a model. A Kestrel session's model routes to its provider, then the providers in that
//! provider's `fallbacks`; a BAE profile's chain is its primary's route followed by each
//! fallback's. A call tries the candidates in order. Before any output, a failure worth
//! retrying (429, 408, 409, 5xx, a connection error, a timeout) is retried with exponential
//! backoff, honouring the provider's `Retry-After`; a provider asking for longer than its
//! `retry_max_wait_secs`, or out of retries, gives way to the next candidate. Once output has
//! started (a streamed call), a failure ends the call: the user has seen part of an answer,
//! and a second answer from elsewhere would not continue it.
//!
//! Every attempt counts in the metrics under its provider and model, and a priced model's
//! answer carries its cost. A caller that records attempts (BAE's `provider.request` and
//! `provider.response`) watches them through `Watch`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::http::Endpoint;
use super::transport::{CallError, Refusal};
use super::{Attempt, Completion, CompletionRequest, Delta, SetupError, Target, Wire};
use crate::cancel::CancelToken;
use crate::config::{ModelConfig, ProviderConfig};
use crate::domain::ModelInfo;

/// One place a call can go.
struct Candidate {
    /// The provider's name in the config (`builtin` for the built-in model): metric labels.
    provider: String,
    wire: Arc<dyn Wire>,
    endpoint: Option<Arc<Endpoint>>,
    model: ModelConfig,
}

/// Where a model's calls go, in order.
#[derive(Clone)]
pub struct Route {
    candidates: Vec<Arc<Candidate>>,
}

/// A call's answer, and where it came from.
pub struct Answered {
    pub completion: Completion,
    /// The body as the provider sent it, for a whole answer.
    pub body: Option<serde_json::Value>,
    pub target: Target,
    /// The id of the model that answered (`<provider>/<model>`).
    pub model_id: String,
    /// How that model's wire says an answer was cut at the token limit.
    pub cut_at_limit: &'static str,
    /// Attempts made, this one included.
    pub attempts: u32,
}

/// Why a call has no answer.
#[derive(Debug, Clone, PartialEq)]
pub enum CallFailed {
    Cancelled,
    /// Every candidate failed (or one failed after output had started): the last failure,
    /// as the run reports it (`provider \`name\`: …`, never a key), and the attempts made.
    Failed {
        message: String,
        attempts: u32,
    },
}

impl std::fmt::Display for CallFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallFailed::Cancelled => write!(f, "cancelled"),
            CallFailed::Failed { message, .. } => write!(f, "{message}"),
        }
    }
}

/// How a caller takes a call: streamed or whole, and what it wants to know of each attempt.
/// `attempt` counts every try of the call from 0; `fallback` is whether the try goes to a
/// candidate after the first.
pub trait Watch {
    /// Whether the answer is streamed (pieces to `delta`) or read whole (its body kept).
    fn streamed(&self) -> bool;
    fn delta(&mut self, _delta: Delta<'_>) {}
    fn attempting(&mut self, _attempt: u32, _target: &Target, _fallback: bool, _request: &CompletionRequest<'_>) {}
    fn refused(&mut self, _attempt: u32, _target: &Target, _fallback: bool, _refusal: &Refusal) {}
    fn answered(&mut self, _attempt: u32, _target: &Target, _fallback: bool, _body: Option<&serde_json::Value>) {}
}

/// Builds every configured model's info and route.
pub(super) fn build(
    providers: &BTreeMap<String, ProviderConfig>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(ModelInfo, Route)>, SetupError> {
    let mut endpoints = BTreeMap::new();
    for (name, config) in providers {
        endpoints.insert(name.clone(), Arc::new(Endpoint::new(name, config, env)?));
    }
    let mut models = Vec::new();
    for (name, config) in providers {
        for fallback in &config.fallbacks {
            if !endpoints.contains_key(fallback) {
                return Err(SetupError::UnknownFallback { provider: name.clone(), fallback: fallback.clone() });
            }
        }
        for model in &config.models {
            let mut candidates = vec![candidate(&endpoints[name], model.clone())];
            for fallback in &config.fallbacks {
                let endpoint = &endpoints[fallback];
                // The fallback's model of the same name, else its first model.
                let same = endpoint.config.models.iter().find(|m| m.name == model.name);
                let chosen = same.or(endpoint.config.models.first()).expect("checked: every provider has models");
                candidates.push(candidate(endpoint, chosen.clone()));
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
            models.push((info, Route { candidates }));
        }
    }
    Ok(models)
}

fn candidate(endpoint: &Arc<Endpoint>, model: ModelConfig) -> Arc<Candidate> {
    Arc::new(Candidate {
        provider: endpoint.name.clone(),
        wire: super::wire_of(endpoint.config.wire),
        endpoint: Some(Arc::clone(endpoint)),
        model,
    })
}

impl Candidate {
    fn target(&self) -> Target {
        Target {
            wire: self.wire.name(),
            base_url: self.endpoint.as_ref().map(|endpoint| endpoint.shown_base()),
            model: self.model.name.clone(),
            max_tokens: self.wire.max_tokens(self.model.max_tokens),
        }
    }

    fn id(&self) -> String {
        format!("{}/{}", self.provider, self.model.name)
    }

    /// The retry settings: the endpoint's, none for a wire with no server.
    fn retries(&self) -> (u32, u64, Duration) {
        match &self.endpoint {
            Some(endpoint) => (
                endpoint.config.max_retries,
                endpoint.config.retry_base_delay_ms,
                Duration::from_secs(endpoint.config.retry_max_wait_secs),
            ),
            None => (0, 0, Duration::ZERO),
        }
    }

    /// A failure as the run reports it: the provider's name and what went wrong.
    fn describe(&self, refusal: &Refusal) -> String {
        format!("provider `{}`: {}", self.provider, refusal.error)
    }
}

/// What one attempt came to.
enum Tried {
    Answered(Box<Answered>),
    Cancelled,
    /// Failed; whether output had started.
    Failed(Refusal, bool),
}

impl Route {
    /// The built-in model's route.
    pub(super) fn builtin(echo: Arc<super::Echo>) -> Route {
        let model = ModelConfig { pricing: echo.pricing.clone(), ..ModelConfig::named("echo") };
        let candidate = Candidate { provider: "builtin".into(), wire: echo, endpoint: None, model };
        Route { candidates: vec![Arc::new(candidate)] }
    }

    /// This route, then `other`'s candidates (a chain that names a provider twice tries it
    /// twice, as BAE does).
    pub fn then(mut self, other: &Route) -> Route {
        self.candidates.extend(other.candidates.iter().cloned());
        self
    }

    /// The most one call may use, as tokens and their cost: for each candidate, `input_tokens`
    /// and the `max_tokens` it sends (`default_output` where it sends none) at its prices;
    /// the largest of each. A budget reserves this while the call is in flight
    /// (`engine/meter.rs`).
    pub fn most_used(&self, input_tokens: u64, default_output: u64) -> (u64, f64) {
        self.candidates.iter().fold((0, 0.0), |(tokens, cost), candidate| {
            let output = candidate.wire.max_tokens(candidate.model.max_tokens).map_or(default_output, u64::from);
            let usage = crate::domain::Usage {
                input_tokens,
                output_tokens: output,
                total_tokens: input_tokens + output,
                ..Default::default()
            };
            let priced = candidate.model.pricing.as_ref().map_or(0.0, |pricing| pricing.cost(&usage).amount);
            (tokens.max(input_tokens + output), cost.max(priced))
        })
    }

    /// What the first candidate is.
    pub fn target(&self) -> Target {
        self.candidates[0].target()
    }

    /// The model's answer, from the first candidate that gives one (see the module doc).
    pub fn call(
        &self,
        request: &CompletionRequest<'_>,
        watch: &mut dyn Watch,
        cancel: &CancelToken,
    ) -> Result<Answered, CallFailed> {
        let metrics = crate::metrics::get();
        let mut attempts = 0;
        let mut last = None;
        for (index, candidate) in self.candidates.iter().enumerate() {
            if index > 0 {
                metrics.provider_fallback(&candidate.provider, &candidate.model.name);
            }
            let (max_retries, base_delay_ms, max_wait) = candidate.retries();
            let mut retries = 0;
            loop {
                let tried = self.attempt(candidate, index > 0, attempts, request, watch, cancel);
                attempts += 1;
                let (refusal, started) = match tried {
                    Tried::Answered(answered) => return Ok(Answered { attempts, ..*answered }),
                    Tried::Cancelled => return Err(CallFailed::Cancelled),
                    Tried::Failed(refusal, started) => (refusal, started),
                };
                let described = candidate.describe(&refusal);
                if started {
                    return Err(CallFailed::Failed { message: described, attempts });
                }
                log::warn!("{described}");
                last = Some(described);
                if !refusal.retryable || retries >= max_retries {
                    break;
                }
                let backoff = Duration::from_millis(base_delay_ms.saturating_mul(1 << retries.min(16)));
                let wait = refusal.retry_after.unwrap_or(backoff);
                if wait > max_wait {
                    log::info!("provider `{}` asks to wait {wait:?}; trying the next provider", candidate.provider);
                    break;
                }
                if cancel.wait(wait) {
                    return Err(CallFailed::Cancelled);
                }
                metrics.provider_retry(&candidate.provider, &candidate.model.name);
                retries += 1;
            }
        }
        let message = last.unwrap_or_else(|| "no provider could be reached".into());
        Err(CallFailed::Failed { message, attempts })
    }

    /// One attempt against `candidate`, watched and counted.
    fn attempt(
        &self,
        candidate: &Candidate,
        fallback: bool,
        number: u32,
        request: &CompletionRequest<'_>,
        watch: &mut dyn Watch,
        cancel: &CancelToken,
    ) -> Tried {
        let target = candidate.target();
        watch.attempting(number, &target, fallback, request);
        let attempt = Attempt {
            request,
            model: &candidate.model,
            endpoint: candidate.endpoint.as_deref(),
            streamed: watch.streamed(),
        };
        let called = Instant::now();
        let mut first_output = None;
        let mut on_delta = |delta: Delta<'_>| {
            first_output.get_or_insert_with(|| called.elapsed());
            watch.delta(delta);
        };
        let outcome = candidate.wire.attempt(&attempt, &mut on_delta, cancel);
        let label = candidate.id();
        let metrics = crate::metrics::get();
        match outcome {
            Ok(mut answer) => {
                let usage = &mut answer.completion.usage;
                usage.cost = candidate.model.pricing.as_ref().map(|pricing| pricing.cost(usage));
                metrics.provider_call(&label, "ok", Some(&answer.completion.usage), first_output);
                watch.answered(number, &target, fallback, answer.body.as_ref());
                Tried::Answered(Box::new(Answered {
                    completion: answer.completion,
                    body: answer.body,
                    target,
                    model_id: label,
                    cut_at_limit: candidate.wire.cut_at_limit(),
                    attempts: 0,
                }))
            }
            Err(CallError::Cancelled) => {
                metrics.provider_call(&label, "cancelled", None, first_output);
                Tried::Cancelled
            }
            Err(CallError::Refused(refusal)) => {
                metrics.provider_call(&label, "error", None, first_output);
                watch.refused(number, &target, fallback, &refusal);
                Tried::Failed(refusal, first_output.is_some())
            }
        }
    }
}
