//! `scripts/crashloop N` and `scripts/fuzz N` run this against the release binary; the
//! integration suite runs both with a small N against the debug binary.

mod bae_crash;
mod bae_fuzz;
mod cluster_crash;
mod crashloop;
mod fuzz;
#[allow(dead_code)]
#[path = "../../tests/it/pg_cluster.rs"]
mod pg_cluster;
mod random;
mod server;
mod surfaces;
mod wire;

use std::path::PathBuf;

fn main() {
    // `--store postgres`: every server keeps its state in a private PostgreSQL cluster.
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    // `--cluster N`: the crash loop kills nodes of a cluster of N on one database instead.
    let cluster = args.iter().position(|arg| arg == "--cluster").map(|at| {
        let nodes = args.get(at + 1).and_then(|n| n.parse::<usize>().ok()).unwrap_or(3).max(2);
        args.drain(at..(at + 2).min(args.len()));
        nodes
    });
    if let Some(at) = args.iter().position(|arg| arg == "--store") {
        let store = args.get(at + 1).cloned().unwrap_or_default();
        args.drain(at..(at + 2).min(args.len()));
        match store.as_str() {
            "sqlite" => {}
            "postgres" => {
                let cluster = pg_cluster::private().expect("PostgreSQL (Debian's postgresql) is installed");
                *server::CLUSTER.lock().unwrap() = Some(cluster);
                println!("store: PostgreSQL (a private cluster)");
            }
            other => {
                eprintln!("--store sqlite|postgres, not {other:?}");
                std::process::exit(2);
            }
        }
    }
    let mut args = args.into_iter();
    let (Some(mode), Some(count)) = (args.next(), args.next().and_then(|n| n.parse::<usize>().ok())) else {
        eprintln!("usage: hammer crashloop|fuzz N [SEED] [--store sqlite|postgres] [--cluster NODES]");
        std::process::exit(2);
    };
    let seed = args.next().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    println!("seed {seed}");
    let binary =
        std::env::current_exe().expect("this program").parent().and_then(|p| p.parent()).map(|p| p.join("kestrel"));
    let binary: PathBuf = binary.filter(|p| p.exists()).expect("target/release/kestrel next to this program");
    let failures = match (mode.as_str(), cluster) {
        ("crashloop", Some(nodes)) => {
            let report = cluster_crash::run(&binary, nodes, count, seed);
            report.print();
            report.failures()
        }
        ("crashloop", None) => {
            let report = crashloop::run(&binary, count, seed);
            report.print();
            // The hostile surfaces, a round for every four of the crash loop's.
            let surfaces = surfaces::crash(&binary, count.div_ceil(4), seed);
            surfaces.print("crashloop");
            // BAE's server-run calls, as many rounds as the crash loop's.
            let bae = bae_crash::run(&binary, count, seed);
            bae.print();
            report.failures.len() + surfaces.failures.len() + bae.failures.len()
        }
        ("fuzz", _) => {
            let report = fuzz::run(&binary, count, seed);
            report.print();
            // The hostile surfaces, an operation for every 500 requests (each one is slow).
            let surfaces = surfaces::fuzz(&binary, count.div_ceil(500).max(20), seed);
            surfaces.print("fuzz");
            report.failures.len() + surfaces.failures.len()
        }
        _ => {
            eprintln!("unknown mode {mode}");
            2
        }
    };
    // The cluster is stopped and removed before the exit.
    drop(server::CLUSTER.lock().unwrap_or_else(|e| e.into_inner()).take());
    std::process::exit(i32::from(failures > 0));
}
