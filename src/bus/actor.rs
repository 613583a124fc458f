//! The bus thread: batches publishes, sends each batch to the log, and fans batches out in
//! order once they commit (see the module above for the channels and bounds).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_channel::{bounded, unbounded, Receiver, Sender};

use super::*;
use crate::store::cluster::LeaseBook;
use crate::store::{Committed, LoggedEvent, Store, StoreError, WriteOp};
use crate::time::StampClock;

/// A published event with its time, waiting for the log to give it its seq.
struct Stamped {
    at: Arc<str>,
    tenant: Option<Arc<str>>,
    origin: Origin,
    event: Arc<Event>,
    /// How the log keeps it (its `seq` set by the log); `None`: not kept (a delta).
    logged: Option<LoggedEvent>,
}

/// An event whose publisher waits for its commit, or that carries writes of its own.
struct Ack {
    to: Option<Sender<u64>>,
    /// Its place in the batch.
    index: usize,
    writes: Vec<WriteOp>,
    /// How many writes it had, once they are moved into a batch's ops.
    count: usize,
}

/// A batch whose log append has been sent: fanned out once it commits.
struct InFlight {
    batch: Vec<Stamped>,
    acks: Vec<Ack>,
    /// The commit's outcome; `None`: deltas alone, numbered here (see `flush`).
    commit: Option<Receiver<Result<Committed, StoreError>>>,
    /// The events' own writes, to write apart should the batch fail.
    writes: Option<Vec<WriteOp>>,
}

struct Subscriber {
    id: u64,
    filter: Filter,
    sender: Sender<Batch>,
    pending: Arc<AtomicUsize>,
}

pub(super) struct BusActor {
    store: Store,
    config: BusConfig,
    /// The last seq handed out, to a logged event or a delta.
    last_seq: u64,
    /// The last seq the store's counter is known to be past: deltas numbered here since
    /// then are at most `DELTA_RUN` (see `flush`).
    persisted: u64,
    next_subscriber_id: u64,
    /// A sender into our own inbox, handed to each `Subscription` so its drop can unsubscribe.
    own_tx: Sender<BusMsg>,
    ring: VecDeque<Arc<Envelope>>,
    /// What the ring's envelopes weigh, all told (`Envelope::weight`).
    ring_bytes: usize,
    /// Deltas numbered here whose batches are still in flight.
    in_flight_len: u64,
    /// Batches sent to the log and not yet committed.
    appending: usize,
    /// Events of this batch that carry writes or have a publisher waiting for the commit.
    acks: Vec<Ack>,
    subscribers: Vec<Subscriber>,
    subscriber_gauge: Arc<AtomicUsize>,
    /// Every envelope's `at`.
    clock: StampClock,
    /// The highest seq other processes are known to have logged (`BusConfig::shared_log`).
    remote: u64,
    /// Deltas other nodes streamed, heard and not yet streamed here, in seq order.
    remote_live: Vec<LoggedEvent>,
    /// In a cluster, this node's leases: it publishes nothing of a session whose lease may
    /// have run out or is lost (`tenure.rs`).
    book: Option<Arc<LeaseBook>>,
}

/// Events read back at a time when catching up with what other processes logged.
const CATCH_UP_PAGE: usize = 512;

impl BusActor {
    /// The actor of a bus whose log's last seq is `last_seq`.
    pub(super) fn new(
        store: Store,
        config: BusConfig,
        last_seq: u64,
        own_tx: Sender<BusMsg>,
        subscriber_gauge: Arc<AtomicUsize>,
    ) -> BusActor {
        BusActor {
            store,
            config,
            last_seq,
            persisted: last_seq,
            next_subscriber_id: 0,
            own_tx,
            ring: VecDeque::with_capacity(config.replay_capacity.min(1 << 16)),
            ring_bytes: 0,
            in_flight_len: 0,
            appending: 0,
            acks: Vec::new(),
            subscribers: Vec::new(),
            subscriber_gauge,
            clock: StampClock::default(),
            remote: last_seq,
            remote_live: Vec::new(),
            book: None,
        }
    }

    /// Publishes by `book`'s leases (a cluster's node's).
    pub(super) fn speaking_by(mut self, book: Option<Arc<LeaseBook>>) -> BusActor {
        self.book = book;
        self
    }

    /// Batches publishes, sends each batch's log write without waiting for it, and fans each
    /// batch out, in order, once its commit is known: while one batch commits, the next one
    /// forms, so a busy bus costs a publisher about one commit, not two.
    pub(super) fn run(mut self, inbox: Receiver<BusMsg>) {
        let mut in_flight: VecDeque<InFlight> = VecDeque::new();
        let mut next: Option<BusMsg> = None;
        loop {
            let message = match next.take() {
                Some(message) => message,
                None => match self.wait(&inbox, &mut in_flight) {
                    Some(message) => message,
                    None => break,
                },
            };
            match message {
                BusMsg::Publish(publication) => {
                    let mut batch = Vec::with_capacity(16);
                    self.take_publish(&mut batch, publication);
                    while batch.len() < MAX_BATCH {
                        match inbox.try_recv() {
                            Ok(BusMsg::Publish(publication)) => self.take_publish(&mut batch, publication),
                            Ok(other) => {
                                next = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    in_flight.push_back(self.flush(batch));
                }
                BusMsg::Subscribe { filter, after, reply } => {
                    // A new subscriber's replay ends where live begins: nothing in flight.
                    self.drain(&mut in_flight);
                    self.subscribe(filter, after, reply);
                }
                BusMsg::Unsubscribe { id } => {
                    self.subscribers.retain(|subscriber| subscriber.id != id);
                    self.subscriber_gauge.store(self.subscribers.len(), Ordering::Relaxed);
                }
                BusMsg::Remote { upto } | BusMsg::RemoteLive { upto, .. } => {
                    if let BusMsg::RemoteLive { events, .. } = message {
                        self.remote_live.extend(events.into_iter().filter(|event| event.seq > self.last_seq));
                        self.remote_live.sort_by_key(|event| event.seq);
                    }
                    self.remote = self.remote.max(upto);
                    // With a batch in flight, its commit catches up first (`complete`).
                    if in_flight.is_empty() {
                        self.catch_up(self.remote);
                    }
                }
                BusMsg::Shutdown => break,
            }
        }
        self.drain(&mut in_flight);
        self.subscribers.clear();
        self.subscriber_gauge.store(0, Ordering::Relaxed);
        log::debug!("bus stopped at seq {}", self.last_seq);
    }

    /// The next message, fanning out batches as their commits arrive meanwhile. `None`: the
    /// inbox is closed.
    fn wait(&mut self, inbox: &Receiver<BusMsg>, in_flight: &mut VecDeque<InFlight>) -> Option<BusMsg> {
        loop {
            let Some(front) = in_flight.front() else { return inbox.recv().ok() };
            let Some(commit) = &front.commit else {
                let done = in_flight.pop_front().expect("a front batch");
                self.complete(done, Ok(Committed::default()));
                continue;
            };
            crossbeam_channel::select! {
                recv(commit) -> outcome => {
                    let done = in_flight.pop_front().expect("a front batch");
                    self.complete(done, outcome.unwrap_or(Err(StoreError::Closed)));
                }
                recv(inbox) -> message => return message.ok(),
            }
        }
    }

    /// Waits for every batch in flight and fans each out.
    fn drain(&mut self, in_flight: &mut VecDeque<InFlight>) {
        while let Some(done) = in_flight.pop_front() {
            let outcome = match &done.commit {
                Some(commit) => commit.recv().unwrap_or(Err(StoreError::Closed)),
                None => Ok(Committed::default()),
            };
            self.complete(done, outcome);
        }
    }

    /// Stamps a publication into `batch`, unless this node may no longer speak for a session
    /// it names: then it is dropped with its writes, and its publisher, if it waits, hears
    /// that it was not committed.
    fn take_publish(&mut self, batch: &mut Vec<Stamped>, publication: Publication) {
        if !super::tenure::may_publish(self.book.as_deref(), &publication) {
            return;
        }
        let Publication { tenant, origin, before, event, writes, logged, committed } = publication;
        for event in before {
            if let Some(stamped) = self.stamp(tenant.clone(), origin.clone(), Arc::new(event), true) {
                batch.push(stamped);
            }
        }
        let Some(stamped) = self.stamp(tenant, origin, event, logged) else { return };
        if committed.is_some() || !writes.is_empty() {
            let count = writes.len();
            self.acks.push(Ack { to: committed, index: batch.len(), writes, count });
        }
        batch.push(stamped);
    }

    /// Gives an event its time and, unless it is a delta or unlogged, the form the log keeps.
    /// Frames are built later, by the streams, once per format.
    fn stamp(&mut self, tenant: Option<Arc<str>>, origin: Origin, event: Arc<Event>, logged: bool) -> Option<Stamped> {
        let at = self.clock.now();
        let logged = match !logged || event.is_transient() {
            true => None,
            false => Some(logged_form(&tenant, &origin, &event, &at)?),
        };
        Some(Stamped { at, tenant, origin, event, logged })
    }

    /// Sends a batch to the log with its events' own writes, without waiting: the log gives
    /// every entry its seq in the commit (a delta takes one and is not kept), and the batch is
    /// fanned out once it commits, so nothing but a delta is streamed before it is durable.
    /// Publishers never wait on this.
    ///
    /// A batch of deltas alone is numbered here, after whatever is in flight, with no trip to
    /// the store: the log's next allocation starts above it (`floor`). At most `DELTA_RUN` are
    /// numbered so between two trips, and a start skips that many (`Bus::start`), so a seq a
    /// delta had before a crash is never handed out again.
    fn flush(&mut self, batch: Vec<Stamped>) -> InFlight {
        let deltas_only = self.acks.is_empty() && batch.iter().all(|stamped| stamped.logged.is_none());
        let numbered = self.last_seq + self.in_flight_len + batch.len() as u64;
        // Numbered here only when no append is in flight: its seqs, still unknown, come first.
        let numbered_here = !self.config.shared_log && self.appending == 0;
        if deltas_only && numbered_here && numbered - self.persisted < DELTA_RUN {
            self.in_flight_len += batch.len() as u64;
            return InFlight { batch, acks: Vec::new(), commit: None, writes: None };
        }
        self.appending += 1;
        let mut acks = std::mem::take(&mut self.acks);
        let mut ops: Vec<WriteOp> = acks.iter_mut().flat_map(|ack| std::mem::take(&mut ack.writes)).collect();
        // Kept to write apart what did commit, should the batch fail.
        let writes = (!ops.is_empty()).then(|| ops.clone());
        ops.push(self.append(&batch));
        let commit = match self.store.write_pending(ops) {
            Ok(commit) => commit,
            Err(_) => {
                let (closed, failed) = bounded(1);
                let _ = closed.send(Err(StoreError::Closed));
                failed
            }
        };
        InFlight { batch, acks, commit: Some(commit), writes }
    }

    /// The log append of `batch`.
    fn append(&self, batch: &[Stamped]) -> WriteOp {
        let entries = batch.iter().map(|stamped| stamped.logged.clone()).collect();
        // Above whatever was numbered here, in flight ones included.
        let floor = self.last_seq + self.in_flight_len;
        // With a shared log, the other nodes stream this node's deltas too.
        let live = match self.config.shared_log {
            true => batch
                .iter()
                .enumerate()
                .filter(|(_, stamped)| stamped.event.is_transient())
                .filter_map(|(place, s)| Some((place, logged_form(&s.tenant, &s.origin, &s.event, &s.at)?)))
                .collect(),
            false => Vec::new(),
        };
        WriteOp::AppendLog { entries, floor, keep: self.config.log_capacity, live }
    }

    /// Keeps an envelope for replays, dropping the oldest past the ring's count or its bytes
    /// (`BusConfig::replay_bytes`): a replay of what the ring dropped reads the log.
    fn keep_in_ring(&mut self, envelope: &Arc<Envelope>) {
        if self.config.replay_capacity == 0 {
            return;
        }
        let weight = envelope.weight();
        while self.ring.len() >= self.config.replay_capacity
            || (!self.ring.is_empty() && self.ring_bytes + weight > self.config.replay_bytes)
        {
            let Some(oldest) = self.ring.pop_front() else { break };
            self.ring_bytes -= oldest.weight();
        }
        self.ring_bytes += weight;
        self.ring.push_back(Arc::clone(envelope));
    }

    /// A batch's commit is known: give its entries their seqs, fan out, confirm. If it carried
    /// writes and failed, each event's writes are tried alone and the events whose writes
    /// failed are dropped; the rest are appended again. Publishers are told after the fan-out:
    /// an event they wait for has been streamed too.
    fn complete(&mut self, done: InFlight, outcome: Result<Committed, StoreError>) {
        let InFlight { mut batch, mut acks, writes, commit } = done;
        match commit {
            None => self.in_flight_len -= batch.len() as u64,
            Some(_) => self.appending -= 1,
        }
        let first = match outcome {
            Ok(committed) => {
                if let Some(first) = committed.first_seq {
                    self.persisted = self.persisted.max(first + batch.len() as u64 - 1);
                }
                committed.first_seq
            }
            Err(error) => {
                let failed = match writes {
                    Some(writes) => self.write_apart(&mut acks, writes, &error),
                    None => Vec::new(),
                };
                keep_survivors(&mut batch, &mut acks, &failed);
                let appended = self.append_again(&mut batch, &mut acks);
                if appended.is_none() {
                    // Streamed without the log's seqs: never what this node may no longer
                    // say (it may have been paused through the failed commit).
                    let silenced = self.silenced(&batch);
                    keep_survivors(&mut batch, &mut acks, &silenced);
                }
                appended
            }
        };
        let first = first.unwrap_or(self.last_seq + 1);
        // What other processes logged below this batch is committed: streamed first.
        if self.config.shared_log && first > self.last_seq + 1 {
            self.catch_up(first - 1);
        }
        let mut envelopes = Vec::with_capacity(batch.len());
        for (offset, stamped) in batch.into_iter().enumerate() {
            let Stamped { at, tenant, origin, event, .. } = stamped;
            let envelope = Arc::new(Envelope::new(first + offset as u64, at, tenant, origin, event));
            self.keep_in_ring(&envelope);
            envelopes.push(envelope);
        }
        if let Some(last) = envelopes.last() {
            self.last_seq = self.last_seq.max(last.seq);
        }
        self.fan_out(&mut envelopes, true);
        for ack in acks {
            if let Some(to) = ack.to {
                let _ = to.send(first + ack.index as u64);
            }
        }
        if self.appending == 0 && self.remote > self.last_seq {
            self.catch_up(self.remote);
        }
    }

    /// Streams what other processes logged after the last seq streamed here, up to `upto`, in
    /// seq order; a seq with no row was a delta of another node, streamed only there. If the
    /// log cannot be read, the next commit here tries again.
    fn catch_up(&mut self, upto: u64) {
        while self.last_seq < upto {
            let page = match self.store.readers().events_between(self.last_seq, upto, CATCH_UP_PAGE) {
                Ok(page) => page,
                Err(error) => {
                    log::warn!("what other nodes logged after seq {} was not read: {error}", self.last_seq);
                    return;
                }
            };
            let reached = match page.len() == CATCH_UP_PAGE {
                true => page.last().map_or(upto, |event| event.seq),
                false => upto,
            };
            // Other nodes' deltas in the same range, in their places.
            let mut page = page;
            let heard = self.remote_live.partition_point(|event| event.seq <= reached);
            page.extend(self.remote_live.drain(..heard).filter(|event| event.seq > self.last_seq));
            page.sort_by_key(|event| event.seq);
            let mut envelopes: Vec<Arc<Envelope>> =
                Envelope::page_from_log(page, &self.store).into_iter().map(Arc::new).collect();
            for envelope in &envelopes {
                self.keep_in_ring(envelope);
            }
            self.last_seq = reached;
            self.persisted = self.persisted.max(reached);
            self.fan_out(&mut envelopes, false);
        }
    }

    /// The places in `batch` of the events of sessions whose lease this node may no longer
    /// speak for.
    fn silenced(&self, batch: &[Stamped]) -> Vec<usize> {
        let Some(book) = &self.book else { return Vec::new() };
        let silent =
            |stamped: &Stamped| stamped.event.session_id().is_some_and(|session| !book.standing(session).may_publish());
        (0..batch.len()).filter(|&at| silent(&batch[at])).collect()
    }

    /// After a failed batch: each event's writes alone. The places of the events whose
    /// writes failed.
    fn write_apart(&self, acks: &mut [Ack], writes: Vec<WriteOp>, error: &StoreError) -> Vec<usize> {
        log::warn!("a batch of events could not be logged ({error}); writing their changes apart");
        let mut writes = writes.into_iter();
        let mut failed = Vec::new();
        for ack in acks.iter() {
            let own: Vec<WriteOp> = writes.by_ref().take(ack.count).collect();
            if !own.is_empty() && self.store.write(own).is_err() {
                failed.push(ack.index);
            }
        }
        failed
    }

    /// Appends what is left of a failed batch on its own; its first seq. The events of a
    /// session another node holds now (`Fenced`: this node lost its lease) are not this
    /// node's to log, and are dropped, so their neighbours are kept. When even that fails
    /// (the store is failing), the batch is streamed anyway, above the last seq known: live
    /// clients keep their events, a replay will miss these.
    fn append_again(&self, batch: &mut Vec<Stamped>, acks: &mut Vec<Ack>) -> Option<u64> {
        loop {
            if batch.is_empty() {
                return None;
            }
            let appended = self
                .store
                .write_pending(vec![self.append(batch)])
                .and_then(|commit| commit.recv().unwrap_or(Err(StoreError::Closed)));
            match appended {
                Ok(committed) => return committed.first_seq,
                Err(StoreError::Fenced(session)) => {
                    let fenced: Vec<usize> =
                        (0..batch.len()).filter(|&at| batch[at].event.session_id() == Some(session.as_str())).collect();
                    log::warn!("{} event(s) of session {session} dropped: another node holds it", fenced.len());
                    if fenced.is_empty() {
                        return None;
                    }
                    keep_survivors(batch, acks, &fenced);
                }
                Err(error) => {
                    log::error!("events could not be logged: {error}");
                    return None;
                }
            }
        }
    }

    /// Hands each subscriber the envelopes of `batch` it wants, then empties `batch`. Each
    /// envelope is first rendered in every format a subscriber sends, once, here: a stream
    /// thread then only copies frames, and one serialization serves every stream.
    /// `observe`: the events happened here, so the metrics count them (another node's count
    /// there).
    fn fan_out(&mut self, batch: &mut Vec<Arc<Envelope>>, observe: bool) {
        if batch.is_empty() {
            return;
        }
        if observe {
            let metrics = crate::metrics::get();
            for envelope in batch.iter() {
                metrics.observe(&envelope.event);
            }
        }
        for (index, render) in self.config.renderers.iter().enumerate() {
            let Some(render) = render else { continue };
            let format = Format::ALL[index];
            if self.subscribers.iter().any(|subscriber| subscriber.filter.format == Some(format)) {
                for envelope in batch.iter() {
                    envelope.frame(format, *render);
                }
            }
        }
        let shared: Batch = Arc::from(std::mem::take(batch));
        let capacity = self.config.subscriber_capacity;
        let before = self.subscribers.len();
        self.subscribers.retain(|subscriber| {
            let wanted: Batch = if shared.iter().all(|envelope| subscriber.filter.matches(envelope)) {
                Arc::clone(&shared)
            } else {
                let own: Vec<Arc<Envelope>> =
                    shared.iter().filter(|envelope| subscriber.filter.matches(envelope)).cloned().collect();
                if own.is_empty() {
                    return true;
                }
                Arc::from(own)
            };
            // A stream that has taken everything is never dropped for one large batch.
            let pending = subscriber.pending.load(Ordering::Relaxed);
            if pending > 0 && pending + wanted.len() > capacity {
                log::debug!("dropping a subscriber that fell behind at seq {}", wanted[0].seq);
                crate::metrics::get().bus_dropped.inc();
                return false;
            }
            subscriber.pending.fetch_add(wanted.len(), Ordering::Relaxed);
            // Sending on an unbounded channel never blocks; it fails only if the stream is gone.
            subscriber.sender.send(wanted).is_ok()
        });
        if self.subscribers.len() != before {
            self.subscriber_gauge.store(self.subscribers.len(), Ordering::Relaxed);
        }
    }

    fn subscribe(&mut self, filter: Filter, after: Option<u64>, reply: Sender<Subscription>) {
        let backlog = match after {
            Some(after) => {
                let start = self.ring.partition_point(|envelope| envelope.seq <= after);
                let ring = self.ring.range(start..).filter(|envelope| filter.matches(envelope)).cloned().collect();
                // Older than the ring (evicted, or from before a restart): from the log.
                let oldest = self.ring.front().map_or(self.last_seq + 1, |envelope| envelope.seq);
                let log = (after + 1 < oldest).then(|| LogReplay {
                    store: self.store.clone(),
                    filter: filter.clone(),
                    after,
                    before: oldest,
                });
                Backlog { log, ring }
            }
            None => Backlog { log: None, ring: Vec::new() },
        };
        let (sender, live) = unbounded();
        let id = self.next_subscriber_id;
        self.next_subscriber_id += 1;
        let pending = Arc::new(AtomicUsize::new(0));
        let tenure = match (&self.book, &filter.scope) {
            (Some(book), Scope::Session(session)) => {
                Some(super::Tenure { book: Arc::clone(book), session: session.clone() })
            }
            _ => None,
        };
        let subscription = Subscription {
            backlog,
            live,
            pending: Arc::clone(&pending),
            id,
            bus_tx: self.own_tx.clone(),
            following: None,
            tenure,
        };
        // Counted before the subscriber hears of it, so a count read after `subscribe`
        // returns includes it.
        self.subscribers.push(Subscriber { id, filter, sender, pending });
        self.subscriber_gauge.store(self.subscribers.len(), Ordering::Relaxed);
        if reply.send(subscription).is_err() {
            self.subscribers.pop();
            self.subscriber_gauge.store(self.subscribers.len(), Ordering::Relaxed);
        }
    }
}

/// How the log keeps an event, or how another node streams a delta (`None`: it could not be
/// serialized, which is logged).
fn logged_form(tenant: &Option<Arc<str>>, origin: &Origin, event: &Event, at: &str) -> Option<LoggedEvent> {
    match serde_json::to_string(event) {
        Ok(body) => Some(LoggedEvent {
            seq: 0,
            tenant: tenant.as_deref().map(str::to_string),
            session_id: event.session_id().map(str::to_string),
            actor: origin.actor.as_deref().map(str::to_string),
            kind: event.kind().to_string(),
            at: at.to_string(),
            body,
            form: crate::domain::STORED_FORM,
        }),
        Err(error) => {
            log::error!("an event could not be serialized: {error}");
            None
        }
    }
}

/// Drops from `batch` the events at `failed` places (their writes did not hold), and the acks
/// of those; the other acks' places follow their events.
fn keep_survivors(batch: &mut Vec<Stamped>, acks: &mut Vec<Ack>, failed: &[usize]) {
    if failed.is_empty() {
        return;
    }
    let mut kept = Vec::with_capacity(batch.len());
    let mut moved = vec![None; batch.len()];
    for (index, stamped) in std::mem::take(batch).into_iter().enumerate() {
        if !failed.contains(&index) {
            moved[index] = Some(kept.len());
            kept.push(stamped);
        }
    }
    *batch = kept;
    acks.retain_mut(|ack| match moved[ack.index] {
        Some(index) => {
            ack.index = index;
            true
        }
        None => false,
    });
}
