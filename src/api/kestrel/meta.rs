//! `health`, `bootstrap` and `plugins`: what a client asks before anything else; and the
//! admin's views of the server: its config and its cluster.

use super::wire::{WireSandbox, WireTool};
use serde_json::json;

use super::{json, ApiError, KestrelApi};
use crate::http::Reply;
use crate::plugins::AssetError;

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
            "plugins": api.plugins.active_count(),
            "sessions": api.engine.session_count()?,
        }),
    ))
}

/// `GET /api/cluster`: admin tokens only; the nodes sharing this database, each with its last
/// heartbeat and how many live sessions it owns (none on a node that runs alone).
pub fn cluster(api: &KestrelApi, caller: &super::Caller) -> Result<Reply, ApiError> {
    if !caller.admin {
        return Err(ApiError::new(403, "forbidden", "the cluster's nodes are for admin tokens"));
    }
    let Some(node) = &api.cluster else {
        return Ok(json(200, &json!({ "clustered": false, "node": null, "nodes": [] })));
    };
    let nodes = node.nodes().map_err(|error| ApiError::store_unavailable(&error))?;
    Ok(json(200, &json!({ "clustered": true, "node": node.id(), "leaseMs": node.lease_ms(), "nodes": nodes })))
}

/// `GET /api/config`: admin tokens only (the whole sanitized config names every tenant, its
/// roots, budgets, rules and token variables); the one user of a server without tokens is its
/// admin.
pub fn config(api: &KestrelApi, caller: &super::Caller) -> Result<Reply, ApiError> {
    if !caller.admin {
        return Err(ApiError::new(403, "forbidden", "the server's config is for admin tokens"));
    }
    Ok(json(200, &api.config_view))
}

/// `GET /api/bootstrap`: besides the protocol's fields, how the caller's commands are
/// contained (`sandbox`), so a client can say when they run unsandboxed.
pub fn bootstrap(api: &KestrelApi, caller: &super::Caller) -> Result<Reply, ApiError> {
    let models: Vec<_> = api.engine.models().infos().collect();
    let tools = api.engine.tools().schemas();
    let tools: Vec<WireTool<'_>> = tools.iter().map(WireTool::from).collect();
    let sandbox = api.engine.sandbox(&caller.tenant);
    Ok(json(
        200,
        &json!({
            "name": SERVER_NAME,
            "version": env!("CARGO_PKG_VERSION"),
            "protocol": PROTOCOL_VERSION,
            "models": models,
            "tools": tools,
            "plugins": api.plugins.infos(),
            "sandbox": WireSandbox::from(&sandbox),
            "features": {
                "streaming": true,
                "approvals": true,
                "persistence": true,
                "multiSession": true,
            },
        }),
    ))
}

pub fn plugins(api: &KestrelApi) -> Result<Reply, ApiError> {
    Ok(json(200, &json!({ "plugins": api.plugins.infos() })))
}

/// `GET /plugins/<id>/web/<path>`: a file of a plugin's `web/` tree, with its content type.
pub fn plugin_asset(api: &KestrelApi, id: &str, path: &str) -> Result<Reply, ApiError> {
    match api.plugins.asset(id, path) {
        Ok((body, content_type)) => {
            Ok(Reply::File { content_type, body, cache_control: "no-cache", policy: crate::plugins::ASSET_POLICY })
        }
        Err(AssetError::NotFound) => Err(ApiError::not_found()),
        Err(AssetError::Forbidden) => {
            Err(ApiError::new(403, "forbidden", "that path is not a file of the plugin's web/ tree"))
        }
    }
}
