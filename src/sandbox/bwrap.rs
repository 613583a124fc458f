//! bubblewrap (`bwrap`), shared by the two kinds of sandboxed process: BAE's local sandbox
//! driver (`local.rs`) and `run_command` (`tools/sandbox.rs`). Here: the mounts a sandboxed
//! process sees, as one list in the order bubblewrap applies them (a later mount covers an
//! earlier one); a path masked by an empty directory or an empty file; the host secrets every
//! sandbox masks; and the probe, run once at start, that finds out whether bubblewrap can set
//! a given layout up on this host (it may be missing, or the host may refuse it user
//! namespaces), and if not, why not, in words an operator can act on.
//!
//! Nothing here runs a sandboxed command: each caller adds its own flags and program.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// What no sandboxed process may read under `/etc`, whatever else it sees.
pub const ETC_SECRETS: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/ssh",
    "/etc/ssl/private",
    "/etc/sudoers",
    "/etc/sudoers.d",
];

/// How long the probe may take before bubblewrap counts as not working.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The isolation every sandboxed process gets besides its mounts, whichever sandbox runs it:
/// every namespace of its own (the network's too, unless `network`), no capabilities (a server
/// run as root would otherwise give its commands the power to remount the host writable or
/// unmount a mask), and an end with the server.
pub fn isolation(network: bool) -> Vec<&'static str> {
    let mut flags = vec!["--unshare-all"];
    if network {
        flags.push("--share-net");
    }
    flags.extend(["--cap-drop", "ALL", "--die-with-parent"]);
    flags
}

/// A bubblewrap that works here, with the layout it was probed with.
#[derive(Debug, Clone)]
pub struct Bwrap {
    pub program: PathBuf,
}

impl Bwrap {
    /// Whether `program` can set up a sandbox with `args` (a layout's mounts and the caller's
    /// flags) here: it runs `true` in one, once. A host where that fails runs its commands
    /// unsandboxed, and says why.
    pub fn probe(program: &Path, args: &[OsString]) -> Result<Bwrap, Unavailable> {
        let mut probe = Command::new(program);
        probe.args(args).arg("true");
        match super::capture(probe, Some(PROBE_TIMEOUT), &crossbeam_channel::never()) {
            Ok(ran) if ran.code == Some(0) => Ok(Bwrap { program: program.to_path_buf() }),
            Ok(ran) => Err(Unavailable::Refused(super::detail(&ran.stderr, &ran.stdout))),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Err(Unavailable::Missing(program.into())),
            Err(error) => Err(Unavailable::Refused(error.to_string())),
        }
    }
}

/// Why bubblewrap cannot sandbox anything here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unavailable {
    /// The program is not there (not installed, or not on `PATH`).
    Missing(PathBuf),
    /// It ran but could not set the sandbox up (user namespaces refused, a mount refused):
    /// its own words.
    Refused(String),
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unavailable::Missing(program) => {
                write!(f, "bubblewrap ({}) was not found; install it (apt-get install bubblewrap)", program.display())
            }
            Unavailable::Refused(detail) => write!(f, "bubblewrap cannot set up a sandbox on this host: {detail}"),
        }
    }
}

/// One mount of a layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mount {
    /// A host path at the same place, read-only.
    ReadOnly(PathBuf),
    /// A host directory at the same place, writable.
    Writable(PathBuf),
    /// An empty private directory over the path, writable, gone with the sandbox.
    Tmpfs(PathBuf),
    /// The layout's empty file over a file, read-only.
    EmptyFile(PathBuf),
    /// A symbolic link `link` to `target`.
    Symlink { target: PathBuf, link: PathBuf },
    /// A minimal `/dev` (null, zero, random, a private pts and shm).
    Dev,
    /// A `/proc` of the sandbox's own PID namespace: no other process is in it.
    Proc,
}

/// The mounts a sandboxed process sees, in order.
#[derive(Debug, Clone)]
pub struct Layout {
    mounts: Vec<Mount>,
    /// An empty read-only file on the host, bound over files that are masked.
    empty: PathBuf,
}

impl Layout {
    /// A layout whose masked files show `empty` (see `empty_file`).
    pub fn new(empty: PathBuf) -> Layout {
        Layout { mounts: Vec::new(), empty }
    }

    pub fn push(&mut self, mount: Mount) {
        self.mounts.push(mount);
    }

    /// Covers `path`, if it exists (symlinks resolved): a directory by an empty tmpfs, a file
    /// (or anything that is not a directory) by the empty file.
    pub fn mask(&mut self, path: &Path) {
        if let Some(mount) = masking(path) {
            self.mounts.push(mount);
        }
    }

    pub fn mounts(&self) -> &[Mount] {
        &self.mounts
    }

    /// bubblewrap's arguments for the mounts.
    pub fn args(&self) -> Vec<OsString> {
        let mut args = Vec::new();
        for mount in &self.mounts {
            let (flag, parts): (&str, Vec<&std::ffi::OsStr>) = match mount {
                Mount::ReadOnly(path) => ("--ro-bind", vec![path.as_os_str(), path.as_os_str()]),
                Mount::Writable(path) => ("--bind", vec![path.as_os_str(), path.as_os_str()]),
                Mount::Tmpfs(path) => ("--tmpfs", vec![path.as_os_str()]),
                Mount::EmptyFile(path) => ("--ro-bind", vec![self.empty.as_os_str(), path.as_os_str()]),
                Mount::Symlink { target, link } => ("--symlink", vec![target.as_os_str(), link.as_os_str()]),
                Mount::Dev => ("--dev", vec!["/dev".as_ref()]),
                Mount::Proc => ("--proc", vec!["/proc".as_ref()]),
            };
            args.push(OsString::from(flag));
            args.extend(parts.into_iter().map(OsString::from));
        }
        args
    }
}

/// The mount that masks `path` as it is now, if it exists.
pub fn masking(path: &Path) -> Option<Mount> {
    let path = path.canonicalize().ok()?;
    match std::fs::metadata(&path) {
        Ok(meta) if meta.is_dir() => Some(Mount::Tmpfs(path)),
        Ok(_) => Some(Mount::EmptyFile(path)),
        Err(_) => None,
    }
}

/// `dir/.empty`, an empty read-only file that masked files show, made if missing.
pub fn empty_file(dir: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    let empty = dir.join(".empty");
    if std::fs::symlink_metadata(&empty).map(|meta| !meta.is_file() || meta.len() != 0).unwrap_or(true) {
        let _ = std::fs::remove_file(&empty);
        std::fs::write(&empty, b"")?;
        std::fs::set_permissions(&empty, std::fs::Permissions::from_mode(0o444))?;
    }
    Ok(empty)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layout_is_bubblewraps_arguments_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secret.txt");
        std::fs::write(&file, "s").unwrap();
        let empty = empty_file(&dir.path().join("e")).unwrap();
        let mut layout = Layout::new(empty.clone());
        layout.push(Mount::ReadOnly("/".into()));
        layout.push(Mount::Dev);
        layout.push(Mount::Proc);
        layout.mask(dir.path());
        layout.mask(&file);
        layout.mask(&dir.path().join("missing"));
        layout.push(Mount::Symlink { target: "usr/bin".into(), link: "/bin".into() });
        layout.push(Mount::Writable("/w".into()));
        let dir = dir.path().canonicalize().unwrap();
        let expected: Vec<OsString> = [
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--tmpfs",
            dir.to_str().unwrap(),
            "--ro-bind",
            empty.to_str().unwrap(),
            dir.join("secret.txt").to_str().unwrap(),
            "--symlink",
            "usr/bin",
            "/bin",
            "--bind",
            "/w",
            "/w",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        assert_eq!(layout.args(), expected, "a missing path is not masked");
        assert_eq!(std::fs::read(&empty).unwrap(), b"");
    }

    #[test]
    fn a_missing_bubblewrap_and_one_that_fails_say_why() {
        let missing = Bwrap::probe(Path::new("/nonexistent/kestrel/bwrap"), &[]).unwrap_err();
        assert_eq!(missing, Unavailable::Missing("/nonexistent/kestrel/bwrap".into()));
        assert!(missing.to_string().contains("was not found"), "{missing}");
        // `false` ignores its arguments and fails, as a bubblewrap the host refuses does.
        let refused = Bwrap::probe(Path::new("false"), &[]).unwrap_err();
        assert!(matches!(refused, Unavailable::Refused(_)), "{refused:?}");
        assert!(refused.to_string().contains("cannot set up a sandbox"), "{refused}");
    }
}
