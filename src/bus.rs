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
use serde::Serialize;

use crate::domain::Event;
use crate::store::{Store, StoreError, WriteOp};

const INBOX: usize = 16_384;
/// Events stamped and fanned out together at most.
const MAX_BATCH: usize = 512;
const SEQ_BLOCK: u64 = 100_000;

/// An event as it was published: its seq, whom it is for, and its JSON, serialized once.
#[derive(Debug)]
pub struct Envelope {
    pub seq: u64,
    /// `None` for events every tenant may see (notices).
    pub tenant: Option<Arc<str>>,
    pub session_id: Option<Arc<str>>,
    /// The single-line `ServerEventEnvelope` JSON.
    pub json: String,
    /// The envelope as a stream frame, built by the first stream that sends it and shared by
    /// every other: with a thousand streams, one `format!` instead of a thousand.
    pub frame: OnceLock<String>,
}

/// Which envelopes a subscriber wants.
#[derive(Debug, Clone)]
pub struct Filter {
    pub tenant: String,
    pub scope: Scope,
}

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
    pub replay: Vec<Arc<Envelope>>,
    live: Receiver<Batch>,
    /// Envelopes queued for this subscriber and not yet taken.
    pending: Arc<AtomicUsize>,
    id: u64,
    bus_tx: Sender<BusMsg>,
}

impl Subscription {
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

enum BusMsg {
    Publish { tenant: Option<Arc<str>>, event: Box<Event> },
    Subscribe { filter: Filter, after: Option<u64>, reply: Sender<Subscription> },
    Unsubscribe { id: u64 },
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
        if self.bus_tx.send(BusMsg::Publish { tenant, event: Box::new(event) }).is_err() {
            log::debug!("event dropped: the bus has stopped");
        }
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
    subscribers: Vec<Subscriber>,
    subscriber_gauge: Arc<AtomicUsize>,
}

#[derive(Serialize)]
struct WireEnvelope<'a> {
    seq: u64,
    at: String,
    event: &'a Event,
}

impl BusActor {
    fn run(mut self, inbox: Receiver<BusMsg>) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        let mut next = inbox.recv().ok();
        while let Some(message) = next.take() {
            match message {
                BusMsg::Publish { tenant, event } => {
                    batch.extend(self.stamp(tenant, event));
                    if batch.len() < MAX_BATCH {
                        next = inbox.try_recv().ok();
                    }
                    if next.as_ref().is_some_and(|m| matches!(m, BusMsg::Publish { .. })) {
                        continue;
                    }
                    self.fan_out(&mut batch);
                }
                BusMsg::Subscribe { filter, after, reply } => self.subscribe(filter, after, reply),
                BusMsg::Unsubscribe { id } => {
                    self.subscribers.retain(|subscriber| subscriber.id != id);
                    self.subscriber_gauge.store(self.subscribers.len(), Ordering::Relaxed);
                }
                BusMsg::Shutdown => break,
            }
            if next.is_none() {
                next = inbox.recv().ok();
            }
        }
        self.subscribers.clear();
        self.subscriber_gauge.store(0, Ordering::Relaxed);
        log::debug!("bus stopped at seq {}", self.next_seq);
    }

    /// Gives an event its seq and time, serializes it once, and keeps it in the ring.
    fn stamp(&mut self, tenant: Option<Arc<str>>, event: Box<Event>) -> Option<Arc<Envelope>> {
        let seq = self.take_seq();
        let json = match serde_json::to_string(&WireEnvelope { seq, at: crate::time::now_rfc3339(), event: &event }) {
            Ok(json) => json,
            Err(error) => {
                log::error!("an event could not be serialized: {error}");
                return None;
            }
        };
        let envelope = Arc::new(Envelope {
            seq,
            tenant,
            session_id: event.session_id().map(Arc::from),
            json,
            frame: OnceLock::new(),
        });
        if self.ring.len() == self.config.replay_capacity {
            self.ring.pop_front();
        }
        if self.config.replay_capacity > 0 {
            self.ring.push_back(Arc::clone(&envelope));
        }
        Some(envelope)
    }

    /// Hands each subscriber the envelopes of `batch` it wants, then empties `batch`.
    fn fan_out(&mut self, batch: &mut Vec<Arc<Envelope>>) {
        if batch.is_empty() {
            return;
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
        let replay = match after {
            Some(after) => {
                let start = self.ring.partition_point(|envelope| envelope.seq <= after);
                self.ring.range(start..).filter(|envelope| filter.matches(envelope)).cloned().collect()
            }
            None => Vec::new(),
        };
        let (sender, live) = unbounded();
        let id = self.next_subscriber_id;
        self.next_subscriber_id += 1;
        let pending = Arc::new(AtomicUsize::new(0));
        let subscription =
            Subscription { replay, live, pending: Arc::clone(&pending), id, bus_tx: self.own_tx.clone() };
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
        Filter { tenant: "t".into(), scope: Scope::AllSessions }
    }

    #[test]
    fn a_subscriber_that_falls_behind_is_dropped_and_others_are_not_slowed() {
        let dir = tempfile::tempdir().unwrap();
        let (bus, handle, writer) = start(dir.path(), BusConfig { replay_capacity: 100, subscriber_capacity: 2 });
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
        let config = BusConfig { replay_capacity: 10, subscriber_capacity: 10 };
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
        let (bus, handle, writer) = start(dir.path(), BusConfig { replay_capacity: 10, subscriber_capacity: 10 });
        let deleted = |id: &str| Event::SessionDeleted { session_id: id.into() };
        bus.publish(Some("t"), deleted("a"));
        bus.publish(Some("other"), deleted("b"));
        bus.publish(Some("t"), deleted("c"));
        bus.publish(None, notice("everyone"));
        let all = bus.subscribe(filter(), Some(0)).unwrap();
        let sessions: Vec<Option<&str>> = all.replay.iter().map(|e| e.session_id.as_deref()).collect();
        assert_eq!(sessions, [Some("a"), Some("c"), None]);
        let one = bus.subscribe(Filter { tenant: "t".into(), scope: Scope::Session("c".into()) }, Some(0)).unwrap();
        assert_eq!(one.replay.len(), 1);
        let after_first = bus.subscribe(filter(), Some(all.replay[0].seq)).unwrap();
        assert_eq!(after_first.replay.len(), 2);
        assert_eq!(bus.subscriber_count(), 3);
        drop((all, one, after_first));
        handle.shutdown();
        writer.shutdown();
    }
}
