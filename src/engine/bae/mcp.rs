//! A BAE session's MCP connections: made once when the session opens, for the servers its
//! profile names (an unknown name is logged and skipped, a connection that fails is logged
//! and skipped), and dropped when it closes, which kills stdio servers. In memory only, as in
//! BAE: after a restart sessions have no MCP.
//!
//! Inside a turn, a call no client tool takes goes to the MCP server that lists its name (the
//! later server when two do), with `mcp.request` and `mcp.response` around it. A failure never
//! ends the turn: its result is `MCP error: …`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use crate::config::bae::McpServer;
use crate::domain::{ToolCall, ToolResult, ToolSchema};
use crate::mcp::{McpClient, McpError};

/// How long one MCP tool call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Every BAE session's live MCP connections.
#[derive(Default)]
pub struct McpSessions {
    by_session: Mutex<HashMap<String, Vec<Arc<Mutex<McpClient>>>>>,
}

impl McpSessions {
    /// Connects `session_id` to each configured server its profile names, in order.
    pub fn connect(&self, session_id: &str, names: &[String], configured: &[McpServer]) {
        let mut clients = Vec::new();
        for name in names {
            let Some(server) = configured.iter().find(|s| &s.name == name) else { continue };
            match McpClient::connect(server, &|var| std::env::var(var).ok()) {
                Ok(client) => clients.push(Arc::new(Mutex::new(client))),
                Err(error) => log::error!("session {session_id}: MCP server {name:?} did not connect: {error}"),
            }
        }
        if !clients.is_empty() {
            self.lock().insert(session_id.to_string(), clients);
        }
    }

    /// Drops a session's connections (stdio servers are killed).
    pub fn disconnect(&self, session_id: &str) {
        let clients = self.lock().remove(session_id);
        drop(clients);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Arc<Mutex<McpClient>>>>> {
        self.by_session.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn clients(&self, session_id: &str) -> Vec<Arc<Mutex<McpClient>>> {
        self.lock().get(session_id).cloned().unwrap_or_default()
    }

    /// The session's MCP tools, as the model sees them (every server's, in order).
    pub fn schemas(&self, session_id: &str) -> Vec<ToolSchema> {
        let clients = self.clients(session_id);
        let mut schemas = Vec::new();
        for client in clients {
            let client = client.lock().unwrap_or_else(|e| e.into_inner());
            for tool in &client.tools {
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
    pub fn route(&self, session_id: &str, tool: &str) -> Option<(String, Arc<Mutex<McpClient>>)> {
        self.clients(session_id).into_iter().rev().find_map(|client| {
            let guard = client.lock().unwrap_or_else(|e| e.into_inner());
            let found = guard.tools.iter().any(|t| t.name == tool);
            let name = guard.server.clone();
            drop(guard);
            found.then_some((name, client))
        })
    }
}

/// One call on its server: the `mcp.response` parts (ok, result, error) and the tool result.
pub fn call(client: &Mutex<McpClient>, call: &ToolCall) -> (bool, Option<Value>, Option<String>, ToolResult) {
    let arguments = Value::Object(call.arguments.clone());
    let outcome = client.lock().unwrap_or_else(|e| e.into_inner()).call(&call.name, arguments, CALL_TIMEOUT);
    match outcome {
        Ok(answer) => {
            let result = json!({ "content": answer.content, "isError": answer.is_error });
            (!answer.is_error, Some(result), None, tool_result(call, answer.content, answer.is_error))
        }
        Err(error) => {
            let text = format!("MCP error: {}", describe(&error));
            let content = vec![json!({ "type": "text", "text": text })];
            (false, None, Some(describe(&error)), tool_result(call, content, true))
        }
    }
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
