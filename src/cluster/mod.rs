//! This node as one of several on one PostgreSQL database (docs/cluster.md).
//!
//! `Node` is what the doors and the engine ask: who this node is, which nodes there are, and
//! who owns a session (claiming it when no one does). The `kestrel-cluster` thread writes
//! the node's heartbeat and renews its leases every third of a lease; a lease that was not
//! renewed is lost, and the session is dropped from the lease book at once, so the writer
//! refuses this node's writes to it from then on (fencing, `store/cluster.rs`). At shutdown
//! the node gives its leases up, so other nodes take its sessions over without waiting for
//! them to expire.

pub mod forward;
mod secret;
#[cfg(test)]
mod testing;
mod watch;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};

use crate::config::ClusterConfig;
use crate::engine::tenure::{Leases, WeakEngine};
use crate::engine::Engine;
use crate::store::cluster::{Claim, LeaseBook, Membership, NodeRow};
use crate::store::StoreError;

/// The header a node presents its cluster secret in, on calls to another node.
pub const SECRET_HEADER: &str = "Kestrel-Cluster-Secret";

/// The shortest and longest lease `cluster.lease_ms` may set: a renewal every third of it
/// must fit between heartbeats, and a lease longer than a day only delays every failover.
const MIN_LEASE_MS: u64 = 300;
const MAX_LEASE_MS: u64 = 86_400_000;

/// This node of a cluster.
pub struct Node {
    id: String,
    advertise_url: OnceLock<String>,
    secret: secret::ClusterSecret,
    lease_ms: u64,
    membership: Arc<dyn Membership>,
    book: Arc<LeaseBook>,
    /// The client of calls to other nodes (`forward.rs`), its connections kept for reuse.
    agent: ureq::Agent,
    /// The client of reads of a session and of relayed session streams, which wait a lease
    /// at most for the holder's next bytes before the session's lease is looked at again
    /// (`watch.rs`, `forward.rs`). A holder pings a relayed stream each third of a lease, so
    /// a lease of silence means a holder paused, cut off or no longer speaking for the
    /// session, and the relay opens the stream again where the session is held then.
    watch_agent: ureq::Agent,
    /// The engine this node's leases are for: told what it takes over and what it loses.
    engine: OnceLock<WeakEngine>,
    /// Claims of sessions this node does not hold, one at a time per stripe, so a session is
    /// taken over once however many requests for it arrive together.
    taking: [Mutex<()>; TAKING_STRIPES],
    /// The sessions found idle at the last heartbeat: given up if still idle at this one.
    idle: Mutex<HashSet<String>>,
}

const TAKING_STRIPES: usize = 16;
/// A lease may have run out, by this node's clock, a tenth of the lease before the database
/// says it does (`Node::lapses`).
const LAPSE_MARGIN_DIVISOR: u64 = 10;
/// Orphaned leases a heartbeat takes over at most (the rest at the next one).
const SWEEP_LIMIT: i64 = 64;

/// How long a call to another node may take to connect, and to send its next bytes: an
/// answer may wait on a model for minutes.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const READ_TIMEOUT: Duration = Duration::from_secs(600);

/// A client of other nodes that waits `read_timeout` at most for their next bytes.
fn agent(read_timeout: Duration) -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout_connect(CONNECT_TIMEOUT)
        .timeout_read(read_timeout)
        .redirects(0)
        .user_agent(concat!("kestrel-cluster/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// The default node id: the host's name and the data dir's marker, so two nodes on one host
/// (each with its own data dir) differ, and one node keeps its id across restarts.
pub fn default_node_id(marker: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "host".to_string());
    format!("{host}-{marker}")
}

impl Node {
    pub fn new(
        config: &ClusterConfig,
        secret: &str,
        membership: Arc<dyn Membership>,
        book: Arc<LeaseBook>,
    ) -> Arc<Node> {
        let lease_ms = config.lease_ms.clamp(MIN_LEASE_MS, MAX_LEASE_MS);
        let advertise_url = OnceLock::new();
        if let Some(url) = config.advertise_url.as_deref().filter(|url| !url.is_empty()) {
            let _ = advertise_url.set(url.trim_end_matches('/').to_string());
        }
        Arc::new(Node {
            id: book.node().to_string(),
            advertise_url,
            secret: secret::ClusterSecret::new(secret),
            lease_ms,
            membership,
            book,
            agent: agent(READ_TIMEOUT),
            watch_agent: agent(Duration::from_millis(lease_ms)),
            engine: OnceLock::new(),
            taking: Default::default(),
            idle: Mutex::default(),
        })
    }

    /// Ties the node and the engine together: the engine claims leases through the node, and
    /// hears from it what it takes over and loses (`engine/tenure.rs`).
    pub fn serve(self: &Arc<Self>, engine: &Engine) {
        let _ = self.engine.set(engine.downgrade());
        engine.serve_leases(Arc::clone(self) as Arc<dyn Leases>);
    }

    fn engine(&self) -> Option<Engine> {
        self.engine.get().and_then(WeakEngine::upgrade)
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn lease_ms(&self) -> u64 {
        self.lease_ms
    }

    pub fn advertise_url(&self) -> &str {
        self.advertise_url.get().map(String::as_str).unwrap_or("")
    }

    /// Every node's row.
    pub fn nodes(&self) -> Result<Vec<NodeRow>, StoreError> {
        self.membership.nodes()
    }

    /// Takes the session's lease if no other node holds it; who does otherwise. A lease this
    /// node did not hold is taken over (`Engine::take_over`) before the book says it holds it,
    /// so no operation runs here on what the last holder left.
    pub fn claim(&self, session_id: &str) -> Result<Claim, StoreError> {
        let _taking = self.taking[stripe(session_id)].lock().unwrap_or_else(|e| e.into_inner());
        let fresh = self.book.epoch(session_id).is_none();
        let started = Instant::now();
        let claim = self.membership.claim(session_id, &self.id, self.lease_ms)?;
        if let Claim::Held { epoch } = claim {
            if fresh {
                self.take_over(session_id, epoch)?;
            }
            self.book.hold(session_id, epoch, self.lapses(started));
        }
        Ok(claim)
    }

    /// When a lease claimed or renewed by a statement sent at `started` may have run out, by
    /// this node's clock: the database set its end to its own time, later than `started`,
    /// plus the lease; a tenth of the lease less covers clocks that run at slightly different
    /// rates and the time from a check to the bytes it lets out.
    fn lapses(&self, started: Instant) -> Instant {
        started + Duration::from_millis(self.lease_ms - self.lease_ms / LAPSE_MARGIN_DIVISOR)
    }

    /// Ends what the last holder left; if that fails the lease is given back, for a later
    /// claim to try again.
    fn take_over(&self, session_id: &str, epoch: i64) -> Result<(), StoreError> {
        let Some(engine) = self.engine() else { return Ok(()) };
        let Err(error) = engine.take_over(session_id) else { return Ok(()) };
        log::warn!("session {session_id} was not taken over: {error}");
        self.membership.release(session_id, &self.id, epoch)?;
        Err(match error {
            crate::engine::EngineError::Store(error) => error,
            _ => StoreError::Unavailable(format!("session {session_id} could not be taken over")),
        })
    }

    /// Gives the session's lease up, if this node holds it.
    pub fn release(&self, session_id: &str) -> Result<(), StoreError> {
        match self.book.drop_session(session_id) {
            Some(epoch) => self.membership.release(session_id, &self.id, epoch).map(drop),
            None => Ok(()),
        }
    }

    /// Whether `presented` is the cluster's secret (`secret.rs`: fixed-length tags compared
    /// in constant time).
    pub fn admits(&self, presented: &str) -> bool {
        self.secret.admits(presented)
    }

    /// One heartbeat and one renewal; the sessions whose lease was lost are dropped from the
    /// book and evicted from the engine (and returned).
    fn beat(&self) -> Result<Vec<String>, StoreError> {
        self.membership.heartbeat(&self.id, self.advertise_url())?;
        let started = Instant::now();
        let renewed = self.membership.renew(&self.id, self.lease_ms)?;
        self.book.extend(&renewed, self.lapses(started));
        let mut lost = Vec::new();
        for (session, epoch) in self.book.held() {
            if !renewed.iter().any(|(id, at)| *id == session && *at == epoch) {
                self.book.lose(&session);
                lost.push(session);
            }
        }
        if let Some(engine) = self.engine() {
            for session in &lost {
                if !engine.evict(session) {
                    self.book.settle(session);
                }
            }
        }
        Ok(lost)
    }

    /// Gives up the leases of sessions idle here since the last heartbeat, so that load
    /// spreads; how many.
    fn let_go_idle(&self) -> usize {
        let Some(engine) = self.engine() else { return 0 };
        let mut seen = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let mut idle_now = HashSet::new();
        let mut released = 0;
        for (session, epoch) in self.book.held() {
            // A claim of the session waits until it is given up (or kept) for good.
            let _taking = self.taking[stripe(&session)].lock().unwrap_or_else(|e| e.into_inner());
            let mut let_go = || {
                if seen.contains(&session) {
                    self.book.drop_session(&session);
                }
            };
            if !engine.let_go_if_idle(&session, &mut let_go) {
                continue;
            }
            match self.book.epoch(&session) {
                Some(_) => drop(idle_now.insert(session)),
                None => match self.membership.release(&session, &self.id, epoch) {
                    Ok(_) => released += 1,
                    Err(error) => log::warn!("the lease of idle session {session} was not given up: {error}"),
                },
            }
        }
        *seen = idle_now;
        released
    }

    /// Takes over the sessions whose lease ran out (their node died or was cut off) and the
    /// ones this node's previous process held; the next heartbeats give them up once idle.
    fn sweep(&self) -> Result<usize, StoreError> {
        let mut taken = 0;
        for session in self.membership.orphans(&self.id, SWEEP_LIMIT)? {
            if self.book.epoch(&session).is_some() {
                continue;
            }
            match self.claim(&session) {
                Ok(Claim::Held { .. }) => taken += 1,
                Ok(Claim::Owned(_)) | Err(StoreError::MissingSession | StoreError::Busy) => {}
                Err(error) => log::warn!("the orphaned lease of session {session} was not taken over: {error}"),
            }
        }
        Ok(taken)
    }

    /// Gives every lease up (at shutdown).
    fn release_all(&self) {
        for (session, _) in self.book.held() {
            if let Err(error) = self.release(&session) {
                log::warn!("the lease of session {session} was not given up: {error}");
            }
        }
    }
}

impl Leases for Node {
    fn acquire(&self, session_id: &str) -> Result<(), StoreError> {
        if self.book.epoch(session_id).is_some() {
            return Ok(());
        }
        match self.claim(session_id)? {
            Claim::Held { .. } => Ok(()),
            Claim::Owned(_) => Err(StoreError::Fenced(session_id.to_string())),
        }
    }

    fn holds(&self, session_id: &str) -> bool {
        self.book.epoch(session_id).is_some()
    }

    fn settled(&self, session_id: &str) {
        self.book.settle(session_id);
    }
}

fn stripe(session_id: &str) -> usize {
    session_id.bytes().fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(b as usize)) % TAKING_STRIPES
}

/// The running `kestrel-cluster` thread; stopping it gives this node's leases up.
pub struct ClusterHandle {
    stop: Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl ClusterHandle {
    pub fn shutdown(mut self) {
        let _ = self.stop.send(());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Announces the node at `bound` (unless an advertise URL is configured) and starts its
/// heartbeat; the first heartbeat is written before this returns, so the node is listed at
/// once.
pub fn start(node: &Arc<Node>, bound: std::net::SocketAddr) -> Result<ClusterHandle, StoreError> {
    let _ = node.advertise_url.set(format!("http://{bound}"));
    node.beat()?;
    log::info!("node {} joined the cluster as {}", node.id, node.advertise_url());
    let (stop, stopped) = bounded(1);
    let beating = Arc::clone(node);
    let thread = std::thread::Builder::new()
        .name("kestrel-cluster".into())
        .spawn(move || run(&beating, &stopped))
        .map_err(StoreError::Io)?;
    Ok(ClusterHandle { stop, thread: Some(thread) })
}

fn run(node: &Node, stopped: &Receiver<()>) {
    let every = Duration::from_millis(node.lease_ms / 3);
    while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
        match node.beat() {
            Ok(lost) => {
                for session in lost {
                    log::warn!("node {} lost the lease of session {session}; it no longer acts on it", node.id);
                }
            }
            Err(error) => log::warn!("node {}'s heartbeat was not written: {error}", node.id),
        }
        let released = node.let_go_idle();
        if released > 0 {
            log::debug!("node {} gave up {released} idle session lease(s)", node.id);
        }
        match node.sweep() {
            Ok(0) => {}
            Ok(taken) => log::info!("node {} took over {taken} session(s) whose holder stopped", node.id),
            Err(error) => log::warn!("node {} did not sweep orphaned leases: {error}", node.id),
        }
    }
    node.release_all();
}
