//! Read-only queries, run on the caller's thread with a pooled connection.
//!
//! WAL lets these readers see the last committed state while the writer works, so a handler
//! never waits for the writer to read. Connections are opened lazily and kept for reuse.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

use rusqlite::{params, Connection, OpenFlags, OptionalExtension};

use super::contract::{LogReads, SessionReads};
use super::rows::{self, EVENT_COLUMNS, SESSION_COLUMNS, SUMMARY_COLUMNS};
use super::{
    IdempotentAnswer, LoggedEvent, Page, SessionWalk, StoreError, UnsettledCall, WalkPage, Walked, IDEMPOTENCY_TTL_MS,
};
use crate::domain::{Message, SessionRecord, SessionStatus, SessionSummary};

/// Idle connections kept for reuse; more may be open at once under load.
const MAX_IDLE: usize = 64;

pub struct ReaderPool {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl ReaderPool {
    pub(super) fn new(path: PathBuf) -> ReaderPool {
        ReaderPool { path, idle: Mutex::new(Vec::new()) }
    }

    pub(super) fn with<T>(&self, query: impl FnOnce(&Connection) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let pooled = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let conn = match pooled {
            Some(conn) => conn,
            None => {
                let conn = Connection::open_with_flags(
                    &self.path,
                    OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )?;
                conn.busy_timeout(std::time::Duration::from_secs(5))?;
                conn
            }
        };
        let result = query(&conn);
        if !conn.is_autocommit() {
            // A read transaction that did not end: the connection would keep its old snapshot.
            return result;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(conn);
        }
        result
    }
}

/// A read transaction on a pooled connection, ended (rolled back: it wrote nothing) when
/// dropped. Its statements are the connection's cached ones: rusqlite's `Transaction` parses
/// `BEGIN` and its end again each time, a few percent of a page of sessions.
struct Snapshot<'c>(&'c Connection);

impl<'c> Snapshot<'c> {
    fn begin(conn: &'c Connection) -> Result<Snapshot<'c>, StoreError> {
        conn.prepare_cached("BEGIN")?.execute([])?;
        Ok(Snapshot(conn))
    }
}

impl std::ops::Deref for Snapshot<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.0
    }
}

impl Drop for Snapshot<'_> {
    fn drop(&mut self) {
        let ended = self.0.prepare_cached("ROLLBACK").and_then(|mut end| end.execute([]));
        if let Err(error) = ended {
            log::warn!("a read transaction did not end cleanly: {error}");
        }
    }
}

impl SessionReads for super::sqlite::Sqlite {
    fn session(&self, id: &str) -> Result<Option<SessionRecord>, StoreError> {
        self.with(|conn| {
            let record = conn
                .prepare_cached(&format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ?1"))?
                .query_row([id], |row| Ok(rows::session(row)))
                .optional()?;
            record.transpose()
        })
    }

    /// A tenant's sessions, most recently updated first.
    fn sessions_of(&self, tenant: &str) -> Result<Vec<SessionSummary>, StoreError> {
        self.with(|conn| {
            let mut statement = conn.prepare_cached(&format!(
                "SELECT {SUMMARY_COLUMNS} FROM sessions INDEXED BY sessions_by_tenant_walk
                 WHERE tenant = ?1 ORDER BY updated_at DESC, id DESC"
            ))?;
            let rows = statement.query_map([tenant], |row| Ok(rows::summary(row)))?;
            let mut sessions = Vec::new();
            for row in rows {
                sessions.push(row??);
            }
            Ok(sessions)
        })
    }

    fn sessions_version(&self) -> Result<i64, StoreError> {
        self.with(|conn| Ok(conn.query_row("SELECT coalesce(max(tick), 0) FROM session_moves", [], |row| row.get(0))?))
    }

    fn sessions_page(&self, tenant: &str, walk: &SessionWalk, limit: usize) -> Result<WalkPage, StoreError> {
        self.with(|conn| {
            // One snapshot for the clock, the moves and the sessions.
            let snapshot = Snapshot::begin(conn)?;
            let as_of = match walk.as_of {
                Some(as_of) => as_of,
                None => snapshot
                    .prepare_cached("SELECT coalesce(max(tick), 0) FROM session_moves")?
                    .query_row([], |row| row.get(0))?,
            };
            // Every session moved since the start, with where it stood then (`None`: it was
            // created since). Few: the moves of one walk's lifetime.
            let mut moves = snapshot.prepare_cached(
                "SELECT session_id, from_updated_at, min(tick) FROM session_moves WHERE tick > ?1 GROUP BY session_id",
            )?;
            let moved = moves
                .query_map([as_of], |row| Ok((row.get::<_, String>(0)?, row.get::<_, Option<String>>(1)?)))?
                .collect::<Result<HashMap<_, _>, _>>()?;
            let below = walk.after.as_ref().map_or(("~", ""), |(position, id)| (position.as_str(), id.as_str()));
            // Those not moved, where they stand: a range of the walk's index, named (left to
            // itself the planner may sort the tenant); a first page starts above every time.
            let mut unmoved = snapshot.prepare_cached(&format!(
                "SELECT {SUMMARY_COLUMNS} FROM sessions INDEXED BY sessions_by_tenant_walk
                 WHERE tenant = ?1 AND (updated_at, id) < (?2, ?3) ORDER BY updated_at DESC, id DESC LIMIT ?4"
            ))?;
            let rows = unmoved.query_map(params![tenant, below.0, below.1, (limit + moved.len()) as i64], |row| {
                Ok(rows::summary(row))
            })?;
            let mut page = Vec::new();
            for row in rows {
                let summary = row??;
                if !moved.contains_key(&summary.id) {
                    page.push(Walked { position: summary.updated_at.clone(), summary });
                }
            }
            // Those moved, at the place they had.
            let mut by_id = snapshot
                .prepare_cached(&format!("SELECT {SUMMARY_COLUMNS} FROM sessions WHERE id = ?1 AND tenant = ?2"))?;
            for (id, place) in &moved {
                let Some(place) = place.as_deref().filter(|place| (*place, id.as_str()) < below) else { continue };
                if let Some(summary) = by_id.query_row(params![id, tenant], |row| Ok(rows::summary(row))).optional()? {
                    page.push(Walked { position: place.to_string(), summary: summary? });
                }
            }
            Ok(super::walked_page(as_of, page, limit))
        })
    }

    fn messages(&self, session_id: &str) -> Result<Vec<Message>, StoreError> {
        self.with(|conn| {
            let mut statement =
                conn.prepare_cached("SELECT body, form FROM messages WHERE session_id = ?1 ORDER BY rowid")?;
            let rows = statement.query_map(params![session_id], |row| Ok((row.get::<_, String>(0)?, row.get(1)?)))?;
            let mut messages = Vec::new();
            for row in rows {
                let (body, form) = row?;
                messages.push(super::decode_message(&body, form)?);
            }
            Ok(messages)
        })
    }

    /// The session's stored messages among `ids`, by id (ids it does not have are left out).
    /// The session's stored messages of `ids`. Requests name a session's messages in the order
    /// they were stored, so a long list is read as one range of the session's rows, from its
    /// first id to its last; only ids the range misses are looked up one by one.
    fn messages_by_id(
        &self,
        session_id: &str,
        ids: &[String],
    ) -> Result<std::collections::HashMap<String, Message>, StoreError> {
        self.with(|conn| {
            let mut found = std::collections::HashMap::with_capacity(ids.len());
            if let (true, Some(first), Some(last)) = (ids.len() > SCAN_FROM, ids.first(), ids.last()) {
                let wanted: std::collections::HashSet<&str> = ids.iter().map(String::as_str).collect();
                let mut statement = conn.prepare_cached(
                    "SELECT id, body, form FROM messages WHERE session_id = ?1
                     AND rowid BETWEEN (SELECT rowid FROM messages WHERE id = ?2) AND (SELECT rowid FROM messages WHERE id = ?3)
                     ORDER BY rowid",
                )?;
                let mut rows = statement.query(params![session_id, first, last])?;
                while let Some(row) = rows.next()? {
                    let id = row.get_ref(0)?.as_str().map_err(rusqlite::Error::from)?;
                    if wanted.contains(id) {
                        let message = super::decode_message(row.get_ref(1)?.as_str().map_err(rusqlite::Error::from)?, row.get(2)?)?;
                        found.insert(id.to_string(), message);
                    }
                }
            }
            let mut statement =
                conn.prepare_cached("SELECT body, form FROM messages WHERE session_id = ?1 AND id = ?2")?;
            let missed: Vec<&String> = ids.iter().filter(|id| !found.contains_key(id.as_str())).collect();
            for id in missed {
                let row: Option<(String, i64)> =
                    statement.query_row(params![session_id, id], |row| Ok((row.get(0)?, row.get(1)?))).optional()?;
                if let Some((body, form)) = row {
                    found.insert(id.clone(), super::decode_message(&body, form)?);
                }
            }
            Ok(found)
        })
    }

    /// The ids of the session's tool calls that were marked as started.
    fn started_calls(&self, session_id: &str) -> Result<std::collections::HashSet<String>, StoreError> {
        self.with(|conn| {
            let mut statement = conn.prepare_cached("SELECT call_id FROM tool_call_starts WHERE session_id = ?1")?;
            let rows = statement.query_map([session_id], |row| row.get::<_, String>(0))?;
            let mut started = std::collections::HashSet::new();
            for id in rows {
                started.insert(id?);
            }
            Ok(started)
        })
    }

    /// The calls of `tenant`'s sessions that were marked as started and never settled, oldest
    /// first: the session, whom its turn acted for, and the call.
    fn unsettled_calls(&self, tenant: &str) -> Result<Vec<UnsettledCall>, StoreError> {
        self.with(|conn| {
            let mut statement = conn.prepare_cached(
                "SELECT s.session_id, s.actor, s.call FROM tool_call_starts s JOIN sessions ON sessions.id = s.session_id
                 WHERE s.settled = 0 AND sessions.tenant = ?1 ORDER BY s.rowid",
            )?;
            let rows = statement.query_map([tenant], |row| Ok(rows::unsettled_call(row)))?;
            rows.map(|row| row?).collect()
        })
    }

    /// The answer stored for a tenant's Idempotency-Key, unless it expired before `now_ms`.
    fn idempotent(&self, tenant: &str, key: &str, now_ms: i64) -> Result<Option<IdempotentAnswer>, StoreError> {
        self.with(|conn| {
            let answer = conn
                .prepare_cached(
                    "SELECT fingerprint, status, body, created_ms FROM idempotency
                     WHERE tenant = ?1 AND key = ?2 AND created_ms >= ?3",
                )?
                .query_row(params![tenant, key, now_ms - IDEMPOTENCY_TTL_MS], |row| {
                    Ok(IdempotentAnswer {
                        tenant: tenant.to_string(),
                        key: key.to_string(),
                        fingerprint: row.get(0)?,
                        status: row.get(1)?,
                        body: row.get(2)?,
                        created_ms: row.get(3)?,
                    })
                })
                .optional()?;
            Ok(answer)
        })
    }

    /// How many sessions have each status.
    fn sessions_by_status(&self) -> Result<Vec<(SessionStatus, u64)>, StoreError> {
        self.with(|conn| {
            let mut statement = conn.prepare_cached("SELECT status, count(*) FROM sessions GROUP BY status")?;
            let rows = statement.query_map([], |row| Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)? as u64)))?;
            let mut counts = Vec::new();
            for row in rows {
                let (status, count) = row?;
                let status = SessionStatus::parse(&status)
                    .ok_or_else(|| StoreError::Corrupt(format!("a session status {status:?}")))?;
                counts.push((status, count));
            }
            Ok(counts)
        })
    }

    fn session_count(&self) -> Result<u64, StoreError> {
        self.with(|conn| Ok(conn.query_row("SELECT count(*) FROM sessions", [], |row| row.get::<_, i64>(0))? as u64))
    }
}

/// From how many ids `messages_by_id` reads a range of rows rather than each row alone.
const SCAN_FROM: usize = 16;

impl LogReads for super::sqlite::Sqlite {
    /// Logged events with `after < seq < before` that `query` admits, in seq order, at most
    /// `limit`.
    fn events(&self, query: &EventQuery<'_>, limit: usize) -> Result<Vec<LoggedEvent>, StoreError> {
        self.with(|conn| {
            let range = (query.after as i64, query.before as i64, limit as i64);
            let Some(session) = query.session else {
                // The tenant's events and the unattributed ones, each a range of
                // `events_by_tenant`, merged: as one query with `OR` the planner collects and
                // sorts everything after `after`, whatever the limit.
                let mut events = events_of(conn, "tenant = ?3", range, query.tenant)?;
                events.extend(events_of(conn, "tenant IS NULL AND ?3 IS NOT NULL", range, query.tenant)?);
                events.sort_unstable_by_key(|event| event.seq);
                events.truncate(limit);
                return Ok(events);
            };
            let mut statement = conn.prepare_cached(&format!(
                "SELECT {EVENT_COLUMNS} FROM events
                 WHERE session_id = ?4 AND seq > ?1 AND seq < ?2 AND (tenant = ?3 OR tenant IS NULL)
                 ORDER BY seq LIMIT ?5"
            ))?;
            let rows = statement.query_map(params![range.0, range.1, query.tenant, session, range.2], |row| {
                Ok(rows::logged_event(row))
            })?;
            rows.map(|row| row?).collect()
        })
    }

    fn events_between(&self, after: u64, upto: u64, limit: usize) -> Result<Vec<LoggedEvent>, StoreError> {
        self.with(|conn| {
            let mut statement = conn.prepare_cached(&format!(
                "SELECT {EVENT_COLUMNS} FROM events WHERE seq > ?1 AND seq <= ?2 ORDER BY seq LIMIT ?3"
            ))?;
            let rows = statement
                .query_map(params![after as i64, upto as i64, limit as i64], |row| Ok(rows::logged_event(row)))?;
            let mut events = Vec::new();
            for row in rows {
                events.push(row??);
            }
            Ok(events)
        })
    }

    fn bae_events(
        &self,
        session_id: &str,
        kinds: &[&str],
        after: u64,
        limit: usize,
    ) -> Result<Page<LoggedEvent>, StoreError> {
        self.with(|conn| {
            let kinds = serde_json::to_string(kinds).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            let mut statement = conn.prepare_cached(&format!(
                "SELECT {EVENT_COLUMNS} FROM events
                 WHERE session_id = ?1 AND seq > ?2 AND type IN (SELECT value FROM json_each(?3))
                 ORDER BY seq LIMIT ?4"
            ))?;
            let rows = statement.query_map(params![session_id, after as i64, kinds, limit as i64 + 1], |row| {
                Ok(rows::logged_event(row))
            })?;
            let mut items = Vec::new();
            for row in rows {
                let event = row??;
                items.push((event.seq, event));
            }
            Ok(Page::of(items, limit))
        })
    }

    /// The session a logged event belongs to, if the event is in the log.
    fn event_session(&self, seq: u64) -> Result<Option<String>, StoreError> {
        self.with(|conn| {
            let session: Option<Option<String>> = conn
                .prepare_cached("SELECT session_id FROM events WHERE seq = ?1")?
                .query_row([seq as i64], |row| row.get(0))
                .optional()?;
            Ok(session.flatten())
        })
    }

    /// A page of a session's logged events whose type is one of `kinds`.
    /// Whom the session's latest event of `kind` is attributed to.
    fn bae_last_actor(&self, session_id: &str, kind: &str) -> Result<Option<String>, StoreError> {
        self.with(|conn| {
            let mut statement = conn.prepare_cached(
                "SELECT actor FROM events WHERE session_id = ?1 AND type = ?2 ORDER BY seq DESC LIMIT 1",
            )?;
            Ok(statement.query_row(params![session_id, kind], |row| row.get(0)).optional()?.flatten())
        })
    }
}

/// Which logged events a replay wants.
#[derive(Debug, Clone, Copy)]
pub struct EventQuery<'a> {
    pub after: u64,
    pub before: u64,
    /// The reader's tenant; events for every tenant are included.
    pub tenant: &'a str,
    /// One session's events, or every session's.
    pub session: Option<&'a str>,
}

/// Up to `range.2` events with `range.0 < seq < range.1` that `filter` (on `?3`, `tenant`)
/// keeps, in seq order.
fn events_of(
    conn: &Connection,
    filter: &str,
    range: (i64, i64, i64),
    tenant: &str,
) -> Result<Vec<LoggedEvent>, StoreError> {
    let mut statement = conn.prepare_cached(&format!(
        "SELECT {EVENT_COLUMNS} FROM events
         WHERE {filter} AND seq > ?1 AND seq < ?2 ORDER BY seq LIMIT ?4"
    ))?;
    let rows = statement.query_map(params![range.0, range.1, tenant, range.2], |row| Ok(rows::logged_event(row)))?;
    rows.map(|row| row?).collect()
}
