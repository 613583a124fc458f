//! File contents, stored once each under `<data_dir>/blobs/<first two hex>/<sha-256 hex>`.
//! A blob is written to a temporary file, synced, and renamed into place, so a name always
//! holds its whole content; a checkpoint's manifest commits only after its new blobs are.

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

pub struct BlobStore {
    dir: PathBuf,
}

impl BlobStore {
    pub fn new(data_dir: &Path) -> BlobStore {
        BlobStore { dir: data_dir.join("blobs") }
    }

    /// The digest of `content`.
    pub fn digest(content: &[u8]) -> String {
        let hash = Sha256::digest(content);
        hash.iter().map(|byte| format!("{byte:02x}")).collect()
    }

    fn path(&self, digest: &str) -> PathBuf {
        self.dir.join(&digest[..2]).join(digest)
    }

    /// Stores `content` under `digest` unless it is there already; whether it was new.
    pub fn put(&self, digest: &str, content: &[u8]) -> std::io::Result<bool> {
        let path = self.path(digest);
        if path.exists() {
            return Ok(false);
        }
        let parent = path.parent().expect("a blob has a directory");
        std::fs::create_dir_all(parent)?;
        // Unique per call: two checkpoints storing the same content at once must not share
        // (and truncate) one temporary file.
        let temporary = parent.join(format!(".{digest}.{}", uuid::Uuid::new_v4().simple()));
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(content)?;
        file.sync_all()?;
        std::fs::rename(&temporary, &path)?;
        Ok(true)
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
