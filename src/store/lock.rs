//! One server per data dir: an exclusive `flock` on `kestrel.lock`, held for the life of the
//! store writer.
//!
//! Two servers on one data dir would each believe they own every run: the second marks the
//! first one's live runs `interrupted`, and a resume through it runs an approved command again.
//! The kernel releases the lock when the process exits, however it exits (`kill -9` included),
//! so a crash never leaves a stale lock behind. The file holds the owner's pid, so a refused
//! server can name it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use super::StoreError;

pub const LOCK_FILE: &str = "kestrel.lock";

pub struct DataDirLock {
    _file: File,
}

impl DataDirLock {
    /// Takes the lock or says who has it.
    pub fn acquire(data_dir: &Path) -> Result<DataDirLock, StoreError> {
        let path = data_dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(StoreError::Io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                let dir = data_dir.canonicalize().unwrap_or_else(|_| PathBuf::from(data_dir));
                return Err(StoreError::Locked { dir, holder: text.trim().parse().ok() });
            }
            Err(std::fs::TryLockError::Error(error)) => return Err(StoreError::Io(error)),
        }
        file.set_len(0).and_then(|()| file.rewind()).map_err(StoreError::Io)?;
        writeln!(file, "{}", std::process::id()).map_err(StoreError::Io)?;
        Ok(DataDirLock { _file: file })
    }
}
