//! Long sessions: before each provider call of a Kestrel run, the history the model would see
//! is estimated, and past `agent.compact_at` of the model's `contextWindow` the older part is
//! replaced by a summary the model writes.
//!
//! The estimate: the provider's own figures when known (the input and output tokens of the
//! latest answer that reported usage), plus four characters a token (and four tokens a
//! message) for what came after it; without figures, the same rule over everything.
//!
//! What a compaction does: the most recent `agent.compaction_keep_turns` turns (a turn starts
//! at a user message, so a tool call and its result are never split) stay as they are; the
//! model is asked for a summary of what came before (`compaction.rs`, the step BAE's
//! compactions take too); the summary is stored as a user message
//! marked `meta.compactionSummary`, before the kept turns; the messages it replaces stay in
//! the store marked `meta.compacted` (hidden: out of the model's history and out of
//! `GET /api/sessions/:id`, still there for audit). A compaction that fails changes nothing:
//! a `notice` says why and the run goes on with the whole history.

use serde_json::json;

use super::compaction::NoSummary;
use super::run::{is_interrupted_partial, Run};
use super::EngineError;
use crate::domain::{Event, Message, NoticeLevel, Role, SessionRecord, Usage};
use crate::providers::{Route, Watch};
use crate::store::WriteOp;

/// A message a compaction replaced.
pub(crate) const COMPACTED: &str = "compacted";
/// The message holding a compaction's summary.
pub(crate) const SUMMARY: &str = "compactionSummary";

/// The messages the model sees: neither the compacted ones nor an answer a shutdown cut short.
pub(crate) fn visible(mut messages: Vec<Message>) -> Vec<Message> {
    messages.retain(|message| !message.flag(COMPACTED) && !is_interrupted_partial(message));
    messages
}

/// Tokens the model would read for `messages` (see the module doc). A compaction's kept
/// messages report what the provider counted before it, so only later answers' figures count.
pub(crate) fn estimate(messages: &[Message]) -> u64 {
    let fresh = match messages.iter().rposition(|m| m.flag(SUMMARY)) {
        Some(at) => {
            let kept = messages[at].meta.as_ref().and_then(|m| m.get("keptMessages")).and_then(|k| k.as_u64());
            (at + 1 + kept.unwrap_or(0) as usize).min(messages.len())
        }
        None => 0,
    };
    let reported = messages[fresh..].iter().rposition(|m| reported_usage(m).is_some()).map(|at| fresh + at);
    let (base, rest) = match reported {
        Some(at) => {
            (reported_usage(&messages[at]).map_or(0, |u| u.input_tokens + u.output_tokens), &messages[at + 1..])
        }
        None => (0, messages),
    };
    base + rest.iter().map(|m| model_bytes(m).div_ceil(4) + 4).sum::<u64>()
}

/// About what of `message` a provider reads: its blocks, and its role and id. Its `meta` (the
/// usage reported, a call's permission) is for clients and never reaches a model.
fn model_bytes(message: &Message) -> u64 {
    let blocks = serde_json::to_string(&message.blocks).map_or(0, |s| s.len());
    (blocks + message.id.len() + message.created_at.len() + 32) as u64
}

fn reported_usage(message: &Message) -> Option<Usage> {
    let usage: Usage = serde_json::from_value(message.meta.as_ref()?.get("usage")?.clone()).ok()?;
    (usage.input_tokens > 0).then_some(usage)
}

/// Where the kept turns start: the `keep`-th user message from the end, if anything comes
/// before it.
fn split(messages: &[Message], keep: usize) -> Option<usize> {
    let starts: Vec<usize> =
        messages.iter().enumerate().filter(|(_, m)| m.role == Role::User).map(|(at, _)| at).collect();
    let at = *starts.iter().rev().nth(keep.max(1) - 1)?;
    (at > 0).then_some(at)
}

impl Run {
    /// Compacts the session's history first if the next call would not fit (see the module doc).
    pub(crate) fn fit_context(&self, route: &Route, session: &SessionRecord) -> Result<(), EngineError> {
        let Some(window) =
            self.shared.models.infos().find(|m| m.id == session.summary.model).and_then(|m| m.context_window)
        else {
            return Ok(());
        };
        let history = visible(self.shared.store.readers().messages(&self.session_id)?);
        let before = estimate(&history);
        if (before as f64) < window as f64 * self.shared.config.compact_at {
            return Ok(());
        }
        let Some(at) = split(&history, self.shared.config.compaction_keep_turns) else { return Ok(()) };
        match self.summarize_messages(
            route,
            &mut Unseen,
            &history[..at],
            super::compaction::DEFAULT_PROMPT,
            session.system_prompt.as_deref(),
        ) {
            Ok(summary) => self.store_compaction(&history, at, summary.text, before),
            // Nor may the run's next call be asked: the run stops there (`run.rs`).
            Err(NoSummary::BudgetSpent(why)) => Err(EngineError::BudgetExceeded(why)),
            Err(why) => {
                self.publish(Event::Notice {
                    level: NoticeLevel::Warn,
                    message: format!("the conversation could not be compacted ({why}); it goes on in full"),
                    session_id: Some(self.session_id.clone()),
                });
                Ok(())
            }
        }
    }

    fn store_compaction(&self, history: &[Message], at: usize, text: String, before: u64) -> Result<(), EngineError> {
        let mut summary = Message::text_of(Role::User, format!("Summary of the earlier conversation:\n\n{text}"));
        let meta = summary.meta.get_or_insert_with(Default::default);
        meta.insert(SUMMARY.into(), json!(true));
        meta.insert("removedMessages".into(), json!(at));
        let kept = &history[at..];
        meta.insert("keptMessages".into(), json!(kept.len()));
        self.shared.store.write(vec![WriteOp::CompactHistory {
            session_id: self.session_id.clone(),
            summary: summary.clone(),
            hidden: history[..at].iter().map(|m| m.id.clone()).collect(),
            kept: kept.iter().map(|m| m.id.clone()).collect(),
        }])?;
        let after = estimate(&[std::slice::from_ref(&summary), kept].concat());
        self.publish(Event::ContextCompacted {
            session_id: self.session_id.clone(),
            removed_messages: at as u64,
            kept_messages: kept.len() as u64,
            tokens_before: before,
            tokens_after: after,
        });
        Ok(())
    }
}

/// A summary streamed as the session's answers are, and shown to nobody.
struct Unseen;

impl Watch for Unseen {
    fn streamed(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(role: Role, text: &str) -> Message {
        Message::text_of(role, text)
    }

    #[test]
    fn the_split_is_at_a_user_message_so_no_call_loses_its_result() {
        let history = vec![
            message(Role::User, "one"),
            message(Role::Assistant, "calls a tool"),
            message(Role::Tool, "the result"),
            message(Role::Assistant, "done"),
            message(Role::User, "two"),
            message(Role::Assistant, "calls again"),
            message(Role::Tool, "result two"),
            message(Role::User, "three"),
        ];
        assert_eq!(split(&history, 2), Some(4));
        assert_eq!(split(&history, 1), Some(7));
        assert_eq!(split(&history, 3), None, "nothing before the first turn to summarize");
    }

    #[test]
    fn the_estimate_uses_reported_usage_and_counts_what_came_after() {
        let mut answer = message(Role::Assistant, "answer");
        answer
            .meta
            .get_or_insert_with(Default::default)
            .insert("usage".into(), json!({ "inputTokens": 1000, "outputTokens": 200, "totalTokens": 1200 }));
        let after = message(Role::User, &"x".repeat(400));
        let without = estimate(std::slice::from_ref(&after));
        assert!(without >= 100, "{without}");
        assert_eq!(estimate(&[message(Role::User, "old"), answer, after]), 1200 + without);
    }
}
