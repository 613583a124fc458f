//! The engine's model: messages as ordered content blocks, tool calls, sessions, models and
//! tools here; usage and prices in `usage.rs`; the typed events the engine emits in `event.rs`.
//!
//! It belongs to no protocol. The store keeps messages and events in this form: their serde
//! shape here is the stored one, form `STORED_FORM`, and nothing else. Each door maps them to
//! its own wire shape (`api/kestrel/wire.rs`, `api/bae/wire/`), so a protocol's field can be
//! renamed without touching what is stored. A change of this serde shape is a new stored form:
//! bump `STORED_FORM` and keep a reader of the old one (`store::decode`); the test at the end
//! of `event.rs` pins form 1.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

mod event;
mod lifecycle;
mod provider_call;
mod sandbox;
mod usage;

/// The serde form of `Message` and `Event` that the store writes; each stored row says which
/// form it holds.
pub const STORED_FORM: i64 = 1;

pub use event::*;
pub use lifecycle::*;
pub use provider_call::{ProviderRequest, ProviderResponse};
pub use sandbox::{SandboxMode, SandboxState};
pub use usage::*;

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

/// Who runs a tool call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Dispatch {
    /// The server, with its built-in tools.
    #[default]
    Server,
    /// The client, which pauses the turn until it sends the result.
    Client,
    /// An MCP server, by its configured name.
    Mcp { server: String },
    /// A sandbox.
    Sandbox,
    /// A remote subagent.
    Subagent,
}

impl Dispatch {
    pub fn is_server(&self) -> bool {
        *self == Dispatch::Server
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: Map<String, Value>,
    #[serde(default, skip_serializing_if = "Dispatch::is_server")]
    pub dispatch: Dispatch,
}

impl ToolCall {
    /// A call the server runs.
    pub fn new(id: impl Into<String>, name: impl Into<String>, arguments: Map<String, Value>) -> ToolCall {
        ToolCall { id: id.into(), name: name.into(), arguments, dispatch: Dispatch::Server }
    }
}

/// One piece of a message, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    Text { text: String },
    Image(ImageAttachment),
    Reasoning { text: String },
    ToolCall(ToolCall),
    ToolResult(ToolResult),
}

/// A message of a conversation: who said it and what, as ordered blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub id: String,
    pub role: Role,
    pub blocks: Vec<Block>,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Map<String, Value>>,
}

impl Message {
    /// A message with a fresh id, the current time and no blocks yet.
    pub fn new(role: Role) -> Message {
        Message {
            id: new_id("msg"),
            role,
            blocks: Vec::new(),
            created_at: crate::time::now_rfc3339(),
            model: None,
            meta: None,
        }
    }

    /// About how many bytes of memory the message holds.
    pub fn weight(&self) -> usize {
        let block = |block: &Block| match block {
            Block::Text { text } | Block::Reasoning { text } => 32 + text.len(),
            Block::Image(image) => 64 + image.data.len(),
            Block::ToolCall(call) => 128 + call.name.len() + call.arguments.len() * 96,
            Block::ToolResult(result) => 128 + result.content.len() + result.error.as_ref().map_or(0, String::len),
        };
        160 + self.blocks.iter().map(block).sum::<usize>() + self.meta.as_ref().map_or(0, |meta| meta.len() * 96)
    }

    /// A message of one text block (none when `text` is empty).
    pub fn text_of(role: Role, text: impl Into<String>) -> Message {
        let mut message = Message::new(role);
        message.push_text(text);
        message
    }

    /// Appends a text block unless `text` is empty.
    pub fn push_text(&mut self, text: impl Into<String>) {
        let text = text.into();
        if !text.is_empty() {
            self.blocks.push(Block::Text { text });
        }
    }

    /// Every text block, joined.
    pub fn text(&self) -> String {
        self.blocks
            .iter()
            .filter_map(|block| match block {
                Block::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    /// Every reasoning block, joined; `None` when there is none.
    pub fn reasoning(&self) -> Option<String> {
        let mut pieces = self.blocks.iter().filter_map(|block| match block {
            Block::Reasoning { text } => Some(text.as_str()),
            _ => None,
        });
        let first = pieces.next()?;
        Some(pieces.fold(first.to_string(), |joined, piece| joined + piece))
    }

    pub fn images(&self) -> impl Iterator<Item = &ImageAttachment> {
        self.blocks.iter().filter_map(|block| match block {
            Block::Image(image) => Some(image),
            _ => None,
        })
    }

    pub fn tool_calls(&self) -> impl Iterator<Item = &ToolCall> {
        self.blocks.iter().filter_map(|block| match block {
            Block::ToolCall(call) => Some(call),
            _ => None,
        })
    }

    pub fn has_tool_calls(&self) -> bool {
        self.tool_calls().next().is_some()
    }

    /// The result a `tool` message carries.
    pub fn tool_result(&self) -> Option<&ToolResult> {
        self.blocks.iter().find_map(|block| match block {
            Block::ToolResult(result) => Some(result),
            _ => None,
        })
    }

    /// A flag in `meta` (`partial`, `interrupted`).
    pub fn flag(&self, name: &str) -> bool {
        self.meta.as_ref().and_then(|meta| meta.get(name)).and_then(Value::as_bool) == Some(true)
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
    /// The result as content blocks, when a BAE client sent blocks rather than a string: they
    /// reach the provider as they are, and `content` is their text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks: Option<Vec<Value>>,
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
    /// What made the call wait: a rule, or (`None`) the tool's own permission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<RuleView>,
    /// Set for the approval of paths a walking tool withheld (an ask rule covers them): the
    /// workspace-relative paths, a directory ending in `/`, that the call runs again with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub withheld: Option<Vec<String>>,
}

/// A permission rule as clients see it (`crate::policy::Rule`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuleView {
    pub id: String,
    pub tool: String,
    #[serde(rename = "match", default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// Set for a remembered approval of one exact call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
    pub outcome: String,
    /// `server`, `tenant` or `session`.
    pub scope: String,
    /// `config`, `api` or `remembered`.
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
}

/// How a tool call's permission was decided, as its `tool.started` event and its result
/// message say.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PermissionNote {
    /// `allow`, `ask` or `deny`: what the rules said (a person then decides an `ask`).
    pub outcome: String,
    /// The rule that decided; `None`: the tool's own permission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<RuleView>,
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
    /// The session and message it was forked from (`POST /api/sessions/:id/fork`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkedFrom>,
}

/// Where a forked session's transcript came from: the source session and the last message
/// copied (the source's id of it; the fork's copies have ids of their own), `None` when the
/// source had none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ForkedFrom {
    pub session_id: String,
    pub message_id: Option<String>,
}

/// A stored session: the summary plus what only the owner and the engine see.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRecord {
    pub summary: SessionSummary,
    pub tenant: String,
    pub system_prompt: Option<String>,
}

/// A session with its transcript; each front door renders it in its own shape.
#[derive(Debug, Clone)]
pub struct SessionDetail {
    pub summary: SessionSummary,
    pub messages: Vec<Message>,
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pricing: Option<ModelPricing>,
}

/// What a turn's final answer must be (`responseFormat` on a message): a JSON value valid
/// against `schema` (`type: "json_schema"`, the one type there is). Kept in the user message's
/// `meta.responseFormat`, so a resumed turn asks for the same.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    pub kind: String,
    pub schema: Value,
    /// What a provider's native structured output calls it (`answer` when not given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ResponseFormat {
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or("answer")
    }

    /// What a system prompt says to a model whose wire has no native structured output.
    pub fn instruction(&self) -> String {
        format!(
            "Your final answer must be only a JSON value, with no other text and no code fence, that \
             is valid against this JSON Schema (named \"{}\"):\n{}",
            self.name(),
            self.schema
        )
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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

/// A new random id with a readable prefix, e.g. `ses_3f2c…`.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}
