//! `builtin/echo`: the offline model every server has, so the whole loop runs with no network.
//!
//! It streams `Echo: <the user's text>` a word per delta after a short reasoning delta. Lines
//! of the form `/tool NAME {json}` become tool calls (several lines, several calls in one
//! message); once the results are in, it answers with a one-line summary of each. Asked for a
//! structured answer, it does as instructed as far as an echo can: it answers with the user's
//! text alone, so a message that is valid JSON is answered with itself.

use std::time::Duration;

use serde_json::{Map, Value};

use serde_json::json;

use super::transport::CallError;
use super::{Answer, Attempt, Completion, Delta, Finish};
use crate::cancel::CancelToken;
use crate::domain::{new_id, Message, ModelInfo, Role, ToolCall, Usage};

pub const ECHO_MODEL_ID: &str = "builtin/echo";

pub struct Echo {
    /// Pause before each streamed word.
    pub delay: Duration,
    /// The `contextWindow` it reports (`[builtin] context_window`).
    pub context_window: u64,
    /// The prices it reports (`[builtin] pricing`).
    pub pricing: Option<crate::domain::ModelPricing>,
}

pub(super) fn echo_model_info(context_window: u64, pricing: Option<crate::domain::ModelPricing>) -> ModelInfo {
    ModelInfo {
        id: ECHO_MODEL_ID.into(),
        provider: "builtin".into(),
        label: Some("Echo (offline)".into()),
        description: Some("Repeats your message; `/tool NAME {json}` lines call tools.".into()),
        context_window: Some(context_window),
        supports_tools: true,
        supports_reasoning: Some(true),
        pricing,
    }
}

impl super::Wire for Echo {
    fn name(&self) -> &'static str {
        "builtin"
    }

    /// Answers here, with no server; a whole answer's body is written in the Messages shape,
    /// so a reader of `provider.response` sees a familiar answer.
    fn attempt(
        &self,
        attempt: &Attempt<'_>,
        on_delta: &mut dyn FnMut(Delta<'_>),
        cancel: &CancelToken,
    ) -> Result<Answer, CallError> {
        let completion = self.answer(attempt, on_delta, cancel)?;
        let body = (!attempt.streamed).then(|| messages_body(&attempt.model.name, &completion));
        Ok(Answer { completion, body })
    }

    fn cut_at_limit(&self) -> &'static str {
        "stop_reason max_tokens"
    }
}

impl Echo {
    fn answer(
        &self,
        attempt: &Attempt<'_>,
        on_delta: &mut dyn FnMut(Delta<'_>),
        cancel: &CancelToken,
    ) -> Result<Completion, CallError> {
        let request = attempt.request;
        let plan = plan_answer(request.messages, request.response_format.is_some());
        let finish = if plan.tool_calls.is_empty() { Finish::Stop } else { Finish::ToolCalls };
        let mut completion = Completion { tool_calls: plan.tool_calls, finish: Some(finish), ..Completion::default() };

        self.pause(cancel)?;
        on_delta(Delta::Reasoning(&plan.reasoning));
        completion.reasoning = plan.reasoning;

        for (index, word) in plan.text.split(' ').enumerate() {
            self.pause(cancel)?;
            let piece = if index == 0 { word.to_string() } else { format!(" {word}") };
            on_delta(Delta::Text(&piece));
            completion.text.push_str(&piece);
        }

        let input_chars: usize =
            request.messages.iter().map(|m| m.text().len()).sum::<usize>() + request.system_prompt.map_or(0, str::len);
        let input_tokens = (input_chars / 4 + 1) as u64;
        let output_tokens = completion.text.split_whitespace().count() as u64 + 1;
        completion.usage = Usage {
            input_tokens,
            output_tokens,
            total_tokens: input_tokens + output_tokens,
            cached_input_tokens: None,
            reasoning_tokens: Some(1),
            cost: None,
        };
        Ok(completion)
    }

    fn pause(&self, cancel: &CancelToken) -> Result<(), CallError> {
        let cancelled = if self.delay.is_zero() { cancel.is_cancelled() } else { cancel.wait(self.delay) };
        if cancelled {
            Err(CallError::Cancelled)
        } else {
            Ok(())
        }
    }
}

/// An answer in the Messages shape.
fn messages_body(model: &str, completion: &Completion) -> serde_json::Value {
    let mut content = Vec::new();
    if !completion.text.is_empty() {
        content.push(json!({ "type": "text", "text": completion.text }));
    }
    for call in &completion.tool_calls {
        content.push(json!({ "type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments }));
    }
    let stop = if completion.tool_calls.is_empty() { "end_turn" } else { "tool_use" };
    json!({
        "id": new_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "usage": { "input_tokens": completion.usage.input_tokens, "output_tokens": completion.usage.output_tokens },
    })
}

struct Plan {
    reasoning: String,
    text: String,
    tool_calls: Vec<ToolCall>,
}

/// Decides the answer from the transcript: a summary after tool results, else an echo of the
/// last user message with its `/tool` lines turned into calls (`structured`: without `Echo: `).
fn plan_answer(messages: &[Message], structured: bool) -> Plan {
    let last_assistant = messages.iter().rposition(|m| m.role == Role::Assistant);
    let results: Vec<&Message> = match last_assistant {
        Some(at) => messages[at + 1..].iter().filter(|m| m.role == Role::Tool).collect(),
        None => Vec::new(),
    };
    if messages.last().is_some_and(|m| m.role == Role::Tool) && !results.is_empty() {
        let lines: Vec<String> = results.iter().map(|m| summarize_result(m)).collect();
        return Plan {
            reasoning: format!("{} tool result(s) came back; summarizing.", results.len()),
            text: format!("Tool results: {}", lines.join("; ")),
            tool_calls: Vec::new(),
        };
    }

    let user = messages.iter().rev().find(|m| m.role == Role::User);
    let (text, images) = user.map_or((String::new(), 0), |m| (m.text(), m.images().count()));
    let mut plain = Vec::new();
    let mut tool_calls = Vec::new();
    for line in text.lines() {
        match parse_tool_line(line) {
            Some(call) => tool_calls.push(call),
            None => plain.push(line),
        }
    }
    let said = plain.join("\n").trim().to_string();
    let echoed = match (said.is_empty(), images) {
        (false, _) if structured => said.clone(),
        (false, _) => format!("Echo: {said}"),
        (true, 0) if !tool_calls.is_empty() => format!("Calling {} tool(s).", tool_calls.len()),
        (true, 0) => "Echo: (nothing)".to_string(),
        (true, n) => format!("Echo: ({n} image(s))"),
    };
    Plan {
        reasoning: format!("The user wrote {} word(s); echoing them.", said.split_whitespace().count()),
        text: echoed,
        tool_calls,
    }
}

fn summarize_result(message: &Message) -> String {
    let result = message.tool_result();
    let ok = result.is_none_or(|r| r.ok);
    let content = result.map_or("", |r| r.content.as_str());
    let first_line: String = content.lines().next().unwrap_or("").chars().take(120).collect();
    let name = result.map_or("tool", |r| r.name.as_str());
    format!("{name} {} — {first_line}", if ok { "ok" } else { "failed" })
}

/// `/tool NAME {json}` → a call; the JSON is optional and must be an object.
fn parse_tool_line(line: &str) -> Option<ToolCall> {
    let rest = line.trim().strip_prefix("/tool ")?.trim();
    let (name, arguments) = match rest.split_once(char::is_whitespace) {
        Some((name, json)) => (name, serde_json::from_str::<Map<String, Value>>(json.trim()).ok()?),
        None => (rest, Map::new()),
    };
    if name.is_empty() {
        return None;
    }
    Some(ToolCall::new(new_id("call"), name, arguments))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(text: &str) -> Message {
        Message::text_of(Role::User, text)
    }

    #[test]
    fn echoes_and_parses_tool_lines() {
        let plan = plan_answer(&[user("hello there\n/tool read_file {\"path\":\"a\"}\n/tool list_directory")], false);
        assert_eq!(plan.text, "Echo: hello there");
        assert_eq!(plan.tool_calls.len(), 2);
        assert_eq!(plan.tool_calls[0].name, "read_file");
        assert_eq!(plan.tool_calls[0].arguments["path"], "a");
        assert!(plan.tool_calls[1].arguments.is_empty());
    }

    #[test]
    fn a_tool_line_with_bad_json_is_plain_text() {
        let plan = plan_answer(&[user("/tool x {not json")], false);
        assert!(plan.tool_calls.is_empty());
        assert_eq!(plan.text, "Echo: /tool x {not json");
    }

    #[test]
    fn summarizes_results_after_tools() {
        let mut call = Message::new(Role::Assistant);
        call.blocks.push(crate::domain::Block::ToolCall(ToolCall::new("c1", "t", Map::new())));
        let mut result = Message::new(Role::Tool);
        result.blocks.push(crate::domain::Block::ToolResult(crate::domain::ToolResult {
            call_id: "c1".into(),
            name: "t".into(),
            ok: false,
            content: "boom\nmore".into(),
            duration_ms: None,
            error: None,
            data: None,
            blocks: None,
        }));
        let plan = plan_answer(&[user("/tool t"), call, result], false);
        assert_eq!(plan.text, "Tool results: t failed — boom");
        assert!(plan.tool_calls.is_empty());
    }
}
