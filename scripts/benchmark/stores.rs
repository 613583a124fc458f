//! `scripts/bench --store postgres`: the rows bound by the store, each measured on SQLite and
//! on PostgreSQL in the same run, one after the other, and printed side by side. PostgreSQL is
//! a private cluster of Debian's binaries on this machine, started for the run
//! (`tests/it/pg_cluster.rs`, the tests' own), with its defaults (`fsync` and
//! `synchronous_commit` on: full durability, as SQLite's `synchronous=FULL`).

use std::time::{Duration, Instant};

use kestrel::store::Store;

use super::client::{open_stream, read_events};
use super::{create_sessions, fill_log, requests_per_second, settle_disk, writer_rate, Spawned};

/// Sessions listed by the session-list row.
const LISTED: usize = 1_000;
/// Sequential BAE turns of the BAE row.
const TURNS: usize = 200;

/// Where a row's server keeps its state.
#[derive(Clone, Copy)]
enum Backend<'a> {
    Sqlite,
    Postgres(&'a crate::pg_cluster::Private),
}

impl Backend<'_> {
    /// The environment of a Kestrel child on this store: a database of its own on PostgreSQL.
    fn env(&self) -> Vec<(&'static str, String)> {
        match self {
            Backend::Sqlite => Vec::new(),
            Backend::Postgres(cluster) => vec![("KESTREL_DATABASE_URL", cluster.database())],
        }
    }

    fn spawn(&self, config: &str) -> Spawned {
        let env = self.env();
        let env: Vec<(&str, &str)> = env.iter().map(|(name, value)| (*name, value.as_str())).collect();
        Spawned::kestrel_with_config(&env, config)
    }
}

pub fn rows(quick: bool) {
    let cluster = crate::pg_cluster::private().expect("PostgreSQL (Debian's postgresql package) is installed");
    let stores = [("SQLite", Backend::Sqlite), ("PostgreSQL", Backend::Postgres(&cluster))];
    let events = if quick { 20_000 } else { 100_000 };
    let logged = if quick { 20_000 } else { super::LOGGED_EVENTS };
    let mut table: Vec<(String, String, [f64; 2])> = Vec::new();
    let mut measure = |label: String, unit: &str, value: &dyn Fn(Backend<'_>) -> f64| {
        let mut figures = [0.0; 2];
        for (slot, (name, store)) in stores.iter().enumerate() {
            settle_disk();
            figures[slot] = value(*store);
            super::report::info(&format!("{label}, {name}"), figures[slot], unit);
        }
        table.push((label, unit.to_string(), figures));
    };
    measure(format!("writer thread: {events} small events, durable"), "ev/s", &|store| writer(store, events));
    measure(format!("session list, {LISTED} sessions, 32 clients"), "req/s", &|store| session_list(store));
    measure(format!("reconnect {logged} events back: replay from the log"), "ms", &|store| replay(store, logged));
    measure(format!("BAE sendMessage turn, sequential p50 ({TURNS} turns)"), "ms", &|store| bae_turn(store));
    println!();
    println!("| row | SQLite | PostgreSQL | PostgreSQL / SQLite |");
    println!("| --- | --- | --- | --- |");
    for (label, unit, [sqlite, postgres]) in table {
        println!("| {label} | {sqlite:.1} {unit} | {postgres:.1} {unit} | {:.2} |", postgres / sqlite);
    }
}

/// The writer thread's rate for `count` appended messages, each its own detached write.
fn writer(store: Backend<'_>, count: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let (opened, handle) = match store {
        Backend::Sqlite => Store::open(dir.path()).unwrap(),
        Backend::Postgres(cluster) => Store::open_postgres(dir.path(), &cluster.database(), 4).unwrap(),
    };
    writer_rate(&opened, handle, count)
}

/// Requests per second for the first page of a tenant's `LISTED` sessions.
fn session_list(store: Backend<'_>) -> f64 {
    let kestrel = store.spawn("");
    create_sessions(&kestrel.host, LISTED);
    requests_per_second(&kestrel.host, "/api/sessions?limit=50")
}

/// Milliseconds until a stream that reconnects `count` events back has them all.
fn replay(store: Backend<'_>, count: usize) -> f64 {
    let env = store.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(name, value)| (*name, value.as_str())).collect();
    let kestrel = fill_log(&env, count);
    let started = Instant::now();
    let mut reader = open_stream(&kestrel.host, "/api/events", Some(0)).unwrap();
    read_events(&mut reader, count);
    started.elapsed().as_secs_f64() * 1000.0
}

/// The median of `TURNS` sequential BAE turns against the fake Messages API.
fn bae_turn(store: Backend<'_>) -> f64 {
    let fake = Spawned::helper("fake-messages");
    let mut kestrel = store.spawn(&super::bae::fake_provider_config(&fake.host));
    let admin = kestrel.next_host();
    let key = super::bae::client_key(&admin, &kestrel.data_dir());
    let mut sends: Vec<f64> = (0..TURNS).map(|_| ms(super::bae::one_turn(&kestrel.host, &key).1)).collect();
    super::bae::percentile(&mut sends, 0.5)
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}
