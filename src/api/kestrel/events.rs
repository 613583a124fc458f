//! The two SSE routes: every session of the caller's tenant, or one session.

use super::{wire, ApiError, Caller, KestrelApi};
use serde_json::json;

use crate::bus::{Filter, Scope, Subscription};
use crate::http::{EventStream, Framing, Reply, Request, Stream};

pub fn all(api: &KestrelApi, caller: &Caller, request: &Request) -> Result<Reply, ApiError> {
    subscribe(
        api,
        Filter { tenant: caller.tenant.clone(), scope: Scope::AllSessions, format: Some(wire::FORMAT) },
        request,
    )
}

pub fn session(api: &KestrelApi, caller: &Caller, id: &str, request: &Request) -> Result<Reply, ApiError> {
    api.engine.check_session(&caller.tenant, id)?;
    subscribe(
        api,
        Filter { tenant: caller.tenant.clone(), scope: Scope::Session(id.to_string()), format: Some(wire::FORMAT) },
        request,
    )
}

/// `/api/plugins/events`: a `ready` frame saying hot reload is off and no plugins are loaded,
/// then pings until the client leaves. `plugins.changed` would come through the bus.
pub fn plugins(api: &KestrelApi, caller: &Caller) -> Result<Reply, ApiError> {
    let subscription = bus_subscription(
        api,
        Filter { tenant: caller.tenant.clone(), scope: Scope::Plugins, format: Some(wire::PLUGINS_FORMAT) },
        None,
    )?;
    let ready = json!({ "enabled": api.plugins.hot_reload(), "plugins": api.plugins.infos() });
    let stream = EventStream::new(subscription, wire::PLUGINS_FORMAT, wire::plugins_frame);
    let stream = stream.with_preamble(format!("event: ready\ndata: {ready}\n\n"));
    Ok(Reply::Stream(Stream::new(Framing::EventStream, stream)))
}

fn subscribe(api: &KestrelApi, filter: Filter, request: &Request) -> Result<Reply, ApiError> {
    let after = last_event_id(request)?;
    let stream = EventStream::new(bus_subscription(api, filter, after)?, wire::FORMAT, wire::sse_frame);
    Ok(Reply::Stream(Stream::new(Framing::EventStream, stream)))
}

fn bus_subscription(api: &KestrelApi, filter: Filter, after: Option<u64>) -> Result<Subscription, ApiError> {
    api.engine.bus().subscribe(filter, after).ok_or_else(|| ApiError::from(crate::engine::EngineError::ShuttingDown))
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
    let refused = || ApiError::bad_request("invalid_body", format!("Last-Event-ID {raw:?} is not a sequence number"));
    // Plain decimal digits only: `u64::from_str` would also take a leading `+`.
    if !raw.bytes().all(|b| b.is_ascii_digit()) {
        return Err(refused());
    }
    raw.parse().map(Some).map_err(|_| refused())
}
