//! BAE sessions: open and join (each mints a session key bound to the session), close,
//! revocation's closes, lists and event pages.
//!
//! A BAE session is an engine session (tenant `@bae`) and a `bae_sessions` row, created in one
//! transaction with the creator's session key. Every event it records is durable before the
//! request that caused it is answered.

use super::bae;
use super::Bae;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::runtime::BaeOp;
use super::{BaeError, Denied, RESERVED_TOOL};
use crate::auth::keys::{new_id, KeyRole};
use crate::bus::{Envelope, LogPage, Origin};
use crate::domain::{CloseReason, Event, Fault, SessionRecord, SessionStatus, SessionSummary};
use crate::engine::session;
use crate::providers::Target;
use crate::store::{BaeSessionRecord, BaeState, BaeWrite, KeyRecord, Page, ProfileRecord, WriteOp, BAE_TENANT};

/// A tool a client declares at open or join.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct ToolDef {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub input_schema: Option<Value>,
}

/// A remote subagent declaration (`subagent_tools`), checked at open and join.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct SubagentDecl {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub input_schema: Option<Value>,
    pub image: String,
    pub subagents: Vec<Harness>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Harness {
    pub harness: String,
    pub command_template: String,
    #[serde(default = "stdin")]
    pub prompt_via: String,
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

fn stdin() -> String {
    "stdin".into()
}

/// How a session's history is compacted, fixed at creation.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(tag = "mode", rename_all = "lowercase", deny_unknown_fields)]
pub enum Compaction {
    /// After a turn whose reported usage passed `size` tokens (at least 1,000).
    Auto { size: u64 },
    /// Only on `session.compact`, with this default instruction.
    Client {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prompt: Option<String>,
    },
}

/// The smallest `auto` size.
pub const MIN_AUTO_SIZE: u64 = 1_000;

/// What a client declares when it opens or joins a session.
#[derive(Debug, Clone, Default)]
pub struct Attach {
    pub client_version: Option<String>,
    pub tools: Vec<ToolDef>,
    pub sandbox_tools: Vec<ToolDef>,
    pub subagent_tools: Vec<SubagentDecl>,
    pub compaction: Option<Compaction>,
}

/// An opened or joined session: its new session key (shown once) and the profile.
pub struct Attached {
    pub session_id: String,
    pub session_key: String,
    pub profile: ProfileRecord,
    /// What the profile's primary provider is, if it resolves.
    pub target: Option<Target>,
}

/// An event of a session's history.
pub type EventView = Arc<Envelope>;

/// A page of a session's history (`Bae::events`).
pub struct EventsPage {
    pub events: LogPage,
    /// The seq to read the next page after, while more remain.
    pub next: Option<u64>,
}

/// The event types a BAE session's history holds (the engine's names).
pub const BAE_EVENT_KINDS: &[&str] = &[
    "client.attached",
    "driver.registered",
    "message.completed",
    "provider.request",
    "provider.response",
    "tool.started",
    "tool.finished",
    "mcp.request",
    "mcp.response",
    "sandbox.local",
    "sandbox.remote",
    "sandbox.request",
    "sandbox.response",
    "sandbox.images",
    "subagent",
    "session.fault",
    "session.closed",
    "compaction.started",
    "compaction.completed",
];

impl Bae {
    /// Opens a session for a client key, in BAE's order of checks.
    pub fn open(&self, client: &KeyRecord, attach: Attach) -> Result<Attached, BaeError> {
        let profile_id = client.profile_id.clone().unwrap_or_default();
        let Some(profile) = self.engine.shared.store.readers().bae_profile(&profile_id)? else {
            self.audit(client, &profile_id, &attach, Fault::ProfileUnavailable { profile_id: profile_id.clone() });
            return Err(BaeError::ProfileUnavailable);
        };
        let model = self.primary_model(client, &profile, &attach)?;
        check_tools(&profile, &attach)?;
        let session_id = new_id("ses_");
        let now = crate::time::now_rfc3339();
        let (key, minted) = self.mint_session_key(client, &session_id, &now);
        let record = BaeSessionRecord {
            id: session_id.clone(),
            creator_key_id: client.id.clone(),
            profile_id: profile.id.clone(),
            state: BaeState::Open,
            client_version: attach.client_version.clone(),
            client_tools: entry(&client.id, declared(&attach.tools)),
            sandbox_tools: entry(&client.id, declared(&attach.sandbox_tools)),
            subagent_tools: entry(&client.id, json!(attach.subagent_tools)),
            compaction: attach.compaction.as_ref().map(|c| json!(c)),
            created_at: now.clone(),
            closed_at: None,
        };
        let writes = vec![
            WriteOp::InsertSession(engine_session(&session_id, &model, &now)),
            WriteOp::Bae(BaeWrite::InsertSession(record)),
            WriteOp::Bae(BaeWrite::InsertKey { key, digest: minted.digest }),
        ];
        // The session, its key and `session.open` commit together.
        self.record_attached(&client.id, &session_id, false, &attach, writes)?;
        // Its MCP connections are made here, so in a cluster this node holds it from now on.
        self.engine.hold_lease(&session_id)?;
        self.log_mcp_servers(&profile, &session_id);
        bae(&self.engine.shared).mcp.connect(
            &session_id,
            &profile.mcp_servers,
            &self.settings().mcp_configs,
            &self.settings().mcp_spawning,
        );
        Ok(Attached { session_id, session_key: minted.plaintext, target: self.target_of(&model), profile })
    }

    /// Connects an open session to its profile's MCP servers on this node, unless it has its
    /// connections here already: this node took the session over from one that stopped.
    pub fn reconnect_mcp(&self, session_id: &str) -> Result<(), BaeError> {
        let readers = self.engine.shared.store.readers();
        let shared = bae(&self.engine.shared);
        let Some(session) = readers.bae_session(session_id)?.filter(|s| s.state == BaeState::Open) else {
            return Ok(());
        };
        let Some(profile) = readers.bae_profile(&session.profile_id)? else { return Ok(()) };
        if profile.mcp_servers.is_empty() || shared.mcp.has(session_id) {
            return Ok(());
        }
        let settings = self.settings();
        shared.mcp.connect(session_id, &profile.mcp_servers, &settings.mcp_configs, &settings.mcp_spawning);
        Ok(())
    }

    /// The session `client` may join: one that exists (404), is open (409) and is of the
    /// client key's profile (403), checked in BAE's order. The one place that decides which
    /// session a client key reaches: the door asks it as it admits a join, before a node of a
    /// cluster claims the session or forwards the join, and `join` asks it again.
    pub fn joinable(&self, client: &KeyRecord, session_id: &str) -> Result<BaeSessionRecord, BaeError> {
        let readers = self.engine.shared.store.readers();
        let session = readers.bae_session(session_id)?.ok_or_else(|| BaeError::SessionNotFound(session_id.into()))?;
        if session.state != BaeState::Open {
            return Err(BaeError::SessionEnded(session.state));
        }
        if client.profile_id.as_deref() != Some(session.profile_id.as_str()) {
            return Err(BaeError::ProfileMismatch);
        }
        Ok(session)
    }

    /// Joins an open session of the same profile, in BAE's order of checks (after auth and
    /// the `compaction` refusal, which are the caller's).
    pub fn join(&self, client: &KeyRecord, session_id: &str, attach: Attach) -> Result<Attached, BaeError> {
        let readers = self.engine.shared.store.readers();
        let session = self.joinable(client, session_id)?;
        let Some(profile) = readers.bae_profile(&session.profile_id)? else {
            let fault = Fault::ProfileUnavailable { profile_id: session.profile_id.clone() };
            self.audit(client, &session.profile_id, &attach, fault);
            return Err(BaeError::ProfileUnavailable);
        };
        let model = self.primary_model(client, &profile, &attach)?;
        check_tools(&profile, &attach)?;
        let now = crate::time::now_rfc3339();
        let (key, minted) = self.mint_session_key(client, session_id, &now);
        let tools = BaeWrite::SetClientTools {
            session_id: session_id.to_string(),
            key_id: client.id.clone(),
            tools: declared(&attach.tools),
            sandbox_tools: declared(&attach.sandbox_tools),
            subagent_tools: json!(attach.subagent_tools),
        };
        let writes = vec![WriteOp::Bae(tools), WriteOp::Bae(BaeWrite::InsertKey { key, digest: minted.digest })];
        self.record_attached(&client.id, session_id, true, &attach, writes)?;
        Ok(Attached {
            session_id: session_id.to_string(),
            session_key: minted.plaintext,
            target: self.target_of(&model),
            profile,
        })
    }

    /// The model the profile's primary provider names; refused (and audited) if none.
    fn primary_model(&self, client: &KeyRecord, profile: &ProfileRecord, attach: &Attach) -> Result<String, BaeError> {
        match self.engine.shared.models.model_named(&profile.primary_provider) {
            Some(info) => Ok(info.id.clone()),
            None => {
                log::error!(
                    "profile {} ({}): primary provider {:?} is not configured; refusing to open a session",
                    profile.id,
                    profile.name,
                    profile.primary_provider
                );
                let fault = Fault::PrimaryProviderUnavailable {
                    profile_id: profile.id.clone(),
                    primary_provider: profile.primary_provider.clone(),
                };
                self.audit(client, &profile.id, attach, fault);
                Err(BaeError::PrimaryProviderUnavailable(profile.primary_provider.clone()))
            }
        }
    }

    fn target_of(&self, model: &str) -> Option<Target> {
        self.engine.shared.models.route(model).map(|route| route.target())
    }

    /// A new session key for `client` on `session_id`: its record and the minted key.
    fn mint_session_key(
        &self,
        client: &KeyRecord,
        session_id: &str,
        now: &str,
    ) -> (KeyRecord, crate::auth::keys::MintedKey) {
        let minted = self.settings().keyring.mint(KeyRole::Session);
        let key = KeyRecord {
            id: new_id("key_"),
            name: session_id.to_string(),
            role: KeyRole::Session,
            prefix: minted.prefix.clone(),
            profile_id: client.profile_id.clone(),
            client_id: Some(client.id.clone()),
            session_id: Some(session_id.to_string()),
            created_at: now.to_string(),
            last_used_at: None,
        };
        (key, minted)
    }

    /// Records `session.open` or `session.join`, committed with `writes`.
    fn record_attached(
        &self,
        client: &str,
        session_id: &str,
        joined: bool,
        attach: &Attach,
        writes: Vec<WriteOp>,
    ) -> Result<(), BaeError> {
        let names = |tools: &[ToolDef]| tools.iter().map(|t| t.name.clone()).collect();
        let event = Event::ClientAttached {
            session_id: session_id.to_string(),
            joined,
            client_version: attach.client_version.clone(),
            tools: names(&attach.tools),
            sandbox_tools: names(&attach.sandbox_tools),
            subagent_tools: attach.subagent_tools.iter().map(|t| t.name.clone()).collect(),
        };
        let origin = Origin { actor: Some(Arc::from(client)), turn: None };
        match self.engine.shared.bus.publish_written(Some(Arc::from(BAE_TENANT)), origin, event, writes) {
            Some(_) => Ok(()),
            None => Err(BaeError::Engine(crate::engine::EngineError::Internal("the session could not be stored"))),
        }
    }

    /// Publishes a BAE session's event attributed to `actor` and waits for it to be durable.
    pub(super) fn publish_bae(&self, actor: &str, event: Event) -> Result<(), BaeError> {
        let origin = Origin { actor: Some(Arc::from(actor)), turn: None };
        match self.engine.shared.bus.publish_durable(Some(Arc::from(BAE_TENANT)), origin, event) {
            Some(_) => Ok(()),
            None => Err(BaeError::Engine(crate::engine::EngineError::Internal("an event could not be logged"))),
        }
    }

    /// The audit trail of a refused open or join: a session in `error` with the fault.
    fn audit(&self, client: &KeyRecord, profile_id: &str, attach: &Attach, fault: Fault) {
        let id = new_id("ses_");
        let now = crate::time::now_rfc3339();
        let names: Vec<Value> = attach.tools.iter().map(|t| json!({ "name": t.name })).collect();
        let record = BaeSessionRecord {
            id: id.clone(),
            creator_key_id: client.id.clone(),
            profile_id: profile_id.to_string(),
            state: BaeState::Error,
            client_version: attach.client_version.clone(),
            client_tools: entry(&client.id, Value::Array(names)),
            sandbox_tools: Map::new(),
            subagent_tools: Map::new(),
            compaction: None,
            created_at: now.clone(),
            closed_at: Some(now.clone()),
        };
        let written = self.engine.shared.store.write(vec![
            WriteOp::InsertSession(engine_session(&id, "", &now)),
            WriteOp::Bae(BaeWrite::InsertSession(record)),
        ]);
        let logged = written
            .map_err(BaeError::from)
            .and_then(|()| self.publish_bae(&client.id, Event::SessionFault { session_id: id, fault }));
        if let Err(error) = logged {
            log::error!("the audit row of a refused session could not be written: {error:?}");
        }
    }

    /// MCP servers the profile names that are not configured are logged on every open.
    fn log_mcp_servers(&self, profile: &ProfileRecord, session_id: &str) {
        for name in &profile.mcp_servers {
            if !self.settings().mcp_servers.iter().any(|server| server == name) {
                log::error!(
                    "profile {} ({}), session {session_id}: MCP server {name:?} is not configured; skipped",
                    profile.id,
                    profile.name
                );
            }
        }
    }

    /// Closes a session (`DELETE`): attributed to its creator. The error is the state it
    /// was already in; its drivers, gate and waiters are freed either way.
    pub fn close(&self, session: &BaeSessionRecord) -> Result<(), BaeError> {
        let record = self.engine_record(&session.id)?;
        let actor = session.creator_key_id.clone();
        let outcome = session::ask(&self.engine.shared, &record, |reply| {
            super::runtime::door_op(BaeOp::Close { reason: CloseReason::ClientClose, actor, reply })
        })?;
        outcome.map_err(BaeError::SessionEnded)
    }

    /// Revokes a client key and its session keys; each session left with no key is closed.
    pub fn revoke_key(&self, id: &str) -> Result<(), BaeError> {
        let write = BaeWrite::RevokeClientKey { id: id.to_string(), at: crate::time::now_rfc3339() };
        match self.engine.shared.store.write(vec![WriteOp::Bae(write)]) {
            Err(crate::store::StoreError::NotFound) => return Err(BaeError::ClientKeyNotFound(id.to_string())),
            other => other?,
        }
        for session_id in self.engine.shared.store.readers().bae_sessions_of_key(id)? {
            let record = self.engine_record(&session_id)?;
            let key = id.to_string();
            session::ask(&self.engine.shared, &record, |reply| super::runtime::door_op(BaeOp::Revoked { key, reply }))?;
        }
        Ok(())
    }

    fn engine_record(&self, id: &str) -> Result<SessionRecord, BaeError> {
        self.engine.shared.store.readers().session(id)?.ok_or_else(|| BaeError::SessionNotFound(id.to_string()))
    }

    pub fn session(&self, id: &str) -> Result<Option<BaeSessionRecord>, BaeError> {
        Ok(self.engine.shared.store.readers().bae_session(id)?)
    }

    pub fn sessions(
        &self,
        after: u64,
        limit: usize,
        state: Option<BaeState>,
    ) -> Result<Page<BaeSessionRecord>, BaeError> {
        Ok(self.engine.shared.store.readers().bae_sessions(after, limit, state)?)
    }

    /// A page of a session's history, oldest first; its `provider.request`s name their stored
    /// messages by id, and the page has those messages once (`LogPage`).
    pub fn events(&self, session_id: &str, after: u64, limit: usize) -> Result<EventsPage, BaeError> {
        let store = &self.engine.shared.store;
        let page = store.readers().bae_events(session_id, BAE_EVENT_KINDS, after, limit)?;
        Ok(EventsPage { events: LogPage::read(page.items, store), next: page.next })
    }

    /// The session's registered drivers, sorted (none when it has no live state).
    pub fn drivers(&self, session_id: &str) -> Result<Vec<String>, BaeError> {
        let record = self.engine_record(session_id)?;
        Ok(session::ask(&self.engine.shared, &record, |reply| super::runtime::door_op(BaeOp::Drivers { reply }))?)
    }

    /// Ends every `session.subscribe` stream of the session.
    pub fn release_streams(&self, session_id: &str) -> Result<(), BaeError> {
        let event = Event::StreamsReleased { session_id: session_id.to_string() };
        self.engine.shared.bus.publish(Some(BAE_TENANT), event);
        Ok(())
    }

    /// The session a logged event belongs to.
    pub fn event_session(&self, seq: u64) -> Option<String> {
        self.engine.shared.store.readers().event_session(seq).ok().flatten()
    }

    /// Sends an RPC operation to the session's actor.
    pub fn op(&self, session_id: &str, op: BaeOp) -> Result<(), BaeError> {
        let record = self.engine_record(session_id)?;
        session::Registry::send(&self.engine.shared, &record, super::runtime::door_op(op))?;
        Ok(())
    }

    /// Whether a token is an active session key of `session_id`; 401 otherwise (a session
    /// that does not exist included).
    pub fn authorize_session(&self, token: &str, session_id: &str) -> Result<(KeyRecord, BaeSessionRecord), BaeError> {
        let key = self.session_key(token, session_id)?;
        let session = self.session(session_id)?.ok_or(BaeError::Unauthorized(Denied::SessionKey))?;
        Ok((key, session))
    }
}

/// Reserved names, then the allowlist (client tools only), then subagent declarations.
fn check_tools(profile: &ProfileRecord, attach: &Attach) -> Result<(), BaeError> {
    if attach.tools.iter().chain(&attach.sandbox_tools).any(|t| t.name == RESERVED_TOOL)
        || attach.subagent_tools.iter().any(|t| t.name == RESERVED_TOOL)
    {
        return Err(BaeError::ReservedToolName);
    }
    if let Some(tool) = attach.tools.iter().find(|tool| !profile.allows(&tool.name)) {
        return Err(BaeError::ToolNotAllowed(tool.name.clone()));
    }
    attach.subagent_tools.iter().try_for_each(check_subagent).map_err(BaeError::InvalidSubagentTools)
}

fn check_subagent(decl: &SubagentDecl) -> Result<(), &'static str> {
    if decl.name.trim().is_empty() {
        return Err("tool name must be a non-empty string");
    }
    if decl.image.trim().is_empty() || decl.subagents.is_empty() {
        return Err("image and non-empty subagents are required");
    }
    let mut harnesses = std::collections::HashSet::new();
    for harness in &decl.subagents {
        if harness.harness.trim().is_empty() || !harnesses.insert(harness.harness.as_str()) {
            return Err("harness must be non-empty and unique");
        }
        if harness.prompt_via != "stdin" && harness.prompt_via != "arg" {
            return Err("prompt_via must be \"stdin\" or \"arg\"");
        }
        if harness.command_template.trim().is_empty() {
            return Err("invalid command_template placeholders");
        }
        super::template::compile(&harness.command_template, &harness.prompt_via)?;
        if harness.timeout_secs == Some(0) {
            return Err("timeout_secs must be a positive integer");
        }
    }
    Ok(())
}

/// Declared tools normalized: `{name, description|null, input_schema|{}}`.
fn declared(tools: &[ToolDef]) -> Value {
    Value::Array(
        tools
            .iter()
            .map(|t| json!({ "name": t.name, "description": t.description, "input_schema": t.input_schema.clone().unwrap_or_else(|| json!({})) }))
            .collect(),
    )
}

fn entry(key: &str, value: Value) -> Map<String, Value> {
    let mut map = Map::new();
    map.insert(key.to_string(), value);
    map
}

/// The engine session under a BAE session: the `@bae` tenant, no workspace.
fn engine_session(id: &str, model: &str, now: &str) -> SessionRecord {
    SessionRecord {
        summary: SessionSummary {
            id: id.to_string(),
            title: "BAE session".into(),
            created_at: now.to_string(),
            updated_at: now.to_string(),
            status: SessionStatus::Idle,
            model: model.to_string(),
            message_count: 0,
            workspace: String::new(),
            forked_from: None,
        },
        tenant: BAE_TENANT.to_string(),
        system_prompt: None,
    }
}
