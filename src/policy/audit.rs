//! The audit log's entries: one per permission decision, and the form a call's arguments are
//! kept in: as given, but for the tool's content arguments (what a file would hold), which are
//! kept as their size and SHA-256 only.

use serde::Serialize;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

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

/// One decision. Arguments are kept as the tool received them, their content arguments as
/// digests (`audited_arguments`), cut to `ARGUMENTS_CHARS`; nothing a tool read or wrote is.
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

/// `arguments` with each of `content` (the tool's content arguments, `Tool::content_arguments`)
/// replaced by `{"bytes": <UTF-8 length>, "sha256": "<hex>"}` of its text (of its JSON, if it
/// is not a string). Whoever holds the text can check it against the digest; nobody can read
/// it back from the digest.
pub fn digested_arguments(arguments: &Map<String, Value>, content: &[&str]) -> Map<String, Value> {
    let mut digested = arguments.clone();
    for name in content {
        if let Some(value) = digested.get_mut(*name) {
            let text = match &mut *value {
                Value::String(text) => std::mem::take(text),
                other => other.to_string(),
            };
            *value = json!({ "bytes": text.len(), "sha256": format!("{:x}", Sha256::digest(text.as_bytes())) });
        }
    }
    digested
}

/// A call's arguments as the audit log keeps them: digested (`digested_arguments`), in
/// canonical form (keys in order, compact), cut to `ARGUMENTS_CHARS`.
pub fn audited_arguments(arguments: &Map<String, Value>, content: &[&str]) -> String {
    truncated(&super::canonical_arguments(&digested_arguments(arguments, content)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_arguments_are_kept_as_size_and_digest_and_the_rest_as_given() {
        let arguments = json!({ "path": "a.txt", "content": "hunter2", "count": 3, "blob": [1, 2] });
        let kept = audited_arguments(arguments.as_object().unwrap(), &["content", "blob", "absent"]);
        let kept: Value = serde_json::from_str(&kept).unwrap();
        let hunter2 = "f52fbd32b2b3b86ff88ef6c490628285f482af15ddcb29541f94bcf526a3f6c7";
        assert_eq!(kept["content"], json!({ "bytes": 7, "sha256": hunter2 }));
        assert_eq!(kept["blob"]["bytes"], 5, "a value that is not text: its JSON");
        assert_eq!((kept["path"].as_str(), kept["count"].as_u64()), (Some("a.txt"), Some(3)));
        assert!(kept.get("absent").is_none());
        assert_eq!(
            audited_arguments(arguments.as_object().unwrap(), &[]),
            super::super::canonical_arguments(arguments.as_object().unwrap())
        );
    }
}
