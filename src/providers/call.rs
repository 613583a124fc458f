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
//!
//! A call that ends without an answer says whether the provider had it (`Unanswered`): an
//! attempt cancelled while in flight, or one that failed after its output began. Providers
//! bill what they processed, so a budget counts such a call at an estimate
//! (`engine/meter.rs`); a refusal, an unreachable provider, a timeout before any output and a
//! cancel between attempts are not counted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::http::Endpoint;
use super::transport::{CallError, Refusal};
use super::{Attempt, Completion, CompletionRequest, Delta, SetupError, Target, Wire};
use crate::cancel::CancelToken;
use crate::config::{ModelConfig, ProviderConfig};
use crate::domain::{ModelInfo, ModelPricing, Usage};

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
    /// Cancelled: while an attempt was in flight (`unanswered` is that attempt), or before
    /// any attempt or between two (`None`).
    Cancelled { unanswered: Option<Unanswered> },
    /// Every candidate failed (or one failed after output had started): the last failure,
    /// as the run reports it (`provider \`name\`: …`, never a key), and the attempts made;
    /// `unanswered` is the attempt whose output had started.
    Failed { message: String, attempts: u32, unanswered: Option<Unanswered> },
}

impl CallFailed {
    /// The attempt the provider had when the call ended, which a budget counts.
    pub fn unanswered(&self) -> Option<&Unanswered> {
        match self {
            CallFailed::Cancelled { unanswered } | CallFailed::Failed { unanswered, .. } => unanswered.as_ref(),
        }
    }
}

impl std::fmt::Display for CallFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallFailed::Cancelled { .. } => write!(f, "cancelled"),
            CallFailed::Failed { message, .. } => write!(f, "{message}"),
        }
    }
}

/// An attempt that ended without an answer after the provider had it: cancelled while in
/// flight (its request sent, or about to be: whether the provider began cannot be known, and
/// providers bill the input once they begin), or failed after its output began.
#[derive(Debug, Clone, PartialEq)]
pub struct Unanswered {
    /// The text and reasoning it streamed, in bytes; `None` for a whole answer, whose output
    /// is not seen before it ends.
    pub streamed_bytes: Option<u64>,
    /// The `max_tokens` it sent, if its wire sends one.
    pub max_output: Option<u32>,
    /// Its model's prices.
    pub pricing: Option<ModelPricing>,
}

impl Unanswered {
    /// What it is counted as: `input_tokens` (the caller's estimate of the request, as its
    /// reservation counts it) and its output at four bytes a token, at most its output limit;
    /// an output not seen counts at that limit (`default_output` where it sends none). Priced
    /// at its model's prices. So it never passes what its call reserved (`Route::most_used`).
    pub fn estimated_usage(&self, input_tokens: u64, default_output: u64) -> Usage {
        let limit = self.max_output.map_or(default_output, u64::from);
        let output = self.streamed_bytes.map_or(limit, |bytes| bytes.div_ceil(4).min(limit));
        priced(self.pricing.as_ref(), input_tokens, output)
    }
}

/// `input` and `output` tokens as a usage, with their cost at `pricing`.
fn priced(pricing: Option<&ModelPricing>, input: u64, output: u64) -> Usage {
    let mut usage =
        Usage { input_tokens: input, output_tokens: output, total_tokens: input + output, ..Usage::default() };
    usage.cost = pricing.map(|pricing| pricing.cost(&usage));
    usage
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
            max_tokens: self.max_output(),
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

    /// The `max_tokens` its wire sends for its model.
    fn max_output(&self) -> Option<u32> {
        self.wire.max_tokens(self.model.max_tokens)
    }

    /// An attempt of it that ended without an answer, having streamed `streamed_bytes`.
    fn unanswered(&self, streamed_bytes: Option<u64>) -> Unanswered {
        Unanswered { streamed_bytes, max_output: self.max_output(), pricing: self.model.pricing.clone() }
    }
}

/// What one attempt came to.
enum Tried {
    Answered(Box<Answered>),
    /// Cancelled while the provider had it.
    Cancelled(Unanswered),
    /// Failed; the attempt, once its output had started.
    Failed(Refusal, Option<Unanswered>),
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
            let output = candidate.max_output().map_or(default_output, u64::from);
            let usage = priced(candidate.model.pricing.as_ref(), input_tokens, output);
            let amount = usage.cost.map_or(0.0, |cost| cost.amount);
            (tokens.max(usage.total_tokens), cost.max(amount))
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
                    Tried::Cancelled(unanswered) => return Err(CallFailed::Cancelled { unanswered: Some(unanswered) }),
                    Tried::Failed(refusal, started) => (refusal, started),
                };
                let described = candidate.describe(&refusal);
                if started.is_some() {
                    return Err(CallFailed::Failed { message: described, attempts, unanswered: started });
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
                    return Err(CallFailed::Cancelled { unanswered: None });
                }
                metrics.provider_retry(&candidate.provider, &candidate.model.name);
                retries += 1;
            }
        }
        let message = last.unwrap_or_else(|| "no provider could be reached".into());
        Err(CallFailed::Failed { message, attempts, unanswered: None })
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
        let mut streamed_bytes = 0u64;
        let mut on_delta = |delta: Delta<'_>| {
            first_output.get_or_insert_with(|| called.elapsed());
            let (Delta::Text(piece) | Delta::Reasoning(piece)) = delta;
            streamed_bytes += piece.len() as u64;
            watch.delta(delta);
        };
        let outcome = candidate.wire.attempt(&attempt, &mut on_delta, cancel);
        // What the provider may bill if this attempt gives no answer (see `Unanswered`).
        let unanswered = candidate.unanswered(attempt.streamed.then_some(streamed_bytes));
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
                Tried::Cancelled(unanswered)
            }
            Err(CallError::Refused(refusal)) => {
                metrics.provider_call(&label, "error", None, first_output);
                watch.refused(number, &target, fallback, &refusal);
                Tried::Failed(refusal, first_output.map(|_| unanswered))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::Duration;

    use super::{build, CallFailed, Route, Unanswered, Watch};
    use crate::cancel::{CancelReason, Canceller};
    use crate::config::{ModelConfig, ProviderConfig, Wire};
    use crate::domain::{Message, ModelPricing, Role};
    use crate::providers::{CompletionRequest, Delta, Echo};

    /// A dollar an input token, two an output token.
    fn pricing() -> ModelPricing {
        ModelPricing {
            input_per_million: 1_000_000.0,
            output_per_million: 2_000_000.0,
            cached_input_per_million: None,
            currency: "USD".into(),
        }
    }

    fn unanswered(streamed_bytes: Option<u64>, max_output: Option<u32>) -> Unanswered {
        Unanswered { streamed_bytes, max_output, pricing: Some(pricing()) }
    }

    #[test]
    fn an_unanswered_attempt_counts_its_input_and_a_token_per_four_streamed_bytes() {
        let usage = unanswered(Some(9), Some(100)).estimated_usage(50, 4096);
        assert_eq!((usage.input_tokens, usage.output_tokens, usage.total_tokens), (50, 3, 53));
        assert_eq!(usage.cost.map(|cost| cost.amount), Some(56.0), "50 in at $1, 3 out at $2");
        let nothing_streamed = unanswered(Some(0), Some(100)).estimated_usage(50, 4096);
        assert_eq!((nothing_streamed.output_tokens, nothing_streamed.total_tokens), (0, 50), "the input is billed");
    }

    #[test]
    fn an_unanswered_attempt_counts_no_more_output_than_its_limit() {
        assert_eq!(unanswered(Some(1_000_000), Some(100)).estimated_usage(50, 4096).output_tokens, 100);
        assert_eq!(unanswered(Some(1_000_000), None).estimated_usage(50, 4096).output_tokens, 4096);
    }

    #[test]
    fn a_whole_answer_cut_short_counts_its_whole_output_limit() {
        assert_eq!(unanswered(None, Some(8192)).estimated_usage(50, 4096).output_tokens, 8192);
        assert_eq!(unanswered(None, None).estimated_usage(50, 4096).output_tokens, 4096);
        let unpriced = Unanswered { pricing: None, ..unanswered(None, None) };
        assert_eq!(unpriced.estimated_usage(50, 4096).cost, None);
    }

    /// A route over two providers with different limits and prices.
    fn two_providers() -> Route {
        let mut cheap = ProviderConfig::new(Wire::Anthropic, "http://127.0.0.1:1");
        cheap.models = vec![ModelConfig { max_tokens: Some(100), ..ModelConfig::named("small") }];
        cheap.fallbacks = vec!["dear".into()];
        cheap.max_retries = 0;
        let mut dear = ProviderConfig::new(Wire::Openai, "http://127.0.0.1:1");
        let doubled = ModelPricing { input_per_million: 2_000_000.0, ..pricing() };
        dear.models = vec![ModelConfig { pricing: Some(doubled), ..ModelConfig::named("large") }];
        dear.max_retries = 0;
        let providers = BTreeMap::from([("cheap".to_string(), cheap), ("dear".to_string(), dear)]);
        let routes = build(&providers, &|_| None).expect("the providers");
        routes.into_iter().find(|(info, _)| info.id == "cheap/small").expect("cheap/small").1
    }

    #[test]
    fn no_unanswered_attempt_counts_more_than_its_call_reserved() {
        let route = two_providers();
        let (tokens, cost) = route.most_used(50, 4096);
        for candidate in &route.candidates {
            for streamed in [None, Some(0), Some(7), Some(u64::MAX / 2)] {
                let usage = candidate.unanswered(streamed).estimated_usage(50, 4096);
                assert!(usage.total_tokens <= tokens, "{} {streamed:?}: {usage:?}", candidate.id());
                assert!(
                    usage.cost.as_ref().map_or(0.0, |c| c.amount) <= cost,
                    "{} {streamed:?}: {usage:?}",
                    candidate.id()
                );
            }
        }
    }

    /// Takes a streamed call, cancelling it at its first text, and keeps what streamed.
    struct CancelAtText {
        canceller: Canceller,
        streamed: String,
        streamed_whole: bool,
    }

    impl Watch for CancelAtText {
        fn streamed(&self) -> bool {
            self.streamed_whole
        }

        fn delta(&mut self, delta: Delta<'_>) {
            let (Delta::Text(piece) | Delta::Reasoning(piece)) = delta;
            self.streamed.push_str(piece);
            if matches!(delta, Delta::Text(_)) {
                self.canceller.cancel(CancelReason::User);
            }
        }
    }

    fn cancelled_echo(streamed: bool) -> (CallFailed, String) {
        let echo = Echo { delay: Duration::from_millis(1), context_window: 1000, pricing: Some(pricing()) };
        let route = Route::builtin(Arc::new(echo));
        let messages = [Message::text_of(Role::User, "one two three four five six")];
        let request = CompletionRequest { system_prompt: None, messages: &messages, tools: &[], response_format: None };
        let mut watch = CancelAtText { canceller: Canceller::new(), streamed: String::new(), streamed_whole: streamed };
        let cancel = watch.canceller.token();
        let failed = route.call(&request, &mut watch, &cancel).err().expect("cancelled");
        (failed, watch.streamed)
    }

    #[test]
    fn a_call_cancelled_mid_stream_says_what_streamed() {
        let (failed, streamed) = cancelled_echo(true);
        let expected = unanswered(Some(streamed.len() as u64), None);
        assert_eq!(failed, CallFailed::Cancelled { unanswered: Some(expected) });
        assert!(streamed.len() > "Echo:".len(), "reasoning and text streamed: {streamed:?}");
    }

    #[test]
    fn a_whole_call_cancelled_in_flight_says_its_output_was_not_seen() {
        let (failed, _) = cancelled_echo(false);
        assert_eq!(failed, CallFailed::Cancelled { unanswered: Some(unanswered(None, None)) });
    }

    #[test]
    fn a_provider_that_cannot_be_reached_is_not_counted() {
        let route = two_providers();
        let messages = [Message::text_of(Role::User, "hi")];
        let request = CompletionRequest { system_prompt: None, messages: &messages, tools: &[], response_format: None };
        let mut watch = CancelAtText { canceller: Canceller::new(), streamed: String::new(), streamed_whole: true };
        let cancel = watch.canceller.token();
        let failed = route.call(&request, &mut watch, &cancel).err().expect("nothing listens on port 1");
        assert!(matches!(failed, CallFailed::Failed { unanswered: None, .. }), "{failed:?}");
    }
}
