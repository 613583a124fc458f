//! Permission rules added through the API or remembered from approvals, and the audit log of
//! every permission decision (`crate::policy`).

use rusqlite::{params, OptionalExtension, Transaction};

use super::rows::{self, AUDIT_COLUMNS, RULE_COLUMNS};
use super::StoreError;
use crate::policy::{AuditEntry, Rule, Source, Spent};

/// A change to the rules or the audit log.
#[derive(Debug, Clone)]
pub enum PolicyWrite {
    /// Adds a rule; a config rule is never stored.
    InsertRule(Rule),
    /// Removes a tenant's rule; `NotFound` when it has none by that id.
    DeleteRule { tenant: String, id: String },
    /// Appends decisions; each takes the next audit seq.
    Audit(Vec<AuditEntry>),
    /// Drops audit entries from before `before` (RFC 3339).
    TrimAudit { before: String },
    /// Adds a model call's tokens and cost to a scope's day and month (`policy::periods`).
    AddUsage { scope: String, day: String, month: String, tokens: u64, cost: f64 },
}

pub(super) fn apply(tx: &Transaction<'_>, write: &PolicyWrite) -> Result<(), StoreError> {
    match write {
        PolicyWrite::InsertRule(rule) => insert_rule(tx, rule),
        PolicyWrite::DeleteRule { tenant, id } => {
            let deleted =
                tx.prepare_cached("DELETE FROM rules WHERE tenant = ?1 AND id = ?2")?.execute([tenant, id])?;
            if deleted == 0 {
                return Err(StoreError::NotFound);
            }
            Ok(())
        }
        PolicyWrite::Audit(entries) => entries.iter().try_for_each(|entry| insert_audit(tx, entry)),
        PolicyWrite::TrimAudit { before } => {
            tx.prepare_cached("DELETE FROM audit WHERE at < ?1")?.execute([before])?;
            Ok(())
        }
        PolicyWrite::AddUsage { scope, day, month, tokens, cost } => {
            let mut add = tx.prepare_cached(
                "INSERT INTO usage (scope, period, tokens, cost) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (scope, period) DO UPDATE SET tokens = tokens + ?3, cost = cost + ?4",
            )?;
            for period in [day, month] {
                add.execute(params![scope, period, *tokens as i64, cost])?;
            }
            Ok(())
        }
    }
}

fn insert_rule(tx: &Transaction<'_>, rule: &Rule) -> Result<(), StoreError> {
    let tenant = rule.tenant.as_deref().ok_or_else(|| StoreError::Backend("a stored rule has a tenant".into()))?;
    if rule.source == Source::Config {
        return Err(StoreError::Backend("config rules are not stored".into()));
    }
    if let Some(session_id) = &rule.session_id {
        let exists: Option<i64> = tx
            .prepare_cached("SELECT 1 FROM sessions WHERE id = ?1")?
            .query_row([session_id], |r| r.get(0))
            .optional()?;
        if exists.is_none() {
            return Err(StoreError::MissingSession);
        }
    }
    tx.prepare_cached(
        "INSERT INTO rules (id, tenant, session_id, tool, pattern, arguments, outcome, source, created_at, created_by)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?
    .execute(params![
        rule.id,
        tenant,
        rule.session_id,
        rule.tool,
        rule.pattern,
        rule.arguments,
        rule.outcome.as_str(),
        rule.source.as_str(),
        rule.created_at,
        rule.created_by,
    ])?;
    Ok(())
}

fn insert_audit(tx: &Transaction<'_>, entry: &AuditEntry) -> Result<(), StoreError> {
    tx.prepare_cached(
        "INSERT INTO audit (at, tenant, session_id, run_id, call_id, tool, decision, decided_by, rule_id, actor,
                            note, arguments, edited)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
    )?
    .execute(params![
        entry.at,
        entry.tenant,
        entry.session_id,
        entry.run_id,
        entry.call_id,
        entry.tool,
        entry.decision,
        entry.decided_by,
        entry.rule_id,
        entry.actor,
        entry.note,
        entry.arguments,
        entry.edited,
    ])?;
    Ok(())
}

/// Which audit entries to read.
#[derive(Debug, Clone, Default)]
pub struct AuditQuery<'a> {
    /// One tenant's, or every tenant's.
    pub tenant: Option<&'a str>,
    /// Entries with a larger seq.
    pub after: u64,
    /// Entries at or after this time (RFC 3339).
    pub since: Option<&'a str>,
}

impl super::contract::PolicyReads for super::sqlite::Sqlite {
    fn rules_of(&self, tenant: &str, session_id: Option<&str>) -> Result<Vec<Rule>, StoreError> {
        self.with(|conn| {
            let sql = format!(
                "SELECT {RULE_COLUMNS} FROM rules WHERE tenant = ?1 AND (session_id IS NULL OR session_id = ?2)
                 ORDER BY created_at, id"
            );
            let mut statement = conn.prepare_cached(&sql)?;
            let rows = statement.query_map(params![tenant, session_id], |row| Ok(rows::rule(row)))?;
            rows.map(|row| row?).collect()
        })
    }

    fn session_rules(&self, session_id: &str) -> Result<Vec<Rule>, StoreError> {
        self.with(|conn| {
            let sql = format!("SELECT {RULE_COLUMNS} FROM rules WHERE session_id = ?1 ORDER BY created_at, id");
            let mut statement = conn.prepare_cached(&sql)?;
            let rows = statement.query_map([session_id], |row| Ok(rows::rule(row)))?;
            rows.map(|row| row?).collect()
        })
    }

    fn spent(&self, scope: &str, day: &str, month: &str) -> Result<Spent, StoreError> {
        self.with(|conn| {
            let mut read = conn.prepare_cached("SELECT tokens, cost FROM usage WHERE scope = ?1 AND period = ?2")?;
            let mut totals = |period: &str| -> Result<(u64, f64), StoreError> {
                let row =
                    read.query_row([scope, period], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, f64>(1)?))).optional()?;
                Ok(row.map_or((0, 0.0), |(tokens, cost)| (tokens.max(0) as u64, cost)))
            };
            let (day_tokens, day_cost) = totals(day)?;
            let (month_tokens, month_cost) = totals(month)?;
            Ok(Spent { day: day.to_string(), month: month.to_string(), day_tokens, day_cost, month_tokens, month_cost })
        })
    }

    fn audit(&self, query: &AuditQuery<'_>, limit: usize) -> Result<Vec<AuditEntry>, StoreError> {
        self.with(|conn| {
            let sql = format!(
                "SELECT {AUDIT_COLUMNS} FROM audit
                 WHERE seq > ?1 AND (?2 IS NULL OR tenant = ?2) AND (?3 IS NULL OR at >= ?3)
                 ORDER BY seq LIMIT ?4"
            );
            let mut statement = conn.prepare_cached(&sql)?;
            let rows = statement
                .query_map(params![query.after as i64, query.tenant, query.since, limit as i64], |row| {
                    Ok(rows::audit_entry(row))
                })?;
            rows.map(|row| row?).collect()
        })
    }
}
