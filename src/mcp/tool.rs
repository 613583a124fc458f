//! MCP tools for Kestrel sessions: every tool of every server in Kestrel's own `[[mcp.servers]]`,
//! category `mcp`, `ask` unless `[agent.permissions]` says otherwise.
//!
//! Names: `mcp__<server>__<tool>` in the characters every provider accepts, at most 64. Two
//! tools that would get one name (`a/b`, `a_b` and `a.b` all become `a_b`), and a name past 64
//! characters, get a stable suffix instead: the first 55 characters, `_`, and 8 hex digits of
//! the SHA-256 of the server's and the tool's real names. No plugin may take the `mcp__`
//! prefix, so no name collides with another tool's.
//!
//! Connections follow the server's `scope`: `server` (one connection for every session),
//! `tenant` (the default: one per tenant, so no tenant ever sees state another left in a
//! stateful server), or `session` (one per session, closed when the session is deleted or
//! unused for `SESSION_IDLE`). A connection is made at its first call; the tools are listed
//! once at start by a connection of the server's own (kept as the shared one for `server`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::{McpClient, McpError, McpTool, Spawning};
use crate::config::bae::{McpScope, McpServer};
use crate::domain::ToolSchema;
use crate::engine::tools::{Permission, Tool, ToolContext, ToolError, ToolOutput};

/// A session-scoped connection unused this long is closed (the next call makes a new one).
const SESSION_IDLE: Duration = Duration::from_secs(30 * 60);
/// The longest tool name every provider accepts.
const NAME_LIMIT: usize = 64;
/// The prefix no tool but an MCP server's may take.
pub const RESERVED_PREFIX: &str = "mcp__";

/// One server's connections, by scope key.
pub struct Pool {
    server: McpServer,
    /// This data dir's marker: server- and tenant-scoped processes carry it.
    node: Spawning,
    clients: Mutex<HashMap<String, (Arc<McpClient>, Instant)>>,
}

impl Pool {
    /// Connects once to list the server's tools; for `server` scope that connection is kept.
    pub fn connect(server: McpServer, node: Spawning) -> Result<(Arc<Pool>, Vec<McpTool>), McpError> {
        let first = McpClient::connect(&server, super::process_env(), node.clone())?;
        let tools = first.tools();
        let pool = Pool { server, node, clients: Mutex::new(HashMap::new()) };
        match pool.server.scope {
            McpScope::Server => pool.lock().insert(String::new(), (Arc::new(first), Instant::now())),
            // Its state is nobody's: it goes, so no session shares it.
            McpScope::Tenant | McpScope::Session => None,
        };
        Ok((Arc::new(pool), tools))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Arc<McpClient>, Instant)>> {
        self.clients.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The key of the connection a call from `context` uses, and the marker its processes
    /// carry.
    fn key(&self, context: &ToolContext<'_>) -> (String, String) {
        match self.server.scope {
            McpScope::Server => (String::new(), self.node.marker.clone()),
            McpScope::Tenant => (format!("tenant:{}", context.tenant), self.node.marker.clone()),
            McpScope::Session => (format!("session:{}", context.session_id), context.session_id.to_string()),
        }
    }

    /// The connection for `key`, made if there is none (outside the map's lock: a slow
    /// server holds up only its own key's first call).
    fn client(&self, key: &str, marker: String) -> Result<Arc<McpClient>, McpError> {
        self.close_idle();
        if let Some((client, used)) = self.lock().get_mut(key) {
            *used = Instant::now();
            return Ok(Arc::clone(client));
        }
        let spawning = Spawning { marker, ..self.node.clone() };
        let made = Arc::new(McpClient::connect(&self.server, super::process_env(), spawning)?);
        let mut clients = self.lock();
        // Another call made one meanwhile: keep that one (the new one closes as it drops).
        let (client, _) = clients.entry(key.to_string()).or_insert_with(|| (Arc::clone(&made), Instant::now()));
        Ok(Arc::clone(client))
    }

    fn close_idle(&self) {
        if self.server.scope != McpScope::Session {
            return;
        }
        self.lock().retain(|_, (_, used)| used.elapsed() < SESSION_IDLE);
    }

    fn call(&self, tool: &str, arguments: Value, context: &ToolContext<'_>) -> Result<super::CallResult, McpError> {
        let (key, marker) = self.key(context);
        // The run's cancel ends the wait at once and tells the server (`notifications/cancelled`),
        // rather than leaving the call to run on after the run abandons it.
        self.client(&key, marker)?.call_until(tool, arguments, self.server.call_timeout(), context.cancel.receiver())
    }

    /// A session was deleted: its own connection, if it had one, is closed.
    fn forget_session(&self, session_id: &str) {
        let gone = self.lock().remove(&format!("session:{session_id}"));
        if let Some((client, _)) = gone {
            client.close();
        }
    }
}

/// One MCP tool as a Kestrel tool.
pub struct KestrelMcpTool {
    name: String,
    tool: McpTool,
    pool: Arc<Pool>,
}

impl KestrelMcpTool {
    /// `name` is the tool's unique Kestrel name (`unique_names`).
    pub fn new(pool: Arc<Pool>, tool: McpTool, name: String) -> KestrelMcpTool {
        KestrelMcpTool { name, tool, pool }
    }
}

/// `mcp__<server>__<tool>` in the characters every provider accepts (also the name BAE's
/// calls to that tool are judged by: `api/bae/core/calls.rs`).
pub fn plain_name(server: &str, tool: &str) -> String {
    let clean =
        |s: &str| s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect::<String>();
    format!("{RESERVED_PREFIX}{}__{}", clean(server), clean(tool))
}

/// A name for every (server, tool) pair, in order, each unique and at most 64 characters:
/// the plain name where it is short and no other pair has it, else the first 55 characters,
/// `_` and 8 hex digits of the SHA-256 of the real names. A pair whose hashed name is still
/// taken (never seen) gets `None` and is left out.
pub fn unique_names(pairs: &[(String, String)]) -> Vec<Option<String>> {
    let plain: Vec<String> = pairs.iter().map(|(server, tool)| plain_name(server, tool)).collect();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for name in &plain {
        *counts.entry(name.as_str()).or_default() += 1;
    }
    let mut taken = std::collections::HashSet::new();
    let mut names = Vec::with_capacity(pairs.len());
    for ((server, tool), name) in pairs.iter().zip(&plain) {
        let name = match name.len() <= NAME_LIMIT && counts[name.as_str()] == 1 {
            true => name.clone(),
            false => {
                let digest = Sha256::digest(format!("{server}\0{tool}").as_bytes());
                let suffix: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
                let stem: String = name.chars().take(NAME_LIMIT - 9).collect();
                format!("{stem}_{suffix}")
            }
        };
        names.push(taken.insert(name.clone()).then_some(name));
    }
    names
}

impl Tool for KestrelMcpTool {
    fn schema(&self) -> ToolSchema {
        ToolSchema {
            name: self.name.clone(),
            description: format!("{} (MCP server `{}`)", self.tool.description, self.pool.server.name),
            parameters: self.tool.input_schema.clone(),
            permission: None,
            category: Some("mcp".into()),
        }
    }

    fn default_permission(&self) -> Permission {
        Permission::Ask
    }

    fn run(&self, arguments: &Map<String, Value>, context: &ToolContext<'_>) -> Result<ToolOutput, ToolError> {
        match self.pool.call(&self.tool.name, Value::Object(arguments.clone()), context) {
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
            Err(error) => Err(ToolError::Mcp(error)),
        }
    }

    fn session_ended(&self, session_id: &str) {
        self.pool.forget_session(session_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(s, t)| (s.to_string(), t.to_string())).collect()
    }

    #[test]
    fn names_that_would_collide_or_be_cut_get_a_stable_suffix() {
        let long = "t".repeat(80);
        let names = unique_names(&pairs(&[("a", "b/c"), ("a", "b_c"), ("a", "b.c"), ("x", "echo"), ("x", &long)]));
        let names: Vec<String> = names.into_iter().map(Option::unwrap).collect();
        assert_eq!(names[3], "mcp__x__echo", "a name no other has is kept as it is");
        let distinct: std::collections::HashSet<&String> = names.iter().collect();
        assert_eq!(distinct.len(), 5, "{names:?}");
        for name in &names {
            assert!(name.len() <= 64 && name.starts_with("mcp__a__b_c_") || name.starts_with("mcp__x__"), "{name}");
            assert!(name.len() <= 64, "{name}");
        }
        assert_eq!(
            unique_names(&pairs(&[("a", "b/c"), ("a", "b.c")]))[0].as_deref(),
            Some(names[0].as_str()),
            "stable"
        );
        let cut_a = format!("{}a", "t".repeat(70));
        let cut_b = format!("{}b", "t".repeat(70));
        let cut = unique_names(&pairs(&[("x", &cut_a), ("x", &cut_b)]));
        assert_ne!(cut[0], cut[1], "names cut at 64 no longer collide");
    }
}
