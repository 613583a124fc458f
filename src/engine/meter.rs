//! Budgets and rate limits at run time: each scope's token bucket and runs in flight, and
//! what a model call adds to its scope's counters (`policy::budget` has the arithmetic, the
//! store the counters, so they survive restarts).
//!
//! A scope is a Kestrel tenant (`tenant:<name>`) or a BAE profile (`profile:<id>`). The
//! buckets and run counts are this process's; on several nodes each keeps its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{EngineError, Shared};
use crate::domain::Usage;
use crate::policy::{periods, Bucket, Budget, Spent};
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
    running: Mutex<HashMap<String, u32>>,
    epoch: Option<Instant>,
}

/// A run in flight, counted against its scope's `max_concurrent_runs` until it is dropped;
/// it holds the allowance it was opened under, which the run then counts against.
pub struct RunSlot {
    meter: Arc<Meter>,
    pub allowance: Allowance,
}

impl Drop for RunSlot {
    fn drop(&mut self) {
        let mut running = self.meter.running.lock().unwrap_or_else(|e| e.into_inner());
        let scope = &self.allowance.scope;
        if let Some(count) = running.get_mut(scope) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                running.remove(scope);
            }
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
        self.running.lock().unwrap_or_else(|e| e.into_inner()).get(scope).copied().unwrap_or(0)
    }

    /// A slot for a new run, unless the scope has as many runs as it may, or spent its budget.
    pub fn open_run(self: &Arc<Self>, allowance: &Allowance, spent: &Spent) -> Result<RunSlot, EngineError> {
        if let Some(reason) = allowance.budget.exceeded(spent) {
            return Err(EngineError::BudgetExceeded(reason));
        }
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let count = running.entry(allowance.scope.clone()).or_insert(0);
        if let Some(limit) = allowance.budget.max_concurrent_runs.filter(|limit| *count >= *limit) {
            return Err(EngineError::BudgetExceeded(format!("{limit} run(s) at once at most; {count} running")));
        }
        *count += 1;
        Ok(RunSlot { meter: Arc::clone(self), allowance: allowance.clone() })
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

    /// A slot for a new run of `allowance`'s scope (see `Meter::open_run`); what was spent
    /// is read only when the budget limits spending.
    pub(crate) fn open_run(&self, allowance: &Allowance) -> Result<RunSlot, EngineError> {
        let spent = match allowance.budget.limits_spending() {
            true => self.spent(&allowance.scope)?,
            false => Spent::default(),
        };
        self.meter.open_run(allowance, &spent)
    }

    /// Adds a model call's tokens, and its cost where `model` is priced, to the scope's
    /// counters. Queued without waiting: it commits before anything the run writes after it.
    pub(crate) fn count_usage(&self, scope: &str, model: &str, usage: &Usage) {
        let tokens = usage.input_tokens + usage.output_tokens;
        let pricing = self.models.infos().find(|m| m.id == model).and_then(|m| m.pricing.clone());
        let cost = pricing.map_or(0.0, |p| p.cost(usage).amount);
        if tokens == 0 && cost == 0.0 {
            return;
        }
        let (day, month) = periods(&crate::time::now_rfc3339());
        let add = PolicyWrite::AddUsage { scope: scope.to_string(), day, month, tokens, cost };
        if let Err(error) = self.store.write_detached(vec![WriteOp::Policy(add)]) {
            log::error!("usage of {scope} could not be counted: {error}");
        }
    }
}
