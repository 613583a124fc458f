//! The BAE client API's settings (`[bae]`, and BAE's own environment names), and BAE's config
//! file (`bae-config.toml`) read as it is: its provider entries become Kestrel providers, its
//! MCP servers and telemetry section are kept for the admin API.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{ConfigError, ModelConfig, ProviderConfig, Wire};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct BaeConfig {
    /// The admin API's listen address: loopback only. Empty: no admin API.
    pub admin_addr: String,
    /// Where the admin key minted on first start is written (mode 0600); default
    /// `<data_dir>/admin-key`.
    pub admin_key_file: Option<PathBuf>,
    /// Serve the admin API with no key at all: local development only.
    pub dangerously_disable_admin_auth: bool,
    /// How long a turn paused for client tools belongs to its driver; after it, the next
    /// driver to send reclaims the turn.
    pub turn_timeout_secs: u64,
    /// Provider calls one BAE turn may make.
    pub loop_limit: u32,
    /// A BAE config file whose providers and MCP servers this server serves.
    pub config_file: Option<PathBuf>,
    /// Remote sandboxes: "local" (a private directory, bubblewrap when it works) or "docker".
    pub sandbox_driver: String,
    /// How long one `execRemoteSandbox` command may run (BAE has no limit).
    pub sandbox_exec_timeout_secs: u64,
    /// The most bytes of each output stream (stdout, stderr) one `execRemoteSandbox` command
    /// or sandbox tool call keeps; the rest is read and dropped, and the result says
    /// `truncated`.
    pub sandbox_output_limit_bytes: usize,
    /// The container CLI the docker driver runs: `docker` from PATH unless set (a path, or
    /// another CLI with docker's commands, such as `podman`).
    pub docker_cli: PathBuf,
    /// How long a remote subagent may run when its declaration sets no `timeout_secs`.
    pub subagent_timeout_secs: u64,
    /// Remote subagents one session may have running at once.
    pub max_subagents_per_session: usize,
    /// Permission rules for BAE sessions only: the `@bae` tenant's, beside the server's
    /// `[[agent.rules]]` (docs/permissions.md, "BAE sessions").
    pub rules: Vec<crate::policy::RuleSpec>,
    /// `--rotate-admin-key`: revoke the admin key and mint a new one at start.
    #[serde(skip)]
    pub rotate_admin_key: bool,
    /// What `config_file` holds beyond its providers, for `GET /admin/v1/config`.
    #[serde(skip)]
    pub file: BaeFile,
}

impl Default for BaeConfig {
    fn default() -> Self {
        BaeConfig {
            admin_addr: "127.0.0.1:8081".into(),
            admin_key_file: None,
            dangerously_disable_admin_auth: false,
            turn_timeout_secs: 120,
            loop_limit: 8,
            config_file: None,
            sandbox_driver: "local".into(),
            sandbox_exec_timeout_secs: 300,
            sandbox_output_limit_bytes: 1024 * 1024,
            docker_cli: PathBuf::from("docker"),
            subagent_timeout_secs: 600,
            max_subagents_per_session: 8,
            rules: Vec::new(),
            rotate_admin_key: false,
            file: BaeFile::default(),
        }
    }
}

impl BaeConfig {
    /// `KESTREL_ADMIN_ADDR` and BAE's names for the same settings (the Kestrel name wins).
    pub(super) fn apply_env(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        if let Some(addr) = env("KESTREL_ADMIN_ADDR").or_else(|| env("BAE_ADMIN_ADDR")) {
            self.admin_addr = addr;
        }
        if let Some(path) = env("KESTREL_ADMIN_KEY_FILE").or_else(|| env("BAE_ADMIN_KEY_FILE")) {
            self.admin_key_file = Some(path.into());
        }
        if let Some(flag) = env("BAE_DANGEROUSLY_DISABLE_ADMIN_AUTH") {
            self.dangerously_disable_admin_auth = matches!(flag.trim().to_ascii_lowercase().as_str(), "1" | "true");
        }
        if let Some(secs) = env("BAE_TURN_TIMEOUT") {
            self.turn_timeout_secs = number("BAE_TURN_TIMEOUT", &secs)?;
        }
        if let Some(path) = env("BAE_CONFIG") {
            self.config_file = Some(path.into());
        }
        if let Some(driver) = env("BAE_SANDBOX_DRIVER") {
            self.sandbox_driver = driver.trim().to_ascii_lowercase();
        }
        if let Some(secs) = env("BAE_SUBAGENT_TIMEOUT") {
            self.subagent_timeout_secs = number("BAE_SUBAGENT_TIMEOUT", &secs)?;
        }
        if let Some(max) = env("BAE_MAX_SUBAGENTS_PER_SESSION") {
            self.max_subagents_per_session = number("BAE_MAX_SUBAGENTS_PER_SESSION", &max)?;
        }
        Ok(())
    }

    /// Where the admin key goes.
    pub fn admin_key_path(&self, data_dir: &Path) -> PathBuf {
        self.admin_key_file.clone().unwrap_or_else(|| data_dir.join("admin-key"))
    }
}

/// A whole number from an environment variable.
fn number<T: std::str::FromStr<Err = std::num::ParseIntError>>(
    name: &'static str,
    text: &str,
) -> Result<T, ConfigError> {
    text.trim().parse().map_err(|e: std::num::ParseIntError| ConfigError::Env(name, e.to_string()))
}

/// `bae-config.toml`: unknown top-level keys are ignored, unknown keys inside a section are
/// refused (provider entries excepted), as BAE does.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct BaeFile {
    #[serde(default)]
    pub mcp: McpSection,
    #[serde(default)]
    pub providers: ProvidersSection,
    #[serde(default)]
    pub telemetry: Option<TelemetrySection>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct McpSection {
    #[serde(default)]
    pub servers: Vec<McpServer>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum McpTransport {
    Stdio,
    Sse,
    Http,
}

impl McpTransport {
    pub fn as_str(self) -> &'static str {
        match self {
            McpTransport::Stdio => "stdio",
            McpTransport::Sse => "sse",
            McpTransport::Http => "http",
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct McpServer {
    pub name: String,
    pub transport: McpTransport,
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub url: Option<String>,
    /// Values may hold `${VAR}`; they are resolved at use and never shown.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// A stdio server's environment beyond the scrubbed minimum (`PATH`, `HOME`, the locale):
    /// values may hold `${VAR}`, resolved at connection and never shown.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Kestrel sessions only: who shares one connection (BAE sessions always get their own).
    #[serde(default)]
    pub scope: McpScope,
    /// How long one tool call may take, in seconds (30, as in BAE, when not set).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

impl McpServer {
    /// How long one tool call on it may take.
    pub fn call_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.timeout_secs.unwrap_or(30).max(1))
    }
}

impl McpServer {
    /// A stdio server running `command` with `args`, nothing else set.
    pub fn stdio(name: &str, command: &str, args: Vec<String>) -> McpServer {
        McpServer {
            name: name.to_string(),
            transport: McpTransport::Stdio,
            command: Some(command.to_string()),
            args,
            url: None,
            headers: BTreeMap::new(),
            env: BTreeMap::new(),
            scope: McpScope::default(),
            timeout_secs: None,
        }
    }

    /// A Streamable HTTP server at `url`, nothing else set.
    pub fn http(name: &str, url: &str) -> McpServer {
        McpServer {
            transport: McpTransport::Http,
            command: None,
            url: Some(url.to_string()),
            ..McpServer::stdio(name, "", Vec::new())
        }
    }
}

/// Which Kestrel sessions share one connection to an MCP server (and the state a server keeps
/// between calls): all of them, those of one tenant, or none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum McpScope {
    Server,
    #[default]
    Tenant,
    Session,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProvidersSection {
    #[serde(default)]
    pub entries: Vec<ProviderEntry>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct ProviderEntry {
    pub name: String,
    pub provider: Wire,
    pub model: String,
    /// May hold `${VAR}`, resolved at each call and never stored or logged.
    #[serde(default)]
    pub auth_token: Option<String>,
    #[serde(default)]
    pub base_url: Option<String>,
    #[serde(default)]
    pub max_tokens: Option<u32>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySection {
    #[serde(default)]
    pub enabled: bool,
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
    #[serde(default)]
    pub otlp_headers: Option<BTreeMap<String, String>>,
    #[serde(default = "one")]
    pub sample_ratio: f64,
    #[serde(default)]
    pub service_name: Option<String>,
    #[serde(default)]
    pub traces: Switch,
    #[serde(default)]
    pub metrics: Metrics,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Switch {
    #[serde(default = "yes")]
    pub enabled: bool,
}

impl Default for Switch {
    fn default() -> Self {
        Switch { enabled: true }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Metrics {
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default)]
    pub disabled: Vec<String>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics { enabled: true, disabled: Vec::new() }
    }
}

fn one() -> f64 {
    1.0
}

fn yes() -> bool {
    true
}

/// BAE's default `max_tokens` for a provider entry.
const DEFAULT_MAX_TOKENS: u32 = 4096;

impl BaeFile {
    /// Reads and checks a BAE config file.
    pub fn read(path: &Path) -> Result<BaeFile, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read(path.into(), e))?;
        let file: BaeFile = toml::from_str(&text).map_err(|e| ConfigError::Parse(path.into(), e.to_string()))?;
        file.check().map_err(|why| ConfigError::Parse(path.into(), why))?;
        Ok(file)
    }

    fn check(&self) -> Result<(), String> {
        let mut seen = std::collections::HashSet::new();
        for server in &self.mcp.servers {
            if server.name.trim().is_empty() || !seen.insert(server.name.as_str()) {
                return Err(format!("mcp.servers: name {:?} is blank or repeated", server.name));
            }
            let ok = match server.transport {
                McpTransport::Stdio => server.command.as_deref().is_some_and(|c| !c.trim().is_empty()),
                McpTransport::Sse | McpTransport::Http => server.url.as_deref().is_some_and(|u| !u.trim().is_empty()),
            };
            if !ok {
                return Err(format!("mcp server {:?}: stdio needs a command, sse and http a url", server.name));
            }
        }
        let mut seen = std::collections::HashSet::new();
        for entry in &self.providers.entries {
            if entry.name.trim().is_empty() || !seen.insert(entry.name.as_str()) {
                return Err(format!("providers.entries: name {:?} is blank or repeated", entry.name));
            }
        }
        Ok(())
    }

    /// Each provider entry as a Kestrel provider of one model, under the entry's name.
    pub fn providers(&self) -> Vec<(String, ProviderConfig)> {
        self.providers.entries.iter().map(|entry| (entry.name.clone(), entry.to_provider())).collect()
    }
}

impl ProviderEntry {
    fn to_provider(&self) -> ProviderConfig {
        let default_base = match self.provider {
            Wire::Anthropic => "https://api.anthropic.com",
            Wire::Openai => "https://api.openai.com",
        };
        // BAE's base URLs stop before the version segment; Kestrel's include it.
        let base = self.base_url.as_deref().unwrap_or(default_base).trim_end_matches('/');
        let mut provider = ProviderConfig::new(self.provider, format!("{base}/v1"));
        provider.api_key_template = self.auth_token.clone();
        // BAE makes one attempt per provider: a provider of its own config file keeps that
        // (those of Kestrel's `[providers]` retry, in both doors).
        provider.max_retries = 0;
        provider.models = vec![ModelConfig {
            max_tokens: Some(self.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)),
            ..ModelConfig::named(&self.model)
        }];
        provider
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bae_config_file_becomes_providers_of_one_model() {
        let file: BaeFile = toml::from_str(
            r#"
            unknown_top_level = 1
            [[providers.entries]]
            name = "anthropic-sonnet"
            provider = "anthropic"
            model = "claude-sonnet-4-6"
            auth_token = "${ANTHROPIC_API_KEY}"
            [[providers.entries]]
            name = "gw"
            provider = "openai"
            model = "gpt-x"
            base_url = "http://127.0.0.1:9/"
            max_tokens = 100
            [[mcp.servers]]
            name = "fs"
            transport = "stdio"
            command = "npx"
            "#,
        )
        .unwrap();
        file.check().unwrap();
        let providers = file.providers();
        assert_eq!(providers[0].0, "anthropic-sonnet");
        assert_eq!(providers[0].1.base_url, "https://api.anthropic.com/v1");
        assert_eq!(providers[0].1.api_key_template.as_deref(), Some("${ANTHROPIC_API_KEY}"));
        assert_eq!(providers[0].1.models[0].max_tokens, Some(4096));
        assert_eq!(providers[1].1.base_url, "http://127.0.0.1:9/v1");
        assert_eq!(providers[1].1.models[0].max_tokens, Some(100));
        let bad: BaeFile = toml::from_str("[[mcp.servers]]\nname = \"x\"\ntransport = \"http\"\n").unwrap();
        assert!(bad.check().is_err());
        assert!(toml::from_str::<BaeFile>("[mcp]\nnope = 1\n").is_err());
    }

    /// `[bae] rules` are the `@bae` tenant's config rules, listed for it alone; a bad pattern
    /// fails the start like any rule's.
    #[test]
    fn bae_rules_are_the_bae_tenant_s_config_rules() {
        let text = "[bae]\nrules = [{ tool = \"sandbox__*\", match = \"rm *\", outcome = \"deny\" }]\n";
        let config: crate::config::Config = toml::from_str(text).unwrap();
        let book = config.rulebook().unwrap();
        let ids: Vec<String> = book.config_rules(crate::store::BAE_TENANT).map(|r| r.id.clone()).collect();
        assert_eq!(ids, ["config:@bae:0"]);
        assert_eq!(book.config_rules("acme").count(), 0, "no other tenant holds them");
        let bad = "[bae]\nrules = [{ tool = \"[\", outcome = \"deny\" }]\n";
        assert!(toml::from_str::<crate::config::Config>(bad).unwrap().rulebook().is_err());
    }
}
