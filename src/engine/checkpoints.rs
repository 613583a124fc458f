//! Checkpoints as operations of a session: listing reads on the caller's thread; taking one
//! and restoring one are ops of the session's actor, so a restore never races a run (it is
//! refused while one is active); the automatic checkpoint is taken by the run itself, before
//! its first call that can change files.

use std::path::Path;

use super::session::{self, Op, SessionActor};
use super::{Engine, EngineError};
use crate::checkpoints::{CheckpointError, Restored, Taking};
use crate::store::{CheckpointKind, CheckpointRecord};

/// What `GET /checkpoints` answers: whether checkpoints work here (and why not), and the list.
pub struct CheckpointList {
    pub disabled: Option<String>,
    pub checkpoints: Vec<CheckpointRecord>,
}

impl From<CheckpointError> for EngineError {
    fn from(error: CheckpointError) -> Self {
        match error {
            CheckpointError::Disabled(reason) => EngineError::CheckpointsDisabled(reason),
            CheckpointError::NotFound => EngineError::CheckpointNotFound,
            CheckpointError::Store(error) => error.into(),
            CheckpointError::Io(error) => {
                log::error!("checkpoint: {error}");
                EngineError::Internal("the workspace could not be read or written")
            }
        }
    }
}

impl Engine {
    pub fn checkpoints(&self, tenant: &str, id: &str) -> Result<CheckpointList, EngineError> {
        let record = self.shared.owned_session(tenant, id)?;
        let disabled = self.shared.checkpoints.status(Path::new(&record.summary.workspace)).err();
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

impl SessionActor {
    fn workspace(&self) -> Result<String, EngineError> {
        let record = self.shared.store.readers().session(&self.id)?.ok_or(EngineError::SessionNotFound)?;
        Ok(record.summary.workspace)
    }

    pub(super) fn checkpoint(&self, label: Option<String>) -> Result<CheckpointRecord, EngineError> {
        let workspace = self.workspace()?;
        let taking = Taking {
            session_id: &self.id,
            workspace: Path::new(&workspace),
            kind: CheckpointKind::Manual,
            label,
            run_id: None,
        };
        Ok(self.shared.checkpoints.take(taking)?)
    }

    pub(super) fn restore(&self, checkpoint: &str) -> Result<Restored, EngineError> {
        if self.turn.is_some() {
            return Err(EngineError::SessionBusy);
        }
        let workspace = self.workspace()?;
        Ok(self.shared.checkpoints.restore(&self.id, Path::new(&workspace), checkpoint)?)
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
        let workspace = match self.session() {
            Ok(record) => record.summary.workspace,
            Err(error) => return log::warn!("run {}: no checkpoint: {error}", self.run_id),
        };
        let taking = Taking {
            session_id: &self.session_id,
            workspace: Path::new(&workspace),
            kind: CheckpointKind::Auto,
            label: Some("before the run's changes".into()),
            run_id: Some(self.run_id.clone()),
        };
        match self.shared.checkpoints.take(taking) {
            Ok(_) | Err(CheckpointError::Disabled(_)) => {}
            Err(error) => log::warn!("run {}: no checkpoint: {error}", self.run_id),
        }
    }
}
