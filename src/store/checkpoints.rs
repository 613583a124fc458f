//! Checkpoint manifests: what each checkpoint holds, file by file. The contents themselves
//! are blobs under the data dir (`crate::checkpoints::blobs`), named by their SHA-256.

use rusqlite::{params, OptionalExtension, Transaction};

use super::rows::{self, CHECKPOINT_COLUMNS};
use super::StoreError;

/// Why a checkpoint was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointKind {
    /// Asked for by a client.
    Manual,
    /// Taken before the first call of a run that can change files.
    Auto,
    /// Taken just before a restore or a rewind puts files back, so it can be undone.
    Safety,
}

impl CheckpointKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CheckpointKind::Manual => "manual",
            CheckpointKind::Auto => "auto",
            CheckpointKind::Safety => "safety",
        }
    }

    pub(super) fn parse(text: &str) -> Result<CheckpointKind, StoreError> {
        match text {
            "manual" => Ok(CheckpointKind::Manual),
            "auto" => Ok(CheckpointKind::Auto),
            "safety" => Ok(CheckpointKind::Safety),
            other => Err(StoreError::Corrupt(format!("checkpoint kind {other:?}"))),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointRecord {
    pub id: String,
    pub session_id: String,
    pub label: Option<String>,
    pub kind: CheckpointKind,
    pub created_at: String,
    pub run_id: Option<String>,
    pub file_count: u64,
    pub total_bytes: u64,
    /// The session's message count when it was taken.
    pub message_count: u64,
}

/// A file (with its content's digest) or a directory (no digest) of a checkpoint; `path` is
/// POSIX and relative to the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointEntry {
    pub path: String,
    pub digest: Option<String>,
    pub size: u64,
    /// Unix permission bits.
    pub mode: u32,
}

/// A checkpoint's entries, sorted by path, and their digest: two checkpoints of a session
/// with the same digest hold the same files, and the second shares the first's entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    entries: Vec<CheckpointEntry>,
    pub(super) digest: String,
}

impl Manifest {
    /// Worked out by the capture, off the writer's thread.
    pub fn new(mut entries: Vec<CheckpointEntry>) -> Manifest {
        use sha2::{Digest, Sha256};
        entries.sort_unstable_by(|a, b| a.path.cmp(&b.path));
        let mut hasher = Sha256::new();
        for entry in &entries {
            // A path never holds a NUL; a directory has no digest.
            let digest = entry.digest.as_deref().unwrap_or("-");
            for part in [entry.path.as_bytes(), b"\0", digest.as_bytes(), b"\0"] {
                hasher.update(part);
            }
            hasher.update(entry.size.to_le_bytes());
            hasher.update(entry.mode.to_le_bytes());
        }
        let digest = format!("{:x}", hasher.finalize());
        Manifest { entries, digest }
    }

    pub fn entries(&self) -> &[CheckpointEntry] {
        &self.entries
    }
}

/// Stores a checkpoint and its entries, or, when an earlier checkpoint of the session holds
/// the same files, a reference to that one's.
pub(super) fn insert(tx: &Transaction<'_>, record: &CheckpointRecord, manifest: &Manifest) -> Result<(), StoreError> {
    let shared: Option<i64> = tx
        .prepare_cached(
            "SELECT coalesce(manifest, seq) FROM checkpoints INDEXED BY checkpoints_by_manifest
             WHERE session_id = ?1 AND manifest_digest = ?2 LIMIT 1",
        )?
        .query_row(params![record.session_id, manifest.digest], |row| row.get(0))
        .optional()?;
    tx.prepare_cached(
        "INSERT INTO checkpoints (id, session_id, label, kind, created_at, run_id, file_count, total_bytes,
                                  message_count, manifest, manifest_digest)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    )?
    .execute(params![
        record.id,
        record.session_id,
        record.label,
        record.kind.as_str(),
        record.created_at,
        record.run_id,
        record.file_count as i64,
        record.total_bytes as i64,
        record.message_count as i64,
        shared,
        manifest.digest,
    ])
    .map_err(|error| match error {
        rusqlite::Error::SqliteFailure(e, _) if e.code == rusqlite::ErrorCode::ConstraintViolation => {
            StoreError::MissingSession
        }
        other => other.into(),
    })?;
    if shared.is_some() {
        return Ok(());
    }
    let seq = tx.last_insert_rowid();
    let mut insert = tx.prepare_cached(
        "INSERT INTO checkpoint_entries (checkpoint_seq, path, digest, size, mode) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    for entry in &manifest.entries {
        insert.execute(params![seq, entry.path, entry.digest, entry.size as i64, entry.mode])?;
    }
    Ok(())
}

impl super::contract::CheckpointReads for super::sqlite::Sqlite {
    /// A session's checkpoints, oldest first.
    fn checkpoints(&self, session_id: &str) -> Result<Vec<CheckpointRecord>, StoreError> {
        self.with(|conn| {
            let sql = format!("SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE session_id = ?1 ORDER BY seq");
            let mut statement = conn.prepare_cached(&sql)?;
            let rows = statement.query_map([session_id], |row| Ok(rows::checkpoint(row)))?;
            let mut checkpoints = Vec::new();
            for row in rows {
                checkpoints.push(row??);
            }
            Ok(checkpoints)
        })
    }

    /// One checkpoint of a session.
    fn checkpoint(&self, session_id: &str, id: &str) -> Result<Option<CheckpointRecord>, StoreError> {
        self.with(|conn| {
            let sql = format!("SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE session_id = ?1 AND id = ?2");
            conn.prepare_cached(&sql)?
                .query_row(params![session_id, id], |row| Ok(rows::checkpoint(row)))
                .optional()?
                .transpose()
        })
    }

    /// The automatic checkpoint taken during a run, if it took one.
    fn checkpoint_of_run(&self, session_id: &str, run_id: &str) -> Result<Option<CheckpointRecord>, StoreError> {
        self.with(|conn| {
            let sql = format!(
                "SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE session_id = ?1 AND run_id = ?2 AND kind = 'auto' ORDER BY seq LIMIT 1"
            );
            conn.prepare_cached(&sql)?.query_row(params![session_id, run_id], |row| Ok(rows::checkpoint(row))).optional()?.transpose()
        })
    }

    /// The first automatic checkpoint taken once the session had more than `messages`
    /// messages: the files as they were before any run from that message on changed them.
    fn first_auto_checkpoint_after(
        &self,
        session_id: &str,
        messages: u64,
    ) -> Result<Option<CheckpointRecord>, StoreError> {
        self.with(|conn| {
            let sql = format!(
                "SELECT {CHECKPOINT_COLUMNS} FROM checkpoints
                 WHERE session_id = ?1 AND kind = 'auto' AND message_count > ?2 ORDER BY seq LIMIT 1"
            );
            conn.prepare_cached(&sql)?
                .query_row(params![session_id, messages as i64], |row| Ok(rows::checkpoint(row)))
                .optional()?
                .transpose()
        })
    }

    /// What a checkpoint holds, by path.
    fn checkpoint_entries(&self, id: &str) -> Result<Vec<CheckpointEntry>, StoreError> {
        self.with(|conn| {
            let mut statement = conn.prepare_cached(
                "SELECT e.path, e.digest, e.size, e.mode FROM checkpoints c
                 JOIN checkpoint_entries e ON e.checkpoint_seq = coalesce(c.manifest, c.seq)
                 WHERE c.id = ?1 ORDER BY e.path",
            )?;
            let rows = statement.query_map([id], |row| Ok(rows::checkpoint_entry(row)))?;
            rows.map(|row| row?).collect()
        })
    }

    /// Whether any checkpoint still refers to the blob with this digest.
    fn blob_referenced(&self, digest: &str) -> Result<bool, StoreError> {
        self.with(|conn| {
            let found: Option<i64> = conn
                .prepare_cached("SELECT 1 FROM checkpoint_entries WHERE digest = ?1 LIMIT 1")?
                .query_row([digest], |row| row.get(0))
                .optional()?;
            Ok(found.is_some())
        })
    }
}
