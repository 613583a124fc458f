//! Shared test support: a real server on 127.0.0.1:0 with a temp data dir, a small JSON client
//! (ureq), and an SSE client that reads a real event stream on its own thread.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError};
use kestrel::{Config, Server};
use serde_json::Value;

/// How long a test waits for something the server should do promptly.
pub const WAIT: Duration = Duration::from_secs(10);

pub struct TestServer {
    pub server: Option<Server>,
    pub base: String,
    pub token: Option<String>,
    pub data_dir: PathBuf,
    pub workspace: PathBuf,
    _dirs: Option<(tempfile::TempDir, tempfile::TempDir)>,
}

/// Whether this run's servers keep their state in PostgreSQL (`KESTREL_TEST_STORE=postgres`,
/// which `scripts/test` sets for its second pass over the storage tests) rather than SQLite.
pub fn on_postgres() -> bool {
    std::env::var("KESTREL_TEST_STORE").is_ok_and(|store| store == "postgres")
}

/// The databases of this process's servers on PostgreSQL, by data dir.
static DATABASES: std::sync::Mutex<Option<std::collections::HashMap<PathBuf, String>>> = std::sync::Mutex::new(None);

/// The PostgreSQL database of the server on `data_dir` when the run is on PostgreSQL: a new
/// one for a new data dir, the same one for a restart on it.
pub fn database_url(data_dir: &Path) -> Option<String> {
    if !on_postgres() {
        return None;
    }
    let mut databases = DATABASES.lock().unwrap_or_else(|e| e.into_inner());
    let url = databases.get_or_insert_with(Default::default).entry(data_dir.to_path_buf()).or_insert_with(|| {
        crate::pg_cluster::database().expect("KESTREL_TEST_STORE=postgres needs PostgreSQL installed").url
    });
    Some(url.clone())
}

/// The store of the server on `data_dir`, opened by the test itself while that server is
/// down: SQLite or PostgreSQL, as the run's servers use.
pub fn open_store(data_dir: &Path) -> (kestrel::store::Store, kestrel::store::WriterHandle) {
    match database_url(data_dir) {
        Some(url) => kestrel::store::Store::open_postgres(data_dir, &url, 2).unwrap(),
        None => kestrel::store::Store::open(data_dir).unwrap(),
    }
}

/// The config every test starts from: ephemeral port, fast echo, short pings; on
/// PostgreSQL when the run is.
pub fn test_config(data_dir: &Path, workspace: &Path) -> Config {
    let mut config = Config::default();
    config.store.url = database_url(data_dir);
    config.server.addr = "127.0.0.1:0".into();
    config.server.data_dir = data_dir.to_path_buf();
    config.server.sse_ping_interval_ms = 200;
    config.agent.workspace = Some(workspace.to_path_buf());
    config.builtin.delay_ms = 2;
    config.bae.admin_addr = "127.0.0.1:0".into();
    config
}

/// Starts a server. A restart in this process can find the data dir's lock still held for a
/// moment: another test's child process, between its fork and its exec, holds a copy of every
/// descriptor of this process, the lock's too. Only a restart inside one process can meet
/// this, so only the tests wait it out (within `WAIT`).
fn start_in_this_process(config: Config) -> Server {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        match Server::start(config.clone()) {
            Err(kestrel::StartError::Store(kestrel::store::StoreError::Locked { .. }))
                if std::time::Instant::now() < deadline =>
            {
                std::thread::yield_now()
            }
            outcome => return outcome.expect("server starts"),
        }
    }
}

impl Drop for TestServer {
    /// Stops the server; the one that owns its directories drops its database too.
    fn drop(&mut self) {
        self.stop();
        if self._dirs.is_some() {
            let url =
                DATABASES.lock().unwrap_or_else(|e| e.into_inner()).as_mut().and_then(|d| d.remove(&self.data_dir));
            if let Some(url) = url {
                crate::pg_cluster::drop_database(&url);
            }
        }
    }
}

impl TestServer {
    pub fn start() -> TestServer {
        TestServer::start_with(|_| {})
    }

    pub fn start_with(adjust: impl FnOnce(&mut Config)) -> TestServer {
        let data = tempfile::tempdir().unwrap();
        let workspace = tempfile::tempdir().unwrap();
        let mut config = test_config(data.path(), workspace.path());
        adjust(&mut config);
        let mut server = TestServer::from_config(config);
        server._dirs = Some((data, workspace));
        server
    }

    /// Starts on a config as given (for restarts on an existing data dir).
    pub fn from_config(config: Config) -> TestServer {
        let token = config.auth.token.clone();
        let data_dir = config.server.data_dir.clone();
        let workspace = config.agent.workspace.clone().unwrap();
        let server = start_in_this_process(config);
        let base = format!("http://{}", server.addr());
        if let Some(admin) = server.admin_addr() {
            crate::openapi::admin_port_at(&format!("http://{admin}"));
        }
        TestServer { server: Some(server), base, token, data_dir, workspace, _dirs: None }
    }

    /// Stops the server but keeps its directories, so a new one can start on them.
    pub fn stop(&mut self) {
        if let Some(server) = self.server.take() {
            if let Some(admin) = server.admin_addr() {
                crate::openapi::admin_port_gone(&format!("http://{admin}"));
            }
            server.shutdown();
        }
    }

    /// Restarts on the same data dir and workspace.
    pub fn restart(&mut self, adjust: impl FnOnce(&mut Config)) {
        self.stop();
        let mut config = test_config(&self.data_dir, &self.workspace);
        adjust(&mut config);
        let dirs = self._dirs.take();
        *self = TestServer::from_config(config);
        self._dirs = dirs;
    }

    pub fn admin_addr(&self) -> Option<std::net::SocketAddr> {
        self.server.as_ref().unwrap().admin_addr()
    }

    pub fn stats(&self) -> kestrel::Stats {
        self.server.as_ref().unwrap().stats()
    }

    pub fn client(&self) -> Client {
        Client { base: self.base.clone(), token: self.token.clone() }
    }

    pub fn get(&self, path: &str) -> Response {
        self.client().get(path)
    }

    pub fn post(&self, path: &str, body: Value) -> Response {
        self.client().post(path, body)
    }

    pub fn patch(&self, path: &str, body: Value) -> Response {
        self.client().send("PATCH", path, Some(body.to_string().as_bytes()))
    }

    pub fn delete(&self, path: &str) -> Response {
        self.client().send("DELETE", path, None)
    }

    /// Creates a session and returns its id.
    pub fn create_session(&self, body: Value) -> String {
        let response = self.post("/api/sessions", body);
        assert_eq!(response.status, 201, "{}", response.text);
        response.json["session"]["id"].as_str().unwrap().to_string()
    }

    pub fn events(&self, path: &str) -> SseClient {
        SseClient::open(&self.base, path, self.token.as_deref(), None)
    }

    /// Sends a message and waits for the run to end; returns the run's events.
    pub fn run_to_end(&self, session: &str, content: &str) -> Vec<Value> {
        let mut stream = self.events(&format!("/api/sessions/{session}/events"));
        let response =
            self.post(&format!("/api/sessions/{session}/messages"), serde_json::json!({ "content": content }));
        assert_eq!(response.status, 202, "{}", response.text);
        stream.collect_until(is_run_end)
    }
}

pub fn is_run_end(event: &Value) -> bool {
    matches!(event["event"]["type"].as_str(), Some("run.finished" | "run.failed"))
}

pub fn event_type(event: &Value) -> &str {
    event["event"]["type"].as_str().unwrap_or("")
}

#[derive(Clone)]
pub struct Client {
    pub base: String,
    pub token: Option<String>,
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub text: String,
    pub json: Value,
    pub headers: Vec<(String, String)>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value.as_str())
    }

    /// Asserts an `ApiErrorBody` with this status and code.
    pub fn assert_error(&self, status: u16, code: &str) {
        assert_eq!(self.status, status, "{}", self.text);
        assert_eq!(self.json["error"]["code"], code, "{}", self.text);
        assert!(self.json["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{}", self.text);
        assert_eq!(self.header("cache-control"), Some("no-store"), "{}", self.text);
    }
}

impl Client {
    /// Asserts that every route of session `id` answers 404 `session_not_found` to this client.
    pub fn assert_session_hidden(&self, id: &str) {
        let path = format!("/api/sessions/{id}");
        self.get(&path).assert_error(404, "session_not_found");
        self.patch_json(&path, serde_json::json!({ "title": "stolen" })).assert_error(404, "session_not_found");
        self.post(&format!("{path}/messages"), serde_json::json!({ "content": "hi" }))
            .assert_error(404, "session_not_found");
        for action in ["cancel", "resume"] {
            self.post(&format!("{path}/{action}"), serde_json::json!({})).assert_error(404, "session_not_found");
        }
        self.get(&format!("{path}/files")).assert_error(404, "session_not_found");
        self.send("DELETE", &path, None).assert_error(404, "session_not_found");
        let stream = SseClient::open(&self.base, &format!("{path}/events"), self.token.as_deref(), None);
        assert_eq!(stream.status, 404);
    }

    pub fn with_token(&self, token: Option<&str>) -> Client {
        Client { base: self.base.clone(), token: token.map(str::to_string) }
    }

    pub fn get(&self, path: &str) -> Response {
        self.send("GET", path, None)
    }

    pub fn post(&self, path: &str, body: Value) -> Response {
        self.send("POST", path, Some(body.to_string().as_bytes()))
    }

    pub fn patch_json(&self, path: &str, body: Value) -> Response {
        self.send("PATCH", path, Some(body.to_string().as_bytes()))
    }

    pub fn post_raw(&self, path: &str, body: &[u8]) -> Response {
        self.send("POST", path, Some(body))
    }

    pub fn send(&self, method: &str, path: &str, body: Option<&[u8]>) -> Response {
        self.send_with_headers(method, path, body, &[])
    }

    pub fn send_with_headers(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        headers: &[(&str, &str)],
    ) -> Response {
        let mut request = ureq::request(method, &format!("{}{}", self.base, path)).timeout(WAIT);
        for (name, value) in headers {
            request = request.set(name, value);
        }
        if let Some(token) = &self.token {
            request = request.set("Authorization", &format!("Bearer {token}"));
        }
        let result = match body {
            Some(body) => request.set("Content-Type", "application/json").send_bytes(body),
            None => request.call(),
        };
        let response = match result {
            Ok(response) => response,
            Err(ureq::Error::Status(_, response)) => response,
            Err(error) => panic!("{method} {path}: {error}"),
        };
        let status = response.status();
        let headers = response
            .headers_names()
            .into_iter()
            .map(|name| (name.clone(), response.header(&name).unwrap_or("").to_string()))
            .collect();
        let content_type = response.header("content-type").map(str::to_string);
        let text = response.into_string().unwrap_or_default();
        crate::openapi::check(&self.base, method, path, status, content_type.as_deref(), &text);
        let json = serde_json::from_str(&text).unwrap_or(Value::Null);
        Response { status, text, json, headers }
    }
}

/// One item read off an event stream.
#[derive(Debug, Clone)]
pub enum SseItem {
    Retry(u64),
    Comment(String),
    /// `id:` and the parsed `data:` envelope.
    Event(u64, Value),
    /// A frame with an `event:` name and no id (the plugin stream's `ready`).
    Named(String, Value),
}

/// A real SSE client: a socket, a reader thread that decodes chunked framing and SSE, and a
/// channel of items the test waits on with timeouts.
pub struct SseClient {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    items: Receiver<SseItem>,
    socket: TcpStream,
    ended: Receiver<()>,
}

impl SseClient {
    pub fn open(base: &str, path: &str, token: Option<&str>, last_event_id: Option<u64>) -> SseClient {
        let host = base.trim_start_matches("http://");
        let mut socket = TcpStream::connect(host).unwrap();
        let mut request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n");
        if let Some(token) = token {
            request.push_str(&format!("Authorization: Bearer {token}\r\n"));
        }
        if let Some(id) = last_event_id {
            request.push_str(&format!("Last-Event-ID: {id}\r\n"));
        }
        request.push_str("\r\n");
        socket.write_all(request.as_bytes()).unwrap();
        // A server that never answers fails the test instead of hanging it.
        socket.set_read_timeout(Some(WAIT)).unwrap();
        let mut reader = BufReader::new(socket.try_clone().unwrap());
        let mut status_line = String::new();
        reader.read_line(&mut status_line).expect("the stream's head within the wait");
        let status: u16 = status_line.split_whitespace().nth(1).unwrap().parse().unwrap();
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            let (name, value) = line.split_once(':').unwrap();
            headers.push((name.trim().to_string(), value.trim().to_string()));
        }
        socket.set_read_timeout(None).unwrap();
        let (items_tx, items) = unbounded();
        let (ended_tx, ended) = unbounded::<()>();
        if status == 200 {
            std::thread::spawn(move || {
                let _ = read_stream(reader, &items_tx);
                drop(ended_tx);
            });
        }
        SseClient { status, headers, items, socket, ended }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value.as_str())
    }

    /// The status a stream request with one extra header gets.
    pub fn open_with_header(base: &str, path: &str, name: &str, value: &str) -> u16 {
        let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{name}: {value}\r\nConnection: close\r\n\r\n");
        let mut socket = TcpStream::connect(host_of(base)).unwrap();
        socket.write_all(request.as_bytes()).unwrap();
        let mut line = String::new();
        socket.set_read_timeout(Some(WAIT)).unwrap();
        BufReader::new(socket).read_line(&mut line).unwrap();
        line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
    }

    /// The next item, or `None` after `timeout` or at the end of the stream.
    pub fn next_item(&mut self, timeout: Duration) -> Option<SseItem> {
        self.items.recv_timeout(timeout).ok()
    }

    /// The next event envelope, skipping comments and `retry`.
    pub fn next_event(&mut self, timeout: Duration) -> Option<(u64, Value)> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.items.recv_timeout(left) {
                Ok(SseItem::Event(id, data)) => return Some((id, data)),
                Ok(_) => continue,
                Err(_) => return None,
            }
        }
    }

    /// Collects envelopes until one matches `done` (included); panics after `WAIT`.
    pub fn collect_until(&mut self, done: impl Fn(&Value) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + WAIT;
        let mut events = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (_, event) = self.next_event(left).unwrap_or_else(|| panic!("timed out; got {events:#?}"));
            let finished = done(&event);
            events.push(event);
            if finished {
                return events;
            }
        }
    }

    /// The envelopes that arrive until the stream has been quiet for half a second.
    pub fn drain_events(&mut self) -> Vec<Value> {
        let mut events = Vec::new();
        while let Some((_, event)) = self.next_event(Duration::from_millis(500)) {
            events.push(event);
        }
        events
    }

    /// The seqs that arrive until the stream has been quiet for half a second.
    pub fn drain_seqs(&mut self) -> Vec<u64> {
        let mut seqs = Vec::new();
        while let Some((seq, _)) = self.next_event(Duration::from_millis(500)) {
            seqs.push(seq);
        }
        seqs
    }

    /// Waits for the server to end the stream.
    pub fn wait_closed(&self, timeout: Duration) -> bool {
        matches!(self.ended.recv_timeout(timeout), Err(RecvTimeoutError::Disconnected))
    }

    /// Hangs up, as a browser tab closing would.
    pub fn disconnect(self) {
        let _ = self.socket.shutdown(Shutdown::Both);
    }
}

fn read_stream(mut reader: BufReader<TcpStream>, items: &crossbeam_channel::Sender<SseItem>) -> std::io::Result<()> {
    let mut pending = String::new();
    loop {
        let mut size_line = String::new();
        if reader.read_line(&mut size_line)? == 0 {
            return Ok(());
        }
        let size = usize::from_str_radix(size_line.trim(), 16).map_err(std::io::Error::other)?;
        if size == 0 {
            return Ok(());
        }
        let mut chunk = vec![0; size + 2];
        reader.read_exact(&mut chunk)?;
        pending.push_str(std::str::from_utf8(&chunk[..size]).map_err(std::io::Error::other)?);
        while let Some(end) = pending.find("\n\n") {
            let frame: String = pending.drain(..end + 2).collect();
            let mut id = None;
            let mut name = None;
            let mut data = String::new();
            for line in frame.lines() {
                if let Some(comment) = line.strip_prefix(':') {
                    let _ = items.send(SseItem::Comment(comment.trim().to_string()));
                } else if let Some(retry) = line.strip_prefix("retry: ") {
                    let _ = items.send(SseItem::Retry(retry.parse().unwrap()));
                } else if let Some(value) = line.strip_prefix("id: ") {
                    id = Some(value.parse().unwrap());
                } else if let Some(value) = line.strip_prefix("data: ") {
                    data.push_str(value);
                } else if let Some(value) = line.strip_prefix("event: ") {
                    name = Some(value.to_string());
                }
            }
            if let Some(id) = id {
                let _ = items.send(SseItem::Event(id, serde_json::from_str(&data).unwrap()));
            } else if let Some(name) = name {
                let _ = items.send(SseItem::Named(name, serde_json::from_str(&data).unwrap()));
            }
        }
    }
}

/// Waits until `condition` holds, checking often; panics with `what` after `WAIT`.
pub fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What the server answered on a raw connection, read until it closed the connection.
#[derive(Debug)]
pub struct RawAnswer {
    pub status: u16,
    pub head: String,
    pub json: Value,
    /// The server closed the connection (rather than the wait running out).
    pub closed: bool,
}

impl RawAnswer {
    /// Asserts a Kestrel error body with this status and code.
    pub fn assert_error(&self, status: u16, code: &str) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(self.json["error"]["code"], code, "{self:?}");
    }
}

/// `base` without its scheme, for raw sockets.
pub fn host_of(base: &str) -> String {
    base.trim_start_matches("http://").to_string()
}

/// Sends `request` on a new connection and reads until the server closes it (at most `WAIT`).
pub fn raw(base: &str, request: &[u8]) -> RawAnswer {
    let mut socket = TcpStream::connect(host_of(base)).unwrap();
    socket.write_all(request).unwrap();
    read_answer(&mut socket, WAIT)
}

/// Reads one answer off `socket` until the server closes it or `wait` passes.
pub fn read_answer(socket: &mut TcpStream, wait: Duration) -> RawAnswer {
    socket.set_read_timeout(Some(wait)).unwrap();
    let mut bytes = Vec::new();
    let closed = match socket.read_to_end(&mut bytes) {
        Ok(_) => true,
        // A reset after the answer still counts as the server closing.
        Err(error) => error.kind() == std::io::ErrorKind::ConnectionReset,
    };
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    RawAnswer { status, head: head.to_string(), json: serde_json::from_str(body).unwrap_or(Value::Null), closed }
}

/// Starts the real binary on a data dir with a config file (written to `data/kestrel.toml`);
/// returns it, its base URL and its admin API's.
pub fn spawn_binary(data: &Path, workspace: &Path, config: &str) -> (std::process::Child, String, String) {
    spawn_binary_with(data, workspace, config, &[])
}

/// `spawn_binary` with more environment (a `-` value removes the variable).
pub fn spawn_binary_with(
    data: &Path,
    workspace: &Path,
    config: &str,
    env: &[(&str, &str)],
) -> (std::process::Child, String, String) {
    use std::io::BufRead;
    let config_path = data.join("kestrel.toml");
    std::fs::write(&config_path, config).unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_kestrel"));
    command
        .arg("--config")
        .arg(&config_path)
        .env("KESTREL_ADDR", "127.0.0.1:0")
        .env("KESTREL_DATA_DIR", data)
        .env("KESTREL_ADMIN_ADDR", "127.0.0.1:0")
        .env("KESTREL_WORKSPACE", workspace)
        .env("KESTREL_DATABASE_URL", database_url(data).unwrap_or_default())
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped());
    // After the defaults, so that the caller's win.
    for (name, value) in env {
        match *value {
            "-" => command.env_remove(name),
            value => command.env(name, value),
        };
    }
    let mut child = command.spawn().unwrap();
    // "kestrel listening on http://…", then "kestrel admin API on http://…".
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut url = || lines.next().unwrap().unwrap().rsplit(' ').next().unwrap().to_string();
    let (base, admin) = (url(), url());
    (child, base, admin)
}

/// `package` (`name@version`) from npm, installed under `target/<dir>` the first time; the
/// path of `entry` inside its `node_modules`.
pub fn npm_package(dir: &str, package: &str, entry: &str) -> PathBuf {
    let prefix = Path::new(env!("CARGO_MANIFEST_DIR")).join("target").join(dir);
    let path = prefix.join("node_modules").join(entry);
    if path.exists() {
        return path;
    }
    // Two tests (or two test processes) installing into one prefix at once break each other's
    // install: the first to come installs under an exclusive lock, the others wait and find it.
    std::fs::create_dir_all(&prefix).expect("the npm prefix can be made");
    let lock = std::fs::File::create(prefix.with_extension("lock")).expect("the npm lock file opens");
    lock.lock().expect("the npm lock is taken");
    if !path.exists() {
        let status = std::process::Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--silent", "--prefix"])
            .arg(&prefix)
            .arg(package)
            .status()
            .expect("npm runs");
        assert!(status.success(), "npm could not install {package}");
    }
    path
}

/// The database of a test server's store, whichever it is, for a test that reads or damages
/// rows directly (with the server stopped, or for reads only). Statements use `?1`-style
/// parameters, all text: SQLite takes them as they are, PostgreSQL as `$1`.
pub enum Db {
    Sqlite(rusqlite::Connection),
    Postgres(Box<postgres::Client>),
}

impl Db {
    pub fn open(data_dir: &Path) -> Db {
        match database_url(data_dir) {
            Some(url) => Db::Postgres(Box::new(postgres::Client::connect(&url, postgres::NoTls).unwrap())),
            None => Db::Sqlite(rusqlite::Connection::open(data_dir.join("kestrel.db")).unwrap()),
        }
    }

    /// `?N` as PostgreSQL writes it.
    fn dollars(sql: &str) -> String {
        sql.replace('?', "$")
    }

    /// Runs a statement; the rows it changed.
    pub fn exec(&mut self, sql: &str, params: &[&str]) -> u64 {
        match self {
            Db::Sqlite(conn) => conn.execute(sql, rusqlite::params_from_iter(params)).unwrap() as u64,
            Db::Postgres(client) => {
                let params: Vec<&(dyn postgres::types::ToSql + Sync)> =
                    params.iter().map(|p| p as &(dyn postgres::types::ToSql + Sync)).collect();
                client.execute(&Db::dollars(sql), &params).unwrap()
            }
        }
    }

    /// The first column of the one row a query answers, as an integer.
    pub fn integer(&mut self, sql: &str, params: &[&str]) -> i64 {
        match self {
            Db::Sqlite(conn) => conn.query_row(sql, rusqlite::params_from_iter(params), |row| row.get(0)).unwrap(),
            Db::Postgres(client) => {
                let params: Vec<&(dyn postgres::types::ToSql + Sync)> =
                    params.iter().map(|p| p as &(dyn postgres::types::ToSql + Sync)).collect();
                client.query_one(&Db::dollars(sql), &params).unwrap().get(0)
            }
        }
    }

    /// The first column of every row a query answers, as text.
    pub fn texts(&mut self, sql: &str, params: &[&str]) -> Vec<String> {
        match self {
            Db::Sqlite(conn) => {
                let mut statement = conn.prepare(sql).unwrap();
                let rows = statement.query_map(rusqlite::params_from_iter(params), |row| row.get(0)).unwrap();
                rows.map(Result::unwrap).collect()
            }
            Db::Postgres(client) => {
                let params: Vec<&(dyn postgres::types::ToSql + Sync)> =
                    params.iter().map(|p| p as &(dyn postgres::types::ToSql + Sync)).collect();
                client.query(&Db::dollars(sql), &params).unwrap().iter().map(|row| row.get(0)).collect()
            }
        }
    }

    /// Whether the database checks out whole (SQLite's integrity check; PostgreSQL keeps its
    /// own, and answering is what is asked of it here).
    pub fn intact(&mut self) -> bool {
        match self {
            Db::Sqlite(conn) => {
                conn.query_row("PRAGMA integrity_check", [], |row| row.get::<_, String>(0)).unwrap() == "ok"
            }
            Db::Postgres(client) => client.query_one("SELECT count(*) FROM events", &[]).is_ok(),
        }
    }

    /// Checkpoint contents stored, however the store keeps them.
    pub fn blob_count(&mut self, data_dir: &Path) -> usize {
        match self {
            Db::Postgres(_) => self.integer("SELECT count(*) FROM blobs", &[]) as usize,
            Db::Sqlite(_) => std::fs::read_dir(data_dir.join("blobs"))
                .map(|shards| shards.flatten().map(|d| std::fs::read_dir(d.path()).unwrap().count()).sum())
                .unwrap_or(0),
        }
    }

    /// Removes a checkpoint content, however the store keeps it.
    pub fn remove_blob(&mut self, data_dir: &Path, digest: &str) {
        match self {
            Db::Postgres(_) => assert_eq!(self.exec("DELETE FROM blobs WHERE digest = ?1", &[digest]), 1),
            Db::Sqlite(_) => std::fs::remove_file(data_dir.join("blobs").join(&digest[..2]).join(digest)).unwrap(),
        }
    }
}
