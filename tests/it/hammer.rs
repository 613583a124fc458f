//! `scripts/crashloop` and `scripts/fuzz` in small, against the debug binary, so CI keeps both
//! honest. The README has the figures of large runs.

#[path = "../../scripts/hammer/bae_crash.rs"]
mod bae_crash;
#[path = "../../scripts/hammer/bae_fuzz.rs"]
mod bae_fuzz;
#[path = "../../scripts/hammer/cluster_crash.rs"]
mod cluster_crash;
#[path = "../../scripts/hammer/crashloop.rs"]
mod crashloop;
#[path = "../../scripts/hammer/fuzz.rs"]
mod fuzz;
#[path = "../../scripts/hammer/random.rs"]
mod random;
#[path = "../../scripts/hammer/server.rs"]
mod server;
#[path = "../../scripts/hammer/surfaces.rs"]
mod surfaces;
#[path = "../../scripts/hammer/wire.rs"]
mod wire;

use std::path::Path;

fn seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
}

#[test]
fn crashloop_keeps_every_promise_across_kill_9() {
    let seed = seed();
    let report = crashloop::run(Path::new(env!("CARGO_BIN_EXE_kestrel")), 4, seed);
    report.print();
    assert!(report.failures.is_empty(), "seed {seed}: {:#?}", report.failures);
    assert_eq!(report.integrity_checks, 4);
    assert!(report.acknowledged > 0);
}

#[test]
fn crashloop_of_a_cluster_loses_doubles_and_skips_nothing_across_node_kills() {
    if crate::pg_cluster::database().is_none() {
        return;
    }
    let seed = seed();
    let report = cluster_crash::run(Path::new(env!("CARGO_BIN_EXE_kestrel")), 3, 3, seed);
    report.print();
    assert_eq!(report.failures(), 0, "seed {seed}: {report:#?}");
    assert_eq!(report.points, 3);
    assert!(report.acknowledged > 0 && report.events_seen > 0, "{report:#?}");
}

#[test]
fn crashloop_of_bae_server_run_calls_runs_none_twice_and_keeps_sessions_usable() {
    let seed = seed();
    let report = bae_crash::run(Path::new(env!("CARGO_BIN_EXE_kestrel")), 3, seed);
    report.print();
    assert!(report.failures.is_empty(), "seed {seed}: {:#?}", report.failures);
    assert_eq!((report.rounds, report.double_executions), (3, 0));
    assert!(report.executions > 0, "calls ran: {report:?}");
    assert_eq!(report.usable_after_restart, 3 * 2, "every session of every killed round answered again");
}

#[test]
fn fuzz_finds_no_server_error_hang_or_crash() {
    let seed = seed();
    let report = fuzz::run(Path::new(env!("CARGO_BIN_EXE_kestrel")), 20_000, seed);
    report.print();
    assert!(report.failures.is_empty(), "seed {seed}: {:#?}", report.failures);
    assert_eq!(report.requests, 20_000);
}

#[test]
fn crashloop_on_the_hostile_surfaces_leaves_the_outside_alone_and_no_process_behind() {
    let seed = seed();
    let report = surfaces::crash(Path::new(env!("CARGO_BIN_EXE_kestrel")), 2, seed);
    report.print("crashloop");
    assert!(report.failures.is_empty(), "seed {seed}: {:#?}", report.failures);
    assert_eq!(report.rounds, 2);
    assert!(report.processes_checked > 0, "the rounds started processes to check");
}

#[test]
fn fuzz_on_the_hostile_surfaces_answers_everything_within_bounds() {
    let seed = seed();
    let report = surfaces::fuzz(Path::new(env!("CARGO_BIN_EXE_kestrel")), 24, seed);
    report.print("fuzz");
    assert!(report.failures.is_empty(), "seed {seed}: {:#?}", report.failures);
    assert_eq!(report.operations, 24);
}
