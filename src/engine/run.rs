//! The turn loop: history → provider → tool calls → results → provider … until the model
//! answers without tools, the step budget runs out, or the run is cancelled. The loop is the
//! same for every door; what each step does is the door's `TurnPlan` (`plan.rs`).
//!
//! Runs on one `kestrel-run` worker thread per active run. The run owns its session's turn
//! until it tells the session's actor it ended, its very last step. Every message is durable
//! before its `message.completed` goes out, so a client that saw it completed finds it after a
//! crash.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use serde_json::{Map, Value};

use super::plan::{Lifecycle, TurnPlan};
use super::session::{SessionMsg, TurnMsg, TurnOutcome};
use super::{EngineError, Shared};
use crate::cancel::{CancelReason, CancelToken};
use crate::domain::{
    Block, DeltaChannel, Event, Message, Role, RunOutcome, SessionRecord, SessionStatus, ToolCall, Usage,
};
use crate::providers::{CallFailed, CompletionRequest, Delta, Route, Watch};
use crate::store::WriteOp;

pub struct Run {
    pub(crate) shared: Arc<Shared>,
    pub(crate) tenant: Arc<str>,
    pub(crate) session_id: String,
    pub(crate) run_id: String,
    pub(crate) cancel: CancelToken,
    /// The message that started the run; `None` when resuming.
    pub(crate) user: Option<Message>,
    /// The session's actor: told of approvals waited on, and of the end.
    pub(super) session: crossbeam_channel::Sender<SessionMsg>,
    /// The door's side of the turn.
    pub(super) plan: Box<dyn TurnPlan>,
    /// Messages sent to be stored whose commit is not yet confirmed (`settle` waits).
    pub(super) pending: std::cell::RefCell<Vec<crossbeam_channel::Receiver<u64>>>,
    /// What goes out with the next publish, in the same log transaction.
    pub(super) held: std::cell::RefCell<super::publish::Held>,
    /// Whether the run took its automatic checkpoint already.
    pub(super) checkpointed: std::cell::Cell<bool>,
    /// Where its model calls are counted, and what they may spend.
    pub(crate) allowance: super::Allowance,
}

/// How the steps ended when nothing failed.
pub enum Stop {
    Finished(RunOutcome),
    Cancelled,
    /// The turn waits for its client; what the door needs to resume it goes to the door's
    /// session state (`SessionDoor::turn_ended`).
    Paused(Box<dyn Any + Send>),
    /// A fault was recorded (every provider failed, the step limit): the session is in error.
    Faulted,
}

/// How one provider call ended.
pub enum Step {
    Answered(Box<Message>),
    Cancelled,
    /// Recorded as a fault; the turn ends.
    Failed,
}

/// A streamed answer as it comes: each piece published as a `message.delta` of `message_id`,
/// and what was streamed kept, should the answer be cut short.
struct Streaming<'r> {
    run: &'r Run,
    /// The ids every delta of the message carries, made once.
    session_id: std::sync::Arc<str>,
    message_id: std::sync::Arc<str>,
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
            session_id: std::sync::Arc::clone(&self.session_id),
            message_id: std::sync::Arc::clone(&self.message_id),
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
        if self.tracked() {
            // Every run says how its commands are contained, unsandboxed ones above all.
            self.publish(Event::RunStarted {
                session_id: self.session_id.clone(),
                run_id: self.run_id.clone(),
                sandbox: Some(self.shared.config.sandbox.state(&self.tenant)),
            });
        }
        let mut usage = Usage::default();
        let outcome = catch_unwind(AssertUnwindSafe(|| self.steps(&mut usage)));
        let outcome = outcome.unwrap_or_else(|_| {
            log::error!("run {} panicked", self.run_id);
            Err(EngineError::Store(crate::store::StoreError::Corrupt("the run panicked".into())))
        });
        let ended = self.turn_outcome(&outcome);
        let (outcome, handoff) = match outcome {
            Ok(Stop::Paused(handoff)) => (Ok(Stop::Finished(RunOutcome::Paused)), Some(handoff)),
            other => (other, None),
        };
        let last = self.finish(outcome, usage);
        // The turn's messages are durable before the next turn can read the history.
        if let Err(error) = self.settle() {
            log::error!("run {}: {error}", self.run_id);
        }
        let run_id = self.run_id.clone();
        let ended = SessionMsg::Turn(TurnMsg::Ended { run_id, outcome: ended, handoff });
        if self.tracked() {
            self.publish_last(last);
            // The very last step: the session is free once its actor reads this.
            let _ = self.session.send(ended);
        } else {
            // A client may answer the moment it reads the turn's end, and its answer must
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

    /// The turn loop, for every door: open the turn, then ask the model and run its calls,
    /// until it answers without calls, the calls stop the turn, the step limit is reached, or
    /// a cancel.
    fn steps(&self, usage: &mut Usage) -> Result<Stop, EngineError> {
        let plan = &*self.plan;
        if let Some(done) = plan.whole(self, usage) {
            return done.map(|()| Stop::Finished(RunOutcome::Completed));
        }
        let pending = match plan.open(self)? {
            Ok(pending) => pending,
            Err(stop) => return Ok(stop),
        };
        let session = self.session()?;
        let Some(route) = plan.route(self, &session)? else { return Ok(Stop::Faulted) };
        if let Some(stop) = self.run_calls(&pending, &session)? {
            return Ok(stop);
        }
        // What the door keeps in memory after the stored history (BAE's all-server rounds).
        let mut tail = Vec::new();
        let mut repairs = 0;
        for _ in 0..plan.step_limit(&self.shared.config) {
            if self.cancel.is_cancelled() {
                return Ok(Stop::Cancelled);
            }
            // Each model call reserves against the run's budget first (`meter.rs`); one the
            // budget no longer allows ends the turn before it is made.
            let answer = match plan.ask(self, &route, &session, usage, &tail) {
                Ok(Step::Answered(answer)) => answer,
                Ok(Step::Cancelled) => return Ok(Stop::Cancelled),
                Ok(Step::Failed) => return Ok(Stop::Faulted),
                Err(EngineError::BudgetExceeded(reason)) => {
                    self.shared.audit_budget(&self.tenant, &self.session_id, Some(&self.run_id), &reason);
                    return plan.budget_spent(self, reason);
                }
                Err(error) => return Err(error),
            };
            if !answer.has_tool_calls() {
                if let Some(errors) = super::structured::errors_of(&answer) {
                    if repairs == super::structured::REPAIRS {
                        return Err(EngineError::StructuredOutputInvalid(errors));
                    }
                    repairs += 1;
                    self.ask_for_repair(&errors)?;
                    continue;
                }
                plan.keep_answer(self, *answer, usage)?;
                return Ok(Stop::Finished(RunOutcome::Completed));
            }
            if let Some(stop) = plan.dispatch(self, *answer, &session, &mut tail)? {
                return Ok(stop);
            }
        }
        plan.limit_reached(self)
    }

    /// Announces the user's message that opens the turn (stored with its claim).
    pub(crate) fn announce_opening(&self, user: &Message) {
        self.publish(Event::MessageStarted { session_id: self.session_id.clone(), message: user.clone() });
        self.publish(Event::MessageCompleted { session_id: self.session_id.clone(), message: user.clone() });
    }

    /// The route a session's own model takes.
    pub(crate) fn session_route(&self, session: &SessionRecord) -> Result<Route, EngineError> {
        let model = &session.summary.model;
        self.shared.models.route(model).ok_or_else(|| EngineError::InvalidModel(model.clone()))
    }

    /// Sends the session's door a message (`SessionDoor::turn_said`).
    pub(crate) fn tell_door(&self, message: Box<dyn Any + Send>) {
        let _ = self.session.send(SessionMsg::Turn(TurnMsg::Door(message)));
    }

    /// One model call, streamed to the bus; the answer is stored before it completes.
    /// One model call of the session's own, streamed to the bus; the answer is stored before
    /// it completes.
    pub(crate) fn call_model(
        &self,
        route: &Route,
        session: &SessionRecord,
        usage: &mut Usage,
    ) -> Result<Step, EngineError> {
        // Neither what a compaction replaced nor an answer a shutdown cut short (kept for people
        // to see; the model answers again as if it had never started, see `repair_transcript`).
        let history = super::context::visible(self.shared.store.readers().messages(&self.session_id)?);
        let tools = self.shared.tools.schemas();
        let format = super::structured::format_of(&history);
        let request = CompletionRequest {
            system_prompt: session.system_prompt.as_deref(),
            messages: &history,
            tools: &tools,
            response_format: format.as_ref(),
        };
        let Some(reservation) = self.reserve_call(route, &request)? else { return Ok(Step::Cancelled) };
        let mut message = Message::new(Role::Assistant);
        message.model = Some(session.summary.model.clone());
        self.publish(Event::MessageStarted { session_id: self.session_id.clone(), message: message.clone() });
        let mut streaming = Streaming {
            run: self,
            session_id: self.session_id.as_str().into(),
            message_id: message.id.as_str().into(),
            text: String::new(),
            reasoning: String::new(),
        };
        let outcome = route.call(&request, &mut streaming, &self.cancel);
        self.settle_call(reservation, &request, &outcome);
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
                if let Some(format) = format.as_ref().filter(|_| !message.has_tool_calls()) {
                    super::structured::mark(&mut message, format);
                }
                Step::Answered(Box::new(message.clone()))
            }
            Err(CallFailed::Cancelled { .. }) => {
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

    /// Stores a message, then announces it complete and the session's new summary; a quiet
    /// turn's message commits in one transaction with its announcement.
    pub(crate) fn append(&self, message: Message) -> Result<(), EngineError> {
        if !self.tracked() {
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
        // A quiet turn's session keeps its own state; a tracked one's status follows the turn.
        if self.tracked() {
            let write = self.shared.store.write(vec![WriteOp::ReleaseTurn {
                session_id: self.session_id.clone(),
                run_id: self.run_id.clone(),
                status,
                at: crate::time::now_rfc3339(),
            }]);
            match write {
                // Another node took the session over (its lease ran out here): it ended the turn.
                Err(error @ crate::store::StoreError::Fenced(_)) => {
                    log::warn!("run {}: its end was not stored: {error}", self.run_id)
                }
                Err(error) => log::error!("run {}: could not store the final status: {error}", self.run_id),
                Ok(_) => {}
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
                    EngineError::StructuredOutputInvalid(_) => error.to_string(),
                    _ => "internal error; the server log has the details".to_string(),
                };
                Event::RunFailed { session_id, run_id, error }
            }
        };
        Some(event)
    }

    pub(crate) fn session(&self) -> Result<SessionRecord, EngineError> {
        self.shared.store.readers().session(&self.session_id)?.ok_or(EngineError::SessionNotFound)
    }

    /// Whether the session's status follows this turn (`Lifecycle::Tracked`).
    pub(super) fn tracked(&self) -> bool {
        self.plan.lifecycle() == Lifecycle::Tracked
    }

    /// Announces the session's summary (`session.updated`), a tracked turn's only.
    fn publish_summary(&self) -> Result<(), EngineError> {
        if !self.tracked() {
            return Ok(());
        }
        let record = self.session()?;
        self.shared.publish_summary(&record);
        Ok(())
    }
}

/// An assistant answer a shutdown cut off mid-stream (`meta.partial` and `meta.interrupted`).
pub(crate) fn is_interrupted_partial(message: &Message) -> bool {
    message.role == Role::Assistant && message.flag("partial") && message.flag("interrupted")
}

/// An answer's blocks: its reasoning, its text, then its tool calls.
pub(crate) fn answer_blocks(reasoning: String, text: String, calls: Vec<ToolCall>) -> Vec<Block> {
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
