//! What captures remember of the files they read, so a capture of a workspace that barely
//! changed reads only what did.
//!
//! A file's `Stamp` is what `lstat` says of it: size, modification and change times, inode,
//! device and mode. A file whose stamp is the one remembered has the digest remembered, and is
//! not read again. Two things make that safe:
//! - the change time (`ctime`) is in the stamp. A program can set a file's modification time
//!   back (`touch -d`, `cp -p`, `rsync -t`), but every such call, like every write, sets the
//!   change time to now, which no call can set back; a file replaced by a rename has another
//!   inode;
//! - a file changed shortly before it was read is not remembered ("racily clean", as git
//!   calls it). Filesystem timestamps are coarse (a kernel tick, or seconds on some
//!   filesystems), so a write landing just after the read can leave the stamp as it was. A
//!   stamp is remembered only if both its times are `RACY` older than the capture's start;
//!   such a file is read again by the next capture.
//!
//! The memory is per workspace root (by device and inode), in this process only: after a
//! restart the first capture of each workspace reads everything. It holds at most
//! `MAX_FILES` files in all, forgetting the workspaces used least recently first. Collecting
//! blobs forgets everything (`Checkpoints` does not let a capture run meanwhile), so a digest
//! remembered always names a stored blob.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::dirfd::Entry;

/// How long before a capture's start a file must have last changed to be remembered.
const RACY_NS: u128 = 2_000_000_000;

/// The most files remembered, over every workspace (about 150 bytes each).
const MAX_FILES: usize = 200_000;

/// What `lstat` says of a file, as far as its content could have changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    size: u64,
    modified_ns: u128,
    changed_ns: u128,
    inode: u64,
    device: u64,
    mode: u32,
}

impl Stamp {
    pub fn of(entry: &Entry) -> Stamp {
        Stamp {
            size: entry.size,
            modified_ns: entry.modified_ns,
            changed_ns: entry.changed_ns,
            inode: entry.inode,
            device: entry.device,
            mode: entry.mode,
        }
    }

    /// Whether the file last changed more than `racy_ns` before `started_ns`.
    fn settled(&self, started_ns: u128, racy_ns: u128) -> bool {
        self.modified_ns.max(self.changed_ns).saturating_add(racy_ns) < started_ns
    }
}

/// A workspace's files as its last capture read them: path → (stamp, digest).
pub type Known = HashMap<String, (Stamp, String)>;

/// A workspace root, by device and inode.
pub type Root = (u64, u64);

pub struct StatCache {
    inner: Mutex<Inner>,
    /// `RACY_NS`, but in tests.
    racy_ns: u128,
}

impl Default for StatCache {
    fn default() -> Self {
        StatCache { inner: Mutex::default(), racy_ns: RACY_NS }
    }
}

#[derive(Default)]
struct Inner {
    workspaces: HashMap<Root, (Known, u64)>,
    clock: u64,
    files: usize,
}

impl StatCache {
    /// A cache whose racy window is `racy_ns` (tests, which cannot wait two seconds).
    #[cfg(test)]
    pub fn with_racy_window(racy_ns: u128) -> StatCache {
        StatCache { racy_ns, ..StatCache::default() }
    }

    /// What the last capture of `root` read, taken out: a capture running alongside finds
    /// nothing and reads every file.
    pub fn take(&self, root: Root) -> Known {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let known = inner.workspaces.remove(&root).map(|(known, _)| known).unwrap_or_default();
        inner.files -= known.len();
        known
    }

    /// Remembers what a capture that started at `started_ns` read of `root`, but the files
    /// that changed too shortly before it.
    pub fn remember(&self, root: Root, mut known: Known, started_ns: u128) {
        known.retain(|_, (stamp, _)| stamp.settled(started_ns, self.racy_ns));
        if known.len() > MAX_FILES {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.clock += 1;
        let used = inner.clock;
        inner.files += known.len();
        if let Some((replaced, _)) = inner.workspaces.insert(root, (known, used)) {
            inner.files -= replaced.len();
        }
        while inner.files > MAX_FILES {
            let Some(oldest) = inner.workspaces.iter().min_by_key(|(_, (_, used))| *used).map(|(root, _)| *root) else {
                break;
            };
            if let Some((forgotten, _)) = inner.workspaces.remove(&oldest) {
                inner.files -= forgotten.len();
            }
        }
    }

    pub fn forget_all(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.workspaces.clear();
        inner.files = 0;
    }
}

/// Now, in nanoseconds since the epoch, as file times count.
pub fn now_ns() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(size: u64, changed_ns: u128) -> Stamp {
        Stamp { size, modified_ns: changed_ns, changed_ns, inode: 1, device: 1, mode: 0o644 }
    }

    #[test]
    fn files_changed_just_before_the_capture_are_not_remembered() {
        let cache = StatCache::default();
        let started = 10 * RACY_NS;
        let known: Known = [
            ("old".to_string(), (stamp(1, started - RACY_NS - 1), "a".to_string())),
            ("fresh".to_string(), (stamp(1, started - 1), "b".to_string())),
        ]
        .into();
        cache.remember((1, 1), known, started);
        let known = cache.take((1, 1));
        assert_eq!(known.keys().collect::<Vec<_>>(), ["old"]);
        assert!(cache.take((1, 1)).is_empty(), "taken out");
    }

    #[test]
    fn the_least_recently_used_workspaces_are_forgotten_past_the_limit() {
        let cache = StatCache::default();
        let many = |n: usize| -> Known { (0..n).map(|i| (format!("f{i}"), (stamp(1, 0), "d".to_string()))).collect() };
        cache.remember((1, 1), many(MAX_FILES / 2), RACY_NS * 2);
        cache.remember((1, 2), many(MAX_FILES / 2), RACY_NS * 2);
        cache.remember((1, 3), many(10), RACY_NS * 2);
        assert!(cache.take((1, 1)).is_empty(), "the oldest went");
        assert_eq!(cache.take((1, 2)).len(), MAX_FILES / 2);
        assert_eq!(cache.take((1, 3)).len(), 10);
        cache.remember((1, 4), many(MAX_FILES + 1), RACY_NS * 2);
        assert!(cache.take((1, 4)).is_empty(), "too large to remember at all");
    }
}
