//! Schema migrations, applied in order by the writer when it opens the database; the version
//! is SQLite's `user_version`. Most are SQL files; a change of stored shape is code.

use rusqlite::{params, Connection, Transaction};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::StoreError;
use crate::domain::{Block, ImageAttachment, Message, Role, ToolCall, ToolResult};

enum Migration {
    Sql(&'static str),
    Code(fn(&Transaction<'_>) -> Result<(), StoreError>),
}

const MIGRATIONS: &[Migration] = &[
    Migration::Sql(include_str!("migrations/0001_init.sql")),
    Migration::Sql(include_str!("migrations/0002_tool_call_starts.sql")),
    Migration::Sql(include_str!("migrations/0003_idempotency.sql")),
    Migration::Sql(include_str!("migrations/0004_events.sql")),
    // 5: messages from Kestrel's `ChatMessage` JSON to the engine's blocks.
    Migration::Code(messages_to_blocks),
    Migration::Sql(include_str!("migrations/0006_bae.sql")),
    Migration::Sql(include_str!("migrations/0007_checkpoints.sql")),
    Migration::Sql(include_str!("migrations/0008_call_marks.sql")),
    Migration::Sql(include_str!("migrations/0009_claims_and_seqs.sql")),
    Migration::Sql(include_str!("migrations/0010_stored_form.sql")),
    Migration::Sql(include_str!("migrations/0011_session_walks.sql")),
    Migration::Sql(include_str!("migrations/0012_lighter_session_walks.sql")),
    Migration::Sql(include_str!("migrations/0013_session_list_version.sql")),
    Migration::Sql(include_str!("migrations/0014_session_detail_version.sql")),
    Migration::Sql(include_str!("migrations/0015_shared_manifests.sql")),
    Migration::Sql(include_str!("migrations/0016_rules_and_audit.sql")),
    Migration::Sql(include_str!("migrations/0017_usage_and_budgets.sql")),
    Migration::Sql(include_str!("migrations/0018_session_forks.sql")),
    Migration::Sql(include_str!("migrations/0019_schedules.sql")),
    Migration::Sql(include_str!("migrations/0020_webhooks.sql")),
    Migration::Sql(include_str!("migrations/0021_covering_session_walks.sql")),
];

/// Applies every migration above the database's `user_version`, each in its own transaction.
pub(super) fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let current: i64 = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    for (index, migration) in MIGRATIONS.iter().enumerate() {
        let version = index as i64 + 1;
        if version <= current {
            continue;
        }
        let tx = conn.transaction()?;
        match migration {
            Migration::Sql(sql) => tx.execute_batch(sql)?,
            Migration::Code(step) => step(&tx)?,
        }
        tx.pragma_update(None, "user_version", version)?;
        tx.commit()?;
        log::info!("applied migration {version}");
    }
    Ok(())
}

/// A message as stores before migration 5 kept it: Kestrel protocol 1.0's `ChatMessage`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LegacyMessage {
    id: String,
    role: Role,
    content: String,
    #[serde(default)]
    images: Vec<ImageAttachment>,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    tool_calls: Vec<LegacyToolCall>,
    #[serde(default)]
    tool_call_id: Option<String>,
    #[serde(default)]
    tool_name: Option<String>,
    created_at: String,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    meta: Option<Map<String, Value>>,
}

#[derive(Deserialize)]
struct LegacyToolCall {
    id: String,
    name: String,
    arguments: Map<String, Value>,
}

impl From<LegacyMessage> for Message {
    fn from(old: LegacyMessage) -> Message {
        let mut blocks = Vec::new();
        if let Some(text) = old.reasoning.filter(|r| !r.is_empty()) {
            blocks.push(Block::Reasoning { text });
        }
        match (old.role, old.tool_call_id) {
            (Role::Tool, Some(call_id)) => {
                // The result's `ok` lived in `meta.ok`; a tool's answer had no other fields.
                let ok = old.meta.as_ref().and_then(|m| m.get("ok")).and_then(Value::as_bool).unwrap_or(true);
                let name = old.tool_name.unwrap_or_default();
                blocks.push(Block::ToolResult(ToolResult {
                    call_id,
                    name,
                    ok,
                    content: old.content,
                    duration_ms: None,
                    error: None,
                    data: None,
                    blocks: None,
                }));
            }
            _ if !old.content.is_empty() => blocks.push(Block::Text { text: old.content }),
            _ => {}
        }
        blocks.extend(old.images.into_iter().map(Block::Image));
        blocks.extend(old.tool_calls.into_iter().map(|c| Block::ToolCall(ToolCall::new(c.id, c.name, c.arguments))));
        Message { id: old.id, role: old.role, blocks, created_at: old.created_at, model: old.model, meta: old.meta }
    }
}

/// Rewrites every message row from the legacy shape to blocks.
fn messages_to_blocks(tx: &Transaction<'_>) -> Result<(), StoreError> {
    let rows: Vec<(i64, String)> = {
        let mut statement = tx.prepare("SELECT rowid, body FROM messages")?;
        let rows = statement.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?;
        rows.collect::<Result<_, _>>()?
    };
    let mut update = tx.prepare("UPDATE messages SET body = ?2 WHERE rowid = ?1")?;
    for (rowid, body) in rows {
        let legacy: LegacyMessage =
            serde_json::from_str(&body).map_err(|e| StoreError::Corrupt(format!("message row {rowid}: {e}")))?;
        let message = Message::from(legacy);
        let body = serde_json::to_string(&message).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        update.execute(params![rowid, body])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_messages_become_blocks_in_kestrel_order() {
        let assistant: LegacyMessage = serde_json::from_str(
            r#"{"id":"m1","role":"assistant","content":"Calling","reasoning":"think",
                "toolCalls":[{"id":"c1","name":"read_file","arguments":{"path":"a"}}],
                "createdAt":"2026-01-01T00:00:00.000Z","model":"builtin/echo","meta":{"finishReason":"tool_calls"}}"#,
        )
        .unwrap();
        let message = Message::from(assistant);
        assert_eq!(message.reasoning().as_deref(), Some("think"));
        assert_eq!(message.text(), "Calling");
        assert_eq!(message.tool_calls().next().unwrap().arguments["path"], "a");
        assert_eq!(message.model.as_deref(), Some("builtin/echo"));

        let tool: LegacyMessage = serde_json::from_str(
            r#"{"id":"m2","role":"tool","content":"boom","toolCallId":"c1","toolName":"read_file",
                "createdAt":"2026-01-01T00:00:00.000Z","meta":{"ok":false}}"#,
        )
        .unwrap();
        let result = Message::from(tool);
        let block = result.tool_result().unwrap();
        assert_eq!(
            (block.call_id.as_str(), block.name.as_str(), block.ok, block.content.as_str()),
            ("c1", "read_file", false, "boom")
        );
        assert_eq!(result.text(), "", "a tool's answer is its result, not text");
    }
}
