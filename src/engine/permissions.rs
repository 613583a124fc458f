//! Permission decisions on a run's tool calls, the audit log they go to, and the rules people
//! add (through the API, or by remembering an approval). The rule language is `crate::policy`.
//!
//! Every decision is audited before its effect: an entry is queued on the store ahead of the
//! call's start mark (or its result), and batches commit in order, so no call runs, and no
//! denial is answered, without its entry being durable first.

use serde_json::{Map, Value};

use super::run::Run;
use super::{EngineError, Shared};
use crate::domain::{new_id, RuleView, ToolCall};
use crate::policy::{self, AuditDecision, AuditEntry, Call, DecidedBy, Outcome, PathJudge, Rule, Source, Verdict};
use crate::store::{AuditQuery, PolicyWrite, WriteOp};
use crate::tools::workspace::Workspace;

/// Stored rules (added and remembered) that hold for one call at most.
pub const MAX_STORED_RULES: usize = 1_000;

/// What a budget's audit entries name as their tool: the model call it refused.
pub const BUDGET_SUBJECT: &str = "(model call)";

/// A call's verdict and what judging the paths it reaches needs.
pub(crate) struct Judged {
    pub verdict: Verdict,
    /// Every rule that holds for the call; `None` when they could not be read.
    rules: Option<Vec<policy::Compiled>>,
    /// The ask rules that apply to the call itself, for a walking tool's call that asks.
    asking: Vec<String>,
    /// Whether the rules read the call whole (`policy::Call::read_whole`).
    pub read_whole: bool,
}

/// How far a remembered decision reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remember {
    /// This session's later calls.
    Session,
    /// Every session of the tenant.
    Tenant,
}

/// A rule a person asks for, before it has an id.
#[derive(Debug, Clone)]
pub struct NewRule {
    pub tool: String,
    pub pattern: Option<String>,
    pub outcome: Outcome,
    /// `Some`: the session's only.
    pub session_id: Option<String>,
    pub created_by: Option<String>,
}

impl Shared {
    /// The rules that hold for a call of `tenant`'s session, compiled; a stored rule that cannot
    /// be read or compiled is an error (the caller denies).
    fn rules_for(&self, tenant: &str, session_id: &str) -> Result<Vec<policy::Compiled>, EngineError> {
        let stored = self.store.readers().rules_of(tenant, Some(session_id))?;
        self.config.rulebook.rules_for(tenant, stored).map_err(|e| EngineError::InvalidRule(e.to_string()))
    }

    /// The verdict on `call`. Fails closed: when the rules cannot be read, the call is denied.
    pub(crate) fn judge(
        &self,
        tenant: &str,
        session_id: &str,
        call: &ToolCall,
        workspace: Option<&Workspace>,
    ) -> Verdict {
        self.judge_call(tenant, session_id, call, workspace).verdict
    }

    /// The verdict on `call`, with the rules it was judged by, for the paths a walking tool
    /// reaches (`path_judge`).
    pub(crate) fn judge_call(
        &self,
        tenant: &str,
        session_id: &str,
        call: &ToolCall,
        workspace: Option<&Workspace>,
    ) -> Judged {
        let Some(permission) = self.tools.permission(&call.name) else {
            // Nobody registered it: it runs nothing and is answered so.
            let verdict = Verdict { outcome: Outcome::Allow, rule: None };
            return Judged { verdict, rules: Some(Vec::new()), asking: Vec::new(), read_whole: true };
        };
        let content = self.tools.content_arguments(&call.name);
        let read = Call::read(&call.name, &call.arguments, self.tools.matches_on(&call.name), content, workspace);
        let read_whole = read.read_whole();
        let Some(rules) = self.rules_or_deny(tenant, session_id, read.tool) else {
            let verdict = Verdict { outcome: Outcome::Deny, rule: None };
            return Judged { verdict, rules: None, asking: Vec::new(), read_whole };
        };
        let verdict = policy::decide(&read, permission.outcome(), &rules);
        let asking = match verdict.outcome == Outcome::Ask && self.tools.walks(&call.name) {
            true => policy::asking_rules(&read, &rules),
            false => Vec::new(),
        };
        Judged { verdict, rules: Some(rules), asking, read_whole }
    }

    /// The verdict on a call read for the rules, whose tool's own permission is `default`: what
    /// a door asks for a call it runs itself (BAE's MCP, sandbox and subagent calls). Fails
    /// closed: when the rules cannot be read, the call is denied.
    pub(crate) fn judge_read(&self, tenant: &str, session_id: &str, read: &Call<'_>, default: Outcome) -> Verdict {
        match self.rules_or_deny(tenant, session_id, read.tool) {
            Some(rules) => policy::decide(read, default, &rules),
            None => Verdict { outcome: Outcome::Deny, rule: None },
        }
    }

    /// The rules for a call of `tool`; `None` (the caller denies) when they cannot be read.
    fn rules_or_deny(&self, tenant: &str, session_id: &str, tool: &str) -> Option<Vec<policy::Compiled>> {
        match self.rules_for(tenant, session_id) {
            Ok(rules) => Some(rules),
            Err(error) => {
                log::error!("the permission rules of session {session_id} cannot be read ({error}); denying {tool}");
                None
            }
        }
    }

    /// The judge of the paths a call of a walking tool reaches, from the rules the call was
    /// judged by; `answered`: a person approved the call itself, so the ask rules that asked
    /// about its own path are not asked again for what is under it. Other tools get a judge
    /// that withholds nothing.
    pub(crate) fn path_judge(
        &self,
        call: &ToolCall,
        judged: &Judged,
        answered: bool,
        workspace: Option<&Workspace>,
    ) -> PathJudge {
        if !self.tools.walks(&call.name) {
            return PathJudge::open();
        }
        match &judged.rules {
            Some(rules) => {
                let answered: &[String] = if answered { &judged.asking } else { &[] };
                PathJudge::new(&call.name, rules, answered, workspace.cloned())
            }
            None => PathJudge::closed(),
        }
    }

    /// A call's arguments as the audit log keeps them: its tool's content arguments as their
    /// size and SHA-256 (`policy::audited_arguments`). Every audit entry's `arguments` and
    /// `edited` are built with this.
    pub(crate) fn audited_arguments(&self, tool: &str, arguments: &Map<String, Value>) -> String {
        policy::audited_arguments(arguments, self.tools.content_arguments(tool))
    }

    /// Queues `entry` on the store; the next batch queued after it commits after it. Entries
    /// past the retention go in the same batch (a range delete on `audit_by_time`, most often
    /// of nothing).
    pub(crate) fn audit(&self, entry: AuditEntry) {
        if let Err(error) = self.store.write_detached(self.audit_ops(entry)) {
            log::error!("an audit entry could not be queued: {error}");
        }
    }

    /// `audit`, returning once the entry is durable: for a decision answered to a client
    /// straight away (a person's, a budget's refusal), with no write of its own after it.
    pub(crate) fn audit_now(&self, entry: AuditEntry) {
        if let Err(error) = self.store.write(self.audit_ops(entry)) {
            log::error!("an audit entry could not be written: {error}");
        }
    }

    fn audit_ops(&self, entry: AuditEntry) -> Vec<WriteOp> {
        let keep_ms = self.config.audit_retention.as_millis().min(i64::MAX as u128) as i64;
        let before = crate::time::rfc3339_from_millis(crate::time::now_millis().saturating_sub(keep_ms));
        vec![WriteOp::Policy(PolicyWrite::TrimAudit { before }), WriteOp::Policy(PolicyWrite::Audit(vec![entry]))]
    }

    /// Records a budget's refusal of a new run, or its stop of a running one, as a decision
    /// on the model's next call.
    pub(crate) fn audit_budget(&self, tenant: &str, session_id: &str, run_id: Option<&str>, reason: &str) {
        self.audit_now(AuditEntry {
            session_id: Some(session_id.to_string()),
            run_id: run_id.map(str::to_string),
            note: Some(policy::truncated(reason)),
            ..AuditEntry::now(tenant, BUDGET_SUBJECT, AuditDecision::Denied, DecidedBy::Budget)
        });
    }

    /// Refuses a rule past `MAX_STORED_RULES` of the tenant and the session together: every
    /// call compiles the rules that hold for it.
    fn room_for_a_rule(&self, tenant: &str, session_id: Option<&str>) -> Result<(), EngineError> {
        if self.store.readers().rules_of(tenant, session_id)?.len() >= MAX_STORED_RULES {
            return Err(EngineError::InvalidRule(format!(
                "a tenant and a session hold at most {MAX_STORED_RULES} stored rules; revoke some first"
            )));
        }
        Ok(())
    }

    /// A person's new rule, checked (its patterns compile) and stored.
    fn insert_rule(&self, tenant: &str, rule: NewRule, source: Source) -> Result<Rule, EngineError> {
        self.room_for_a_rule(tenant, rule.session_id.as_deref())?;
        let rule = Rule {
            id: new_id("rule"),
            tenant: Some(tenant.to_string()),
            session_id: rule.session_id,
            tool: rule.tool,
            pattern: rule.pattern,
            arguments: None,
            outcome: rule.outcome,
            source,
            created_at: crate::time::now_rfc3339(),
            created_by: rule.created_by,
        };
        policy::Compiled::new(rule.clone(), self.config.rulebook.matching())
            .map_err(|e| EngineError::InvalidRule(e.to_string()))?;
        self.store.write(vec![WriteOp::Policy(PolicyWrite::InsertRule(rule.clone()))])?;
        Ok(rule)
    }
}

impl super::Engine {
    /// The rules that hold for `tenant`'s sessions: the config's (server and tenant), then
    /// those added through the API or remembered for the tenant.
    pub fn rules(&self, tenant: &str) -> Result<Vec<RuleView>, EngineError> {
        let shared = &self.shared;
        let mut views: Vec<RuleView> = shared.config.rulebook.config_rules(tenant).map(|r| r.view()).collect();
        views.extend(shared.store.readers().rules_of(tenant, None)?.iter().map(Rule::view));
        Ok(views)
    }

    /// A session's own rules (added for it, or remembered for it).
    pub fn session_rules(&self, tenant: &str, session_id: &str) -> Result<Vec<RuleView>, EngineError> {
        self.shared.owned_session(tenant, session_id)?;
        Ok(self.shared.store.readers().session_rules(session_id)?.iter().map(Rule::view).collect())
    }

    /// Adds a rule for `tenant`, or for one of its sessions.
    pub fn add_rule(&self, tenant: &str, rule: NewRule) -> Result<RuleView, EngineError> {
        if let Some(session_id) = &rule.session_id {
            self.shared.owned_session(tenant, session_id)?;
        }
        Ok(self.shared.insert_rule(tenant, rule, Source::Api)?.view())
    }

    /// Revokes one of `tenant`'s stored rules; the config's are not the API's to revoke.
    pub fn delete_rule(&self, tenant: &str, id: &str, session_id: Option<&str>) -> Result<(), EngineError> {
        if id.starts_with("config:") {
            return Err(EngineError::ConfigRule);
        }
        let readers = self.shared.store.readers();
        let exists = match session_id {
            Some(session_id) => {
                self.shared.owned_session(tenant, session_id)?;
                readers.session_rules(session_id)?.iter().any(|r| r.id == id)
            }
            None => readers.rules_of(tenant, None)?.iter().any(|r| r.id == id),
        };
        if !exists {
            return Err(EngineError::RuleNotFound);
        }
        let delete = PolicyWrite::DeleteRule { tenant: tenant.to_string(), id: id.to_string() };
        match self.shared.store.write(vec![WriteOp::Policy(delete)]) {
            Err(crate::store::StoreError::NotFound) => Err(EngineError::RuleNotFound),
            other => Ok(other?),
        }
    }

    /// Audit entries after `after` (and at or after `since`), of one tenant or all.
    pub fn audit(&self, query: &AuditQuery<'_>, limit: usize) -> Result<Vec<AuditEntry>, EngineError> {
        Ok(self.shared.store.readers().audit(query, limit)?)
    }
}

impl Run {
    /// An audit entry for `call` of this run: `verdict` is the rules' (`None`: a person
    /// decided). Its `arguments` keep the tool's content arguments as digests; the caller fills
    /// in `actor`, `note` and `edited` (with `Shared::audited_arguments`) when it has them.
    pub(crate) fn audit_entry(
        &self,
        call: &ToolCall,
        decision: AuditDecision,
        verdict: Option<&Verdict>,
    ) -> AuditEntry {
        let (decided_by, rule_id) = match verdict {
            Some(Verdict { rule: Some(rule), .. }) => (DecidedBy::Rule, Some(rule.id.clone())),
            Some(Verdict { rule: None, .. }) => (DecidedBy::Default, None),
            None => (DecidedBy::Person, None),
        };
        AuditEntry {
            session_id: Some(self.session_id.clone()),
            run_id: Some(self.run_id.clone()),
            call_id: Some(call.id.clone()),
            rule_id,
            arguments: self.shared.audited_arguments(&call.name, &call.arguments),
            ..AuditEntry::now(&self.tenant, &call.name, decision, decided_by)
        }
    }

    /// The rule a person's `remember` adds: their pattern, or this exact call.
    pub(super) fn remember(
        &self,
        call: &ToolCall,
        workspace: Option<&Workspace>,
        scope: Remember,
        pattern: Option<String>,
        outcome: Outcome,
        actor: Option<String>,
    ) -> Result<Rule, EngineError> {
        let shared = &self.shared;
        let content = shared.tools.content_arguments(&call.name);
        let read = Call::read(&call.name, &call.arguments, shared.tools.matches_on(&call.name), content, workspace);
        let exact = match &pattern {
            Some(_) => None,
            None => read.exact_pattern(),
        };
        // The exact call, as `Call::read` writes it: content as its digest.
        let arguments = match (&pattern, &exact) {
            (None, None) => Some(read.canonical.clone()),
            _ => None,
        };
        let rule = Rule {
            id: new_id("rule"),
            tenant: Some(self.tenant.to_string()),
            session_id: (scope == Remember::Session).then(|| self.session_id.clone()),
            tool: globset::escape(&call.name),
            pattern: pattern.or(exact),
            arguments,
            outcome,
            source: Source::Remembered,
            created_at: crate::time::now_rfc3339(),
            created_by: actor,
        };
        policy::Compiled::new(rule.clone(), shared.config.rulebook.matching())
            .map_err(|e| EngineError::InvalidRule(e.to_string()))?;
        shared.room_for_a_rule(&self.tenant, Some(&self.session_id))?;
        shared.store.write(vec![WriteOp::Policy(PolicyWrite::InsertRule(rule.clone()))])?;
        Ok(rule)
    }
}

/// Whether `arguments` fit the tool's input schema; `EngineError::InvalidEdit` says why not.
pub(crate) fn check_arguments(schema: &Value, arguments: &Map<String, Value>) -> Result<(), EngineError> {
    let validator = jsonschema::validator_for(schema)
        .map_err(|e| EngineError::InvalidEdit(format!("the tool's schema cannot be used: {e}")))?;
    let instance = Value::Object(arguments.clone());
    let errors: Vec<String> = validator.iter_errors(&instance).take(5).map(|e| e.to_string()).collect();
    match errors.is_empty() {
        true => Ok(()),
        false => Err(EngineError::InvalidEdit(errors.join("; "))),
    }
}

/// What the model is told of a call the rules denied.
pub(crate) fn denied_text(verdict: &Verdict) -> String {
    match &verdict.rule {
        Some(rule) => format!(
            "This tool call is denied by a permission rule ({}); it did not run. Do not retry it in another form.",
            rule.id
        ),
        None => "This tool is disabled on this server; the call did not run.".to_string(),
    }
}

/// Shares a verdict's rule for an event.
pub(super) fn note_of(verdict: &Verdict) -> Box<crate::domain::PermissionNote> {
    Box::new(verdict.note())
}
