//! A bus subscription as a server-sent event body.
//!
//! First `retry:` and any preamble frames, then what the subscriber missed (from the event log
//! and the ring), then live envelopes, each in the subscriber's wire format (rendered once per
//! envelope, by the bus or the first stream to need it). It ends when the bus closes the
//! channel (shutdown, or the client fell behind and should replay) and stops the moment the
//! client leaves (`stop`).

use std::time::Duration;

use crossbeam_channel::Receiver;

use super::stream::{Frames, StreamBody, BURST_BYTES};
use crate::bus::{Envelope, Format, Live, Subscription};

pub struct EventStream {
    subscription: Subscription,
    /// `retry:` and the frames sent before any replay; taken by the first `next`.
    preamble: Option<String>,
    /// The protocol's frame of an envelope, cached on the envelope per format.
    format: Format,
    render: fn(&Envelope) -> String,
    /// Whether the replay is over.
    live: bool,
}

impl EventStream {
    /// A stream of `subscription`'s envelopes, each as `render` makes it for `format`.
    pub fn new(subscription: Subscription, format: Format, render: fn(&Envelope) -> String) -> EventStream {
        let preamble = Some("retry: 3000\n\n".to_string());
        EventStream { subscription, preamble, format, render, live: false }
    }

    /// Frames to send first, already in SSE form (`event: …\ndata: …\n\n`).
    pub fn with_preamble(mut self, frames: String) -> EventStream {
        self.preamble.get_or_insert_with(String::new).push_str(&frames);
        self
    }

    /// What the subscriber missed, a page at a time, up to a burst.
    fn replay(&mut self, mut burst: String) -> Frames {
        while burst.len() < BURST_BYTES {
            match self.subscription.next_replay() {
                Some(page) => page.iter().for_each(|e| burst.push_str(e.frame(self.format, self.render))),
                None => {
                    self.live = true;
                    break;
                }
            }
        }
        Frames::Ready(burst)
    }
}

impl StreamBody for EventStream {
    fn next(&mut self, idle: Duration, stop: &Receiver<()>) -> Frames {
        if let Some(preamble) = self.preamble.take() {
            return self.replay(preamble);
        }
        if !self.live {
            return self.replay(String::new());
        }
        match self.subscription.recv_or_stop(idle, stop) {
            Live::Batch(batch) => {
                // One burst per batch, and whatever else is already queued, up to a limit.
                let mut burst = String::new();
                let mut next = Some(batch);
                while let Some(batch) = next.take() {
                    batch.iter().for_each(|e| burst.push_str(e.frame(self.format, self.render)));
                    if burst.len() < BURST_BYTES {
                        next = self.subscription.try_recv();
                    }
                }
                Frames::Ready(burst)
            }
            Live::Idle => Frames::Idle,
            Live::Stopped => Frames::Stopped,
            Live::Closed => Frames::End,
        }
    }
}
