//! `/api/sessions/:id/checkpoints`, `…/:checkpointId/restore`, `/rewind` and `/fork`:
//! snapshots of a session's workspace, putting one back, dropping the end of a conversation,
//! and a new session from its beginning (docs/forks.md).
//!
//! A checkpoint on the wire: `{id, label?, kind: "manual" | "auto" | "safety", createdAt,
//! runId?, fileCount, totalBytes}`.

use serde_json::{json, Map, Value};

use super::body::JsonBody;
use super::{json, ApiError, Caller, KestrelApi};
use crate::engine::{ForkRequest, ForkWorkspace};
use crate::http::{Reply, Request};
use crate::store::CheckpointRecord;

/// The longest label a checkpoint may carry, in characters.
const LABEL_LIMIT: usize = 200;

pub fn list(api: &KestrelApi, caller: &Caller, id: &str) -> Result<Reply, ApiError> {
    let list = api.engine.checkpoints(&caller.tenant, id)?;
    let mut body = Map::new();
    body.insert("enabled".into(), json!(list.disabled.is_none()));
    if let Some(reason) = list.disabled {
        body.insert("reason".into(), json!(reason));
    }
    body.insert("checkpoints".into(), list.checkpoints.iter().map(checkpoint_json).collect());
    Ok(json(200, &Value::Object(body)))
}

pub fn create(api: &KestrelApi, caller: &Caller, id: &str, request: &mut Request) -> Result<Reply, ApiError> {
    // The session first, so another tenant's id is a 404 whatever the body.
    api.engine.check_session(&caller.tenant, id)?;
    let body = JsonBody::read(request)?;
    let label = body.optional_string("label", "invalid_body")?.map(|l| l.trim().to_string()).filter(|l| !l.is_empty());
    if label.as_ref().is_some_and(|l| l.chars().count() > LABEL_LIMIT) {
        return Err(ApiError::invalid_body(format!("`label` is longer than {LABEL_LIMIT} characters")));
    }
    let checkpoint = api.engine.create_checkpoint(&caller.tenant, id, label)?;
    Ok(json(201, &json!({ "checkpoint": checkpoint_json(&checkpoint) })))
}

pub fn restore(api: &KestrelApi, caller: &Caller, id: &str, checkpoint: &str) -> Result<Reply, ApiError> {
    let restored = api.engine.restore_checkpoint(&caller.tenant, id, checkpoint)?;
    let mut body = Map::new();
    body.insert("restored".into(), checkpoint_json(&restored.restored));
    body.insert("safety".into(), checkpoint_json(&restored.safety));
    if !restored.warnings.is_empty() {
        body.insert("warning".into(), json!(partial_warning(&restored.warnings)));
    }
    Ok(json(200, &Value::Object(body)))
}

/// `POST /rewind` with `{messageId, restoreFiles?}`.
pub fn rewind(api: &KestrelApi, caller: &Caller, id: &str, request: &mut Request) -> Result<Reply, ApiError> {
    api.engine.check_session(&caller.tenant, id)?;
    let body = JsonBody::read(request)?;
    let message_id = match body.get("messageId") {
        Some(Value::String(message_id)) if !message_id.is_empty() => message_id.clone(),
        _ => return Err(ApiError::invalid_body("`messageId` must name a message of this session")),
    };
    let restore_files = match body.get("restoreFiles") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(restore)) => *restore,
        Some(_) => return Err(ApiError::invalid_body("`restoreFiles` must be true or false")),
    };
    let rewound = api.engine.rewind(&caller.tenant, id, message_id.clone(), restore_files)?;
    let messages: Vec<super::wire::WireMessage<'_>> =
        rewound.messages.iter().map(super::wire::WireMessage::from).collect();
    let mut answer = Map::new();
    answer.insert("messageId".into(), json!(message_id));
    answer.insert("removed".into(), json!(rewound.removed));
    answer.insert("messages".into(), serde_json::to_value(&messages).unwrap_or_default());
    let files = rewound.files.as_ref();
    answer.insert("restored".into(), files.map_or(Value::Null, |f| checkpoint_json(&f.restored)));
    answer.insert("safety".into(), files.map_or(Value::Null, |f| checkpoint_json(&f.safety)));
    if let Some(files) = files.filter(|f| !f.warnings.is_empty()) {
        answer.insert("warning".into(), json!(partial_warning(&files.warnings)));
    }
    Ok(json(200, &Value::Object(answer)))
}

/// `POST /fork` with `{messageId?, workspace?: "share" | "copy", path?}`: `201 {session,
/// copiedFrom?, warning?}`, `copiedFrom` the checkpoint a copy's files were put back from.
pub fn fork(api: &KestrelApi, caller: &Caller, id: &str, request: &mut Request) -> Result<Reply, ApiError> {
    api.engine.check_session(&caller.tenant, id)?;
    let body = JsonBody::read(request)?;
    let message_id = match body.get("messageId") {
        None | Some(Value::Null) => None,
        Some(Value::String(message_id)) if !message_id.is_empty() => Some(message_id.clone()),
        Some(_) => return Err(ApiError::invalid_body("`messageId` must name a message of this session")),
    };
    let path = match body.get("path") {
        None | Some(Value::Null) => None,
        Some(Value::String(path)) if !path.is_empty() => Some(std::path::PathBuf::from(path)),
        Some(_) => return Err(ApiError::invalid_body("`path` must be an absolute path")),
    };
    let workspace = match (body.get("workspace").and_then(Value::as_str), body.get("workspace")) {
        (Some("share"), _) | (None, None | Some(Value::Null)) if path.is_none() => ForkWorkspace::Share,
        (Some("copy"), _) | (None, None | Some(Value::Null)) => ForkWorkspace::Copy { path },
        _ => return Err(ApiError::invalid_body("`workspace` must be \"share\" or \"copy\" (`path` only with a copy)")),
    };
    let forked = api.engine.fork_session(&caller.tenant, id, ForkRequest { message_id, workspace })?;
    let mut answer = Map::new();
    let session = serde_json::to_value(super::wire::WireSession::from(&forked.detail)).unwrap_or_default();
    answer.insert("session".into(), session);
    if let Some(copy) = &forked.copy {
        answer.insert("copiedFrom".into(), checkpoint_json(&copy.checkpoint));
        if !copy.warnings.is_empty() {
            answer.insert("warning".into(), json!(partial_warning(&copy.warnings)));
        }
    }
    Ok(json(201, &Value::Object(answer)))
}

/// One line for people about what a restore could not put back.
pub fn partial_warning(warnings: &[String]) -> String {
    let shown: Vec<&str> = warnings.iter().take(5).map(String::as_str).collect();
    let more = warnings.len().saturating_sub(shown.len());
    let tail = if more > 0 { format!(" (and {more} more)") } else { String::new() };
    format!("the files were only partly restored: {}{tail}", shown.join("; "))
}

pub fn checkpoint_json(checkpoint: &CheckpointRecord) -> Value {
    let mut object = Map::new();
    object.insert("id".into(), json!(checkpoint.id));
    if let Some(label) = &checkpoint.label {
        object.insert("label".into(), json!(label));
    }
    object.insert("kind".into(), json!(checkpoint.kind.as_str()));
    object.insert("createdAt".into(), json!(checkpoint.created_at));
    if let Some(run_id) = &checkpoint.run_id {
        object.insert("runId".into(), json!(run_id));
    }
    object.insert("fileCount".into(), json!(checkpoint.file_count));
    object.insert("totalBytes".into(), json!(checkpoint.total_bytes));
    Value::Object(object)
}
