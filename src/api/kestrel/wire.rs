//! Kestrel protocol 1.0's shapes of the engine's model: `ChatMessage`, `SessionDetail`, and the
//! `ServerEventEnvelope` of the event streams.
//!
//! The engine keeps messages as ordered blocks (`domain::Message`); Kestrel shows a message as
//! one `content` string with `images`, `reasoning`, `toolCalls`, and for a tool's answer
//! `toolCallId` and `toolName`. Borrowed views, so nothing is copied before it is serialized.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::bus::{Envelope, Format};
use crate::domain::{Event, ImageAttachment, Message, Role, SessionDetail, SessionSummary, ToolCall, Usage};

/// Kestrel's `ChatMessage`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WireMessage<'a> {
    id: &'a str,
    role: Role,
    content: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    images: Vec<&'a ImageAttachment>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<&'a ToolCall>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_name: Option<&'a str>,
    created_at: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<&'a str>,
    /// Replaced by a compaction's summary (shown only when asked for).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    hidden: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    meta: Option<&'a Map<String, Value>>,
}

impl<'a> From<&'a Message> for WireMessage<'a> {
    fn from(message: &'a Message) -> WireMessage<'a> {
        let result = message.tool_result();
        WireMessage {
            id: &message.id,
            role: message.role,
            // A tool's answer is its result's content; anything else, its text.
            content: result.map_or_else(|| message.text(), |r| r.content.clone()),
            images: message.images().collect(),
            reasoning: message.reasoning(),
            tool_calls: message.tool_calls().collect(),
            tool_call_id: result.map(|r| r.call_id.as_str()),
            tool_name: result.map(|r| r.name.as_str()),
            created_at: &message.created_at,
            model: message.model.as_deref(),
            hidden: message.flag("compacted"),
            meta: message.meta.as_ref(),
        }
    }
}

/// Kestrel's `SessionDetail`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WireSession<'a> {
    #[serde(flatten)]
    summary: &'a SessionSummary,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    system_prompt: Option<&'a str>,
    /// What every model call of the session counted (and cost, where priced).
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
}

impl<'a> From<&'a SessionDetail> for WireSession<'a> {
    fn from(detail: &'a SessionDetail) -> WireSession<'a> {
        WireSession {
            summary: &detail.summary,
            messages: detail.messages.iter().map(WireMessage::from).collect(),
            system_prompt: detail.system_prompt.as_deref(),
            usage: session_usage(&detail.messages),
        }
    }
}

/// The sum of the usage each answer recorded (`meta.usage`); `None` before any.
fn session_usage(messages: &[Message]) -> Option<Usage> {
    let mut total: Option<Usage> = None;
    for message in messages {
        let recorded = message.meta.as_ref().and_then(|meta| meta.get("usage"));
        if let Some(usage) = recorded.and_then(|value| Usage::deserialize(value).ok()) {
            total.get_or_insert_with(Usage::default).add(&usage);
        }
    }
    total
}

/// The two events that carry a message, with the message in Kestrel's shape.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MessageEvent<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    session_id: &'a str,
    message: WireMessage<'a>,
}

/// `session.rewound` with Kestrel's `ChatMessage`s.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RewoundEvent<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    session_id: &'a str,
    message_id: &'a str,
    messages: Vec<WireMessage<'a>>,
}

/// An event as Kestrel's `SessionEvent`.
pub fn event_json(event: &Event) -> Result<String, serde_json::Error> {
    match event {
        Event::MessageStarted { session_id, message } | Event::MessageCompleted { session_id, message } => {
            let wire = MessageEvent { kind: event.kind(), session_id, message: WireMessage::from(message) };
            serde_json::to_string(&wire)
        }
        Event::SessionRewound { session_id, message_id, messages } => {
            let messages: Vec<WireMessage<'_>> = messages.iter().map(WireMessage::from).collect();
            let wire = RewoundEvent { kind: event.kind(), session_id, message_id, messages };
            serde_json::to_string(&wire)
        }
        // Every other event's own serde shape is Kestrel's.
        other => serde_json::to_string(other),
    }
}

/// An envelope as one SSE frame: `id: <seq>` and the `ServerEventEnvelope` on one `data:` line.
/// Built once per envelope, by the first stream that sends it.
pub fn sse_frame(envelope: &Envelope) -> String {
    match event_json(&envelope.event) {
        Ok(event) => format!(
            "id: {seq}\ndata: {{\"seq\":{seq},\"at\":\"{at}\",\"event\":{event}}}\n\n",
            seq = envelope.seq,
            at = envelope.at
        ),
        Err(error) => {
            log::error!("event {} could not be serialized: {error}", envelope.seq);
            String::new()
        }
    }
}

/// An envelope as a frame of `/api/plugins/events`: `event: plugins.changed` with Kestrel's
/// `PluginChangeEvent`; nothing for any other event.
pub fn plugins_frame(envelope: &Envelope) -> String {
    match &*envelope.event {
        Event::PluginsChanged { plugins, at } => {
            let body = serde_json::json!({ "type": "plugins.changed", "plugins": plugins, "at": at });
            format!("event: plugins.changed\ndata: {body}\n\n")
        }
        _ => String::new(),
    }
}

/// The format the plugin stream uses.
pub const PLUGINS_FORMAT: Format = Format::KestrelPlugins;

/// The format the Kestrel streams use.
pub const FORMAT: Format = Format::KestrelSse;
