//! Permission rules and the audit log (docs/permissions.md):
//! `GET/POST /api/rules`, `DELETE /api/rules/:ruleId`, the same under
//! `/api/sessions/:id/rules` for one session, and `GET /api/audit` for admin tokens.

use serde_json::{json, Value};

use super::body::JsonBody;
use super::{json, ApiError, Caller, KestrelApi};
use crate::engine::NewRule;
use crate::http::{Reply, Request};
use crate::policy::Outcome;
use crate::store::AuditQuery;

/// Entries `GET /api/audit` answers at most per page.
const AUDIT_PAGE: usize = 500;

/// `GET /api/rules`, or with `session` the session's own rules.
pub fn list(api: &KestrelApi, caller: &Caller, session: Option<&str>) -> Result<Reply, ApiError> {
    let rules = match session {
        Some(session_id) => api.engine.session_rules(&caller.tenant, session_id)?,
        None => api.engine.rules(&caller.tenant)?,
    };
    Ok(json(200, &json!({ "rules": rules })))
}

/// `POST /api/rules`: `{ "tool", "match"?, "outcome" }`.
pub fn create(
    api: &KestrelApi,
    caller: &Caller,
    session: Option<&str>,
    request: &mut Request,
) -> Result<Reply, ApiError> {
    let body = JsonBody::read(request)?;
    let tool = match body.get("tool") {
        Some(Value::String(tool)) if !tool.trim().is_empty() && tool.len() <= 256 => tool.clone(),
        _ => return Err(ApiError::bad_request("invalid_rule", "`tool` must be a tool name or glob")),
    };
    let pattern = body.optional_string("match", "invalid_rule")?;
    if pattern.as_ref().is_some_and(|p| p.is_empty() || p.len() > 4096) {
        return Err(ApiError::bad_request("invalid_rule", "`match` must be a non-empty pattern of at most 4096 bytes"));
    }
    let outcome = match body.get("outcome") {
        Some(Value::String(text)) => Outcome::parse(text),
        _ => None,
    }
    .ok_or_else(|| ApiError::bad_request("invalid_rule", "`outcome` must be \"allow\", \"ask\" or \"deny\""))?;
    let rule =
        NewRule { tool, pattern, outcome, session_id: session.map(str::to_string), created_by: caller.name.clone() };
    let view = api.engine.add_rule(&caller.tenant, rule)?;
    Ok(json(201, &json!({ "rule": view })))
}

/// `DELETE /api/rules/:ruleId`.
pub fn delete(api: &KestrelApi, caller: &Caller, session: Option<&str>, id: &str) -> Result<Reply, ApiError> {
    api.engine.delete_rule(&caller.tenant, id, session)?;
    Ok(json(200, &json!({ "deleted": true })))
}

/// `GET /api/audit?since=…&after=…&tenant=…`: admin tokens only; a page of entries, oldest
/// first, with `nextAfter` when more remain.
pub fn audit(api: &KestrelApi, caller: &Caller, request: &Request) -> Result<Reply, ApiError> {
    if !caller.admin {
        return Err(ApiError::new(403, "forbidden", "the audit log is for admin tokens"));
    }
    let after = match request.query("after") {
        // Seqs are SQLite integers: no seq is past i64::MAX.
        Some(text) => text
            .parse::<u64>()
            .ok()
            .filter(|after| *after <= i64::MAX as u64)
            .ok_or_else(|| ApiError::bad_request("invalid_query", "`after` is a seq"))?,
        None => 0,
    };
    let since = request.query("since");
    if since.is_some_and(|s| s.chars().count() > 64) {
        return Err(ApiError::bad_request("invalid_query", "`since` is an RFC 3339 time"));
    }
    let query = AuditQuery { tenant: request.query("tenant"), after, since };
    let mut entries = api.engine.audit(&query, AUDIT_PAGE + 1)?;
    let more = entries.len() > AUDIT_PAGE;
    entries.truncate(AUDIT_PAGE);
    let next = if more { entries.last().map(|e| e.seq) } else { None };
    Ok(json(200, &json!({ "entries": entries, "nextAfter": next })))
}
