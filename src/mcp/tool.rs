//! MCP tools for Kestrel sessions: every tool of every server in Kestrel's own `[[mcp.servers]]`,
//! named `mcp__<server>__<tool>` (so no name can collide with a built-in tool), category
//! `mcp`, `ask` unless `[agent.permissions]` says otherwise.
//!
//! One connection per server, shared by every session: a server starts once, not once per
//! session, and a call from one session waits while another's runs on the same server; state a
//! server keeps between calls is shared too. A connection that broke (the server crashed) is
//! made again at the next call.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value};

use super::{McpClient, McpError, McpTool};
use crate::config::bae::McpServer;
use crate::domain::ToolSchema;
use crate::engine::tools::{Permission, Tool, ToolContext, ToolOutput};

/// How long one call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A server's shared connection, made again after it broke.
pub struct Shared {
    server: McpServer,
    client: Mutex<Option<McpClient>>,
}

impl Shared {
    /// Connects; the tools it listed, or why it did not connect.
    pub fn connect(server: McpServer) -> Result<(Arc<Shared>, Vec<McpTool>), McpError> {
        let client = McpClient::connect(&server, &|var| std::env::var(var).ok())?;
        let tools = client.tools.clone();
        Ok((Arc::new(Shared { server, client: Mutex::new(Some(client)) }), tools))
    }

    fn call(&self, tool: &str, arguments: Value) -> Result<super::CallResult, McpError> {
        let mut client = self.client.lock().unwrap_or_else(|e| e.into_inner());
        if client.is_none() {
            *client = Some(McpClient::connect(&self.server, &|var| std::env::var(var).ok())?);
        }
        let outcome = client.as_mut().map(|c| c.call(tool, arguments, CALL_TIMEOUT)).expect("connected above");
        if matches!(outcome, Err(McpError::Transport(_))) {
            *client = None;
        }
        outcome
    }
}

/// One MCP tool as a Kestrel tool.
pub struct KestrelMcpTool {
    name: String,
    tool: McpTool,
    shared: Arc<Shared>,
}

impl KestrelMcpTool {
    pub fn new(shared: Arc<Shared>, tool: McpTool) -> KestrelMcpTool {
        KestrelMcpTool { name: tool_name(&shared.server.name, &tool.name), tool, shared }
    }
}

/// `mcp__<server>__<tool>`, in the characters every provider accepts, at most 64.
pub fn tool_name(server: &str, tool: &str) -> String {
    let clean =
        |s: &str| s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect::<String>();
    let name = format!("mcp__{}__{}", clean(server), clean(tool));
    name.chars().take(64).collect()
}

impl Tool for KestrelMcpTool {
    fn schema(&self) -> ToolSchema {
        ToolSchema {
            name: self.name.clone(),
            description: format!("{} (MCP server `{}`)", self.tool.description, self.shared.server.name),
            parameters: self.tool.input_schema.clone(),
            permission: None,
            category: Some("mcp".into()),
        }
    }

    fn default_permission(&self) -> Permission {
        Permission::Ask
    }

    fn run(&self, arguments: &Map<String, Value>, _: &ToolContext<'_>) -> Result<ToolOutput, String> {
        match self.shared.call(&self.tool.name, Value::Object(arguments.clone())) {
            Ok(answer) => {
                let text: Vec<&str> = answer.content.iter().filter_map(|b| b["text"].as_str()).collect();
                let text = text.join("\n");
                let data = Some(Value::Array(answer.content.clone()));
                Ok(ToolOutput {
                    ok: !answer.is_error,
                    error: answer.is_error.then(|| text.clone()),
                    content: text,
                    data,
                })
            }
            Err(error) => Err(format!("MCP error: {error}")),
        }
    }
}
