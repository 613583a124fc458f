//! File contents, stored once each under `<data_dir>/blobs/<first two hex>/<sha-256 hex>`.
//! A blob is written to a temporary file, synced, and renamed into place, so a name always
//! holds its whole content; a checkpoint's manifest commits only after its new blobs are.
//!
//! A capture stores its new blobs as one `Batch`: each is written to its temporary file at
//! once, and they are made durable together at the end. Up to `FSYNC_EACH` new blobs (a run
//! that changed a few files) are synced one by one; past that, one `syncfs` of the blob
//! store's filesystem writes them all, which costs one journal commit instead of one per file
//! (it also flushes whatever else is dirty on that filesystem, which is why small batches do
//! not use it). Only then are they renamed into place and their directories synced.

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Where checkpoint contents are kept, by their SHA-256: files under the data dir
/// (`BlobStore`), or a table of the database when the store is shared (PostgreSQL).
pub trait Blobs: Send + Sync {
    /// A batch of new blobs, durable together at `BlobBatch::finish`.
    fn batch(&self) -> Box<dyn BlobBatch + '_>;
    fn get(&self, digest: &str) -> std::io::Result<Vec<u8>>;
    /// Removes what unfinished batches left (a crash mid-capture); how many.
    fn remove_leftovers(&self) -> std::io::Result<usize>;
    /// Removes a blob no checkpoint refers to any more.
    fn remove(&self, digest: &str) -> std::io::Result<()>;
    /// Every stored digest (for collecting unreferenced blobs).
    fn digests(&self) -> std::io::Result<Vec<String>>;
}

/// New blobs being stored; none is named by a manifest before `finish` answers.
pub trait BlobBatch {
    /// Stores `content` under `digest` unless the store or this batch has it; whether it was new.
    fn put(&mut self, digest: &str, content: &[u8]) -> std::io::Result<bool>;
    /// Makes every new blob durable and readable.
    fn finish(self: Box<Self>) -> std::io::Result<()>;
}

/// The digest of `content`.
pub fn digest(content: &[u8]) -> String {
    let hash = Sha256::digest(content);
    hash.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Blob files under `<data_dir>/blobs`.
pub struct BlobStore {
    dir: PathBuf,
}

impl BlobStore {
    pub fn new(data_dir: &Path) -> BlobStore {
        BlobStore { dir: data_dir.join("blobs") }
    }

    /// The digest of `content`.
    pub fn digest(content: &[u8]) -> String {
        digest(content)
    }

    fn path(&self, digest: &str) -> PathBuf {
        self.dir.join(&digest[..2]).join(digest)
    }

    /// Stores `content` under `digest` unless it is there already, durably; whether it was new.
    pub fn put(&self, digest: &str, content: &[u8]) -> std::io::Result<bool> {
        let mut batch = self.batch();
        let new = batch.put(digest, content)?;
        batch.finish()?;
        Ok(new)
    }

    /// A batch of new blobs, durable together at `Batch::finish`.
    pub fn batch(&self) -> Batch<'_> {
        Batch { store: self, pending: Vec::new(), open: Vec::new(), seen: std::collections::HashSet::new() }
    }

    pub fn get(&self, digest: &str) -> std::io::Result<Vec<u8>> {
        std::fs::read(self.path(digest))
    }

    /// Syncs the blob directories, so the renames of new blobs survive a power cut.
    pub fn sync_dirs(&self, digests: &[String]) -> std::io::Result<()> {
        let mut dirs: Vec<PathBuf> = digests.iter().map(|d| self.dir.join(&d[..2])).collect();
        dirs.sort();
        dirs.dedup();
        for dir in dirs.iter().chain(std::iter::once(&self.dir)) {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }

    /// Removes the temporary files of batches that never finished (a crash mid-capture); only
    /// while no batch is being written. How many.
    pub fn remove_leftovers(&self) -> std::io::Result<usize> {
        let Ok(shards) = std::fs::read_dir(&self.dir) else { return Ok(0) };
        let mut removed = 0;
        for shard in shards.flatten().filter_map(|shard| std::fs::read_dir(shard.path()).ok()) {
            for file in shard.flatten().filter(|file| file.file_name().as_encoded_bytes().starts_with(b".")) {
                std::fs::remove_file(file.path())?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Removes a blob no checkpoint refers to any more.
    pub fn remove(&self, digest: &str) -> std::io::Result<()> {
        match std::fs::remove_file(self.path(digest)) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
            _ => Ok(()),
        }
    }

    /// Every stored digest (for collecting unreferenced blobs).
    pub fn digests(&self) -> Vec<String> {
        let Ok(shards) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        shards
            .flatten()
            .filter_map(|shard| std::fs::read_dir(shard.path()).ok())
            .flat_map(|files| files.flatten())
            .filter_map(|file| file.file_name().into_string().ok())
            .filter(|name| name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()))
            .collect()
    }
}

impl Blobs for BlobStore {
    fn batch(&self) -> Box<dyn BlobBatch + '_> {
        Box::new(BlobStore::batch(self))
    }

    fn get(&self, digest: &str) -> std::io::Result<Vec<u8>> {
        BlobStore::get(self, digest)
    }

    fn remove_leftovers(&self) -> std::io::Result<usize> {
        BlobStore::remove_leftovers(self)
    }

    fn remove(&self, digest: &str) -> std::io::Result<()> {
        BlobStore::remove(self, digest)
    }

    fn digests(&self) -> std::io::Result<Vec<String>> {
        Ok(BlobStore::digests(self))
    }
}

impl BlobBatch for Batch<'_> {
    fn put(&mut self, digest: &str, content: &[u8]) -> std::io::Result<bool> {
        Batch::put(self, digest, content)
    }

    fn finish(self: Box<Self>) -> std::io::Result<()> {
        Batch::finish(*self)
    }
}

/// New blobs written to temporary files, not yet durable nor in place.
pub struct Batch<'a> {
    store: &'a BlobStore,
    /// (temporary, final) paths.
    pending: Vec<(PathBuf, PathBuf)>,
    /// The first `FSYNC_EACH` files, kept open to be synced one by one.
    open: Vec<std::fs::File>,
    seen: std::collections::HashSet<String>,
}

/// Batches of up to this many new blobs sync each file; larger ones sync the filesystem once.
const FSYNC_EACH: usize = 8;

impl Batch<'_> {
    /// Writes `content` under `digest` unless the store or this batch has it; whether it was new.
    pub fn put(&mut self, digest: &str, content: &[u8]) -> std::io::Result<bool> {
        let path = self.store.path(digest);
        if self.seen.contains(digest) || path.exists() {
            return Ok(false);
        }
        let parent = path.parent().expect("a blob has a directory");
        std::fs::create_dir_all(parent)?;
        // Unique per call: two checkpoints storing the same content at once must not share
        // (and truncate) one temporary file.
        let temporary = parent.join(format!(".{digest}.{}", uuid::Uuid::new_v4().simple()));
        let mut file = std::fs::File::create(&temporary)?;
        self.pending.push((temporary, path));
        file.write_all(content)?;
        if self.pending.len() <= FSYNC_EACH {
            self.open.push(file);
        } else {
            self.open.clear();
        }
        self.seen.insert(digest.to_string());
        Ok(true)
    }

    /// Makes every new blob durable, puts it in place and makes the renames durable: a few
    /// blobs by syncing each file and then their directories, many by one `syncfs` before
    /// the renames and one after (rather than a sync of each of up to 257 directories).
    pub fn finish(mut self) -> std::io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let few = self.pending.len() <= FSYNC_EACH;
        match few {
            true => self.open.iter().try_for_each(std::fs::File::sync_all)?,
            false => syncfs(&self.store.dir)?,
        }
        self.open.clear();
        for (temporary, path) in std::mem::take(&mut self.pending) {
            std::fs::rename(&temporary, &path)?;
        }
        match few {
            true => self.store.sync_dirs(&self.seen.drain().collect::<Vec<_>>()),
            false => syncfs(&self.store.dir),
        }
    }
}

/// Writes out everything dirty on the filesystem holding `dir`.
fn syncfs(dir: &Path) -> std::io::Result<()> {
    Ok(nix::unistd::syncfs(std::fs::File::open(dir)?)?)
}

impl Drop for Batch<'_> {
    /// A batch abandoned (an error, a capture past its deadline) leaves no temporary file.
    fn drop(&mut self) {
        for (temporary, _) in &self.pending {
            let _ = std::fs::remove_file(temporary);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_content_stored_at_once_from_many_threads() {
        let dir = tempfile::tempdir().unwrap();
        let store = std::sync::Arc::new(BlobStore::new(dir.path()));
        for round in 0..20 {
            let content = format!("round {round}").repeat(10_000).into_bytes();
            let digest = BlobStore::digest(&content);
            let puts: Vec<_> = (0..4)
                .map(|_| {
                    let (store, content, digest) = (store.clone(), content.clone(), digest.clone());
                    std::thread::spawn(move || store.put(&digest, &content))
                })
                .collect();
            for put in puts {
                put.join().unwrap().expect("every put succeeds");
            }
            assert_eq!(store.get(&digest).unwrap(), content);
        }
        assert_eq!(store.digests().len(), 20);
    }
}
