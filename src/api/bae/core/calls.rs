//! The permission step of a BAE turn's server-run calls: an MCP tool, a sandbox tool's command,
//! a subagent launch or status. Each is judged as a Kestrel call is (`Shared::judge_read`, the
//! one rule engine) by the rules that hold for the `@bae` tenant: the server's
//! `[[agent.rules]]` and `[bae] rules`. The decision is audited before the call's start mark
//! commits, or before its denial is written, so no call runs and no denial reaches the model
//! before its entry is durable. BAE's protocol has nobody to ask, so an `ask` is a denial
//! that says so. A denied call never runs: its `tool.result`, in BAE's shape, tells the model
//! why.
//!
//! Rules name a call by what runs it, so that a client's choice of names cannot dodge them:
//! an MCP tool as Kestrel's sessions name that server's tool (`mcp__<server>__<tool>`), a
//! sandbox tool as `sandbox__<tool>` (its `match` reads `input.command`), a subagent tool as
//! `subagent__<tool>`. With no rule, `[agent.permissions]` under that name decides, else the
//! call is allowed, as BAE allows it.

use super::turn::BaeRun;
use crate::domain::{Dispatch, Event, ToolCall, ToolResult};
use crate::engine::permissions::denied_text;
use crate::policy::{AuditDecision, Call, MatchOn, Outcome, Verdict};

/// What the note of an `ask` turned into a denial says, in the audit log.
const NOBODY_TO_ASK: &str = "a BAE session has nobody to ask: an ask is a denial";

/// The name the rules judge a server-run call by; `None` for a call nothing runs (the client's,
/// or an MCP call no server takes, which is answered so).
pub(crate) fn rule_name(call: &ToolCall) -> Option<String> {
    match &call.dispatch {
        Dispatch::Mcp { server } if server.is_empty() => None,
        Dispatch::Mcp { server } => Some(crate::mcp::tool::plain_name(server, &call.name)),
        Dispatch::Sandbox => Some(format!("sandbox__{}", call.name)),
        Dispatch::Subagent => Some(format!("subagent__{}", call.name)),
        Dispatch::Client | Dispatch::Server => None,
    }
}

/// Which argument of a call the rules' `match` reads.
fn matches_on(dispatch: &Dispatch) -> MatchOn {
    match dispatch {
        Dispatch::Sandbox => MatchOn::Command("command"),
        Dispatch::Mcp { .. } | Dispatch::Subagent | Dispatch::Client | Dispatch::Server => MatchOn::Nothing,
    }
}

impl BaeRun<'_> {
    /// Judges `call` and audits the decision. `None`: it may run (its start mark comes next).
    /// `Some`: it was denied (or asked, which is denied here); the result has been published
    /// and is what the model is told.
    pub(crate) fn refusal(&self, call: &ToolCall) -> Option<ToolResult> {
        // A call nothing runs is not judged.
        let name = rule_name(call)?;
        let shared = &self.shared;
        let read = Call::read(&name, &call.arguments, matches_on(&call.dispatch), &[], None);
        let default = shared.tools.configured_permission(&name).map_or(Outcome::Allow, |p| p.outcome());
        let verdict = shared.judge_read(&self.tenant, &self.session_id, &read, default);
        let judged = ToolCall { name, ..call.clone() };
        let (decision, note) = match verdict.outcome {
            Outcome::Allow => (AuditDecision::Allowed, None),
            Outcome::Deny => (AuditDecision::Denied, None),
            Outcome::Ask => (AuditDecision::Denied, Some(NOBODY_TO_ASK)),
        };
        let mut entry = self.audit_entry(&judged, decision, Some(&verdict));
        entry.note = note.map(str::to_string);
        match verdict.outcome {
            // Queued ahead of the start mark, whose commit the call waits for: it commits first.
            Outcome::Allow => {
                shared.audit(entry);
                None
            }
            // The denial goes to the model in the turn's next round, which waits for no
            // commit of its own: the entry is made durable here.
            Outcome::Deny | Outcome::Ask => {
                shared.audit_now(entry);
                Some(self.refuse(call, &verdict))
            }
        }
    }

    /// Publishes a refused call's error result (it has no start mark to settle).
    fn refuse(&self, call: &ToolCall, verdict: &Verdict) -> ToolResult {
        let result = super::turn::error_result(call, refusal_text(verdict));
        let dispatch = call.dispatch.clone();
        self.publish(Event::ToolFinished { session_id: self.session_id.clone(), result: result.clone(), dispatch });
        result
    }
}

/// What the model is told of a call the rules refused.
fn refusal_text(verdict: &Verdict) -> String {
    match (verdict.outcome, &verdict.rule) {
        (Outcome::Ask, Some(rule)) => format!(
            "This tool call needs a person's approval (permission rule {}), and a BAE session has nobody to \
             ask; it was denied and did not run.",
            rule.id
        ),
        (Outcome::Ask, None) => "This tool needs a person's approval on this server, and a BAE session has \
             nobody to ask; it was denied and did not run."
            .to_string(),
        (Outcome::Deny | Outcome::Allow, _) => denied_text(verdict),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy;
    use serde_json::Map;

    fn call(name: &str, dispatch: Dispatch) -> ToolCall {
        ToolCall { id: "tu_1".into(), name: name.into(), arguments: Map::new(), dispatch }
    }

    /// Every kind of call a BAE turn makes, and the name the rules judge it by.
    #[test]
    fn each_server_run_call_is_judged_under_the_name_of_what_runs_it() {
        let table: [(&str, Dispatch, Option<&str>); 7] = [
            ("record", Dispatch::Mcp { server: "tiny".into() }, Some("mcp__tiny__record")),
            ("a.b/c", Dispatch::Mcp { server: "git hub".into() }, Some("mcp__git_hub__a_b_c")),
            ("echo", Dispatch::Mcp { server: String::new() }, None),
            ("shell", Dispatch::Sandbox, Some("sandbox__shell")),
            ("launch_subagent", Dispatch::Subagent, Some("subagent__launch_subagent")),
            ("lookup", Dispatch::Client, None),
            ("read_file", Dispatch::Server, None),
        ];
        for (name, dispatch, expected) in table {
            assert_eq!(rule_name(&call(name, dispatch.clone())).as_deref(), expected, "{name} by {dispatch:?}");
        }
        assert_eq!(matches_on(&Dispatch::Sandbox), MatchOn::Command("command"));
        assert_eq!(matches_on(&Dispatch::Mcp { server: "tiny".into() }), MatchOn::Nothing);
    }

    #[test]
    fn an_ask_is_refused_with_a_text_that_says_nobody_can_answer_it() {
        let rule = policy::Rule {
            id: "config:server:3".into(),
            tenant: None,
            session_id: None,
            tool: "mcp__*".into(),
            pattern: None,
            arguments: None,
            outcome: Outcome::Ask,
            source: policy::Source::Config,
            created_at: String::new(),
            created_by: None,
        };
        let by_rule = Verdict { outcome: Outcome::Ask, rule: Some(std::sync::Arc::new(rule.clone())) };
        let text = refusal_text(&by_rule);
        assert!(text.contains("config:server:3") && text.contains("nobody to ask"), "{text}");
        let by_default = refusal_text(&Verdict { outcome: Outcome::Ask, rule: None });
        assert!(by_default.contains("nobody to ask"), "{by_default}");
        let denied = refusal_text(&Verdict {
            outcome: Outcome::Deny,
            rule: Some(std::sync::Arc::new(policy::Rule { outcome: Outcome::Deny, ..rule })),
        });
        assert!(denied.contains("denied by a permission rule (config:server:3)"), "{denied}");
    }
}
