//! Budgets and rate limits at run time: each scope's token bucket, runs in flight, and model
//! calls in flight with what they reserved; and what a model call adds to its scope's
//! counters (`policy::budget` has the arithmetic, the store the counters, so they survive
//! restarts).
//!
//! A scope is a Kestrel tenant (`tenant:<name>`) or a BAE profile (`profile:<id>`); both doors
//! reach the meter through the one turn loop (`Run::reserve_call`, `Run::settle_call`).
//!
//! Runs at once (issue 35, finding 6): a model call of a scope with a spending limit first
//! reserves the most it may use (its input, as the context estimate counts it, and its
//! output limit, at its model's prices) and holds the reservation until its real usage is
//! committed to the store; the reservation is then let go and the waiters woken. A call
//! starts only as `Budget::admit_call` allows: alone once anything is left, alongside calls
//! in flight only if all of them fit. A call that must wait blocks its run's worker, waking
//! at each settle of its scope or at a cancel. What a scope spent is read from the store
//! outside the meter's lock (no I/O under a lock), so a read is paired with the scope's
//! settled counter: what settled after the counter was looked at is added to the read,
//! counted twice at worst, never missed.
//!
//! A call that ends without an answer is counted too when the provider had it (issue 35's
//! review): cancelled while an attempt was in flight, or failed after its output began
//! (`providers::Unanswered`). Providers bill what they processed, so it counts its input as
//! estimated here and its output at four bytes a token of what streamed (a whole answer's
//! output, never seen, at its limit), at its model's prices: never more than it reserved.
//! Otherwise a tenant could send and cancel just before each answer ends, again and again,
//! and spend without limit.
//!
//! The buckets, runs and reservations are this process's; on several nodes each keeps its
//! own, so a scope may pass its limit by one call per node.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Sender};

use super::{EngineError, Shared};
use crate::cancel::CancelToken;
use crate::domain::Usage;
use crate::policy::{periods, Admission, Bucket, Budget, Reserve, Spent};
use crate::store::{PolicyWrite, WriteOp};

/// Where a run's spending is counted, and what it may spend.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Allowance {
    pub scope: String,
    pub budget: Budget,
}

impl Allowance {
    pub fn tenant(tenant: &str, budget: Budget) -> Allowance {
        Allowance { scope: format!("tenant:{tenant}"), budget }
    }

    pub fn profile(profile_id: &str, budget: Budget) -> Allowance {
        Allowance { scope: format!("profile:{profile_id}"), budget }
    }
}

#[derive(Default)]
pub struct Meter {
    buckets: Mutex<HashMap<String, Bucket>>,
    /// Each scope's runs and calls in flight. A scope's entry stays (scopes are the
    /// configured tenants and the BAE profiles), so its settled counter never goes back.
    scopes: Mutex<HashMap<String, Scope>>,
    epoch: Option<Instant>,
}

/// A scope's state in flight.
#[derive(Default)]
struct Scope {
    runs: u32,
    /// Model calls in flight and what they reserved.
    reserved: Reserve,
    /// The tokens and cost of every call settled here since the start: it only grows.
    settled_tokens: u64,
    settled_cost: f64,
    /// Calls waiting for one in flight to settle; each is woken once, at the next settle.
    waiters: Vec<Sender<()>>,
}

/// A run in flight, counted against its scope's `max_concurrent_runs` until it is dropped;
/// it holds the allowance it was opened under, which the run then counts against.
pub struct RunSlot {
    meter: Arc<Meter>,
    pub allowance: Allowance,
}

impl Drop for RunSlot {
    fn drop(&mut self) {
        let mut scopes = self.meter.scopes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(scope) = scopes.get_mut(&self.allowance.scope) {
            scope.runs = scope.runs.saturating_sub(1);
        }
    }
}

/// A model call in flight, counted against its scope with what it reserved until it is
/// dropped; then what it used (committed to the store by then, `Shared::settle_usage`)
/// counts instead. A call of a scope with no spending limit holds nothing (`held` unset).
pub struct Reservation {
    held: Option<(Arc<Meter>, String)>,
    reserved: Reserve,
    used: (u64, f64),
}

impl Reservation {
    /// The reservation of a call whose scope limits no spending: it holds nothing.
    fn unheld() -> Reservation {
        Reservation { held: None, reserved: Reserve::default(), used: (0, 0.0) }
    }

    /// Whether the call's usage must be committed before the reservation is let go.
    fn is_held(&self) -> bool {
        self.held.is_some()
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let Some((meter, scope)) = self.held.take() else { return };
        let mut scopes = meter.scopes.lock().unwrap_or_else(|e| e.into_inner());
        let state = scopes.entry(scope).or_default();
        state.reserved.remove(&self.reserved);
        state.settled_tokens = state.settled_tokens.saturating_add(self.used.0);
        state.settled_cost += self.used.1;
        for waiter in state.waiters.drain(..) {
            let _ = waiter.try_send(());
        }
    }
}

impl Meter {
    pub fn new() -> Meter {
        Meter { epoch: Some(Instant::now()), ..Meter::default() }
    }

    fn seconds(&self) -> f64 {
        self.epoch.map_or(0.0, |epoch| epoch.elapsed().as_secs_f64())
    }

    /// Takes a request from the scope's bucket, or says how long until one is there.
    pub fn admit(&self, allowance: &Allowance) -> Result<(), Duration> {
        let Some(rate) = allowance.budget.requests_per_second else { return Ok(()) };
        let now = self.seconds();
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        buckets.entry(allowance.scope.clone()).or_insert_with(|| Bucket::full(rate, now)).take(rate, now)
    }

    /// Runs of the scope in flight here.
    pub fn running(&self, scope: &str) -> u32 {
        self.scopes.lock().unwrap_or_else(|e| e.into_inner()).get(scope).map_or(0, |scope| scope.runs)
    }

    /// What the scope spent: `read` (the store's counters), and what settled here while it
    /// read. Then `decide` under the lock, with the scope's state.
    fn with_spent<T>(
        &self,
        scope: &str,
        read: &dyn Fn() -> Result<Spent, EngineError>,
        decide: impl FnOnce(&Spent, &mut Scope) -> T,
    ) -> Result<T, EngineError> {
        let before = self.settled(scope);
        let read = read()?;
        let mut scopes = self.scopes.lock().unwrap_or_else(|e| e.into_inner());
        let state = scopes.entry(scope.to_string()).or_default();
        let spent = read.plus(state.settled_tokens.saturating_sub(before.0), (state.settled_cost - before.1).max(0.0));
        Ok(decide(&spent, state))
    }

    fn settled(&self, scope: &str) -> (u64, f64) {
        let scopes = self.scopes.lock().unwrap_or_else(|e| e.into_inner());
        scopes.get(scope).map_or((0, 0.0), |state| (state.settled_tokens, state.settled_cost))
    }

    /// A slot for a new run, unless the scope has as many runs as it may, or spent its budget
    /// (`spent` reads what it spent; it is read only when the budget limits spending).
    pub fn open_run(
        self: &Arc<Self>,
        allowance: &Allowance,
        spent: &dyn Fn() -> Result<Spent, EngineError>,
    ) -> Result<RunSlot, EngineError> {
        let unread = || Ok(Spent::default());
        let read: &dyn Fn() -> Result<Spent, EngineError> = match allowance.budget.limits_spending() {
            true => spent,
            false => &unread,
        };
        self.with_spent(&allowance.scope, read, |spent, state| {
            if let Some(reason) = allowance.budget.exceeded(spent) {
                return Err(EngineError::BudgetExceeded(reason));
            }
            if let Some(limit) = allowance.budget.max_concurrent_runs.filter(|limit| state.runs >= *limit) {
                let running = state.runs;
                return Err(EngineError::BudgetExceeded(format!("{limit} run(s) at once at most; {running} running")));
            }
            state.runs += 1;
            Ok(RunSlot { meter: Arc::clone(self), allowance: allowance.clone() })
        })?
    }

    /// A reservation for a model call that may use `call`, once the scope's budget lets it
    /// start (`Budget::admit_call`): at once, or after calls in flight settled. `None`: the
    /// run was cancelled while it waited. A spent budget is `BudgetExceeded`.
    pub fn reserve(
        self: &Arc<Self>,
        allowance: &Allowance,
        call: Reserve,
        spent: &dyn Fn() -> Result<Spent, EngineError>,
        cancel: &CancelToken,
    ) -> Result<Option<Reservation>, EngineError> {
        if !allowance.budget.limits_spending() {
            return Ok(Some(Reservation::unheld()));
        }
        loop {
            let woken = self.with_spent(&allowance.scope, spent, |spent, state| {
                match allowance.budget.admit_call(spent, &state.reserved, &call) {
                    Admission::Go => {
                        state.reserved.add(&call);
                        Ok(None)
                    }
                    Admission::Spent(reason) => Err(EngineError::BudgetExceeded(reason)),
                    Admission::Wait => {
                        let (waiter, woken) = bounded(1);
                        state.waiters.push(waiter);
                        Ok(Some(woken))
                    }
                }
            })??;
            let Some(woken) = woken else {
                let held = Some((Arc::clone(self), allowance.scope.clone()));
                return Ok(Some(Reservation { held, reserved: call, used: (0, 0.0) }));
            };
            select! {
                recv(woken) -> _ => {}
                recv(cancel.receiver()) -> _ => return Ok(None),
            }
        }
    }
}

impl super::EngineConfig {
    /// A Kestrel tenant's allowance: its token's budget over the server's.
    pub fn tenant_allowance(&self, tenant: &str) -> Allowance {
        let own = self.tenant_budgets.get(tenant).cloned().unwrap_or_default();
        Allowance::tenant(tenant, own.over(&self.budget))
    }
}

/// A scope's spending as `GET /api/usage` and `/admin/v1/usage` show it.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageView {
    pub scope: String,
    #[serde(flatten)]
    pub spent: Spent,
    pub running_runs: u32,
    pub budget: Budget,
}

impl super::Engine {
    /// Takes one request from `allowance`'s rate limit, or says how long to wait.
    pub fn admit_request(&self, allowance: &Allowance) -> Result<(), Duration> {
        self.shared.meter.admit(allowance)
    }

    /// A Kestrel tenant's allowance.
    pub fn tenant_allowance(&self, tenant: &str) -> Allowance {
        self.shared.config.tenant_allowance(tenant)
    }

    /// What `allowance`'s scope spent, runs now, and may spend.
    pub fn usage_of(&self, allowance: &Allowance) -> Result<UsageView, EngineError> {
        Ok(UsageView {
            scope: allowance.scope.clone(),
            spent: self.shared.spent(&allowance.scope)?,
            running_runs: self.shared.meter.running(&allowance.scope),
            budget: allowance.budget.clone(),
        })
    }
}

impl Shared {
    /// What `scope` spent today and this month.
    pub(crate) fn spent(&self, scope: &str) -> Result<Spent, EngineError> {
        let (day, month) = periods(&crate::time::now_rfc3339());
        Ok(self.store.readers().spent(scope, &day, &month)?)
    }

    /// A slot for a new run of `allowance`'s scope (see `Meter::open_run`).
    pub(crate) fn open_run(&self, allowance: &Allowance) -> Result<RunSlot, EngineError> {
        self.meter.open_run(allowance, &|| self.spent(&allowance.scope))
    }

    /// Adds a model call's tokens and cost (as its model's prices give it) to the scope's
    /// counters, then lets its reservation go. A held reservation waits for the commit, so
    /// the next read of the counters has it; otherwise the write is queued without waiting.
    /// Either way it commits before anything the run writes after it.
    pub(crate) fn settle_usage(&self, scope: &str, usage: &Usage, mut reservation: Reservation) {
        let tokens = usage.input_tokens + usage.output_tokens;
        let cost = usage.cost.as_ref().map_or(0.0, |cost| cost.amount);
        reservation.used = (tokens, cost);
        if tokens == 0 && cost == 0.0 {
            return;
        }
        let (day, month) = periods(&crate::time::now_rfc3339());
        let add = PolicyWrite::AddUsage { scope: scope.to_string(), day, month, tokens, cost };
        let written = match reservation.is_held() {
            true => self.store.write(vec![WriteOp::Policy(add)]),
            false => self.store.write_detached(vec![WriteOp::Policy(add)]).map(|_| ()),
        };
        if let Err(error) = written {
            log::error!("usage of {scope} could not be counted: {error}");
        }
    }
}

impl super::run::Run {
    /// The reservation a model call of this run over `route` with `request` takes before it
    /// starts (see the module doc); `None`: the run was cancelled while it waited.
    pub(crate) fn reserve_call(
        &self,
        route: &crate::providers::Route,
        request: &crate::providers::CompletionRequest<'_>,
    ) -> Result<Option<Reservation>, EngineError> {
        let allowance = &self.allowance;
        if !allowance.budget.limits_spending() {
            return Ok(Some(Reservation::unheld()));
        }
        let (tokens, cost) = route.most_used(estimate_input(request), DEFAULT_OUTPUT_RESERVE);
        let call = Reserve { calls: 1, tokens, cost };
        self.shared.meter.reserve(allowance, call, &|| self.shared.spent(&allowance.scope), &self.cancel)
    }

    /// Counts a model call's usage against the run's scope and lets its reservation go: an
    /// answer's usage as its provider reported it; a call that ended without one while the
    /// provider had it (cancelled in flight, or failed after its output began) at an estimate
    /// (`Unanswered::estimated_usage`: the request's input as `reserve_call` estimates it and
    /// what streamed, at most what it reserved); any other, nothing.
    pub(crate) fn settle_call(
        &self,
        reservation: Reservation,
        request: &crate::providers::CompletionRequest<'_>,
        called: &Result<crate::providers::Answered, crate::providers::CallFailed>,
    ) {
        let usage = match called {
            Ok(answered) => answered.completion.usage.clone(),
            Err(failed) => failed
                .unanswered()
                .map(|unanswered| unanswered.estimated_usage(estimate_input(request), DEFAULT_OUTPUT_RESERVE))
                .unwrap_or_default(),
        };
        self.shared.settle_usage(&self.allowance.scope, &usage, reservation);
    }
}

/// The output a call reserves when its model sends no `max_tokens` (OpenAI-style providers
/// may leave it out; the model then stops where it likes).
pub const DEFAULT_OUTPUT_RESERVE: u64 = 4096;

/// The input tokens of a request as the context estimate counts them (`context.rs`), with its
/// system prompt and tool schemas, at four bytes a token.
fn estimate_input(request: &crate::providers::CompletionRequest<'_>) -> u64 {
    let tools = serde_json::to_string(request.tools).map_or(0, |text| text.len());
    let system = request.system_prompt.map_or(0, str::len);
    super::context::estimate(request.messages) + ((tools + system) as u64).div_ceil(4)
}
