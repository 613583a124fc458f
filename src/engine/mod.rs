//! The engine: sessions and their turns, shared by every front door.
//!
//! Handlers call `Engine` methods on their connection threads. Reads and plain changes go to
//! the store directly; every operation that must not race a turn (send, resume, cancel, an
//! approval's decision, a move to another workspace, delete) goes to the session's actor
//! (`session.rs`) as an `Op`, and the actor runs each turn on a `kestrel-run` worker
//! (`run.rs`). The registry of live actors' inboxes is the only shared map. The engine does no
//! socket I/O and knows no wire format.

mod answer;
pub(crate) mod calls;
pub(crate) mod checkpoints;
pub(crate) mod compaction;
pub(crate) mod context;
mod error;
mod fork;
pub mod idempotency;
mod meter;
pub(crate) mod permissions;
pub mod plan;
pub(crate) mod publish;
mod registry;
pub(crate) mod run;
pub(crate) mod session;
pub mod structured;
pub mod tenure;
pub mod tools;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::bus::Bus;
use crate::domain::{
    new_id, Block, Event, ImageAttachment, Message, Role, SessionDetail, SessionRecord, SessionStatus, SessionSummary,
};
use crate::providers::ModelRegistry;
use crate::store::{SessionPatch, Store, WriteOp};
use crate::tools::workspace::{Workspace, WorkspacePolicy};
pub use calls::{Decision, Repair};
pub use fork::{CopiedFiles, ForkRequest, ForkWorkspace, Forked};
pub use idempotency::{Created, Idempotent, Lookup};
pub use meter::{Allowance, Meter, RunSlot, UsageView};
pub use permissions::{NewRule, Remember};
pub use plan::{Lifecycle, Opening, SessionDoor, TurnPlan};
pub use run::{Run, Step, Stop};
use tools::ToolRegistry;

pub use error::EngineError;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Where sessions may work and what they may never reach.
    pub workspaces: WorkspacePolicy,
    /// Provider calls allowed in one run.
    pub max_steps: u32,
    /// Past this share of a model's context window a Kestrel run compacts first.
    pub compact_at: f64,
    /// The most recent turns a compaction keeps as they are.
    pub compaction_keep_turns: usize,
    /// Workspace snapshots, and the data dir their blobs live under.
    pub checkpoints: crate::checkpoints::CheckpointConfig,
    pub data_dir: std::path::PathBuf,
    /// This process's id among the nodes sharing the store: what its turn claims name.
    pub node: String,
    /// The config file's permission rules.
    pub rulebook: crate::policy::Rulebook,
    /// What the audit log calls each tenant's token (`auth.tokens[].name`).
    pub token_names: std::collections::HashMap<String, String>,
    /// How long the audit log keeps a decision.
    pub audit_retention: std::time::Duration,
    /// `[agent.budget]`: every scope's, where its own sets nothing.
    pub budget: crate::policy::Budget,
    /// Each tenant's token's `budget`.
    pub tenant_budgets: std::collections::HashMap<String, crate::policy::Budget>,
    /// How each tenant's commands are contained, which every run announces.
    pub sandbox: Arc<crate::tools::sandbox::CommandSandbox>,
    /// Sessions a Kestrel tenant may have (`agent.max_sessions_per_tenant`).
    pub max_sessions_per_tenant: u64,
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
    /// What the turn's final answer must be (`structured.rs`).
    pub response_format: Option<crate::domain::ResponseFormat>,
}

pub(crate) struct Shared {
    pub(crate) store: Store,
    pub(crate) bus: Bus,
    pub(crate) models: ModelRegistry,
    pub(crate) tools: ToolRegistry,
    pub(crate) config: EngineConfig,
    /// Live sessions' actors: the only map of per-session state, and it holds only inboxes.
    pub(crate) sessions: session::Registry,
    /// Idempotency-Keys whose request is being handled.
    pub(crate) claims: idempotency::Claims,
    pub(crate) checkpoints: crate::checkpoints::Checkpoints,
    /// What each door keeps across its sessions (`DoorShared`).
    pub(crate) doors: Vec<Arc<dyn DoorShared>>,
    /// Budgets and rate limits in flight.
    pub(crate) meter: Arc<meter::Meter>,
    /// Whether a quiet turn's end is logged (a webhook wants BAE's turn ends), not only streamed.
    pub(crate) log_quiet_ends: Arc<std::sync::atomic::AtomicBool>,
    /// Starts a run's worker thread; tests replace it to make the start fail.
    pub(crate) spawn_run: fn(run::Run) -> std::io::Result<()>,
    /// A cluster's leases (`tenure.rs`); unset when this node runs alone.
    pub(crate) leases: std::sync::OnceLock<Arc<dyn tenure::Leases>>,
}

fn spawn_run_thread(run: run::Run) -> std::io::Result<()> {
    crate::workers::RUNS.spawn(move || run.execute())
}

#[derive(Clone)]
pub struct Engine {
    pub(crate) shared: Arc<Shared>,
}

const DEFAULT_TITLE: &str = "New session";

impl Engine {
    pub fn new(
        store: Store,
        bus: Bus,
        models: ModelRegistry,
        tools: ToolRegistry,
        config: EngineConfig,
        doors: Vec<Arc<dyn DoorShared>>,
    ) -> Engine {
        let checkpoints =
            crate::checkpoints::Checkpoints::new(store.clone(), &config.data_dir, config.checkpoints.clone());
        Engine {
            shared: Arc::new(Shared {
                checkpoints,
                doors,
                store,
                bus,
                models,
                tools,
                config,
                sessions: session::Registry::default(),
                claims: idempotency::Claims::default(),
                meter: Arc::new(meter::Meter::new()),
                log_quiet_ends: Arc::default(),
                spawn_run: spawn_run_thread,
                leases: Default::default(),
            }),
        }
    }

    pub fn models(&self) -> &ModelRegistry {
        &self.shared.models
    }

    pub fn tools(&self) -> &ToolRegistry {
        &self.shared.tools
    }

    /// The containment `tenant`'s commands get (`tools/sandbox.rs`).
    pub fn sandbox(&self, tenant: &str) -> crate::domain::SandboxState {
        self.shared.config.sandbox.state(tenant)
    }

    pub fn bus(&self) -> &Bus {
        &self.shared.bus
    }

    /// Whether a quiet turn's end is logged: set while a webhook wants BAE's turn ends.
    pub fn quiet_ends_logged(&self) -> Arc<std::sync::atomic::AtomicBool> {
        Arc::clone(&self.shared.log_quiet_ends)
    }

    /// The store, for the parts beside the engine that keep their own tables (schedules).
    pub fn store(&self) -> &Store {
        &self.shared.store
    }

    pub fn session_count(&self) -> Result<u64, EngineError> {
        Ok(self.shared.store.readers().session_count()?)
    }

    /// `/metrics`: the levels read when scraped, then every family as text.
    pub fn render_metrics(&self) -> Result<Vec<u8>, EngineError> {
        let metrics = crate::metrics::get();
        metrics.sessions.reset();
        for status in ["idle", "running", "interrupted", "error", "cancelled"] {
            metrics.sessions.with_label_values(&[status]).set(0);
        }
        for (status, count) in self.shared.store.readers().sessions_by_status()? {
            metrics.sessions.with_label_values(&[status.as_str()]).set(count as i64);
        }
        metrics.active_runs.set(self.active_runs() as i64);
        metrics.bus_subscribers.set(self.bus().subscriber_count() as i64);
        metrics.writer_queue.set(self.shared.store.queue_depth() as i64);
        Ok(metrics.render())
    }

    pub fn active_runs(&self) -> usize {
        self.shared.sessions.active_turns()
    }

    pub fn list_sessions(&self, tenant: &str) -> Result<Vec<SessionSummary>, EngineError> {
        Ok(self.shared.store.readers().sessions_of(tenant)?)
    }

    /// A number that changes whenever any session's summary does (`SessionReads::sessions_version`).
    pub fn sessions_version(&self) -> Result<i64, EngineError> {
        Ok(self.shared.store.readers().sessions_version()?)
    }

    /// A page of a walk of the tenant's sessions (`SessionReads::sessions_page`).
    pub fn list_sessions_page(
        &self,
        tenant: &str,
        walk: &crate::store::SessionWalk,
        limit: usize,
    ) -> Result<crate::store::WalkPage, EngineError> {
        Ok(self.shared.store.readers().sessions_page(tenant, walk, limit)?)
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
        let (model, workspace) = self.check_new_session(tenant, new.model, new.workspace.as_deref())?;
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
                forked_from: None,
            },
            tenant: tenant.to_string(),
            system_prompt: new.system_prompt,
        };
        let detail = SessionDetail {
            summary: record.summary.clone(),
            messages: Vec::new(),
            system_prompt: record.system_prompt.clone(),
        };
        let mut ops = vec![self.shared.session_room(tenant), WriteOp::InsertSession(record.clone())];
        ops.extend(idempotent.map(|i| i.record(Created::Session(&detail))));
        self.shared.store.write(ops)?;
        self.shared.publish_created(&record);
        Ok(detail)
    }

    /// The model and workspace a new session of `tenant` would get (defaults filled in), or
    /// why it cannot be made.
    pub fn check_new_session(
        &self,
        tenant: &str,
        model: Option<String>,
        workspace: Option<&str>,
    ) -> Result<(String, std::path::PathBuf), EngineError> {
        let model = model.unwrap_or_else(|| self.shared.models.default_model().to_string());
        if !self.shared.models.contains(&model) {
            return Err(EngineError::InvalidModel(model));
        }
        let policy = &self.shared.config.workspaces;
        let workspace = match workspace {
            Some(path) => policy.check(tenant, Path::new(path))?,
            None => {
                let default = policy.default_for(tenant);
                policy.allows(tenant, &default)?;
                default
            }
        };
        Ok((model, workspace))
    }

    /// Publishes an event of `tenant`'s that no session's actor owns (a schedule's fire).
    pub fn announce(&self, tenant: &str, event: Event) {
        self.shared.bus.publish_shared(Some(Arc::from(tenant)), event);
    }

    /// Checks that the session exists and is the tenant's, without loading its transcript.
    pub fn check_session(&self, tenant: &str, id: &str) -> Result<(), EngineError> {
        self.shared.owned_session(tenant, id).map(|_| ())
    }

    pub fn session(&self, tenant: &str, id: &str) -> Result<SessionDetail, EngineError> {
        self.session_with(tenant, id, false)
    }

    /// A session; `with_compacted` keeps the messages a compaction replaced (stored for
    /// audit, out of the transcript otherwise).
    pub fn session_with(&self, tenant: &str, id: &str, with_compacted: bool) -> Result<SessionDetail, EngineError> {
        let record = self.shared.owned_session(tenant, id)?;
        let mut messages = self.shared.store.readers().messages(id)?;
        messages.retain(|message| with_compacted || !message.flag(context::COMPACTED));
        Ok(SessionDetail { summary: record.summary, messages, system_prompt: record.system_prompt })
    }

    /// Changes a session's title, model, prompt or workspace. A new workspace is checked like
    /// one given at create, and cannot change under a running run.
    pub fn patch_session(&self, tenant: &str, id: &str, patch: SessionPatch) -> Result<SessionDetail, EngineError> {
        let record = self.shared.owned_session(tenant, id)?;
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
        let patch = SessionPatch { status: None, workspace, ..patch };
        if patch.workspace.is_some() {
            // The session's actor moves it, so no turn can start or run in between.
            session::ask(&self.shared, &record, |reply| session::Op::Patch { patch, reply })??;
        } else {
            let now = crate::time::now_rfc3339();
            self.shared.store.write(vec![WriteOp::UpdateSession { id: id.to_string(), patch, updated_at: now }])?;
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
        let record = self.shared.owned_session(tenant, id)?;
        session::ask(&self.shared, &record, |reply| session::Op::Delete { reply })??;
        self.shared.tools.session_ended(id);
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
        plan: Box<dyn TurnPlan>,
    ) -> Result<String, EngineError> {
        let record = self.shared.owned_session(tenant, id)?;
        let NewMessage { content, images, response_format } = message;
        let mut message = Message::text_of(Role::User, content);
        message.blocks.extend(images.into_iter().map(Block::Image));
        if let Some(format) = response_format {
            structured::check_format(&format).map_err(EngineError::InvalidResponseFormat)?;
            let format = serde_json::to_value(&format).map_err(|_| EngineError::Internal("a format as JSON"))?;
            message.meta.get_or_insert_with(Default::default).insert(structured::FORMAT_KEY.into(), format);
        }
        let (message, idempotent) = (Box::new(message), idempotent.map(Box::new));
        session::ask(&self.shared, &record, |reply| session::Op::Send { message, idempotent, plan, reply })?
    }

    /// Re-enters the loop of an `interrupted` or `error` session from its stored transcript,
    /// with `plan`.
    pub fn resume(&self, tenant: &str, id: &str, plan: Box<dyn TurnPlan>) -> Result<String, EngineError> {
        let record = self.shared.owned_session(tenant, id)?;
        match record.summary.status {
            SessionStatus::Interrupted | SessionStatus::Error => {
                session::ask(&self.shared, &record, |reply| session::Op::Resume { plan, reply })?
            }
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
        // No actor, no run, no approval waiting.
        let (reply, answer) = crossbeam_channel::bounded(1);
        let op = session::Op::Decide { approval_id: approval_id.to_string(), decision: Box::new(decision), reply };
        if self.shared.sessions.send_if_live(id, op).is_err() {
            return Err(EngineError::ApprovalNotFound);
        }
        answer.recv().map_err(|_| EngineError::Internal("the session dropped a request"))?
    }

    /// The workspace of a session, for the read-only file routes.
    pub fn workspace(&self, tenant: &str, id: &str) -> Result<Workspace, EngineError> {
        let record = self.shared.owned_session(tenant, id)?;
        self.shared.config.workspaces.open(tenant, Path::new(&record.summary.workspace)).map_err(EngineError::Workspace)
    }

    /// Cancels the session's run; true if this call cancelled one.
    pub fn cancel(&self, tenant: &str, id: &str) -> Result<bool, EngineError> {
        self.shared.owned_session(tenant, id)?;
        let (reply, answer) = crossbeam_channel::bounded(1);
        // No actor: nothing runs, nothing to cancel.
        if self.shared.sessions.send_if_live(id, session::Op::Cancel { reply }).is_err() {
            return Ok(false);
        }
        answer.recv().map_err(|_| EngineError::Internal("the session dropped a request"))
    }

    /// Refuses new runs, cancels the active ones (they are stored as `interrupted`), and
    /// waits for their sessions to stop, at most `grace`.
    pub fn shutdown(&self, grace: Duration) {
        self.shared.sessions.shutdown(grace);
        for door in &self.shared.doors {
            door.shutdown();
        }
    }
}

/// What a door keeps across its sessions (a BAE door's MCP connections, sandbox images and
/// subagents), held by the engine for the door's turns and actors to find (`Shared::door`).
pub trait DoorShared: Send + Sync {
    /// The server is stopping: nothing of the door's may outlive it.
    fn shutdown(&self) {}
    /// This node took the session's lease: record what the last holder left half done, and
    /// rebuild what the session had on it (`tenure.rs`).
    fn taken_over(&self, _engine: &Engine, _record: &SessionRecord) -> Result<(), EngineError> {
        Ok(())
    }
    /// Whether the door keeps something of the session on this node outside its actor (MCP
    /// connections, subagents): then its lease is not given up as idle.
    fn keeps(&self, _session_id: &str) -> bool {
        false
    }
    /// This node lost the session's lease: let go of what the door keeps of it.
    fn let_go(&self, _session_id: &str) {}
    fn as_any(&self) -> &dyn std::any::Any;
}

impl Shared {
    /// The shared state of the door whose type it is, if that door is installed.
    pub(crate) fn door<T: 'static>(&self) -> Option<&T> {
        self.doors.iter().find_map(|door| door.as_any().downcast_ref::<T>())
    }

    /// The session if it exists and belongs to `tenant`; another tenant's is "not found".
    fn owned_session(&self, tenant: &str, id: &str) -> Result<SessionRecord, EngineError> {
        match self.store.readers().session(id)? {
            Some(record) if record.tenant == tenant => Ok(record),
            _ => Err(EngineError::SessionNotFound),
        }
    }

    /// The write op that refuses a new session of `tenant` past its sessions; it goes first in
    /// the write that inserts one (a create, a fork, a schedule's fire).
    pub(crate) fn session_room(&self, tenant: &str) -> WriteOp {
        WriteOp::SessionRoom { tenant: tenant.to_string(), max: self.config.max_sessions_per_tenant }
    }

    /// `session.created`, then the summary every stream follows.
    pub(crate) fn publish_created(&self, record: &SessionRecord) {
        let (session_id, session) = (record.summary.id.clone(), record.summary.clone());
        self.bus.publish(Some(&record.tenant), Event::SessionCreated { session_id, session });
        self.publish_summary(record);
    }

    fn publish_summary(&self, record: &SessionRecord) {
        self.bus.publish(
            Some(&record.tenant),
            Event::SessionUpdated { session_id: record.summary.id.clone(), session: record.summary.clone() },
        );
    }
}

#[cfg(test)]
mod tests;
