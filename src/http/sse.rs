//! Server-sent event bodies, written straight to the socket.
//!
//! tiny_http's own chunked encoder buffers 8 KiB before it sends anything, which would hold
//! back a stream's events, so a stream takes the raw connection (`into_writer`), writes the
//! head itself and sends each burst of frames as one chunk with a flush. The thread blocks on
//! the subscription's channel; it ends when the client is gone (a write fails, at the latest
//! on the next ping) or when the bus closes the channel (shutdown, or the client fell behind).

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::RecvTimeoutError;

use crate::bus::{Envelope, Subscription};

const HEAD: &str = "HTTP/1.1 200 OK\r\n\
Content-Type: text/event-stream\r\n\
Cache-Control: no-cache, no-transform\r\n\
X-Accel-Buffering: no\r\n\
Connection: close\r\n\
Transfer-Encoding: chunked\r\n\r\n";

/// Frames queued at once are sent together up to this many bytes.
const BURST_BYTES: usize = 64 * 1024;

pub struct EventStream {
    subscription: Subscription,
    /// Frames sent right after `retry`, before any replay.
    preamble: String,
}

impl EventStream {
    pub fn new(subscription: Subscription) -> EventStream {
        EventStream { subscription, preamble: String::new() }
    }

    /// Frames to send first, already in SSE form (`event: …\ndata: …\n\n`).
    pub fn with_preamble(mut self, frames: String) -> EventStream {
        self.preamble = frames;
        self
    }

    /// Writes the stream until the client leaves or the subscription closes.
    pub fn write_to(self, mut socket: Box<dyn Write + Send>, ping: Duration) -> std::io::Result<()> {
        socket.write_all(HEAD.as_bytes())?;
        let mut burst = String::with_capacity(4096);
        burst.push_str("retry: 3000\n\n");
        burst.push_str(&self.preamble);
        for envelope in &self.subscription.replay {
            push_frame(&mut burst, envelope);
            if burst.len() >= BURST_BYTES {
                write_chunk(&mut socket, &burst)?;
                burst.clear();
            }
        }
        write_chunk(&mut socket, &burst)?;
        let live = &self.subscription;
        loop {
            burst.clear();
            match live.recv_timeout(ping) {
                Ok(batch) => {
                    // One chunk per batch, and whatever else is already queued, up to a limit;
                    // a large batch goes out in several chunks.
                    let mut next = Some(batch);
                    while let Some(batch) = next.take() {
                        for envelope in batch.iter() {
                            push_frame(&mut burst, envelope);
                            if burst.len() >= BURST_BYTES {
                                write_chunk(&mut socket, &burst)?;
                                burst.clear();
                            }
                        }
                        if burst.len() < BURST_BYTES {
                            next = live.try_recv();
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) => burst.push_str(": ping\n\n"),
                Err(RecvTimeoutError::Disconnected) => break,
            }
            write_chunk(&mut socket, &burst)?;
        }
        // The last chunk tells the client the stream ended on purpose; it reconnects.
        socket.write_all(b"0\r\n\r\n")?;
        socket.flush()
    }
}

fn push_frame(burst: &mut String, envelope: &Arc<Envelope>) {
    let frame = envelope.frame.get_or_init(|| format!("id: {}\ndata: {}\n\n", envelope.seq, envelope.json));
    burst.push_str(frame);
}

fn write_chunk(socket: &mut Box<dyn Write + Send>, data: &str) -> std::io::Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    write!(socket, "{:x}\r\n", data.len())?;
    socket.write_all(data.as_bytes())?;
    socket.write_all(b"\r\n")?;
    socket.flush()
}
