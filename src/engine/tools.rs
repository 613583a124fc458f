//! Tool dispatch: the registry the turn loop asks to run a model's tool calls.
//!
//! Runs on the run's worker thread. The registry is built at start and read-only after. A
//! call to a name nobody registered is answered with an error result the model can read; the
//! built-in workspace tools plug in here through the `Tool` trait.

use std::path::Path;
use std::time::Instant;

use serde_json::{Map, Value};

use crate::cancel::CancelToken;
use crate::domain::{ToolCall, ToolResult, ToolSchema};

/// What a tool may use while it runs.
pub struct ToolContext<'a> {
    pub workspace: &'a Path,
    pub cancel: &'a CancelToken,
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
    pub fn failure(message: impl Into<String>) -> ToolOutput {
        let message = message.into();
        ToolOutput {
            ok: false,
            content: message.clone(),
            error: Some(message),
            data: None,
        }
    }
}

pub trait Tool: Send + Sync {
    fn schema(&self) -> ToolSchema;
    fn run(&self, arguments: &Map<String, Value>, context: &ToolContext<'_>) -> ToolOutput;
}

#[derive(Default)]
pub struct ToolRegistry {
    tools: Vec<Box<dyn Tool>>,
}

impl ToolRegistry {
    pub fn register(&mut self, tool: Box<dyn Tool>) {
        self.tools.push(tool);
    }

    pub fn schemas(&self) -> Vec<ToolSchema> {
        self.tools.iter().map(|tool| tool.schema()).collect()
    }

    /// Runs one call to completion; never fails, an error becomes an error result.
    pub fn execute(&self, call: &ToolCall, context: &ToolContext<'_>) -> ToolResult {
        let started = Instant::now();
        let output = match self
            .tools
            .iter()
            .find(|tool| tool.schema().name == call.name)
        {
            Some(tool) => tool.run(&call.arguments, context),
            None => ToolOutput::failure(format!(
                "Unknown tool `{}`: this server has no tool by that name.",
                call.name
            )),
        };
        ToolResult {
            call_id: call.id.clone(),
            name: call.name.clone(),
            ok: output.ok,
            content: output.content,
            duration_ms: Some(started.elapsed().as_millis() as u64),
            error: output.error,
            data: output.data,
        }
    }
}
