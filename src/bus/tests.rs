use super::*;
use crate::domain::NoticeLevel;
use std::time::Duration;

fn notice(text: &str) -> Event {
    Event::Notice { level: NoticeLevel::Info, message: text.into(), session_id: None }
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
        BusConfig {
            replay_bytes: 1 << 30,
            replay_capacity: 100,
            subscriber_capacity: 2,
            log_capacity: 1000,
            renderers: [None, None, None],
            shared_log: false,
        },
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
fn seqs_continue_above_the_log_after_a_restart_deltas_included() {
    let dir = tempfile::tempdir().unwrap();
    let config = BusConfig {
        replay_bytes: 1 << 30,
        replay_capacity: 10,
        subscriber_capacity: 10,
        log_capacity: 1000,
        renderers: [None, None, None],
        shared_log: false,
    };
    let (bus, handle, writer) = start(dir.path(), config);
    let sub = bus.subscribe(filter(), None).unwrap();
    bus.publish(None, notice("before"));
    let delta = Event::MessageDelta {
        session_id: "s".into(),
        message_id: "m".into(),
        channel: crate::domain::DeltaChannel::Text,
        delta: "x".into(),
    };
    bus.publish(Some("t"), delta);
    let mut seen = Vec::new();
    while seen.len() < 2 {
        seen.extend(sub.recv_timeout(Duration::from_secs(5)).unwrap().iter().map(|e| e.seq));
    }
    assert!(seen[1] > seen[0], "the delta's seq follows the notice's: {seen:?}");
    let before = seen[1];
    drop(sub);
    handle.shutdown();
    writer.shutdown();

    let (bus, handle, writer) = start(dir.path(), config);
    let sub = bus.subscribe(filter(), None).unwrap();
    bus.publish(None, notice("after"));
    let after = sub.recv_timeout(Duration::from_secs(5)).unwrap()[0].seq;
    assert!(after > before, "{after} must be above every seq handed out before the restart ({before})");
    handle.shutdown();
    writer.shutdown();
}

#[test]
fn replay_and_filters_respect_tenant_and_session() {
    let dir = tempfile::tempdir().unwrap();
    let (bus, handle, writer) = start(
        dir.path(),
        BusConfig {
            replay_bytes: 1 << 30,
            replay_capacity: 10,
            subscriber_capacity: 10,
            log_capacity: 1000,
            renderers: [None, None, None],
            shared_log: false,
        },
    );
    let deleted = |id: &str| Event::SessionDeleted { session_id: id.into() };
    bus.publish(Some("t"), deleted("a"));
    bus.publish(Some("other"), deleted("b"));
    bus.publish(Some("t"), deleted("c"));
    bus.publish(None, notice("everyone"));
    let mut all = bus.subscribe(filter(), Some(0)).unwrap();
    let replayed = replay(&mut all);
    let sessions: Vec<Option<&str>> = replayed.iter().map(|e| e.session_id()).collect();
    assert_eq!(sessions, [Some("a"), Some("c"), None]);
    let mut one =
        bus.subscribe(Filter { tenant: "t".into(), scope: Scope::Session("c".into()), format: None }, Some(0)).unwrap();
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
    let config = BusConfig {
        replay_bytes: 1 << 30,
        replay_capacity: 5,
        subscriber_capacity: 100,
        log_capacity: 1000,
        renderers: [None, None, None],
        shared_log: false,
    };
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
    let mut expected: Vec<u64> = seen.iter().copied().filter(|s| s > &first).filter(|s| (s - first) % 2 == 0).collect();
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

#[test]
fn the_ring_holds_at_most_its_bytes_and_replays_the_newest() {
    let dir = tempfile::tempdir().unwrap();
    let config = BusConfig {
        replay_bytes: 4 * 1024 * 1024,
        replay_capacity: 10_000,
        subscriber_capacity: 100,
        log_capacity: 1000,
        renderers: [None, None, None],
        shared_log: false,
    };
    let (bus, handle, writer) = start(dir.path(), config);
    // Unlogged deltas of 256 KiB: only the ring holds them, and only a budget's worth.
    let live = bus.subscribe(filter(), None).unwrap();
    let delta = "d".repeat(256 * 1024);
    for _ in 0..64 {
        let event = Event::MessageDelta {
            session_id: "s".into(),
            message_id: "m".into(),
            channel: crate::domain::DeltaChannel::Text,
            delta: delta.clone(),
        };
        bus.publish(Some("t"), event);
    }
    let mut seen = Vec::new();
    while seen.len() < 64 {
        seen.extend(live.recv_timeout(Duration::from_secs(5)).unwrap().iter().map(|e| e.seq));
    }
    let last = *seen.last().unwrap();
    let mut subscription = bus.subscribe(filter(), Some(0)).unwrap();
    let replayed = replay(&mut subscription);
    let held: usize = replayed.iter().map(|envelope| envelope.weight()).sum();
    assert!(held <= 4 * 1024 * 1024, "{held} bytes held");
    assert!((4..=8).contains(&replayed.len()), "{} kept", replayed.len());
    assert_eq!(replayed.last().unwrap().seq, last, "the newest are kept");
    drop((live, subscription));
    handle.shutdown();
    writer.shutdown();
}

/// A page of logged requests puts back each request's stored messages from its own session
/// only: an id of another session's message, named by a request, stays an empty slot.
#[test]
fn a_logged_request_reads_back_only_its_own_sessions_messages() {
    use crate::domain::{Message, ProviderRequest, Role, SessionStatus};
    use crate::store::WriteOp;
    let dir = tempfile::tempdir().unwrap();
    let (store, writer) = Store::open(dir.path()).unwrap();
    let session = |id: &str| crate::store::conformance::session(id, SessionStatus::Idle);
    let said = |session_id: &str, id: &str| WriteOp::AppendMessage {
        session_id: session_id.into(),
        message: Message { id: id.into(), ..Message::text_of(Role::User, format!("{session_id} said")) },
        updated_at: "2026-01-01T00:00:01.000Z".into(),
    };
    store.write(vec![session("a"), session("b"), said("a", "m_a"), said("b", "m_b")]).unwrap();
    let logged = |seq: u64, session_id: &str, ids: &[&str]| {
        let placeholders = ids.iter().map(|id| Message { id: id.to_string(), ..Message::text_of(Role::User, "") });
        let request = ProviderRequest {
            session_id: session_id.into(),
            attempt: 0,
            fallback: None,
            provider: "builtin".into(),
            base_url: None,
            model: "echo".into(),
            max_tokens: None,
            messages: placeholders.collect(),
            tools: Vec::new(),
            stored: ids.len(),
            unresolved: true,
        };
        LoggedEvent {
            seq,
            tenant: Some("t".into()),
            session_id: Some(session_id.into()),
            actor: None,
            kind: "provider.request".into(),
            at: "2026-01-01T00:00:02.000Z".into(),
            body: serde_json::to_string(&Event::ProviderRequest(Box::new(request))).unwrap(),
            form: crate::domain::STORED_FORM,
        }
    };
    let page = Envelope::page_from_log(vec![logged(1, "a", &["m_a", "m_b"]), logged(2, "b", &["m_b"])], &store);
    let texts: Vec<Vec<String>> = page
        .iter()
        .map(|envelope| match &*envelope.event {
            Event::ProviderRequest(request) => request.messages.iter().map(Message::text).collect(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(texts, [vec!["a said".to_string(), String::new()], vec!["b said".to_string()]]);
    writer.shutdown();
}

/// Two buses on one log, as two nodes of a cluster on one database.
#[test]
fn with_a_shared_log_each_bus_streams_the_others_events_in_seq_order_with_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let (store, writer) = Store::open(dir.path()).unwrap();
    let config = BusConfig {
        replay_bytes: 1 << 30,
        replay_capacity: 100,
        subscriber_capacity: 1000,
        log_capacity: 10_000,
        renderers: [None, None, None],
        shared_log: true,
    };
    let (a, a_handle) = Bus::start(store.clone(), config).unwrap();
    let (b, b_handle) = Bus::start(store.clone(), config).unwrap();
    let at_b = b.subscribe(filter(), None).unwrap();
    let durable = |bus: &Bus, text: &str| bus.publish_durable(None, Origin::default(), notice(text)).unwrap();
    // A logs and streams a delta; B has heard of none of it when it logs its own event, whose
    // commit streams A's logged ones first.
    durable(&a, "a0");
    let delta = Event::MessageDelta {
        session_id: Arc::from("s"),
        message_id: Arc::from("m"),
        channel: crate::domain::DeltaChannel::Text,
        delta: "only at a".into(),
    };
    a.publish(None, delta);
    durable(&a, "a1");
    durable(&b, "b0");
    // Then A logs more, and B hears of it.
    let last = durable(&a, "a2");
    b.heard(last);
    let mut seen: Vec<(u64, String)> = Vec::new();
    while seen.last().is_none_or(|(_, text)| text != "a2") {
        let batch = at_b.recv_timeout(Duration::from_secs(5)).expect("B streams A's events");
        for envelope in batch.iter() {
            match &*envelope.event {
                Event::Notice { message, .. } => seen.push((envelope.seq, message.clone())),
                other => panic!("only logged events reach another bus: {other:?}"),
            }
        }
    }
    let texts: Vec<&str> = seen.iter().map(|(_, text)| text.as_str()).collect();
    assert_eq!(texts, ["a0", "a1", "b0", "a2"]);
    assert!(seen.windows(2).all(|pair| pair[0].0 < pair[1].0), "seqs rise: {seen:?}");
    assert!(seen[1].0 > seen[0].0 + 1, "the delta took a seq from the log between them: {seen:?}");
    a_handle.shutdown();
    b_handle.shutdown();
    writer.shutdown();
}
