//! Session routes: list, create, get, patch, delete.

use serde::Serialize;
use serde_json::Value;

use super::body::JsonBody;
use super::idempotency;
use super::wire::{WireSession, WireSummary};
use super::{json, ApiError, Caller, KestrelApi};
use crate::engine::idempotency::Render;
use crate::engine::{Created, NewSession};
use crate::http::{Reply, Request};
use crate::store::SessionPatch;

const MAX_TITLE_CHARS: usize = 200;

// Bodies are serialized straight from borrowed wire views: going through `json!` would first
// copy a whole transcript (images included) into a `Value` tree.
#[derive(Serialize)]
struct SessionList<'a> {
    sessions: Vec<WireSummary<'a>>,
}

#[derive(Serialize)]
struct OneSession<'a> {
    session: WireSession<'a>,
}
const MAX_PROMPT_CHARS: usize = 100_000;

pub fn list(api: &KestrelApi, caller: &Caller) -> Result<Reply, ApiError> {
    let sessions = api.engine.list_sessions(&caller.tenant)?;
    Ok(json(200, &SessionList { sessions: sessions.iter().map(WireSummary::from).collect() }))
}

pub fn create(api: &KestrelApi, caller: &Caller, request: &mut Request) -> Result<Reply, ApiError> {
    let bytes = request.read_body()?;
    let key = idempotency::key(request)?;
    let render: Render = Box::new(|created| match created {
        Created::Session(session) => {
            (201, serde_json::to_vec(&OneSession { session: WireSession::from(session) }).unwrap_or_default())
        }
        Created::Run(_) => unreachable!("a session create creates a session"),
    });
    idempotency::once(api, caller, key, ("POST", request.path(), &bytes), render, |idempotent| {
        let body = JsonBody::parse(&bytes)?;
        let new = NewSession {
            title: title(&body)?,
            model: body.optional_string("model", "invalid_model")?,
            system_prompt: prompt(&body)?.flatten(),
            workspace: body.optional_string("workspace", "invalid_body")?,
        };
        let session = api.engine.create_session(&caller.tenant, new, idempotent)?;
        Ok(json(201, &OneSession { session: WireSession::from(&session) }))
    })
}

/// `?compacted=true` also shows the messages a compaction replaced (`hidden: true`), for audit.
pub fn get(api: &KestrelApi, caller: &Caller, id: &str, request: &Request) -> Result<Reply, ApiError> {
    let with_compacted = match request.query("compacted") {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => return Err(ApiError::bad_request("invalid_query", "`compacted` must be true or false")),
    };
    let session = api.engine.session_with(&caller.tenant, id, with_compacted)?;
    Ok(json(200, &OneSession { session: WireSession::from(&session) }))
}

pub fn patch(api: &KestrelApi, caller: &Caller, id: &str, request: &mut Request) -> Result<Reply, ApiError> {
    let body = JsonBody::read(request)?;
    let model = match body.get("model") {
        None => None,
        Some(Value::String(model)) => Some(model.clone()),
        Some(_) => return Err(ApiError::bad_request("invalid_model", "`model` must be a string")),
    };
    if body.get("title") == Some(&Value::Null) {
        return Err(ApiError::bad_request("invalid_title", "`title` cannot be null"));
    }
    let workspace = body.optional_string("workspace", "invalid_body")?;
    let patch = SessionPatch { title: title(&body)?, model, system_prompt: prompt(&body)?, status: None, workspace };
    let session = api.engine.patch_session(&caller.tenant, id, patch)?;
    Ok(json(200, &OneSession { session: WireSession::from(&session) }))
}

pub fn delete(api: &KestrelApi, caller: &Caller, id: &str) -> Result<Reply, ApiError> {
    api.engine.delete_session(&caller.tenant, id)?;
    Ok(Reply::Empty { status: 204 })
}

/// `title`: a non-blank string of at most 200 characters, stored trimmed.
fn title(body: &JsonBody) -> Result<Option<String>, ApiError> {
    let Some(title) = body.optional_string("title", "invalid_title")? else {
        return Ok(None);
    };
    let title = title.trim();
    if title.is_empty() {
        return Err(ApiError::bad_request("invalid_title", "`title` cannot be blank"));
    }
    if title.chars().count() > MAX_TITLE_CHARS {
        return Err(ApiError::bad_request(
            "invalid_title",
            format!("`title` is longer than {MAX_TITLE_CHARS} characters"),
        ));
    }
    Ok(Some(title.to_string()))
}

/// `systemPrompt`: absent (unchanged), `null` or `""` (cleared), or a string up to the limit.
fn prompt(body: &JsonBody) -> Result<Option<Option<String>>, ApiError> {
    if !body.has("systemPrompt") {
        return Ok(None);
    }
    let prompt = body.optional_string("systemPrompt", "invalid_prompt")?;
    if prompt.as_ref().is_some_and(|p| p.chars().count() > MAX_PROMPT_CHARS) {
        return Err(ApiError::bad_request(
            "invalid_prompt",
            format!("`systemPrompt` is longer than {MAX_PROMPT_CHARS} characters"),
        ));
    }
    Ok(Some(prompt.filter(|p| !p.is_empty())))
}
