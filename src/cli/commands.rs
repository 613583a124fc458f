//! The one-shot commands: `sessions`, `send`, `events`, `health`.

use std::io::Write;

use serde_json::{json, Value};

use super::args::{EventsArgs, HealthArgs, MigrateArgs, SendArgs, SessionsAction, SessionsArgs};
use super::client::{CliError, Client, Frames};

/// Prints a line to stdout; a closed stdout (a pipe whose reader left) ends the command quietly.
pub(super) fn say(text: &str) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Err(CliError::Failed(String::new())),
        _ => Ok(()),
    }
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}

/// A path segment: ids are sent as they are, but nothing in them can change the route.
pub(super) fn segment(id: &str) -> Result<&str, CliError> {
    match !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        true => Ok(id),
        false => Err(CliError::Usage(format!("{id:?} is not a session id"))),
    }
}

/// Every session, walked a page at a time (`?limit&cursor`), most recently updated first.
fn every_session(client: &Client) -> Result<Vec<Value>, CliError> {
    const PAGE: usize = 500;
    let mut sessions = Vec::new();
    let mut path = format!("/api/sessions?limit={PAGE}");
    loop {
        let page = client.call("GET", &path, None)?;
        sessions.extend(page["sessions"].as_array().cloned().unwrap_or_default());
        match page["nextCursor"].as_str() {
            Some(cursor) => path = format!("/api/sessions?limit={PAGE}&cursor={cursor}"),
            None => return Ok(sessions),
        }
    }
}

pub fn sessions(args: &SessionsArgs) -> Result<(), CliError> {
    let client = Client::new(&args.remote)?;
    match args.action.as_ref().unwrap_or(&SessionsAction::List) {
        SessionsAction::List => {
            let sessions = every_session(&client)?;
            if args.json {
                return say(&pretty(&Value::Array(sessions)));
            }
            if sessions.is_empty() {
                return say("no sessions");
            }
            for session in sessions {
                let field = |name: &str| session[name].as_str().unwrap_or("").to_string();
                say(&format!(
                    "{}  {:<11}  {}  {:>4} msgs  {}",
                    field("id"),
                    field("status"),
                    field("updatedAt"),
                    session["messageCount"].as_u64().unwrap_or(0),
                    field("title")
                ))?;
            }
            Ok(())
        }
        SessionsAction::Show { id } => {
            let detail = client.call("GET", &format!("/api/sessions/{}", segment(id)?), None)?;
            match args.json {
                true => say(&pretty(&detail["session"])),
                false => say(&transcript(&detail["session"])),
            }
        }
        SessionsAction::Rm { id } => {
            client.call("DELETE", &format!("/api/sessions/{}", segment(id)?), None)?;
            say(&format!("deleted {id}"))
        }
        SessionsAction::Fork { id, message, copy, path } => {
            let workspace = if *copy { "copy" } else { "share" };
            let body = json!({ "messageId": message, "workspace": workspace, "path": path });
            let forked = client.call("POST", &format!("/api/sessions/{}/fork", segment(id)?), Some(&body))?;
            match args.json {
                true => say(&pretty(&forked)),
                false => say(&format!(
                    "forked {id} into {}  workspace {}",
                    forked["session"]["id"].as_str().unwrap_or(""),
                    forked["session"]["workspace"].as_str().unwrap_or("")
                )),
            }
        }
    }
}

/// A session as a person reads it: a header, then each message by role.
fn transcript(session: &Value) -> String {
    let text = |value: &Value| value.as_str().unwrap_or("").to_string();
    let mut out = format!(
        "{}  {}\nmodel {}  status {}  workspace {}\n",
        text(&session["id"]),
        text(&session["title"]),
        text(&session["model"]),
        text(&session["status"]),
        text(&session["workspace"])
    );
    for message in session["messages"].as_array().into_iter().flatten() {
        let role = text(&message["role"]);
        let line = match role.as_str() {
            "tool" => format!("[{}] {}", text(&message["toolName"]), first_line(&text(&message["content"]))),
            _ => text(&message["content"]),
        };
        out.push_str(&format!("\n{role}: {line}"));
        for call in message["toolCalls"].as_array().into_iter().flatten() {
            out.push_str(&format!("\n  -> {}({})", text(&call["name"]), call["arguments"]));
        }
    }
    out
}

pub(super) fn first_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or("");
    match line.chars().count() > 100 {
        true => format!("{}…", line.chars().take(100).collect::<String>()),
        false => line.to_string(),
    }
}

pub fn send(args: &SendArgs) -> Result<(), CliError> {
    let client = Client::new(&args.remote)?;
    let id = segment(&args.session)?;
    // Subscribed before the message goes, so the run's first event cannot be missed.
    let mut body = json!({ "content": args.message });
    if let Some(path) = &args.schema {
        body["responseFormat"] = response_format(path)?;
    }
    let frames = match args.wait || args.schema.is_some() {
        true => Some(client.stream(&format!("/api/sessions/{id}/events"), None)?),
        false => None,
    };
    let sent = client.call("POST", &format!("/api/sessions/{id}/messages"), Some(&body))?;
    let run_id = sent["runId"].as_str().unwrap_or_default().to_string();
    let Some(mut frames) = frames else {
        return say(&if args.json { json!({ "runId": run_id }).to_string() } else { run_id });
    };
    let outcome = follow(&mut frames, &run_id, |event| {
        if event["type"] == "approval.requested" {
            let approval = &event["approval"];
            eprintln!(
                "kestrel: waiting for approval of {} ({}): answer it in the console or with `kestrel chat {id}`",
                approval["toolName"].as_str().unwrap_or("a tool call"),
                approval["id"].as_str().unwrap_or("")
            );
        }
    })?;
    if args.json {
        return say(&outcome.to_json(&run_id).to_string());
    }
    if let Some(error) = &outcome.error {
        return Err(CliError::Failed(format!("the run failed: {error}")));
    }
    match (&args.schema, outcome.structured()) {
        (Some(_), Some(value)) => say(&value.to_string()),
        _ => say(&outcome.reply()),
    }
}

/// `--schema FILE`: a JSON Schema, or a whole `responseFormat` (`{type, schema, name?}`).
fn response_format(path: &std::path::Path) -> Result<Value, CliError> {
    let unreadable = |why: String| CliError::Usage(format!("--schema {}: {why}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|error| unreadable(error.to_string()))?;
    let schema: Value = serde_json::from_str(&text).map_err(|error| unreadable(error.to_string()))?;
    Ok(match schema.get("type") == Some(&json!("json_schema")) && schema.get("schema").is_some() {
        true => schema,
        false => json!({ "type": "json_schema", "schema": schema }),
    })
}

/// How a run ended, and the messages it completed.
#[derive(Debug, Default)]
pub(super) struct Outcome {
    pub status: Option<String>,
    pub error: Option<String>,
    pub usage: Option<Value>,
    pub messages: Vec<Value>,
}

impl Outcome {
    /// The last assistant message's text.
    fn reply(&self) -> String {
        let last = self.messages.iter().rev().find(|m| m["role"] == "assistant");
        last.and_then(|m| m["content"].as_str()).unwrap_or("").to_string()
    }

    /// The last assistant message's structured value, when it has one.
    fn structured(&self) -> Option<&Value> {
        let last = self.messages.iter().rev().find(|m| m["role"] == "assistant")?;
        last.get("meta")?.get("structured")
    }

    fn to_json(&self, run_id: &str) -> Value {
        let mut outcome = json!({
            "runId": run_id,
            "status": self.status.as_deref().unwrap_or("failed"),
            "error": self.error,
            "usage": self.usage,
            "reply": self.reply(),
            "messages": self.messages,
        });
        if let Some(value) = self.structured() {
            outcome["structured"] = value.clone();
        }
        outcome
    }
}

/// Reads a session's stream until run `run_id` ends, handing every event of the run to
/// `seen`; the completed messages and the ending.
pub(super) fn follow(frames: &mut Frames, run_id: &str, mut seen: impl FnMut(&Value)) -> Result<Outcome, CliError> {
    let mut outcome = Outcome::default();
    let mut started = false;
    while let Some(frame) = frames.next_frame() {
        let Ok(envelope) = serde_json::from_str::<Value>(&frame.data) else { continue };
        let event = &envelope["event"];
        let ours = event["runId"] == run_id;
        started |= event["type"] == "run.started" && ours;
        if !started {
            continue;
        }
        seen(event);
        match event["type"].as_str().unwrap_or("") {
            "message.completed" => outcome.messages.push(event["message"].clone()),
            "run.finished" if ours => {
                outcome.status = event["status"].as_str().map(str::to_string);
                outcome.usage = event.get("usage").cloned();
                return Ok(outcome);
            }
            "run.failed" if ours => {
                outcome.error = Some(event["error"].as_str().unwrap_or("unknown error").to_string());
                return Ok(outcome);
            }
            _ => {}
        }
    }
    Err(CliError::Failed("the event stream ended before the run did".into()))
}

pub fn events(args: &EventsArgs) -> Result<(), CliError> {
    let client = Client::new(&args.remote)?;
    let path = match &args.session {
        Some(id) => format!("/api/sessions/{}/events", segment(id)?),
        None => "/api/events".to_string(),
    };
    let mut frames = client.stream(&path, args.since)?;
    while let Some(frame) = frames.next_frame() {
        say(&frame.data)?;
    }
    Err(CliError::Failed("the server ended the stream".into()))
}

pub fn health(args: &HealthArgs) -> Result<(), CliError> {
    let health = Client::new(&args.remote)?.call("GET", "/api/health", None)?;
    if args.json {
        return say(&health.to_string());
    }
    say(&format!(
        "{} {} {} (protocol {}), up {} s, {} sessions, {} plugins",
        health["status"].as_str().unwrap_or("?"),
        health["name"].as_str().unwrap_or("?"),
        health["version"].as_str().unwrap_or("?"),
        health["protocol"].as_str().unwrap_or("?"),
        health["uptimeMs"].as_u64().unwrap_or(0) / 1000,
        health["sessions"].as_u64().unwrap_or(0),
        health["plugins"].as_u64().unwrap_or(0),
    ))
}

/// `kestrel migrate`: the PostgreSQL schema's versions under its advisory lock, or the data
/// dir's SQLite file opened (which migrates it) and closed.
pub fn migrate(args: &MigrateArgs) -> Result<(), CliError> {
    use crate::store::postgres as pg;
    let Some(url) = args.database_url.as_deref().filter(|url| !url.is_empty()) else {
        if args.from.is_some() {
            return Err(CliError::Failed("--from sqlite copies into --database-url (or KESTREL_DATABASE_URL)".into()));
        }
        let (_, writer) = crate::store::Store::open(&args.data_dir).map_err(|e| CliError::Failed(e.to_string()))?;
        writer.shutdown();
        return say(&format!("SQLite at {}: up to date", args.data_dir.join("kestrel.db").display()));
    };
    if args.from.is_some() {
        let imported = pg::from_sqlite(&args.data_dir, url).map_err(|error| CliError::Failed(error.to_string()))?;
        let rows: Vec<String> = imported.rows.iter().map(|(table, count)| format!("{table} {count}")).collect();
        return say(&format!(
            "copied {} into PostgreSQL at {}: {}; blobs {}; the log's last seq {}",
            args.data_dir.join("kestrel.db").display(),
            pg::redacted(url),
            rows.join(", "),
            imported.blobs,
            imported.last_seq
        ));
    }
    let mut client = pg::connect(url).map_err(|error| CliError::Failed(error.to_string()))?;
    let migrated = pg::migrate(&mut client).map_err(|error| CliError::Failed(error.to_string()))?;
    let applied = match migrated.applied.as_slice() {
        [] => "nothing to apply".to_string(),
        versions => format!("applied {versions:?}"),
    };
    say(&format!("PostgreSQL at {}: schema version {}, {applied}", pg::redacted(url), migrated.version))
}
