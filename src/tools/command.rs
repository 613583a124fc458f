//! run_command: a shell command in the workspace, with a timeout, capped interleaved output,
//! and its whole process group killed on cancel or timeout.
//!
//! The command runs under `/bin/sh -c` as `process.rs` runs a tool's processes, with stdout
//! and stderr on one pipe, so they interleave as the command wrote them, inside the sandbox
//! its tenant gets (`sandbox.rs`: bubblewrap, or unsandboxed where it cannot run or is off).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::args::Args;
use super::process::{Ending, Launcher, Pipes, OUTPUT_CAP};
use super::sandbox::CommandSandbox;
use super::schema;
use crate::domain::ToolSchema;
use crate::engine::tools::{Permission, Tool, ToolContext, ToolError, ToolOutput};
use crate::policy::MatchOn;

pub struct RunCommand {
    pub default_timeout: Duration,
    pub max_timeout: Duration,
    /// Environment variables removed from the command's environment (tokens, API keys).
    pub hidden_env: Vec<String>,
    /// `setpriv`: the shell then dies with the thread that started it (`orphans.rs`).
    pub death_signal_wrapper: Option<PathBuf>,
    /// Each tenant's containment.
    pub sandbox: Arc<CommandSandbox>,
}

impl Tool for RunCommand {
    fn schema(&self) -> ToolSchema {
        schema(
            "run_command",
            &format!(
                "Run a shell command (/bin/sh -c) in the workspace. Output (stdout and stderr together) is capped at {OUTPUT_CAP} characters; the exit code is reported. Default timeout {} s, at most {} s.",
                self.default_timeout.as_secs(),
                self.max_timeout.as_secs()
            ),
            "shell",
            json!({
                "type": "object",
                "properties": {
                    "command": { "type": "string", "description": "The command line." },
                    "timeoutSecs": { "type": "integer", "minimum": 1, "description": "Kill the command after this many seconds." }
                },
                "required": ["command"]
            }),
        )
    }

    fn default_permission(&self) -> Permission {
        Permission::Ask
    }

    fn matches_on(&self) -> MatchOn {
        MatchOn::Command("command")
    }

    fn run(&self, arguments: &Map<String, Value>, context: &ToolContext<'_>) -> Result<ToolOutput, ToolError> {
        let args = Args::new(arguments);
        let command = args.string("command")?;
        let timeout = args.optional_u64("timeoutSecs")?.map(Duration::from_secs).unwrap_or(self.default_timeout);
        self.execute(command, timeout.min(self.max_timeout), context)
            .map_err(|error| ToolError::Io("cannot run the command".into(), error))
    }
}

impl RunCommand {
    fn execute(&self, command: &str, timeout: Duration, context: &ToolContext<'_>) -> std::io::Result<ToolOutput> {
        let launcher =
            Launcher { hidden_env: self.hidden_env.clone(), death_signal_wrapper: self.death_signal_wrapper.clone() };
        let shell_args = ["-c".to_string(), command.to_string()];
        let wrapped = self.sandbox.wrap(context.tenant, context.workspace.root(), "/bin/sh", &shell_args);
        let shell = launcher.command(&wrapped.program, &wrapped.args, context);
        let finished = launcher.run(shell, None, Pipes::Merged, timeout, context)?;
        let (output, dropped) = finished.outputs.first().cloned().unwrap_or_default();
        let mut content = match &finished.ending {
            Ending::Exited(Some(code)) => format!("exit code {code}\n"),
            Ending::Exited(None) => "killed by a signal\n".to_string(),
            Ending::TimedOut => format!("timed out after {} s; the command was killed\n", timeout.as_secs()),
            Ending::Cancelled => "cancelled; the command was killed\n".to_string(),
        };
        content.push_str(&output);
        if dropped > 0 {
            content.push_str(&format!("\n[output truncated: {dropped} more bytes]"));
        }
        let exit_code = finished.exit_code();
        let data = json!({
            "exitCode": exit_code,
            "timedOut": matches!(finished.ending, Ending::TimedOut),
            "cancelled": matches!(finished.ending, Ending::Cancelled),
            "durationMs": finished.duration_ms,
            "truncated": dropped > 0,
            "sandbox": wrapped.state.mode.name(),
        });
        let ok = exit_code == Some(0);
        Ok(ToolOutput {
            ok,
            error: (!ok).then(|| content.lines().next().unwrap_or("").to_string()),
            content,
            data: Some(data),
        })
    }
}
