//! The Kestrel door's side of a turn: the session's own model, streamed; every call the
//! server's, with approvals and start marks (`engine/calls.rs`); the history compacted when it
//! would not fit (`engine/context.rs`); the session's status tracked through the turn; a
//! resumed turn first settles what the last one left (`Run::repair_transcript`).

use crate::domain::{Message, RunOutcome, SessionRecord, ToolCall, Usage};
use crate::engine::{EngineConfig, EngineError, Lifecycle, Opening, Repair, Run, Step, Stop, TurnPlan};
use crate::providers::Route;

/// A Kestrel run.
pub struct KestrelTurn;

impl TurnPlan for KestrelTurn {
    fn lifecycle(&self) -> Lifecycle {
        Lifecycle::Tracked
    }

    /// The user's message (stored with the claim) is announced; a resumed run settles the
    /// calls the last one left and runs again those that provably never ran.
    fn open(&self, run: &Run) -> Result<Opening, EngineError> {
        if let Some(user) = &run.user {
            run.announce_opening(user);
            return Ok(Ok(Vec::new()));
        }
        Ok(match run.repair_transcript()? {
            // The last stored message is a complete answer: the crash came after it.
            Repair::Complete => Err(Stop::Finished(RunOutcome::Completed)),
            Repair::Dispatch(calls) => Ok(calls),
        })
    }

    fn route(&self, run: &Run, session: &SessionRecord) -> Result<Option<Route>, EngineError> {
        run.session_route(session).map(Some)
    }

    fn step_limit(&self, config: &EngineConfig) -> u32 {
        config.max_steps
    }

    fn limit_reached(&self, _: &Run) -> Result<Stop, EngineError> {
        Ok(Stop::Finished(RunOutcome::MaxSteps))
    }

    fn ask(
        &self,
        run: &Run,
        route: &Route,
        session: &SessionRecord,
        usage: &mut Usage,
        _: &[Message],
    ) -> Result<Step, EngineError> {
        run.fit_context(route, session)?;
        run.call_model(route, session, usage)
    }

    /// Stored as it streamed.
    fn keep_answer(&self, _: &Run, _: Message, _: &Usage) -> Result<(), EngineError> {
        Ok(())
    }

    fn dispatch(
        &self,
        run: &Run,
        answer: Message,
        session: &SessionRecord,
        _: &mut Vec<Message>,
    ) -> Result<Option<Stop>, EngineError> {
        let calls: Vec<ToolCall> = answer.tool_calls().cloned().collect();
        run.run_calls(&calls, session)
    }
}
