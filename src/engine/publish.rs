//! How a turn publishes: every event attributed to the turn (and to whom it acts for),
//! messages stored in the same transaction as their `message.completed`, and a few things
//! held back so they share a commit with what follows them. Every commit a turn waits for is
//! an fsync; a BAE turn against a fast provider is mostly those.

use std::sync::Arc;

use super::run::Run;
use super::EngineError;
use crate::bus::{Origin, Publication};
use crate::domain::{Event, Message};
use crate::store::WriteOp;

/// Events and writes held back to go out with the turn's next publish, in the same log
/// transaction: the client's message with the provider request made of it, a provider's
/// answer with the message made of it.
#[derive(Default)]
pub(super) struct Held {
    events: Vec<Event>,
    writes: Vec<WriteOp>,
}

impl Run {
    /// Publishes an event of this turn (after whatever is held).
    pub(crate) fn publish(&self, event: Event) {
        let (publication, writes) = self.publication(event);
        if !writes {
            return self.shared.bus.send(publication);
        }
        // Held messages are on their way to the store: `settle` waits for them.
        if let Some(commit) = self.shared.bus.send_pending(publication) {
            self.pending.borrow_mut().push(commit);
        }
    }

    /// Holds `event` back to go out with the next publish of this turn.
    pub(crate) fn hold(&self, event: Event) {
        self.held.borrow_mut().events.push(event);
    }

    /// Holds `message` back to be stored with the next publish of this turn, announced by
    /// its `message.completed`.
    pub(crate) fn hold_message(&self, message: Message) {
        let (event, writes) = self.announced(message);
        let mut held = self.held.borrow_mut();
        held.events.push(event);
        held.writes.extend(writes);
    }

    /// Publishes an event of this turn and returns its seq once it is durable.
    pub(crate) fn publish_durable(&self, event: Event) -> Result<u64, EngineError> {
        let committed = self.shared.bus.send_pending(self.publication(event).0);
        committed.and_then(|seq| seq.recv().ok()).ok_or(EngineError::Internal("an event could not be logged"))
    }

    /// Stores a message and its `message.completed` together; the event's seq.
    pub(crate) fn append_announced(&self, message: Message) -> Result<u64, EngineError> {
        self.append_pending(message)?.recv().map_err(|_| EngineError::Internal("a message could not be stored"))
    }

    /// Sends a message to be stored with its `message.completed`, without waiting for the
    /// commit; the receiver gets the event's seq once both are durable.
    pub(crate) fn append_pending(&self, message: Message) -> Result<crossbeam_channel::Receiver<u64>, EngineError> {
        let (event, writes) = self.announced(message);
        let (publication, _) = self.publication(event);
        let publication = publication.with_writes(writes);
        self.shared.bus.send_pending(publication).ok_or(EngineError::ShuttingDown)
    }

    /// Sends a message to be stored with its `message.completed` without waiting: the turn
    /// settles it before it ends (`settle`).
    pub(crate) fn append_later(&self, message: Message) -> Result<(), EngineError> {
        let commit = self.append_pending(message)?;
        self.pending.borrow_mut().push(commit);
        Ok(())
    }

    /// Waits until every message sent to be stored (or held) is committed.
    pub(crate) fn settle(&self) -> Result<(), EngineError> {
        self.flush_held();
        let pending = std::mem::take(&mut *self.pending.borrow_mut());
        for commit in pending {
            commit.recv().map_err(|_| EngineError::Internal("a message could not be stored"))?;
        }
        Ok(())
    }

    /// The turn's last event. A quiet turn's end is not logged: its door's wire has no such
    /// event, and a log write would cost its client one more commit before it hears the end;
    /// unless a webhook wants it (`log_quiet_ends`), which needs it in the log's outbox.
    pub(super) fn publish_last(&self, last: Option<Event>) {
        let logged = self.shared.log_quiet_ends.load(std::sync::atomic::Ordering::Relaxed);
        match last {
            Some(event) if self.tracked() || logged => self.publish(event),
            Some(event) => {
                let (publication, _) = self.publication(event);
                self.shared.bus.send(publication.unlogged())
            }
            None => self.flush_held(),
        }
    }

    /// Publishes whatever is held.
    fn flush_held(&self) {
        let last = self.held.borrow_mut().events.pop();
        if let Some(event) = last {
            self.publish(event);
        }
    }

    /// A message's `message.completed` and the writes that store it.
    fn announced(&self, message: Message) -> (Event, Vec<WriteOp>) {
        let writes = self.stored(&message);
        (Event::MessageCompleted { session_id: self.session_id.clone(), message }, writes)
    }

    /// The writes that store a message: the append, and the settling of the start mark of
    /// every call it carries a result of.
    pub(crate) fn stored(&self, message: &Message) -> Vec<WriteOp> {
        let mut writes = vec![WriteOp::AppendMessage {
            session_id: self.session_id.clone(),
            message: message.clone(),
            updated_at: crate::time::now_rfc3339(),
        }];
        writes.extend(message.blocks.iter().filter_map(|block| match block {
            crate::domain::Block::ToolResult(result) => {
                Some(WriteOp::SettleCall { session_id: self.session_id.clone(), call_id: result.call_id.clone() })
            }
            _ => None,
        }));
        writes
    }

    /// Publishes a server-run call's `tool.finished` with the settling of its start mark, in
    /// one commit.
    pub(crate) fn publish_settled(&self, event: Event, call_id: &str) {
        let settle = WriteOp::SettleCall { session_id: self.session_id.clone(), call_id: call_id.to_string() };
        self.held.borrow_mut().writes.push(settle);
        self.publish(event);
    }

    /// `event` as this turn publishes it, after the held events and with the held writes;
    /// whether it carries writes.
    fn publication(&self, event: Event) -> (Publication, bool) {
        let Held { events, writes } = std::mem::take(&mut *self.held.borrow_mut());
        let carries = !writes.is_empty();
        let publication = Publication::new(Some(Arc::clone(&self.tenant)), self.origin(), event).after(events);
        (publication.with_writes(writes), carries)
    }

    pub(super) fn origin(&self) -> Origin {
        Origin { actor: self.plan.actor(), turn: Some(Arc::from(self.run_id.as_str())) }
    }
}
