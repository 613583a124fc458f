//! Checkpoints: snapshots of a session's workspace, and putting one back.
//!
//! A checkpoint is a manifest in SQLite (every file's path, digest, size and mode, every
//! directory's path) over blobs stored once each by content (`blobs.rs`), so a checkpoint of an
//! unchanged tree adds rows, not copies. What is left out is `ignore.rs`'s business; symbolic
//! links and names that are not UTF-8 are not kept. Callers are the session's actor (manual
//! checkpoints, restores) and its turn's worker (the automatic one before a run's first
//! changing tool call), so a restore never races a run.

pub mod blobs;
pub mod ignore;
pub mod tree;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use blobs::BlobStore;
use tree::{Found, Limits, WalkError};

use crate::store::{CheckpointEntry, CheckpointKind, CheckpointRecord, Store, StoreError, WriteOp};

/// `[checkpoints]` in the config file.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointConfig {
    pub enabled: bool,
    /// A workspace with more files than this (ignored ones aside) is not checkpointed.
    pub max_files: u64,
    /// Nor one holding more bytes than this.
    pub max_bytes: u64,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig { enabled: true, max_files: 20_000, max_bytes: 512 * 1024 * 1024 }
    }
}

#[derive(Debug)]
pub enum CheckpointError {
    /// Checkpoints are off, or the workspace is past a limit: the reason, for people.
    Disabled(String),
    NotFound,
    Io(std::io::Error),
    Store(StoreError),
}

impl From<StoreError> for CheckpointError {
    fn from(error: StoreError) -> Self {
        CheckpointError::Store(error)
    }
}

impl From<std::io::Error> for CheckpointError {
    fn from(error: std::io::Error) -> Self {
        CheckpointError::Io(error)
    }
}

impl std::fmt::Display for CheckpointError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CheckpointError::Disabled(reason) => write!(f, "checkpoints are disabled: {reason}"),
            CheckpointError::NotFound => write!(f, "no such checkpoint"),
            CheckpointError::Io(error) => write!(f, "workspace: {error}"),
            CheckpointError::Store(error) => write!(f, "{error}"),
        }
    }
}

/// What a restore did: the checkpoint put back, the one taken just before, and what could
/// not be put back (a partial restore), for people.
#[derive(Debug)]
pub struct Restored {
    pub restored: CheckpointRecord,
    pub safety: CheckpointRecord,
    pub warnings: Vec<String>,
}

/// What a checkpoint records about one taking: who asked, why, for which run.
pub struct Taking<'a> {
    pub session_id: &'a str,
    pub workspace: &'a Path,
    pub kind: CheckpointKind,
    pub label: Option<String>,
    pub run_id: Option<String>,
    /// The session's message count now.
    pub message_count: u64,
}

pub struct Checkpoints {
    store: Store,
    blobs: BlobStore,
    config: CheckpointConfig,
}

impl Checkpoints {
    pub fn new(store: Store, data_dir: &Path, config: CheckpointConfig) -> Checkpoints {
        Checkpoints { store, blobs: BlobStore::new(data_dir), config }
    }

    fn limits(&self) -> Limits {
        Limits { max_files: self.config.max_files, max_bytes: self.config.max_bytes }
    }

    /// Whether `workspace` can be checkpointed; why not if it cannot.
    pub fn status(&self, workspace: &Path) -> Result<(), String> {
        if !self.config.enabled {
            return Err("checkpoints are switched off in the config (checkpoints.enabled)".into());
        }
        match tree::walk(workspace, self.limits()) {
            Ok(_) => Ok(()),
            Err(WalkError::TooLarge(reason)) => Err(reason),
            Err(WalkError::Io(error)) => Err(format!("the workspace cannot be read: {error}")),
        }
    }

    /// Snapshots the workspace: new contents become blobs, then the manifest commits.
    pub fn take(&self, taking: Taking<'_>) -> Result<CheckpointRecord, CheckpointError> {
        let found = self.walk(taking.workspace)?;
        let (entries, _) = self.capture(&found)?;
        let record = CheckpointRecord {
            id: format!("chk_{}", uuid::Uuid::new_v4().simple()),
            session_id: taking.session_id.to_string(),
            label: taking.label,
            kind: taking.kind,
            created_at: crate::time::now_rfc3339(),
            run_id: taking.run_id,
            message_count: taking.message_count,
            file_count: entries.iter().filter(|e| e.digest.is_some()).count() as u64,
            total_bytes: entries.iter().filter(|e| e.digest.is_some()).map(|e| e.size).sum(),
        };
        self.store.write(vec![WriteOp::InsertCheckpoint { record: record.clone(), entries }])?;
        Ok(record)
    }

    fn walk(&self, workspace: &Path) -> Result<Vec<Found>, CheckpointError> {
        if !self.config.enabled {
            return Err(CheckpointError::Disabled("checkpoints are switched off in the config".into()));
        }
        tree::walk(workspace, self.limits()).map_err(|error| match error {
            WalkError::TooLarge(reason) => CheckpointError::Disabled(reason),
            WalkError::Io(error) => CheckpointError::Io(error),
        })
    }

    /// Every found file as a blob, and the manifest entries; the digests of the new blobs.
    fn capture(&self, found: &[Found]) -> Result<(Vec<CheckpointEntry>, Vec<String>), CheckpointError> {
        let mut entries = Vec::with_capacity(found.len());
        let mut new = Vec::new();
        for item in found {
            let stored = match item.is_dir {
                true => None,
                false => {
                    let content = match std::fs::read(&item.absolute) {
                        Ok(content) => content,
                        // Deleted since the walk (a build cleaning up): not part of this one.
                        Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                        Err(error) => return Err(error.into()),
                    };
                    let digest = BlobStore::digest(&content);
                    if self.blobs.put(&digest, &content)? {
                        new.push(digest.clone());
                    }
                    // The size of what was read, should the file have changed since the walk.
                    Some((digest, content.len() as u64))
                }
            };
            let (digest, size) = match stored {
                Some((digest, size)) => (Some(digest), size),
                None => (None, 0),
            };
            entries.push(CheckpointEntry { path: item.path.clone(), digest, size, mode: item.mode });
        }
        if !new.is_empty() {
            self.blobs.sync_dirs(&new)?;
        }
        Ok((entries, new))
    }

    /// Puts checkpoint `id` back, after a safety checkpoint of the workspace as it is:
    /// changed files are rewritten, files made since are deleted, deleted ones recreated.
    pub fn restore(&self, at: Taking<'_>, id: &str) -> Result<Restored, CheckpointError> {
        let (session_id, workspace) = (at.session_id, at.workspace);
        let restored = self.store.readers().checkpoint(session_id, id)?.ok_or(CheckpointError::NotFound)?;
        let label = Some(format!("before restoring {id}"));
        let taking = Taking { kind: CheckpointKind::Safety, label, run_id: None, ..at };
        let safety = self.take(taking)?;
        let target = self.store.readers().checkpoint_entries(&restored.id)?;
        let current = self.store.readers().checkpoint_entries(&safety.id)?;
        let warnings = self.put_back(workspace, &target, &current);
        Ok(Restored { restored, safety, warnings })
    }

    /// Makes the workspace's kept files what `target` says, given what they are (`current`).
    fn put_back(&self, root: &Path, target: &[CheckpointEntry], current: &[CheckpointEntry]) -> Vec<String> {
        let mut warnings = Vec::new();
        let wanted: HashMap<&str, &CheckpointEntry> = target.iter().map(|e| (e.path.as_str(), e)).collect();
        // Made since: deepest first, so a directory is empty by the time its turn comes. A
        // directory still holding ignored files stays.
        for entry in current.iter().rev().filter(|e| !wanted.contains_key(e.path.as_str())) {
            let path = root.join(&entry.path);
            let removed = match entry.digest {
                Some(_) => std::fs::remove_file(&path),
                None => std::fs::remove_dir(&path),
            };
            if let Err(error) = removed {
                if entry.digest.is_some() || error.kind() != std::io::ErrorKind::DirectoryNotEmpty {
                    warnings.push(format!("{}: not removed: {error}", entry.path));
                }
            }
        }
        let now: HashMap<&str, &CheckpointEntry> = current.iter().map(|e| (e.path.as_str(), e)).collect();
        for entry in target {
            let unchanged =
                now.get(entry.path.as_str()).is_some_and(|c| c.digest == entry.digest && c.mode == entry.mode);
            if unchanged {
                continue;
            }
            if let Err(error) = self.put_one(root, entry) {
                warnings.push(format!("{}: not restored: {error}", entry.path));
            }
        }
        warnings
    }

    /// Writes one entry, never through a symbolic link: a link standing where a directory or
    /// file goes is replaced, so a restore cannot write outside the workspace.
    fn put_one(&self, root: &Path, entry: &CheckpointEntry) -> std::io::Result<()> {
        let mut at = root.to_path_buf();
        let parts: Vec<&str> = entry.path.split('/').collect();
        for part in &parts[..parts.len() - 1] {
            at.push(part);
            make_dir(&at)?;
        }
        let path = root.join(&entry.path);
        let Some(digest) = &entry.digest else {
            make_dir(&path)?;
            return std::fs::set_permissions(&path, std::fs::Permissions::from_mode(entry.mode));
        };
        if let Ok(metadata) = std::fs::symlink_metadata(&path) {
            if metadata.is_dir() {
                std::fs::remove_dir_all(&path)?;
            }
        }
        let content = self.blobs.get(digest)?;
        let temporary = temporary_beside(&path);
        std::fs::write(&temporary, &content)?;
        std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(entry.mode))?;
        // A rename replaces a link itself, never what it points at.
        std::fs::rename(&temporary, &path)
    }

    /// Deletes the blobs no checkpoint refers to (after sessions went, with their checkpoints).
    pub fn collect_garbage(&self) -> Result<usize, CheckpointError> {
        let mut removed = 0;
        for digest in self.blobs.digests() {
            if !self.store.readers().blob_referenced(&digest)? {
                self.blobs.remove(&digest)?;
                removed += 1;
            }
        }
        Ok(removed)
    }
}

/// A real directory at `path`: a file or a link there is replaced.
fn make_dir(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(metadata) if metadata.is_dir() => Ok(()),
        Ok(_) => {
            std::fs::remove_file(path)?;
            std::fs::create_dir(path)
        }
        Err(_) => std::fs::create_dir(path),
    }
}

fn temporary_beside(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.kestrel-restore"))
}
