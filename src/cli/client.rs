//! The client side of the protocol for the terminal commands: JSON requests with the bearer
//! token, the protocol's error body turned into a one-line message and an exit code, and
//! event streams read frame by frame.

use std::io::{BufRead, BufReader, Read};
use std::time::Duration;

use serde_json::Value;

use super::args::Remote;

/// Why a command failed; its exit code says which kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CliError {
    /// The command line or its input was wrong (2).
    Usage(String),
    /// Unauthorized, forbidden or not found (3).
    Denied(String),
    /// Anything else: the server refused or failed, or could not be reached (1).
    Failed(String),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Failed(_) => 1,
            CliError::Usage(_) => 2,
            CliError::Denied(_) => 3,
        }
    }
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CliError::Usage(text) | CliError::Denied(text) | CliError::Failed(text) => f.write_str(text),
        }
    }
}

/// A server to talk to.
pub struct Client {
    base: String,
    token: Option<String>,
    agent: ureq::Agent,
}

impl Client {
    /// A client of the server `remote` names, with its token (`cli/token.rs`).
    pub fn new(remote: &Remote) -> Result<Client, CliError> {
        Ok(Client::with_token(&remote.url, remote.token()?))
    }

    /// A client of the server at `base`, with `token` when it asks for one.
    pub fn with_token(base: &str, token: Option<String>) -> Client {
        let agent = ureq::AgentBuilder::new().timeout_connect(Duration::from_secs(10)).build();
        let token = token.filter(|token| !token.is_empty());
        Client { base: base.trim_end_matches('/').to_string(), token, agent }
    }

    fn request(&self, method: &str, path: &str) -> ureq::Request {
        let request = self.agent.request(method, &format!("{}{path}", self.base));
        match &self.token {
            Some(token) => request.set("Authorization", &format!("Bearer {token}")),
            None => request,
        }
    }

    /// A JSON request; the answer's body (`Value::Null` for an empty one).
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, CliError> {
        let request = self.request(method, path).timeout(Duration::from_secs(60));
        let answer = match body {
            Some(body) => request.send_json(body),
            None => request.call(),
        };
        let response = answer.map_err(|error| self.failure(error))?;
        let text = response.into_string().map_err(|e| CliError::Failed(format!("reading the answer: {e}")))?;
        match text.trim() {
            "" => Ok(Value::Null),
            text => serde_json::from_str(text)
                .map_err(|e| CliError::Failed(format!("the server's answer is not JSON: {e}"))),
        }
    }

    /// Opens an event stream (`path`), replaying after `since`; returns once the server has
    /// subscribed (its headers have arrived), so nothing published afterwards is missed.
    pub fn stream(&self, path: &str, since: Option<u64>) -> Result<Frames, CliError> {
        let mut request = self.request("GET", path).set("Accept", "text/event-stream");
        if let Some(seq) = since {
            request = request.set("Last-Event-ID", &seq.to_string());
        }
        let response = request.call().map_err(|error| self.failure(error))?;
        Ok(Frames { reader: BufReader::new(response.into_reader()) })
    }

    /// A failed request as a one-line error: the protocol's `error.message` when there is one.
    fn failure(&self, error: ureq::Error) -> CliError {
        match error {
            ureq::Error::Status(status, response) => {
                let body: Value = response.into_json().unwrap_or(Value::Null);
                let code = body["error"]["code"].as_str().unwrap_or("error").to_string();
                let message = body["error"]["message"].as_str().unwrap_or("no message").to_string();
                let text = format!("{status} {code}: {message}");
                match status {
                    401 | 403 | 404 => CliError::Denied(text),
                    _ => CliError::Failed(text),
                }
            }
            ureq::Error::Transport(transport) => CliError::Failed(format!("cannot reach {}: {transport}", self.base)),
        }
    }
}

/// A server-sent event: its `id` and its `data` (an envelope's JSON).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub id: Option<String>,
    pub data: String,
}

/// An event stream read a frame at a time; comments and `retry:` lines are skipped.
pub struct Frames {
    reader: BufReader<Box<dyn Read + Send + Sync + 'static>>,
}

impl Frames {
    /// The next frame, or `None` once the stream has ended.
    pub fn next_frame(&mut self) -> Option<Frame> {
        read_frame(&mut self.reader)
    }
}

fn read_frame(reader: &mut impl BufRead) -> Option<Frame> {
    let (mut id, mut data) = (None, Vec::new());
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end_matches(['\r', '\n']);
        if line.is_empty() {
            if !data.is_empty() {
                return Some(Frame { id, data: data.join("\n") });
            }
            continue;
        }
        if let Some(value) = line.strip_prefix("data:") {
            data.push(value.strip_prefix(' ').unwrap_or(value).to_string());
        } else if let Some(value) = line.strip_prefix("id:") {
            id = Some(value.trim().to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_read_across_comments_retry_lines_and_multi_line_data() {
        let text = "retry: 3000\n\n: ping\n\nid: 4\ndata: {\"a\":1}\n\ndata: one\ndata:two\n\n";
        let mut reader = std::io::Cursor::new(text.as_bytes());
        assert_eq!(read_frame(&mut reader), Some(Frame { id: Some("4".into()), data: "{\"a\":1}".into() }));
        assert_eq!(read_frame(&mut reader), Some(Frame { id: None, data: "one\ntwo".into() }));
        assert_eq!(read_frame(&mut reader), None);
    }

    #[test]
    fn statuses_map_to_exit_codes() {
        assert_eq!(CliError::Denied("x".into()).exit_code(), 3);
        assert_eq!(CliError::Usage("x".into()).exit_code(), 2);
        assert_eq!(CliError::Failed("x".into()).exit_code(), 1);
    }
}
