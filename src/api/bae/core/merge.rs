//! The resume rules of a paused BAE turn: the client's tool results and the server's
//! stashed ones merged into the one user turn that answers every call of the paused answer,
//! in its order, or a reason why they cannot be.
//!
//! Pure functions over content blocks as the client sends them (JSON), so what is recorded
//! as `client.message.send` is the merged content exactly.

use std::collections::{HashMap, HashSet};

use serde_json::{json, Value};

use super::runtime::InvalidParams;
use crate::domain::{Block, ImageAttachment, Message, Role, ToolResult};

/// What a synthetic result says of a client call that never answered.
pub const ABANDONED_RESULT: &str = "Client tool call was abandoned before returning a result.";

/// Why a resume cannot be merged; the text follows `tool result merge invalid: `.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeError(pub String);

/// How a message answers a paused turn.
pub enum Resume {
    /// Tool results (or a mix) to merge with the server's.
    Results,
    /// Anything else non-empty: the pending client calls are abandoned, the content kept.
    Abandon,
}

/// A message that is not empty and carries no tool result abandons the paused calls; an
/// empty one is a malformed continuation the merge refuses.
pub fn resume_kind(content: &Value) -> Resume {
    let abandons = match content {
        Value::String(text) => !text.is_empty(),
        Value::Array(blocks) => !blocks.is_empty() && !blocks.iter().any(is_tool_result),
        _ => false,
    };
    if abandons {
        Resume::Abandon
    } else {
        Resume::Results
    }
}

fn is_tool_result(block: &Value) -> bool {
    block.get("type").and_then(Value::as_str) == Some("tool_result")
}

/// Whether content carries any tool result.
pub fn has_tool_results(content: &Value) -> bool {
    content.as_array().is_some_and(|blocks| blocks.iter().any(is_tool_result))
}

/// One result per expected id, in order (the server's win over a client's copy), then the
/// client's other blocks.
pub fn merge(expected: &[String], server: &[Value], client: &Value) -> Result<Value, MergeError> {
    let invalid = |why: String| Err(MergeError(why));
    if expected.is_empty() {
        return invalid("paused assistant turn has no tool_use ids".into());
    }
    let expected_set: HashSet<&str> = expected.iter().map(String::as_str).collect();
    if expected_set.len() != expected.len() {
        return invalid("paused assistant turn contains duplicate tool_use ids".into());
    }
    let mut server_by_id: HashMap<String, Value> = HashMap::new();
    for block in server {
        let id = block.get("tool_use_id").and_then(Value::as_str).unwrap_or_default().to_string();
        if server_by_id.insert(id.clone(), block.clone()).is_some() {
            return invalid(format!("server produced a duplicate tool_result for id {id:?}"));
        }
    }
    let mut client_by_id: HashMap<String, Value> = HashMap::new();
    let mut extras = Vec::new();
    for block in client.as_array().cloned().unwrap_or_default() {
        if !is_tool_result(&block) {
            extras.push(block);
            continue;
        }
        let id = block.get("tool_use_id").and_then(Value::as_str).unwrap_or_default().to_string();
        if server_by_id.contains_key(&id) {
            continue;
        }
        if client_by_id.insert(id.clone(), block).is_some() {
            return invalid(format!("client returned a duplicate tool_result for id {id:?}"));
        }
    }
    if let Some(id) = server_by_id.keys().chain(client_by_id.keys()).find(|id| !expected_set.contains(id.as_str())) {
        return invalid(format!("tool_result id {id:?} is not in the paused assistant turn"));
    }
    let mut merged = Vec::with_capacity(expected.len() + extras.len());
    for id in expected {
        match server_by_id.remove(id).or_else(|| client_by_id.remove(id)) {
            Some(block) => merged.push(block),
            None => return invalid(format!("no tool_result for tool_use id {id:?}")),
        }
    }
    merged.extend(extras);
    Ok(Value::Array(merged))
}

/// The client abandons its pending calls (a plain message, or any message after the pause
/// timed out): each call the server did not answer gets an error result, the new content
/// follows, and the whole is merged as usual.
pub fn abandon(expected: &[String], server: &[Value], incoming: &Value) -> Result<Value, MergeError> {
    let answered: HashSet<&str> = server.iter().filter_map(|b| b.get("tool_use_id").and_then(Value::as_str)).collect();
    let mut content: Vec<Value> = expected
        .iter()
        .filter(|id| !answered.contains(id.as_str()))
        .map(|id| json!({ "type": "tool_result", "tool_use_id": id, "content": ABANDONED_RESULT, "is_error": true }))
        .collect();
    match incoming {
        Value::String(text) if !text.is_empty() => content.push(json!({ "type": "text", "text": text })),
        Value::String(_) => {}
        Value::Array(blocks) if blocks.iter().any(is_tool_result) => {
            return Err(MergeError("timed-out replacement message must not contain tool_result blocks".into()))
        }
        Value::Array(blocks) => content.extend(blocks.iter().cloned()),
        _ => return Err(MergeError("abandonment message content must be a string or content-block array".into())),
    }
    merge(expected, server, &Value::Array(content))
}

/// A server result as the block the merge and the transcript hold.
pub fn result_block(result: &ToolResult) -> Value {
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

/// A client's message as the engine stores it. A string is one text block (remembered as a
/// string, so it is shown back as one); `names` gives tool results the name of their call.
pub fn to_message(role: Role, content: &Value, names: &HashMap<String, String>) -> Result<Message, InvalidParams> {
    let mut message = Message::new(role);
    match content {
        Value::String(text) => {
            message.blocks.push(Block::Text { text: text.clone() });
            message.meta.get_or_insert_with(Default::default).insert(PLAIN.into(), Value::Bool(true));
        }
        Value::Array(blocks) => {
            for block in blocks {
                message.blocks.push(to_block(block, names)?);
            }
        }
        _ => return Err("content must be a string or an array of content blocks".into()),
    }
    Ok(message)
}

/// `meta` flag of a message whose content was a plain string.
pub const PLAIN: &str = "plainText";

fn to_block(block: &Value, names: &HashMap<String, String>) -> Result<Block, InvalidParams> {
    let kind = block.get("type").and_then(Value::as_str).unwrap_or_default();
    let text = |field: &str| block.get(field).and_then(Value::as_str).map(str::to_string);
    Ok(match kind {
        "text" => Block::Text { text: text("text").ok_or("a text block needs a string `text`")? },
        "tool_result" => {
            let call_id = text("tool_use_id").ok_or("a tool_result block needs a string `tool_use_id`")?;
            let failed = block.get("is_error").and_then(Value::as_bool) == Some(true);
            let (content, blocks) = match block.get("content") {
                None | Some(Value::Null) => (String::new(), None),
                Some(Value::String(text)) => (text.clone(), None),
                Some(Value::Array(parts)) => {
                    (parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect(), Some(parts.clone()))
                }
                Some(_) => return Err("a tool_result's content must be a string or an array of blocks".into()),
            };
            Block::ToolResult(ToolResult {
                name: names.get(&call_id).cloned().unwrap_or_default(),
                call_id,
                ok: !failed,
                error: failed.then(|| content.clone()),
                content,
                duration_ms: None,
                data: None,
                blocks,
            })
        }
        "image" if block.pointer("/source/type").and_then(Value::as_str) == Some("base64") => {
            let field = |name: &str| block.pointer(&format!("/source/{name}")).and_then(Value::as_str);
            Block::Image(ImageAttachment {
                mime_type: field("media_type").ok_or("an image block needs source.media_type")?.to_string(),
                data: field("data").ok_or("an image block needs source.data")?.to_string(),
                name: None,
            })
        }
        other => return Err(format!("unsupported content block type {other:?} in a client message").into()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn result(id: &str) -> Value {
        json!({"type": "tool_result", "tool_use_id": id, "content": "ok"})
    }

    #[test]
    fn results_are_ordered_by_the_paused_answer_and_the_server_wins() {
        let server = vec![json!({"type": "tool_result", "tool_use_id": "b", "content": "server"})];
        let client = json!([result("a"), result("b"), {"type": "text", "text": "and"}]);
        let merged = merge(&ids(&["a", "b"]), &server, &client).unwrap();
        assert_eq!(merged[0]["tool_use_id"], "a");
        assert_eq!(merged[1]["content"], "server");
        assert_eq!(merged[2]["text"], "and");
    }

    #[test]
    fn missing_duplicate_and_foreign_ids_are_refused() {
        let expected = ids(&["a", "b"]);
        assert_eq!(merge(&expected, &[], &json!([result("a")])).unwrap_err().0, "no tool_result for tool_use id \"b\"");
        let duplicate = json!([result("a"), result("a"), result("b")]);
        assert!(merge(&expected, &[], &duplicate).unwrap_err().0.contains("duplicate"));
        let foreign = json!([result("a"), result("b"), result("z")]);
        assert!(merge(&expected, &[], &foreign).unwrap_err().0.contains("\"z\" is not in the paused"));
        assert!(merge(&expected, &[], &json!([])).is_err());
    }

    #[test]
    fn abandonment_answers_every_pending_call_and_keeps_the_text() {
        let server = vec![json!({"type": "tool_result", "tool_use_id": "b", "content": "server"})];
        let merged = abandon(&ids(&["a", "b"]), &server, &json!("never mind")).unwrap();
        assert_eq!(merged[0]["content"], ABANDONED_RESULT);
        assert_eq!(merged[0]["is_error"], true);
        assert_eq!(merged[1]["content"], "server");
        assert_eq!(merged[2]["text"], "never mind");
        assert!(abandon(&ids(&["a"]), &[], &json!([result("a")])).is_err());
        assert!(matches!(resume_kind(&json!("x")), Resume::Abandon));
        assert!(matches!(resume_kind(&json!([result("a")])), Resume::Results));
        assert!(matches!(resume_kind(&json!("")), Resume::Results));
    }

    #[test]
    fn client_content_becomes_blocks() {
        let names = HashMap::from([("a".to_string(), "clock".to_string())]);
        let message = to_message(Role::User, &json!("hi"), &names).unwrap();
        assert!(message.flag(PLAIN));
        let content =
            json!([{"type": "tool_result", "tool_use_id": "a", "content": [{"type": "text", "text": "12:00"}]}]);
        let message = to_message(Role::User, &content, &names).unwrap();
        let Block::ToolResult(result) = &message.blocks[0] else { panic!("a result") };
        assert_eq!((result.name.as_str(), result.content.as_str()), ("clock", "12:00"));
        assert!(to_message(Role::User, &json!([{"type": "video"}]), &names).is_err());
        assert!(to_message(Role::User, &json!(7), &names).is_err());
    }
}
