//! Compaction: the model summarizes the history so far (the engine's one summary step,
//! `engine/compaction.rs`, which Kestrel's long sessions use too), and the provider sees that
//! summary instead of the history from the next turn on. The history itself stays stored.
//!
//! What is stored: a preamble (a user-role message flagged `historyStart` and `synthetic`) and
//! the summary (an assistant message); the provider's history starts at the last preamble
//! (`turn::effective_history`). Both are announced like any message, then
//! `compaction.completed` names them. A compaction that fails leaves the history as it was.
//!
//! Runs on a `kestrel-run` worker: as a client's `session.compact` (its own worker, holding
//! the turn gate) or at the end of a turn whose usage passed an `auto` session's size.

use super::turn::BaeRun;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::merge::ABANDONED_RESULT;
use super::turn::{effective_history, PausedTurn, HISTORY_START};
use crate::domain::{Block, CompactionCompleted, CompactionTrigger, Dispatch, Event, Message, Role, ToolResult, Usage};
use crate::engine::run::Run;
use crate::engine::EngineError;
use crate::store::WriteOp;

/// The instruction used when neither the call nor the session gives one (the engine's one).
pub use crate::engine::compaction::DEFAULT_PROMPT;

/// What the preamble tells the model.
const PREAMBLE: &str = "The earlier part of this conversation was compacted. The next message is a summary of \
it; continue the conversation from that summary.";

/// `meta.synthetic` of messages the server writes on its own.
pub const SYNTHETIC: &str = "synthetic";

/// A compaction asked for by a client.
pub(crate) struct CompactionJob {
    pub actor: Arc<str>,
    pub prompt: String,
    pub primary: String,
    pub fallbacks: Vec<String>,
    /// A paused turn reclaimed on the way: its unanswered calls are answered first.
    pub repair: Option<PausedTurn>,
    /// The session's profile's budget.
    pub allowance: crate::engine::Allowance,
}

impl BaeRun<'_> {
    /// A client's compaction: repair a reclaimed turn's history if needed, then summarize.
    pub(crate) fn compact(&self, job: &CompactionJob, usage: &mut Usage) -> Result<(), EngineError> {
        if let Some(paused) = &job.repair {
            self.answer_abandoned(paused)?;
        }
        self.summarize(CompactionTrigger::Client, &job.prompt, &job.primary, &job.fallbacks, usage)
    }

    /// An `auto` session's compaction after a turn; a failure only backs later ones off.
    pub(crate) fn auto_compact(&self, turn: &super::turn::BaeTurn) {
        let mut usage = Usage::default();
        if let Err(error) =
            self.summarize(CompactionTrigger::Auto, DEFAULT_PROMPT, &turn.primary, &turn.fallbacks, &mut usage)
        {
            log::warn!("session {}: automatic {error}", self.session_id);
            self.tell_door(Box::new(super::runtime::FromTurn::AutoCompactionFailed));
        }
    }

    /// Asks the chain for a summary of the provider's history and stores it as the new start.
    fn summarize(
        &self,
        trigger: CompactionTrigger,
        prompt: &str,
        primary: &str,
        fallbacks: &[String],
        usage: &mut Usage,
    ) -> Result<(), EngineError> {
        let history = effective_history(self.shared.store.readers().messages(&self.session_id)?);
        let message_count = history.len() as u64;
        self.publish(Event::CompactionStarted { session_id: self.session_id.clone(), trigger, message_count });
        let chain = self
            .resolve_chain(primary, fallbacks)
            .map_err(|d| EngineError::Compaction(format!("provider_config: {d}")))?;
        let mut recorded = super::turn::Recorded { run: self.run, stored: 0, fault_first: false };
        let written = self
            .summarize_messages(&chain, &mut recorded, &history, prompt, None)
            .map_err(|why| EngineError::Compaction(why.to_string()))?;
        usage.add(&written.usage);
        let preamble = flagged(Message::text_of(Role::User, PREAMBLE), "compaction_preamble", true);
        let summary = Message::text_of(Role::Assistant, written.text);
        let (preamble_event, summary_event) = self.store_pair(preamble, summary)?;
        self.publish(Event::CompactionCompleted(Box::new(CompactionCompleted {
            session_id: self.session_id.clone(),
            trigger,
            compacted_message_count: message_count,
            input_tokens: written.usage.input_tokens,
            summary_tokens: written.usage.output_tokens,
            preamble_event,
            summary_event,
        })));
        Ok(())
    }

    /// Stores the preamble and the summary together, then announces each; their seqs.
    fn store_pair(&self, preamble: Message, summary: Message) -> Result<(u64, u64), EngineError> {
        let at = crate::time::now_rfc3339();
        let append = |message: &Message| WriteOp::AppendMessage {
            session_id: self.session_id.clone(),
            message: message.clone(),
            updated_at: at.clone(),
        };
        self.shared.store.write(vec![append(&preamble), append(&summary)])?;
        let preamble =
            self.publish_durable(Event::MessageCompleted { session_id: self.session_id.clone(), message: preamble })?;
        let summary =
            self.publish_durable(Event::MessageCompleted { session_id: self.session_id.clone(), message: summary })?;
        Ok((preamble, summary))
    }

    /// A reclaimed turn's calls that never got a result are answered with an error, so the
    /// history the summary is made from pairs every call with a result.
    fn answer_abandoned(&self, paused: &PausedTurn) -> Result<(), EngineError> {
        let answered: std::collections::HashSet<&str> =
            paused.server_results.iter().map(|r| r.call_id.as_str()).collect();
        let mut results = Vec::new();
        for (id, name) in paused.expected.iter().zip(&paused.names) {
            match paused.server_results.iter().find(|r| &r.call_id == id) {
                Some(result) => results.push((result.clone(), false)),
                None if !answered.contains(id.as_str()) => results.push((abandoned(id, name), true)),
                None => {}
            }
        }
        let mut message = Message::new(Role::User);
        message.blocks = results.iter().map(|(result, _)| Block::ToolResult(result.clone())).collect();
        let message = flagged(message, "abandoned_tool_results", false);
        self.append(message)?;
        for (result, _) in results.into_iter().filter(|(_, synthetic)| *synthetic) {
            self.publish(Event::ToolFinished {
                session_id: self.session_id.clone(),
                result,
                dispatch: Dispatch::Client,
            });
        }
        Ok(())
    }
}

fn abandoned(id: &str, name: &str) -> ToolResult {
    ToolResult {
        call_id: id.to_string(),
        name: name.to_string(),
        ok: false,
        content: ABANDONED_RESULT.into(),
        duration_ms: None,
        error: Some(ABANDONED_RESULT.into()),
        data: None,
        blocks: None,
    }
}

/// A message the server wrote on its own, tagged with why; `start` makes it the first message
/// the provider sees from now on.
fn flagged(mut message: Message, why: &str, start: bool) -> Message {
    let meta = message.meta.get_or_insert_with(Map::new);
    meta.insert(SYNTHETIC.into(), Value::String(why.into()));
    if start {
        meta.insert(HISTORY_START.into(), Value::Bool(true));
    }
    message
}

impl crate::engine::plan::TurnPlan for CompactionJob {
    fn actor(&self) -> Option<Arc<str>> {
        Some(Arc::clone(&self.actor))
    }

    fn allowance(&self, _: &crate::engine::EngineConfig, _: &str) -> crate::engine::Allowance {
        self.allowance.clone()
    }

    fn lifecycle(&self) -> crate::engine::plan::Lifecycle {
        crate::engine::plan::Lifecycle::Quiet
    }

    /// A compaction is one summary, no loop.
    fn whole(&self, run: &Run, usage: &mut Usage) -> Option<Result<(), EngineError>> {
        Some(BaeRun { run }.compact(self, usage))
    }

    fn open(&self, _: &Run) -> Result<crate::engine::plan::Opening, EngineError> {
        Err(EngineError::Internal("a compaction has no turn loop"))
    }

    fn route(&self, _: &Run, _: &crate::domain::SessionRecord) -> Result<Option<crate::providers::Route>, EngineError> {
        Err(EngineError::Internal("a compaction has no turn loop"))
    }

    fn step_limit(&self, _: &crate::engine::EngineConfig) -> u32 {
        0
    }

    fn limit_reached(&self, _: &Run) -> Result<crate::engine::run::Stop, EngineError> {
        Err(EngineError::Internal("a compaction has no turn loop"))
    }

    fn ask(
        &self,
        _: &Run,
        _: &crate::providers::Route,
        _: &crate::domain::SessionRecord,
        _: &mut Usage,
        _: &[Message],
    ) -> Result<crate::engine::run::Step, EngineError> {
        Err(EngineError::Internal("a compaction has no turn loop"))
    }

    fn keep_answer(&self, _: &Run, _: Message, _: &Usage) -> Result<(), EngineError> {
        Err(EngineError::Internal("a compaction has no turn loop"))
    }

    fn dispatch(
        &self,
        _: &Run,
        _: Message,
        _: &crate::domain::SessionRecord,
        _: &mut Vec<Message>,
    ) -> Result<Option<crate::engine::run::Stop>, EngineError> {
        Err(EngineError::Internal("a compaction has no turn loop"))
    }
}
