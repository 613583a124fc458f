//! The turn loop: history → provider → tool calls → results → provider … until the model
//! answers without tools, the step budget runs out, or the run is cancelled.
//!
//! Runs on one `kestrel-run` worker thread per active run. The run owns its session's turn
//! until it tells the session's actor it ended, its very last step. Every message is durable before its
//! `message.completed` goes out, so a client that saw it completed finds it after a crash.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use serde_json::{Map, Value};

use super::calls::Repair;
use super::session::{SessionMsg, TurnMsg, TurnOutcome};
use super::{EngineError, Shared};
use crate::cancel::{CancelReason, CancelToken};
use crate::domain::{
    Block, DeltaChannel, Event, Message, Role, RunOutcome, SessionRecord, SessionStatus, ToolCall, Usage,
};
use crate::providers::{CompletionRequest, Delta, Provider, ProviderError};
use crate::store::{SessionPatch, WriteOp};

pub(super) struct Run {
    pub shared: Arc<Shared>,
    pub tenant: Arc<str>,
    pub session_id: String,
    pub run_id: String,
    pub cancel: CancelToken,
    /// The message that started the run; `None` when resuming.
    pub user: Option<Message>,
    /// The session's actor: told of approvals waited on, and of the end.
    pub session: crossbeam_channel::Sender<SessionMsg>,
}

/// How the steps ended when nothing failed.
pub(super) enum Stop {
    Finished(RunOutcome),
    Cancelled,
}

/// How one provider call ended.
enum Step {
    Answered(Box<Message>),
    Cancelled,
}

impl Run {
    pub(super) fn execute(self) {
        // The claim already stored the session as `running`; announce it first.
        if let Err(error) = self.publish_summary() {
            log::warn!("run {}: {error}", self.run_id);
        }
        self.publish(Event::RunStarted { session_id: self.session_id.clone(), run_id: self.run_id.clone() });
        let mut usage = Usage::default();
        let outcome = catch_unwind(AssertUnwindSafe(|| self.steps(&mut usage)));
        let outcome = outcome.unwrap_or_else(|_| {
            log::error!("run {} panicked", self.run_id);
            Err(EngineError::Store(crate::store::StoreError::Corrupt("the run panicked".into())))
        });
        let ended = self.turn_outcome(&outcome);
        self.finish(outcome, usage);
        // The very last step: the session is free once its actor reads this.
        let _ = self.session.send(SessionMsg::Turn(TurnMsg::Ended { run_id: self.run_id.clone(), outcome: ended }));
    }

    /// How the turn ended, for its session's actor.
    fn turn_outcome(&self, outcome: &Result<Stop, EngineError>) -> TurnOutcome {
        match outcome {
            Ok(Stop::Finished(RunOutcome::MaxSteps)) => TurnOutcome::MaxSteps,
            Ok(Stop::Finished(_)) => TurnOutcome::Completed,
            Ok(Stop::Cancelled) if self.cancel.reason() == Some(CancelReason::Shutdown) => TurnOutcome::Interrupted,
            Ok(Stop::Cancelled) => TurnOutcome::Cancelled,
            Err(_) => TurnOutcome::Failed,
        }
    }

    fn steps(&self, usage: &mut Usage) -> Result<Stop, EngineError> {
        let mut pending = Vec::new();
        if let Some(user) = &self.user {
            self.publish(Event::MessageStarted { session_id: self.session_id.clone(), message: user.clone() });
            self.publish(Event::MessageCompleted { session_id: self.session_id.clone(), message: user.clone() });
        } else {
            match self.repair_transcript()? {
                // The last stored message is a complete answer: the crash came after it.
                Repair::Complete => return Ok(Stop::Finished(RunOutcome::Completed)),
                Repair::Dispatch(calls) => pending = calls,
            }
        }
        let session = self.session()?;
        let provider = self
            .shared
            .models
            .resolve(&session.summary.model)
            .ok_or_else(|| EngineError::InvalidModel(session.summary.model.clone()))?;
        if let Some(stop) = self.run_calls(&pending, &session)? {
            return Ok(stop);
        }
        for _ in 0..self.shared.config.max_steps {
            if self.cancel.is_cancelled() {
                return Ok(Stop::Cancelled);
            }
            let answer = match self.call_model(provider.as_ref(), &session, usage)? {
                Step::Answered(answer) => answer,
                Step::Cancelled => return Ok(Stop::Cancelled),
            };
            let calls: Vec<ToolCall> = answer.tool_calls().cloned().collect();
            if calls.is_empty() {
                return Ok(Stop::Finished(RunOutcome::Completed));
            }
            if let Some(stop) = self.run_calls(&calls, &session)? {
                return Ok(stop);
            }
        }
        Ok(Stop::Finished(RunOutcome::MaxSteps))
    }

    /// One provider call, streamed to the bus; the answer is stored before it completes.
    fn call_model(
        &self,
        provider: &dyn Provider,
        session: &SessionRecord,
        usage: &mut Usage,
    ) -> Result<Step, EngineError> {
        let mut history = self.shared.store.readers().messages(&self.session_id)?;
        // An answer a shutdown cut short is kept for people to see, but the model answers again
        // as if it had never started (see `repair_transcript`).
        history.retain(|message| !is_interrupted_partial(message));
        let tools = self.shared.tools.schemas();
        let request =
            CompletionRequest { system_prompt: session.system_prompt.as_deref(), messages: &history, tools: &tools };
        let mut message = Message::new(Role::Assistant);
        message.model = Some(session.summary.model.clone());
        self.publish(Event::MessageStarted { session_id: self.session_id.clone(), message: message.clone() });

        let mut streamed_text = String::new();
        let mut streamed_reasoning = String::new();
        let mut on_delta = |delta: Delta<'_>| {
            let (channel, piece) = match delta {
                Delta::Text(piece) => {
                    streamed_text.push_str(piece);
                    (DeltaChannel::Text, piece)
                }
                Delta::Reasoning(piece) => {
                    streamed_reasoning.push_str(piece);
                    (DeltaChannel::Reasoning, piece)
                }
            };
            self.publish(Event::MessageDelta {
                session_id: self.session_id.clone(),
                message_id: message.id.clone(),
                channel,
                delta: piece.to_string(),
            });
        };
        let outcome = provider.complete(&request, &mut on_delta, &self.cancel);
        let step = match outcome {
            Ok(completion) => {
                usage.add(&completion.usage);
                message.blocks = answer_blocks(completion.reasoning, completion.text, completion.tool_calls);
                if let Some(finish) = &completion.finish {
                    let meta = message.meta.get_or_insert_with(Map::new);
                    meta.insert("finishReason".into(), Value::String(finish.as_str().to_string()));
                }
                Step::Answered(Box::new(message.clone()))
            }
            Err(ProviderError::Cancelled) => {
                // What the user already saw is kept, marked as cut short; the calls it may have
                // named are not. A shutdown's cut also marks it interrupted, so a resume answers
                // again instead of taking it for a finished answer.
                message.blocks = answer_blocks(streamed_reasoning, streamed_text, Vec::new());
                let meta = message.meta.get_or_insert_with(Map::new);
                meta.insert("partial".into(), Value::Bool(true));
                if self.cancel.reason() == Some(CancelReason::Shutdown) {
                    meta.insert("interrupted".into(), Value::Bool(true));
                }
                Step::Cancelled
            }
            Err(ProviderError::Failed(error)) => return Err(EngineError::Provider(error)),
        };
        self.append(message)?;
        Ok(step)
    }

    /// Stores a message, then announces it complete and the session's new summary.
    pub(super) fn append(&self, message: Message) -> Result<(), EngineError> {
        self.shared.store.write(vec![WriteOp::AppendMessage {
            session_id: self.session_id.clone(),
            message: message.clone(),
            updated_at: crate::time::now_rfc3339(),
        }])?;
        self.publish(Event::MessageCompleted { session_id: self.session_id.clone(), message });
        self.publish_summary()
    }

    fn finish(&self, outcome: Result<Stop, EngineError>, usage: Usage) {
        let shutdown = self.cancel.reason() == Some(CancelReason::Shutdown);
        let status = match &outcome {
            Ok(Stop::Finished(_)) => SessionStatus::Idle,
            Ok(Stop::Cancelled) if shutdown => SessionStatus::Interrupted,
            Ok(Stop::Cancelled) => SessionStatus::Cancelled,
            Err(_) => SessionStatus::Error,
        };
        let patch = SessionPatch { status: Some(status), ..SessionPatch::default() };
        let write = self.shared.store.write(vec![WriteOp::UpdateSession {
            id: self.session_id.clone(),
            patch,
            updated_at: crate::time::now_rfc3339(),
        }]);
        if let Err(error) = write {
            log::error!("run {}: could not store the final status: {error}", self.run_id);
        }
        let _ = self.publish_summary();
        let (session_id, run_id) = (self.session_id.clone(), self.run_id.clone());
        let event = match outcome {
            Ok(Stop::Finished(status)) => Event::RunFinished { session_id, run_id, status, usage: Some(usage) },
            Ok(Stop::Cancelled) if shutdown => {
                return log::info!("run {} stopped by shutdown; the session can be resumed", self.run_id)
            }
            Ok(Stop::Cancelled) => {
                Event::RunFinished { session_id, run_id, status: RunOutcome::Cancelled, usage: Some(usage) }
            }
            Err(error) => {
                log::warn!("run {} failed: {error}", self.run_id);
                // A provider's message is written for the user; anything else stays in the log.
                let error = match error {
                    EngineError::Provider(message) => message,
                    EngineError::InvalidModel(_) => error.to_string(),
                    _ => "internal error; the server log has the details".to_string(),
                };
                Event::RunFailed { session_id, run_id, error }
            }
        };
        self.publish(event);
    }

    pub(super) fn session(&self) -> Result<SessionRecord, EngineError> {
        self.shared.store.readers().session(&self.session_id)?.ok_or(EngineError::SessionNotFound)
    }

    fn publish_summary(&self) -> Result<(), EngineError> {
        let record = self.session()?;
        self.shared.publish_summary(&record);
        Ok(())
    }

    pub(super) fn publish(&self, event: Event) {
        self.shared.bus.publish_shared(Some(Arc::clone(&self.tenant)), event);
    }
}

/// An assistant answer a shutdown cut off mid-stream (`meta.partial` and `meta.interrupted`).
pub(super) fn is_interrupted_partial(message: &Message) -> bool {
    message.role == Role::Assistant && message.flag("partial") && message.flag("interrupted")
}

/// An answer's blocks: its reasoning, its text, then its tool calls.
fn answer_blocks(reasoning: String, text: String, calls: Vec<ToolCall>) -> Vec<Block> {
    let mut blocks = Vec::new();
    if !reasoning.is_empty() {
        blocks.push(Block::Reasoning { text: reasoning });
    }
    if !text.is_empty() {
        blocks.push(Block::Text { text });
    }
    blocks.extend(calls.into_iter().map(Block::ToolCall));
    blocks
}
