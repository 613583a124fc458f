//! The BAE admin API (`/admin/v1/*`) on its own loopback listener: profiles, client keys,
//! sessions and their events, and read-only views of the configured MCP servers, providers,
//! config (secrets masked) and sandbox images.
//!
//! Every route needs the admin key unless admin auth is disabled for local development.

use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::problem::Problem;
use super::{authenticate, body, events_page, json_reply, page};
use crate::api::bae::core::Bae;
use crate::api::bae::core::ProfileInput;
use crate::api::routes::{self, RouteDef};
use crate::auth::keys::KeyRole;
use crate::config::Config;
use crate::http::{EdgeError, Handler, Reply, Request};
use crate::store::{BaeSessionRecord, BaeState, KeyRecord, Page, ProfileRecord};

/// What secrets are shown as.
pub const MASK: &str = "••••••••";

pub struct AdminApi {
    bae: Bae,
    auth_disabled: bool,
    /// `GET /admin/v1/config`, `/providers`, `/mcp-servers`: fixed at start.
    config: Value,
    providers: Value,
    mcp_servers: Value,
}

/// What a route of the admin door is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    OpenApi,
    Metrics,
    Profiles,
    Profile,
    Keys,
    Key,
    Sessions,
    SessionEvents,
    McpServers,
    Providers,
    Config,
    SandboxStatus,
    Audit,
    Usage,
}

const fn row(template: &'static str, methods: &'static [&'static str], kind: Kind) -> RouteDef<Kind> {
    RouteDef { template, methods, kind }
}

const GET: &[&str] = &["GET"];

/// Every route of the admin door. The OpenAPI document is public; the rest need the admin key.
pub const ROUTES: &[RouteDef<Kind>] = &[
    row("/admin/openapi.json", GET, Kind::OpenApi),
    row("/metrics", GET, Kind::Metrics),
    row("/admin/v1/profiles", &["GET", "POST"], Kind::Profiles),
    row("/admin/v1/profiles/{id}", &["GET", "PUT", "DELETE"], Kind::Profile),
    row("/admin/v1/keys", &["GET", "POST"], Kind::Keys),
    row("/admin/v1/keys/{id}", &["DELETE"], Kind::Key),
    row("/admin/v1/sessions", GET, Kind::Sessions),
    row("/admin/v1/sessions/{id}/events", GET, Kind::SessionEvents),
    row("/admin/v1/mcp-servers", GET, Kind::McpServers),
    row("/admin/v1/providers", GET, Kind::Providers),
    row("/admin/v1/config", GET, Kind::Config),
    row("/admin/v1/sandbox-status", GET, Kind::SandboxStatus),
    row("/admin/v1/audit", GET, Kind::Audit),
    row("/admin/v1/usage", GET, Kind::Usage),
];

/// Fixed views for the read-only routes.
pub struct AdminViews {
    pub config: Value,
    pub providers: Value,
    pub mcp_servers: Value,
}

impl AdminApi {
    pub fn new(bae: Bae, auth_disabled: bool, views: AdminViews) -> Arc<AdminApi> {
        Arc::new(AdminApi {
            bae,
            auth_disabled,
            config: views.config,
            providers: views.providers,
            mcp_servers: views.mcp_servers,
        })
    }

    fn dispatch(&self, request: &mut Request) -> Result<Reply, Problem> {
        let path = request.path().to_string();
        let not_found = || Problem::not_found(format!("no route for {path}"));
        let found = routes::find(ROUTES, &path);
        if let Some(found) = &found {
            request.set_route(found.route.template);
        }
        if path == "/admin/openapi.json" && request.method() == "GET" {
            return Ok(crate::api::openapi::admin_document());
        }
        if !path.starts_with("/admin/v1/") && path != "/admin/openapi.json" && path != "/metrics" {
            return Err(not_found());
        }
        // The key is checked before the route, so a caller without one learns nothing of them.
        if !self.auth_disabled && path != "/admin/openapi.json" {
            authenticate(&self.bae, request, KeyRole::Admin, crate::api::Rate::Count)?;
        }
        let found = found.ok_or_else(not_found)?;
        let method = request.method().to_string();
        let methods = found.route.methods;
        if !methods.contains(&method.as_str()) {
            return Err(Problem::method_not_allowed(&path, methods));
        }
        let id = found.param(0);
        match (found.kind(), method.as_str()) {
            (Kind::OpenApi, _) => unreachable!("answered before authentication"),
            (Kind::Metrics, _) => {
                let text = self.bae.render_metrics().map_err(|e| Problem::internal(&format!("{e:?}")))?;
                Ok(crate::api::kestrel::metrics_reply(text))
            }
            (Kind::Profiles, "POST") => self.create_profile(request),
            (Kind::Profiles, _) => self.list_profiles(request),
            (Kind::Profile, "GET") => Ok(json_reply(200, &profile_view(&self.bae.profile(id)?))),
            (Kind::Profile, "PUT") => self.replace_profile(request, id),
            (Kind::Profile, _) => {
                self.bae.delete_profile(id)?;
                Ok(Reply::Empty { status: 204 })
            }
            (Kind::Keys, "POST") => self.create_key(request),
            (Kind::Keys, _) => self.list_keys(request),
            (Kind::Key, _) => {
                self.bae.revoke_key(id)?;
                Ok(Reply::Empty { status: 204 })
            }
            (Kind::Sessions, _) => self.list_sessions(request),
            (Kind::SessionEvents, _) => match self.bae.session(id)? {
                Some(session) => events_page(&self.bae, request, &session.id),
                None => Err(Problem::not_found(format!("no session {id}"))),
            },
            (Kind::McpServers, _) => Ok(json_reply(200, &self.mcp_servers)),
            (Kind::Providers, _) => Ok(json_reply(200, &self.providers)),
            (Kind::Config, _) => Ok(json_reply(200, &self.config)),
            (Kind::SandboxStatus, _) => self.sandbox_status(),
            (Kind::Audit, _) => self.audit(request),
            (Kind::Usage, _) => self.usage(request),
        }
    }

    /// What each profile's sessions spent today and this month, run now and may spend
    /// (Kestrel's extension), paged over the profiles like `/admin/v1/profiles`.
    fn usage(&self, request: &Request) -> Result<Reply, Problem> {
        let (after, limit) = page::parse(request)?;
        let page = match request.query("profile_id") {
            Some(id) => Page { items: vec![self.bae.profile(id)?], next: None },
            None => self.bae.profiles(after, limit)?,
        };
        let mut items = Vec::new();
        for profile in &page.items {
            let usage = self.bae.engine.usage_of(&self.bae.allowance(&profile.id));
            let usage = usage.map_err(|e| Problem::internal(&format!("usage: {e}")))?;
            let mut item = serde_json::to_value(&usage).unwrap_or_default();
            item["profile_id"] = json!(profile.id);
            items.push(item);
        }
        Ok(json_reply(200, &json!({ "items": items, "next_cursor": page.next.map(|seq| seq.to_string()) })))
    }

    /// Kestrel's audit log of permission decisions (docs/permissions.md), every tenant's or
    /// `?tenant=`'s, from `?since=` (RFC 3339), paged like every admin list.
    fn audit(&self, request: &Request) -> Result<Reply, Problem> {
        let (after, limit) = page::parse(request)?;
        let since = request.query("since").filter(|s| !s.is_empty());
        if since.is_some_and(|s| s.chars().count() > 64) {
            return Err(Problem::bad_request("since must be an RFC 3339 time"));
        }
        let query = crate::store::AuditQuery { tenant: request.query("tenant"), after, since };
        let mut entries =
            self.bae.engine.audit(&query, limit + 1).map_err(|e| Problem::internal(&format!("audit: {e}")))?;
        let next = match entries.len() > limit {
            true => {
                entries.truncate(limit);
                entries.last().map(|e| e.seq)
            }
            false => None,
        };
        let items: Vec<Value> = entries.iter().map(|e| serde_json::to_value(e).unwrap_or_default()).collect();
        Ok(json_reply(200, &json!({ "items": items, "next_cursor": next.map(|seq| seq.to_string()) })))
    }

    fn create_profile(&self, request: &mut Request) -> Result<Reply, Problem> {
        let input = profile_input(body::json_object(request)?)?;
        let profile = self.bae.create_profile(input)?;
        Ok(json_reply(201, &json!({ "id": profile.id, "name": profile.name, "created_at": profile.created_at })))
    }

    fn replace_profile(&self, request: &mut Request, id: &str) -> Result<Reply, Problem> {
        let input = profile_input(body::json_object(request)?)?;
        Ok(json_reply(200, &profile_view(&self.bae.replace_profile(id, input)?)))
    }

    fn list_profiles(&self, request: &Request) -> Result<Reply, Problem> {
        let (after, limit) = page::parse(request)?;
        Ok(page_reply(self.bae.profiles(after, limit)?, profile_view))
    }

    fn create_key(&self, request: &mut Request) -> Result<Reply, Problem> {
        let fields = body::json_object(request)?;
        let text = |field: &str| match fields.get(field) {
            Some(Value::String(text)) => Ok(text.clone()),
            _ => Err(Problem::bad_request(format!("invalid request body: missing or invalid field `{field}`"))),
        };
        let (name, profile_id) = (text("name")?, text("profile_id")?);
        if name.trim().is_empty() {
            return Err(Problem::bad_request("name must not be empty"));
        }
        check_name("name", &name)?;
        let (key, plaintext) = self.bae.create_key(&name, &profile_id)?;
        Ok(json_reply(
            201,
            &json!({ "id": key.id, "name": key.name, "key": plaintext, "prefix": key.prefix, "profile_id": key.profile_id, "created_at": key.created_at }),
        ))
    }

    fn list_keys(&self, request: &Request) -> Result<Reply, Problem> {
        let (after, limit) = page::parse(request)?;
        Ok(page_reply(self.bae.client_keys(after, limit)?, key_view))
    }

    fn list_sessions(&self, request: &Request) -> Result<Reply, Problem> {
        let (after, limit) = page::parse(request)?;
        let state = match request.query("state") {
            None | Some("") => None,
            Some(state) => Some(BaeState::parse(state).ok_or_else(|| {
                Problem::bad_request(format!("invalid state filter {state:?}; expected one of open, closed, error"))
            })?),
        };
        Ok(page_reply(self.bae.sessions(after, limit, state)?, session_view))
    }

    /// Each live profile that declares images, with each image's provisioning status.
    fn sandbox_status(&self) -> Result<Reply, Problem> {
        let mut items = Vec::new();
        let mut after = 0;
        loop {
            let page = self.bae.profiles(after, page::MAX_LIMIT)?;
            for profile in page.items.iter().filter(|p| !p.available_sandboxes.is_empty()) {
                let mut names = profile.available_sandboxes.clone();
                names.sort();
                names.dedup();
                let images: Vec<Value> =
                    self.bae.image_statuses(&names).iter().map(super::wire::image_status).collect();
                items.push(json!({ "profile_id": profile.id, "images": images }));
            }
            match page.next {
                Some(next) => after = next,
                None => break,
            }
        }
        items.sort_by(|a, b| a["profile_id"].as_str().cmp(&b["profile_id"].as_str()));
        Ok(json_reply(200, &json!({ "items": items })))
    }
}

fn page_reply<T>(page: Page<T>, view: fn(&T) -> Value) -> Reply {
    let items: Vec<Value> = page.items.iter().map(view).collect();
    let next = page.next.map(|seq| seq.to_string());
    json_reply(200, &json!({ "items": items, "next_cursor": next }))
}

pub fn profile_view(p: &ProfileRecord) -> Value {
    let mut view = json!({
        "id": p.id,
        "name": p.name,
        "primary_provider": p.primary_provider,
        "fallback_providers": p.fallback_providers,
        "mcp_servers": p.mcp_servers,
        "allowed_tools": p.allowed_tools,
        "available_sandboxes": p.available_sandboxes,
        "created_at": p.created_at,
        "updated_at": p.updated_at,
    });
    // Kestrel's extension, only where it was set: a BAE client sees BAE's profile.
    if let Some(budget) = &p.budget {
        view["budget"] = serde_json::to_value(budget).unwrap_or_default();
    }
    view
}

fn key_view(k: &KeyRecord) -> Value {
    json!({ "id": k.id, "name": k.name, "prefix": k.prefix, "profile_id": k.profile_id, "created_at": k.created_at, "last_used_at": k.last_used_at })
}

fn session_view(s: &BaeSessionRecord) -> Value {
    json!({
        "id": s.id,
        "profile_id": s.profile_id,
        "state": s.state.as_str(),
        "client_version": s.client_version,
        "created_at": s.created_at,
        "closed_at": s.closed_at,
    })
}

/// A profile body: `name` and `primary_provider` non-blank strings, the lists arrays (of
/// strings, `allowed_tools` excepted), each defaulting to `[]`.
fn profile_input(mut fields: Map<String, Value>) -> Result<ProfileInput, Problem> {
    let mut text = |field: &str| match fields.remove(field) {
        Some(Value::String(text)) if !text.trim().is_empty() => Ok(text),
        Some(Value::String(_)) => Err(Problem::bad_request(format!("{field} must not be empty"))),
        _ => Err(Problem::bad_request(format!("invalid request body: missing or invalid field `{field}`"))),
    };
    let name = text("name")?;
    check_name("name", &name)?;
    let primary_provider = text("primary_provider")?;
    check_name("primary_provider", &primary_provider)?;
    Ok(ProfileInput {
        name,
        primary_provider,
        fallback_providers: strings(&mut fields, "fallback_providers")?,
        mcp_servers: strings(&mut fields, "mcp_servers")?,
        allowed_tools: array(&mut fields, "allowed_tools")?,
        available_sandboxes: strings(&mut fields, "available_sandboxes")?,
        budget: budget(&mut fields)?,
    })
}

/// Kestrel's `budget` extension of a profile body (docs/permissions.md); absent or null: none.
fn budget(fields: &mut Map<String, Value>) -> Result<Option<crate::policy::Budget>, Problem> {
    match fields.remove("budget") {
        None | Some(Value::Null) => Ok(None),
        // An object only: serde would also read a struct from an array of its fields.
        Some(value @ Value::Object(_)) => {
            let budget: crate::policy::Budget = serde_json::from_value(value)
                .map_err(|e| Problem::bad_request(format!("invalid request body: budget: {e}")))?;
            budget.check().map_err(|why| Problem::bad_request(format!("invalid request body: budget: {why}")))?;
            Ok(Some(budget))
        }
        Some(_) => Err(Problem::bad_request("invalid request body: budget must be an object")),
    }
}

fn array(fields: &mut Map<String, Value>, field: &str) -> Result<Vec<Value>, Problem> {
    match fields.remove(field) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => Ok(items),
        Some(_) => Err(Problem::bad_request(format!("{field} must be an array"))),
    }
}

fn strings(fields: &mut Map<String, Value>, field: &str) -> Result<Vec<String>, Problem> {
    let items = array(fields, field)?;
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(text) => check_name(&format!("{field}[{i}]"), &text).map(|()| text),
            _ => Err(Problem::bad_request(format!("{field}[{i}] must be a string (a bae-config.toml registry name)"))),
        })
        .collect()
}

/// The longest name (of a profile, a key, a provider, a server, an image) taken, in characters.
const NAME_LIMIT: usize = 200;

/// A name is at most `NAME_LIMIT` characters, with no control character (a NUL, an escape
/// sequence, a newline that would forge a log line) and no bidirectional formatting one (a
/// right-to-left override that would show it reversed).
fn check_name(field: &str, name: &str) -> Result<(), Problem> {
    if name.chars().count() > NAME_LIMIT {
        return Err(Problem::bad_request(format!("{field} must be at most {NAME_LIMIT} characters")));
    }
    let bidi =
        |c: char| matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}');
    if name.chars().any(|c| c.is_control() || bidi(c)) {
        return Err(Problem::bad_request(format!(
            "{field} must not hold control or bidirectional formatting characters"
        )));
    }
    Ok(())
}

impl Handler for AdminApi {
    fn handle(&self, request: &mut Request) -> Reply {
        self.dispatch(request).unwrap_or_else(Problem::into_reply)
    }

    fn internal_error(&self) -> Reply {
        Problem::new(500, "internal", "internal server error").into_reply()
    }

    fn edge_error(&self, _path: Option<&str>, error: &EdgeError) -> Reply {
        Problem::from(error).into_reply()
    }
}

/// The read-only views, computed once at start. Every secret is masked.
pub fn views(config: &Config, bae: &Bae) -> AdminViews {
    let providers: Vec<Value> = bae
        .providers()
        .into_iter()
        .map(|(name, target)| json!({ "name": name, "provider": target.wire, "model": target.model, "base_url": target.base_url }))
        .collect();
    let entries: Vec<Value> = providers
        .iter()
        .map(|p| {
            let mut entry = p.clone();
            entry["auth_token"] = json!(MASK);
            entry
        })
        .collect();
    // Every server a profile may name: BAE's config file's, then Kestrel's own (the first of a
    // name is the one a session connects to).
    let mut servers: Vec<crate::config::bae::McpServer> = Vec::new();
    for server in config.bae.file.mcp.servers.iter().chain(&config.mcp.servers) {
        if !servers.iter().any(|known| known.name == server.name) {
            servers.push(server.clone());
        }
    }
    servers.sort_by(|a, b| a.name.cmp(&b.name));
    let mcp_servers: Vec<Value> =
        servers.iter().map(|s| json!({ "name": s.name, "transport": s.transport.as_str() })).collect();
    let mcp_config: Vec<Value> = servers
        .iter()
        .map(|s| json!({ "name": s.name, "transport": s.transport.as_str(), "command": s.command, "args": s.args, "url": s.url, "headers": masked(&s.headers), "env": masked(&s.env) }))
        .collect();
    AdminViews {
        config: json!({ "mcp": { "servers": mcp_config }, "providers": { "entries": entries }, "telemetry": telemetry(config) }),
        providers: json!({ "items": providers }),
        mcp_servers: json!({ "items": mcp_servers }),
    }
}

fn masked(map: &std::collections::BTreeMap<String, String>) -> Value {
    Value::Object(map.keys().map(|key| (key.clone(), json!(MASK))).collect())
}

/// The `[telemetry]` section as given (this server exports none), or BAE's defaults.
fn telemetry(config: &Config) -> Value {
    match &config.bae.file.telemetry {
        Some(t) => json!({
            "enabled": t.enabled,
            "otlp_endpoint": t.otlp_endpoint,
            "otlp_headers": t.otlp_headers.as_ref().map(masked).unwrap_or_else(|| json!({})),
            "sample_ratio": t.sample_ratio,
            "service_name": t.service_name.as_deref().unwrap_or("baesrv"),
            "traces": { "enabled": t.traces.enabled },
            "metrics": { "enabled": t.metrics.enabled, "disabled": t.metrics.disabled },
        }),
        None => json!({
            "enabled": false, "otlp_endpoint": null, "otlp_headers": {}, "sample_ratio": 1.0, "service_name": "baesrv",
            "traces": { "enabled": true }, "metrics": { "enabled": true, "disabled": [] },
        }),
    }
}
