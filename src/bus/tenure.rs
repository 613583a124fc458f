//! A node of a cluster says nothing of a session once its lease of it may have run out
//! (docs/cluster.md): the bus publishes none of its own events of the session (`may_publish`,
//! on the bus thread), and a stream of one session sends nothing, pings included, while the
//! node's lease of the session may have run out by its own clock, and ends once the lease is
//! gone (`Subscription::next_live`, on the stream's thread). A relay that hears nothing from
//! a holder for a lease period then opens the stream again where the session is held, so a
//! holder that was paused or cut off sends no frame after another node took the session.
//!
//! Knows leases only through the store's `LeaseBook`; a bus without one (a single server)
//! is never silenced.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver};

use super::{Live, Publication, Subscription};
use crate::domain::Event;
use crate::store::cluster::{LeaseBook, Standing};

/// How often a silenced stream looks again at the lease book: the silence lasts until the
/// node's next heartbeat renews the lease or finds it lost.
const LAPSE_POLL: Duration = Duration::from_millis(25);

/// The session a stream follows, and the book that says whether this node speaks for it.
pub(super) struct Tenure {
    pub(super) book: Arc<LeaseBook>,
    pub(super) session: String,
}

/// What a stream of one session may do now.
enum Voice {
    /// Send, until this instant at least (`None`: for as long as it likes).
    Speak(Option<Instant>),
    /// Send nothing, not even a ping: the lease may have run out.
    Silent,
    /// End: the node no longer holds the lease.
    Ended,
}

/// Whether this node may publish `publication` (every session it names), by `book`.
pub(super) fn may_publish(book: Option<&LeaseBook>, publication: &Publication) -> bool {
    let Some(book) = book else { return true };
    let events = publication.before.iter().chain(std::iter::once(&*publication.event));
    let silenced = events.filter_map(Event::session_id).find(|session| !book.standing(session).may_publish());
    match silenced {
        None => true,
        Some(session) => {
            // Deltas come many a second; the event that ends the run is worth a line.
            match publication.event.is_transient() {
                true => log::debug!("an event of session {session} not published: this node's lease may have run out"),
                false => log::warn!("an event of session {session} not published: this node's lease may have run out"),
            }
            false
        }
    }
}

impl Subscription {
    fn voice(&self) -> Voice {
        let Some(tenure) = &self.tenure else { return Voice::Speak(None) };
        match tenure.book.standing(&tenure.session) {
            Standing::Held(until) => Voice::Speak(Some(until)),
            Standing::Lapsed => Voice::Silent,
            Standing::Lost | Standing::Free => Voice::Ended,
        }
    }

    /// Waits, silent, while the node's lease may have run out; `None` once it may speak
    /// again, else how the wait ended (the lease is gone: `Closed`; the client left).
    fn wait_out_lapse(&self, stop: &Receiver<()>) -> Option<Live> {
        loop {
            match self.voice() {
                Voice::Speak(_) => return None,
                Voice::Ended => return Some(Live::Closed),
                Voice::Silent => select! {
                    recv(stop) -> _ => return Some(Live::Stopped),
                    default(LAPSE_POLL) => {}
                },
            }
        }
    }

    /// The next batch within `timeout`, or a message of `other`, or the client leaving
    /// (`stop`), while this node speaks for the session: a batch is handed over only while
    /// it does (one published before a lapse waits for the renewal), and the wait ends
    /// `Closed` once the lease is gone. A silent wait is never `Idle`, so no ping goes out.
    pub(super) fn next_live<T>(
        &self,
        other: &Receiver<T>,
        timeout: Duration,
        stop: &Receiver<()>,
    ) -> Result<Live, Option<T>> {
        let deadline = Instant::now() + timeout;
        loop {
            let until = match self.wait_out_lapse(stop) {
                Some(ended) => return Ok(ended),
                None => match self.voice() {
                    Voice::Speak(until) => until,
                    Voice::Silent | Voice::Ended => continue,
                },
            };
            let wait = until.map_or(deadline, |until| until.min(deadline)).saturating_duration_since(Instant::now());
            select! {
                recv(other) -> message => return Err(message.ok()),
                recv(self.live) -> batch => return Ok(match batch {
                    Ok(batch) => {
                        self.pending.fetch_sub(batch.len(), Ordering::Relaxed);
                        self.wait_out_lapse(stop).unwrap_or(Live::Batch(batch))
                    }
                    Err(_) => Live::Closed,
                }),
                recv(stop) -> _ => return Ok(Live::Stopped),
                default(wait) => if Instant::now() >= deadline {
                    return Ok(Live::Idle);
                },
            }
        }
    }

    /// Whether the stream may take more batches now (`try_recv`).
    pub(super) fn speaking(&self) -> bool {
        matches!(self.voice(), Voice::Speak(until) if until.is_none_or(|until| Instant::now() < until))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Bus, BusConfig, BusHandle, Filter, Scope};
    use super::*;
    use crate::store::Store;

    /// A bus that publishes by `book`, on a store of its own.
    fn start(dir: &std::path::Path, book: &Arc<LeaseBook>) -> (Bus, BusHandle, crate::store::WriterHandle) {
        let (store, writer) = Store::open(dir).unwrap();
        let config = BusConfig {
            replay_bytes: 1 << 30,
            replay_capacity: 100,
            subscriber_capacity: 100,
            log_capacity: 1000,
            renderers: [None, None, None],
            shared_log: false,
        };
        let (bus, handle) = Bus::start_speaking_by(store, config, Some(Arc::clone(book))).unwrap();
        (bus, handle, writer)
    }

    fn deleted(session: &str) -> Event {
        Event::SessionDeleted { session_id: session.into() }
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(3600)
    }

    /// The sessions of the envelopes `subscription` has live now, in order.
    fn sessions_of(batch: &super::super::Batch) -> Vec<String> {
        batch.iter().filter_map(|e| e.session_id().map(str::to_string)).collect()
    }

    #[test]
    fn a_session_whose_lease_may_have_run_out_or_is_lost_is_not_published_and_others_are() {
        let dir = tempfile::tempdir().unwrap();
        let book = LeaseBook::new("a");
        let (bus, handle, writer) = start(dir.path(), &book);
        let all = bus.subscribe(Filter { tenant: "t".into(), scope: Scope::AllSessions, format: None }, None).unwrap();
        let publish = |session: &str| bus.publish_durable(Some(Arc::from("t")), Default::default(), deleted(session));

        book.hold("s", 1, later());
        assert!(publish("s").is_some(), "held: published");
        // By this node's clock the lease may have run out: nothing of it is published (the
        // publisher hears it was not committed), while a session no node holds is.
        book.hold("s", 1, Instant::now());
        assert!(publish("s").is_none());
        let delta = Event::MessageDelta {
            session_id: "s".into(),
            message_id: "m".into(),
            channel: crate::domain::DeltaChannel::Text,
            delta: "late".into(),
        };
        bus.publish(Some("t"), delta);
        assert!(publish("free").is_some());
        // Lost: nothing either, until what this node did with it has stopped.
        book.lose("s");
        assert!(publish("s").is_none());
        book.settle("s");
        assert!(publish("s").is_some());
        let mut seen = Vec::new();
        while seen.len() < 3 {
            seen.extend(sessions_of(&all.recv_timeout(Duration::from_secs(5)).unwrap()));
        }
        assert_eq!(seen, ["s", "free", "s"], "neither the lapsed event nor the delta went out");
        drop(all);
        handle.shutdown();
        writer.shutdown();
    }

    #[test]
    fn a_sessions_stream_is_silent_while_the_lease_may_have_run_out_and_ends_when_it_is_lost() {
        let dir = tempfile::tempdir().unwrap();
        let book = LeaseBook::new("a");
        let (bus, handle, writer) = start(dir.path(), &book);
        book.hold("s", 1, later());
        let follow = || {
            bus.subscribe(Filter { tenant: "t".into(), scope: Scope::Session("s".into()), format: None }, None).unwrap()
        };
        let (stream, (client, stop)) = (follow(), crossbeam_channel::bounded::<()>(0));
        bus.publish_durable(Some(Arc::from("t")), Default::default(), deleted("s")).unwrap();
        // Published while held; the lease then lapses before the stream sends it: it is held
        // back, with no ping either, until a renewal says the lease is still this node's.
        book.hold("s", 1, Instant::now());
        assert!(stream.try_recv().is_none(), "nothing taken while silent");
        let (returned_tx, returned) = crossbeam_channel::bounded(1);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let _ = returned_tx.send(stream.recv_or_stop(Duration::from_millis(10), &stop));
            });
            assert!(
                returned.recv_timeout(Duration::from_millis(300)).is_err(),
                "a silent stream neither pings nor sends"
            );
            book.extend(&[("s".to_string(), 1)], later());
            match returned.recv_timeout(Duration::from_secs(5)).expect("sent once renewed") {
                Live::Batch(batch) => assert_eq!(sessions_of(&batch), ["s"]),
                _ => panic!("the batch held back"),
            }
        });
        assert!(matches!(stream.recv_or_stop(Duration::from_millis(10), &stop), Live::Idle), "held: pings");
        // The lease is lost: the stream ends, so its client goes to the next holder.
        book.lose("s");
        assert!(matches!(stream.recv_or_stop(Duration::from_secs(5), &stop), Live::Closed));
        // No longer held here at all (let go, or lost and settled): a new stream ends too.
        book.settle("s");
        assert!(matches!(follow().recv_or_stop(Duration::from_secs(5), &stop), Live::Closed));
        // A silent stream still hears its client leave.
        book.hold("s", 2, Instant::now());
        let silent = follow();
        drop(client);
        assert!(matches!(silent.recv_or_stop(Duration::from_secs(5), &stop), Live::Stopped));
        drop((stream, silent));
        handle.shutdown();
        writer.shutdown();
    }
}
