//! The SSE streams: framing, pings, replay, scope, and cleanup.

use serde_json::json;

use crate::support::{event_type, is_run_end, wait_until, SseClient, SseItem, TestServer, WAIT};

#[test]
fn a_stream_starts_with_retry_and_the_three_headers_then_pings() {
    let server = TestServer::start();
    let mut stream = server.events("/api/events");
    assert_eq!(stream.status, 200);
    assert_eq!(stream.header("content-type"), Some("text/event-stream"));
    assert_eq!(stream.header("cache-control"), Some("no-cache, no-transform"));
    assert_eq!(stream.header("x-accel-buffering"), Some("no"));
    assert!(matches!(stream.next_item(WAIT), Some(SseItem::Retry(3000))));
    // The test config pings every 200 ms.
    assert!(matches!(stream.next_item(WAIT), Some(SseItem::Comment(ref c)) if c == "ping"));
}

#[test]
fn each_frame_is_one_envelope_with_its_seq_as_id() {
    let server = TestServer::start();
    let id = server.create_session(json!({}));
    let mut stream = server.events("/api/events");
    server.post(&format!("/api/sessions/{id}/messages"), json!({ "content": "hi" }));
    let (frame_id, envelope) = stream.next_event(WAIT).unwrap();
    assert_eq!(envelope["seq"], frame_id);
    assert!(envelope["at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(envelope["event"]["sessionId"], id.as_str());
}

#[test]
fn last_event_id_replays_what_came_after_scoped_to_the_session() {
    let server = TestServer::start();
    let a = server.create_session(json!({ "title": "a" }));
    let b = server.create_session(json!({ "title": "b" }));
    let first_run = server.run_to_end(&a, "first");
    let last_seen = first_run.last().unwrap()["seq"].as_u64().unwrap();
    server.run_to_end(&b, "other session");
    let second_run = server.run_to_end(&a, "second");

    // Header form, session scope: only session a's events after `last_seen`.
    let mut replay = SseClient::open(&server.base, &format!("/api/sessions/{a}/events"), None, Some(last_seen));
    let replayed =
        replay.collect_until(|e| is_run_end(e) && e["event"]["runId"] == second_run.last().unwrap()["event"]["runId"]);
    assert!(replayed.iter().all(|e| e["event"]["sessionId"] == a.as_str()));
    assert!(replayed.iter().all(|e| e["seq"].as_u64().unwrap() > last_seen));
    let want: Vec<u64> = second_run.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    let got: Vec<u64> = replayed.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(want.iter().all(|seq| got.contains(seq)), "every event of the second run is replayed");

    // Query form, all-sessions scope: session b's run is there too.
    let mut all = SseClient::open(&server.base, &format!("/api/events?lastEventId={last_seen}"), None, None);
    let replayed = all.collect_until(|e| is_run_end(e) && e["event"]["sessionId"] == a.as_str());
    assert!(replayed.iter().any(|e| e["event"]["sessionId"] == b.as_str()));
    assert!(replayed.iter().all(|e| e["seq"].as_u64().unwrap() > last_seen));

    // Then live delivery follows on the same stream.
    server.post(&format!("/api/sessions/{a}/messages"), json!({ "content": "live" }));
    let live = all.collect_until(is_run_end);
    assert!(live.iter().any(|e| e["event"]["message"]["content"] == "live"));
}

/// What a replay after `first` must send when the ring holds the last `ring` envelopes of
/// `run`: every older event but a delta (from the durable log), then the ring, in seq order.
fn expected_replay(run: &[serde_json::Value], first: u64, ring: u64) -> Vec<u64> {
    let last = run.last().unwrap()["seq"].as_u64().unwrap();
    let oldest_in_ring = last + 1 - ring;
    let mut seqs: Vec<u64> = run
        .iter()
        .filter(|e| event_type(e) != "message.delta")
        .map(|e| e["seq"].as_u64().unwrap())
        .filter(|seq| *seq > first && *seq < oldest_in_ring)
        .collect();
    seqs.extend(oldest_in_ring..=last);
    seqs
}

#[test]
fn an_evicted_id_replays_the_log_then_the_ring() {
    // Beyond the spec's "replays what remains": what the ring lost but deltas comes from the log.
    let server = TestServer::start_with(|config| config.server.replay_buffer = 8);
    let id = server.create_session(json!({}));
    let run = server.run_to_end(&id, "one two three four five six seven eight nine ten");
    assert!(run.len() > 8);
    let first = run[0]["seq"].as_u64().unwrap();
    let mut replay = SseClient::open(&server.base, &format!("/api/sessions/{id}/events"), None, Some(first));
    let seqs = replay.drain_seqs();
    assert_eq!(seqs, expected_replay(&run, first, 8));
}

#[test]
fn a_disconnected_client_leaves_no_thread_or_subscriber_behind() {
    let server = TestServer::start();
    let id = server.create_session(json!({}));
    let streams: Vec<SseClient> = (0..5)
        .map(|i| {
            if i % 2 == 0 {
                server.events("/api/events")
            } else {
                server.events(&format!("/api/sessions/{id}/events"))
            }
        })
        .collect();
    wait_until("five streams open", || server.stats().open_streams == 5 && server.stats().bus_subscribers == 5);
    for stream in streams {
        stream.disconnect();
    }
    // A quiet stream notices at its next ping (200 ms here) and its thread ends.
    wait_until("every stream thread to end", || server.stats().open_streams == 0);
    wait_until("every subscriber to go", || server.stats().bus_subscribers == 0);
    wait_until("every request thread to end", || server.stats().open_requests == 0);
}

#[test]
fn shutdown_ends_open_streams() {
    let mut server = TestServer::start();
    let stream = server.events("/api/events");
    wait_until("the stream to open", || server.stats().open_streams == 1);
    server.stop();
    assert!(stream.wait_closed(WAIT), "the stream ended with the server");
}

#[test]
fn session_events_cover_the_whole_lifecycle() {
    let server = TestServer::start();
    let mut all = server.events("/api/events");
    let id = server.create_session(json!({}));
    let created = all.collect_until(|e| event_type(e) == "session.updated");
    assert_eq!(created.last().unwrap()["event"]["session"]["id"], id.as_str());
}

#[test]
fn a_burst_of_stream_clients_is_served_promptly() {
    // tiny_http's pool can queue connections that arrive together behind long-lived ones; the
    // gates' kicks must get every one of them served.
    let server = TestServer::start();
    // Idle pool threads are what let tiny_http queue a burst: make some, as finished
    // keep-alive clients leave behind.
    let warmups: Vec<_> = (0..48)
        .map(|_| {
            let host = server.base.trim_start_matches("http://").to_string();
            std::thread::spawn(move || {
                use std::io::{Read, Write};
                let mut socket = std::net::TcpStream::connect(&host).unwrap();
                socket.write_all(b"GET /api/health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
                let mut answer = String::new();
                socket.read_to_string(&mut answer).unwrap();
                assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            })
        })
        .collect();
    warmups.into_iter().for_each(|w| w.join().unwrap());
    let clients: Vec<_> = (0..200)
        .map(|_| {
            let base = server.base.clone();
            std::thread::spawn(move || SseClient::open(&base, "/api/events", None, None))
        })
        .collect();
    let streams: Vec<SseClient> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    assert!(streams.iter().all(|s| s.status == 200));
    wait_until("all 200 streams open", || server.stats().open_streams == 200);
    // And a plain request still gets through beside them.
    assert_eq!(server.get("/api/health").status, 200);
}

#[test]
fn the_default_ring_keeps_the_last_ten_thousand_envelopes() {
    let server = TestServer::start_with(|config| config.builtin.delay_ms = 0);
    let id = server.create_session(json!({}));
    let words = "w ".repeat(10_100);
    let run = server.run_to_end(&id, words.trim_end());
    let first = run[0]["seq"].as_u64().unwrap();
    let last = run.last().unwrap()["seq"].as_u64().unwrap();
    assert!(last - first >= 10_000, "the run outgrew the ring");
    // The first envelopes of the run were evicted: they come from the log, deltas excepted,
    // then the ring's 10,000, in order.
    let mut replay = SseClient::open(&server.base, &format!("/api/sessions/{id}/events"), None, Some(first));
    let seqs = replay.drain_seqs();
    assert_eq!(seqs, expected_replay(&run, first, 10_000));
    assert_eq!(seqs.last().copied(), Some(last));
}

#[test]
fn a_client_that_stops_reading_is_cut_off_without_slowing_the_run_or_others() {
    let server = TestServer::start_with(|config| {
        config.builtin.delay_ms = 0;
        config.server.write_timeout_ms = 500;
        config.server.subscriber_buffer = 100_000;
    });
    let id = server.create_session(json!({}));
    // A raw client that sends its request and then never reads a byte.
    let host = server.base.trim_start_matches("http://").to_string();
    let mut stalled = std::net::TcpStream::connect(&host).unwrap();
    std::io::Write::write_all(
        &mut stalled,
        format!("GET /api/sessions/{id}/events HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes(),
    )
    .unwrap();
    wait_until("the stalled stream to open", || server.stats().open_streams == 1);
    let mut reader = server.events(&format!("/api/sessions/{id}/events"));
    // About 18 MB of frames: more than the socket buffers on both ends hold.
    let words = "w ".repeat(90_000);
    let started = std::time::Instant::now();
    server.post(&format!("/api/sessions/{id}/messages"), json!({ "content": words.trim_end() }));
    let events = reader.collect_until(is_run_end);
    assert_eq!(event_type(events.last().unwrap()), "run.finished");
    assert!(started.elapsed() < std::time::Duration::from_secs(20), "the run was not held back");
    // The stalled client's thread gave up on its write; the reading client's stream remains.
    wait_until("the stalled stream's thread to end", || server.stats().open_streams == 1);
    drop(stalled);
}

#[test]
fn the_plugin_stream_reports_hot_reload_off_and_stays_idle() {
    let server = TestServer::start();
    let mut stream = server.events("/api/plugins/events");
    assert_eq!(stream.status, 200);
    assert_eq!(stream.header("content-type"), Some("text/event-stream"));
    assert!(matches!(stream.next_item(WAIT), Some(SseItem::Retry(3000))));
    match stream.next_item(WAIT) {
        Some(SseItem::Named(name, data)) => {
            assert_eq!(name, "ready");
            assert_eq!(data, json!({ "enabled": false, "plugins": [] }));
        }
        other => panic!("expected the ready frame, got {other:?}"),
    }
    // Session activity does not reach it; only pings do.
    let id = server.create_session(json!({}));
    server.run_to_end(&id, "hello");
    assert!(matches!(stream.next_item(WAIT), Some(SseItem::Comment(ref c)) if c == "ping"));
    assert_eq!(server.get("/api/plugins").json, json!({ "plugins": [] }));
}
