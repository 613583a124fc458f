//! A BAE session's MCP connections: made once when the session opens, for the servers its
//! profile names, whichever file declares them (BAE's own config file or Kestrel's
//! `[[mcp.servers]]`): a BAE session always gets a connection of its own, never a Kestrel
//! scope's, so no state is shared with another session or tenant. An unknown name is logged
//! and skipped, a connection that fails is logged and skipped. Close (and revocation) closes
//! them at once: each stdio server's process tree is killed and calls in flight end. In
//! memory only, as in BAE: after a restart sessions have no MCP.
//!
//! Inside a turn, a call no client tool takes goes to the MCP server that lists its name (the
//! later server when two do), with `mcp.request` and `mcp.response` around it, once the rules
//! allowed it (`calls.rs`). A failure never ends the turn: its result is `MCP error: …`. The
//! turn's cancel ends a call in flight at once, and the server is told
//! (`notifications/cancelled`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crossbeam_channel::Receiver;
use serde_json::{json, Value};

use crate::config::bae::McpServer;
use crate::domain::{ToolCall, ToolResult, ToolSchema};
use crate::mcp::{McpClient, McpError, Spawning};

/// Every BAE session's live MCP connections.
#[derive(Default)]
pub struct McpSessions {
    by_session: Mutex<HashMap<String, Vec<Arc<McpClient>>>>,
}

impl McpSessions {
    /// Connects `session_id` to each configured server its profile names, in order; each
    /// stdio server's processes carry the session's marker.
    pub fn connect(&self, session_id: &str, names: &[String], configured: &[McpServer], spawning: &Spawning) {
        let mut clients = Vec::new();
        for name in names {
            let Some(server) = configured.iter().find(|s| &s.name == name) else { continue };
            let spawning = Spawning { marker: session_id.to_string(), ..spawning.clone() };
            match McpClient::connect(server, crate::mcp::process_env(), spawning) {
                Ok(client) => clients.push(Arc::new(client)),
                Err(error) => log::error!("session {session_id}: MCP server {name:?} did not connect: {error}"),
            }
        }
        if !clients.is_empty() {
            self.lock().insert(session_id.to_string(), clients);
        }
    }

    /// Closes a session's connections now: stdio servers' process trees are killed and calls
    /// in flight end with an error.
    pub fn disconnect(&self, session_id: &str) {
        let clients = self.lock().remove(session_id).unwrap_or_default();
        for client in &clients {
            client.close();
        }
    }

    /// Whether the session has connections on this node.
    pub fn has(&self, session_id: &str) -> bool {
        self.lock().contains_key(session_id)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Arc<McpClient>>>> {
        self.by_session.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn clients(&self, session_id: &str) -> Vec<Arc<McpClient>> {
        self.lock().get(session_id).cloned().unwrap_or_default()
    }

    /// The session's MCP tools, as the model sees them (every server's, in order).
    pub fn schemas(&self, session_id: &str) -> Vec<ToolSchema> {
        let mut schemas = Vec::new();
        for client in self.clients(session_id) {
            for tool in client.tools() {
                let schema = ToolSchema {
                    name: tool.name.clone(),
                    description: tool.description.clone(),
                    parameters: tool.input_schema.clone(),
                    permission: None,
                    category: Some("mcp".into()),
                };
                // Two servers with a tool of the same name: the later one's, as `route` picks.
                match schemas.iter().position(|s: &ToolSchema| s.name == tool.name) {
                    Some(at) => schemas[at] = schema,
                    None => schemas.push(schema),
                }
            }
        }
        schemas
    }

    /// The server that takes a tool: the later one when two list it.
    pub fn route(&self, session_id: &str, tool: &str) -> Option<(String, Arc<McpClient>)> {
        self.clients(session_id)
            .into_iter()
            .rev()
            .find(|client| client.tools().iter().any(|t| t.name == tool))
            .map(|client| (client.server.clone(), client))
    }
}

/// A call's `mcp.response` parts (ok, result, error) and its tool result.
pub type Answered = (bool, Option<Value>, Option<String>, ToolResult);

/// One call on its server, which ends at once when `cancel` fires (the turn's cancel: the
/// server is told, and the error is `McpError::Cancelled`, for the turn to answer).
pub fn call(client: &McpClient, call: &ToolCall, cancel: &Receiver<()>) -> Result<Answered, McpError> {
    let arguments = Value::Object(call.arguments.clone());
    match client.call_until(&call.name, arguments, client.call_timeout(), cancel) {
        Ok(answer) => {
            let result = json!({ "content": answer.content, "isError": answer.is_error });
            Ok((!answer.is_error, Some(result), None, tool_result(call, answer.content, answer.is_error)))
        }
        Err(McpError::Cancelled) => Err(McpError::Cancelled),
        Err(error) => Ok(failed(call, &error)),
    }
}

/// A failed call's parts: the result `MCP error: …`.
pub fn failed(call: &ToolCall, error: &McpError) -> Answered {
    let text = format!("MCP error: {}", describe(error));
    let content = vec![json!({ "type": "text", "text": text })];
    (false, None, Some(describe(error)), tool_result(call, content, true))
}

fn describe(error: &McpError) -> String {
    error.to_string()
}

fn tool_result(call: &ToolCall, content: Vec<Value>, is_error: bool) -> ToolResult {
    let text: Vec<&str> = content.iter().filter_map(|block| block["text"].as_str()).collect();
    let text = text.join("\n");
    ToolResult {
        call_id: call.id.clone(),
        name: call.name.clone(),
        ok: !is_error,
        content: text.clone(),
        duration_ms: None,
        error: is_error.then_some(text),
        data: None,
        blocks: Some(content),
    }
}
