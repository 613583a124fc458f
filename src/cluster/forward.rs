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
//! Nothing of this is done for a request its door has not admitted (authenticated, taken
//! from its caller's rate limit, and, for a route that names a session, the session found
//! the caller's: `api::Door`), so a caller the door does not know, or a session that is not
//! the caller's, claims no lease and is sent nowhere. The session a request names is the
//! one its door admitted, never read again from the path here.
//!
//! A call that carries the secret came from a node that found this one the holder: it is
//! served here, never sent on again. If the lease moved meanwhile, the answer is a retryable
//! 503, so a request is forwarded at most once. A call with a wrong secret is refused (403);
//! the secret itself is never logged. Such a call still carries its client's credentials,
//! and its door admits it by them as it would the client's own.

use std::io::Read;
use std::time::Duration;

use std::sync::Arc;

use crossbeam_channel::{bounded, select, Receiver, Sender};

use super::{Node, SECRET_HEADER};
use crate::http::{BodyError, Frames, Framing, Reply, Request, Stream, StreamBody};
use crate::store::cluster::Claim;
use crate::store::StoreError;

/// The header naming the node that forwarded a call (in the owner's access log).
pub const FORWARDED_BY: &str = "Kestrel-Forwarded-By";

/// The headers of an answer a client reads, relayed from the owner.
const RELAYED_HEADERS: [&str; 7] =
    ["Retry-After", "Allow", "Idempotency-Replayed", "Cache-Control", "Location", "ETag", "Content-Disposition"];

/// Request headers not sent on: hop-by-hop ones, ones the call sets again, the cluster's, and
/// where a browser's request came from, which this node screened (`http/origin.rs`) against
/// its own address and which would never match the holder's.
const NOT_SENT_ON: [&str; 14] = [
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
    "origin",
    "sec-fetch-site",
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

/// Whether the request may make its session live, so it is served by the lease's holder.
fn claims(method: &str, path: &str) -> bool {
    !matches!(method, "GET" | "HEAD") || path.trim_end_matches('/').ends_with("/events")
}

impl Node {
    /// Whether `request` comes from another node of the cluster: it carries the cluster's
    /// secret. `Forbidden` when it carries another value (the secret itself is never logged).
    pub fn from_a_node(&self, request: &Request) -> Result<bool, ForwardError> {
        match request.header(SECRET_HEADER) {
            None => Ok(false),
            Some(presented) if self.admits(presented) => Ok(true),
            Some(_) => Err(ForwardError::Forbidden),
        }
    }

    /// Where `request`, which its door has admitted, is served; `session` is the session
    /// the door admitted it for (the caller's), if its route names one. A call from another
    /// node (`from_a_node`) found this node the holder: it is served here, or answered a
    /// retryable 503 if the lease moved meanwhile, never sent on.
    pub fn route(&self, request: &Request, session: Option<&str>, from_a_node: bool) -> Result<Route, ForwardError> {
        if from_a_node {
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

    /// Sends `request`, which names `session` (as its door admitted it), to the node at `url`
    /// and relays its answer. A session's event stream outlives its holder: when the holder's
    /// stream ends, the relay opens it again at the session's holder then (`Resume`).
    pub fn forward(
        self: &Arc<Self>,
        request: &mut Request,
        session: Option<&str>,
        url: &str,
    ) -> Result<Reply, ForwardError> {
        let body = match request.method() {
            "GET" | "HEAD" => Vec::new(),
            _ => request.read_body().map_err(ForwardError::Body)?,
        };
        let headers: Vec<(String, String)> = request
            .headers()
            .filter(|(name, _)| !NOT_SENT_ON.iter().any(|skipped| name.eq_ignore_ascii_case(skipped)))
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
        let resumable = match (request.method(), session) {
            ("GET", Some(session)) if request.path().trim_end_matches('/').ends_with("/events") => Some(session),
            _ => None,
        };
        let call = Call {
            method: request.method().to_string(),
            target: request.url().to_string(),
            headers,
            stream: resumable.is_some(),
        };
        // Where the log is before the stream opens: a stream that ends before it passed on
        // any event is opened again after it.
        let position = match resumable {
            Some(_) if request.header("Last-Event-ID").or_else(|| request.query("lastEventId")).is_none() => {
                self.membership.log_position().ok()
            }
            _ => None,
        };
        let (answer, resume) = match (resumable, session) {
            (Some(session), _) => {
                let answer = self.send(&call, url, &body)?;
                (answer, Some(Resume { node: Arc::clone(self), session: session.to_string(), call, position }))
            }
            (None, Some(session)) if matches!(call.method.as_str(), "GET" | "HEAD") => {
                (self.read_watching(&call, url, session)?, None)
            }
            (None, Some(session)) => (self.send_watching(call, url, body, session)?, None),
            (None, None) => (self.send(&call, url, &body)?, None),
        };
        relay(answer, resume)
            .map_err(|error| ForwardError::Unavailable(format!("the answer of {url} was cut: {error}")))
    }

    /// One call to the node at `url`, with the cluster's secret.
    pub(super) fn send(&self, call: &Call, url: &str, body: &[u8]) -> Result<ureq::Response, ForwardError> {
        let agent = if call.stream { &self.watch_agent } else { &self.agent };
        self.call_with(agent, call, url, body).map_err(|error| unanswered(url, &error))
    }

    pub(super) fn call_with(
        &self,
        agent: &ureq::Agent,
        call: &Call,
        url: &str,
        body: &[u8],
    ) -> Result<ureq::Response, Box<ureq::Transport>> {
        let mut request = agent.request(&call.method, &format!("{url}{}", call.target));
        for (name, value) in &call.headers {
            request = request.set(name, value);
        }
        request = request.set(SECRET_HEADER, self.secret.value()).set(FORWARDED_BY, &self.id);
        match request.send_bytes(body) {
            Ok(answer) | Err(ureq::Error::Status(_, answer)) => Ok(answer),
            Err(ureq::Error::Transport(error)) => Err(Box::new(error)),
        }
    }
}

impl Node {
    /// This node's answer to a call from another node, as that node's relay needs it: an
    /// event stream pings at least each third of a lease, so a relay, which gives a holder
    /// up after a lease of silence, hears from a holder that still speaks for the session.
    pub fn to_relay(&self, reply: Reply) -> Reply {
        match reply {
            Reply::Stream(Stream { framing: Framing::EventStream, body, request_id, access }) => {
                let every = Duration::from_millis((self.lease_ms / 3).max(1));
                let body = Box::new(Paced { body, every });
                Reply::Stream(Stream { framing: Framing::EventStream, body, request_id, access })
            }
            other => other,
        }
    }
}

/// A stream that is idle (and so pings) at least every `every`.
struct Paced {
    body: Box<dyn StreamBody>,
    every: Duration,
}

impl StreamBody for Paced {
    fn next(&mut self, idle: Duration, stop: &Receiver<()>) -> Frames {
        self.body.next(idle.min(self.every), stop)
    }
}

pub(super) fn unanswered(url: &str, error: &ureq::Transport) -> ForwardError {
    ForwardError::Unavailable(format!("the node at {url} did not answer: {error}"))
}

/// A request as it is sent on: its method, path and query, and the client's headers.
pub(super) struct Call {
    pub(super) method: String,
    pub(super) target: String,
    pub(super) headers: Vec<(String, String)>,
    /// A session's event stream, read with a wait of a lease for each of the holder's bytes.
    pub(super) stream: bool,
}

/// What opens a relayed session stream again after its holder's stream ended: the session's
/// holder is found (or the lease claimed) as for any stream, and the stream asked for again
/// with `Last-Event-ID` set to the last id relayed, so the client misses no logged event.
struct Resume {
    node: Arc<Node>,
    session: String,
    call: Call,
    /// The log's last seq before the stream first opened, when the client named none.
    position: Option<u64>,
}

/// How long a relay tries to open a stream again: past a dead holder's lease, with room.
const RESUME_FOR: Duration = Duration::from_secs(60);

impl Resume {
    /// The stream again, after `last_id`; `None` when it cannot be had (the session is gone,
    /// the client's token no longer admitted, the client left, or `RESUME_FOR` passed).
    fn reopen(&mut self, last_id: Option<u64>, still_wanted: &dyn Fn() -> bool) -> Option<ureq::Response> {
        if let Some(id) = last_id.or(self.position) {
            self.call.headers.retain(|(name, _)| !name.eq_ignore_ascii_case("last-event-id"));
            self.call.headers.push(("Last-Event-ID".into(), id.to_string()));
        }
        let deadline = std::time::Instant::now() + RESUME_FOR;
        let mut pause = Duration::from_millis(50);
        while std::time::Instant::now() < deadline && still_wanted() {
            let url = match self.node.lease_holder(&self.session, true) {
                Ok(Route::Here) => Some(self.node.advertise_url().to_string()),
                Ok(Route::There(url)) => Some(url),
                Err(_) => None,
            };
            match url.map(|url| self.node.send(&self.call, &url, &[])) {
                Some(Ok(answer)) if answer.status() == 200 => return Some(answer),
                // Refused for good (404, 401, 403): the client hears the stream end.
                Some(Ok(answer)) if answer.status() != 503 => return None,
                _ => {}
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_secs(1));
        }
        None
    }
}

/// The holder's answer as this node's: a stream stays a stream.
fn relay(answer: ureq::Response, resume: Option<Resume>) -> std::io::Result<Reply> {
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
        let resume = resume.filter(|_| framing == Framing::EventStream);
        return Ok(Reply::Stream(Stream::new(framing, RelayedStream::start(answer.into_reader(), resume)?)));
    }
    let mut body = Vec::new();
    answer.into_reader().take(MAX_RELAYED_BODY).read_to_end(&mut body)?;
    Ok(Reply::Relayed { status, content_type, body, headers })
}

/// Hands the holder's stream on until it ends or the client leaves; a session's stream is
/// opened again where the session is held then, after the last id passed on.
fn pass_on(mut reader: Box<dyn Read + Send>, mut resume: Option<Resume>, sender: &Sender<Vec<u8>>) {
    let mut buffer = vec![0u8; RELAY_READ_BYTES];
    let mut ids = LastId::default();
    loop {
        while let Ok(read @ 1..) = reader.read(&mut buffer) {
            ids.feed(&buffer[..read]);
            if sender.send(buffer[..read].to_vec()).is_err() {
                return;
            }
        }
        // An empty burst asks nothing of the client's stream; it fails once the client left.
        let still_wanted = || sender.send(Vec::new()).is_ok();
        match resume.as_mut().and_then(|resume| resume.reopen(ids.last, &still_wanted)) {
            Some(answer) => {
                ids.partial.clear();
                reader = Box::new(answer.into_reader());
            }
            None => return,
        }
    }
}

/// The last `id:` of the SSE frames seen, read line by line across reads.
#[derive(Default)]
struct LastId {
    last: Option<u64>,
    /// The start of a line not ended yet.
    partial: Vec<u8>,
}

impl LastId {
    fn feed(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            if byte != b'\n' {
                if self.partial.len() < 64 {
                    self.partial.push(byte);
                }
                continue;
            }
            if let Some(id) = self.partial.strip_prefix(b"id:") {
                if let Some(id) = std::str::from_utf8(id).ok().and_then(|id| id.trim().parse().ok()) {
                    self.last = Some(id);
                }
            }
            self.partial.clear();
        }
    }
}

/// The holder's stream, read on a `kestrel-relay` thread and handed over in bursts. When
/// the client leaves, the thread ends at the holder's next bytes (its frames, or its ping
/// within a third of a lease).
struct RelayedStream {
    chunks: Receiver<Vec<u8>>,
    /// Bytes of a character cut between two reads, kept for the next burst.
    pending: Vec<u8>,
}

impl RelayedStream {
    fn start(reader: impl Read + Send + 'static, resume: Option<Resume>) -> std::io::Result<RelayedStream> {
        let (sender, chunks) = bounded(16);
        std::thread::Builder::new()
            .name("kestrel-relay".into())
            .stack_size(128 * 1024)
            .spawn(move || pass_on(Box::new(reader), resume, &sender))?;
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
    use super::super::testing::{call, holder, node};
    use super::*;

    #[test]
    fn a_relayed_stream_is_opened_again_after_the_last_id_through_a_503_but_not_after_a_refusal() {
        let (answer, answers) = crossbeam_channel::unbounded();
        let (url, heard) = holder(answers);
        let (node, _) = node(&url, false);
        let call = Call { stream: true, ..call("GET", "/api/sessions/s/events") };
        let mut resume = Resume { node, session: "s".into(), call, position: Some(7) };
        // The holder is not ready (503), then serves the stream, from after the last id passed on.
        answer.send(Some("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")).unwrap();
        answer.send(Some("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 0\r\n\r\n")).unwrap();
        let reopened = resume.reopen(Some(41), &|| true).expect("opened again after the 503");
        assert_eq!(reopened.status(), 200);
        let calls: Vec<String> = heard.try_iter().collect();
        assert_eq!(calls.len(), 2);
        assert!(calls.iter().all(|head| head.to_ascii_lowercase().contains("last-event-id: 41\r\n")), "{calls:?}");
        // With no id passed on yet, the log's position when the stream first opened.
        answer.send(Some("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")).unwrap();
        resume.reopen(None, &|| true).expect("opened again");
        assert!(heard.recv().unwrap().to_ascii_lowercase().contains("last-event-id: 7\r\n"));
        // Refused for good (the client's token no longer admitted there): the stream ends.
        answer.send(Some("HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")).unwrap();
        assert!(resume.reopen(Some(41), &|| true).is_none());
        // The client left: not tried at all.
        assert!(resume.reopen(Some(41), &|| false).is_none());
        assert_eq!(heard.try_iter().count(), 1, "the refused call only");
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
    fn the_last_sse_id_is_read_across_reads() {
        let mut ids = LastId::default();
        ids.feed(b"retry: 3000\n\n: ping\n\nid: 4");
        assert_eq!(ids.last, None, "an id line not ended yet");
        ids.feed(b"2\ndata: {\"seq\":42}\n\nid:43\ndata: {}\n\n");
        assert_eq!(ids.last, Some(43));
        ids.feed(b"id: not-a-seq\ndata: x\n\n");
        assert_eq!(ids.last, Some(43), "an id that is no seq changes nothing");
        // A holder's endless line costs the relay 64 bytes, not the line.
        ids.feed(&vec![b'x'; 1 << 20]);
        assert!(ids.partial.len() <= 64);
        ids.feed(b"\nid: 44\n");
        assert_eq!(ids.last, Some(44));
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
