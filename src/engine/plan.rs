//! What a door contributes to a turn. The loop (`run.rs`) is the same for every door: open the
//! turn, then ask the model, keep an answer without calls or dispatch its calls, until the
//! turn stops. A door's `TurnPlan` says how each step goes: what opens the turn, which route
//! the model calls take and what they are sent, how an answer is kept, who runs each call
//! (the server with approvals, an MCP server, a sandbox, a subagent, or the client, which
//! pauses the turn), how the turn shows on its session, and how it settles. A door's
//! per-session state lives behind `SessionDoor` on the session's actor (`session.rs`).
//!
//! Adding a door is writing these two, never editing the loop or the actor
//! (ARCHITECTURE.md, "How to add a door").

use std::any::Any;
use std::sync::Arc;

use super::run::{Run, Step, Stop};
use super::session::SessionActor;
use super::{EngineConfig, EngineError};
use crate::domain::{Message, SessionRecord, ToolCall, Usage};
use crate::providers::Route;

/// How a turn shows on its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    /// The session's status follows the turn (claimed `running`, released with how it
    /// ended); `run.started` and the turn's last event are logged; the session's summary is
    /// published as it changes; a message is stored, then announced; the turn's end is
    /// announced before its session's actor hears of it.
    Tracked,
    /// The session's status is the door's own business; a message commits in one transaction
    /// with its announcement; the turn's last event is streamed but not logged, after the
    /// actor heard of the end (a client may answer the moment it reads it).
    Quiet,
}

/// How a turn opens: calls to run before the first model call, or nothing left to do.
pub type Opening = Result<Vec<ToolCall>, Stop>;

/// A door's side of one turn.
pub trait TurnPlan: Send {
    /// Whom the turn's events are attributed to, if anyone (a BAE client's key id).
    fn actor(&self) -> Option<Arc<str>> {
        None
    }

    fn lifecycle(&self) -> Lifecycle;

    /// A plan that is not a loop (a compaction) runs whole here, and the turn ends with it;
    /// `None`: the loop runs.
    fn whole(&self, _run: &Run, _usage: &mut Usage) -> Option<Result<(), EngineError>> {
        None
    }

    /// Announces (and stores) what opens the turn.
    fn open(&self, run: &Run) -> Result<Opening, EngineError>;

    /// The route the turn's model calls take; `None`: there is none (recorded as the door
    /// records it), and the turn ends in a fault.
    fn route(&self, run: &Run, session: &SessionRecord) -> Result<Option<Route>, EngineError>;

    /// The most model calls one turn makes.
    fn step_limit(&self, config: &EngineConfig) -> u32;

    /// The turn made them all without a final answer.
    fn limit_reached(&self, run: &Run) -> Result<Stop, EngineError>;

    /// Where the turn's model calls are counted, and what they may spend: its tenant's,
    /// unless the door says otherwise (a BAE profile's).
    fn allowance(&self, config: &EngineConfig, tenant: &str) -> super::Allowance {
        config.tenant_allowance(tenant)
    }

    /// The budget was spent before the turn's next model call: how the turn ends (by
    /// default `budget_exceeded`, with a notice saying why).
    fn budget_spent(&self, run: &Run, reason: String) -> Result<Stop, EngineError> {
        let message = format!("The run stopped before its next model call: budget exceeded ({reason}).");
        let level = crate::domain::NoticeLevel::Warn;
        run.publish(crate::domain::Event::Notice { level, message, session_id: Some(run.session_id.clone()) });
        Ok(Stop::Finished(crate::domain::RunOutcome::BudgetExceeded))
    }

    /// One model call. `tail` is what the turn keeps in memory after the stored history (the
    /// rounds a door does not store).
    fn ask(
        &self,
        run: &Run,
        route: &Route,
        session: &SessionRecord,
        usage: &mut Usage,
        tail: &[Message],
    ) -> Result<Step, EngineError>;

    /// Keeps an answer that calls nothing: the turn's last.
    fn keep_answer(&self, run: &Run, answer: Message, usage: &Usage) -> Result<(), EngineError>;

    /// Runs an answer's calls; `Some(stop)` ends the turn (a cancel, a pause for the client).
    fn dispatch(
        &self,
        run: &Run,
        answer: Message,
        session: &SessionRecord,
        tail: &mut Vec<Message>,
    ) -> Result<Option<Stop>, EngineError>;
}

/// What a door keeps for a session on the session's actor, and how it answers what the door,
/// the session's turns and the door's slow steps send there. It is state of the actor, changed
/// only on its thread; with `worth_keeping`, an idle session keeps it with no thread.
pub trait SessionDoor: Send {
    /// One of the door's operations (`Engine::door_op`).
    fn op(&mut self, actor: &mut SessionActor, op: Box<dyn Any + Send>);
    /// A message one of the session's turns sent (`Run::tell_door`).
    fn turn_said(&mut self, _actor: &mut SessionActor, _message: Box<dyn Any + Send>) {}
    /// A turn ended; a turn that paused hands over what its door needs to resume it.
    fn turn_ended(&mut self, _actor: &mut SessionActor, _run_id: &str, _handoff: Option<Box<dyn Any + Send>>) {}
    /// A slow step the door started (`SessionActor::work`) is done.
    fn done(&mut self, _actor: &mut SessionActor, _done: Box<dyn Any + Send>) {}
    /// Another node took the session's lease: let go of what only this node has of it (a
    /// sandbox, MCP connections, drivers); the new owner rebuilds what it needs.
    fn evicted(&mut self, _actor: &mut SessionActor) {}
    /// Nothing waits on the actor for this door.
    fn is_idle(&self) -> bool {
        true
    }
    /// Something of it must outlive the actor's thread.
    fn worth_keeping(&self) -> bool {
        false
    }
    fn as_any(&mut self) -> &mut dyn Any;
}
