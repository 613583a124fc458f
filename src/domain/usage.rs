//! What model calls count and cost: `Usage` (summed over a run's calls), a model's
//! `ModelPricing`, and the `Cost` it gives.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub total_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<u64>,
    /// What these tokens cost, when the model declares prices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<Cost>,
}

/// An amount of money, in the currency a model's prices are given in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    pub amount: f64,
    pub currency: String,
}

/// What a model costs per million tokens (`[[providers.*.models]] pricing`). Cached input
/// tokens cost `cached_input_per_million` when it is given, the input price otherwise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelPricing {
    #[serde(alias = "input_per_million")]
    pub input_per_million: f64,
    #[serde(alias = "output_per_million")]
    pub output_per_million: f64,
    #[serde(default, alias = "cached_input_per_million", skip_serializing_if = "Option::is_none")]
    pub cached_input_per_million: Option<f64>,
    #[serde(default = "default_currency")]
    pub currency: String,
}

fn default_currency() -> String {
    "USD".into()
}

impl ModelPricing {
    /// What `usage` costs at these prices.
    pub fn cost(&self, usage: &Usage) -> Cost {
        let cached = usage.cached_input_tokens.unwrap_or(0).min(usage.input_tokens);
        let fresh = usage.input_tokens - cached;
        let cached_price = self.cached_input_per_million.unwrap_or(self.input_per_million);
        let amount = (fresh as f64 * self.input_per_million
            + cached as f64 * cached_price
            + usage.output_tokens as f64 * self.output_per_million)
            / 1_000_000.0;
        Cost { amount, currency: self.currency.clone() }
    }
}

impl Usage {
    /// Adds another provider call's usage to this run's total.
    pub fn add(&mut self, other: &Usage) {
        fn sum(a: Option<u64>, b: Option<u64>) -> Option<u64> {
            match (a, b) {
                (None, None) => None,
                (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
            }
        }
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.total_tokens += other.total_tokens;
        self.cached_input_tokens = sum(self.cached_input_tokens, other.cached_input_tokens);
        self.reasoning_tokens = sum(self.reasoning_tokens, other.reasoning_tokens);
        self.cost = match (self.cost.take(), &other.cost) {
            (Some(mine), Some(theirs)) if mine.currency == theirs.currency => {
                Some(Cost { amount: mine.amount + theirs.amount, currency: mine.currency })
            }
            // Calls priced in different currencies are not summed into one.
            (Some(mine), Some(_)) => Some(mine),
            (mine, theirs) => mine.or_else(|| theirs.clone()),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_tokens_cost_their_own_price_and_costs_add_up_in_one_currency() {
        let pricing = ModelPricing {
            input_per_million: 2.0,
            output_per_million: 10.0,
            cached_input_per_million: Some(0.5),
            currency: "USD".into(),
        };
        let usage = Usage {
            input_tokens: 1_000_000,
            output_tokens: 100_000,
            total_tokens: 1_100_000,
            cached_input_tokens: Some(400_000),
            ..Usage::default()
        };
        // 600k fresh at 2.0, 400k cached at 0.5, 100k out at 10.0.
        assert_eq!(pricing.cost(&usage), Cost { amount: 1.2 + 0.2 + 1.0, currency: "USD".into() });
        let mut total = Usage { cost: Some(Cost { amount: 1.0, currency: "USD".into() }), ..Usage::default() };
        total.add(&Usage { cost: Some(Cost { amount: 0.5, currency: "USD".into() }), ..Usage::default() });
        total.add(&Usage { cost: Some(Cost { amount: 9.0, currency: "EUR".into() }), ..Usage::default() });
        assert_eq!(total.cost, Some(Cost { amount: 1.5, currency: "USD".into() }));
        let mut unpriced = Usage::default();
        unpriced.add(&Usage { cost: Some(Cost { amount: 0.25, currency: "USD".into() }), ..Usage::default() });
        assert_eq!(unpriced.cost.unwrap().amount, 0.25);
    }
}
