//! The event bus actor: stamps every event with a `seq`, keeps a replay ring, fans out.
//!
//! Runs on the `kestrel-bus` thread and owns three things no other thread touches: the last
//! `seq` its log gave, the ring of the last `replay_capacity` envelopes, and the subscriber list.
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
//! Seqs come from the log: each batch goes to the store as one append, whose commit gives
//! every entry its seq (a delta takes one and is not kept), so seq order is commit order
//! however many processes share the store (`store::Seqs`). The batch is fanned out once that
//! commit is known. A batch of deltas alone is numbered by the bus itself, above what is in
//! flight, with no trip to the store: the next append starts above it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use crossbeam_channel::{bounded, never, Receiver, Sender};

use crate::domain::{Event, Message};
use crate::store::{EventQuery, LoggedEvent, Store, StoreError, WriteOp};

const INBOX: usize = 16_384;
/// Deltas the bus numbers on its own between two trips to the store (see `BusActor::flush`).
const DELTA_RUN: u64 = 100_000;
/// Events stamped and fanned out together at most.
const MAX_BATCH: usize = 512;

/// An event as it was published: its seq and time, whom it is for, and the event itself, with
/// a frame per wire format built by the first stream of that format that sends it.
#[derive(Debug)]
pub struct Envelope {
    pub seq: u64,
    /// When it was published (RFC 3339).
    pub at: Arc<str>,
    /// `None` for events every tenant may see (notices).
    pub tenant: Option<Arc<str>>,
    /// Whom the event is attributed to (a BAE client key id); kept in the log.
    pub actor: Option<Arc<str>>,
    /// The turn (run id) that emitted it, for streams that follow one turn; live only.
    pub turn: Option<Arc<str>>,
    pub event: Arc<Event>,
    /// One frame per `Format`: with a thousand streams of one format, one serialization
    /// instead of a thousand.
    frames: [OnceLock<String>; FORMATS],
    /// What the replay ring counts it as (`Envelope::weight`), worked out once.
    weight: OnceLock<usize>,
}

/// The wire formats streams send envelopes in; each has its own cached frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Kestrel's SSE frames (`api/kestrel/wire.rs`).
    KestrelSse = 0,
    /// BAE's NDJSON frames (`api/bae/wire/`).
    BaeNdjson = 1,
    /// Kestrel's plugin stream: named SSE events (`plugins.changed`).
    KestrelPlugins = 2,
}

pub const FORMATS: usize = 3;

impl Format {
    /// Every format, by its index.
    pub const ALL: [Format; FORMATS] = [Format::KestrelSse, Format::BaeNdjson, Format::KestrelPlugins];
}

impl Envelope {
    pub(crate) fn new(seq: u64, at: Arc<str>, tenant: Option<Arc<str>>, origin: Origin, event: Arc<Event>) -> Envelope {
        Envelope {
            seq,
            at,
            tenant,
            actor: origin.actor,
            turn: origin.turn,
            event,
            frames: Default::default(),
            weight: OnceLock::new(),
        }
    }

    /// The session the event belongs to, if it belongs to one.
    pub fn session_id(&self) -> Option<&str> {
        self.event.session_id()
    }

    /// About how much memory the envelope holds: its event's weight, twice, since it also
    /// caches its rendered frames. A `provider.request`'s is its whole history: worked out once.
    pub fn weight(&self) -> usize {
        *self.weight.get_or_init(|| 2 * self.event.weight())
    }

    /// The envelope in `format`, rendered by `render` the first time it is asked for.
    pub fn frame(&self, format: Format, render: fn(&Envelope) -> String) -> &str {
        self.frames[format as usize].get_or_init(|| render(self))
    }

    /// The envelopes of a page of events read back from the log, whole again: the stored
    /// messages of its `provider.request`s, which the log keeps by id, are read back from
    /// `store` (`LogPage::read`). An event that cannot be read is skipped.
    pub(crate) fn page_from_log(page: Vec<LoggedEvent>, store: &Store) -> Vec<Envelope> {
        let mut page = LogPage::read(page, store);
        for envelope in &mut page.envelopes {
            if let Some(Event::ProviderRequest(request)) = Arc::get_mut(&mut envelope.event) {
                if let Some(found) = page.history.get(&request.session_id) {
                    request.resolve(found);
                }
            }
        }
        page.envelopes
    }

    /// A logged event as an envelope, its stored history still to resolve.
    fn decoded(logged: LoggedEvent) -> Option<Envelope> {
        match crate::store::decode_event(&logged) {
            Ok(event) => {
                let origin = Origin { actor: logged.actor.map(Arc::from), turn: None };
                Some(Envelope::new(logged.seq, logged.at.into(), logged.tenant.map(Arc::from), origin, Arc::new(event)))
            }
            Err(error) => {
                log::error!("logged event {} cannot be read ({error}); it is skipped", logged.seq);
                None
            }
        }
    }
}

/// A page of events read back from the log, with the stored messages its `provider.request`s
/// name by id, read once for the page however many requests repeat them (a long session's
/// requests each carry its whole history so far).
pub struct LogPage {
    /// The page's events; their `provider.request`s still name their stored messages by id.
    pub envelopes: Vec<Envelope>,
    /// The stored messages they name, by session and id; a session whose could not be read
    /// is missing, and its requests stay unresolved.
    pub history: HashMap<String, HashMap<String, Message>>,
}

impl LogPage {
    pub fn read(page: Vec<LoggedEvent>, store: &Store) -> LogPage {
        let envelopes: Vec<Envelope> = page.into_iter().filter_map(Envelope::decoded).collect();
        // Each session's wanted ids once, in the order the requests name them (the store reads
        // a list in stored order as one range).
        let mut wanted: HashMap<&str, (HashSet<&str>, Vec<String>)> = HashMap::new();
        for envelope in &envelopes {
            if let Event::ProviderRequest(request) = &*envelope.event {
                if request.unresolved {
                    let (seen, ids) = wanted.entry(&request.session_id).or_default();
                    for message in request.messages.iter().take(request.stored) {
                        if seen.insert(&message.id) {
                            ids.push(message.id.clone());
                        }
                    }
                }
            }
        }
        let mut history = HashMap::new();
        for (session_id, (_, ids)) in wanted {
            match store.readers().messages_by_id(session_id, &ids) {
                Ok(found) => drop(history.insert(session_id.to_string(), found)),
                Err(error) => {
                    log::error!("the history of session {session_id}'s logged requests is not readable: {error}")
                }
            }
        }
        LogPage { envelopes, history }
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
            Scope::AllSessions => !envelope.event.is_plugin_change(),
            Scope::Session(wanted) => envelope.session_id() == Some(wanted.as_str()),
            Scope::Plugins => envelope.event.is_plugin_change(),
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
    /// Counts the stream among its session's followers while it lasts.
    following: Option<Following>,
    /// In a cluster, the session a one-session stream follows, which it speaks of only while
    /// this node holds the session's lease (`tenure.rs`).
    tenure: Option<Tenure>,
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
        let store = &self.store;
        Some(Envelope::page_from_log(page, store).into_iter().map(Arc::new).collect())
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
    /// (it fell behind), the bus stopped, or (in a cluster) this node lost the session.
    pub fn recv_timeout(&self, timeout: std::time::Duration) -> Result<Batch, crossbeam_channel::RecvTimeoutError> {
        match self.next_live(&never::<()>(), timeout, &never()) {
            Ok(Live::Batch(batch)) => Ok(batch),
            Ok(Live::Idle) => Err(crossbeam_channel::RecvTimeoutError::Timeout),
            Ok(Live::Closed | Live::Stopped) | Err(_) => Err(crossbeam_channel::RecvTimeoutError::Disconnected),
        }
    }

    /// Like `recv_timeout`, but also ends when `stop` disconnects (the client left).
    pub fn recv_or_stop(&self, timeout: std::time::Duration, stop: &Receiver<()>) -> Live {
        // `never` neither delivers nor disconnects: the wait ends some other way.
        self.next_live(&never::<()>(), timeout, stop).unwrap_or(Live::Closed)
    }

    /// Like `recv_or_stop`, but also ends when `other` has a message (or disconnects), which
    /// it returns: a stream waiting on its envelopes and one answer at once.
    pub fn recv_or<T>(
        &self,
        other: &Receiver<T>,
        timeout: std::time::Duration,
        stop: &Receiver<()>,
    ) -> Result<Live, Option<T>> {
        self.next_live(other, timeout, stop)
    }

    /// A batch if one is waiting (and, in a cluster, this node still speaks for the session).
    pub fn try_recv(&self) -> Option<Batch> {
        if !self.speaking() {
            return None;
        }
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

enum BusMsg {
    Publish(Publication),
    Subscribe {
        filter: Filter,
        after: Option<u64>,
        reply: Sender<Subscription>,
    },
    /// Another process logged events up to this seq.
    Remote {
        upto: u64,
    },
    /// Another node streamed these deltas, the last at `upto`.
    RemoteLive {
        upto: u64,
        events: Vec<crate::store::LoggedEvent>,
    },
    Unsubscribe {
        id: u64,
    },
    Shutdown,
}

/// One publish: an event, the events stamped just before it in the same batch (so they
/// commit in the same transaction), the writes that commit with them, and whether the
/// events are logged at all.
pub struct Publication {
    tenant: Option<Arc<str>>,
    origin: Origin,
    before: Vec<Event>,
    /// Shared from here on: the ring, the streams and the log read the one the publisher built.
    event: Arc<Event>,
    /// Written in the same transaction as the events (what they announce).
    writes: Vec<WriteOp>,
    /// `false`: streamed in order but kept out of the log (a turn's end for a front door
    /// whose wire has no such event).
    logged: bool,
    /// Told the event's seq once it is committed to the log.
    committed: Option<Sender<u64>>,
}

impl Publication {
    pub fn new(tenant: Option<Arc<str>>, origin: Origin, event: Event) -> Publication {
        Publication {
            tenant,
            origin,
            before: Vec::new(),
            event: Arc::new(event),
            writes: Vec::new(),
            logged: true,
            committed: None,
        }
    }

    /// Stamps `events` just before this one, in the same batch.
    pub fn after(mut self, events: Vec<Event>) -> Publication {
        self.before = events;
        self
    }

    /// Commits `writes` in the same transaction as the events.
    pub fn with_writes(mut self, writes: impl IntoIterator<Item = WriteOp>) -> Publication {
        self.writes.extend(writes);
        self
    }

    /// Streams the event without logging it (its `before` events are logged as usual).
    pub fn unlogged(mut self) -> Publication {
        self.logged = false;
        self
    }
}

/// The publishing side, cloned into every component that emits events.
#[derive(Clone)]
pub struct Bus {
    bus_tx: Sender<BusMsg>,
    subscribers: Arc<AtomicUsize>,
    followers: Arc<Followers>,
}

pub struct BusHandle {
    bus_tx: Sender<BusMsg>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Debug, Clone, Copy)]
pub struct BusConfig {
    pub replay_capacity: usize,
    /// The most the replay ring holds, in bytes (`Event::weight`), whatever its count: a
    /// long BAE session's `provider.request`s each carry its whole history.
    pub replay_bytes: usize,
    pub subscriber_capacity: usize,
    /// Logged events kept: older ones are dropped as new ones are written.
    pub log_capacity: u64,
    /// How each format renders an envelope, from the front doors.
    pub renderers: [Option<Render>; FORMATS],
    /// Other processes append to the log too (a cluster's nodes): every seq, a delta's
    /// included, is taken from the log, and what the others log is read back in seq order
    /// (`Bus::heard`).
    pub shared_log: bool,
}

impl Bus {
    /// Starts the bus thread, continuing the seq above what the store says was handed out. In
    /// a cluster, it publishes by this node's lease book (`tenure.rs`).
    pub fn start(store: Store, config: BusConfig) -> Result<(Bus, BusHandle), StoreError> {
        let book = store.cluster().map(|(_, book)| Arc::clone(book));
        Bus::start_speaking_by(store, config, book)
    }

    /// `start`, with the lease book the bus publishes by (`None`: it publishes everything).
    pub(crate) fn start_speaking_by(
        store: Store,
        config: BusConfig,
        book: Option<Arc<crate::store::cluster::LeaseBook>>,
    ) -> Result<(Bus, BusHandle), StoreError> {
        // Past every seq a delta may have had before a crash: one entry allocated above them.
        let skip = WriteOp::AppendLog {
            entries: vec![None],
            floor: store.last_seq()? + DELTA_RUN,
            keep: u64::MAX,
            live: Vec::new(),
        };
        store.write(vec![skip])?;
        let last_seq = store.last_seq()?;
        let (bus_tx, inbox) = bounded(INBOX);
        let subscribers = Arc::new(AtomicUsize::new(0));
        let actor = BusActor::new(store, config, last_seq, bus_tx.clone(), Arc::clone(&subscribers)).speaking_by(book);
        let thread = std::thread::Builder::new()
            .name("kestrel-bus".into())
            .spawn(move || actor.run(inbox))
            .map_err(StoreError::Io)?;
        let followers = Arc::default();
        Ok((Bus { bus_tx: bus_tx.clone(), subscribers, followers }, BusHandle { bus_tx, thread: Some(thread) }))
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
        self.send(Publication::new(tenant, origin, event));
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
        self.send_pending(Publication::new(tenant, origin, event).with_writes(writes))
    }

    /// Publishes without waiting for anything.
    pub fn send(&self, publication: Publication) {
        if self.bus_tx.send(BusMsg::Publish(publication)).is_err() {
            log::debug!("event dropped: the bus has stopped");
        }
    }

    /// Publishes; the receiver gets the event's seq once it, the events before it and the
    /// writes are committed (and nothing if they fail).
    pub fn send_pending(&self, mut publication: Publication) -> Option<Receiver<u64>> {
        let (committed, seq) = bounded(1);
        publication.committed = Some(committed);
        self.bus_tx.send(BusMsg::Publish(publication)).ok()?;
        Some(seq)
    }

    /// Another node committed events up to `seq` (`store/postgres/listen.rs`): the bus reads
    /// them back from the log and streams them in seq order with its own.
    pub fn heard(&self, seq: u64) {
        let _ = self.bus_tx.send(BusMsg::Remote { upto: seq });
    }

    /// Another node streamed these deltas (`store/postgres/listen.rs`): streamed here in seq
    /// order with the logged events, unless this node has streamed a later event already.
    pub fn heard_live(&self, mut events: Vec<crate::store::LoggedEvent>) {
        events.sort_by_key(|event| event.seq);
        let Some(upto) = events.last().map(|event| event.seq) else { return };
        let _ = self.bus_tx.send(BusMsg::RemoteLive { upto, events });
    }

    /// Subscribes; `after` replays buffered envelopes with a greater seq first.
    /// Returns `None` once the bus has stopped.
    pub fn subscribe(&self, filter: Filter, after: Option<u64>) -> Option<Subscription> {
        let following = match &filter.scope {
            Scope::Session(session) => Some(Following::new(&self.followers, session)),
            Scope::AllSessions | Scope::Plugins => None,
        };
        let (reply, subscription) = bounded(1);
        self.bus_tx.send(BusMsg::Subscribe { filter, after, reply }).ok()?;
        let mut subscription = subscription.recv().ok()?;
        subscription.following = following;
        Some(subscription)
    }

    /// Whether a stream on this node follows the session.
    pub fn followed(&self, session_id: &str) -> bool {
        self.followers.counts().contains_key(session_id)
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

mod actor;
mod followers;
mod tenure;
use actor::BusActor;
use followers::{Followers, Following};
use tenure::Tenure;
#[cfg(test)]
mod tests;
