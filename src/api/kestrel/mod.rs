//! Kestrel protocol 1.0 over REST + SSE: routing, authentication and the handlers.
//!
//! Runs on request threads. Routes are matched here, the tenant is decided here, and each
//! handler turns a request into an `Engine` call and the result into JSON. Errors from the
//! engine are mapped in one place (`error.rs`).

mod approvals;
mod body;
mod checkpoints;
mod error;
mod events;
mod files;
mod idempotency;
mod meta;
mod runs;
mod sessions;
mod wire;

use std::sync::Arc;
use std::time::Instant;

use crate::auth::{self, Principal, TokenSet};
use crate::config::DEFAULT_TENANT;
use crate::engine::Engine;
use crate::http::{EdgeError, Handler, Reply, Request};
pub use error::ApiError;

/// How the bus renders an envelope as one of Kestrel's SSE frames.
pub fn wire_sse_frame(envelope: &crate::bus::Envelope) -> String {
    wire::sse_frame(envelope)
}

/// How the bus renders an envelope for the plugin stream.
pub fn wire_plugins_frame(envelope: &crate::bus::Envelope) -> String {
    wire::plugins_frame(envelope)
}

/// The Kestrel front door.
pub struct KestrelApi {
    engine: Engine,
    tokens: TokenSet,
    /// `GET /api/config`: the effective config, secrets removed, computed once.
    config_view: serde_json::Value,
    /// Bytes `GET /file` reads at most.
    file_read_limit: usize,
    started: Instant,
    plugins: Arc<crate::plugins::Plugins>,
}

/// The authenticated caller.
pub struct Caller {
    pub tenant: String,
}

/// Every route of the protocol, with its path parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route<'a> {
    Health,
    Bootstrap,
    Config,
    Plugins,
    PluginEvents,
    Sessions,
    Session(&'a str),
    Messages(&'a str),
    Cancel(&'a str),
    Resume(&'a str),
    Rewind(&'a str),
    SessionEvents(&'a str),
    Approval(&'a str, &'a str),
    Files(&'a str),
    File(&'a str),
    Checkpoints(&'a str),
    CheckpointRestore(&'a str, &'a str),
    Events,
}

impl<'a> Route<'a> {
    fn parse(path: &'a str) -> Option<Route<'a>> {
        let rest = path.strip_prefix("/api/")?;
        let segments: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
        if segments.iter().any(|segment| segment.is_empty()) {
            return None;
        }
        Some(match segments.as_slice() {
            ["health"] => Route::Health,
            ["bootstrap"] => Route::Bootstrap,
            ["config"] => Route::Config,
            ["plugins"] => Route::Plugins,
            ["plugins", "events"] => Route::PluginEvents,
            ["events"] => Route::Events,
            ["sessions"] => Route::Sessions,
            ["sessions", id] => Route::Session(id),
            ["sessions", id, "messages"] => Route::Messages(id),
            ["sessions", id, "cancel"] => Route::Cancel(id),
            ["sessions", id, "resume"] => Route::Resume(id),
            ["sessions", id, "rewind"] => Route::Rewind(id),
            ["sessions", id, "events"] => Route::SessionEvents(id),
            ["sessions", id, "approvals", approval] => Route::Approval(id, approval),
            ["sessions", id, "files"] => Route::Files(id),
            ["sessions", id, "file"] => Route::File(id),
            ["sessions", id, "checkpoints"] => Route::Checkpoints(id),
            ["sessions", id, "checkpoints", checkpoint, "restore"] => Route::CheckpointRestore(id, checkpoint),
            _ => return None,
        })
    }

    fn methods(self) -> &'static [&'static str] {
        match self {
            Route::Sessions | Route::Checkpoints(_) => &["GET", "POST"],
            Route::Session(_) => &["GET", "PATCH", "DELETE"],
            Route::Messages(_)
            | Route::Cancel(_)
            | Route::Resume(_)
            | Route::Rewind(_)
            | Route::Approval(..)
            | Route::CheckpointRestore(..) => &["POST"],
            _ => &["GET"],
        }
    }
}

impl KestrelApi {
    pub fn new(
        engine: Engine,
        tokens: TokenSet,
        config_view: serde_json::Value,
        file_read_limit: usize,
        plugins: Arc<crate::plugins::Plugins>,
    ) -> Arc<KestrelApi> {
        Arc::new(KestrelApi { engine, tokens, config_view, file_read_limit, started: Instant::now(), plugins })
    }

    fn authenticate(&self, request: &Request) -> Result<Caller, ApiError> {
        if self.tokens.is_open() {
            return Ok(Caller { tenant: DEFAULT_TENANT.to_string() });
        }
        // `?token=` is for clients that cannot set headers (EventSource).
        let presented = auth::bearer(request.header("Authorization")).ok().or_else(|| request.query("token"));
        match presented.and_then(|token| self.tokens.principal(token)) {
            Some(Principal::Tenant(tenant)) => Ok(Caller { tenant }),
            None => Err(ApiError::unauthorized()),
        }
    }

    fn dispatch(&self, request: &mut Request) -> Result<Reply, ApiError> {
        let path = request.path().to_string();
        // The console and plugins' web assets are static files, never authenticated (as the
        // spec says).
        if let Some(served) = crate::console::serve(&path) {
            return console_file(request.method(), served);
        }
        if let Some(rest) = path.strip_prefix("/plugins/") {
            return meta::plugin_asset(self, request.method(), rest);
        }
        let route = Route::parse(&path).ok_or_else(ApiError::not_found)?;
        let method = request.method().to_string();
        if !route.methods().contains(&method.as_str()) {
            return Err(ApiError::method_not_allowed(route.methods()));
        }
        if route == Route::Health {
            return meta::health(self);
        }
        let caller = self.authenticate(request)?;
        match (route, method.as_str()) {
            (Route::Bootstrap, _) => meta::bootstrap(self),
            (Route::Config, _) => Ok(json(200, &self.config_view)),
            (Route::Plugins, _) => meta::plugins(self),
            (Route::Sessions, "GET") => sessions::list(self, &caller),
            (Route::Sessions, _) => sessions::create(self, &caller, request),
            (Route::Session(id), "GET") => sessions::get(self, &caller, id, request),
            (Route::Session(id), "PATCH") => sessions::patch(self, &caller, id, request),
            (Route::Session(id), _) => sessions::delete(self, &caller, id),
            (Route::Messages(id), _) => runs::send(self, &caller, id, request),
            (Route::Cancel(id), _) => runs::cancel(self, &caller, id),
            (Route::Resume(id), _) => runs::resume(self, &caller, id),
            (Route::Events, _) => events::all(self, &caller, request),
            (Route::SessionEvents(id), _) => events::session(self, &caller, id, request),
            (Route::Approval(id, approval), _) => approvals::resolve(self, &caller, id, approval, request),
            (Route::Files(id), _) => files::list(self, &caller, id, request),
            (Route::File(id), _) => files::read(self, &caller, id, request, self.file_read_limit),
            (Route::Checkpoints(id), "GET") => checkpoints::list(self, &caller, id),
            (Route::Checkpoints(id), _) => checkpoints::create(self, &caller, id, request),
            (Route::CheckpointRestore(id, checkpoint), _) => checkpoints::restore(self, &caller, id, checkpoint),
            (Route::Rewind(id), _) => checkpoints::rewind(self, &caller, id, request),
            (Route::PluginEvents, _) => events::plugins(self, &caller),
            (Route::Health, _) => unreachable!("answered before authentication"),
        }
    }
}

impl Handler for KestrelApi {
    fn handle(&self, request: &mut Request) -> Reply {
        self.dispatch(request).unwrap_or_else(ApiError::into_reply)
    }

    fn internal_error(&self) -> Reply {
        ApiError::new(500, "internal_error", "internal server error").into_reply()
    }

    fn edge_error(&self, _path: Option<&str>, error: &EdgeError) -> Reply {
        ApiError::from(error).into_reply()
    }
}

fn console_file(method: &str, served: crate::console::Served) -> Result<Reply, ApiError> {
    if method != "GET" && method != "HEAD" {
        return Err(ApiError::method_not_allowed(&["GET", "HEAD"]));
    }
    match served {
        crate::console::Served::File { body, content_type, cache_control } => {
            Ok(Reply::File { content_type, body, cache_control })
        }
        crate::console::Served::NotFound => Err(ApiError::not_found()),
    }
}

/// A JSON reply from any serializable value.
fn json(status: u16, value: &impl serde::Serialize) -> Reply {
    match serde_json::to_vec(value) {
        Ok(body) => Reply::Json { status, body, headers: Vec::new() },
        Err(error) => ApiError::internal(&error).into_reply(),
    }
}

#[cfg(test)]
mod tests {
    use super::Route;

    #[test]
    fn parses_the_route_table() {
        assert_eq!(Route::parse("/api/sessions/abc/events"), Some(Route::SessionEvents("abc")));
        assert_eq!(Route::parse("/api/sessions/a/approvals/b"), Some(Route::Approval("a", "b")));
        assert_eq!(Route::parse("/api/sessions/"), Some(Route::Sessions));
        assert_eq!(Route::parse("/api/sessions//messages"), None);
        assert_eq!(Route::parse("/api/nope"), None);
        assert_eq!(Route::parse("/elsewhere"), None);
    }
}
