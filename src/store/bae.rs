//! The BAE client API's tables: profiles, keys and BAE sessions, and the event history read
//! by cursor.
//!
//! Writes are `BaeWrite`s, applied by the writer thread like every other `WriteOp`; reads run
//! on the caller's thread. Lists page by the table's `seq` (the opaque cursor), fetching one
//! row more than asked to know whether another page follows.

use rusqlite::{params, OptionalExtension, Row, Transaction};
use serde_json::{Map, Value};

use super::rows::{self, BAE_SESSION_COLUMNS, KEY_COLUMNS, PROFILE_COLUMNS};
use super::{LoggedEvent, StoreError};
use crate::auth::keys::KeyRole;

/// The tenant of every BAE session's engine session. Kestrel tenant names cannot start with
/// `@`, so no Kestrel caller ever sees one.
pub const BAE_TENANT: &str = "@bae";

#[derive(Debug, Clone, PartialEq)]
pub struct ProfileRecord {
    pub id: String,
    pub name: String,
    pub primary_provider: String,
    pub fallback_providers: Vec<String>,
    pub mcp_servers: Vec<String>,
    /// As written: an array whose elements are not type-checked.
    pub allowed_tools: Vec<Value>,
    pub available_sandboxes: Vec<String>,
    pub created_at: String,
    pub updated_at: String,
    /// Kestrel's extension: what the profile's sessions may spend (`None`: the server's).
    pub budget: Option<crate::policy::Budget>,
}

impl ProfileRecord {
    /// Whether a tool name is in `allowed_tools` (empty: none is).
    pub fn allows(&self, tool: &str) -> bool {
        self.allowed_tools.iter().any(|allowed| allowed.as_str() == Some(tool))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct KeyRecord {
    pub id: String,
    pub name: String,
    pub role: KeyRole,
    pub prefix: String,
    pub profile_id: Option<String>,
    /// A session key's client key.
    pub client_id: Option<String>,
    /// A session key's session.
    pub session_id: Option<String>,
    pub created_at: String,
    pub last_used_at: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaeState {
    Open,
    Closed,
    Error,
}

impl BaeState {
    pub fn as_str(self) -> &'static str {
        match self {
            BaeState::Open => "open",
            BaeState::Closed => "closed",
            BaeState::Error => "error",
        }
    }

    pub fn parse(text: &str) -> Option<BaeState> {
        Some(match text {
            "open" => BaeState::Open,
            "closed" => BaeState::Closed,
            "error" => BaeState::Error,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct BaeSessionRecord {
    pub id: String,
    pub creator_key_id: String,
    pub profile_id: String,
    pub state: BaeState,
    pub client_version: Option<String>,
    /// Each client key's declared tools, by key id.
    pub client_tools: Map<String, Value>,
    pub sandbox_tools: Map<String, Value>,
    pub subagent_tools: Map<String, Value>,
    /// The compaction setting given at creation.
    pub compaction: Option<Value>,
    pub created_at: String,
    pub closed_at: Option<String>,
}

/// One page of a list, and the cursor of the next (`None` on the last).
#[derive(Debug, Clone)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next: Option<u64>,
}

impl<T> Page<T> {
    /// A page of up to `limit` of `items` (read with one more than `limit`, to know whether
    /// another page follows), each with its cursor.
    pub(crate) fn of(mut items: Vec<(u64, T)>, limit: usize) -> Page<T> {
        let more = items.len() > limit;
        items.truncate(limit);
        let next = if more { items.last().map(|(seq, _)| *seq) } else { None };
        Page { items: items.into_iter().map(|(_, item)| item).collect(), next }
    }
}

pub type EventPage = Page<LoggedEvent>;

/// A change to the BAE tables.
#[derive(Debug, Clone)]
pub enum BaeWrite {
    InsertProfile(ProfileRecord),
    /// Replaces every field but the id and `created_at`; `NotFound` if deleted or absent.
    ReplaceProfile(ProfileRecord),
    /// Soft-deletes; `NotFound`, or `InUse` while active client keys name the profile.
    DeleteProfile {
        id: String,
        at: String,
    },
    /// A new key and its digest. A client key's profile must be active (else `NotFound`).
    InsertKey {
        key: KeyRecord,
        digest: String,
    },
    TouchKey {
        id: String,
        at: String,
    },
    /// Soft-deletes an active client key and every session key minted for it; `NotFound`
    /// if it is not an active client key.
    RevokeClientKey {
        id: String,
        at: String,
    },
    /// Soft-deletes every admin key (rotation).
    RevokeAdminKeys {
        at: String,
    },
    InsertSession(BaeSessionRecord),
    /// A client's declared tools on a session (join replaces its entries).
    SetClientTools {
        session_id: String,
        key_id: String,
        tools: Value,
        sandbox_tools: Value,
        subagent_tools: Value,
    },
    /// `session.updateClientTools`: the client's tools, as sent.
    ReplaceClientTools {
        session_id: String,
        key_id: String,
        tools: Value,
    },
    /// Moves an open session to a terminal state; `NotFound` unless it was open.
    EndSession {
        id: String,
        state: BaeState,
        at: String,
    },
}

pub(super) fn apply(tx: &Transaction<'_>, write: &BaeWrite) -> Result<(), StoreError> {
    match write {
        BaeWrite::InsertProfile(profile) => insert_profile(tx, profile),
        BaeWrite::ReplaceProfile(profile) => replace_profile(tx, profile),
        BaeWrite::DeleteProfile { id, at } => delete_profile(tx, id, at),
        BaeWrite::InsertKey { key, digest } => insert_key(tx, key, digest),
        BaeWrite::TouchKey { id, at } => {
            tx.prepare_cached("UPDATE bae_keys SET last_used_at = ?2 WHERE id = ?1")?.execute(params![id, at])?;
            Ok(())
        }
        BaeWrite::RevokeClientKey { id, at } => revoke_client_key(tx, id, at),
        BaeWrite::RevokeAdminKeys { at } => {
            tx.prepare_cached("UPDATE bae_keys SET deleted_at = ?1 WHERE role = 'admin' AND deleted_at IS NULL")?
                .execute([at])?;
            Ok(())
        }
        BaeWrite::InsertSession(session) => insert_session(tx, session),
        BaeWrite::SetClientTools { session_id, key_id, tools, sandbox_tools, subagent_tools } => {
            let columns =
                [("client_tools", tools), ("sandbox_tools", sandbox_tools), ("subagent_tools", subagent_tools)];
            for (column, value) in columns {
                set_tool_entry(tx, session_id, column, key_id, value)?;
            }
            Ok(())
        }
        BaeWrite::ReplaceClientTools { session_id, key_id, tools } => {
            set_tool_entry(tx, session_id, "client_tools", key_id, tools)
        }
        BaeWrite::EndSession { id, state, at } => {
            let changed = tx
                .prepare_cached("UPDATE bae_sessions SET state = ?2, closed_at = ?3 WHERE id = ?1 AND state = 'open'")?
                .execute(params![id, state.as_str(), at])?;
            if changed == 0 {
                return Err(StoreError::NotFound);
            }
            Ok(())
        }
    }
}

fn json_text(value: &impl serde::Serialize) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn insert_profile(tx: &Transaction<'_>, p: &ProfileRecord) -> Result<(), StoreError> {
    tx.prepare_cached(
        "INSERT INTO bae_profiles (id, name, primary_provider, fallback_providers, mcp_servers, allowed_tools,
                                   available_sandboxes, created_at, updated_at, budget)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?
    .execute(params![
        p.id,
        p.name,
        p.primary_provider,
        json_text(&p.fallback_providers)?,
        json_text(&p.mcp_servers)?,
        json_text(&p.allowed_tools)?,
        json_text(&p.available_sandboxes)?,
        p.created_at,
        p.updated_at,
        p.budget.as_ref().map(json_text).transpose()?
    ])?;
    Ok(())
}

fn replace_profile(tx: &Transaction<'_>, p: &ProfileRecord) -> Result<(), StoreError> {
    let changed = tx
        .prepare_cached(
            "UPDATE bae_profiles SET name = ?2, primary_provider = ?3, fallback_providers = ?4, mcp_servers = ?5,
                    allowed_tools = ?6, available_sandboxes = ?7, updated_at = ?8, budget = ?9
             WHERE id = ?1 AND deleted_at IS NULL",
        )?
        .execute(params![
            p.id,
            p.name,
            p.primary_provider,
            json_text(&p.fallback_providers)?,
            json_text(&p.mcp_servers)?,
            json_text(&p.allowed_tools)?,
            json_text(&p.available_sandboxes)?,
            p.updated_at,
            p.budget.as_ref().map(json_text).transpose()?
        ])?;
    if changed == 0 {
        return Err(StoreError::NotFound);
    }
    Ok(())
}

fn delete_profile(tx: &Transaction<'_>, id: &str, at: &str) -> Result<(), StoreError> {
    let exists: Option<i64> = tx
        .prepare_cached("SELECT 1 FROM bae_profiles WHERE id = ?1 AND deleted_at IS NULL")?
        .query_row([id], |row| row.get(0))
        .optional()?;
    if exists.is_none() {
        return Err(StoreError::NotFound);
    }
    let keys: i64 = tx
        .prepare_cached(
            "SELECT count(*) FROM bae_keys WHERE role = 'client' AND profile_id = ?1 AND deleted_at IS NULL",
        )?
        .query_row([id], |row| row.get(0))?;
    if keys > 0 {
        return Err(StoreError::InUse(keys as u64));
    }
    tx.prepare_cached("UPDATE bae_profiles SET deleted_at = ?2 WHERE id = ?1")?.execute(params![id, at])?;
    Ok(())
}

fn insert_key(tx: &Transaction<'_>, k: &KeyRecord, digest: &str) -> Result<(), StoreError> {
    if k.role == KeyRole::Client {
        let profile = k.profile_id.as_deref().unwrap_or_default();
        let active: Option<i64> = tx
            .prepare_cached("SELECT 1 FROM bae_profiles WHERE id = ?1 AND deleted_at IS NULL")?
            .query_row([profile], |row| row.get(0))
            .optional()?;
        if active.is_none() {
            return Err(StoreError::NotFound);
        }
    }
    tx.prepare_cached(
        "INSERT INTO bae_keys (id, name, role, digest, prefix, profile_id, client_id, session_id, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )?
    .execute(params![
        k.id,
        k.name,
        k.role.as_str(),
        digest,
        k.prefix,
        k.profile_id,
        k.client_id,
        k.session_id,
        k.created_at
    ])?;
    Ok(())
}

fn revoke_client_key(tx: &Transaction<'_>, id: &str, at: &str) -> Result<(), StoreError> {
    let changed = tx
        .prepare_cached("UPDATE bae_keys SET deleted_at = ?2 WHERE id = ?1 AND role = 'client' AND deleted_at IS NULL")?
        .execute(params![id, at])?;
    if changed == 0 {
        return Err(StoreError::NotFound);
    }
    tx.prepare_cached(
        "UPDATE bae_keys SET deleted_at = ?2 WHERE role = 'session' AND client_id = ?1 AND deleted_at IS NULL",
    )?
    .execute(params![id, at])?;
    Ok(())
}

fn insert_session(tx: &Transaction<'_>, s: &BaeSessionRecord) -> Result<(), StoreError> {
    tx.prepare_cached(
        "INSERT INTO bae_sessions (id, creator_key_id, profile_id, state, client_version, client_tools,
                                   sandbox_tools, subagent_tools, compaction, created_at, closed_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    )?
    .execute(params![
        s.id,
        s.creator_key_id,
        s.profile_id,
        s.state.as_str(),
        s.client_version,
        json_text(&s.client_tools)?,
        json_text(&s.sandbox_tools)?,
        json_text(&s.subagent_tools)?,
        s.compaction.as_ref().map(json_text).transpose()?,
        s.created_at,
        s.closed_at
    ])?;
    Ok(())
}

/// Sets one client's entry in one of a session's per-client tool maps.
fn set_tool_entry(
    tx: &Transaction<'_>,
    session_id: &str,
    column: &str,
    key_id: &str,
    value: &Value,
) -> Result<(), StoreError> {
    // `column` is one of three literals above, never input.
    let sql = format!(
        "UPDATE bae_sessions SET {column} = json_set({column}, '$.' || json_quote(?2), json(?3)) WHERE id = ?1"
    );
    let changed = tx.prepare_cached(&sql)?.execute(params![session_id, key_id, json_text(value)?])?;
    if changed == 0 {
        return Err(StoreError::NotFound);
    }
    Ok(())
}

/// Runs a paged query (`?1` the cursor, `?2` the limit plus one, then `extra`).
fn page<T>(
    conn: &rusqlite::Connection,
    sql: &str,
    after: u64,
    limit: usize,
    extra: Option<&str>,
    read: impl Fn(&Row<'_>) -> Result<(u64, T), StoreError>,
) -> Result<Page<T>, StoreError> {
    let mut statement = conn.prepare_cached(sql)?;
    let rows = statement.query_map(params![after as i64, limit as i64 + 1, extra], |row| Ok(read(row)))?;
    let mut items = Vec::new();
    for row in rows {
        items.push(row??);
    }
    Ok(Page::of(items, limit))
}

impl super::contract::BaeReads for super::sqlite::Sqlite {
    /// An active (not deleted) profile.
    fn bae_profile(&self, id: &str) -> Result<Option<ProfileRecord>, StoreError> {
        self.with(|conn| {
            let sql = format!("SELECT {PROFILE_COLUMNS} FROM bae_profiles WHERE id = ?1 AND deleted_at IS NULL");
            Ok(conn
                .prepare_cached(&sql)?
                .query_row([id], |row| Ok(rows::profile(row)))
                .optional()?
                .transpose()?
                .map(|(_, p)| p))
        })
    }

    fn bae_profiles(&self, after: u64, limit: usize) -> Result<Page<ProfileRecord>, StoreError> {
        self.with(|conn| {
            let sql = format!(
                "SELECT {PROFILE_COLUMNS} FROM bae_profiles WHERE deleted_at IS NULL AND seq > ?1 AND ?3 IS NULL
                 ORDER BY seq LIMIT ?2"
            );
            page(conn, &sql, after, limit, None, |row| rows::profile(row))
        })
    }

    /// The active key of `role` whose digest this is.
    fn bae_key_by_digest(&self, role: KeyRole, digest: &str) -> Result<Option<KeyRecord>, StoreError> {
        self.with(|conn| {
            let sql =
                format!("SELECT {KEY_COLUMNS} FROM bae_keys WHERE digest = ?1 AND role = ?2 AND deleted_at IS NULL");
            Ok(conn
                .prepare_cached(&sql)?
                .query_row(params![digest, role.as_str()], |row| Ok(rows::key(row)))
                .optional()?
                .transpose()?
                .map(|(_, k)| k))
        })
    }

    fn bae_client_keys(&self, after: u64, limit: usize) -> Result<Page<KeyRecord>, StoreError> {
        self.with(|conn| {
            let sql = format!(
                "SELECT {KEY_COLUMNS} FROM bae_keys WHERE role = 'client' AND deleted_at IS NULL AND seq > ?1
                 AND ?3 IS NULL ORDER BY seq LIMIT ?2"
            );
            page(conn, &sql, after, limit, None, |row| rows::key(row))
        })
    }

    fn bae_admin_key_exists(&self) -> Result<bool, StoreError> {
        self.with(|conn| {
            let found: Option<i64> = conn
                .prepare_cached("SELECT 1 FROM bae_keys WHERE role = 'admin' AND deleted_at IS NULL LIMIT 1")?
                .query_row([], |row| row.get(0))
                .optional()?;
            Ok(found.is_some())
        })
    }

    /// Active session keys of a session.
    fn bae_session_key_count(&self, session_id: &str) -> Result<u64, StoreError> {
        self.with(|conn| {
            let count: i64 = conn
                .prepare_cached(
                    "SELECT count(*) FROM bae_keys WHERE role = 'session' AND session_id = ?1 AND deleted_at IS NULL",
                )?
                .query_row([session_id], |row| row.get(0))?;
            Ok(count as u64)
        })
    }

    /// The sessions a client key holds (or held) session keys for.
    fn bae_sessions_of_key(&self, client_id: &str) -> Result<Vec<String>, StoreError> {
        self.with(|conn| {
            let mut statement = conn.prepare_cached(
                "SELECT DISTINCT session_id FROM bae_keys WHERE role = 'session' AND client_id = ?1 ORDER BY session_id",
            )?;
            let rows = statement.query_map([client_id], |row| row.get::<_, String>(0))?;
            let mut ids = Vec::new();
            for id in rows {
                ids.push(id?);
            }
            Ok(ids)
        })
    }

    fn bae_session(&self, id: &str) -> Result<Option<BaeSessionRecord>, StoreError> {
        self.with(|conn| {
            let sql = format!("SELECT {BAE_SESSION_COLUMNS} FROM bae_sessions WHERE id = ?1");
            let found = conn.prepare_cached(&sql)?.query_row([id], |row| Ok(rows::bae_session(row))).optional()?;
            Ok(found.transpose()?.map(|(_, s)| s))
        })
    }

    fn bae_sessions(
        &self,
        after: u64,
        limit: usize,
        state: Option<BaeState>,
    ) -> Result<Page<BaeSessionRecord>, StoreError> {
        self.with(|conn| {
            let sql = format!(
                "SELECT {BAE_SESSION_COLUMNS} FROM bae_sessions WHERE seq > ?1 AND (?3 IS NULL OR state = ?3)
                 ORDER BY seq LIMIT ?2"
            );
            page(conn, &sql, after, limit, state.map(BaeState::as_str), |row| rows::bae_session(row))
        })
    }
}
