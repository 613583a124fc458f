//! What a session actor keeps for a BAE session, and the operations it answers: drivers, the
//! turn gate with its FIFO of waiting requests, and a turn paused for a client's tools.
//!
//! All of it is state of the session's actor (`session.rs`), changed only on its thread. An
//! idle session keeps it in the registry with no thread (`Slot::Dormant`). It is process
//! memory, as in BAE: after a restart, drivers register again.
//!
//! The gate: one turn (or compaction) at a time. A request that finds the gate taken waits in
//! arrival order. A paused turn keeps the gate for its owner, who may continue at any time;
//! once its deadline has passed, the next request to arrive reclaims it
//! (`driver_turn_abandoned`). A compaction never waits on a paused turn.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Sender;
use serde_json::Value;

use super::compaction::{CompactionJob, DEFAULT_PROMPT};
use super::merge::{self, Resume};
use super::turn::{BaeTurn, PausedTurn};
use super::RESERVED_TOOL;
use crate::bus::Origin;
use crate::cancel::{CancelReason, Canceller};
use crate::domain::{CloseReason, Event, Fault, Message, Role, ToolSchema};
use crate::engine::run::{self, Plan};
use crate::engine::session::{ActiveTurn, SessionActor};
use crate::store::{BaeSessionRecord, BaeState, BaeWrite, WriteOp, BAE_TENANT};

/// What the BAE door asks of a session's actor.
pub enum BaeOp {
    RegisterDriver {
        key: String,
        reply: Sender<Result<(), RpcError>>,
    },
    /// The registered drivers, sorted.
    Drivers {
        reply: Sender<Vec<String>>,
    },
    Send(Box<SendMessage>),
    Compact(Box<Compact>),
    /// `session.updateClientTools`: `tools` is the parsed array, or why it is invalid.
    UpdateTools {
        key: String,
        tools: Result<Vec<Value>, String>,
        reply: Sender<Result<(), RpcError>>,
    },
    /// Close an open session; the error is the state it was already in.
    Close {
        reason: CloseReason,
        actor: String,
        reply: Sender<Result<(), BaeState>>,
    },
    /// A client key was revoked: close the session if no session key is left.
    Revoked {
        key: String,
        reply: Sender<()>,
    },
    /// `session.startRemoteSandbox`: the sandbox and its `started_at`.
    StartSandbox {
        key: String,
        image: String,
        reply: Sender<Result<(crate::sandbox::Running, String), RpcError>>,
    },
    /// `session.stopRemoteSandbox`.
    StopSandbox {
        key: String,
        reply: Sender<Result<crate::sandbox::Running, RpcError>>,
    },
    /// `session.execRemoteSandbox`: the handle the caller runs the command with.
    SandboxHandle {
        key: String,
        reply: Sender<Result<crate::sandbox::Running, RpcError>>,
    },
    /// `session.reportLocalSandbox` and `session.reportLocalSubagent`: any registered driver
    /// may report; the report is the event, or why its params are invalid (said only to a
    /// driver).
    Report {
        key: String,
        report: Result<Box<Event>, String>,
        reply: Sender<Result<(), RpcError>>,
    },
    /// `session.cancelSubagent`: the id, or why the params are invalid; whether it was running.
    CancelSubagent {
        key: String,
        id: Result<String, String>,
        reply: Sender<Result<bool, RpcError>>,
    },
    /// The caller went away: its queued request leaves the queue, its running turn stops.
    Abandon {
        run_id: String,
    },
}

/// `session.sendMessage`: the caller's key, the turn id it will follow, and its message.
pub struct SendMessage {
    pub key: String,
    pub run_id: String,
    /// The message, or why the params are invalid.
    pub message: Result<UserMessage, String>,
    /// Answered once the turn holds the gate and has started (or why it cannot).
    pub reply: Sender<Result<Started, RpcError>>,
}

pub struct UserMessage {
    pub role: Role,
    /// As sent: a string or content blocks.
    pub content: Value,
}

/// `session.compact`.
pub struct Compact {
    pub key: String,
    pub run_id: String,
    /// The prompt param, or why it is invalid.
    pub prompt: Result<Option<String>, String>,
    pub reply: Sender<Result<Started, RpcError>>,
}

/// The request holds the gate and its work has started as turn `run_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Started;

/// Why an RPC operation was refused; `api/bae/rpc.rs` gives each its code and text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RpcError {
    NotDriver,
    NotOpen(BaeState),
    /// The session no longer exists.
    Gone,
    InvalidParams(String),
    MergeInvalid(String),
    /// Tool results with no paused turn waiting for them.
    NoPausedTurn,
    ProfileUnavailable,
    /// A compaction found the gate held by a paused turn.
    TurnInProgress,
    SandboxImageNotAllowed(String),
    SandboxStartFailed(String),
    SandboxNotRunning,
    SandboxAlreadyRunning,
    SandboxStopFailed(String),
    SandboxExecFailed(String),
    SubagentNotFound(String),
    ToolNotAllowed(String),
    Internal,
}

/// A request waiting for the gate.
enum Waiter {
    Send(Box<SendMessage>),
    Compact(Box<Compact>),
}

impl Waiter {
    fn run_id(&self) -> &str {
        match self {
            Waiter::Send(send) => &send.run_id,
            Waiter::Compact(compact) => &compact.run_id,
        }
    }

    fn fail(self, error: RpcError) {
        let _ = match self {
            Waiter::Send(send) => send.reply.send(Err(error)),
            Waiter::Compact(compact) => compact.reply.send(Err(error)),
        };
    }
}

#[derive(Default)]
enum Gate {
    #[default]
    Free,
    Running {
        run_id: String,
    },
    Paused(Box<Pending>),
}

struct Pending {
    turn: PausedTurn,
    deadline: Instant,
}

#[derive(Default)]
pub(in crate::engine) struct BaeRuntime {
    pub(in crate::engine) drivers: BTreeSet<String>,
    gate: Gate,
    queue: VecDeque<Waiter>,
    /// After a failed automatic compaction, automatic ones wait until then.
    pub(in crate::engine) auto_backoff_until: Option<Instant>,
    /// The session's one remote sandbox.
    pub(in crate::engine) sandbox: Option<crate::sandbox::Running>,
    /// Whether a turn paused before a restart has been looked for (`recover_pause`).
    recovered: bool,
}

/// How long automatic compactions wait after one failed.
const AUTO_COMPACTION_BACKOFF: std::time::Duration = std::time::Duration::from_secs(300);

impl BaeRuntime {
    pub(in crate::engine) fn back_off_auto_compaction(&mut self) {
        self.auto_backoff_until = Some(Instant::now() + AUTO_COMPACTION_BACKOFF);
    }

    /// Whether an automatic compaction may run now.
    fn auto_compaction_allowed(&mut self) -> bool {
        match self.auto_backoff_until {
            Some(until) if Instant::now() < until => false,
            _ => {
                self.auto_backoff_until = None;
                true
            }
        }
    }

    /// Whether anything must outlive the actor's thread.
    pub(in crate::engine) fn worth_keeping(&self) -> bool {
        !self.drivers.is_empty()
            || matches!(self.gate, Gate::Paused(_))
            || self.auto_backoff_until.is_some()
            || self.sandbox.is_some()
    }

    /// Nothing is waiting on the actor (a paused turn waits on its client, not the actor).
    pub(in crate::engine) fn is_idle(&self) -> bool {
        self.queue.is_empty() && !matches!(self.gate, Gate::Running { .. })
    }
}

impl SessionActor {
    pub(in crate::engine) fn bae_op(&mut self, op: BaeOp) {
        match op {
            BaeOp::RegisterDriver { key, reply } => {
                let _ = reply.send(self.register_driver(key));
            }
            BaeOp::StartSandbox { key, image, reply } => {
                let _ = reply.send(self.start_sandbox(&key, &image));
            }
            BaeOp::StopSandbox { key, reply } => {
                let outcome = match self.bae.drivers.contains(&key) {
                    true => self.stop_sandbox(&key, "explicit"),
                    false => Err(RpcError::NotDriver),
                };
                let _ = reply.send(outcome);
            }
            BaeOp::SandboxHandle { key, reply } => {
                let _ = reply.send(self.sandbox_handle(&key));
            }
            BaeOp::Report { key, report, reply } => {
                // No state, allowlist or ownership check: a local sandbox or subagent is the
                // client's own, and the report is telemetry.
                let outcome = match (self.bae.drivers.contains(&key), report) {
                    (false, _) => Err(RpcError::NotDriver),
                    (true, Err(why)) => Err(RpcError::InvalidParams(why)),
                    (true, Ok(event)) => self.publish_bae(&key, *event),
                };
                let _ = reply.send(outcome);
            }
            BaeOp::CancelSubagent { key, id, reply } => {
                let _ = reply.send(self.cancel_subagent(&key, id));
            }
            BaeOp::Drivers { reply } => {
                let _ = reply.send(self.bae.drivers.iter().cloned().collect());
            }
            BaeOp::Send(send) => self.arrive(Waiter::Send(send)),
            BaeOp::Compact(compact) => self.arrive(Waiter::Compact(compact)),
            BaeOp::UpdateTools { key, tools, reply } => {
                let _ = reply.send(self.update_tools(&key, tools));
            }
            BaeOp::Close { reason, actor, reply } => {
                let _ = reply.send(self.close_bae(reason, &actor));
            }
            BaeOp::Revoked { key, reply } => {
                self.revoked(&key);
                let _ = reply.send(());
            }
            BaeOp::Abandon { run_id } => self.abandon(&run_id),
        }
    }

    fn bae_record(&self) -> Result<BaeSessionRecord, RpcError> {
        match self.shared.store.readers().bae_session(&self.id) {
            Ok(Some(record)) => Ok(record),
            Ok(None) => Err(RpcError::Gone),
            Err(error) => {
                log::error!("session {}: {error}", self.id);
                Err(RpcError::Internal)
            }
        }
    }

    fn open_record(&self) -> Result<BaeSessionRecord, RpcError> {
        let record = self.bae_record()?;
        match record.state {
            BaeState::Open => Ok(record),
            state => Err(RpcError::NotOpen(state)),
        }
    }

    /// Publishes a BAE event attributed to `actor`, and waits for it to be durable.
    pub(in crate::engine) fn publish_bae(&self, actor: &str, event: Event) -> Result<(), RpcError> {
        self.publish_for_turn(actor, None, event)
    }

    /// `publish_bae` for an event that opens a turn (`turn` is its run id).
    fn publish_for_turn(&self, actor: &str, turn: Option<&str>, event: Event) -> Result<(), RpcError> {
        let origin = Origin { actor: Some(Arc::from(actor)), turn: turn.map(Arc::from) };
        match self.shared.bus.publish_durable(Some(Arc::from(BAE_TENANT)), origin, event) {
            Some(_) => Ok(()),
            None => Err(RpcError::Internal),
        }
    }

    /// The first registration of a key is recorded, then the status of the profile's
    /// sandbox images when it declares any.
    fn register_driver(&mut self, key: String) -> Result<(), RpcError> {
        let record = self.open_record()?;
        if self.bae.drivers.insert(key.clone()) {
            self.publish_bae(&key, Event::DriverRegistered { session_id: self.id.clone() })?;
            if let Some(images) = self.images_event(&record.profile_id) {
                self.publish_bae(&key, images)?;
            }
        }
        Ok(())
    }

    /// A send or compact arrives: the driver, state and params checks, then the gate.
    fn arrive(&mut self, waiter: Waiter) {
        let (key, params_error) = match &waiter {
            Waiter::Send(send) => (send.key.clone(), send.message.as_ref().err().cloned()),
            Waiter::Compact(compact) => (compact.key.clone(), compact.prompt.as_ref().err().cloned()),
        };
        if !self.bae.drivers.contains(&key) {
            return waiter.fail(RpcError::NotDriver);
        }
        if let Err(error) = self.open_record() {
            return waiter.fail(error);
        }
        if let Some(why) = params_error {
            return waiter.fail(RpcError::InvalidParams(why));
        }
        if !self.bae.recovered {
            self.recover_pause();
        }
        let now = Instant::now();
        match std::mem::take(&mut self.bae.gate) {
            Gate::Paused(pending) if pending.turn.owner == key && matches!(waiter, Waiter::Send(_)) => {
                self.start(waiter, Some((pending.turn, false)))
            }
            Gate::Paused(pending) if now > pending.deadline => {
                let owner = pending.turn.owner.clone();
                let fault = Fault::DriverTurnAbandoned { owner_client_key_id: owner.clone() };
                // Tagged with the reclaiming turn: a compaction shows it; a send leaves it out.
                let event = Event::SessionFault { session_id: self.id.clone(), fault };
                if self.publish_for_turn(&owner, Some(waiter.run_id()), event).is_err() {
                    log::error!("session {}: driver_turn_abandoned could not be recorded", self.id);
                }
                self.start(waiter, Some((pending.turn, true)))
            }
            Gate::Paused(pending) if matches!(waiter, Waiter::Compact(_)) => {
                self.bae.gate = Gate::Paused(pending);
                waiter.fail(RpcError::TurnInProgress)
            }
            Gate::Free if self.bae.queue.is_empty() => self.start(waiter, None),
            gate => {
                self.bae.gate = gate;
                self.bae.queue.push_back(waiter);
            }
        }
    }

    /// The first request of a process for this session: a turn that was paused for its
    /// client's tools when the server stopped is paused again, for the same owner, with a new
    /// deadline, so the client can still answer it once it has registered again.
    fn recover_pause(&mut self) {
        self.bae.recovered = true;
        if !matches!(self.bae.gate, Gate::Free) {
            return;
        }
        let readers = self.shared.store.readers();
        let found = readers.messages(&self.id).and_then(|messages| {
            let Some(last) = messages.last().filter(|m| m.role == Role::Assistant) else { return Ok(None) };
            let owner = readers.bae_last_actor(&self.id, "message.completed")?.unwrap_or_default();
            Ok(PausedTurn::of_answer(last, owner))
        });
        match found {
            Ok(Some(turn)) => {
                log::info!("session {}: the turn paused before the restart waits for {} again", self.id, turn.owner);
                let deadline = Instant::now() + self.shared.config.bae.turn_timeout;
                self.bae.gate = Gate::Paused(Box::new(Pending { turn, deadline }));
            }
            Ok(None) => {}
            Err(error) => log::error!("session {}: a paused turn could not be looked for: {error}", self.id),
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
        let message = message.map_err(RpcError::InvalidParams)?;
        let record = self.open_record()?;
        let (content, server_ids, names) = match pending {
            Some((paused, timed_out)) => self.merge_resume(&key, &message, &paused, timed_out)?,
            None if merge::has_tool_results(&message.content) => return Err(RpcError::NoPausedTurn),
            None => (message.content, HashSet::new(), HashMap::new()),
        };
        let user = merge::to_message(message.role, &content, &names).map_err(RpcError::InvalidParams)?;
        let profile = match self.shared.store.readers().bae_profile(&record.profile_id) {
            Ok(Some(profile)) => profile,
            Ok(None) => {
                let fault = Fault::ProfileUnavailable { profile_id: record.profile_id.clone() };
                self.end_with_fault(&key, fault);
                return Err(RpcError::ProfileUnavailable);
            }
            Err(_) => return Err(RpcError::Internal),
        };
        let (mut tools, client_tools) = declared_tools(&record.client_tools, &key);
        // The acting client's sandbox tools, then the session's MCP tools; the first to claim
        // a name takes it (client, sandbox, MCP), as BAE classifies calls.
        let (sandbox_schemas, sandbox_tools) = declared_tools(&record.sandbox_tools, &key);
        tools.extend(sandbox_schemas.into_iter().filter(|t| !client_tools.contains(&t.name)));
        let subagent_tools = super::subagent::declarations(&record.subagent_tools, &key);
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
        tools.extend(self.shared.mcp.schemas(&self.id).into_iter().filter(|t| !taken(&t.name)));
        let turn = BaeTurn {
            actor: Arc::from(key.as_str()),
            primary: profile.primary_provider,
            fallbacks: profile.fallback_providers,
            tools,
            client_tools,
            sandbox_tools,
            subagent_tools,
            server_result_ids: server_ids,
            auto_compaction: auto_size(&record).filter(|_| self.bae.auto_compaction_allowed()),
        };
        self.spawn_turn(run_id, Some(user), Plan::Bae(Box::new(turn)))
    }

    /// Starts a client's compaction: the prompt is the call's, else the session's, else the
    /// built-in one.
    fn start_compaction(&mut self, compact: Compact, pending: Option<(PausedTurn, bool)>) -> Result<(), RpcError> {
        let Compact { key, run_id, prompt, .. } = compact;
        let prompt = prompt.map_err(RpcError::InvalidParams)?;
        let record = self.open_record()?;
        let profile = match self.shared.store.readers().bae_profile(&record.profile_id) {
            Ok(Some(profile)) => profile,
            Ok(None) => return Err(RpcError::ProfileUnavailable),
            Err(_) => return Err(RpcError::Internal),
        };
        let stored =
            record.compaction.as_ref().and_then(|c| c.get("prompt")).and_then(Value::as_str).map(str::to_string);
        let job = CompactionJob {
            actor: Arc::from(key.as_str()),
            prompt: prompt.or(stored).unwrap_or_else(|| DEFAULT_PROMPT.to_string()),
            primary: profile.primary_provider,
            fallbacks: profile.fallback_providers,
            repair: pending.map(|(paused, _)| paused),
        };
        self.spawn_turn(run_id, None, Plan::Compaction(Box::new(job)))
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
    pub(in crate::engine) fn spawn_turn(
        &mut self,
        run_id: String,
        user: Option<Message>,
        plan: Plan,
    ) -> Result<(), RpcError> {
        let canceller = Canceller::new();
        let run = run::Run {
            shared: Arc::clone(&self.shared),
            tenant: Arc::clone(&self.tenant),
            session_id: self.id.clone(),
            run_id: run_id.clone(),
            cancel: canceller.token(),
            user,
            session: self.own_tx.clone(),
            plan,
            pending: Default::default(),
            held: Default::default(),
            checkpointed: Default::default(),
        };
        match (self.shared.spawn_run)(run) {
            Ok(()) => {
                self.turn = Some(ActiveTurn { run_id: run_id.clone(), canceller });
                self.shared.sessions.turns.fetch_add(1, Ordering::Relaxed);
                self.bae.gate = Gate::Running { run_id };
                Ok(())
            }
            Err(error) => {
                log::error!("session {}: cannot start a turn: {error}", self.id);
                Err(RpcError::Internal)
            }
        }
    }

    /// Records a terminal fault and moves the session to `error`.
    fn end_with_fault(&mut self, key: &str, fault: Fault) {
        let _ = self.publish_bae(key, Event::SessionFault { session_id: self.id.clone(), fault });
        let end = BaeWrite::EndSession { id: self.id.clone(), state: BaeState::Error, at: crate::time::now_rfc3339() };
        if let Err(error) = self.shared.store.write(vec![WriteOp::Bae(end)]) {
            log::debug!("session {}: not moved to error: {error}", self.id);
        }
    }

    /// The turn's worker ended: a paused turn keeps the gate for its owner, anything else
    /// frees it for the next waiter.
    pub(in crate::engine) fn bae_turn_ended(&mut self, run_id: &str, paused: Option<Box<PausedTurn>>) {
        if !matches!(&self.bae.gate, Gate::Running { run_id: running } if running == run_id) {
            return;
        }
        self.bae.gate = match paused {
            Some(turn) => Gate::Paused(Box::new(Pending {
                turn: *turn,
                deadline: Instant::now() + self.shared.config.bae.turn_timeout,
            })),
            None => Gate::Free,
        };
        self.advance();
    }

    /// Hands the gate to waiters in arrival order while it is free. A compaction at the head
    /// of the queue never waits on a paused turn.
    fn advance(&mut self) {
        loop {
            match &self.bae.gate {
                Gate::Running { .. } => return,
                Gate::Paused(pending) => {
                    while matches!(self.bae.queue.front(), Some(Waiter::Compact(_))) {
                        if let Some(compact) = self.bae.queue.pop_front() {
                            compact.fail(RpcError::TurnInProgress);
                        }
                    }
                    // The owner's answer may have come while its turn was still ending.
                    let owner = pending.turn.owner.clone();
                    let Some(at) = self.bae.queue.iter().position(|w| matches!(w, Waiter::Send(s) if s.key == owner))
                    else {
                        return;
                    };
                    let waiter = self.bae.queue.remove(at).expect("a queued waiter");
                    let Gate::Paused(pending) = std::mem::take(&mut self.bae.gate) else { return };
                    self.start(waiter, Some((pending.turn, false)));
                    continue;
                }
                Gate::Free => {}
            }
            let Some(waiter) = self.bae.queue.pop_front() else { return };
            match self.open_record() {
                Ok(_) => self.start(waiter, None),
                Err(error) => waiter.fail(error),
            }
        }
    }

    fn update_tools(&mut self, key: &str, tools: Result<Vec<Value>, String>) -> Result<(), RpcError> {
        if !self.bae.drivers.contains(key) {
            return Err(RpcError::NotDriver);
        }
        let record = self.open_record()?;
        let tools = tools.map_err(RpcError::InvalidParams)?;
        let profile = match self.shared.store.readers().bae_profile(&record.profile_id) {
            Ok(Some(profile)) => profile,
            _ => return Err(RpcError::Internal),
        };
        let names: Vec<&str> = tools.iter().filter_map(|t| t.get("name").and_then(Value::as_str)).collect();
        if names.contains(&RESERVED_TOOL) {
            return Err(RpcError::ToolNotAllowed(RESERVED_TOOL.into()));
        }
        if let Some(denied) = names.iter().find(|name| !profile.allows(name)) {
            return Err(RpcError::ToolNotAllowed(denied.to_string()));
        }
        let write = BaeWrite::ReplaceClientTools {
            session_id: self.id.clone(),
            key_id: key.to_string(),
            tools: Value::Array(tools),
        };
        self.shared.store.write(vec![WriteOp::Bae(write)]).map_err(|_| RpcError::Internal)
    }

    /// Closes an open session; whatever its state, its drivers, gate and waiters go.
    fn close_bae(&mut self, reason: CloseReason, actor: &str) -> Result<(), BaeState> {
        let state = self.bae_record().map(|r| r.state).unwrap_or(BaeState::Closed);
        let outcome = match state {
            BaeState::Open => {
                let end = BaeWrite::EndSession {
                    id: self.id.clone(),
                    state: BaeState::Closed,
                    at: crate::time::now_rfc3339(),
                };
                if let Err(error) = self.shared.store.write(vec![WriteOp::Bae(end)]) {
                    log::error!("session {}: could not close: {error}", self.id);
                }
                let _ = self.publish_bae(actor, Event::SessionClosed { session_id: self.id.clone(), reason });
                Ok(())
            }
            state => Err(state),
        };
        self.bae.drivers.clear();
        if let Some(turn) = &self.turn {
            turn.canceller.cancel(CancelReason::User);
        }
        self.shared.mcp.disconnect(&self.id);
        self.cancel_subagents_at_close();
        if self.bae.sandbox.is_some() {
            let creator = actor.to_string();
            if let Err(error) = self.stop_sandbox(&creator, "session_close") {
                log::warn!("session {}: its sandbox did not stop cleanly: {error:?}", self.id);
            }
        }
        self.bae.gate = Gate::Free;
        for waiter in std::mem::take(&mut self.bae.queue) {
            waiter.fail(RpcError::NotOpen(BaeState::Closed));
        }
        outcome
    }

    fn revoked(&mut self, key: &str) {
        let open = matches!(self.bae_record(), Ok(record) if record.state == BaeState::Open);
        let keys_left = self.shared.store.readers().bae_session_key_count(&self.id).unwrap_or(1);
        if open && keys_left == 0 {
            let _ = self.close_bae(CloseReason::ClientKeyRevoked, key);
        }
    }

    fn abandon(&mut self, run_id: &str) {
        self.bae.queue.retain(|waiter| waiter.run_id() != run_id);
        if matches!(&self.bae.gate, Gate::Running { run_id: running } if running == run_id) {
            if let Some(turn) = &self.turn {
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
