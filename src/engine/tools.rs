//! Tool dispatch: the registry the turn loop asks to run a model's tool calls.
//!
//! Runs on the run's worker thread. The registry is built at start and read-only after. Each
//! tool has a permission (`auto`, `ask`, `deny`), its own default unless the config overrides
//! it. A call to a name nobody registered, or to a denied tool, is answered with an error
//! result the model can read. What goes back to the model is capped at `output_limit`
//! characters, with a note saying so.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::cancel::CancelToken;
use crate::domain::{ToolCall, ToolResult, ToolSchema};
use crate::tools::workspace::Workspace;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Permission {
    /// Runs without asking.
    Auto,
    /// Waits for a person's approval.
    Ask,
    /// Never runs; not offered to the model.
    Deny,
}

impl Permission {
    /// The rules' outcome this permission amounts to when no rule applies.
    pub fn outcome(self) -> crate::policy::Outcome {
        match self {
            Permission::Auto => crate::policy::Outcome::Allow,
            Permission::Ask => crate::policy::Outcome::Ask,
            Permission::Deny => crate::policy::Outcome::Deny,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Permission::Auto => "auto",
            Permission::Ask => "ask",
            Permission::Deny => "deny",
        }
    }
}

/// What a tool may use while it runs.
pub struct ToolContext<'a> {
    pub workspace: &'a Workspace,
    /// Judges each path a walking tool reaches (`Tool::walks`) by the call's rules; it
    /// withholds nothing for other tools.
    pub paths: &'a crate::policy::PathJudge,
    /// The session's tenant (an MCP server scoped by tenant keys its connection by it).
    pub tenant: &'a str,
    pub cancel: &'a CancelToken,
    pub session_id: &'a str,
    pub call_id: &'a str,
}

/// A tool's answer before the registry stamps it with the call's id and duration.
pub struct ToolOutput {
    pub ok: bool,
    /// For the model.
    pub content: String,
    pub error: Option<String>,
    /// For clients only.
    pub data: Option<Value>,
}

impl ToolOutput {
    pub fn success(content: impl Into<String>, data: Option<Value>) -> ToolOutput {
        ToolOutput { ok: true, content: content.into(), error: None, data }
    }

    pub fn failure(message: impl Into<String>) -> ToolOutput {
        let message = message.into();
        ToolOutput { ok: false, content: message.clone(), error: Some(message), data: None }
    }
}

/// Why a tool call failed. Its text is what the model reads (the same as a
/// `ToolOutput::failure`), so tools use `?` on bad arguments, refused paths and I/O.
#[derive(Debug)]
pub enum ToolError {
    /// The call's arguments: missing, of the wrong type, or a pattern that does not compile.
    Arguments(String),
    /// A workspace path was refused or could not be read.
    Path(crate::tools::workspace::PathError),
    /// What the call asked for cannot be done (an `oldString` not found, a binary file).
    Refused(String),
    /// The tool's own work failed: what it was doing, and the error.
    Io(String, std::io::Error),
    /// An MCP server failed.
    Mcp(crate::mcp::McpError),
}

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ToolError::Arguments(why) | ToolError::Refused(why) => write!(f, "{why}"),
            ToolError::Path(error) => write!(f, "{error}"),
            ToolError::Io(doing, error) => write!(f, "{doing}: {error}"),
            ToolError::Mcp(error) => write!(f, "MCP error: {error}"),
        }
    }
}

impl std::error::Error for ToolError {}

impl From<crate::tools::workspace::PathError> for ToolError {
    fn from(error: crate::tools::workspace::PathError) -> Self {
        ToolError::Path(error)
    }
}

pub trait Tool: Send + Sync {
    fn schema(&self) -> ToolSchema;
    fn default_permission(&self) -> Permission;
    /// Runs the tool. An `Err` is a failure the model reads, the same as `ToolOutput::failure`.
    fn run(&self, arguments: &Map<String, Value>, context: &ToolContext<'_>) -> Result<ToolOutput, ToolError>;
    /// Whether a call may change the workspace's files: a run takes its automatic checkpoint
    /// before the first such call. Unless a tool says otherwise, it may.
    fn changes_files(&self) -> bool {
        true
    }
    /// A session was deleted: whatever the tool keeps for it (an MCP connection) goes.
    fn session_ended(&self, _session_id: &str) {}
    /// Which argument the rules' `match` patterns read (`crate::policy`); none unless the
    /// tool says so.
    fn matches_on(&self) -> crate::policy::MatchOn {
        crate::policy::MatchOn::Nothing
    }
    /// Whether the tool walks the workspace, asking `ToolContext::paths` of each file it would
    /// open or return and each directory it would enter: the engine then judges those paths by
    /// the call's rules. It must not change files: a person's approval of withheld paths runs
    /// it again.
    fn walks(&self) -> bool {
        false
    }
    /// The arguments that carry content (what a file would hold) rather than say what the call
    /// does: the audit log and remembered rules keep only their size and SHA-256
    /// (`policy::digested_arguments`).
    fn content_arguments(&self) -> &'static [&'static str] {
        &[]
    }
}

/// A named group of tools replaced as a whole.
type Group = (&'static str, Vec<Arc<Registered>>);

struct Registered {
    tool: Box<dyn Tool>,
    schema: ToolSchema,
    permission: Permission,
}

/// The tools a run may call: the built-in ones, fixed at start, then groups that are replaced
/// as a whole (the plugins' tools on a reload, the MCP servers' once they connect); a call
/// already running keeps its tool.
pub struct ToolRegistry {
    tools: Vec<Arc<Registered>>,
    groups: RwLock<Vec<Group>>,
    overrides: HashMap<String, Permission>,
    output_limit: usize,
}

impl ToolRegistry {
    /// An empty registry; `overrides` replace tools' default permissions by name.
    pub fn new(overrides: HashMap<String, Permission>, output_limit: usize) -> ToolRegistry {
        ToolRegistry { tools: Vec::new(), groups: RwLock::default(), overrides, output_limit }
    }

    fn registered(&self, tool: Box<dyn Tool>) -> Arc<Registered> {
        let mut schema = tool.schema();
        let permission = self.overrides.get(&schema.name).copied().unwrap_or_else(|| tool.default_permission());
        schema.permission = Some(permission.as_str().to_string());
        Arc::new(Registered { tool, schema, permission })
    }

    pub fn register(&mut self, tool: Box<dyn Tool>) {
        let registered = self.registered(tool);
        self.tools.push(registered);
    }

    /// Replaces every plugin tool with `tools` (a plugin reload).
    pub fn replace_plugin_tools(&self, tools: Vec<Box<dyn Tool>>) {
        self.replace_group("plugins", tools);
    }

    /// Replaces the tools of `group` with `tools`.
    pub fn replace_group(&self, group: &'static str, tools: Vec<Box<dyn Tool>>) {
        let registered: Vec<Arc<Registered>> = tools.into_iter().map(|tool| self.registered(tool)).collect();
        let mut groups = self.groups.write().unwrap_or_else(|e| e.into_inner());
        match groups.iter_mut().find(|(name, _)| *name == group) {
            Some((_, tools)) => *tools = registered,
            None => groups.push((group, registered)),
        }
    }

    fn all(&self) -> Vec<Arc<Registered>> {
        let groups = self.groups.read().unwrap_or_else(|e| e.into_inner());
        self.tools.iter().chain(groups.iter().flat_map(|(_, tools)| tools.iter())).cloned().collect()
    }

    /// The tools offered to models and clients: every tool but the denied ones.
    /// Tells every tool that a session was deleted.
    pub fn session_ended(&self, session_id: &str) {
        for registered in self.all() {
            registered.tool.session_ended(session_id);
        }
    }

    pub fn schemas(&self) -> Vec<ToolSchema> {
        self.all().iter().filter(|t| t.permission != Permission::Deny).map(|t| t.schema.clone()).collect()
    }

    /// A tool's permission; `None` for a name nobody registered.
    pub fn permission(&self, name: &str) -> Option<Permission> {
        self.find(name).map(|t| t.permission)
    }

    /// The permission `[agent.permissions]` gives `name`, registered or not (a door's own
    /// calls, such as BAE's, are judged under names no tool registers).
    pub fn configured_permission(&self, name: &str) -> Option<Permission> {
        self.overrides.get(name).copied()
    }

    /// The input schema of `name`'s calls.
    pub fn parameters(&self, name: &str) -> Option<Value> {
        self.find(name).map(|t| t.schema.parameters.clone())
    }

    /// Which argument of `name`'s calls the rules' patterns read.
    pub fn matches_on(&self, name: &str) -> crate::policy::MatchOn {
        self.find(name).map_or(crate::policy::MatchOn::Nothing, |t| t.tool.matches_on())
    }

    /// Whether `name` walks the workspace (`Tool::walks`).
    pub fn walks(&self, name: &str) -> bool {
        self.find(name).is_some_and(|t| t.tool.walks() && !t.tool.changes_files())
    }

    /// The content arguments of `name`'s calls (`Tool::content_arguments`); none for a name
    /// nobody registered.
    pub fn content_arguments(&self, name: &str) -> &'static [&'static str] {
        self.find(name).map_or(&[], |t| t.tool.content_arguments())
    }

    /// Whether a call of `name` may change files (an unknown tool runs nothing, so no).
    pub fn changes_files(&self, name: &str) -> bool {
        self.find(name).is_some_and(|t| t.tool.changes_files())
    }

    fn find(&self, name: &str) -> Option<Arc<Registered>> {
        if let Some(builtin) = self.tools.iter().find(|t| t.schema.name == name) {
            return Some(Arc::clone(builtin));
        }
        let groups = self.groups.read().unwrap_or_else(|e| e.into_inner());
        groups.iter().flat_map(|(_, tools)| tools.iter()).find(|t| t.schema.name == name).cloned()
    }

    /// Runs one call to completion; never fails, an error becomes an error result.
    pub fn execute(&self, call: &ToolCall, context: &ToolContext<'_>) -> ToolResult {
        let started = Instant::now();
        let output = match self.find(&call.name) {
            Some(registered) if registered.permission == Permission::Deny => {
                ToolOutput::failure(format!("`{}` is disabled on this server.", call.name))
            }
            Some(registered) => registered
                .tool
                .run(&call.arguments, context)
                .unwrap_or_else(|error| ToolOutput::failure(error.to_string())),
            None => ToolOutput::failure(format!("Unknown tool `{}`: this server has no tool by that name.", call.name)),
        };
        ToolResult {
            call_id: call.id.clone(),
            name: call.name.clone(),
            ok: output.ok,
            content: cap(output.content, self.output_limit),
            duration_ms: Some(started.elapsed().as_millis() as u64),
            error: output.error,
            data: output.data,
            blocks: None,
        }
    }
}

/// Cuts `content` to `limit` characters, saying how much was left out.
fn cap(content: String, limit: usize) -> String {
    let total = content.chars().count();
    if total <= limit {
        return content;
    }
    let mut kept: String = content.chars().take(limit).collect();
    kept.push_str(&format!("\n[output truncated: {} of {total} characters shown]", limit));
    kept
}
