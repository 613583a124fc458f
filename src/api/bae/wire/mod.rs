//! BAE's shapes of the engine's events and messages: `EventView`s with `evt_` ids, content
//! blocks, and the NDJSON notification frame the bus renders once per event.
//!
//! An event's id is its seq in the event log, as `evt_` and 32 hex digits: the id, the
//! `since_event_id` of a replay and the list cursor are the same number.

use std::borrow::Cow;
use std::collections::HashMap;

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::api::bae::core::compaction::SYNTHETIC;
use crate::api::bae::core::merge::PLAIN;
use crate::bus::{Envelope, Format, LogPage};
use crate::domain::{
    Block, CloseReason, CompactionTrigger, Dispatch, Event, Fault, ImageStatus, Message, ProviderRequest,
    ProviderResponse, Role, ToolResult, ToolSchema,
};

/// The format BAE's streams use.
pub const FORMAT: Format = Format::BaeNdjson;

/// What precedes an `EventView` in a notification frame, and what follows it.
const FRAME_HEAD: &str = "{\"jsonrpc\":\"2.0\",\"method\":\"session.event\",\"params\":";
const FRAME_TAIL: &str = "}\n";

pub fn event_id(seq: u64) -> String {
    format!("evt_{seq:032x}")
}

/// The seq an `evt_` id names, if it is one.
pub fn parse_event_id(id: &str) -> Option<u64> {
    let hex = id.strip_prefix("evt_")?;
    if hex.len() != 32 {
        return None;
    }
    u64::try_from(u128::from_str_radix(hex, 16).ok()?).ok()
}

/// An envelope as one notification frame; empty for events BAE has no type for.
pub fn ndjson_frame(envelope: &Envelope) -> String {
    match view(envelope) {
        Some(view) => format!("{FRAME_HEAD}{view}{FRAME_TAIL}"),
        None => String::new(),
    }
}

/// The `EventView` inside a frame.
pub fn view_of_frame(frame: &str) -> &str {
    frame.strip_prefix(FRAME_HEAD).and_then(|rest| rest.strip_suffix(FRAME_TAIL)).unwrap_or("null")
}

/// An envelope as an `EventView`, or `None` when BAE has no type for its event.
pub fn view(envelope: &Envelope) -> Option<String> {
    view_in(envelope, &mut Rendered::default())
}

/// A page of logged events as `EventView`s. The page's `provider.request`s repeat the
/// session's stored history, each request all of it so far: each stored message is rendered
/// once for the page and copied into every request that names it.
/// The views are written into `out` as the items of a JSON array, without its brackets.
pub fn write_page_views(page: &LogPage, out: &mut Vec<u8>) {
    let mut rendered = Rendered { history: Some(&page.history), ..Rendered::default() };
    let mut first = true;
    for envelope in &page.envelopes {
        let mark = out.len();
        if !first {
            out.push(b',');
        }
        if write_view(envelope, &mut rendered, out) {
            first = false;
        } else {
            out.truncate(mark);
        }
    }
}

/// Stored messages already rendered, by id (an id names one stored message of a session);
/// and, for an unresolved request, where its stored messages are.
#[derive(Default)]
struct Rendered<'p> {
    history: Option<&'p HashMap<String, HashMap<String, Message>>>,
    by_id: HashMap<&'p str, usize>,
    written: Vec<Box<RawValue>>,
    /// The last request's stored messages, as indexes into `written`: the next request of
    /// the session mostly repeats them in the same places, which a comparison of ids finds
    /// more cheaply than a lookup.
    last: Vec<(&'p str, usize)>,
}

impl<'p> Rendered<'p> {
    /// `request`'s stored messages as indexes into `written`, each rendered the first time:
    /// from the page's history while the request is unresolved (a message that is gone: its
    /// empty slot, as `ProviderRequest::resolve` leaves it).
    fn stored(&mut self, request: &'p ProviderRequest) -> Vec<usize> {
        let stored = &request.messages[..request.stored.min(request.messages.len())];
        let mut indexes = Vec::with_capacity(stored.len());
        for (place, slot) in stored.iter().enumerate() {
            let index = match self.last.get(place) {
                Some(&(id, index)) if id == slot.id => index,
                _ => self.index(request, slot),
            };
            indexes.push(index);
        }
        self.last = stored.iter().map(|slot| slot.id.as_str()).zip(indexes.iter().copied()).collect();
        indexes
    }

    fn index(&mut self, request: &'p ProviderRequest, slot: &'p Message) -> usize {
        if let Some(&index) = self.by_id.get(slot.id.as_str()) {
            return index;
        }
        let found = match request.unresolved {
            true => self.history.and_then(|history| history.get(&request.session_id)?.get(&slot.id)),
            false => None,
        };
        self.written.push(raw(&message_json(found.unwrap_or(slot))));
        self.by_id.insert(&slot.id, self.written.len() - 1);
        self.written.len() - 1
    }
}

/// An `EventView`; its fields in the order of a JSON object's keys.
#[derive(Serialize)]
struct View<'a, P: Serialize> {
    client_key_id: Option<&'a str>,
    created_at: &'a str,
    event_type: &'static str,
    id: String,
    payload: P,
    session_id: Option<&'a str>,
}

fn view_in<'p>(envelope: &'p Envelope, rendered: &mut Rendered<'p>) -> Option<String> {
    let mut out = Vec::new();
    write_view(envelope, rendered, &mut out).then(|| String::from_utf8(out).expect("serde_json writes UTF-8"))
}

/// Writes `envelope`'s view into `out`; false (with `out` in an unspecified state) when BAE
/// has no type for its event.
fn write_view<'p>(envelope: &'p Envelope, rendered: &mut Rendered<'p>, out: &mut Vec<u8>) -> bool {
    let written = match &*envelope.event {
        Event::ProviderRequest(request) => serde_json::to_writer(
            &mut *out,
            &View::new(envelope, "provider.request", RequestPayload::new(request, rendered)),
        ),
        event => match type_and_payload(event) {
            Some((event_type, payload)) => serde_json::to_writer(out, &View::new(envelope, event_type, payload)),
            None => return false,
        },
    };
    written.is_ok()
}

impl<'a, P: Serialize> View<'a, P> {
    fn new(envelope: &'a Envelope, event_type: &'static str, payload: P) -> View<'a, P> {
        View {
            client_key_id: envelope.actor.as_deref(),
            created_at: &envelope.at,
            event_type,
            id: event_id(envelope.seq),
            payload,
            session_id: envelope.session_id(),
        }
    }
}

/// A `provider.request`'s payload; its fields in the order of a JSON object's keys.
#[derive(Serialize)]
struct RequestPayload<'a> {
    attempt: u32,
    base_url: &'a Option<String>,
    kind: &'static str,
    max_tokens: Option<u32>,
    messages: Vec<Cow<'a, RawValue>>,
    model: &'a str,
    provider: &'a str,
    tools: Vec<Value>,
}

impl<'a> RequestPayload<'a> {
    fn new<'p: 'a>(request: &'p ProviderRequest, rendered: &'a mut Rendered<'p>) -> RequestPayload<'a> {
        let stored = rendered.stored(request);
        let own = request.messages[stored.len()..].iter().map(|message| Cow::Owned(raw(&message_json(message))));
        let written = &rendered.written;
        let history = stored.into_iter().map(|index| Cow::Borrowed(&*written[index]));
        RequestPayload {
            attempt: request.attempt,
            base_url: &request.base_url,
            kind: kind(request.attempt, request.fallback),
            max_tokens: request.max_tokens,
            messages: history.chain(own).collect(),
            model: &request.model,
            provider: &request.provider,
            tools: request.tools.iter().map(tool).collect(),
        }
    }
}

fn raw(value: &Value) -> Box<RawValue> {
    serde_json::value::to_raw_value(value).expect("a JSON value is written")
}

fn type_and_payload(event: &Event) -> Option<(&'static str, Value)> {
    Some(match event {
        Event::ClientAttached { joined, client_version, tools, sandbox_tools, subagent_tools, .. } => (
            if *joined { "session.join" } else { "session.open" },
            json!({ "client_version": client_version, "tools": tools, "sandbox_tools": sandbox_tools, "subagent_tools": subagent_tools }),
        ),
        Event::DriverRegistered { .. } => ("session.driver.register", json!({})),
        Event::SandboxImages { images, .. } => {
            let images: Vec<Value> = images.iter().map(image_status).collect();
            ("session.sandbox.available", json!({ "images": images }))
        }
        Event::Subagent(step) => subagent_event(step),
        Event::MessageCompleted { message, .. } => message_event(message),
        Event::ProviderResponse(response) => ("provider.response", provider_response(response)),
        Event::ToolStarted { call, .. } => {
            let mut payload = json!({ "id": call.id, "name": call.name, "input": call.arguments, "dispatch": dispatch(&call.dispatch) });
            if let Dispatch::Mcp { server } = &call.dispatch {
                payload["server_name"] = server_name(server);
            }
            ("tool.call", payload)
        }
        Event::ToolFinished { result, dispatch: by, .. } => ("tool.result", tool_result_payload(result, by)),
        Event::LocalSandbox { state, image, unsandboxed, container_id, detail, .. } => {
            let kind = match state.as_str() {
                "running" => "session.sandbox.running",
                "stopped" => "session.sandbox.stopped",
                _ => "session.sandbox.error",
            };
            let payload = json!({ "dispatch": "local", "image": image, "unsandboxed": unsandboxed, "container_id": container_id, "detail": detail });
            (kind, payload)
        }
        Event::SandboxRequest { tool, input, command, .. } => {
            ("sandbox.request", json!({ "tool": tool, "input": input, "command": command }))
        }
        Event::SandboxResponse { sandbox_id, ok, result, error, .. } => match error {
            Some(error) => ("sandbox.response", json!({ "sandbox_id": sandbox_id, "ok": false, "error": error })),
            None => ("sandbox.response", json!({ "sandbox_id": sandbox_id, "ok": ok, "result": result })),
        },
        Event::RemoteSandbox { step, image, sandbox_id, reason, phase, detail, unsandboxed, .. } => {
            let mut payload = json!({ "image": image, "dispatch": "remote" });
            match step.as_str() {
                "start" => {}
                "stop" => {
                    payload["sandbox_id"] = json!(sandbox_id);
                    payload["reason"] = json!(reason);
                }
                "stopped" => {
                    payload["sandbox_id"] = json!(sandbox_id);
                    payload["reason"] = json!(reason);
                    payload["unsandboxed"] = json!(unsandboxed);
                }
                "running" => {
                    payload["sandbox_id"] = json!(sandbox_id);
                    payload["unsandboxed"] = json!(unsandboxed);
                }
                _ => {
                    if sandbox_id.is_some() {
                        payload["sandbox_id"] = json!(sandbox_id);
                    }
                    payload["phase"] = json!(phase);
                    payload["detail"] = json!(detail);
                    payload["unsandboxed"] = json!(unsandboxed);
                }
            }
            let kind = match step.as_str() {
                "start" => "session.sandbox.start",
                "running" => "session.sandbox.running",
                "stop" => "session.sandbox.stop",
                "stopped" => "session.sandbox.stopped",
                _ => "session.sandbox.error",
            };
            (kind, payload)
        }
        Event::McpRequest { server_name, tool, input, .. } => {
            ("mcp.request", json!({ "method": "tools/call", "server_name": server_name, "tool": tool, "input": input }))
        }
        Event::McpResponse { server_name, ok, result, error, .. } => match error {
            Some(error) => ("mcp.response", json!({ "server_name": server_name, "ok": false, "error": error })),
            None => ("mcp.response", json!({ "server_name": server_name, "ok": ok, "result": result })),
        },
        Event::SessionFault { fault, .. } => ("session.error", fault_payload(fault)),
        Event::SessionClosed { reason, .. } => {
            let reason = match reason {
                CloseReason::ClientClose => "client_close",
                CloseReason::ClientKeyRevoked => "client_key_revoked",
            };
            ("session.close", json!({ "reason": reason }))
        }
        Event::CompactionStarted { trigger, message_count, .. } => {
            let trigger = match trigger {
                CompactionTrigger::Auto => "auto",
                CompactionTrigger::Client => "client",
            };
            ("session.compaction.started", json!({ "trigger": trigger, "message_count": message_count }))
        }
        Event::CompactionCompleted(done) => (
            "session.compaction.completed",
            json!({
                "preamble_event_id": event_id(done.preamble_event),
                "summary_event_id": event_id(done.summary_event),
                "compacted_message_count": done.compacted_message_count,
                "input_tokens": done.input_tokens,
                "summary_tokens": done.summary_tokens,
            }),
        ),
        _ => return None,
    })
}

/// An image's provisioning status as `session.sandbox.available` lists it.
pub fn image_status(image: &ImageStatus) -> Value {
    let mut status = json!({ "name": image.name, "status": image.status });
    if let Some(detail) = &image.detail {
        status["detail"] = json!(detail);
    }
    status
}

/// `session.error`'s payload: the fault's reason and what it carries.
fn fault_payload(fault: &Fault) -> Value {
    match fault {
        Fault::ProviderConfig { detail } => json!({ "reason": "provider_config", "detail": detail }),
        Fault::ProviderCallFailed { provider, detail } => {
            json!({ "reason": "provider_call_failed", "provider": provider, "detail": detail })
        }
        Fault::AllProvidersFailed { attempts } => json!({ "reason": "all_providers_failed", "attempts": attempts }),
        Fault::LoopLimit { max_iterations } => json!({ "reason": "loop_limit", "max_iterations": max_iterations }),
        Fault::BudgetExceeded { detail } => json!({ "reason": "budget_exceeded", "detail": detail }),
        Fault::ProfileUnavailable { profile_id } => {
            json!({ "reason": "profile_unavailable", "profile_id": profile_id })
        }
        Fault::PrimaryProviderUnavailable { profile_id, primary_provider } => json!({
            "reason": "primary_provider_unavailable", "profile_id": profile_id, "primary_provider": primary_provider,
        }),
        Fault::DriverTurnAbandoned { owner_client_key_id } => {
            json!({ "reason": "driver_turn_abandoned", "owner_client_key_id": owner_client_key_id })
        }
        Fault::ToolResultMergeInvalid { detail } => json!({ "reason": "tool_result_merge_invalid", "detail": detail }),
    }
}

/// A client's message is `client.message.send`; the model's, and anything the server wrote
/// on its own (flagged `synthetic`), `server.message.send`.
fn message_event(message: &Message) -> (&'static str, Value) {
    let synthetic = message.meta.as_ref().and_then(|meta| meta.get(SYNTHETIC)).cloned();
    let mut payload = message_json(message);
    match synthetic {
        Some(why) => {
            payload["synthetic"] = why;
            ("server.message.send", payload)
        }
        None if message.role == Role::User => ("client.message.send", payload),
        None => ("server.message.send", payload),
    }
}

/// `{role, content}`: content a string when the client sent one, else blocks.
pub fn message_json(message: &Message) -> Value {
    let role = match message.role {
        Role::User | Role::Tool => "user",
        Role::Assistant => "assistant",
        Role::System => "system",
    };
    json!({ "role": role, "content": content(message) })
}

pub fn content(message: &Message) -> Value {
    if message.flag(PLAIN) {
        if let [Block::Text { text }] = message.blocks.as_slice() {
            return Value::String(text.clone());
        }
    }
    Value::Array(message.blocks.iter().filter_map(block).collect())
}

/// A block as BAE's content blocks have it. Reasoning is left out: BAE's content model has
/// no such block (its SDKs refuse unknown ones), and Kestrel never asks a provider for it on
/// a BAE turn; only `builtin/echo` produces some.
fn block(block: &Block) -> Option<Value> {
    Some(match block {
        Block::Text { text } => json!({ "type": "text", "text": text }),
        Block::Reasoning { .. } => return None,
        Block::Image(image) => json!({ "type": "image", "source": {
            "type": "base64", "media_type": image.mime_type, "data": image.data,
        }}),
        Block::ToolCall(call) => {
            let mut block = json!({ "type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments });
            if !call.dispatch.is_server() {
                block["dispatch"] = Value::String(dispatch(&call.dispatch).into());
            }
            block
        }
        Block::ToolResult(result) => {
            let mut block =
                json!({ "type": "tool_result", "tool_use_id": result.call_id, "content": result_content(result) });
            if !result.ok {
                block["is_error"] = Value::Bool(true);
            }
            block
        }
    })
}

fn result_content(result: &ToolResult) -> Value {
    match &result.blocks {
        Some(blocks) => Value::Array(blocks.clone()),
        None => Value::String(result.content.clone()),
    }
}

fn dispatch(dispatch: &Dispatch) -> &'static str {
    match dispatch {
        Dispatch::Client => "client",
        Dispatch::Mcp { .. } | Dispatch::Server => "mcp",
        Dispatch::Sandbox => "sandbox",
        Dispatch::Subagent => "subagent",
    }
}

/// An MCP server's name; `null` for a call no server could take.
fn server_name(server: &str) -> Value {
    if server.is_empty() {
        Value::Null
    } else {
        Value::String(server.to_string())
    }
}

/// `session.subagent.*`: who, then what a terminal step adds (completed: `exit_code`;
/// failed: `reason` and `exit_code`; cancelled: `reason`).
fn subagent_event(step: &crate::domain::SubagentStep) -> (&'static str, Value) {
    let mut payload = json!({
        "dispatch": if step.remote { "remote" } else { "local" },
        "subagent_id": step.subagent_id,
        "harness": step.harness,
        "model": step.model,
        "detail": step.detail,
    });
    let kind = match step.step.as_str() {
        "start" => "session.subagent.start",
        "running" => "session.subagent.running",
        "completed" => {
            payload["exit_code"] = json!(step.exit_code);
            "session.subagent.completed"
        }
        "failed" => {
            payload["reason"] = json!(step.reason);
            payload["exit_code"] = json!(step.exit_code);
            "session.subagent.failed"
        }
        _ => {
            payload["reason"] = json!(step.reason);
            "session.subagent.cancelled"
        }
    };
    (kind, payload)
}

fn tool_result_payload(result: &ToolResult, by: &Dispatch) -> Value {
    let mut payload = Map::new();
    payload.insert("tool_use_id".into(), json!(result.call_id));
    payload.insert("dispatch".into(), json!(dispatch(by)));
    match by {
        Dispatch::Client => {}
        Dispatch::Mcp { server } => {
            payload.insert("server_name".into(), server_name(server));
            payload.insert("is_error".into(), json!(!result.ok));
        }
        _ => {
            payload.insert("is_error".into(), json!(!result.ok));
        }
    }
    payload.insert("content".into(), result_content(result));
    Value::Object(payload)
}

/// `primary` or `fallback`: a retry of the primary is `primary` (BAE makes no retries; in
/// its logs every attempt after the first was a fallback).
fn kind(attempt: u32, fallback: Option<bool>) -> &'static str {
    match fallback.unwrap_or(attempt > 0) {
        false => "primary",
        true => "fallback",
    }
}

/// A tool as the provider is told of it (a blank description was given as none).
pub fn tool(tool: &ToolSchema) -> Value {
    let description = if tool.description.is_empty() { Value::Null } else { json!(tool.description) };
    json!({ "name": tool.name, "description": description, "input_schema": tool.parameters })
}

fn provider_response(response: &ProviderResponse) -> Value {
    let base = json!({ "attempt": response.attempt, "kind": kind(response.attempt, response.fallback), "provider": response.provider });
    let mut payload = base.as_object().cloned().unwrap_or_default();
    if response.ok {
        payload.insert("ok".into(), json!(true));
        payload.insert("status".into(), json!(200));
        payload.insert("body".into(), response.body.clone().unwrap_or(Value::Null));
    } else {
        payload.insert("ok".into(), json!(false));
        payload.insert("status".into(), json!(response.status));
        payload.insert("error".into(), json!(response.error));
        payload.insert("body".into(), response.body.clone().unwrap_or(Value::Null));
    }
    Value::Object(payload)
}

#[cfg(test)]
mod tests;
