//! The server's metrics, in Prometheus' text format at `GET /metrics` (on the admin port when
//! there is one, otherwise on the main port behind the token).
//!
//! One process-wide registry: the HTTP layer, the bus, the writer and the providers record
//! into it where things happen; what is a level rather than an event (sessions by status,
//! runs in flight, pending approvals, the writer's queue, bus subscribers) is read from the
//! engine when scraped. Label values are route templates, statuses, tool, provider and model
//! names, never an id or user text, so every family's cardinality is bounded by the config.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use prometheus::{
    CounterVec, Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

use crate::domain::{Dispatch, Event, ModelInfo, RunOutcome, ToolResult, Usage};

/// Latency buckets from 1 ms to 2 minutes (HTTP requests, tool calls, first tokens).
const LATENCY: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0];
/// Run lengths from 10 ms to an hour.
const RUN: &[f64] = &[0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0];
/// Writer commits from 100 µs to 5 s.
const COMMIT: &[f64] = &[0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 5.0];
/// Operations per writer batch.
const BATCH: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];

/// Every family.
pub struct Metrics {
    registry: Registry,
    pub http_requests: IntCounterVec,
    pub http_duration: HistogramVec,
    pub open_connections: IntGauge,
    pub open_streams: IntGaugeVec,
    pub runs_started: IntCounter,
    pub runs_finished: IntCounterVec,
    pub run_duration: HistogramVec,
    pub tool_calls: IntCounterVec,
    pub tool_duration: HistogramVec,
    pub approvals_pending: IntGauge,
    pub provider_calls: IntCounterVec,
    pub provider_retries: IntCounterVec,
    pub provider_fallbacks: IntCounterVec,
    pub provider_first_token: HistogramVec,
    pub provider_tokens: IntCounterVec,
    pub cost: CounterVec,
    pub writer_queue: IntGauge,
    pub writer_batch: Histogram,
    pub writer_commit: Histogram,
    pub bus_subscribers: IntGauge,
    pub bus_dropped: IntCounter,
    pub sessions: IntGaugeVec,
    pub active_runs: IntGauge,
    /// When each run in flight started, for its duration.
    started: Mutex<HashMap<String, Instant>>,
    /// The tools the server has (builtin, plugin, MCP): only their names become labels, as a
    /// model may call a tool by any name it makes up.
    known_tools: RwLock<HashSet<String>>,
}

/// The registry, made on first use.
pub fn get() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let family = IntCounterVec::new(Opts::new(name, help), labels).expect("a valid metric");
    registry.register(Box::new(family.clone())).expect("registered once");
    family
}

fn histogram(registry: &Registry, name: &str, help: &str, labels: &[&str], buckets: &[f64]) -> HistogramVec {
    let family =
        HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets.to_vec()), labels).expect("a valid metric");
    registry.register(Box::new(family.clone())).expect("registered once");
    family
}

fn single_histogram(registry: &Registry, name: &str, help: &str, buckets: &[f64]) -> Histogram {
    let histogram =
        Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec())).expect("a valid metric");
    registry.register(Box::new(histogram.clone())).expect("registered once");
    histogram
}

fn gauges(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let family = IntGaugeVec::new(Opts::new(name, help), labels).expect("a valid metric");
    registry.register(Box::new(family.clone())).expect("registered once");
    family
}

fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let gauge = IntGauge::new(name, help).expect("a valid metric");
    registry.register(Box::new(gauge.clone())).expect("registered once");
    gauge
}

fn single_counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let counter = IntCounter::new(name, help).expect("a valid metric");
    registry.register(Box::new(counter.clone())).expect("registered once");
    counter
}

impl Metrics {
    fn new() -> Metrics {
        let r = Registry::new();
        let cost = CounterVec::new(
            Opts::new("kestrel_cost_total", "What provider tokens cost at the models' configured prices"),
            &["provider", "model", "currency"],
        )
        .expect("a valid metric");
        r.register(Box::new(cost.clone())).expect("registered once");
        Metrics {
            http_requests: counter(
                &r,
                "kestrel_http_requests_total",
                "HTTP requests answered, by route template, method and status",
                &["route", "method", "status"],
            ),
            http_duration: histogram(
                &r,
                "kestrel_http_request_duration_seconds",
                "Time from a request's dispatch to its reply (a stream: to its start)",
                &["route", "method"],
                LATENCY,
            ),
            open_connections: gauge(&r, "kestrel_http_open_connections", "Client connections open"),
            open_streams: gauges(&r, "kestrel_http_open_streams", "Event streams open, by framing", &["framing"]),
            runs_started: single_counter(&r, "kestrel_runs_started_total", "Runs (turns) started"),
            runs_finished: counter(&r, "kestrel_runs_finished_total", "Runs ended, by status", &["status"]),
            run_duration: histogram(&r, "kestrel_run_duration_seconds", "Run lengths, by status", &["status"], RUN),
            tool_calls: counter(
                &r,
                "kestrel_tool_calls_total",
                "Tool calls, by tool and outcome",
                &["tool", "outcome"],
            ),
            tool_duration: histogram(&r, "kestrel_tool_call_duration_seconds", "Tool call lengths", &["tool"], LATENCY),
            approvals_pending: gauge(&r, "kestrel_approvals_pending", "Tool calls waiting for a person's decision"),
            provider_calls: counter(
                &r,
                "kestrel_provider_calls_total",
                "Provider calls, by provider, model and outcome",
                &["provider", "model", "outcome"],
            ),
            provider_retries: counter(
                &r,
                "kestrel_provider_retries_total",
                "Provider calls retried after a retryable failure",
                &["provider", "model"],
            ),
            provider_fallbacks: counter(
                &r,
                "kestrel_provider_fallbacks_total",
                "Calls made to a provider as a fallback, after the one before it gave up",
                &["provider", "model"],
            ),
            provider_first_token: histogram(
                &r,
                "kestrel_provider_time_to_first_token_seconds",
                "Time from a provider call to its first streamed output",
                &["provider", "model"],
                LATENCY,
            ),
            provider_tokens: counter(
                &r,
                "kestrel_provider_tokens_total",
                "Tokens the providers reported, by direction (input, output, cached_input)",
                &["provider", "model", "direction"],
            ),
            cost,
            writer_queue: gauge(&r, "kestrel_writer_queue_depth", "Writes waiting for the SQLite writer"),
            writer_batch: single_histogram(&r, "kestrel_writer_batch_size", "Operations per writer transaction", BATCH),
            writer_commit: single_histogram(
                &r,
                "kestrel_writer_commit_seconds",
                "Writer transaction commit time",
                COMMIT,
            ),
            bus_subscribers: gauge(&r, "kestrel_bus_subscribers", "Streams subscribed to the event bus"),
            bus_dropped: single_counter(
                &r,
                "kestrel_bus_dropped_subscribers_total",
                "Subscribers the bus dropped because they fell behind",
            ),
            sessions: gauges(&r, "kestrel_sessions", "Kestrel sessions, by status", &["status"]),
            active_runs: gauge(&r, "kestrel_active_runs", "Runs in flight"),
            started: Mutex::new(HashMap::new()),
            known_tools: RwLock::new(HashSet::new()),
            registry: r,
        }
    }

    /// Creates the series every configured model will have, at zero, so a scrape
    /// shows every family (and a rate over a counter that has not moved yet) from the start.
    pub fn prime<'m>(&self, models: impl Iterator<Item = &'m ModelInfo>) {
        for info in models {
            let model = info.id.split_once('/').map_or(info.id.as_str(), |(_, name)| name);
            let labels = [info.provider.as_str(), model];
            for outcome in ["ok", "error", "cancelled"] {
                self.provider_calls.with_label_values(&[labels[0], labels[1], outcome]);
            }
            for direction in ["input", "output", "cached_input"] {
                self.provider_tokens.with_label_values(&[labels[0], labels[1], direction]);
            }
            self.provider_retries.with_label_values(&labels);
            self.provider_fallbacks.with_label_values(&labels);
            self.provider_first_token.with_label_values(&labels);
            if let Some(pricing) = &info.pricing {
                self.cost.with_label_values(&[labels[0], labels[1], pricing.currency.as_str()]);
            }
        }
        for status in ["completed", "cancelled", "max_steps", "paused", "failed"] {
            self.runs_finished.with_label_values(&[status]);
            self.run_duration.with_label_values(&[status]);
        }
        for framing in ["sse", "ndjson"] {
            self.open_streams.with_label_values(&[framing]);
        }
    }

    /// Adds tools the server now has (a plugin reloaded, an MCP server connected), with their
    /// series at zero.
    pub fn know_tools(&self, tools: &[String]) {
        self.known_tools.write().unwrap_or_else(|e| e.into_inner()).extend(tools.iter().cloned());
        for tool in tools {
            for outcome in ["ok", "error"] {
                self.tool_calls.with_label_values(&[tool.as_str(), outcome]);
            }
            self.tool_duration.with_label_values(&[tool.as_str()]);
        }
    }

    /// Every family in the text exposition format.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 * 1024);
        if let Err(error) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            log::error!("metrics could not be encoded: {error}");
        }
        out
    }

    /// One answered HTTP request.
    pub fn http(&self, route: &str, method: &str, status: u16, took: Duration) {
        let method = match method {
            "GET" | "HEAD" | "POST" | "PUT" | "PATCH" | "DELETE" | "OPTIONS" => method,
            _ => "other",
        };
        self.http_requests.with_label_values(&[route, method, status_label(status)]).inc();
        self.http_duration.with_label_values(&[route, method]).observe(took.as_secs_f64());
    }

    /// One call to a model (`provider/name`): its outcome, the tokens it reported and how long
    /// its first output took.
    pub fn provider_call(&self, model_id: &str, outcome: &str, usage: Option<&Usage>, first_output: Option<Duration>) {
        let (provider, model) = model_id.split_once('/').unwrap_or((model_id, ""));
        self.provider_calls.with_label_values(&[provider, model, outcome]).inc();
        if let Some(first) = first_output {
            self.provider_first_token.with_label_values(&[provider, model]).observe(first.as_secs_f64());
        }
        let Some(usage) = usage else { return };
        if let Some(cost) = &usage.cost {
            self.cost.with_label_values(&[provider, model, cost.currency.as_str()]).inc_by(cost.amount.max(0.0));
        }
        let cached = usage.cached_input_tokens.unwrap_or(0);
        for (direction, tokens) in
            [("input", usage.input_tokens), ("output", usage.output_tokens), ("cached_input", cached)]
        {
            self.provider_tokens.with_label_values(&[provider, model, direction]).inc_by(tokens);
        }
    }

    /// A failed attempt at `provider` that will be tried again.
    pub fn provider_retry(&self, provider: &str, model: &str) {
        self.provider_retries.with_label_values(&[provider, model]).inc();
    }

    /// `provider` is tried as a fallback: the one before it gave up.
    pub fn provider_fallback(&self, provider: &str, model: &str) {
        self.provider_fallbacks.with_label_values(&[provider, model]).inc();
    }

    /// What an event says about runs and tools (called once per published event).
    pub fn observe(&self, event: &Event) {
        match event {
            Event::ToolFinished { result, dispatch, .. } => self.tool_finished(result, dispatch),
            Event::RunStarted { run_id, .. } => {
                self.runs_started.inc();
                self.started.lock().unwrap_or_else(|e| e.into_inner()).insert(run_id.clone(), Instant::now());
            }
            Event::RunFinished { run_id, status, .. } => self.run_ended(run_id, outcome_label(*status)),
            Event::RunFailed { run_id, .. } => self.run_ended(run_id, "failed"),
            _ => {}
        }
    }

    fn tool_finished(&self, result: &ToolResult, dispatch: &Dispatch) {
        // Names a client declares (its own, sandbox and subagent tools) are not labels: a
        // client could make a series per call. Nor is a name the server does not have.
        let known = |name: &str| self.known_tools.read().unwrap_or_else(|e| e.into_inner()).contains(name);
        let tool = match dispatch {
            Dispatch::Server | Dispatch::Mcp { .. } if known(&result.name) => result.name.as_str(),
            Dispatch::Server | Dispatch::Mcp { .. } => "(unknown)",
            Dispatch::Client => "(client)",
            Dispatch::Sandbox => "(sandbox)",
            Dispatch::Subagent => "(subagent)",
        };
        let outcome = if result.ok { "ok" } else { "error" };
        self.tool_calls.with_label_values(&[tool, outcome]).inc();
        if let Some(ms) = result.duration_ms {
            self.tool_duration.with_label_values(&[tool]).observe(ms as f64 / 1000.0);
        }
    }

    fn run_ended(&self, run_id: &str, status: &str) {
        self.runs_finished.with_label_values(&[status]).inc();
        let started = self.started.lock().unwrap_or_else(|e| e.into_inner()).remove(run_id);
        if let Some(started) = started {
            self.run_duration.with_label_values(&[status]).observe(started.elapsed().as_secs_f64());
        }
    }
}

fn outcome_label(outcome: RunOutcome) -> &'static str {
    match outcome {
        RunOutcome::Completed => "completed",
        RunOutcome::Cancelled => "cancelled",
        RunOutcome::MaxSteps => "max_steps",
        RunOutcome::Paused => "paused",
        RunOutcome::BudgetExceeded => "budget_exceeded",
    }
}

/// A status as a label without allocating.
fn status_label(status: u16) -> &'static str {
    const KNOWN: &[(u16, &str)] = &[
        (200, "200"),
        (201, "201"),
        (202, "202"),
        (204, "204"),
        (304, "304"),
        (400, "400"),
        (401, "401"),
        (403, "403"),
        (404, "404"),
        (405, "405"),
        (408, "408"),
        (409, "409"),
        (411, "411"),
        (413, "413"),
        (414, "414"),
        (415, "415"),
        (417, "417"),
        (422, "422"),
        (429, "429"),
        (431, "431"),
        (500, "500"),
        (501, "501"),
        (503, "503"),
        (505, "505"),
    ];
    KNOWN.iter().find(|(code, _)| *code == status).map_or("other", |(_, label)| label)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_family_in_the_text_format() {
        let metrics = get();
        metrics.http("/api/sessions/{id}", "GET", 404, Duration::from_millis(3));
        metrics.http("/api/sessions/{id}", "BREW", 999, Duration::from_millis(3));
        let text = String::from_utf8(metrics.render()).unwrap();
        assert!(text.contains("# TYPE kestrel_http_requests_total counter"), "{text}");
        assert!(text.contains(r#"kestrel_http_requests_total{method="GET",route="/api/sessions/{id}",status="404"}"#));
        assert!(text.contains(r#"method="other",route="/api/sessions/{id}",status="other""#), "bounded labels");
        assert!(text.contains("# TYPE kestrel_http_request_duration_seconds histogram"));
    }
}
