//! Remote subagents: a client's `subagent_tools` declaration names CLI harnesses (`claude`,
//! `codex`, …) with a command template; the model calls the declared tool (`launch_subagent`)
//! with a harness, a model and a prompt, and the server runs the harness's command inside the
//! session's remote sandbox, in the background. The call answers at once (`status:
//! started`); the model asks `remote_subagent_status` later for the outcome, which is reported
//! once and then forgotten.
//!
//! The tasks are process memory (`Subagents`, shared by the engine): a turn launches and
//! queries, `session.cancelSubagent` cancels, close cancels what still runs, and a restart
//! loses them all. Each task runs on a `kestrel-subagent` thread that supervises its process
//! (`sandbox::supervise`): capped output, a timeout, and a kill on cancel. Its lifecycle
//! events go to the launching client even after the turn; they are not the turn's own events
//! (not in `result.events`), as in BAE.

use super::bae;
use super::turn::BaeRun;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crossbeam_channel::Sender;
use serde_json::{json, Map, Value};

use super::runtime::BaeSession;
use super::sessions::{Harness, SubagentDecl};
use super::turn::BaeTurn;
use super::RESERVED_TOOL;
use crate::bus::Origin;
use crate::domain::{Dispatch, Event, SubagentStep, ToolCall, ToolResult, ToolSchema};
use crate::sandbox::{Ending, Running, Supervised};
use crate::store::BAE_TENANT;

/// The most bytes of each output stream kept.
pub const OUTPUT_CAP: usize = 65_536;

const STATUS_DESCRIPTION: &str = "Check on subagents started with launch_subagent: give a subagent_id for \
one, or nothing for all. A finished subagent's output is reported once, then forgotten.";

/// `remote_subagent_status` as the model sees it (offered while the session tracks any).
pub fn status_tool() -> ToolSchema {
    ToolSchema {
        name: RESERVED_TOOL.into(),
        description: STATUS_DESCRIPTION.into(),
        parameters: json!({
            "type": "object",
            "properties": { "subagent_id": { "type": "string", "description": "The subagent to report; omit for all." } },
            "required": [],
            "additionalProperties": false
        }),
        permission: None,
        category: None,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Running,
    Completed,
    Failed,
    TimedOut,
    Cancelled,
}

impl Status {
    fn name(self) -> &'static str {
        match self {
            Status::Running => "running",
            Status::Completed => "completed",
            Status::Failed => "failed",
            Status::TimedOut => "timed_out",
            Status::Cancelled => "cancelled",
        }
    }
}

/// Who a task is: its id, harness and model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Who {
    pub id: String,
    pub harness: String,
    pub model: String,
}

/// How a task ended, as its status report and terminal event tell it.
struct Outcome {
    status: Status,
    exit_code: Option<i64>,
    stdout: Option<String>,
    stderr: Option<String>,
    truncated: bool,
    reason: Option<&'static str>,
    detail: Option<String>,
}

struct Task {
    who: Who,
    /// The outcome once it has ended.
    ended: Option<Outcome>,
    /// Held while it runs: sending or dropping it kills the process.
    kill: Option<Sender<()>>,
}

impl Task {
    fn status(&self) -> Status {
        self.ended.as_ref().map_or(Status::Running, |o| o.status)
    }

    fn report(&self) -> Value {
        let ended = self.ended.as_ref();
        json!({
            "subagent_id": self.who.id,
            "harness": self.who.harness,
            "model": self.who.model,
            "status": self.status().name(),
            "exit_code": ended.and_then(|o| o.exit_code),
            "stdout": ended.and_then(|o| o.stdout.clone()),
            "stderr": ended.and_then(|o| o.stderr.clone()),
            "truncated": ended.is_some_and(|o| o.truncated),
            "reason": ended.and_then(|o| o.reason),
            "detail": ended.and_then(|o| o.detail.clone()),
        })
    }
}

/// `session.cancelSubagent` found no such task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotTracked;

/// Every session's remote subagents, in launch order.
#[derive(Default)]
pub struct Subagents {
    sessions: Mutex<HashMap<String, Vec<Task>>>,
}

impl Subagents {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Task>>> {
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the session tracks any task (then the model is offered the status tool).
    pub fn tracks(&self, session_id: &str) -> bool {
        self.lock().get(session_id).is_some_and(|tasks| !tasks.is_empty())
    }

    fn running(&self, session_id: &str) -> usize {
        self.lock().get(session_id).map_or(0, |tasks| tasks.iter().filter(|t| t.ended.is_none()).count())
    }

    /// `remote_subagent_status`: the one asked for, or all; the ended ones reported are
    /// forgotten. The reply, and whether it is an error.
    pub fn status(&self, session_id: &str, input: &Map<String, Value>) -> (Value, bool) {
        let asked = input.get("subagent_id").and_then(Value::as_str);
        let mut sessions = self.lock();
        let tasks = sessions.entry(session_id.to_string()).or_default();
        let chosen: Vec<usize> = match asked {
            Some(id) => match tasks.iter().position(|task| task.who.id == id) {
                Some(at) => vec![at],
                None => return (json!({ "error": "unknown subagent_id" }), true),
            },
            None => (0..tasks.len()).collect(),
        };
        let reports: Vec<Value> = chosen.iter().map(|&at| tasks[at].report()).collect();
        let reported: Vec<String> = chosen.iter().map(|&at| tasks[at].who.id.clone()).collect();
        tasks.retain(|task| task.ended.is_none() || !reported.contains(&task.who.id));
        if tasks.is_empty() {
            sessions.remove(session_id);
        }
        (json!({ "subagents": reports }), false)
    }

    /// Cancels a running task (killing its process); the task if it was running. An ended
    /// task stays to be reported.
    pub fn cancel(&self, session_id: &str, id: &str) -> Result<Option<Who>, NotTracked> {
        let mut sessions = self.lock();
        let task = sessions.get_mut(session_id).and_then(|tasks| tasks.iter_mut().find(|t| t.who.id == id));
        let task = task.ok_or(NotTracked)?;
        if task.ended.is_some() {
            return Ok(None);
        }
        task.kill.take();
        task.ended = Some(Outcome::cancelled("explicit"));
        Ok(Some(task.who.clone()))
    }

    /// The session closes: its running tasks are killed and returned; everything is forgotten.
    pub fn close(&self, session_id: &str) -> Vec<Who> {
        let tasks = self.lock().remove(session_id).unwrap_or_default();
        tasks.into_iter().filter(|task| task.ended.is_none()).map(|task| task.who).collect()
    }

    /// The server stops: every running task is killed.
    pub fn abort_all(&self) {
        self.lock().clear();
    }

    /// Records how a task ended, unless it was cancelled (or forgotten) meanwhile; whether it
    /// was recorded.
    fn finish(&self, session_id: &str, id: &str, outcome: Outcome) -> bool {
        let mut sessions = self.lock();
        let task = sessions.get_mut(session_id).and_then(|tasks| tasks.iter_mut().find(|t| t.who.id == id));
        match task {
            Some(task) if task.ended.is_none() => {
                task.kill.take();
                task.ended = Some(outcome);
                true
            }
            _ => false,
        }
    }
}

impl Outcome {
    fn cancelled(reason: &'static str) -> Outcome {
        Outcome {
            status: Status::Cancelled,
            exit_code: None,
            stdout: None,
            stderr: None,
            truncated: false,
            reason: Some(reason),
            detail: None,
        }
    }

    fn spawn_failed(detail: String) -> Outcome {
        Outcome { status: Status::Failed, reason: Some("spawn_failed"), detail: Some(detail), ..Outcome::empty() }
    }

    fn empty() -> Outcome {
        Outcome {
            status: Status::Failed,
            exit_code: None,
            stdout: None,
            stderr: None,
            truncated: false,
            reason: None,
            detail: None,
        }
    }

    fn of(ran: Supervised) -> Outcome {
        let (status, exit_code, reason) = match ran.ending {
            Ending::TimedOut => {
                return Outcome { status: Status::TimedOut, reason: Some("timeout"), ..Outcome::empty() }
            }
            Ending::Cancelled => return Outcome::cancelled("explicit"),
            Ending::Exited(Some(0)) => (Status::Completed, Some(0), None),
            Ending::Exited(code) => (Status::Failed, Some(i64::from(code.unwrap_or(-1))), Some("nonzero_exit")),
        };
        Outcome {
            status,
            exit_code,
            stdout: Some(ran.stdout),
            stderr: Some(ran.stderr),
            truncated: ran.truncated,
            reason,
            detail: None,
        }
    }

    /// The terminal step's name.
    fn step(&self) -> &'static str {
        match self.status {
            Status::Completed => "completed",
            Status::Cancelled => "cancelled",
            _ => "failed",
        }
    }
}

/// A launch refused: the reason, in BAE's words.
struct Refused(String);

impl BaeRun<'_> {
    /// A call of a subagent tool (`launch_subagent` or `remote_subagent_status`), answered
    /// with one text block holding a JSON object, and its `tool.result`.
    pub(crate) fn call_subagent(&self, turn: &BaeTurn, call: &ToolCall) -> ToolResult {
        let (reply, is_error) = match call.name == RESERVED_TOOL {
            true => bae(&self.shared).subagents.status(&self.session_id, &call.arguments),
            false => match self.launch_subagent(turn, call) {
                Ok(started) => (started, false),
                Err(Refused(why)) => (json!({ "error": why }), true),
            },
        };
        let text = reply.to_string();
        let result = ToolResult {
            call_id: call.id.clone(),
            name: call.name.clone(),
            ok: !is_error,
            content: text.clone(),
            duration_ms: None,
            error: is_error.then(|| text.clone()),
            data: None,
            blocks: Some(vec![json!({ "type": "text", "text": text })]),
        };
        let session_id = self.session_id.clone();
        let finished = Event::ToolFinished { session_id, result: result.clone(), dispatch: Dispatch::Subagent };
        self.publish_settled(finished, &call.id);
        result
    }

    /// The checks in BAE's order, then the task starts in the background.
    fn launch_subagent(&self, turn: &BaeTurn, call: &ToolCall) -> Result<Value, Refused> {
        let text = |field: &str| call.arguments.get(field).and_then(Value::as_str).filter(|t| !t.trim().is_empty());
        let (Some(harness), Some(model), Some(prompt)) = (text("harness"), text("model"), text("prompt")) else {
            return Err(Refused("launch_subagent requires string \"harness\", \"model\", and \"prompt\"".into()));
        };
        let declared = turn.subagent_tools.iter().find(|decl| decl.name == call.name);
        let chosen = declared.and_then(|decl| decl.subagents.iter().find(|h| h.harness == harness).map(|h| (decl, h)));
        let Some((decl, chosen)) = chosen else { return Err(Refused(format!("unknown harness {harness:?}"))) };
        let cap = bae(&self.shared).settings.max_subagents;
        if bae(&self.shared).subagents.running(&self.session_id) >= cap {
            return Err(Refused(format!("subagent limit reached (max {cap} per session)")));
        }
        let Some(sandbox) = self.session_sandbox() else {
            let why =
                format!("no remote sandbox is running for tool '{}'; call session.startRemoteSandbox first", call.name);
            return Err(Refused(why));
        };
        if sandbox.image != decl.image {
            return Err(Refused(format!(
                "remote sandbox image mismatch: subagent declared {:?} but the running sandbox uses {:?}",
                decl.image, sandbox.image
            )));
        }
        let who = Who { id: crate::auth::keys::new_id("sba_"), harness: harness.into(), model: model.into() };
        self.start_task(turn, &who, chosen, &sandbox, prompt);
        Ok(json!({ "subagent_id": who.id, "harness": who.harness, "model": who.model, "status": "started" }))
    }

    /// Records the task (start, then running) and hands it to its thread.
    fn start_task(&self, turn: &BaeTurn, who: &Who, harness: &Harness, sandbox: &Running, prompt: &str) {
        let tell = Teller { shared: Arc::clone(&self.shared), session_id: self.session_id.clone(), who: who.clone() };
        let actor = turn.actor.to_string();
        tell.step(&actor, "start", None);
        let (kill, killed) = crossbeam_channel::bounded::<()>(1);
        let task = Task { who: who.clone(), ended: None, kill: Some(kill) };
        bae(&self.shared).subagents.lock().entry(self.session_id.clone()).or_default().push(task);
        tell.step(&actor, "running", None);

        let driver = Arc::clone(&bae(&self.shared).settings.sandbox.0);
        let marker = sandbox.process_marker();
        // Checked at open and join; the values are positional parameters, never script.
        let process = super::template::compile(&harness.command_template, &harness.prompt_via)
            .map_err(|why| crate::sandbox::DriverError(why.to_string()))
            .and_then(|script| {
                let args = super::template::arguments(&who.model, prompt, &harness.prompt_via);
                let script = crate::sandbox::Script { text: &script, args: &args, marker: &marker, stdin: true };
                driver.process(sandbox, &script)
            });
        let stdin = (harness.prompt_via != "arg").then(|| prompt.as_bytes().to_vec());
        let timeout = harness
            .timeout_secs
            .map(std::time::Duration::from_secs)
            .unwrap_or(bae(&self.shared).settings.subagent_timeout);
        let (finish, finish_actor, sandbox) = (tell.clone(), actor.clone(), sandbox.clone());
        let work = move || {
            let reap = |ending| driver.reap(&sandbox, &marker, ending);
            let outcome = match process {
                Ok(process) => match crate::sandbox::supervise(process, stdin, timeout, &killed, OUTPUT_CAP, &reap) {
                    Ok(ran) => Outcome::of(ran),
                    Err(error) => Outcome::spawn_failed(error.to_string()),
                },
                Err(error) => Outcome::spawn_failed(error.0),
            };
            finish.ended(&finish_actor, outcome);
        };
        let spawned = std::thread::Builder::new().name("kestrel-subagent".into()).spawn(work);
        if let Err(error) = spawned {
            tell.ended(&actor, Outcome::spawn_failed(format!("no thread for the subagent: {error}")));
        }
    }

    /// The session's remote sandbox, asked of its actor.
    pub(crate) fn session_sandbox(&self) -> Option<Running> {
        let (reply, handle) = crossbeam_channel::bounded(1);
        self.tell_door(Box::new(super::runtime::FromTurn::SandboxHandle { reply }));
        handle.recv().ok().flatten()
    }
}

/// Publishes a task's lifecycle events, from the turn or from the task's thread.
#[derive(Clone)]
struct Teller {
    shared: Arc<crate::engine::Shared>,
    session_id: String,
    who: Who,
}

impl Teller {
    fn step(&self, actor: &str, step: &str, ended: Option<&Outcome>) {
        publish_subagent(&self.shared, actor, self.event(step, ended));
    }

    /// `Event::Subagent` for `step` of this task, with what its end says if it ended.
    fn event(&self, step: &str, ended: Option<&Outcome>) -> Event {
        Event::Subagent(Box::new(SubagentStep {
            session_id: self.session_id.clone(),
            step: step.into(),
            remote: true,
            subagent_id: self.who.id.clone(),
            harness: self.who.harness.clone(),
            model: self.who.model.clone(),
            detail: ended.and_then(|o| o.detail.clone()),
            reason: ended.and_then(|o| o.reason).map(str::to_string),
            exit_code: ended.and_then(|o| o.exit_code),
        }))
    }

    /// The task ended on its own (or could not start): recorded and told, unless it was
    /// cancelled meanwhile (cancelled tasks tell nothing more).
    fn ended(&self, actor: &str, outcome: Outcome) {
        let event = self.event(outcome.step(), Some(&outcome));
        if bae(&self.shared).subagents.finish(&self.session_id, &self.who.id, outcome) {
            publish_subagent(&self.shared, actor, event);
        }
    }
}

/// A subagent event, attributed to `actor` and to no turn.
fn publish_subagent(shared: &crate::engine::Shared, actor: &str, event: Event) {
    let origin = Origin { actor: Some(Arc::from(actor)), turn: None };
    if shared.bus.publish_durable(Some(Arc::from(BAE_TENANT)), origin, event).is_none() {
        log::warn!("a subagent event could not be recorded");
    }
}

impl BaeSession<'_> {
    /// `session.cancelSubagent`: a driver, a non-blank id, a tracked task; whether it was
    /// running (then its process is killed and `cancelled` told, attributed to the caller).
    pub(crate) fn cancel_subagent(
        &mut self,
        key: &str,
        id: super::runtime::Params<String>,
    ) -> Result<bool, super::runtime::RpcError> {
        use super::runtime::RpcError;
        if !self.state.drivers.contains(key) {
            return Err(RpcError::NotDriver);
        }
        let id = id?;
        match bae(&self.actor.shared).subagents.cancel(&self.actor.id, &id) {
            Err(NotTracked) => Err(RpcError::SubagentNotFound(id)),
            Ok(None) => Ok(false),
            Ok(Some(who)) => {
                publish_subagent(&self.actor.shared, key, cancelled_event(&self.actor.id, &who, "explicit"));
                Ok(true)
            }
        }
    }

    /// Close: every running task is killed and told `cancelled` (`session_close`), attributed
    /// to the session's creator; ended ones are forgotten.
    pub(crate) fn cancel_subagents_at_close(&mut self) {
        let cancelled = bae(&self.actor.shared).subagents.close(&self.actor.id);
        if cancelled.is_empty() {
            return;
        }
        let creator = match self.actor.shared.store.readers().bae_session(&self.actor.id) {
            Ok(Some(record)) => record.creator_key_id,
            _ => String::new(),
        };
        for who in cancelled {
            publish_subagent(&self.actor.shared, &creator, cancelled_event(&self.actor.id, &who, "session_close"));
        }
    }
}

/// A cancelled task's event (`reason`: explicit or session_close).
fn cancelled_event(session_id: &str, who: &Who, reason: &str) -> Event {
    Event::Subagent(Box::new(SubagentStep {
        session_id: session_id.to_string(),
        step: "cancelled".into(),
        remote: true,
        subagent_id: who.id.clone(),
        harness: who.harness.clone(),
        model: who.model.clone(),
        detail: None,
        reason: Some(reason.into()),
        exit_code: None,
    }))
}

/// The acting client's subagent declarations, as stored at open or join.
pub(crate) fn declarations(by_key: &Map<String, Value>, key: &str) -> Vec<SubagentDecl> {
    let declared = by_key.get(key).cloned().unwrap_or(Value::Array(Vec::new()));
    serde_json::from_value(declared).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_reports_ended_tasks_once_and_keeps_running_ones() {
        let subagents = Subagents::default();
        let who = |id: &str| Who { id: id.into(), harness: "h".into(), model: "m".into() };
        let (kill, _killed) = crossbeam_channel::bounded(1);
        subagents.lock().entry("s".into()).or_default().extend([
            Task { who: who("sba_1"), ended: None, kill: Some(kill) },
            Task { who: who("sba_2"), ended: Some(Outcome::spawn_failed("no".into())), kill: None },
        ]);
        let (all, error) = subagents.status("s", &Map::new());
        assert!(!error);
        assert_eq!(all["subagents"].as_array().unwrap().len(), 2);
        assert_eq!(all["subagents"][1]["reason"], "spawn_failed");
        let (again, _) = subagents.status("s", &Map::new());
        assert_eq!(again["subagents"].as_array().unwrap().len(), 1, "the failed one was reported: {again}");
        let mut asked = Map::new();
        asked.insert("subagent_id".into(), json!("sba_2"));
        assert_eq!(subagents.status("s", &asked), (json!({ "error": "unknown subagent_id" }), true));
        assert_eq!(subagents.cancel("s", "sba_1"), Ok(Some(who("sba_1"))));
        assert_eq!(subagents.cancel("s", "sba_1"), Ok(None), "already ended");
        assert_eq!(subagents.cancel("s", "sba_9"), Err(NotTracked));
        asked.insert("subagent_id".into(), json!("sba_1"));
        assert_eq!(subagents.status("s", &asked).0["subagents"][0]["status"], "cancelled");
        assert!(!subagents.tracks("s"));
        assert_eq!(subagents.status("s", &Map::new()), (json!({ "subagents": [] }), false));
    }
}
