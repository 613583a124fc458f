//! One `session/prompt`: the session's stream opened first, the message sent, and the run's
//! events relayed as `session/update`s until it ends: text and reasoning deltas as message
//! and thought chunks, calls as tool calls and their updates, approvals asked of the editor
//! with `session/request_permission` and answered on the server.

use serde_json::{json, Map, Value};

use super::map;
use super::rpc::{Peer, RpcError, INTERNAL_ERROR, NOT_FOUND};
use crate::cli::client::{CliError, Client};

/// The options an approval offers the editor, and what each answers the server.
const OPTIONS: &[(&str, &str, &str)] = &[
    ("allow", "Allow", "allow_once"),
    ("allow_session", "Allow for this session", "allow_always"),
    ("reject", "Reject", "reject_once"),
];

/// What a prompt turn needs: the server and the editor.
pub struct Turn<'a> {
    pub client: &'a Client,
    pub peer: &'a Peer,
    pub session_id: &'a str,
}

impl Turn<'_> {
    /// Runs the prompt to its end; its `{stopReason}`.
    pub fn run(&self, prompt: &[Value]) -> Result<Value, RpcError> {
        let message = map::message(prompt)?;
        let base = format!("/api/sessions/{}", self.session_id);
        let session = self.client.call("GET", &base, None).map_err(not_found)?;
        let workspace = session["session"]["workspace"].as_str().unwrap_or("").to_string();
        let mut frames = self.client.stream(&format!("{base}/events"), None).map_err(internal)?;
        let sent = self.client.call("POST", &format!("{base}/messages"), Some(&message)).map_err(internal)?;
        let run_id = sent["runId"].as_str().unwrap_or_default().to_string();
        let mut calls: Map<String, Value> = Map::new();
        while let Some(frame) = frames.next_frame() {
            let Ok(envelope) = serde_json::from_str::<Value>(&frame.data) else { continue };
            let event = &envelope["event"];
            match event["type"].as_str().unwrap_or("") {
                "message.delta" => self.delta(event),
                "approval.requested" => self.ask(&event["approval"], &workspace, &mut calls)?,
                "tool.started" => self.started(&event["call"], &workspace, &mut calls),
                "tool.finished" => {
                    let result = &event["result"];
                    let arguments = result["callId"].as_str().and_then(|id| calls.get(id));
                    self.update(map::finished(result, arguments, &workspace));
                }
                "run.finished" if event["runId"] == run_id.as_str() => {
                    let status = event["status"].as_str().unwrap_or("completed");
                    return Ok(json!({ "stopReason": map::stop_reason(status) }));
                }
                "run.failed" if event["runId"] == run_id.as_str() => {
                    let error = event["error"].as_str().unwrap_or("the run failed");
                    return Err(RpcError::new(INTERNAL_ERROR, error));
                }
                _ => {}
            }
        }
        Err(RpcError::new(INTERNAL_ERROR, "the server's event stream ended before the run did"))
    }

    fn update(&self, update: Value) {
        self.peer.notify("session/update", json!({ "sessionId": self.session_id, "update": update }));
    }

    fn delta(&self, event: &Value) {
        let kind = match event["channel"].as_str() {
            Some("reasoning") => "agent_thought_chunk",
            _ => "agent_message_chunk",
        };
        self.update(json!({ "sessionUpdate": kind, "content": { "type": "text", "text": event["delta"] } }));
    }

    /// A call the model made: pending until it runs (it may wait for an approval first).
    fn started(&self, call: &Value, workspace: &str, calls: &mut Map<String, Value>) {
        let Some(id) = call["id"].as_str() else { return };
        if calls.insert(id.to_string(), call["arguments"].clone()).is_none() {
            self.update(map::tool_call(call, "pending", workspace));
        }
    }

    /// Asks the editor about an approval and answers the server with its choice; a
    /// cancelled or failed question is a denial.
    fn ask(&self, approval: &Value, workspace: &str, calls: &mut Map<String, Value>) -> Result<(), RpcError> {
        let call =
            json!({ "id": approval["callId"], "name": approval["toolName"], "arguments": approval["arguments"] });
        let id = approval["callId"].as_str().unwrap_or_default().to_string();
        let mut tool_call = map::tool_call(&call, "pending", workspace);
        if calls.insert(id, approval["arguments"].clone()).is_none() {
            self.update(tool_call.clone());
        }
        tool_call.as_object_mut().map(|t| t.remove("sessionUpdate"));
        // Paths a walk withheld are allowed for this call only: nothing to remember.
        let once = approval.get("withheld").is_some_and(Value::is_array);
        let options: Vec<Value> = OPTIONS
            .iter()
            .filter(|(id, ..)| !(once && *id == "allow_session"))
            .map(|(id, name, kind)| json!({ "optionId": id, "name": name, "kind": kind }))
            .collect();
        let params = json!({ "sessionId": self.session_id, "toolCall": tool_call, "options": options });
        let answer = self.peer.request("session/request_permission", params).recv();
        let chosen = match answer {
            Ok(Ok(result)) if result["outcome"]["outcome"] == "selected" => {
                result["outcome"]["optionId"].as_str().map(str::to_string)
            }
            _ => None,
        };
        let decision = match chosen.as_deref() {
            Some("allow") => json!({ "approved": true }),
            Some("allow_session") => json!({ "approved": true, "remember": "session" }),
            _ => json!({ "approved": false, "note": "Rejected in the editor." }),
        };
        let path = format!("/api/sessions/{}/approvals/{}", self.session_id, approval["id"].as_str().unwrap_or(""));
        match self.client.call("POST", &path, Some(&decision)) {
            Ok(_) if decision["approved"] == true => {
                let id = &approval["callId"];
                self.update(json!({ "sessionUpdate": "tool_call_update", "toolCallId": id, "status": "in_progress" }));
                Ok(())
            }
            // The run may have ended (a cancel) while the editor was asked.
            Ok(_) | Err(CliError::Denied(_)) => Ok(()),
            Err(error) => Err(internal(error)),
        }
    }
}

fn not_found(error: CliError) -> RpcError {
    match error {
        CliError::Denied(message) => RpcError::new(NOT_FOUND, message),
        other => internal(other),
    }
}

fn internal(error: CliError) -> RpcError {
    RpcError::new(INTERNAL_ERROR, error.to_string())
}
