//! Checkpoint manifests in PostgreSQL (`store/checkpoints.rs` says how a manifest is shared
//! by the checkpoints of a session that hold the same files).

use super::super::checkpoints::{CheckpointEntry, CheckpointRecord, Manifest};
use super::super::rows::{self, CHECKPOINT_COLUMNS};
use super::super::StoreError;
use super::conn::{decode, Tx};
use super::Postgres;

pub(super) fn insert(tx: &mut Tx<'_>, record: &CheckpointRecord, manifest: &Manifest) -> Result<(), StoreError> {
    let shared: Option<i64> = tx
        .opt(
            "SELECT coalesce(manifest, seq) FROM checkpoints WHERE session_id = $1 AND manifest_digest = $2 LIMIT 1",
            &[&record.session_id, &manifest.digest],
        )?
        .map(|row| row.get(0));
    let seq: i64 = tx
        .one(
            "INSERT INTO checkpoints (id, session_id, label, kind, created_at, run_id, file_count, total_bytes,
                                      message_count, manifest, manifest_digest)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING seq",
            &[
                &record.id,
                &record.session_id,
                &record.label,
                &record.kind.as_str(),
                &record.created_at,
                &record.run_id,
                &(record.file_count as i64),
                &(record.total_bytes as i64),
                &(record.message_count as i64),
                &shared,
                &manifest.digest,
            ],
        )?
        .get(0);
    if shared.is_some() {
        return Ok(());
    }
    let entries = manifest.entries();
    let paths: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
    let digests: Vec<Option<&str>> = entries.iter().map(|e| e.digest.as_deref()).collect();
    let sizes: Vec<i64> = entries.iter().map(|e| e.size as i64).collect();
    let modes: Vec<i64> = entries.iter().map(|e| i64::from(e.mode)).collect();
    tx.exec(
        "INSERT INTO checkpoint_entries (checkpoint_seq, path, digest, size, mode)
         SELECT $1, path, digest, size, mode FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[])
              AS e(path, digest, size, mode)",
        &[&seq, &paths, &digests, &sizes, &modes],
    )?;
    Ok(())
}

impl super::super::contract::CheckpointReads for Postgres {
    fn checkpoints(&self, session_id: &str) -> Result<Vec<CheckpointRecord>, StoreError> {
        self.with(|conn| {
            let sql = format!("SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE session_id = $1 ORDER BY seq");
            decode(conn.query(&sql, &[&session_id])?, rows::checkpoint)
        })
    }

    fn checkpoint(&self, session_id: &str, id: &str) -> Result<Option<CheckpointRecord>, StoreError> {
        self.with(|conn| {
            let sql = format!("SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE session_id = $1 AND id = $2");
            conn.opt(&sql, &[&session_id, &id])?.map(|row| rows::checkpoint(&row)).transpose()
        })
    }

    fn checkpoint_of_run(&self, session_id: &str, run_id: &str) -> Result<Option<CheckpointRecord>, StoreError> {
        self.with(|conn| {
            let sql = format!(
                "SELECT {CHECKPOINT_COLUMNS} FROM checkpoints
                 WHERE session_id = $1 AND run_id = $2 AND kind = 'auto' ORDER BY seq LIMIT 1"
            );
            conn.opt(&sql, &[&session_id, &run_id])?.map(|row| rows::checkpoint(&row)).transpose()
        })
    }

    fn first_auto_checkpoint_after(
        &self,
        session_id: &str,
        messages: u64,
    ) -> Result<Option<CheckpointRecord>, StoreError> {
        self.with(|conn| {
            let sql = format!(
                "SELECT {CHECKPOINT_COLUMNS} FROM checkpoints
                 WHERE session_id = $1 AND kind = 'auto' AND message_count > $2 ORDER BY seq LIMIT 1"
            );
            conn.opt(&sql, &[&session_id, &(messages as i64)])?.map(|row| rows::checkpoint(&row)).transpose()
        })
    }

    fn checkpoint_entries(&self, id: &str) -> Result<Vec<CheckpointEntry>, StoreError> {
        self.with(|conn| {
            let sql = "SELECT e.path, e.digest, e.size, e.mode FROM checkpoints c
                       JOIN checkpoint_entries e ON e.checkpoint_seq = coalesce(c.manifest, c.seq)
                       WHERE c.id = $1 ORDER BY e.path";
            decode(conn.query(sql, &[&id])?, rows::checkpoint_entry)
        })
    }

    fn blob_referenced(&self, digest: &str) -> Result<bool, StoreError> {
        self.with(|conn| {
            Ok(conn.opt("SELECT 1 FROM checkpoint_entries WHERE digest = $1 LIMIT 1", &[&digest])?.is_some())
        })
    }
}
