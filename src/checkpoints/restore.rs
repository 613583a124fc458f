//! Putting a checkpoint back: into the session's workspace after a safety checkpoint (a
//! restore), or into a new directory (a fork's copy), through directory handles that never
//! follow a link.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::Write;
use std::path::Path;

use super::{CheckpointError, CheckpointKind, Checkpoints, Restored, Taking};
use crate::dirfd::{Dir, Kind};
use crate::store::CheckpointEntry;

impl Checkpoints {
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
        let root = Dir::open(workspace)?;
        let warnings = self.put_back(&root, &target, &current);
        Ok(Restored { restored, safety, warnings })
    }

    /// Writes checkpoint `id` of `session_id` into `directory`, a new empty one (a fork's
    /// copy of the workspace); what could not be written, one line each.
    pub fn copy_into(&self, session_id: &str, id: &str, directory: &Path) -> Result<Vec<String>, CheckpointError> {
        let copied = self.store.readers().checkpoint(session_id, id)?.ok_or(CheckpointError::NotFound)?;
        let target = self.store.readers().checkpoint_entries(&copied.id)?;
        let root = Dir::open(directory)?;
        Ok(self.put_back(&root, &target, &[]))
    }

    /// Makes the workspace's kept files what `target` says, given what they are (`current`).
    fn put_back(&self, root: &Dir, target: &[CheckpointEntry], current: &[CheckpointEntry]) -> Vec<String> {
        let mut warnings = Vec::new();
        let wanted: HashMap<&str, &CheckpointEntry> = target.iter().map(|e| (e.path.as_str(), e)).collect();
        // Made since: deepest first, so a directory is empty by the time its turn comes. A
        // directory still holding ignored files stays.
        for entry in current.iter().rev().filter(|e| !wanted.contains_key(e.path.as_str())) {
            let (parent, name) = split(&entry.path);
            let removed = root.descend(parent).and_then(|dir| match entry.digest {
                Some(_) => dir.remove_file(OsStr::new(name)),
                None => dir.remove_dir(OsStr::new(name)),
            });
            if let Err(error) = removed {
                let benign =
                    matches!(error.kind(), std::io::ErrorKind::DirectoryNotEmpty | std::io::ErrorKind::NotFound);
                if entry.digest.is_some() || !benign {
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

    /// Writes one entry through directory handles, never through a symbolic link: a link
    /// standing where a directory or a file goes is removed (the link, not its target), and a
    /// directory swapped for a link mid-restore makes this entry fail, never reach outside.
    fn put_one(&self, root: &Dir, entry: &CheckpointEntry) -> std::io::Result<()> {
        let (parent, name) = split(&entry.path);
        let mut dir = root.try_clone()?;
        for part in parent.split('/').filter(|part| !part.is_empty()) {
            dir = real_dir(&dir, OsStr::new(part), 0o755)?;
        }
        let name = OsStr::new(name);
        let Some(digest) = &entry.digest else {
            let made = real_dir(&dir, name, entry.mode)?;
            return chmod_dir(&made, entry.mode);
        };
        if dir.entry(name)?.is_some_and(|found| found.kind == Kind::Dir) {
            dir.remove_all(name)?;
        }
        let content = self.blobs.get(digest)?;
        let temporary = format!(".{}.{}.kestrel-restore", name.to_string_lossy(), uuid::Uuid::new_v4().simple());
        let temporary = OsStr::new(&temporary);
        let written = dir.create_new(temporary).and_then(|mut file| {
            file.write_all(&content)?;
            crate::dirfd::set_mode(&file, entry.mode)
        });
        // A rename replaces a link itself, never what it points at.
        let placed = written.and_then(|()| dir.rename(temporary, name));
        if placed.is_err() {
            let _ = dir.remove_file(temporary);
        }
        placed
    }
}

/// A manifest path's parent directory (`""` at the root) and its name.
fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

/// The real directory `name` in `dir`, made if missing; a file or a link there is removed
/// first (the link itself).
fn real_dir(dir: &Dir, name: &OsStr, mode: u32) -> std::io::Result<Dir> {
    match dir.entry(name)? {
        Some(found) if found.kind == Kind::Dir => {}
        Some(_) => {
            dir.remove_file(name)?;
            dir.make_dir(name, mode)?;
        }
        None => dir.make_dir(name, mode)?,
    }
    dir.dir(name)
}

/// Sets a directory's permission bits through its handle.
fn chmod_dir(dir: &Dir, mode: u32) -> std::io::Result<()> {
    Ok(nix::sys::stat::fchmod(dir.as_fd(), nix::sys::stat::Mode::from_bits_truncate(mode & 0o7777))?)
}
