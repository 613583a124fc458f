//! Budgets and rate limits: what a tenant (Kestrel) or a profile (BAE) may spend, and the
//! arithmetic of checking it. The counters live in the store (`usage`); the running state
//! (token buckets, runs in flight) in `engine::meter`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Limits; an absent field is no limit. `[agent.budget]` is the server's default, a token's
/// `budget` and a BAE profile's `budget` replace it field by field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Budget {
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "whole")]
    pub tokens_per_day: Option<u64>,
    /// In the models' price currency (`pricing`); calls of unpriced models cost nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_per_day: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_per_month: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "whole")]
    pub max_concurrent_runs: Option<u32>,
    /// Requests per second, as a token bucket holding a second's worth (at least one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests_per_second: Option<f64>,
}

/// A budget that cannot be used as given: why, for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetError(pub String);

impl std::fmt::Display for BudgetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BudgetError {}

/// The largest count every JSON reader keeps exactly (2^53 - 1).
const MAX_EXACT: u64 = (1 << 53) - 1;

/// A count written as any JSON number with no fraction (`4178.0` is 4178, as JSON Schema
/// reads it), or null.
fn whole<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: TryFrom<u64>,
{
    use serde::de::Error;
    let Some(number) = Option::<serde_json::Number>::deserialize(deserializer)? else { return Ok(None) };
    let whole = match (number.as_u64(), number.as_f64()) {
        (Some(n), _) => Some(n),
        (None, Some(f)) if f >= 0.0 && f.fract() == 0.0 && f < u64::MAX as f64 => Some(f as u64),
        _ => None,
    };
    let whole =
        whole.ok_or_else(|| D::Error::custom(format!("{number} is not a count (a whole number, 0 or more)")))?;
    T::try_from(whole).map(Some).map_err(|_| D::Error::custom(format!("{number} is too large")))
}

impl Budget {
    /// This budget's limits, and `base`'s where this one sets none.
    pub fn over(&self, base: &Budget) -> Budget {
        Budget {
            tokens_per_day: self.tokens_per_day.or(base.tokens_per_day),
            cost_per_day: self.cost_per_day.or(base.cost_per_day),
            cost_per_month: self.cost_per_month.or(base.cost_per_month),
            max_concurrent_runs: self.max_concurrent_runs.or(base.max_concurrent_runs),
            requests_per_second: self.requests_per_second.or(base.requests_per_second),
        }
    }

    /// Why the budget cannot be used as given (a negative or non-finite amount, a count past
    /// what JSON carries exactly).
    pub fn check(&self) -> Result<(), BudgetError> {
        if self.tokens_per_day.is_some_and(|t| t > MAX_EXACT) {
            return Err(BudgetError(format!("tokens_per_day is at most {MAX_EXACT}")));
        }
        let amounts = [("cost_per_day", self.cost_per_day), ("cost_per_month", self.cost_per_month)];
        for (name, amount) in amounts.into_iter().chain([("requests_per_second", self.requests_per_second)]) {
            if amount.is_some_and(|a| !a.is_finite() || a < 0.0) {
                return Err(BudgetError(format!("{name} must be a finite number, 0 or more")));
            }
        }
        Ok(())
    }

    /// Whether it limits tokens or cost (then what was spent must be read).
    pub fn limits_spending(&self) -> bool {
        self.tokens_per_day.is_some() || self.cost_per_day.is_some() || self.cost_per_month.is_some()
    }

    /// Why a new model call would pass the budget, given what was spent; `None`: it may go.
    pub fn exceeded(&self, spent: &Spent) -> Option<String> {
        if let Some(limit) = self.tokens_per_day.filter(|limit| spent.day_tokens >= *limit) {
            return Some(format!("{} of {limit} tokens used today", spent.day_tokens));
        }
        if let Some(limit) = self.cost_per_day.filter(|limit| spent.day_cost >= *limit) {
            return Some(format!("{:.4} of {limit} spent today", spent.day_cost));
        }
        if let Some(limit) = self.cost_per_month.filter(|limit| spent.month_cost >= *limit) {
            return Some(format!("{:.4} of {limit} spent this month", spent.month_cost));
        }
        None
    }
}

/// What model calls in flight reserved, or what one call may use at most: its tokens and
/// their cost (`engine/meter.rs`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Reserve {
    pub calls: u32,
    pub tokens: u64,
    pub cost: f64,
}

impl Reserve {
    pub fn add(&mut self, other: &Reserve) {
        self.calls += other.calls;
        self.tokens = self.tokens.saturating_add(other.tokens);
        self.cost += other.cost;
    }

    pub fn remove(&mut self, other: &Reserve) {
        self.calls = self.calls.saturating_sub(other.calls);
        self.tokens = self.tokens.saturating_sub(other.tokens);
        self.cost = (self.cost - other.cost).max(0.0);
    }
}

/// Whether a model call may start now.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    Go,
    /// Not until a call in flight settles: with what they reserved it might pass a limit.
    Wait,
    /// The budget is spent: why.
    Spent(String),
}

impl Budget {
    /// Whether a model call that may use `call` may start, given what was spent and what the
    /// calls in flight reserved. A spent budget refuses it. With no call in flight it goes
    /// (it is the one call that may pass the limit). Alongside calls in flight it goes only
    /// if every limit holds with all of them and it using the most they may; otherwise it
    /// waits for one of them to settle. So spending passes a limit by at most one call's
    /// usage, as long as no call uses more than it reserved.
    pub fn admit_call(&self, spent: &Spent, in_flight: &Reserve, call: &Reserve) -> Admission {
        if let Some(reason) = self.exceeded(spent) {
            return Admission::Spent(reason);
        }
        if in_flight.calls == 0 {
            return Admission::Go;
        }
        let tokens = spent.day_tokens.saturating_add(in_flight.tokens).saturating_add(call.tokens);
        let reserved_cost = in_flight.cost + call.cost;
        let fits = self.tokens_per_day.is_none_or(|limit| tokens <= limit)
            && self.cost_per_day.is_none_or(|limit| spent.day_cost + reserved_cost <= limit)
            && self.cost_per_month.is_none_or(|limit| spent.month_cost + reserved_cost <= limit);
        match fits {
            true => Admission::Go,
            false => Admission::Wait,
        }
    }
}

/// What a scope spent in the current day and month (UTC).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Spent {
    pub day: String,
    pub month: String,
    pub day_tokens: u64,
    pub day_cost: f64,
    pub month_tokens: u64,
    pub month_cost: f64,
}

impl Spent {
    /// This, and `tokens` and `cost` more in the day and the month.
    pub fn plus(&self, tokens: u64, cost: f64) -> Spent {
        Spent {
            day_tokens: self.day_tokens.saturating_add(tokens),
            month_tokens: self.month_tokens.saturating_add(tokens),
            day_cost: self.day_cost + cost,
            month_cost: self.month_cost + cost,
            ..self.clone()
        }
    }
}

/// The day and month periods (`d:2026-12-01`, `m:2026-12`) of an RFC 3339 time.
pub fn periods(at: &str) -> (String, String) {
    let day = at.get(..10).unwrap_or(at);
    let month = at.get(..7).unwrap_or(at);
    (format!("d:{day}"), format!("m:{month}"))
}

/// A token bucket: `rate` tokens a second, holding at most `max(rate, 1)`.
#[derive(Debug, Clone)]
pub struct Bucket {
    tokens: f64,
    /// When `tokens` was last brought up to date, in seconds on the caller's clock.
    at: f64,
}

impl Bucket {
    pub fn full(rate: f64, now: f64) -> Bucket {
        Bucket { tokens: rate.max(1.0), at: now }
    }

    /// Takes a token at `now` (seconds), or says how long until one is there.
    pub fn take(&mut self, rate: f64, now: f64) -> Result<(), Duration> {
        let capacity = rate.max(1.0);
        self.tokens = (self.tokens + (now - self.at).max(0.0) * rate).min(capacity);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        if rate <= 0.0 {
            return Err(Duration::from_secs(3600));
        }
        Err(Duration::from_secs_f64(((1.0 - self.tokens) / rate).min(3600.0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_lets_a_second_s_worth_through_then_refills_at_its_rate() {
        let mut bucket = Bucket::full(2.0, 0.0);
        assert!(bucket.take(2.0, 0.0).is_ok());
        assert!(bucket.take(2.0, 0.0).is_ok());
        let wait = bucket.take(2.0, 0.0).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        assert!(bucket.take(2.0, 0.5).is_ok(), "half a second later, one more");
        let mut slow = Bucket::full(0.5, 0.0);
        assert!(slow.take(0.5, 0.0).is_ok());
        assert_eq!(slow.take(0.5, 0.0).unwrap_err(), Duration::from_secs(2));
    }

    #[test]
    fn a_budget_is_passed_at_its_limit_and_falls_back_field_by_field() {
        let base = Budget { tokens_per_day: Some(100), cost_per_month: Some(5.0), ..Budget::default() };
        let own = Budget { tokens_per_day: Some(10), ..Budget::default() }.over(&base);
        assert_eq!((own.tokens_per_day, own.cost_per_month), (Some(10), Some(5.0)));
        let mut spent = Spent { day_tokens: 9, ..Spent::default() };
        assert_eq!(own.exceeded(&spent), None);
        spent.day_tokens = 10;
        assert!(own.exceeded(&spent).unwrap().contains("10 of 10 tokens"));
        spent = Spent { month_cost: 5.0, ..Spent::default() };
        assert!(own.exceeded(&spent).unwrap().contains("this month"));
        assert!(Budget { cost_per_day: Some(-1.0), ..Budget::default() }.check().is_err());
        assert!(Budget { requests_per_second: Some(f64::NAN), ..Budget::default() }.check().is_err());
        assert!(Budget { tokens_per_day: Some(1 << 53), ..Budget::default() }.check().is_err());
        assert_eq!(periods("2026-12-01T10:00:00.000Z"), ("d:2026-12-01".into(), "m:2026-12".into()));
    }

    /// Issue 35, finding 6: calls in flight count against what is left.
    #[test]
    fn a_call_alongside_others_goes_only_if_all_of_them_fit_and_alone_only_if_anything_is_left() {
        let budget = Budget { tokens_per_day: Some(100), cost_per_month: Some(1.0), ..Budget::default() };
        let spent = Spent { day_tokens: 40, month_cost: 0.5, ..Spent::default() };
        let call = Reserve { calls: 1, tokens: 30, cost: 0.1 };
        let none = Reserve::default();
        assert_eq!(budget.admit_call(&spent, &none, &Reserve { tokens: 10_000, ..call }), Admission::Go, "alone");
        let one = Reserve { calls: 1, tokens: 30, cost: 0.1 };
        assert_eq!(budget.admit_call(&spent, &one, &call), Admission::Go, "40 + 30 + 30 <= 100");
        let two = Reserve { calls: 2, tokens: 60, cost: 0.2 };
        assert_eq!(budget.admit_call(&spent, &two, &call), Admission::Wait, "40 + 60 + 30 > 100");
        let costly = Reserve { calls: 1, tokens: 0, cost: 0.45 };
        assert_eq!(budget.admit_call(&spent, &costly, &call), Admission::Wait, "0.5 + 0.45 + 0.1 > 1.0");
        let spent_all = spent.plus(60, 0.0);
        assert_eq!((spent_all.day_tokens, spent_all.month_tokens), (100, 60));
        assert!(matches!(budget.admit_call(&spent_all, &none, &call), Admission::Spent(_)));
        assert!(matches!(budget.admit_call(&spent_all, &one, &call), Admission::Spent(_)));
        let mut in_flight = Reserve::default();
        in_flight.add(&call);
        in_flight.add(&call);
        in_flight.remove(&call);
        assert_eq!(in_flight, call);
        assert_eq!(Budget::default().admit_call(&spent, &two, &call), Admission::Go, "no limit, no wait");
    }

    #[test]
    fn counts_read_as_json_schema_reads_integers() {
        let read = |text: &str| serde_json::from_str::<Budget>(text);
        assert_eq!(read(r#"{"tokens_per_day": 4178.0}"#).unwrap().tokens_per_day, Some(4178));
        assert_eq!(read(r#"{"tokens_per_day": null, "max_concurrent_runs": 2}"#).unwrap().max_concurrent_runs, Some(2));
        for bad in [r#"{"tokens_per_day": 1.5}"#, r#"{"tokens_per_day": -1}"#, r#"{"max_concurrent_runs": 5000000000}"#]
        {
            assert!(read(bad).is_err(), "{bad}");
        }
        let toml: Budget = toml::from_str("tokens_per_day = 10\nrequests_per_second = 2").unwrap();
        assert_eq!((toml.tokens_per_day, toml.requests_per_second), (Some(10), Some(2.0)));
    }
}
