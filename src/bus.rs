//! The event bus actor: stamps every event with a `seq`, keeps a replay ring, fans out.
//!
//! Runs on the `kestrel-bus` thread and owns three things no other thread touches: the next
//! `seq`, the ring of the last `replay_capacity` envelopes, and the subscriber list.
//!
//! Channels:
//! - The inbox is bounded (`INBOX`); publishers block when it is full, which slows runs, never
//!   clients.
//! - Each subscriber has a channel of batches, bounded at `subscriber_capacity` envelopes. The
//!   bus counts what it queued and the stream counts what it took (`pending`), on an unbounded
//!   channel, so an idle stream costs no preallocated slots. A subscriber whose queue would
//!   pass the bound is dropped on the spot, its stream ends, and its client reconnects with
//!   `Last-Event-ID`. The bus never blocks on a client.
//!
//! Fan-out is batched: the bus stamps every publish already waiting in its inbox (up to
//! `MAX_BATCH`), then hands each subscriber the whole batch at once. A burst of deltas then
//! wakes each stream thread once per batch instead of once per event; with a thousand streams
//! that is most of the cost. A subscribe or unsubscribe in the middle of a burst ends the
//! batch first, so order is kept.
//!
//! Seqs survive restarts without a write per event: the bus reserves seqs in blocks of
//! `SEQ_BLOCK` by raising a ceiling in the store, asking for the next block when half of the
//! current one is used, and starts above the stored ceiling on boot.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use crossbeam_channel::{bounded, unbounded, Receiver, Sender};

use crate::domain::Event;
use crate::store::{EventQuery, LoggedEvent, Store, StoreError, WriteOp};

const INBOX: usize = 16_384;
/// Events stamped and fanned out together at most.
const MAX_BATCH: usize = 512;
const SEQ_BLOCK: u64 = 100_000;

/// An event as it was published: its seq and time, whom it is for, and the event itself, with
/// a frame per wire format built by the first stream of that format that sends it.
#[derive(Debug)]
pub struct Envelope {
    pub seq: u64,
    /// When it was published (RFC 3339).
    pub at: String,
    /// `None` for events every tenant may see (notices).
    pub tenant: Option<Arc<str>>,
    pub session_id: Option<Arc<str>>,
    /// Whom the event is attributed to (a BAE client key id); kept in the log.
    pub actor: Option<Arc<str>>,
    /// The turn (run id) that emitted it, for streams that follow one turn; live only.
    pub turn: Option<Arc<str>>,
    pub event: Arc<Event>,
    /// One frame per `Format`: with a thousand streams of one format, one serialization
    /// instead of a thousand.
    frames: [OnceLock<String>; FORMATS],
}

/// The wire formats streams send envelopes in; each has its own cached frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Kestrel's SSE frames (`api/kestrel/wire.rs`).
    KestrelSse = 0,
    /// BAE's NDJSON frames (the next front door).
    BaeNdjson = 1,
}

pub const FORMATS: usize = 2;

impl Envelope {
    fn new(seq: u64, at: String, tenant: Option<Arc<str>>, origin: Origin, event: Arc<Event>) -> Envelope {
        Envelope {
            seq,
            at,
            tenant,
            session_id: event.session_id().map(Arc::from),
            actor: origin.actor,
            turn: origin.turn,
            event,
            frames: Default::default(),
        }
    }

    /// The envelope in `format`, rendered by `render` the first time it is asked for.
    pub fn frame(&self, format: Format, render: fn(&Envelope) -> String) -> &str {
        self.frames[format as usize].get_or_init(|| render(self))
    }

    /// The envelope of an event read back from the log.
    pub(crate) fn from_log(logged: LoggedEvent) -> Option<Envelope> {
        match serde_json::from_str::<Event>(&logged.body) {
            Ok(event) => {
                let origin = Origin { actor: logged.actor.map(Arc::from), turn: None };
                Some(Envelope::new(logged.seq, logged.at, logged.tenant.map(Arc::from), origin, Arc::new(event)))
            }
            Err(error) => {
                log::error!("logged event {} cannot be read ({error}); it is skipped", logged.seq);
                None
            }
        }
    }
}

/// Where an event comes from beyond its tenant: whom it is attributed to and which turn
/// emitted it.
#[derive(Debug, Clone, Default)]
pub struct Origin {
    pub actor: Option<Arc<str>>,
    pub turn: Option<Arc<str>>,
}

/// Which envelopes a subscriber wants, and in which format it sends them.
#[derive(Debug, Clone)]
pub struct Filter {
    pub tenant: String,
    pub scope: Scope,
    /// The stream's wire format: the bus renders each envelope in every format a subscriber
    /// wants before it fans the envelope out. `None`: the subscriber renders nothing.
    pub format: Option<Format>,
}

/// Renders an envelope as one frame of a format.
pub type Render = fn(&Envelope) -> String;

/// Which of a tenant's envelopes a subscriber wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every session's events, and notices.
    AllSessions,
    /// One session's events.
    Session(String),
    /// Plugin asset changes. This server publishes none, so such a stream stays idle.
    Plugins,
}

impl Filter {
    fn matches(&self, envelope: &Envelope) -> bool {
        let tenant_ok = envelope.tenant.as_deref().is_none_or(|t| t == self.tenant);
        let scope_ok = match &self.scope {
            Scope::AllSessions => true,
            Scope::Session(wanted) => envelope.session_id.as_deref() == Some(wanted.as_str()),
            Scope::Plugins => false,
        };
        tenant_ok && scope_ok
    }
}

/// Envelopes fanned out together, in seq order.
pub type Batch = Arc<[Arc<Envelope>]>;

/// What a stream's wait for live envelopes ended with.
pub enum Live {
    Batch(Batch),
    /// Nothing arrived within the timeout.
    Idle,
    /// The bus dropped this subscriber (it fell behind) or stopped.
    Closed,
    /// The stop channel disconnected.
    Stopped,
}

/// What a new subscriber gets: the buffered envelopes after its `Last-Event-ID`, then live.
/// Replay and live are cut at the same instant on the bus thread, so nothing is missed or
/// repeated between them.
/// Dropping it unsubscribes.
pub struct Subscription {
    /// What the subscriber missed, sent before live envelopes (see `next_replay`).
    backlog: Backlog,
    live: Receiver<Batch>,
    /// Envelopes queued for this subscriber and not yet taken.
    pending: Arc<AtomicUsize>,
    id: u64,
    bus_tx: Sender<BusMsg>,
}

/// A subscriber's missed envelopes: logged events older than the ring, then the ring's.
struct Backlog {
    log: Option<LogReplay>,
    ring: Vec<Arc<Envelope>>,
}

/// Logged events with `after < seq < before`, read a page at a time on the subscriber's
/// own thread, so a long replay never holds up the bus or fills memory.
struct LogReplay {
    store: Store,
    filter: Filter,
    after: u64,
    before: u64,
}

/// Logged events read per page of a replay.
const LOG_PAGE: usize = 1000;

impl LogReplay {
    fn next_page(&mut self) -> Option<Vec<Arc<Envelope>>> {
        let session = match &self.filter.scope {
            Scope::Session(id) => Some(id.as_str()),
            Scope::AllSessions => None,
            Scope::Plugins => return None,
        };
        let query = EventQuery { after: self.after, before: self.before, tenant: &self.filter.tenant, session };
        let page = match self.store.readers().events(&query, LOG_PAGE) {
            Ok(page) => page,
            Err(error) => {
                log::error!("replay from the event log stopped: {error}");
                return None;
            }
        };
        self.after = page.last()?.seq;
        Some(page.into_iter().filter_map(Envelope::from_log).map(Arc::new).collect())
    }
}

impl Subscription {
    /// The next page of envelopes the subscriber missed, oldest first: from the durable log
    /// while the ring no longer has them, then from the ring. `None` once all are handed out.
    pub fn next_replay(&mut self) -> Option<Vec<Arc<Envelope>>> {
        if let Some(log) = &mut self.backlog.log {
            match log.next_page() {
                Some(page) => return Some(page),
                None => self.backlog.log = None,
            }
        }
        if self.backlog.ring.is_empty() {
            None
        } else {
            Some(std::mem::take(&mut self.backlog.ring))
        }
    }

    /// The next batch of live envelopes. `Disconnected` means the bus dropped this subscriber
    /// (it fell behind) or stopped.
    pub fn recv_timeout(&self, timeout: std::time::Duration) -> Result<Batch, crossbeam_channel::RecvTimeoutError> {
        let batch = self.live.recv_timeout(timeout)?;
        self.pending.fetch_sub(batch.len(), Ordering::Relaxed);
        Ok(batch)
    }

    /// Like `recv_timeout`, but also ends when `stop` disconnects (the client left).
    pub fn recv_or_stop(&self, timeout: std::time::Duration, stop: &Receiver<()>) -> Live {
        crossbeam_channel::select! {
            recv(self.live) -> batch => match batch {
                Ok(batch) => {
                    self.pending.fetch_sub(batch.len(), Ordering::Relaxed);
                    Live::Batch(batch)
                }
                Err(_) => Live::Closed,
            },
            recv(stop) -> _ => Live::Stopped,
            default(timeout) => Live::Idle,
        }
    }

    /// Like `recv_or_stop`, but also ends when `other` has a message (or disconnects), which
    /// it returns: a stream waiting on its envelopes and one answer at once.
    pub fn recv_or<T>(
        &self,
        other: &Receiver<T>,
        timeout: std::time::Duration,
        stop: &Receiver<()>,
    ) -> Result<Live, Option<T>> {
        crossbeam_channel::select! {
            recv(other) -> message => Err(message.ok()),
            recv(self.live) -> batch => Ok(match batch {
                Ok(batch) => {
                    self.pending.fetch_sub(batch.len(), Ordering::Relaxed);
                    Live::Batch(batch)
                }
                Err(_) => Live::Closed,
            }),
            recv(stop) -> _ => Ok(Live::Stopped),
            default(timeout) => Ok(Live::Idle),
        }
    }

    /// A batch if one is waiting.
    pub fn try_recv(&self) -> Option<Batch> {
        let batch = self.live.try_recv().ok()?;
        self.pending.fetch_sub(batch.len(), Ordering::Relaxed);
        Some(batch)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // try_send: a full inbox means the bus is busy; the subscriber is then removed on its
        // next matching event, when the send finds the receiver gone.
        let _ = self.bus_tx.try_send(BusMsg::Unsubscribe { id: self.id });
    }
}

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

enum BusMsg {
    Publish {
        tenant: Option<Arc<str>>,
        origin: Origin,
        event: Box<Event>,
        /// Told the event's seq once it is committed to the log.
        committed: Option<Sender<u64>>,
        /// Written in the same transaction as the event (what the event announces).
        writes: Vec<WriteOp>,
    },
    Subscribe {
        filter: Filter,
        after: Option<u64>,
        reply: Sender<Subscription>,
    },
    Unsubscribe {
        id: u64,
    },
    Shutdown,
}

/// The publishing side, cloned into every component that emits events.
#[derive(Clone)]
pub struct Bus {
    bus_tx: Sender<BusMsg>,
    subscribers: Arc<AtomicUsize>,
}

pub struct BusHandle {
    bus_tx: Sender<BusMsg>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Debug, Clone, Copy)]
pub struct BusConfig {
    pub replay_capacity: usize,
    pub subscriber_capacity: usize,
    /// Logged events kept: older ones are dropped as new ones are written.
    pub log_capacity: u64,
    /// How each format renders an envelope, from the front doors.
    pub renderers: [Option<Render>; FORMATS],
}

impl Bus {
    /// Starts the bus thread, continuing the seq above what the store says was handed out.
    pub fn start(store: Store, config: BusConfig) -> Result<(Bus, BusHandle), StoreError> {
        let first_seq = store.readers().seq_ceiling()? + 1;
        let ceiling = first_seq + SEQ_BLOCK - 1;
        store.write(vec![WriteOp::SetSeqCeiling(ceiling)])?;
        let (bus_tx, inbox) = bounded(INBOX);
        let subscribers = Arc::new(AtomicUsize::new(0));
        let actor = BusActor {
            store,
            config,
            next_seq: first_seq,
            ceiling,
            pending_ceiling: None,
            next_subscriber_id: 0,
            own_tx: bus_tx.clone(),
            ring: VecDeque::with_capacity(config.replay_capacity.min(1 << 16)),
            unlogged: Vec::new(),
            acks: Vec::new(),
            subscribers: Vec::new(),
            subscriber_gauge: Arc::clone(&subscribers),
        };
        let thread = std::thread::Builder::new()
            .name("kestrel-bus".into())
            .spawn(move || actor.run(inbox))
            .map_err(StoreError::Io)?;
        Ok((Bus { bus_tx: bus_tx.clone(), subscribers }, BusHandle { bus_tx, thread: Some(thread) }))
    }

    /// Publishes an event scoped to `tenant` (`None`: every tenant sees it).
    pub fn publish(&self, tenant: Option<&str>, event: Event) {
        self.publish_shared(tenant.map(Arc::from), event);
    }

    /// `publish` for a hot path that keeps its tenant as an `Arc`, saving an allocation per
    /// event (a run publishes one per streamed delta).
    pub fn publish_shared(&self, tenant: Option<Arc<str>>, event: Event) {
        self.publish_from(tenant, Origin::default(), event);
    }

    /// Publishes an event with its attribution and turn.
    pub fn publish_from(&self, tenant: Option<Arc<str>>, origin: Origin, event: Event) {
        let message = BusMsg::Publish { tenant, origin, event: Box::new(event), committed: None, writes: Vec::new() };
        if self.bus_tx.send(message).is_err() {
            log::debug!("event dropped: the bus has stopped");
        }
    }

    /// Publishes an event and returns its seq once it is committed to the log, so a reply can
    /// acknowledge it. `None`: the bus has stopped or the log write failed.
    pub fn publish_durable(&self, tenant: Option<Arc<str>>, origin: Origin, event: Event) -> Option<u64> {
        self.publish_written(tenant, origin, event, Vec::new())
    }

    /// `publish_durable` for an event that announces a change: `writes` commit in the same
    /// transaction as the event, so neither is durable without the other and the event is
    /// streamed only once both are. `None`: the bus has stopped or the commit failed.
    pub fn publish_written(
        &self,
        tenant: Option<Arc<str>>,
        origin: Origin,
        event: Event,
        writes: Vec<WriteOp>,
    ) -> Option<u64> {
        self.publish_written_pending(tenant, origin, event, writes)?.recv().ok()
    }

    /// `publish_written` without waiting: the receiver gets the event's seq once it and its
    /// writes are committed (and nothing if they fail).
    pub fn publish_written_pending(
        &self,
        tenant: Option<Arc<str>>,
        origin: Origin,
        event: Event,
        writes: Vec<WriteOp>,
    ) -> Option<Receiver<u64>> {
        let (committed, seq) = bounded(1);
        let message = BusMsg::Publish { tenant, origin, event: Box::new(event), committed: Some(committed), writes };
        self.bus_tx.send(message).ok()?;
        Some(seq)
    }

    /// Subscribes; `after` replays buffered envelopes with a greater seq first.
    /// Returns `None` once the bus has stopped.
    pub fn subscribe(&self, filter: Filter, after: Option<u64>) -> Option<Subscription> {
        let (reply, subscription) = bounded(1);
        self.bus_tx.send(BusMsg::Subscribe { filter, after, reply }).ok()?;
        subscription.recv().ok()
    }

    /// Live subscribers right now (for health checks and tests).
    pub fn subscriber_count(&self) -> usize {
        self.subscribers.load(Ordering::Relaxed)
    }
}

impl BusHandle {
    /// Stops the bus; every subscriber's channel closes, which ends every stream.
    pub fn shutdown(mut self) {
        let _ = self.bus_tx.send(BusMsg::Shutdown);
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                log::error!("the bus thread panicked");
            }
        }
    }
}

struct Subscriber {
    id: u64,
    filter: Filter,
    sender: Sender<Batch>,
    pending: Arc<AtomicUsize>,
}

struct BusActor {
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
    /// Batches publishes, sends each batch's log write without waiting for it, and fans each
    /// batch out, in order, once its commit is known: while one batch commits, the next one
    /// forms, so a busy bus costs a publisher about one commit, not two.
    fn run(mut self, inbox: Receiver<BusMsg>) {
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
                BusMsg::Publish { tenant, origin, event, committed, writes } => {
                    let mut batch = Vec::with_capacity(16);
                    self.take_publish(&mut batch, tenant, origin, event, committed, writes);
                    while batch.len() < MAX_BATCH {
                        match inbox.try_recv() {
                            Ok(BusMsg::Publish { tenant, origin, event, committed, writes }) => {
                                self.take_publish(&mut batch, tenant, origin, event, committed, writes)
                            }
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

    fn take_publish(
        &mut self,
        batch: &mut Vec<Arc<Envelope>>,
        tenant: Option<Arc<str>>,
        origin: Origin,
        event: Box<Event>,
        committed: Option<Sender<u64>>,
        writes: Vec<WriteOp>,
    ) {
        let Some(envelope) = self.stamp(tenant, origin, event) else { return };
        if committed.is_some() || !writes.is_empty() {
            let count = writes.len();
            self.acks.push(Ack { to: committed, seq: envelope.seq, writes, count });
        }
        batch.push(envelope);
    }

    /// Gives an event its seq and time, keeps it in the ring, and queues it for the log unless
    /// it is a delta. Frames are built later, by the streams, once per format.
    fn stamp(&mut self, tenant: Option<Arc<str>>, origin: Origin, event: Box<Event>) -> Option<Arc<Envelope>> {
        let body = match event.is_transient() {
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
        for (index, render) in self.config.renderers.iter().enumerate() {
            let Some(render) = render else { continue };
            let format = if index == Format::KestrelSse as usize { Format::KestrelSse } else { Format::BaeNdjson };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::NoticeLevel;
    use std::time::Duration;

    fn notice(text: &str) -> Event {
        Event::Notice { level: NoticeLevel::Info, message: text.into() }
    }

    fn start(dir: &std::path::Path, config: BusConfig) -> (Bus, BusHandle, crate::store::WriterHandle) {
        let (store, writer) = Store::open(dir).unwrap();
        let (bus, handle) = Bus::start(store, config).unwrap();
        (bus, handle, writer)
    }

    fn filter() -> Filter {
        Filter { tenant: "t".into(), scope: Scope::AllSessions, format: None }
    }

    #[test]
    fn a_subscriber_that_falls_behind_is_dropped_and_others_are_not_slowed() {
        let dir = tempfile::tempdir().unwrap();
        let (bus, handle, writer) = start(
            dir.path(),
            BusConfig { replay_capacity: 100, subscriber_capacity: 2, log_capacity: 1000, renderers: [None, None] },
        );
        let slow = bus.subscribe(filter(), None).unwrap();
        let fast = bus.subscribe(filter(), None).unwrap();
        // The reader tells the publisher what it took, so it never falls behind however slow
        // the machine is; the other subscriber reads nothing.
        let (took_tx, took) = crossbeam_channel::unbounded::<usize>();
        let reader = std::thread::spawn(move || {
            let mut seen = 0;
            while let Ok(batch) = fast.recv_timeout(Duration::from_secs(5)) {
                seen += batch.len();
                let _ = took_tx.send(seen);
                if seen == 20 {
                    break;
                }
            }
            seen
        });
        for i in 0..20 {
            bus.publish(None, notice(&format!("n{i}")));
            while took.recv_timeout(Duration::from_secs(5)).is_ok_and(|seen| seen <= i) {}
        }
        assert_eq!(reader.join().unwrap(), 20, "the reading subscriber got everything");
        // The slow one holds what fit in its channel, then its channel is closed.
        let mut held = 0;
        while let Ok(batch) = slow.recv_timeout(Duration::from_secs(5)) {
            held += batch.len();
        }
        assert_eq!(held, 2);
        handle.shutdown();
        writer.shutdown();
    }

    #[test]
    fn seqs_continue_above_the_stored_ceiling_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let config =
            BusConfig { replay_capacity: 10, subscriber_capacity: 10, log_capacity: 1000, renderers: [None, None] };
        let (bus, handle, writer) = start(dir.path(), config);
        let sub = bus.subscribe(filter(), None).unwrap();
        bus.publish(None, notice("before"));
        let before = sub.recv_timeout(Duration::from_secs(5)).unwrap()[0].seq;
        drop(sub);
        handle.shutdown();
        writer.shutdown();

        let (bus, handle, writer) = start(dir.path(), config);
        let sub = bus.subscribe(filter(), None).unwrap();
        bus.publish(None, notice("after"));
        let after = sub.recv_timeout(Duration::from_secs(5)).unwrap()[0].seq;
        assert!(after > before + SEQ_BLOCK - 1, "{after} must be above the whole reserved block of {before}");
        handle.shutdown();
        writer.shutdown();
    }

    #[test]
    fn replay_and_filters_respect_tenant_and_session() {
        let dir = tempfile::tempdir().unwrap();
        let (bus, handle, writer) = start(
            dir.path(),
            BusConfig { replay_capacity: 10, subscriber_capacity: 10, log_capacity: 1000, renderers: [None, None] },
        );
        let deleted = |id: &str| Event::SessionDeleted { session_id: id.into() };
        bus.publish(Some("t"), deleted("a"));
        bus.publish(Some("other"), deleted("b"));
        bus.publish(Some("t"), deleted("c"));
        bus.publish(None, notice("everyone"));
        let mut all = bus.subscribe(filter(), Some(0)).unwrap();
        let replayed = replay(&mut all);
        let sessions: Vec<Option<&str>> = replayed.iter().map(|e| e.session_id.as_deref()).collect();
        assert_eq!(sessions, [Some("a"), Some("c"), None]);
        let mut one = bus
            .subscribe(Filter { tenant: "t".into(), scope: Scope::Session("c".into()), format: None }, Some(0))
            .unwrap();
        assert_eq!(replay(&mut one).len(), 1);
        let mut after_first = bus.subscribe(filter(), Some(replayed[0].seq)).unwrap();
        assert_eq!(replay(&mut after_first).len(), 2);
        assert_eq!(bus.subscriber_count(), 3);
        drop((all, one, after_first));
        handle.shutdown();
        writer.shutdown();
    }

    /// Every envelope a subscription replays.
    fn replay(subscription: &mut Subscription) -> Vec<Arc<Envelope>> {
        std::iter::from_fn(|| subscription.next_replay()).flatten().collect()
    }

    #[test]
    fn what_the_ring_lost_is_replayed_from_the_log_exactly_once_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let config =
            BusConfig { replay_capacity: 5, subscriber_capacity: 100, log_capacity: 1000, renderers: [None, None] };
        let (bus, handle, writer) = start(dir.path(), config);
        let live = bus.subscribe(filter(), None).unwrap();
        let delta = |i: usize| Event::MessageDelta {
            session_id: "s".into(),
            message_id: "m".into(),
            channel: crate::domain::DeltaChannel::Text,
            delta: format!("d{i}"),
        };
        for i in 0..20 {
            bus.publish(Some("t"), notice(&format!("n{i}")));
            bus.publish(Some("t"), delta(i));
        }
        let mut seen = Vec::new();
        while seen.len() < 40 {
            seen.extend(live.recv_timeout(Duration::from_secs(5)).unwrap().iter().map(|e| e.seq));
        }
        let first = seen[0];
        // The ring holds the last 5; the log every notice; deltas older than the ring are gone.
        let mut late = bus.subscribe(filter(), Some(first)).unwrap();
        let replayed: Vec<u64> = replay(&mut late).iter().map(|e| e.seq).collect();
        let mut expected: Vec<u64> =
            seen.iter().copied().filter(|s| s > &first).filter(|s| (s - first) % 2 == 0).collect();
        expected.retain(|s| *s < seen[35]);
        expected.extend(&seen[35..]);
        assert_eq!(replayed, expected);
        drop((live, late));
        handle.shutdown();
        writer.shutdown();

        // After a restart the ring is empty and the log has every notice.
        let (bus, handle, writer) = start(dir.path(), config);
        let mut late = bus.subscribe(filter(), Some(first)).unwrap();
        let replayed: Vec<Arc<Envelope>> = replay(&mut late);
        assert_eq!(replayed.len(), 19);
        assert!(replayed.iter().all(|e| matches!(*e.event, Event::Notice { .. })));
        assert!(replayed.windows(2).all(|w| w[0].seq < w[1].seq));
        drop(late);
        handle.shutdown();
        writer.shutdown();
    }
}
