//! The Docker driver: the `docker` CLI, with BAE's command lines.
//!
//! - ensure: `docker image inspect <image>`, and if that fails `docker pull <image>`;
//! - start: `docker run -d --rm <image> sleep infinity`; the trimmed stdout is the id (empty is
//!   an error);
//! - a command: `docker exec [-i] -e KESTREL_COMMAND=<marker> <id> sh -c <script> sh <args>…`,
//!   killed past its timeout (exit code -1; BAE has no timeout, Kestrel's is configurable),
//!   and then whatever carries its marker in the container is killed too (`reap`); what a
//!   command that finished started keeps running in the container, as in BAE, until stop;
//! - stop: `docker stop <id>`; "no such container" counts as stopped.
//!
//! The CLI itself starts from a scrubbed environment: `PATH`, the locale, and the variables
//! that tell it where its engine is (`DOCKER_HOST`, `DOCKER_CONFIG`, …), nothing else.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crossbeam_channel::Receiver;

use super::{capture, detail, Driver, DriverError, Ending, Ran, Running, Script};

/// Whether `cancel` has fired (a message, or its sender gone).
fn cancelled(cancel: &Receiver<()>) -> bool {
    !matches!(cancel.try_recv(), Err(crossbeam_channel::TryRecvError::Empty))
}

#[derive(Default)]
pub struct Docker {
    /// The CLI: `docker` from PATH unless configured.
    pub program: PathBuf,
    /// `setpriv`, if it works here: each CLI process then dies with the server.
    pub setpriv: Option<PathBuf>,
}

/// What the CLI needs to find and reach its engine (docker's and podman's names).
const ENGINE_ENV: &[&str] = &[
    "DOCKER_HOST",
    "DOCKER_CONFIG",
    "DOCKER_CONTEXT",
    "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY",
    "XDG_RUNTIME_DIR",
    "CONTAINER_HOST",
    "CONTAINERS_CONF",
    "REGISTRY_AUTH_FILE",
];

/// Kills, inside the container, every process whose environment carries the marker `$1`.
const KILL_MARKED: &str = r#"for p in /proc/[0-9]*; do if tr '\0' '\n' < "$p/environ" 2>/dev/null | grep -qxF "KESTREL_COMMAND=$1"; then kill -9 "${p#/proc/}" 2>/dev/null; fi; done; exit 0"#;

impl Docker {
    fn cli(&self) -> Command {
        let mut command = super::dying_with_server(&self.program, self.setpriv.as_deref());
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/"));
        super::scrub_env(&mut command, &home, ENGINE_ENV);
        // A configured CLI path may not be on the sandbox PATH.
        if let Some(path) = std::env::var_os("PATH") {
            command.env("PATH", path);
        }
        command
    }

    fn run(&self, args: &[&str], timeout: Option<Duration>, cancel: &Receiver<()>) -> Result<Ran, DriverError> {
        let mut command = self.cli();
        command.args(args);
        capture(command, timeout, cancel)
            .map_err(|e| DriverError(format!("cannot run {}: {e}", self.program.display())))
    }

    fn checked(&self, args: &[&str], cancel: &Receiver<()>) -> Result<Ran, DriverError> {
        let ran = self.run(args, None, cancel)?;
        match ran.code {
            Some(0) => Ok(ran),
            _ if cancelled(cancel) => Err(DriverError(format!("docker {} was cancelled", args[0]))),
            _ => Err(DriverError(detail(&ran.stderr, &ran.stdout))),
        }
    }
}

impl Driver for Docker {
    fn ensure_image(&self, image: &str, cancel: &Receiver<()>) -> Result<(), DriverError> {
        if self.run(&["image", "inspect", image], None, cancel)?.code == Some(0) {
            return Ok(());
        }
        if cancelled(cancel) {
            return Err(DriverError("docker image inspect was cancelled".into()));
        }
        self.checked(&["pull", image], cancel).map(|_| ())
    }

    fn start(&self, image: &str, cancel: &Receiver<()>) -> Result<Running, DriverError> {
        let ran = self.checked(&["run", "-d", "--rm", image, "sleep", "infinity"], cancel)?;
        match ran.stdout.trim() {
            "" => Err(DriverError("docker run printed no container id".into())),
            id => Ok(Running::new(id, image)),
        }
    }

    fn process(&self, sandbox: &Running, script: &Script<'_>) -> Result<Command, DriverError> {
        let mut process = self.cli();
        process.arg("exec");
        if script.stdin {
            process.arg("-i");
        }
        let marked = format!("{}={}", crate::tools::orphans::MARKER, script.marker);
        process.args(["-e", &marked, &sandbox.id, "sh", "-c", script.text, "sh"]).args(script.args);
        process.env(crate::tools::orphans::MARKER, script.marker);
        Ok(process)
    }

    fn reap(&self, sandbox: &Running, marker: &str, ending: Ending) {
        if matches!(ending, Ending::Exited(_)) {
            return;
        }
        // Killing the CLI leaves the command running in the container.
        let args = ["exec", &sandbox.id, "sh", "-c", KILL_MARKED, "sh", marker];
        let _ = self.run(&args, Some(Duration::from_secs(30)), &crossbeam_channel::never());
    }

    fn isolated(&self) -> bool {
        true
    }

    fn stop(&self, sandbox: &Running) -> Result<(), DriverError> {
        let ran = self.run(&["stop", &sandbox.id], None, &crossbeam_channel::never())?;
        if ran.code == Some(0) || ran.stderr.to_ascii_lowercase().contains("no such container") {
            return Ok(());
        }
        Err(DriverError(detail(&ran.stderr, &ran.stdout)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::{exec, ExecLimits, ExecOutput};
    use std::os::unix::fs::PermissionsExt;

    /// A `docker` that records its arguments and answers like the real CLI; `exec` runs the
    /// command on this host with the `-e` variables set, standing in for the container.
    fn fake_docker(dir: &std::path::Path) -> (Docker, PathBuf) {
        let log = dir.join("calls.log");
        let script = format!(
            r#"#!/bin/sh
echo "$*" >> {log}
case "$1" in
  image) [ "$3" = "present:1" ] && exit 0; echo "Error: No such image: $3" >&2; exit 1 ;;
  pull) [ "$2" = "missing:1" ] && {{ echo "Error response from daemon: manifest unknown" >&2; exit 1; }}; echo "pulled"; exit 0 ;;
  run) echo "c0ffee123"; exit 0 ;;
  exec) shift
    while :; do case "$1" in -i) shift ;; -e) export "$2"; shift 2 ;; *) break ;; esac; done
    shift 3; script="$1"; shift; exec sh -c "$script" "$@" ;;
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

    /// The log's lines, each process marker written `<marker>`.
    fn calls(log: &std::path::Path) -> Vec<String> {
        let marker = regex::Regex::new(r"sandbox-c0ffee123:[0-9a-f]{32}").unwrap();
        let text = std::fs::read_to_string(log).unwrap();
        text.lines().map(|line| marker.replace_all(line, "<marker>").into_owned()).collect()
    }

    #[test]
    fn the_docker_driver_runs_bae_s_command_lines() {
        let dir = tempfile::tempdir().unwrap();
        let (docker, log) = fake_docker(dir.path());
        let never = crossbeam_channel::never();
        docker.ensure_image("present:1", &never).unwrap();
        docker.ensure_image("alpine:3.19", &never).unwrap();
        let missing = docker.ensure_image("missing:1", &never).unwrap_err();
        assert_eq!(missing.0, "Error response from daemon: manifest unknown");
        let running = docker.start("alpine:3.19", &never).unwrap();
        assert_eq!(running, Running::new("c0ffee123", "alpine:3.19"));
        let limits = |ms| ExecLimits { timeout: Duration::from_millis(ms), output_cap: 1024 };
        let out = exec(&docker, &running, "echo out; echo err >&2; exit 3", limits(5000)).unwrap();
        let expected = ExecOutput { stdout: "out\n".into(), stderr: "err\n".into(), exit_code: 3, truncated: false };
        assert_eq!(out, expected);
        docker.stop(&running).unwrap();
        docker.stop(&Running::new("gone", "x")).unwrap();
        assert_eq!(
            calls(&log),
            [
                "image inspect present:1",
                "image inspect alpine:3.19",
                "pull alpine:3.19",
                "image inspect missing:1",
                "pull missing:1",
                "run -d --rm alpine:3.19 sleep infinity",
                "exec -e KESTREL_COMMAND=<marker> c0ffee123 sh -c echo out; echo err >&2; exit 3 sh",
                "stop c0ffee123",
                "stop gone",
            ]
        );
    }

    #[test]
    fn a_command_past_its_timeout_is_killed_in_the_container_too() {
        let dir = tempfile::tempdir().unwrap();
        let (docker, log) = fake_docker(dir.path());
        let running = Running::new("c0ffee123", "alpine:3.19");
        let pid_file = dir.path().join("escaped.pid");
        // A process that leaves the CLI's process group, as one in a container would be.
        let script = format!("setsid sh -c 'echo $$ > {}; exec sleep 60' & sleep 60", pid_file.display());
        let limits = ExecLimits { timeout: Duration::from_millis(500), output_cap: 1024 };
        let slow = exec(&docker, &running, &script, limits).unwrap();
        assert_eq!(slow.exit_code, -1, "killed past its timeout");
        let pid: i32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
        let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err()
            || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| stat.contains(") Z "));
        assert!(gone, "what the command started in the container was killed");
        // The fake's `echo` reads the script's `\n` as a newline: one call, several lines.
        let reap = calls(&log)[1..].join("\n");
        assert!(reap.starts_with("exec c0ffee123 sh -c for p in /proc/"), "{reap}");
        assert!(reap.ends_with("sh <marker>"), "{reap}");
    }

    #[test]
    fn the_cli_starts_from_a_scrubbed_environment() {
        let dir = tempfile::tempdir().unwrap();
        let (docker, _) = fake_docker(dir.path());
        let secret = format!("KESTREL_TEST_DOCKER_SECRET_{}", std::process::id());
        std::env::set_var(&secret, "leaked");
        let script = Script { text: "env", args: &[], marker: "m", stdin: false };
        let process = docker.process(&Running::new("c0ffee123", "x"), &script).unwrap();
        std::env::remove_var(&secret);
        let names: Vec<String> = process
            .get_envs()
            .filter(|(_, value)| value.is_some())
            .map(|(name, _)| name.to_string_lossy().into_owned())
            .collect();
        assert!(!names.contains(&secret), "{names:?}");
        assert!(names.contains(&"KESTREL_COMMAND".to_string()) && names.contains(&"PATH".to_string()));
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
