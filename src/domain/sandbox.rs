//! How `run_command`'s commands are contained: the modes an operator chooses
//! (`agent.sandbox`, or a tenant's own `sandbox`), and the containment a tenant's commands
//! actually get once the server has tried bubblewrap at start. Plain data: the config reads
//! the mode, `tools/sandbox.rs` decides the state, `run.started` and `/api/bootstrap` carry it.

use serde::{Deserialize, Serialize};

/// What a command may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxMode {
    /// The workspace writable; the rest of the file system read-only, its secrets hidden;
    /// a private `/tmp`; no network unless allowed.
    WorkspaceWrite,
    /// As `WorkspaceWrite`, with the workspace read-only too.
    ReadOnly,
    /// No sandbox: a command runs as the server's user, with that user's access.
    Off,
}

impl SandboxMode {
    /// The name the config and the protocol use.
    pub fn name(self) -> &'static str {
        match self {
            SandboxMode::WorkspaceWrite => "workspace-write",
            SandboxMode::ReadOnly => "read-only",
            SandboxMode::Off => "off",
        }
    }
}

/// The containment one tenant's commands get.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxState {
    /// What the config asks for this tenant.
    pub requested: SandboxMode,
    /// What is in force: `requested`, or `Off` when bubblewrap cannot run here.
    pub mode: SandboxMode,
    /// Whether a command can reach the network (always, when unsandboxed).
    pub network: bool,
    /// Why `mode` is not `requested` (bubblewrap missing, or refused by the host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl SandboxState {
    /// Whether commands run unsandboxed although the config asked for a sandbox.
    pub fn fell_back(&self) -> bool {
        self.mode != self.requested
    }
}
