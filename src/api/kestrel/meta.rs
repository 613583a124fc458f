//! `health`, `bootstrap` and `plugins`: what a client asks before anything else.

use serde_json::json;

use super::{json, ApiError, KestrelApi};
use crate::http::Reply;

pub const PROTOCOL_VERSION: &str = "1.0";
pub const SERVER_NAME: &str = "kestrel";

pub fn health(api: &KestrelApi) -> Result<Reply, ApiError> {
    Ok(json(
        200,
        &json!({
            "status": "ok",
            "name": SERVER_NAME,
            "version": env!("CARGO_PKG_VERSION"),
            "protocol": PROTOCOL_VERSION,
            "uptimeMs": api.started.elapsed().as_millis() as u64,
            "plugins": 0,
            "sessions": api.engine.session_count()?,
        }),
    ))
}

pub fn bootstrap(api: &KestrelApi) -> Result<Reply, ApiError> {
    let models: Vec<_> = api.engine.models().infos().collect();
    Ok(json(
        200,
        &json!({
            "name": SERVER_NAME,
            "version": env!("CARGO_PKG_VERSION"),
            "protocol": PROTOCOL_VERSION,
            "models": models,
            "tools": api.engine.tools().schemas(),
            "plugins": [],
            "features": {
                "streaming": true,
                "approvals": true,
                "persistence": true,
                "multiSession": true,
            },
        }),
    ))
}

pub fn plugins() -> Result<Reply, ApiError> {
    Ok(json(200, &json!({ "plugins": [] })))
}
