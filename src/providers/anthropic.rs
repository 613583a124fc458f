//! The Anthropic Messages wire format: `POST /messages` with `x-api-key` and
//! `anthropic-version`, its request body, its streamed answer (server-sent events) and its
//! whole answer (one JSON message).

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::http::{Decoder, Exchange};
use super::openai::parse_arguments;
use super::sse::SseEvent;
use super::transport::{CallError, Refusal};
use super::{Answer, Attempt, Completion, CompletionRequest, Delta, Finish, StreamState};
use crate::cancel::CancelToken;
use crate::domain::{Block as MessageBlock, Message, Role, ToolCall, Usage};

const API_VERSION: &str = "2023-06-01";

/// Anthropic requires `max_tokens`; this is used when a model sets none.
const DEFAULT_MAX_TOKENS: u32 = 8192;

/// The Messages API.
pub struct Anthropic;

impl super::Wire for Anthropic {
    fn name(&self) -> &'static str {
        "anthropic"
    }

    fn max_tokens(&self, configured: Option<u32>) -> Option<u32> {
        Some(configured.unwrap_or(DEFAULT_MAX_TOKENS))
    }

    fn attempt(
        &self,
        attempt: &Attempt<'_>,
        on_delta: &mut dyn FnMut(Delta<'_>),
        cancel: &CancelToken,
    ) -> Result<Answer, CallError> {
        let endpoint = attempt.endpoint.ok_or_else(|| Refusal::fatal("an Anthropic model has no endpoint"))?;
        let max_tokens = attempt.model.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
        let mut body = request_body(attempt.request, &attempt.model.name, max_tokens, attempt.model.supports_tools);
        if attempt.streamed {
            body["stream"] = Value::Bool(true);
        }
        let exchange = Exchange {
            path: "/messages",
            headers: vec![("anthropic-version", API_VERSION.into())],
            key_header: ("x-api-key", ""),
            body,
            decoder: Box::<AnthropicStream>::default(),
            read: |body| Ok(whole_answer(body)),
        };
        endpoint.attempt(exchange, attempt.streamed, on_delta, cancel)
    }

    fn cut_at_limit(&self) -> &'static str {
        "stop_reason max_tokens"
    }
}

/// The request body for one call. Anthropic wants alternating user and assistant turns, so
/// consecutive messages that map to the same role (tool results, then the next user message)
/// are merged into one turn.
fn request_body(request: &CompletionRequest<'_>, model: &str, max_tokens: u32, tools: bool) -> Value {
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for message in request.messages {
        let (role, blocks) = match message.role {
            Role::System => continue, // the session's prompt goes in `system`
            Role::User => ("user", user_blocks(message)),
            Role::Tool => ("user", vec![tool_result(message)]),
            Role::Assistant => ("assistant", assistant_blocks(message)),
        };
        if blocks.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((last_role, last_blocks)) if *last_role == role => last_blocks.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    let messages: Vec<Value> =
        turns.into_iter().map(|(role, content)| json!({ "role": role, "content": content })).collect();
    let mut body = json!({ "model": model, "max_tokens": max_tokens, "messages": messages });
    // Structured answers are instructed: the Messages API's own is a beta behind a header.
    if let Some(prompt) = request.system_text(false) {
        body["system"] = json!(prompt);
    }
    if tools && !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .distinct_tools()
            .into_iter()
            .map(|tool| json!({ "name": tool.name, "description": tool.description, "input_schema": tool.parameters }))
            .collect();
        body["tools"] = Value::Array(tools);
    }
    body
}

fn user_blocks(message: &Message) -> Vec<Value> {
    if message.blocks.iter().any(|block| matches!(block, MessageBlock::ToolResult(_))) {
        return message.blocks.iter().filter_map(user_block).collect();
    }
    let mut blocks = Vec::new();
    for image in message.images() {
        blocks.push(json!({ "type": "image", "source": {
            "type": "base64", "media_type": image.mime_type, "data": image.data,
        }}));
    }
    let text = message.text();
    if !text.is_empty() {
        blocks.push(json!({ "type": "text", "text": text }));
    }
    blocks
}

/// One block of a user turn that carries tool results (a BAE client's), in its order.
fn user_block(block: &MessageBlock) -> Option<Value> {
    Some(match block {
        MessageBlock::Text { text } => json!({ "type": "text", "text": text }),
        MessageBlock::Image(image) => json!({ "type": "image", "source": {
            "type": "base64", "media_type": image.mime_type, "data": image.data,
        }}),
        MessageBlock::ToolResult(result) => {
            let content = match &result.blocks {
                Some(blocks) => Value::Array(blocks.clone()),
                None => Value::String(result.content.clone()),
            };
            let mut block = json!({ "type": "tool_result", "tool_use_id": result.call_id, "content": content });
            if !result.ok {
                block["is_error"] = Value::Bool(true);
            }
            block
        }
        MessageBlock::Reasoning { .. } | MessageBlock::ToolCall(_) => return None,
    })
}

fn assistant_blocks(message: &Message) -> Vec<Value> {
    let mut blocks = Vec::new();
    let text = message.text();
    if !text.is_empty() {
        blocks.push(json!({ "type": "text", "text": text }));
    }
    for call in message.tool_calls() {
        blocks.push(json!({ "type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments }));
    }
    blocks
}

fn tool_result(message: &Message) -> Value {
    let result = message.tool_result();
    let failed = result.is_some_and(|r| !r.ok);
    json!({
        "type": "tool_result",
        "tool_use_id": result.map_or("", |r| r.call_id.as_str()),
        "content": result.map_or("", |r| r.content.as_str()),
        "is_error": failed,
    })
}

enum Block {
    Text,
    Thinking,
    ToolUse { id: String, name: String, json: String },
}

/// Assembles a streamed answer from Messages stream events.
#[derive(Default)]
struct AnthropicStream {
    state: StreamState,
    blocks: BTreeMap<u64, Block>,
    input_tokens: u64,
    cache_read: Option<u64>,
    cache_creation: Option<u64>,
    output_tokens: u64,
}

impl Decoder for AnthropicStream {
    /// Handles one SSE event; returns false once the message is complete.
    fn on_event(&mut self, event: &SseEvent, on_delta: &mut dyn FnMut(Delta<'_>)) -> Result<bool, Refusal> {
        if event.data.trim().is_empty() {
            return Ok(true);
        }
        let payload: Value = serde_json::from_str(&event.data)
            .map_err(|e| Refusal::fatal(format!("the provider sent an event that is not JSON: {e}")))?;
        let kind = payload.get("type").and_then(Value::as_str).or(event.event.as_deref()).unwrap_or("");
        let index = payload.get("index").and_then(Value::as_u64).unwrap_or(0);
        match kind {
            "message_start" => {
                if let Some(usage) = payload.pointer("/message/usage") {
                    self.read_usage(usage);
                }
            }
            "content_block_start" => {
                let block = payload.get("content_block").cloned().unwrap_or(Value::Null);
                let started = match block.get("type").and_then(Value::as_str) {
                    Some("tool_use") => Block::ToolUse {
                        id: block.get("id").and_then(Value::as_str).unwrap_or_default().to_string(),
                        name: block.get("name").and_then(Value::as_str).unwrap_or_default().to_string(),
                        json: String::new(),
                    },
                    Some("thinking") | Some("redacted_thinking") => Block::Thinking,
                    _ => {
                        if let Some(text) = block.get("text").and_then(Value::as_str).filter(|t| !t.is_empty()) {
                            self.state.text(text, on_delta);
                        }
                        Block::Text
                    }
                };
                self.blocks.insert(index, started);
            }
            "content_block_delta" => self.on_block_delta(index, payload.get("delta").unwrap_or(&Value::Null), on_delta),
            "message_delta" => {
                if let Some(reason) = payload.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.state.finish = Some(stop_reason(reason));
                }
                if let Some(usage) = payload.get("usage") {
                    self.read_usage(usage);
                }
            }
            "message_stop" => return Ok(false),
            "error" => {
                let message = payload.pointer("/error/message").and_then(Value::as_str).unwrap_or("unknown error");
                let kind = payload.pointer("/error/type").and_then(Value::as_str).unwrap_or("error");
                return Err(Refusal::transient(format!("stream error ({kind}): {message}")));
            }
            _ => {} // ping, content_block_stop and future event types
        }
        Ok(true)
    }

    fn finish(self: Box<Self>) -> StreamState {
        let this = *self;
        let mut state = this.state;
        // Anthropic counts cached prompt tokens apart from `input_tokens`; ours is the total.
        let input = this.input_tokens + this.cache_read.unwrap_or(0) + this.cache_creation.unwrap_or(0);
        state.usage = Some(Usage {
            input_tokens: input,
            output_tokens: this.output_tokens,
            total_tokens: input + this.output_tokens,
            cached_input_tokens: this.cache_read,
            reasoning_tokens: None,
            cost: None,
        });
        state.tool_calls = this
            .blocks
            .into_values()
            .filter_map(|block| match block {
                Block::ToolUse { id, name, json } => Some(ToolCall::new(id, name, parse_arguments(&json))),
                _ => None,
            })
            .collect();
        state
    }
}

impl AnthropicStream {
    fn on_block_delta(&mut self, index: u64, delta: &Value, on_delta: &mut dyn FnMut(Delta<'_>)) {
        let text = |field: &str| delta.get(field).and_then(Value::as_str).unwrap_or("");
        match delta.get("type").and_then(Value::as_str) {
            Some("text_delta") => self.state.text(text("text"), on_delta),
            Some("thinking_delta") => self.state.reasoning(text("thinking"), on_delta),
            Some("input_json_delta") => {
                if let Some(Block::ToolUse { json, .. }) = self.blocks.get_mut(&index) {
                    json.push_str(text("partial_json"));
                }
            }
            _ => {} // signature_delta and future delta types carry nothing for the transcript
        }
    }

    /// Usage arrives in `message_start` (input, cache) and `message_delta` (output so far).
    fn read_usage(&mut self, usage: &Value) {
        let number = |field: &str| usage.get(field).and_then(Value::as_u64);
        if let Some(input) = number("input_tokens") {
            self.input_tokens = input;
        }
        if let Some(read) = number("cache_read_input_tokens") {
            self.cache_read = Some(read);
        }
        if let Some(created) = number("cache_creation_input_tokens") {
            self.cache_creation = Some(created);
        }
        if let Some(output) = number("output_tokens") {
            self.output_tokens = output;
        }
    }
}

/// A whole Messages answer: its `content` blocks (missing: none) and its usage.
fn whole_answer(body: &Value) -> Completion {
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
    completion.finish = body.get("stop_reason").and_then(Value::as_str).map(stop_reason);
    completion
}

/// Why a Messages answer stopped.
fn stop_reason(reason: &str) -> Finish {
    match reason {
        "end_turn" | "stop_sequence" => Finish::Stop,
        "max_tokens" => Finish::Length,
        "tool_use" => Finish::ToolCalls,
        "refusal" => Finish::ContentFilter,
        other => Finish::Other(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_answer_is_read_with_its_calls_usage_and_stop_reason() {
        let body = json!({"content": [{"type": "text", "text": "hi"},
            {"type": "tool_use", "id": "tu_1", "name": "t", "input": {"a": 1}}],
            "stop_reason": "tool_use", "usage": {"input_tokens": 10, "output_tokens": 3}});
        let completion = whole_answer(&body);
        assert_eq!(completion.text, "hi");
        assert_eq!(completion.tool_calls[0].name, "t");
        assert_eq!(completion.usage.total_tokens, 13);
        assert_eq!(completion.finish, Some(Finish::ToolCalls));
        assert_eq!(whole_answer(&json!({"stop_reason": "max_tokens"})).finish, Some(Finish::Length));
    }
}
