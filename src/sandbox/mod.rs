//! Sandboxes for BAE sessions: a driver that can make sure an image is there, start a
//! sandbox from it, run a command in it, and stop it. `docker.rs` drives the `docker` CLI as
//! BAE does; `local.rs` is for hosts with no container engine (bubblewrap, or honestly
//! unsandboxed); `bwrap.rs` holds bubblewrap's layouts and its probe, which `run_command`'s
//! sandbox (`tools/sandbox.rs`) shares; `provision.rs` makes profiles' images ready in the
//! background. The JSON-RPC methods are in `api/bae/core/sandbox.rs`, remote subagents in
//! `api/bae/core/subagent.rs`.

pub mod bwrap;
pub mod docker;
pub mod local;
pub mod provision;

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

/// What a command run in a sandbox left: its output as text (bytes that are not UTF-8 become
/// U+FFFD, as BAE's own driver converts them), each stream cut at the output cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    pub stdout: String,
    pub stderr: String,
    /// -1 when the command was killed (a timeout, a cancel).
    pub exit_code: i32,
    /// Whether either stream was cut at the cap (or left unread by a process that escaped).
    pub truncated: bool,
}

/// A running sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    pub id: String,
    pub image: String,
    /// The `KESTREL_COMMAND` value every process run for it starts with (`tools/orphans.rs`),
    /// so the sweep at start and shutdown finds what a killed server left; set by its owner.
    pub marker: Option<String>,
}

impl Running {
    pub fn new(id: impl Into<String>, image: impl Into<String>) -> Running {
        Running { id: id.into(), image: image.into(), marker: None }
    }

    /// A marker for one process run in this sandbox: the sandbox's, plus a part of its own,
    /// so what that one process left can be killed without touching the others.
    pub fn process_marker(&self) -> String {
        let own = uuid::Uuid::new_v4().simple().to_string();
        match &self.marker {
            Some(marker) => format!("{marker}:{own}"),
            None => format!("sandbox-{}:{own}", self.id),
        }
    }

    /// Whether `value` marks a process run in this sandbox.
    pub fn marks(&self, value: &str) -> bool {
        let prefix = self.marker.clone().unwrap_or_else(|| format!("sandbox-{}", self.id));
        value.strip_prefix(&prefix).is_some_and(|rest| rest.starts_with(':'))
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

/// A command for a sandbox: `text` run with `sh -c`, `args` its positional parameters
/// (`$1`…), `marker` its `KESTREL_COMMAND` value; with `stdin` its input is attached.
pub struct Script<'a> {
    pub text: &'a str,
    pub args: &'a [String],
    pub marker: &'a str,
    pub stdin: bool,
}

/// How long one command may run and how much of each output stream is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecLimits {
    pub timeout: Duration,
    pub output_cap: usize,
}

/// A sandbox driver.
pub trait Driver: Send + Sync {
    /// Makes sure `image` is present (pulling it if not). A message on `cancel`, or its
    /// sender dropped, stops it (what it ran is killed) and it answers an error.
    fn ensure_image(&self, image: &str, cancel: &Receiver<()>) -> Result<(), DriverError>;
    /// Starts a sandbox from `image`, stopped by `cancel` as `ensure_image` is.
    fn start(&self, image: &str, cancel: &Receiver<()>) -> Result<Running, DriverError>;
    fn stop(&self, sandbox: &Running) -> Result<(), DriverError>;
    /// The process that runs `script` in the sandbox, from a scrubbed environment. The caller
    /// spawns and supervises it.
    fn process(&self, sandbox: &Running, script: &Script<'_>) -> Result<Command, DriverError>;
    /// Kills what a process started with `marker` left running in the sandbox once it ended
    /// (`ending`): everything, where a sandbox's commands end with their shell (the local
    /// driver); only after a kill, where a container keeps what a finished command started.
    fn reap(&self, sandbox: &Running, marker: &str, ending: Ending);
    /// Whether images mean anything to it: when not, every image is available at once.
    fn has_images(&self) -> bool {
        true
    }
    /// Whether commands are isolated from the host (`unsandboxed` is its negation).
    fn isolated(&self) -> bool;
}

/// Runs `command` with `sh -c` in the sandbox: output capped at `limits.output_cap` per
/// stream, the process and everything it started killed past `limits.timeout`.
pub fn exec(
    driver: &dyn Driver,
    sandbox: &Running,
    command: &str,
    limits: ExecLimits,
) -> Result<ExecOutput, DriverError> {
    exec_until(driver, sandbox, command, limits, &crossbeam_channel::never())
}

/// `exec`, also killed (and what it started reaped) as soon as `cancel` fires: a message, or
/// its sender dropped (a turn's `CancelToken`: the turn was cancelled, its session closed, or
/// the server is stopping).
pub fn exec_until(
    driver: &dyn Driver,
    sandbox: &Running,
    command: &str,
    limits: ExecLimits,
    cancel: &Receiver<()>,
) -> Result<ExecOutput, DriverError> {
    let marker = sandbox.process_marker();
    let process = driver.process(sandbox, &Script { text: command, args: &[], marker: &marker, stdin: false })?;
    let reap = |ending: Ending| driver.reap(sandbox, &marker, ending);
    let ran = supervise(process, None, limits.timeout, cancel, limits.output_cap, &reap)
        .map_err(|e| DriverError(format!("cannot run the command: {e}")))?;
    let exit_code = match ran.ending {
        Ending::Exited(code) => code.unwrap_or(-1),
        Ending::TimedOut | Ending::Cancelled => -1,
    };
    Ok(ExecOutput { stdout: ran.stdout, stderr: ran.stderr, exit_code, truncated: ran.truncated })
}

/// The search path every sandbox-side process gets.
pub const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Variables of the server's own environment a sandbox-side process may see: locale and
/// terminal only. Nothing else passes (no token, no provider key, no `api_key_env` value).
const PASSED_ENV: &[&str] = &["LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ"];

/// Starts `command` from an empty environment: `PATH`, `HOME`, the locale and terminal
/// variables the server has, and `extra` names a driver needs passed (a container CLI's
/// `DOCKER_HOST`), each only when the server has it.
pub fn scrub_env(command: &mut Command, home: &std::path::Path, extra: &[&str]) {
    command.env_clear().env("PATH", SANDBOX_PATH).env("HOME", home);
    for name in PASSED_ENV.iter().chain(extra) {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    if std::env::var_os("LANG").is_none() {
        command.env("LANG", "C.UTF-8");
    }
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

/// Runs a driver's own CLI step (`docker pull`, `docker stop`) in a process group of its own,
/// its output captured up to `DETAIL_CAP` bytes a stream; past `timeout` the group is killed.
/// A message on `cancel` (or its sender dropped) kills it too.
pub(crate) fn capture(command: Command, timeout: Option<Duration>, cancel: &Receiver<()>) -> std::io::Result<Ran> {
    // A pull may take long; "no timeout" is a day, not forever.
    let timeout = timeout.unwrap_or(Duration::from_secs(24 * 60 * 60));
    let ran = supervise(command, None, timeout, cancel, DETAIL_CAP, &|_| {})?;
    let code = match ran.ending {
        Ending::Exited(code) => code,
        _ => None,
    };
    Ok(Ran { code, stdout: ran.stdout, stderr: ran.stderr })
}

/// What a driver's CLI step keeps of each output stream.
const DETAIL_CAP: usize = 64 * 1024;

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

/// How long the output readers are waited for once the process ended and what it left was
/// killed: a pipe still open after that is held by a process that escaped every kill.
const READER_GRACE: Duration = Duration::from_secs(2);

/// Runs `command` in a process group of its own: `stdin` written to it (then closed), its
/// output kept up to `cap` bytes each (the rest read and dropped, so it never blocks), the
/// whole group killed past `timeout` or once `cancel` fires or is dropped. Once it ended,
/// `reap` kills what it left outside its group; the readers are waited for at most
/// `READER_GRACE` more, so nothing it started can hold the caller past its deadline.
pub fn supervise(
    mut command: Command,
    stdin: Option<Vec<u8>>,
    timeout: Duration,
    cancel: &Receiver<()>,
    cap: usize,
    reap: &dyn Fn(Ending),
) -> std::io::Result<Supervised> {
    let input = if stdin.is_some() { Stdio::piped() } else { Stdio::null() };
    let mut child = command.stdin(input).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0).spawn()?;
    drop(command);
    if let (Some(mut pipe), Some(bytes)) = (child.stdin.take(), stdin) {
        // A child that never reads its stdin must not hold the supervisor up.
        std::thread::Builder::new().name("kestrel-cmd-in".into()).spawn(move || {
            let _ = std::io::Write::write_all(&mut pipe, &bytes);
        })?;
    }
    let out = Captured::read(child.stdout.take(), cap)?;
    let err = Captured::read(child.stderr.take(), cap)?;
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let (exited_tx, exited) = crossbeam_channel::bounded(1);
    std::thread::Builder::new().name("kestrel-cmd-wait".into()).spawn(move || {
        let _ = exited_tx.send(child.wait().ok().and_then(|status| status.code()));
    })?;
    let ending = crossbeam_channel::select! {
        recv(exited) -> code => Ending::Exited(code.ok().flatten()),
        recv(cancel) -> _ => Ending::Cancelled,
        default(timeout) => Ending::TimedOut,
    };
    if !matches!(ending, Ending::Exited(_)) {
        let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
        let _ = exited.recv();
    }
    reap(ending);
    let deadline = Instant::now() + READER_GRACE;
    let (stdout, cut_out) = out.finish(deadline);
    let (stderr, cut_err) = err.finish(deadline);
    Ok(Supervised { ending, stdout, stderr, truncated: cut_out || cut_err })
}

/// One output pipe drained by a `kestrel-cmd-out` thread into a capped buffer.
struct Captured {
    state: Arc<Mutex<Capture>>,
    done: Receiver<()>,
}

#[derive(Default)]
struct Capture {
    kept: Vec<u8>,
    dropped: u64,
}

impl Captured {
    fn read(pipe: Option<impl Read + Send + 'static>, cap: usize) -> std::io::Result<Captured> {
        let state = Arc::new(Mutex::new(Capture::default()));
        let (done_tx, done) = crossbeam_channel::bounded(1);
        let Some(mut pipe) = pipe else { return Ok(Captured { state, done }) };
        let filled = Arc::clone(&state);
        std::thread::Builder::new().name("kestrel-cmd-out".into()).spawn(move || {
            let mut buffer = [0u8; 16 * 1024];
            loop {
                match pipe.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let mut capture = filled.lock().unwrap_or_else(PoisonError::into_inner);
                        let room = cap.saturating_sub(capture.kept.len()).min(n);
                        capture.kept.extend_from_slice(&buffer[..room]);
                        capture.dropped += (n - room) as u64;
                    }
                }
            }
            drop(done_tx);
        })?;
        Ok(Captured { state, done })
    }

    /// The text kept, waiting for the pipe's end until `deadline`, and whether anything was
    /// dropped (or the pipe was still open at the deadline).
    fn finish(self, deadline: Instant) -> (String, bool) {
        let ended = !matches!(self.done.recv_deadline(deadline), Err(crossbeam_channel::RecvTimeoutError::Timeout));
        let capture = std::mem::take(&mut *self.state.lock().unwrap_or_else(PoisonError::into_inner));
        let (text, cut) = text_of(capture.kept, capture.dropped > 0);
        (text, cut || !ended)
    }
}

/// Bytes as text: a character the cap cut in half is dropped (and counts as a cut); any
/// other byte that is not UTF-8 becomes U+FFFD.
fn text_of(mut kept: Vec<u8>, truncated: bool) -> (String, bool) {
    if truncated {
        if let Err(error) = std::str::from_utf8(&kept) {
            if error.error_len().is_none() {
                kept.truncate(error.valid_up_to());
            }
        }
    }
    (String::from_utf8_lossy(&kept).into_owned(), truncated)
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
