//! `POST /api/v1/sessions/{id}/rpc`: one JSON-RPC 2.0 request (or notification) per call,
//! answered as NDJSON with HTTP 200 whatever happens after authentication.
//!
//! Order: the session key (a 401 problem, the only non-200), the body as JSON (-32700), one
//! object (-32600; batches are refused), `jsonrpc` and `method` (-32600), a known method
//! (-32601); then the method's own checks. A notification (no `id`) gets no terminal frame.

use crossbeam_channel::bounded;
use serde_json::{Map, Value};

use super::problem::Problem;
use super::streams::{error_frame, RpcId, TurnKind, TurnStream, WatchStream};
use super::{body, wire};
use crate::api::bae::core::runtime::InvalidParams;
use crate::api::bae::core::Bae;
use crate::api::bae::core::{BaeOp, Compact, RpcError, SendMessage, UserMessage};
use crate::bus::{Filter, Scope};
use crate::domain::{Event, Role};
use crate::http::{Framing, Reply, Request, Stream};
use crate::store::{BaeSessionRecord, KeyRecord, BAE_TENANT};

/// A parsed request: its id (`None` for a notification), method and params.
struct Call {
    id: Option<RpcId>,
    method: String,
    params: Map<String, Value>,
}

/// What the caller is and where: the acting key and the session.
struct Context<'a> {
    bae: &'a Bae,
    key: KeyRecord,
    session_id: String,
}

/// A call on a session, by `key` (the session's, as the door admitted it).
pub fn handle(bae: &Bae, request: &mut Request, key: KeyRecord, session: BaeSessionRecord) -> Result<Reply, Problem> {
    let bytes = body::read(request)?;
    let call = match parse(&bytes) {
        Ok(call) => call,
        Err(frame) => return Ok(Reply::Ndjson(frame.into_bytes())),
    };
    let context = Context { bae, key, session_id: session.id };
    Ok(match dispatch(&context, call) {
        Answer::Frame(Some(frame)) => Reply::Ndjson(frame.into_bytes()),
        Answer::Frame(None) => Reply::Ndjson(Vec::new()),
        Answer::Stream(stream) => Reply::Stream(stream),
    })
}

enum Answer {
    /// One frame (or none, for a notification).
    Frame(Option<String>),
    Stream(Stream),
}

/// The envelope checks; an error is the frame that answers it.
fn parse(bytes: &[u8]) -> Result<Call, String> {
    let null = RpcId::null();
    let value: Value = serde_json::from_slice(bytes).map_err(|_| error_frame(&null, -32700, "Parse error"))?;
    let mut object = match value {
        Value::Object(object) => object,
        Value::Array(_) => return Err(error_frame(&null, -32600, "Invalid Request: batch requests are not supported")),
        _ => return Err(error_frame(&null, -32600, "Invalid Request")),
    };
    let id = object.remove("id").map(|parsed| RpcId::of(bytes, &parsed));
    let refuse = |message: &str| match &id {
        Some(id) => Err(error_frame(id, -32600, message)),
        None => Err(String::new()),
    };
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return refuse("Invalid Request: missing or wrong \"jsonrpc\" version");
    }
    let Some(method) = object.get("method").and_then(Value::as_str).map(str::to_string) else {
        return refuse("Invalid Request: missing \"method\"");
    };
    let params = match object.remove("params") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(params)) => params,
        Some(_) => {
            return Err(id
                .map(|id| error_frame(&id, -32602, "Invalid params: params must be an object"))
                .unwrap_or_default())
        }
    };
    Ok(Call { id, method, params })
}

fn dispatch(context: &Context<'_>, call: Call) -> Answer {
    let Call { id, method, params } = call;
    match method.as_str() {
        "session.registerDriver" => {
            let key = context.key_id();
            reply(
                &id,
                context.ask(|reply| BaeOp::RegisterDriver { key, reply }),
                &method,
                serde_json::json!({ "registered": true }),
            )
        }
        "session.updateClientTools" => {
            let tools = client_tools(&params);
            let key = context.key_id();
            reply(
                &id,
                context.ask(|reply| BaeOp::UpdateTools { key, tools: tools.map_err(InvalidParams), reply }),
                &method,
                serde_json::json!({ "updated": true }),
            )
        }
        "session.unsubscribe" => {
            let released = context.bae.release_streams(&context.session_id);
            let outcome = released.map_err(|_| RpcError::Internal);
            reply(&id, outcome, &method, serde_json::json!({ "unsubscribed": true }))
        }
        "session.sendMessage" => turn(context, id, TurnKind::Send, |key, run_id, reply| {
            BaeOp::Send(Box::new(SendMessage {
                key,
                run_id,
                message: user_message(&params).map_err(InvalidParams),
                reply,
            }))
        }),
        "session.compact" => turn(context, id, TurnKind::Compact, |key, run_id, reply| {
            BaeOp::Compact(Box::new(Compact { key, run_id, prompt: prompt(&params).map_err(InvalidParams), reply }))
        }),
        "session.subscribe" => watch(context, id, &params),
        "session.startRemoteSandbox" => {
            let Some(image) = params.get("image").and_then(Value::as_str).filter(|i| !i.trim().is_empty()) else {
                return invalid(id, "missing or blank \"image\"");
            };
            let (key, image) = (context.key_id(), image.to_string());
            let started = context.ask(|reply| BaeOp::StartSandbox { key, image, reply });
            answer(&id, started.map(|(running, at)| {
                serde_json::json!({ "sandbox_id": running.id, "image": running.image, "started_at": at })
            }), &method)
        }
        "session.stopRemoteSandbox" => {
            let key = context.key_id();
            let stopped = context.ask(|reply| BaeOp::StopSandbox { key, reply });
            answer(
                &id,
                stopped.map(
                    |running| serde_json::json!({ "stopped": true, "image": running.image, "sandbox_id": running.id }),
                ),
                &method,
            )
        }
        "session.execRemoteSandbox" => {
            let Some(command) = params.get("command").and_then(Value::as_str).map(str::to_string) else {
                return invalid(id, "missing \"command\"");
            };
            let key = context.key_id();
            let ran =
                context.ask(|reply| BaeOp::SandboxHandle { key: key.clone(), reply }).and_then(|(sandbox, stopped)| {
                    context.bae.sandbox_exec(&context.session_id, &key, &sandbox, &command, stopped.receiver())
                });
            answer(
                &id,
                ran.map(
                    |out| serde_json::json!({ "stdout": out.stdout, "stderr": out.stderr, "exit_code": out.exit_code, "truncated": out.truncated }),
                ),
                &method,
            )
        }
        "session.reportLocalSandbox" | "session.reportLocalSubagent" => {
            let report = match method.as_str() {
                "session.reportLocalSandbox" => local_sandbox_report(&context.session_id, &params),
                _ => local_subagent_report(&context.session_id, &params),
            };
            let key = context.key_id();
            let asked =
                context.ask(|reply| BaeOp::Report { key, report: report.map(Box::new).map_err(InvalidParams), reply });
            reply(&id, asked, &method, serde_json::json!({ "reported": true }))
        }
        "session.cancelSubagent" => {
            let subagent = params.get("subagent_id").and_then(Value::as_str).filter(|s| !s.trim().is_empty());
            let subagent = subagent.map(str::to_string);
            let asked = subagent.clone().ok_or_else(|| "missing \"subagent_id\"".to_string());
            let key = context.key_id();
            let cancelled = context.ask(|reply| BaeOp::CancelSubagent { key, id: asked.map_err(InvalidParams), reply });
            answer(&id, cancelled.map(|was_running| {
                serde_json::json!({ "cancelled": true, "subagent_id": subagent, "was_running": was_running })
            }), &method)
        }
        _ => Answer::Frame(id.map(|id| error_frame(&id, -32601, &format!("Method not found: {method}")))),
    }
}

/// `session.reportLocalSandbox`'s params as the event they become: `state` one of running,
/// stopped, error; `unsandboxed` a boolean (default false); `image` a string, or null or
/// absent only when `unsandboxed`; `container_id` and `detail` strings or null.
fn local_sandbox_report(session_id: &str, params: &Map<String, Value>) -> Result<Event, String> {
    let state = match params.get("state").and_then(Value::as_str) {
        Some(state @ ("running" | "stopped" | "error")) => state.to_string(),
        _ => return Err("\"state\" must be \"running\", \"stopped\" or \"error\"".into()),
    };
    let unsandboxed = match params.get("unsandboxed") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(flag)) => *flag,
        Some(_) => return Err("\"unsandboxed\" must be a boolean".into()),
    };
    let image = match params.get("image") {
        Some(Value::String(image)) => Some(image.clone()),
        None | Some(Value::Null) if unsandboxed => None,
        _ => return Err("\"image\" must be a string (or null when unsandboxed)".into()),
    };
    let optional = |field: &str| match params.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(format!("\"{field}\" must be a string or null")),
    };
    let (container_id, detail) = (optional("container_id")?, optional("detail")?);
    Ok(Event::LocalSandbox { session_id: session_id.to_string(), state, image, unsandboxed, container_id, detail })
}

/// `session.reportLocalSubagent`'s params as the event they become: `state` one of start,
/// running, completed, failed, cancelled; `subagent_id`, `harness` and `model` non-blank
/// strings; `detail` and `reason` strings or null; `exit_code` an integer, or null (which BAE
/// refuses, but BAE's Python SDK always sends; see docs/bae.md).
fn local_subagent_report(session_id: &str, params: &Map<String, Value>) -> Result<Event, String> {
    let step = match params.get("state").and_then(Value::as_str) {
        Some(state @ ("start" | "running" | "completed" | "failed" | "cancelled")) => state.to_string(),
        _ => return Err("\"state\" must be \"start\", \"running\", \"completed\", \"failed\", or \"cancelled\"".into()),
    };
    let text = |field: &str| params.get(field).and_then(Value::as_str).filter(|t| !t.trim().is_empty());
    let (Some(subagent_id), Some(harness), Some(model)) = (text("subagent_id"), text("harness"), text("model")) else {
        return Err("\"subagent_id\", \"harness\", and \"model\" must be non-empty strings".into());
    };
    let optional = |field: &str| match params.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(format!("\"{field}\" must be a string or null")),
    };
    let (detail, reason) = (optional("detail")?, optional("reason")?);
    let exit_code = match params.get("exit_code") {
        None | Some(Value::Null) => None,
        Some(code) => Some(code.as_i64().ok_or("\"exit_code\" must be an integer")?),
    };
    Ok(Event::Subagent(Box::new(crate::domain::SubagentStep {
        session_id: session_id.to_string(),
        step,
        remote: false,
        subagent_id: subagent_id.to_string(),
        harness: harness.to_string(),
        model: model.to_string(),
        detail,
        reason,
        exit_code,
    })))
}

impl Context<'_> {
    /// The acting key: the client key the session key was minted for.
    fn key_id(&self) -> String {
        self.key.client_id.clone().unwrap_or_else(|| self.key.id.clone())
    }

    /// Sends an op to the session's actor and waits for its answer.
    fn ask<T>(&self, op: impl FnOnce(crossbeam_channel::Sender<Result<T, RpcError>>) -> BaeOp) -> Result<T, RpcError> {
        let (reply, answer) = bounded(1);
        self.bae.op(&self.session_id, op(reply)).map_err(|_| RpcError::Internal)?;
        answer.recv().unwrap_or(Err(RpcError::Internal))
    }
}

/// A terminal frame with `result`, or the error's.
fn answer(id: &Option<RpcId>, outcome: Result<Value, RpcError>, method: &str) -> Answer {
    let Some(id) = id else { return Answer::Frame(None) };
    Answer::Frame(Some(match outcome {
        Ok(result) => format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{result}}}\n"),
        Err(error) => rpc_error_frame_for(id, &error, method),
    }))
}

/// A -32602 answer.
fn invalid(id: Option<RpcId>, why: &str) -> Answer {
    Answer::Frame(id.map(|id| error_frame(&id, -32602, &format!("Invalid params: {why}"))))
}

fn reply(id: &Option<RpcId>, outcome: Result<(), RpcError>, method: &str, result: Value) -> Answer {
    let Some(id) = id else { return Answer::Frame(None) };
    Answer::Frame(Some(match outcome {
        Ok(()) => format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{result}}}\n"),
        Err(error) => rpc_error_frame_for(id, &error, method),
    }))
}

/// A turn: subscribe first, then ask for the gate; the stream follows the turn.
fn turn(
    context: &Context<'_>,
    id: Option<RpcId>,
    kind: TurnKind,
    op: impl FnOnce(String, String, crossbeam_channel::Sender<Result<crate::api::bae::core::Started, RpcError>>) -> BaeOp,
) -> Answer {
    let filter = Filter {
        tenant: BAE_TENANT.to_string(),
        scope: Scope::Session(context.session_id.clone()),
        format: Some(wire::FORMAT),
    };
    let Some(subscription) = context.bae.bus().subscribe(filter, None) else {
        return Answer::Frame(id.map(|id| error_frame(&id, -32603, "Internal error")));
    };
    let run_id = crate::domain::new_id("run");
    let (reply, started) = bounded(1);
    if context.bae.op(&context.session_id, op(context.key_id(), run_id.clone(), reply)).is_err() {
        return Answer::Frame(id.map(|id| error_frame(&id, -32603, "Internal error")));
    }
    let stream = TurnStream {
        bae: context.bae.clone(),
        session_id: context.session_id.clone(),
        run_id,
        kind,
        id,
        subscription,
        started: Some(started),
        events: Vec::new(),
        message: None,
        completed: None,
        faulted: false,
        compacting: false,
        done: false,
        settled: false,
    };
    Answer::Stream(Stream::new(Framing::Ndjson, stream))
}

/// `session.subscribe`: no driver or state check; `since_event_id` replays what follows it
/// (an id not of this session replays from the start).
fn watch(context: &Context<'_>, id: Option<RpcId>, params: &Map<String, Value>) -> Answer {
    let after = match params.get("since_event_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(since)) => Some(context.replay_after(since)),
        Some(_) => {
            let message = "Invalid params: \"since_event_id\" must be a string";
            return Answer::Frame(id.map(|id| error_frame(&id, -32602, message)));
        }
    };
    let filter = Filter {
        tenant: BAE_TENANT.to_string(),
        scope: Scope::Session(context.session_id.clone()),
        format: Some(wire::FORMAT),
    };
    match context.bae.bus().subscribe(filter, after) {
        Some(subscription) => Answer::Stream(Stream::new(
            Framing::Ndjson,
            WatchStream { subscription, replaying: after.is_some(), done: false },
        )),
        None => Answer::Frame(id.map(|id| error_frame(&id, -32603, "Internal error"))),
    }
}

impl Context<'_> {
    /// The seq a replay starts after: the event's, when it is one of this session's.
    fn replay_after(&self, since: &str) -> u64 {
        let Some(seq) = wire::parse_event_id(since) else { return 0 };
        match self.bae.event_session(seq) {
            Some(session) if session == self.session_id => seq,
            _ => 0,
        }
    }
}

/// `params.message`: `{role? = "user", content}`.
fn user_message(params: &Map<String, Value>) -> Result<UserMessage, String> {
    let message = params.get("message").ok_or("missing \"message\"")?;
    let message = message.as_object().ok_or("invalid type: \"message\" must be an object")?;
    let role = match message.get("role") {
        None => Role::User,
        Some(Value::String(role)) if role == "user" => Role::User,
        Some(Value::String(role)) if role == "assistant" => Role::Assistant,
        Some(Value::String(role)) => return Err(format!("unknown role {role:?}")),
        Some(_) => return Err("invalid type: \"role\" must be a string".into()),
    };
    let content = message.get("content").cloned().ok_or("missing field `content`")?;
    // Checked now, so a malformed or oversized message never waits for the gate.
    let parsed = crate::api::bae::core::merge::to_message(role, &content, &Default::default()).map_err(|why| why.0)?;
    within_limits(&parsed)?;
    Ok(UserMessage { role, content })
}

/// The most text a message's text blocks may hold, in characters (the Kestrel door's limit).
const MAX_TEXT_CHARS: usize = 200_000;
/// The most one tool result's content may hold, in bytes of JSON.
const MAX_TOOL_RESULT_BYTES: usize = 4 * 1024 * 1024;
/// The most an image may hold, and all of a message's images together, in bytes of base64
/// (the Kestrel door's 4 MB and 12 MB, decoded).
const MAX_IMAGE_BASE64: usize = 4 * 1024 * 1024 / 3 * 4;
const MAX_IMAGES_BASE64: usize = 12 * 1024 * 1024 / 3 * 4;

/// A message is held to the Kestrel door's limits: its text, each image and all of them, and
/// each tool result (a client's tool output); past one, `-32602` says which.
fn within_limits(message: &crate::domain::Message) -> Result<(), String> {
    use crate::domain::Block;
    let (mut text, mut images) = (0usize, 0usize);
    for block in &message.blocks {
        match block {
            Block::Text { text: piece } => text += piece.chars().count(),
            Block::Image(image) if image.data.len() > MAX_IMAGE_BASE64 => {
                return Err("message too large: an image is larger than 4 MB".into())
            }
            Block::Image(image) => images += image.data.len(),
            Block::ToolResult(result) => {
                let size = result
                    .blocks
                    .as_ref()
                    .map_or(result.content.len(), |blocks| blocks.iter().map(|block| block.to_string().len()).sum());
                if size > MAX_TOOL_RESULT_BYTES {
                    return Err(format!(
                        "message too large: a tool result is larger than {MAX_TOOL_RESULT_BYTES} bytes"
                    ));
                }
            }
            Block::Reasoning { .. } | Block::ToolCall(_) => {}
        }
    }
    if text > MAX_TEXT_CHARS {
        return Err(format!("message too large: its text is longer than {MAX_TEXT_CHARS} characters"));
    }
    if images > MAX_IMAGES_BASE64 {
        return Err("message too large: its images are larger than 12 MB in total".into());
    }
    Ok(())
}

fn prompt(params: &Map<String, Value>) -> Result<Option<String>, String> {
    match params.get("prompt") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(prompt)) => Ok(Some(prompt.clone())),
        Some(_) => Err("invalid type: \"prompt\" must be a string or null".into()),
    }
}

/// `params.tools`: required, an array whose every entry has a non-blank string `name`.
fn client_tools(params: &Map<String, Value>) -> Result<Vec<Value>, String> {
    let tools = params.get("tools").ok_or("missing field `tools`")?;
    let tools = tools.as_array().ok_or("invalid type: \"tools\" must be an array")?;
    for tool in tools {
        let name = tool.get("name").and_then(Value::as_str).unwrap_or_default();
        if name.trim().is_empty() {
            return Err("every tool needs a non-empty \"name\"".into());
        }
    }
    Ok(tools.clone())
}

/// The frame of a refused operation.
pub fn rpc_error_frame(id: &RpcId, error: &RpcError, kind: TurnKind) -> String {
    let method = match kind {
        TurnKind::Send => "session.sendMessage",
        TurnKind::Compact => "session.compact",
    };
    rpc_error_frame_for(id, error, method)
}

fn rpc_error_frame_for(id: &RpcId, error: &RpcError, method: &str) -> String {
    let (code, message) = match error {
        RpcError::NotDriver => (-32001, format!("call session.registerDriver before {method}")),
        RpcError::NotOpen(state) => (-32000, format!("session is {}, not open", state.as_str())),
        RpcError::Gone => (-32000, "session no longer exists".to_string()),
        RpcError::InvalidParams(detail) => (-32602, format!("Invalid params: {detail}")),
        RpcError::MergeInvalid(detail) => (-32000, format!("tool result merge invalid: {detail}")),
        RpcError::NoPausedTurn => (
            -32000,
            "tool result merge invalid: no paused turn is awaiting tool results (it may have timed out and been retired)"
                .to_string(),
        ),
        RpcError::ProfileUnavailable => {
            (-32000, "profile_unavailable: the profile bound to this session is no longer available".to_string())
        }
        RpcError::TurnInProgress => (-32020, "turn in progress: resolve the paused turn before compacting".to_string()),
        RpcError::ToolNotAllowed(name) => (-32015, format!("tool_not_allowed: tool {name:?} is not in the profile's allowlist")),
        RpcError::Internal => (-32603, "Internal error".to_string()),
        RpcError::BudgetExceeded(why) => (-32000, format!("budget_exceeded: {why}")),
        RpcError::SandboxImageNotAllowed(image) => (
            -32011,
            format!("sandbox_image_not_allowed: image {image:?} is not in this session profile's available_sandboxes"),
        ),
        RpcError::SandboxStartFailed(detail) => (-32012, format!("sandbox_start_failed: {detail}")),
        RpcError::SandboxNotRunning => {
            (-32013, "sandbox_not_running: no remote sandbox is running for this session".to_string())
        }
        RpcError::SandboxAlreadyRunning => (
            -32000,
            "a remote sandbox is already running for this session; call session.stopRemoteSandbox first".to_string(),
        ),
        RpcError::SandboxStopFailed(detail) => (-32000, format!("sandbox stop failed: {detail}")),
        RpcError::SandboxExecFailed(detail) => (-32000, format!("sandbox exec failed: {detail}")),
        RpcError::SubagentNotFound(id) => {
            (-32014, format!("subagent_not_found: no tracked subagent {id:?} for this session"))
        }
    };
    error_frame(id, code, &message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(bytes: &str) -> Value {
        let frame = parse(bytes.as_bytes()).err().unwrap();
        serde_json::from_str(frame.trim()).unwrap()
    }

    #[test]
    fn envelope_errors_have_their_codes() {
        assert_eq!(frame("{nope")["error"]["code"], -32700);
        assert_eq!(frame("[]")["error"]["message"], "Invalid Request: batch requests are not supported");
        assert_eq!(frame("7")["error"]["code"], -32600);
        assert_eq!(
            frame(r#"{"id":1,"method":"x"}"#)["error"]["message"],
            "Invalid Request: missing or wrong \"jsonrpc\" version"
        );
        assert_eq!(frame(r#"{"jsonrpc":"2.0","id":null}"#)["error"]["message"], "Invalid Request: missing \"method\"");
        assert_eq!(frame(r#"{"jsonrpc":"2.0","id":null}"#)["id"], Value::Null);
        // A notification with a bad envelope gets nothing.
        assert_eq!(parse(br#"{"jsonrpc":"1.0","method":"x"}"#).err().unwrap(), "");
        let call = parse(br#"{"jsonrpc":"2.0","id":"a","method":"m"}"#).unwrap();
        assert_eq!(
            (call.id.map(|id| id.to_string()), call.method, call.params.len()),
            (Some("\"a\"".into()), "m".to_string(), 0)
        );
    }

    #[test]
    fn an_id_comes_back_exactly_as_it_was_written() {
        for id in ["9007199254740993", "18446744073709551616", "-123456789012345678901234567890", "\"x\"", "null"] {
            let body = format!(r#"{{"jsonrpc":"2.0","id":{id},"params":[]}}"#);
            let answer = parse(body.as_bytes()).err().unwrap();
            assert!(answer.contains(&format!("\"id\":{id},")), "{id}: {answer}");
        }
    }
}
