//! A client for MCP servers, shared by both front doors: over stdio (newline-delimited JSON-RPC
//! to a child process) or Streamable HTTP (`stdio.rs`, `http.rs`).
//!
//! A connection is `initialize` (protocol version 2024-11-05, as BAE sends; whatever version
//! the server answers is accepted), `notifications/initialized`, then `tools/list`, following
//! `nextCursor` until the list ends. A call is `tools/call` with a per-call timeout; its
//! `content` (default `[]`) and `isError` are the result. Header values may hold `${VAR}`,
//! resolved from the environment when the connection is made, and never logged.

mod http;
mod stdio;
pub mod tool;

use std::time::Duration;

use serde_json::{json, Value};

use crate::config::bae::{McpServer, McpTransport};

/// The protocol version a connection asks for.
pub const PROTOCOL_VERSION: &str = "2024-11-05";
/// How long a handshake request or a listing may take.
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Pages of `tools/list` followed at most (a server that pages forever is cut off).
const MAX_PAGES: usize = 100;

/// Why an MCP request failed, for people (and for the model, in an error result).
#[derive(Debug, Clone, PartialEq)]
pub enum McpError {
    /// The server could not be reached or the connection broke.
    Transport(String),
    /// The server answered a JSON-RPC error.
    Protocol { code: i64, message: String },
    /// No answer within the timeout.
    Timeout(Duration),
}

impl std::fmt::Display for McpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            McpError::Transport(why) => write!(f, "{why}"),
            McpError::Protocol { code, message } => write!(f, "MCP protocol error: [{code}] {message}"),
            McpError::Timeout(after) => write!(f, "the MCP server did not answer within {} s", after.as_secs()),
        }
    }
}

/// A tool a server offers.
#[derive(Debug, Clone, PartialEq)]
pub struct McpTool {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

/// What a `tools/call` answered.
#[derive(Debug, Clone, PartialEq)]
pub struct CallResult {
    pub content: Vec<Value>,
    pub is_error: bool,
}

/// One JSON-RPC exchange over a transport.
trait Transport: Send {
    /// Sends a request and waits for the answer with the same id.
    fn request(&mut self, method: &str, params: Value, timeout: Duration) -> Result<Value, McpError>;
    /// Sends a notification.
    fn notify(&mut self, method: &str, params: Value) -> Result<(), McpError>;
}

/// A live connection to one MCP server, and the tools it listed.
pub struct McpClient {
    pub server: String,
    pub tools: Vec<McpTool>,
    transport: Box<dyn Transport>,
}

impl McpClient {
    /// Connects, shakes hands and lists the tools. `env` resolves `${VAR}` in header values.
    pub fn connect(server: &McpServer, env: &dyn Fn(&str) -> Option<String>) -> Result<McpClient, McpError> {
        let transport: Box<dyn Transport> = match server.transport {
            McpTransport::Stdio => {
                let command = server.command.as_deref().ok_or(McpError::Transport("no command".into()))?;
                Box::new(stdio::Stdio::spawn(command, &server.args)?)
            }
            McpTransport::Http | McpTransport::Sse => {
                let url = server.url.as_deref().ok_or(McpError::Transport("no url".into()))?;
                Box::new(http::Http::new(url, resolve_headers(server, env)?))
            }
        };
        let mut client = McpClient { server: server.name.clone(), tools: Vec::new(), transport };
        client.handshake()?;
        client.tools = client.list_tools()?;
        Ok(client)
    }

    fn handshake(&mut self) -> Result<(), McpError> {
        let params = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": { "name": "kestrel", "version": env!("CARGO_PKG_VERSION") },
        });
        self.transport.request("initialize", params, SETUP_TIMEOUT)?;
        self.transport.notify("notifications/initialized", json!({}))
    }

    fn list_tools(&mut self) -> Result<Vec<McpTool>, McpError> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let params = match &cursor {
                Some(cursor) => json!({ "cursor": cursor }),
                None => json!({}),
            };
            let page = self.transport.request("tools/list", params, SETUP_TIMEOUT)?;
            tools.extend(page["tools"].as_array().into_iter().flatten().filter_map(tool_of));
            cursor = page["nextCursor"].as_str().filter(|c| !c.is_empty()).map(str::to_string);
            if cursor.is_none() {
                break;
            }
        }
        Ok(tools)
    }

    /// Calls a tool; a transport failure or a timeout is an `Err`, a tool's own failure an
    /// `Ok` with `is_error`.
    pub fn call(&mut self, name: &str, arguments: Value, timeout: Duration) -> Result<CallResult, McpError> {
        let answer = self.transport.request("tools/call", json!({ "name": name, "arguments": arguments }), timeout)?;
        Ok(CallResult {
            content: answer["content"].as_array().cloned().unwrap_or_default(),
            is_error: answer["isError"].as_bool().unwrap_or(false),
        })
    }
}

fn tool_of(tool: &Value) -> Option<McpTool> {
    Some(McpTool {
        name: tool["name"].as_str()?.to_string(),
        description: tool["description"].as_str().unwrap_or_default().to_string(),
        input_schema: tool.get("inputSchema").filter(|s| s.is_object()).cloned().unwrap_or(json!({ "type": "object" })),
    })
}

fn resolve_headers(
    server: &McpServer,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, McpError> {
    server
        .headers
        .iter()
        .map(|(name, template)| {
            crate::config::resolve_template(template, env)
                .map(|value| (name.clone(), value))
                .map_err(|why| McpError::Transport(format!("header {name}: {why}")))
        })
        .collect()
}

/// The `result` of a JSON-RPC answer, or its error.
fn outcome(answer: Value) -> Result<Value, McpError> {
    if let Some(error) = answer.get("error") {
        return Err(McpError::Protocol {
            code: error["code"].as_i64().unwrap_or(0),
            message: error["message"].as_str().unwrap_or_default().to_string(),
        });
    }
    Ok(answer.get("result").cloned().unwrap_or(Value::Null))
}
