//! The one summary step every compaction takes, whichever door asked: the older messages and
//! an instruction go to the model (a Kestrel session's provider, or a BAE profile's provider
//! chain with its `provider.request` / `provider.response` events), without tools, and the
//! answer is judged: an empty or cut-off summary is a failure, and a failure changes nothing.
//!
//! What the summary then replaces is each door's: a Kestrel run's older turns
//! (`context.rs`), a BAE session's whole history (`bae/compaction.rs`).

use super::bae::turn::{Attempted, Link};
use super::run::Run;
use crate::domain::{Message, Role, Usage};
use crate::providers::{CompletionRequest, Delta, Finish, Provider};

/// The built-in instruction, for every compaction that is given none.
pub const DEFAULT_PROMPT: &str = "Summarize the conversation so far in a single, self-contained message that \
lets it continue without the earlier messages: the user's goals and constraints, decisions made, tool \
results that still matter, open questions and the next steps. Write only the summary.";

/// Who writes the summary.
pub(super) enum Summarizer<'a> {
    /// A Kestrel session's model.
    Provider(&'a dyn Provider),
    /// A BAE profile's provider chain, each attempt recorded.
    Chain(&'a [Link]),
}

/// A summary and what the model counted for it.
pub(super) struct Summary {
    pub text: String,
    pub usage: Usage,
}

impl Run {
    /// Asks for a summary of `older` following `prompt`; why there is none, for people.
    pub(super) fn summarize_messages(
        &self,
        summarizer: Summarizer<'_>,
        older: &[Message],
        prompt: &str,
        system_prompt: Option<&str>,
    ) -> Result<Summary, String> {
        let mut messages = older.to_vec();
        messages.push(Message::text_of(Role::User, prompt));
        let (completion, wire) = match summarizer {
            Summarizer::Provider(provider) => {
                let request = CompletionRequest { system_prompt, messages: &messages, tools: &[] };
                let mut ignore = |_: Delta<'_>| {};
                let completion = provider.complete(&request, &mut ignore, &self.cancel).map_err(|e| e.to_string())?;
                (completion, provider.target().wire)
            }
            Summarizer::Chain(chain) => match self.attempt_chain(chain, (&messages, 0), &[], |_, _| {}) {
                Attempted::Answer(exchanged, target) => (exchanged.completion, target.wire),
                Attempted::AllFailed => return Err(format!("all {} providers failed", chain.len())),
                Attempted::Cancelled => return Err("cancelled".into()),
            },
        };
        if completion.finish == Some(Finish::Length) {
            let why = if wire == "openai" { "finish_reason length" } else { "stop_reason max_tokens" };
            return Err(format!("summary truncated: {why}"));
        }
        match completion.text.trim() {
            "" => Err("empty summary".into()),
            text => Ok(Summary { text: text.to_string(), usage: completion.usage }),
        }
    }
}
