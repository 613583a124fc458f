//! MCP over Streamable HTTP: each message is a POST to the server's URL with the configured
//! headers and, once the server gave one, its `mcp-session-id`. The answer is JSON, or an
//! event stream whose `data:` lines carry JSON-RPC messages (the one with the request's id is
//! the answer). A status other than 2xx is a transport error.

use std::io::{BufRead, BufReader};
use std::time::Duration;

use serde_json::{json, Value};

use super::{outcome, McpError, Transport};

/// The largest answer read.
const ANSWER_LIMIT: u64 = 16 * 1024 * 1024;

pub struct Http {
    url: String,
    headers: Vec<(String, String)>,
    session: Option<String>,
    next_id: u64,
}

impl Http {
    pub fn new(url: &str, headers: Vec<(String, String)>) -> Http {
        Http { url: url.to_string(), headers, session: None, next_id: 1 }
    }

    fn post(&mut self, message: &Value, timeout: Duration) -> Result<Option<ureq::Response>, McpError> {
        let mut request = ureq::post(&self.url)
            .timeout(timeout)
            .set("content-type", "application/json")
            .set("accept", "application/json, text/event-stream");
        for (name, value) in &self.headers {
            request = request.set(name, value);
        }
        if let Some(session) = &self.session {
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
            self.session = Some(session.to_string());
        }
        Ok((response.status() != 202).then_some(response))
    }
}

impl Transport for Http {
    fn request(&mut self, method: &str, params: Value, timeout: Duration) -> Result<Value, McpError> {
        let id = self.next_id;
        self.next_id += 1;
        let message = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        let response =
            self.post(&message, timeout)?.ok_or(McpError::Transport("the MCP server sent no answer".into()))?;
        let streamed = response.content_type().starts_with("text/event-stream");
        let reader = BufReader::new(std::io::Read::take(response.into_reader(), ANSWER_LIMIT));
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

    fn notify(&mut self, method: &str, params: Value) -> Result<(), McpError> {
        self.post(&json!({ "jsonrpc": "2.0", "method": method, "params": params }), Duration::from_secs(30))?;
        Ok(())
    }
}
