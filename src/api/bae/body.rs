//! The open and join bodies, read with BAE's three kinds of 400 (the raw rejection of a body
//! that is not JSON, `invalid compaction config: …`, `invalid request body: …`).

use serde::Deserialize;
use serde_json::{Map, Value};

use super::problem::Problem;
use crate::api::bae::core::{Attach, Compaction, SubagentDecl, ToolDef};
use crate::http::{BodyError, Request};

#[derive(Deserialize)]
struct AttachBody {
    #[serde(default)]
    client_version: Option<String>,
    #[serde(default)]
    tools: Vec<ToolDef>,
    #[serde(default)]
    sandbox_tools: Vec<ToolDef>,
    #[serde(default)]
    subagent_tools: Vec<SubagentDecl>,
}

const NOT_ON_JOIN: &str = "compaction is a session-level setting fixed at creation and cannot be set on join";

/// Reads an open (`join` false) or join body.
pub fn attach(request: &mut Request, join: bool) -> Result<Attach, Problem> {
    attach_of(json_object(request)?, join)
}

/// Reads a join body and leaves it whole for whoever reads it next
/// (`Request::buffered_body`): the door judges a join's body as it admits it (BAE checks the
/// body before it looks the session up), and the join may then be forwarded to the node that
/// holds the session.
pub fn join_ahead(request: &mut Request) -> Result<Attach, Problem> {
    let json = sent_as_json(request);
    let bytes = request.buffered_body().map_err(unread)?;
    attach_of(object_of(json, bytes)?, true)
}

fn attach_of(mut fields: Map<String, Value>, join: bool) -> Result<Attach, Problem> {
    let compaction = fields.remove("compaction");
    if join && compaction.is_some() {
        return Err(Problem::bad_request(NOT_ON_JOIN));
    }
    let compaction = match compaction {
        None | Some(Value::Null) => None,
        Some(value) => Some(compaction_of(value)?),
    };
    let body: AttachBody = serde_json::from_value(Value::Object(fields))
        .map_err(|e| Problem::bad_request(format!("invalid request body: {e}")))?;
    if body.tools.iter().chain(&body.sandbox_tools).any(|tool| tool.name.trim().is_empty()) {
        return Err(Problem::bad_request("invalid request body: a tool name must not be empty"));
    }
    Ok(Attach {
        client_version: body.client_version,
        tools: body.tools,
        sandbox_tools: body.sandbox_tools,
        subagent_tools: body.subagent_tools,
        compaction,
    })
}

fn compaction_of(value: Value) -> Result<Compaction, Problem> {
    let compaction: Compaction =
        serde_json::from_value(value).map_err(|e| Problem::bad_request(format!("invalid compaction config: {e}")))?;
    if let Compaction::Auto { size } = compaction {
        if size < crate::api::bae::core::MIN_AUTO_SIZE {
            return Err(Problem::bad_request(format!(
                "invalid compaction config: size must be at least {} tokens",
                crate::api::bae::core::MIN_AUTO_SIZE
            )));
        }
    }
    Ok(compaction)
}

/// The body as a JSON object; it must be sent as `application/json`.
pub fn json_object(request: &mut Request) -> Result<Map<String, Value>, Problem> {
    let json = sent_as_json(request);
    let bytes = read(request)?;
    object_of(json, &bytes)
}

fn sent_as_json(request: &Request) -> bool {
    request
        .header("Content-Type")
        .and_then(|value| value.split(';').next())
        .is_some_and(|kind| kind.trim().eq_ignore_ascii_case("application/json"))
}

/// The body's bytes as a JSON object; `json` says whether it was sent as JSON (after the
/// body itself was read, so a body past the limit is a 413 whatever its type).
fn object_of(json: bool, bytes: &[u8]) -> Result<Map<String, Value>, Problem> {
    if !json {
        return Err(Problem::bad_request("Expected request with `Content-Type: application/json`"));
    }
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(fields)) => Ok(fields),
        Ok(_) => Err(Problem::bad_request("Failed to deserialize the JSON body: expected a JSON object")),
        Err(e) => Err(Problem::bad_request(format!("Failed to parse the request body as JSON: {e}"))),
    }
}

/// The whole body: 413 past the limit, 400 when it ends early.
pub fn read(request: &mut Request) -> Result<Vec<u8>, Problem> {
    request.read_body().map_err(unread)
}

fn unread(error: BodyError) -> Problem {
    match error {
        BodyError::TooLarge { limit } => {
            Problem::new(413, "payload_too_large", format!("the request body is larger than {limit} bytes"))
        }
        BodyError::Truncated { expected, received } => {
            Problem::bad_request(format!("the request body ended after {received} of {expected} bytes"))
        }
        BodyError::Io(error) => Problem::bad_request(format!("the request body could not be read: {error}")),
    }
}
