//! Permission rules, the audit log and usage counters in PostgreSQL (`store/policy.rs` says
//! what each write means).

use super::super::policy::{AuditQuery, PolicyWrite};
use super::super::rows::{self, AUDIT_COLUMNS, RULE_COLUMNS};
use super::super::StoreError;
use super::conn::{decode, Tx};
use super::Postgres;
use crate::policy::{AuditEntry, Rule, Source, Spent};

pub(super) fn apply(tx: &mut Tx<'_>, write: &PolicyWrite) -> Result<(), StoreError> {
    match write {
        PolicyWrite::InsertRule(rule) => insert_rule(tx, rule),
        PolicyWrite::DeleteRule { tenant, id } => {
            match tx.exec("DELETE FROM rules WHERE tenant = $1 AND id = $2", &[tenant, id])? {
                0 => Err(StoreError::NotFound),
                _ => Ok(()),
            }
        }
        PolicyWrite::Audit(entries) => entries.iter().try_for_each(|entry| insert_audit(tx, entry)),
        PolicyWrite::TrimAudit { before } => {
            tx.exec("DELETE FROM audit WHERE at < $1", &[before])?;
            Ok(())
        }
        PolicyWrite::AddUsage { scope, day, month, tokens, cost } => {
            for period in [day, month] {
                tx.exec(
                    "INSERT INTO usage (scope, period, tokens, cost) VALUES ($1, $2, $3, $4)
                     ON CONFLICT (scope, period) DO UPDATE SET tokens = usage.tokens + $3, cost = usage.cost + $4",
                    &[scope, period, &(*tokens as i64), cost],
                )?;
            }
            Ok(())
        }
    }
}

fn insert_rule(tx: &mut Tx<'_>, rule: &Rule) -> Result<(), StoreError> {
    let tenant = rule.tenant.as_deref().ok_or_else(|| StoreError::Backend("a stored rule has a tenant".into()))?;
    if rule.source == Source::Config {
        return Err(StoreError::Backend("config rules are not stored".into()));
    }
    if let Some(session_id) = &rule.session_id {
        if tx.opt("SELECT 1 FROM sessions WHERE id = $1", &[session_id])?.is_none() {
            return Err(StoreError::MissingSession);
        }
    }
    tx.exec(
        "INSERT INTO rules (id, tenant, session_id, tool, pattern, arguments, outcome, source, created_at, created_by)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        &[
            &rule.id,
            &tenant,
            &rule.session_id,
            &rule.tool,
            &rule.pattern,
            &rule.arguments,
            &rule.outcome.as_str(),
            &rule.source.as_str(),
            &rule.created_at,
            &rule.created_by,
        ],
    )?;
    Ok(())
}

fn insert_audit(tx: &mut Tx<'_>, entry: &AuditEntry) -> Result<(), StoreError> {
    tx.exec(
        "INSERT INTO audit (at, tenant, session_id, run_id, call_id, tool, decision, decided_by, rule_id, actor,
                            note, arguments, edited)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
        &[
            &entry.at,
            &entry.tenant,
            &entry.session_id,
            &entry.run_id,
            &entry.call_id,
            &entry.tool,
            &entry.decision,
            &entry.decided_by,
            &entry.rule_id,
            &entry.actor,
            &entry.note,
            &entry.arguments,
            &entry.edited,
        ],
    )?;
    Ok(())
}

impl super::super::contract::PolicyReads for Postgres {
    fn rules_of(&self, tenant: &str, session_id: Option<&str>) -> Result<Vec<Rule>, StoreError> {
        self.with(|conn| {
            let sql = format!(
                "SELECT {RULE_COLUMNS} FROM rules WHERE tenant = $1 AND (session_id IS NULL OR session_id = $2)
                 ORDER BY created_at, id"
            );
            decode(conn.query(&sql, &[&tenant, &session_id])?, rows::rule)
        })
    }

    fn session_rules(&self, session_id: &str) -> Result<Vec<Rule>, StoreError> {
        self.with(|conn| {
            let sql = format!("SELECT {RULE_COLUMNS} FROM rules WHERE session_id = $1 ORDER BY created_at, id");
            decode(conn.query(&sql, &[&session_id])?, rows::rule)
        })
    }

    fn spent(&self, scope: &str, day: &str, month: &str) -> Result<Spent, StoreError> {
        self.with(|conn| {
            let mut totals = |period: &str| -> Result<(u64, f64), StoreError> {
                let row =
                    conn.opt("SELECT tokens, cost FROM usage WHERE scope = $1 AND period = $2", &[&scope, &period])?;
                Ok(row.map_or((0, 0.0), |row| (row.get::<_, i64>(0).max(0) as u64, row.get::<_, f64>(1))))
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
                 WHERE seq > $1 AND ($2::text IS NULL OR tenant = $2) AND ($3::text IS NULL OR at >= $3)
                 ORDER BY seq LIMIT $4"
            );
            let params: [&(dyn postgres::types::ToSql + Sync); 4] =
                [&(query.after as i64), &query.tenant, &query.since, &(limit as i64)];
            decode(conn.query(&sql, &params)?, rows::audit_entry)
        })
    }
}
