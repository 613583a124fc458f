//! The engine's side of the BAE client API: profiles, keys and their checks, BAE sessions and
//! what their actor does for them. The HTTP and JSON-RPC shapes are `api/bae`'s.
//!
//! - `mod.rs`: errors, profiles, keys, the admin key.
//! - `sessions.rs`: open, join, close, revocation, event pages.
//! - `runtime.rs`: what a session actor keeps for BAE (drivers, the turn gate and its FIFO,
//!   a paused turn) and the operations it answers.
//! - `merge.rs`: the resume rules for a paused turn's tool results.
//! - `mcp.rs`: a session's MCP connections and the calls a turn makes on them.
//! - `calls.rs`: the permission step and audit of a turn's server-run calls.

mod calls;
pub mod compaction;
mod gate;
pub mod mcp;
pub mod merge;
mod recovery;
pub mod runtime;
pub mod sandbox;
mod sessions;
pub mod subagent;
mod template;
pub(crate) mod turn;

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use crate::auth::keys::{new_id, write_private, KeyRole, Keyring};
use crate::engine::{Engine, EngineError};
use crate::store::{BaeWrite, KeyRecord, Page, ProfileRecord, StoreError, WriteOp};
pub use merge::MergeError;
pub use recovery::INTERRUPTED_RESULT;
pub use runtime::{BaeOp, Compact, RpcError, SendMessage, Started, UserMessage};
pub use sessions::{Attach, Attached, Compaction, EventView, SubagentDecl, ToolDef, MIN_AUTO_SIZE};

/// The engine's BAE settings.
#[derive(Debug, Clone)]
pub struct BaeSettings {
    pub keyring: Arc<Keyring>,
    /// How long a paused turn belongs to its driver.
    pub turn_timeout: std::time::Duration,
    /// Provider calls one turn may make.
    pub loop_limit: u32,
    /// The configured MCP servers' names.
    pub mcp_servers: Vec<String>,
    /// The configured MCP servers.
    pub mcp_configs: Vec<crate::config::bae::McpServer>,
    /// How a session's stdio MCP servers start (`setpriv` and the spawner thread, so they
    /// die with the server); each gets the session's id as its marker.
    pub mcp_spawning: crate::mcp::Spawning,
    /// Remote sandboxes' driver, and how long one exec may run and how much of its output
    /// is kept.
    pub sandbox: sandbox::SandboxDriver,
    pub sandbox_exec: crate::sandbox::ExecLimits,
    /// How long a remote subagent may run when its declaration says nothing.
    pub subagent_timeout: std::time::Duration,
    /// Remote subagents a session may have running at once.
    pub max_subagents: usize,
}

/// What the BAE door keeps across its sessions: its settings, the sessions' MCP connections,
/// the profiles' sandbox images (made ready in the background) and the sessions' remote
/// subagents. Installed in the engine at start (`Shared::door`).
pub struct BaeShared {
    pub settings: BaeSettings,
    pub(crate) mcp: mcp::McpSessions,
    pub(crate) images: crate::sandbox::provision::Images,
    pub(crate) subagents: subagent::Subagents,
    /// Profiles' budgets as last read, for a second: every request of a profile's keys takes
    /// from its rate limit, and a profile read per request would cost more than the check.
    budgets: std::sync::Mutex<std::collections::HashMap<String, (std::time::Instant, Option<crate::policy::Budget>)>>,
}

/// How long a profile's budget is taken as read (`BaeShared::budgets`); a change made on
/// another node is seen within it.
const BUDGET_FRESH: std::time::Duration = std::time::Duration::from_secs(1);

impl BaeShared {
    pub fn new(settings: BaeSettings) -> BaeShared {
        let images = crate::sandbox::provision::Images::start(Arc::clone(&settings.sandbox.0));
        BaeShared {
            settings,
            mcp: Default::default(),
            images,
            subagents: Default::default(),
            budgets: Default::default(),
        }
    }
}

impl crate::engine::DoorShared for BaeShared {
    /// Subagents are process memory: none outlives the server.
    fn shutdown(&self) {
        self.subagents.abort_all();
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    /// The last holder's unfinished server-run calls are recorded as a restart records them,
    /// and an open session's MCP connections are made here.
    fn taken_over(&self, engine: &Engine, record: &crate::domain::SessionRecord) -> Result<(), EngineError> {
        if record.tenant != crate::store::BAE_TENANT {
            return Ok(());
        }
        let bae = Bae::new(engine.clone());
        bae.recover_calls_of(&record.summary.id)?;
        bae.reconnect_mcp(&record.summary.id).map_err(|error| match error {
            BaeError::Engine(error) => error,
            _ => EngineError::Internal("an open session's MCP servers could not be read"),
        })
    }

    fn keeps(&self, session_id: &str) -> bool {
        self.mcp.has(session_id) || self.subagents.tracks(session_id)
    }

    fn let_go(&self, session_id: &str) {
        self.mcp.disconnect(session_id);
        self.subagents.close(session_id);
    }
}

/// The BAE door over the engine: what its handlers ask (profiles, keys, sessions, their
/// operations and events). The engine's own operations are reached through it too.
#[derive(Clone)]
pub struct Bae {
    pub(crate) engine: Engine,
}

impl Bae {
    pub fn new(engine: Engine) -> Bae {
        Bae { engine }
    }
}

impl std::ops::Deref for Bae {
    type Target = Engine;

    fn deref(&self) -> &Engine {
        &self.engine
    }
}

/// The BAE door's shared state in the engine.
pub(crate) fn bae(shared: &crate::engine::Shared) -> &BaeShared {
    shared.door::<BaeShared>().expect("the BAE door is installed")
}

/// Why a BAE request was refused; `api/bae` gives each its status, slug and wording.
#[derive(Debug)]
pub enum BaeError {
    Unauthorized(Denied),
    ProfileNotFound(String),
    DuplicateProfileName,
    ProfileInUse(u64),
    /// A key's profile is gone (at open or join).
    ProfileUnavailable,
    /// A key cannot be made for a profile that is not active.
    NoActiveProfile(String),
    ClientKeyNotFound(String),
    SessionNotFound(String),
    /// The session is closed or in error.
    SessionEnded(crate::store::BaeState),
    ProfileMismatch,
    ToolNotAllowed(String),
    ReservedToolName,
    InvalidSubagentTools(&'static str),
    PrimaryProviderUnavailable(String),
    Engine(EngineError),
}

/// Which key a 401 was about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    ClientKey,
    SessionKey,
    AdminKey,
}

impl From<StoreError> for BaeError {
    fn from(error: StoreError) -> Self {
        BaeError::Engine(error.into())
    }
}

impl From<EngineError> for BaeError {
    fn from(error: EngineError) -> Self {
        BaeError::Engine(error)
    }
}

/// A profile as the admin writes it.
#[derive(Debug, Clone)]
pub struct ProfileInput {
    pub name: String,
    pub primary_provider: String,
    pub fallback_providers: Vec<String>,
    pub mcp_servers: Vec<String>,
    pub allowed_tools: Vec<Value>,
    pub available_sandboxes: Vec<String>,
    /// Kestrel's extension (`budget`): BAE clients never send it.
    pub budget: Option<crate::policy::Budget>,
}

/// The tool name BAE reserves for remote subagent status.
pub const RESERVED_TOOL: &str = "remote_subagent_status";

impl Bae {
    fn settings(&self) -> &BaeSettings {
        &bae(&self.engine.shared).settings
    }

    pub fn create_profile(&self, input: ProfileInput) -> Result<ProfileRecord, BaeError> {
        let now = crate::time::now_rfc3339();
        let profile = ProfileRecord {
            id: new_id("pro_"),
            name: input.name,
            primary_provider: input.primary_provider,
            fallback_providers: input.fallback_providers,
            mcp_servers: input.mcp_servers,
            allowed_tools: input.allowed_tools,
            available_sandboxes: input.available_sandboxes,
            created_at: now.clone(),
            updated_at: now,
            budget: input.budget,
        };
        self.write(BaeWrite::InsertProfile(profile.clone()))?;
        bae(&self.engine.shared).images.provision(&profile.available_sandboxes);
        Ok(profile)
    }

    /// A profile's allowance (its budget over the server's); a profile that is gone has the
    /// server's. Read at most once a second per profile (`BUDGET_FRESH`), and at once after
    /// this node changed the profile.
    pub fn allowance(&self, profile_id: &str) -> crate::engine::Allowance {
        let shared = bae(&self.engine.shared);
        let cached = {
            let budgets = shared.budgets.lock().unwrap_or_else(|e| e.into_inner());
            budgets.get(profile_id).filter(|(at, _)| at.elapsed() < BUDGET_FRESH).map(|(_, b)| b.clone())
        };
        let budget = match cached {
            Some(budget) => budget,
            None => {
                let read = self.engine.shared.store.readers().bae_profile(profile_id).ok().flatten();
                let budget = read.and_then(|p| p.budget);
                let mut budgets = shared.budgets.lock().unwrap_or_else(|e| e.into_inner());
                if budgets.len() > 10_000 {
                    budgets.clear();
                }
                budgets.insert(profile_id.to_string(), (std::time::Instant::now(), budget.clone()));
                budget
            }
        };
        gate::profile_allowance(&self.engine.shared.config, profile_id, budget)
    }

    /// Forgets a profile's budget as read, after this node changed it.
    fn forget_budget(&self, profile_id: &str) {
        bae(&self.engine.shared).budgets.lock().unwrap_or_else(|e| e.into_inner()).remove(profile_id);
    }

    /// Takes one request from a profile's rate limit, or says how long to wait.
    pub fn admit_request(&self, profile_id: &str) -> Result<(), std::time::Duration> {
        let allowance = self.allowance(profile_id);
        match allowance.budget.requests_per_second {
            Some(_) => self.engine.admit_request(&allowance),
            None => Ok(()),
        }
    }

    pub fn profile(&self, id: &str) -> Result<ProfileRecord, BaeError> {
        self.engine.shared.store.readers().bae_profile(id)?.ok_or_else(|| BaeError::ProfileNotFound(id.to_string()))
    }

    pub fn profiles(&self, after: u64, limit: usize) -> Result<Page<ProfileRecord>, BaeError> {
        Ok(self.engine.shared.store.readers().bae_profiles(after, limit)?)
    }

    pub fn replace_profile(&self, id: &str, input: ProfileInput) -> Result<ProfileRecord, BaeError> {
        let old = self.profile(id)?;
        let profile = ProfileRecord {
            id: old.id,
            name: input.name,
            primary_provider: input.primary_provider,
            fallback_providers: input.fallback_providers,
            mcp_servers: input.mcp_servers,
            allowed_tools: input.allowed_tools,
            available_sandboxes: input.available_sandboxes,
            created_at: old.created_at,
            updated_at: crate::time::now_rfc3339(),
            budget: input.budget,
        };
        self.forget_budget(id);
        match self.write(BaeWrite::ReplaceProfile(profile.clone())) {
            Err(BaeError::Engine(EngineError::Store(StoreError::NotFound))) => {
                Err(BaeError::ProfileNotFound(id.into()))
            }
            other => other.map(|()| {
                bae(&self.engine.shared).images.provision(&profile.available_sandboxes);
                profile
            }),
        }
    }

    pub fn delete_profile(&self, id: &str) -> Result<(), BaeError> {
        self.forget_budget(id);
        match self.write(BaeWrite::DeleteProfile { id: id.to_string(), at: crate::time::now_rfc3339() }) {
            Err(BaeError::Engine(EngineError::Store(StoreError::NotFound))) => {
                Err(BaeError::ProfileNotFound(id.into()))
            }
            Err(BaeError::Engine(EngineError::Store(StoreError::InUse(keys)))) => Err(BaeError::ProfileInUse(keys)),
            other => other,
        }
    }

    /// A new client key for a profile: the record and the plaintext, shown once.
    pub fn create_key(&self, name: &str, profile_id: &str) -> Result<(KeyRecord, String), BaeError> {
        let minted = self.settings().keyring.mint(KeyRole::Client);
        let key = KeyRecord {
            id: new_id("key_"),
            name: name.to_string(),
            role: KeyRole::Client,
            prefix: minted.prefix.clone(),
            profile_id: Some(profile_id.to_string()),
            client_id: None,
            session_id: None,
            created_at: crate::time::now_rfc3339(),
            last_used_at: None,
        };
        match self.write(BaeWrite::InsertKey { key: key.clone(), digest: minted.digest.clone() }) {
            Err(BaeError::Engine(EngineError::Store(StoreError::NotFound))) => {
                Err(BaeError::NoActiveProfile(profile_id.to_string()))
            }
            other => other.map(|()| (key, minted.plaintext)),
        }
    }

    pub fn client_keys(&self, after: u64, limit: usize) -> Result<Page<KeyRecord>, BaeError> {
        Ok(self.engine.shared.store.readers().bae_client_keys(after, limit)?)
    }

    /// The active key of `role` a presented token is. Stamps `last_used_at` without waiting.
    pub fn authenticate(&self, role: KeyRole, token: &str) -> Result<Option<KeyRecord>, BaeError> {
        // A token of another role's shape cannot match; skip the lookup.
        let shaped = token.starts_with(role.prefix())
            && !(role == KeyRole::Client && (token.starts_with("bae_ses_") || token.starts_with("bae_admin_")));
        if !shaped {
            return Ok(None);
        }
        let digest = self.settings().keyring.digest(token);
        let found = self.engine.shared.store.readers().bae_key_by_digest(role, &digest)?;
        if let Some(key) = &found {
            let now = crate::time::now_rfc3339();
            // `last_used_at` to the minute: a session's every call does not cost a write.
            let stale = key.last_used_at.as_deref().is_none_or(|at| at.get(..16) != now.get(..16));
            if stale {
                let touch = BaeWrite::TouchKey { id: key.id.clone(), at: now };
                self.engine.shared.store.write_detached(vec![WriteOp::Bae(touch)])?;
            }
        }
        Ok(found)
    }

    /// The session key a token is, if it was minted for `session_id`.
    pub fn session_key(&self, token: &str, session_id: &str) -> Result<KeyRecord, BaeError> {
        match self.authenticate(KeyRole::Session, token)? {
            Some(key) if key.session_id.as_deref() == Some(session_id) => Ok(key),
            _ => Err(BaeError::Unauthorized(Denied::SessionKey)),
        }
    }

    /// Every name a profile can give as a provider: each model id, and each provider's name
    /// (for its first model), with what it resolves to.
    pub fn providers(&self) -> Vec<(String, crate::providers::Target)> {
        let models = &self.engine.shared.models;
        let mut names = std::collections::BTreeMap::new();
        for info in models.infos() {
            names.entry(info.provider.clone()).or_insert_with(|| info.id.clone());
            names.insert(info.id.clone(), info.id.clone());
        }
        names.into_iter().filter_map(|(name, id)| Some((name, models.route(&id)?.target()))).collect()
    }

    fn write(&self, write: BaeWrite) -> Result<(), BaeError> {
        match self.engine.shared.store.write(vec![WriteOp::Bae(write)]) {
            Err(StoreError::Conflict(_)) => Err(BaeError::DuplicateProfileName),
            other => Ok(other?),
        }
    }

    /// The admin key at start: with auth disabled nothing; `rotate` revokes every admin key and
    /// mints a new one; else a new one is minted only when none is active. A minted key's
    /// plaintext goes to `key_file` (mode 0600) and nowhere else.
    pub fn admin_bootstrap(&self, key_file: &Path, rotate: bool) -> Result<AdminBootstrap, BaeError> {
        if rotate {
            self.write(BaeWrite::RevokeAdminKeys { at: crate::time::now_rfc3339() })?;
        } else if self.engine.shared.store.readers().bae_admin_key_exists()? {
            return Ok(AdminBootstrap::Existing);
        }
        let minted = self.settings().keyring.mint(KeyRole::Admin);
        write_private(key_file, &minted.plaintext)
            .map_err(|e| BaeError::Engine(EngineError::Store(StoreError::Io(e))))?;
        let key = KeyRecord {
            id: new_id("key_"),
            name: "bootstrap-admin".into(),
            role: KeyRole::Admin,
            prefix: minted.prefix.clone(),
            profile_id: None,
            client_id: None,
            session_id: None,
            created_at: crate::time::now_rfc3339(),
            last_used_at: None,
        };
        self.write(BaeWrite::InsertKey { key, digest: minted.digest })?;
        Ok(if rotate { AdminBootstrap::Rotated } else { AdminBootstrap::Minted })
    }
}

/// What the admin key bootstrap did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminBootstrap {
    Existing,
    Minted,
    Rotated,
}
