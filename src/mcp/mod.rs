//! A client for MCP servers, shared by both front doors: over stdio (newline-delimited JSON-RPC
//! to a child process) or Streamable HTTP (`stdio.rs`, `http.rs`).
//!
//! A connection is `initialize` (protocol version 2024-11-05, as BAE sends; whatever version
//! the server answers is accepted), `notifications/initialized`, then `tools/list`, following
//! `nextCursor` until the list ends. A call is `tools/call` with a per-call timeout; its
//! `content` (default `[]`) and `isError` are the result. Header and `env` values may hold
//! `${VAR}`, resolved from the environment when the connection is made, and never logged.
//!
//! An `McpClient` owns one server's connection for one owner (a BAE session, or a Kestrel
//! scope) and keeps it usable: a call that times out is cancelled on the server
//! (`notifications/cancelled`) and the server is asked for a `ping`; a server that does not
//! answer it, or whose connection broke, is dropped (its process tree killed) and connected
//! again at the next call. Calls run concurrently on one connection. A call's caller may
//! cancel it (`call_until`: its turn was cancelled, its session closed, the server stops): the
//! caller stops waiting at once and the server is told (`notifications/cancelled`). `close`
//! ends the connection at once: its process tree is killed and calls in flight end with an
//! error.

mod http;
mod stdio;
pub mod tool;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crossbeam_channel::{never, Receiver};
use serde_json::{json, Value};

use crate::config::bae::{McpServer, McpTransport};

/// The protocol version a connection asks for.
pub const PROTOCOL_VERSION: &str = "2024-11-05";
/// How long a handshake request or a listing may take.
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a server may take to answer the `ping` after a call timed out (at most; no
/// longer than the call's own timeout, or a second).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Pages of `tools/list` followed at most (a server that pages forever is cut off).
const MAX_PAGES: usize = 100;
/// The longest message a server may send (a stdio line, an HTTP answer); past it the
/// connection is dropped.
pub const MESSAGE_LIMIT: usize = 16 * 1024 * 1024;

/// Why an MCP request failed, for people (and for the model, in an error result).
#[derive(Debug, Clone, PartialEq)]
pub enum McpError {
    /// The server could not be reached or the connection broke.
    Transport(String),
    /// The server answered a JSON-RPC error.
    Protocol { code: i64, message: String },
    /// No answer within the timeout.
    Timeout(Duration),
    /// The connection was closed by its owner (a BAE session closed).
    Closed,
    /// The caller cancelled the call (its turn was cancelled or the server is stopping).
    Cancelled,
}

impl std::fmt::Display for McpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            McpError::Transport(why) => write!(f, "{why}"),
            McpError::Protocol { code, message } => write!(f, "MCP protocol error: [{code}] {message}"),
            McpError::Timeout(after) => write!(f, "the MCP server did not answer within {} s", after.as_secs()),
            McpError::Closed => write!(f, "the MCP connection was closed"),
            McpError::Cancelled => write!(f, "the MCP call was cancelled"),
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

/// Who starts a stdio server and how: its processes carry `KESTREL_COMMAND=<marker>:mcp-…`
/// (the marker names a session, or this data dir's node), so the sweep at start finds what a
/// killed server left; with `setpriv` the server dies with the thread that started it, which
/// is the `spawner`'s (it lives as long as the server) when there is one.
#[derive(Debug, Clone, Default)]
pub struct Spawning {
    pub marker: String,
    pub setpriv: Option<PathBuf>,
    pub spawner: Option<crate::tools::spawner::Spawner>,
}

/// How `${VAR}` in header and `env` values is resolved.
pub type Env<'a> = &'a (dyn Fn(&str) -> Option<String> + Sync);

/// An `Env` a client keeps, to resolve again at each reconnection.
pub type SharedEnv = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// One JSON-RPC exchange over a transport; calls may run concurrently.
trait Transport: Send + Sync {
    /// Sends a request and waits for the answer with the same id, at most `timeout`, and no
    /// longer than until `cancel` fires (`Cancelled`; a request whose cancel came first is
    /// not sent). A request that timed out or was cancelled is cancelled on the server too
    /// (`notifications/cancelled`).
    fn request(&self, method: &str, params: Value, timeout: Duration, cancel: &Receiver<()>)
        -> Result<Value, McpError>;
    /// Sends a notification.
    fn notify(&self, method: &str, params: Value) -> Result<(), McpError>;
    /// Ends the connection now: a stdio server's process tree is killed; requests in flight
    /// end with `Closed` or a transport error.
    fn close(&self);
}

/// A handshaken connection and the tools it listed.
struct Connection {
    transport: Box<dyn Transport>,
    tools: Vec<McpTool>,
}

impl Connection {
    fn open(server: &McpServer, env: Env<'_>, spawning: &Spawning) -> Result<Connection, McpError> {
        let transport: Box<dyn Transport> = match server.transport {
            McpTransport::Stdio => {
                let command = server.command.as_deref().ok_or(McpError::Transport("no command".into()))?;
                let variables = resolve(&server.env, "env", env)?;
                Box::new(stdio::Stdio::spawn(command, &server.args, &variables, spawning)?)
            }
            McpTransport::Http | McpTransport::Sse => {
                let url = server.url.as_deref().ok_or(McpError::Transport("no url".into()))?;
                Box::new(http::Http::new(url, resolve(&server.headers, "header", env)?))
            }
        };
        let mut connection = Connection { transport, tools: Vec::new() };
        let opened = connection.handshake().and_then(|()| connection.list_tools());
        match opened {
            Ok(tools) => {
                connection.tools = tools;
                Ok(connection)
            }
            Err(error) => {
                connection.transport.close();
                Err(error)
            }
        }
    }

    fn handshake(&self) -> Result<(), McpError> {
        let params = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": { "name": "kestrel", "version": env!("CARGO_PKG_VERSION") },
        });
        self.transport.request("initialize", params, SETUP_TIMEOUT, &never())?;
        self.transport.notify("notifications/initialized", json!({}))
    }

    fn list_tools(&self) -> Result<Vec<McpTool>, McpError> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let params = match &cursor {
                Some(cursor) => json!({ "cursor": cursor }),
                None => json!({}),
            };
            let page = self.transport.request("tools/list", params, SETUP_TIMEOUT, &never())?;
            tools.extend(page["tools"].as_array().into_iter().flatten().filter_map(tool_of));
            cursor = page["nextCursor"].as_str().filter(|c| !c.is_empty()).map(str::to_string);
            if cursor.is_none() {
                break;
            }
        }
        Ok(tools)
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.transport.close();
    }
}

/// One server's connection for one owner, made again when it broke or stopped answering.
pub struct McpClient {
    pub server: String,
    config: McpServer,
    spawning: Spawning,
    env: SharedEnv,
    /// The live connection; `None` until the next call makes one.
    live: Mutex<Option<Arc<Connection>>>,
    /// The tools the latest connection listed.
    tools: Mutex<Vec<McpTool>>,
    closed: std::sync::atomic::AtomicBool,
}

impl McpClient {
    /// Connects, shakes hands and lists the tools. `env` resolves `${VAR}` in header and `env`
    /// values, now and at every reconnection.
    pub fn connect(server: &McpServer, env: SharedEnv, spawning: Spawning) -> Result<McpClient, McpError> {
        let connection = Connection::open(server, &*env, &spawning)?;
        let tools = connection.tools.clone();
        Ok(McpClient {
            server: server.name.clone(),
            config: server.clone(),
            spawning,
            env,
            live: Mutex::new(Some(Arc::new(connection))),
            tools: Mutex::new(tools),
            closed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// How long one tool call on this server may take (its `timeout_secs`, else 30 s).
    pub fn call_timeout(&self) -> Duration {
        self.config.call_timeout()
    }

    /// The tools the server listed (at the latest connection).
    pub fn tools(&self) -> Vec<McpTool> {
        self.tools.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The live connection, made again if there is none (unless closed).
    fn connection(&self) -> Result<Arc<Connection>, McpError> {
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(McpError::Closed);
        }
        if let Some(connection) = live.as_ref() {
            return Ok(Arc::clone(connection));
        }
        let connection = Arc::new(Connection::open(&self.config, &*self.env, &self.spawning)?);
        *self.tools.lock().unwrap_or_else(PoisonError::into_inner) = connection.tools.clone();
        *live = Some(Arc::clone(&connection));
        Ok(connection)
    }

    /// Drops `connection` if it is still the live one (its process tree is killed).
    fn drop_connection(&self, connection: &Arc<Connection>) {
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        if live.as_ref().is_some_and(|current| Arc::ptr_eq(current, connection)) {
            live.take();
        }
        drop(live);
        connection.transport.close();
    }

    /// Calls a tool; a transport failure or a timeout is an `Err`, a tool's own failure an
    /// `Ok` with `is_error`. A timed-out call is cancelled on the server, and a server that
    /// then does not answer a `ping` is dropped, to be connected again at the next call.
    pub fn call(&self, name: &str, arguments: Value, timeout: Duration) -> Result<CallResult, McpError> {
        self.call_until(name, arguments, timeout, &never())
    }

    /// `call`, which also ends as soon as `cancel` fires (a message, or its sender dropped, as
    /// a `CancelToken`'s receiver does): `Err(Cancelled)` at once, the server told, the
    /// connection kept.
    pub fn call_until(
        &self,
        name: &str,
        arguments: Value,
        timeout: Duration,
        cancel: &Receiver<()>,
    ) -> Result<CallResult, McpError> {
        let connection = self.connection()?;
        let params = json!({ "name": name, "arguments": arguments });
        match connection.transport.request("tools/call", params, timeout, cancel) {
            Ok(answer) => Ok(CallResult {
                content: answer["content"].as_array().cloned().unwrap_or_default(),
                is_error: answer["isError"].as_bool().unwrap_or(false),
            }),
            Err(McpError::Timeout(after)) => {
                let probe = PROBE_TIMEOUT.min(after.max(Duration::from_secs(1)));
                if connection.transport.request("ping", json!({}), probe, &never()).is_err() {
                    log::warn!("MCP server {:?} stopped answering; it will be connected again", self.server);
                    self.drop_connection(&connection);
                }
                Err(McpError::Timeout(after))
            }
            Err(McpError::Transport(why)) => {
                self.drop_connection(&connection);
                Err(McpError::Transport(why))
            }
            Err(other) => Err(other),
        }
    }

    /// Ends the connection for good: the server's process tree is killed now and calls in
    /// flight end with an error; later calls answer `Closed`.
    pub fn close(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        let connection = self.live.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(connection) = connection {
            connection.transport.close();
        }
    }
}

impl Drop for McpClient {
    fn drop(&mut self) {
        self.close();
    }
}

fn tool_of(tool: &Value) -> Option<McpTool> {
    Some(McpTool {
        name: tool["name"].as_str()?.to_string(),
        description: tool["description"].as_str().unwrap_or_default().to_string(),
        input_schema: tool.get("inputSchema").filter(|s| s.is_object()).cloned().unwrap_or(json!({ "type": "object" })),
    })
}

/// Header or `env` values with their `${VAR}` resolved; an error names the entry only.
fn resolve(
    templates: &std::collections::BTreeMap<String, String>,
    what: &str,
    env: Env<'_>,
) -> Result<Vec<(String, String)>, McpError> {
    templates
        .iter()
        .map(|(name, template)| {
            crate::config::resolve_template(template, env)
                .map(|value| (name.clone(), value))
                .map_err(|why| McpError::Transport(format!("{what} {name}: {why}")))
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

/// The process environment as an `Env` for connections.
pub fn process_env() -> SharedEnv {
    Arc::new(|name: &str| std::env::var(name).ok())
}
