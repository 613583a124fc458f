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
    pub tenants: Vec<crate::config::TenantSandbox>,
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
        let mut sandbox =
            CommandSandbox { server: config.server, tenants, bwrap: None, masks, network_files, empty: PathBuf::new() };
        let wanted =
            std::iter::once(&sandbox.server).chain(sandbox.tenants.values()).any(|s| s.mode != SandboxMode::Off);
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

/// bubblewrap's flags after the mounts: its isolation (`bwrap::isolation`), no terminal, a
/// `TMPDIR` it can write.
fn flags(network: bool) -> Vec<&'static str> {
    let mut flags = crate::sandbox::bwrap::isolation(network);
    flags.extend(["--new-session", "--setenv", "TMPDIR", "/tmp"]);
    flags
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TenantSandbox;

    fn setting(mode: SandboxMode, network: bool) -> Setting {
        Setting { mode, network }
    }

    /// A sandbox with `hidden` masked, probed with `program`.
    fn sandbox(program: &str, server: Setting, tenants: Vec<TenantSandbox>, hidden: Vec<PathBuf>) -> CommandSandbox {
        let empty = tempfile::tempdir().unwrap().keep();
        CommandSandbox::start(SandboxConfig { server, tenants, program: program.into(), hidden, empty_dir: empty })
    }

    /// Runs `script` with `/bin/sh -c` in `workspace` as `tenant`'s command: its output.
    fn run(sandbox: &CommandSandbox, tenant: &str, workspace: &Path, script: &str) -> (bool, String) {
        let wrapped = sandbox.wrap(tenant, workspace, "/bin/sh", &["-c".to_string(), script.to_string()]);
        let out =
            std::process::Command::new(&wrapped.program).args(&wrapped.args).current_dir(workspace).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
    }

    #[test]
    fn each_tenant_gets_its_own_setting_and_an_unusable_bubblewrap_is_said() {
        let tenants = vec![
            ("strict".to_string(), Some(SandboxMode::ReadOnly), None),
            ("open".to_string(), None, Some(true)),
            ("trusted".to_string(), Some(SandboxMode::Off), None),
        ];
        let missing =
            sandbox("/nonexistent/bwrap", setting(SandboxMode::WorkspaceWrite, false), tenants.clone(), vec![]);
        let state = missing.state("anyone");
        assert_eq!((state.requested, state.mode, state.network), (SandboxMode::WorkspaceWrite, SandboxMode::Off, true));
        assert!(state.fell_back() && state.reason.as_deref().unwrap().contains("/nonexistent/bwrap"), "{state:?}");
        assert_eq!(missing.state("strict").requested, SandboxMode::ReadOnly);
        let trusted = missing.state("trusted");
        assert!(!trusted.fell_back() && trusted.reason.is_none(), "off as asked: {trusted:?}");
        let unwrapped = missing.wrap("anyone", Path::new("/w"), "/bin/sh", &["-c".into(), "true".into()]);
        assert_eq!((unwrapped.program.as_os_str(), unwrapped.args.len()), (std::ffi::OsStr::new("/bin/sh"), 2));

        // Nobody asks for a sandbox: bubblewrap is not even tried.
        let off = sandbox("/nonexistent/bwrap", setting(SandboxMode::Off, false), vec![], vec![]);
        assert!(off.bwrap.is_none());
        assert_eq!(off.state("anyone").reason, None);

        let working = sandbox("bwrap", setting(SandboxMode::WorkspaceWrite, false), tenants, vec![]);
        if working.bwrap.as_ref().is_some_and(|b| b.is_err()) {
            return; // this host cannot run bubblewrap (CI can: `.ci/run` installs it)
        }
        let state = |tenant: &str| {
            let state = working.state(tenant);
            (state.mode, state.network)
        };
        assert_eq!(state("anyone"), (SandboxMode::WorkspaceWrite, false));
        assert_eq!(state("strict"), (SandboxMode::ReadOnly, false));
        assert_eq!(state("open"), (SandboxMode::WorkspaceWrite, true), "its own network, the server's mode");
        assert_eq!(state("trusted"), (SandboxMode::Off, true));
    }

    #[test]
    fn the_workspace_is_bound_after_the_masks_that_cover_it_and_before_those_inside_it() {
        let outer = tempfile::tempdir().unwrap();
        let workspace = outer.path().join("ws");
        let data = workspace.join("data");
        std::fs::create_dir_all(&data).unwrap();
        let config = outer.path().join("kestrel.toml");
        std::fs::write(&config, "secret").unwrap();
        let mut built =
            sandbox("bwrap", setting(SandboxMode::WorkspaceWrite, false), vec![], vec![data.clone(), config]);
        built.bwrap = Some(Ok(Bwrap { program: "bwrap".into() }));
        let workspace = workspace.canonicalize().unwrap();
        let data = data.canonicalize().unwrap();
        let at = |mounts: &[Mount], wanted: &Mount| mounts.iter().position(|m| m == wanted).unwrap();
        let layout = built.layout(Some(&workspace), setting(SandboxMode::WorkspaceWrite, false));
        let mounts = layout.mounts();
        assert_eq!(mounts[..3], [Mount::ReadOnly("/".into()), Mount::Dev, Mount::Proc]);
        let bound = at(mounts, &Mount::Writable(workspace.clone()));
        assert!(at(mounts, &Mount::Tmpfs("/tmp".into())) < bound, "the workspace is under the private /tmp");
        assert!(at(mounts, &Mount::Tmpfs(data)) > bound, "the data dir inside it is masked again");
        let read_only = built.layout(Some(&workspace), setting(SandboxMode::ReadOnly, false));
        assert!(read_only.mounts().contains(&Mount::ReadOnly(workspace.clone())));
        assert!(!read_only.mounts().contains(&Mount::Writable(workspace)));
    }

    /// Every row of `PRIVATE_TREES` and `ETC_SECRETS` that exists here is empty inside, and
    /// so are the server's own paths; the host is read-only, even to root.
    #[test]
    fn a_sandboxed_command_sees_every_masked_path_empty_and_cannot_uncover_them() {
        // Outside /tmp and the homes, which are masked whole.
        let outer = tempfile::tempdir_in(concat!(env!("CARGO_MANIFEST_DIR"), "/target")).unwrap();
        let (workspace, data, config) =
            (outer.path().join("ws"), outer.path().join("data"), outer.path().join("kestrel.toml"));
        std::fs::create_dir_all(&workspace).unwrap();
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("kestrel.db"), "store").unwrap();
        std::fs::write(&config, "secret").unwrap();
        let hidden = vec![data.clone(), config.clone()];
        let built = sandbox("bwrap", setting(SandboxMode::WorkspaceWrite, false), vec![], hidden);
        if built.bwrap.as_ref().is_some_and(|b| b.is_err()) {
            return; // this host cannot run bubblewrap (CI can: `.ci/run` installs it)
        }
        let workspace = workspace.canonicalize().unwrap();
        let rows = PRIVATE_TREES.iter().map(|(tree, _)| *tree).chain(ETC_SECRETS.iter().copied());
        let paths: Vec<PathBuf> = rows.map(PathBuf::from).chain([data, config]).collect();
        for path in paths {
            let Ok(meta) = std::fs::metadata(&path) else { continue };
            let script = match meta.is_dir() {
                true => format!("ls -A {} | wc -l", path.display()),
                false => format!("wc -c < {}", path.display()),
            };
            let (ok, out) = run(&built, "t", &workspace, &script);
            assert!(ok, "{}: {out}", path.display());
            assert_eq!(out.trim(), "0", "{} is masked", path.display());
        }
        // Root inside has no capability to remount the host writable or unmount a mask.
        let escape = outer.path().join("escaped");
        let script = format!(
            "umount -l /tmp 2>/dev/null; mount -o remount,bind,rw / 2>/dev/null; echo x > {}; true",
            escape.display()
        );
        run(&built, "t", &workspace, &script);
        assert!(!escape.exists(), "the host stayed read-only");
    }
}
