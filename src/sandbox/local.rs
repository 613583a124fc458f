//! The driver for hosts with no container engine. A sandbox is a private directory; a command
//! runs there under bubblewrap (`bwrap`) when it is installed and works: the host's filesystem
//! read-only, the sandbox directory writable, a private `/tmp`, and no network, no view of
//! other processes (`--unshare-all`), dying with the server. Without bubblewrap a command runs
//! unisolated in the directory, and the driver says so (`isolated` is false, which the events
//! report as `unsandboxed: true`). Images mean nothing here: `ensure_image` accepts any.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::{capture, detail, Driver, DriverError, ExecOutput, Running};

pub struct Local {
    root: PathBuf,
    bwrap: Option<PathBuf>,
    /// `setpriv`, if it works here: an unisolated command then dies with the server too
    /// (bubblewrap's `--die-with-parent` does that for isolated ones).
    setpriv: Option<PathBuf>,
}

impl Local {
    /// Sandboxes under `root`; bubblewrap is used if `bwrap` runs here.
    pub fn new(root: &Path, setpriv: Option<PathBuf>) -> Local {
        Local { root: root.to_path_buf(), bwrap: working_bwrap(), setpriv }
    }

    /// Sandboxes under `root`, never isolated (for hosts where bubblewrap must not be used).
    pub fn unisolated(root: &Path, setpriv: Option<PathBuf>) -> Local {
        Local { root: root.to_path_buf(), bwrap: None, setpriv }
    }

    fn dir(&self, sandbox: &Running) -> Result<PathBuf, DriverError> {
        let ok = sandbox.id.starts_with("lsb_") && sandbox.id[4..].chars().all(|c| c.is_ascii_hexdigit());
        match ok {
            true => Ok(self.root.join(&sandbox.id)),
            false => Err(DriverError(format!("no sandbox {}", sandbox.id))),
        }
    }
}

/// `bwrap` from PATH, if it can actually set up a sandbox here.
fn working_bwrap() -> Option<PathBuf> {
    let mut probe = Command::new("bwrap");
    probe.args(["--ro-bind", "/", "/", "--dev", "/dev", "--unshare-all", "--die-with-parent", "true"]);
    match capture(probe, Some(Duration::from_secs(10))) {
        Ok(ran) if ran.code == Some(0) => Some(PathBuf::from("bwrap")),
        _ => None,
    }
}

impl Driver for Local {
    fn ensure_image(&self, _image: &str) -> Result<(), DriverError> {
        Ok(())
    }

    fn start(&self, image: &str) -> Result<Running, DriverError> {
        let id = format!("lsb_{}", uuid::Uuid::new_v4().simple());
        std::fs::create_dir_all(self.root.join(&id))
            .map_err(|e| DriverError(format!("cannot make the sandbox: {e}")))?;
        Ok(Running::new(id, image))
    }

    fn exec(&self, sandbox: &Running, command: &str, timeout: Duration) -> Result<ExecOutput, DriverError> {
        let process = self.attach(sandbox, command)?;
        let ran = capture(process, Some(timeout)).map_err(|e| DriverError(format!("cannot run the command: {e}")))?;
        Ok(ExecOutput { stdout: ran.stdout, stderr: ran.stderr, exit_code: ran.code.unwrap_or(-1) })
    }

    fn attach(&self, sandbox: &Running, command: &str) -> Result<Command, DriverError> {
        let dir = self.dir(sandbox)?;
        let dir_text = dir.to_string_lossy().into_owned();
        let mut process = match &self.bwrap {
            Some(bwrap) => {
                let mut wrapped = Command::new(bwrap);
                wrapped.args(["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]);
                wrapped.args(["--bind", &dir_text, &dir_text, "--chdir", &dir_text]);
                wrapped.args(["--unshare-all", "--die-with-parent", "--new-session", "sh", "-c", command]);
                wrapped
            }
            None => {
                let mut plain = super::dying_with_server("sh", self.setpriv.as_deref());
                plain.args(["-c", command]).current_dir(&dir);
                plain
            }
        };
        sandbox.mark(&mut process);
        Ok(process)
    }

    fn stop(&self, sandbox: &Running) -> Result<(), DriverError> {
        match std::fs::remove_dir_all(self.dir(sandbox)?) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                Err(DriverError(detail(&error.to_string(), "")))
            }
            _ => Ok(()),
        }
    }

    fn has_images(&self) -> bool {
        false
    }

    fn isolated(&self) -> bool {
        self.bwrap.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exercise(driver: &Local) {
        let sandbox = driver.start("alpine:3.19").unwrap();
        let out =
            driver.exec(&sandbox, "pwd; echo made > here.txt; echo oops >&2; exit 4", Duration::from_secs(10)).unwrap();
        assert_eq!(out.exit_code, 4);
        assert_eq!(out.stderr, "oops\n");
        assert!(out.stdout.trim_end().ends_with(&sandbox.id), "runs in its directory: {}", out.stdout);
        let read = driver.exec(&sandbox, "cat here.txt", Duration::from_secs(10)).unwrap();
        assert_eq!(read.stdout, "made\n", "the directory keeps what a command wrote");
        let slow = driver.exec(&sandbox, "sleep 5", Duration::from_millis(200)).unwrap();
        assert_eq!(slow.exit_code, -1, "killed past its timeout");
        driver.stop(&sandbox).unwrap();
        assert!(!driver.dir(&sandbox).unwrap().exists(), "stop removes the sandbox");
        assert!(driver.exec(&Running::new("../escape", "x"), "true", Duration::from_secs(1)).is_err());
    }

    #[test]
    fn an_unisolated_sandbox_runs_in_its_own_directory_and_says_so() {
        let root = tempfile::tempdir().unwrap();
        let driver = Local::unisolated(root.path(), None);
        assert!(!driver.isolated());
        exercise(&driver);
    }

    #[test]
    fn under_bubblewrap_the_host_is_read_only_and_the_sandbox_is_not() {
        let root = tempfile::tempdir().unwrap();
        let driver = Local::new(root.path(), None);
        if !driver.isolated() {
            // Without a working bubblewrap the driver must say so (`.ci/run` installs it, so
            // CI takes the other branch).
            let runs = Command::new("bwrap").args(["--ro-bind", "/", "/", "true"]).status().is_ok_and(|s| s.success());
            assert!(!runs, "bwrap works here, but the driver did not detect it");
            return exercise(&driver);
        }
        exercise(&driver);
        let sandbox = driver.start("x").unwrap();
        // The host's files are read-only inside (the server runs as root here, so /etc is
        // writable outside), and the host's /tmp is not the sandbox's.
        let outside = std::path::PathBuf::from(format!("/etc/kestrel-sandbox-{}", std::process::id()));
        let wrote = driver.exec(&sandbox, &format!("echo x > {}", outside.display()), Duration::from_secs(10)).unwrap();
        assert_ne!(wrote.exit_code, 0, "the host is read-only inside");
        assert!(!outside.exists());
        let in_tmp = root.path().join("outside.txt");
        driver.exec(&sandbox, &format!("echo x > {}", in_tmp.display()), Duration::from_secs(10)).unwrap();
        assert!(!in_tmp.exists(), "the sandbox's /tmp is its own");
        let net = driver.exec(&sandbox, "cat /proc/net/dev | wc -l", Duration::from_secs(10)).unwrap();
        assert_eq!(net.stdout.trim(), "3", "only the loopback device: {}", net.stdout);
        driver.stop(&sandbox).unwrap();
    }
}
