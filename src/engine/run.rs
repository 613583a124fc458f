//! The turn loop: history → provider → tool calls → results → provider … until the model
//! answers without tools, the step budget runs out, or the run is cancelled.
//!
//! Runs on one `kestrel-run` worker thread per active run. The run owns its session's turn
//! until it tells the session's actor it ended, its very last step. Every message is durable before its
//! `message.completed` goes out, so a client that saw it completed finds it after a crash.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use serde_json::{Map, Value};

use super::bae::compaction::CompactionJob;
use super::bae::turn::{BaeTurn, PausedTurn};
use super::calls::Repair;
use super::session::{SessionMsg, TurnMsg, TurnOutcome};
use super::{EngineError, Shared};
use crate::cancel::{CancelReason, CancelToken};
use crate::domain::{
    Block, DeltaChannel, Event, Message, Role, RunOutcome, SessionRecord, SessionStatus, ToolCall, Usage,
};
use crate::providers::{CallFailed, CompletionRequest, Delta, Route, Watch};
use crate::store::WriteOp;

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
    /// What kind of turn this is: a Kestrel run, or a BAE client's turn.
    pub plan: Plan,
    /// Messages sent to be stored whose commit is not yet confirmed (`settle` waits).
    pub pending: std::cell::RefCell<Vec<crossbeam_channel::Receiver<u64>>>,
    /// What goes out with the next publish, in the same log transaction.
    pub held: std::cell::RefCell<super::publish::Held>,
    /// Whether the run took its automatic checkpoint already.
    pub checkpointed: std::cell::Cell<bool>,
}

/// The front door's side of a turn: which model is asked and how, which tools the model
/// sees, and who runs its calls. The loop itself (`Run::steps`) is the same for both.
pub(super) enum Plan {
    /// The session's model, streamed; every call runs on the server, with approvals.
    Kestrel,
    /// A BAE client's turn (`bae/turn.rs`): the profile's provider chain, one attempt at a
    /// time; the acting client's tools pause the turn.
    Bae(Box<BaeTurn>),
    /// A compaction asked for by a client (`bae/compaction.rs`): one summary, no loop.
    Compaction(Box<CompactionJob>),
}

/// How the steps ended when nothing failed.
pub(super) enum Stop {
    Finished(RunOutcome),
    Cancelled,
    /// The turn waits for the client's tool results.
    Paused(Box<PausedTurn>),
    /// A fault was recorded (every provider failed, the step limit): the session is in error.
    Faulted,
}

/// How one provider call ended.
pub(super) enum Step {
    Answered(Box<Message>),
    Cancelled,
    /// Recorded as a fault; the turn ends.
    Failed,
}

/// A Kestrel answer as it streams: each piece published as a `message.delta` of `message_id`,
/// and what was streamed kept, should the answer be cut short.
struct Streaming<'r> {
    run: &'r Run,
    message_id: String,
    text: String,
    reasoning: String,
}

impl Watch for Streaming<'_> {
    fn streamed(&self) -> bool {
        true
    }

    fn delta(&mut self, delta: Delta<'_>) {
        let (channel, piece) = match delta {
            Delta::Text(piece) => {
                self.text.push_str(piece);
                (DeltaChannel::Text, piece)
            }
            Delta::Reasoning(piece) => {
                self.reasoning.push_str(piece);
                (DeltaChannel::Reasoning, piece)
            }
        };
        self.run.publish(Event::MessageDelta {
            session_id: self.run.session_id.clone(),
            message_id: self.message_id.clone(),
            channel,
            delta: piece.to_string(),
        });
    }
}

impl Run {
    pub(super) fn execute(self) {
        // The claim already stored the session as `running`; announce it first.
        if let Err(error) = self.publish_summary() {
            log::warn!("run {}: {error}", self.run_id);
        }
        if self.is_kestrel() {
            self.publish(Event::RunStarted { session_id: self.session_id.clone(), run_id: self.run_id.clone() });
        }
        let mut usage = Usage::default();
        let outcome = catch_unwind(AssertUnwindSafe(|| self.steps(&mut usage)));
        let outcome = outcome.unwrap_or_else(|_| {
            log::error!("run {} panicked", self.run_id);
            Err(EngineError::Store(crate::store::StoreError::Corrupt("the run panicked".into())))
        });
        let ended = self.turn_outcome(&outcome);
        let (outcome, paused) = match outcome {
            Ok(Stop::Paused(paused)) => (Ok(Stop::Finished(RunOutcome::Paused)), Some(paused)),
            other => (other, None),
        };
        let last = self.finish(outcome, usage);
        // The turn's messages are durable before the next turn can read the history.
        if let Err(error) = self.settle() {
            log::error!("run {}: {error}", self.run_id);
        }
        let run_id = self.run_id.clone();
        let ended = SessionMsg::Turn(TurnMsg::Ended { run_id, outcome: ended, paused });
        if self.is_kestrel() {
            self.publish_last(last);
            // The very last step: the session is free once its actor reads this.
            let _ = self.session.send(ended);
        } else {
            // A BAE client may answer the moment it reads the turn's end, and its answer must
            // find the turn paused (or over): the actor hears of it first.
            let _ = self.session.send(ended);
            self.publish_last(last);
        }
    }

    /// How the turn ended, for its session's actor.
    fn turn_outcome(&self, outcome: &Result<Stop, EngineError>) -> TurnOutcome {
        match outcome {
            Ok(Stop::Finished(RunOutcome::MaxSteps)) => TurnOutcome::MaxSteps,
            Ok(Stop::Paused(_)) => TurnOutcome::Paused,
            Ok(Stop::Finished(_)) => TurnOutcome::Completed,
            Ok(Stop::Faulted) => TurnOutcome::Failed,
            Ok(Stop::Cancelled) if self.cancel.reason() == Some(CancelReason::Shutdown) => TurnOutcome::Interrupted,
            Ok(Stop::Cancelled) => TurnOutcome::Cancelled,
            Err(_) => TurnOutcome::Failed,
        }
    }

    /// The turn loop, for every front door: ask the model, run its calls, until it answers
    /// without calls, the calls pause the turn, the step limit is reached, or a cancel.
    fn steps(&self, usage: &mut Usage) -> Result<Stop, EngineError> {
        if let Plan::Compaction(job) = &self.plan {
            return self.compact(job, usage).map(|()| Stop::Finished(RunOutcome::Completed));
        }
        let pending = match self.open_turn()? {
            Ok(pending) => pending,
            Err(stop) => return Ok(stop),
        };
        let session = self.session()?;
        let model = match self.model(&session)? {
            Some(model) => model,
            None => return Ok(Stop::Faulted),
        };
        if let Some(stop) = self.run_calls(&pending, &session)? {
            return Ok(stop);
        }
        // A BAE turn's all-server rounds are kept here, not stored (as BAE does).
        let mut tail = Vec::new();
        for _ in 0..self.step_limit() {
            if self.cancel.is_cancelled() {
                return Ok(Stop::Cancelled);
            }
            let answer = match self.ask_model(&model, &session, usage, &tail)? {
                Step::Answered(answer) => answer,
                Step::Cancelled => return Ok(Stop::Cancelled),
                Step::Failed => return Ok(Stop::Faulted),
            };
            if !answer.has_tool_calls() {
                self.keep_answer(*answer, usage)?;
                return Ok(Stop::Finished(RunOutcome::Completed));
            }
            if let Some(stop) = self.dispatch(*answer, &session, &mut tail)? {
                return Ok(stop);
            }
        }
        self.step_limit_reached()
    }

    /// Announces the turn's opening message. `Ok(calls)`: calls to run before the first model
    /// call (a resumed Kestrel run's); `Err(stop)`: nothing is left to do.
    fn open_turn(&self) -> Result<Result<Vec<ToolCall>, Stop>, EngineError> {
        if let Plan::Bae(turn) = &self.plan {
            self.open_bae_turn(turn)?;
            return Ok(Ok(Vec::new()));
        }
        if let Some(user) = &self.user {
            self.publish(Event::MessageStarted { session_id: self.session_id.clone(), message: user.clone() });
            self.publish(Event::MessageCompleted { session_id: self.session_id.clone(), message: user.clone() });
            return Ok(Ok(Vec::new()));
        }
        Ok(match self.repair_transcript()? {
            // The last stored message is a complete answer: the crash came after it.
            Repair::Complete => Err(Stop::Finished(RunOutcome::Completed)),
            Repair::Dispatch(calls) => Ok(calls),
        })
    }

    /// The model to ask; `None` when a BAE profile's provider does not resolve (recorded).
    fn model(&self, session: &SessionRecord) -> Result<Option<Route>, EngineError> {
        match &self.plan {
            Plan::Bae(turn) => Ok(self.bae_chain(&turn.primary, &turn.fallbacks)),
            Plan::Compaction(_) => Err(EngineError::Internal("a compaction has no turn loop")),
            Plan::Kestrel => {
                let route = self
                    .shared
                    .models
                    .route(&session.summary.model)
                    .ok_or_else(|| EngineError::InvalidModel(session.summary.model.clone()))?;
                Ok(Some(route))
            }
        }
    }

    fn step_limit(&self) -> u32 {
        match &self.plan {
            Plan::Kestrel => self.shared.config.max_steps,
            Plan::Bae(_) | Plan::Compaction(_) => self.shared.config.bae.loop_limit,
        }
    }

    fn step_limit_reached(&self) -> Result<Stop, EngineError> {
        match &self.plan {
            Plan::Bae(_) | Plan::Compaction(_) => self.bae_loop_limit(),
            Plan::Kestrel => Ok(Stop::Finished(RunOutcome::MaxSteps)),
        }
    }

    fn ask_model(
        &self,
        route: &Route,
        session: &SessionRecord,
        usage: &mut Usage,
        tail: &[Message],
    ) -> Result<Step, EngineError> {
        match &self.plan {
            Plan::Bae(turn) => self.ask_chain(turn, route, usage, tail),
            _ => {
                self.fit_context(route, session)?;
                self.call_model(route, session, usage)
            }
        }
    }

    /// Stores a final answer (a Kestrel answer is stored as it streams).
    fn keep_answer(&self, answer: Message, usage: &Usage) -> Result<(), EngineError> {
        match &self.plan {
            Plan::Bae(turn) => self.keep_bae_answer(turn, answer, usage),
            Plan::Kestrel | Plan::Compaction(_) => Ok(()),
        }
    }

    /// Runs an answer's calls. `Some(stop)` ends the turn (a cancel, or a pause for the client).
    fn dispatch(
        &self,
        answer: Message,
        session: &SessionRecord,
        tail: &mut Vec<Message>,
    ) -> Result<Option<Stop>, EngineError> {
        match &self.plan {
            Plan::Bae(turn) => self.dispatch_bae(turn, answer, tail),
            Plan::Kestrel | Plan::Compaction(_) => {
                let calls: Vec<ToolCall> = answer.tool_calls().cloned().collect();
                self.run_calls(&calls, session)
            }
        }
    }

    /// One model call, streamed to the bus; the answer is stored before it completes.
    fn call_model(&self, route: &Route, session: &SessionRecord, usage: &mut Usage) -> Result<Step, EngineError> {
        // Neither what a compaction replaced nor an answer a shutdown cut short (kept for people
        // to see; the model answers again as if it had never started, see `repair_transcript`).
        let history = super::context::visible(self.shared.store.readers().messages(&self.session_id)?);
        let tools = self.shared.tools.schemas();
        let request =
            CompletionRequest { system_prompt: session.system_prompt.as_deref(), messages: &history, tools: &tools };
        let mut message = Message::new(Role::Assistant);
        message.model = Some(session.summary.model.clone());
        self.publish(Event::MessageStarted { session_id: self.session_id.clone(), message: message.clone() });
        let mut streaming =
            Streaming { run: self, message_id: message.id.clone(), text: String::new(), reasoning: String::new() };
        let outcome = route.call(&request, &mut streaming, &self.cancel);
        let step = match outcome {
            Ok(answered) => {
                let completion = answered.completion;
                usage.add(&completion.usage);
                message.blocks = answer_blocks(completion.reasoning, completion.text, completion.tool_calls);
                if let Some(finish) = &completion.finish {
                    let meta = message.meta.get_or_insert_with(Map::new);
                    meta.insert("finishReason".into(), Value::String(finish.as_str().to_string()));
                }
                // What the provider counted: the next context estimate starts from it.
                if completion.usage.input_tokens > 0 {
                    let meta = message.meta.get_or_insert_with(Map::new);
                    meta.insert("usage".into(), serde_json::to_value(&completion.usage).unwrap_or_default());
                }
                Step::Answered(Box::new(message.clone()))
            }
            Err(CallFailed::Cancelled) => {
                // What the user already saw is kept, marked as cut short; the calls it may have
                // named are not. A shutdown's cut also marks it interrupted, so a resume answers
                // again instead of taking it for a finished answer.
                message.blocks = answer_blocks(streaming.reasoning, streaming.text, Vec::new());
                let meta = message.meta.get_or_insert_with(Map::new);
                meta.insert("partial".into(), Value::Bool(true));
                if self.cancel.reason() == Some(CancelReason::Shutdown) {
                    meta.insert("interrupted".into(), Value::Bool(true));
                }
                Step::Cancelled
            }
            Err(CallFailed::Failed { message, .. }) => return Err(EngineError::Provider(message)),
        };
        self.append(message)?;
        Ok(step)
    }

    /// Stores a message, then announces it complete and the session's new summary. A BAE
    /// turn's message commits in one transaction with its announcement.
    pub(super) fn append(&self, message: Message) -> Result<(), EngineError> {
        if !self.is_kestrel() {
            return self.append_announced(message).map(|_| ());
        }
        self.shared.store.write(self.stored(&message))?;
        self.publish(Event::MessageCompleted { session_id: self.session_id.clone(), message });
        self.publish_summary()
    }

    /// Stores the final status and returns the turn's last event (none after a shutdown).
    fn finish(&self, outcome: Result<Stop, EngineError>, usage: Usage) -> Option<Event> {
        let shutdown = self.cancel.reason() == Some(CancelReason::Shutdown);
        let status = match &outcome {
            Ok(Stop::Finished(_)) | Ok(Stop::Paused(_)) => SessionStatus::Idle,
            Ok(Stop::Cancelled) if shutdown => SessionStatus::Interrupted,
            Ok(Stop::Cancelled) => SessionStatus::Cancelled,
            Ok(Stop::Faulted) | Err(_) => SessionStatus::Error,
        };
        // A BAE session's state is its own (`bae_sessions.state`); the status is Kestrel's.
        if self.is_kestrel() {
            let write = self.shared.store.write(vec![WriteOp::ReleaseTurn {
                session_id: self.session_id.clone(),
                run_id: self.run_id.clone(),
                status,
                at: crate::time::now_rfc3339(),
            }]);
            if let Err(error) = write {
                log::error!("run {}: could not store the final status: {error}", self.run_id);
            }
        }
        let _ = self.publish_summary();
        let (session_id, run_id) = (self.session_id.clone(), self.run_id.clone());
        let event = match outcome {
            Ok(Stop::Finished(status)) => Event::RunFinished { session_id, run_id, status, usage: Some(usage) },
            Ok(Stop::Paused(_)) => {
                Event::RunFinished { session_id, run_id, status: RunOutcome::Paused, usage: Some(usage) }
            }
            Ok(Stop::Faulted) => {
                Event::RunFailed { session_id, run_id, error: "the turn failed; see its fault".into() }
            }
            Ok(Stop::Cancelled) if shutdown => {
                log::info!("run {} stopped by shutdown; the session can be resumed", self.run_id);
                return None;
            }
            Ok(Stop::Cancelled) => {
                Event::RunFinished { session_id, run_id, status: RunOutcome::Cancelled, usage: Some(usage) }
            }
            Err(error) => {
                log::warn!("run {} failed: {error}", self.run_id);
                // A provider's message is written for the user; anything else stays in the log.
                let error = match error {
                    EngineError::Provider(message) => message,
                    EngineError::Compaction(_) => error.to_string(),
                    EngineError::InvalidModel(_) => error.to_string(),
                    _ => "internal error; the server log has the details".to_string(),
                };
                Event::RunFailed { session_id, run_id, error }
            }
        };
        Some(event)
    }

    pub(super) fn session(&self) -> Result<SessionRecord, EngineError> {
        self.shared.store.readers().session(&self.session_id)?.ok_or(EngineError::SessionNotFound)
    }

    fn is_kestrel(&self) -> bool {
        matches!(self.plan, Plan::Kestrel)
    }

    /// Announces the session's summary (`session.updated`); Kestrel's only.
    fn publish_summary(&self) -> Result<(), EngineError> {
        if !self.is_kestrel() {
            return Ok(());
        }
        let record = self.session()?;
        self.shared.publish_summary(&record);
        Ok(())
    }
}

/// An assistant answer a shutdown cut off mid-stream (`meta.partial` and `meta.interrupted`).
pub(super) fn is_interrupted_partial(message: &Message) -> bool {
    message.role == Role::Assistant && message.flag("partial") && message.flag("interrupted")
}

/// An answer's blocks: its reasoning, its text, then its tool calls.
pub(in crate::engine) fn answer_blocks(reasoning: String, text: String, calls: Vec<ToolCall>) -> Vec<Block> {
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
