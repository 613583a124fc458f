//! The two SSE routes: every session of the caller's tenant, or one session.

use super::{ApiError, Caller, KestrelApi};
use crate::bus::Filter;
use crate::http::{event_stream, Reply, Request};

pub fn all(api: &KestrelApi, caller: &Caller, request: &Request) -> Result<Reply, ApiError> {
    subscribe(api, Filter { tenant: caller.tenant.clone(), session_id: None }, request)
}

pub fn session(api: &KestrelApi, caller: &Caller, id: &str, request: &Request) -> Result<Reply, ApiError> {
    api.engine.session(&caller.tenant, id)?;
    subscribe(api, Filter { tenant: caller.tenant.clone(), session_id: Some(id.to_string()) }, request)
}

fn subscribe(api: &KestrelApi, filter: Filter, request: &Request) -> Result<Reply, ApiError> {
    let after = last_event_id(request)?;
    let subscription = api
        .engine
        .bus()
        .subscribe(filter, after)
        .ok_or_else(|| ApiError::new(503, "unavailable", "the server is shutting down"))?;
    Ok(event_stream(subscription))
}

/// `Last-Event-ID` or `?lastEventId=`; the header wins when both are sent.
fn last_event_id(request: &Request) -> Result<Option<u64>, ApiError> {
    let Some(raw) = request.header("Last-Event-ID").or_else(|| request.query("lastEventId")) else {
        return Ok(None);
    };
    let raw = raw.trim();
    if raw.is_empty() {
        return Ok(None);
    }
    raw.parse()
        .map(Some)
        .map_err(|_| ApiError::bad_request("invalid_body", format!("Last-Event-ID {raw:?} is not a sequence number")))
}
