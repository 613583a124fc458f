//! The PostgreSQL writer: like SQLite's (`store/writer.rs`), one `kestrel-store` thread owns
//! a connection and runs the loop of `group_commit.rs` (what is queued, in one transaction,
//! replies after the commit); this is how a batch commits in PostgreSQL.
//!
//! When the server goes away (a restart, a failover), a batch whose transaction never reached
//! COMMIT is held while the writer reconnects, for up to `RECONNECT_WAIT`, then committed; a
//! commit whose answer was lost is reported as `Unavailable`, never guessed at. Past the wait
//! every batch answers `Unavailable` until the server is back.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use super::super::contract::Committed;
use super::super::housekeeping::{MoveMarks, Trim, TRIM_STEP_COMMIT, TRIM_STEP_IDLE};
use super::super::{StoreError, WriteOp, WriterHandle, WriterMsg};
use super::conn::{Conn, Tx};

/// The most messages one transaction takes (see `max_batch`).
const MAX_BATCH: usize = 1024;
/// How long a batch waits for the server to come back before it answers `Unavailable`.
const RECONNECT_WAIT: Duration = Duration::from_secs(10);

pub(super) struct Writer {
    url: String,
    conn: Option<Conn>,
    trim: Trim,
    move_marks: MoveMarks,
    /// This node's leases, when it is one of a cluster: each message is checked against them.
    fence: Option<std::sync::Arc<super::super::cluster::LeaseBook>>,
}

/// How a transaction ended.
enum Outcome {
    Committed(Vec<Committed>),
    /// It failed before its COMMIT was sent: nothing of it is in the database.
    Failed(StoreError),
    /// Its COMMIT was sent and no answer came: it may or may not be in.
    Unknown(StoreError),
}

impl Writer {
    pub(super) fn open(
        url: &str,
        conn: Conn,
        fence: Option<std::sync::Arc<super::super::cluster::LeaseBook>>,
    ) -> Result<Writer, StoreError> {
        let mut conn = conn;
        let last_move = conn.one("SELECT value FROM meta WHERE key = 'session_moves'", &[])?.get::<_, i64>(0);
        Ok(Writer {
            url: url.to_string(),
            conn: Some(conn),
            trim: Trim::default(),
            move_marks: MoveMarks::starting_at(last_move),
            fence,
        })
    }

    pub(super) fn spawn(
        self,
        inbox: Receiver<WriterMsg>,
        writer_tx: Sender<WriterMsg>,
        lock: Option<super::super::lock::DataDirLock>,
    ) -> Result<WriterHandle, StoreError> {
        let thread = std::thread::Builder::new()
            .name("kestrel-store".into())
            .spawn(move || super::super::group_commit::run(self, inbox))
            .map_err(StoreError::Io)?;
        Ok(WriterHandle::new(writer_tx, thread, lock))
    }

    /// The connection, made again if the last one was lost.
    fn conn(&mut self) -> Result<&mut Conn, StoreError> {
        if self.conn.as_ref().is_some_and(|conn| conn.client.is_closed()) {
            self.conn = None;
        }
        if self.conn.is_none() {
            let client = super::connect(&self.url).map_err(|e| StoreError::Unavailable(e.to_string()))?;
            log::info!("the store writer reconnected to PostgreSQL");
            self.conn = Some(Conn::new(client));
        }
        Ok(self.conn.as_mut().expect("connected above"))
    }

    fn trim_idle_step(&mut self) {
        let mut trim = self.trim;
        let stepped = self.conn().and_then(|conn| {
            let mut tx = conn.transaction()?;
            trim_step(&mut tx, &mut trim, TRIM_STEP_IDLE)?;
            tx.commit()
        });
        self.trim.settle(stepped, trim);
    }

    /// Commits the messages, waiting out a lost server for up to `RECONNECT_WAIT` as long as
    /// nothing of them may have committed.
    fn transaction_waiting(&mut self, messages: &[&[WriteOp]]) -> Result<Vec<Committed>, StoreError> {
        let deadline = Instant::now() + RECONNECT_WAIT;
        let mut pause = Duration::from_millis(50);
        loop {
            let outcome = match self.conn() {
                Ok(_) => self.transaction(messages),
                Err(error) => Outcome::Failed(error),
            };
            match outcome {
                Outcome::Committed(committed) => return Ok(committed),
                Outcome::Unknown(error) => return Err(error),
                Outcome::Failed(StoreError::Unavailable(why)) if Instant::now() < deadline => {
                    log::warn!("the store waits for PostgreSQL: {why}");
                    self.conn = None;
                    std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Outcome::Failed(error) => return Err(error),
            }
        }
    }

    fn transaction(&mut self, messages: &[&[WriteOp]]) -> Outcome {
        let mut trim = self.trim;
        let due = self.move_marks.due();
        let fence = self.fence.clone();
        let conn = match self.conn() {
            Ok(conn) => conn,
            Err(error) => return Outcome::Failed(error),
        };
        let mut tx = match conn.transaction() {
            Ok(tx) => tx,
            Err(error) => return Outcome::Failed(error),
        };
        let mut committed = Vec::new();
        let applied = (|| {
            let mut appends = super::apply::Appends::default();
            if let Some(book) = &fence {
                // Other nodes' writers take the log's counter and the session list's tick
                // too, in whichever order their ops come: both rows, in one order, first,
                // or two writers each holding one would wait for the other (a deadlock
                // PostgreSQL breaks only after `deadlock_timeout`).
                tx.query(
                    "SELECT key FROM meta WHERE key IN ('seq_last', 'session_moves') ORDER BY key FOR UPDATE",
                    &[],
                )?;
                super::cluster::fence(&mut tx, book, messages)?;
            }
            for ops in messages {
                let mut first_seq = None;
                for op in ops.iter() {
                    if appends.take(op) {
                        continue;
                    }
                    appends.flush(&mut tx)?;
                    if let Some(first) = super::apply::apply(&mut tx, op, &mut trim)? {
                        first_seq = Some(first);
                    }
                }
                committed.push(Committed { first_seq });
            }
            appends.flush(&mut tx)?;
            // Other nodes read what this commit logged once they hear of it (`listen.rs`).
            if fence.is_some() && messages.iter().any(|ops| ops.iter().any(logs_an_event)) {
                tx.exec(
                    "SELECT pg_notify($1, (SELECT value::text FROM meta WHERE key = 'seq_last'))",
                    &[&super::listen::CHANNEL],
                )?;
            }
            trim_step(&mut tx, &mut trim, TRIM_STEP_COMMIT)?;
            due.map(|older| prune_moves(&mut tx, older)).transpose()
        })();
        let mark = match applied {
            Ok(mark) => mark,
            Err(error) => return Outcome::Failed(error),
        };
        if let Err(error) = tx.commit() {
            return match error {
                StoreError::Unavailable(_) => Outcome::Unknown(error),
                other => Outcome::Failed(other),
            };
        }
        if let Some(mark) = mark {
            self.move_marks.keep(mark);
        }
        self.trim = trim;
        Outcome::Committed(committed)
    }
}

/// Whether the op keeps an event in the log (a batch of deltas alone keeps none).
fn logs_an_event(op: &WriteOp) -> bool {
    matches!(op, WriteOp::AppendLog { entries, .. } if entries.iter().any(Option::is_some))
}

/// A step of dropping the oldest events (`Trim`), never a BAE session's.
fn trim_step(tx: &mut Tx<'_>, trim: &mut Trim, most: i64) -> Result<(), StoreError> {
    if !trim.behind() {
        return Ok(());
    }
    let from = match trim.below {
        Some(below) => below as i64,
        None => tx.one("SELECT coalesce(min(seq), 0) FROM events", &[])?.get(0),
    };
    let last: Option<i64> = tx
        .one(
            "SELECT max(seq) FROM (SELECT seq FROM events WHERE seq >= $1 AND seq < $2 ORDER BY seq LIMIT $3) AS step",
            &[&from, &(trim.goal as i64), &most],
        )?
        .get(0);
    let Some(last) = last else {
        trim.below = Some(trim.goal);
        return Ok(());
    };
    tx.exec(
        "DELETE FROM events WHERE seq >= $1 AND seq <= $2 AND tenant IS DISTINCT FROM $3",
        &[&from, &last, &super::super::BAE_TENANT],
    )?;
    trim.below = Some(last as u64 + 1);
    Ok(())
}

/// Drops the moves older than any walk (`older`, see `MoveMarks`) but the last; the mark to
/// keep once this commits.
fn prune_moves(tx: &mut Tx<'_>, older: Option<i64>) -> Result<super::super::housekeeping::Mark, StoreError> {
    if let Some(tick) = older {
        tx.exec(
            "DELETE FROM session_moves WHERE tick <= $1 AND tick < (SELECT max(tick) FROM session_moves)",
            &[&tick],
        )?;
    }
    let last: i64 = tx.one("SELECT value FROM meta WHERE key = 'session_moves'", &[])?.get(0);
    Ok((Instant::now(), last))
}

impl super::super::group_commit::Committer for Writer {
    fn transaction(&mut self, messages: &[&[WriteOp]]) -> Result<Vec<Committed>, StoreError> {
        self.transaction_waiting(messages)
    }

    fn trim_behind(&self) -> bool {
        self.trim.behind()
    }

    fn trim_while_idle(&mut self) {
        self.trim_idle_step()
    }

    /// Every update of a row in a transaction leaves a version the next one steps over: a
    /// batch's appends update their session once (`apply::Appends`), but the counter rows of
    /// `meta` are still updated once per log append, so a transaction takes at most
    /// `MAX_BATCH` messages (`scripts/bench --store postgres`, writer row: 1.1k ev/s with
    /// neither, 3.5k with 128 and no coalescing, 62k with 128, 94k with 1024).
    fn max_batch(&self) -> usize {
        MAX_BATCH
    }
}
