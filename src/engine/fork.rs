//! Forking a session (`POST /api/sessions/:id/fork`): a new session of the same tenant with
//! the source's transcript up to and including a message, working in the same workspace or
//! in a copy of the workspace as it was at that message, put back from the checkpoints.
//!
//! Which checkpoint: the first automatic one taken after that message (the files just before
//! the next run changed them); when none was, the workspace as it is now, through a manual
//! checkpoint of it. A run's automatic checkpoint is taken before its first change, so a fork
//! at a message in the middle of a run gets the files as they were before that whole run's
//! changes when a later run exists, and as they are now when none does (docs/forks.md).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use crate::checkpoints::ignore::FORKS_DIR;
use crate::checkpoints::Taking;
use crate::dirfd::Dir;
use crate::domain::{new_id, ForkedFrom, Message, SessionDetail, SessionRecord, SessionStatus, SessionSummary};
use crate::store::{CheckpointKind, CheckpointRecord, WriteOp};

use super::{context, Engine, EngineError};

/// Where a fork works.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForkWorkspace {
    /// The source's own directory.
    Share,
    /// A new directory holding the files as they were at the message: `path` when given (it
    /// must not exist yet, and be inside the tenant's roots), else beside the source's.
    Copy { path: Option<PathBuf> },
}

#[derive(Debug, Clone)]
pub struct ForkRequest {
    /// The last message the fork keeps (a visible one); `None`: the whole transcript.
    pub message_id: Option<String>,
    pub workspace: ForkWorkspace,
}

/// A new fork, and for a copy what its files were put back from.
pub struct Forked {
    pub detail: SessionDetail,
    pub copy: Option<CopiedFiles>,
}

pub struct CopiedFiles {
    pub checkpoint: CheckpointRecord,
    /// What could not be written, one line each.
    pub warnings: Vec<String>,
}

impl Engine {
    /// Forks session `id`; the source may be running (its stored transcript is what is copied).
    pub fn fork_session(&self, tenant: &str, id: &str, request: ForkRequest) -> Result<Forked, EngineError> {
        let source = self.shared.owned_session(tenant, id)?;
        let mut messages = self.shared.store.readers().messages(id)?;
        let end = match &request.message_id {
            Some(wanted) => {
                let visible = |m: &Message| m.id == *wanted && !m.flag(context::COMPACTED);
                messages.iter().position(visible).ok_or(EngineError::MessageNotFound)? + 1
            }
            None => messages.len(),
        };
        messages.truncate(end);
        let fork_id = new_id("ses");
        let (workspace, copy) = match &request.workspace {
            ForkWorkspace::Share => (source.summary.workspace.clone(), None),
            ForkWorkspace::Copy { path } => {
                let directory = self.fork_directory(tenant, &source, &fork_id, path.as_deref())?;
                match self.copy_files(&source, end, &directory) {
                    Ok(copied) => (directory.to_string_lossy().into_owned(), Some(copied)),
                    Err(error) => {
                        remove_new_directory(&directory);
                        return Err(error);
                    }
                }
            }
        };
        let forked_from =
            ForkedFrom { session_id: source.summary.id.clone(), message_id: messages.last().map(|m| m.id.clone()) };
        let written = self.write_fork(source, fork_id, workspace.clone(), forked_from, messages);
        // A copy nobody will use (the tenant has no room for the fork) does not stay behind.
        if let (Err(_), Some(_)) = (&written, &copy) {
            remove_new_directory(Path::new(&workspace));
        }
        Ok(Forked { detail: written?, copy })
    }

    /// The fork and its copies of the messages (ids of their own), in one commit.
    fn write_fork(
        &self,
        source: SessionRecord,
        fork_id: String,
        workspace: String,
        forked_from: ForkedFrom,
        messages: Vec<Message>,
    ) -> Result<SessionDetail, EngineError> {
        let now = crate::time::now_rfc3339();
        let summary = SessionSummary {
            id: fork_id.clone(),
            title: format!("{} (fork)", source.summary.title),
            created_at: now.clone(),
            updated_at: now.clone(),
            status: SessionStatus::Idle,
            model: source.summary.model.clone(),
            message_count: 0,
            workspace,
            forked_from: Some(forked_from),
        };
        let record = SessionRecord { summary, tenant: source.tenant, system_prompt: source.system_prompt };
        let mut ops = vec![self.shared.session_room(&record.tenant), WriteOp::InsertSession(record.clone())];
        let copies: Vec<Message> =
            messages.into_iter().map(|message| Message { id: new_id("msg"), ..message }).collect();
        ops.extend(copies.iter().map(|message| WriteOp::AppendMessage {
            session_id: fork_id.clone(),
            message: message.clone(),
            updated_at: now.clone(),
        }));
        self.shared.store.write(ops)?;
        let record = self.shared.store.readers().session(&fork_id)?.ok_or(EngineError::SessionNotFound)?;
        self.shared.publish_created(&record);
        let mut visible = copies;
        visible.retain(|message| !message.flag(context::COMPACTED));
        Ok(SessionDetail { summary: record.summary, messages: visible, system_prompt: record.system_prompt })
    }

    /// Puts the source's files as they were after its first `kept` messages into `directory`.
    fn copy_files(&self, source: &SessionRecord, kept: usize, directory: &Path) -> Result<CopiedFiles, EngineError> {
        let checkpoints = &self.shared.checkpoints;
        let id = &source.summary.id;
        let later = self.shared.store.readers().first_auto_checkpoint_after(id, kept.saturating_sub(1) as u64)?;
        let checkpoint = match later {
            Some(checkpoint) => checkpoint,
            None => checkpoints.take(Taking {
                session_id: id,
                workspace: Path::new(&source.summary.workspace),
                kind: CheckpointKind::Manual,
                label: Some("for a fork".into()),
                run_id: None,
                message_count: source.summary.message_count,
            })?,
        };
        let warnings = checkpoints.copy_into(id, &checkpoint.id, directory)?;
        Ok(CopiedFiles { checkpoint, warnings })
    }

    /// Makes the fork's new, empty directory, inside the tenant's roots: `requested`, or beside
    /// the source's workspace (`<name>-fork-<8 hex>`), or when that is outside the roots (the
    /// workspace is a root itself) `<workspace>/.kestrel-forks/<fork id>`, which the source's
    /// checkpoints leave out. Made through directory handles: a link in its place fails.
    fn fork_directory(
        &self,
        tenant: &str,
        source: &SessionRecord,
        fork_id: &str,
        requested: Option<&Path>,
    ) -> Result<PathBuf, EngineError> {
        let policy = &self.shared.config.workspaces;
        let (parent, name) = match requested {
            Some(path) => split_new(path)?,
            None => {
                let workspace = Path::new(&source.summary.workspace);
                let suffix = &fork_id[fork_id.len().saturating_sub(8)..];
                let beside = workspace
                    .file_name()
                    .zip(workspace.parent())
                    .map(|(name, parent)| (parent.to_path_buf(), format!("{}-fork-{suffix}", name.to_string_lossy())));
                match beside.filter(|(parent, name)| policy.allows(tenant, &parent.join(name)).is_ok()) {
                    Some(beside) => beside,
                    None => {
                        let forks = workspace.join(FORKS_DIR);
                        make_dir(workspace, FORKS_DIR).or_else(|error| match error {
                            EngineError::InvalidWorkspace(_) if forks.is_dir() && !forks.is_symlink() => Ok(()),
                            error => Err(error),
                        })?;
                        (forks, fork_id.to_string())
                    }
                }
            }
        };
        let parent = parent.canonicalize().map_err(|_| invalid(&parent, "is not an existing directory"))?;
        policy.allows(tenant, &parent.join(&name))?;
        make_dir(&parent, &name)?;
        // Checked again once made: a parent swapped for a link meanwhile put it elsewhere.
        let made = parent.join(&name);
        policy.check(tenant, &made).map_err(|refusal| {
            remove_new_directory(&made);
            EngineError::from(refusal)
        })
    }
}

/// A requested fork directory as its parent and its new name.
fn split_new(path: &Path) -> Result<(PathBuf, String), EngineError> {
    if !path.is_absolute() {
        return Err(invalid(path, "must be an absolute path"));
    }
    let name = path.file_name().and_then(OsStr::to_str).filter(|name| *name != "..");
    match (path.parent(), name) {
        (Some(parent), Some(name)) => Ok((parent.to_path_buf(), name.to_string())),
        _ => Err(invalid(path, "does not name a new directory")),
    }
}

/// Makes `parent/name`, which must not exist (a link there included).
fn make_dir(parent: &Path, name: &str) -> Result<(), EngineError> {
    let made = Dir::open(parent).and_then(|dir| dir.make_dir(OsStr::new(name), 0o755));
    made.map_err(|error| match error.kind() {
        std::io::ErrorKind::AlreadyExists => invalid(&parent.join(name), "already exists"),
        _ => invalid(&parent.join(name), &format!("cannot be made ({error})")),
    })
}

fn invalid(path: &Path, why: &str) -> EngineError {
    EngineError::InvalidWorkspace(format!("the fork's workspace {} {why}", path.display()))
}

/// Takes back the directory a failed copy made (it holds only what the copy wrote).
fn remove_new_directory(directory: &Path) {
    let (Some(parent), Some(name)) = (directory.parent(), directory.file_name()) else { return };
    if let Err(error) = Dir::open(parent).and_then(|dir| dir.remove_all(name)) {
        log::warn!("a failed fork's directory {} stays: {error}", directory.display());
    }
}
