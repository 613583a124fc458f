//! PostgreSQL, the second store: the store traits (`contract.rs`) over a database its users
//! already run. Connecting takes a URL whose password never reaches a message; the versioned
//! schema is applied at open under an advisory lock (`migrate.rs`), so several processes
//! starting at once apply each version once. The `postgres` crate is a synchronous client
//! over an internal single-threaded tokio runtime of its own (README: "no async runtime" is
//! said with that caveat).
//!
//! - `writer.rs`: the writer thread, group commit, and waiting out a restart of the server;
//!   `apply.rs` and the table modules turn each `WriteOp` into SQL.
//! - `conn.rs`: connections with their prepared statements, the readers' pool (r2d2), and
//!   what an error means (`StoreError::Unavailable` for a lost server).
//! - `reads.rs` and the table modules: the reads, on pooled connections.
//! - `blobs.rs`: checkpoint contents in the database.
//! - `shown.rs`: a store URL as it may be shown, every secret redacted.

mod apply;
mod bae;
mod blobs;
mod checkpoints;
mod cluster;
mod conn;
mod import;
pub mod listen;
mod live;
mod migrate;
mod policy;
mod reads;
mod schedules;
mod shown;
mod webhooks;
mod writer;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{bounded, Sender};

use super::contract::{Claims, Recovery, Reply, Seqs, Writes};
use super::{StoreError, WriteOp, WriterHandle, WriterMsg};
pub use import::{from_sqlite, ImportError, Imported};
pub use migrate::{migrate, Migrated, VERSIONS};
pub use shown::redacted;
use shown::scrub;

/// Capacity of the writer's inbox (as SQLite's): when full, senders wait.
const WRITER_INBOX: usize = 8192;

/// The PostgreSQL backend.
pub struct Postgres {
    writer_tx: Sender<WriterMsg>,
    pool: Arc<conn::Pool>,
    /// Where it connects, for the connections the pool does not lend (`listen.rs`).
    url: Arc<str>,
}

impl Postgres {
    /// Connects to `url` (a failure is one line naming the problem, never the password),
    /// applies the schema's missing versions, starts the writer thread, and keeps a pool of
    /// up to `pool` connections for readers.
    /// `lock` (a data dir's) is released when the writer's handle goes.
    pub fn open(
        url: &str,
        pool: u32,
        lock: Option<super::lock::DataDirLock>,
        fence: Option<Arc<super::cluster::LeaseBook>>,
    ) -> Result<(Postgres, WriterHandle), StoreError> {
        let mut client = connect(url).map_err(StoreError::Connect)?;
        migrate(&mut client).map_err(StoreError::Connect)?;
        let (writer_tx, inbox) = bounded(WRITER_INBOX);
        let writer = writer::Writer::open(url, conn::Conn::new(client), fence)?;
        let handle = writer.spawn(inbox, writer_tx.clone(), lock)?;
        Ok((Postgres { writer_tx, pool: Arc::new(conn::Pool::new(url, pool)), url: Arc::from(url) }, handle))
    }

    /// Where checkpoint contents go: the `blobs` table, through this backend's pool.
    pub(super) fn blobs(&self) -> Arc<dyn crate::checkpoints::blobs::Blobs> {
        Arc::new(blobs::PgBlobs { pool: Arc::clone(&self.pool) })
    }

    /// Membership and leases (`store/cluster.rs`), through this backend's pool.
    pub(super) fn membership(&self) -> Arc<dyn super::cluster::Membership> {
        Arc::new(cluster::PgMembership { pool: Arc::clone(&self.pool), url: Arc::clone(&self.url) })
    }

    fn with<T>(&self, read: impl Fn(&mut conn::Conn) -> Result<T, StoreError>) -> Result<T, StoreError> {
        self.pool.with(read)
    }
}

impl Writes for Postgres {
    fn submit(&self, ops: Vec<WriteOp>, reply: Option<Reply>) -> Result<(), StoreError> {
        self.writer_tx.send(WriterMsg::Write { ops, reply }).map_err(|_| StoreError::Closed)
    }

    fn queue_depth(&self) -> usize {
        self.writer_tx.len()
    }
}

impl Seqs for Postgres {
    fn last_seq(&self) -> Result<u64, StoreError> {
        self.with(|conn| Ok(conn.one("SELECT value FROM meta WHERE key = 'seq_last'", &[])?.get::<_, i64>(0) as u64))
    }
}

impl Claims for Postgres {}

impl Recovery for Postgres {
    fn recover(&self, node: &str, at: &str) -> Result<Vec<String>, StoreError> {
        let held = self.with(|conn| {
            let rows = conn.query(
                "SELECT id FROM sessions WHERE status = 'running' AND (node = $1 OR node IS NULL) ORDER BY id",
                &[&node],
            )?;
            Ok(rows.iter().map(|row| row.get::<_, String>(0)).collect::<Vec<_>>())
        })?;
        self.submit_and_wait(vec![WriteOp::RecoverTurns { node: node.to_string(), at: at.to_string() }])?;
        Ok(held)
    }
}

/// How long a statement may run before the server cancels it: a stuck query never holds a
/// request thread forever.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a connection may sit inside a transaction between statements before the server
/// ends it. Kestrel's transactions run their statements back to back; a node that is paused
/// (or cut off) inside one would otherwise keep its row locks, and with them the lease rows
/// another node must claim to take its sessions over (docs/cluster.md, fencing).
pub const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(5);
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the store could not use the database, in one line that never holds the password.
#[derive(Debug)]
pub enum PgError {
    /// The URL is not a PostgreSQL URL: why.
    Url(String),
    /// The server could not be reached (its address, redacted).
    Unreachable(String, String),
    /// The server refused the user or the password.
    Auth(String),
    /// The database does not exist.
    NoDatabase(String),
    /// Anything else the server said.
    Server(String),
}

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PgError::Url(why) => write!(f, "store.url is not a PostgreSQL URL: {why}"),
            PgError::Unreachable(url, why) => write!(f, "PostgreSQL at {url} cannot be reached: {why}"),
            PgError::Auth(url) => write!(f, "PostgreSQL at {url} refused the user or its password"),
            PgError::NoDatabase(url) => write!(f, "PostgreSQL at {url}: the database does not exist"),
            PgError::Server(why) => write!(f, "PostgreSQL: {why}"),
        }
    }
}

impl std::error::Error for PgError {}

/// Connects, with the statement timeout set for the session: `STATEMENT_TIMEOUT`, unless the
/// URL's own `options` set one (`?options=-c%20statement_timeout%3D5000`); and the same for
/// `IDLE_IN_TRANSACTION_TIMEOUT`.
pub fn connect(url: &str) -> Result<postgres::Client, PgError> {
    let mut config = postgres::Config::from_str(url).map_err(|error| PgError::Url(scrub(&error.to_string(), url)))?;
    config.connect_timeout(CONNECT_TIMEOUT);
    let mut options = config.get_options().unwrap_or_default().to_string();
    if !options.contains("statement_timeout") {
        options = format!("{options} -c statement_timeout={}", STATEMENT_TIMEOUT.as_millis());
    }
    if !options.contains("idle_in_transaction_session_timeout") {
        let idle = IDLE_IN_TRANSACTION_TIMEOUT.as_millis();
        options = format!("{options} -c idle_in_transaction_session_timeout={idle}");
    }
    config.options(options.trim());
    config.application_name("kestrel");
    config.connect(postgres::NoTls).map_err(|error| classify(&error, url))
}

/// What a failed connection means, in words that name the problem.
fn classify(error: &postgres::Error, url: &str) -> PgError {
    let shown = redacted(url);
    match error.as_db_error().map(|db| db.code().clone()) {
        Some(code) if code == postgres::error::SqlState::INVALID_PASSWORD => PgError::Auth(shown),
        Some(code) if code == postgres::error::SqlState::INVALID_AUTHORIZATION_SPECIFICATION => PgError::Auth(shown),
        Some(code) if code == postgres::error::SqlState::INVALID_CATALOG_NAME => PgError::NoDatabase(shown),
        Some(_) => PgError::Server(scrub(&error.to_string(), url)),
        None => {
            let why = std::error::Error::source(error).map_or_else(|| error.to_string(), |source| source.to_string());
            PgError::Unreachable(shown, scrub(&why, url))
        }
    }
}

impl From<postgres::Error> for PgError {
    fn from(error: postgres::Error) -> Self {
        PgError::Server(error.as_db_error().map_or_else(|| error.to_string(), |db| db.message().to_string()))
    }
}

#[cfg(test)]
#[allow(dead_code)]
#[path = "../../../tests/it/pg_cluster.rs"]
pub(crate) mod pg_cluster;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_keeps_the_store_contract() {
        if pg_cluster::database().is_none() {
            return;
        }
        // Each of the suite's stores is a database of its own; every handle on it is a node.
        let databases = std::sync::Mutex::new(std::collections::HashMap::new());
        super::super::conformance::run_all(&|path| {
            let url = databases
                .lock()
                .unwrap()
                .entry(path.to_path_buf())
                .or_insert_with(|| pg_cluster::database().expect("the cluster").url)
                .clone();
            let (backend, handle) = Postgres::open(&url, 4, None, None)?;
            let backend: Arc<dyn super::super::Backend> = Arc::new(backend);
            Ok((backend, Box::new(move || handle.shutdown())))
        });
    }

    #[test]
    fn passwords_are_never_shown() {
        let error = connect("postgres://k:s3cret@db:notaport/kestrel").err().expect("a bad port").to_string();
        assert!(!error.contains("s3cret") && error.starts_with("store.url is not a PostgreSQL URL"), "{error}");
    }
}
