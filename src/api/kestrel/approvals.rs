//! `POST /api/sessions/:id/approvals/:approvalId`: a person's answer to an `ask` tool call.

use serde_json::{json, Value};

use super::body::JsonBody;
use super::{json, ApiError, Caller, KestrelApi};
use crate::engine::Decision;
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
    api.engine.resolve_approval(&caller.tenant, id, approval_id, Decision { approved, note })?;
    Ok(json(200, &json!({ "resolved": true })))
}
