//! A run's tool calls: permissions, approvals, execution, and the resume rules.
//!
//! Runs on the run's worker thread. Each call is announced (`tool.started`); an `ask` tool
//! then waits for a person (`approval.requested` … `approval.resolved`) or for the cancel;
//! before a tool executes, a start mark is committed to the store. That mark is what resume
//! trusts: a call with a mark and no result may have had side effects, so the model is told
//! to verify; a call without one provably never ran, so it is dispatched again (and an `ask`
//! tool is asked again) instead of being failed.
//!
//! A walking tool (`Tool::walks`) is given a judge of the paths it reaches, built from the
//! rules the call was judged by. What a deny covers is skipped and counted; what an ask covers
//! is withheld, and once the tool is done a person is asked about exactly those paths (a
//! second approval of the same call, `withheld` listing them): allowed, the read-only tool runs
//! again with them; refused, its result says a person withheld them.

use std::collections::HashSet;

use std::sync::Arc;

use crossbeam_channel::{bounded, select, RecvTimeoutError};
use serde_json::{json, Map, Value};

use super::permissions::{self, Remember};
use super::run::{Run, Stop};
use super::session::{SessionMsg, TurnMsg};
use super::tools::ToolContext;
use super::EngineError;
use crate::cancel::CancelReason;
use crate::domain::{new_id, ApprovalRequest, Block, Event, Message, Role, SessionRecord, ToolCall, ToolResult};
use crate::policy::{self, AuditDecision, Outcome, PathJudge, Rule, Verdict, Withheld};
use crate::store::WriteOp;
use crate::tools::workspace::Workspace;

/// What the model is told for a call that started but whose result was never recorded.
pub(crate) const INTERRUPTED_TOOL_RESULT: &str = "This tool call was interrupted: the server stopped \
before its result was recorded, and it was not run again. Its side effects may or may not have \
happened. Verify the state of the workspace before retrying.";

/// What the model is told for a call that was still running, stuck, when the run was cancelled.
const ABANDONED_TOOL_RESULT: &str = "The run was cancelled while this tool call was still running and \
it did not stop; it was abandoned. Its side effects may or may not have happened.";

/// How long a cancelled tool has to stop before the run stops waiting for it.
const TOOL_STOP_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// What the model is told for calls the user cancelled before they ran.
const CANCELLED_TOOL_RESULT: &str = "The user cancelled the run before this tool call ran; it did not run.";

/// Paths an audit entry's note names, at most, of those a walk withheld (the approval itself
/// lists them all).
const WITHHELD_NOTE_PATHS: usize = 20;

/// A person's answer to an approval request.
#[derive(Debug, Clone, Default)]
pub struct Decision {
    pub approved: bool,
    pub note: Option<String>,
    /// Keep the decision as a rule, for the session or the tenant.
    pub remember: Option<Remember>,
    /// The pattern the remembered rule matches; this exact call when `None`.
    pub pattern: Option<String>,
    /// The arguments the call runs with instead of the model's.
    pub arguments: Option<Map<String, Value>>,
    /// Who decided (a token's name), for the audit log.
    pub actor: Option<String>,
    /// Where the run says whether it took the decision; the session's actor sets it.
    pub taken: Option<crossbeam_channel::Sender<Result<(), EngineError>>>,
}

/// A decision the run took.
pub(super) struct Taken {
    approved: bool,
    edited: Option<ToolCall>,
    /// The id of the rule it was remembered as.
    remembered: Option<String>,
    note: Option<String>,
}

/// What resume found in the transcript.
pub enum Repair {
    /// The transcript ends in a complete answer; nothing is left to do.
    Complete,
    /// Calls that provably never ran, to dispatch before the next model call.
    Dispatch(Vec<ToolCall>),
}

enum CallEnd {
    Done,
    Cancelled,
}

impl Run {
    /// Runs `calls` in order. `Some(Stop::Cancelled)` when a cancel stopped them; the calls that
    /// did not run are then answered (on a user's cancel) so the transcript stays well formed.
    pub(crate) fn run_calls(&self, calls: &[ToolCall], session: &SessionRecord) -> Result<Option<Stop>, EngineError> {
        let workspace =
            self.shared.config.workspaces.open(&self.tenant, std::path::Path::new(&session.summary.workspace));
        for (index, call) in calls.iter().enumerate() {
            // No call of a cancelled response starts after the cancel.
            let end = if self.cancel.is_cancelled() { CallEnd::Cancelled } else { self.run_call(call, &workspace)? };
            if let CallEnd::Cancelled = end {
                self.abandon(&calls[index..])?;
                return Ok(Some(Stop::Cancelled));
            }
        }
        Ok(None)
    }

    fn run_call(
        &self,
        call: &ToolCall,
        workspace: &Result<Workspace, crate::tools::workspace::PathError>,
    ) -> Result<CallEnd, EngineError> {
        let judged = self.shared.judge_call(&self.tenant, &self.session_id, call, workspace.as_ref().ok());
        let verdict = &judged.verdict;
        let note = permissions::note_of(verdict);
        let mut meta = Map::new();
        meta.insert("permission".into(), serde_json::to_value(&*note).unwrap_or_default());
        let permission = Some(note);
        self.publish(Event::ToolStarted { session_id: self.session_id.clone(), call: call.clone(), permission });
        let (decision, by) = match verdict.outcome {
            Outcome::Deny => (AuditDecision::Denied, Some(verdict)),
            Outcome::Allow => (AuditDecision::Allowed, Some(verdict)),
            Outcome::Ask => (AuditDecision::Asked, Some(verdict)),
        };
        let mut entry = self.audit_entry(call, decision, by);
        if !judged.read_whole {
            entry.note = Some(policy::NOT_READ_WHOLE.to_string());
        }
        self.shared.audit(entry);
        let (edited, approved) = match verdict.outcome {
            Outcome::Deny => {
                self.finish_noted(failed_result(call, permissions::denied_text(verdict), "denied"), meta)?;
                return Ok(CallEnd::Done);
            }
            Outcome::Allow => (None, false),
            Outcome::Ask => {
                match self.ask(call, self.approval(call, verdict.rule.as_ref(), None), workspace.as_ref().ok()) {
                    Some(taken) if taken.approved => (taken.edited, true),
                    Some(taken) => {
                        let mut content = "The user denied this tool call; it did not run.".to_string();
                        if let Some(note) = taken.note.filter(|n| !n.trim().is_empty()) {
                            content.push_str(&format!(" Their note: {note}"));
                        }
                        self.finish_noted(failed_result(call, content, "denied"), meta)?;
                        return Ok(CallEnd::Done);
                    }
                    None => return Ok(CallEnd::Cancelled),
                }
            }
        };
        if let Some(edited) = &edited {
            meta.insert("editedArguments".into(), Value::Object(edited.arguments.clone()));
        }
        // The asks a person answered were about the model's call, not about an edit of theirs.
        let answered = approved && edited.is_none();
        let call = edited.as_ref().unwrap_or(call);
        if self.shared.tools.changes_files(&call.name) {
            self.checkpoint_before_changes();
        }
        // Durable before the tool runs: see the module doc.
        self.mark_started(call)?;
        let mut result = match workspace {
            Ok(workspace) => {
                let paths = Arc::new(self.shared.path_judge(call, &judged, answered, Some(workspace)));
                let first = self.execute_tool(call, workspace, &paths);
                self.settle_withheld(call, workspace, &paths, first)
            }
            Err(error) => failed_result(call, format!("The session's workspace is unavailable: {error}"), "workspace"),
        };
        if edited.is_some() {
            let arguments = Value::Object(call.arguments.clone());
            result.content = format!(
                "A person edited this call's arguments before it ran; it ran with {arguments}.\n\n{}",
                result.content
            );
        }
        self.finish_noted(result, meta)?;
        Ok(CallEnd::Done)
    }

    /// Settles what a tool's judge of paths withheld from its `result`. When the judge withheld
    /// paths an ask rule covers, a person is asked about exactly those, and the tool (which
    /// changes no files: only walking tools have a judge that withholds) runs again with them
    /// allowed; the result says what stayed withheld, and why.
    fn settle_withheld(
        &self,
        call: &ToolCall,
        workspace: &Workspace,
        paths: &PathJudge,
        mut result: ToolResult,
    ) -> ToolResult {
        let tally = paths.tally();
        let mut withheld = Withheld { denied: tally.denied, refused: 0, unasked: tally.over };
        if !tally.asked.is_empty() && self.cancel.is_cancelled() {
            withheld.unasked += tally.asked.len();
        } else if !tally.asked.is_empty() {
            self.audit_withheld(call, &tally.asked, tally.over, tally.rule.as_ref());
            let approval = self.approval(call, tally.rule.as_ref(), Some(tally.asked.clone()));
            match self.ask(call, approval, Some(workspace)) {
                Some(taken) if taken.approved => {
                    let again = Arc::new(paths.allowing(tally.asked.clone()));
                    result = self.execute_tool(call, workspace, &again);
                    let second = again.tally();
                    withheld =
                        Withheld { denied: second.denied, refused: 0, unasked: second.over + second.asked.len() };
                }
                // Refused, or the run was cancelled before anyone answered: the first run's
                // result stands, without them.
                Some(_) | None => withheld.refused = tally.asked.len(),
            }
        }
        if !withheld.is_empty() {
            result.content = format!("{}\n{}", result.content, withheld.note());
            let mut data = match result.data.take() {
                Some(Value::Object(data)) => data,
                Some(other) => Map::from_iter([("value".to_string(), other)]),
                None => Map::new(),
            };
            data.insert("withheld".into(), withheld.data());
            result.data = Some(Value::Object(data));
        }
        result
    }

    /// Audits the ask rules' verdict on the paths a walk withheld, before a person is asked.
    fn audit_withheld(&self, call: &ToolCall, asked: &[String], over: usize, rule: Option<&Arc<Rule>>) {
        let verdict = Verdict { outcome: Outcome::Ask, rule: rule.cloned() };
        let mut entry = self.audit_entry(call, AuditDecision::Asked, Some(&verdict));
        let mut listed = asked.iter().take(WITHHELD_NOTE_PATHS).cloned().collect::<Vec<_>>().join(", ");
        if asked.len() > WITHHELD_NOTE_PATHS {
            listed.push_str(&format!(" and {} more", asked.len() - WITHHELD_NOTE_PATHS));
        }
        let past = if over > 0 { format!(" ({over} more withheld without asking)") } else { String::new() };
        entry.note = Some(policy::truncated(&format!("paths an ask rule withholds: {listed}{past}")));
        self.shared.audit(entry);
    }

    /// Commits the call's start mark; the tool may run once this returns.
    pub(crate) fn mark_started(&self, call: &ToolCall) -> Result<(), EngineError> {
        self.shared.store.write(vec![WriteOp::MarkCallStarted {
            session_id: self.session_id.clone(),
            call: Box::new(call.clone()),
            actor: self.origin().actor.as_deref().map(str::to_string),
            at: crate::time::now_rfc3339(),
        }])?;
        Ok(())
    }

    /// Runs a tool on a `kestrel-tool` thread while this thread waits for it or for the cancel,
    /// so a cancel ends the run within a second even if the tool is stuck in a blocking call
    /// (a network filesystem, a device). A tool that does not stop within `TOOL_STOP_GRACE` of
    /// the cancel is abandoned: its thread is left to finish on its own, and its result says
    /// it may still have had effects.
    fn execute_tool(&self, call: &ToolCall, workspace: &Workspace, paths: &Arc<PathJudge>) -> ToolResult {
        let (done_tx, done) = bounded(1);
        let (shared, owned_call, owned_workspace, cancel) =
            (Arc::clone(&self.shared), call.clone(), workspace.clone(), self.cancel.clone());
        let owned_paths = Arc::clone(paths);
        let (session_id, tenant) = (self.session_id.clone(), Arc::clone(&self.tenant));
        let spawned = std::thread::Builder::new().name("kestrel-tool".into()).spawn(move || {
            let context = ToolContext {
                workspace: &owned_workspace,
                paths: &owned_paths,
                tenant: &tenant,
                cancel: &cancel,
                session_id: &session_id,
                call_id: &owned_call.id,
            };
            let _ = done_tx.send(shared.tools.execute(&owned_call, &context));
        });
        if let Err(error) = spawned {
            log::warn!("cannot start a tool thread ({error}); running {} on the run's thread", call.name);
            let context = ToolContext {
                workspace,
                paths,
                tenant: &self.tenant,
                cancel: &self.cancel,
                session_id: &self.session_id,
                call_id: &call.id,
            };
            return self.shared.tools.execute(call, &context);
        }
        let panicked =
            || failed_result(call, "The tool failed unexpectedly; the server log has details.".into(), "internal");
        select! {
            recv(done) -> result => result.unwrap_or_else(|_| panicked()),
            recv(self.cancel.receiver()) -> _ => match done.recv_timeout(TOOL_STOP_GRACE) {
                Ok(result) => result,
                Err(RecvTimeoutError::Disconnected) => panicked(),
                Err(RecvTimeoutError::Timeout) => {
                    log::warn!("{} did not stop within {TOOL_STOP_GRACE:?} of a cancel; abandoned", call.name);
                    failed_result(call, ABANDONED_TOOL_RESULT.into(), "cancelled")
                }
            },
        }
    }

    /// The approval request for `call`: for the call itself, or (`withheld`) for the paths a
    /// walk of it withheld.
    fn approval(&self, call: &ToolCall, rule: Option<&Arc<Rule>>, withheld: Option<Vec<String>>) -> ApprovalRequest {
        ApprovalRequest {
            id: new_id("apr"),
            call_id: call.id.clone(),
            tool_name: call.name.clone(),
            arguments: call.arguments.clone(),
            created_at: crate::time::now_rfc3339(),
            rule: rule.map(|rule| rule.view()),
            withheld,
        }
    }

    /// Asks a person; `None` when the run was cancelled while waiting. A decision this run
    /// cannot take (an edit the schema or the rules refuse, a bad pattern to remember, a
    /// remember or an edit of withheld paths) is answered with the error and the call waits on.
    fn ask(&self, call: &ToolCall, approval: ApprovalRequest, workspace: Option<&Workspace>) -> Option<Taken> {
        let approval_id = approval.id.clone();
        let about_paths = approval.withheld.is_some();
        // Registered with the session's actor before anyone can see the request, so a decision
        // can never arrive before the actor knows where to send it.
        let mut decisions = self.await_decision(&approval_id);
        self.publish(Event::ApprovalRequested { session_id: self.session_id.clone(), approval });
        let taken = loop {
            let decision = select! {
                recv(decisions) -> decision => decision.ok(),
                recv(self.cancel.receiver()) -> _ => None,
            };
            let Some(mut decision) = decision else { break None };
            let reply = decision.taken.take();
            match self.take_decision(call, decision, workspace, about_paths) {
                Ok(taken) => {
                    reply.map(|r| r.send(Ok(())));
                    break Some(taken);
                }
                Err(error) => {
                    decisions = self.await_decision(&approval_id);
                    reply.map(|r| r.send(Err(error)));
                }
            }
        };
        let _ = self.session.send(SessionMsg::Turn(TurnMsg::Closed { approval_id: approval_id.clone() }));
        let (approved, arguments, remembered) = match &taken {
            Some(t) => (t.approved, t.edited.as_ref().map(|c| c.arguments.clone()), t.remembered.clone()),
            None => (false, None, None),
        };
        let session_id = self.session_id.clone();
        self.publish(Event::ApprovalResolved { session_id, approval_id, approved, arguments, remembered });
        taken
    }

    /// Tells the session's actor where a decision on `approval_id` goes.
    fn await_decision(&self, approval_id: &str) -> crossbeam_channel::Receiver<Decision> {
        let (decision, decisions) = bounded(1);
        let awaiting = TurnMsg::Awaiting { approval_id: approval_id.to_string(), decision };
        let _ = self.session.send(SessionMsg::Turn(awaiting));
        decisions
    }

    /// Checks a person's decision and records it: an edit must fit the tool's schema and must
    /// not be denied by a rule; a `remember` is stored as a rule. Audited either way.
    fn take_decision(
        &self,
        call: &ToolCall,
        decision: Decision,
        workspace: Option<&Workspace>,
        about_paths: bool,
    ) -> Result<Taken, EngineError> {
        if about_paths && (decision.remember.is_some() || decision.arguments.is_some()) {
            // A rule cannot stand for this decision (no allow weakens an ask rule), and the
            // call has already run with the arguments the person saw.
            return Err(EngineError::InvalidDecision(
                "an approval of withheld paths takes `approved` and `note` only: no `remember`, no `arguments`".into(),
            ));
        }
        let edited = match (&decision.arguments, decision.approved) {
            (Some(arguments), true) => Some(self.check_edit(call, arguments, &decision, workspace)?),
            _ => None,
        };
        let remembered = match decision.remember {
            Some(scope) => {
                let target = edited.as_ref().unwrap_or(call);
                let outcome = if decision.approved { Outcome::Allow } else { Outcome::Deny };
                let actor = decision.actor.clone();
                Some(self.remember(target, workspace, scope, decision.pattern.clone(), outcome, actor)?.id)
            }
            None => None,
        };
        let kind = match (decision.approved, &edited) {
            (true, Some(_)) => AuditDecision::Edited,
            (true, None) => AuditDecision::Approved,
            (false, _) => AuditDecision::Rejected,
        };
        let mut entry = self.audit_entry(call, kind, None);
        entry.actor = decision.actor.clone();
        entry.note = decision.note.clone().map(|n| policy::truncated(&n));
        entry.rule_id = remembered.clone();
        entry.edited = edited.as_ref().map(|c| self.shared.audited_arguments(&c.name, &c.arguments));
        self.shared.audit_now(entry);
        Ok(Taken { approved: decision.approved, edited, remembered, note: decision.note })
    }

    /// The call with a person's arguments, if the tool's schema and the rules let it run.
    fn check_edit(
        &self,
        call: &ToolCall,
        arguments: &Map<String, Value>,
        decision: &Decision,
        workspace: Option<&Workspace>,
    ) -> Result<ToolCall, EngineError> {
        let schema = self.shared.tools.parameters(&call.name).unwrap_or_else(|| json!({ "type": "object" }));
        permissions::check_arguments(&schema, arguments)?;
        let edited = ToolCall { arguments: arguments.clone(), ..call.clone() };
        let verdict = self.shared.judge(&self.tenant, &self.session_id, &edited, workspace);
        if verdict.outcome == Outcome::Deny {
            let mut entry = self.audit_entry(call, AuditDecision::Denied, Some(&verdict));
            entry.actor = decision.actor.clone();
            entry.edited = Some(self.shared.audited_arguments(&call.name, arguments));
            self.shared.audit_now(entry);
            return Err(EngineError::EditDenied(permissions::denied_text(&verdict)));
        }
        Ok(edited)
    }

    /// `finish_call`, with the call's permission (and a person's edit) in the message's meta.
    fn finish_noted(&self, result: ToolResult, meta: Map<String, Value>) -> Result<(), EngineError> {
        self.finish_with(result, Some(meta))
    }

    /// Announces a result and stores it as a `tool` message.
    fn finish_call(&self, result: ToolResult) -> Result<(), EngineError> {
        self.finish_with(result, None)
    }

    fn finish_with(&self, result: ToolResult, meta: Option<Map<String, Value>>) -> Result<(), EngineError> {
        self.publish(Event::ToolFinished {
            session_id: self.session_id.clone(),
            result: result.clone(),
            dispatch: Default::default(),
        });
        let mut message = tool_message(&result);
        if let Some(meta) = meta {
            message.meta.get_or_insert_with(Map::new).extend(meta);
        }
        self.publish(Event::MessageStarted { session_id: self.session_id.clone(), message: message.clone() });
        self.append(message)
    }

    /// Answers calls that will not run because the user cancelled. After a shutdown they are
    /// left unanswered: resume decides their fate from the start marks.
    fn abandon(&self, calls: &[ToolCall]) -> Result<(), EngineError> {
        if self.cancel.reason() != Some(CancelReason::User) {
            return Ok(());
        }
        for call in calls {
            self.finish_call(failed_result(call, CANCELLED_TOOL_RESULT.into(), "cancelled"))?;
        }
        Ok(())
    }

    /// Settles every call without a recorded result before a resumed run continues.
    pub(crate) fn repair_transcript(&self) -> Result<Repair, EngineError> {
        let history = self.shared.store.readers().messages(&self.session_id)?;
        let started = self.shared.store.readers().started_calls(&self.session_id)?;
        let answered: HashSet<&str> =
            history.iter().filter_map(|m| m.tool_result()).map(|result| result.call_id.as_str()).collect();
        let unanswered: Vec<&ToolCall> = history
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .flat_map(|m| m.tool_calls())
            .filter(|call| !answered.contains(call.id.as_str()))
            .collect();
        let mut never_ran = Vec::new();
        for call in &unanswered {
            if !started.contains(&call.id) {
                never_ran.push((*call).clone());
                continue;
            }
            let mut result = failed_result(call, INTERRUPTED_TOOL_RESULT.into(), "interrupted");
            result.duration_ms = None;
            let mut message = tool_message(&result);
            message.meta.get_or_insert_with(Map::new).insert("interrupted".into(), Value::Bool(true));
            self.publish(Event::MessageStarted { session_id: self.session_id.clone(), message: message.clone() });
            self.append(message)?;
        }
        // An answer cut off by a shutdown is not complete: the model answers again.
        let complete = unanswered.is_empty()
            && history.last().is_some_and(|m| {
                m.role == Role::Assistant && !m.has_tool_calls() && !super::run::is_interrupted_partial(m)
            });
        Ok(if complete { Repair::Complete } else { Repair::Dispatch(never_ran) })
    }
}

fn failed_result(call: &ToolCall, content: String, error: &str) -> ToolResult {
    ToolResult {
        call_id: call.id.clone(),
        name: call.name.clone(),
        ok: false,
        content,
        duration_ms: Some(0),
        error: Some(error.to_string()),
        data: None,
        blocks: None,
    }
}

/// The `tool` message that carries a result back to the model.
fn tool_message(result: &ToolResult) -> Message {
    let mut message = Message::new(Role::Tool);
    // What the model reads; `data` (a diff, an exit code) is for clients, on `tool.finished`.
    message.blocks.push(Block::ToolResult(ToolResult { data: None, duration_ms: None, ..result.clone() }));
    message.meta = json!({ "ok": result.ok }).as_object().cloned();
    message
}
