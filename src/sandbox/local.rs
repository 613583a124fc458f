//! The driver for hosts with no container engine. A sandbox is a private directory; a command
//! runs there under bubblewrap (`bwrap`) when it is installed and works, and unisolated
//! otherwise, which the driver says (`isolated` is false, which the events report as
//! `unsandboxed: true`). Images mean nothing here: `ensure_image` accepts any.
//!
//! Under bubblewrap a command sees only what it needs: `/usr`, `/bin`, `/sbin`, `/lib*` and
//! `/etc` read-only, with `/etc`'s secrets (`shadow`, `gshadow`, `ssh/`, `ssl/private`) and any
//! server path under those trees (the data dir, the config file) hidden behind an empty file
//! or directory; a private `/tmp`, `/dev` and `/proc`; its own sandbox directory writable. Not
//! `/root`, `/home`, the data dir or another sandbox. It has no network, and its own PID
//! namespace (`--unshare-all`): when its shell exits, everything it started dies with it, as
//! it does when the server dies (`--die-with-parent`). Either way a command starts from a
//! scrubbed environment (`super::scrub_env`) with `HOME` its sandbox directory, carries its
//! `KESTREL_COMMAND` marker, and whatever it started is killed when it ends (`reap`): a
//! background process, a `nohup` or `setsid` one included.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::bwrap::{empty_file, Bwrap, Layout, Mount, ETC_SECRETS};
use super::{detail, Driver, DriverError, Ending, Running, Script};

pub struct Local {
    root: PathBuf,
    /// bubblewrap and the mount arguments every command gets, when it works here.
    bwrap: Option<(Bwrap, Vec<OsString>)>,
    /// `setpriv`, if it works here: an unisolated command then dies with the server too
    /// (bubblewrap's `--die-with-parent` does that for isolated ones).
    setpriv: Option<PathBuf>,
}

/// Host trees a command may read (when they exist).
const SYSTEM_TREES: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"];

/// What every command gets besides its mounts: a private `/dev`, `/proc` and `/tmp`, and
/// bubblewrap's isolation with no network (`bwrap::isolation`).
fn flags() -> Vec<&'static str> {
    let mut flags = vec!["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"];
    flags.extend(super::bwrap::isolation(false));
    flags
}

impl Local {
    /// Sandboxes under `root`; bubblewrap is used if `bwrap` runs here. `hidden` are the
    /// server's own paths (its data dir, its config file): hidden from commands should they
    /// lie under a tree the sandbox shows.
    pub fn new(root: &Path, setpriv: Option<PathBuf>, hidden: &[PathBuf]) -> Local {
        let bwrap = mounts(root, hidden).ok().and_then(|mounts| {
            let probe: Vec<OsString> = mounts.iter().cloned().chain(flags().into_iter().map(OsString::from)).collect();
            let found = Bwrap::probe(Path::new("bwrap"), &probe);
            if let Err(why) = &found {
                log::warn!("BAE's local sandboxes run commands unsandboxed: {why}");
            }
            Some((found.ok()?, mounts))
        });
        Local { root: root.to_path_buf(), bwrap, setpriv }
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

/// bubblewrap's mount arguments: the system trees read-only (a merged-`/usr` link as a link),
/// then the secrets and `hidden` paths under them masked: a directory by an empty tmpfs, a
/// file by an empty read-only file kept in `root`.
fn mounts(root: &Path, hidden: &[PathBuf]) -> std::io::Result<Vec<OsString>> {
    let mut layout = Layout::new(empty_file(root)?);
    for tree in SYSTEM_TREES {
        let path = Path::new(tree);
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let target = std::fs::read_link(path)?;
                layout.push(Mount::Symlink { target, link: path.to_path_buf() });
            }
            Ok(meta) if meta.is_dir() => layout.push(Mount::ReadOnly(path.to_path_buf())),
            _ => {}
        }
    }
    let shown: Vec<PathBuf> = SYSTEM_TREES.iter().filter_map(|tree| Path::new(tree).canonicalize().ok()).collect();
    let masked = ETC_SECRETS.iter().map(PathBuf::from).chain(hidden.iter().cloned());
    for path in masked {
        let Ok(path) = path.canonicalize() else { continue };
        if shown.iter().any(|tree| path.starts_with(tree)) {
            layout.mask(&path);
        }
    }
    Ok(layout.args())
}

impl Driver for Local {
    fn ensure_image(&self, _image: &str, _cancel: &crossbeam_channel::Receiver<()>) -> Result<(), DriverError> {
        Ok(())
    }

    fn start(&self, image: &str, _cancel: &crossbeam_channel::Receiver<()>) -> Result<Running, DriverError> {
        let id = format!("lsb_{}", uuid::Uuid::new_v4().simple());
        let made = std::fs::create_dir_all(&self.root).and_then(|()| {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new().mode(0o700).create(self.root.join(&id))
        });
        made.map_err(|e| DriverError(format!("cannot make the sandbox: {e}")))?;
        Ok(Running::new(id, image))
    }

    fn process(&self, sandbox: &Running, script: &Script<'_>) -> Result<Command, DriverError> {
        let dir = self.dir(sandbox)?;
        let mut process = match &self.bwrap {
            Some((bwrap, mounts)) => {
                let mut wrapped = Command::new(&bwrap.program);
                wrapped.args(mounts);
                wrapped.args(flags());
                wrapped.arg("--bind").arg(&dir).arg(&dir).arg("--chdir").arg(&dir);
                wrapped.args(["--new-session", "sh", "-c", script.text, "sh"]);
                wrapped
            }
            None => {
                let mut plain = super::dying_with_server("sh", self.setpriv.as_deref());
                plain.args(["-c", script.text, "sh"]).current_dir(&dir);
                plain
            }
        };
        process.args(script.args);
        super::scrub_env(&mut process, &dir, &[]);
        process.env(crate::tools::orphans::MARKER, script.marker);
        Ok(process)
    }

    fn reap(&self, _sandbox: &Running, marker: &str, _ending: Ending) {
        crate::tools::orphans::kill_marked(&|value| value == marker, true);
    }

    fn stop(&self, sandbox: &Running) -> Result<(), DriverError> {
        let dir = self.dir(sandbox)?;
        // Whatever still runs for it (a subagent, something that escaped its command's end).
        crate::tools::orphans::kill_marked(&|value| sandbox.marks(value), true);
        match std::fs::remove_dir_all(dir) {
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
    use crate::sandbox::{exec, ExecLimits};
    use std::time::Duration;

    fn limits(timeout: Duration) -> ExecLimits {
        ExecLimits { timeout, output_cap: 4096 }
    }

    fn exercise(driver: &Local) {
        let sandbox = driver.start("alpine:3.19", &crossbeam_channel::never()).unwrap();
        let out =
            exec(driver, &sandbox, "pwd; echo made > here.txt; echo oops >&2; exit 4", limits(Duration::from_secs(10)))
                .unwrap();
        assert_eq!(out.exit_code, 4);
        assert_eq!(out.stderr, "oops\n");
        assert!(out.stdout.trim_end().ends_with(&sandbox.id), "runs in its directory: {}", out.stdout);
        let read = exec(driver, &sandbox, "cat here.txt", limits(Duration::from_secs(10))).unwrap();
        assert_eq!(read.stdout, "made\n", "the directory keeps what a command wrote");
        let slow = exec(driver, &sandbox, "sleep 5", limits(Duration::from_millis(200))).unwrap();
        assert_eq!(slow.exit_code, -1, "killed past its timeout");
        driver.stop(&sandbox).unwrap();
        assert!(!driver.dir(&sandbox).unwrap().exists(), "stop removes the sandbox");
        assert!(exec(driver, &Running::new("../escape", "x"), "true", limits(Duration::from_secs(1))).is_err());
    }

    /// Processes whose marker names `sandbox`.
    fn marked(sandbox: &Running) -> usize {
        let mut count = 0;
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(environ) = std::fs::read(entry.path().join("environ")) else { continue };
            let text = String::from_utf8_lossy(&environ);
            if text.split('\0').any(|var| var.strip_prefix("KESTREL_COMMAND=").is_some_and(|v| sandbox.marks(v))) {
                count += 1;
            }
        }
        count
    }

    /// A command's output is capped and its bytes converted; what it started in the
    /// background, `setsid` and `nohup` included, ends with it and never holds it up; the
    /// server's environment stays out.
    fn contain(driver: &Local) {
        let mut sandbox = driver.start("x", &crossbeam_channel::never()).unwrap();
        sandbox.marker = Some(format!("ses_{}:{}", uuid::Uuid::new_v4().simple(), sandbox.id));
        let big =
            exec(driver, &sandbox, "head -c 3000000 /dev/zero | tr '\\0' x", limits(Duration::from_secs(20))).unwrap();
        assert_eq!(big.stdout.len(), 4096, "capped");
        assert!(big.truncated);
        let binary = exec(driver, &sandbox, r"printf '\377\376ok'", limits(Duration::from_secs(10))).unwrap();
        assert_eq!(binary.stdout, "\u{FFFD}\u{FFFD}ok", "bytes that are not UTF-8 become U+FFFD");
        assert!(!binary.truncated);
        let started = std::time::Instant::now();
        let script = "sleep 30 & nohup sleep 31 >/dev/null 2>&1 & setsid sleep 32 & echo bg";
        let background = exec(driver, &sandbox, script, limits(Duration::from_secs(5))).unwrap();
        assert_eq!(background.stdout, "bg\n");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the background held the command up: {:?}",
            started.elapsed()
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while marked(&sandbox) > 0 {
            assert!(std::time::Instant::now() < deadline, "the background outlived its command");
            std::thread::sleep(Duration::from_millis(20));
        }
        let secret = format!("KESTREL_TEST_SECRET_{}", std::process::id());
        // The variable exists only in this test process; a sandbox must not see it.
        std::env::set_var(&secret, "leaked");
        let env = exec(driver, &sandbox, "env", limits(Duration::from_secs(10))).unwrap();
        std::env::remove_var(&secret);
        assert!(!env.stdout.contains("leaked") && !env.stdout.contains(&secret), "{}", env.stdout);
        let names: Vec<&str> = env.stdout.lines().filter_map(|line| line.split('=').next()).collect();
        for name in names {
            let allowed = [
                "PATH",
                "HOME",
                "LANG",
                "LC_ALL",
                "LC_CTYPE",
                "TERM",
                "TZ",
                "KESTREL_COMMAND",
                "PWD",
                "SHLVL",
                "_",
                "OLDPWD",
            ];
            assert!(allowed.contains(&name), "{name} reached the sandbox");
        }
        driver.stop(&sandbox).unwrap();
    }

    #[test]
    fn an_unisolated_sandbox_runs_in_its_own_directory_and_says_so() {
        let root = tempfile::tempdir().unwrap();
        let driver = Local::unisolated(root.path(), None);
        assert!(!driver.isolated());
        exercise(&driver);
        contain(&driver);
    }

    #[test]
    fn under_bubblewrap_a_command_sees_only_the_system_and_its_own_directory() {
        let data = tempfile::tempdir().unwrap();
        let root = data.path().join("sandboxes");
        let driver = Local::new(&root, None, &[data.path().to_path_buf()]);
        if !driver.isolated() {
            // Without a working bubblewrap the driver must say so (`.ci/run` installs it, so
            // CI takes the other branch).
            let runs = Command::new("bwrap").args(["--ro-bind", "/", "/", "true"]).status().is_ok_and(|s| s.success());
            assert!(!runs, "bwrap works here, but the driver did not detect it");
            return exercise(&driver);
        }
        exercise(&driver);
        contain(&driver);
        let sandbox = driver.start("x", &crossbeam_channel::never()).unwrap();
        let other = driver.start("x", &crossbeam_channel::never()).unwrap();
        std::fs::write(data.path().join("admin-key"), "the admin key").unwrap();
        let run = |command: &str| exec(&driver, &sandbox, command, limits(Duration::from_secs(10))).unwrap();
        // The host's files are read-only inside (the server runs as root here, so /etc is
        // writable outside), and the host's /tmp is not the sandbox's.
        let outside = std::path::PathBuf::from(format!("/etc/kestrel-sandbox-{}", std::process::id()));
        assert_ne!(run(&format!("echo x > {}", outside.display())).exit_code, 0, "the host is read-only inside");
        assert!(!outside.exists());
        // Root inside has no capability to make it writable again.
        run(&format!("mount -o remount,bind,rw /etc 2>/dev/null; echo x > {}", outside.display()));
        assert!(!outside.exists(), "a command remounted the host writable");
        let in_tmp = data.path().join("outside.txt");
        run(&format!("echo x > {}", in_tmp.display()));
        assert!(!in_tmp.exists(), "the sandbox's /tmp is its own");
        assert_eq!(run("cat /proc/net/dev | wc -l").stdout.trim(), "3", "only the loopback device");
        // No secret of the host, no home, no data dir, no other sandbox.
        assert_eq!(run("cat /etc/shadow /etc/gshadow 2>/dev/null | wc -c").stdout.trim(), "0");
        assert_eq!(run("ls /etc/ssh 2>/dev/null | wc -l").stdout.trim(), "0");
        for hidden in [
            "/root",
            "/home",
            &data.path().join("admin-key").display().to_string(),
            &driver.dir(&other).unwrap().display().to_string(),
        ] {
            assert_ne!(run(&format!("ls {hidden}")).exit_code, 0, "{hidden} is visible");
        }
        assert_eq!(run("ls /usr/bin/env && echo ok").exit_code, 0, "the system is there");
        driver.stop(&sandbox).unwrap();
        driver.stop(&other).unwrap();
    }
}
