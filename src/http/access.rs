//! The request log: one line per request when it completes, at info, on target
//! `kestrel::request`: its method, its route template (never the raw path, which holds ids,
//! nor its query, which may hold a token), status, duration, the bytes of the body sent and
//! the request id (the client's own when it sent a sane one). A stream's line is written when
//! the stream ends.

use std::time::{Duration, Instant};

/// The route of a connection refused before a request was read.
pub const REFUSED: &str = "(refused)";

/// A request whose line is written once it completes (a stream's, at its end).
#[derive(Debug, Clone)]
pub struct Pending {
    pub method: String,
    pub route: &'static str,
    pub started: Instant,
    pub request_id: String,
}

impl Pending {
    /// Writes the line: `status`, and the body's size where it is known.
    pub fn done(&self, status: u16, bytes: Option<u64>) {
        line(&self.method, self.route, status, bytes, self.started.elapsed(), &self.request_id);
    }
}

/// Writes one request's line (at info; a connection the edge refused before reading a request,
/// at debug: a flood of them must not become a flood of log lines).
pub fn line(method: &str, route: &str, status: u16, bytes: Option<u64>, took: Duration, request_id: &str) {
    let level = if route == REFUSED { log::Level::Debug } else { log::Level::Info };
    let duration_ms = took.as_secs_f64() * 1000.0;
    let duration_ms = format!("{duration_ms:.1}");
    let bytes = bytes.map_or_else(|| "-".to_string(), |bytes| bytes.to_string());
    log::log!(
        target: "kestrel::request",
        level,
        method = method, route = route, status = status, duration_ms = duration_ms.as_str(), bytes = bytes.as_str(),
        request_id = request_id;
        "{method} {route} {status}"
    );
}
