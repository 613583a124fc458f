//! The config file's rules, compiled once at start, and what the engine asks of them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{Compiled, Matching, Rule, RuleError, RuleSpec, Source};

/// Stored rules kept compiled; past this many the cache starts over.
const COMPILED_CACHE: usize = 100_000;

/// The server's rules (`[[agent.rules]]`) and each tenant's (`rules` under `auth.tokens[]`),
/// and stored rules once compiled, by id (a stored rule never changes: it is added or
/// deleted), so a call under a thousand rules does not compile a thousand globs.
#[derive(Debug, Clone, Default)]
pub struct Rulebook {
    matching: Matching,
    server: Vec<Compiled>,
    tenants: HashMap<String, Vec<Compiled>>,
    compiled: Arc<Mutex<HashMap<String, Compiled>>>,
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
        Ok(Rulebook { matching, server: compile(None, server)?, tenants: by_tenant, compiled: Arc::default() })
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
        let mut compiled = self.compiled.lock().unwrap_or_else(|e| e.into_inner());
        if compiled.len() > COMPILED_CACHE {
            compiled.clear();
        }
        for rule in stored {
            // The id names one rule for its whole life; the check guards against a row that
            // was replaced under the same id all the same.
            match compiled.get(&rule.id).filter(|known| *known.rule == rule) {
                Some(known) => rules.push(known.clone()),
                None => {
                    let fresh = Compiled::new(rule, self.matching)?;
                    compiled.insert(fresh.rule.id.clone(), fresh.clone());
                    rules.push(fresh);
                }
            }
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
