//! The engine's data: messages, tool calls, usage, sessions and the event union.
//!
//! These types serialize in the shape of Kestrel protocol 1.0, which is also the form the
//! store keeps (a message row holds its JSON) and the bus carries. Keeping one canonical shape
//! means an event is serialized once, on the bus thread, however many clients watch it. A front
//! door that speaks another protocol (BAE) maps from these types; it never changes them.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageAttachment {
    pub mime_type: String,
    /// Base64 without a `data:` prefix.
    pub data: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChatMessage {
    pub id: String,
    pub role: Role,
    pub content: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<ImageAttachment>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Map<String, Value>>,
}

impl ChatMessage {
    /// A message with a fresh id and the current time; the caller fills in the rest.
    pub fn new(role: Role, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            id: new_id("msg"),
            role,
            content: content.into(),
            images: Vec::new(),
            reasoning: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            tool_name: None,
            created_at: crate::time::now_rfc3339(),
            model: None,
            meta: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolResult {
    pub call_id: String,
    pub name: String,
    pub ok: bool,
    /// What the model sees.
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// For clients only; never sent to the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

/// A tool call waiting for a person's decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRequest {
    pub id: String,
    pub call_id: String,
    pub tool_name: String,
    pub arguments: Map<String, Value>,
    pub created_at: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub total_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<u64>,
}

impl Usage {
    /// Adds another provider call's usage to this run's total.
    pub fn add(&mut self, other: &Usage) {
        fn sum(a: Option<u64>, b: Option<u64>) -> Option<u64> {
            match (a, b) {
                (None, None) => None,
                (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
            }
        }
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.total_tokens += other.total_tokens;
        self.cached_input_tokens = sum(self.cached_input_tokens, other.cached_input_tokens);
        self.reasoning_tokens = sum(self.reasoning_tokens, other.reasoning_tokens);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionStatus {
    Idle,
    Running,
    Interrupted,
    Error,
    Cancelled,
}

impl SessionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionStatus::Idle => "idle",
            SessionStatus::Running => "running",
            SessionStatus::Interrupted => "interrupted",
            SessionStatus::Error => "error",
            SessionStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(text: &str) -> Option<SessionStatus> {
        Some(match text {
            "idle" => SessionStatus::Idle,
            "running" => SessionStatus::Running,
            "interrupted" => SessionStatus::Interrupted,
            "error" => SessionStatus::Error,
            "cancelled" => SessionStatus::Cancelled,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionSummary {
    pub id: String,
    pub title: String,
    pub created_at: String,
    pub updated_at: String,
    pub status: SessionStatus,
    pub model: String,
    pub message_count: u64,
    pub workspace: String,
}

/// A stored session: the summary plus what only the owner and the engine see.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRecord {
    pub summary: SessionSummary,
    pub tenant: String,
    pub system_prompt: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionDetail {
    #[serde(flatten)]
    pub summary: SessionSummary,
    pub messages: Vec<ChatMessage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelInfo {
    pub id: String,
    pub provider: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
    pub supports_tools: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub supports_reasoning: Option<bool>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolSchema {
    pub name: String,
    pub description: String,
    pub parameters: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permission: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunOutcome {
    Completed,
    Cancelled,
    MaxSteps,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeltaChannel {
    Text,
    Reasoning,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NoticeLevel {
    Info,
    Warn,
    Error,
}

/// Everything the engine tells the world. The bus stamps each with a `seq` and a time.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type")]
pub enum Event {
    #[serde(rename = "session.updated", rename_all = "camelCase")]
    SessionUpdated { session_id: String, session: SessionSummary },
    #[serde(rename = "run.started", rename_all = "camelCase")]
    RunStarted { session_id: String, run_id: String },
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
    MessageStarted { session_id: String, message: ChatMessage },
    #[serde(rename = "message.delta", rename_all = "camelCase")]
    MessageDelta { session_id: String, message_id: String, channel: DeltaChannel, delta: String },
    #[serde(rename = "message.completed", rename_all = "camelCase")]
    MessageCompleted { session_id: String, message: ChatMessage },
    #[serde(rename = "tool.started", rename_all = "camelCase")]
    ToolStarted { session_id: String, call: ToolCall },
    #[serde(rename = "tool.finished", rename_all = "camelCase")]
    ToolFinished { session_id: String, result: ToolResult },
    #[serde(rename = "approval.requested", rename_all = "camelCase")]
    ApprovalRequested { session_id: String, approval: ApprovalRequest },
    #[serde(rename = "approval.resolved", rename_all = "camelCase")]
    ApprovalResolved { session_id: String, approval_id: String, approved: bool },
    #[serde(rename = "session.deleted", rename_all = "camelCase")]
    SessionDeleted { session_id: String },
    #[serde(rename = "notice", rename_all = "camelCase")]
    Notice { level: NoticeLevel, message: String },
}

impl Event {
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
            Event::Notice { .. } => "notice",
        }
    }

    /// Token deltas live only in the in-memory ring; every other event goes to the log.
    pub fn is_delta(&self) -> bool {
        matches!(self, Event::MessageDelta { .. })
    }

    /// The session an event belongs to, if any; session streams filter on it.
    pub fn session_id(&self) -> Option<&str> {
        match self {
            Event::SessionUpdated { session_id, .. }
            | Event::RunStarted { session_id, .. }
            | Event::RunFinished { session_id, .. }
            | Event::RunFailed { session_id, .. }
            | Event::MessageStarted { session_id, .. }
            | Event::MessageDelta { session_id, .. }
            | Event::MessageCompleted { session_id, .. }
            | Event::ToolStarted { session_id, .. }
            | Event::ToolFinished { session_id, .. }
            | Event::ApprovalRequested { session_id, .. }
            | Event::ApprovalResolved { session_id, .. }
            | Event::SessionDeleted { session_id } => Some(session_id),
            Event::Notice { .. } => None,
        }
    }
}

/// A new random id with a readable prefix, e.g. `ses_3f2c…`.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}
