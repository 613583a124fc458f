//! tiny_http behind the gates: a server on a private Unix socket, and the dispatcher that hands
//! each request it parses back to the gate that forwarded it.
//!
//! Each gate opens one Unix connection to the backend and tags every head it forwards with its
//! connection id (`CONN_HEADER`); the `kestrel-http` dispatcher thread takes requests from
//! tiny_http and sends each to its gate through `Routes`. tiny_http's accept thread can die
//! (it breaks its loop on any accept error and panics when `try_clone` fails for want of file
//! descriptors); then requests stop arriving. Either the dispatcher sees tiny_http's queue end,
//! or a gate waits past `DISPATCH_DEADLINE` and a probe on a fresh connection confirms it: the
//! backend is replaced by a new one on a new socket and serving resumes.
//!
//! tiny_http's pool can also leave a new connection queued behind long-lived ones (an idle
//! pool thread was counted as free twice); a gate waiting for its request "kicks" the backend,
//! opening and closing a connection, which makes tiny_http start a fresh pool thread that then
//! takes the queued connection.

use std::collections::HashMap;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};

use super::Gauges;

/// The header that carries a gate's connection id to tiny_http and back.
pub const CONN_HEADER: &str = "X-Kestrel-Conn";

/// How long a gate waits for tiny_http to hand back a request it forwarded before suspecting
/// the backend. A healthy backend answers in microseconds; kicks cover the pool's queueing.
pub const DISPATCH_DEADLINE: Duration = Duration::from_secs(5);

/// How long a probe waits; the probe is the only request on its fresh connection.
const PROBE_DEADLINE: Duration = Duration::from_secs(2);

/// Connection id of the probe request; gates count from 1.
const PROBE_ID: u64 = 0;

/// Sockets longer than this do not fit `sun_path`; a temporary directory is used instead.
const MAX_SOCKET_PATH: usize = 100;

/// Where requests parsed by tiny_http go: the channel of the gate with that connection id.
#[derive(Default)]
pub struct Routes {
    shards: [Mutex<HashMap<u64, Sender<tiny_http::Request>>>; 16],
}

impl Routes {
    fn shard(&self, id: u64) -> MutexGuard<'_, HashMap<u64, Sender<tiny_http::Request>>> {
        self.shards[(id % 16) as usize].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a connection; its requests arrive on the returned receiver.
    pub fn register(&self, id: u64) -> Receiver<tiny_http::Request> {
        let (tx, rx) = bounded(1);
        self.shard(id).insert(id, tx);
        rx
    }

    pub fn unregister(&self, id: u64) {
        self.shard(id).remove(&id);
    }

    fn route(&self, request: tiny_http::Request) {
        let id = request
            .headers()
            .iter()
            .find(|h| h.field.equiv(CONN_HEADER))
            .and_then(|h| h.value.as_str().parse::<u64>().ok());
        let sender = id.and_then(|id| self.shard(id).get(&id).cloned());
        match sender {
            // One request at a time per connection, so the slot is free; a gate that has just
            // gone away drops it, and tiny_http answers it to nobody.
            Some(sender) => {
                let _ = sender.try_send(request);
            }
            None => log::debug!("a request for a connection that is gone was dropped"),
        }
    }
}

/// One tiny_http server and its dispatcher.
pub struct Backend {
    pub generation: u64,
    /// Set when a newer backend took over; gates waiting on this one give up at once.
    retired: AtomicBool,
    server: Arc<tiny_http::Server>,
    socket: PathBuf,
    dispatcher: Mutex<Option<JoinHandle<()>>>,
}

impl Backend {
    /// A new connection to this backend.
    pub fn connect(&self) -> std::io::Result<UnixStream> {
        UnixStream::connect(&self.socket)
    }

    /// Opens and closes a connection, so a request tiny_http's pool queued gets a thread.
    /// False when nothing listens any more (tiny_http's accept thread is gone).
    pub fn kick(&self) -> bool {
        match UnixStream::connect(&self.socket) {
            Ok(_) => true,
            Err(error) => !matches!(error.kind(), std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound),
        }
    }
}

/// Owns the current backend and replaces it when it dies.
pub struct Backends {
    dir: PathBuf,
    /// Removed at shutdown when the directory is a temporary one we made.
    temporary: bool,
    current: Mutex<Arc<Backend>>,
    /// Serializes probes and replacements.
    repair: Mutex<()>,
    routes: Arc<Routes>,
    generations: AtomicU64,
    stopping: AtomicBool,
    gauges: Arc<Gauges>,
}

impl Backends {
    /// Creates the socket directory (mode 0700) and starts the first backend.
    pub fn start(runtime_dir: &Path, gauges: Arc<Gauges>) -> std::io::Result<Arc<Backends>> {
        let (dir, temporary) = socket_dir(runtime_dir)?;
        let routes = Arc::new(Routes::default());
        let first = spawn_backend(&dir, 1)?;
        let backends = Arc::new(Backends {
            dir,
            temporary,
            current: Mutex::new(Arc::clone(&first.0)),
            repair: Mutex::new(()),
            routes,
            generations: AtomicU64::new(1),
            stopping: AtomicBool::new(false),
            gauges,
        });
        backends.watch(first);
        Ok(backends)
    }

    pub fn routes(&self) -> &Routes {
        &self.routes
    }

    pub fn current(&self) -> Arc<Backend> {
        Arc::clone(&self.current.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// A gate could not reach `generation`, or its forwarded request never came back. Probes
    /// that backend on a fresh connection and replaces it if the probe fails too. A probe that
    /// cannot even open a socket (the process is out of descriptors) proves nothing, so the
    /// backend is kept. If another thread is already repairing, this returns at once.
    pub fn suspect(self: &Arc<Self>, generation: u64) {
        let Ok(_repairing) = self.repair.try_lock() else { return };
        let backend = self.current();
        if backend.generation != generation || self.stopping.load(Ordering::SeqCst) {
            return; // already replaced, or going away anyway
        }
        match self.probe(&backend) {
            Probe::Answered => {
                log::warn!("a request to the HTTP backend was lost, but the backend answers a probe");
            }
            Probe::NoDescriptors => log::warn!("the HTTP backend cannot be probed: out of file descriptors"),
            Probe::Lost => {
                log::error!("the HTTP backend (generation {generation}) stopped taking requests; starting a new one");
                self.replace(generation, Some(5));
            }
        }
    }

    /// Sends a request tagged with the probe id and waits for the dispatcher to hand it over.
    fn probe(&self, backend: &Backend) -> Probe {
        use std::io::Write;
        let requests = self.routes.register(PROBE_ID);
        let outcome = match backend.connect() {
            Ok(mut stream) => {
                let head = format!("GET /kestrel-probe HTTP/1.1\r\n{CONN_HEADER}: {PROBE_ID}\r\n\r\n");
                let answered = stream.write_all(head.as_bytes()).is_ok()
                    && wait_kicking(&requests, backend, PROBE_DEADLINE).is_some();
                if answered {
                    Probe::Answered
                } else {
                    Probe::Lost
                }
            }
            Err(error) if out_of_descriptors(&error) => Probe::NoDescriptors,
            Err(_) => Probe::Lost,
        };
        self.routes.unregister(PROBE_ID);
        outcome
    }

    /// Starts a backend to take over from `generation`, retrying with a growing pause while
    /// that fails (`attempts` times, or until it works). The old backend's dispatcher is told
    /// to stop; connections still on it are refused once and reconnect to the new one.
    fn replace(self: &Arc<Self>, generation: u64, attempts: Option<usize>) {
        let mut delay = Duration::from_millis(50);
        let mut tries = 0;
        while !self.stopping.load(Ordering::SeqCst) {
            let next = self.generations.fetch_add(1, Ordering::SeqCst) + 1;
            match spawn_backend(&self.dir, next) {
                Ok(fresh) => {
                    let old = std::mem::replace(
                        &mut *self.current.lock().unwrap_or_else(|e| e.into_inner()),
                        Arc::clone(&fresh.0),
                    );
                    old.retired.store(true, Ordering::SeqCst);
                    old.server.unblock();
                    self.gauges.backend_restarts.fetch_add(1, Ordering::Relaxed);
                    log::warn!("HTTP backend generation {next} replaces generation {generation}");
                    self.watch(fresh);
                    return;
                }
                Err(error) => {
                    tries += 1;
                    if attempts.is_some_and(|limit| tries >= limit) {
                        log::error!("cannot start a new HTTP backend ({error}); giving up for now");
                        return;
                    }
                    log::error!("cannot start a new HTTP backend ({error}); retrying in {delay:?}");
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    /// Starts the dispatcher of a fresh backend; when tiny_http's queue ends for any reason
    /// but shutdown, the backend is replaced.
    fn watch(self: &Arc<Self>, (backend, server): (Arc<Backend>, Arc<tiny_http::Server>)) {
        let backends = Arc::downgrade(self);
        let routes = Arc::clone(&self.routes);
        let generation = backend.generation;
        let backend_of_thread = Arc::clone(&backend);
        let spawned = std::thread::Builder::new().name("kestrel-http".into()).spawn(move || {
            for request in server.incoming_requests() {
                routes.route(request);
            }
            let Some(backends) = backends.upgrade() else { return };
            if !backends.stopping.load(Ordering::SeqCst) && !backend_of_thread.retired.load(Ordering::SeqCst) {
                log::error!("tiny_http's accept loop ended (generation {generation}); starting a new backend");
                let _repairing = backends.repair.lock().unwrap_or_else(|e| e.into_inner());
                if backends.current().generation == generation {
                    backends.replace(generation, None);
                }
            }
        });
        match spawned {
            Ok(thread) => *backend.dispatcher.lock().unwrap_or_else(|e| e.into_inner()) = Some(thread),
            Err(error) => log::error!("cannot start the HTTP dispatcher: {error}"),
        }
    }

    /// Stops the current backend and waits for its dispatcher; removes the socket directory if
    /// it was a temporary one.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let backend = self.current();
        backend.server.unblock();
        let dispatcher = backend.dispatcher.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = dispatcher {
            let _ = thread.join();
        }
        if self.temporary {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// What a probe of the backend found.
enum Probe {
    Answered,
    Lost,
    NoDescriptors,
}

/// EMFILE or ENFILE: the process or the system is out of file descriptors.
pub fn out_of_descriptors(error: &std::io::Error) -> bool {
    matches!(error.raw_os_error(), Some(nix::libc::EMFILE | nix::libc::ENFILE))
}

/// Waits for a request on `requests`, kicking the backend with growing pauses until `limit`
/// or until the backend is retired.
pub fn wait_kicking(
    requests: &Receiver<tiny_http::Request>,
    backend: &Backend,
    limit: Duration,
) -> Option<tiny_http::Request> {
    let deadline = Instant::now() + limit;
    let mut pause = Duration::from_millis(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match requests.recv_timeout(pause.min(left)) {
            Ok(request) => return Some(request),
            Err(RecvTimeoutError::Disconnected) => return None,
            Err(RecvTimeoutError::Timeout) if left <= pause || backend.retired.load(Ordering::SeqCst) => return None,
            Err(RecvTimeoutError::Timeout) => {
                if !backend.kick() {
                    return None;
                }
                pause = (pause * 2).min(Duration::from_millis(500));
            }
        }
    }
}

/// Binds a new tiny_http server on `dir/http-<generation>.sock` (mode 0600).
fn spawn_backend(dir: &Path, generation: u64) -> std::io::Result<(Arc<Backend>, Arc<tiny_http::Server>)> {
    let socket = dir.join(format!("http-{generation}.sock"));
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket)?;
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))?;
    let server = tiny_http::Server::from_listener(listener, None).map_err(std::io::Error::other)?;
    let server = Arc::new(server);
    let backend = Arc::new(Backend {
        generation,
        retired: AtomicBool::new(false),
        server: Arc::clone(&server),
        socket,
        dispatcher: Mutex::new(None),
    });
    Ok((backend, server))
}

/// `runtime_dir` if a socket path inside it fits `sun_path`, else a fresh temporary directory;
/// either way created with mode 0700, so no other user can reach tiny_http around the gate.
fn socket_dir(runtime_dir: &Path) -> std::io::Result<(PathBuf, bool)> {
    let fits = runtime_dir.join("http-18446744073709551615.sock").as_os_str().len() <= MAX_SOCKET_PATH;
    let (dir, temporary) = if fits {
        (runtime_dir.to_path_buf(), false)
    } else {
        (std::env::temp_dir().join(format!("kestrel-{}", uuid::Uuid::new_v4().simple())), true)
    };
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    // Sockets a killed predecessor left; the data dir lock says none is in use.
    for entry in std::fs::read_dir(&dir)?.filter_map(Result::ok) {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("http-") && name.ends_with(".sock") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    Ok((dir, temporary))
}
