//! run_command's sandbox (docs/sandbox.md): which containment each tenant's commands get, and
//! the bubblewrap command line that gives it to one command.
//!
//! Under `workspace-write` a command sees the whole file system read-only, with what must stay
//! secret masked by empty directories and files: the server's own paths (its data dir, its
//! config files, its keys), the host's secrets under `/etc`, every home directory, `/run`
//! (sockets: a container engine's, the session bus, users' agents) and a private `/tmp` and
//! `/var/tmp`. Its `/proc` is its own PID namespace's, so no other process (the server's
//! environment included) is visible, and `/dev` is minimal. Only the workspace is writable
//! (`read-only`: not even that), bound back in after the masks so a workspace under `/tmp`
//! or a home is still there, and the masks inside the workspace (the default workspace often
//! holds the data dir) are applied again after it. It has no network (`sandbox_network`
//! allows it), no capabilities (so root inside cannot remount or unmount what covers the
//! host), no controlling terminal (`--new-session`), and it ends with the server
//! (`--die-with-parent`). It keeps what `process.rs` gives every command: a process group
//! killed on cancel or timeout, the `KESTREL_COMMAND` marker, an environment without the
//! server's secrets. Because the sandbox is a PID namespace, whatever a command starts in the
//! background ends when its shell does.
//!
//! bubblewrap is probed once, at start, with this layout. Where it cannot run (not
//! installed, user namespaces refused), commands run unsandboxed, and that is said: in the
//! log, in `/api/bootstrap` and on every `run.started`. Built once by `app/`, read by the
//! `kestrel-tool` threads that run commands and by the engine when a run starts.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::domain::{SandboxMode, SandboxState};
use crate::sandbox::bwrap::{empty_file, masking, Bwrap, Layout, Mount, Unavailable, ETC_SECRETS};

/// Host trees no command sees, each replaced by an empty private directory, with why.
pub const PRIVATE_TREES: &[(&str, &str)] = &[
    ("/tmp", "a private /tmp: other processes' files stay out, and nothing a command leaves stays"),
    ("/var/tmp", "the same for /var/tmp"),
    ("/root", "root's home: its credentials (.ssh, .aws, .netrc, shell history)"),
    ("/home", "users' homes and their credentials"),
    ("/run", "sockets (a container engine's, the system bus, users' ssh and gpg agents) and service credentials"),
];

/// One scope's setting: what a command may change, and whether it may use the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    pub mode: SandboxMode,
    pub network: bool,
}

/// What the sandbox is built from at start.
pub struct SandboxConfig {
    /// `agent.sandbox` and `agent.sandbox_network`.
    pub server: Setting,
    /// Tenants whose token sets `sandbox` or `sandbox_network`: what each sets.
    pub tenants: Vec<(String, Option<SandboxMode>, Option<bool>)>,
    /// `agent.sandbox_bwrap`.
    pub program: PathBuf,
    /// The server's own paths (data dir, config files, keys): masked like the host's secrets.
    pub hidden: Vec<PathBuf>,
    /// Where the empty file that masks files is kept (in the data dir).
    pub empty_dir: PathBuf,
}

/// Each tenant's containment, and bubblewrap as the probe found it.
#[derive(Debug)]
pub struct CommandSandbox {
    server: Setting,
    tenants: HashMap<String, Setting>,
    /// bubblewrap when it works here, why not when it does not; `None` when every mode is
    /// `off`, so it was never tried.
    bwrap: Option<Result<Bwrap, Unavailable>>,
    /// Every mask, with the path it covers, in the order applied.
    masks: Vec<(PathBuf, Mount)>,
    /// Files a command with network needs that a mask covers (`/etc/resolv.conf` pointing
    /// into `/run`), shown again read-only.
    network_files: Vec<PathBuf>,
    empty: PathBuf,
}

/// A program and its arguments, as the sandbox runs them.
pub struct Wrapped {
    pub program: OsString,
    pub args: Vec<OsString>,
    pub state: SandboxState,
}

impl CommandSandbox {
    /// Builds the masks and probes bubblewrap with them, when any scope asks for a sandbox.
    pub fn start(config: SandboxConfig) -> CommandSandbox {
        let tenants = config
            .tenants
            .iter()
            .map(|(tenant, mode, network)| {
                let setting = Setting {
                    mode: mode.unwrap_or(config.server.mode),
                    network: network.unwrap_or(config.server.network),
                };
                (tenant.clone(), setting)
            })
            .collect();
        let trees = PRIVATE_TREES.iter().map(|(tree, _)| PathBuf::from(tree));
        let secrets = ETC_SECRETS.iter().map(PathBuf::from);
        let mut masks: Vec<(PathBuf, Mount)> = Vec::new();
        for path in trees.chain(secrets).chain(config.hidden) {
            if let Some(mount) = masking(&path) {
                let covered = covered(&mount).to_path_buf();
                if !masks.iter().any(|(seen, _)| *seen == covered) {
                    masks.push((covered, mount));
                }
            }
        }
        let network_files = Path::new("/etc/resolv.conf")
            .canonicalize()
            .into_iter()
            .filter(|file| masks.iter().any(|(covered, _)| file.starts_with(covered)))
            .collect();
        let mut sandbox = CommandSandbox {
            server: config.server,
            tenants,
            bwrap: None,
            masks,
            network_files,
            empty: PathBuf::new(),
        };
        let wanted = std::iter::once(&sandbox.server).chain(sandbox.tenants.values()).any(|s| s.mode != SandboxMode::Off);
        if wanted {
            let probed = empty_file(&config.empty_dir)
                .map_err(|error| Unavailable::Refused(format!("cannot make {}: {error}", config.empty_dir.display())))
                .and_then(|empty| {
                    sandbox.empty = empty;
                    let mut args = sandbox.layout(None, Setting { mode: SandboxMode::ReadOnly, network: false }).args();
                    args.extend(flags(false).into_iter().map(OsString::from));
                    Bwrap::probe(&config.program, &args)
                });
            if let Err(why) = &probed {
                log::warn!("run_command runs UNSANDBOXED: {why}");
            }
            sandbox.bwrap = Some(probed);
        }
        sandbox
    }

    /// No sandbox for anyone (embedders and engine tests that run no command).
    pub fn off() -> CommandSandbox {
        CommandSandbox {
            server: Setting { mode: SandboxMode::Off, network: true },
            tenants: HashMap::new(),
            bwrap: None,
            masks: Vec::new(),
            network_files: Vec::new(),
            empty: PathBuf::new(),
        }
    }

    fn setting(&self, tenant: &str) -> Setting {
        self.tenants.get(tenant).copied().unwrap_or(self.server)
    }

    /// The containment `tenant`'s commands get.
    pub fn state(&self, tenant: &str) -> SandboxState {
        let setting = self.setting(tenant);
        let unsandboxed = |reason: Option<String>| SandboxState {
            requested: setting.mode,
            mode: SandboxMode::Off,
            network: true,
            reason,
        };
        match (setting.mode, &self.bwrap) {
            (SandboxMode::Off, _) => unsandboxed(None),
            (_, Some(Err(why))) => unsandboxed(Some(why.to_string())),
            (_, None) => unsandboxed(Some("bubblewrap was not tried".into())),
            (mode, Some(Ok(_))) => SandboxState { requested: mode, mode, network: setting.network, reason: None },
        }
    }

    /// `program` with `args`, as `tenant`'s command in `workspace` (canonical) runs it.
    pub fn wrap(&self, tenant: &str, workspace: &Path, program: &str, args: &[String]) -> Wrapped {
        let state = self.state(tenant);
        let bwrap = match (&self.bwrap, state.mode) {
            (Some(Ok(bwrap)), SandboxMode::WorkspaceWrite | SandboxMode::ReadOnly) => bwrap,
            _ => {
                let args = args.iter().map(OsString::from).collect();
                return Wrapped { program: program.into(), args, state };
            }
        };
        let setting = Setting { mode: state.mode, network: state.network };
        let mut wrapped = self.layout(Some(workspace), setting).args();
        wrapped.extend(["--chdir".into(), workspace.as_os_str().to_os_string()]);
        wrapped.extend(flags(setting.network).into_iter().map(OsString::from));
        wrapped.push("--".into());
        wrapped.push(program.into());
        wrapped.extend(args.iter().map(OsString::from));
        Wrapped { program: bwrap.program.clone().into_os_string(), args: wrapped, state }
    }

    /// The mounts for a command in `workspace` (none: the probe's): the host read-only, the
    /// masks, the workspace, the masks inside it again.
    fn layout(&self, workspace: Option<&Path>, setting: Setting) -> Layout {
        let mut layout = Layout::new(self.empty.clone());
        layout.push(Mount::ReadOnly("/".into()));
        layout.push(Mount::Dev);
        layout.push(Mount::Proc);
        let inside = |covered: &Path| workspace.is_some_and(|ws| covered.starts_with(ws) && covered != ws);
        for (_, mount) in self.masks.iter().filter(|(covered, _)| !inside(covered)) {
            layout.push(mount.clone());
        }
        if setting.network {
            for file in &self.network_files {
                layout.push(Mount::ReadOnly(file.clone()));
            }
        }
        if let Some(workspace) = workspace {
            layout.push(match setting.mode {
                SandboxMode::ReadOnly => Mount::ReadOnly(workspace.to_path_buf()),
                SandboxMode::WorkspaceWrite | SandboxMode::Off => Mount::Writable(workspace.to_path_buf()),
            });
            for (_, mount) in self.masks.iter().filter(|(covered, _)| inside(covered)) {
                layout.push(mount.clone());
            }
        }
        layout
    }
}

/// What a mask covers.
fn covered(mount: &Mount) -> &Path {
    match mount {
        Mount::Tmpfs(path) | Mount::EmptyFile(path) | Mount::ReadOnly(path) | Mount::Writable(path) => path,
        Mount::Symlink { link, .. } => link,
        Mount::Dev => Path::new("/dev"),
        Mount::Proc => Path::new("/proc"),
    }
}

/// bubblewrap's flags after the mounts: every namespace of its own (the network's too unless
/// `network`), no capabilities, no terminal, an end with the server, a `TMPDIR` it can write.
fn flags(network: bool) -> Vec<&'static str> {
    let mut flags = vec!["--unshare-all"];
    if network {
        flags.push("--share-net");
    }
    flags.extend([
        "--cap-drop",
        "ALL",
        "--die-with-parent",
        "--new-session",
        "--setenv",
        "TMPDIR",
        "/tmp",
    ]);
    flags
}
