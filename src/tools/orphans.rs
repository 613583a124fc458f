//! Commands must not outlive the server that ran them.
//!
//! Two layers. While the server runs, each command starts under `setpriv --pdeathsig KILL`
//! (util-linux) where it exists, so the kernel kills the command's shell the moment the thread
//! that started it dies, `kill -9` of the server included. A shell's own children are not
//! covered by that, so every command also carries `KESTREL_COMMAND=<session>:<call>` in its
//! environment, which its children inherit; at start and at shutdown the server reads
//! `/proc/*/environ` and kills every process (and its process group) that carries the marker
//! of one of its own sessions. The marker names our own session ids, so a pid reused by an
//! unrelated process can never be mistaken for a command; and the data dir lock guarantees no
//! other live server owns those sessions.

use std::path::PathBuf;

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::{getpgid, getpgrp, Pid};

/// The environment variable that marks a command and everything it starts.
pub const MARKER: &str = "KESTREL_COMMAND";

/// The marker's value for one tool call.
pub fn marker_value(session_id: &str, call_id: &str) -> String {
    format!("{session_id}:{call_id}")
}

/// This data dir's marker for processes that belong to no session (MCP servers shared by
/// every session or a tenant's): a digest of the data dir's path, the same at every start.
pub fn node_marker(data_dir: &std::path::Path) -> String {
    use sha2::Digest;
    let path = data_dir.canonicalize().unwrap_or_else(|_| data_dir.to_path_buf());
    let digest = sha2::Sha256::digest(path.as_os_str().as_encoded_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("node-{hex}")
}

/// `setpriv` if it exists and supports `--pdeathsig`; checked once at start.
pub fn find_death_signal_wrapper() -> Option<PathBuf> {
    let candidates = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).map(|dir| dir.join("setpriv")).collect::<Vec<_>>())
        .unwrap_or_default();
    let setpriv = candidates.into_iter().find(|candidate| candidate.is_file())?;
    let works = std::process::Command::new(&setpriv)
        .args(["--pdeathsig", "KILL", "--", "/bin/true"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    works.then_some(setpriv)
}

/// Kills every process carrying the marker of a session `ours` recognizes, with its process
/// group; returns how many such processes it found alive (the rest of a group it killed is
/// not counted).
pub fn sweep(ours: &dyn Fn(&str) -> bool) -> usize {
    kill_marked(&|value| value.split(':').next().is_some_and(ours), true)
}

/// Kills every process whose marker value `matches` accepts (and, with `groups`, each one's
/// process group); how many it found. Processes that left their group (`setsid`, `nohup`)
/// still carry the marker their starter gave them, so this reaches what `killpg` cannot.
pub fn kill_marked(matches: &dyn Fn(&str) -> bool, groups: bool) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0 };
    let me = std::process::id();
    let my_group = getpgrp();
    let mut killed = 0;
    for entry in entries.filter_map(Result::ok) {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<i32>().ok()) else { continue };
        if pid as u32 == me {
            continue;
        }
        // Unreadable for other users' processes, gone for ones that just exited: not ours.
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else { continue };
        let Some(value) = marker_of(&environ) else { continue };
        if !matches(&value) {
            continue;
        }
        let pid = Pid::from_raw(pid);
        if groups {
            if let Ok(group) = getpgid(Some(pid)) {
                if group != my_group {
                    let _ = killpg(group, Signal::SIGKILL);
                }
            }
        }
        let _ = kill(pid, Signal::SIGKILL);
        killed += 1;
    }
    killed
}

/// The marker's whole value in an environment block, if it has one.
fn marker_of(environ: &[u8]) -> Option<String> {
    let prefix = format!("{MARKER}=");
    environ.split(|&b| b == 0).find_map(|var| {
        let value = std::str::from_utf8(var.strip_prefix(prefix.as_bytes())?).ok()?;
        Some(value.to_string())
    })
}

/// The session id in an environment block's marker, if it has one.
#[cfg(test)]
fn marked_session(environ: &[u8]) -> Option<String> {
    Some(marker_of(environ)?.split(':').next()?.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_session_in_an_environment_block() {
        let block = b"PATH=/bin\0KESTREL_COMMAND=ses_1:call_2\0HOME=/root\0";
        assert_eq!(marked_session(block).as_deref(), Some("ses_1"));
        assert_eq!(marked_session(b"PATH=/bin\0XKESTREL_COMMAND=ses_1:c\0"), None);
    }

    #[test]
    fn a_marked_process_of_ours_is_killed_with_its_group_and_others_are_left() {
        let spawn = |session: &str| {
            let mut command = std::process::Command::new("/bin/sh");
            command.args(["-c", "sleep 60 & sleep 60"]).env(MARKER, marker_value(session, "call"));
            std::os::unix::process::CommandExt::process_group(&mut command, 0);
            command.spawn().unwrap()
        };
        let session = format!("ses_{}", uuid::Uuid::new_v4().simple());
        let mut ours = spawn(&session);
        let mut theirs = spawn("ses_someone_else");
        // Wait until the shell has forked its background child, which carries the marker too.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while count(&session) < 2 {
            assert!(std::time::Instant::now() < deadline, "the command's children did not start");
            std::thread::yield_now();
        }
        assert!(sweep(&|candidate| candidate == session) >= 1);
        assert!(ours.wait().unwrap().signal().is_some(), "killed");
        // SIGKILL is delivered asynchronously: wait for the background child to be gone.
        while count(&session) > 0 {
            assert!(std::time::Instant::now() < deadline, "the background child went with its group");
            std::thread::yield_now();
        }
        assert!(theirs.try_wait().unwrap().is_none(), "another server's command is left alone");
        let _ = killpg(Pid::from_raw(theirs.id() as i32), Signal::SIGKILL);
        let _ = theirs.wait();
    }

    /// Processes carrying `session`'s marker.
    fn count(session: &str) -> usize {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(Result::ok)
            .filter_map(|entry| std::fs::read(entry.path().join("environ")).ok())
            .filter(|environ| marked_session(environ).as_deref() == Some(session))
            .count()
    }

    use std::os::unix::process::ExitStatusExt;
}
