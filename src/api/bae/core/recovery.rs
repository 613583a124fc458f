//! BAE's crash rule for server-run calls. A BAE turn keeps its all-server rounds in memory, so
//! after a `kill -9` the only trace of a sandbox exec, MCP call or subagent launch that was
//! running is its start mark (`Run::mark_started`, committed before the call ran). At start,
//! every such mark still unsettled is recorded in its session's history: the call, as the
//! answer that made it, and an error result saying the server stopped before it finished and
//! did not run it again; each with its `tool.finished`, attributed to the client the turn
//! acted for. The turn is over; the session stays open and its next `sendMessage` starts a new
//! turn from that history. Nothing is run again.

use super::Bae;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::bus::{Origin, Publication};
use crate::domain::{Block, Event, Message, Role, ToolCall, ToolResult};
use crate::engine::EngineError;
use crate::store::{UnsettledCall, WriteOp, BAE_TENANT};

/// The result a killed call is recorded with.
pub const INTERRUPTED_RESULT: &str = "the server stopped before this call finished; it was not run again";

/// `meta.synthetic` of the messages that record killed calls.
const SYNTHETIC_WHY: &str = "interrupted_tool_calls";

impl Bae {
    /// Records every BAE call that started and never finished (see the module doc); how many.
    pub fn recover_calls(&self) -> Result<usize, EngineError> {
        self.recover(|_| true)
    }

    /// Records the session's calls that started and never finished: this node took its
    /// lease from a holder that stopped (`engine/tenure.rs`); how many.
    pub fn recover_calls_of(&self, session_id: &str) -> Result<usize, EngineError> {
        self.recover(|call| call.session_id == session_id)
    }

    fn recover(&self, of: impl Fn(&UnsettledCall) -> bool) -> Result<usize, EngineError> {
        let mut unsettled = self.engine.shared.store.readers().unsettled_calls(BAE_TENANT)?;
        unsettled.retain(of);
        let count = unsettled.len();
        let mut by_turn: Vec<(String, Option<String>, Vec<ToolCall>)> = Vec::new();
        for UnsettledCall { session_id, actor, call } in unsettled {
            match by_turn.iter_mut().find(|(session, who, _)| *session == session_id && *who == actor) {
                Some((_, _, calls)) => calls.push(call),
                None => by_turn.push((session_id, actor, vec![call])),
            }
        }
        for (session_id, actor, calls) in by_turn {
            log::info!("session {session_id}: {} call(s) the last process did not finish are recorded", calls.len());
            self.record_interrupted(&session_id, actor, calls)?;
        }
        Ok(count)
    }

    /// The calls' answer and their error results, stored and announced in one commit with the
    /// settling of their marks.
    fn record_interrupted(
        &self,
        session_id: &str,
        actor: Option<String>,
        calls: Vec<ToolCall>,
    ) -> Result<(), EngineError> {
        let results: Vec<ToolResult> = calls.iter().map(interrupted).collect();
        let answer = synthetic(Role::Assistant, calls.iter().cloned().map(Block::ToolCall).collect());
        let answered = synthetic(Role::User, results.iter().cloned().map(Block::ToolResult).collect());
        let at = crate::time::now_rfc3339();
        let mut writes: Vec<WriteOp> = [&answer, &answered]
            .into_iter()
            .map(|message| WriteOp::AppendMessage {
                session_id: session_id.to_string(),
                message: message.clone(),
                updated_at: at.clone(),
            })
            .collect();
        writes.extend(
            calls
                .iter()
                .map(|call| WriteOp::SettleCall { session_id: session_id.to_string(), call_id: call.id.clone() }),
        );
        let mut before = vec![Event::MessageCompleted { session_id: session_id.to_string(), message: answer }];
        before.extend(calls.iter().zip(results).map(|(call, result)| Event::ToolFinished {
            session_id: session_id.to_string(),
            result,
            dispatch: call.dispatch.clone(),
        }));
        let last = Event::MessageCompleted { session_id: session_id.to_string(), message: answered };
        let origin = Origin { actor: actor.map(Arc::from), turn: None };
        let publication = Publication::new(Some(Arc::from(BAE_TENANT)), origin, last).after(before).with_writes(writes);
        match self.engine.shared.bus.send_pending(publication).and_then(|committed| committed.recv().ok()) {
            Some(_) => Ok(()),
            None => Err(EngineError::Internal("the calls the last process left could not be recorded")),
        }
    }
}

/// A killed call's result, in BAE's content format.
fn interrupted(call: &ToolCall) -> ToolResult {
    ToolResult {
        call_id: call.id.clone(),
        name: call.name.clone(),
        ok: false,
        content: INTERRUPTED_RESULT.into(),
        duration_ms: None,
        error: Some(INTERRUPTED_RESULT.into()),
        data: None,
        blocks: Some(vec![json!({ "type": "text", "text": INTERRUPTED_RESULT })]),
    }
}

/// A message the server writes on its own.
fn synthetic(role: Role, blocks: Vec<Block>) -> Message {
    let mut message = Message::new(role);
    message.blocks = blocks;
    let mut meta = Map::new();
    meta.insert(super::compaction::SYNTHETIC.into(), Value::String(SYNTHETIC_WHY.into()));
    message.meta = Some(meta);
    message
}
