//! Sandboxes for BAE sessions: a driver that can make sure an image is there, start a
//! sandbox from it, run a command in it, and stop it. `docker.rs` drives the `docker` CLI as
//! BAE does. (The driver for hosts with no container engine, provisioning, and the JSON-RPC
//! methods come next; see issue 11.)

pub mod docker;

use std::time::Duration;

/// What a command run in a sandbox left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    pub stdout: String,
    pub stderr: String,
    /// -1 when the command was killed (a timeout).
    pub exit_code: i32,
}

/// A running sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    pub id: String,
    pub image: String,
}

/// Why a driver step failed: the tool's own words, trimmed to `DETAIL_LIMIT` characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverError(pub String);

impl std::fmt::Display for DriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The longest error detail kept, in characters (then `…`).
pub const DETAIL_LIMIT: usize = 1024;

/// A sandbox driver.
pub trait Driver: Send + Sync {
    /// Makes sure `image` is present (pulling it if not).
    fn ensure_image(&self, image: &str) -> Result<(), DriverError>;
    fn start(&self, image: &str) -> Result<Running, DriverError>;
    /// Runs `command` with `sh -c`; past `timeout` it is killed (exit code -1).
    fn exec(&self, sandbox: &Running, command: &str, timeout: Duration) -> Result<ExecOutput, DriverError>;
    fn stop(&self, sandbox: &Running) -> Result<(), DriverError>;
}

/// An error detail from a tool's output: its stderr trimmed, else its stdout, cut at
/// `DETAIL_LIMIT` characters.
pub fn detail(stderr: &str, stdout: &str) -> String {
    let text = match stderr.trim() {
        "" => stdout.trim(),
        text => text,
    };
    if text.chars().count() <= DETAIL_LIMIT {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(DETAIL_LIMIT).collect();
    cut.push('…');
    cut
}
