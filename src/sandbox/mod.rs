//! Sandboxes for BAE sessions: a driver that can make sure an image is there, start a
//! sandbox from it, run a command in it, and stop it. `docker.rs` drives the `docker` CLI as
//! BAE does; `local.rs` is for hosts with no container engine (bubblewrap, or honestly
//! unsandboxed); `provision.rs` makes profiles' images ready in the background. The JSON-RPC
//! methods are in `engine/bae/sandbox.rs`, remote subagents in `engine/bae/subagent.rs`.

pub mod docker;
pub mod local;
pub mod provision;

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
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
    /// The `KESTREL_COMMAND` value every process run for it carries (`tools/orphans.rs`), so
    /// the sweep at start and shutdown finds what a killed server left; set by its owner.
    pub marker: Option<String>,
}

impl Running {
    pub fn new(id: impl Into<String>, image: impl Into<String>) -> Running {
        Running { id: id.into(), image: image.into(), marker: None }
    }

    /// Marks a process run for this sandbox.
    fn mark(&self, command: &mut Command) {
        if let Some(marker) = &self.marker {
            command.env(crate::tools::orphans::MARKER, marker);
        }
    }
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
    /// The process that runs `command` with `sh -c` in the sandbox with its stdin attached,
    /// for the caller to spawn and supervise (a remote subagent).
    fn attach(&self, sandbox: &Running, command: &str) -> Result<Command, DriverError>;
    /// Whether images mean anything to it: when not, every image is available at once.
    fn has_images(&self) -> bool {
        true
    }
    /// Whether commands are isolated from the host (`unsandboxed` is its negation).
    fn isolated(&self) -> bool;
}

/// A command for `program` that dies with the thread that starts it when `setpriv` is given
/// (`setpriv --pdeathsig KILL -- program`; see `tools/orphans.rs`), so a server killed with
/// SIGKILL leaves no sandbox command behind.
pub fn dying_with_server(program: impl AsRef<std::ffi::OsStr>, setpriv: Option<&std::path::Path>) -> Command {
    match setpriv {
        Some(setpriv) => {
            let mut wrapped = Command::new(setpriv);
            wrapped.args(["--pdeathsig", "KILL", "--"]).arg(program);
            wrapped
        }
        None => Command::new(program),
    }
}

/// What a process left: its exit code (`None` when killed), stdout and stderr.
pub(crate) struct Ran {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `command` in a process group of its own, its output captured; past `timeout` the
/// whole group is killed.
pub(crate) fn capture(mut command: Command, timeout: Option<Duration>) -> std::io::Result<Ran> {
    let mut child =
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0).spawn()?;
    let (mut stdout, mut stderr) = (child.stdout.take(), child.stderr.take());
    let out = std::thread::spawn(move || read_all(stdout.as_mut()));
    let err = std::thread::spawn(move || read_all(stderr.as_mut()));
    let code = wait(child, timeout);
    let (stdout, stderr) = (out.join().unwrap_or_default(), err.join().unwrap_or_default());
    Ok(Ran { code, stdout, stderr })
}

fn read_all(pipe: Option<&mut impl Read>) -> String {
    let mut text = String::new();
    if let Some(pipe) = pipe {
        let _ = pipe.read_to_string(&mut text);
    }
    text
}

/// How a supervised process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// It exited; `None` when a signal ended it.
    Exited(Option<i32>),
    TimedOut,
    /// The caller asked (or went away).
    Cancelled,
}

/// What a supervised process left: its output, each cut at the cap on a UTF-8 boundary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Supervised {
    pub ending: Ending,
    pub stdout: String,
    pub stderr: String,
    /// Whether either output was cut.
    pub truncated: bool,
}

/// Runs `command` in a process group of its own: `stdin` written to it (then closed), its
/// output kept up to `cap` bytes each (the rest read and dropped, so it never blocks), and the
/// whole group killed past `timeout` or once `cancel` fires or is dropped.
pub fn supervise(
    mut command: Command,
    stdin: Option<Vec<u8>>,
    timeout: Duration,
    cancel: &crossbeam_channel::Receiver<()>,
    cap: usize,
) -> std::io::Result<Supervised> {
    let input = if stdin.is_some() { Stdio::piped() } else { Stdio::null() };
    let mut child = command.stdin(input).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0).spawn()?;
    if let (Some(mut pipe), Some(bytes)) = (child.stdin.take(), stdin) {
        // A child that never reads its stdin must not hold the supervisor up.
        std::thread::spawn(move || {
            let _ = std::io::Write::write_all(&mut pipe, &bytes);
        });
    }
    let (mut stdout, mut stderr) = (child.stdout.take(), child.stderr.take());
    let out = std::thread::spawn(move || read_capped(stdout.as_mut(), cap));
    let err = std::thread::spawn(move || read_capped(stderr.as_mut(), cap));
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let (exited_tx, exited) = crossbeam_channel::bounded(1);
    std::thread::spawn(move || {
        let _ = exited_tx.send(child.wait().ok().and_then(|status| status.code()));
    });
    let ending = crossbeam_channel::select! {
        recv(exited) -> code => Ending::Exited(code.ok().flatten()),
        recv(cancel) -> _ => Ending::Cancelled,
        default(timeout) => Ending::TimedOut,
    };
    if !matches!(ending, Ending::Exited(_)) {
        let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
        let _ = exited.recv();
    }
    let ((stdout, cut_out), (stderr, cut_err)) = (out.join().unwrap_or_default(), err.join().unwrap_or_default());
    Ok(Supervised { ending, stdout, stderr, truncated: cut_out || cut_err })
}

/// Reads a pipe to its end, keeping the first `cap` bytes (cut back to a UTF-8 boundary);
/// whether anything was dropped.
fn read_capped(pipe: Option<&mut impl Read>, cap: usize) -> (String, bool) {
    let Some(pipe) = pipe else { return (String::new(), false) };
    let mut kept = Vec::new();
    let _ = pipe.by_ref().take(cap as u64).read_to_end(&mut kept);
    let mut rest = 0u64;
    if let Ok(more) = std::io::copy(pipe, &mut std::io::sink()) {
        rest = more;
    }
    let mut truncated = rest > 0;
    let end = match std::str::from_utf8(&kept) {
        Ok(_) => kept.len(),
        Err(error) if error.error_len().is_none() && truncated => error.valid_up_to(),
        Err(_) => kept.len(),
    };
    if end < kept.len() {
        kept.truncate(end);
        truncated = true;
    }
    (String::from_utf8_lossy(&kept).into_owned(), truncated)
}

/// Waits for the child, killing its group past `timeout`; its exit code, `None` if killed.
fn wait(mut child: std::process::Child, timeout: Option<Duration>) -> Option<i32> {
    let Some(timeout) = timeout else { return child.wait().ok().and_then(|s| s.code()) };
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let (exited_tx, exited) = crossbeam_channel::bounded(1);
    std::thread::spawn(move || {
        let _ = exited_tx.send(child.wait().ok().and_then(|status| status.code()));
    });
    match exited.recv_timeout(timeout) {
        Ok(code) => code,
        Err(_) => {
            // The whole group: nothing the process started keeps its pipes open.
            let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = exited.recv();
            None
        }
    }
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
