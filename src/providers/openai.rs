//! The OpenAI Chat Completions wire format: request bodies and the streamed answer.
//!
//! Also spoken by vLLM, llama.cpp's server, Ollama's `/v1`, LM Studio and most gateways, which
//! is why reasoning is read from both `reasoning_content` and `reasoning`.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::Deserialize;

use serde_json::{json, Map, Value};

use super::http::{Decoder, Exchange};
use super::sse::SseEvent;
use super::transport::{CallError, Refusal};
use super::{Answer, Attempt, Completion, CompletionRequest, Delta, Finish, StreamState};
use crate::cancel::CancelToken;
use crate::domain::{new_id, Block, Message, Role, ToolCall, ToolResult, Usage};

/// The Chat Completions API.
pub struct OpenAi;

impl super::Wire for OpenAi {
    fn name(&self) -> &'static str {
        "openai"
    }

    fn attempt(
        &self,
        attempt: &Attempt<'_>,
        on_delta: &mut dyn FnMut(Delta<'_>),
        cancel: &CancelToken,
    ) -> Result<Answer, CallError> {
        let endpoint = attempt.endpoint.ok_or_else(|| Refusal::fatal("an OpenAI model has no endpoint"))?;
        let model = attempt.model;
        let mut body = request_body(attempt.request, &model.name, model.max_tokens, model.supports_tools);
        if attempt.streamed {
            body["stream"] = Value::Bool(true);
            body["stream_options"] = json!({ "include_usage": true });
        }
        let exchange = Exchange {
            path: "/chat/completions",
            headers: Vec::new(),
            key_header: ("Authorization", "Bearer "),
            body,
            decoder: Box::<OpenAiStream>::default(),
            read: whole_answer,
        };
        endpoint.attempt(exchange, attempt.streamed, on_delta, cancel)
    }

    fn cut_at_limit(&self) -> &'static str {
        "finish_reason length"
    }
}

/// The request body for one call (streaming is the caller's to ask for).
fn request_body(request: &CompletionRequest<'_>, model: &str, max_tokens: Option<u32>, tools: bool) -> Value {
    let mut messages = Vec::new();
    if let Some(prompt) = request.system_text(true) {
        messages.push(json!({ "role": "system", "content": prompt }));
    }
    for each in request.messages {
        match tool_results(each) {
            Some(turns) => messages.extend(turns),
            None => messages.extend(message(each)),
        }
    }
    let mut body = json!({ "model": model, "messages": messages });
    if tools && !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .distinct_tools()
            .into_iter()
            .map(|tool| {
                json!({ "type": "function", "function": {
                    "name": tool.name, "description": tool.description, "parameters": tool.parameters,
                }})
            })
            .collect();
        body["tools"] = Value::Array(tools);
    }
    if let Some(max_tokens) = max_tokens {
        body["max_tokens"] = json!(max_tokens);
    }
    // Native structured output; the answer is validated all the same (not `strict`, which
    // accepts only a subset of JSON Schema).
    if let Some(format) = request.response_format {
        body["response_format"] = json!({ "type": "json_schema", "json_schema": {
            "name": format.name(), "schema": format.schema, "strict": false,
        }});
    }
    body
}

/// A user message that carries tool results (a BAE client's): one `tool` message per result,
/// then the user's text if it has any. `None` for any other message.
fn tool_results(message: &Message) -> Option<Vec<Value>> {
    let results: Vec<&ToolResult> = message
        .blocks
        .iter()
        .filter_map(|block| match block {
            Block::ToolResult(result) => Some(result),
            _ => None,
        })
        .collect();
    if message.role != Role::User || results.is_empty() {
        return None;
    }
    let mut turns: Vec<Value> = results
        .into_iter()
        .map(|result| json!({ "role": "tool", "tool_call_id": result.call_id, "content": result_text(result) }))
        .collect();
    let text = message.text();
    if !text.is_empty() {
        turns.push(json!({ "role": "user", "content": text }));
    }
    Some(turns)
}

/// A result's text: its content, or for blocks their text joined, or their JSON if none is text.
fn result_text(result: &ToolResult) -> String {
    let Some(blocks) = &result.blocks else { return result.content.clone() };
    let text: String = blocks.iter().filter_map(|b| b.get("text").and_then(Value::as_str)).collect();
    if text.is_empty() {
        Value::Array(blocks.clone()).to_string()
    } else {
        text
    }
}

fn message(message: &Message) -> Option<Value> {
    let text = message.text();
    let mut images = message.images().peekable();
    Some(match message.role {
        Role::System => json!({ "role": "system", "content": text }),
        Role::User if images.peek().is_none() => json!({ "role": "user", "content": text }),
        Role::User => {
            let mut parts = Vec::new();
            if !text.is_empty() {
                parts.push(json!({ "type": "text", "text": text }));
            }
            for image in images {
                let url = format!("data:{};base64,{}", image.mime_type, image.data);
                parts.push(json!({ "type": "image_url", "image_url": { "url": url } }));
            }
            json!({ "role": "user", "content": parts })
        }
        Role::Assistant => {
            let calls: Vec<Value> = message
                .tool_calls()
                .map(|call| {
                    json!({ "id": call.id, "type": "function", "function": {
                        "name": call.name, "arguments": Value::Object(call.arguments.clone()).to_string(),
                    }})
                })
                .collect();
            let mut turn = json!({ "role": "assistant", "content": text });
            if !calls.is_empty() {
                if text.is_empty() {
                    turn["content"] = Value::Null;
                }
                turn["tool_calls"] = Value::Array(calls);
            }
            turn
        }
        Role::Tool => {
            let result = message.tool_result();
            json!({
                "role": "tool",
                "tool_call_id": result.map_or("", |r| r.call_id.as_str()),
                "content": result.map_or("", |r| r.content.as_str()),
            })
        }
    })
}

/// One `chat.completion.chunk`, read without copying its strings where JSON allows: a stream
/// carries thousands of these, and this is the hot path of every OpenAI-style answer.
#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(borrow, default)]
    choices: Vec<Choice<'a>>,
    #[serde(default)]
    usage: Option<Value>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(borrow, default)]
    delta: Option<ChunkDelta<'a>>,
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct ChunkDelta<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    /// vLLM, DeepSeek.
    #[serde(borrow, default)]
    reasoning_content: Option<Cow<'a, str>>,
    /// llama.cpp, Ollama, OpenRouter.
    #[serde(borrow, default)]
    reasoning: Option<Cow<'a, str>>,
    #[serde(default, deserialize_with = "null_as_empty")]
    tool_calls: Vec<Value>,
}

fn null_as_empty<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Vec<Value>, D::Error> {
    Ok(Option::<Vec<Value>>::deserialize(deserializer)?.unwrap_or_default())
}

#[derive(Default)]
struct PartialCall {
    id: Option<String>,
    name: String,
    arguments: String,
}

/// Assembles a streamed answer from `chat.completion.chunk` events.
#[derive(Default)]
struct OpenAiStream {
    state: StreamState,
    calls: BTreeMap<u64, PartialCall>,
}

impl Decoder for OpenAiStream {
    /// Handles one SSE event; returns false once the stream is done (`[DONE]`).
    fn on_event(&mut self, event: &SseEvent, on_delta: &mut dyn FnMut(Delta<'_>)) -> Result<bool, Refusal> {
        let data = event.data.trim();
        if data == "[DONE]" {
            return Ok(false);
        }
        if data.is_empty() {
            return Ok(true);
        }
        let chunk: Chunk<'_> = serde_json::from_str(data)
            .map_err(|e| Refusal::fatal(format!("the provider sent a chunk that is not JSON: {e}")))?;
        if let Some(error) = chunk.error {
            let message = error.get("message").and_then(Value::as_str).unwrap_or("unknown error");
            return Err(Refusal::transient(format!("stream error: {message}")));
        }
        if let Some(usage) = chunk.usage.filter(|u| u.is_object()) {
            self.state.usage = Some(usage_from(&usage));
        }
        let Some(choice) = chunk.choices.into_iter().next() else {
            return Ok(true);
        };
        if let Some(delta) = choice.delta {
            for piece in [delta.reasoning_content, delta.reasoning].into_iter().flatten() {
                if !piece.is_empty() {
                    self.state.reasoning(&piece, on_delta);
                }
            }
            if let Some(piece) = delta.content.filter(|p| !p.is_empty()) {
                self.state.text(&piece, on_delta);
            }
            for call in &delta.tool_calls {
                self.add_call_piece(call);
            }
        }
        if let Some(reason) = choice.finish_reason {
            self.state.finish = Some(finish_reason(&reason));
        }
        Ok(true)
    }

    fn finish(self: Box<Self>) -> StreamState {
        let this = *self;
        let mut state = this.state;
        state.tool_calls = this
            .calls
            .into_values()
            .map(|call| {
                ToolCall::new(call.id.unwrap_or_else(|| new_id("call")), call.name, parse_arguments(&call.arguments))
            })
            .collect();
        state
    }
}

impl OpenAiStream {
    /// A tool call arrives in pieces keyed by index: id and name once, arguments in parts.
    fn add_call_piece(&mut self, piece: &Value) {
        let index = piece.get("index").and_then(Value::as_u64).unwrap_or(0);
        let call = self.calls.entry(index).or_default();
        if let Some(id) = piece.get("id").and_then(Value::as_str).filter(|id| !id.is_empty()) {
            call.id = Some(id.to_string());
        }
        if let Some(function) = piece.get("function") {
            if let Some(name) = function.get("name").and_then(Value::as_str) {
                call.name.push_str(name);
            }
            if let Some(arguments) = function.get("arguments").and_then(Value::as_str) {
                call.arguments.push_str(arguments);
            }
        }
    }
}

/// Why a Chat Completions answer stopped.
fn finish_reason(reason: &str) -> Finish {
    match reason {
        "stop" => Finish::Stop,
        "length" => Finish::Length,
        "tool_calls" | "function_call" => Finish::ToolCalls,
        "content_filter" => Finish::ContentFilter,
        other => Finish::Other(other.to_string()),
    }
}

/// A whole Chat Completions answer: `choices[0].message` (required), its text and tool calls
/// (each with a `function.name` and arguments that are a JSON object, as BAE requires).
fn whole_answer(body: &Value) -> Result<Completion, Refusal> {
    let message =
        body.pointer("/choices/0/message").ok_or_else(|| Refusal::fatal("the response has no choices[0].message"))?;
    let mut completion = Completion {
        text: message.get("content").and_then(Value::as_str).unwrap_or("").to_string(),
        ..Completion::default()
    };
    for call in message.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
        let name = call
            .pointer("/function/name")
            .and_then(Value::as_str)
            .ok_or_else(|| Refusal::fatal("a tool call has no function.name"))?;
        let arguments = call.pointer("/function/arguments").and_then(Value::as_str).unwrap_or("");
        let input = if arguments.trim().is_empty() {
            Map::new()
        } else {
            match serde_json::from_str::<Value>(arguments) {
                Ok(Value::Object(map)) => map,
                _ => return Err(Refusal::fatal(format!("the arguments of tool call {name} are not a JSON object"))),
            }
        };
        let id = call.get("id").and_then(Value::as_str).unwrap_or("").to_string();
        completion.tool_calls.push(ToolCall::new(id, name, input));
    }
    completion.usage = body.get("usage").map(usage_from).unwrap_or_default();
    completion.finish = body.pointer("/choices/0/finish_reason").and_then(Value::as_str).map(finish_reason);
    Ok(completion)
}

/// Tool arguments as an object. Arguments that are not a JSON object are kept under `_raw`,
/// so the tool can refuse them with a message the model understands.
pub(super) fn parse_arguments(text: &str) -> Map<String, Value> {
    if text.trim().is_empty() {
        return Map::new();
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => map,
        _ => {
            let mut map = Map::new();
            map.insert("_raw".into(), Value::String(text.to_string()));
            map
        }
    }
}

fn usage_from(usage: &Value) -> Usage {
    let number = |pointer: &str| usage.pointer(pointer).and_then(Value::as_u64);
    let input = number("/prompt_tokens").unwrap_or(0);
    let output = number("/completion_tokens").unwrap_or(0);
    Usage {
        input_tokens: input,
        output_tokens: output,
        total_tokens: number("/total_tokens").unwrap_or(input + output),
        cached_input_tokens: number("/prompt_tokens_details/cached_tokens"),
        reasoning_tokens: number("/completion_tokens_details/reasoning_tokens"),
        cost: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_answer_needs_a_message_named_calls_and_object_arguments() {
        let body = json!({"choices": [{"message": {"content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "t", "arguments": "{\"a\":1}"}}]}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2}});
        let completion = whole_answer(&body).unwrap();
        assert_eq!(completion.tool_calls[0].arguments["a"], 1);
        assert_eq!((completion.usage.input_tokens, completion.usage.total_tokens), (5, 7));
        assert!(!whole_answer(&json!({"choices": []})).unwrap_err().retryable);
        let unnamed = json!({"choices": [{"message": {"tool_calls": [{"function": {"arguments": "{}"}}]}}]});
        assert_eq!(whole_answer(&unnamed).unwrap_err().error, "a tool call has no function.name");
        let bad = json!({"choices": [{"message": {"tool_calls": [{"function": {"name": "t", "arguments": "[1]"}}]}}]});
        assert!(whole_answer(&bad).is_err());
    }
}
