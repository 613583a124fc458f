//! A workspace as a checkpoint sees it: its regular files and directories, by POSIX path,
//! leaving out what the ignore rules name. Symbolic links, FIFOs, sockets and devices are not
//! followed, not opened and not kept.
//!
//! The walk goes through directory handles (`dirfd::Dir`), never paths: a directory swapped
//! for a link mid-walk is not entered, a file swapped for a link or a FIFO is not read (each
//! is opened with `O_NOFOLLOW | O_NONBLOCK` and checked to be regular on the opened handle),
//! and what is read counts against the byte limit as it is read, so a file that grew since it
//! was listed cannot carry a checkpoint past `max_bytes`. It stops at the first entry after
//! its `stop` flag is set (a capture abandoned for taking too long).

use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, Ordering};

use super::ignore::IgnoreRules;
use crate::dirfd::{Dir, Entry, Kind, ReadError};

/// A file or directory found in a workspace.
#[derive(Debug, Clone)]
pub struct Found {
    pub path: String,
    pub is_dir: bool,
    pub size: u64,
    pub mode: u32,
    /// A file's content digest, when the walk captured contents.
    pub digest: Option<String>,
}

/// How much a checkpoint may hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_files: u64,
    pub max_bytes: u64,
}

/// Directories nested deeper than this are past a limit (each level holds a descriptor open).
pub const MAX_DEPTH: usize = 256;

/// The longest `.gitignore` read; the rest is not.
const IGNORE_FILE_LIMIT: u64 = 1024 * 1024;

/// Why a workspace cannot be walked.
#[derive(Debug)]
pub enum WalkError {
    /// Past a limit: the reason, for people.
    TooLarge(String),
    /// The walk was told to stop.
    Stopped,
    Io(std::io::Error),
}

/// What a walk that captures does with each regular file: the digest of a file known
/// unchanged since it was last read, or of the content it reads.
pub trait Keep {
    /// The digest of a file its `lstat` entry shows unchanged, which is then not read.
    fn known(&mut self, _path: &str, _entry: &Entry) -> Option<String> {
        None
    }

    /// Keeps the content of a file read through a handle that `opened` describes (its
    /// `fstat`, taken before the read); its digest.
    fn keep(&mut self, path: &str, opened: &Entry, content: &[u8]) -> std::io::Result<String>;
}

impl<F: FnMut(&[u8]) -> std::io::Result<String>> Keep for F {
    fn keep(&mut self, _path: &str, _opened: &Entry, content: &[u8]) -> std::io::Result<String> {
        self(content)
    }
}

struct Walk<'a> {
    limits: Limits,
    rules: IgnoreRules,
    files: u64,
    bytes: u64,
    keep: Option<&'a mut dyn Keep>,
    stop: &'a AtomicBool,
    found: Vec<Found>,
}

/// Every file and directory of `root` not ignored, by path (parents before children). With
/// `keep`, every file it does not know is read and given to it.
pub fn walk<'a>(
    root: &Dir,
    limits: Limits,
    keep: Option<&'a mut dyn Keep>,
    stop: &'a AtomicBool,
) -> Result<Vec<Found>, WalkError> {
    let rules = match root.read_file(OsStr::new(".gitignore"), IGNORE_FILE_LIMIT) {
        Ok((text, _)) => IgnoreRules::parse(&String::from_utf8_lossy(&text)),
        Err(_) => IgnoreRules::default(),
    };
    let mut walk = Walk { limits, rules, files: 0, bytes: 0, keep, stop, found: Vec::new() };
    walk.directory(root, "", 0)?;
    let mut found = walk.found;
    found.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(found)
}

impl Walk<'_> {
    fn directory(&mut self, dir: &Dir, prefix: &str, depth: usize) -> Result<(), WalkError> {
        if depth > MAX_DEPTH {
            return Err(WalkError::TooLarge(format!("the workspace nests directories deeper than {MAX_DEPTH}")));
        }
        let mut entries = dir.entries().map_err(WalkError::Io)?;
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        for entry in entries {
            if self.stop.load(Ordering::Relaxed) {
                return Err(WalkError::Stopped);
            }
            // Names that are not UTF-8 are not kept (a manifest's paths are text).
            let Some(name) = entry.name.to_str() else { continue };
            let path = if prefix.is_empty() { name.to_string() } else { format!("{prefix}/{name}") };
            let is_dir = entry.kind == Kind::Dir;
            if !(is_dir || entry.kind == Kind::File) || self.rules.ignores(&path, is_dir) {
                continue;
            }
            if is_dir {
                // Swapped for a link or removed since the listing: not part of this walk.
                let Ok(child) = dir.dir(&entry.name) else { continue };
                self.found.push(Found { path: path.clone(), is_dir, size: 0, mode: entry.mode, digest: None });
                self.directory(&child, &path, depth + 1)?;
            } else if let Some(found) = self.file(dir, &entry, path)? {
                self.found.push(found);
            }
        }
        Ok(())
    }

    /// A regular file, counted against the limits and (with `keep`) read; `None` when it is
    /// no longer a regular file by that name.
    fn file(&mut self, dir: &Dir, entry: &Entry, path: String) -> Result<Option<Found>, WalkError> {
        self.files += 1;
        if self.files > self.limits.max_files {
            return Err(WalkError::TooLarge(format!(
                "the workspace has more than {} files (checkpoints.max_files)",
                self.limits.max_files
            )));
        }
        let room = self.limits.max_bytes.saturating_sub(self.bytes);
        let known = match self.keep.as_mut() {
            Some(keep) => keep.known(&path, entry),
            None => {
                self.count(entry.size)?;
                return Ok(Some(Found { path, is_dir: false, size: entry.size, mode: entry.mode, digest: None }));
            }
        };
        if let Some(digest) = known {
            self.count(entry.size)?;
            return Ok(Some(Found { path, is_dir: false, size: entry.size, mode: entry.mode, digest: Some(digest) }));
        }
        let (content, opened) = match dir.read_file(&entry.name, room) {
            Ok(read) => read,
            Err(ReadError::TooLarge) => return Err(self.too_many_bytes()),
            // Gone, or swapped for a link, a FIFO or a directory since the listing.
            Err(ReadError::Io(_)) => return Ok(None),
        };
        self.count(content.len() as u64)?;
        let Some(keep) = self.keep.as_mut() else { return Ok(None) };
        let digest = keep.keep(&path, &opened, &content).map_err(WalkError::Io)?;
        let size = content.len() as u64;
        Ok(Some(Found { path, is_dir: false, size, mode: opened.mode, digest: Some(digest) }))
    }

    fn count(&mut self, bytes: u64) -> Result<(), WalkError> {
        self.bytes += bytes;
        match self.bytes > self.limits.max_bytes {
            true => Err(self.too_many_bytes()),
            false => Ok(()),
        }
    }

    fn too_many_bytes(&self) -> WalkError {
        WalkError::TooLarge(format!(
            "the workspace holds more than {} bytes (checkpoints.max_bytes)",
            self.limits.max_bytes
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// The walk reads files in name order; while it reads `a`, `b` becomes a link to a large
    /// outside file and `c` a FIFO, as a racer would make them between listing and reading.
    #[test]
    fn entries_swapped_after_the_listing_are_neither_followed_nor_opened() {
        let (root, outside) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::write(outside.path().join("big"), vec![b'S'; 4096]).unwrap();
        for name in ["a", "b", "c", "d"] {
            std::fs::write(root.path().join(name), name).unwrap();
        }
        let (workspace, big) = (root.path().to_path_buf(), outside.path().join("big"));
        let mut read = Vec::new();
        let mut keep = |content: &[u8]| {
            if content == b"a" {
                std::fs::remove_file(workspace.join("b")).unwrap();
                symlink(&big, workspace.join("b")).unwrap();
                std::fs::remove_file(workspace.join("c")).unwrap();
                nix::unistd::mkfifo(&workspace.join("c"), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
            }
            read.push(content.to_vec());
            Ok(String::from_utf8_lossy(content).into_owned())
        };
        let limits = Limits { max_files: 10, max_bytes: 100 };
        let dir = Dir::open(root.path()).unwrap();
        let found = walk(&dir, limits, Some(&mut keep), &AtomicBool::new(false)).unwrap();
        let paths: Vec<&str> = found.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["a", "d"], "the link and the FIFO are not part of the checkpoint");
        assert_eq!(read, [b"a".to_vec(), b"d".to_vec()]);
    }

    #[test]
    fn a_file_that_grew_past_the_limit_since_the_listing_is_refused() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("a"), "a").unwrap();
        std::fs::write(root.path().join("b"), "b").unwrap();
        let grow = root.path().join("b");
        let mut keep = |content: &[u8]| {
            std::fs::write(&grow, vec![b'x'; 1000]).unwrap();
            Ok(String::from_utf8_lossy(content).into_owned())
        };
        let dir = Dir::open(root.path()).unwrap();
        let limits = Limits { max_files: 10, max_bytes: 100 };
        let outcome = walk(&dir, limits, Some(&mut keep), &AtomicBool::new(false));
        assert!(matches!(outcome, Err(WalkError::TooLarge(_))), "{outcome:?}");
    }
}
