//! A plugin's tool: a subprocess per call, with the call's arguments as JSON on its stdin and
//! its result on stdout, the workspace as its working directory, a timeout, and the same
//! permissions and approvals as a built-in tool (`ask` unless the manifest or the config says
//! otherwise).
//!
//! The command is the manifest's argv; `{pluginDir}` in it stands for the plugin's directory,
//! and `KESTREL_PLUGIN_DIR` holds it too. stdout is the result: a JSON object
//! `{"ok": bool, "content": string, "data"?: any}`, or else its text, `ok` when the exit code
//! is 0. What the process writes to stderr goes into the error of a failed call.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::manifest::ToolManifest;
use crate::domain::ToolSchema;
use crate::engine::tools::{Permission, Tool, ToolContext, ToolError, ToolOutput};
use crate::tools::process::{Ending, Launcher, Pipes};

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

pub struct PluginTool {
    plugin_id: String,
    plugin_dir: PathBuf,
    manifest: ToolManifest,
    launcher: Launcher,
}

impl PluginTool {
    pub fn new(plugin_id: &str, plugin_dir: PathBuf, manifest: ToolManifest, launcher: Launcher) -> PluginTool {
        PluginTool { plugin_id: plugin_id.to_string(), plugin_dir, manifest, launcher }
    }

    fn argv(&self) -> Vec<String> {
        let dir = self.plugin_dir.to_string_lossy();
        self.manifest.command.iter().map(|part| part.replace("{pluginDir}", &dir)).collect()
    }
}

impl Tool for PluginTool {
    fn schema(&self) -> ToolSchema {
        ToolSchema {
            name: self.manifest.name.clone(),
            description: self.manifest.description.clone(),
            parameters: self.manifest.parameters.clone(),
            permission: None,
            category: Some(format!("plugin:{}", self.plugin_id)),
        }
    }

    fn default_permission(&self) -> Permission {
        match self.manifest.permission.as_deref() {
            Some("auto") => Permission::Auto,
            _ => Permission::Ask,
        }
    }

    fn run(&self, arguments: &Map<String, Value>, context: &ToolContext<'_>) -> Result<ToolOutput, ToolError> {
        let argv = self.argv();
        let mut command = self.launcher.command(&argv[0], &argv[1..], context);
        command.env("KESTREL_PLUGIN_DIR", &self.plugin_dir);
        let input = serde_json::to_vec(arguments).map_err(|e| ToolError::Arguments(e.to_string()))?;
        let timeout = self.manifest.timeout_secs.map_or(DEFAULT_TIMEOUT, Duration::from_secs);
        let finished = self
            .launcher
            .run(command, Some(input), Pipes::Apart, timeout, context)
            .map_err(|error| ToolError::Io("cannot run the plugin tool".into(), error))?;
        let (stdout, _) = finished.outputs.first().cloned().unwrap_or_default();
        let (stderr, _) = finished.outputs.get(1).cloned().unwrap_or_default();
        let ended = match finished.ending {
            Ending::TimedOut => Some(format!("timed out after {} s; the tool was killed", timeout.as_secs())),
            Ending::Cancelled => Some("cancelled; the tool was killed".to_string()),
            Ending::Exited(_) => None,
        };
        if let Some(why) = ended {
            return Ok(ToolOutput { ok: false, content: why.clone(), error: Some(why), data: None });
        }
        let exited_ok = finished.exit_code() == Some(0);
        Ok(result_of(&stdout, &stderr, exited_ok, finished.exit_code()))
    }
}

/// The call's result from what the process printed (see the module doc).
fn result_of(stdout: &str, stderr: &str, exited_ok: bool, code: Option<i32>) -> ToolOutput {
    let structured = serde_json::from_str::<Value>(stdout.trim()).ok().filter(|v| v["content"].is_string());
    let (ok, content, data) = match structured {
        Some(value) => (
            value["ok"].as_bool().unwrap_or(exited_ok) && exited_ok,
            value["content"].as_str().unwrap_or_default().to_string(),
            value.get("data").cloned(),
        ),
        None => (exited_ok, stdout.to_string(), None),
    };
    let error = (!ok).then(|| {
        let detail = stderr.trim();
        match (code, detail.is_empty()) {
            (Some(0), true) => "the tool reported a failure".to_string(),
            (Some(0), false) => detail.to_string(),
            (code, _) => format!("exit code {}: {detail}", code.map_or("none".into(), |c| c.to_string())),
        }
    });
    ToolOutput { ok, content, error, data: data.or_else(|| Some(json!({ "exitCode": code }))) }
}
