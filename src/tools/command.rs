//! run_command: a shell command in the workspace, with a timeout, capped interleaved output,
//! and its whole process group killed on cancel or timeout.
//!
//! The command runs under `/bin/sh -c` in a process group of its own, marked so that it cannot
//! outlive the server (`orphans.rs`), with stdout and stderr on one pipe (so they interleave as the command wrote them) and without the server's
//! secrets in its environment. A reader thread drains the pipe into a capped buffer; a waiter
//! thread reaps the child; the run's worker waits on both, its cancel token and the clock.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::{json, Map, Value};

use super::args::Args;
use super::orphans;
use super::schema;
use crate::domain::ToolSchema;
use crate::engine::tools::{Permission, Tool, ToolContext, ToolOutput};

/// Output kept from one command; the rest is counted and dropped.
const OUTPUT_CAP: usize = 30_000;

pub struct RunCommand {
    pub default_timeout: Duration,
    pub max_timeout: Duration,
    /// Environment variables removed from the command's environment (tokens, API keys).
    pub hidden_env: Vec<String>,
    /// `setpriv`: the shell then dies with the thread that started it (`orphans.rs`).
    pub death_signal_wrapper: Option<PathBuf>,
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

    fn run(&self, arguments: &Map<String, Value>, context: &ToolContext<'_>) -> Result<ToolOutput, String> {
        let args = Args::new(arguments);
        let command = args.string("command")?;
        let timeout = args.optional_u64("timeoutSecs")?.map(Duration::from_secs).unwrap_or(self.default_timeout);
        self.execute(command, timeout.min(self.max_timeout), context)
            .map_err(|error| format!("cannot run the command: {error}"))
    }
}

enum Ending {
    Exited(Option<i32>),
    TimedOut,
    Cancelled,
}

impl RunCommand {
    fn execute(&self, command: &str, timeout: Duration, context: &ToolContext<'_>) -> std::io::Result<ToolOutput> {
        let started = Instant::now();
        let (reader, writer) = std::io::pipe()?;
        let mut shell = match &self.death_signal_wrapper {
            Some(setpriv) => {
                let mut wrapped = Command::new(setpriv);
                wrapped.args(["--pdeathsig", "KILL", "--", "/bin/sh"]);
                wrapped
            }
            None => Command::new("/bin/sh"),
        };
        shell
            .arg("-c")
            .arg(command)
            .env(orphans::MARKER, orphans::marker_value(context.session_id, context.call_id))
            .current_dir(context.workspace.root())
            .stdin(Stdio::null())
            .stdout(Stdio::from(writer.try_clone()?))
            .stderr(Stdio::from(writer))
            .process_group(0);
        for name in &self.hidden_env {
            shell.env_remove(name);
        }
        let mut child = shell.spawn()?;
        drop(shell); // closes our copies of the pipe's write end, so EOF comes when the command's do
        let group = Pid::from_raw(child.id() as i32);

        let (output_tx, output_rx) = bounded(1);
        std::thread::Builder::new().name("kestrel-cmd-out".into()).spawn(move || {
            let _ = output_tx.send(read_capped(reader));
        })?;
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
        }
        // A daemon that left the group may hold the pipe open; do not wait for it forever.
        let (output, dropped) = output_rx.recv_timeout(Duration::from_secs(2)).unwrap_or_default();
        let duration_ms = started.elapsed().as_millis() as u64;
        let mut content = match &ending {
            Ending::Exited(Some(code)) => format!("exit code {code}\n"),
            Ending::Exited(None) => "killed by a signal\n".to_string(),
            Ending::TimedOut => format!("timed out after {} s; the command was killed\n", timeout.as_secs()),
            Ending::Cancelled => "cancelled; the command was killed\n".to_string(),
        };
        content.push_str(&output);
        if dropped > 0 {
            content.push_str(&format!("\n[output truncated: {dropped} more bytes]"));
        }
        let exit_code = match ending {
            Ending::Exited(code) => code,
            _ => None,
        };
        let data = json!({
            "exitCode": exit_code,
            "timedOut": matches!(ending, Ending::TimedOut),
            "cancelled": matches!(ending, Ending::Cancelled),
            "durationMs": duration_ms,
            "truncated": dropped > 0,
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
