//! A private PostgreSQL cluster for the tests: Debian's `postgresql` binaries, `initdb` in a
//! directory under `target/pg-test/`, `postgres` on a free loopback port with password
//! authentication, run as `nobody` when the tests run as root (PostgreSQL refuses root). One
//! cluster per test run, shared by the run's test processes (nextest starts one per test):
//! the first to need it starts it under a file lock, and a watchdog stops it and removes its
//! directory once the process that ran the tests (cargo or nextest) is gone. Each test gets a
//! database of its own. No Docker, no mock.
//!
//! Without PostgreSQL installed, `database()` says the test is skipped and answers `None`;
//! `KESTREL_REQUIRE_POSTGRES=1` (set by `.ci/run`) makes that a failure.
//!
//! The crate's own unit tests include this file too (the store conformance suite runs on
//! PostgreSQL there), so it uses only the package's dependencies, not the crate.

use std::fs::{self, File};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// How long the cluster may take to start.
const WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// The cluster's superuser and its password (a test secret: it must never show in output).
pub const USER: &str = "kestrel";
pub const PASSWORD: &str = "pg-test-password-5f3a";

/// A database of its own for one test.
pub struct Database {
    pub url: String,
    pub port: u16,
    pub name: String,
}

/// A fresh database on the run's cluster; `None` (the test skips) without PostgreSQL.
pub fn database() -> Option<Database> {
    let bin = installed()?;
    let port = cluster(&bin);
    let name = format!("k_{}", uuid::Uuid::new_v4().simple());
    let admin = format!("postgres://{USER}:{PASSWORD}@127.0.0.1:{port}/postgres");
    let mut client = postgres::Client::connect(&admin, postgres::NoTls).expect("the test cluster answers");
    client.batch_execute(&format!("CREATE DATABASE {name}")).expect("a database");
    Some(Database { url: format!("postgres://{USER}:{PASSWORD}@127.0.0.1:{port}/{name}"), port, name })
}

/// A cluster of one test's own, which it may restart (the run's shared one must not be): its
/// database `kestrel`; stopped and removed when dropped (or by its watchdog).
pub struct Private {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    pub url: String,
}

/// A private cluster; `None` (the test skips) without PostgreSQL.
pub fn private() -> Option<Private> {
    let bin = installed()?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("target").join("pg-test");
    let dir = root.join(format!("private-{}", uuid::Uuid::new_v4().simple()));
    let port = start(&bin, &dir, "");
    let admin = format!("postgres://{USER}:{PASSWORD}@127.0.0.1:{port}/postgres");
    let mut client = postgres::Client::connect(&admin, postgres::NoTls).expect("the private cluster answers");
    client.batch_execute("CREATE DATABASE kestrel").expect("a database");
    Some(Private { bin, dir, port, url: format!("postgres://{USER}:{PASSWORD}@127.0.0.1:{port}/kestrel") })
}

impl Private {
    /// One more database on this cluster; its URL.
    pub fn database(&self) -> String {
        let admin = format!("postgres://{USER}:{PASSWORD}@127.0.0.1:{}/postgres", self.port);
        let mut client = postgres::Client::connect(&admin, postgres::NoTls).expect("the private cluster answers");
        let name = format!("k_{}", uuid::Uuid::new_v4().simple());
        client.batch_execute(&format!("CREATE DATABASE {name}")).expect("a database");
        format!("postgres://{USER}:{PASSWORD}@127.0.0.1:{}/{name}", self.port)
    }

    /// `pg_ctl restart -m fast`: every connection is cut, and the server is back when this
    /// returns.
    pub fn restart(&self) {
        // The new server writes to the log, not to pipes this process would wait on.
        let restarted = as_owner(self.bin.join("pg_ctl"))
            .args(["restart", "-m", "fast", "-w", "-t", &WAIT.as_secs().to_string(), "-D"])
            .arg(self.dir.join("data"))
            .arg("-l")
            .arg(self.dir.join("log"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(restarted.success(), "pg_ctl restart failed: see {}", self.dir.join("log").display());
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        let _ = as_owner(self.bin.join("pg_ctl"))
            .args(["stop", "-m", "immediate", "-D"])
            .arg(self.dir.join("data"))
            .output();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The binaries, or `None` after saying the test is skipped (a failure with
/// `KESTREL_REQUIRE_POSTGRES`).
fn installed() -> Option<PathBuf> {
    let found = binaries();
    if found.is_none() {
        assert!(
            std::env::var("KESTREL_REQUIRE_POSTGRES").is_err(),
            "KESTREL_REQUIRE_POSTGRES is set and no PostgreSQL (initdb) is installed"
        );
        eprintln!("skipped: no PostgreSQL installed (Debian's postgresql package)");
    }
    found
}

/// Drops a database `database()` made (its clients gone, or cut off): a run makes hundreds.
pub fn drop_database(url: &str) {
    let Some((server, name)) = url.rsplit_once('/') else { return };
    let Ok(mut client) = postgres::Client::connect(&format!("{server}/postgres"), postgres::NoTls) else { return };
    let _ = client.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
}

/// Where `initdb`, `pg_ctl` and `postgres` are: `KESTREL_PG_BIN`, or Debian's newest.
fn binaries() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("KESTREL_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut versions: Vec<PathBuf> =
        fs::read_dir("/usr/lib/postgresql").ok()?.flatten().map(|e| e.path().join("bin")).collect();
    versions.retain(|dir| dir.join("initdb").exists());
    versions.sort();
    versions.pop()
}

/// Which test run's cluster this process uses: `KESTREL_PG_RUN` (a test that runs the suite
/// again in a child process passes its own), nextest's run, or this process.
pub fn run_key() -> String {
    std::env::var("KESTREL_PG_RUN")
        .or_else(|_| std::env::var("NEXTEST_RUN_ID"))
        .unwrap_or_else(|_| std::process::id().to_string())
}

/// The run's cluster, started if this is the first process to need it; its port.
fn cluster(bin: &Path) -> u16 {
    let run = run_key();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("target").join("pg-test");
    fs::create_dir_all(&root).unwrap();
    let lock = File::create(root.join(format!("{run}.lock"))).unwrap();
    let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive).expect("the cluster's lock");
    let dir = root.join(&run);
    if let Ok(port) = fs::read_to_string(dir.join("port")) {
        return port.trim().parse().unwrap();
    }
    // Hundreds of databases are made and dropped in a run: the WAL is kept small.
    let port = start(bin, &dir, "-c max_wal_size=128MB -c min_wal_size=32MB");
    fs::write(dir.join("port"), port.to_string()).unwrap();
    port
}

/// `initdb`, `pg_ctl start` (with `settings` added) and the watchdog; the port.
fn start(bin: &Path, dir: &Path, settings: &str) -> u16 {
    fs::create_dir_all(dir).unwrap();
    fs::set_permissions(dir, fs::Permissions::from_mode(0o777)).unwrap();
    let password_file = dir.join("password");
    fs::write(&password_file, PASSWORD).unwrap();
    fs::set_permissions(&password_file, fs::Permissions::from_mode(0o644)).unwrap();
    let data = dir.join("data");
    let initdb = as_owner(bin.join("initdb"))
        .args(["-U", USER, "--auth=scram-sha-256", "--no-sync", "-E", "UTF8", "--locale=C", "-D"])
        .arg(&data)
        .arg("--pwfile")
        .arg(&password_file)
        .output()
        .unwrap();
    assert!(initdb.status.success(), "initdb: {}", String::from_utf8_lossy(&initdb.stderr));
    let port = free_port();
    let options =
        format!("-p {port} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200 {settings}", dir.display());
    let started = as_owner(bin.join("pg_ctl"))
        .args(["start", "-w", "-t", &WAIT.as_secs().to_string(), "-D"])
        .arg(&data)
        .arg("-l")
        .arg(dir.join("log"))
        .args(["-o", &options])
        .output()
        .unwrap();
    assert!(started.status.success(), "pg_ctl start: {}", String::from_utf8_lossy(&started.stderr));
    watchdog(bin, dir);
    port
}

/// Stops the cluster and removes it once the process that ran the tests has exited.
fn watchdog(bin: &Path, dir: &Path) {
    let runner = nix::unistd::getppid();
    let stop = as_owner(bin.join("pg_ctl"))
        .args(["stop", "-m", "immediate", "-D"])
        .arg(dir.join("data"))
        .get_program_and_args();
    let script = format!(
        "tail --pid={runner} -f /dev/null; {stop} >/dev/null 2>&1; rm -rf '{}' '{}.lock'",
        dir.display(),
        dir.display()
    );
    // `--fork`: setsid returns at once, leaving the watchdog to the session it made.
    let started = Command::new("setsid")
        .args(["--fork", "sh", "-c", &script])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("the cluster's watchdog starts");
    assert!(started.success(), "the cluster's watchdog starts");
}

/// A command that runs as the cluster's owner: `nobody` when the tests run as root.
fn as_owner(program: PathBuf) -> Command {
    let root = std::os::unix::fs::MetadataExt::uid(&fs::metadata("/proc/self").unwrap()) == 0;
    if root {
        let mut command = Command::new("setpriv");
        command.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

trait ShellLine {
    fn get_program_and_args(&self) -> String;
}

impl ShellLine for Command {
    /// The command as one shell line, each word quoted.
    fn get_program_and_args(&self) -> String {
        std::iter::once(self.get_program())
            .chain(self.get_args())
            .map(|word| format!("'{}'", word.to_string_lossy().replace('\'', "'\\''")))
            .collect::<Vec<_>>()
            .join(" ")
    }
}
