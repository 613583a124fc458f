//! `scripts/fuzz N`: N random and mutated requests over every route of a live server, the
//! Kestrel door's and both BAE doors' (`bae_fuzz.rs`).
//!
//! Requests come from templates of the route table (right and wrong methods, this tenant's
//! sessions, another tenant's, ids that are not ids), with query strings and headers the
//! protocol reads, and bodies built from valid ones and then mutated: fields of the wrong
//! type, huge or deeply nested values, truncated or flipped bytes, garbage. One request in
//! twenty is mangled below HTTP: bytes of its head flipped, non-ASCII inserted, lengths that
//! lie. One in eight is what a web page might send (`hostile`): a foreign or doubled `Host`, a
//! cross-origin or `null` `Origin`, a cross-site `Sec-Fetch-Site`, or a body of a type a page may
//! send without asking; each must be refused (403, or 415 for the body). Any 5xx but the
//! documented 501 of routes not built yet fails the run, and so does a request with no answer at
//! all (a hang or a silent close), a hostile request served, and a server that is not alive and
//! healthy at the end.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::bae_fuzz::BaeTargets;
use super::random::Random;
use super::server::Kestrel;
use super::wire::{Client, Outcome};

const THREADS: usize = 4;
const TOKEN_A: &str = "fuzz-token-a";
const TOKEN_B: &str = "fuzz-token-b";
const CONFIG: &str = "[server]\nheader_timeout_ms = 1000\nbody_timeout_ms = 1000\n\
[auth]\ntoken = \"fuzz-token-a\"\n[[auth.tokens]]\ntenant = \"b\"\ntoken = \"fuzz-token-b\"\n\
[builtin]\ndelay_ms = 0\n[bae]\nturn_timeout_secs = 2\n";

#[derive(Default, Debug)]
pub struct Report {
    pub requests: usize,
    pub by_status: BTreeMap<u16, usize>,
    /// Statuses per door: "kestrel", "BAE" (the client door) and "admin".
    pub by_door: BTreeMap<&'static str, BTreeMap<u16, usize>>,
    pub raw: usize,
    pub failures: Vec<String>,
    pub elapsed: Duration,
}

impl Report {
    pub fn print(&self) {
        let rate = self.requests as f64 / self.elapsed.as_secs_f64().max(0.001);
        println!(
            "fuzz: {} requests ({} mangled below HTTP) in {:.1} s, {rate:.0} req/s",
            self.requests,
            self.raw,
            self.elapsed.as_secs_f64()
        );
        let statuses: Vec<String> = self.by_status.iter().map(|(s, n)| format!("{s}: {n}")).collect();
        println!("  statuses: {}", statuses.join(", "));
        for (door, statuses) in &self.by_door {
            let statuses: Vec<String> = statuses.iter().map(|(s, n)| format!("{s}: {n}")).collect();
            println!("    {door}: {}", statuses.join(", "));
        }
        println!("  failures: {}", self.failures.len());
        for failure in self.failures.iter().take(20) {
            println!("    {failure}");
        }
    }
}

/// Sessions the requests aim at: tenant a's (the fuzzer's own) and tenant b's.
struct Targets {
    own: Mutex<Vec<String>>,
    foreign: Vec<String>,
}

pub fn run(binary: &Path, requests: usize, seed: u64) -> Report {
    let root = tempfile::tempdir().expect("a temporary directory");
    let workspace = root.path().join("workspace");
    std::fs::create_dir_all(workspace.join("src")).expect("the workspace");
    std::fs::write(workspace.join("src/main.rs"), "fn main() {}\n").expect("a file");
    let mut server = Kestrel::start(binary, &root.path().join("state"), &workspace, CONFIG);
    let create = |token: &str| {
        let answer = Client::new(&server.host).request(
            "POST",
            "/api/sessions",
            &[("Authorization", &format!("Bearer {token}"))],
            b"{}",
        );
        answer.json()["session"]["id"].as_str().expect("a session").to_string()
    };
    let targets = Arc::new(Targets {
        own: Mutex::new((0..4).map(|_| create(TOKEN_A)).collect()),
        foreign: vec![create(TOKEN_B)],
    });
    let admin_key = std::fs::read_to_string(root.path().join("state/data/admin-key")).expect("the admin key");
    let bae = Arc::new(super::bae_fuzz::setup(&server.host, &server.admin, admin_key.trim()));
    let report = Arc::new(Mutex::new(Report::default()));
    let sent = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let threads: Vec<_> = (0..THREADS)
        .map(|index| {
            let (host, targets, report, sent) =
                (server.host.clone(), Arc::clone(&targets), Arc::clone(&report), Arc::clone(&sent));
            let (admin, bae) = (server.admin.clone(), Arc::clone(&bae));
            std::thread::spawn(move || {
                let mut fuzzer = Fuzzer {
                    random: Random(seed.wrapping_add(index as u64 * 7919) | 1),
                    client: Client::new(&host),
                    targets,
                    admin: Client::new(&admin),
                    bae,
                    expected: None,
                };
                while sent.fetch_add(1, Ordering::Relaxed) < requests {
                    let (label, outcome, allowed_501, raw) = fuzzer.one();
                    record(&report, &label, &outcome, allowed_501, raw);
                    if let Some(expected) = fuzzer.expected.take() {
                        refused_as(&report, &label, &outcome, expected);
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        let _ = thread.join();
    }
    let mut report =
        Arc::try_unwrap(report).map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner())).unwrap_or_default();
    report.elapsed = started.elapsed();
    if !server.alive() {
        report.failures.push("the server died".into());
    }
    let health = Client::new(&server.host).request("GET", "/api/health", &[], b"");
    if health.status() != Some(200) {
        report.failures.push(format!("health after the run: {health:?}"));
    }
    if !server.stop() {
        report.failures.push("SIGTERM did not exit cleanly after the run".into());
    }
    report
}

fn record(report: &Mutex<Report>, label: &str, outcome: &Outcome, allowed_501: bool, raw: bool) {
    let mut report = report.lock().unwrap_or_else(|e| e.into_inner());
    report.requests += 1;
    report.raw += usize::from(raw);
    match outcome {
        Outcome::Answered { status, head, body } => {
            *report.by_status.entry(*status).or_default() += 1;
            let door = match label.split(' ').next() {
                Some("BAE") => "BAE",
                Some("admin") => "admin",
                _ => "kestrel",
            };
            *report.by_door.entry(door).or_default().entry(*status).or_default() += 1;
            // 501 for the routes not built yet, 505 for HTTP/2 and later: both documented.
            let documented = (*status == 501 && allowed_501) || *status == 505;
            if *status >= 500 && !documented && report.failures.len() < 100 {
                let body = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
                let first = head.lines().next().unwrap_or("");
                report.failures.push(format!("{first} for {label}: {body}"));
            }
        }
        Outcome::Closed if report.failures.len() < 100 => {
            report.failures.push(format!("no answer (closed) for {label}"))
        }
        Outcome::Hung if report.failures.len() < 100 => report.failures.push(format!("no answer (hung) for {label}")),
        _ => {}
    }
}

pub(super) struct Fuzzer {
    pub(super) random: Random,
    pub(super) client: Client,
    targets: Arc<Targets>,
    /// The BAE admin API.
    pub(super) admin: Client,
    pub(super) bae: Arc<BaeTargets>,
    /// The statuses the last request must have been refused with, when it was hostile.
    expected: Option<&'static [u16]>,
}

/// Fails the run when a hostile request was not refused as it must be.
fn refused_as(report: &Mutex<Report>, label: &str, outcome: &Outcome, expected: &[u16]) {
    let status = match outcome {
        Outcome::Answered { status, .. } => *status,
        // No answer at all is already a failure of its own.
        Outcome::Closed | Outcome::Hung => return,
    };
    let mut report = report.lock().unwrap_or_else(|e| e.into_inner());
    if !expected.contains(&status) && report.failures.len() < 100 {
        report.failures.push(format!("{status} for hostile {label}, not {expected:?}"));
    }
}

/// What a hostile `Host`, `Origin` or Fetch Metadata is refused with.
const FORBIDDEN: &[u16] = &[403];
/// What a body of a type a page may send is refused with.
const MEDIA_TYPE: &[u16] = &[415];

/// Routes with the methods they answer; `true` where the route answers 501 for now.
const ROUTES: &[(&str, &[&str], bool)] = &[
    ("/api/health", &["GET"], false),
    ("/api/bootstrap", &["GET"], false),
    ("/api/config", &["GET"], false),
    ("/api/plugins", &["GET"], false),
    ("/api/plugins/events", &["GET"], false),
    ("/api/events", &["GET"], false),
    ("/api/sessions", &["GET", "POST"], false),
    ("/api/sessions/{id}", &["GET", "PATCH", "DELETE"], false),
    ("/api/sessions/{id}/messages", &["POST"], false),
    ("/api/sessions/{id}/cancel", &["POST"], false),
    ("/api/sessions/{id}/resume", &["POST"], false),
    ("/api/sessions/{id}/rewind", &["POST"], false),
    ("/api/sessions/{id}/events", &["GET"], false),
    ("/api/sessions/{id}/approvals/{other}", &["POST"], false),
    ("/api/sessions/{id}/files", &["GET"], false),
    ("/api/sessions/{id}/file", &["GET"], false),
    ("/api/sessions/{id}/checkpoints", &["GET", "POST"], false),
    ("/api/sessions/{id}/checkpoints/{other}/restore", &["POST"], false),
];

impl Fuzzer {
    /// One request: its label, what came back, whether a 501 is documented, whether raw.
    fn one(&mut self) -> (String, Outcome, bool, bool) {
        // Three requests in ten go to the BAE doors: two to the client's, one to the admin's.
        match self.random.below(10) {
            0 | 1 => {
                let (label, outcome) = self.one_bae_client();
                return (label, outcome, false, false);
            }
            2 => {
                let (label, outcome) = self.one_bae_admin();
                return (label, outcome, false, false);
            }
            _ => {}
        }
        // Transcripts grow with every message sent; fresh sessions keep them small.
        if self.random.below(2000) == 0 {
            let mut own = self.targets.own.lock().unwrap_or_else(|e| e.into_inner());
            let created =
                self.client.request("POST", "/api/sessions", &[("Authorization", &format!("Bearer {TOKEN_A}"))], b"{}");
            if let Some(id) = created.json()["session"]["id"].as_str() {
                let index = self.random.below(own.len());
                own[index] = id.to_string();
            }
        }
        let (template, methods, not_built) = ROUTES[self.random.below(ROUTES.len())];
        let method = if self.random.chance(85) {
            methods[self.random.below(methods.len())].to_string()
        } else {
            self.random.pick(&["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "TRACE", "BREW"]).to_string()
        };
        let path = format!("{}{}", self.fill(template), self.query());
        let mut headers: Vec<(String, String)> = Vec::new();
        match self.random.below(20) {
            0 => {}
            1 => headers.push(("Authorization".into(), format!("Bearer {TOKEN_B}"))),
            2 => headers.push((
                "Authorization".into(),
                self.random.pick(&["Bearer", "Bearer  x", "Basic abc", "bearer fuzz-token-a"]).into(),
            )),
            _ => headers.push(("Authorization".into(), format!("Bearer {TOKEN_A}"))),
        }
        if self.random.chance(10) {
            headers.push((
                "Last-Event-ID".into(),
                self.random.pick(&["5", "+5", "-1", "", "99999999999999999999", "0x1", "1e9"]).into(),
            ));
        }
        if self.random.chance(10) {
            headers.push(("Idempotency-Key".into(), format!("key-{}", self.random.below(50))));
        }
        let mut label = format!("{method} {path}");
        if self.random.chance(12) {
            let (hostile, expected) = self.hostile();
            label = format!("{label} with {hostile:?}");
            headers.extend(hostile);
            self.expected = Some(expected);
        }
        let streaming = template.ends_with("events") && method == "GET";
        if streaming {
            if self.expected == Some(MEDIA_TYPE) {
                self.expected = None; // a stream is asked for without a body
            }
            let refs: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
            return (label, self.client.stream_status(&path, &refs), not_built, false);
        }
        let body = self.body(template);
        if self.expected == Some(MEDIA_TYPE) && body.is_empty() {
            // A hostile type on no body at all is no body a page sent: nothing to refuse.
            self.expected = None;
        }
        if self.expected.is_none() && self.random.chance(5) {
            let bytes = self.mangle(&method, &path, &headers, &body);
            let label = format!("mangled {label}: {:?}", String::from_utf8_lossy(&bytes[..bytes.len().min(120)]));
            return (label, self.client.raw(&bytes), not_built, true);
        }
        let refs: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        let outcome = self.client.request(&method, &path, &refs, &body);
        if method == "DELETE" && outcome.status() == Some(204) {
            self.replace_deleted(&path);
        }
        (label, outcome, not_built, false)
    }

    /// Headers a web page might send, and the statuses they must be refused with: a `Host`
    /// that is not the server's, an `Origin` of another site, Fetch Metadata saying so, or a
    /// body type a page may send without a preflight.
    fn hostile(&mut self) -> (Vec<(String, String)>, &'static [u16]) {
        let pair = |name: &str, value: &str| vec![(name.to_string(), value.to_string())];
        match self.random.below(4) {
            0 => {
                let host = self.random.pick(&[
                    "evil.example",
                    "evil.example:8080",
                    "localhost.evil.example",
                    "127.0.0.1.nip.io",
                    "2130706433",
                    "[::1",
                    "localhost:99999",
                    "user@localhost",
                    "",
                ]);
                (pair("Host", host), FORBIDDEN)
            }
            1 => {
                let origin = self.random.pick(&[
                    "http://evil.example",
                    "null",
                    "http://localhost:1",
                    "file://",
                    "https://evil.example",
                ]);
                (pair("Origin", origin), FORBIDDEN)
            }
            2 => (pair("Sec-Fetch-Site", self.random.pick(&["cross-site", "same-site"])), FORBIDDEN),
            _ => {
                let kind = self.random.pick(&[
                    "text/plain",
                    "text/plain;charset=UTF-8",
                    "application/x-www-form-urlencoded",
                    "multipart/form-data; boundary=x",
                    "application/octet-stream",
                    "text/json",
                    "",
                ]);
                (pair("Content-Type", kind), MEDIA_TYPE)
            }
        }
    }

    fn fill(&mut self, template: &str) -> String {
        let id = match self.random.below(10) {
            0..=5 => {
                let own = self.targets.own.lock().unwrap_or_else(|e| e.into_inner());
                own[self.random.below(own.len())].clone()
            }
            6 => self.targets.foreign[0].clone(),
            _ => self
                .random
                .pick(&["ses_nope", "..", "%2e%2e", "x".repeat(300).as_str(), "%00", "ses_%C3%A9", "a%2Fb"])
                .to_string(),
        };
        let other = self.random.pick(&["apr_x", "chk_1", "..", "%FF", "0"]).to_string();
        template.replace("{id}", &id).replace("{other}", &other)
    }

    fn query(&mut self) -> String {
        if !self.random.chance(30) {
            return String::new();
        }
        let path = self
            .random
            .pick(&["src", "src/main.rs", "..", "../etc/passwd", "/etc/passwd", "%00", "a/../../b", "", "kestrel.toml"])
            .to_string();
        let long = "a".repeat(300 + self.random.below(5000));
        match self.random.below(5) {
            0 => format!("?path={long}"),
            1 => format!("?lastEventId={}", self.random.pick(&["1", "+1", "x", "18446744073709551616"])),
            2 => format!("?token={}", self.random.pick(&[TOKEN_A, TOKEN_B, "nope"])),
            3 => "?path=src&path=..&&=&%zz".to_string(),
            _ => format!("?path={path}"),
        }
    }

    fn body(&mut self, template: &str) -> Vec<u8> {
        let mut value = if template.ends_with("/messages") {
            json!({ "content": "hello /tool list_directory {}", "images": [{ "mimeType": "image/png", "data": "iVBORw0KGgo=", "name": "x.png" }] })
        } else if template.contains("/approvals/") {
            json!({ "approved": true, "note": "fine" })
        } else if template.ends_with("/rewind") {
            json!({ "messageId": "msg_x", "restoreFiles": true })
        } else {
            json!({ "title": "t", "model": "builtin/echo", "systemPrompt": "p", "workspace": "/tmp" })
        };
        if self.random.chance(60) {
            self.mutate_value(&mut value, 0);
        }
        self.damage(serde_json::to_vec(&value).unwrap_or_default())
    }

    /// A body's bytes, now and then truncated, bit-flipped, replaced by garbage or emptied.
    pub(super) fn damage(&mut self, mut bytes: Vec<u8>) -> Vec<u8> {
        match self.random.below(20) {
            0 => bytes.truncate(self.random.below(bytes.len() + 1)),
            1 => {
                for _ in 0..3 {
                    let at = self.random.below(bytes.len().max(1));
                    if let Some(byte) = bytes.get_mut(at) {
                        *byte ^= 1 << self.random.below(8);
                    }
                }
            }
            2 => bytes = (0..self.random.below(64)).map(|_| self.random.next() as u8).collect(),
            3 => bytes.clear(),
            _ => {}
        }
        bytes
    }

    pub(super) fn mutate_value(&mut self, value: &mut Value, depth: usize) {
        let Value::Object(fields) = value else { return };
        let keys: Vec<String> = fields.keys().cloned().collect();
        if keys.is_empty() {
            return;
        }
        let key = keys[self.random.below(keys.len())].clone();
        let replacement = match self.random.below(9) {
            0 => Value::Null,
            1 => json!(self.random.next() as i64),
            2 => json!(-1.5e308),
            3 => json!([1, "two", null]),
            4 => json!({ "nested": { "deeper": [] } }),
            5 => Value::String("x".repeat(self.random.below(300_000))),
            6 => Value::String("\u{0}\u{202e}é😀".into()),
            7 => nested(100 + self.random.below(400)),
            _ => {
                fields.remove(&key);
                fields.insert("unknownField".into(), json!(true));
                return;
            }
        };
        fields.insert(key, replacement);
        if depth < 2 && self.random.chance(30) {
            self.mutate_value(value, depth + 1);
        }
    }

    /// The request as bytes with its head mangled: flipped bits, non-ASCII, lying lengths.
    fn mangle(&mut self, method: &str, path: &str, headers: &[(String, String)], body: &[u8]) -> Vec<u8> {
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n");
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        let mut length = body.len().to_string();
        match self.random.below(12) {
            0 => {
                length = self.random.pick(&["999999999999", "18446744073709551616", "-1", "+3", "1 2", ""]).to_string()
            }
            1 => head.push_str("Content-Length: 0\r\n"),
            2 => head.push_str("Transfer-Encoding: chunked\r\n"),
            3 => head.push_str("Expect: 100-continue\r\n"),
            4 => head.push_str("X-Bad: caf\u{e9}\r\n"),
            5 => {
                head = head.replacen(
                    "HTTP/1.1",
                    self.random.pick(&["HTTP/2.0", "HTTP/1.2", "HTTP/0.9", "HTTP/1.1 extra", "http/1.1"]),
                    1,
                )
            }
            6 => head.push_str(&format!("X-Long: {}\r\n", "h".repeat(20_000))),
            7 => head.push_str(" folded\r\n"),
            _ => {}
        }
        head.push_str(&format!("Content-Length: {length}\r\n\r\n"));
        let mut bytes = head.into_bytes();
        if self.random.chance(50) {
            let end = bytes.len() - 4;
            for _ in 0..1 + self.random.below(3) {
                let at = self.random.below(end);
                bytes[at] = self.random.pick(&[b'\0', 0xff, b'\n', b' ', b':', 0x80]);
            }
        }
        bytes.extend_from_slice(body);
        bytes
    }

    /// A session this run deleted is replaced, so the requests keep finding live ones.
    fn replace_deleted(&mut self, path: &str) {
        let mut own = self.targets.own.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(index) = own.iter().position(|id| path.contains(id.as_str())) {
            let created =
                self.client.request("POST", "/api/sessions", &[("Authorization", &format!("Bearer {TOKEN_A}"))], b"{}");
            if let Some(id) = created.json()["session"]["id"].as_str() {
                own[index] = id.to_string();
            }
        }
    }
}

/// An array nested `depth` levels deep.
fn nested(depth: usize) -> Value {
    (0..depth).fold(json!([]), |inner, _| Value::Array(vec![inner]))
}
