//! The writer thread's loop, for every backend: it blocks on its inbox for the first message,
//! drains whatever else is already queued (up to `MAX_BATCH`) and has the backend commit all
//! of it in one transaction (group commit: a hundred concurrent writes cost one sync, not a
//! hundred). Replies go out only after the commit. A failed batch is tried again one message
//! at a time, so one bad write never fails its neighbours. While the backend has old events
//! to drop, an idle writer drops them a step at a time. It exits on `Shutdown` after
//! committing everything queued before it.

use crossbeam_channel::Receiver;

use super::contract::{Committed, Reply};
use super::{StoreError, WriteOp, WriterMsg};

/// The most messages one transaction takes; bounds the latency a batch adds to its first write.
const MAX_BATCH: usize = 4096;

/// What a backend's writer does with a batch.
pub(super) trait Committer {
    /// Commits every message's ops in one transaction; what each message's log append was
    /// given.
    fn transaction(&mut self, messages: &[&[WriteOp]]) -> Result<Vec<Committed>, StoreError>;
    /// Whether old events are still to be dropped.
    fn trim_behind(&self) -> bool;
    /// One step of dropping them, in a transaction of its own.
    fn trim_while_idle(&mut self);
    /// The most messages one transaction takes.
    fn max_batch(&self) -> usize {
        MAX_BATCH
    }
}

type Batch = Vec<(Vec<WriteOp>, Option<Reply>)>;

/// Runs the writer until `Shutdown` (or every sender is gone).
pub(super) fn run(mut committer: impl Committer, inbox: Receiver<WriterMsg>) {
    let mut batch: Batch = Vec::new();
    loop {
        let mut stop = false;
        let next = match committer.trim_behind() {
            true => inbox.try_recv().map_err(|error| error.is_disconnected()),
            false => inbox.recv().map_err(|_| true),
        };
        match next {
            Ok(WriterMsg::Write { ops, reply }) => batch.push((ops, reply)),
            Ok(WriterMsg::Shutdown) | Err(true) => stop = true,
            Err(false) => {
                // It holds the writer like a commit: it counts as one.
                let started = std::time::Instant::now();
                committer.trim_while_idle();
                crate::metrics::get().writer_commit.observe(started.elapsed().as_secs_f64());
                continue;
            }
        }
        while !stop && batch.len() < committer.max_batch() {
            match inbox.try_recv() {
                Ok(WriterMsg::Write { ops, reply }) => batch.push((ops, reply)),
                Ok(WriterMsg::Shutdown) => stop = true,
                Err(_) => break,
            }
        }
        if !batch.is_empty() {
            commit_batch(&mut committer, &mut batch);
        }
        if stop {
            break;
        }
    }
    log::debug!("store writer stopped");
}

fn commit_batch(committer: &mut impl Committer, batch: &mut Batch) {
    let metrics = crate::metrics::get();
    let operations: usize = batch.iter().map(|(ops, _)| ops.len()).sum();
    metrics.writer_batch.observe(operations as f64);
    let started = std::time::Instant::now();
    let messages: Vec<&[WriteOp]> = batch.iter().map(|(ops, _)| ops.as_slice()).collect();
    let outcome = committer.transaction(&messages);
    metrics.writer_commit.observe(started.elapsed().as_secs_f64());
    match outcome {
        Ok(committed) => {
            for ((_, reply), committed) in batch.drain(..).zip(committed) {
                respond(reply, Ok(committed));
            }
        }
        // The database is away: trying each alone would only wait again.
        Err(error) if batch.len() > 1 && !matches!(error, StoreError::Unavailable(_)) => {
            log::warn!("batch of {} writes failed ({error}); retrying one by one", batch.len());
            for (ops, reply) in batch.drain(..) {
                let result = committer.transaction(&[ops.as_slice()]).map(|mut c| c.remove(0));
                respond(reply, result);
            }
        }
        Err(error) => {
            for (_, reply) in batch.drain(..) {
                respond(reply, Err(error.again()));
            }
        }
    }
}

fn respond(reply: Option<Reply>, result: Result<Committed, StoreError>) {
    match reply {
        Some(reply) => {
            let _ = reply.send(result);
        }
        None => {
            if let Err(error) = result {
                log::error!("a detached write failed: {error}");
            }
        }
    }
}
