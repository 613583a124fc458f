//! The NDJSON bodies of the RPC methods that stream: a turn (`session.sendMessage`,
//! `session.compact`) and a watch (`session.subscribe`).
//!
//! Each is pulled on its connection's thread. A turn's stream subscribes to the session's
//! events before it asks for the gate, so it misses nothing of its turn; until the gate is
//! held it sends nothing at all (a queued caller sees headers and zero bytes). Its own turn's
//! events are the ones the bus tagged with its run id. If the client goes away first, the
//! turn is abandoned: it leaves the queue, or stops.

use std::time::Duration;

use crossbeam_channel::Receiver;
use serde_json::{json, Value};

use super::wire;
use crate::api::bae::core::Bae;
use crate::api::bae::core::{BaeOp, RpcError, Started};
use crate::bus::{Batch, Envelope, Live, Subscription};
use crate::domain::{Dispatch, Event, Fault, Role, RunOutcome};
use crate::http::{Frames, StreamBody};

/// What a provider failure answers with instead of the model.
const UNAVAILABLE: &str = "The provider is currently unavailable.";

const LAGGED: &str =
    "{\"jsonrpc\":\"2.0\",\"error\":{\"code\":-32000,\"message\":\"lagged; reconnect with since_event_id\"}}\n";

/// Which method a turn stream answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnKind {
    Send,
    Compact,
}

/// A `sendMessage` or `compact` call: its notifications, then one terminal frame.
pub struct TurnStream {
    pub bae: Bae,
    pub session_id: String,
    pub run_id: String,
    pub kind: TurnKind,
    /// The request's id; `None` for a notification (no terminal frame).
    pub id: Option<RpcId>,
    pub subscription: Subscription,
    /// The actor's answer, until the gate is held.
    pub started: Option<Receiver<Result<Started, RpcError>>>,
    /// This turn's `EventView`s, in order (`result.events`).
    pub events: Vec<String>,
    /// The last answer of the model in this turn.
    pub message: Option<Value>,
    /// The `compaction.completed` view of a compaction.
    pub completed: Option<String>,
    /// A fault that ends the turn was recorded.
    pub faulted: bool,
    /// A compaction has started in this turn.
    pub compacting: bool,
    /// The stream has ended.
    pub done: bool,
    /// The turn is over, or was refused: nothing to give up when the stream goes.
    pub settled: bool,
}

impl TurnStream {
    /// Handles a batch; returns the frames to send and whether the turn is over.
    fn take(&mut self, batch: &Batch) -> String {
        let mut out = String::new();
        for envelope in batch.iter() {
            let ours = envelope.turn.as_deref() == Some(self.run_id.as_str());
            if ours {
                self.own(envelope, &mut out);
            } else if self.started.is_none() {
                // Events of the session once this call holds the gate are sent as they are.
                out.push_str(envelope.frame(wire::FORMAT, wire::ndjson_frame));
            }
            if self.done {
                break;
            }
        }
        out
    }

    /// One of this turn's events: kept for the result, sent unless the caller wrote it.
    fn own(&mut self, envelope: &Envelope, out: &mut String) {
        match &*envelope.event {
            // Recorded before a send held the gate: neither in its result nor sent to it.
            Event::SessionFault { fault: Fault::DriverTurnAbandoned { .. }, .. } if self.kind == TurnKind::Send => {
                return
            }
            Event::RunFinished { status, .. } => return self.finish(Some(*status), None, out),
            Event::RunFailed { error, .. } => return self.finish(None, Some(error.clone()), out),
            // A compaction at the end of a turn stores a summary: not the turn's answer.
            Event::CompactionStarted { .. } => self.compacting = true,
            Event::MessageCompleted { message, .. } if message.role == Role::Assistant && !self.compacting => {
                self.message = Some(wire::content(message));
            }
            Event::SessionFault { fault, .. } if fault.is_terminal() => self.faulted = true,
            _ => {}
        }
        let frame = envelope.frame(wire::FORMAT, wire::ndjson_frame);
        if frame.is_empty() {
            return;
        }
        let view = wire::view_of_frame(frame).to_string();
        if matches!(&*envelope.event, Event::CompactionCompleted(_)) {
            self.completed = Some(view.clone());
        }
        self.events.push(view);
        if !(self.kind == TurnKind::Send && written_by_caller(&envelope.event)) {
            out.push_str(frame);
        }
    }

    /// The terminal frame of the turn.
    fn finish(&mut self, status: Option<RunOutcome>, error: Option<String>, out: &mut String) {
        self.done = true;
        self.settled = true;
        let Some(id) = self.id.clone() else { return };
        let frame = match (self.kind, status, error) {
            (TurnKind::Send, Some(RunOutcome::Completed | RunOutcome::Paused), _) => {
                let message = json!({ "role": "assistant", "content": self.message.clone().unwrap_or(json!([])) });
                self.result(&id, &message)
            }
            (TurnKind::Send, None, _) if self.faulted => {
                let message = json!({ "role": "assistant", "content": [{ "type": "text", "text": UNAVAILABLE }] });
                self.result(&id, &message)
            }
            (TurnKind::Compact, Some(RunOutcome::Completed), _) if self.completed.is_some() => {
                format!(
                    "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{}}}\n",
                    self.completed.as_deref().unwrap_or("null")
                )
            }
            (TurnKind::Compact, None, Some(error)) => error_frame(&id, -32000, &error),
            _ => error_frame(&id, -32000, "session loop failed"),
        };
        out.push_str(&frame);
    }

    fn result(&self, id: &RpcId, message: &Value) -> String {
        format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{\"message\":{message},\"events\":[{}]}}}}\n",
            self.events.join(",")
        )
    }

    /// The gate is held: what arrived before it (other turns') is not this call's.
    fn gate_held(&mut self) -> String {
        self.started = None;
        let mut out = String::new();
        let run_id = self.run_id.clone();
        while let Some(batch) = self.subscription.try_recv() {
            for envelope in batch.iter().filter(|e| e.turn.as_deref() == Some(run_id.as_str())) {
                self.own(envelope, &mut out);
            }
        }
        out
    }
}

/// The events a `sendMessage` request itself recorded (its message, its tool results): in
/// `result.events`, never sent back to it as notifications.
fn written_by_caller(event: &Event) -> bool {
    match event {
        Event::MessageCompleted { message, .. } => {
            message.role == Role::User && message.meta.as_ref().is_none_or(|meta| !meta.contains_key("synthetic"))
        }
        Event::ToolFinished { dispatch, .. } => *dispatch == Dispatch::Client,
        _ => false,
    }
}

pub fn error_frame(id: &RpcId, code: i64, message: &str) -> String {
    let error = json!({ "code": code, "message": message });
    format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"error\":{error}}}\n")
}

/// A JSON-RPC request's id, kept as the client wrote it (its raw JSON), so it comes back
/// exactly: an integer past 2^53, or past 2^64, is never re-read as a float.
#[derive(Debug, Clone)]
pub struct RpcId(Box<serde_json::value::RawValue>);

impl RpcId {
    /// `null`: the id of an answer to a request whose own id could not be read.
    pub fn null() -> RpcId {
        RpcId(serde_json::value::RawValue::from_string("null".into()).expect("null is JSON"))
    }

    /// The raw id of a request body, given the id `parsed` from it (present or not). The raw
    /// text is read again from the body; a body it cannot be read from (a repeated `id` key)
    /// falls back to the parsed value.
    pub fn of(body: &[u8], parsed: &Value) -> RpcId {
        #[derive(serde::Deserialize)]
        struct IdOnly {
            #[serde(default)]
            id: Option<Box<serde_json::value::RawValue>>,
        }
        match serde_json::from_slice::<IdOnly>(body) {
            Ok(IdOnly { id: Some(raw) }) => RpcId(raw),
            Ok(IdOnly { id: None }) if parsed.is_null() => RpcId::null(),
            _ => {
                RpcId(serde_json::value::RawValue::from_string(parsed.to_string()).unwrap_or_else(|_| RpcId::null().0))
            }
        }
    }
}

impl std::fmt::Display for RpcId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.get())
    }
}

impl StreamBody for TurnStream {
    fn next(&mut self, idle: Duration, stop: &Receiver<()>) -> Frames {
        if self.done {
            return Frames::End;
        }
        let waited = match &self.started {
            Some(started) => self.subscription.recv_or(started, idle, stop),
            None => Ok(self.subscription.recv_or_stop(idle, stop)),
        };
        match waited {
            Err(Some(Ok(Started))) => Frames::Ready(self.gate_held()),
            Err(Some(Err(error))) => {
                self.done = true;
                self.settled = true;
                match &self.id {
                    Some(id) => Frames::Ready(super::rpc::rpc_error_frame(id, &error, self.kind)),
                    None => Frames::End,
                }
            }
            Err(None) => {
                self.done = true;
                self.settled = true;
                match &self.id {
                    Some(id) => Frames::Ready(error_frame(id, -32603, "Internal error")),
                    None => Frames::End,
                }
            }
            Ok(Live::Batch(batch)) => Frames::Ready(self.take(&batch)),
            Ok(Live::Idle) => Frames::Idle,
            Ok(Live::Closed) => {
                self.done = true;
                Frames::Ready(LAGGED.to_string())
            }
            Ok(Live::Stopped) => Frames::Stopped,
        }
    }
}

impl Drop for TurnStream {
    /// A caller that left before its turn ended gives it up.
    fn drop(&mut self) {
        if !self.settled {
            let _ = self.bae.op(&self.session_id, BaeOp::Abandon { run_id: self.run_id.clone() });
        }
    }
}

/// A `subscribe` call: what the log holds after `since_event_id`, then live events, until an
/// unsubscribe, the session's close, the client leaving, or a lag.
pub struct WatchStream {
    pub subscription: Subscription,
    pub replaying: bool,
    pub done: bool,
}

impl WatchStream {
    fn live(&mut self, batch: &Batch) -> String {
        let mut out = String::new();
        for envelope in batch.iter() {
            match &*envelope.event {
                Event::StreamsReleased { .. } => {
                    self.done = true;
                    break;
                }
                Event::SessionClosed { .. } => {
                    out.push_str(envelope.frame(wire::FORMAT, wire::ndjson_frame));
                    self.done = true;
                    break;
                }
                _ => out.push_str(envelope.frame(wire::FORMAT, wire::ndjson_frame)),
            }
        }
        out
    }
}

impl StreamBody for WatchStream {
    fn next(&mut self, idle: Duration, stop: &Receiver<()>) -> Frames {
        if self.done {
            return Frames::End;
        }
        if self.replaying {
            match self.subscription.next_replay() {
                Some(page) => {
                    let frames: String = page.iter().map(|e| e.frame(wire::FORMAT, wire::ndjson_frame)).collect();
                    return Frames::Ready(frames);
                }
                None => self.replaying = false,
            }
        }
        match self.subscription.recv_or_stop(idle, stop) {
            Live::Batch(batch) => Frames::Ready(self.live(&batch)),
            Live::Idle => Frames::Idle,
            Live::Closed => {
                self.done = true;
                Frames::Ready(LAGGED.to_string())
            }
            Live::Stopped => Frames::Stopped,
        }
    }
}
