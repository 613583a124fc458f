//! The audit log's entries: one per permission decision.

use serde::Serialize;

/// Characters of a call's arguments an entry keeps; the rest is cut with a marker.
pub const ARGUMENTS_CHARS: usize = 2_000;

/// What was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    /// Ran without asking (a rule or the tool's permission allowed it).
    Allowed,
    /// Never ran (a rule or the tool's permission denied it, or an edit was refused).
    Denied,
    /// Waits for a person.
    Asked,
    /// A person approved it.
    Approved,
    /// A person said no.
    Rejected,
    /// A person approved it with changed arguments.
    Edited,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allowed => "allowed",
            Decision::Denied => "denied",
            Decision::Asked => "asked",
            Decision::Approved => "approved",
            Decision::Rejected => "rejected",
            Decision::Edited => "edited",
        }
    }
}

/// Who decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DecidedBy {
    /// A rule (`rule_id` says which).
    Rule,
    /// No rule applied: the tool's own permission.
    Default,
    /// A person, through an approval.
    Person,
    /// A budget or rate limit.
    Budget,
}

impl DecidedBy {
    pub fn as_str(self) -> &'static str {
        match self {
            DecidedBy::Rule => "rule",
            DecidedBy::Default => "default",
            DecidedBy::Person => "person",
            DecidedBy::Budget => "budget",
        }
    }
}

/// One decision. Arguments are kept as the tool received them, cut to `ARGUMENTS_CHARS`;
/// nothing a tool read or wrote is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEntry {
    /// Given by the store; 0 before.
    pub seq: u64,
    pub at: String,
    pub tenant: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    pub tool: String,
    pub decision: String,
    pub decided_by: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule_id: Option<String>,
    /// The token (its name) or BAE key that decided, for a person's decision.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub arguments: String,
    /// The arguments a person's edit gave the call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub edited: Option<String>,
}

impl AuditEntry {
    /// An entry made now for `tenant`'s `tool` (no session, run, call, rule, actor, note or
    /// arguments: the caller fills in what it knows).
    pub fn now(tenant: &str, tool: &str, decision: Decision, decided_by: DecidedBy) -> AuditEntry {
        AuditEntry {
            seq: 0,
            at: crate::time::now_rfc3339(),
            tenant: tenant.to_string(),
            session_id: None,
            run_id: None,
            call_id: None,
            tool: tool.to_string(),
            decision: decision.as_str().to_string(),
            decided_by: decided_by.as_str().to_string(),
            rule_id: None,
            actor: None,
            note: None,
            arguments: "{}".to_string(),
            edited: None,
        }
    }
}

/// `text` cut to `ARGUMENTS_CHARS` characters, saying so.
pub fn truncated(text: &str) -> String {
    match text.char_indices().nth(ARGUMENTS_CHARS) {
        None => text.to_string(),
        Some((cut, _)) => format!("{}… ({} characters in all)", &text[..cut], text.chars().count()),
    }
}
