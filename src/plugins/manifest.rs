//! `plugin.json`: what a plugin says about itself, read and checked. A manifest that does not
//! pass is reported (the plugin is listed as failed, with why), never fatal.
//!
//! ```json
//! {
//!   "id": "hello",                       // [a-z0-9][a-z0-9_-]{0,63}, unique
//!   "name": "Hello",                     // 1–100 characters
//!   "version": "1.2.0",                  // 1–40 characters
//!   "description": "Says hello",         // optional, at most 1,000 characters
//!   "web": { "entry": "index.js", "stylesheet": "style.css" },   // optional, under web/
//!   "tools": [{                          // optional
//!     "name": "hello_world",             // [a-z][a-z0-9_]{0,63}, not a built-in tool's name
//!     "description": "…",
//!     "parameters": { "type": "object", … },                    // JSON Schema, an object
//!     "command": ["python3", "hello.py"],                        // argv, run in the workspace
//!     "timeoutSecs": 30,                 // optional, 1–600, default 30
//!     "permission": "ask"                // optional, "auto" or "ask" (the default)
//!   }]
//! }
//! ```

use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Manifest {
    pub id: String,
    pub name: String,
    pub version: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub web: Option<WebEntry>,
    #[serde(default)]
    pub tools: Vec<ToolManifest>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebEntry {
    pub entry: String,
    #[serde(default)]
    pub stylesheet: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ToolManifest {
    pub name: String,
    pub description: String,
    pub parameters: Value,
    pub command: Vec<String>,
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    #[serde(default)]
    pub permission: Option<String>,
}

/// The largest `plugin.json` read.
const MANIFEST_LIMIT: u64 = 256 * 1024;

/// Why a plugin is not loaded; its text says what is wrong, for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginError {
    /// The plugin directory or its `plugin.json` could not be read.
    Read(String),
    TooLarge,
    /// `plugin.json` is not a manifest (its JSON or its fields).
    Parse(String),
    Id(String),
    Name,
    Version,
    Description,
    WebFile(String),
    /// `web` is a link or a file, not a directory inside the plugin.
    WebNotDirectory,
    /// The manifest declares web files and there is no `web/`.
    WebMissing,
    IdTaken(String),
    ToolName(String),
    /// A tool name starting with `mcp__`.
    ToolReservedPrefix(String),
    /// A tool name a built-in tool or another plugin has.
    ToolTaken(String),
    ToolDeclaredTwice(String),
    ToolParameters(String),
    ToolCommand(String),
    ToolTimeout(String),
    ToolPermission(String),
}

impl std::fmt::Display for PluginError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PluginError::Read(why) => write!(f, "{why}"),
            PluginError::TooLarge => write!(f, "plugin.json is larger than {MANIFEST_LIMIT} bytes"),
            PluginError::Parse(why) => write!(f, "plugin.json: {why}"),
            PluginError::Id(id) => write!(f, "id {id:?} must be 1–64 of a-z, 0-9, - and _"),
            PluginError::Name => write!(f, "name must be 1–100 characters"),
            PluginError::Version => write!(f, "version must be 1–40 characters"),
            PluginError::Description => write!(f, "description must be at most 1,000 characters"),
            PluginError::WebFile(file) => write!(f, "web file {file:?} must be a relative path inside web/"),
            PluginError::WebNotDirectory => {
                write!(f, "web must be a directory inside the plugin directory, not a link or a file")
            }
            PluginError::WebMissing => {
                write!(f, "the manifest declares web files but the plugin has no web/ directory")
            }
            PluginError::IdTaken(id) => write!(f, "id {id:?} is taken by another plugin"),
            PluginError::ToolName(name) => {
                write!(f, "tool name {name:?} must be 1–64 of a-z, 0-9 and _, starting with a letter")
            }
            PluginError::ToolReservedPrefix(name) => {
                write!(f, "tool {name:?}: names starting with mcp__ are MCP servers' own")
            }
            PluginError::ToolTaken(name) => {
                write!(f, "tool {name:?} has the name of a built-in tool or another plugin's")
            }
            PluginError::ToolDeclaredTwice(name) => write!(f, "tool {name:?} is declared twice"),
            PluginError::ToolParameters(name) => write!(f, "tool {name:?}: parameters must be a JSON Schema object"),
            PluginError::ToolCommand(name) => write!(f, "tool {name:?}: command must be a non-empty list of arguments"),
            PluginError::ToolTimeout(name) => write!(f, "tool {name:?}: timeoutSecs must be 1–600"),
            PluginError::ToolPermission(name) => write!(f, "tool {name:?}: permission must be \"auto\" or \"ask\""),
        }
    }
}

impl std::error::Error for PluginError {}

/// Reads and checks a plugin directory's `plugin.json` (through its directory's handle: never
/// a link, never a FIFO).
pub fn read(dir: &std::path::Path, reserved_tools: &[String]) -> Result<Manifest, PluginError> {
    let plugin = crate::dirfd::Dir::open(dir).map_err(|e| PluginError::Read(format!("plugin directory: {e}")))?;
    let text = match plugin.read_file(std::ffi::OsStr::new("plugin.json"), MANIFEST_LIMIT) {
        Ok((text, _)) => text,
        Err(crate::dirfd::ReadError::TooLarge) => return Err(PluginError::TooLarge),
        Err(crate::dirfd::ReadError::Io(error)) => return Err(PluginError::Read(format!("plugin.json: {error}"))),
    };
    let manifest: Manifest = serde_json::from_slice(&text).map_err(|e| PluginError::Parse(e.to_string()))?;
    check(&manifest, reserved_tools)?;
    Ok(manifest)
}

fn check(manifest: &Manifest, reserved_tools: &[String]) -> Result<(), PluginError> {
    let id_ok = !manifest.id.is_empty()
        && manifest.id.len() <= 64
        && manifest.id.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && manifest.id.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !id_ok {
        return Err(PluginError::Id(manifest.id.clone()));
    }
    if manifest.name.trim().is_empty() || manifest.name.chars().count() > 100 {
        return Err(PluginError::Name);
    }
    if manifest.version.trim().is_empty() || manifest.version.chars().count() > 40 {
        return Err(PluginError::Version);
    }
    if manifest.description.as_ref().is_some_and(|d| d.chars().count() > 1000) {
        return Err(PluginError::Description);
    }
    if let Some(web) = &manifest.web {
        for file in std::iter::once(&web.entry).chain(web.stylesheet.as_ref()) {
            if !relative_path_ok(file) {
                return Err(PluginError::WebFile(file.clone()));
            }
        }
    }
    let mut names = std::collections::HashSet::new();
    for tool in &manifest.tools {
        check_tool(tool, reserved_tools)?;
        if !names.insert(tool.name.as_str()) {
            return Err(PluginError::ToolDeclaredTwice(tool.name.clone()));
        }
    }
    Ok(())
}

fn check_tool(tool: &ToolManifest, reserved_tools: &[String]) -> Result<(), PluginError> {
    let name = || tool.name.clone();
    let name_ok = !tool.name.is_empty()
        && tool.name.len() <= 64
        && tool.name.starts_with(|c: char| c.is_ascii_lowercase())
        && tool.name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !name_ok {
        return Err(PluginError::ToolName(name()));
    }
    if tool.name.starts_with(crate::mcp::tool::RESERVED_PREFIX) {
        return Err(PluginError::ToolReservedPrefix(name()));
    }
    if reserved_tools.contains(&tool.name) {
        return Err(PluginError::ToolTaken(name()));
    }
    if !tool.parameters.is_object() {
        return Err(PluginError::ToolParameters(name()));
    }
    if tool.command.is_empty() || tool.command.iter().any(|part| part.is_empty() || part.contains('\0')) {
        return Err(PluginError::ToolCommand(name()));
    }
    if tool.timeout_secs.is_some_and(|t| !(1..=600).contains(&t)) {
        return Err(PluginError::ToolTimeout(name()));
    }
    if tool.permission.as_deref().is_some_and(|p| p != "auto" && p != "ask") {
        return Err(PluginError::ToolPermission(name()));
    }
    Ok(())
}

/// A relative POSIX path with no `..`, no empty part and no leading `/`.
pub fn relative_path_ok(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && !path.contains('\\')
        && !path.contains('\0')
        && path.split('/').all(|part| !part.is_empty() && part != "." && part != "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(json: &str) -> Result<Manifest, String> {
        let manifest: Manifest = serde_json::from_str(json).map_err(|e| e.to_string())?;
        check(&manifest, &["read_file".to_string()]).map(|()| manifest).map_err(|e| e.to_string())
    }

    #[test]
    fn a_good_manifest_passes_and_each_kind_of_bad_one_says_why() {
        let good = r#"{"id":"hello","name":"Hello","version":"1.0.0","web":{"entry":"index.js"},
            "tools":[{"name":"hi","description":"d","parameters":{"type":"object"},"command":["echo"]}]}"#;
        assert!(manifest(good).is_ok());
        for (bad, why) in [
            (r#"{"id":"Hello","name":"x","version":"1"}"#, "id"),
            (r#"{"id":"a","name":"","version":"1"}"#, "name"),
            (r#"{"id":"a","name":"x","version":"1","web":{"entry":"../x.js"}}"#, "web file"),
            (
                r#"{"id":"a","name":"x","version":"1","tools":[{"name":"read_file","description":"d","parameters":{},"command":["x"]}]}"#,
                "built-in",
            ),
            (
                r#"{"id":"a","name":"x","version":"1","tools":[{"name":"t","description":"d","parameters":[],"command":["x"]}]}"#,
                "parameters",
            ),
            (
                r#"{"id":"a","name":"x","version":"1","tools":[{"name":"t","description":"d","parameters":{},"command":[]}]}"#,
                "command",
            ),
            (r#"{"id":"a","name":"x","version":"1","surprise":true}"#, "unknown field"),
            (
                r#"{"id":"a","name":"x","version":"1","tools":[{"name":"mcp__files__read","description":"d","parameters":{},"command":["x"]}]}"#,
                "MCP servers' own",
            ),
        ] {
            let error = manifest(bad).unwrap_err();
            assert!(error.contains(why), "{bad}: {error}");
        }
    }
}
