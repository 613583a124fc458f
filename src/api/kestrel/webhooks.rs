//! `/api/webhooks`: the caller's tenant's endpoints and their deliveries (docs/webhooks.md).
//!
//! An endpoint on the wire: `{id, url, events, description?, source, enabled, failures,
//! disabledReason?, createdAt}`, and `secret` only in the answer that made it. A delivery:
//! `{id, seq, type, at, sessionId?, state, attempts: [{n, at, status?, error?, latencyMs}],
//! nextAttemptAt?, deliveredAt?}`.

use serde_json::{json, Map, Value};

use super::body::JsonBody;
use super::{json, ApiError, Caller, KestrelApi};
use crate::http::{Reply, Request};
use crate::webhooks::{Attempt, Delivery, DeliveryState, NewWebhook, Webhook, WebhookError};

impl From<WebhookError> for ApiError {
    fn from(error: WebhookError) -> ApiError {
        let message = error.to_string();
        match error {
            WebhookError::Invalid(_) | WebhookError::Target(_) => ApiError::bad_request("invalid_webhook", message),
            WebhookError::NotFound => ApiError::new(404, "webhook_not_found", message),
            WebhookError::TooMany => ApiError::new(409, "webhook_limit", message),
            WebhookError::Store(error) => ApiError::from(crate::engine::EngineError::from(error)),
        }
    }
}

pub fn list(api: &KestrelApi, caller: &Caller) -> Result<Reply, ApiError> {
    let webhooks = api.webhooks.list(&caller.tenant)?;
    Ok(json(200, &json!({ "webhooks": webhooks.iter().map(webhook_json).collect::<Vec<_>>() })))
}

/// `201 {webhook}`, its `secret` shown this once.
pub fn create(api: &KestrelApi, caller: &Caller, request: &mut Request) -> Result<Reply, ApiError> {
    let body = JsonBody::read(request)?;
    let invalid = |why: &str| ApiError::bad_request("invalid_webhook", why.to_string());
    let url = match body.get("url") {
        Some(Value::String(url)) => url.clone(),
        _ => return Err(invalid("`url` is required: an http(s) URL")),
    };
    let events = match body.get("events") {
        Some(Value::Array(events)) => events
            .iter()
            .map(|kind| kind.as_str().map(str::to_string).ok_or_else(|| invalid("`events` must be strings")))
            .collect::<Result<Vec<_>, _>>()?,
        _ => return Err(invalid("`events` is required: the event types to send")),
    };
    let description = match body.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(description)) => Some(description.clone()),
        Some(_) => return Err(invalid("`description` must be a string")),
    };
    let webhook = api.webhooks.create(&caller.tenant, NewWebhook { url, events, description })?;
    let mut shown = webhook_json(&webhook);
    shown["secret"] = json!(webhook.secret);
    Ok(json(201, &json!({ "webhook": shown })))
}

pub fn get(api: &KestrelApi, caller: &Caller, id: &str) -> Result<Reply, ApiError> {
    let webhook = api.webhooks.get(&caller.tenant, id)?;
    Ok(json(200, &json!({ "webhook": webhook_json(&webhook) })))
}

pub fn delete(api: &KestrelApi, caller: &Caller, id: &str) -> Result<Reply, ApiError> {
    api.webhooks.delete(&caller.tenant, id)?;
    Ok(json(200, &json!({ "deleted": true })))
}

pub fn enable(api: &KestrelApi, caller: &Caller, id: &str) -> Result<Reply, ApiError> {
    let webhook = api.webhooks.enable(&caller.tenant, id)?;
    Ok(json(200, &json!({ "webhook": webhook_json(&webhook) })))
}

pub fn deliveries(api: &KestrelApi, caller: &Caller, id: &str) -> Result<Reply, ApiError> {
    let deliveries = api.webhooks.deliveries(&caller.tenant, id)?;
    let shown: Vec<Value> = deliveries.iter().map(|(delivery, attempts)| delivery_json(delivery, attempts)).collect();
    Ok(json(200, &json!({ "deliveries": shown })))
}

/// `202 {redelivering: true}`: sent again at once, for a whole retry period.
pub fn redeliver(api: &KestrelApi, caller: &Caller, id: &str, delivery_id: &str) -> Result<Reply, ApiError> {
    api.webhooks.redeliver(&caller.tenant, id, delivery_id)?;
    Ok(json(202, &json!({ "redelivering": true })))
}

fn webhook_json(webhook: &Webhook) -> Value {
    let mut object = Map::new();
    object.insert("id".into(), json!(webhook.id));
    object.insert("url".into(), json!(webhook.url));
    object.insert("events".into(), json!(webhook.events));
    if let Some(description) = &webhook.description {
        object.insert("description".into(), json!(description));
    }
    object.insert("source".into(), json!(webhook.source.as_str()));
    object.insert("enabled".into(), json!(webhook.enabled));
    object.insert("failures".into(), json!(webhook.failures));
    if let Some(reason) = &webhook.disabled_reason {
        object.insert("disabledReason".into(), json!(reason));
    }
    object.insert("createdAt".into(), json!(webhook.created_at));
    Value::Object(object)
}

fn delivery_json(delivery: &Delivery, attempts: &[Attempt]) -> Value {
    let attempts: Vec<Value> = attempts
        .iter()
        .map(|attempt| {
            let mut object = json!({ "n": attempt.n, "at": attempt.at, "latencyMs": attempt.latency_ms });
            if let Some(status) = attempt.status {
                object["status"] = json!(status);
            }
            if let Some(error) = &attempt.error {
                object["error"] = json!(error);
            }
            object
        })
        .collect();
    let mut object = json!({
        "id": delivery.id, "seq": delivery.seq, "type": delivery.kind, "at": delivery.at,
        "state": delivery.state.as_str(), "attempts": attempts,
    });
    if let Some(session_id) = &delivery.session_id {
        object["sessionId"] = json!(session_id);
    }
    if delivery.state == DeliveryState::Pending {
        object["nextAttemptAt"] = json!(crate::time::rfc3339_from_millis(delivery.next_at));
    }
    if let Some(at) = &delivery.delivered_at {
        object["deliveredAt"] = json!(at);
    }
    object
}
