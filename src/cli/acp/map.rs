//! Kestrel's shapes as ACP's: a tool call's kind, title and `session/update`s (a file edit's
//! as a diff), a prompt's content blocks as a message, a run's end as a stop reason, and a
//! stored transcript replayed for `session/load`.

use std::path::Path;

use serde_json::{json, Value};

use super::rpc::RpcError;

/// ACP's kind of a Kestrel tool.
pub fn tool_kind(name: &str) -> &'static str {
    match name {
        "read_file" | "list_directory" => "read",
        "write_file" | "edit_file" => "edit",
        "find_files" | "search_text" => "search",
        "run_command" => "execute",
        _ => "other",
    }
}

/// What an editor shows for a call: the tool and what it works on.
pub fn tool_title(name: &str, arguments: &Value) -> String {
    let subject = arguments
        .get("command")
        .or_else(|| arguments.get("path"))
        .or_else(|| arguments.get("pattern"))
        .or_else(|| arguments.get("query"))
        .and_then(Value::as_str);
    match subject {
        Some(subject) => format!("{name}: {}", subject.chars().take(120).collect::<String>()),
        None => name.to_string(),
    }
}

/// A `tool_call` update for a Kestrel call (`{id, name, arguments}`).
pub fn tool_call(call: &Value, status: &str, workspace: &str) -> Value {
    let (name, arguments) = (call["name"].as_str().unwrap_or("tool"), &call["arguments"]);
    let mut update = json!({
        "sessionUpdate": "tool_call",
        "toolCallId": call["id"],
        "title": tool_title(name, arguments),
        "kind": tool_kind(name),
        "status": status,
        "rawInput": arguments,
    });
    if let Some(path) = arguments.get("path").and_then(Value::as_str) {
        update["locations"] = json!([{ "path": absolute(workspace, path) }]);
    }
    update
}

/// The `tool_call_update` that ends a call: its result's text, and for a file tool that
/// changed a file a diff (`edit_file`: the text replaced and its replacement; `write_file`:
/// the new content, `oldText` null when it made the file).
pub fn finished(result: &Value, arguments: Option<&Value>, workspace: &str) -> Value {
    let ok = result["ok"].as_bool().unwrap_or(false);
    let mut content = vec![json!({ "type": "content", "content": { "type": "text", "text": result["content"] } })];
    if let (true, Some(arguments)) = (ok, arguments) {
        content.extend(diff(result, arguments, workspace));
    }
    json!({
        "sessionUpdate": "tool_call_update",
        "toolCallId": result["callId"],
        "status": if ok { "completed" } else { "failed" },
        "content": content,
        "rawOutput": result.get("data").cloned().unwrap_or(Value::Null),
    })
}

fn diff(result: &Value, arguments: &Value, workspace: &str) -> Option<Value> {
    let path = absolute(workspace, arguments.get("path")?.as_str()?);
    match result["name"].as_str()? {
        "edit_file" => Some(json!({
            "type": "diff", "path": path, "oldText": arguments.get("oldString")?, "newText": arguments.get("newString")?,
        })),
        "write_file" => {
            let created = result["data"]["created"].as_bool().unwrap_or(false);
            let old = if created { Value::Null } else { Value::String(String::new()) };
            Some(json!({ "type": "diff", "path": path, "oldText": old, "newText": arguments.get("content")? }))
        }
        _ => None,
    }
}

fn absolute(workspace: &str, path: &str) -> String {
    Path::new(workspace).join(path).to_string_lossy().into_owned()
}

/// A prompt's content blocks as a Kestrel message: text, and the text of embedded resources
/// and links; images as attachments.
pub fn message(prompt: &[Value]) -> Result<Value, RpcError> {
    let mut text = Vec::new();
    let mut images = Vec::new();
    for block in prompt {
        match block["type"].as_str() {
            Some("text") => text.push(block["text"].as_str().unwrap_or("").to_string()),
            Some("image") => images.push(json!({ "mimeType": block["mimeType"], "data": block["data"] })),
            Some("resource") => {
                let resource = &block["resource"];
                let body = resource["text"].as_str().unwrap_or("(a binary resource)");
                text.push(format!("{}:\n{body}", resource["uri"].as_str().unwrap_or("resource")));
            }
            Some("resource_link") => text.push(format!("(see {})", block["uri"].as_str().unwrap_or(""))),
            other => return Err(RpcError::invalid_params(format!("content blocks of type {other:?} are not taken"))),
        }
    }
    let mut message = json!({ "content": text.join("\n\n") });
    if !images.is_empty() {
        message["images"] = Value::Array(images);
    }
    Ok(message)
}

/// ACP's stop reason for a Kestrel run's end.
pub fn stop_reason(status: &str) -> &'static str {
    match status {
        "cancelled" => "cancelled",
        "max_steps" => "max_turn_requests",
        "budget_exceeded" => "refusal",
        _ => "end_turn",
    }
}

/// The `session/update`s that replay a stored transcript (`GET /api/sessions/:id`).
pub fn replay(session: &Value) -> Vec<Value> {
    let workspace = session["workspace"].as_str().unwrap_or("");
    let mut updates = Vec::new();
    let mut calls: Vec<Value> = Vec::new();
    for message in session["messages"].as_array().into_iter().flatten() {
        let text =
            |kind: &str, text: &Value| json!({ "sessionUpdate": kind, "content": { "type": "text", "text": text } });
        match message["role"].as_str() {
            Some("user") => updates.push(text("user_message_chunk", &message["content"])),
            Some("assistant") => {
                if let Some(reasoning) = message.get("reasoning") {
                    updates.push(text("agent_thought_chunk", reasoning));
                }
                if message["content"].as_str().is_some_and(|c| !c.is_empty()) {
                    updates.push(text("agent_message_chunk", &message["content"]));
                }
                for call in message["toolCalls"].as_array().into_iter().flatten() {
                    updates.push(tool_call(call, "pending", workspace));
                    calls.push(call.clone());
                }
            }
            Some("tool") => {
                let id = &message["toolCallId"];
                let call = calls.iter().find(|call| call["id"] == *id);
                let ok = message.get("meta").and_then(|m| m.get("error")).is_none();
                let result = json!({
                    "callId": id, "name": message["toolName"], "ok": ok, "content": message["content"],
                });
                updates.push(finished(&result, call.map(|c| &c["arguments"]), workspace));
            }
            _ => {}
        }
    }
    updates
}
