//! The engine: sessions and their runs, shared by every front door.
//!
//! Handlers call `Engine` methods on their request threads; each run executes on its own
//! `kestrel-run` worker thread (see `run.rs`), which owns its session while it runs. The only
//! shared mutable state is the table of active runs, one entry per running session, which is
//! how `session_busy` is decided. The engine does no socket I/O and knows no wire format.

mod calls;
pub mod idempotency;
mod run;
pub mod tools;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::bus::Bus;
use crate::cancel::{CancelReason, Canceller};
use crate::domain::{
    new_id, ChatMessage, Event, ImageAttachment, Role, SessionDetail, SessionRecord, SessionStatus, SessionSummary,
};
use crate::providers::ModelRegistry;
use crate::store::{SessionPatch, Store, StoreError, WriteOp};
use crate::tools::workspace::{PathError, Workspace, WorkspacePolicy, WorkspaceRefusal};
pub use calls::Decision;
pub use idempotency::{Created, Idempotent, Lookup};
use tools::ToolRegistry;

#[derive(Debug)]
pub enum EngineError {
    SessionNotFound,
    InvalidModel(String),
    InvalidWorkspace(String),
    /// A workspace outside the tenant's roots or overlapping a protected path.
    WorkspaceForbidden(String),
    SessionBusy,
    NotResumable(SessionStatus),
    ShuttingDown,
    /// The server could not start a thread for the run (out of memory or threads).
    Overloaded,
    ApprovalNotFound,
    /// An Idempotency-Key already answered a different request.
    IdempotencyConflict,
    /// The first request with this Idempotency-Key is still being handled.
    IdempotencyInFlight,
    /// A workspace path was refused or could not be read.
    Workspace(PathError),
    /// The model provider failed; the message is safe to show (no keys, no headers).
    Provider(String),
    Store(StoreError),
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::SessionNotFound => write!(f, "session not found"),
            EngineError::InvalidModel(model) => write!(f, "model `{model}` is not registered"),
            EngineError::InvalidWorkspace(why) | EngineError::WorkspaceForbidden(why) => write!(f, "{why}"),
            EngineError::SessionBusy => write!(f, "a run is already active in this session"),
            EngineError::NotResumable(status) => {
                write!(f, "only interrupted or failed sessions can be resumed; this one is {}", status.as_str())
            }
            EngineError::ShuttingDown => write!(f, "the server is shutting down"),
            EngineError::Overloaded => write!(
                f,
                "the server cannot start a run right now; the message is stored and the session can be resumed"
            ),
            EngineError::ApprovalNotFound => write!(f, "no pending approval with that id"),
            EngineError::IdempotencyConflict => {
                write!(f, "this Idempotency-Key was already used for a different request")
            }
            EngineError::IdempotencyInFlight => {
                write!(f, "a request with this Idempotency-Key is still being handled; retry shortly")
            }
            EngineError::Workspace(error) => write!(f, "{error}"),
            EngineError::Provider(message) => write!(f, "{message}"),
            EngineError::Store(error) => write!(f, "{error}"),
        }
    }
}

impl std::error::Error for EngineError {}

impl From<StoreError> for EngineError {
    fn from(error: StoreError) -> Self {
        match error {
            // A session deleted between its check and a write to it.
            StoreError::MissingSession => EngineError::SessionNotFound,
            error => EngineError::Store(error),
        }
    }
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Where sessions may work and what they may never reach.
    pub workspaces: WorkspacePolicy,
    /// Provider calls allowed in one run.
    pub max_steps: u32,
}

pub struct NewSession {
    pub title: Option<String>,
    pub model: Option<String>,
    pub system_prompt: Option<String>,
    pub workspace: Option<String>,
}

pub struct NewMessage {
    pub content: String,
    pub images: Vec<ImageAttachment>,
}

struct ActiveRun {
    run_id: String,
    canceller: Canceller,
    thread: Option<JoinHandle<()>>,
}

pub(crate) struct Shared {
    store: Store,
    bus: Bus,
    models: ModelRegistry,
    tools: ToolRegistry,
    config: EngineConfig,
    /// Running sessions by id. A session is busy exactly while it has an entry here.
    runs: Mutex<HashMap<String, ActiveRun>>,
    /// Signalled whenever an entry leaves `runs`.
    run_ended: Condvar,
    /// Approvals runs are waiting on, by approval id.
    approvals: Mutex<HashMap<String, calls::PendingApproval>>,
    stopping: std::sync::atomic::AtomicBool,
    /// Idempotency-Keys whose request is being handled.
    claims: idempotency::Claims,
    /// Starts a run's worker thread; tests replace it to make the start fail.
    spawn_run: fn(run::Run) -> std::io::Result<JoinHandle<()>>,
}

fn spawn_run_thread(run: run::Run) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name("kestrel-run".into()).spawn(move || run.execute())
}

#[derive(Clone)]
pub struct Engine {
    shared: Arc<Shared>,
}

const DEFAULT_TITLE: &str = "New session";

impl Engine {
    pub fn new(store: Store, bus: Bus, models: ModelRegistry, tools: ToolRegistry, config: EngineConfig) -> Engine {
        Engine {
            shared: Arc::new(Shared {
                store,
                bus,
                models,
                tools,
                config,
                runs: Mutex::new(HashMap::new()),
                run_ended: Condvar::new(),
                approvals: Mutex::new(HashMap::new()),
                stopping: std::sync::atomic::AtomicBool::new(false),
                claims: idempotency::Claims::default(),
                spawn_run: spawn_run_thread,
            }),
        }
    }

    pub fn models(&self) -> &ModelRegistry {
        &self.shared.models
    }

    pub fn tools(&self) -> &ToolRegistry {
        &self.shared.tools
    }

    pub fn bus(&self) -> &Bus {
        &self.shared.bus
    }

    pub fn session_count(&self) -> Result<u64, EngineError> {
        Ok(self.shared.store.readers().session_count()?)
    }

    pub fn active_runs(&self) -> usize {
        self.shared.lock_runs().len()
    }

    pub fn list_sessions(&self, tenant: &str) -> Result<Vec<SessionSummary>, EngineError> {
        Ok(self.shared.store.readers().sessions_of(tenant)?)
    }

    /// Claims an Idempotency-Key for a request, or finds the answer it already got.
    pub fn idempotency(&self, tenant: &str, key: &str, fingerprint: &str) -> Result<Lookup<'_>, EngineError> {
        self.shared.idempotency(tenant, key, fingerprint)
    }

    /// Creates a session; with `idempotent`, its answer is stored in the same transaction.
    pub fn create_session(
        &self,
        tenant: &str,
        new: NewSession,
        idempotent: Option<Idempotent>,
    ) -> Result<SessionDetail, EngineError> {
        let model = new.model.unwrap_or_else(|| self.shared.models.default_model().to_string());
        if !self.shared.models.contains(&model) {
            return Err(EngineError::InvalidModel(model));
        }
        let policy = &self.shared.config.workspaces;
        let workspace = match new.workspace {
            Some(path) => policy.check(tenant, Path::new(&path))?,
            None => {
                let default = policy.default_for(tenant);
                policy.allows(tenant, &default)?;
                default
            }
        };
        let now = crate::time::now_rfc3339();
        let record = SessionRecord {
            summary: SessionSummary {
                id: new_id("ses"),
                title: new.title.unwrap_or_else(|| DEFAULT_TITLE.to_string()),
                created_at: now.clone(),
                updated_at: now,
                status: SessionStatus::Idle,
                model,
                message_count: 0,
                workspace: workspace.to_string_lossy().into_owned(),
            },
            tenant: tenant.to_string(),
            system_prompt: new.system_prompt,
        };
        let detail = SessionDetail {
            summary: record.summary.clone(),
            messages: Vec::new(),
            system_prompt: record.system_prompt.clone(),
        };
        let mut ops = vec![WriteOp::InsertSession(record.clone())];
        ops.extend(idempotent.map(|i| i.record(Created::Session(&detail))));
        self.shared.store.write(ops)?;
        self.shared.publish_summary(&record);
        Ok(detail)
    }

    /// Checks that the session exists and is the tenant's, without loading its transcript.
    pub fn check_session(&self, tenant: &str, id: &str) -> Result<(), EngineError> {
        self.shared.owned_session(tenant, id).map(|_| ())
    }

    pub fn session(&self, tenant: &str, id: &str) -> Result<SessionDetail, EngineError> {
        let record = self.shared.owned_session(tenant, id)?;
        let messages = self.shared.store.readers().messages(id)?;
        Ok(SessionDetail { summary: record.summary, messages, system_prompt: record.system_prompt })
    }

    /// Changes a session's title, model, prompt or workspace. A new workspace is checked like
    /// one given at create, and cannot change under a running run.
    pub fn patch_session(&self, tenant: &str, id: &str, patch: SessionPatch) -> Result<SessionDetail, EngineError> {
        self.shared.owned_session(tenant, id)?;
        if let Some(model) = &patch.model {
            if !self.shared.models.contains(model) {
                return Err(EngineError::InvalidModel(model.clone()));
            }
        }
        let workspace = match &patch.workspace {
            Some(requested) => {
                let checked = self.shared.config.workspaces.check(tenant, Path::new(requested))?;
                Some(checked.to_string_lossy().into_owned())
            }
            None => None,
        };
        let moving = workspace.is_some();
        let patch = SessionPatch { status: None, workspace, ..patch };
        let write = vec![WriteOp::UpdateSession { id: id.to_string(), patch, updated_at: crate::time::now_rfc3339() }];
        if moving {
            // Held across the write so no run starts between the check and the move.
            let runs = self.shared.lock_runs();
            if runs.contains_key(id) {
                return Err(EngineError::SessionBusy);
            }
            self.shared.store.write(write)?;
        } else {
            self.shared.store.write(write)?;
        }
        let detail = self.session(tenant, id)?;
        self.shared.bus.publish(
            Some(tenant),
            Event::SessionUpdated { session_id: id.to_string(), session: detail.summary.clone() },
        );
        Ok(detail)
    }

    /// Deletes a session and its transcript, cancelling its run first if it has one.
    pub fn delete_session(&self, tenant: &str, id: &str) -> Result<(), EngineError> {
        self.shared.owned_session(tenant, id)?;
        let mut runs = self.shared.lock_runs();
        if let Some(run) = runs.get(id) {
            run.canceller.cancel(CancelReason::User);
        }
        while runs.contains_key(id) {
            runs = self.shared.run_ended.wait(runs).unwrap_or_else(|e| e.into_inner());
        }
        // Still holding the run table, so no new run can claim the session before it is gone.
        self.shared.store.write(vec![WriteOp::DeleteSession { id: id.to_string() }])?;
        drop(runs);
        self.shared.bus.publish(Some(tenant), Event::SessionDeleted { session_id: id.to_string() });
        Ok(())
    }

    /// Stores the user's message and starts a run; returns once the message is durable.
    /// With `idempotent`, the answer is stored in the same transaction as the message.
    pub fn send_message(
        &self,
        tenant: &str,
        id: &str,
        message: NewMessage,
        idempotent: Option<Idempotent>,
    ) -> Result<String, EngineError> {
        let record = self.shared.owned_session(tenant, id)?;
        let mut user = ChatMessage::new(Role::User, message.content);
        user.images = message.images;
        self.start_run(record, Some(user), idempotent)
    }

    /// Re-enters the loop of an `interrupted` or `error` session from its stored transcript.
    pub fn resume(&self, tenant: &str, id: &str) -> Result<String, EngineError> {
        let record = self.shared.owned_session(tenant, id)?;
        match record.summary.status {
            SessionStatus::Interrupted | SessionStatus::Error => self.start_run(record, None, None),
            status => Err(EngineError::NotResumable(status)),
        }
    }

    /// Answers an approval the session's run is waiting on.
    pub fn resolve_approval(
        &self,
        tenant: &str,
        id: &str,
        approval_id: &str,
        decision: Decision,
    ) -> Result<(), EngineError> {
        self.shared.owned_session(tenant, id)?;
        let pending = {
            let mut approvals = self.shared.lock_approvals();
            match approvals.get(approval_id) {
                Some(pending) if pending.session_id == id => approvals.remove(approval_id),
                _ => None,
            }
        };
        let pending = pending.ok_or(EngineError::ApprovalNotFound)?;
        // The run may have been cancelled a moment ago; then nobody listens, which is fine.
        let _ = pending.decision_tx.send(decision);
        Ok(())
    }

    /// The workspace of a session, for the read-only file routes.
    pub fn workspace(&self, tenant: &str, id: &str) -> Result<Workspace, EngineError> {
        let record = self.shared.owned_session(tenant, id)?;
        self.shared.config.workspaces.open(tenant, Path::new(&record.summary.workspace)).map_err(EngineError::Workspace)
    }

    /// Cancels the session's run; true if this call cancelled one.
    pub fn cancel(&self, tenant: &str, id: &str) -> Result<bool, EngineError> {
        self.shared.owned_session(tenant, id)?;
        let runs = self.shared.lock_runs();
        Ok(runs.get(id).is_some_and(|run| run.canceller.cancel(CancelReason::User)))
    }

    /// Claims the session, stores the opening writes, and spawns the worker.
    fn start_run(
        &self,
        record: SessionRecord,
        user: Option<ChatMessage>,
        idempotent: Option<Idempotent>,
    ) -> Result<String, EngineError> {
        let id = record.summary.id.clone();
        let run_id = new_id("run");
        let canceller = Canceller::new();
        {
            let mut runs = self.shared.lock_runs();
            if self.shared.stopping.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(EngineError::ShuttingDown);
            }
            if runs.contains_key(&id) {
                return Err(EngineError::SessionBusy);
            }
            runs.insert(id.clone(), ActiveRun { run_id: run_id.clone(), canceller: canceller.clone(), thread: None });
        }
        let now = crate::time::now_rfc3339();
        let mut ops = vec![WriteOp::UpdateSession {
            id: id.clone(),
            patch: SessionPatch { status: Some(SessionStatus::Running), ..SessionPatch::default() },
            updated_at: now.clone(),
        }];
        if let Some(user) = &user {
            ops.push(WriteOp::AppendMessage { session_id: id.clone(), message: user.clone(), updated_at: now });
        }
        ops.extend(idempotent.map(|i| i.record(Created::Run(&run_id))));
        if let Err(error) = self.shared.store.write(ops) {
            self.shared.release(&id, &run_id);
            return Err(error.into());
        }
        let record_tenant = record.tenant.clone();
        let run = run::Run {
            shared: Arc::clone(&self.shared),
            tenant: Arc::from(record.tenant),
            session_id: id.clone(),
            run_id: run_id.clone(),
            cancel: canceller.token(),
            user,
        };
        let spawned = (self.shared.spawn_run)(run);
        match spawned {
            Ok(thread) => {
                let mut runs = self.shared.lock_runs();
                match runs.get_mut(&id) {
                    Some(active) if active.run_id == run_id => active.thread = Some(thread),
                    _ => drop(thread), // already finished
                }
                Ok(run_id)
            }
            Err(error) => {
                // The message is stored; the session must not look busy with no run. It becomes
                // `error`, so a retry is a `POST /resume` away.
                log::error!("cannot start a worker for run {run_id}: {error}");
                let failed = SessionPatch { status: Some(SessionStatus::Error), ..SessionPatch::default() };
                let now = crate::time::now_rfc3339();
                let write = self.shared.store.write(vec![WriteOp::UpdateSession {
                    id: id.clone(),
                    patch: failed,
                    updated_at: now,
                }]);
                self.shared.release(&id, &run_id);
                write?;
                if let Ok(record) = self.shared.owned_session(&record_tenant, &id) {
                    self.shared.publish_summary(&record);
                }
                Err(EngineError::Overloaded)
            }
        }
    }

    /// Refuses new runs, cancels the active ones (they are stored as `interrupted`), and
    /// waits for their workers, at most `grace`.
    pub fn shutdown(&self, grace: Duration) {
        self.shared.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
        let threads: Vec<JoinHandle<()>> = {
            let mut runs = self.shared.lock_runs();
            for run in runs.values() {
                run.canceller.cancel(CancelReason::Shutdown);
            }
            let deadline = std::time::Instant::now() + grace;
            while !runs.is_empty() {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    log::warn!("{} run(s) did not stop within {grace:?}", runs.len());
                    break;
                }
                runs = self.shared.run_ended.wait_timeout(runs, left).unwrap_or_else(|e| e.into_inner()).0;
            }
            runs.values_mut().filter_map(|run| run.thread.take()).collect()
        };
        drop(threads); // still running past the grace period: detached, the store refuses them
    }
}

impl Shared {
    fn lock_approvals(&self) -> MutexGuard<'_, HashMap<String, calls::PendingApproval>> {
        self.approvals.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_runs(&self) -> MutexGuard<'_, HashMap<String, ActiveRun>> {
        self.runs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The session if it exists and belongs to `tenant`; another tenant's is "not found".
    fn owned_session(&self, tenant: &str, id: &str) -> Result<SessionRecord, EngineError> {
        match self.store.readers().session(id)? {
            Some(record) if record.tenant == tenant => Ok(record),
            _ => Err(EngineError::SessionNotFound),
        }
    }

    fn publish_summary(&self, record: &SessionRecord) {
        self.bus.publish(
            Some(&record.tenant),
            Event::SessionUpdated { session_id: record.summary.id.clone(), session: record.summary.clone() },
        );
    }

    /// Ends a session's claim; the worker calls this as its very last step.
    fn release(&self, session_id: &str, run_id: &str) {
        let mut runs = self.lock_runs();
        if runs.get(session_id).is_some_and(|run| run.run_id == run_id) {
            runs.remove(session_id);
        }
        self.run_ended.notify_all();
    }
}

impl From<WorkspaceRefusal> for EngineError {
    fn from(refusal: WorkspaceRefusal) -> Self {
        match refusal {
            WorkspaceRefusal::Invalid(why) => EngineError::InvalidWorkspace(why),
            WorkspaceRefusal::Forbidden(why) => EngineError::WorkspaceForbidden(why),
        }
    }
}

#[cfg(test)]
mod tests;
