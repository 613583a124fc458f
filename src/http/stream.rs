//! Streamed replies: a body that produces frames over time, and the framing that carries them.
//!
//! Two framings, one writer: server-sent events (`text/event-stream`, a `: ping` comment when
//! idle) and NDJSON (`application/x-ndjson`, one JSON object per line, nothing when idle, so
//! a stream that has nothing to say sends headers and then zero bytes). Either way the body
//! goes out as one HTTP chunk per burst, flushed at once, written by the gate straight to the
//! socket; tiny_http's chunked encoder would hold 8 KiB back.

use std::io::Write;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError};

use super::head::Version;

/// Frames gathered into one write at most.
pub(crate) const BURST_BYTES: usize = 64 * 1024;

/// What a body has next.
pub enum Frames {
    /// Bytes to send, already framed (`data: …\n\n`, or `{…}\n`).
    Ready(String),
    /// Nothing within the idle interval.
    Idle,
    /// The body ended on purpose.
    End,
    /// The client left (`stop` disconnected).
    Stopped,
}

/// The source of a streamed reply, pulled on the connection's thread.
pub trait StreamBody: Send {
    /// The next frames: waits at most `idle`, and returns `Stopped` as soon as `stop`
    /// disconnects (the client closed its end).
    fn next(&mut self, idle: Duration, stop: &Receiver<()>) -> Frames;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Server-sent events, with a `: ping` comment each idle interval.
    EventStream,
    /// One JSON object per line.
    Ndjson,
}

/// A streamed reply.
pub struct Stream {
    pub framing: Framing,
    pub body: Box<dyn StreamBody>,
    /// Sent as `X-Request-Id` in the head.
    pub request_id: Option<String>,
    /// The request's log line, written when the stream ends.
    pub access: Option<super::access::Pending>,
}

impl Stream {
    pub fn new(framing: Framing, body: impl StreamBody + 'static) -> Stream {
        Stream { framing, body: Box::new(body), request_id: None, access: None }
    }

    /// The response head. HTTP/1.1 clients get chunks; HTTP/1.0 ones get the body until close.
    pub fn head(&self, version: Version) -> String {
        let encoding = if version == Version::Http11 { "Transfer-Encoding: chunked\r\n" } else { "" };
        let kind = match self.framing {
            Framing::EventStream => "Content-Type: text/event-stream\r\nX-Accel-Buffering: no\r\n",
            Framing::Ndjson => "Content-Type: application/x-ndjson\r\n",
        };
        let id = self.request_id.as_deref().map(|id| format!("X-Request-Id: {id}\r\n")).unwrap_or_default();
        format!(
            "{} 200 OK\r\n{kind}Cache-Control: no-cache, no-transform\r\n{id}Connection: close\r\n{encoding}\r\n",
            version.as_str()
        )
    }

    /// Writes the body until it ends, the client leaves, or a write fails.
    pub fn write_to(
        mut self,
        socket: &mut dyn Write,
        version: Version,
        idle: Duration,
        stop: &Receiver<()>,
    ) -> std::io::Result<()> {
        socket.write_all(self.head(version).as_bytes())?;
        let mut out = Chunks { socket, chunked: version == Version::Http11 };
        // Headers go out at once, even if the body has nothing yet.
        out.socket.flush()?;
        loop {
            match self.body.next(idle, stop) {
                Frames::Ready(frames) => out.write(&frames)?,
                Frames::Idle if self.framing == Framing::EventStream => out.write(": ping\n\n")?,
                Frames::Idle => {}
                Frames::Stopped => return Ok(()),
                Frames::End => return out.finish(),
            }
        }
    }
}

/// One HTTP chunk per write, flushed.
struct Chunks<'a> {
    socket: &'a mut dyn Write,
    chunked: bool,
}

impl Chunks<'_> {
    fn write(&mut self, data: &str) -> std::io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        if self.chunked {
            write!(self.socket, "{:x}\r\n", data.len())?;
            self.socket.write_all(data.as_bytes())?;
            self.socket.write_all(b"\r\n")?;
        } else {
            self.socket.write_all(data.as_bytes())?;
        }
        self.socket.flush()
    }

    /// The last chunk tells the client the stream ended on purpose.
    fn finish(&mut self) -> std::io::Result<()> {
        if self.chunked {
            self.socket.write_all(b"0\r\n\r\n")?;
        }
        self.socket.flush()
    }
}

/// An NDJSON body from a channel of JSON values: a line each, all that are waiting in one
/// burst; it ends when every sender is gone.
pub struct JsonLines {
    lines: Receiver<serde_json::Value>,
}

impl JsonLines {
    pub fn new(lines: Receiver<serde_json::Value>) -> JsonLines {
        JsonLines { lines }
    }

    fn push(burst: &mut String, value: &serde_json::Value) {
        burst.push_str(&value.to_string());
        burst.push('\n');
    }
}

impl StreamBody for JsonLines {
    fn next(&mut self, idle: Duration, stop: &Receiver<()>) -> Frames {
        let first = crossbeam_channel::select! {
            recv(self.lines) -> line => line.map_err(|_| RecvTimeoutError::Disconnected),
            recv(stop) -> _ => return Frames::Stopped,
            default(idle) => Err(RecvTimeoutError::Timeout),
        };
        match first {
            Ok(value) => {
                let mut burst = String::new();
                Self::push(&mut burst, &value);
                while burst.len() < BURST_BYTES {
                    match self.lines.try_recv() {
                        Ok(value) => Self::push(&mut burst, &value),
                        Err(_) => break,
                    }
                }
                Frames::Ready(burst)
            }
            Err(RecvTimeoutError::Timeout) => Frames::Idle,
            Err(RecvTimeoutError::Disconnected) => Frames::End,
        }
    }
}
