//! The `kestrel` binary as a child process on a data dir the caller keeps across restarts.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The PostgreSQL cluster the servers keep their state in (`--store postgres`), if any.
pub static CLUSTER: std::sync::Mutex<Option<crate::pg_cluster::Private>> = std::sync::Mutex::new(None);

/// The database of the server on `data` when on PostgreSQL: a new one for a new data dir,
/// the same for a restart on it.
fn database_url(data: &Path) -> Option<String> {
    static DATABASES: std::sync::Mutex<Option<std::collections::HashMap<PathBuf, String>>> =
        std::sync::Mutex::new(None);
    let cluster = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = cluster.as_ref()?;
    let mut databases = DATABASES.lock().unwrap_or_else(|e| e.into_inner());
    Some(
        databases
            .get_or_insert_with(Default::default)
            .entry(data.to_path_buf())
            .or_insert_with(|| cluster.database())
            .clone(),
    )
}

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
        Kestrel::start_with(binary, data, workspace, config, &[])
    }

    /// `start` with more environment, set after the defaults.
    pub fn start_with(binary: &Path, data: &Path, workspace: &Path, config: &str, env: &[(&str, &str)]) -> Kestrel {
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
            .env("KESTREL_DATABASE_URL", database_url(data).unwrap_or_default())
            .env("RUST_LOG", "error")
            .envs(env.iter().copied())
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

/// Whether the store of a data dir started by `Kestrel::start`, which no server has open, is
/// whole: SQLite's `PRAGMA integrity_check`, or on PostgreSQL (which keeps its own
/// consistency) that every table of the log and the transcripts reads to its end.
pub fn integrity_ok(data: &Path) -> bool {
    if let Some(url) = database_url(data) {
        let Ok(mut client) = postgres::Client::connect(&url, postgres::NoTls) else { return false };
        return ["events", "messages", "sessions", "tool_call_starts"]
            .iter()
            .all(|table| client.query_one(&format!("SELECT count(*) FROM {table}"), &[]).is_ok());
    }
    let Ok(conn) = rusqlite::Connection::open(data.join("data").join("kestrel.db")) else { return false };
    conn.query_row("PRAGMA integrity_check", [], |row| row.get::<_, String>(0)).is_ok_and(|r| r == "ok")
}
