//! The typed events the engine emits, and what each carries (run outcomes, provider
//! attempts, subagent steps, plugin revisions); faults, close reasons and compactions are in
//! `lifecycle.rs`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{
    ApprovalRequest, CloseReason, CompactionCompleted, CompactionTrigger, Dispatch, Fault, Message, ProviderRequest,
    ProviderResponse, SessionSummary, ToolCall, ToolResult, Usage,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunOutcome {
    Completed,
    Cancelled,
    MaxSteps,
    /// The turn waits for a client's tool results (BAE).
    Paused,
    /// The run's budget was spent: it stopped before its next model call.
    BudgetExceeded,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeltaChannel {
    Text,
    Reasoning,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NoticeLevel {
    Info,
    Warn,
    Error,
}

/// A sandbox image's provisioning status: `pending`, `available`, or `error` with the
/// driver's detail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageStatus {
    pub name: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// One step of a subagent's life, as `Event::Subagent` carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubagentStep {
    pub session_id: String,
    pub step: String,
    /// Whether the server runs it (`dispatch: remote`) or a client (`local`).
    pub remote: bool,
    pub subagent_id: String,
    pub harness: String,
    pub model: String,
    pub detail: Option<String>,
    /// Why it failed (nonzero_exit, spawn_failed, timeout) or was cancelled (explicit,
    /// session_close).
    pub reason: Option<String>,
    pub exit_code: Option<i64>,
}

/// A plugin's new `web/` revision, in `plugins.changed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PluginRevision {
    pub id: String,
    pub revision: String,
}

/// Everything the engine tells the world. The bus stamps each with a `seq` and a time; the
/// event log keeps this serde form (stored form `STORED_FORM`, pinned by the test below). No
/// door shows it as it is: each renders the events it carries in its own shapes
/// (`api/kestrel/wire.rs`, `api/bae/wire/`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum Event {
    #[serde(rename = "session.updated", rename_all = "camelCase")]
    SessionUpdated { session_id: String, session: SessionSummary },
    #[serde(rename = "run.started", rename_all = "camelCase")]
    RunStarted {
        session_id: String,
        run_id: String,
        /// How the run's commands are contained (Kestrel's runs; none in older logs).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sandbox: Option<super::SandboxState>,
    },
    #[serde(rename = "run.finished", rename_all = "camelCase")]
    RunFinished {
        session_id: String,
        run_id: String,
        status: RunOutcome,
        #[serde(skip_serializing_if = "Option::is_none")]
        usage: Option<Usage>,
    },
    #[serde(rename = "run.failed", rename_all = "camelCase")]
    RunFailed { session_id: String, run_id: String, error: String },
    #[serde(rename = "message.started", rename_all = "camelCase")]
    MessageStarted { session_id: String, message: Message },
    #[serde(rename = "message.delta", rename_all = "camelCase")]
    MessageDelta {
        /// Shared by every delta of the message (two fewer allocations per delta).
        session_id: std::sync::Arc<str>,
        message_id: std::sync::Arc<str>,
        channel: DeltaChannel,
        delta: String,
    },
    #[serde(rename = "message.completed", rename_all = "camelCase")]
    MessageCompleted { session_id: String, message: Message },
    #[serde(rename = "tool.started", rename_all = "camelCase")]
    ToolStarted {
        session_id: String,
        call: ToolCall,
        /// How the call's permission was decided (none for a call the client runs).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        permission: Option<Box<crate::domain::PermissionNote>>,
    },
    #[serde(rename = "tool.finished", rename_all = "camelCase")]
    ToolFinished {
        session_id: String,
        result: ToolResult,
        /// Who produced the result, when not the server's own tools.
        #[serde(default, skip_serializing_if = "Dispatch::is_server")]
        dispatch: Dispatch,
    },
    #[serde(rename = "approval.requested", rename_all = "camelCase")]
    ApprovalRequested { session_id: String, approval: ApprovalRequest },
    #[serde(rename = "approval.resolved", rename_all = "camelCase")]
    ApprovalResolved {
        session_id: String,
        approval_id: String,
        approved: bool,
        /// The arguments a person gave the call in place of the model's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        arguments: Option<Map<String, Value>>,
        /// The rule the decision was remembered as.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        remembered: Option<String>,
    },
    #[serde(rename = "session.deleted", rename_all = "camelCase")]
    SessionDeleted { session_id: String },
    /// A session was made (`session.updated` follows with the same summary).
    #[serde(rename = "session.created", rename_all = "camelCase")]
    SessionCreated { session_id: String, session: SessionSummary },
    /// A schedule sent its message (`crate::schedule`); `due_at` is the time it was due.
    #[serde(rename = "schedule.fired", rename_all = "camelCase")]
    ScheduleFired { schedule_id: String, session_id: String, run_id: String, due_at: String },
    /// A schedule's fire did not happen: why (`session_busy`, `missed`, …).
    #[serde(rename = "schedule.skipped", rename_all = "camelCase")]
    ScheduleSkipped { schedule_id: String, session_id: Option<String>, reason: String, due_at: String },
    /// A turn asks an MCP server to run a tool (`server_name` is `None` when none has it).
    #[serde(rename = "mcp.request", rename_all = "camelCase")]
    McpRequest { session_id: String, server_name: Option<String>, tool: String, input: Value },
    /// What the MCP server answered: its result, or why there is none.
    #[serde(rename = "mcp.response", rename_all = "camelCase")]
    McpResponse {
        session_id: String,
        server_name: Option<String>,
        ok: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A step of a session's remote sandbox: `step` is start, running, stop, stopped or error
    /// (`phase` says which step failed).
    #[serde(rename = "sandbox.remote", rename_all = "camelCase")]
    RemoteSandbox {
        session_id: String,
        step: String,
        image: String,
        sandbox_id: Option<String>,
        reason: Option<String>,
        phase: Option<String>,
        detail: Option<String>,
        unsandboxed: bool,
    },
    /// A turn runs a sandbox tool's command in the session's remote sandbox.
    #[serde(rename = "sandbox.request", rename_all = "camelCase")]
    SandboxRequest { session_id: String, tool: String, input: Value, command: Option<String> },
    /// What the command left (`result`: stdout, stderr, exit_code), or why it did not run.
    #[serde(rename = "sandbox.response", rename_all = "camelCase")]
    SandboxResponse {
        session_id: String,
        sandbox_id: Option<String>,
        ok: bool,
        result: Option<Value>,
        error: Option<String>,
    },
    /// A client reported the lifecycle of a sandbox it runs itself (`state`: running, stopped
    /// or error).
    #[serde(rename = "sandbox.local", rename_all = "camelCase")]
    LocalSandbox {
        session_id: String,
        state: String,
        image: Option<String>,
        unsandboxed: bool,
        container_id: Option<String>,
        detail: Option<String>,
    },
    /// A step of a subagent's life: `step` is start, running, completed, failed or
    /// cancelled. Remote ones the server runs; local ones a client reports.
    #[serde(rename = "subagent")]
    Subagent(Box<SubagentStep>),
    /// Plugins' `web/` trees changed (hot reload): each plugin's new revision.
    #[serde(rename = "plugins.changed")]
    PluginsChanged { plugins: Vec<PluginRevision>, at: String },
    /// A compaction replaced `removed_messages` older messages with a summary.
    #[serde(rename = "context.compacted", rename_all = "camelCase")]
    ContextCompacted {
        session_id: String,
        removed_messages: u64,
        kept_messages: u64,
        tokens_before: u64,
        tokens_after: u64,
    },
    /// A rewind dropped `message_id` and what came after it; `messages` are the ones left.
    #[serde(rename = "session.rewound", rename_all = "camelCase")]
    SessionRewound { session_id: String, message_id: String, messages: Vec<Message> },
    #[serde(rename = "notice", rename_all = "camelCase")]
    Notice {
        level: NoticeLevel,
        message: String,
        /// The session it is about, if any: then it also reaches that session's streams.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session_id: Option<String>,
    },
    /// A client opened (`joined: false`) or joined a session, declaring its tools.
    #[serde(rename = "client.attached")]
    ClientAttached {
        session_id: String,
        joined: bool,
        client_version: Option<String>,
        tools: Vec<String>,
        sandbox_tools: Vec<String>,
        subagent_tools: Vec<String>,
    },
    /// A client registered as a driver of the session.
    #[serde(rename = "driver.registered")]
    DriverRegistered { session_id: String },
    /// The provisioning status of the session's profile's sandbox images, in profile order.
    #[serde(rename = "sandbox.images")]
    SandboxImages { session_id: String, images: Vec<ImageStatus> },
    /// One provider attempt of a turn is about to be made.
    #[serde(rename = "provider.request")]
    ProviderRequest(Box<ProviderRequest>),
    /// How that attempt went.
    #[serde(rename = "provider.response")]
    ProviderResponse(Box<ProviderResponse>),
    /// Something went wrong in a session; `fault.reason` says what.
    #[serde(rename = "session.fault")]
    SessionFault { session_id: String, fault: Fault },
    /// A session reached its end (BAE sessions close rather than being deleted).
    #[serde(rename = "session.closed")]
    SessionClosed { session_id: String, reason: CloseReason },
    #[serde(rename = "compaction.started")]
    CompactionStarted { session_id: String, trigger: CompactionTrigger, message_count: u64 },
    #[serde(rename = "compaction.completed")]
    CompactionCompleted(Box<CompactionCompleted>),
    /// Every watcher of the session is let go (BAE's `session.unsubscribe`); never logged.
    #[serde(rename = "streams.released")]
    StreamsReleased { session_id: String },
}

/// The stored forms of the events a replay reads most, read without serde's buffering of an
/// internally tagged enum (which first copies the whole body into a tree of its own).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WithMessage {
    session_id: String,
    message: Message,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WithSession {
    session_id: String,
    session: SessionSummary,
}

impl Event {
    /// An event from its stored form (`STORED_FORM`), its `kind` known: the common kinds read
    /// straight into their fields, the rest through the enum.
    pub fn from_stored(kind: &str, body: &str) -> serde_json::Result<Event> {
        match kind {
            "message.completed" => serde_json::from_str(body)
                .map(|WithMessage { session_id, message }| Event::MessageCompleted { session_id, message }),
            "message.started" => serde_json::from_str(body)
                .map(|WithMessage { session_id, message }| Event::MessageStarted { session_id, message }),
            "session.updated" => serde_json::from_str(body)
                .map(|WithSession { session_id, session }| Event::SessionUpdated { session_id, session }),
            // A long session's request names thousands of stored messages.
            "provider.request" => serde_json::from_str(body).map(|request| Event::ProviderRequest(Box::new(request))),
            _ => serde_json::from_str(body),
        }
    }

    /// About how many bytes of memory the event holds: what the bus's replay ring counts
    /// against its budget. A `provider.request` holds the whole conversation it sent.
    pub fn weight(&self) -> usize {
        const BASE: usize = 256;
        BASE + match self {
            Event::ProviderRequest(request) => {
                request.messages.iter().map(Message::weight).sum::<usize>() + request.tools.len() * 512
            }
            Event::MessageCompleted { message, .. } => message.weight(),
            Event::MessageDelta { delta, .. } => delta.len(),
            _ => BASE,
        }
    }

    /// The event's `type` on the wire.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::SessionUpdated { .. } => "session.updated",
            Event::RunStarted { .. } => "run.started",
            Event::RunFinished { .. } => "run.finished",
            Event::RunFailed { .. } => "run.failed",
            Event::MessageStarted { .. } => "message.started",
            Event::MessageDelta { .. } => "message.delta",
            Event::MessageCompleted { .. } => "message.completed",
            Event::ToolStarted { .. } => "tool.started",
            Event::ToolFinished { .. } => "tool.finished",
            Event::ApprovalRequested { .. } => "approval.requested",
            Event::ApprovalResolved { .. } => "approval.resolved",
            Event::SessionDeleted { .. } => "session.deleted",
            Event::SessionCreated { .. } => "session.created",
            Event::ScheduleFired { .. } => "schedule.fired",
            Event::ScheduleSkipped { .. } => "schedule.skipped",
            Event::SessionRewound { .. } => "session.rewound",
            Event::ContextCompacted { .. } => "context.compacted",
            Event::PluginsChanged { .. } => "plugins.changed",
            Event::McpRequest { .. } => "mcp.request",
            Event::LocalSandbox { .. } => "sandbox.local",
            Event::SandboxRequest { .. } => "sandbox.request",
            Event::SandboxResponse { .. } => "sandbox.response",
            Event::RemoteSandbox { .. } => "sandbox.remote",
            Event::McpResponse { .. } => "mcp.response",
            Event::Notice { .. } => "notice",
            Event::ClientAttached { .. } => "client.attached",
            Event::DriverRegistered { .. } => "driver.registered",
            Event::SandboxImages { .. } => "sandbox.images",
            Event::Subagent(_) => "subagent",
            Event::ProviderRequest(_) => "provider.request",
            Event::ProviderResponse(_) => "provider.response",
            Event::SessionFault { .. } => "session.fault",
            Event::SessionClosed { .. } => "session.closed",
            Event::CompactionStarted { .. } => "compaction.started",
            Event::CompactionCompleted(_) => "compaction.completed",
            Event::StreamsReleased { .. } => "streams.released",
        }
    }

    /// Token deltas (and stream signals) live only in the in-memory ring; every other event
    /// goes to the log.
    pub fn is_transient(&self) -> bool {
        matches!(self, Event::MessageDelta { .. } | Event::StreamsReleased { .. } | Event::PluginsChanged { .. })
    }

    /// Whether it is for the plugin stream (and only for it).
    pub fn is_plugin_change(&self) -> bool {
        matches!(self, Event::PluginsChanged { .. })
    }

    /// The session an event belongs to, if any; session streams filter on it.
    pub fn session_id(&self) -> Option<&str> {
        match self {
            Event::SessionUpdated { session_id, .. }
            | Event::RunStarted { session_id, .. }
            | Event::RunFinished { session_id, .. }
            | Event::RunFailed { session_id, .. }
            | Event::MessageStarted { session_id, .. }
            | Event::MessageCompleted { session_id, .. }
            | Event::ToolStarted { session_id, .. }
            | Event::ToolFinished { session_id, .. }
            | Event::ApprovalRequested { session_id, .. }
            | Event::ApprovalResolved { session_id, .. }
            | Event::SessionDeleted { session_id }
            | Event::SessionCreated { session_id, .. }
            | Event::SessionRewound { session_id, .. }
            | Event::ContextCompacted { session_id, .. }
            | Event::McpRequest { session_id, .. }
            | Event::LocalSandbox { session_id, .. }
            | Event::SandboxRequest { session_id, .. }
            | Event::SandboxResponse { session_id, .. }
            | Event::RemoteSandbox { session_id, .. }
            | Event::McpResponse { session_id, .. }
            | Event::ClientAttached { session_id, .. }
            | Event::DriverRegistered { session_id }
            | Event::SandboxImages { session_id, .. }
            | Event::SessionFault { session_id, .. }
            | Event::SessionClosed { session_id, .. }
            | Event::CompactionStarted { session_id, .. }
            | Event::StreamsReleased { session_id }
            | Event::ScheduleFired { session_id, .. } => Some(session_id),
            Event::ScheduleSkipped { session_id, .. } => session_id.as_deref(),
            Event::MessageDelta { session_id, .. } => Some(session_id),
            Event::ProviderRequest(request) => Some(&request.session_id),
            Event::ProviderResponse(response) => Some(&response.session_id),
            Event::CompactionCompleted(completed) => Some(&completed.session_id),
            Event::Subagent(step) => Some(&step.session_id),
            Event::Notice { session_id, .. } => session_id.as_deref(),
            Event::PluginsChanged { .. } => None,
        }
    }
}

#[cfg(test)]
mod stored_form {
    //! Form 1 of the stored events and messages, pinned: a change of what these serialize to is
    //! a new stored form (`STORED_FORM`), with a reader of this one.

    use super::*;
    use crate::domain::{Block, Cost, ImageAttachment, Role, SessionStatus};
    use serde_json::json;

    fn message() -> Message {
        let mut call = ToolCall::new("call_1", "read", json!({ "path": "a" }).as_object().cloned().unwrap());
        call.dispatch = Dispatch::Mcp { server: "tiny".into() };
        let result = ToolResult {
            call_id: "call_1".into(),
            name: "read".into(),
            ok: false,
            content: "no".into(),
            duration_ms: Some(3),
            error: Some("no".into()),
            data: Some(json!({ "exit": 1 })),
            blocks: Some(vec![json!({ "type": "text", "text": "no" })]),
        };
        let image = ImageAttachment { mime_type: "image/png".into(), data: "AAAA".into(), name: Some("a.png".into()) };
        Message {
            id: "msg_1".into(),
            role: Role::Assistant,
            blocks: vec![
                Block::Reasoning { text: "think".into() },
                Block::Text { text: "hi".into() },
                Block::Image(image),
                Block::ToolCall(call),
                Block::ToolResult(result),
            ],
            created_at: "2026-01-01T00:00:00.000Z".into(),
            model: Some("builtin/echo".into()),
            meta: json!({ "partial": true }).as_object().cloned(),
        }
    }

    fn cases() -> Vec<(Event, &'static str)> {
        let usage = Usage {
            input_tokens: 1,
            output_tokens: 2,
            total_tokens: 3,
            cached_input_tokens: Some(1),
            reasoning_tokens: None,
            cost: Some(Cost { amount: 0.5, currency: "EUR".into() }),
        };
        let summary = SessionSummary {
            id: "ses_1".into(),
            title: "t".into(),
            created_at: "a".into(),
            updated_at: "b".into(),
            status: SessionStatus::Running,
            model: "builtin/echo".into(),
            message_count: 2,
            workspace: "/w".into(),
            forked_from: None,
        };
        vec![
            (
                Event::SessionUpdated { session_id: "ses_1".into(), session: summary },
                r#"{"type":"session.updated","sessionId":"ses_1","session":{"id":"ses_1","title":"t","createdAt":"a","updatedAt":"b","status":"running","model":"builtin/echo","messageCount":2,"workspace":"/w"}}"#,
            ),
            (
                Event::RunStarted { session_id: "s".into(), run_id: "r".into(), sandbox: None },
                r#"{"type":"run.started","sessionId":"s","runId":"r"}"#,
            ),
            (
                Event::RunStarted {
                    session_id: "s".into(),
                    run_id: "r".into(),
                    sandbox: Some(crate::domain::SandboxState {
                        requested: crate::domain::SandboxMode::WorkspaceWrite,
                        mode: crate::domain::SandboxMode::Off,
                        network: true,
                        reason: Some("no bwrap".into()),
                    }),
                },
                r#"{"type":"run.started","sessionId":"s","runId":"r","sandbox":{"requested":"workspace-write","mode":"off","network":true,"reason":"no bwrap"}}"#,
            ),
            (
                Event::RunFinished {
                    session_id: "s".into(),
                    run_id: "r".into(),
                    status: RunOutcome::MaxSteps,
                    usage: Some(usage),
                },
                r#"{"type":"run.finished","sessionId":"s","runId":"r","status":"max_steps","usage":{"inputTokens":1,"outputTokens":2,"totalTokens":3,"cachedInputTokens":1,"cost":{"amount":0.5,"currency":"EUR"}}}"#,
            ),
            (
                Event::MessageCompleted { session_id: "s".into(), message: message() },
                r#"{"type":"message.completed","sessionId":"s","message":{"id":"msg_1","role":"assistant","blocks":[{"type":"reasoning","text":"think"},{"type":"text","text":"hi"},{"type":"image","mimeType":"image/png","data":"AAAA","name":"a.png"},{"type":"tool_call","id":"call_1","name":"read","arguments":{"path":"a"},"dispatch":{"kind":"mcp","server":"tiny"}},{"type":"tool_result","callId":"call_1","name":"read","ok":false,"content":"no","durationMs":3,"error":"no","data":{"exit":1},"blocks":[{"text":"no","type":"text"}]}],"created_at":"2026-01-01T00:00:00.000Z","model":"builtin/echo","meta":{"partial":true}}}"#,
            ),
            (
                Event::SessionFault { session_id: "s".into(), fault: Fault::AllProvidersFailed { attempts: 3 } },
                r#"{"type":"session.fault","session_id":"s","fault":{"reason":"all_providers_failed","attempts":3}}"#,
            ),
            (
                Event::ProviderRequest(Box::new(ProviderRequest {
                    session_id: "s".into(),
                    attempt: 1,
                    fallback: Some(false),
                    provider: "anthropic".into(),
                    base_url: None,
                    model: "m".into(),
                    max_tokens: Some(5),
                    messages: vec![
                        Message {
                            id: "msg_0".into(),
                            role: Role::User,
                            blocks: Vec::new(),
                            created_at: String::new(),
                            model: None,
                            meta: None,
                        },
                        message(),
                    ],
                    tools: Vec::new(),
                    stored: 1,
                    unresolved: true,
                })),
                r#"{"type":"provider.request","session_id":"s","attempt":1,"fallback":false,"provider":"anthropic","base_url":null,"model":"m","max_tokens":5,"history_ids":["msg_0"],"messages":[{"id":"msg_1","role":"assistant","blocks":[{"type":"reasoning","text":"think"},{"type":"text","text":"hi"},{"type":"image","mimeType":"image/png","data":"AAAA","name":"a.png"},{"type":"tool_call","id":"call_1","name":"read","arguments":{"path":"a"},"dispatch":{"kind":"mcp","server":"tiny"}},{"type":"tool_result","callId":"call_1","name":"read","ok":false,"content":"no","durationMs":3,"error":"no","data":{"exit":1},"blocks":[{"text":"no","type":"text"}]}],"created_at":"2026-01-01T00:00:00.000Z","model":"builtin/echo","meta":{"partial":true}}],"tools":[]}"#,
            ),
            (
                Event::Notice { level: NoticeLevel::Warn, message: "m".into(), session_id: None },
                r#"{"type":"notice","level":"warn","message":"m"}"#,
            ),
        ]
    }

    #[test]
    fn events_and_messages_keep_stored_form_1() {
        for (event, stored) in cases() {
            assert_eq!(serde_json::to_string(&event).unwrap(), stored);
            assert_eq!(serde_json::from_str::<Event>(stored).unwrap(), event, "form 1 reads back");
            assert_eq!(Event::from_stored(event.kind(), stored).unwrap(), event, "and by its kind");
        }
    }
}
