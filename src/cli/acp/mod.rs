//! `kestrel acp`: Kestrel as an agent of the Agent Client Protocol (v1) over stdio, so an
//! editor (Zed, JetBrains, any ACP client) drives Kestrel sessions (docs/acp.md). It is a
//! client of a Kestrel server over the public protocol: a running one (`--url`, with a token
//! from `KESTREL_TOKEN` or `--token-file`) or, without one, one it starts in this process on a
//! local data dir (`Server::start`), which answers only this process (a token minted here and
//! kept in memory) and whose sessions work only in the editor's project directories
//! (`--root`, the current directory by default).
//!
//! The main thread reads the editor's lines; each `session/prompt` runs on a thread of its own
//! (`turn.rs`), so a `session/cancel` and the answers to permission requests are read while it
//! runs. Stdout carries only protocol lines; logs go to stderr.

mod map;
mod rpc;
mod turn;

use std::io::{BufRead, Read};
use std::path::PathBuf;

use serde_json::{json, Value};

use super::args::AcpArgs;
use super::client::{CliError, Client};
use rpc::{Peer, RpcError, INTERNAL_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR};

/// The ACP version spoken.
const PROTOCOL_VERSION: u64 = 1;
/// The longest line read from the editor (a prompt with images).
const LINE_LIMIT: u64 = 64 * 1024 * 1024;
/// Sessions a `session/list` page holds.
const LIST_PAGE: usize = 50;

pub fn acp(args: &AcpArgs) -> Result<(), CliError> {
    let roots = roots(args)?;
    let (client, server) = backend(args, &roots)?;
    let peer = Peer::new(Box::new(std::io::stdout()));
    let agent = Agent { client: std::sync::Arc::new(client), peer: peer.clone(), roots };
    let mut input = std::io::stdin().lock();
    loop {
        let mut line = Vec::new();
        let read = (&mut input).take(LINE_LIMIT).read_until(b'\n', &mut line);
        match read {
            Ok(0) | Err(_) => break,
            Ok(_) if !line.ends_with(b"\n") && line.len() as u64 >= LINE_LIMIT => {
                peer.answer(&Value::Null, Err(RpcError::new(INVALID_REQUEST, "a line longer than 64 MiB")));
                skip_rest_of_line(&mut input);
            }
            Ok(_) => agent.take(&line),
        }
    }
    peer.abandon();
    if let Some(server) = server {
        server.shutdown();
    }
    Ok(())
}

fn skip_rest_of_line(input: &mut impl BufRead) {
    let mut sink = Vec::new();
    while let Ok(read) = input.take(1 << 20).read_until(b'\n', &mut sink) {
        if read == 0 || sink.ends_with(b"\n") {
            return;
        }
        sink.clear();
    }
}

/// The editor's project directories sessions may work in, resolved: `--root`s, or the
/// directory the editor started this process in. With `--url` and no `--root`, none: the
/// server's roots for the token's tenant decide alone.
fn roots(args: &AcpArgs) -> Result<Vec<PathBuf>, CliError> {
    let named = match (&args.url, args.roots.is_empty()) {
        (Some(_), true) => return Ok(Vec::new()),
        (None, true) => vec![PathBuf::from(".")],
        (_, false) => args.roots.clone(),
    };
    let roots = named
        .iter()
        .map(|root| match std::fs::canonicalize(root) {
            Ok(path) if path.is_dir() => Ok(path),
            Ok(_) => Err(CliError::Usage(format!("--root {}: not a directory", root.display()))),
            Err(error) => Err(CliError::Usage(format!("--root {}: {error}", root.display()))),
        })
        .collect::<Result<Vec<PathBuf>, CliError>>()?;
    // Started in `/` with no project named, the whole file system would be the project.
    if args.roots.is_empty() && roots.iter().any(|root| root.parent().is_none()) {
        return Err(CliError::Usage(
            "started in /: name the project directories with --root (or start kestrel acp in one)".into(),
        ));
    }
    Ok(roots)
}

/// The server to talk to: the one named, with its token; or one started here on `--data-dir`
/// that answers only this process: its token is minted here, at random, and kept in memory
/// only (never on a command line, in the environment or in a file), and its sessions work
/// only in `roots`.
fn backend(args: &AcpArgs, roots: &[PathBuf]) -> Result<(Client, Option<crate::Server>), CliError> {
    if let Some(url) = &args.url {
        let env = std::env::var("KESTREL_TOKEN").ok();
        let token = super::token::resolve(args.token.as_deref(), args.token_file.as_deref(), env)?;
        return Ok((Client::with_token(url, token), None));
    }
    // Commands the agent runs are this user's processes too: none of them may read this
    // process's memory, where the token is (`/proc/<pid>/mem`, `environ`, ptrace).
    if let Err(error) = nix::sys::prctl::set_dumpable(false) {
        eprintln!("kestrel acp: cannot mark the process non-dumpable: {error}");
    }
    let token = crate::auth::keys::new_id("kacp_");
    let mut config = crate::Config::default();
    config.server.addr = "127.0.0.1:0".into();
    config.server.data_dir = args.data_dir.clone();
    config.auth.token = Some(token.clone());
    config.agent.workspace_roots = roots.to_vec();
    config.agent.workspace = roots.first().cloned();
    config.bae.admin_addr = String::new();
    std::fs::create_dir_all(&args.data_dir)
        .map_err(|e| CliError::Failed(format!("the data dir {}: {e}", args.data_dir.display())))?;
    let server = crate::Server::start(config).map_err(|error| CliError::Failed(error.to_string()))?;
    let url = format!("http://{}", server.addr());
    eprintln!("kestrel acp: a server for this process only on {url} (with a token of its own)");
    Ok((Client::with_token(&url, Some(token)), Some(server)))
}

struct Agent {
    client: std::sync::Arc<Client>,
    peer: Peer,
    /// The project directories a new session's `cwd` must be inside; none to leave it to the
    /// server.
    roots: Vec<PathBuf>,
}

impl Agent {
    /// One line from the editor: a request, a notification, or an answer to our request.
    fn take(&self, line: &[u8]) {
        let message: Value = match serde_json::from_slice(line) {
            Ok(message) => message,
            Err(error) => return self.peer.answer(&Value::Null, Err(RpcError::new(PARSE_ERROR, error.to_string()))),
        };
        if message.get("method").is_none() {
            self.peer.answered(&message);
            return;
        }
        let method = message["method"].as_str().unwrap_or("").to_string();
        let params = message.get("params").cloned().unwrap_or(json!({}));
        let Some(id) = message.get("id").cloned() else { return self.notification(&method, &params) };
        if method == "session/prompt" {
            let (client, peer) = (std::sync::Arc::clone(&self.client), self.peer.clone());
            let spawned = std::thread::Builder::new().name("kestrel-acp-prompt".into()).spawn(move || {
                let session_id = params["sessionId"].as_str().unwrap_or_default().to_string();
                let prompt = params["prompt"].as_array().cloned().unwrap_or_default();
                let result = turn::Turn { client: &client, peer: &peer, session_id: &session_id }.run(&prompt);
                peer.answer(&id, result);
            });
            if spawned.is_err() {
                self.peer.answer(&message["id"], Err(RpcError::new(INTERNAL_ERROR, "no thread for the prompt")));
            }
            return;
        }
        self.peer.answer(&id, self.request(&method, &params));
    }

    fn notification(&self, method: &str, params: &Value) {
        if method == "session/cancel" {
            if let Some(id) = params["sessionId"].as_str() {
                if let Err(error) = self.client.call("POST", &format!("/api/sessions/{id}/cancel"), None) {
                    log::warn!("acp: session/cancel of {id}: {error}");
                }
            }
        }
    }

    fn request(&self, method: &str, params: &Value) -> Result<Value, RpcError> {
        match method {
            "initialize" => Ok(json!({
                "protocolVersion": PROTOCOL_VERSION,
                "agentCapabilities": {
                    "loadSession": true,
                    "promptCapabilities": { "image": true, "audio": false, "embeddedContext": true },
                    "sessionCapabilities": { "list": {} },
                },
                "agentInfo": { "name": "kestrel", "version": env!("CARGO_PKG_VERSION") },
                "authMethods": [],
            })),
            "authenticate" => Ok(json!({})),
            "session/new" => self.new_session(params),
            "session/load" => self.load(params),
            "session/list" => self.list(params),
            _ => Err(RpcError::new(METHOD_NOT_FOUND, format!("{method} is not a method Kestrel answers"))),
        }
    }

    fn new_session(&self, params: &Value) -> Result<Value, RpcError> {
        let cwd = params["cwd"].as_str().ok_or_else(|| RpcError::invalid_params("`cwd` is required"))?;
        self.check_cwd(cwd)?;
        let body = json!({ "workspace": cwd, "title": format!("ACP: {cwd}") });
        let created = self.client.call("POST", "/api/sessions", Some(&body)).map_err(server_error)?;
        Ok(json!({ "sessionId": created["session"]["id"] }))
    }

    /// Refuses a `cwd` that is not an absolute path to a directory inside one of the roots
    /// (links resolved); the server checks its own roots again.
    fn check_cwd(&self, cwd: &str) -> Result<(), RpcError> {
        let path = std::path::Path::new(cwd);
        if !path.is_absolute() {
            return Err(RpcError::invalid_params(format!("`cwd` must be an absolute path, not {cwd:?}")));
        }
        if self.roots.is_empty() {
            return Ok(());
        }
        let resolved =
            std::fs::canonicalize(path).map_err(|error| RpcError::invalid_params(format!("`cwd` {cwd}: {error}")))?;
        if self.roots.iter().any(|root| resolved.starts_with(root)) {
            return Ok(());
        }
        let roots: Vec<String> = self.roots.iter().map(|root| root.display().to_string()).collect();
        Err(RpcError::invalid_params(format!(
            "`cwd` {cwd} is outside this agent's project directories ({}); start it with --root for each",
            roots.join(", ")
        )))
    }

    /// Replays the stored transcript as `session/update`s, then answers.
    fn load(&self, params: &Value) -> Result<Value, RpcError> {
        let id = params["sessionId"].as_str().ok_or_else(|| RpcError::invalid_params("`sessionId` is required"))?;
        let answer = self.client.call("GET", &format!("/api/sessions/{id}"), None).map_err(server_error)?;
        for update in map::replay(&answer["session"]) {
            self.peer.notify("session/update", json!({ "sessionId": id, "update": update }));
        }
        Ok(json!({}))
    }

    /// A page of sessions, newest first; with `cwd`, only those working there.
    fn list(&self, params: &Value) -> Result<Value, RpcError> {
        let mut path = format!("/api/sessions?limit={LIST_PAGE}");
        if let Some(cursor) = params["cursor"].as_str() {
            path.push_str(&format!("&cursor={}", url_encode(cursor)));
        }
        let page = self.client.call("GET", &path, None).map_err(server_error)?;
        let cwd = params["cwd"].as_str();
        let sessions: Vec<Value> = page["sessions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|session| cwd.is_none_or(|cwd| session["workspace"] == cwd))
            .map(|session| {
                json!({ "sessionId": session["id"], "cwd": session["workspace"], "title": session["title"],
                        "updatedAt": session["updatedAt"] })
            })
            .collect();
        Ok(json!({ "sessions": sessions, "nextCursor": page.get("nextCursor").cloned().unwrap_or(Value::Null) }))
    }
}

fn server_error(error: CliError) -> RpcError {
    match error {
        CliError::Denied(message) => RpcError::new(rpc::NOT_FOUND, message),
        CliError::Failed(message) | CliError::Usage(message) => RpcError::new(INTERNAL_ERROR, message),
    }
}

fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect()
}
