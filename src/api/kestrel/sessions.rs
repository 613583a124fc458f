//! Session routes: list, create, get, patch, delete.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::Serialize;
use serde_json::Value;

use super::body::JsonBody;
use super::idempotency;
use super::wire::{WireSession, WireSummary};
use super::{json, ApiError, Caller, KestrelApi};
use crate::engine::idempotency::Render;
use crate::engine::{Created, NewSession};
use crate::http::{Reply, Request};
use crate::store::{SessionPatch, SessionWalk, Walked, WALK_TTL_MS};
use crate::time::now_millis;

const MAX_TITLE_CHARS: usize = 200;

// Bodies are serialized straight from borrowed wire views: going through `json!` would first
// copy a whole transcript (images included) into a `Value` tree.
#[derive(Serialize)]
struct SessionList<'a> {
    sessions: Vec<WireSummary<'a>>,
    #[serde(rename = "nextCursor", skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

/// The most sessions one page answers.
const MAX_PAGE: usize = 1000;
#[derive(Serialize)]
struct OneSession<'a> {
    session: WireSession<'a>,
}
const MAX_PROMPT_CHARS: usize = 100_000;

/// With neither `limit` nor `cursor`, every session (the protocol's answer); with either, one
/// page of a walk, and `nextCursor` while more remain.
pub fn list(api: &KestrelApi, caller: &Caller, request: &Request) -> Result<Reply, ApiError> {
    let (limit, cursor) = (request.query("limit"), request.query("cursor"));
    if limit.is_none() && cursor.is_none() {
        return whole_list(api, caller);
    }
    let limit = match limit.map(str::parse::<usize>) {
        None => 100,
        Some(Ok(limit @ 1..=MAX_PAGE)) => limit,
        Some(_) => return Err(ApiError::bad_request("invalid_query", "`limit` must be an integer from 1 to 1000")),
    };
    let (walk, started) = match cursor {
        Some(cursor) => Cursor::decode(cursor)?,
        None => (SessionWalk { as_of: None, after: None }, now_millis()),
    };
    // One more than asked says whether another page follows.
    let mut page = api.engine.list_sessions_page(&caller.tenant, &walk, limit + 1)?;
    let more = page.sessions.len() > limit;
    page.sessions.truncate(limit);
    let next_cursor = match page.sessions.last() {
        Some(last) if more => Some(Cursor::encode(page.as_of, started, last)),
        _ => None,
    };
    let sessions = page.sessions.iter().map(|walked| WireSummary::from(&walked.summary)).collect();
    Ok(json(200, &SessionList { sessions, next_cursor }))
}

/// Every session of the tenant: the cached answer while no session changed since it was read.
fn whole_list(api: &KestrelApi, caller: &Caller) -> Result<Reply, ApiError> {
    let version = api.engine.sessions_version()?;
    api.lists.answer(&caller.tenant, version, || {
        let sessions = api.engine.list_sessions(&caller.tenant)?;
        let sessions = sessions.iter().map(WireSummary::from).collect();
        Ok(json(200, &SessionList { sessions, next_cursor: None }))
    })
}

/// A walk's place, as an opaque token: base64url of `{"asOf", "t", "pos", "id"}` (the walk
/// clock's tick at the start, the start in milliseconds, the last session's place and id).
#[derive(Serialize, serde::Deserialize)]
struct Cursor {
    #[serde(rename = "asOf")]
    as_of: i64,
    t: i64,
    pos: String,
    id: String,
}

impl Cursor {
    fn encode(as_of: i64, started: i64, last: &Walked) -> String {
        let cursor = Cursor { as_of, t: started, pos: last.position.clone(), id: last.summary.id.clone() };
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(&cursor).unwrap_or_default())
    }

    /// A cursor this server made, whose walk has not outlived the moves it relies on; and the
    /// walk's start.
    fn decode(token: &str) -> Result<(SessionWalk, i64), ApiError> {
        let invalid =
            || ApiError::bad_request("invalid_cursor", "`cursor` is not one this server gave, or has expired");
        let bytes = URL_SAFE_NO_PAD.decode(token).map_err(|_| invalid())?;
        let cursor: Cursor = serde_json::from_slice(&bytes).map_err(|_| invalid())?;
        let age = now_millis().saturating_sub(cursor.t);
        if !(0..WALK_TTL_MS).contains(&age) || cursor.as_of < 0 {
            return Err(invalid());
        }
        Ok((SessionWalk { as_of: Some(cursor.as_of), after: Some((cursor.pos, cursor.id)) }, cursor.t))
    }
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
/// A session's answer is cached, like the whole list, while no session changed.
pub fn get(api: &KestrelApi, caller: &Caller, id: &str, request: &Request) -> Result<Reply, ApiError> {
    let with_compacted = match request.query("compacted") {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => return Err(ApiError::bad_request("invalid_query", "`compacted` must be true or false")),
    };
    let key = format!("{}\n{id}\n{with_compacted}", caller.tenant);
    let version = api.engine.sessions_version()?;
    api.details.answer(&key, version, || {
        let session = api.engine.session_with(&caller.tenant, id, with_compacted)?;
        Ok(json(200, &OneSession { session: WireSession::from(&session) }))
    })
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
