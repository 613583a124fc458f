//! `kestrel migrate --from sqlite`: a data dir's SQLite store copied into an empty PostgreSQL
//! database, in one transaction, so that a server started on the database serves what the
//! SQLite server did: every table's rows in their order (messages and marks by rowid, events
//! by seq), the row numbers cursors and manifests name (`seq` columns) kept, the log's last
//! seq kept, and the checkpoint blob files moved into `blobs`.
//!
//! The copy is generic: for each table, the columns both schemas have, each value converted to
//! the PostgreSQL column's type. The data dir is locked while it runs (no server may write it),
//! and its SQLite file is migrated to this binary's version first.

use std::path::Path;

use postgres::types::{ToSql, Type};
use rusqlite::types::Value;

use super::super::StoreError;
use super::PgError;

/// The tables, parents before children; `session_moves` starts afresh and `meta` is set last.
const TABLES: &[&str] = &[
    "sessions",
    "messages",
    "events",
    "tool_call_starts",
    "idempotency",
    "bae_profiles",
    "bae_keys",
    "bae_sessions",
    "checkpoints",
    "checkpoint_entries",
    "rules",
    "audit",
    "usage",
    "schedules",
    "schedule_fires",
    "webhooks",
    "webhook_events",
    "webhook_deliveries",
    "webhook_attempts",
];

/// What a copy did.
#[derive(Debug, Default)]
pub struct Imported {
    /// Rows copied, by table, in `TABLES`' order.
    pub rows: Vec<(&'static str, u64)>,
    pub blobs: u64,
    /// The log's last seq, as the SQLite store had it.
    pub last_seq: i64,
}

/// Why a copy did not happen.
#[derive(Debug)]
pub enum ImportError {
    /// The database already holds sessions: a copy would mix two stores.
    NotEmpty(i64),
    Store(StoreError),
    Database(PgError),
}

impl std::fmt::Display for ImportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ImportError::NotEmpty(count) => {
                write!(f, "the PostgreSQL database already holds {count} session(s); copy into an empty one")
            }
            ImportError::Store(error) => write!(f, "{error}"),
            ImportError::Database(error) => write!(f, "{error}"),
        }
    }
}

impl From<StoreError> for ImportError {
    fn from(error: StoreError) -> Self {
        ImportError::Store(error)
    }
}

impl From<rusqlite::Error> for ImportError {
    fn from(error: rusqlite::Error) -> Self {
        ImportError::Store(error.into())
    }
}

impl From<postgres::Error> for ImportError {
    fn from(error: postgres::Error) -> Self {
        ImportError::Database(error.into())
    }
}

/// Copies the SQLite store of `data_dir` into the database at `url` (migrated first).
pub fn from_sqlite(data_dir: &Path, url: &str) -> Result<Imported, ImportError> {
    let _lock = super::super::lock::DataDirLock::acquire(data_dir)?;
    let mut sqlite = rusqlite::Connection::open(data_dir.join(super::super::DB_FILE))?;
    super::super::migrate::migrate(&mut sqlite)?;
    let mut client = super::connect(url).map_err(ImportError::Database)?;
    super::migrate(&mut client).map_err(ImportError::Database)?;
    let sessions: i64 = client.query_one("SELECT count(*) FROM sessions", &[])?.get(0);
    if sessions > 0 {
        return Err(ImportError::NotEmpty(sessions));
    }
    let mut tx = client.transaction()?;
    let mut imported = Imported::default();
    for table in TABLES {
        imported.rows.push((table, copy_table(&sqlite, &mut tx, table)?));
    }
    imported.blobs = copy_blobs(data_dir, &mut tx)?;
    imported.last_seq = sqlite.query_row(super::super::writer::LAST_SEQ, [], |row| row.get(0))?;
    tx.execute("UPDATE meta SET value = greatest(value, $1) WHERE key = 'seq_last'", &[&imported.last_seq])?;
    tx.commit()?;
    Ok(imported)
}

/// Copies one table's rows in their order; how many.
fn copy_table(
    sqlite: &rusqlite::Connection,
    tx: &mut postgres::Transaction<'_>,
    table: &str,
) -> Result<u64, ImportError> {
    let target: Vec<(String, bool)> = tx
        .query(
            "SELECT column_name::text, is_identity = 'YES' FROM information_schema.columns
             WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position",
            &[&table],
        )?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let source: Vec<String> = {
        let mut statement = sqlite.prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))?;
        let names = statement.query_map([], |row| row.get(0))?;
        names.collect::<Result<_, _>>()?
    };
    // The columns both have (an identity column SQLite took from its rowid is left to count).
    let columns: Vec<&(String, bool)> = target.iter().filter(|(name, _)| source.contains(name)).collect();
    let names: Vec<&str> = columns.iter().map(|(name, _)| name.as_str()).collect();
    let overriding = columns.iter().any(|(_, identity)| *identity);
    let placeholders: Vec<String> = (1..=names.len()).map(|n| format!("${n}")).collect();
    let insert = tx.prepare(&format!(
        "INSERT INTO {table} ({}) {} VALUES ({})",
        names.join(", "),
        if overriding { "OVERRIDING SYSTEM VALUE" } else { "" },
        placeholders.join(", ")
    ))?;
    let types = insert.params().to_vec();
    let without_rowid: bool =
        sqlite.query_row("SELECT sql LIKE '%WITHOUT ROWID%' FROM sqlite_master WHERE name = ?1", [table], |row| {
            row.get(0)
        })?;
    let order = if without_rowid { "" } else { " ORDER BY rowid" };
    let mut statement = sqlite.prepare(&format!("SELECT {} FROM {table}{order}", names.join(", ")))?;
    let mut rows = statement.query([])?;
    let mut copied = 0;
    while let Some(row) = rows.next()? {
        let values: Vec<Box<dyn ToSql + Sync>> = types
            .iter()
            .enumerate()
            .map(|(index, kind)| row.get::<_, Value>(index).map(|value| as_param(value, kind)))
            .collect::<Result<_, _>>()?;
        let params: Vec<&(dyn ToSql + Sync)> = values.iter().map(|value| value.as_ref()).collect();
        tx.execute(&insert, &params)?;
        copied += 1;
    }
    if overriding {
        for (name, _) in columns.iter().filter(|(_, identity)| *identity) {
            tx.execute(
                &format!(
                    "SELECT setval(pg_get_serial_sequence('{table}', '{name}'), coalesce((SELECT max({name}) FROM {table}), 0) + 1, false)"
                ),
                &[],
            )?;
        }
    }
    Ok(copied)
}

/// A SQLite value as a parameter of the PostgreSQL column's type.
fn as_param(value: Value, kind: &Type) -> Box<dyn ToSql + Sync> {
    match (value, kind) {
        (Value::Null, &Type::INT8) => Box::new(None::<i64>),
        (Value::Null, &Type::FLOAT8) => Box::new(None::<f64>),
        (Value::Null, &Type::BYTEA) => Box::new(None::<Vec<u8>>),
        (Value::Null, _) => Box::new(None::<String>),
        (Value::Integer(n), &Type::FLOAT8) => Box::new(n as f64),
        (Value::Integer(n), &Type::TEXT) => Box::new(n.to_string()),
        (Value::Integer(n), _) => Box::new(n),
        (Value::Real(x), &Type::INT8) => Box::new(x as i64),
        (Value::Real(x), _) => Box::new(x),
        (Value::Text(text), &Type::BYTEA) => Box::new(text.into_bytes()),
        (Value::Text(text), &Type::INT8) => Box::new(text.parse::<i64>().unwrap_or_default()),
        (Value::Text(text), _) => Box::new(text),
        (Value::Blob(bytes), &Type::TEXT) => Box::new(String::from_utf8_lossy(&bytes).into_owned()),
        (Value::Blob(bytes), _) => Box::new(bytes),
    }
}

/// The data dir's blob files into `blobs`; how many.
fn copy_blobs(data_dir: &Path, tx: &mut postgres::Transaction<'_>) -> Result<u64, ImportError> {
    let files = crate::checkpoints::blobs::BlobStore::new(data_dir);
    let insert = tx.prepare("INSERT INTO blobs (digest, size, content) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING")?;
    let mut copied = 0;
    for digest in files.digests() {
        let content = files.get(&digest).map_err(StoreError::Io)?;
        tx.execute(&insert, &[&digest, &(content.len() as i64), &content])?;
        copied += 1;
    }
    Ok(copied)
}
