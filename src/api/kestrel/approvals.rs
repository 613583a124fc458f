//! `POST /api/sessions/:id/approvals/:approvalId`: a person's answer to an `ask` tool call.
//!
//! Besides the protocol's `approved` and `note`, Kestrel reads `remember` (`"session"` or
//! `"tenant"`: keep the decision as a rule), `match` (the pattern that rule matches; this
//! exact call when absent) and `arguments` (the whole arguments object the call runs with
//! instead of the model's; checked against the tool's schema and the rules).

use serde_json::{json, Value};

use super::body::JsonBody;
use super::{json, ApiError, Caller, KestrelApi};
use crate::engine::{Decision, Remember};
use crate::http::{Reply, Request};

pub fn resolve(
    api: &KestrelApi,
    caller: &Caller,
    id: &str,
    approval_id: &str,
    request: &mut Request,
) -> Result<Reply, ApiError> {
    let body = JsonBody::read(request)?;
    let approved = match body.get("approved") {
        Some(Value::Bool(approved)) => *approved,
        _ => return Err(ApiError::bad_request("invalid_decision", "`approved` must be true or false")),
    };
    let note = body.optional_string("note", "invalid_decision")?;
    let remember = match body.optional_string("remember", "invalid_decision")?.as_deref() {
        None => None,
        Some("session") => Some(Remember::Session),
        Some("tenant") => Some(Remember::Tenant),
        Some(_) => return Err(ApiError::bad_request("invalid_decision", "`remember` is \"session\" or \"tenant\"")),
    };
    let pattern = body.optional_string("match", "invalid_decision")?;
    if pattern.is_some() && remember.is_none() {
        return Err(ApiError::bad_request("invalid_decision", "`match` goes with `remember`"));
    }
    if pattern.as_ref().is_some_and(|p| p.is_empty() || p.len() > 4096) {
        return Err(ApiError::bad_request("invalid_decision", "`match` is a pattern of 1 to 4096 bytes"));
    }
    // An edit is what an approved call runs with; a denial has nothing to run, so its
    // `arguments` are left unused.
    let arguments = match body.get("arguments") {
        None | Some(Value::Null) => None,
        Some(Value::Object(arguments)) => Some(arguments.clone()).filter(|_| approved),
        Some(_) => return Err(ApiError::bad_request("invalid_decision", "`arguments` must be an object")),
    };
    let actor = caller.name.clone();
    let decision = Decision { approved, note, remember, pattern, arguments, actor, taken: None };
    api.engine.resolve_approval(&caller.tenant, id, approval_id, decision)?;
    Ok(json(200, &json!({ "resolved": true })))
}
