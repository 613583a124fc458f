//! JSON-RPC 2.0 over stdio, one message a line: what `kestrel acp` writes (answers,
//! notifications, its own requests to the editor) through one locked stdout, and the editor's
//! answers to those requests handed to whoever waits for them.

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_channel::{bounded, Receiver, Sender};
use serde_json::{json, Value};

/// JSON-RPC's and ACP's error codes.
pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;
/// ACP: the session (or another resource) is not found.
pub const NOT_FOUND: i64 = -32002;

/// A request's failure, as its error answer says it.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError { code, message: message.into() }
    }

    pub fn invalid_params(message: impl Into<String>) -> RpcError {
        RpcError::new(INVALID_PARAMS, message)
    }
}

/// What an answer from the editor is handed to.
type Waiter = Sender<Result<Value, RpcError>>;

/// The editor's side of the line: writes are whole lines, in order, from any thread.
#[derive(Clone)]
pub struct Peer {
    out: Arc<Mutex<Box<dyn Write + Send>>>,
    next_id: Arc<AtomicU64>,
    /// Requests sent to the editor, by id, waiting for its answer.
    waiting: Arc<Mutex<HashMap<u64, Waiter>>>,
}

impl Peer {
    pub fn new(out: Box<dyn Write + Send>) -> Peer {
        Peer { out: Arc::new(Mutex::new(out)), next_id: Arc::default(), waiting: Arc::default() }
    }

    fn write(&self, message: &Value) {
        let mut line = message.to_string();
        line.push('\n');
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        // The editor went away: there is nobody left to tell.
        let _ = out.write_all(line.as_bytes()).and_then(|()| out.flush());
    }

    pub fn answer(&self, id: &Value, result: Result<Value, RpcError>) {
        match result {
            Ok(result) => self.write(&json!({ "jsonrpc": "2.0", "id": id, "result": result })),
            Err(error) => self.write(&json!({
                "jsonrpc": "2.0", "id": id, "error": { "code": error.code, "message": error.message },
            })),
        }
    }

    pub fn notify(&self, method: &str, params: Value) {
        self.write(&json!({ "jsonrpc": "2.0", "method": method, "params": params }));
    }

    /// Sends a request to the editor; its answer arrives on the receiver (`Err` when the
    /// editor answered with an error, or never will).
    pub fn request(&self, method: &str, params: Value) -> Receiver<Result<Value, RpcError>> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (sender, receiver) = bounded(1);
        self.waiting.lock().unwrap_or_else(|e| e.into_inner()).insert(id, sender);
        self.write(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }));
        receiver
    }

    /// Hands the editor's answer to the request it answers; `false` when none waits for it.
    pub fn answered(&self, message: &Value) -> bool {
        let Some(id) = message.get("id").and_then(Value::as_u64) else { return false };
        let Some(waiter) = self.waiting.lock().unwrap_or_else(|e| e.into_inner()).remove(&id) else { return false };
        let outcome = match (message.get("result"), message.get("error")) {
            (_, Some(error)) => Err(RpcError::new(
                error["code"].as_i64().unwrap_or(INTERNAL_ERROR),
                error["message"].as_str().unwrap_or("the editor answered with an error"),
            )),
            (Some(result), None) => Ok(result.clone()),
            (None, None) => Err(RpcError::new(INVALID_REQUEST, "an answer with neither result nor error")),
        };
        let _ = waiter.send(outcome);
        true
    }

    /// Fails every request still waiting (the editor closed its side).
    pub fn abandon(&self) {
        let waiting = std::mem::take(&mut *self.waiting.lock().unwrap_or_else(|e| e.into_inner()));
        for (_, waiter) in waiting {
            let _ = waiter.send(Err(RpcError::new(INTERNAL_ERROR, "the editor closed the connection")));
        }
    }
}
