//! What the writer drops as it goes, a little at a time so that no commit is held up: the
//! oldest events past the log's capacity (`Trim`), and session moves older than any walk of
//! the session list (`MoveMarks`).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rusqlite::{params, Connection, Transaction};

use super::StoreError;

/// How often the moves of sessions older than any walk are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// Moves older than this are older than any walk (`WALK_TTL_MS`, and a minute's margin).
const MOVES_KEPT: Duration = Duration::from_millis(super::WALK_TTL_MS as u64 + 60_000);

/// The most events a trimming step drops while the writer is idle, and with each commit: what
/// bounds the time a step holds the writer, however far behind the log is after its capacity
/// was lowered. Dropped events are spread over every session's index pages, so a step's cost
/// is mostly those pages: 500 of them are about 10–30 ms on this VM with a 10M-event log.
pub(super) const TRIM_STEP_IDLE: i64 = 500;
pub(super) const TRIM_STEP_COMMIT: i64 = 100;

/// Dropping the oldest events as new ones come (`AppendLog::keep`), but never a BAE
/// session's: that is its history. A step drops a few hundred events at most, as a range on
/// the primary key from where the last step ended; every commit takes a small step, and an
/// idle writer takes larger ones, each its own commit, until the log is within its capacity.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Trim {
    /// Every event below this seq that may be dropped has been; `None` before the first step.
    pub(super) below: Option<u64>,
    /// Every event below this seq may be dropped.
    pub(super) goal: u64,
}

impl Trim {
    pub(super) fn behind(&self) -> bool {
        self.below.unwrap_or(0) < self.goal
    }

    /// After a step tried on a copy (`tried`) in a transaction of its own: its progress if
    /// it committed; if not, the goal is given up until the next append sets it again.
    pub(super) fn settle(&mut self, stepped: Result<(), StoreError>, tried: Trim) {
        match stepped {
            Ok(()) => *self = tried,
            Err(error) => {
                log::warn!("dropping the oldest events failed: {error}");
                self.goal = self.below.unwrap_or(0);
            }
        }
    }

    pub(super) fn step(&mut self, tx: &Transaction<'_>, most: i64) -> Result<(), StoreError> {
        if !self.behind() {
            return Ok(());
        }
        let from = match self.below {
            Some(below) => below as i64,
            None => tx.query_row("SELECT coalesce(min(seq), 0) FROM events", [], |row| row.get(0))?,
        };
        let last: Option<i64> = tx
            .prepare_cached(
                "SELECT max(seq) FROM (SELECT seq FROM events WHERE seq >= ?1 AND seq < ?2 ORDER BY seq LIMIT ?3)",
            )?
            .query_row(params![from, self.goal as i64, most], |row| row.get(0))?;
        let Some(last) = last else {
            self.below = Some(self.goal);
            return Ok(());
        };
        tx.prepare_cached("DELETE FROM events WHERE seq >= ?1 AND seq <= ?2 AND tenant IS NOT ?3")?
            .execute(params![from, last, super::BAE_TENANT])?;
        self.below = Some(last as u64 + 1);
        Ok(())
    }
}

/// When the last move had which tick: `(when, tick)`.
pub(super) type Mark = (Instant, i64);

/// The last move's tick at each prune, oldest first: ticks no later than one marked more than
/// `MOVES_KEPT` ago are older than any walk.
pub(super) struct MoveMarks(VecDeque<Mark>);

impl MoveMarks {
    pub(super) fn open(conn: &Connection) -> Result<MoveMarks, StoreError> {
        Ok(MoveMarks::starting_at(last_move(conn)?))
    }

    /// Marks that start with the last move's tick now.
    pub(super) fn starting_at(tick: i64) -> MoveMarks {
        MoveMarks(VecDeque::from([(Instant::now(), tick)]))
    }

    /// Whether it is time to prune, and if so the tick at and below which moves are older
    /// than any walk (`None`: none is yet).
    pub(super) fn due(&self) -> Option<Option<i64>> {
        due(&self.0)
    }

    /// Drops the moves older than any walk, if it is time; the mark to keep once `tx` commits.
    pub(super) fn prune(&self, tx: &Transaction<'_>) -> Result<Option<Mark>, StoreError> {
        prune_moves(&self.0, tx)
    }

    pub(super) fn keep(&mut self, mark: Mark) {
        self.0.push_back(mark);
        while self.0.front().is_some_and(|(at, _)| at.elapsed() > MOVES_KEPT + PRUNE_EVERY) {
            self.0.pop_front();
        }
    }
}

/// Once every `PRUNE_EVERY`, drops the moves older than any walk: a range of the primary
/// key, about a minute's moves. The last move stays, so that ticks never go back. The mark
/// to keep once this commits.
fn prune_moves(marks: &VecDeque<Mark>, tx: &Transaction<'_>) -> Result<Option<Mark>, StoreError> {
    let Some(older) = due(marks) else { return Ok(None) };
    if let Some(tick) = older {
        tx.prepare_cached(
            "DELETE FROM session_moves WHERE tick <= ?1 AND tick < (SELECT max(tick) FROM session_moves)",
        )?
        .execute([tick])?;
    }
    Ok(Some((Instant::now(), last_move(tx)?)))
}

fn due(marks: &VecDeque<Mark>) -> Option<Option<i64>> {
    if marks.back().is_some_and(|(at, _)| at.elapsed() < PRUNE_EVERY) {
        return None;
    }
    Some(marks.iter().rev().find(|(at, _)| at.elapsed() > MOVES_KEPT).map(|(_, tick)| *tick))
}

/// The tick of the last move of a session (`session_moves`), or 0.
fn last_move(conn: &Connection) -> Result<i64, StoreError> {
    Ok(conn.query_row("SELECT coalesce(max(tick), 0) FROM session_moves", [], |row| row.get(0))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Moves are dropped by the mark older than any walk, never the last one (ticks must
    /// not go back), and not again before `PRUNE_EVERY`.
    #[test]
    fn moves_older_than_any_walk_are_pruned_but_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = Connection::open(dir.path().join("kestrel.db")).unwrap();
        super::super::migrate::migrate(&mut conn).unwrap();
        let tx = conn.transaction().unwrap();
        for n in 0..5 {
            tx.execute("INSERT INTO session_moves (session_id) VALUES (?1)", [format!("s{n}")]).unwrap();
        }
        let now = Instant::now();
        let long_ago = now - MOVES_KEPT - Duration::from_secs(1);
        let recent = now - PRUNE_EVERY / 2;
        // Pruned not long ago: nothing.
        assert!(prune_moves(&[(long_ago, 3), (recent, 5)].into(), &tx).unwrap().is_none());
        let ticks = |tx: &rusqlite::Transaction<'_>| -> Vec<i64> {
            let mut statement = tx.prepare("SELECT tick FROM session_moves ORDER BY tick").unwrap();
            statement.query_map([], |row| row.get(0)).unwrap().collect::<Result<_, _>>().unwrap()
        };
        assert_eq!(ticks(&tx), [1, 2, 3, 4, 5]);
        let before = now - PRUNE_EVERY * 2;
        let (_, last) = prune_moves(&[(long_ago, 3), (before, 5)].into(), &tx).unwrap().unwrap();
        assert_eq!((ticks(&tx), last), (vec![4, 5], 5), "up to the mark older than any walk");
        let (_, last) = prune_moves(&[(long_ago, 9)].into(), &tx).unwrap().unwrap();
        assert_eq!((ticks(&tx), last), (vec![5], 5), "the last move stays");
        tx.execute("INSERT INTO session_moves (session_id) VALUES ('next')", []).unwrap();
        assert_eq!(ticks(&tx), [5, 6], "and the next tick follows it");
    }
}
