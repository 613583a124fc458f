//! The SQLite backend: one database file, one writer thread that owns the write connection
//! and commits batches in group transactions (`writer.rs`), and readers that borrow pooled
//! read-only connections on the caller's thread (`reader.rs`, `bae.rs`, `checkpoints.rs`).
//!
//! It keeps the store contract (`contract.rs`) for any number of processes on one file: every
//! write transaction takes SQLite's write lock at its start (`BEGIN IMMEDIATE`), so they are
//! serialized; seqs are allocated from `meta.seq_last` inside that transaction; a claim is an
//! `UPDATE … WHERE status != 'running'` whose row count is the compare-and-set. Kestrel
//! itself runs one process per data dir (`lock.rs`); the conformance suite opens several.

use std::path::Path;

use crossbeam_channel::{bounded, Sender};
use rusqlite::Connection;

use super::contract::{Claims, Recovery, Reply, Seqs, Writes};
use super::lock::DataDirLock;
use super::reader::ReaderPool;
use super::writer::{Writer, WriterHandle};
use super::{StoreError, WriteOp, WriterMsg};
use crate::domain::SessionStatus;

/// Capacity of the writer's inbox. When it is full, senders block: a burst of writes slows the
/// runs that make them instead of growing memory without bound.
const WRITER_INBOX: usize = 8192;

pub struct Sqlite {
    writer_tx: Sender<WriterMsg>,
    readers: ReaderPool,
}

impl Sqlite {
    /// Opens (creating if needed) the database at `path`, applies migrations and starts its
    /// writer thread; `lock` (the data dir's) is released when the writer's handle goes.
    pub fn open(path: &Path, lock: Option<DataDirLock>) -> Result<(Sqlite, WriterHandle), StoreError> {
        let (writer_tx, inbox) = bounded(WRITER_INBOX);
        let writer = Writer::open(path)?;
        let handle = writer.spawn(inbox, writer_tx.clone(), lock)?;
        Ok((Sqlite { writer_tx, readers: ReaderPool::new(path.to_path_buf()) }, handle))
    }

    pub(super) fn with<T>(&self, query: impl FnOnce(&Connection) -> Result<T, StoreError>) -> Result<T, StoreError> {
        self.readers.with(query)
    }
}

impl Writes for Sqlite {
    fn submit(&self, ops: Vec<WriteOp>, reply: Option<Reply>) -> Result<(), StoreError> {
        self.writer_tx.send(WriterMsg::Write { ops, reply }).map_err(|_| StoreError::Closed)
    }

    fn queue_depth(&self) -> usize {
        self.writer_tx.len()
    }
}

impl Seqs for Sqlite {
    fn last_seq(&self) -> Result<u64, StoreError> {
        self.with(|conn| Ok(conn.query_row(super::writer::LAST_SEQ, [], |row| row.get::<_, i64>(0))? as u64))
    }
}

impl Claims for Sqlite {}

impl Recovery for Sqlite {
    fn recover(&self, node: &str, at: &str) -> Result<Vec<String>, StoreError> {
        // What this node held, read first; the write ends exactly those (no other node's
        // claim matches, and this node claims nothing before its recovery).
        let held = self.with(|conn| {
            let mut statement = conn.prepare_cached(
                "SELECT id FROM sessions WHERE status = 'running' AND (node = ?1 OR node IS NULL) ORDER BY id",
            )?;
            let rows = statement.query_map([node], |row| row.get::<_, String>(0))?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })?;
        self.submit_and_wait(vec![WriteOp::RecoverTurns { node: node.to_string(), at: at.to_string() }])?;
        Ok(held)
    }
}

impl super::rows::Cells for rusqlite::Row<'_> {
    fn text(&self, index: usize) -> Result<String, StoreError> {
        Ok(self.get(index)?)
    }

    fn opt_text(&self, index: usize) -> Result<Option<String>, StoreError> {
        Ok(self.get(index)?)
    }

    fn int(&self, index: usize) -> Result<i64, StoreError> {
        Ok(self.get(index)?)
    }

    fn opt_int(&self, index: usize) -> Result<Option<i64>, StoreError> {
        Ok(self.get(index)?)
    }
}

/// A session's status as the claim columns see it (for the writer).
pub(super) fn running() -> &'static str {
    SessionStatus::Running.as_str()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    #[test]
    fn sqlite_keeps_the_store_contract() {
        super::super::conformance::run_all(&|path| {
            let (backend, handle) = super::Sqlite::open(path, None)?;
            let backend: Arc<dyn super::super::Backend> = Arc::new(backend);
            Ok((backend, Box::new(move || handle.shutdown())))
        });
    }
}
