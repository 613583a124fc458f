//! Reads of sessions, transcripts and the event log in PostgreSQL, on pooled connections.
//! Each read is one statement at READ COMMITTED (it sees what was committed when it began);
//! a page of the session list reads in one REPEATABLE READ snapshot.

use std::collections::{HashMap, HashSet};

use super::super::contract::{LogReads, SessionReads};
use super::super::reader::EventQuery;
use super::super::rows::{self, EVENT_COLUMNS, SESSION_COLUMNS, SUMMARY_COLUMNS};
use super::super::{
    IdempotentAnswer, LoggedEvent, Page, SessionWalk, StoreError, UnsettledCall, WalkPage, Walked, IDEMPOTENCY_TTL_MS,
};
use super::conn::decode;
use super::Postgres;
use crate::domain::{Message, SessionRecord, SessionStatus, SessionSummary};

impl SessionReads for Postgres {
    fn session(&self, id: &str) -> Result<Option<SessionRecord>, StoreError> {
        self.with(|conn| {
            let sql = format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE id = $1");
            conn.opt(&sql, &[&id])?.map(|row| rows::session(&row)).transpose()
        })
    }

    fn sessions_of(&self, tenant: &str) -> Result<Vec<SessionSummary>, StoreError> {
        self.with(|conn| {
            let sql =
                format!("SELECT {SUMMARY_COLUMNS} FROM sessions WHERE tenant = $1 ORDER BY updated_at DESC, id DESC");
            decode(conn.query(&sql, &[&tenant])?, rows::summary)
        })
    }

    fn sessions_version(&self) -> Result<i64, StoreError> {
        self.with(|conn| Ok(conn.one("SELECT value FROM meta WHERE key = 'session_moves'", &[])?.get(0)))
    }

    fn sessions_page(&self, tenant: &str, walk: &SessionWalk, limit: usize) -> Result<WalkPage, StoreError> {
        self.with(|conn| {
            let mut snapshot = conn.snapshot()?;
            let as_of = match walk.as_of {
                Some(as_of) => as_of,
                None => snapshot.one("SELECT value FROM meta WHERE key = 'session_moves'", &[])?.get(0),
            };
            // Every session moved since the start, with where it stood then (`None`: created
            // since).
            let moved: HashMap<String, Option<String>> = snapshot
                .query(
                    "SELECT DISTINCT ON (session_id) session_id, from_updated_at FROM session_moves
                     WHERE tick > $1 ORDER BY session_id, tick",
                    &[&as_of],
                )?
                .iter()
                .map(|row| (row.get(0), row.get(1)))
                .collect();
            // PostgreSQL's text holds no NUL: a place with one (a forged cursor) is cut there.
            let cut = |text: &'_ str| text.split('\0').next().unwrap_or_default().to_string();
            let after = walk.after.as_ref().map(|(position, id)| (cut(position), cut(id)));
            let below = after.as_ref().map_or(("~", ""), |(position, id)| (position.as_str(), id.as_str()));
            let sql = format!(
                "SELECT {SUMMARY_COLUMNS} FROM sessions
                 WHERE tenant = $1 AND (updated_at, id) < ($2, $3) ORDER BY updated_at DESC, id DESC LIMIT $4"
            );
            let unmoved = snapshot.query(&sql, &[&tenant, &below.0, &below.1, &((limit + moved.len()) as i64)])?;
            let mut page = Vec::new();
            for row in &unmoved {
                let summary = rows::summary(row)?;
                if !moved.contains_key(&summary.id) {
                    page.push(Walked { position: summary.updated_at.clone(), summary });
                }
            }
            let by_id = format!("SELECT {SUMMARY_COLUMNS} FROM sessions WHERE id = $1 AND tenant = $2");
            for (id, place) in &moved {
                let Some(place) = place.as_deref().filter(|place| (*place, id.as_str()) < below) else { continue };
                if let Some(row) = snapshot.opt(&by_id, &[id, &tenant])? {
                    page.push(Walked { position: place.to_string(), summary: rows::summary(&row)? });
                }
            }
            snapshot.commit()?;
            Ok(super::super::walked_page(as_of, page, limit))
        })
    }

    fn messages(&self, session_id: &str) -> Result<Vec<Message>, StoreError> {
        self.with(|conn| {
            let rows =
                conn.query("SELECT body, form FROM messages WHERE session_id = $1 ORDER BY ord", &[&session_id])?;
            rows.iter().map(|row| super::super::decode_message(row.get(0), row.get(1))).collect()
        })
    }

    fn messages_by_id(&self, session_id: &str, ids: &[String]) -> Result<HashMap<String, Message>, StoreError> {
        self.with(|conn| {
            let rows = conn.query(
                "SELECT id, body, form FROM messages WHERE session_id = $1 AND id = ANY($2)",
                &[&session_id, &ids],
            )?;
            rows.iter().map(|row| Ok((row.get(0), super::super::decode_message(row.get(1), row.get(2))?))).collect()
        })
    }

    fn started_calls(&self, session_id: &str) -> Result<HashSet<String>, StoreError> {
        self.with(|conn| {
            let rows = conn.query("SELECT call_id FROM tool_call_starts WHERE session_id = $1", &[&session_id])?;
            Ok(rows.iter().map(|row| row.get(0)).collect())
        })
    }

    fn unsettled_calls(&self, tenant: &str) -> Result<Vec<UnsettledCall>, StoreError> {
        self.with(|conn| {
            let sql = "SELECT s.session_id, s.actor, s.call FROM tool_call_starts s
                       JOIN sessions ON sessions.id = s.session_id
                       WHERE s.settled = 0 AND sessions.tenant = $1 ORDER BY s.ord";
            decode(conn.query(sql, &[&tenant])?, rows::unsettled_call)
        })
    }

    fn idempotent(&self, tenant: &str, key: &str, now_ms: i64) -> Result<Option<IdempotentAnswer>, StoreError> {
        self.with(|conn| {
            let row = conn.opt(
                "SELECT fingerprint, status, body, created_ms FROM idempotency
                 WHERE tenant = $1 AND key = $2 AND created_ms >= $3",
                &[&tenant, &key, &(now_ms - IDEMPOTENCY_TTL_MS)],
            )?;
            row.map(|row| {
                Ok(IdempotentAnswer {
                    tenant: tenant.to_string(),
                    key: key.to_string(),
                    fingerprint: row.get(0),
                    status: u16::try_from(row.get::<_, i64>(1))
                        .map_err(|_| StoreError::Corrupt("an idempotent answer's status".into()))?,
                    body: row.get(2),
                    created_ms: row.get(3),
                })
            })
            .transpose()
        })
    }

    fn sessions_by_status(&self) -> Result<Vec<(SessionStatus, u64)>, StoreError> {
        self.with(|conn| {
            let rows = conn.query("SELECT status, count(*) FROM sessions GROUP BY status", &[])?;
            rows.iter()
                .map(|row| {
                    let status: String = row.get(0);
                    let parsed = SessionStatus::parse(&status)
                        .ok_or_else(|| StoreError::Corrupt(format!("a session status {status:?}")))?;
                    Ok((parsed, row.get::<_, i64>(1) as u64))
                })
                .collect()
        })
    }

    fn session_count(&self) -> Result<u64, StoreError> {
        self.with(|conn| Ok(conn.one("SELECT count(*) FROM sessions", &[])?.get::<_, i64>(0) as u64))
    }
}

impl LogReads for Postgres {
    fn events(&self, query: &EventQuery<'_>, limit: usize) -> Result<Vec<LoggedEvent>, StoreError> {
        self.with(|conn| {
            let (after, before, limit) = (query.after as i64, query.before as i64, limit as i64);
            let rows = match query.session {
                Some(session) => {
                    let sql = format!(
                        "SELECT {EVENT_COLUMNS} FROM events
                         WHERE session_id = $4 AND seq > $1 AND seq < $2 AND (tenant = $3 OR tenant IS NULL)
                         ORDER BY seq LIMIT $5"
                    );
                    conn.query(&sql, &[&after, &before, &query.tenant, &session, &limit])?
                }
                // The tenant's events and the unattributed ones, each a range of
                // `events_by_tenant`, merged in seq order.
                None => {
                    let sql = format!(
                        "(SELECT {EVENT_COLUMNS} FROM events WHERE tenant = $3 AND seq > $1 AND seq < $2
                          ORDER BY seq LIMIT $4)
                         UNION ALL
                         (SELECT {EVENT_COLUMNS} FROM events WHERE tenant IS NULL AND seq > $1 AND seq < $2
                          ORDER BY seq LIMIT $4)
                         ORDER BY seq LIMIT $4"
                    );
                    conn.query(&sql, &[&after, &before, &query.tenant, &limit])?
                }
            };
            decode(rows, rows::logged_event)
        })
    }

    fn events_between(&self, after: u64, upto: u64, limit: usize) -> Result<Vec<LoggedEvent>, StoreError> {
        self.with(|conn| {
            let sql = format!("SELECT {EVENT_COLUMNS} FROM events WHERE seq > $1 AND seq <= $2 ORDER BY seq LIMIT $3");
            let rows = conn.query(&sql, &[&(after as i64), &(upto as i64), &(limit as i64)])?;
            decode(rows, rows::logged_event)
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
            let sql = format!(
                "SELECT {EVENT_COLUMNS} FROM events WHERE session_id = $1 AND seq > $2 AND type = ANY($3)
                 ORDER BY seq LIMIT $4"
            );
            let rows = conn.query(&sql, &[&session_id, &(after as i64), &kinds, &(limit as i64 + 1)])?;
            let items = decode(rows, |row| rows::logged_event(row).map(|event| (event.seq, event)))?;
            Ok(Page::of(items, limit))
        })
    }

    fn event_session(&self, seq: u64) -> Result<Option<String>, StoreError> {
        self.with(|conn| {
            let row = conn.opt("SELECT session_id FROM events WHERE seq = $1", &[&(seq as i64)])?;
            Ok(row.and_then(|row| row.get(0)))
        })
    }

    fn bae_last_actor(&self, session_id: &str, kind: &str) -> Result<Option<String>, StoreError> {
        self.with(|conn| {
            let row = conn.opt(
                "SELECT actor FROM events WHERE session_id = $1 AND type = $2 ORDER BY seq DESC LIMIT 1",
                &[&session_id, &kind],
            )?;
            Ok(row.and_then(|row| row.get(0)))
        })
    }
}
