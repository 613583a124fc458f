//! Kestrel protocol 1.0 over REST + SSE: routing, authentication and the handlers.
//!
//! Runs on request threads. Routes are matched here, the tenant is decided here, and each
//! handler turns a request into an `Engine` call and the result into JSON. Errors from the
//! engine are mapped in one place (`error.rs`).

mod answers;
mod approvals;
mod body;
mod checkpoints;
mod error;
mod events;
mod files;
mod idempotency;
mod meta;
mod rules;
mod runs;
mod schedules;
mod sessions;
mod turn;
mod webhooks;

/// A Kestrel run's plan, for a run the server starts on its own (a schedule's).
pub fn kestrel_turn() -> Box<dyn crate::engine::TurnPlan> {
    Box::new(turn::KestrelTurn)
}
pub use turn::KestrelTurn;
mod wire;

use std::sync::Arc;
use std::time::Instant;

use crate::api::routes::{self, RouteDef};
use crate::api::{Door, Rate};
use crate::auth::{self, TokenSet};
use crate::config::DEFAULT_TENANT;
use crate::engine::Engine;
use crate::http::origin::Exposure;
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
    /// The whole session list's last answer per tenant, and sessions' detail answers.
    lists: answers::AnswerCache,
    details: answers::AnswerCache,
    schedules: crate::schedule::Schedules,
    webhooks: crate::webhooks::Webhooks,
    /// This node, when it is one of a cluster.
    cluster: Option<Arc<crate::cluster::Node>>,
}

/// What the door serves beside the engine.
pub struct Services {
    pub plugins: Arc<crate::plugins::Plugins>,
    pub schedules: crate::schedule::Schedules,
    pub webhooks: crate::webhooks::Webhooks,
    pub cluster: Option<Arc<crate::cluster::Node>>,
}

/// Appends an event in Kestrel's shape, for a webhook's payload; `false` for one no Kestrel
/// stream shows.
pub fn webhook_event(event: &crate::domain::Event, out: &mut Vec<u8>) -> bool {
    matches!(wire::event_json(event, out), Some(Ok(())))
}

/// The authenticated caller.
pub struct Caller {
    pub tenant: String,
    /// The token's name (for the audit log); `None` on a server without tokens.
    pub name: Option<String>,
    /// May read every tenant's audit log.
    pub admin: bool,
}

/// What a route of this door is; its path parameters come with the match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Console,
    Asset,
    PluginAsset,
    OpenApi,
    Metrics,
    Health,
    Bootstrap,
    Config,
    Plugins,
    PluginEvents,
    Sessions,
    Session,
    Messages,
    Cancel,
    Resume,
    Rewind,
    Fork,
    SessionEvents,
    Approval,
    Files,
    File,
    Checkpoints,
    CheckpointRestore,
    Events,
    Rules,
    Rule,
    SessionRules,
    SessionRule,
    Audit,
    Usage,
    Cluster,
    Schedules,
    Schedule,
    SchedulePause,
    ScheduleResume,
    ScheduleRun,
    Webhooks,
    Webhook,
    WebhookEnable,
    WebhookDeliveries,
    WebhookRedeliver,
}

impl Kind {
    /// Whether the route's first parameter is a session (`/api/sessions/{id}…`), which only
    /// its own tenant reaches.
    fn names_session(self) -> bool {
        match self {
            Kind::Session
            | Kind::Messages
            | Kind::Cancel
            | Kind::Resume
            | Kind::Rewind
            | Kind::Fork
            | Kind::SessionEvents
            | Kind::Approval
            | Kind::Files
            | Kind::File
            | Kind::Checkpoints
            | Kind::CheckpointRestore
            | Kind::SessionRules
            | Kind::SessionRule => true,
            Kind::Console
            | Kind::Asset
            | Kind::PluginAsset
            | Kind::OpenApi
            | Kind::Metrics
            | Kind::Health
            | Kind::Bootstrap
            | Kind::Config
            | Kind::Plugins
            | Kind::PluginEvents
            | Kind::Sessions
            | Kind::Events
            | Kind::Rules
            | Kind::Rule
            | Kind::Audit
            | Kind::Usage
            | Kind::Cluster
            | Kind::Schedules
            | Kind::Schedule
            | Kind::SchedulePause
            | Kind::ScheduleResume
            | Kind::ScheduleRun
            | Kind::Webhooks
            | Kind::Webhook
            | Kind::WebhookEnable
            | Kind::WebhookDeliveries
            | Kind::WebhookRedeliver => false,
        }
    }
}

const fn row(template: &'static str, methods: &'static [&'static str], kind: Kind) -> RouteDef<Kind> {
    RouteDef { template, methods, kind }
}

const GET: &[&str] = &["GET"];
const POST: &[&str] = &["POST"];
const DELETE: &[&str] = &["DELETE"];
const STATIC: &[&str] = &["GET", "HEAD"];

/// Every route of the Kestrel door on the main port (BAE's client routes are matched first,
/// by `bae::owns`). `/metrics` is here behind the token, and on the admin port behind its key.
pub const ROUTES: &[RouteDef<Kind>] = &[
    row("/", STATIC, Kind::Console),
    row("/index.html", STATIC, Kind::Console),
    row("/assets/{fingerprint}/{file}", STATIC, Kind::Asset),
    row("/plugins/{plugin}/web/{path*}", STATIC, Kind::PluginAsset),
    row("/api/openapi.json", GET, Kind::OpenApi),
    row("/metrics", GET, Kind::Metrics),
    row("/api/health", GET, Kind::Health),
    row("/api/bootstrap", GET, Kind::Bootstrap),
    row("/api/config", GET, Kind::Config),
    row("/api/plugins", GET, Kind::Plugins),
    row("/api/plugins/events", GET, Kind::PluginEvents),
    row("/api/events", GET, Kind::Events),
    row("/api/sessions", &["GET", "POST"], Kind::Sessions),
    row("/api/sessions/{id}", &["GET", "PATCH", "DELETE"], Kind::Session),
    row("/api/sessions/{id}/messages", POST, Kind::Messages),
    row("/api/sessions/{id}/cancel", POST, Kind::Cancel),
    row("/api/sessions/{id}/resume", POST, Kind::Resume),
    row("/api/sessions/{id}/rewind", POST, Kind::Rewind),
    row("/api/sessions/{id}/fork", POST, Kind::Fork),
    row("/api/sessions/{id}/events", GET, Kind::SessionEvents),
    row("/api/sessions/{id}/approvals/{approvalId}", POST, Kind::Approval),
    row("/api/sessions/{id}/files", GET, Kind::Files),
    row("/api/sessions/{id}/file", GET, Kind::File),
    row("/api/sessions/{id}/checkpoints", &["GET", "POST"], Kind::Checkpoints),
    row("/api/sessions/{id}/checkpoints/{checkpointId}/restore", POST, Kind::CheckpointRestore),
    row("/api/sessions/{id}/rules", &["GET", "POST"], Kind::SessionRules),
    row("/api/sessions/{id}/rules/{ruleId}", DELETE, Kind::SessionRule),
    row("/api/rules", &["GET", "POST"], Kind::Rules),
    row("/api/rules/{ruleId}", DELETE, Kind::Rule),
    row("/api/audit", GET, Kind::Audit),
    row("/api/usage", GET, Kind::Usage),
    row("/api/cluster", GET, Kind::Cluster),
    row("/api/schedules", &["GET", "POST"], Kind::Schedules),
    row("/api/schedules/{id}", &["GET", "DELETE"], Kind::Schedule),
    row("/api/schedules/{id}/pause", POST, Kind::SchedulePause),
    row("/api/schedules/{id}/resume", POST, Kind::ScheduleResume),
    row("/api/schedules/{id}/run", POST, Kind::ScheduleRun),
    row("/api/webhooks", &["GET", "POST"], Kind::Webhooks),
    row("/api/webhooks/{id}", &["GET", "DELETE"], Kind::Webhook),
    row("/api/webhooks/{id}/enable", POST, Kind::WebhookEnable),
    row("/api/webhooks/{id}/deliveries", GET, Kind::WebhookDeliveries),
    row("/api/webhooks/{id}/deliveries/{deliveryId}/redeliver", POST, Kind::WebhookRedeliver),
];

impl KestrelApi {
    pub fn new(
        engine: Engine,
        tokens: TokenSet,
        config_view: serde_json::Value,
        file_read_limit: usize,
        services: Services,
    ) -> Arc<KestrelApi> {
        let (lists, details) = (answers::AnswerCache::default(), answers::AnswerCache::default());
        let started = Instant::now();
        let Services { plugins, schedules, webhooks, cluster } = services;
        Arc::new(KestrelApi {
            engine,
            tokens,
            config_view,
            file_read_limit,
            started,
            plugins,
            lists,
            details,
            schedules,
            webhooks,
            cluster,
        })
    }

    /// The caller a request's token names, taken from its tenant's rate limit unless another
    /// node counted it (`Rate::Counted`): the one place the Kestrel door authenticates.
    fn authenticate(&self, request: &Request, rate: Rate) -> Result<Caller, ApiError> {
        let caller = if self.tokens.is_open() {
            // No token: a loopback server with one user, who is its operator; another account
            // of the machine reaches the port too, and is refused.
            if self.tokens.tokenless() == auth::Tokenless::OwnUser && !request.peer().is_own_user() {
                return Err(ApiError::not_own_user());
            }
            Caller { tenant: DEFAULT_TENANT.to_string(), name: None, admin: true }
        } else {
            // `?token=` is for clients that cannot set headers (EventSource).
            let presented = auth::bearer(request.header("Authorization")).ok().or_else(|| request.query("token"));
            match presented.and_then(|token| self.tokens.holder(token)) {
                Some(token) => {
                    Caller { tenant: token.tenant.clone(), name: Some(token.name.clone()), admin: token.admin }
                }
                None => return Err(ApiError::unauthorized()),
            }
        };
        if rate == Rate::Count {
            let allowance = self.engine.tenant_allowance(&caller.tenant);
            self.engine.admit_request(&allowance).map_err(ApiError::rate_limited)?;
        }
        Ok(caller)
    }

    fn dispatch(&self, request: &mut Request, admitted: Admitted) -> Result<Reply, ApiError> {
        let Admitted { path, kind, id, second, caller } = admitted;
        let (id, second) = (id.as_str(), second.as_str());
        let caller = match (kind, caller) {
            (Kind::Console | Kind::Asset, _) => return console_file(&path),
            (Kind::PluginAsset, _) => return meta::plugin_asset(self, id, second),
            (Kind::Health, _) => return meta::health(self),
            (Kind::OpenApi, _) => return Ok(crate::api::openapi::main_document()),
            (_, Some(caller)) => caller,
            // `admit` names a caller for every other route; refused if it did not.
            (_, None) => return Err(ApiError::unauthorized()),
        };
        let method = request.method().to_string();
        match (kind, method.as_str()) {
            (Kind::Bootstrap, _) => meta::bootstrap(self, &caller),
            (Kind::Config, _) => meta::config(self, &caller),
            (Kind::Metrics, _) => Ok(metrics_reply(self.engine.render_metrics()?)),
            (Kind::Plugins, _) => meta::plugins(self),
            (Kind::Sessions, "GET") => sessions::list(self, &caller, request),
            (Kind::Sessions, _) => sessions::create(self, &caller, request),
            (Kind::Session, "GET") => sessions::get(self, &caller, id, request),
            (Kind::Session, "PATCH") => sessions::patch(self, &caller, id, request),
            (Kind::Session, _) => sessions::delete(self, &caller, id),
            (Kind::Messages, _) => runs::send(self, &caller, id, request),
            (Kind::Cancel, _) => runs::cancel(self, &caller, id),
            (Kind::Resume, _) => runs::resume(self, &caller, id),
            (Kind::Events, _) => events::all(self, &caller, request),
            (Kind::SessionEvents, _) => events::session(self, &caller, id, request),
            (Kind::Approval, _) => approvals::resolve(self, &caller, id, second, request),
            (Kind::Files, _) => files::list(self, &caller, id, request),
            (Kind::File, _) => files::read(self, &caller, id, request, self.file_read_limit),
            (Kind::Checkpoints, "GET") => checkpoints::list(self, &caller, id),
            (Kind::Checkpoints, _) => checkpoints::create(self, &caller, id, request),
            (Kind::CheckpointRestore, _) => checkpoints::restore(self, &caller, id, second),
            (Kind::Rewind, _) => checkpoints::rewind(self, &caller, id, request),
            (Kind::Fork, _) => checkpoints::fork(self, &caller, id, request),
            (Kind::PluginEvents, _) => events::plugins(self, &caller),
            (Kind::Rules, "GET") => rules::list(self, &caller, None),
            (Kind::Rules, _) => rules::create(self, &caller, None, request),
            (Kind::Rule, _) => rules::delete(self, &caller, None, id),
            (Kind::SessionRules, "GET") => rules::list(self, &caller, Some(id)),
            (Kind::SessionRules, _) => rules::create(self, &caller, Some(id), request),
            (Kind::SessionRule, _) => rules::delete(self, &caller, Some(id), second),
            (Kind::Audit, _) => rules::audit(self, &caller, request),
            (Kind::Cluster, _) => meta::cluster(self, &caller),
            (Kind::Schedules, "GET") => schedules::list(self, &caller),
            (Kind::Schedules, _) => schedules::create(self, &caller, request),
            (Kind::Schedule, "GET") => schedules::get(self, &caller, id),
            (Kind::Schedule, _) => schedules::delete(self, &caller, id),
            (Kind::SchedulePause, _) => schedules::set_paused(self, &caller, id, true),
            (Kind::ScheduleResume, _) => schedules::set_paused(self, &caller, id, false),
            (Kind::ScheduleRun, _) => schedules::run_now(self, &caller, id),
            (Kind::Webhooks, "GET") => webhooks::list(self, &caller),
            (Kind::Webhooks, _) => webhooks::create(self, &caller, request),
            (Kind::Webhook, "GET") => webhooks::get(self, &caller, id),
            (Kind::Webhook, _) => webhooks::delete(self, &caller, id),
            (Kind::WebhookEnable, _) => webhooks::enable(self, &caller, id),
            (Kind::WebhookDeliveries, _) => webhooks::deliveries(self, &caller, id),
            (Kind::WebhookRedeliver, _) => webhooks::redeliver(self, &caller, id, second),
            (Kind::Usage, _) => {
                let usage = self.engine.usage_of(&self.engine.tenant_allowance(&caller.tenant))?;
                Ok(json(200, &serde_json::json!({ "usage": usage })))
            }
            (Kind::Console | Kind::Asset | Kind::PluginAsset | Kind::Health | Kind::OpenApi, _) => {
                unreachable!("answered before authentication")
            }
        }
    }
}

/// A request `KestrelApi::admit` let in: its route, with the route's parameters, and
/// its caller (none for the routes anyone may ask). A session its route names is the
/// caller's tenant's.
pub struct Admitted {
    path: String,
    kind: Kind,
    id: String,
    second: String,
    caller: Option<Caller>,
}

impl Door for KestrelApi {
    type Admitted = Admitted;
    type Refusal = ApiError;

    /// The route a request matches and its caller, and the session it names found the
    /// caller's: authentication and ownership come before anything is done for the request,
    /// here or, in a cluster, at another node.
    fn admit(&self, request: &mut Request, rate: Rate) -> Result<Admitted, ApiError> {
        let path = request.path().to_string();
        let found = routes::find(ROUTES, &path).ok_or_else(ApiError::not_found)?;
        request.set_route(found.route.template);
        if !found.route.methods.contains(&request.method()) {
            return Err(ApiError::method_not_allowed(found.route.methods));
        }
        let (kind, id, second) = (found.kind(), found.param(0).to_string(), found.param(1).to_string());
        // Static files (the console, plugins' web assets), the health check and the OpenAPI
        // document are never authenticated (as the spec says for static assets).
        let caller = match kind {
            Kind::Console | Kind::Asset | Kind::PluginAsset | Kind::Health | Kind::OpenApi => None,
            _ => Some(self.authenticate(request, rate)?),
        };
        // A session is its tenant's alone, whatever the token (an admin token is its tenant's
        // for sessions): in a cluster, another tenant's, or one that does not exist, is a 404
        // wherever the request lands, before the node claims the session or forwards anything.
        // One node needs no read of its own here: the engine's serving call checks it, as it
        // does for every caller (a cached answer is served with no read at all).
        if let (true, true, Some(caller)) = (self.cluster.is_some(), kind.names_session(), &caller) {
            self.engine.check_session(&caller.tenant, &id)?;
        }
        Ok(Admitted { path, kind, id, second, caller })
    }

    fn session<'a>(&self, admitted: &'a Admitted) -> Option<&'a str> {
        admitted.kind.names_session().then_some(admitted.id.as_str())
    }

    fn refuse(&self, refusal: ApiError) -> Reply {
        refusal.into_reply()
    }

    fn serve(&self, request: &mut Request, admitted: Admitted) -> Reply {
        self.dispatch(request, admitted).unwrap_or_else(ApiError::into_reply)
    }
}

impl Handler for KestrelApi {
    fn handle(&self, request: &mut Request) -> Reply {
        self.answer(request)
    }

    fn internal_error(&self) -> Reply {
        ApiError::new(500, "internal_error", "internal server error").into_reply()
    }

    fn edge_error(&self, _path: Option<&str>, error: &EdgeError) -> Reply {
        ApiError::from(error).into_reply()
    }

    /// The console's files and plugins' web files are public, as the spec says of static
    /// assets: any page may load them. Every other route is the API's.
    fn exposure(&self, method: &str, path: &str) -> Exposure {
        let kind = routes::find(ROUTES, path).map(|found| found.kind());
        match (kind, method) {
            (Some(Kind::Console | Kind::Asset | Kind::PluginAsset), "GET" | "HEAD") => Exposure::Asset,
            // Every other route, and any route added later, is screened as the API's: a new
            // public file must be named above on purpose.
            _ => Exposure::Api { bodies: crate::http::origin::JSON },
        }
    }
}

fn console_file(path: &str) -> Result<Reply, ApiError> {
    match crate::console::serve(path) {
        Some(crate::console::Served::File { body, content_type, cache_control }) => {
            Ok(Reply::File { content_type, body, cache_control, policy: crate::console::POLICY })
        }
        _ => Err(ApiError::not_found()),
    }
}

/// `/metrics` in Prometheus' text exposition format, never cached.
pub fn metrics_reply(text: Vec<u8>) -> Reply {
    Reply::File {
        content_type: "text/plain; version=0.0.4; charset=utf-8",
        body: text,
        cache_control: "no-store",
        policy: &[],
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
    use super::{Kind, ROUTES};
    use crate::api::routes::find;

    #[test]
    fn routes_by_the_table() {
        let kind = |path| find(ROUTES, path).map(|found| (found.kind(), found.param(0), found.param(1)));
        assert_eq!(kind("/api/sessions/abc/events"), Some((Kind::SessionEvents, "abc", "")));
        assert_eq!(kind("/api/sessions/a/approvals/b"), Some((Kind::Approval, "a", "b")));
        assert_eq!(kind("/api/sessions/"), Some((Kind::Sessions, "", "")));
        assert_eq!(kind("/plugins/p/web/a/b.js"), Some((Kind::PluginAsset, "p", "a/b.js")));
        assert_eq!(kind("/api/sessions//messages"), None);
        assert_eq!(kind("/api/nope"), None);
        assert_eq!(kind("/elsewhere"), None);
    }

    /// Exactly the routes under `/api/sessions/{id}` name a session: each is checked as the
    /// caller's before anything is done for it, and no other route is.
    #[test]
    fn the_routes_under_a_session_name_it() {
        for route in ROUTES {
            let under_a_session = route.template.starts_with("/api/sessions/{id}");
            assert_eq!(route.kind.names_session(), under_a_session, "{}", route.template);
        }
    }
}
