//! A workspace as a checkpoint sees it: its regular files and directories, by POSIX path,
//! leaving out what the ignore rules name. Symbolic links are not followed and not kept.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::ignore::IgnoreRules;

/// A file or directory found in a workspace.
#[derive(Debug, Clone)]
pub struct Found {
    pub path: String,
    pub absolute: PathBuf,
    pub is_dir: bool,
    pub size: u64,
    pub mode: u32,
}

/// How much a checkpoint may hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_files: u64,
    pub max_bytes: u64,
}

/// Why a workspace cannot be walked.
#[derive(Debug)]
pub enum WalkError {
    /// Past a limit: the reason, for people.
    TooLarge(String),
    Io(std::io::Error),
}

/// Every file and directory of `root` not ignored, parents before children, by path.
pub fn walk(root: &Path, limits: Limits) -> Result<Vec<Found>, WalkError> {
    let rules = match std::fs::read_to_string(root.join(".gitignore")) {
        Ok(text) => IgnoreRules::parse(&text),
        Err(_) => IgnoreRules::default(),
    };
    let mut found = Vec::new();
    let (mut files, mut bytes) = (0u64, 0u64);
    let mut pending = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = pending.pop() {
        let listing = match std::fs::read_dir(&dir) {
            Ok(listing) => listing,
            // A directory removed since its parent was listed: not part of this walk.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound && !prefix.is_empty() => continue,
            Err(error) => return Err(WalkError::Io(error)),
        };
        let mut children: Vec<_> = listing.flatten().collect();
        children.sort_by_key(|entry| entry.file_name());
        for child in children {
            let Some(name) = child.file_name().to_str().map(str::to_string) else { continue };
            let path = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
            let Ok(metadata) = std::fs::symlink_metadata(child.path()) else { continue };
            let is_dir = metadata.is_dir();
            if !(is_dir || metadata.is_file()) || rules.ignores(&path, is_dir) {
                continue;
            }
            let mode = metadata.permissions().mode() & 0o7777;
            if is_dir {
                pending.push((child.path(), path.clone()));
            } else {
                files += 1;
                bytes += metadata.len();
                if files > limits.max_files {
                    return Err(WalkError::TooLarge(format!(
                        "the workspace has more than {} files (checkpoints.max_files)",
                        limits.max_files
                    )));
                }
                if bytes > limits.max_bytes {
                    return Err(WalkError::TooLarge(format!(
                        "the workspace holds more than {} bytes (checkpoints.max_bytes)",
                        limits.max_bytes
                    )));
                }
            }
            found.push(Found { path, absolute: child.path(), is_dir, size: metadata.len(), mode });
        }
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(found)
}
