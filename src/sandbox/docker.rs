//! The Docker driver: the `docker` CLI, with BAE's command lines.
//!
//! - ensure: `docker image inspect <image>`, and if that fails `docker pull <image>`;
//! - start: `docker run -d --rm <image> sleep infinity`; the trimmed stdout is the id (empty is
//!   an error);
//! - exec: `docker exec <id> sh -c <command>`, killed past its timeout (exit code -1; BAE has
//!   no timeout, Kestrel's is configurable);
//! - stop: `docker stop <id>`; "no such container" counts as stopped;
//! - a remote subagent: `docker exec -i <id> sh -c <command>`, its prompt on stdin.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::{capture, detail, Driver, DriverError, ExecOutput, Ran, Running};

#[derive(Default)]
pub struct Docker {
    /// The CLI: `docker` from PATH unless configured.
    pub program: PathBuf,
    /// `setpriv`, if it works here: each CLI process then dies with the server.
    pub setpriv: Option<PathBuf>,
}

impl Docker {
    fn run(&self, args: &[&str], timeout: Option<Duration>) -> Result<Ran, DriverError> {
        let mut command = super::dying_with_server(&self.program, self.setpriv.as_deref());
        command.args(args);
        capture(command, timeout).map_err(|e| DriverError(format!("cannot run {}: {e}", self.program.display())))
    }

    fn checked(&self, args: &[&str]) -> Result<Ran, DriverError> {
        let ran = self.run(args, None)?;
        match ran.code {
            Some(0) => Ok(ran),
            _ => Err(DriverError(detail(&ran.stderr, &ran.stdout))),
        }
    }
}

impl Driver for Docker {
    fn ensure_image(&self, image: &str) -> Result<(), DriverError> {
        if self.run(&["image", "inspect", image], None)?.code == Some(0) {
            return Ok(());
        }
        self.checked(&["pull", image]).map(|_| ())
    }

    fn start(&self, image: &str) -> Result<Running, DriverError> {
        let ran = self.checked(&["run", "-d", "--rm", image, "sleep", "infinity"])?;
        match ran.stdout.trim() {
            "" => Err(DriverError("docker run printed no container id".into())),
            id => Ok(Running::new(id, image)),
        }
    }

    fn exec(&self, sandbox: &Running, command: &str, timeout: Duration) -> Result<ExecOutput, DriverError> {
        let mut process = super::dying_with_server(&self.program, self.setpriv.as_deref());
        process.args(["exec", &sandbox.id, "sh", "-c", command]);
        sandbox.mark(&mut process);
        let ran = capture(process, Some(timeout))
            .map_err(|e| DriverError(format!("cannot run {}: {e}", self.program.display())))?;
        Ok(ExecOutput { stdout: ran.stdout, stderr: ran.stderr, exit_code: ran.code.unwrap_or(-1) })
    }

    fn attach(&self, sandbox: &Running, command: &str) -> Result<Command, DriverError> {
        let mut process = super::dying_with_server(&self.program, self.setpriv.as_deref());
        process.args(["exec", "-i", &sandbox.id, "sh", "-c", command]);
        sandbox.mark(&mut process);
        Ok(process)
    }

    fn isolated(&self) -> bool {
        true
    }

    fn stop(&self, sandbox: &Running) -> Result<(), DriverError> {
        let ran = self.run(&["stop", &sandbox.id], None)?;
        if ran.code == Some(0) || ran.stderr.to_ascii_lowercase().contains("no such container") {
            return Ok(());
        }
        Err(DriverError(detail(&ran.stderr, &ran.stdout)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A `docker` that records its arguments and answers like the real CLI.
    fn fake_docker(dir: &std::path::Path) -> (Docker, PathBuf) {
        let log = dir.join("calls.log");
        let script = format!(
            r#"#!/bin/sh
echo "$*" >> {log}
case "$1" in
  image) [ "$3" = "present:1" ] && exit 0; echo "Error: No such image: $3" >&2; exit 1 ;;
  pull) [ "$2" = "missing:1" ] && {{ echo "Error response from daemon: manifest unknown" >&2; exit 1; }}; echo "pulled"; exit 0 ;;
  run) echo "c0ffee123"; exit 0 ;;
  exec) shift 4; sh -c "$1"; exit $? ;;
  stop) [ "$2" = "gone" ] && {{ echo "Error response from daemon: No such container: gone" >&2; exit 1; }}; echo "$2"; exit 0 ;;
esac
exit 2
"#,
            log = log.display()
        );
        let program = dir.join("docker");
        std::fs::write(&program, script).unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        (Docker { program, setpriv: None }, log)
    }

    #[test]
    fn the_docker_driver_runs_bae_s_exact_command_lines() {
        let dir = tempfile::tempdir().unwrap();
        let (docker, log) = fake_docker(dir.path());
        docker.ensure_image("present:1").unwrap();
        docker.ensure_image("alpine:3.19").unwrap();
        let missing = docker.ensure_image("missing:1").unwrap_err();
        assert_eq!(missing.0, "Error response from daemon: manifest unknown");
        let running = docker.start("alpine:3.19").unwrap();
        assert_eq!(running, Running::new("c0ffee123", "alpine:3.19"));
        let out = docker.exec(&running, "echo out; echo err >&2; exit 3", Duration::from_secs(5)).unwrap();
        assert_eq!(out, ExecOutput { stdout: "out\n".into(), stderr: "err\n".into(), exit_code: 3 });
        let slow = docker.exec(&running, "sleep 5", Duration::from_millis(200)).unwrap();
        assert_eq!(slow.exit_code, -1, "killed past its timeout");
        docker.stop(&running).unwrap();
        docker.stop(&Running::new("gone", "x")).unwrap();
        let calls = std::fs::read_to_string(log).unwrap();
        assert_eq!(
            calls.lines().collect::<Vec<_>>(),
            [
                "image inspect present:1",
                "image inspect alpine:3.19",
                "pull alpine:3.19",
                "image inspect missing:1",
                "pull missing:1",
                "run -d --rm alpine:3.19 sleep infinity",
                "exec c0ffee123 sh -c echo out; echo err >&2; exit 3",
                "exec c0ffee123 sh -c sleep 5",
                "stop c0ffee123",
                "stop gone",
            ]
        );
    }

    #[test]
    fn an_error_detail_is_stderr_else_stdout_cut_at_the_limit() {
        assert_eq!(detail("  boom \n", "ignored"), "boom");
        assert_eq!(detail("", " out "), "out");
        let long = detail(&"x".repeat(2000), "");
        assert_eq!(long.chars().count(), super::super::DETAIL_LIMIT + 1);
        assert!(long.ends_with('…'));
    }
}
