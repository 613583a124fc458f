//! MCP over stdio: the server is a child process speaking newline-delimited JSON-RPC on its
//! stdin and stdout (its stderr is discarded). A reader thread turns stdout lines into JSON,
//! skipping lines that are not; answers are matched by id; EOF ends the connection. The child
//! runs in a process group of its own, killed when the connection is dropped.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio as Pipe};
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

use super::{outcome, McpError, Transport};

pub struct Stdio {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<Value>,
    next_id: u64,
}

impl Stdio {
    pub fn spawn(command: &str, args: &[String]) -> Result<Stdio, McpError> {
        let mut child = Command::new(command)
            .args(args)
            .stdin(Pipe::piped())
            .stdout(Pipe::piped())
            .stderr(Pipe::null())
            .process_group(0)
            .spawn()
            .map_err(|e| McpError::Transport(format!("cannot start {command}: {e}")))?;
        let (stdin, stdout) = match (child.stdin.take(), child.stdout.take()) {
            (Some(stdin), Some(stdout)) => (stdin, stdout),
            _ => return Err(McpError::Transport("the MCP server's pipes could not be opened".into())),
        };
        let (line_tx, lines) = unbounded();
        let reader = std::thread::Builder::new().name("kestrel-mcp".into()).spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                // Anything that is not JSON is not for us (a banner, a log line).
                if let Ok(value) = serde_json::from_str::<Value>(&line) {
                    if line_tx.send(value).is_err() {
                        return;
                    }
                }
            }
        });
        if let Err(error) = reader {
            let _ = child.kill();
            return Err(McpError::Transport(format!("cannot start a reader: {error}")));
        }
        Ok(Stdio { child, stdin, lines, next_id: 1 })
    }

    fn send(&mut self, message: &Value) -> Result<(), McpError> {
        let mut line = message.to_string();
        line.push('\n');
        self.stdin
            .write_all(line.as_bytes())
            .and_then(|()| self.stdin.flush())
            .map_err(|e| McpError::Transport(format!("the MCP server went away: {e}")))
    }
}

impl Transport for Stdio {
    fn request(&mut self, method: &str, params: Value, timeout: Duration) -> Result<Value, McpError> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }))?;
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                // Other ids (a late answer to a timed-out call) and server requests are skipped.
                Ok(answer) if answer["id"].as_u64() == Some(id) && answer.get("method").is_none() => {
                    return outcome(answer)
                }
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => return Err(McpError::Timeout(timeout)),
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(McpError::Transport("the MCP server closed its output (it may have crashed)".into()))
                }
            }
        }
    }

    fn notify(&mut self, method: &str, params: Value) -> Result<(), McpError> {
        self.send(&json!({ "jsonrpc": "2.0", "method": method, "params": params }))
    }
}

impl Drop for Stdio {
    fn drop(&mut self) {
        // The whole group: whatever the server started goes with it.
        let _ = killpg(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
        let _ = self.child.wait();
    }
}
