//! The BAE client API v1: REST for sessions (`/api/v1/sessions*`, `/api/v1/meta`, `/healthz`)
//! and JSON-RPC over NDJSON for the live loop (`rpc.rs`); the admin API on its own listener
//! (`admin.rs`). Errors are RFC 7807 problems (`problem.rs`); events, messages and frames are
//! shaped in `wire/`.
//!
//! Runs on request threads. Authentication comes first on every route that has it, so a bad
//! key wins over a malformed body.

pub mod admin;
mod body;
pub mod core;
mod page;
pub mod problem;
mod rpc;
mod streams;
pub mod wire;

use std::sync::Arc;

use serde_json::{json, Value};

use crate::api::bae::core::Bae;
use crate::api::bae::core::{Attach, Attached, BaeError, Denied};
use crate::api::routes::{self, RouteDef};
use crate::api::{Door, Rate};
use crate::auth::keys::KeyRole;
use crate::auth::{self, BearerError};
use crate::http::origin::{self, Exposure};
use crate::http::{EdgeError, Handler, Reply, Request};
use crate::store::{BaeSessionRecord, KeyRecord};
use problem::Problem;

/// The client door.
pub struct ClientApi {
    bae: Bae,
}

/// What a route of the client door is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Health,
    Meta,
    Sessions,
    Session,
    Join,
    Events,
    Participants,
    Rpc,
}

const fn row(template: &'static str, method: &'static [&'static str], kind: Kind) -> RouteDef<Kind> {
    RouteDef { template, methods: method, kind }
}

/// Every route of the client door; each has one method, and GET routes answer HEAD too.
pub const ROUTES: &[RouteDef<Kind>] = &[
    row("/healthz", &["GET"], Kind::Health),
    row("/api/v1/meta", &["GET"], Kind::Meta),
    row("/api/v1/sessions", &["POST"], Kind::Sessions),
    row("/api/v1/sessions/{session_id}", &["DELETE"], Kind::Session),
    row("/api/v1/sessions/{session_id}/join", &["POST"], Kind::Join),
    row("/api/v1/sessions/{session_id}/events", &["GET"], Kind::Events),
    row("/api/v1/sessions/{session_id}/participants", &["GET"], Kind::Participants),
    row("/api/v1/sessions/{session_id}/rpc", &["POST"], Kind::Rpc),
];

/// Whether a path belongs to this door on the main port.
pub fn owns(path: &str) -> bool {
    path == "/healthz" || path.starts_with("/api/v1/") || path == "/api/v1"
}

impl ClientApi {
    pub fn new(bae: Bae) -> Arc<ClientApi> {
        Arc::new(ClientApi { bae })
    }

    fn dispatch(&self, request: &mut Request, admitted: Admitted) -> Result<Reply, Problem> {
        match admitted {
            // BAE's empty 200, with a media type so clients and the document agree on it.
            Admitted::Health => Ok(Reply::File {
                content_type: "text/plain; charset=utf-8",
                body: Vec::new(),
                cache_control: "no-store",
                policy: &[],
            }),
            Admitted::Meta => {
                Ok(json_reply(200, &json!({ "version": env!("CARGO_PKG_VERSION"), "api_versions": ["v1"] })))
            }
            Admitted::Open(client) => self.open(request, &client),
            Admitted::Join { client, id, attach } => {
                let attached = self.bae.join(&client, &id, attach)?;
                Ok(json_reply(201, &attached_json(&attached)))
            }
            Admitted::Close(session) => {
                self.bae.close(&session)?;
                Ok(json_reply(200, &json!({ "session_id": session.id, "state": "closed" })))
            }
            Admitted::Events(session) => events_page(&self.bae, request, &session.id),
            Admitted::Participants(session) => {
                let drivers = self.bae.drivers(&session.id)?;
                Ok(json_reply(200, &json!({ "drivers": drivers })))
            }
            Admitted::Rpc { key, session } => rpc::handle(&self.bae, request, key, session),
        }
    }

    fn open(&self, request: &mut Request, client: &KeyRecord) -> Result<Reply, Problem> {
        let attach = body::attach(request, false)?;
        let attached = self.bae.open(client, attach)?;
        Ok(json_reply(201, &attached_json(&attached)))
    }
}

/// A request `ClientApi::admit` let in: its route, with the key (and the session)
/// it was authenticated by. Every session it names is one its key reaches: a session key's
/// own session, or an open session of a client key's profile that it joins.
pub enum Admitted {
    Health,
    Meta,
    Open(KeyRecord),
    /// The join's body was read as it was admitted (BAE judges it before the session).
    Join {
        client: KeyRecord,
        id: String,
        attach: Attach,
    },
    Close(BaeSessionRecord),
    Events(BaeSessionRecord),
    Participants(BaeSessionRecord),
    Rpc {
        key: KeyRecord,
        session: BaeSessionRecord,
    },
}

/// A page of a session's events as `{items, next_cursor}` (the admin door shares it).
pub(crate) fn events_page(bae: &Bae, request: &Request, session_id: &str) -> Result<Reply, Problem> {
    let (after, limit) = page::parse(request)?;
    let page = bae.events(session_id, after, limit)?;
    let next = match page.next {
        Some(seq) => json!(seq.to_string()),
        None => Value::Null,
    };
    let mut body = b"{\"items\":[".to_vec();
    wire::write_page_views(&page.events, &mut body);
    body.extend_from_slice(format!("],\"next_cursor\":{next}}}").as_bytes());
    Ok(Reply::Json { status: 200, body, headers: Vec::new() })
}

/// The key of `role` the request's bearer token is; 401 with BAE's wording otherwise. A
/// client key's request is taken from its profile's rate limit unless another node counted
/// it (`Rate::Counted`).
pub(crate) fn authenticate(bae: &Bae, request: &Request, role: KeyRole, rate: Rate) -> Result<KeyRecord, Problem> {
    let token = bearer(request)?;
    let denied = match role {
        KeyRole::Client => Denied::ClientKey,
        KeyRole::Session => Denied::SessionKey,
        KeyRole::Admin => Denied::AdminKey,
    };
    let key = bae.authenticate(role, token)?.ok_or_else(|| Problem::from(BaeError::Unauthorized(denied)))?;
    if let Some(profile_id) = key.profile_id.as_deref().filter(|_| role == KeyRole::Client && rate == Rate::Count) {
        count_request(bae, profile_id)?;
    }
    Ok(key)
}

/// Takes one request from the rate limit of the profile's budget (Kestrel's extension).
fn count_request(bae: &Bae, profile_id: &str) -> Result<(), Problem> {
    bae.admit_request(profile_id).map_err(Problem::rate_limited)
}

fn bearer(request: &Request) -> Result<&str, Problem> {
    auth::bearer(request.header("Authorization")).map_err(|error: BearerError| Problem::unauthorized(error.to_string()))
}

/// The session key of `id` the request carries, and the session; 401 for any other key or
/// a session that does not exist. Taken from the session's profile's rate limit unless
/// another node counted it.
pub(crate) fn authorize_session(
    bae: &Bae,
    request: &Request,
    id: &str,
    rate: Rate,
) -> Result<(KeyRecord, BaeSessionRecord), Problem> {
    let token = bearer(request)?;
    let (key, session) = bae.authorize_session(token, id)?;
    if rate == Rate::Count {
        count_request(bae, &session.profile_id)?;
    }
    Ok((key, session))
}

fn attached_json(attached: &Attached) -> Value {
    let profile = &attached.profile;
    let provider = match &attached.target {
        Some(target) => json!({ "provider": target.wire, "model": target.model }),
        None => json!({ "provider": null, "model": null }),
    };
    json!({
        "session_id": attached.session_id,
        "session_key": attached.session_key,
        "profile": {
            "id": profile.id,
            "name": profile.name,
            "allowed_tools": profile.allowed_tools,
            "mcp_servers": profile.mcp_servers,
            "provider": provider,
        },
    })
}

pub(crate) fn json_reply(status: u16, value: &Value) -> Reply {
    Reply::Json { status, body: value.to_string().into_bytes(), headers: Vec::new() }
}

impl Door for ClientApi {
    type Admitted = Admitted;
    type Refusal = Problem;

    /// The route a request matches, with the key (and session) it is authenticated by: the
    /// one place this door decides who calls and which session it reaches, before anything
    /// is done for the request. A session key reaches only its own session (401 otherwise,
    /// as for a session that does not exist); a client key joins only an open session of its
    /// profile, checked in BAE's order (its body's 400s, then 404, 409, 403: `joinable`).
    fn admit(&self, request: &mut Request, rate: Rate) -> Result<Admitted, Problem> {
        let path = request.path().to_string();
        let found = routes::find(ROUTES, &path).ok_or_else(|| Problem::not_found(format!("no route for {path}")))?;
        request.set_route(found.route.template);
        let method = request.method().to_string();
        let served = found.route.methods[0];
        if method != served && !(served == "GET" && method == "HEAD") {
            let methods: &[&str] = if served == "GET" { &["GET", "HEAD"] } else { found.route.methods };
            return Err(Problem::method_not_allowed(&path, methods));
        }
        let id = found.param(0);
        Ok(match found.kind() {
            Kind::Health => Admitted::Health,
            Kind::Meta => Admitted::Meta,
            Kind::Sessions => Admitted::Open(authenticate(&self.bae, request, KeyRole::Client, rate)?),
            Kind::Join => {
                let client = authenticate(&self.bae, request, KeyRole::Client, rate)?;
                let attach = body::join_ahead(request)?;
                self.bae.joinable(&client, id)?;
                Admitted::Join { client, id: id.to_string(), attach }
            }
            Kind::Session => Admitted::Close(authorize_session(&self.bae, request, id, rate)?.1),
            Kind::Events => Admitted::Events(authorize_session(&self.bae, request, id, rate)?.1),
            Kind::Participants => Admitted::Participants(authorize_session(&self.bae, request, id, rate)?.1),
            Kind::Rpc => {
                let (key, session) = authorize_session(&self.bae, request, id, rate)?;
                Admitted::Rpc { key, session }
            }
        })
    }

    fn session<'a>(&self, admitted: &'a Admitted) -> Option<&'a str> {
        match admitted {
            Admitted::Health | Admitted::Meta | Admitted::Open(_) => None,
            Admitted::Join { id, .. } => Some(id),
            Admitted::Close(session) | Admitted::Events(session) | Admitted::Participants(session) => Some(&session.id),
            Admitted::Rpc { session, .. } => Some(&session.id),
        }
    }

    fn refuse(&self, refusal: Problem) -> Reply {
        refusal.into_reply()
    }

    fn serve(&self, request: &mut Request, admitted: Admitted) -> Reply {
        self.dispatch(request, admitted).unwrap_or_else(Problem::into_reply)
    }
}

impl Handler for ClientApi {
    fn handle(&self, request: &mut Request) -> Reply {
        self.answer(request)
    }

    fn internal_error(&self) -> Reply {
        Problem::new(500, "internal", "internal server error").into_reply()
    }

    fn edge_error(&self, _path: Option<&str>, error: &EdgeError) -> Reply {
        Problem::from(error).into_reply()
    }

    /// `/rpc` takes NDJSON as BAE's reference documents it, and JSON as BAE's SDKs send it.
    fn exposure(&self, _method: &str, path: &str) -> Exposure {
        let bodies = match routes::find(ROUTES, path).map(|found| found.kind()) {
            Some(Kind::Rpc) => origin::JSON_OR_NDJSON,
            Some(
                Kind::Health
                | Kind::Meta
                | Kind::Sessions
                | Kind::Session
                | Kind::Join
                | Kind::Events
                | Kind::Participants,
            )
            | None => origin::JSON,
        };
        Exposure::Api { bodies }
    }
}

#[cfg(test)]
mod tests {
    use super::{Kind, ROUTES};
    use crate::api::routes::find;

    #[test]
    fn routes_the_client_paths() {
        let kind = |path| find(ROUTES, path).map(|found| (found.kind(), found.param(0)));
        assert_eq!(kind("/healthz"), Some((Kind::Health, "")));
        assert_eq!(kind("/api/v1/sessions/ses_1/rpc"), Some((Kind::Rpc, "ses_1")));
        assert_eq!(kind("/api/v1/sessions/ses_1"), Some((Kind::Session, "ses_1")));
        assert_eq!(kind("/admin/v1/profiles"), None);
        assert_eq!(kind("/api/v1/sessions//join"), None);
    }
}
