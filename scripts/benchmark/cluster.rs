//! `scripts/bench --cluster N`: a cluster of 1..=N node processes on one private PostgreSQL
//! database (`tests/it/pg_cluster.rs`), on this one machine:
//!
//! - BAE turns/s and Kestrel runs/s with 1, 2, … N nodes, the clients spread over the nodes
//!   (each session opened at the node its client talks to, so its turns run there);
//! - what a remote subscriber adds: the same events followed at the node that runs the turn
//!   and at another node (a session stream relayed from the holder, and the global stream fed
//!   through LISTEN/NOTIFY), each event's arrival at the remote one less its arrival at the
//!   local one, p50 and p99;
//! - forwarding: one session read at its holder and at another node, which sends it on,
//!   p50 and p99 of each.

use std::io::BufRead;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use super::bae::{client_key, fake_provider_config, open_registered, percentile};
use super::client::{open_stream, read_chunk, Connection};
use super::{report, Spawned};

const SECRET: &str = "bench-cluster-secret";
/// Clients of the throughput rows, spread over the nodes.
const CLIENTS: usize = 16;

/// Nodes on one database, the fake Messages API configured as `fake`.
fn start_nodes(database: &str, count: usize, fake: &str) -> Vec<Spawned> {
    (0..count)
        .map(|n| {
            let config = format!(
                "[store]\nurl = \"{database}\"\n[cluster]\nsecret = \"{SECRET}\"\nnode_id = \"bench-{n}\"\n\
                 [builtin]\ndelay_ms = 0\n{}",
                fake_provider_config(fake)
            );
            Spawned::kestrel_with_config(&[("KESTREL_DATABASE_URL", database)], &config)
        })
        .collect()
}

pub fn rows(nodes: usize, quick: bool) {
    let cluster = crate::pg_cluster::private().expect("PostgreSQL (Debian's postgresql package) is installed");
    let fake = Spawned::helper("fake-messages");
    let seconds = if quick { 2 } else { 5 };
    for count in 1..=nodes {
        let mut spawned = start_nodes(&cluster.database(), count, &fake.host);
        let admin = spawned[0].next_host();
        let key = client_key(&admin, &spawned[0].data_dir());
        let hosts: Vec<String> = spawned.iter().map(|node| node.host.clone()).collect();
        let turns = spread(&hosts, seconds, |host| bae_turns(host, &key));
        report::info(&format!("BAE sendMessage turns/s, {CLIENTS} clients over {count} node(s)"), turns, "/s");
        let runs = spread(&hosts, seconds, kestrel_runs);
        report::info(&format!("Kestrel runs/s, {CLIENTS} clients over {count} node(s)"), runs, "/s");
        if count == 2 {
            remote_latency(&hosts, if quick { 50 } else { 200 });
            forwarding(&hosts, if quick { 500 } else { 2_000 });
        }
        spawned.drain(..).for_each(Spawned::stop);
    }
}

/// `CLIENTS` clients, client i at node i mod n, each running `client` for `seconds`; what
/// they did per second, all told.
fn spread(hosts: &[String], seconds: u64, client: impl Fn(&str) -> Box<dyn FnMut() + Send> + Sync) -> f64 {
    let barrier = Arc::new(Barrier::new(CLIENTS + 1));
    let until = Arc::new(std::sync::OnceLock::<Instant>::new());
    let threads: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let mut step = client(&hosts[i % hosts.len()]);
            let (barrier, until) = (Arc::clone(&barrier), Arc::clone(&until));
            std::thread::spawn(move || {
                barrier.wait();
                let end = *until.wait();
                let mut done = 0u64;
                while Instant::now() < end {
                    step();
                    done += 1;
                }
                done
            })
        })
        .collect();
    let started = Instant::now();
    let _ = until.set(started + Duration::from_secs(seconds));
    barrier.wait();
    let done: u64 = threads.into_iter().map(|thread| thread.join().unwrap()).sum();
    done as f64 / started.elapsed().as_secs_f64()
}

/// A BAE client: a session opened at `host` (so held there), then one turn per step.
fn bae_turns(host: &str, key: &str) -> Box<dyn FnMut() + Send> {
    let (session, session_key) = open_registered(&mut Connection::open(host).unwrap(), key);
    let rpc = format!("/api/v1/sessions/{session}/rpc");
    let host = host.to_string();
    Box::new(move || {
        let send = br#"{"jsonrpc":"2.0","id":2,"method":"session.sendMessage","params":{"message":{"content":"What time is it?"}}}"#;
        // A turn's stream ends its connection.
        let mut connection = Connection::open(&host).unwrap();
        let answer = connection.request_as("POST", &rpc, Some(&session_key), send).unwrap();
        assert!(String::from_utf8_lossy(&answer.body).contains("It is noon."));
    })
}

/// A Kestrel client: a session at `host`, its stream open there (so held there), then one
/// run per step: a message, and its stream read to `run.finished`.
fn kestrel_runs(host: &str) -> Box<dyn FnMut() + Send> {
    let mut connection = Connection::open(host).unwrap();
    let created = connection.request("POST", "/api/sessions", b"{}").unwrap();
    let created: serde_json::Value = serde_json::from_slice(&created.body).unwrap();
    let session = created["session"]["id"].as_str().unwrap().to_string();
    let mut stream = open_stream(host, &format!("/api/sessions/{session}/events"), None).unwrap();
    let path = format!("/api/sessions/{session}/messages");
    Box::new(move || {
        let sent = connection.request("POST", &path, br#"{"content":"hello"}"#).unwrap();
        assert_eq!(sent.status, 202, "{}", String::from_utf8_lossy(&sent.body));
        while !String::from_utf8_lossy(&read_chunk(&mut stream).unwrap().unwrap()).contains("run.finished") {}
    })
}

/// Each event's seq, as it arrives on `stream`, with when it arrived, until `run.finished`
/// has arrived `runs` times.
fn arrivals(mut stream: std::io::BufReader<std::net::TcpStream>, runs: usize) -> Vec<(u64, Instant)> {
    let mut seen = Vec::new();
    let mut finished = 0;
    while finished < runs {
        let Some(chunk) = read_chunk(&mut stream).unwrap() else { break };
        let at = Instant::now();
        for line in chunk.as_slice().lines().map_while(Result::ok) {
            if let Some(id) = line.strip_prefix("id: ").and_then(|id| id.parse().ok()) {
                seen.push((id, at));
            }
            finished += usize::from(line.starts_with("data: ") && line.contains("\"run.finished\""));
        }
    }
    seen
}

/// Runs at the first node, followed there and at the second: the second's arrival of each
/// event less the first's.
fn remote_latency(hosts: &[String], runs: usize) {
    let mut connection = Connection::open(&hosts[0]).unwrap();
    let created = connection.request("POST", "/api/sessions", b"{}").unwrap();
    let created: serde_json::Value = serde_json::from_slice(&created.body).unwrap();
    let session = created["session"]["id"].as_str().unwrap().to_string();
    let path = format!("/api/sessions/{session}/events");
    let local = open_stream(&hosts[0], &path, None).unwrap();
    let relayed = open_stream(&hosts[1], &path, None).unwrap();
    let global = open_stream(&hosts[1], "/api/events", None).unwrap();
    let followers = [local, relayed, global].map(|stream| std::thread::spawn(move || arrivals(stream, runs)));
    for _ in 0..runs {
        let sent = connection.request("POST", &format!("/api/sessions/{session}/messages"), br#"{"content":"hi"}"#);
        assert_eq!(sent.unwrap().status, 202);
        // One run at a time: wait for its end at the holder.
        let detail = format!("/api/sessions/{session}");
        while String::from_utf8_lossy(&connection.request("GET", &detail, b"").unwrap().body).contains("\"running\"") {}
    }
    let [local, relayed, global] = followers.map(|follower| follower.join().unwrap());
    let local: std::collections::HashMap<u64, Instant> = local.into_iter().collect();
    for (label, remote) in
        [("a session stream relayed from the holder", relayed), ("the global stream (LISTEN/NOTIFY)", global)]
    {
        let mut added: Vec<f64> = remote
            .iter()
            .filter_map(|(seq, at)| {
                local.get(seq).map(|there| at.saturating_duration_since(*there).as_secs_f64() * 1000.0)
            })
            .collect();
        if added.is_empty() {
            continue;
        }
        let (p50, p99) = (percentile(&mut added, 0.5), percentile(&mut added, 0.99));
        report::info(&format!("remote subscriber, {label}: added latency p50"), p50, "ms");
        report::info(&format!("  p99 ({} events)", added.len()), p99, "ms");
    }
}

/// One session, held by the first node, read at it and at the second.
fn forwarding(hosts: &[String], requests: usize) {
    let mut at_holder = Connection::open(&hosts[0]).unwrap();
    let created = at_holder.request("POST", "/api/sessions", b"{}").unwrap();
    let created: serde_json::Value = serde_json::from_slice(&created.body).unwrap();
    let session = created["session"]["id"].as_str().unwrap().to_string();
    // Its stream claims it for the first node, which keeps it while the stream is open.
    let _held = open_stream(&hosts[0], &format!("/api/sessions/{session}/events"), None).unwrap();
    let path = format!("/api/sessions/{session}");
    let timed = |host: &str| -> Vec<f64> {
        let mut connection = Connection::open(host).unwrap();
        (0..requests)
            .map(|_| {
                let started = Instant::now();
                assert_eq!(connection.request("GET", &path, b"").unwrap().status, 200);
                started.elapsed().as_secs_f64() * 1000.0
            })
            .collect()
    };
    let (mut here, mut forwarded) = (timed(&hosts[0]), timed(&hosts[1]));
    at_holder.request("GET", "/api/health", b"").unwrap();
    let (here_p50, here_p99) = (percentile(&mut here, 0.5), percentile(&mut here, 0.99));
    let (there_p50, there_p99) = (percentile(&mut forwarded, 0.5), percentile(&mut forwarded, 0.99));
    report::vs_floor(
        "GET a session at another node (forwarded): p50 (floor: at its holder)",
        there_p50,
        "ms",
        here_p50,
    );
    report::vs_floor("  p99 (floor: at its holder)", there_p99, "ms", here_p99);
    report::info("  forwarding overhead p50", there_p50 - here_p50, "ms");
    report::info("  forwarding overhead p99", there_p99 - here_p99, "ms");
}
