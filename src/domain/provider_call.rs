//! A provider attempt as events carry it: `provider.request` (with the form the log keeps,
//! the stored history by id only) and `provider.response`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Message, Role, ToolSchema};

/// A provider attempt, as the turn makes it (no key or header ever).
///
/// `messages` is the whole history the model was sent, as BAE's `provider.request` shows it:
/// the session's stored messages, then the turn's own rounds. The log keeps the stored ones by
/// id only (`history_ids`), so a long history is not copied into the log at every model call;
/// reading the event back (`Event::history_to_resolve`, `resolve_history`) puts them in again.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(from = "StoredProviderRequest")]
pub struct ProviderRequest {
    pub session_id: String,
    /// The attempt's number in its call, from 0 (every retry and fallback counts).
    pub attempt: u32,
    /// Whether it goes to a provider after the chain's first; `None` in events logged before
    /// retries, where every attempt after the first was a fallback.
    pub fallback: Option<bool>,
    /// The wire format (`anthropic`, `openai`, `builtin`).
    pub provider: String,
    pub base_url: Option<String>,
    pub model: String,
    pub max_tokens: Option<u32>,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSchema>,
    /// How many of `messages`, from the first, are the session's stored messages.
    pub stored: usize,
    /// Read back from the log and not yet resolved: the first `stored` messages are ids only.
    pub unresolved: bool,
}

/// `ProviderRequest` as the log keeps it.
#[derive(Serialize, Deserialize)]
struct StoredProviderRequest {
    session_id: String,
    attempt: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fallback: Option<bool>,
    provider: String,
    base_url: Option<String>,
    model: String,
    max_tokens: Option<u32>,
    /// The stored messages, by id.
    #[serde(default)]
    history_ids: Vec<String>,
    /// The messages after them (all of them, for an event logged before ids were kept).
    messages: Vec<Message>,
    tools: Vec<ToolSchema>,
}

impl From<StoredProviderRequest> for ProviderRequest {
    fn from(stored: StoredProviderRequest) -> ProviderRequest {
        let count = stored.history_ids.len();
        // A placeholder is cheap: a long session's request names thousands (no fresh id or
        // clock reading each), and resolving replaces it whole.
        let placeholders = stored.history_ids.into_iter().map(|id| Message {
            id,
            role: Role::User,
            blocks: Vec::new(),
            created_at: String::new(),
            model: None,
            meta: None,
        });
        ProviderRequest {
            session_id: stored.session_id,
            attempt: stored.attempt,
            fallback: stored.fallback,
            provider: stored.provider,
            base_url: stored.base_url,
            model: stored.model,
            max_tokens: stored.max_tokens,
            messages: placeholders.chain(stored.messages).collect(),
            tools: stored.tools,
            stored: count,
            unresolved: count > 0,
        }
    }
}

impl Serialize for ProviderRequest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let stored = self.stored.min(self.messages.len());
        let ids: Vec<&str> = self.messages[..stored].iter().map(|m| m.id.as_str()).collect();
        let mut fields = serializer.serialize_struct("ProviderRequest", 10)?;
        fields.serialize_field("session_id", &self.session_id)?;
        fields.serialize_field("attempt", &self.attempt)?;
        match self.fallback {
            Some(fallback) => fields.serialize_field("fallback", &fallback)?,
            None => fields.skip_field("fallback")?,
        }
        fields.serialize_field("provider", &self.provider)?;
        fields.serialize_field("base_url", &self.base_url)?;
        fields.serialize_field("model", &self.model)?;
        fields.serialize_field("max_tokens", &self.max_tokens)?;
        fields.serialize_field("history_ids", &ids)?;
        fields.serialize_field("messages", &self.messages[stored..])?;
        fields.serialize_field("tools", &self.tools)?;
        fields.end()
    }
}

impl ProviderRequest {
    /// Puts the stored messages back into an event read from the log; `found` has them by
    /// id (one that is gone stays an empty message with its id).
    pub fn resolve(&mut self, found: &std::collections::HashMap<String, Message>) {
        for slot in self.messages.iter_mut().take(self.stored) {
            if let Some(message) = found.get(&slot.id) {
                *slot = message.clone();
            }
        }
        self.unresolved = false;
    }

    /// The ids of the stored messages still to put back.
    pub fn unresolved_ids(&self) -> Vec<String> {
        match self.unresolved {
            true => self.messages.iter().take(self.stored).map(|m| m.id.clone()).collect(),
            false => Vec::new(),
        }
    }
}

/// What an attempt got back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProviderResponse {
    pub session_id: String,
    pub attempt: u32,
    /// As `ProviderRequest::fallback`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<bool>,
    pub provider: String,
    pub ok: bool,
    /// The HTTP status, when a response arrived.
    pub status: Option<u16>,
    pub error: Option<String>,
    /// The provider's answer: its JSON on success, its raw text on failure.
    pub body: Option<Value>,
}
