//! The config file's rules, compiled once at start, and what the engine asks of them.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Compiled, Matching, Rule, RuleError, RuleSpec, Source};

/// The server's rules (`[[agent.rules]]`) and each tenant's (`rules` under `auth.tokens[]`).
#[derive(Debug, Clone, Default)]
pub struct Rulebook {
    matching: Matching,
    server: Vec<Compiled>,
    tenants: HashMap<String, Vec<Compiled>>,
}

impl Rulebook {
    /// Compiles every config rule; the first that does not compile is the error.
    pub fn new(
        matching: Matching,
        server: &[RuleSpec],
        tenants: &[(String, Vec<RuleSpec>)],
    ) -> Result<Rulebook, RuleError> {
        let compile = |tenant: Option<&str>, specs: &[RuleSpec]| -> Result<Vec<Compiled>, RuleError> {
            let owner = tenant.unwrap_or("server");
            specs
                .iter()
                .enumerate()
                .map(|(index, spec)| Compiled::new(config_rule(tenant, owner, index, spec), matching))
                .collect()
        };
        let mut by_tenant: HashMap<String, Vec<Compiled>> = HashMap::new();
        for (tenant, specs) in tenants {
            let compiled = compile(Some(tenant), specs)?;
            by_tenant.entry(tenant.clone()).or_default().extend(compiled);
        }
        Ok(Rulebook { matching, server: compile(None, server)?, tenants: by_tenant })
    }

    pub fn matching(&self) -> Matching {
        self.matching
    }

    /// The config rules that hold for `tenant`: the server's, then its own.
    pub fn config_rules(&self, tenant: &str) -> impl Iterator<Item = &Arc<Rule>> {
        let own = self.tenants.get(tenant).map(Vec::as_slice).unwrap_or_default();
        self.server.iter().chain(own).map(|compiled| &compiled.rule)
    }

    /// Every rule that holds for a call of `tenant`: the config's and `stored` (the tenant's
    /// and the session's from the store).
    pub fn rules_for(&self, tenant: &str, stored: Vec<Rule>) -> Result<Vec<Compiled>, RuleError> {
        let own = self.tenants.get(tenant).map(Vec::as_slice).unwrap_or_default();
        let mut rules: Vec<Compiled> = self.server.iter().chain(own).cloned().collect();
        for rule in stored {
            rules.push(Compiled::new(rule, self.matching)?);
        }
        Ok(rules)
    }
}

/// A config rule as listed: its id says where it is written (`config:server:0` is the first
/// `[[agent.rules]]`, `config:acme:2` the third rule of tenant `acme`'s token).
fn config_rule(tenant: Option<&str>, owner: &str, index: usize, spec: &RuleSpec) -> Rule {
    Rule {
        id: format!("config:{owner}:{index}"),
        tenant: tenant.map(str::to_string),
        session_id: None,
        tool: spec.tool.clone(),
        pattern: spec.pattern.clone(),
        arguments: None,
        outcome: spec.outcome,
        source: Source::Config,
        created_at: String::new(),
        created_by: None,
    }
}
