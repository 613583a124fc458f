//! The Anthropic Messages wire format: request bodies and the streamed answer.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::openai::parse_arguments;
use super::sse::SseEvent;
use super::transport::CallError;
use super::{CompletionRequest, Delta, Finish, StreamState};
use crate::domain::{Block as MessageBlock, Message, Role, ToolCall, Usage};

pub(super) const API_VERSION: &str = "2023-06-01";

/// The request body for one call. Anthropic wants alternating user and assistant turns, so
/// consecutive messages that map to the same role (tool results, then the next user message)
/// are merged into one turn.
pub(super) fn request_body(request: &CompletionRequest<'_>, model: &str, max_tokens: u32, tools: bool) -> Value {
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
    let mut body = json!({ "model": model, "max_tokens": max_tokens, "stream": true, "messages": messages });
    if let Some(prompt) = request.system_prompt {
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
pub(super) struct AnthropicStream {
    state: StreamState,
    blocks: BTreeMap<u64, Block>,
    input_tokens: u64,
    cache_read: Option<u64>,
    cache_creation: Option<u64>,
    output_tokens: u64,
}

impl AnthropicStream {
    /// Handles one SSE event; returns false once the message is complete.
    pub(super) fn on_event(
        &mut self,
        event: &SseEvent,
        on_delta: &mut dyn FnMut(Delta<'_>),
    ) -> Result<bool, CallError> {
        if event.data.trim().is_empty() {
            return Ok(true);
        }
        let payload: Value = serde_json::from_str(&event.data)
            .map_err(|e| CallError::Fatal(format!("the provider sent an event that is not JSON: {e}")))?;
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
                    self.state.finish = Some(match reason {
                        "end_turn" | "stop_sequence" => Finish::Stop,
                        "max_tokens" => Finish::Length,
                        "tool_use" => Finish::ToolCalls,
                        "refusal" => Finish::ContentFilter,
                        other => Finish::Other(other.to_string()),
                    });
                }
                if let Some(usage) = payload.get("usage") {
                    self.read_usage(usage);
                }
            }
            "message_stop" => return Ok(false),
            "error" => {
                let message = payload.pointer("/error/message").and_then(Value::as_str).unwrap_or("unknown error");
                let kind = payload.pointer("/error/type").and_then(Value::as_str).unwrap_or("error");
                return Err(CallError::Transient {
                    message: format!("stream error ({kind}): {message}"),
                    retry_after: None,
                });
            }
            _ => {} // ping, content_block_stop and future event types
        }
        Ok(true)
    }

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

    pub(super) fn finish(self) -> StreamState {
        let mut state = self.state;
        // Anthropic counts cached prompt tokens apart from `input_tokens`; ours is the total.
        let input = self.input_tokens + self.cache_read.unwrap_or(0) + self.cache_creation.unwrap_or(0);
        state.usage = Some(Usage {
            input_tokens: input,
            output_tokens: self.output_tokens,
            total_tokens: input + self.output_tokens,
            cached_input_tokens: self.cache_read,
            reasoning_tokens: None,
            cost: None,
        });
        state.tool_calls = self
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
