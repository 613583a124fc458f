//! A child process a tool runs: in a process group of its own, marked so it cannot outlive
//! the server (`orphans.rs`), without the server's secrets in its environment, its output
//! pipes drained into capped buffers by reader threads, and its whole group (and whatever
//! left the group carrying its marker) killed on cancel or timeout. `run_command` and plugin
//! tools both run this way.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use super::orphans;
use crate::engine::tools::ToolContext;

/// Output kept from one pipe; the rest is counted and dropped.
pub const OUTPUT_CAP: usize = 30_000;

/// How a process ended.
pub enum Ending {
    Exited(Option<i32>),
    TimedOut,
    Cancelled,
}

/// What a process left: how it ended, each pipe's text and dropped byte count, and how long
/// it took.
pub struct Finished {
    pub ending: Ending,
    pub outputs: Vec<(String, usize)>,
    pub duration_ms: u64,
}

impl Finished {
    pub fn exit_code(&self) -> Option<i32> {
        match self.ending {
            Ending::Exited(code) => code,
            _ => None,
        }
    }
}

/// How a tool's processes are started.
#[derive(Clone, Default)]
pub struct Launcher {
    /// Environment variables removed from the process's environment (tokens, API keys).
    pub hidden_env: Vec<String>,
    /// `setpriv`: the process then dies with the thread that started it (`orphans.rs`).
    pub death_signal_wrapper: Option<PathBuf>,
}

/// Which pipes a process writes to.
pub enum Pipes {
    /// stdout and stderr on one pipe, interleaved as written.
    Merged,
    /// stdout and stderr apart (in that order in `Finished::outputs`).
    Apart,
}

impl Launcher {
    /// `program` with `args` in the workspace, `stdin` written to it (then closed).
    pub fn command(
        &self,
        program: impl AsRef<std::ffi::OsStr>,
        args: &[impl AsRef<std::ffi::OsStr>],
        context: &ToolContext<'_>,
    ) -> Command {
        let mut command = match &self.death_signal_wrapper {
            Some(setpriv) => {
                let mut wrapped = Command::new(setpriv);
                wrapped.args(["--pdeathsig", "KILL", "--"]).arg(program);
                wrapped
            }
            None => Command::new(program),
        };
        command
            .args(args)
            .env(orphans::MARKER, orphans::marker_value(context.session_id, context.call_id))
            .current_dir(context.workspace.root())
            .process_group(0);
        for name in &self.hidden_env {
            command.env_remove(name);
        }
        command
    }

    /// Runs `command` to its end, its timeout or the cancel.
    pub fn run(
        &self,
        mut command: Command,
        stdin: Option<Vec<u8>>,
        pipes: Pipes,
        timeout: Duration,
        context: &ToolContext<'_>,
    ) -> std::io::Result<Finished> {
        let started = Instant::now();
        let mut readers = Vec::new();
        let (out_reader, out_writer) = std::io::pipe()?;
        readers.push(out_reader);
        match pipes {
            Pipes::Merged => {
                command.stdout(Stdio::from(out_writer.try_clone()?)).stderr(Stdio::from(out_writer));
            }
            Pipes::Apart => {
                let (err_reader, err_writer) = std::io::pipe()?;
                readers.push(err_reader);
                command.stdout(Stdio::from(out_writer)).stderr(Stdio::from(err_writer));
            }
        }
        command.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        let mut child = command.spawn()?;
        drop(command); // closes our copies of the pipes' write ends, so EOF comes when the child's do
        let group = Pid::from_raw(child.id() as i32);
        if let (Some(bytes), Some(mut input)) = (stdin, child.stdin.take()) {
            std::thread::Builder::new().name("kestrel-cmd-in".into()).spawn(move || {
                let _ = input.write_all(&bytes);
            })?;
        }
        let outputs: Vec<Receiver<(String, usize)>> = readers.into_iter().map(drain).collect::<std::io::Result<_>>()?;
        let (exit_tx, exit_rx) = bounded(1);
        std::thread::Builder::new().name("kestrel-cmd-wait".into()).spawn(move || {
            let _ = exit_tx.send(child.wait().ok().and_then(|status| status.code()));
        })?;
        let ending = select! {
            recv(exit_rx) -> code => Ending::Exited(code.ok().flatten()),
            recv(context.cancel.receiver()) -> _ => Ending::Cancelled,
            default(timeout) => Ending::TimedOut,
        };
        if !matches!(ending, Ending::Exited(_)) {
            // The whole group: a shell's children die with it.
            let _ = killpg(group, Signal::SIGKILL);
            let _ = exit_rx.recv_timeout(Duration::from_secs(5));
            // And what left the group (`setsid`, a daemon) but still carries the call's
            // marker. In a sandbox nothing can: its PID namespace died with the shell.
            let marker = orphans::marker_value(context.session_id, context.call_id);
            orphans::kill_marked(&|value| value == marker, true);
        }
        // A daemon that left the group may hold a pipe open; do not wait for it forever.
        let outputs = outputs.iter().map(|o| o.recv_timeout(Duration::from_secs(2)).unwrap_or_default()).collect();
        Ok(Finished { ending, outputs, duration_ms: started.elapsed().as_millis() as u64 })
    }
}

/// A reader thread that drains a pipe into a capped buffer.
fn drain(reader: std::io::PipeReader) -> std::io::Result<Receiver<(String, usize)>> {
    let (output_tx, output_rx) = bounded(1);
    std::thread::Builder::new().name("kestrel-cmd-out".into()).spawn(move || {
        let _ = output_tx.send(read_capped(reader));
    })?;
    Ok(output_rx)
}

/// Reads to the end, keeping the first `OUTPUT_CAP` bytes; returns the text and how many bytes
/// were dropped.
fn read_capped(mut reader: impl Read) -> (String, usize) {
    let mut kept = Vec::new();
    let mut dropped = 0;
    let mut buffer = [0u8; 8192];
    loop {
        match reader.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = OUTPUT_CAP.saturating_sub(kept.len()).min(n);
                kept.extend_from_slice(&buffer[..room]);
                dropped += n - room;
            }
        }
    }
    (String::from_utf8_lossy(&kept).into_owned(), dropped)
}
