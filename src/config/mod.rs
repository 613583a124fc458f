//! Configuration: defaults, an optional TOML file, then environment overrides.
//!
//! Loaded once on the main thread before anything starts; read-only afterwards. Secrets
//! (tokens) are never serialized: `sanitized()` is what `GET /api/config` shows.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::engine::tools::Permission;

mod auth;
pub mod bae;
mod cluster;
mod providers;
mod schedules;
mod store;
mod webhooks;
pub use auth::{AuthConfig, TenantSandbox, TenantToken, TokenConfig};
pub use bae::BaeConfig;
pub use cluster::ClusterConfig;
pub use providers::{ModelConfig, ProviderConfig, Wire};
pub use schedules::SchedulesConfig;
pub use store::StoreConfig;
pub use webhooks::{EndpointConfig, WebhooksConfig};

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub auth: AuthConfig,
    pub agent: AgentConfig,
    pub builtin: BuiltinConfig,
    /// Model providers by name; a model's id is `<provider>/<model name>`.
    pub providers: BTreeMap<String, ProviderConfig>,
    /// The BAE client API.
    pub bae: BaeConfig,
    /// Workspace snapshots.
    pub checkpoints: crate::checkpoints::CheckpointConfig,
    /// Plugins: where they live, and whether their web assets are watched.
    pub plugins: crate::plugins::PluginConfig,
    /// MCP servers whose tools Kestrel sessions get (BAE profiles may name them too).
    pub mcp: bae::McpSection,
    /// Webhook deliveries, and the config file's endpoints.
    pub webhooks: webhooks::WebhooksConfig,
    /// Scheduled runs: how often one may fire.
    pub schedules: schedules::SchedulesConfig,
    /// Where state is kept: the data dir's SQLite file, or a PostgreSQL database.
    pub store: StoreConfig,
    /// Several nodes on one PostgreSQL database.
    pub cluster: ClusterConfig,
    /// The file this config was read from, if any: no workspace may reach it.
    #[serde(skip)]
    pub file: Option<PathBuf>,
    /// The clock schedules fire by: the system's, unless a test moves one by hand.
    #[serde(skip)]
    pub clock: crate::clock::SharedClock,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Listen address; port 0 picks a free port.
    pub addr: String,
    pub data_dir: PathBuf,
    /// Largest request body accepted, in bytes.
    pub body_limit_bytes: usize,
    /// Interval of the `: ping` comment on event streams.
    pub sse_ping_interval_ms: u64,
    /// Envelopes kept in memory for `Last-Event-ID` replay.
    pub replay_buffer: usize,
    /// The most memory those envelopes may hold, in bytes (older ones replay from the log).
    pub replay_buffer_bytes: usize,
    /// Envelopes queued for one stream before it is dropped as too slow.
    pub subscriber_buffer: usize,
    /// Events (all but token deltas) kept in the durable log for replay; older ones are dropped.
    pub event_log_events: u64,
    /// A write to a client that makes no progress for this long fails and ends its thread.
    pub write_timeout_ms: u64,
    /// A request head must arrive whole within this, from its first byte (else 408, closed).
    pub header_timeout_ms: u64,
    /// A request body must arrive whole within this, from the end of its head (else 408).
    pub body_timeout_ms: u64,
    /// An idle keep-alive connection is closed after this long without a new request.
    pub keep_alive_timeout_ms: u64,
    /// Request heads (request line and headers) larger than this are refused with 431.
    pub max_header_bytes: usize,
    /// Connections open at once; 0 derives it from the open-file limit. Past it, a new
    /// connection is answered 503 and closed.
    pub max_connections: usize,
    /// Serve a non-loopback address with no token configured.
    pub allow_unauthenticated: bool,
    /// Host names answered beyond IP literals, `localhost` and the server's own names: exact
    /// names, `.example.com` for a domain and the names under it, `"*"` for any
    /// (`KESTREL_ALLOWED_HOSTS`, comma-separated; docs/security.md).
    pub allowed_hosts: Vec<String>,
    /// Origins of web pages that may call the API besides the server's own
    /// (`KESTREL_ALLOWED_ORIGINS`, comma-separated).
    pub allowed_origins: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// The workspace of sessions created without one; defaults to the start directory.
    pub workspace: Option<PathBuf>,
    /// Directories a session's workspace must be inside (symlinks resolved); empty means just
    /// `workspace` and what is under it.
    pub workspace_roots: Vec<PathBuf>,
    pub default_model: Option<String>,
    /// Provider calls allowed in one run.
    pub max_steps: u32,
    /// Per-tool permission overrides: `run_command = "auto"`, `write_file = "deny"`.
    pub permissions: BTreeMap<String, Permission>,
    /// Permission rules (`[[agent.rules]]`, docs/permissions.md).
    pub rules: Vec<crate::policy::RuleSpec>,
    /// Whether rules' path patterns ignore case (`.ENV` meets a rule on `.env`).
    pub rules_ignore_case: bool,
    /// Days the audit log keeps a decision.
    pub audit_retention_days: u64,
    /// Every tenant's and BAE profile's budget, where its own sets nothing
    /// (docs/permissions.md).
    pub budget: crate::policy::Budget,
    /// run_command's timeout when the call sets none.
    pub command_timeout_secs: u64,
    /// The longest timeout a call may ask for.
    pub command_max_timeout_secs: u64,
    /// Bytes read at most from one file (read_file, edit_file, `GET /file`).
    pub file_read_limit_bytes: usize,
    /// Characters of one tool result sent to the model; the rest is cut with a note.
    pub tool_output_limit_chars: usize,
    /// Past this share of the model's `contextWindow`, a run compacts the history first.
    pub compact_at: f64,
    /// The most recent turns a compaction keeps as they are.
    pub compaction_keep_turns: usize,
    /// How `run_command`'s commands are contained (docs/sandbox.md); a tenant's token may
    /// set its own.
    pub sandbox: crate::domain::SandboxMode,
    /// Whether a sandboxed command may use the network.
    pub sandbox_network: bool,
    /// The bubblewrap program sandboxed commands run under (a name looked up on `PATH`, or a
    /// path).
    pub sandbox_bwrap: PathBuf,
    /// Sessions one Kestrel tenant may have at once; past it a create, a fork or a
    /// schedule's fire is refused (`429 session_limit`).
    pub max_sessions_per_tenant: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct BuiltinConfig {
    /// Pause before each word `builtin/echo` streams.
    pub delay_ms: u64,
    /// The `contextWindow` `builtin/echo` reports, in tokens (small values make it compact).
    pub context_window: u64,
    /// Prices for `builtin/echo`'s counted tokens, to try cost reporting offline.
    pub pricing: Option<crate::domain::ModelPricing>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            addr: "127.0.0.1:8080".into(),
            data_dir: PathBuf::from("./kestrel-data"),
            body_limit_bytes: 16 * 1024 * 1024,
            sse_ping_interval_ms: 15_000,
            replay_buffer: 10_000,
            replay_buffer_bytes: 64 * 1024 * 1024,
            subscriber_buffer: 4096,
            event_log_events: 1_000_000,
            write_timeout_ms: 30_000,
            header_timeout_ms: 10_000,
            body_timeout_ms: 60_000,
            keep_alive_timeout_ms: 30_000,
            max_header_bytes: 16 * 1024,
            max_connections: 0,
            allow_unauthenticated: false,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
        }
    }
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            workspace: None,
            workspace_roots: Vec::new(),
            default_model: None,
            max_steps: 50,
            permissions: BTreeMap::new(),
            rules: Vec::new(),
            rules_ignore_case: false,
            audit_retention_days: 90,
            budget: Default::default(),
            command_timeout_secs: 120,
            command_max_timeout_secs: 600,
            file_read_limit_bytes: 2 * 1024 * 1024,
            tool_output_limit_chars: 50_000,
            compact_at: 0.8,
            compaction_keep_turns: 2,
            sandbox: crate::domain::SandboxMode::WorkspaceWrite,
            sandbox_network: false,
            sandbox_bwrap: PathBuf::from("bwrap"),
            max_sessions_per_tenant: 10_000,
        }
    }
}

impl Default for BuiltinConfig {
    fn default() -> Self {
        BuiltinConfig { delay_ms: 15, context_window: 1_000_000, pricing: None }
    }
}

#[derive(Debug)]
pub enum ConfigError {
    Read(PathBuf, std::io::Error),
    Parse(PathBuf, String),
    Env(&'static str, String),
    /// A token entry whose secret could not be found.
    MissingToken(String),
    /// A setting that cannot be served as given.
    Invalid(String),
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::Read(path, error) => {
                write!(f, "cannot read config {}: {error}", path.display())
            }
            ConfigError::Parse(path, error) => {
                write!(f, "invalid config {}: {error}", path.display())
            }
            ConfigError::Env(name, error) => write!(f, "invalid {name}: {error}"),
            ConfigError::MissingToken(tenant) => {
                write!(f, "auth token for tenant `{tenant}` is empty or its token_env variable is unset")
            }
            ConfigError::Invalid(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// The variables a `${VAR}` template names.
pub fn template_vars(template: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = template;
    while let Some(start) = rest.find("${") {
        let Some(end) = rest[start + 2..].find('}') else { break };
        names.push(rest[start + 2..start + 2 + end].to_string());
        rest = &rest[start + 3 + end..];
    }
    names
}

/// Why a `${VAR}` template did not resolve (never a value, only a name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateError {
    Unterminated,
    Unset(String),
}

impl std::fmt::Display for TemplateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TemplateError::Unterminated => write!(f, "unterminated ${{ in a token template"),
            TemplateError::Unset(name) => write!(f, "environment variable {name} is not set"),
        }
    }
}

impl std::error::Error for TemplateError {}

/// Resolves every `${NAME}` of a template from `env`; `$` not followed by `{` is literal.
/// An unterminated `${` or an unset variable is an error naming it (never its value).
pub fn resolve_template(template: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, TemplateError> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start + 2..].find('}') else {
            return Err(TemplateError::Unterminated);
        };
        let name = &rest[start + 2..start + 2 + end];
        match env(name) {
            Some(value) => out.push_str(&value),
            None => return Err(TemplateError::Unset(name.to_string())),
        }
        rest = &rest[start + 3 + end..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The tenant of every session when auth is off, and of `auth.token` / `KESTREL_TOKEN`.
pub const DEFAULT_TENANT: &str = "default";

impl Config {
    /// Reads the file (if any), then applies `KESTREL_*` overrides from `env`.
    pub fn load(path: Option<&Path>, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let mut config = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read(path.into(), e))?;
                let mut config: Config =
                    toml::from_str(&text).map_err(|e| ConfigError::Parse(path.into(), e.to_string()))?;
                config.file = Some(path.to_path_buf());
                config
            }
            None => Config::default(),
        };
        config.apply_env(env)?;
        config.bae.apply_env(env)?;
        config.read_bae_file()?;
        config.check()?;
        Ok(config)
    }

    /// Reads `bae.config_file`: its provider entries join `providers` (a name already there
    /// is an error), the rest is kept for the admin API.
    fn read_bae_file(&mut self) -> Result<(), ConfigError> {
        let Some(path) = self.bae.config_file.clone() else { return Ok(()) };
        let file = bae::BaeFile::read(&path)?;
        for (name, provider) in file.providers() {
            if self.providers.contains_key(&name) {
                return Err(ConfigError::Invalid(format!(
                    "provider `{name}` of {} is also configured in [providers]",
                    path.display()
                )));
            }
            self.providers.insert(name, provider);
        }
        self.bae.file = file;
        Ok(())
    }

    /// What cannot be served as configured.
    fn check(&self) -> Result<(), ConfigError> {
        // `@` starts the BAE door's own tenant; no configured tenant may look like it.
        if let Some(token) = self.auth.tokens.iter().find(|t| t.tenant.starts_with('@') || t.tenant.is_empty()) {
            return Err(ConfigError::Invalid(format!("tenant name {:?} is empty or starts with `@`", token.tenant)));
        }
        self.rulebook()?;
        let budgets =
            std::iter::once(&self.agent.budget).chain(self.auth.tokens.iter().filter_map(|t| t.budget.as_ref()));
        for budget in budgets {
            budget.check().map_err(|why| ConfigError::Invalid(format!("budget: {why}")))?;
        }
        self.auth.tenant_sandboxes()?;
        Ok(())
    }

    /// The permission rules of the file, compiled; a rule whose pattern does not compile is
    /// an error at start.
    pub fn rulebook(&self) -> Result<crate::policy::Rulebook, ConfigError> {
        let matching = crate::policy::Matching { paths_ignore_case: self.agent.rules_ignore_case };
        let mut tenants: Vec<(String, Vec<crate::policy::RuleSpec>)> =
            self.auth.tokens.iter().map(|t| (t.tenant.clone(), t.rules.clone())).collect();
        // BAE sessions' own rules, as their tenant's (no token can name it).
        tenants.push((crate::store::BAE_TENANT.to_string(), self.bae.rules.clone()));
        crate::policy::Rulebook::new(matching, &self.agent.rules, &tenants)
            .map_err(|error| ConfigError::Invalid(format!("permission rule: {error}")))
    }

    /// The admin API's address, if it is served; only a loopback address is accepted.
    pub fn admin_addr(&self) -> Result<Option<SocketAddr>, ConfigError> {
        let text = self.bae.admin_addr.trim();
        if text.is_empty() {
            return Ok(None);
        }
        let addr: SocketAddr = text
            .parse()
            .map_err(|_| ConfigError::Invalid(format!("admin address {text:?} is not an IP:port literal")))?;
        if !addr.ip().is_loopback() {
            return Err(ConfigError::Invalid(format!(
                "admin address {addr} is not a loopback address; the admin API never leaves the host"
            )));
        }
        Ok(Some(addr))
    }

    fn apply_env(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        // BAE's name for the client port, for a BAE deployment's environment (ours wins).
        if let Some(addr) = env("KESTREL_ADDR").or_else(|| env("BAE_ADDR")) {
            self.server.addr = addr;
        }
        if let Some(url) = env("KESTREL_DATABASE_URL").filter(|url| !url.is_empty()) {
            self.store.url = Some(url);
        }
        if let Some(secret) = env("KESTREL_CLUSTER_SECRET").filter(|secret| !secret.is_empty()) {
            self.cluster.secret = Some(secret);
        }
        let list = |text: String| text.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
        if let Some(hosts) = env("KESTREL_ALLOWED_HOSTS") {
            self.server.allowed_hosts = list(hosts);
        }
        if let Some(origins) = env("KESTREL_ALLOWED_ORIGINS") {
            self.server.allowed_origins = list(origins);
        }
        if let Some(dir) = env("KESTREL_DATA_DIR") {
            self.server.data_dir = dir.into();
        }
        if let Some(workspace) = env("KESTREL_WORKSPACE") {
            self.agent.workspace = Some(workspace.into());
        }
        if let Some(token) = env("KESTREL_TOKEN").filter(|t| !t.is_empty()) {
            self.auth.token = Some(token);
        }
        if let Some(model) = env("KESTREL_DEFAULT_MODEL") {
            self.agent.default_model = Some(model);
        }
        self.add_env_providers(env);
        if let Some(delay) = env("KESTREL_BUILTIN_DELAY_MS") {
            self.builtin.delay_ms = delay
                .parse()
                .map_err(|e: std::num::ParseIntError| ConfigError::Env("KESTREL_BUILTIN_DELAY_MS", e.to_string()))?;
        }
        Ok(())
    }

    /// `OPENAI_API_KEY` / `ANTHROPIC_API_KEY` (with their `*_BASE_URL`) register a provider
    /// named `openai` / `anthropic` with a few current models, unless the config already
    /// declares a provider of that name.
    fn add_env_providers(&mut self, env: &dyn Fn(&str) -> Option<String>) {
        let vendors = [
            ("openai", Wire::Openai, "OPENAI", "https://api.openai.com/v1", &["gpt-5", "gpt-5-mini", "gpt-4.1"][..]),
            (
                "anthropic",
                Wire::Anthropic,
                "ANTHROPIC",
                "https://api.anthropic.com/v1",
                &["claude-sonnet-4-5", "claude-opus-4-1", "claude-haiku-4-5"][..],
            ),
        ];
        for (name, wire, prefix, default_url, models) in vendors {
            let Some(key) = env(&format!("{prefix}_API_KEY")).filter(|k| !k.is_empty()) else {
                continue;
            };
            if self.providers.contains_key(name) {
                continue;
            }
            let base_url = env(&format!("{prefix}_BASE_URL")).unwrap_or_else(|| default_url.to_string());
            let mut provider = ProviderConfig::new(wire, base_url);
            provider.api_key_env = Some(format!("{prefix}_API_KEY"));
            provider.api_key = Some(key);
            provider.models = models
                .iter()
                .map(|model| ModelConfig {
                    supports_reasoning: wire == Wire::Anthropic || model.starts_with("gpt-5"),
                    ..ModelConfig::named(*model)
                })
                .collect();
            self.providers.insert(name.to_string(), provider);
        }
    }

    /// Environment variables that hold secrets: tokens and provider keys. Commands the agent
    /// runs never see them.
    pub fn secret_env_names(&self) -> Vec<String> {
        let mut names: Vec<String> =
            ["KESTREL_TOKEN", "OPENAI_API_KEY", "ANTHROPIC_API_KEY"].iter().map(|s| s.to_string()).collect();
        names.extend(self.auth.tokens.iter().filter_map(|t| t.token_env.clone()));
        names.extend(self.providers.values().filter_map(|p| p.api_key_env.clone()));
        names.extend(self.providers.values().filter_map(|p| p.api_key_template.as_deref()).flat_map(template_vars));
        names.sort();
        names.dedup();
        names
    }

    /// Tenants with workspace roots of their own.
    pub fn tenant_workspace_roots(&self) -> Vec<(String, Vec<PathBuf>)> {
        self.auth.tokens.iter().filter_map(|t| Some((t.tenant.clone(), t.workspace_roots.clone()?))).collect()
    }

    /// Every configured token with its tenant, env indirections resolved.
    pub fn tenant_tokens(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<Vec<TenantToken>, ConfigError> {
        let mut tokens = Vec::new();
        if let Some(token) = &self.auth.token {
            // The single token of a one-tenant server is its operator's.
            let name = DEFAULT_TENANT.to_string();
            tokens.push(TenantToken { tenant: DEFAULT_TENANT.into(), token: token.clone(), name, admin: true });
        }
        for entry in &self.auth.tokens {
            let token = entry.token.clone().or_else(|| entry.token_env.as_deref().and_then(env));
            match token.filter(|t| !t.is_empty()) {
                Some(token) => tokens.push(TenantToken {
                    tenant: entry.tenant.clone(),
                    token,
                    name: entry.name.clone().unwrap_or_else(|| entry.tenant.clone()),
                    admin: entry.admin,
                }),
                None => return Err(ConfigError::MissingToken(entry.tenant.clone())),
            }
        }
        Ok(tokens)
    }

    /// The effective config with every secret left out, for `GET /api/config`.
    pub fn sanitized(&self) -> serde_json::Value {
        // Token fields are `skip_serializing`, so plain serialization already drops them;
        // say whether one is set so an operator can still tell.
        let mut value = serde_json::to_value(self).unwrap_or_default();
        if let Some(auth) = value.get_mut("auth").and_then(|a| a.as_object_mut()) {
            auth.insert("tokenConfigured".into(), serde_json::Value::Bool(self.auth.token.is_some()));
        }
        value
    }

    pub fn socket_addr(&self) -> Result<SocketAddr, ConfigError> {
        use std::net::ToSocketAddrs;
        self.server
            .addr
            .to_socket_addrs()
            .map_err(|e| ConfigError::Env("server.addr", e.to_string()))?
            .next()
            .ok_or_else(|| ConfigError::Env("server.addr", "resolves to no address".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_overrides_the_file_and_secrets_stay_out_of_the_sanitized_view() {
        let dir = std::env::temp_dir().join(format!("kestrel-config-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kestrel.toml");
        std::fs::write(
            &path,
            r#"
            [server]
            addr = "127.0.0.1:9000"
            [[auth.tokens]]
            tenant = "acme"
            token = "acme-secret"
            [[auth.tokens]]
            tenant = "globex"
            token_env = "GLOBEX_TOKEN"
            "#,
        )
        .unwrap();
        let env = |name: &str| match name {
            "KESTREL_ADDR" => Some("127.0.0.1:9001".to_string()),
            "KESTREL_TOKEN" => Some("main-secret".to_string()),
            "GLOBEX_TOKEN" => Some("globex-secret".to_string()),
            _ => None,
        };
        let config = Config::load(Some(&path), &env).unwrap();
        assert_eq!(config.server.addr, "127.0.0.1:9001");
        let tokens = config.tenant_tokens(&env).unwrap();
        let tenants: Vec<&str> = tokens.iter().map(|t| t.tenant.as_str()).collect();
        assert_eq!(tenants, ["default", "acme", "globex"]);
        assert_eq!(tokens[2].token, "globex-secret");
        let shown = config.sanitized().to_string();
        assert!(!shown.contains("-secret"), "{shown}");
        assert!(shown.contains("GLOBEX_TOKEN"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn vendor_keys_register_providers_whose_keys_are_never_shown() {
        let env = |name: &str| match name {
            "OPENAI_API_KEY" => Some("sk-openai-secret".to_string()),
            "ANTHROPIC_API_KEY" => Some("sk-ant-secret".to_string()),
            "ANTHROPIC_BASE_URL" => Some("http://127.0.0.1:9/v1".to_string()),
            _ => None,
        };
        let config = Config::load(None, &env).unwrap();
        assert_eq!(config.providers["openai"].wire, Wire::Openai);
        assert_eq!(config.providers["openai"].base_url, "https://api.openai.com/v1");
        assert_eq!(config.providers["anthropic"].base_url, "http://127.0.0.1:9/v1");
        assert_eq!(config.providers["anthropic"].api_key.as_deref(), Some("sk-ant-secret"));
        assert!(!config.providers["openai"].models.is_empty());
        let shown = config.sanitized().to_string();
        assert!(!shown.contains("-secret"), "{shown}");
        assert!(shown.contains("OPENAI_API_KEY"), "the variable's name is shown: {shown}");
    }

    #[test]
    fn bae_environment_names_apply_and_kestrel_names_win() {
        let bae_only = |name: &str| match name {
            "BAE_ADDR" => Some("127.0.0.1:9100".to_string()),
            "BAE_ADMIN_ADDR" => Some("127.0.0.1:9101".to_string()),
            "BAE_ADMIN_KEY_FILE" => Some("/tmp/bae-admin-key".to_string()),
            "BAE_TURN_TIMEOUT" => Some("7".to_string()),
            "BAE_DANGEROUSLY_DISABLE_ADMIN_AUTH" => Some("true".to_string()),
            "BAE_SANDBOX_DRIVER" => Some(" Docker ".to_string()),
            _ => None,
        };
        let config = Config::load(None, &bae_only).unwrap();
        assert_eq!(config.server.addr, "127.0.0.1:9100");
        assert_eq!(config.bae.admin_addr, "127.0.0.1:9101");
        assert_eq!(config.bae.admin_key_file.as_deref(), Some(Path::new("/tmp/bae-admin-key")));
        assert_eq!(config.bae.turn_timeout_secs, 7);
        assert!(config.bae.dangerously_disable_admin_auth);
        assert_eq!(config.bae.sandbox_driver, "docker");
        let both = |name: &str| match name {
            "KESTREL_ADDR" => Some("127.0.0.1:9200".to_string()),
            "KESTREL_ADMIN_ADDR" => Some("127.0.0.1:9201".to_string()),
            other => bae_only(other),
        };
        let config = Config::load(None, &both).unwrap();
        assert_eq!((config.server.addr.as_str(), config.bae.admin_addr.as_str()), ("127.0.0.1:9200", "127.0.0.1:9201"));
        let bad = |name: &str| (name == "BAE_TURN_TIMEOUT").then(|| "soon".to_string());
        assert!(Config::load(None, &bad).is_err());
    }

    #[test]
    fn an_unknown_key_is_an_error() {
        let error = toml::from_str::<Config>("[server]\nadress = 1").unwrap_err();
        assert!(error.to_string().contains("adress"));
    }
}
