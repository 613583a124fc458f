//! Checkpoint contents in the `blobs` table, so that every process sharing the database reads
//! them. A batch keeps new contents in memory up to `FLUSH_BYTES` (or `FLUSH_BLOBS`) and writes them in a
//! transaction of its own, committed (durable) before `finish` answers; a content already in
//! the table is not sent again.

use std::collections::HashSet;
use std::sync::Arc;

use super::super::StoreError;
use super::conn::Pool;
use crate::checkpoints::blobs::{BlobBatch, Blobs};

/// A batch writes what it holds once it holds this much, or this many blobs (which bounds
/// what one transaction sends).
const FLUSH_BYTES: usize = 8 << 20;
const FLUSH_BLOBS: usize = 256;

pub(super) struct PgBlobs {
    pub(super) pool: Arc<Pool>,
}

fn io(error: StoreError) -> std::io::Error {
    std::io::Error::other(error.to_string())
}

impl Blobs for PgBlobs {
    fn batch(&self) -> Box<dyn BlobBatch + '_> {
        Box::new(PgBatch { blobs: self, pending: Vec::new(), bytes: 0, seen: HashSet::new() })
    }

    fn get(&self, digest: &str) -> std::io::Result<Vec<u8>> {
        let row =
            self.pool.with(|conn| conn.opt("SELECT content FROM blobs WHERE digest = $1", &[&digest])).map_err(io)?;
        row.map(|row| row.get(0))
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, format!("no blob {digest}")))
    }

    fn remove_leftovers(&self) -> std::io::Result<usize> {
        // A batch's transaction commits whole or not at all: nothing is ever left over.
        Ok(0)
    }

    fn remove(&self, digest: &str) -> std::io::Result<()> {
        // Not while a manifest names it: one committed since the caller looked keeps it.
        self.pool
            .with(|conn| {
                let mut tx = conn.transaction()?;
                tx.exec(
                    "DELETE FROM blobs WHERE digest = $1
                     AND NOT EXISTS (SELECT 1 FROM checkpoint_entries WHERE digest = $1)",
                    &[&digest],
                )?;
                tx.commit()
            })
            .map_err(io)
    }

    fn digests(&self) -> std::io::Result<Vec<String>> {
        let rows = self.pool.with(|conn| conn.query("SELECT digest FROM blobs", &[])).map_err(io)?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }
}

struct PgBatch<'a> {
    blobs: &'a PgBlobs,
    pending: Vec<(String, Vec<u8>)>,
    bytes: usize,
    seen: HashSet<String>,
}

impl PgBatch<'_> {
    fn flush(&mut self) -> std::io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let pending = std::mem::take(&mut self.pending);
        self.bytes = 0;
        self.blobs
            .pool
            .with(|conn| {
                let mut tx = conn.transaction()?;
                for (digest, content) in &pending {
                    tx.exec(
                        "INSERT INTO blobs (digest, size, content) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                        &[digest, &(content.len() as i64), content],
                    )?;
                }
                tx.commit()
            })
            .map_err(io)
    }
}

impl BlobBatch for PgBatch<'_> {
    fn put(&mut self, digest: &str, content: &[u8]) -> std::io::Result<bool> {
        if self.seen.contains(digest) {
            return Ok(false);
        }
        let stored = self
            .blobs
            .pool
            .with(|conn| Ok(conn.opt("SELECT 1 FROM blobs WHERE digest = $1", &[&digest])?.is_some()))
            .map_err(io)?;
        self.seen.insert(digest.to_string());
        if stored {
            return Ok(false);
        }
        self.bytes += content.len();
        self.pending.push((digest.to_string(), content.to_vec()));
        if self.bytes >= FLUSH_BYTES || self.pending.len() >= FLUSH_BLOBS {
            self.flush()?;
        }
        Ok(true)
    }

    fn finish(mut self: Box<Self>) -> std::io::Result<()> {
        self.flush()
    }
}
