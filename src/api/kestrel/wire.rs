//! Kestrel protocol 1.0's shapes of the engine's model: `ChatMessage`, `SessionDetail`,
//! `SessionSummary`, tool calls and results, approvals, usage, tools, the sandbox commands
//! run in, and the `ServerEventEnvelope` of the event streams.
//!
//! The engine's types serialize to its stored form (`domain`), which is not this: every shape
//! the Kestrel door shows is written here, so renaming a field of the protocol never touches
//! what the store keeps. The engine keeps messages as ordered blocks; Kestrel shows a message
//! as one `content` string with `images`, `reasoning`, `toolCalls`, and for a tool's answer
//! `toolCallId` and `toolName`. Borrowed views, so nothing is copied before it is serialized.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::bus::{Envelope, Format};
use crate::domain::{
    ApprovalRequest, Cost, DeltaChannel, Dispatch, Event, ImageAttachment, Message, NoticeLevel, Role, RunOutcome,
    SandboxState, SessionDetail, SessionSummary, ToolCall, ToolResult, ToolSchema, Usage,
};

/// Kestrel's `ChatMessage`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WireMessage<'a> {
    id: &'a str,
    role: Role,
    content: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    images: Vec<WireImage<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<WireToolCall<'a>>,
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
            images: message.images().map(WireImage::from).collect(),
            reasoning: message.reasoning(),
            tool_calls: message.tool_calls().map(WireToolCall::from).collect(),
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
    summary: WireSummary<'a>,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    system_prompt: Option<&'a str>,
    /// What every model call of the session counted (and cost, where priced).
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<WireUsage>,
}

impl<'a> From<&'a SessionDetail> for WireSession<'a> {
    fn from(detail: &'a SessionDetail) -> WireSession<'a> {
        WireSession {
            summary: WireSummary::from(&detail.summary),
            messages: detail.messages.iter().map(WireMessage::from).collect(),
            system_prompt: detail.system_prompt.as_deref(),
            usage: session_usage(&detail.messages).as_ref().map(WireUsage::from),
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

/// An event as Kestrel's `SessionEvent`; `None` for an event no Kestrel stream carries (a BAE
/// session's, which the `@bae` tenant keeps from every Kestrel stream).
/// Appended to `out`, so that a frame is built in one buffer without a second copy.
pub fn event_json(event: &Event, out: &mut Vec<u8>) -> Option<Result<(), serde_json::Error>> {
    let kind = event.kind();
    let wire = match event {
        Event::MessageStarted { session_id, message } | Event::MessageCompleted { session_id, message } => {
            let wire = MessageEvent { kind, session_id, message: WireMessage::from(message) };
            return Some(serde_json::to_writer(out, &wire));
        }
        Event::SessionRewound { session_id, message_id, messages } => {
            let messages: Vec<WireMessage<'_>> = messages.iter().map(WireMessage::from).collect();
            let wire = RewoundEvent { kind, session_id, message_id, messages };
            return Some(serde_json::to_writer(out, &wire));
        }
        Event::SessionUpdated { session_id, session } => {
            WireEvent::SessionUpdated { session_id, session: WireSummary::from(session) }
        }
        Event::RunStarted { session_id, run_id, sandbox } => {
            WireEvent::RunStarted { session_id, run_id, sandbox: sandbox.as_ref().map(WireSandbox::from) }
        }
        Event::RunFinished { session_id, run_id, status, usage } => WireEvent::RunFinished {
            session_id,
            run_id,
            status: outcome_name(*status),
            usage: usage.as_ref().map(WireUsage::from),
        },
        Event::RunFailed { session_id, run_id, error } => WireEvent::RunFailed { session_id, run_id, error },
        Event::MessageDelta { session_id, message_id, channel, delta } => {
            let channel = match channel {
                DeltaChannel::Text => "text",
                DeltaChannel::Reasoning => "reasoning",
            };
            WireEvent::MessageDelta { session_id, message_id, channel, delta }
        }
        Event::ToolStarted { session_id, call, permission } => {
            WireEvent::ToolStarted { session_id, call: WireToolCall::from(call), permission: permission.as_deref() }
        }
        Event::ToolFinished { session_id, result, dispatch } => WireEvent::ToolFinished {
            session_id,
            result: WireToolResult::from(result),
            dispatch: WireDispatch::of(dispatch),
        },
        Event::ApprovalRequested { session_id, approval } => {
            WireEvent::ApprovalRequested { session_id, approval: WireApproval::from(approval) }
        }
        Event::ApprovalResolved { session_id, approval_id, approved, arguments, remembered } => {
            let (arguments, remembered) = (arguments.as_ref(), remembered.as_deref());
            WireEvent::ApprovalResolved { session_id, approval_id, approved: *approved, arguments, remembered }
        }
        Event::SessionDeleted { session_id } => WireEvent::SessionDeleted { session_id },
        Event::SessionCreated { session_id, session } => {
            WireEvent::SessionCreated { session_id, session: WireSummary::from(session) }
        }
        Event::ScheduleFired { schedule_id, session_id, run_id, due_at } => {
            WireEvent::ScheduleFired { schedule_id, session_id, run_id, due_at }
        }
        Event::ScheduleSkipped { schedule_id, session_id, reason, due_at } => {
            WireEvent::ScheduleSkipped { schedule_id, session_id: session_id.as_deref(), reason, due_at }
        }
        Event::ContextCompacted { session_id, removed_messages, kept_messages, tokens_before, tokens_after } => {
            WireEvent::ContextCompacted {
                session_id,
                removed_messages: *removed_messages,
                kept_messages: *kept_messages,
                tokens_before: *tokens_before,
                tokens_after: *tokens_after,
            }
        }
        Event::Notice { level, message, session_id } => {
            let level = match level {
                NoticeLevel::Info => "info",
                NoticeLevel::Warn => "warn",
                NoticeLevel::Error => "error",
            };
            WireEvent::Notice { level, message, session_id: session_id.as_deref() }
        }
        _ => return None,
    };
    Some(serde_json::to_writer(out, &wire))
}

/// The protocol's events besides the two that carry a message and `session.rewound`.
#[derive(Serialize)]
#[serde(tag = "type")]
enum WireEvent<'a> {
    #[serde(rename = "session.updated", rename_all = "camelCase")]
    SessionUpdated { session_id: &'a str, session: WireSummary<'a> },
    #[serde(rename = "run.started", rename_all = "camelCase")]
    RunStarted {
        session_id: &'a str,
        run_id: &'a str,
        /// Kestrel's extension: how the run's commands are contained.
        #[serde(skip_serializing_if = "Option::is_none")]
        sandbox: Option<WireSandbox<'a>>,
    },
    #[serde(rename = "run.finished", rename_all = "camelCase")]
    RunFinished {
        session_id: &'a str,
        run_id: &'a str,
        status: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        usage: Option<WireUsage>,
    },
    #[serde(rename = "run.failed", rename_all = "camelCase")]
    RunFailed { session_id: &'a str, run_id: &'a str, error: &'a str },
    #[serde(rename = "message.delta", rename_all = "camelCase")]
    MessageDelta { session_id: &'a str, message_id: &'a str, channel: &'static str, delta: &'a str },
    #[serde(rename = "tool.started", rename_all = "camelCase")]
    ToolStarted {
        session_id: &'a str,
        call: WireToolCall<'a>,
        /// Kestrel's extension: how the call's permission was decided.
        #[serde(skip_serializing_if = "Option::is_none")]
        permission: Option<&'a crate::domain::PermissionNote>,
    },
    #[serde(rename = "tool.finished", rename_all = "camelCase")]
    ToolFinished {
        session_id: &'a str,
        result: WireToolResult<'a>,
        #[serde(skip_serializing_if = "Option::is_none")]
        dispatch: Option<WireDispatch<'a>>,
    },
    #[serde(rename = "approval.requested", rename_all = "camelCase")]
    ApprovalRequested { session_id: &'a str, approval: WireApproval<'a> },
    #[serde(rename = "approval.resolved", rename_all = "camelCase")]
    ApprovalResolved {
        session_id: &'a str,
        approval_id: &'a str,
        approved: bool,
        /// Kestrel's extension: the arguments a person gave the call.
        #[serde(skip_serializing_if = "Option::is_none")]
        arguments: Option<&'a Map<String, Value>>,
        /// Kestrel's extension: the rule the decision was remembered as.
        #[serde(skip_serializing_if = "Option::is_none")]
        remembered: Option<&'a str>,
    },
    #[serde(rename = "session.deleted", rename_all = "camelCase")]
    SessionDeleted { session_id: &'a str },
    /// Kestrel's extension: a session was made.
    #[serde(rename = "session.created", rename_all = "camelCase")]
    SessionCreated { session_id: &'a str, session: WireSummary<'a> },
    /// Kestrel's extension: a schedule sent its message.
    #[serde(rename = "schedule.fired", rename_all = "camelCase")]
    ScheduleFired { schedule_id: &'a str, session_id: &'a str, run_id: &'a str, due_at: &'a str },
    /// Kestrel's extension: a schedule's fire was skipped, and why.
    #[serde(rename = "schedule.skipped", rename_all = "camelCase")]
    ScheduleSkipped { schedule_id: &'a str, session_id: Option<&'a str>, reason: &'a str, due_at: &'a str },
    #[serde(rename = "context.compacted", rename_all = "camelCase")]
    ContextCompacted {
        session_id: &'a str,
        removed_messages: u64,
        kept_messages: u64,
        tokens_before: u64,
        tokens_after: u64,
    },
    #[serde(rename = "notice", rename_all = "camelCase")]
    Notice {
        level: &'static str,
        message: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        session_id: Option<&'a str>,
    },
}

fn outcome_name(outcome: RunOutcome) -> &'static str {
    match outcome {
        RunOutcome::Completed => "completed",
        RunOutcome::Cancelled => "cancelled",
        RunOutcome::MaxSteps => "max_steps",
        RunOutcome::Paused => "paused",
        RunOutcome::BudgetExceeded => "budget_exceeded",
    }
}

/// Kestrel's `SessionSummary`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WireSummary<'a> {
    id: &'a str,
    title: &'a str,
    created_at: &'a str,
    updated_at: &'a str,
    status: &'static str,
    model: &'a str,
    message_count: u64,
    workspace: &'a str,
    /// Kestrel's extension: the session and message a fork was made from.
    #[serde(skip_serializing_if = "Option::is_none")]
    forked_from: Option<&'a crate::domain::ForkedFrom>,
}

impl<'a> From<&'a SessionSummary> for WireSummary<'a> {
    fn from(summary: &'a SessionSummary) -> WireSummary<'a> {
        WireSummary {
            id: &summary.id,
            title: &summary.title,
            created_at: &summary.created_at,
            updated_at: &summary.updated_at,
            status: summary.status.as_str(),
            model: &summary.model,
            message_count: summary.message_count,
            workspace: &summary.workspace,
            forked_from: summary.forked_from.as_ref(),
        }
    }
}

/// Kestrel's `ImageAttachment`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WireImage<'a> {
    mime_type: &'a str,
    data: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
}

impl<'a> From<&'a ImageAttachment> for WireImage<'a> {
    fn from(image: &'a ImageAttachment) -> WireImage<'a> {
        WireImage { mime_type: &image.mime_type, data: &image.data, name: image.name.as_deref() }
    }
}

/// Kestrel's `ToolCall`.
#[derive(Serialize)]
struct WireToolCall<'a> {
    id: &'a str,
    name: &'a str,
    arguments: &'a Map<String, Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dispatch: Option<WireDispatch<'a>>,
}

impl<'a> From<&'a ToolCall> for WireToolCall<'a> {
    fn from(call: &'a ToolCall) -> WireToolCall<'a> {
        WireToolCall {
            id: &call.id,
            name: &call.name,
            arguments: &call.arguments,
            dispatch: WireDispatch::of(&call.dispatch),
        }
    }
}

/// Who ran a call, when not the server's own tools.
#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum WireDispatch<'a> {
    Client,
    Mcp { server: &'a str },
    Sandbox,
    Subagent,
}

impl<'a> WireDispatch<'a> {
    fn of(dispatch: &'a Dispatch) -> Option<WireDispatch<'a>> {
        Some(match dispatch {
            Dispatch::Server => return None,
            Dispatch::Client => WireDispatch::Client,
            Dispatch::Mcp { server } => WireDispatch::Mcp { server },
            Dispatch::Sandbox => WireDispatch::Sandbox,
            Dispatch::Subagent => WireDispatch::Subagent,
        })
    }
}

/// Kestrel's `ToolResult`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WireToolResult<'a> {
    call_id: &'a str,
    name: &'a str,
    ok: bool,
    content: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    blocks: Option<&'a Vec<Value>>,
}

impl<'a> From<&'a ToolResult> for WireToolResult<'a> {
    fn from(result: &'a ToolResult) -> WireToolResult<'a> {
        WireToolResult {
            call_id: &result.call_id,
            name: &result.name,
            ok: result.ok,
            content: &result.content,
            duration_ms: result.duration_ms,
            error: result.error.as_deref(),
            data: result.data.as_ref(),
            blocks: result.blocks.as_ref(),
        }
    }
}

/// Kestrel's `ApprovalRequest`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WireApproval<'a> {
    id: &'a str,
    call_id: &'a str,
    tool_name: &'a str,
    arguments: &'a Map<String, Value>,
    created_at: &'a str,
    /// Kestrel's extension: the rule that made the call wait (none: the tool's permission).
    #[serde(skip_serializing_if = "Option::is_none")]
    rule: Option<&'a crate::domain::RuleView>,
    /// Kestrel's extension: the paths a walking tool withheld, which this approval is about.
    #[serde(skip_serializing_if = "Option::is_none")]
    withheld: Option<&'a Vec<String>>,
}

impl<'a> From<&'a ApprovalRequest> for WireApproval<'a> {
    fn from(approval: &'a ApprovalRequest) -> WireApproval<'a> {
        WireApproval {
            id: &approval.id,
            call_id: &approval.call_id,
            tool_name: &approval.tool_name,
            arguments: &approval.arguments,
            created_at: &approval.created_at,
            rule: approval.rule.as_ref(),
            withheld: approval.withheld.as_ref(),
        }
    }
}

/// Kestrel's `Usage`, with its `cost` when the model is priced.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WireUsage {
    input_tokens: u64,
    output_tokens: u64,
    total_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    cached_input_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cost: Option<WireCost>,
}

#[derive(Serialize)]
struct WireCost {
    amount: f64,
    currency: String,
}

impl From<&Usage> for WireUsage {
    fn from(usage: &Usage) -> WireUsage {
        WireUsage {
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            total_tokens: usage.total_tokens,
            cached_input_tokens: usage.cached_input_tokens,
            reasoning_tokens: usage.reasoning_tokens,
            cost: usage
                .cost
                .as_ref()
                .map(|Cost { amount, currency }| WireCost { amount: *amount, currency: currency.clone() }),
        }
    }
}

/// Kestrel's `ToolInfo` of a tool the server offers.
#[derive(Serialize)]
pub struct WireTool<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    permission: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    category: Option<&'a str>,
}

impl<'a> From<&'a ToolSchema> for WireTool<'a> {
    fn from(tool: &'a ToolSchema) -> WireTool<'a> {
        WireTool {
            name: &tool.name,
            description: &tool.description,
            parameters: &tool.parameters,
            permission: tool.permission.as_deref(),
            category: tool.category.as_deref(),
        }
    }
}

/// Kestrel's extension `SandboxState`, on `run.started` and in `/api/bootstrap`: the
/// containment asked for, the one in force, the network, and why they differ.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WireSandbox<'a> {
    requested: &'static str,
    mode: &'static str,
    network: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
}

impl<'a> From<&'a SandboxState> for WireSandbox<'a> {
    fn from(state: &'a SandboxState) -> WireSandbox<'a> {
        WireSandbox {
            requested: state.requested.name(),
            mode: state.mode.name(),
            network: state.network,
            reason: state.reason.as_deref(),
        }
    }
}

/// An envelope as one SSE frame: `id: <seq>` and the `ServerEventEnvelope` on one `data:` line.
/// Built once per envelope, by the first stream that sends it.
pub fn sse_frame(envelope: &Envelope) -> String {
    use std::io::Write as _;
    // One buffer sized for a delta's frame, the commonest by far: no regrowth, no second copy.
    let mut frame = Vec::with_capacity(FRAME_CAPACITY);
    let seq = envelope.seq;
    let head = write!(frame, "id: {seq}\ndata: {{\"seq\":{seq},\"at\":\"{}\",\"event\":", envelope.at);
    head.expect("writing to a Vec cannot fail");
    match event_json(&envelope.event, &mut frame) {
        None => String::new(),
        Some(Ok(())) => {
            frame.extend_from_slice(b"}\n\n");
            String::from_utf8(frame).expect("the frame is UTF-8: its parts are")
        }
        Some(Err(error)) => {
            log::error!("event {seq} could not be serialized: {error}");
            String::new()
        }
    }
}

/// What `sse_frame` reserves: a text delta's frame with its ids fits.
const FRAME_CAPACITY: usize = 384;

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
