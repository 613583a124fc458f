//! MCP over Streamable HTTP: each message is a POST to the server's URL with the configured
//! headers and, once the server gave one, its `mcp-session-id`. The answer is JSON, or an
//! event stream whose `data:` lines carry JSON-RPC messages (the one with the request's id is
//! the answer; the others are dropped as they are read). A status other than 2xx is a
//! transport error. An answer is read up to `MESSAGE_LIMIT` bytes.
//!
//! Each request runs on a `kestrel-mcp-http` thread of its own while the caller waits for its
//! answer, its timeout, its cancel or the connection's close, whichever comes first: a closed
//! connection or a cancel ends the calls in flight at once (their threads finish on their
//! own, bounded by the request timeout). A cancelled call's `notifications/cancelled` is
//! posted without waiting for it.

use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crossbeam_channel::{bounded, never, select, Receiver, Sender};
use serde_json::{json, Value};

use super::{outcome, McpError, Transport, MESSAGE_LIMIT};

pub struct Http {
    shared: Arc<Shared>,
    next_id: AtomicU64,
    /// Dropped at close: every waiting caller wakes.
    open: Mutex<Option<Sender<()>>>,
    closed: Receiver<()>,
}

struct Shared {
    url: String,
    headers: Vec<(String, String)>,
    session: Mutex<Option<String>>,
}

impl Http {
    pub fn new(url: &str, headers: Vec<(String, String)>) -> Http {
        let (open, closed) = bounded(0);
        let shared = Shared { url: url.to_string(), headers, session: Mutex::new(None) };
        Http { shared: Arc::new(shared), next_id: AtomicU64::new(1), open: Mutex::new(Some(open)), closed }
    }

    /// Runs `exchange` on its own thread; its answer, unless the timeout, the close or the
    /// caller's cancel comes first.
    fn exchange(
        &self,
        timeout: Duration,
        cancel: &Receiver<()>,
        exchange: impl FnOnce(&Shared) -> Result<Value, McpError> + Send + 'static,
    ) -> Result<Value, McpError> {
        if self.open.lock().unwrap_or_else(PoisonError::into_inner).is_none() {
            return Err(McpError::Closed);
        }
        if crate::cancel::fired(cancel) {
            return Err(McpError::Cancelled);
        }
        let (answer_tx, answer) = bounded(1);
        let shared = Arc::clone(&self.shared);
        let spawned = std::thread::Builder::new().name("kestrel-mcp-http".into()).spawn(move || {
            let _ = answer_tx.send(exchange(&shared));
        });
        if let Err(error) = spawned {
            return Err(McpError::Transport(format!("no thread for the MCP request: {error}")));
        }
        select! {
            recv(answer) -> outcome => outcome.unwrap_or(Err(McpError::Transport("the MCP request failed".into()))),
            recv(self.closed) -> _ => Err(McpError::Closed),
            recv(cancel) -> _ => Err(McpError::Cancelled),
            default(timeout + Duration::from_secs(1)) => Err(McpError::Timeout(timeout)),
        }
    }

    /// Posts a notification on a thread of its own and does not wait for it: a caller that
    /// cancelled must not wait on a server that may hang on this too (the post ends at its
    /// timeout).
    fn notify_detached(&self, message: Value) {
        let shared = Arc::clone(&self.shared);
        let spawned = std::thread::Builder::new().name("kestrel-mcp-http".into()).spawn(move || {
            let _ = shared.post(&message, NOTIFY_TIMEOUT);
        });
        if let Err(error) = spawned {
            log::warn!("no thread to tell an MCP server of a cancel: {error}");
        }
    }
}

/// How long a notification's post may take.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(30);

impl Shared {
    fn post(&self, message: &Value, timeout: Duration) -> Result<Option<ureq::Response>, McpError> {
        let mut request = ureq::post(&self.url)
            .timeout(timeout)
            .set("content-type", "application/json")
            .set("accept", "application/json, text/event-stream");
        for (name, value) in &self.headers {
            request = request.set(name, value);
        }
        if let Some(session) = self.session.lock().unwrap_or_else(PoisonError::into_inner).as_deref() {
            request = request.set("mcp-session-id", session);
        }
        let response = match request.send_string(&message.to_string()) {
            Ok(response) => response,
            Err(ureq::Error::Status(status, _)) => {
                return Err(McpError::Transport(format!("MCP server returned HTTP {status}")))
            }
            Err(ureq::Error::Transport(error)) => {
                if error.kind() == ureq::ErrorKind::Io && error.to_string().contains("timed out") {
                    return Err(McpError::Timeout(timeout));
                }
                // The URL is the configured one; the headers (secrets) are never in the text.
                return Err(McpError::Transport(format!("cannot reach the MCP server: {}", error.kind())));
            }
        };
        if let Some(session) = response.header("mcp-session-id") {
            *self.session.lock().unwrap_or_else(PoisonError::into_inner) = Some(session.to_string());
        }
        Ok((response.status() != 202).then_some(response))
    }

    fn request(&self, id: u64, message: &Value, timeout: Duration) -> Result<Value, McpError> {
        let response =
            self.post(message, timeout)?.ok_or(McpError::Transport("the MCP server sent no answer".into()))?;
        let streamed = response.content_type().starts_with("text/event-stream");
        let reader = BufReader::new(std::io::Read::take(response.into_reader(), MESSAGE_LIMIT as u64));
        if !streamed {
            let answer: Value = serde_json::from_reader(reader)
                .map_err(|e| McpError::Transport(format!("the MCP server's answer is not JSON: {e}")))?;
            return outcome(answer);
        }
        for line in reader.lines() {
            let line = line.map_err(|e| McpError::Transport(format!("the MCP stream broke: {e}")))?;
            let Some(data) = line.strip_prefix("data:") else { continue };
            let Ok(answer) = serde_json::from_str::<Value>(data.trim()) else { continue };
            if answer["id"].as_u64() == Some(id) && answer.get("method").is_none() {
                return outcome(answer);
            }
        }
        Err(McpError::Transport("the MCP stream ended without an answer".into()))
    }
}

impl Transport for Http {
    fn request(
        &self,
        method: &str,
        params: Value,
        timeout: Duration,
        cancel: &Receiver<()>,
    ) -> Result<Value, McpError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let message = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        let outcome = self.exchange(timeout, cancel, move |shared| shared.request(id, &message, timeout));
        match &outcome {
            Err(McpError::Timeout(_)) if method != "ping" => {
                let _ = self.notify("notifications/cancelled", json!({ "requestId": id, "reason": "timed out" }));
            }
            Err(McpError::Cancelled) => self.notify_detached(json!({ "jsonrpc": "2.0",
                "method": "notifications/cancelled", "params": { "requestId": id, "reason": "cancelled" } })),
            _ => {}
        }
        outcome
    }

    fn notify(&self, method: &str, params: Value) -> Result<(), McpError> {
        let message = json!({ "jsonrpc": "2.0", "method": method, "params": params });
        self.exchange(NOTIFY_TIMEOUT, &never(), move |shared| {
            shared.post(&message, NOTIFY_TIMEOUT).map(|_| Value::Null)
        })
        .map(|_| ())
    }

    fn close(&self) {
        self.open.lock().unwrap_or_else(PoisonError::into_inner).take();
    }
}
