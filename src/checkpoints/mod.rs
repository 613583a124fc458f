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
mod restore;
pub mod stats;
pub mod tree;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use blobs::{BlobStore, Blobs};
use stats::{Known, Stamp, StatCache};
use tree::{Found, Limits, WalkError};

use crate::dirfd::{Dir, Entry};
use crate::store::{CheckpointEntry, CheckpointKind, CheckpointRecord, Manifest, Store, StoreError, WriteOp};

/// `[checkpoints]` in the config file.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointConfig {
    pub enabled: bool,
    /// A workspace with more files than this (ignored ones aside) is not checkpointed.
    pub max_files: u64,
    /// Nor one holding more bytes than this.
    pub max_bytes: u64,
    /// A capture still reading the workspace after this long is abandoned with an error (a
    /// hung network filesystem must not wedge the session).
    pub capture_timeout_secs: u64,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig { enabled: true, max_files: 20_000, max_bytes: 512 * 1024 * 1024, capture_timeout_secs: 120 }
    }
}

#[derive(Debug)]
pub enum CheckpointError {
    /// Checkpoints are off, or the workspace is past a limit: the reason, for people.
    Disabled(String),
    NotFound,
    /// The capture took longer than `capture_timeout_secs` and was abandoned.
    TimedOut(Duration),
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

impl From<WalkError> for CheckpointError {
    fn from(error: WalkError) -> Self {
        match error {
            WalkError::TooLarge(reason) => CheckpointError::Disabled(reason),
            WalkError::Io(error) => CheckpointError::Io(error),
            // Only an abandoned capture is stopped, and its caller has answered already.
            WalkError::Stopped => CheckpointError::TimedOut(Duration::ZERO),
        }
    }
}

impl std::fmt::Display for CheckpointError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CheckpointError::Disabled(reason) => write!(f, "checkpoints are disabled: {reason}"),
            CheckpointError::NotFound => write!(f, "no such checkpoint"),
            CheckpointError::TimedOut(after) => write!(
                f,
                "reading the workspace took longer than {} s (checkpoints.capture_timeout_secs); no checkpoint was taken",
                after.as_secs()
            ),
            CheckpointError::Io(error) => write!(f, "workspace: {error}"),
            CheckpointError::Store(error) => write!(f, "{error}"),
        }
    }
}

/// Why a workspace cannot be checkpointed now (`Checkpoints::status`), for people.
#[derive(Debug)]
pub enum Unavailable {
    /// `checkpoints.enabled` is false.
    Off,
    /// Past `max_files` or `max_bytes`: which, in words.
    TooLarge(String),
    Unreadable(std::io::Error),
    Stopped,
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unavailable::Off => write!(f, "checkpoints are switched off in the config (checkpoints.enabled)"),
            Unavailable::TooLarge(reason) => write!(f, "{reason}"),
            Unavailable::Unreadable(error) => write!(f, "the workspace cannot be read: {error}"),
            Unavailable::Stopped => write!(f, "the workspace listing was stopped"),
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
    blobs: Arc<dyn Blobs>,
    stats: Arc<StatCache>,
    /// Held to read by every taking from its capture to its manifest's commit, and to write
    /// by a collection of blobs, which so never removes a blob a manifest is about to name.
    collecting: RwLock<()>,
    config: CheckpointConfig,
}

impl Checkpoints {
    pub fn new(store: Store, data_dir: &Path, config: CheckpointConfig) -> Checkpoints {
        let blobs = store.blobs().unwrap_or_else(|| Arc::new(BlobStore::new(data_dir)));
        Checkpoints { store, blobs, stats: Arc::default(), collecting: RwLock::new(()), config }
    }

    fn limits(&self) -> Limits {
        Limits { max_files: self.config.max_files, max_bytes: self.config.max_bytes }
    }

    /// Whether `workspace` can be checkpointed; why not if it cannot.
    pub fn status(&self, workspace: &Path) -> Result<(), Unavailable> {
        if !self.config.enabled {
            return Err(Unavailable::Off);
        }
        let listed = Dir::open(workspace)
            .map_err(WalkError::Io)
            .and_then(|root| tree::walk(&root, self.limits(), None, &AtomicBool::new(false)));
        match listed {
            Ok(_) => Ok(()),
            Err(WalkError::TooLarge(reason)) => Err(Unavailable::TooLarge(reason)),
            Err(WalkError::Io(error)) => Err(Unavailable::Unreadable(error)),
            Err(WalkError::Stopped) => Err(Unavailable::Stopped),
        }
    }

    /// Snapshots the workspace: new contents become blobs, then the manifest commits.
    pub fn take(&self, taking: Taking<'_>) -> Result<CheckpointRecord, CheckpointError> {
        if !self.config.enabled {
            return Err(CheckpointError::Disabled("checkpoints are switched off in the config".into()));
        }
        let _taking = self.collecting.read().unwrap_or_else(|e| e.into_inner());
        let found = self.capture(taking.workspace)?;
        let entries: Vec<CheckpointEntry> = found
            .into_iter()
            .map(|item| CheckpointEntry { path: item.path, digest: item.digest, size: item.size, mode: item.mode })
            .collect();
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
        self.store
            .write(vec![WriteOp::InsertCheckpoint { record: record.clone(), manifest: Manifest::new(entries) }])?;
        Ok(record)
    }

    /// Reads the workspace into blobs on a `kestrel-capture` thread, waiting for it at most
    /// `capture_timeout_secs`: past that the capture is told to stop and this answers
    /// `TimedOut`, so the caller (a session's actor) is never held by a hung read.
    fn capture(&self, workspace: &Path) -> Result<Vec<Found>, CheckpointError> {
        let (blobs, stats, limits) = (Arc::clone(&self.blobs), Arc::clone(&self.stats), self.limits());
        let root = workspace.to_path_buf();
        let timeout = Duration::from_secs(self.config.capture_timeout_secs.max(1));
        let captured = with_deadline(timeout, move |stop| capture_tree(&*blobs, &stats, &root, limits, stop))?;
        log::debug!("checkpoint capture read {} of {} files", captured.read, captured.found.len());
        Ok(captured.found)
    }

    /// Deletes the blobs no checkpoint refers to (after sessions went, with their checkpoints).
    pub fn collect_garbage(&self) -> Result<usize, CheckpointError> {
        let _collecting = self.collecting.write().unwrap_or_else(|e| e.into_inner());
        // A remembered digest must name a stored blob.
        self.stats.forget_all();
        self.blobs.remove_leftovers()?;
        let mut removed = 0;
        for digest in self.blobs.digests()? {
            if !self.store.readers().blob_referenced(&digest)? {
                self.blobs.remove(&digest)?;
                removed += 1;
            }
        }
        Ok(removed)
    }
}

/// What a capture found, and how many files it read (the others it knew unchanged).
struct Captured {
    found: Vec<Found>,
    read: usize,
}

/// Reads `root`'s tree into `blobs` (the walk of `tree.rs`), reading only the files `stats`
/// does not know unchanged; the new blobs are durable and in place before it answers, so a
/// manifest naming them can commit.
fn capture_tree(
    blobs: &dyn Blobs,
    stats: &StatCache,
    root: &Path,
    limits: Limits,
    stop: &AtomicBool,
) -> Result<Captured, CheckpointError> {
    let started_ns = stats::now_ns();
    let root = Dir::open(root)?;
    let this = root.itself().map(|entry| (entry.device, entry.inode))?;
    let mut capture = Capture { batch: blobs.batch(), known: stats.take(this), seen: Known::new(), read: 0 };
    let found = tree::walk(&root, limits, Some(&mut capture), stop)?;
    capture.batch.finish()?;
    stats.remember(this, capture.seen, started_ns);
    Ok(Captured { found, read: capture.read })
}

/// A capture's keeping: new contents into a batch of blobs, each file's stamp remembered.
struct Capture<'a> {
    batch: Box<dyn blobs::BlobBatch + 'a>,
    /// What the last capture of this workspace read.
    known: Known,
    /// What this one read or knew.
    seen: Known,
    /// How many files it read.
    read: usize,
}

impl tree::Keep for Capture<'_> {
    fn known(&mut self, path: &str, entry: &Entry) -> Option<String> {
        let (stamp, digest) = self.known.remove_entry(path).filter(|(_, (stamp, _))| *stamp == Stamp::of(entry))?.1;
        self.seen.insert(path.to_string(), (stamp, digest.clone()));
        Some(digest)
    }

    fn keep(&mut self, path: &str, opened: &Entry, content: &[u8]) -> std::io::Result<String> {
        let digest = blobs::digest(content);
        self.batch.put(&digest, content)?;
        self.seen.insert(path.to_string(), (Stamp::of(opened), digest.clone()));
        self.read += 1;
        Ok(digest)
    }
}

/// Runs `work` on a `kestrel-capture` thread and waits for it at most `timeout`; past that
/// its stop flag is set (the walk stops at its next entry) and this answers `TimedOut`.
fn with_deadline<T: Send + 'static>(
    timeout: Duration,
    work: impl FnOnce(&AtomicBool) -> Result<T, CheckpointError> + Send + 'static,
) -> Result<T, CheckpointError> {
    let (done_tx, done) = crossbeam_channel::bounded(1);
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = Arc::clone(&stop);
    std::thread::Builder::new().name("kestrel-capture".into()).spawn(move || {
        let _ = done_tx.send(work(&stopped));
    })?;
    match done.recv_timeout(timeout) {
        Ok(outcome) => outcome,
        Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
            stop.store(true, Ordering::Relaxed);
            Err(CheckpointError::TimedOut(timeout))
        }
        Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
            Err(CheckpointError::Io(std::io::Error::other("the capture thread ended without an answer")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn capture(blobs: &dyn Blobs, stats: &StatCache, root: &Path) -> Captured {
        let limits = Limits { max_files: 1000, max_bytes: 1 << 30 };
        capture_tree(blobs, stats, root, limits, &AtomicBool::new(false)).expect("a capture")
    }

    fn digest_of<'a>(captured: &'a Captured, path: &str) -> &'a str {
        captured.found.iter().find(|f| f.path == path).and_then(|f| f.digest.as_deref()).expect("the file")
    }

    /// Sets a file's modification time back to what it was, as `touch -d`, `cp -p` or
    /// `rsync -t` would after changing it.
    fn set_modified(path: &Path, seconds: i64, nanos: i64) {
        let at = std::time::UNIX_EPOCH + Duration::new(seconds as u64, nanos as u32);
        let file = std::fs::File::options().write(true).open(path).expect("the file");
        file.set_times(std::fs::FileTimes::new().set_modified(at)).expect("utimensat");
    }

    #[test]
    fn an_unchanged_tree_is_not_read_again_and_a_changed_file_is_whatever_its_mtime_says() {
        let (data, workspace) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (blobs, stats) = (BlobStore::new(data.path()), StatCache::with_racy_window(0));
        for i in 0..50 {
            std::fs::write(workspace.path().join(format!("f{i}")), format!("content {i:04}")).unwrap();
        }
        let first = capture(&blobs, &stats, workspace.path());
        assert_eq!(first.read, 50);
        let again = capture(&blobs, &stats, workspace.path());
        assert_eq!(again.read, 0, "nothing changed, nothing read");
        assert_eq!(again.found.len(), 50);
        // Same size, and the modification time put back to the nanosecond: the change time
        // still moved, so the file is read.
        let lied = workspace.path().join("f7");
        let before = std::fs::metadata(&lied).unwrap();
        std::fs::write(&lied, "CONTENT 0007").unwrap();
        set_modified(&lied, before.mtime(), before.mtime_nsec());
        let after = std::fs::metadata(&lied).unwrap();
        assert_eq!(
            (after.len(), after.mtime(), after.mtime_nsec()),
            (before.len(), before.mtime(), before.mtime_nsec())
        );
        let third = capture(&blobs, &stats, workspace.path());
        assert_eq!(third.read, 1);
        assert_eq!(digest_of(&third, "f7"), BlobStore::digest(b"CONTENT 0007"));
        assert_eq!(blobs.get(digest_of(&third, "f7")).unwrap(), b"CONTENT 0007");
        // A file replaced by a rename (another inode) is read too.
        let replacement = workspace.path().join(".new");
        std::fs::write(&replacement, "content 0009").unwrap();
        std::fs::rename(&replacement, workspace.path().join("f8")).unwrap();
        let fourth = capture(&blobs, &stats, workspace.path());
        assert_eq!(fourth.read, 1);
        assert_eq!(digest_of(&fourth, "f8"), BlobStore::digest(b"content 0009"));
    }

    #[test]
    fn a_file_changed_just_before_a_capture_is_read_again_by_the_next() {
        let (data, workspace) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        // The real window: these files all changed within it.
        let (blobs, stats) = (BlobStore::new(data.path()), StatCache::default());
        let file = workspace.path().join("racy");
        std::fs::write(&file, "one").unwrap();
        assert_eq!(capture(&blobs, &stats, workspace.path()).read, 1);
        // Written again at once, in what may be the same timestamp tick, times put back:
        // without the window the stamp could match and the change be missed.
        let before = std::fs::metadata(&file).unwrap();
        std::fs::write(&file, "two").unwrap();
        set_modified(&file, before.mtime(), before.mtime_nsec());
        let second = capture(&blobs, &stats, workspace.path());
        assert_eq!(second.read, 1, "a racily clean file is read again");
        assert_eq!(digest_of(&second, "racy"), BlobStore::digest(b"two"));
    }

    #[test]
    fn collecting_blobs_forgets_every_stamp_and_removes_leftover_temporaries() {
        let (data, workspace) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (store, writer) = Store::open(data.path()).unwrap();
        let mut checkpoints = Checkpoints::new(store, data.path(), CheckpointConfig::default());
        checkpoints.stats = Arc::new(StatCache::with_racy_window(0));
        std::fs::write(workspace.path().join("kept"), "kept").unwrap();
        assert_eq!(capture(&*checkpoints.blobs, &checkpoints.stats, workspace.path()).read, 1);
        let shard = data.path().join("blobs/00");
        std::fs::create_dir_all(&shard).unwrap();
        std::fs::write(shard.join(".00ab.leftover"), "half a blob").unwrap();
        // No manifest names the blob: it is collected, and the stamp naming it forgotten, so
        // the next capture stores the content again rather than naming a missing blob.
        assert_eq!(checkpoints.collect_garbage().unwrap(), 1);
        assert!(!shard.join(".00ab.leftover").exists());
        let again = capture(&*checkpoints.blobs, &checkpoints.stats, workspace.path());
        assert_eq!(again.read, 1);
        assert_eq!(checkpoints.blobs.get(digest_of(&again, "kept")).unwrap(), b"kept");
        writer.shutdown();
    }

    #[test]
    fn a_large_batch_is_durable_and_in_place_and_an_abandoned_one_leaves_nothing() {
        let data = tempfile::tempdir().unwrap();
        let blobs = BlobStore::new(data.path());
        let contents: Vec<Vec<u8>> = (0..40).map(|i| format!("blob {i}").into_bytes()).collect();
        let mut batch = blobs.batch();
        for content in &contents {
            assert!(batch.put(&BlobStore::digest(content), content).unwrap());
        }
        assert!(!batch.put(&BlobStore::digest(&contents[0]), &contents[0]).unwrap(), "once per batch");
        batch.finish().unwrap();
        for content in &contents {
            assert_eq!(&blobs.get(&BlobStore::digest(content)).unwrap(), content);
        }
        let mut abandoned = blobs.batch();
        abandoned.put(&BlobStore::digest(b"never"), b"never").unwrap();
        drop(abandoned);
        assert_eq!(blobs.remove_leftovers().unwrap(), 0, "a dropped batch removed its temporaries");
        assert!(blobs.get(&BlobStore::digest(b"never")).is_err());
    }

    #[test]
    fn a_capture_past_its_deadline_is_abandoned_and_told_to_stop() {
        let (saw_stop_tx, saw_stop) = crossbeam_channel::bounded(1);
        let outcome: Result<(), _> = with_deadline(Duration::from_millis(50), move |stop| {
            // A read that hangs until the capture is abandoned.
            while !stop.load(Ordering::Relaxed) {
                std::thread::park_timeout(Duration::from_millis(5));
            }
            let _ = saw_stop_tx.send(());
            Ok(())
        });
        assert!(matches!(outcome, Err(CheckpointError::TimedOut(_))), "{outcome:?}");
        assert!(outcome.unwrap_err().to_string().contains("checkpoints.capture_timeout_secs"));
        saw_stop.recv_timeout(Duration::from_secs(10)).expect("the work was told to stop");
        assert_eq!(with_deadline(Duration::from_secs(10), |_| Ok(7)).unwrap(), 7);
    }
}
