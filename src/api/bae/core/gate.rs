//! The turn gate of a BAE session's actor: one turn (or compaction) at a time, requests that
//! find it taken waiting in arrival order, a paused turn keeping it for its owner until its
//! deadline passes, and starting a turn (its tools, its provider chain, a resume merged into
//! the client's message).

use super::bae;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;

use super::compaction::{CompactionJob, DEFAULT_PROMPT};
use super::merge::{self, Resume};
use super::runtime::BaeSession;
use super::runtime::{Compact, RpcError, SendMessage, Started, UserMessage};
use super::turn::{BaeTurn, PausedTurn};
use super::RESERVED_TOOL;
use crate::cancel::CancelReason;
use crate::domain::{Event, Fault, Message, Role, ToolSchema};
use crate::engine::plan::TurnPlan;
use crate::store::{BaeSessionRecord, BaeState, BaeWrite, WriteOp};

/// A request waiting for the gate.
pub(super) enum Waiter {
    Send(Box<SendMessage>),
    Compact(Box<Compact>),
}

impl Waiter {
    pub(super) fn run_id(&self) -> &str {
        match self {
            Waiter::Send(send) => &send.run_id,
            Waiter::Compact(compact) => &compact.run_id,
        }
    }

    pub(super) fn fail(self, error: RpcError) {
        let _ = match self {
            Waiter::Send(send) => send.reply.send(Err(error)),
            Waiter::Compact(compact) => compact.reply.send(Err(error)),
        };
    }
}

#[derive(Default)]
pub(super) enum Gate {
    #[default]
    Free,
    Running {
        run_id: String,
    },
    Paused(Box<Pending>),
}

pub(super) struct Pending {
    turn: PausedTurn,
    deadline: Instant,
}

impl BaeSession<'_> {
    /// A send or compact arrives: the driver, state and params checks, then the gate.
    pub(super) fn arrive(&mut self, waiter: Waiter) {
        let (key, params_error) = match &waiter {
            Waiter::Send(send) => (send.key.clone(), send.message.as_ref().err().cloned()),
            Waiter::Compact(compact) => (compact.key.clone(), compact.prompt.as_ref().err().cloned()),
        };
        if !self.state.drivers.contains(&key) {
            return waiter.fail(RpcError::NotDriver);
        }
        if let Err(error) = self.open_record() {
            return waiter.fail(error);
        }
        if let Some(why) = params_error {
            return waiter.fail(why.into());
        }
        if !self.state.recovered {
            self.recover_pause();
        }
        let now = Instant::now();
        match std::mem::take(&mut self.state.gate) {
            Gate::Paused(pending) if pending.turn.owner == key && matches!(waiter, Waiter::Send(_)) => {
                self.start(waiter, Some((pending.turn, false)))
            }
            Gate::Paused(pending) if now > pending.deadline => {
                let owner = pending.turn.owner.clone();
                let fault = Fault::DriverTurnAbandoned { owner_client_key_id: owner.clone() };
                // Tagged with the reclaiming turn: a compaction shows it; a send leaves it out.
                let event = Event::SessionFault { session_id: self.actor.id.clone(), fault };
                if self.publish_for_turn(&owner, Some(waiter.run_id()), event).is_err() {
                    log::error!("session {}: driver_turn_abandoned could not be recorded", self.actor.id);
                }
                self.start(waiter, Some((pending.turn, true)))
            }
            Gate::Paused(pending) if matches!(waiter, Waiter::Compact(_)) => {
                self.state.gate = Gate::Paused(pending);
                waiter.fail(RpcError::TurnInProgress)
            }
            Gate::Free if self.state.queue.is_empty() => self.start(waiter, None),
            gate => {
                self.state.gate = gate;
                self.state.queue.push_back(waiter);
            }
        }
    }

    /// The first request of a process for this session: a turn that was paused for its
    /// client's tools when the server stopped is paused again, for the same owner, with a new
    /// deadline, so the client can still answer it once it has registered again.
    fn recover_pause(&mut self) {
        self.state.recovered = true;
        if !matches!(self.state.gate, Gate::Free) {
            return;
        }
        let readers = self.actor.shared.store.readers();
        let found = readers.messages(&self.actor.id).and_then(|messages| {
            let Some(last) = messages.last().filter(|m| m.role == Role::Assistant) else { return Ok(None) };
            let owner = readers.bae_last_actor(&self.actor.id, "message.completed")?.unwrap_or_default();
            Ok(PausedTurn::of_answer(last, owner))
        });
        match found {
            Ok(Some(turn)) => {
                log::info!(
                    "session {}: the turn paused before the restart waits for {} again",
                    self.actor.id,
                    turn.owner
                );
                let deadline = Instant::now() + bae(&self.actor.shared).settings.turn_timeout;
                self.state.gate = Gate::Paused(Box::new(Pending { turn, deadline }));
            }
            Ok(None) => {}
            Err(error) => log::error!("session {}: a paused turn could not be looked for: {error}", self.actor.id),
        }
    }

    /// Starts a waiter's work with the gate free (or reclaimed: `pending` is the paused turn
    /// it resumes, and whether its deadline had passed).
    fn start(&mut self, waiter: Waiter, pending: Option<(PausedTurn, bool)>) {
        let outcome = match waiter {
            Waiter::Send(send) => {
                let reply = send.reply.clone();
                let outcome = self.start_send(*send, pending);
                let _ = reply.send(outcome.clone().map(|_| Started));
                outcome
            }
            Waiter::Compact(compact) => {
                let reply = compact.reply.clone();
                let outcome = self.start_compaction(*compact, pending);
                let _ = reply.send(outcome.clone().map(|_| Started));
                outcome
            }
        };
        if outcome.is_err() {
            self.advance();
        }
    }

    /// Merges a resume, stores the client's message and starts its turn.
    fn start_send(&mut self, send: SendMessage, pending: Option<(PausedTurn, bool)>) -> Result<(), RpcError> {
        let SendMessage { key, run_id, message, .. } = send;
        let message = message?;
        let record = self.open_record()?;
        let (content, server_ids, names) = match pending {
            Some((paused, timed_out)) => self.merge_resume(&key, &message, &paused, timed_out)?,
            None if merge::has_tool_results(&message.content) => return Err(RpcError::NoPausedTurn),
            None => (message.content, HashSet::new(), HashMap::new()),
        };
        let user = merge::to_message(message.role, &content, &names)?;
        let profile = match self.actor.shared.store.readers().bae_profile(&record.profile_id) {
            Ok(Some(profile)) => profile,
            Ok(None) => {
                let fault = Fault::ProfileUnavailable { profile_id: record.profile_id.clone() };
                self.end_with_fault(&key, fault);
                return Err(RpcError::ProfileUnavailable);
            }
            Err(_) => return Err(RpcError::Internal),
        };
        let turn = BaeTurn {
            actor: Arc::from(key.as_str()),
            primary: profile.primary_provider,
            fallbacks: profile.fallback_providers,
            server_result_ids: server_ids,
            auto_compaction: auto_size(&record).filter(|_| self.state.auto_compaction_allowed()),
            allowance: Some(profile_allowance(&self.actor.shared.config, &record.profile_id, profile.budget)),
            ..self.turn_tools(&record, &key)
        };
        self.spawn_turn(run_id, Some(user), Box::new(turn))
    }

    /// What the acting client's turn offers the model, in BAE's order: its client tools, its
    /// sandbox tools, its subagent tools, then the session's MCP tools; the first to claim a
    /// name takes it, as BAE classifies calls. (`remote_subagent_status` is added per model
    /// call, while the session tracks a subagent.)
    fn turn_tools(&self, record: &BaeSessionRecord, key: &str) -> BaeTurn {
        let (mut tools, client_tools) = declared_tools(&record.client_tools, key);
        let (sandbox_schemas, sandbox_tools) = declared_tools(&record.sandbox_tools, key);
        tools.extend(sandbox_schemas.into_iter().filter(|t| !client_tools.contains(&t.name)));
        let subagent_tools = super::subagent::declarations(&record.subagent_tools, key);
        tools.extend(subagent_tools.iter().map(|decl| ToolSchema {
            name: decl.name.clone(),
            description: decl.description.clone().unwrap_or_default(),
            parameters: decl.input_schema.clone().filter(|s| !s.is_null()).unwrap_or_else(|| serde_json::json!({})),
            permission: None,
            category: None,
        }));
        let taken = |name: &String| {
            client_tools.contains(name)
                || sandbox_tools.contains(name)
                || name == RESERVED_TOOL
                || subagent_tools.iter().any(|decl| &decl.name == name)
        };
        tools.extend(bae(&self.actor.shared).mcp.schemas(&self.actor.id).into_iter().filter(|t| !taken(&t.name)));
        BaeTurn {
            actor: Arc::from(key),
            primary: String::new(),
            fallbacks: Vec::new(),
            tools,
            client_tools,
            sandbox_tools,
            subagent_tools,
            server_result_ids: HashSet::new(),
            auto_compaction: None,
            loop_limit: bae(&self.actor.shared).settings.loop_limit,
            allowance: None,
        }
    }

    /// Starts a client's compaction: the prompt is the call's, else the session's, else the
    /// built-in one.
    fn start_compaction(&mut self, compact: Compact, pending: Option<(PausedTurn, bool)>) -> Result<(), RpcError> {
        let Compact { key, run_id, prompt, .. } = compact;
        let prompt = prompt?;
        let record = self.open_record()?;
        let profile = match self.actor.shared.store.readers().bae_profile(&record.profile_id) {
            Ok(Some(profile)) => profile,
            Ok(None) => return Err(RpcError::ProfileUnavailable),
            Err(_) => return Err(RpcError::Internal),
        };
        let stored =
            record.compaction.as_ref().and_then(|c| c.get("prompt")).and_then(Value::as_str).map(str::to_string);
        let allowance = profile_allowance(&self.actor.shared.config, &record.profile_id, profile.budget);
        let job = CompactionJob {
            allowance,
            actor: Arc::from(key.as_str()),
            prompt: prompt.or(stored).unwrap_or_else(|| DEFAULT_PROMPT.to_string()),
            primary: profile.primary_provider,
            fallbacks: profile.fallback_providers,
            repair: pending.map(|(paused, _)| paused),
        };
        self.spawn_turn(run_id, None, Box::new(job))
    }

    /// The content that answers a paused turn, the ids the server answered, and each call's
    /// tool name; a merge that fails records `tool_result_merge_invalid` and ends the session.
    #[allow(clippy::type_complexity)]
    fn merge_resume(
        &mut self,
        key: &str,
        message: &UserMessage,
        paused: &PausedTurn,
        timed_out: bool,
    ) -> Result<(Value, HashSet<String>, HashMap<String, String>), RpcError> {
        let server: Vec<Value> = paused.server_results.iter().map(merge::result_block).collect();
        let merged = if message.role != Role::User {
            Err(merge::MergeError(format!(
                "paused tool continuation must have role \"user\", got {:?}",
                role_name(message.role)
            )))
        } else if timed_out || matches!(merge::resume_kind(&message.content), Resume::Abandon) {
            merge::abandon(&paused.expected, &server, &message.content)
        } else {
            merge::merge(&paused.expected, &server, &message.content)
        };
        match merged {
            Ok(content) => {
                let server_ids = paused.server_results.iter().map(|r| r.call_id.clone()).collect();
                let names = paused.expected.iter().cloned().zip(paused.names.iter().cloned()).collect();
                Ok((content, server_ids, names))
            }
            Err(merge::MergeError(detail)) => {
                self.end_with_fault(key, Fault::ToolResultMergeInvalid { detail: detail.clone() });
                Err(RpcError::MergeInvalid(detail))
            }
        }
    }

    /// Starts the worker, which stores the opening message first; the gate is the turn's.
    pub(crate) fn spawn_turn(
        &mut self,
        run_id: String,
        user: Option<Message>,
        plan: Box<dyn TurnPlan>,
    ) -> Result<(), RpcError> {
        let shared = &self.actor.shared;
        let slot = match shared.open_run(&plan.allowance(&shared.config, &self.actor.tenant)) {
            Ok(slot) => slot,
            Err(crate::engine::EngineError::BudgetExceeded(why)) => {
                shared.audit_budget(&self.actor.tenant, &self.actor.id, Some(&run_id), &why);
                return Err(RpcError::BudgetExceeded(why));
            }
            Err(_) => return Err(RpcError::Internal),
        };
        match self.actor.spawn_run(run_id.clone(), user, plan, slot) {
            Ok(()) => {
                self.state.gate = Gate::Running { run_id };
                Ok(())
            }
            Err(error) => {
                log::error!("session {}: cannot start a turn: {error}", self.actor.id);
                Err(RpcError::Internal)
            }
        }
    }

    /// Records a terminal fault and moves the session to `error`.
    pub(super) fn end_with_fault(&mut self, key: &str, fault: Fault) {
        let _ = self.publish_bae(key, Event::SessionFault { session_id: self.actor.id.clone(), fault });
        let end =
            BaeWrite::EndSession { id: self.actor.id.clone(), state: BaeState::Error, at: crate::time::now_rfc3339() };
        if let Err(error) = self.actor.shared.store.write(vec![WriteOp::Bae(end)]) {
            log::debug!("session {}: not moved to error: {error}", self.actor.id);
        }
    }

    /// The turn's worker ended: a paused turn keeps the gate for its owner, anything else
    /// frees it for the next waiter.
    pub(crate) fn bae_turn_ended(&mut self, run_id: &str, paused: Option<Box<PausedTurn>>) {
        if !matches!(&self.state.gate, Gate::Running { run_id: running } if running == run_id) {
            return;
        }
        self.state.gate = match paused {
            Some(turn) => Gate::Paused(Box::new(Pending {
                turn: *turn,
                deadline: Instant::now() + bae(&self.actor.shared).settings.turn_timeout,
            })),
            None => Gate::Free,
        };
        self.advance();
    }

    /// Hands the gate to waiters in arrival order while it is free. A compaction at the head
    /// of the queue never waits on a paused turn.
    pub(super) fn advance(&mut self) {
        loop {
            match &self.state.gate {
                Gate::Running { .. } => return,
                Gate::Paused(pending) => {
                    while matches!(self.state.queue.front(), Some(Waiter::Compact(_))) {
                        if let Some(compact) = self.state.queue.pop_front() {
                            compact.fail(RpcError::TurnInProgress);
                        }
                    }
                    // The owner's answer may have come while its turn was still ending.
                    let owner = pending.turn.owner.clone();
                    let Some(at) = self.state.queue.iter().position(|w| matches!(w, Waiter::Send(s) if s.key == owner))
                    else {
                        return;
                    };
                    let waiter = self.state.queue.remove(at).expect("a queued waiter");
                    let Gate::Paused(pending) = std::mem::take(&mut self.state.gate) else { return };
                    self.start(waiter, Some((pending.turn, false)));
                    continue;
                }
                Gate::Free => {}
            }
            let Some(waiter) = self.state.queue.pop_front() else { return };
            match self.open_record() {
                Ok(_) => self.start(waiter, None),
                Err(error) => waiter.fail(error),
            }
        }
    }

    pub(super) fn abandon(&mut self, run_id: &str) {
        self.state.queue.retain(|waiter| waiter.run_id() != run_id);
        if matches!(&self.state.gate, Gate::Running { run_id: running } if running == run_id) {
            if let Some(turn) = &self.actor.turn {
                turn.canceller.cancel(CancelReason::User);
            }
        }
    }
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::System => "system",
        Role::Tool => "tool",
    }
}

/// The acting client's tools of one kind (client or sandbox), as the model sees them, and
/// their names.
fn declared_tools(by_key: &serde_json::Map<String, Value>, key: &str) -> (Vec<ToolSchema>, HashSet<String>) {
    let declared = by_key.get(key).and_then(Value::as_array).cloned().unwrap_or_default();
    let tools: Vec<ToolSchema> = declared
        .iter()
        .filter_map(|tool| {
            Some(ToolSchema {
                name: tool.get("name")?.as_str()?.to_string(),
                description: tool.get("description").and_then(Value::as_str).unwrap_or_default().to_string(),
                parameters: tool
                    .get("input_schema")
                    .cloned()
                    .filter(|s| !s.is_null())
                    .unwrap_or_else(|| serde_json::json!({})),
                permission: None,
                category: None,
            })
        })
        .collect();
    let names = tools.iter().map(|tool| tool.name.clone()).collect();
    (tools, names)
}

/// The session's `auto` compaction threshold, if it has one.
fn auto_size(record: &BaeSessionRecord) -> Option<u64> {
    let compaction = record.compaction.as_ref()?;
    (compaction.get("mode")?.as_str()? == "auto").then(|| compaction.get("size")?.as_u64()).flatten()
}

/// A BAE profile's allowance: its budget over the server's `[agent.budget]`.
pub(crate) fn profile_allowance(
    config: &crate::engine::EngineConfig,
    profile_id: &str,
    budget: Option<crate::policy::Budget>,
) -> crate::engine::Allowance {
    crate::engine::Allowance::profile(profile_id, budget.unwrap_or_default().over(&config.budget))
}
