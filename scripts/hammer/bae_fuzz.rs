//! The BAE doors for `scripts/fuzz`: the client routes (open, join, participants, events,
//! close, and JSON-RPC on `/rpc`) and every admin route, with this run's keys, another
//! session's key, the admin key where it does not belong, and junk; JSON-RPC bodies built from
//! every method's valid params and then mutated like the Kestrel bodies.

use std::sync::Mutex;

use serde_json::{json, Value};

use super::fuzz::Fuzzer;
use super::wire::{Client, Outcome};

/// What the BAE requests aim at.
pub struct BaeTargets {
    pub admin_key: String,
    pub client_key: String,
    /// Sessions opened with `client_key`: (id, session key); one closed is replaced.
    pub own: Mutex<Vec<(String, String)>>,
    /// A session of another client key: (id, session key).
    pub foreign: (String, String),
    /// A profile and a key the run may delete or revoke (never the ones it uses).
    pub victim_profile: String,
    pub victim_key: String,
}

const CLIENT_ROUTES: &[(&str, &[&str])] = &[
    ("/healthz", &["GET"]),
    ("/api/v1/meta", &["GET"]),
    ("/api/v1/sessions", &["POST"]),
    ("/api/v1/sessions/{ses}", &["DELETE"]),
    ("/api/v1/sessions/{ses}/join", &["POST"]),
    ("/api/v1/sessions/{ses}/participants", &["GET"]),
    ("/api/v1/sessions/{ses}/events", &["GET"]),
    ("/api/v1/sessions/{ses}/rpc", &["POST"]),
    ("/api/v1/sessions/{ses}/rpc", &["POST"]),
    ("/api/v1/sessions/{ses}/rpc", &["POST"]),
];

const ADMIN_ROUTES: &[(&str, &[&str])] = &[
    ("/admin/v1/profiles", &["GET", "POST"]),
    ("/admin/v1/profiles/{pro}", &["GET", "PUT", "DELETE"]),
    ("/admin/v1/keys", &["GET", "POST"]),
    ("/admin/v1/keys/{key}", &["DELETE"]),
    ("/admin/v1/sessions", &["GET"]),
    ("/admin/v1/sessions/{ses}/events", &["GET"]),
    ("/admin/v1/mcp-servers", &["GET"]),
    ("/admin/v1/providers", &["GET"]),
    ("/admin/v1/config", &["GET"]),
    ("/admin/v1/sandbox-status", &["GET"]),
];

/// A profile on the built-in model, two keys for it, a victim profile and key, and sessions.
pub fn setup(host: &str, admin_host: &str, admin_key: &str) -> BaeTargets {
    let mut admin = Client::new(admin_host);
    let mut profile = |name: &str| {
        let body = json!({ "name": name, "primary_provider": "builtin/echo", "allowed_tools": ["lookup"],
            "available_sandboxes": ["alpine:3.19"] });
        post_json(&mut admin, "/admin/v1/profiles", admin_key, &body)["id"].as_str().expect("a profile").to_string()
    };
    let (main, victim_profile) = (profile("fuzz"), profile("victim"));
    let mut key = |profile: &str| {
        let created =
            post_json(&mut admin, "/admin/v1/keys", admin_key, &json!({ "name": "k", "profile_id": profile }));
        (created["id"].as_str().expect("a key id").to_string(), created["key"].as_str().expect("a key").to_string())
    };
    let ((_, client_key), (_, other_key), (victim_key, _)) = (key(&main), key(&main), key(&victim_profile));
    let mut client = Client::new(host);
    let own = (0..3).map(|_| open(&mut client, &client_key)).collect::<Option<Vec<_>>>().expect("sessions");
    let foreign = open(&mut client, &other_key).expect("a foreign session");
    let admin_key = admin_key.to_string();
    BaeTargets { admin_key, client_key, own: Mutex::new(own), foreign, victim_profile, victim_key }
}

/// A JSON POST with a bearer key; the answer's JSON.
fn post_json(client: &mut Client, path: &str, key: &str, body: &Value) -> Value {
    let bearer = format!("Bearer {key}");
    let headers = [("Authorization", bearer.as_str()), ("Content-Type", "application/json")];
    client.request("POST", path, &headers, body.to_string().as_bytes()).json()
}

/// Opens a session with a client tool; (its id, its session key).
fn open(client: &mut Client, key: &str) -> Option<(String, String)> {
    let body = json!({ "tools": [{ "name": "lookup", "description": "d", "input_schema": { "type": "object" } }] });
    let opened = post_json(client, "/api/v1/sessions", key, &body);
    Some((opened["session_id"].as_str()?.to_string(), opened["session_key"].as_str()?.to_string()))
}

impl Fuzzer {
    /// One request to the BAE client door: its label and what came back.
    pub(super) fn one_bae_client(&mut self) -> (String, Outcome) {
        let (template, methods) = CLIENT_ROUTES[self.random.below(CLIENT_ROUTES.len())];
        let method = self.method(methods);
        let (path, session_key) = self.fill_bae(template);
        let bearer = match self.random.below(12) {
            0 => None,
            1 => Some(self.bae.admin_key.clone()),
            2 => Some(self.random.pick(&["bae_", "bae_ses_00", "Bearer", "bae_admin_zz"]).to_string()),
            3 => Some(self.bae.foreign.1.clone()),
            _ if template.contains("{ses}") && !template.ends_with("/join") => Some(session_key),
            _ => Some(self.bae.client_key.clone()),
        };
        let label = format!("BAE {method} {path}");
        let body = if template.ends_with("/rpc") { self.rpc_body() } else { self.open_body() };
        let mut headers = vec![("Content-Type".to_string(), "application/json".to_string())];
        if let Some(bearer) = bearer {
            headers.push(("Authorization".into(), format!("Bearer {bearer}")));
        }
        let refs: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        // A subscribe streams for as long as the client listens: only its head is awaited.
        let outcome = match template.ends_with("/rpc") && String::from_utf8_lossy(&body).contains("subscribe") {
            true => self.client.head_status(&method, &path, &refs, &body),
            false => self.client.request(&method, &path, &refs, &body),
        };
        if method == "DELETE" && outcome.status() == Some(204) {
            self.replace_closed(&path);
        }
        (label, outcome)
    }

    /// One request to the BAE admin door.
    pub(super) fn one_bae_admin(&mut self) -> (String, Outcome) {
        let (template, methods) = ADMIN_ROUTES[self.random.below(ADMIN_ROUTES.len())];
        let method = self.method(methods);
        let path = template
            .replace("{pro}", &self.pick_id(&self.bae.victim_profile.clone(), "pro_"))
            .replace("{key}", &self.pick_id(&self.bae.victim_key.clone(), "key_"))
            .replace("{ses}", &self.fill_bae("{ses}").0);
        let query = match self.random.below(6) {
            0 => format!("?limit={}", self.random.pick(&["0", "1", "200", "201", "-1", "x", "99999999999999999999"])),
            1 => format!("?cursor={}", self.random.pick(&["", "zz", "eyJ4IjoxfQ", "%00", "a".repeat(500).as_str()])),
            2 => format!("?state={}", self.random.pick(&["active", "closed", "error", "bogus", ""])),
            _ => String::new(),
        };
        let bearer = match self.random.below(10) {
            0 => None,
            1 => Some(self.bae.client_key.clone()),
            _ => Some(self.bae.admin_key.clone()),
        };
        let mut value = match template {
            "/admin/v1/keys" => json!({ "name": "k", "profile_id": self.bae.victim_profile }),
            _ => json!({ "name": format!("p{}", self.random.below(1000)), "primary_provider": "builtin/echo",
                         "fallback_providers": ["nope"], "allowed_tools": ["lookup"], "compaction": { "mode": "auto", "size": 1000 } }),
        };
        if self.random.chance(60) {
            self.mutate_value(&mut value, 0);
        }
        let body = self.damage(serde_json::to_vec(&value).unwrap_or_default());
        let mut headers = vec![("Content-Type".to_string(), "application/json".to_string())];
        if let Some(bearer) = bearer {
            headers.push(("Authorization".into(), format!("Bearer {bearer}")));
        }
        let refs: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        let path = format!("{path}{query}");
        (format!("admin {method} {path}"), self.admin.request(&method, &path, &refs, &body))
    }

    fn method(&mut self, methods: &[&str]) -> String {
        match self.random.chance(85) {
            true => methods[self.random.below(methods.len())].to_string(),
            false => self.random.pick(&["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]).to_string(),
        }
    }

    /// The path with a session id (one of ours, another client's, or junk), and the session
    /// key that goes with ours.
    fn fill_bae(&mut self, template: &str) -> (String, String) {
        let (id, key) = match self.random.below(10) {
            0..=6 => {
                let own = self.bae.own.lock().unwrap_or_else(|e| e.into_inner());
                own[self.random.below(own.len())].clone()
            }
            7 => self.bae.foreign.clone(),
            _ => {
                let junk = self.random.pick(&["ses_nope", "..", "%2e%2e", "%00", "ses_%C3%A9", "a%2Fb", ""]);
                (junk.to_string(), self.bae.client_key.clone())
            }
        };
        (template.replace("{ses}", &id), key)
    }

    fn pick_id(&mut self, victim: &str, prefix: &str) -> String {
        match self.random.below(4) {
            0 => victim.to_string(),
            1 => format!("{prefix}{}", "0".repeat(32)),
            2 => self.random.pick(&["..", "%00", "x"]).to_string(),
            _ => format!("{prefix}{}", self.random.next()),
        }
    }

    fn open_body(&mut self) -> Vec<u8> {
        let mut value = json!({
            "tools": [{ "name": "lookup", "description": "d", "input_schema": { "type": "object" } }],
            "compaction": { "mode": self.random.pick(&["auto", "client", "none", "bogus"]), "size": 1000 },
        });
        if self.random.chance(60) {
            self.mutate_value(&mut value, 0);
        }
        self.damage(serde_json::to_vec(&value).unwrap_or_default())
    }

    /// A JSON-RPC body: one of the methods with valid params, then maybe mutated; now and
    /// then a batch, a notification or an unknown method.
    fn rpc_body(&mut self) -> Vec<u8> {
        let (method, params) = match self.random.below(17) {
            0 => ("session.registerDriver", json!({})),
            1 | 2 => {
                ("session.sendMessage", json!({ "message": { "role": "user", "content": "hello /tool lookup {}" } }))
            }
            3 => (
                "session.sendMessage",
                json!({ "message": { "role": "user", "content": [{ "type": "tool_result", "tool_use_id": "toolu_1", "content": "r" }] } }),
            ),
            4 => ("session.compact", json!({ "prompt": "sum up" })),
            5 => ("session.subscribe", json!({ "since_event_id": format!("evt_{:032x}", self.random.below(50)) })),
            6 => ("session.unsubscribe", json!({})),
            7 => (
                "session.updateClientTools",
                json!({ "tools": [{ "name": "lookup", "input_schema": { "type": "object" } }] }),
            ),
            8 => ("session.sandbox.exec", json!({ "command": "ls" })),
            9 => ("session.nope", json!({})),
            10 => ("session.startRemoteSandbox", json!({ "image": "alpine:3.19" })),
            11 => ("session.execRemoteSandbox", json!({ "command": "ls" })),
            12 => ("session.stopRemoteSandbox", json!({})),
            13 => ("session.reportLocalSandbox", json!({ "state": "running", "image": "x", "container_id": "c" })),
            14 => (
                "session.reportLocalSubagent",
                json!({ "state": "failed", "subagent_id": "sba_1", "harness": "h", "model": "m", "reason": "timeout", "exit_code": null }),
            ),
            15 => ("session.cancelSubagent", json!({ "subagent_id": format!("sba_{}", self.random.below(5)) })),
            _ => {
                return self.damage(b"[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"session.registerDriver\"}]".to_vec())
            }
        };
        let mut envelope =
            json!({ "jsonrpc": "2.0", "id": self.random.below(1000), "method": method, "params": params });
        if self.random.chance(10) {
            envelope.as_object_mut().map(|fields| fields.remove("id"));
        }
        if self.random.chance(40) {
            self.mutate_value(&mut envelope["params"], 0);
        } else if self.random.chance(15) {
            self.mutate_value(&mut envelope, 0);
        }
        self.damage(serde_json::to_vec(&envelope).unwrap_or_default())
    }

    /// A session this run closed is replaced, so the requests keep finding open ones.
    fn replace_closed(&mut self, path: &str) {
        let mut own = self.bae.own.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(index) = own.iter().position(|(id, _)| path.contains(id.as_str())) {
            if let Some(opened) = open(&mut self.client, &self.bae.client_key) {
                own[index] = opened;
            }
        }
    }
}
