//! The session actor: one `kestrel-session` thread per live session, owning everything about
//! it that changes while it runs.
//!
//! A session is live while it has a turn running or operations queued; an idle session has no
//! thread. Requests reach the actor as one closed enum of operations (`Op`), each with its
//! reply channel; the turn's worker (`run.rs`, on its own `kestrel-run` thread) reports to the
//! actor on the same inbox (`TurnMsg`): the approvals it waits on and, as its very last step,
//! how the turn ended. The actor owns the active turn (so it alone decides `session_busy`), the
//! pending approvals, a delete waiting for the turn to stop, and what a BAE session keeps (its
//! drivers, its turn gate and queue, a paused turn, its sandbox). Slow steps (a checkpoint's
//! walk, a sandbox start) run on `kestrel-slow` workers that report back (`Done`), so the
//! actor blocks only on its inbox and on the store.
//!
//! The registry (`registry.rs`) maps session id → the actor's inbox.

use std::any::Any;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crossbeam_channel::{bounded, Receiver, Sender};

use super::calls::Decision;
use super::idempotency::{Created, Idempotent};
use super::plan::{SessionDoor, TurnPlan};
use super::{run, EngineError, Shared};
use crate::cancel::{CancelReason, Canceller};
use crate::domain::{new_id, Event, Message, SessionRecord, SessionStatus};
use crate::store::{CheckpointRecord, SessionPatch, StoreError, TurnClaim, WriteOp};

/// What a front door can ask of a session.
pub(crate) enum Op {
    /// Store the message and start a turn; `session_busy` while one runs.
    Send {
        message: Box<Message>,
        idempotent: Option<Box<Idempotent>>,
        plan: Box<dyn TurnPlan>,
        reply: Sender<Result<String, EngineError>>,
    },
    /// Continue an `interrupted` or `error` session with `plan`.
    Resume { plan: Box<dyn TurnPlan>, reply: Sender<Result<String, EngineError>> },
    /// Cancel the running turn; answers whether this call cancelled one.
    Cancel { reply: Sender<bool> },
    /// Answer an approval the turn waits on.
    Decide { approval_id: String, decision: Box<Decision>, reply: Sender<Result<(), EngineError>> },
    /// A change that must not happen under a running turn (a new workspace).
    Patch { patch: SessionPatch, reply: Sender<Result<(), EngineError>> },
    /// Cancel the turn if there is one, then delete the session.
    Delete { reply: Sender<Result<(), EngineError>> },
    /// The server is stopping: cancel the turn, to be stored as `interrupted`.
    Shutdown,
    /// Another node holds the lease now: stop the turn, let the door's state go.
    Evict,
    /// One of a door's own operations, for its state on this session (`SessionDoor::op`);
    /// `state` makes that state when the session has none yet.
    Door { state: fn() -> Box<dyn SessionDoor>, op: Box<dyn Any + Send> },
    /// Take a manual checkpoint of the workspace.
    Checkpoint { label: Option<String>, reply: Sender<Result<CheckpointRecord, EngineError>> },
    /// Drop a user message and its successors, maybe restoring files; `session_busy` while a
    /// turn runs.
    Rewind { message_id: String, restore_files: bool, reply: Sender<Result<super::checkpoints::Rewound, EngineError>> },
    /// Put a checkpoint back; `session_busy` while a turn runs.
    Restore { checkpoint: String, reply: Sender<Result<crate::checkpoints::Restored, EngineError>> },
}

/// What a turn's worker tells its session.
pub(crate) enum TurnMsg {
    /// The turn waits for a person; a `Decide` for this id goes to `decision`.
    Awaiting { approval_id: String, decision: Sender<Decision> },
    /// The approval was answered or the wait ended.
    Closed { approval_id: String },
    /// For the session's door (`SessionDoor::turn_said`).
    Door(Box<dyn Any + Send>),
    /// The worker's last word: the turn is over and the session free. A turn paused for its
    /// client hands its door what resuming it takes.
    Ended { run_id: String, outcome: TurnOutcome, handoff: Option<Box<dyn Any + Send>> },
}

/// How a turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TurnOutcome {
    Completed,
    /// It waits for a client's tool results (BAE).
    Paused,
    MaxSteps,
    /// A person cancelled it.
    Cancelled,
    /// The server stopped it; the session is `interrupted`, to be resumed.
    Interrupted,
    Failed,
}

pub(crate) use super::registry::Registry;

pub(crate) enum SessionMsg {
    Op(Op),
    Turn(TurnMsg),
    /// A slow step ran on a worker (`SessionActor::off_actor`) and is done.
    Done(Done),
}

/// What a worker reports back to its session's actor.
pub(crate) enum Done {
    /// A checkpoint, restore or rewind finished; `answer` tells its caller once the actor
    /// no longer counts the step (the caller's next request never finds it busy with it).
    Files { changed: bool, answer: super::answer::Answer },
    /// A door's slow step (`SessionDoor::done`).
    Door(Box<dyn Any + Send>),
    /// The step panicked (logged where it happened); its caller heard an internal error.
    Panicked,
}

/// A turn running on its worker.
pub(crate) struct ActiveTurn {
    pub(crate) run_id: String,
    pub(crate) canceller: Canceller,
    /// Counts the run against its scope's runs at once until the turn ends.
    _slot: super::RunSlot,
}

pub struct SessionActor {
    pub(crate) shared: Arc<Shared>,
    pub(crate) id: String,
    pub(crate) tenant: Arc<str>,
    inbox: Receiver<SessionMsg>,
    /// Handed to each turn's worker.
    pub(crate) own_tx: Sender<SessionMsg>,
    pub(crate) turn: Option<ActiveTurn>,
    approvals: HashMap<String, Sender<Decision>>,
    /// Deletes waiting for the turn to stop: the first deletes, the others find it gone.
    deleting: Vec<Sender<Result<(), EngineError>>>,
    deleted: bool,
    /// Slow steps under way on workers; the actor stays until each has reported.
    working: usize,
    /// Of those, restores and rewinds: no turn starts and no delete happens meanwhile.
    pub(super) changing_files: usize,
    /// What the session's door keeps here (a BAE session's drivers, gate, paused turn).
    pub(super) door: Option<Box<dyn SessionDoor>>,
    /// Told to stop because another node holds the lease (`Op::Evict`).
    evicted: bool,
    /// Turns asked for once the running one had stored its end: started when it has ended.
    after_turn: Vec<Op>,
}

impl SessionActor {
    pub(super) fn new(
        shared: Arc<Shared>,
        record: &SessionRecord,
        inbox: Receiver<SessionMsg>,
        own_tx: Sender<SessionMsg>,
    ) -> Self {
        SessionActor {
            shared,
            id: record.summary.id.clone(),
            tenant: Arc::from(record.tenant.as_str()),
            inbox,
            own_tx,
            turn: None,
            approvals: HashMap::new(),
            deleting: Vec::new(),
            deleted: false,
            working: 0,
            changing_files: 0,
            door: None,
            evicted: false,
            after_turn: Vec::new(),
        }
    }

    pub(super) fn run(mut self) {
        let pending = &crate::metrics::get().approvals_pending;
        loop {
            let waiting = self.approvals.len() as i64;
            let handled = match self.inbox.recv() {
                Ok(SessionMsg::Op(op)) => catch_unwind(AssertUnwindSafe(|| self.handle(op))),
                Ok(SessionMsg::Turn(message)) => catch_unwind(AssertUnwindSafe(|| self.turn_said(message))),
                Ok(SessionMsg::Done(done)) => catch_unwind(AssertUnwindSafe(|| self.done(done))),
                Err(_) => break,
            };
            pending.add(self.approvals.len() as i64 - waiting);
            if handled.is_err() {
                // Its reply channel is gone with the panic, so the caller gets an internal error.
                log::error!("session {} panicked handling a message; it goes on", self.id);
            }
            let door_idle = self.door.as_ref().is_none_or(|door| door.is_idle());
            let idle = self.turn.is_none() && self.deleting.is_empty() && self.working == 0 && door_idle;
            if (idle || self.deleted) && self.shared.sessions.retire(&self.id, &self.inbox, &mut self.door) {
                if self.evicted {
                    super::tenure::left(&self.shared, &self.id);
                }
                break;
            }
        }
        pending.sub(self.approvals.len() as i64);
    }

    fn handle(&mut self, op: Op) {
        if matches!(op, Op::Send { .. } | Op::Resume { .. }) && self.turn_has_ended() {
            self.after_turn.push(op);
            return;
        }
        match op {
            Op::Send { message, idempotent, plan, reply } => {
                let _ = reply.send(self.start_turn(Some(*message), idempotent.map(|i| *i), plan));
            }
            Op::Resume { plan, reply } => {
                let _ = reply.send(self.resume(plan));
            }
            Op::Cancel { reply } => {
                let _ = reply.send(self.turn.as_ref().is_some_and(|t| t.canceller.cancel(CancelReason::User)));
            }
            Op::Decide { approval_id, mut decision, reply } => match self.approvals.remove(&approval_id) {
                // The run answers once it has checked the decision (an edit may be refused).
                Some(waiting) => {
                    decision.taken = Some(reply);
                    // The turn may have been cancelled a moment ago; then nobody listens.
                    if let Err(unheard) = waiting.send(*decision) {
                        unheard.0.taken.map(|reply| reply.send(Err(EngineError::ApprovalNotFound)));
                    }
                }
                None => {
                    let _ = reply.send(Err(EngineError::ApprovalNotFound));
                }
            },
            Op::Patch { patch, reply } => {
                let _ = reply.send(self.patch(patch));
            }
            Op::Delete { reply } => {
                if let Some(turn) = &self.turn {
                    turn.canceller.cancel(CancelReason::User);
                }
                match self.turn.is_some() || self.changing_files > 0 {
                    true => self.deleting.push(reply),
                    false => {
                        let _ = reply.send(self.delete());
                    }
                }
            }
            Op::Checkpoint { label, reply } => self.checkpoint(label, reply),
            Op::Restore { checkpoint, reply } => self.restore(checkpoint, reply),
            Op::Rewind { message_id, restore_files, reply } => self.rewind(message_id, restore_files, reply),
            Op::Shutdown => {
                if let Some(turn) = &self.turn {
                    turn.canceller.cancel(CancelReason::Shutdown);
                }
            }
            Op::Evict => {
                self.evicted = true;
                if let Some(turn) = &self.turn {
                    turn.canceller.cancel(CancelReason::Shutdown);
                }
                self.approvals.clear();
                if let Some(mut door) = self.door.take() {
                    door.evicted(self);
                }
            }
            Op::Door { state, op } => {
                let mut door = self.door.take().unwrap_or_else(state);
                door.op(self, op);
                self.door.get_or_insert(door);
            }
        }
    }

    fn turn_said(&mut self, message: TurnMsg) {
        match message {
            TurnMsg::Awaiting { approval_id, decision } => {
                self.approvals.insert(approval_id, decision);
            }
            TurnMsg::Closed { approval_id } => {
                self.approvals.remove(&approval_id);
            }
            TurnMsg::Door(message) => {
                if let Some(mut door) = self.door.take() {
                    door.turn_said(self, message);
                    self.door.get_or_insert(door);
                }
            }
            TurnMsg::Ended { run_id, outcome, handoff } => {
                log::debug!("session {}: run {run_id} ended {outcome:?}", self.id);
                if self.turn.as_ref().is_some_and(|t| t.run_id == run_id) {
                    self.turn = None;
                    self.approvals.clear();
                    self.shared.sessions.turns.fetch_sub(1, Ordering::Relaxed);
                }
                self.answer_deletes();
                if let Some(mut door) = self.door.take() {
                    door.turn_ended(self, &run_id, handoff);
                    self.door.get_or_insert(door);
                }
                for op in std::mem::take(&mut self.after_turn) {
                    self.handle(op);
                }
            }
        }
    }

    /// Whether the running turn has stored its end already (its `run.finished` may be out):
    /// a new turn asked for now waits for it to end, instead of finding the session busy.
    fn turn_has_ended(&self) -> bool {
        self.turn.is_some()
            && matches!(self.shared.store.readers().session(&self.id), Ok(Some(r)) if r.summary.status != SessionStatus::Running)
    }

    fn done(&mut self, done: Done) {
        self.working -= 1;
        match done {
            Done::Files { changed, answer } => {
                if changed {
                    self.changing_files -= 1;
                }
                answer.give();
                self.answer_deletes();
            }
            Done::Door(done) => {
                if let Some(mut door) = self.door.take() {
                    door.done(self, done);
                    self.door.get_or_insert(door);
                }
            }
            Done::Panicked => log::error!("session {}: a slow step panicked", self.id),
        }
    }

    /// Deletes that waited for a turn or a change of files, once neither is under way.
    fn answer_deletes(&mut self) {
        if self.turn.is_some() || self.changing_files > 0 {
            return;
        }
        for reply in std::mem::take(&mut self.deleting) {
            let _ = reply.send(self.delete());
        }
    }

    /// Runs `step` on a `kestrel-slow` worker, which tells this actor it is done, and the
    /// actor answers `reply`; a step that `changes` files (a restore, a rewind) holds turns
    /// off until then.
    pub(super) fn off_actor<T: Send + 'static>(
        &mut self,
        changes: bool,
        step: impl FnOnce() -> Result<T, EngineError> + Send + 'static,
        reply: Sender<Result<T, EngineError>>,
    ) {
        let changed = changes;
        if changed {
            self.changing_files += 1;
        }
        let started = self.work(move || {
            let outcome =
                catch_unwind(AssertUnwindSafe(step)).unwrap_or(Err(EngineError::Internal("a slow step panicked")));
            let answer = super::answer::Answer::new(move || {
                let _ = reply.send(outcome);
            });
            Done::Files { changed, answer }
        });
        // The job (and its reply) is gone with the refused start: the caller hears an
        // internal error.
        if !started && changed {
            self.changing_files -= 1;
        }
    }

    /// Runs `job` on a `kestrel-slow` worker and hands what it reports back to this actor,
    /// which stays live until then; false when no worker could start.
    pub(crate) fn work(&mut self, job: impl FnOnce() -> Done + Send + 'static) -> bool {
        let tell = self.own_tx.clone();
        match crate::workers::SLOW.spawn(move || {
            let done = catch_unwind(AssertUnwindSafe(job)).unwrap_or(Done::Panicked);
            let _ = tell.send(SessionMsg::Done(done));
        }) {
            Ok(()) => {
                self.working += 1;
                true
            }
            Err(error) => {
                log::error!("session {}: no worker for a slow step: {error}", self.id);
                false
            }
        }
    }

    fn resume(&mut self, plan: Box<dyn TurnPlan>) -> Result<String, EngineError> {
        let record = self.record()?;
        match record.summary.status {
            SessionStatus::Interrupted | SessionStatus::Error => self.start_turn(None, None, plan),
            status => Err(EngineError::NotResumable(status)),
        }
    }

    pub(crate) fn record(&self) -> Result<SessionRecord, EngineError> {
        self.shared.store.readers().session(&self.id)?.ok_or(EngineError::SessionNotFound)
    }

    /// Claims the session for a turn, stores its opening writes, and starts the worker.
    fn start_turn(
        &mut self,
        user: Option<Message>,
        idempotent: Option<Idempotent>,
        plan: Box<dyn TurnPlan>,
    ) -> Result<String, EngineError> {
        if self.deleted {
            return Err(EngineError::SessionNotFound);
        }
        if self.turn.is_some() || !self.deleting.is_empty() || self.changing_files > 0 {
            return Err(EngineError::SessionBusy);
        }
        if self.shared.sessions.stopping.load(Ordering::SeqCst) {
            return Err(EngineError::ShuttingDown);
        }
        let slot = self.shared.open_run(&plan.allowance(&self.shared.config, &self.tenant)).inspect_err(|error| {
            if let EngineError::BudgetExceeded(reason) = error {
                self.shared.audit_budget(&self.tenant, &self.id, None, reason);
            }
        })?;
        let run_id = new_id("run");
        let now = crate::time::now_rfc3339();
        let mut ops = Vec::new();
        if let Some(user) = &user {
            ops.push(WriteOp::AppendMessage {
                session_id: self.id.clone(),
                message: user.clone(),
                updated_at: now.clone(),
            });
        }
        ops.extend(idempotent.map(|i| i.record(Created::Run(&run_id))));
        let claim = TurnClaim {
            session_id: self.id.clone(),
            run_id: run_id.clone(),
            node: self.shared.config.node.clone(),
            at: now,
        };
        match self.shared.store.claim_turn(&claim, ops) {
            Err(StoreError::Busy) => return Err(EngineError::SessionBusy),
            other => other?,
        }
        match self.spawn_run(run_id.clone(), user, plan, slot) {
            Ok(()) => Ok(run_id),
            Err(error) => Err(self.no_worker(&run_id, &error)),
        }
    }

    /// Starts a turn's worker with `plan` and makes it this session's active turn.
    pub(crate) fn spawn_run(
        &mut self,
        run_id: String,
        user: Option<Message>,
        plan: Box<dyn TurnPlan>,
        slot: super::RunSlot,
    ) -> std::io::Result<()> {
        let canceller = Canceller::new();
        let allowance = slot.allowance.clone();
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
            allowance,
        };
        (self.shared.spawn_run)(run)?;
        self.turn = Some(ActiveTurn { run_id, canceller, _slot: slot });
        self.shared.sessions.turns.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The worker could not start: the message is stored, so the session must not look busy
    /// with no run. It becomes `error`, so a retry is a `POST /resume` away.
    fn no_worker(&self, run_id: &str, error: &std::io::Error) -> EngineError {
        log::error!("cannot start a worker for run {run_id}: {error}");
        match self.shared.store.write(vec![WriteOp::ReleaseTurn {
            session_id: self.id.clone(),
            run_id: run_id.to_string(),
            status: SessionStatus::Error,
            at: crate::time::now_rfc3339(),
        }]) {
            Ok(()) => {
                if let Ok(record) = self.record() {
                    self.shared.publish_summary(&record);
                }
                EngineError::Overloaded
            }
            Err(error) => error.into(),
        }
    }

    fn patch(&self, patch: SessionPatch) -> Result<(), EngineError> {
        if self.turn.is_some() || !self.deleting.is_empty() || self.changing_files > 0 {
            return Err(EngineError::SessionBusy);
        }
        let now = crate::time::now_rfc3339();
        self.shared.store.write(vec![WriteOp::UpdateSession { id: self.id.clone(), patch, updated_at: now }])?;
        Ok(())
    }

    fn delete(&mut self) -> Result<(), EngineError> {
        if self.deleted {
            return Err(EngineError::SessionNotFound);
        }
        self.shared.store.write(vec![WriteOp::DeleteSession { id: self.id.clone() }])?;
        self.deleted = true;
        self.shared
            .bus
            .publish_shared(Some(Arc::clone(&self.tenant)), Event::SessionDeleted { session_id: self.id.clone() });
        Ok(())
    }
}

/// Sends an op and waits for its reply.
pub(crate) fn ask<T>(
    shared: &Arc<Shared>,
    record: &SessionRecord,
    op: impl FnOnce(Sender<T>) -> Op,
) -> Result<T, EngineError> {
    let (reply, answer) = bounded(1);
    Registry::send(shared, record, op(reply))?;
    answer.recv().map_err(|_| EngineError::Internal("the session dropped a request"))
}
