//! The built-in tools of a Kestrel session and the workspace they are confined to.
//!
//! Tools run on a run's worker thread. Each implements `engine::tools::Tool`; this module
//! only builds them from the config. Every path goes through `workspace.rs`.

mod args;
mod command;
mod files;
pub mod orphans;
pub mod process;
pub mod sandbox;
mod search;
pub mod spawner;
pub mod workspace;

use std::time::Duration;

use crate::domain::ToolSchema;
use crate::engine::tools::ToolRegistry;

/// A built-in tool's schema; the registry fills in the permission.
fn schema(name: &str, description: &str, category: &str, parameters: serde_json::Value) -> ToolSchema {
    ToolSchema {
        name: name.into(),
        description: description.into(),
        parameters,
        permission: None,
        category: Some(category.into()),
    }
}

/// What the built-in tools are configured with.
#[derive(Debug, Clone)]
pub struct ToolSettings {
    pub read_limit: usize,
    pub command_timeout: Duration,
    pub command_max_timeout: Duration,
    /// Environment variables a command must not see.
    pub hidden_env: Vec<String>,
    /// `setpriv`, to have the kernel kill a command when the server dies (see `orphans.rs`).
    pub death_signal_wrapper: Option<std::path::PathBuf>,
    /// How each tenant's commands are contained (`sandbox.rs`).
    pub sandbox: std::sync::Arc<sandbox::CommandSandbox>,
}

/// Registers every built-in tool.
pub fn register_builtins(registry: &mut ToolRegistry, settings: &ToolSettings) {
    registry.register(Box::new(files::ReadFile { read_limit: settings.read_limit }));
    registry.register(Box::new(files::ListDirectory));
    registry.register(Box::new(search::FindFiles));
    registry.register(Box::new(search::SearchText));
    registry.register(Box::new(files::WriteFile));
    registry.register(Box::new(files::EditFile { read_limit: settings.read_limit }));
    registry.register(Box::new(command::RunCommand {
        default_timeout: settings.command_timeout,
        max_timeout: settings.command_max_timeout,
        hidden_env: settings.hidden_env.clone(),
        death_signal_wrapper: settings.death_signal_wrapper.clone(),
        sandbox: std::sync::Arc::clone(&settings.sandbox),
    }));
}
