//! Forwarding (docs/cluster.md): an operation on a session another node owns is sent to that
//! node with the cluster's secret, and its answer relayed: the status, body and the headers a
//! client reads, or the stream, burst by burst, for as long as it lasts.
//!
//! Which node serves a request that names a session (`/api/sessions/{id}…` on Kestrel's door,
//! `/api/v1/sessions/{id}…` on BAE's):
//! - this node, when it holds the session's lease;
//! - an operation that may make the session live (any method but GET and HEAD, and the event
//!   streams, which follow the live session) claims the lease first: this node serves it when
//!   the claim succeeds (or the session does not exist, which the door answers), and the
//!   holder does otherwise;
//! - a read of a session another node holds goes to that node; of one no node holds, served
//!   here from the database.
//!
//! A call that carries the secret came from a node that found this one the holder: it is
//! served here, never sent on again. If the lease moved meanwhile, the answer is a retryable
//! 503, so a request is forwarded at most once. A call with a wrong secret is refused (403);
//! the secret itself is never logged.

use std::io::Read;
use std::time::Duration;

use crossbeam_channel::{bounded, select, Receiver};

use super::{Node, SECRET_HEADER};
use crate::http::{BodyError, Frames, Framing, Reply, Request, Stream, StreamBody};
use crate::store::cluster::Claim;
use crate::store::StoreError;

/// The header naming the node that forwarded a call (in the owner's access log).
pub const FORWARDED_BY: &str = "Kestrel-Forwarded-By";

/// The headers of an answer a client reads, relayed from the owner.
const RELAYED_HEADERS: [&str; 7] =
    ["Retry-After", "Allow", "Idempotency-Replayed", "Cache-Control", "Location", "ETag", "Content-Disposition"];

/// Request headers not sent on: hop-by-hop ones, ones the call sets again, and the cluster's.
const NOT_SENT_ON: [&str; 12] = [
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "content-length",
    "te",
    "trailer",
    "upgrade",
    "expect",
    "kestrel-cluster-secret",
    "kestrel-forwarded-by",
];

/// The largest answer body relayed whole (an answer is bounded by what the owner sends; this
/// bounds what a node holds of one). Streams are relayed burst by burst, without a bound.
const MAX_RELAYED_BODY: u64 = 256 * 1024 * 1024;

/// What a relay reads at once from the owner's stream.
const RELAY_READ_BYTES: usize = 16 * 1024;

/// Where a request is served.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    Here,
    /// At the node with this advertised URL.
    There(String),
}

/// Why a request could be neither served here nor forwarded.
#[derive(Debug)]
pub enum ForwardError {
    /// A node-to-node call without the cluster's secret.
    Forbidden,
    /// The holder could not be reached, or the lease moved while the call was on its way:
    /// worth trying again in a moment (503 with `Retry-After`).
    Unavailable(String),
    /// The request's own body could not be read.
    Body(BodyError),
}

impl From<StoreError> for ForwardError {
    fn from(error: StoreError) -> ForwardError {
        ForwardError::Unavailable(error.to_string())
    }
}

impl std::fmt::Display for ForwardError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ForwardError::Forbidden => write!(f, "a call between nodes without the cluster's secret"),
            ForwardError::Unavailable(why) => write!(f, "the session's node is unavailable for now: {why}"),
            ForwardError::Body(error) => write!(f, "the request body was not read: {error:?}"),
        }
    }
}

/// The session a request path names, on either door.
pub fn session_of(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/api/v1/sessions/").or_else(|| path.strip_prefix("/api/sessions/"))?;
    rest.split('/').next().filter(|id| !id.is_empty())
}

/// Whether the request may make its session live, so it is served by the lease's holder.
fn claims(method: &str, path: &str) -> bool {
    !matches!(method, "GET" | "HEAD") || path.trim_end_matches('/').ends_with("/events")
}

impl Node {
    /// Where `request` is served.
    pub fn route(&self, request: &Request) -> Result<Route, ForwardError> {
        let session = session_of(request.path());
        if let Some(presented) = request.header(SECRET_HEADER) {
            if !self.admits(Some(presented)) {
                return Err(ForwardError::Forbidden);
            }
            return match session.map(|session| self.lease_holder(session, true)).transpose()? {
                Some(Route::There(_)) => Err(ForwardError::Unavailable("the session's lease moved; retry".into())),
                _ => Ok(Route::Here),
            };
        }
        match session {
            Some(session) => Ok(self.lease_holder(session, claims(request.method(), request.path()))?),
            None => Ok(Route::Here),
        }
    }

    /// Who serves the session: this node when it holds the lease (or, with `claim`, takes it),
    /// the holder when another node does, this node when none does and `claim` is false.
    fn lease_holder(&self, session: &str, claim: bool) -> Result<Route, StoreError> {
        if self.book.epoch(session).is_some() {
            return Ok(Route::Here);
        }
        let owner = if claim {
            match self.claim_retrying(session) {
                Ok(Claim::Held { .. }) | Err(StoreError::MissingSession) => return Ok(Route::Here),
                Ok(Claim::Owned(owner)) => owner,
                Err(error) => return Err(error),
            }
        } else {
            match self.membership.owner(session)? {
                Some(owner) if !owner.expired && owner.node_id != self.id => owner,
                _ => return Ok(Route::Here),
            }
        };
        match owner.advertise_url {
            Some(url) => Ok(Route::There(url)),
            None => {
                Err(StoreError::Unavailable(format!("node {} holds the session and has no address", owner.node_id)))
            }
        }
    }

    /// A claim, tried once more when the lease was given up between its two statements.
    fn claim_retrying(&self, session: &str) -> Result<Claim, StoreError> {
        match self.claim(session) {
            Err(StoreError::Busy) => self.claim(session),
            other => other,
        }
    }

    /// Sends `request` to the node at `url` and relays its answer.
    pub fn forward(&self, request: &mut Request, url: &str) -> Result<Reply, ForwardError> {
        let body = match request.method() {
            "GET" | "HEAD" => Vec::new(),
            _ => request.read_body().map_err(ForwardError::Body)?,
        };
        let mut call = self.agent.request(request.method(), &format!("{url}{}", request.url()));
        for (name, value) in request.headers() {
            if !NOT_SENT_ON.iter().any(|skipped| name.eq_ignore_ascii_case(skipped)) {
                call = call.set(name, value);
            }
        }
        call = call.set(SECRET_HEADER, &self.secret).set(FORWARDED_BY, &self.id);
        let answer = match call.send_bytes(&body) {
            Ok(answer) | Err(ureq::Error::Status(_, answer)) => answer,
            Err(ureq::Error::Transport(error)) => {
                return Err(ForwardError::Unavailable(format!("the node at {url} did not answer: {error}")))
            }
        };
        relay(answer).map_err(|error| ForwardError::Unavailable(format!("the answer of {url} was cut: {error}")))
    }
}

/// The holder's answer as this node's: a stream stays a stream.
fn relay(answer: ureq::Response) -> std::io::Result<Reply> {
    let status = answer.status();
    let content_type = answer.header("content-type").unwrap_or("application/json").to_string();
    let headers: Vec<(&'static str, String)> =
        RELAYED_HEADERS.iter().filter_map(|name| answer.header(name).map(|value| (*name, value.to_string()))).collect();
    let media = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    let framing = match media.as_str() {
        "text/event-stream" => Some(Framing::EventStream),
        // A whole NDJSON answer has a length; a stream of lines has none.
        "application/x-ndjson" if answer.header("content-length").is_none() => Some(Framing::Ndjson),
        _ => None,
    };
    if let Some(framing) = framing {
        return Ok(Reply::Stream(Stream::new(framing, RelayedStream::start(answer.into_reader())?)));
    }
    let mut body = Vec::new();
    answer.into_reader().take(MAX_RELAYED_BODY).read_to_end(&mut body)?;
    Ok(Reply::Relayed { status, content_type, body, headers })
}

/// The holder's stream, read on a `kestrel-relay` thread and handed over in bursts. When
/// the client leaves, the thread ends at the holder's next bytes (its frames, or its ping
/// within `ping_interval`).
struct RelayedStream {
    chunks: Receiver<Vec<u8>>,
    /// Bytes of a character cut between two reads, kept for the next burst.
    pending: Vec<u8>,
}

impl RelayedStream {
    fn start(mut reader: impl Read + Send + 'static) -> std::io::Result<RelayedStream> {
        let (sender, chunks) = bounded(16);
        std::thread::Builder::new().name("kestrel-relay".into()).stack_size(64 * 1024).spawn(move || {
            let mut buffer = vec![0u8; RELAY_READ_BYTES];
            while let Ok(read @ 1..) = reader.read(&mut buffer) {
                if sender.send(buffer[..read].to_vec()).is_err() {
                    break;
                }
            }
        })?;
        Ok(RelayedStream { chunks, pending: Vec::new() })
    }

    /// The whole characters received, as text; a cut one waits for its other bytes.
    fn take_text(&mut self) -> String {
        let whole = match std::str::from_utf8(&self.pending) {
            Ok(text) => text.len(),
            Err(error) => error.valid_up_to(),
        };
        let rest = self.pending.split_off(whole);
        let text = std::mem::replace(&mut self.pending, rest);
        String::from_utf8(text).unwrap_or_default()
    }
}

impl StreamBody for RelayedStream {
    fn next(&mut self, idle: Duration, stop: &Receiver<()>) -> Frames {
        loop {
            select! {
                recv(self.chunks) -> chunk => match chunk {
                    Ok(bytes) => {
                        self.pending.extend_from_slice(&bytes);
                        while self.pending.len() < crate::http::BURST_BYTES {
                            match self.chunks.try_recv() {
                                Ok(more) => self.pending.extend_from_slice(&more),
                                Err(_) => break,
                            }
                        }
                        let text = self.take_text();
                        if !text.is_empty() {
                            return Frames::Ready(text);
                        }
                    }
                    Err(_) => return Frames::End,
                },
                recv(stop) -> _ => return Frames::Stopped,
                default(idle) => return Frames::Idle,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_found_in_either_doors_paths() {
        assert_eq!(session_of("/api/sessions/ses_1"), Some("ses_1"));
        assert_eq!(session_of("/api/sessions/ses_1/events"), Some("ses_1"));
        assert_eq!(session_of("/api/v1/sessions/ses_2/rpc"), Some("ses_2"));
        assert_eq!(session_of("/api/sessions"), None);
        assert_eq!(session_of("/api/sessions/"), None);
        assert_eq!(session_of("/api/v1/sessions"), None);
        assert_eq!(session_of("/api/cluster"), None);
    }

    #[test]
    fn writes_and_streams_claim_reads_do_not() {
        assert!(claims("POST", "/api/sessions/s/messages"));
        assert!(claims("DELETE", "/api/v1/sessions/s"));
        assert!(claims("GET", "/api/sessions/s/events"));
        assert!(claims("GET", "/api/v1/sessions/s/events/"));
        assert!(!claims("GET", "/api/sessions/s"));
        assert!(!claims("HEAD", "/api/v1/sessions/s/participants"));
    }

    #[test]
    fn a_character_cut_between_reads_waits_for_its_other_bytes() {
        let (sender, chunks) = bounded(4);
        let mut stream = RelayedStream { chunks, pending: Vec::new() };
        let (_stop_sender, stop) = bounded::<()>(1);
        let text = "data: é\n\n".as_bytes();
        let cut = text.iter().position(|b| *b == 0xc3).unwrap() + 1;
        sender.send(text[..cut].to_vec()).unwrap();
        let first = match stream.next(Duration::from_millis(10), &stop) {
            Frames::Ready(text) => text,
            _ => panic!("the whole characters first"),
        };
        assert_eq!(first, "data: ");
        sender.send(text[cut..].to_vec()).unwrap();
        match stream.next(Duration::from_secs(5), &stop) {
            Frames::Ready(rest) => assert_eq!(format!("{first}{rest}"), "data: é\n\n"),
            _ => panic!("the rest of the frame"),
        }
        drop(sender);
        assert!(matches!(stream.next(Duration::from_secs(5), &stop), Frames::End));
    }
}
