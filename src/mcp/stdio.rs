//! MCP over stdio: the server is a child process speaking newline-delimited JSON-RPC on its
//! stdin and stdout (its stderr is discarded).
//!
//! The child starts from a scrubbed environment (`PATH`, `HOME`, `USER`, `LOGNAME`, `TMPDIR`,
//! the locale and terminal variables, then the server's configured `env`), never the server's
//! own secrets; in a process group of its own, under `setpriv --pdeathsig KILL` where that
//! works, and carrying a `KESTREL_COMMAND` marker of its own. Closing the connection kills the
//! group and every process carrying the marker (a `setsid` grandchild included).
//!
//! A `kestrel-mcp` reader thread reads stdout a line at a time, each line at most
//! `MESSAGE_LIMIT` bytes, and hands each answer to the request waiting for its id; anything
//! else (a notification, a late answer, a line that is not JSON) is dropped as it is read, so a
//! flood costs no memory. A line over the limit, or the end of the output, breaks the
//! connection: the tree is killed and every waiting request ends with the reason.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio as Pipe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crossbeam_channel::{bounded, select, Receiver, Sender};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

use super::{outcome, McpError, Spawning, Transport, MESSAGE_LIMIT};
use crate::tools::spawner::Spawner;

/// The server's own environment variables a stdio server may see.
const PASSED_ENV: &[&str] = &["PATH", "HOME", "USER", "LOGNAME", "TMPDIR", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ"];

/// Requests waiting for an answer, by id; the reader empties it when the connection breaks.
type Waiting = Arc<Mutex<Option<HashMap<u64, Sender<Value>>>>>;

pub struct Stdio {
    child: Mutex<Child>,
    group: Pid,
    marker: String,
    stdin: Mutex<ChildStdin>,
    waiting: Waiting,
    /// Why the reader stopped, once it has.
    broken: Arc<Mutex<Option<String>>>,
    next_id: AtomicU64,
}

impl Stdio {
    pub fn spawn(
        command: &str,
        args: &[String],
        env: &[(String, String)],
        spawning: &Spawning,
    ) -> Result<Stdio, McpError> {
        let marker = format!("{}:mcp-{}", spawning.marker, uuid::Uuid::new_v4().simple());
        let mut process = crate::sandbox::dying_with_server(command, spawning.setpriv.as_deref());
        process.args(args).env_clear();
        for name in PASSED_ENV {
            if let Some(value) = std::env::var_os(name) {
                process.env(name, value);
            }
        }
        process.envs(env.iter().map(|(name, value)| (name, value)));
        process.env(crate::tools::orphans::MARKER, &marker);
        let mut child = start(process, command, spawning.spawner.as_ref())?;
        let (stdin, stdout) = match (child.stdin.take(), child.stdout.take()) {
            (Some(stdin), Some(stdout)) => (stdin, stdout),
            _ => {
                let _ = child.kill();
                return Err(McpError::Transport("the MCP server's pipes could not be opened".into()));
            }
        };
        let group = Pid::from_raw(child.id() as i32);
        let waiting: Waiting = Arc::new(Mutex::new(Some(HashMap::new())));
        let broken = Arc::new(Mutex::new(None));
        let reader =
            Reader { waiting: Arc::clone(&waiting), broken: Arc::clone(&broken), group, marker: marker.clone() };
        if let Err(error) = std::thread::Builder::new().name("kestrel-mcp".into()).spawn(move || reader.run(stdout)) {
            let _ = child.kill();
            return Err(McpError::Transport(format!("cannot start a reader: {error}")));
        }
        let stdio = Stdio {
            child: Mutex::new(child),
            group,
            marker,
            stdin: Mutex::new(stdin),
            waiting,
            broken,
            next_id: AtomicU64::new(1),
        };
        Ok(stdio)
    }

    fn send(&self, message: &Value) -> Result<(), McpError> {
        let mut line = message.to_string();
        line.push('\n');
        let mut stdin = self.stdin.lock().unwrap_or_else(PoisonError::into_inner);
        stdin.write_all(line.as_bytes()).and_then(|()| stdin.flush()).map_err(|_| self.broken_error())
    }

    fn broken_error(&self) -> McpError {
        let why = self.broken.lock().unwrap_or_else(PoisonError::into_inner).clone();
        McpError::Transport(why.unwrap_or_else(|| "the MCP server went away".into()))
    }
}

/// Spawns the server (on the spawner's thread when there is one); a busy executable
/// (`ETXTBSY`, just written) is tried again for a while.
fn start(mut process: Command, command: &str, spawner: Option<&Spawner>) -> Result<Child, McpError> {
    process.stdin(Pipe::piped()).stdout(Pipe::piped()).stderr(Pipe::null()).process_group(0);
    let mut tries = 0;
    loop {
        let spawned = match spawner {
            Some(spawner) => spawner.spawn(clone_command(&process)),
            None => process.spawn(),
        };
        match spawned {
            Ok(child) => return Ok(child),
            Err(error) if error.raw_os_error() == Some(nix::libc::ETXTBSY) && tries < 40 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(error) => return Err(McpError::Transport(format!("cannot start {command}: {error}"))),
        }
    }
}

/// A copy of `command` (program, arguments, environment, group): the spawner takes its own.
fn clone_command(command: &Command) -> Command {
    let mut copy = Command::new(command.get_program());
    copy.args(command.get_args()).env_clear();
    for (name, value) in command.get_envs() {
        match value {
            Some(value) => copy.env(name, value),
            None => copy.env_remove(name),
        };
    }
    copy.stdin(Pipe::piped()).stdout(Pipe::piped()).stderr(Pipe::null()).process_group(0);
    copy
}

impl Transport for Stdio {
    fn request(
        &self,
        method: &str,
        params: Value,
        timeout: Duration,
        cancel: &Receiver<()>,
    ) -> Result<Value, McpError> {
        if crate::cancel::fired(cancel) {
            return Err(McpError::Cancelled);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (answer_tx, answer) = bounded(1);
        match self.waiting.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
            Some(waiting) => waiting.insert(id, answer_tx),
            None => return Err(self.broken_error()),
        };
        let sent = self.send(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }));
        let outcome_of = match sent {
            Err(error) => Err(error),
            Ok(()) => select! {
                recv(answer) -> message => match message {
                    Ok(message) => outcome(message),
                    Err(_) => Err(self.broken_error()),
                },
                recv(cancel) -> _ => Err(McpError::Cancelled),
                default(timeout) => Err(McpError::Timeout(timeout)),
            },
        };
        if let Some(waiting) = self.waiting.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
            waiting.remove(&id);
        }
        let why = match &outcome_of {
            Err(McpError::Timeout(_)) if method != "ping" => Some("timed out"),
            Err(McpError::Cancelled) => Some("cancelled"),
            _ => None,
        };
        if let Some(why) = why {
            // The server may stop the work; its late answer, if any, is dropped by the reader.
            let _ = self.notify("notifications/cancelled", json!({ "requestId": id, "reason": why }));
        }
        outcome_of
    }

    fn notify(&self, method: &str, params: Value) -> Result<(), McpError> {
        self.send(&json!({ "jsonrpc": "2.0", "method": method, "params": params }))
    }

    fn close(&self) {
        kill_tree(self.group, &self.marker);
        let mut child = self.child.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = child.wait();
    }
}

/// Kills a server's process group and every process carrying its marker.
fn kill_tree(group: Pid, marker: &str) {
    let _ = killpg(group, Signal::SIGKILL);
    crate::tools::orphans::kill_marked(&|value| value == marker, true);
}

/// The reader thread's state.
struct Reader {
    waiting: Waiting,
    broken: Arc<Mutex<Option<String>>>,
    group: Pid,
    marker: String,
}

impl Reader {
    fn run(self, stdout: ChildStdout) {
        let mut lines = BufReader::with_capacity(64 * 1024, stdout);
        let why = loop {
            match read_line(&mut lines, MESSAGE_LIMIT) {
                Ok(Some(line)) => self.deliver(&line),
                Ok(None) => break "the MCP server closed its output (it may have crashed)".to_string(),
                Err(Line::TooLong) => {
                    break format!(
                        "the MCP server sent a message longer than {MESSAGE_LIMIT} bytes; the connection was closed"
                    )
                }
                Err(Line::Io(error)) => break format!("reading from the MCP server failed: {error}"),
            }
        };
        *self.broken.lock().unwrap_or_else(PoisonError::into_inner) = Some(why);
        // Every waiting request wakes with the reason; nothing more can be waited for.
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner).take();
        kill_tree(self.group, &self.marker);
    }

    /// Hands an answer to the request waiting for its id; anything else is dropped.
    fn deliver(&self, line: &[u8]) {
        // Anything that is not JSON is not for us (a banner, a log line).
        let Ok(message) = serde_json::from_slice::<Value>(line) else { return };
        let Some(id) = message.get("id").and_then(Value::as_u64) else { return };
        if message.get("method").is_some() {
            return;
        }
        let waiter = self.waiting.lock().unwrap_or_else(PoisonError::into_inner).as_mut().and_then(|w| w.remove(&id));
        if let Some(waiter) = waiter {
            let _ = waiter.try_send(message);
        }
    }
}

enum Line {
    TooLong,
    Io(std::io::Error),
}

/// The next line without its newline, at most `limit` bytes; `None` at the end.
fn read_line(reader: &mut impl BufRead, limit: usize) -> Result<Option<Vec<u8>>, Line> {
    let mut line = Vec::new();
    loop {
        let available = match reader.fill_buf() {
            Ok(available) => available,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(Line::Io(error)),
        };
        if available.is_empty() {
            return Ok((!line.is_empty()).then_some(line));
        }
        let (taken, ended) = match available.iter().position(|&b| b == b'\n') {
            Some(at) => (at + 1, true),
            None => (available.len(), false),
        };
        if line.len() + taken > limit + 1 {
            return Err(Line::TooLong);
        }
        line.extend_from_slice(&available[..taken]);
        reader.consume(taken);
        if ended {
            line.pop();
            return Ok(Some(line));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_read_whole_and_cut_off_past_the_limit() {
        let mut reader = BufReader::with_capacity(4, &b"ab\ncdefgh\nlast"[..]);
        assert_eq!(read_line(&mut reader, 10).ok().flatten(), Some(b"ab".to_vec()));
        assert_eq!(read_line(&mut reader, 10).ok().flatten(), Some(b"cdefgh".to_vec()));
        assert_eq!(read_line(&mut reader, 10).ok().flatten(), Some(b"last".to_vec()));
        assert!(matches!(read_line(&mut reader, 10), Ok(None)));
        let mut long = BufReader::with_capacity(4, &b"0123456789abc\n"[..]);
        assert!(matches!(read_line(&mut long, 10), Err(Line::TooLong)));
    }
}
