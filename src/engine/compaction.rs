//! The one summary step every compaction takes, whichever door asked: the older messages and
//! an instruction go to the model through the one call path (a Kestrel session's route, or a
//! BAE profile's chain, whose door watches the attempts), without tools, and the answer is
//! judged: an empty or cut-off summary is a failure, and a failure changes nothing.
//!
//! What the summary then replaces is each door's: a Kestrel run's older turns
//! (`context.rs`), a BAE session's whole history (`bae/compaction.rs`).

use super::run::Run;
use crate::domain::{Message, Role, Usage};
use crate::providers::{CallFailed, CompletionRequest, Finish, Route, Watch};

/// The built-in instruction, for every compaction that is given none.
pub const DEFAULT_PROMPT: &str = "Summarize the conversation so far in a single, self-contained message that \
lets it continue without the earlier messages: the user's goals and constraints, decisions made, tool \
results that still matter, open questions and the next steps. Write only the summary.";

/// A summary and what the model counted for it.
pub(crate) struct Summary {
    pub text: String,
    pub usage: Usage,
}

/// Why there is no summary; the history is left as it was.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum NoSummary {
    /// The model could not be asked: the call failed or was cancelled.
    Call(CallFailed),
    /// The answer hit the token limit, in the wire's words.
    Truncated(&'static str),
    Empty,
    /// The run's budget is spent: the model was not asked (why).
    BudgetSpent(String),
}

impl std::fmt::Display for NoSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // BAE's words; with retries, N counts every attempt.
            NoSummary::Call(CallFailed::Failed { attempts, .. }) => write!(f, "all {attempts} providers failed"),
            NoSummary::Call(CallFailed::Cancelled { .. }) => write!(f, "cancelled"),
            NoSummary::Truncated(why) => write!(f, "summary truncated: {why}"),
            NoSummary::BudgetSpent(why) => write!(f, "budget exceeded: {why}"),
            NoSummary::Empty => write!(f, "empty summary"),
        }
    }
}

impl Run {
    /// Asks `route` for a summary of `older` following `prompt`, without tools; `watch` takes
    /// the call (a BAE compaction records its attempts).
    pub(crate) fn summarize_messages(
        &self,
        route: &Route,
        watch: &mut dyn Watch,
        older: &[Message],
        prompt: &str,
        system_prompt: Option<&str>,
    ) -> Result<Summary, NoSummary> {
        let mut messages = older.to_vec();
        messages.push(Message::text_of(Role::User, prompt));
        let request = CompletionRequest { system_prompt, messages: &messages, tools: &[], response_format: None };
        let reservation = match self.reserve_call(route, &request) {
            Ok(Some(reservation)) => reservation,
            Ok(None) => return Err(NoSummary::Call(CallFailed::Cancelled { unanswered: None })),
            Err(super::EngineError::BudgetExceeded(why)) => return Err(NoSummary::BudgetSpent(why)),
            Err(error) => {
                let failed = CallFailed::Failed { message: error.to_string(), attempts: 0, unanswered: None };
                return Err(NoSummary::Call(failed));
            }
        };
        let called = route.call(&request, watch, &self.cancel);
        self.settle_call(reservation, &request, &called);
        let answered = called.map_err(NoSummary::Call)?;
        if answered.completion.finish == Some(Finish::Length) {
            return Err(NoSummary::Truncated(answered.cut_at_limit));
        }
        match answered.completion.text.trim() {
            "" => Err(NoSummary::Empty),
            text => Ok(Summary { text: text.to_string(), usage: answered.completion.usage }),
        }
    }
}
