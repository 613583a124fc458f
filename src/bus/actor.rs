//! The bus thread: batches publishes, sends each batch to the log, and fans batches out in
//! order once they commit (see the module above for the channels and bounds).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_channel::{bounded, unbounded, Receiver, Sender};

use super::*;
use crate::store::{LoggedEvent, Store, StoreError, WriteOp};

/// An event whose publisher waits for its commit, or that carries writes of its own.
struct Ack {
    to: Option<Sender<u64>>,
    seq: u64,
    writes: Vec<WriteOp>,
    /// How many writes it had, once they are moved into a batch's ops.
    count: usize,
}

/// A batch whose log write has been sent: fanned out once it commits.
struct InFlight {
    batch: Vec<Arc<Envelope>>,
    acks: Vec<Ack>,
    /// The commit's outcome; `None`: nothing to write (only deltas).
    commit: Option<Receiver<Result<(), StoreError>>>,
    /// When its events carry writes: the events and the writes, to log apart on failure.
    events: Option<(Vec<LoggedEvent>, Vec<WriteOp>)>,
}

impl Ack {
    /// Tells the publisher its event is committed.
    fn confirm(self) {
        if let Some(to) = self.to {
            let _ = to.send(self.seq);
        }
    }
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
    next_seq: u64,
    ceiling: u64,
    pending_ceiling: Option<(u64, Receiver<Result<(), StoreError>>)>,
    next_subscriber_id: u64,
    /// A sender into our own inbox, handed to each `Subscription` so its drop can unsubscribe.
    own_tx: Sender<BusMsg>,
    ring: VecDeque<Arc<Envelope>>,
    /// Stamped events not yet in the log; written before their batch is fanned out.
    unlogged: Vec<LoggedEvent>,
    /// Events of this batch that carry writes or have a publisher waiting for the commit.
    acks: Vec<Ack>,
    subscribers: Vec<Subscriber>,
    subscriber_gauge: Arc<AtomicUsize>,
}

impl BusActor {
    /// The actor of a bus whose first seq is `first_seq`, with the block up to `first_seq +
    /// SEQ_BLOCK - 1` reserved.
    pub(super) fn new(
        store: Store,
        config: BusConfig,
        first_seq: u64,
        own_tx: Sender<BusMsg>,
        subscriber_gauge: Arc<AtomicUsize>,
    ) -> BusActor {
        BusActor {
            store,
            config,
            next_seq: first_seq,
            ceiling: first_seq + SEQ_BLOCK - 1,
            pending_ceiling: None,
            next_subscriber_id: 0,
            own_tx,
            ring: VecDeque::with_capacity(config.replay_capacity.min(1 << 16)),
            unlogged: Vec::new(),
            acks: Vec::new(),
            subscribers: Vec::new(),
            subscriber_gauge,
        }
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
                BusMsg::Shutdown => break,
            }
        }
        self.drain(&mut in_flight);
        self.subscribers.clear();
        self.subscriber_gauge.store(0, Ordering::Relaxed);
        log::debug!("bus stopped at seq {}", self.next_seq);
    }

    /// The next message, fanning out batches as their commits arrive meanwhile. `None`: the
    /// inbox is closed.
    fn wait(&mut self, inbox: &Receiver<BusMsg>, in_flight: &mut VecDeque<InFlight>) -> Option<BusMsg> {
        loop {
            let Some(front) = in_flight.front() else { return inbox.recv().ok() };
            let Some(commit) = &front.commit else {
                let done = in_flight.pop_front().expect("a front batch");
                self.complete(done, Ok(()));
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
                None => Ok(()),
            };
            self.complete(done, outcome);
        }
    }

    fn take_publish(&mut self, batch: &mut Vec<Arc<Envelope>>, publication: Publication) {
        let Publication { tenant, origin, before, event, writes, logged, committed } = publication;
        for event in before {
            if let Some(envelope) = self.stamp(tenant.clone(), origin.clone(), Box::new(event), true) {
                batch.push(envelope);
            }
        }
        let Some(envelope) = self.stamp(tenant, origin, event, logged) else { return };
        if committed.is_some() || !writes.is_empty() {
            let count = writes.len();
            self.acks.push(Ack { to: committed, seq: envelope.seq, writes, count });
        }
        batch.push(envelope);
    }

    /// Gives an event its seq and time, keeps it in the ring, and queues it for the log unless
    /// it is a delta or unlogged. Frames are built later, by the streams, once per format.
    fn stamp(
        &mut self,
        tenant: Option<Arc<str>>,
        origin: Origin,
        event: Box<Event>,
        logged: bool,
    ) -> Option<Arc<Envelope>> {
        let body = match !logged || event.is_transient() {
            true => None,
            false => match serde_json::to_string(&*event) {
                Ok(body) => Some(body),
                Err(error) => {
                    log::error!("an event could not be serialized: {error}");
                    return None;
                }
            },
        };
        let seq = self.take_seq();
        let at = crate::time::now_rfc3339();
        let event = Arc::<Event>::from(event);
        if let Some(body) = body {
            self.unlogged.push(LoggedEvent {
                seq,
                tenant: tenant.as_deref().map(str::to_string),
                session_id: event.session_id().map(str::to_string),
                actor: origin.actor.as_deref().map(str::to_string),
                kind: event.kind().to_string(),
                at: at.clone(),
                body,
            });
        }
        let envelope = Arc::new(Envelope::new(seq, at, tenant, origin, event));
        if self.ring.len() == self.config.replay_capacity {
            self.ring.pop_front();
        }
        if self.config.replay_capacity > 0 {
            self.ring.push_back(Arc::clone(&envelope));
        }
        Some(envelope)
    }

    /// Sends a batch's events (and its events' own writes) to the log without waiting: the
    /// batch is fanned out once they commit, so nothing but a delta is streamed before it is
    /// durable. Publishers never wait on this.
    fn flush(&mut self, batch: Vec<Arc<Envelope>>) -> InFlight {
        let mut acks = std::mem::take(&mut self.acks);
        let events = std::mem::take(&mut self.unlogged);
        let with_writes = acks.iter().any(|ack| !ack.writes.is_empty());
        if events.is_empty() && !with_writes {
            return InFlight { batch, acks, commit: None, events: None };
        }
        let keep = self.config.log_capacity;
        let mut ops: Vec<WriteOp> = acks.iter_mut().flat_map(|ack| std::mem::take(&mut ack.writes)).collect();
        // Kept to log apart what did commit, should the writes fail.
        let kept = with_writes.then(|| (events.clone(), ops.clone()));
        ops.push(WriteOp::AppendEvents { events, keep });
        let commit = match self.store.write_pending(ops) {
            Ok(commit) => Some(commit),
            Err(_) => {
                let (closed, failed) = bounded(1);
                let _ = closed.send(Err(StoreError::Closed));
                Some(failed)
            }
        };
        InFlight { batch, acks, commit, events: kept }
    }

    /// A batch's commit is known: confirm and fan out. If it carried writes and failed, each
    /// event's writes are tried alone and the events whose writes failed are dropped.
    /// Publishers are told after the fan-out: an event they wait for has been streamed too.
    fn complete(&mut self, done: InFlight, outcome: Result<(), StoreError>) {
        let InFlight { mut batch, acks, events, .. } = done;
        let confirmed = match (outcome, events) {
            (Ok(()), _) => acks,
            (Err(error), Some((events, writes))) => {
                let (held, failed) = self.log_apart(acks, events, writes, &error);
                batch.retain(|envelope| !failed.contains(&envelope.seq));
                held
            }
            // Streaming anyway: live clients keep their events; a replay will miss these.
            // Whoever waits for a commit learns it failed (its sender is dropped).
            (Err(error), None) => {
                log::error!("events could not be logged: {error}");
                Vec::new()
            }
        };
        self.fan_out(&mut batch);
        confirmed.into_iter().for_each(Ack::confirm);
    }

    /// After a failed batch: each event's writes alone, then the events whose writes held.
    /// Returns the acks to confirm and the seqs of events whose writes failed.
    fn log_apart(
        &self,
        acks: Vec<Ack>,
        mut events: Vec<LoggedEvent>,
        writes: Vec<WriteOp>,
        error: &StoreError,
    ) -> (Vec<Ack>, Vec<u64>) {
        log::warn!("a batch of events could not be logged ({error}); logging them apart");
        let mut writes = writes.into_iter();
        let mut failed = Vec::new();
        let mut held = Vec::new();
        for ack in acks {
            let own: Vec<WriteOp> = writes.by_ref().take(ack.count).collect();
            match own.is_empty() || self.store.write(own).is_ok() {
                true => held.push(ack),
                false => failed.push(ack.seq),
            }
        }
        events.retain(|event| !failed.contains(&event.seq));
        let keep = self.config.log_capacity;
        match self.store.write(vec![WriteOp::AppendEvents { events, keep }]) {
            Ok(()) => (held, failed),
            Err(error) => {
                log::error!("events could not be logged: {error}");
                (Vec::new(), failed)
            }
        }
    }

    /// Hands each subscriber the envelopes of `batch` it wants, then empties `batch`. Each
    /// envelope is first rendered in every format a subscriber sends, once, here: a stream
    /// thread then only copies frames, and one serialization serves every stream.
    fn fan_out(&mut self, batch: &mut Vec<Arc<Envelope>>) {
        if batch.is_empty() {
            return;
        }
        let metrics = crate::metrics::get();
        for envelope in batch.iter() {
            metrics.observe(&envelope.event);
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
                let oldest = self.ring.front().map_or(self.next_seq, |envelope| envelope.seq);
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
        let subscription =
            Subscription { backlog, live, pending: Arc::clone(&pending), id, bus_tx: self.own_tx.clone() };
        if reply.send(subscription).is_ok() {
            self.subscribers.push(Subscriber { id, filter, sender, pending });
            self.subscriber_gauge.store(self.subscribers.len(), Ordering::Relaxed);
        }
    }

    /// Hands out the next seq, keeping the stored ceiling ahead of it.
    fn take_seq(&mut self) -> u64 {
        if let Some((new_ceiling, outcome)) = &self.pending_ceiling {
            // Only block on the store when the current block is used up, which a healthy
            // writer never lets happen: the request went out half a block ago.
            let result = if self.next_seq > self.ceiling { outcome.recv().ok() } else { outcome.try_recv().ok() };
            match result {
                Some(Ok(())) => {
                    self.ceiling = *new_ceiling;
                    self.pending_ceiling = None;
                }
                Some(Err(error)) => {
                    log::error!("could not reserve event seqs: {error}");
                    self.pending_ceiling = None;
                }
                None => {}
            }
        }
        if self.pending_ceiling.is_none() && self.next_seq + SEQ_BLOCK / 2 > self.ceiling {
            let new_ceiling = self.ceiling + SEQ_BLOCK;
            match self.store.write_pending(vec![WriteOp::SetSeqCeiling(new_ceiling)]) {
                Ok(outcome) => self.pending_ceiling = Some((new_ceiling, outcome)),
                Err(error) => log::error!("could not reserve event seqs: {error}"),
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }
}
