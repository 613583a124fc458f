//! Server-sent event bodies, written straight to the client's socket.
//!
//! tiny_http's own chunked encoder buffers 8 KiB before it sends anything, which would hold
//! back a stream's events, so the gate writes a stream's head itself and each burst of frames
//! as one chunk with a flush. The thread blocks on the subscription's channel and on `stop`,
//! which the gate's watcher disconnects the moment the client closes its end, so a closed
//! stream gives its thread and socket back at once, not at the next ping. It also ends when a
//! write fails or when the bus closes the channel (shutdown, or the client fell behind).

use std::io::Write;
use std::time::Duration;

use crossbeam_channel::Receiver;

use crate::bus::{Envelope, Format, Live, Subscription};

/// Frames queued at once are sent together up to this many bytes.
const BURST_BYTES: usize = 64 * 1024;

pub struct EventStream {
    subscription: Subscription,
    /// Frames sent right after `retry`, before any replay.
    preamble: String,
    /// The protocol's frame of an envelope, cached on the envelope per format.
    format: Format,
    render: fn(&Envelope) -> String,
}

/// How a stream's body is framed: chunked for HTTP/1.1, raw until close for HTTP/1.0.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Chunked,
    UntilClose,
}

impl EventStream {
    /// A stream of `subscription`'s envelopes, each as `render` makes it for `format`.
    pub fn new(subscription: Subscription, format: Format, render: fn(&Envelope) -> String) -> EventStream {
        EventStream { subscription, preamble: String::new(), format, render }
    }

    /// Frames to send first, already in SSE form (`event: …\ndata: …\n\n`).
    pub fn with_preamble(mut self, frames: String) -> EventStream {
        self.preamble = frames;
        self
    }

    /// The response head, before any frame.
    pub fn head(framing: Framing, version: &str) -> String {
        let encoding = if framing == Framing::Chunked { "Transfer-Encoding: chunked\r\n" } else { "" };
        format!(
            "{version} 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache, no-transform\r\n\
             X-Accel-Buffering: no\r\nConnection: close\r\n{encoding}\r\n"
        )
    }

    /// Writes the stream until the client leaves (`stop` disconnects or a write fails) or the
    /// subscription closes.
    pub fn write_to(
        self,
        socket: &mut dyn Write,
        ping: Duration,
        stop: &Receiver<()>,
        framing: Framing,
    ) -> std::io::Result<()> {
        let mut out = Chunks { socket, framing };
        let mut burst = String::with_capacity(4096);
        burst.push_str("retry: 3000\n\n");
        burst.push_str(&self.preamble);
        let (format, render) = (self.format, self.render);
        let mut subscription = self.subscription;
        while let Some(page) = subscription.next_replay() {
            for envelope in &page {
                burst.push_str(envelope.frame(format, render));
                if burst.len() >= BURST_BYTES {
                    out.write(&burst)?;
                    burst.clear();
                }
            }
        }
        out.write(&burst)?;
        let live = &subscription;
        loop {
            burst.clear();
            match live.recv_or_stop(ping, stop) {
                Live::Batch(batch) => {
                    // One chunk per batch, and whatever else is already queued, up to a limit;
                    // a large batch goes out in several chunks.
                    let mut next = Some(batch);
                    while let Some(batch) = next.take() {
                        for envelope in batch.iter() {
                            burst.push_str(envelope.frame(format, render));
                            if burst.len() >= BURST_BYTES {
                                out.write(&burst)?;
                                burst.clear();
                            }
                        }
                        if burst.len() < BURST_BYTES {
                            next = live.try_recv();
                        }
                    }
                }
                Live::Idle => burst.push_str(": ping\n\n"),
                Live::Stopped => return Ok(()),
                Live::Closed => break,
            }
            out.write(&burst)?;
        }
        out.finish()
    }
}

struct Chunks<'a> {
    socket: &'a mut dyn Write,
    framing: Framing,
}

impl Chunks<'_> {
    fn write(&mut self, data: &str) -> std::io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        if self.framing == Framing::Chunked {
            write!(self.socket, "{:x}\r\n", data.len())?;
            self.socket.write_all(data.as_bytes())?;
            self.socket.write_all(b"\r\n")?;
        } else {
            self.socket.write_all(data.as_bytes())?;
        }
        self.socket.flush()
    }

    /// The last chunk tells the client the stream ended on purpose; it reconnects.
    fn finish(&mut self) -> std::io::Result<()> {
        if self.framing == Framing::Chunked {
            self.socket.write_all(b"0\r\n\r\n")?;
        }
        self.socket.flush()
    }
}
