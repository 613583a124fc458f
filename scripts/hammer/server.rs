//! The `kestrel` binary as a child process on a data dir the caller keeps across restarts.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Killed when dropped, so a run that fails half-way leaves no server behind.
pub struct Kestrel {
    child: Option<Child>,
    pub host: String,
    /// The BAE admin API's host.
    pub admin: String,
}

impl Kestrel {
    /// Starts `binary` with `config` (TOML) on `data`; returns once it listens.
    pub fn start(binary: &Path, data: &Path, workspace: &Path, config: &str) -> Kestrel {
        let config_path = data.join("kestrel.toml");
        std::fs::create_dir_all(data).expect("the data dir");
        std::fs::write(&config_path, config).expect("the config file");
        let mut child = Command::new(binary)
            .arg("--config")
            .arg(&config_path)
            .env("KESTREL_ADDR", "127.0.0.1:0")
            .env("KESTREL_DATA_DIR", data.join("data"))
            .env("KESTREL_ADMIN_ADDR", "127.0.0.1:0")
            .env("KESTREL_WORKSPACE", workspace)
            .env("RUST_LOG", "error")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("kestrel starts");
        // "kestrel listening on http://…", then "kestrel admin API on http://…".
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut address = || {
            let mut line = String::new();
            stdout.read_line(&mut line).expect("a listening line");
            let host = line.trim().rsplit("http://").next().expect("an address").to_string();
            assert!(!host.is_empty(), "kestrel printed no address (did it fail to start?)");
            host
        };
        let (host, admin) = (address(), address());
        Kestrel { child: Some(child), host, admin }
    }

    /// The server's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        self.child.as_mut().is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// SIGKILL, and waits for the process to be gone.
    pub fn kill_9(mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, and waits for a clean exit.
    pub fn stop(mut self) -> bool {
        let Some(mut child) = self.child.take() else { return false };
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        child.wait().is_ok_and(|status| status.success())
    }
}

impl Drop for Kestrel {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The database file under a data dir started by `Kestrel::start`.
pub fn database(data: &Path) -> PathBuf {
    data.join("data").join("kestrel.db")
}

/// `PRAGMA integrity_check` on a database no server has open.
pub fn integrity_ok(database: &Path) -> bool {
    let Ok(conn) = rusqlite::Connection::open(database) else { return false };
    conn.query_row("PRAGMA integrity_check", [], |row| row.get::<_, String>(0)).is_ok_and(|r| r == "ok")
}
