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
//! (`driver_turn_abandoned`). A compaction never waits on a paused turn. The gate's workings
//! are `gate.rs`.

use super::bae;
use std::any::Any;
use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Sender;
use serde_json::Value;

use super::gate::{Gate, Waiter};
use super::turn::PausedTurn;
use super::RESERVED_TOOL;
use crate::bus::Origin;
use crate::cancel::CancelReason;
use crate::domain::{CloseReason, Event, Role};
use crate::engine::plan::SessionDoor;
use crate::engine::session::{Op, SessionActor};
use crate::store::{BaeSessionRecord, BaeState, BaeWrite, WriteOp, BAE_TENANT};

/// Why a request's params are invalid, in BAE's words (answered `-32602`, after the checks
/// that come first in BAE's order, such as whether the caller is a driver).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidParams(pub String);

impl std::fmt::Display for InvalidParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl From<&str> for InvalidParams {
    fn from(why: &str) -> InvalidParams {
        InvalidParams(why.to_string())
    }
}

impl From<String> for InvalidParams {
    fn from(why: String) -> InvalidParams {
        InvalidParams(why)
    }
}

impl From<InvalidParams> for RpcError {
    fn from(invalid: InvalidParams) -> RpcError {
        RpcError::InvalidParams(invalid.0)
    }
}

/// A request's params, parsed by the door, or why they are invalid.
pub type Params<T> = Result<T, InvalidParams>;

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
        tools: Params<Vec<Value>>,
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
    /// `session.execRemoteSandbox`: the handle the caller runs the command with, and the
    /// token that is cancelled when the sandbox stops (the command is killed then).
    SandboxHandle {
        key: String,
        reply: Sender<Result<(crate::sandbox::Running, crate::cancel::CancelToken), RpcError>>,
    },
    /// `session.reportLocalSandbox` and `session.reportLocalSubagent`: any registered driver
    /// may report; the report is the event, or why its params are invalid (said only to a
    /// driver).
    Report {
        key: String,
        report: Params<Box<Event>>,
        reply: Sender<Result<(), RpcError>>,
    },
    /// `session.cancelSubagent`: the id, or why the params are invalid; whether it was running.
    CancelSubagent {
        key: String,
        id: Params<String>,
        reply: Sender<Result<bool, RpcError>>,
    },
    /// The caller went away: its queued request leaves the queue, its running turn stops.
    Abandon {
        run_id: String,
    },
}

/// What a BAE session's slow step reports to its actor when it is done.
pub enum BaeDone {
    /// A sandbox's image pull and start ended.
    SandboxStarted(Result<crate::sandbox::Running, crate::sandbox::DriverError>),
}

/// `session.sendMessage`: the caller's key, the turn id it will follow, and its message.
pub struct SendMessage {
    pub key: String,
    pub run_id: String,
    /// The message, or why the params are invalid.
    pub message: Params<UserMessage>,
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
    pub prompt: Params<Option<String>>,
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
    /// The profile's budget allows no new turn: why.
    BudgetExceeded(String),
    Internal,
}

/// What a turn of a BAE session asks of its session's state.
pub enum FromTurn {
    /// An `auto` compaction at the end of the turn failed: later ones back off.
    AutoCompactionFailed,
    /// A sandbox tool or a subagent launch needs the session's remote sandbox, if one runs.
    SandboxHandle { reply: Sender<Option<crate::sandbox::Running>> },
}

/// A BAE operation as the op a session's actor takes.
pub(crate) fn door_op(op: BaeOp) -> Op {
    Op::Door { state: || Box::<BaeRuntime>::default(), op: Box::new(op) }
}

/// A BAE session's state with its actor, for the length of one message to the actor.
pub(crate) struct BaeSession<'a> {
    pub actor: &'a mut SessionActor,
    pub state: &'a mut BaeRuntime,
}

impl SessionDoor for BaeRuntime {
    fn op(&mut self, actor: &mut SessionActor, op: Box<dyn Any + Send>) {
        match op.downcast::<BaeOp>() {
            Ok(op) => BaeSession { actor, state: self }.bae_op(*op),
            Err(_) => log::error!("session {}: an operation of another door", actor.id),
        }
    }

    fn turn_said(&mut self, _: &mut SessionActor, message: Box<dyn Any + Send>) {
        match message.downcast::<FromTurn>().map(|message| *message) {
            Ok(FromTurn::AutoCompactionFailed) => self.back_off_auto_compaction(),
            Ok(FromTurn::SandboxHandle { reply }) => {
                let _ = reply.send(self.sandbox.clone());
            }
            Err(_) => log::error!("a turn's message for another door"),
        }
    }

    fn turn_ended(&mut self, actor: &mut SessionActor, run_id: &str, handoff: Option<Box<dyn Any + Send>>) {
        let paused = handoff.and_then(|handoff| handoff.downcast::<PausedTurn>().ok());
        BaeSession { actor, state: self }.bae_turn_ended(run_id, paused);
    }

    fn done(&mut self, actor: &mut SessionActor, done: Box<dyn Any + Send>) {
        match done.downcast::<BaeDone>() {
            Ok(done) => BaeSession { actor, state: self }.bae_done(*done),
            Err(_) => log::error!("session {}: a slow step of another door", actor.id),
        }
    }

    fn evicted(&mut self, actor: &mut SessionActor) {
        BaeSession { actor, state: self }.bae_evicted();
    }

    fn is_idle(&self) -> bool {
        self.queue.is_empty() && !matches!(self.gate, Gate::Running { .. })
    }

    fn worth_keeping(&self) -> bool {
        !self.drivers.is_empty()
            || matches!(self.gate, Gate::Paused(_))
            || self.auto_backoff_until.is_some()
            || self.sandbox.is_some()
    }

    fn as_any(&mut self) -> &mut dyn Any {
        self
    }
}

#[derive(Default)]
pub(crate) struct BaeRuntime {
    pub(crate) drivers: BTreeSet<String>,
    pub(super) gate: Gate,
    pub(super) queue: VecDeque<Waiter>,
    /// After a failed automatic compaction, automatic ones wait until then.
    pub(crate) auto_backoff_until: Option<Instant>,
    /// The session's one remote sandbox.
    pub(crate) sandbox: Option<crate::sandbox::Running>,
    /// Cancelled when that sandbox stops (a stop, a close, this node losing the session):
    /// every `execRemoteSandbox` command in it is killed then.
    pub(crate) sandbox_execs: Option<crate::cancel::Canceller>,
    /// A sandbox start under way on a worker.
    pub(crate) starting: Option<super::sandbox::Starting>,
    /// Whether a turn paused before a restart has been looked for (`recover_pause`).
    pub(super) recovered: bool,
}

/// How long automatic compactions wait after one failed.
const AUTO_COMPACTION_BACKOFF: std::time::Duration = std::time::Duration::from_secs(300);

impl BaeRuntime {
    pub(crate) fn back_off_auto_compaction(&mut self) {
        self.auto_backoff_until = Some(Instant::now() + AUTO_COMPACTION_BACKOFF);
    }

    /// Whether an automatic compaction may run now.
    pub(super) fn auto_compaction_allowed(&mut self) -> bool {
        match self.auto_backoff_until {
            Some(until) if Instant::now() < until => false,
            _ => {
                self.auto_backoff_until = None;
                true
            }
        }
    }
}

impl BaeSession<'_> {
    pub(crate) fn bae_op(&mut self, op: BaeOp) {
        match op {
            BaeOp::RegisterDriver { key, reply } => {
                let _ = reply.send(self.register_driver(key));
            }
            BaeOp::StartSandbox { key, image, reply } => self.start_sandbox(key, image, reply),
            BaeOp::StopSandbox { key, reply } => {
                let job = match self.state.drivers.contains(&key) {
                    true => self.stop_sandbox(&key, "explicit").ok_or(RpcError::SandboxNotRunning),
                    false => Err(RpcError::NotDriver),
                };
                match job {
                    Ok(job) => self.detach(move || {
                        let _ = reply.send(job.run());
                    }),
                    Err(error) => {
                        let _ = reply.send(Err(error));
                    }
                }
            }
            BaeOp::SandboxHandle { key, reply } => {
                let _ = reply.send(self.sandbox_handle(&key));
            }
            BaeOp::Report { key, report, reply } => {
                // No state, allowlist or ownership check: a local sandbox or subagent is the
                // client's own, and the report is telemetry.
                let outcome = match (self.state.drivers.contains(&key), report) {
                    (false, _) => Err(RpcError::NotDriver),
                    (true, Err(why)) => Err(why.into()),
                    (true, Ok(event)) => self.publish_bae(&key, *event),
                };
                let _ = reply.send(outcome);
            }
            BaeOp::CancelSubagent { key, id, reply } => {
                let _ = reply.send(self.cancel_subagent(&key, id));
            }
            BaeOp::Drivers { reply } => {
                let _ = reply.send(self.state.drivers.iter().cloned().collect());
            }
            BaeOp::Send(send) => self.arrive(Waiter::Send(send)),
            BaeOp::Compact(compact) => self.arrive(Waiter::Compact(compact)),
            BaeOp::UpdateTools { key, tools, reply } => {
                let _ = reply.send(self.update_tools(&key, tools));
            }
            BaeOp::Close { reason, actor, reply } => self.close_bae(reason, &actor, move |closed| {
                let _ = reply.send(closed);
            }),
            BaeOp::Revoked { key, reply } => self.revoked(&key, move || {
                let _ = reply.send(());
            }),
            BaeOp::Abandon { run_id } => self.abandon(&run_id),
        }
    }

    pub(crate) fn bae_done(&mut self, done: BaeDone) {
        match done {
            BaeDone::SandboxStarted(started) => self.sandbox_started(started),
        }
    }

    fn bae_record(&self) -> Result<BaeSessionRecord, RpcError> {
        match self.actor.shared.store.readers().bae_session(&self.actor.id) {
            Ok(Some(record)) => Ok(record),
            Ok(None) => Err(RpcError::Gone),
            Err(error) => {
                log::error!("session {}: {error}", self.actor.id);
                Err(RpcError::Internal)
            }
        }
    }

    pub(super) fn open_record(&self) -> Result<BaeSessionRecord, RpcError> {
        let record = self.bae_record()?;
        match record.state {
            BaeState::Open => Ok(record),
            state => Err(RpcError::NotOpen(state)),
        }
    }

    /// Publishes a BAE event attributed to `actor`, and waits for it to be durable.
    pub(crate) fn publish_bae(&self, actor: &str, event: Event) -> Result<(), RpcError> {
        self.publish_for_turn(actor, None, event)
    }

    /// `publish_bae` for an event that opens a turn (`turn` is its run id).
    pub(super) fn publish_for_turn(&self, actor: &str, turn: Option<&str>, event: Event) -> Result<(), RpcError> {
        let origin = Origin { actor: Some(Arc::from(actor)), turn: turn.map(Arc::from) };
        match self.actor.shared.bus.publish_durable(Some(Arc::from(BAE_TENANT)), origin, event) {
            Some(_) => Ok(()),
            None => Err(RpcError::Internal),
        }
    }

    /// The first registration of a key is recorded, then the status of the profile's
    /// sandbox images when it declares any.
    fn register_driver(&mut self, key: String) -> Result<(), RpcError> {
        let record = self.open_record()?;
        if self.state.drivers.insert(key.clone()) {
            self.publish_bae(&key, Event::DriverRegistered { session_id: self.actor.id.clone() })?;
            if let Some(images) = self.images_event(&record.profile_id) {
                self.publish_bae(&key, images)?;
            }
        }
        Ok(())
    }

    fn update_tools(&mut self, key: &str, tools: Params<Vec<Value>>) -> Result<(), RpcError> {
        if !self.state.drivers.contains(key) {
            return Err(RpcError::NotDriver);
        }
        let record = self.open_record()?;
        let tools = tools?;
        let profile = match self.actor.shared.store.readers().bae_profile(&record.profile_id) {
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
            session_id: self.actor.id.clone(),
            key_id: key.to_string(),
            tools: Value::Array(tools),
        };
        self.actor.shared.store.write(vec![WriteOp::Bae(write)]).map_err(|_| RpcError::Internal)
    }

    /// Closes an open session; whatever its state, its drivers, gate and waiters go at once,
    /// and a sandbox start under way is cancelled. Its MCP connections and its sandbox are
    /// closed on a worker, which then calls `then` with the outcome: the error is the state
    /// the session was already in.
    fn close_bae(
        &mut self,
        reason: CloseReason,
        actor: &str,
        then: impl FnOnce(Result<(), BaeState>) + Send + 'static,
    ) {
        let state = self.bae_record().map(|r| r.state).unwrap_or(BaeState::Closed);
        let outcome = match state {
            BaeState::Open => {
                let end = BaeWrite::EndSession {
                    id: self.actor.id.clone(),
                    state: BaeState::Closed,
                    at: crate::time::now_rfc3339(),
                };
                if let Err(error) = self.actor.shared.store.write(vec![WriteOp::Bae(end)]) {
                    log::error!("session {}: could not close: {error}", self.actor.id);
                }
                let _ = self.publish_bae(actor, Event::SessionClosed { session_id: self.actor.id.clone(), reason });
                Ok(())
            }
            state => Err(state),
        };
        self.state.drivers.clear();
        if let Some(turn) = &self.actor.turn {
            turn.canceller.cancel(CancelReason::User);
        }
        self.cancel_subagents_at_close();
        self.cancel_sandbox_start(actor);
        let stop = self.stop_sandbox(actor, "session_close");
        let (shared, id) = (Arc::clone(&self.actor.shared), self.actor.id.clone());
        self.detach(move || {
            bae(&shared).mcp.disconnect(&id);
            if let Some(Err(error)) = stop.map(super::sandbox::StopJob::run) {
                log::warn!("session {id}: its sandbox did not stop cleanly: {error:?}");
            }
            then(outcome);
        });
        self.state.gate = Gate::Free;
        for waiter in std::mem::take(&mut self.state.queue) {
            waiter.fail(RpcError::NotOpen(BaeState::Closed));
        }
    }

    /// Another node holds the session now (`SessionDoor::evicted`): what this node had of it
    /// goes, and nothing is written or announced, since this node may no longer write the
    /// session (the new owner records what it takes over). Drivers register again at the new
    /// owner, as after a restart; requests waiting for the gate are refused.
    fn bae_evicted(&mut self) {
        self.state.drivers.clear();
        if let Some(turn) = &self.actor.turn {
            turn.canceller.cancel(CancelReason::Shutdown);
        }
        bae(&self.actor.shared).subagents.close(&self.actor.id);
        self.drop_sandbox_here();
        self.state.gate = Gate::Free;
        for waiter in std::mem::take(&mut self.state.queue) {
            waiter.fail(RpcError::Internal);
        }
    }

    /// Runs `job` on a `kestrel-slow` worker with nothing to report back to the actor. If no
    /// worker can start, the job is dropped, and with it the reply it would have sent: the
    /// caller hears an internal error.
    fn detach(&self, job: impl FnOnce() + Send + 'static) {
        if let Err(error) = crate::workers::SLOW.spawn(job) {
            log::error!("session {}: no worker for a slow step ({error})", self.actor.id);
        }
    }

    fn revoked(&mut self, key: &str, then: impl FnOnce() + Send + 'static) {
        let open = matches!(self.bae_record(), Ok(record) if record.state == BaeState::Open);
        let keys_left = self.actor.shared.store.readers().bae_session_key_count(&self.actor.id).unwrap_or(1);
        match open && keys_left == 0 {
            true => self.close_bae(CloseReason::ClientKeyRevoked, key, move |_| then()),
            false => then(),
        }
    }
}
