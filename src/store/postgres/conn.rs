//! A connection with its prepared statements, the pool of them readers borrow (r2d2), and
//! what a PostgreSQL error means to the store.
//!
//! Statements are prepared once per connection and kept by their text: a read is then one
//! round trip (bind and execute), not two. A connection that lost its server is dropped by
//! the pool; a read that met one is tried once more on a fresh connection, so a database
//! restart costs the requests made while it is down, not the ones after.

use std::collections::HashMap;

use postgres::types::ToSql;
use postgres::{Client, Row, Statement};

use super::super::StoreError;

/// Parameters of a statement.
pub(super) type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// A client and the statements prepared on it.
pub(super) struct Conn {
    pub(super) client: Client,
    statements: HashMap<String, Statement>,
}

impl Conn {
    pub(super) fn new(client: Client) -> Conn {
        Conn { client, statements: HashMap::new() }
    }

    /// The statement for `sql`, prepared on this connection the first time.
    fn statement(&mut self, sql: &str) -> Result<Statement, StoreError> {
        prepared(&mut self.statements, sql, |sql| self.client.prepare(sql))
    }

    pub(super) fn query(&mut self, sql: &str, params: Params<'_>) -> Result<Vec<Row>, StoreError> {
        let statement = self.statement(sql)?;
        self.client.query(&statement, params).map_err(error)
    }

    /// Runs a statement outside a transaction; how many rows it changed.
    pub(super) fn exec(&mut self, sql: &str, params: Params<'_>) -> Result<u64, StoreError> {
        let statement = self.statement(sql)?;
        self.client.execute(&statement, params).map_err(error)
    }

    pub(super) fn opt(&mut self, sql: &str, params: Params<'_>) -> Result<Option<Row>, StoreError> {
        let statement = self.statement(sql)?;
        self.client.query_opt(&statement, params).map_err(error)
    }

    pub(super) fn one(&mut self, sql: &str, params: Params<'_>) -> Result<Row, StoreError> {
        let statement = self.statement(sql)?;
        self.client.query_one(&statement, params).map_err(error)
    }

    /// A transaction whose statements are prepared (and kept) on this connection.
    pub(super) fn transaction(&mut self) -> Result<Tx<'_>, StoreError> {
        let tx = self.client.transaction().map_err(error)?;
        Ok(Tx { tx, statements: &mut self.statements })
    }

    /// A read-only snapshot: every statement in it sees the same committed state.
    pub(super) fn snapshot(&mut self) -> Result<Tx<'_>, StoreError> {
        let tx = self
            .client
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .map_err(error)?;
        Ok(Tx { tx, statements: &mut self.statements })
    }
}

/// The statement for `sql` from `statements`, or prepared by `prepare` and kept there.
fn prepared(
    statements: &mut HashMap<String, Statement>,
    sql: &str,
    prepare: impl FnOnce(&str) -> Result<Statement, postgres::Error>,
) -> Result<Statement, StoreError> {
    if let Some(statement) = statements.get(sql) {
        return Ok(statement.clone());
    }
    let statement = prepare(sql).map_err(error)?;
    statements.insert(sql.to_string(), statement.clone());
    Ok(statement)
}

/// A transaction of a `Conn`.
pub(super) struct Tx<'a> {
    tx: postgres::Transaction<'a>,
    statements: &'a mut HashMap<String, Statement>,
}

impl Tx<'_> {
    fn statement(&mut self, sql: &str) -> Result<Statement, StoreError> {
        prepared(self.statements, sql, |sql| self.tx.prepare(sql))
    }

    /// Runs a statement; how many rows it changed.
    pub(super) fn exec(&mut self, sql: &str, params: Params<'_>) -> Result<u64, StoreError> {
        let statement = self.statement(sql)?;
        self.tx.execute(&statement, params).map_err(error)
    }

    pub(super) fn query(&mut self, sql: &str, params: Params<'_>) -> Result<Vec<Row>, StoreError> {
        let statement = self.statement(sql)?;
        self.tx.query(&statement, params).map_err(error)
    }

    pub(super) fn opt(&mut self, sql: &str, params: Params<'_>) -> Result<Option<Row>, StoreError> {
        let statement = self.statement(sql)?;
        self.tx.query_opt(&statement, params).map_err(error)
    }

    pub(super) fn one(&mut self, sql: &str, params: Params<'_>) -> Result<Row, StoreError> {
        let statement = self.statement(sql)?;
        self.tx.query_one(&statement, params).map_err(error)
    }

    pub(super) fn commit(self) -> Result<(), StoreError> {
        self.tx.commit().map_err(error)
    }
}

/// What a PostgreSQL error means to the store. A lost connection, a server shutting down or
/// starting up, and a cancelled (timed out) statement are `Unavailable`: worth trying again
/// in a moment, never a crash.
pub(super) fn error(error: postgres::Error) -> StoreError {
    use postgres::error::SqlState;
    let Some(db) = error.as_db_error() else {
        return StoreError::Unavailable(format!("PostgreSQL: {error}"));
    };
    let code = db.code();
    if *code == SqlState::FOREIGN_KEY_VIOLATION {
        // Every foreign key but a manifest's entries points at `sessions`.
        return StoreError::MissingSession;
    }
    if *code == SqlState::CHARACTER_NOT_IN_REPERTOIRE {
        // A NUL in text, which PostgreSQL's text cannot hold (SQLite's can).
        return StoreError::Unrepresentable(db.message().to_string());
    }
    if *code == SqlState::UNIQUE_VIOLATION {
        return StoreError::Conflict(db.message().to_string());
    }
    let class = &code.code()[..2];
    // 08: connection exception; 57: operator intervention (shutdown, cancelled statement);
    // 53: insufficient resources (too many connections).
    if matches!(class, "08" | "57" | "53") {
        return StoreError::Unavailable(format!("PostgreSQL: {}", db.message()));
    }
    StoreError::Backend(format!("PostgreSQL: {} ({})", db.message(), code.code()))
}

/// Opens connections for the pool.
pub(super) struct Manager {
    pub(super) url: String,
}

impl r2d2::ManageConnection for Manager {
    type Connection = Conn;
    type Error = super::PgError;

    fn connect(&self) -> Result<Conn, super::PgError> {
        super::connect(&self.url).map(Conn::new)
    }

    fn is_valid(&self, conn: &mut Conn) -> Result<(), super::PgError> {
        conn.client.simple_query("").map(|_| ()).map_err(super::PgError::from)
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        conn.client.is_closed()
    }
}

/// The readers' connections.
pub(super) struct Pool {
    pool: r2d2::Pool<Manager>,
}

/// How long a read waits for a connection before it answers `Unavailable`.
const CHECKOUT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

impl Pool {
    pub(super) fn new(url: &str, size: u32) -> Pool {
        let pool = r2d2::Pool::builder()
            .max_size(size.max(1))
            .min_idle(Some(0))
            // A checkout does not ping: a dead connection is found by its first statement,
            // and `with` tries once more.
            .test_on_check_out(false)
            .connection_timeout(CHECKOUT_TIMEOUT)
            .error_handler(Box::new(LogErrors))
            .build_unchecked(Manager { url: url.to_string() });
        Pool { pool }
    }

    /// Runs `read` on a pooled connection; once more on another if the first had lost its
    /// server.
    pub(super) fn with<T>(&self, read: impl Fn(&mut Conn) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let mut tries = 0;
        loop {
            let mut conn = self.pool.get().map_err(|e| StoreError::Unavailable(format!("PostgreSQL: {e}")))?;
            match read(&mut conn) {
                Err(StoreError::Unavailable(_)) if conn.client.is_closed() && tries == 0 => tries += 1,
                outcome => return outcome,
            }
        }
    }
}

/// r2d2 logs a failed connection attempt through this: the error never holds the password.
#[derive(Debug)]
struct LogErrors;

impl r2d2::HandleError<super::PgError> for LogErrors {
    fn handle_error(&self, error: super::PgError) {
        log::warn!("{error}");
    }
}

impl super::super::rows::Cells for Row {
    fn text(&self, index: usize) -> Result<String, StoreError> {
        self.try_get(index).map_err(cell)
    }

    fn opt_text(&self, index: usize) -> Result<Option<String>, StoreError> {
        self.try_get(index).map_err(cell)
    }

    fn int(&self, index: usize) -> Result<i64, StoreError> {
        self.try_get(index).map_err(cell)
    }

    fn opt_int(&self, index: usize) -> Result<Option<i64>, StoreError> {
        self.try_get(index).map_err(cell)
    }
}

fn cell(error: postgres::Error) -> StoreError {
    StoreError::Corrupt(error.to_string())
}

/// Rows read by a decoder.
pub(super) fn decode<T>(rows: Vec<Row>, read: impl Fn(&Row) -> Result<T, StoreError>) -> Result<Vec<T>, StoreError> {
    rows.iter().map(read).collect()
}
