//! The BAE client API's tables in PostgreSQL: `BaeWrite`s in the writer's transaction, and
//! the `BaeReads` (lists page by each table's `seq`, as in SQLite).

use super::super::bae::{BaeSessionRecord, BaeState, BaeWrite, KeyRecord, Page, ProfileRecord};
use super::super::rows::{self, BAE_SESSION_COLUMNS, KEY_COLUMNS, PROFILE_COLUMNS};
use super::super::StoreError;
use super::conn::{Conn, Tx};
use super::Postgres;
use crate::auth::keys::KeyRole;

pub(super) fn apply(tx: &mut Tx<'_>, write: &BaeWrite) -> Result<(), StoreError> {
    match write {
        BaeWrite::InsertProfile(profile) => {
            let [fallbacks, servers, tools, sandboxes, budget] = profile_json(profile)?;
            tx.exec(
                "INSERT INTO bae_profiles (id, name, primary_provider, fallback_providers, mcp_servers, allowed_tools,
                                           available_sandboxes, created_at, updated_at, budget)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                &[
                    &profile.id,
                    &profile.name,
                    &profile.primary_provider,
                    &fallbacks,
                    &servers,
                    &tools,
                    &sandboxes,
                    &profile.created_at,
                    &profile.updated_at,
                    &budget,
                ],
            )?;
            Ok(())
        }
        BaeWrite::ReplaceProfile(profile) => {
            let [fallbacks, servers, tools, sandboxes, budget] = profile_json(profile)?;
            let changed = tx.exec(
                "UPDATE bae_profiles SET name = $2, primary_provider = $3, fallback_providers = $4, mcp_servers = $5,
                        allowed_tools = $6, available_sandboxes = $7, updated_at = $8, budget = $9
                 WHERE id = $1 AND deleted_at IS NULL",
                &[
                    &profile.id,
                    &profile.name,
                    &profile.primary_provider,
                    &fallbacks,
                    &servers,
                    &tools,
                    &sandboxes,
                    &profile.updated_at,
                    &budget,
                ],
            )?;
            found(changed)
        }
        BaeWrite::DeleteProfile { id, at } => delete_profile(tx, id, at),
        BaeWrite::InsertKey { key, digest } => insert_key(tx, key, digest),
        BaeWrite::TouchKey { id, at } => {
            tx.exec("UPDATE bae_keys SET last_used_at = $2 WHERE id = $1", &[id, at])?;
            Ok(())
        }
        BaeWrite::RevokeClientKey { id, at } => {
            let changed = tx.exec(
                "UPDATE bae_keys SET deleted_at = $2 WHERE id = $1 AND role = 'client' AND deleted_at IS NULL",
                &[id, at],
            )?;
            found(changed)?;
            tx.exec(
                "UPDATE bae_keys SET deleted_at = $2 WHERE role = 'session' AND client_id = $1 AND deleted_at IS NULL",
                &[id, at],
            )?;
            Ok(())
        }
        BaeWrite::RevokeAdminKeys { at } => {
            tx.exec("UPDATE bae_keys SET deleted_at = $1 WHERE role = 'admin' AND deleted_at IS NULL", &[at])?;
            Ok(())
        }
        BaeWrite::InsertSession(session) => insert_session(tx, session),
        BaeWrite::SetClientTools { session_id, key_id, tools, sandbox_tools, subagent_tools } => {
            let changed = tx.exec(
                "UPDATE bae_sessions SET
                     client_tools = (client_tools::jsonb || jsonb_build_object($2::text, $3::text::jsonb))::text,
                     sandbox_tools = (sandbox_tools::jsonb || jsonb_build_object($2::text, $4::text::jsonb))::text,
                     subagent_tools = (subagent_tools::jsonb || jsonb_build_object($2::text, $5::text::jsonb))::text
                 WHERE id = $1",
                &[session_id, key_id, &json_text(tools)?, &json_text(sandbox_tools)?, &json_text(subagent_tools)?],
            )?;
            found(changed)
        }
        BaeWrite::ReplaceClientTools { session_id, key_id, tools } => {
            let changed = tx.exec(
                "UPDATE bae_sessions SET
                     client_tools = (client_tools::jsonb || jsonb_build_object($2::text, $3::text::jsonb))::text
                 WHERE id = $1",
                &[session_id, key_id, &json_text(tools)?],
            )?;
            found(changed)
        }
        BaeWrite::EndSession { id, state, at } => {
            let changed = tx.exec(
                "UPDATE bae_sessions SET state = $2, closed_at = $3 WHERE id = $1 AND state = 'open'",
                &[id, &state.as_str(), at],
            )?;
            found(changed)
        }
    }
}

fn found(changed: u64) -> Result<(), StoreError> {
    match changed {
        0 => Err(StoreError::NotFound),
        _ => Ok(()),
    }
}

fn json_text(value: &impl serde::Serialize) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// A profile's JSON columns: fallbacks, MCP servers, tools, sandboxes and budget.
fn profile_json(p: &ProfileRecord) -> Result<[Option<String>; 5], StoreError> {
    Ok([
        Some(json_text(&p.fallback_providers)?),
        Some(json_text(&p.mcp_servers)?),
        Some(json_text(&p.allowed_tools)?),
        Some(json_text(&p.available_sandboxes)?),
        p.budget.as_ref().map(json_text).transpose()?,
    ])
}

fn delete_profile(tx: &mut Tx<'_>, id: &str, at: &str) -> Result<(), StoreError> {
    if tx.opt("SELECT 1 FROM bae_profiles WHERE id = $1 AND deleted_at IS NULL", &[&id])?.is_none() {
        return Err(StoreError::NotFound);
    }
    let keys: i64 = tx
        .one("SELECT count(*) FROM bae_keys WHERE role = 'client' AND profile_id = $1 AND deleted_at IS NULL", &[&id])?
        .get(0);
    if keys > 0 {
        return Err(StoreError::InUse(keys as u64));
    }
    tx.exec("UPDATE bae_profiles SET deleted_at = $2 WHERE id = $1", &[&id, &at])?;
    Ok(())
}

fn insert_key(tx: &mut Tx<'_>, k: &KeyRecord, digest: &str) -> Result<(), StoreError> {
    if k.role == KeyRole::Client {
        let profile = k.profile_id.as_deref().unwrap_or_default();
        if tx.opt("SELECT 1 FROM bae_profiles WHERE id = $1 AND deleted_at IS NULL", &[&profile])?.is_none() {
            return Err(StoreError::NotFound);
        }
    }
    tx.exec(
        "INSERT INTO bae_keys (id, name, role, digest, prefix, profile_id, client_id, session_id, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        &[
            &k.id,
            &k.name,
            &k.role.as_str(),
            &digest,
            &k.prefix,
            &k.profile_id,
            &k.client_id,
            &k.session_id,
            &k.created_at,
        ],
    )?;
    Ok(())
}

fn insert_session(tx: &mut Tx<'_>, s: &BaeSessionRecord) -> Result<(), StoreError> {
    tx.exec(
        "INSERT INTO bae_sessions (id, creator_key_id, profile_id, state, client_version, client_tools,
                                   sandbox_tools, subagent_tools, compaction, created_at, closed_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        &[
            &s.id,
            &s.creator_key_id,
            &s.profile_id,
            &s.state.as_str(),
            &s.client_version,
            &json_text(&s.client_tools)?,
            &json_text(&s.sandbox_tools)?,
            &json_text(&s.subagent_tools)?,
            &s.compaction.as_ref().map(json_text).transpose()?,
            &s.created_at,
            &s.closed_at,
        ],
    )?;
    Ok(())
}

/// Runs a paged query (`$1` the cursor, `$2` the limit plus one, then `extra`).
fn page<T>(
    conn: &mut Conn,
    sql: &str,
    (after, limit): (u64, usize),
    extra: Option<&str>,
    read: impl Fn(&postgres::Row) -> Result<(u64, T), StoreError>,
) -> Result<Page<T>, StoreError> {
    let rows = conn.query(sql, &[&(after as i64), &(limit as i64 + 1), &extra])?;
    Ok(Page::of(rows.iter().map(read).collect::<Result<_, _>>()?, limit))
}

impl super::super::contract::BaeReads for Postgres {
    fn bae_profile(&self, id: &str) -> Result<Option<ProfileRecord>, StoreError> {
        self.with(|conn| {
            let sql = format!("SELECT {PROFILE_COLUMNS} FROM bae_profiles WHERE id = $1 AND deleted_at IS NULL");
            Ok(conn.opt(&sql, &[&id])?.map(|row| rows::profile(&row)).transpose()?.map(|(_, p)| p))
        })
    }

    fn bae_profiles(&self, after: u64, limit: usize) -> Result<Page<ProfileRecord>, StoreError> {
        self.with(|conn| {
            let sql = format!(
                "SELECT {PROFILE_COLUMNS} FROM bae_profiles WHERE deleted_at IS NULL AND seq > $1 AND $3::text IS NULL
                 ORDER BY seq LIMIT $2"
            );
            page(conn, &sql, (after, limit), None, rows::profile)
        })
    }

    fn bae_key_by_digest(&self, role: KeyRole, digest: &str) -> Result<Option<KeyRecord>, StoreError> {
        self.with(|conn| {
            let sql =
                format!("SELECT {KEY_COLUMNS} FROM bae_keys WHERE digest = $1 AND role = $2 AND deleted_at IS NULL");
            Ok(conn.opt(&sql, &[&digest, &role.as_str()])?.map(|row| rows::key(&row)).transpose()?.map(|(_, k)| k))
        })
    }

    fn bae_client_keys(&self, after: u64, limit: usize) -> Result<Page<KeyRecord>, StoreError> {
        self.with(|conn| {
            let sql = format!(
                "SELECT {KEY_COLUMNS} FROM bae_keys WHERE role = 'client' AND deleted_at IS NULL AND seq > $1
                 AND $3::text IS NULL ORDER BY seq LIMIT $2"
            );
            page(conn, &sql, (after, limit), None, rows::key)
        })
    }

    fn bae_admin_key_exists(&self) -> Result<bool, StoreError> {
        self.with(|conn| {
            let sql = "SELECT 1 FROM bae_keys WHERE role = 'admin' AND deleted_at IS NULL LIMIT 1";
            Ok(conn.opt(sql, &[])?.is_some())
        })
    }

    fn bae_session_key_count(&self, session_id: &str) -> Result<u64, StoreError> {
        self.with(|conn| {
            let sql = "SELECT count(*) FROM bae_keys WHERE role = 'session' AND session_id = $1 AND deleted_at IS NULL";
            Ok(conn.one(sql, &[&session_id])?.get::<_, i64>(0) as u64)
        })
    }

    fn bae_sessions_of_key(&self, client_id: &str) -> Result<Vec<String>, StoreError> {
        self.with(|conn| {
            let sql = "SELECT DISTINCT session_id FROM bae_keys WHERE role = 'session' AND client_id = $1
                       ORDER BY session_id";
            Ok(conn.query(sql, &[&client_id])?.iter().map(|row| row.get(0)).collect())
        })
    }

    fn bae_session(&self, id: &str) -> Result<Option<BaeSessionRecord>, StoreError> {
        self.with(|conn| {
            let sql = format!("SELECT {BAE_SESSION_COLUMNS} FROM bae_sessions WHERE id = $1");
            Ok(conn.opt(&sql, &[&id])?.map(|row| rows::bae_session(&row)).transpose()?.map(|(_, s)| s))
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
                "SELECT {BAE_SESSION_COLUMNS} FROM bae_sessions WHERE seq > $1 AND ($3::text IS NULL OR state = $3)
                 ORDER BY seq LIMIT $2"
            );
            page(conn, &sql, (after, limit), state.map(BaeState::as_str), rows::bae_session)
        })
    }
}
