//! One streamed HTTP call to a provider, readable with a cancel and an idle timeout.
//!
//! ureq reads block, and ureq offers no way to interrupt a read from another thread. So the
//! blocking part runs on its own `kestrel-upstream` thread, which sends what it reads over a
//! bounded channel (32 pieces; when the run is slow to consume, the reader waits, which is
//! the backpressure we want). The run's worker waits on that channel, its cancel token and the
//! clock at once, so a cancel or an idle stream ends the call within a second however silent
//! the provider is. The reader notices at its next read: it stops when its channel is gone,
//! and its socket read times out at the provider's idle timeout, so an abandoned connection is
//! closed at the latest then.

use std::io::Read;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver};

use crate::cancel::CancelToken;

/// Why an attempt failed.
#[derive(Debug)]
pub enum CallError {
    Cancelled,
    Refused(Refusal),
}

/// A failed attempt, with what the retry logic needs to decide and what a record of it shows:
/// never a key or a header.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// The HTTP status, when a response arrived.
    pub status: Option<u16>,
    /// What went wrong, in a sentence.
    pub error: String,
    /// The response body's text, when there was one.
    pub body: Option<String>,
    /// How long the provider asked to be left alone.
    pub retry_after: Option<Duration>,
    /// Worth retrying before output started: 429, 408, 409, 5xx, connection errors, timeouts.
    /// Not: 400, 401, 404, a malformed answer.
    pub retryable: bool,
}

impl Refusal {
    /// A failure worth retrying, with no response to show.
    pub fn transient(error: impl Into<String>) -> Refusal {
        Refusal { status: None, error: error.into(), body: None, retry_after: None, retryable: true }
    }

    /// A failure not worth retrying against the same provider.
    pub fn fatal(error: impl Into<String>) -> Refusal {
        Refusal { retryable: false, ..Refusal::transient(error) }
    }

    /// A non-2xx status, with its body and hint.
    fn status(status: u16, error: String, body: String, retry_after: Option<Duration>) -> Refusal {
        let retryable = status == 408 || status == 409 || status == 429 || status >= 500;
        Refusal { status: Some(status), error, body: Some(body), retry_after, retryable }
    }
}

impl From<Refusal> for CallError {
    fn from(refusal: Refusal) -> Self {
        CallError::Refused(refusal)
    }
}

pub(super) struct HttpCall {
    pub url: String,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
}

enum Piece {
    /// The response head: the status, a parsed retry hint, and for errors the body.
    Head {
        status: u16,
        retry_after: Option<Duration>,
        error_body: Option<String>,
    },
    Bytes(Vec<u8>),
    End,
    Failed(String),
}

/// Sends the call and feeds the body to `on_bytes` as it arrives. `on_bytes` returns false
/// to stop early (the stream said it is done).
pub(super) fn stream(
    agent: &ureq::Agent,
    call: HttpCall,
    cancel: &CancelToken,
    idle: Duration,
    deadline: Instant,
    on_bytes: &mut dyn FnMut(&[u8]) -> Result<bool, CallError>,
) -> Result<(), CallError> {
    let pieces = spawn_reader(agent.clone(), call)?;
    loop {
        let piece = next_piece(&pieces, cancel, idle, deadline)?;
        match piece {
            Piece::Head { status: 200..=299, .. } => {}
            Piece::Head { status, retry_after, error_body } => {
                let body = error_body.unwrap_or_default();
                let message = format!("HTTP {status}: {}", error_message(&body));
                return Err(Refusal::status(status, message, body, retry_after).into());
            }
            Piece::Bytes(bytes) => {
                if !on_bytes(&bytes)? {
                    return Ok(());
                }
            }
            Piece::End => return Ok(()),
            Piece::Failed(message) => return Err(Refusal::transient(message).into()),
        }
    }
}

/// Sends the call and reads the whole 2xx answer, at most `limit` bytes of it. A non-2xx
/// answer is refused as BAE words it: `provider returned HTTP <n>`, with its raw body.
pub(super) fn fetch(
    agent: &ureq::Agent,
    call: HttpCall,
    cancel: &CancelToken,
    deadline: Instant,
    limit: u64,
) -> Result<Vec<u8>, CallError> {
    let pieces = spawn_reader(agent.clone(), call)?;
    let idle = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    let mut body = Vec::new();
    loop {
        match next_piece(&pieces, cancel, idle, deadline)? {
            Piece::Head { status, error_body: Some(text), retry_after } => {
                let error = format!("provider returned HTTP {status}");
                return Err(Refusal::status(status, error, text, retry_after).into());
            }
            Piece::Head { .. } => {}
            Piece::Bytes(bytes) if body.len() as u64 + bytes.len() as u64 > limit => {
                return Err(Refusal::fatal(format!("the answer is larger than {limit} bytes")).into())
            }
            Piece::Bytes(bytes) => body.extend_from_slice(&bytes),
            Piece::End => return Ok(body),
            Piece::Failed(message) => return Err(Refusal::transient(message).into()),
        }
    }
}

fn next_piece(
    pieces: &Receiver<Piece>,
    cancel: &CancelToken,
    idle: Duration,
    deadline: Instant,
) -> Result<Piece, CallError> {
    let now = Instant::now();
    if now >= deadline {
        return Err(Refusal::transient("the request took longer than its timeout").into());
    }
    let wait = idle.min(deadline - now);
    select! {
        recv(pieces) -> piece => {
            piece.map_err(|_| Refusal::transient("the connection to the provider ended unexpectedly").into())
        }
        recv(cancel.receiver()) -> _ => Err(CallError::Cancelled),
        default(wait) => Err(Refusal::transient(if Instant::now() >= deadline {
            "the request took longer than its timeout".to_string()
        } else {
            format!("the provider sent nothing for {} s", idle.as_secs_f64())
        }).into()),
    }
}

fn spawn_reader(agent: ureq::Agent, call: HttpCall) -> Result<Receiver<Piece>, CallError> {
    let (piece_tx, pieces) = bounded(32);
    let spawned = crate::workers::UPSTREAM.spawn(move || {
        let mut request = agent.post(&call.url);
        for (name, value) in &call.headers {
            request = request.set(name, value);
        }
        let response = match request.send_string(&call.body) {
            Ok(response) => response,
            Err(ureq::Error::Status(status, response)) => {
                let retry_after = retry_after(&response);
                let body = read_limited(response.into_reader(), 64 * 1024);
                let _ = piece_tx.send(Piece::Head { status, retry_after, error_body: Some(body) });
                return;
            }
            Err(ureq::Error::Transport(transport)) => {
                // The transport error names the URL and the cause, never a header.
                let _ = piece_tx.send(Piece::Failed(format!("cannot reach the provider: {}", transport.kind())));
                return;
            }
        };
        let head = Piece::Head { status: response.status(), retry_after: None, error_body: None };
        if piece_tx.send(head).is_err() {
            return;
        }
        let mut reader = response.into_reader();
        let mut buffer = vec![0; 16 * 1024];
        loop {
            let piece = match reader.read(&mut buffer) {
                Ok(0) => Piece::End,
                Ok(n) => Piece::Bytes(buffer[..n].to_vec()),
                Err(error) => Piece::Failed(format!("the stream broke: {}", error.kind())),
            };
            let last = !matches!(piece, Piece::Bytes(_));
            if piece_tx.send(piece).is_err() || last {
                return;
            }
        }
    });
    spawned.map_err(|error| Refusal::fatal(format!("cannot start a reader thread: {error}")))?;
    Ok(pieces)
}

fn read_limited(reader: impl Read, limit: u64) -> String {
    let mut body = Vec::new();
    let _ = reader.take(limit).read_to_end(&mut body);
    String::from_utf8_lossy(&body).into_owned()
}

/// `retry-after-ms` (OpenAI) or `retry-after` in seconds; an HTTP date is ignored.
fn retry_after(response: &ureq::Response) -> Option<Duration> {
    parse_retry_after(response.header("retry-after-ms"), response.header("retry-after"))
}

/// `retry-after-ms` wins over `retry-after` (seconds) when it is a number. A negative wait is
/// none; an infinite or unrepresentable one is "longer than anyone waits"; NaN is no hint.
fn parse_retry_after(millis: Option<&str>, seconds: Option<&str>) -> Option<Duration> {
    let number = |text: Option<&str>| text.and_then(|t| t.trim().parse::<f64>().ok()).filter(|n| !n.is_nan());
    let seconds = match number(millis) {
        Some(ms) => ms / 1000.0,
        None => number(seconds)?,
    };
    Some(Duration::try_from_secs_f64(seconds.max(0.0)).unwrap_or(Duration::MAX))
}

/// The human part of an error body: `error.message` in both vendors' JSON, else the text.
pub(super) fn error_message(body: &str) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_str(body).ok();
    let message = parsed
        .as_ref()
        .and_then(|v| v.pointer("/error/message").or_else(|| v.get("message")).or_else(|| v.get("error")))
        .and_then(|m| m.as_str())
        .map(str::to_string)
        .unwrap_or_else(|| body.trim().to_string());
    let mut message: String = message.chars().take(500).collect();
    if message.is_empty() {
        message = "no details".into();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::parse_retry_after;
    use std::time::Duration;

    #[test]
    fn retry_after_hints_never_panic() {
        assert_eq!(parse_retry_after(Some("50"), Some("9")), Some(Duration::from_millis(50)));
        assert_eq!(parse_retry_after(None, Some("2.5")), Some(Duration::from_millis(2500)));
        assert_eq!(parse_retry_after(Some("soon"), Some("3")), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after(None, Some("inf")), Some(Duration::MAX));
        assert_eq!(parse_retry_after(Some("infinity"), None), Some(Duration::MAX));
        assert_eq!(parse_retry_after(None, Some("1e400")), Some(Duration::MAX));
        assert_eq!(parse_retry_after(None, Some("1e30")), Some(Duration::MAX));
        assert_eq!(parse_retry_after(None, Some("-3")), Some(Duration::ZERO));
        assert_eq!(parse_retry_after(Some("NaN"), Some("nan")), None);
        assert_eq!(parse_retry_after(None, Some("Wed, 21 Oct 2015 07:28:00 GMT")), None);
    }
}
