//! One provider attempt as BAE makes it: a single, non-streamed request to one model's own
//! provider (no retries, no fallbacks: the caller walks its own chain), answered with the
//! provider's JSON body as it came, or with why it failed (status, message, raw body).
//!
//! Request bodies and answers use the same wire formats as the streamed calls
//! (`openai.rs`, `anthropic.rs`), without `stream`.

use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use super::route::WireClient;
use super::transport::{self, Fetched, HttpCall};
use super::{anthropic, openai, Completion, CompletionRequest, Finish};
use crate::cancel::CancelToken;
use crate::config::{ModelConfig, Wire};
use crate::domain::{ToolCall, Usage};

/// What an attempt is made against, as events and the admin API show it (never a key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The wire format: `anthropic`, `openai` or `builtin`.
    pub wire: &'static str,
    /// The provider's base URL before the version segment, as BAE shows it.
    pub base_url: Option<String>,
    /// The model name sent upstream.
    pub model: String,
    pub max_tokens: Option<u32>,
}

/// An answer: what the engine reads of it, and the body as the provider sent it.
#[derive(Debug, Clone)]
pub struct Exchanged {
    pub completion: Completion,
    pub body: Value,
}

/// A failed attempt, safe to record: no key, no header.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    /// The HTTP status, when a response arrived.
    pub status: Option<u16>,
    pub error: String,
    /// The response body's text, when there was one.
    pub body: Option<String>,
    pub cancelled: bool,
}

impl Refused {
    pub fn new(status: Option<u16>, error: impl Into<String>, body: Option<String>) -> Refused {
        Refused { status, error: error.into(), body, cancelled: false }
    }
}

/// The largest answer body read.
const BODY_LIMIT: u64 = 32 * 1024 * 1024;

impl WireClient {
    pub(super) fn target(&self, model: &ModelConfig) -> Target {
        let base = self.config.base_url.trim_end_matches('/');
        Target {
            wire: match self.config.wire {
                Wire::Openai => "openai",
                Wire::Anthropic => "anthropic",
            },
            base_url: Some(base.strip_suffix("/v1").unwrap_or(base).to_string()),
            model: model.name.clone(),
            max_tokens: self.max_tokens(model),
        }
    }

    fn max_tokens(&self, model: &ModelConfig) -> Option<u32> {
        match self.config.wire {
            Wire::Anthropic => Some(model.max_tokens.unwrap_or(super::route::ANTHROPIC_DEFAULT_MAX_TOKENS)),
            Wire::Openai => model.max_tokens,
        }
    }

    /// One non-streamed request to this provider for `model`.
    pub(super) fn exchange(
        &self,
        request: &CompletionRequest<'_>,
        model: &ModelConfig,
        cancel: &CancelToken,
    ) -> Result<Exchanged, Refused> {
        let key = self.key().map_err(|error| Refused::new(None, error.to_string(), None))?;
        let base = self.config.base_url.trim_end_matches('/');
        let mut headers = vec![("Content-Type", "application/json".to_string()), ("Accept", "application/json".into())];
        let (url, mut body) = match self.config.wire {
            Wire::Openai => {
                headers.extend(key.map(|key| ("Authorization", format!("Bearer {key}"))));
                let body = openai::request_body(request, &model.name, model.max_tokens, model.supports_tools);
                (format!("{base}/chat/completions"), body)
            }
            Wire::Anthropic => {
                headers.extend(key.map(|key| ("x-api-key", key)));
                headers.push(("anthropic-version", anthropic::API_VERSION.into()));
                let max_tokens = self.max_tokens(model).unwrap_or(super::route::ANTHROPIC_DEFAULT_MAX_TOKENS);
                let body = anthropic::request_body(request, &model.name, max_tokens, true);
                (format!("{base}/messages"), body)
            }
        };
        if let Some(fields) = body.as_object_mut() {
            fields.remove("stream");
            fields.remove("stream_options");
        }
        let call = HttpCall { url, headers, body: body.to_string() };
        let deadline = Instant::now() + Duration::from_secs(self.config.timeout_secs.max(1));
        let fetched = transport::fetch(&self.agent, call, cancel, deadline, BODY_LIMIT);
        match fetched {
            Fetched::Answer { status, body } if (200..300).contains(&status) => self.read_answer(&body),
            Fetched::Answer { status, body } => Err(Refused::new(
                Some(status),
                format!("provider returned HTTP {status}"),
                Some(self.redact(&String::from_utf8_lossy(&body))),
            )),
            Fetched::Cancelled => Err(Refused { cancelled: true, ..Refused::new(None, "cancelled", None) }),
            Fetched::Failed(why) => Err(Refused::new(None, self.redact(&why), None)),
        }
    }

    fn read_answer(&self, body: &[u8]) -> Result<Exchanged, Refused> {
        let text = String::from_utf8_lossy(body);
        let value: Value = serde_json::from_slice(body).map_err(|e| {
            Refused::new(Some(200), format!("provider returned a body that is not JSON: {e}"), Some(self.redact(&text)))
        })?;
        let completion = match self.config.wire {
            Wire::Anthropic => Ok(anthropic_answer(&value)),
            Wire::Openai => openai_answer(&value),
        }
        .map_err(|why| Refused::new(Some(200), why, Some(self.redact(&text))))?;
        Ok(Exchanged { completion, body: value })
    }

    fn redact(&self, text: &str) -> String {
        match self.resolved_key().filter(|key| key.len() >= 4) {
            Some(key) => text.replace(&key, "[redacted]"),
            None => text.to_string(),
        }
    }
}

/// A Messages answer: its `content` blocks (missing: none) and its usage.
fn anthropic_answer(body: &Value) -> Completion {
    let mut completion = Completion::default();
    for block in body.get("content").and_then(Value::as_array).into_iter().flatten() {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => completion.text.push_str(block.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("thinking") => {
                completion.reasoning.push_str(block.get("thinking").and_then(Value::as_str).unwrap_or(""))
            }
            Some("tool_use") => {
                let string = |field: &str| block.get(field).and_then(Value::as_str).unwrap_or("").to_string();
                let input = block.get("input").and_then(Value::as_object).cloned().unwrap_or_default();
                completion.tool_calls.push(ToolCall::new(string("id"), string("name"), input));
            }
            _ => {}
        }
    }
    let number = |field: &str| body.pointer(&format!("/usage/{field}")).and_then(Value::as_u64);
    let (input, output) = (number("input_tokens").unwrap_or(0), number("output_tokens").unwrap_or(0));
    completion.usage =
        Usage { input_tokens: input, output_tokens: output, total_tokens: input + output, ..Usage::default() };
    completion.finish = body.get("stop_reason").and_then(Value::as_str).map(|reason| match reason {
        "end_turn" | "stop_sequence" => Finish::Stop,
        "max_tokens" => Finish::Length,
        "tool_use" => Finish::ToolCalls,
        other => Finish::Other(other.to_string()),
    });
    completion
}

/// A Chat Completions answer: `choices[0].message` (required), its text and tool calls.
fn openai_answer(body: &Value) -> Result<Completion, String> {
    let message = body.pointer("/choices/0/message").ok_or("the response has no choices[0].message")?;
    let mut completion = Completion {
        text: message.get("content").and_then(Value::as_str).unwrap_or("").to_string(),
        ..Completion::default()
    };
    for call in message.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
        let name = call.pointer("/function/name").and_then(Value::as_str).ok_or("a tool call has no function.name")?;
        let arguments = call.pointer("/function/arguments").and_then(Value::as_str).unwrap_or("");
        let input = if arguments.trim().is_empty() {
            Map::new()
        } else {
            match serde_json::from_str::<Value>(arguments) {
                Ok(Value::Object(map)) => map,
                _ => return Err(format!("the arguments of tool call {name} are not a JSON object")),
            }
        };
        let id = call.get("id").and_then(Value::as_str).unwrap_or("").to_string();
        completion.tool_calls.push(ToolCall::new(id, name, input));
    }
    let number = |pointer: &str| body.pointer(pointer).and_then(Value::as_u64);
    let (input, output) =
        (number("/usage/prompt_tokens").unwrap_or(0), number("/usage/completion_tokens").unwrap_or(0));
    completion.usage =
        Usage { input_tokens: input, output_tokens: output, total_tokens: input + output, ..Usage::default() };
    completion.finish = body.pointer("/choices/0/finish_reason").and_then(Value::as_str).map(|reason| match reason {
        "stop" => Finish::Stop,
        "length" => Finish::Length,
        "tool_calls" => Finish::ToolCalls,
        other => Finish::Other(other.to_string()),
    });
    Ok(completion)
}

/// The body an answer from a provider with no wire of its own (`builtin/echo`) is recorded
/// with: the Messages shape, so a reader of `provider.response` sees a familiar answer.
pub(super) fn messages_body(model: &str, completion: &Completion) -> Value {
    let mut content = Vec::new();
    if !completion.text.is_empty() {
        content.push(json!({ "type": "text", "text": completion.text }));
    }
    for call in &completion.tool_calls {
        content.push(json!({ "type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments }));
    }
    let stop = if completion.tool_calls.is_empty() { "end_turn" } else { "tool_use" };
    json!({
        "id": crate::domain::new_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "usage": { "input_tokens": completion.usage.input_tokens, "output_tokens": completion.usage.output_tokens },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_from_both_wire_formats() {
        let body = json!({"content": [{"type": "text", "text": "hi"},
            {"type": "tool_use", "id": "tu_1", "name": "t", "input": {"a": 1}}],
            "stop_reason": "tool_use", "usage": {"input_tokens": 10, "output_tokens": 3}});
        let completion = anthropic_answer(&body);
        assert_eq!(completion.text, "hi");
        assert_eq!(completion.tool_calls[0].name, "t");
        assert_eq!(completion.usage.total_tokens, 13);
        let body = json!({"choices": [{"message": {"content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "t", "arguments": "{\"a\":1}"}}]}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2}});
        let completion = openai_answer(&body).unwrap();
        assert_eq!(completion.tool_calls[0].arguments["a"], 1);
        assert_eq!(completion.usage.input_tokens, 5);
        assert!(openai_answer(&json!({"choices": []})).is_err());
        let bad = json!({"choices": [{"message": {"tool_calls": [{"function": {"name": "t", "arguments": "[1]"}}]}}]});
        assert!(openai_answer(&bad).is_err());
    }
}
