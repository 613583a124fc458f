//! Checkpoints and rewind as operations of a session: listing reads on the caller's thread;
//! taking a checkpoint, restoring one and rewinding are ops of the session's actor, so a
//! restore or a rewind never races a run (both are refused while one is active, and no run
//! starts while one is under way). The actor only decides: the walk over the workspace runs
//! on a `kestrel-slow` worker, which answers the caller, so a cancel or an approval is never
//! held up by a large tree. The automatic checkpoint is taken by the run itself, before its
//! first call that can change files.

use std::path::Path;
use std::sync::Arc;

use crossbeam_channel::Sender;

use super::session::{self, Op, SessionActor};
use super::{Engine, EngineError, Shared};
use crate::checkpoints::{CheckpointError, Restored, Taking};
use crate::domain::{Event, Message, Role};
use crate::store::{CheckpointKind, CheckpointRecord, WriteOp};

/// What `GET /checkpoints` answers: whether checkpoints work here (and why not), and the list.
pub struct CheckpointList {
    pub disabled: Option<String>,
    pub checkpoints: Vec<CheckpointRecord>,
}

/// What a rewind did: the messages left, how many went, and the files it put back (`None`
/// when it was asked not to, or no run since that message changed files).
pub struct Rewound {
    pub removed: u64,
    pub messages: Vec<Message>,
    pub files: Option<Restored>,
}

impl From<CheckpointError> for EngineError {
    fn from(error: CheckpointError) -> Self {
        match error {
            CheckpointError::Disabled(reason) => EngineError::CheckpointsDisabled(reason),
            CheckpointError::NotFound => EngineError::CheckpointNotFound,
            CheckpointError::TimedOut(_) => EngineError::CheckpointTimedOut(error.to_string()),
            CheckpointError::Store(error) => error.into(),
            CheckpointError::Io(error) => {
                log::error!("checkpoint: {error}");
                EngineError::Internal("the workspace could not be read or written")
            }
        }
    }
}

impl Engine {
    /// Removes the blobs no checkpoint refers to (their sessions were deleted); how many.
    pub fn collect_checkpoint_garbage(&self) -> Result<usize, EngineError> {
        Ok(self.shared.checkpoints.collect_garbage()?)
    }

    pub fn checkpoints(&self, tenant: &str, id: &str) -> Result<CheckpointList, EngineError> {
        let record = self.shared.owned_session(tenant, id)?;
        let disabled =
            self.shared.checkpoints.status(Path::new(&record.summary.workspace)).err().map(|why| why.to_string());
        let checkpoints = self.shared.store.readers().checkpoints(id)?;
        Ok(CheckpointList { disabled, checkpoints })
    }

    /// A manual checkpoint of the session's workspace.
    pub fn create_checkpoint(
        &self,
        tenant: &str,
        id: &str,
        label: Option<String>,
    ) -> Result<CheckpointRecord, EngineError> {
        let record = self.shared.owned_session(tenant, id)?;
        session::ask(&self.shared, &record, |reply| Op::Checkpoint { label, reply })?
    }

    /// Puts a checkpoint back, after a safety checkpoint; `session_busy` while a run is active.
    pub fn restore_checkpoint(&self, tenant: &str, id: &str, checkpoint: &str) -> Result<Restored, EngineError> {
        let record = self.shared.owned_session(tenant, id)?;
        let checkpoint = checkpoint.to_string();
        session::ask(&self.shared, &record, |reply| Op::Restore { checkpoint, reply })?
    }
}

impl Engine {
    /// Drops a user message and everything after it; with `restore_files`, first puts back
    /// the files as they were before that message's run changed them (after a safety
    /// checkpoint). `session_busy` while a run is active.
    pub fn rewind(
        &self,
        tenant: &str,
        id: &str,
        message_id: String,
        restore_files: bool,
    ) -> Result<Rewound, EngineError> {
        let record = self.shared.owned_session(tenant, id)?;
        session::ask(&self.shared, &record, |reply| Op::Rewind { message_id, restore_files, reply })?
    }
}

impl SessionActor {
    /// A manual checkpoint, taken on a worker; it may run beside a turn.
    pub(super) fn checkpoint(&mut self, label: Option<String>, reply: Sender<Result<CheckpointRecord, EngineError>>) {
        let (shared, id) = (Arc::clone(&self.shared), self.id.clone());
        self.off_actor(
            false,
            move || {
                let record = owned_record(&shared, &id)?;
                Ok(shared.checkpoints.take(taking(&record, CheckpointKind::Manual, label, None))?)
            },
            reply,
        );
    }

    /// Puts a checkpoint back on a worker; `session_busy` while a turn or another change of
    /// files is under way, and no turn starts until it is done.
    pub(super) fn restore(&mut self, checkpoint: String, reply: Sender<Result<Restored, EngineError>>) {
        if self.turn.is_some() || self.changing_files > 0 {
            let _ = reply.send(Err(EngineError::SessionBusy));
            return;
        }
        let (shared, id) = (Arc::clone(&self.shared), self.id.clone());
        self.off_actor(
            true,
            move || {
                let record = owned_record(&shared, &id)?;
                Ok(shared.checkpoints.restore(taking(&record, CheckpointKind::Safety, None, None), &checkpoint)?)
            },
            reply,
        );
    }

    /// A rewind, on a worker, under the same rule as a restore.
    pub(super) fn rewind(
        &mut self,
        message_id: String,
        restore_files: bool,
        reply: Sender<Result<Rewound, EngineError>>,
    ) {
        if self.turn.is_some() || self.changing_files > 0 {
            let _ = reply.send(Err(EngineError::SessionBusy));
            return;
        }
        let (shared, id, tenant) = (Arc::clone(&self.shared), self.id.clone(), Arc::clone(&self.tenant));
        self.off_actor(true, move || rewind(&shared, &id, &tenant, &message_id, restore_files), reply);
    }
}

/// The session's record, as its actor's worker reads it.
fn owned_record(shared: &Shared, id: &str) -> Result<crate::domain::SessionRecord, EngineError> {
    shared.store.readers().session(id)?.ok_or(EngineError::SessionNotFound)
}

/// Drops `message_id` and what follows it, first putting files back if asked (see
/// `Engine::rewind`).
fn rewind(
    shared: &Shared,
    id: &str,
    tenant: &Arc<str>,
    message_id: &str,
    restore_files: bool,
) -> Result<Rewound, EngineError> {
    let record = owned_record(shared, id)?;
    let readers = shared.store.readers();
    let mut messages = readers.messages(id)?;
    let index = messages.iter().position(|m| m.id == message_id).ok_or(EngineError::MessageNotFound)?;
    if messages[index].role != Role::User {
        return Err(EngineError::InvalidRewindTarget);
    }
    let files = match restore_files {
        true => match readers.first_auto_checkpoint_after(id, index as u64)? {
            Some(before) => {
                let safety = taking(&record, CheckpointKind::Safety, None, None);
                Some(shared.checkpoints.restore(safety, &before.id)?)
            }
            None => None,
        },
        false => None,
    };
    let now = crate::time::now_rfc3339();
    let truncate =
        WriteOp::TruncateMessages { session_id: id.to_string(), from_message_id: message_id.into(), updated_at: now };
    shared.store.write(vec![truncate])?;
    let removed = (messages.len() - index) as u64;
    messages.truncate(index);
    let event = Event::SessionRewound {
        session_id: id.to_string(),
        message_id: message_id.to_string(),
        messages: messages.clone(),
    };
    shared.bus.publish_shared(Some(Arc::clone(tenant)), event);
    shared.publish_summary(&owned_record(shared, id)?);
    Ok(Rewound { removed, messages, files })
}

/// A checkpoint of `record`'s workspace, as it is now.
fn taking(
    record: &crate::domain::SessionRecord,
    kind: CheckpointKind,
    label: Option<String>,
    run_id: Option<String>,
) -> Taking<'_> {
    Taking {
        session_id: &record.summary.id,
        workspace: Path::new(&record.summary.workspace),
        kind,
        label,
        run_id,
        message_count: record.summary.message_count,
    }
}

impl super::run::Run {
    /// The run's automatic checkpoint, taken once, before its first call that can change
    /// files. Checkpoints that are off or a workspace past the limits are no reason to stop
    /// the run: that is logged and the call goes ahead.
    pub(super) fn checkpoint_before_changes(&self) {
        if self.checkpointed.replace(true) {
            return;
        }
        let record = match self.session() {
            Ok(record) => record,
            Err(error) => return log::warn!("run {}: no checkpoint: {error}", self.run_id),
        };
        let label = Some("before the run's changes".to_string());
        let taking = taking(&record, CheckpointKind::Auto, label, Some(self.run_id.clone()));
        match self.shared.checkpoints.take(taking) {
            Ok(_) | Err(CheckpointError::Disabled(_)) => {}
            Err(error) => log::warn!("run {}: no checkpoint: {error}", self.run_id),
        }
    }
}
