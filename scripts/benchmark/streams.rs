//! Many idle event streams: Kestrel's memory, threads and descriptors while it holds them,
//! and how fast it answers meanwhile; beside the floor server holding the same streams.

use std::time::Instant;

use super::client::{open_stream, Connection};
use super::{report, Spawned};

/// What a server process is using: (VmRSS MiB, VmHWM MiB, threads, open descriptors).
pub fn usage(pid: u32) -> (u64, u64, u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|line| line.starts_with(name))
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let descriptors = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |fds| fds.count() as u64);
    (field("VmRSS:") / 1024, field("VmHWM:") / 1024, field("Threads:"), descriptors)
}

/// `count` idle streams on `path`, opened one after another, then `/api/health` (or `/`)
/// asked one request at a time for `ROUND`: the process's usage and the answers' latencies.
fn hold(server: &Spawned, path: &str, health: &str, count: usize) -> ((u64, u64, u64, u64), Vec<f64>) {
    let streams: Vec<_> = (0..count)
        .map(|n| open_stream(&server.host, path, None).unwrap_or_else(|e| panic!("stream {n} did not open: {e}")))
        .collect();
    let held = usage(server.child.id());
    let mut connection = Connection::open(&server.host).unwrap();
    let mut latencies = Vec::new();
    let until = Instant::now() + super::ROUND;
    while Instant::now() < until {
        let started = Instant::now();
        let answer = connection.request("GET", health, b"").unwrap();
        assert_eq!(answer.status, 200);
        latencies.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    drop(streams);
    (held, latencies)
}

pub fn rows(quick: bool) {
    let count = if quick { 1_000 } else { 10_000 };
    // An idle stream holds one descriptor (its socket), but `max_connections` derived from the
    // limit counts four per connection (README, Limits and hardening): set it for the streams.
    let kestrel = Spawned::kestrel_with_config(&[], &format!("[server]\nmax_connections = {}\n", count + 1_000));
    let idle = usage(kestrel.child.id());
    let ((rss, peak, threads, descriptors), mut latencies) = hold(&kestrel, "/api/events", "/api/health", count);
    drop(kestrel);
    // tiny_http holds two descriptors per connection: under a 20,000 limit the floor holds 9,000.
    let floor_count = count.min(9_000);
    let floor = Spawned::floor();
    let floor_idle = usage(floor.child.id());
    let ((floor_rss, _, floor_threads, _), mut floor_latencies) = hold(&floor, "/stream", "/", floor_count);
    drop(floor);
    let per = |now: u64, before: u64, streams: usize| now.saturating_sub(before) as f64 / streams as f64;
    match quick {
        true => report::info(&format!("RSS with {count} idle SSE streams"), rss as f64, "MiB"),
        false => {
            report::vs_target(&format!("RSS with {count} idle SSE streams"), rss as f64, "MiB", 600.0, "< 600 MiB")
        }
    }
    report::info(&format!("  peak RSS ({count} streams)"), peak as f64, "MiB");
    report::vs_floor(
        &format!("  KiB per idle stream ({count} streams)"),
        per(rss, idle.0, count) * 1024.0,
        "KiB",
        per(floor_rss, floor_idle.0, floor_count) * 1024.0,
    );
    report::vs_floor(
        &format!("  threads per idle stream ({count} streams)"),
        per(threads, idle.2, count),
        "threads",
        per(floor_threads, floor_idle.2, floor_count),
    );
    report::info(&format!("  descriptors per idle stream ({count} streams)"), per(descriptors, idle.3, count), "fds");
    let p99 = super::bae::percentile(&mut latencies, 0.99);
    let floor_p99 = super::bae::percentile(&mut floor_latencies, 0.99);
    report::vs_floor(&format!("GET /api/health while {count} streams are open: p99"), p99, "ms", floor_p99);
    report::vs_target(&format!("  p99, target ({count} streams)"), p99, "ms", 10.0, "< 10 ms");
}
