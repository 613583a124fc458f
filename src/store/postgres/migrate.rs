//! The PostgreSQL schema's versions, applied in order, each in a transaction of its own that
//! also records it in `schema_migrations`. A session-level advisory lock is held around the
//! whole run, so of several processes starting at once one applies and the others find the
//! versions applied.

use super::PgError;

/// The schema's versions, in order.
pub const VERSIONS: &[(i32, &str)] = &[
    (1, include_str!("schema/0001_init.sql")),
    (2, include_str!("schema/0002_cluster.sql")),
    (3, include_str!("schema/0003_cluster_secrets.sql")),
];

/// The advisory lock's key: "kestrel" in ASCII, so it does not collide with another app's
/// lock on the same database by accident.
const LOCK_KEY: i64 = 0x006b_6573_7472_656c;

/// What a run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migrated {
    /// The versions this run applied (none when another had).
    pub applied: Vec<i32>,
    /// The schema's version now.
    pub version: i32,
}

/// Applies every version the database lacks; a database of a later version than this binary
/// knows is refused.
pub fn migrate(client: &mut postgres::Client) -> Result<Migrated, PgError> {
    client.execute("SELECT pg_advisory_lock($1)", &[&LOCK_KEY])?;
    let outcome = apply_missing(client);
    let unlocked = client.execute("SELECT pg_advisory_unlock($1)", &[&LOCK_KEY]);
    let migrated = outcome?;
    unlocked?;
    Ok(migrated)
}

fn apply_missing(client: &mut postgres::Client) -> Result<Migrated, PgError> {
    client.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
             version    INTEGER PRIMARY KEY,
             applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
         )",
    )?;
    let row = client.query_one("SELECT coalesce(max(version), 0) FROM schema_migrations", &[])?;
    let current: i32 = row.get(0);
    let known = VERSIONS.last().map_or(0, |(version, _)| *version);
    if current > known {
        return Err(PgError::Server(format!(
            "the database's schema is version {current}, newer than this binary's {known}; upgrade Kestrel"
        )));
    }
    let mut applied = Vec::new();
    for (version, sql) in VERSIONS.iter().filter(|(version, _)| *version > current) {
        let mut transaction = client.transaction()?;
        transaction.batch_execute(sql)?;
        transaction.execute("INSERT INTO schema_migrations (version) VALUES ($1)", &[version])?;
        transaction.commit()?;
        applied.push(*version);
    }
    Ok(Migrated { applied, version: known })
}
