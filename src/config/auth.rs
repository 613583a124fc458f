//! `[auth]`: the tokens that admit tenants, each with its name, its roots, its rules and its
//! budget, and a token as the server holds it once resolved.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// A single token for the `default` tenant.
    #[serde(skip_serializing)]
    pub token: Option<String>,
    pub tokens: Vec<TokenConfig>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    pub tenant: String,
    #[serde(default, skip_serializing)]
    pub token: Option<String>,
    /// The name of an environment variable holding the token.
    #[serde(default)]
    pub token_env: Option<String>,
    /// Directories this tenant's sessions may work in, replacing `agent.workspace_roots`.
    #[serde(default)]
    pub workspace_roots: Option<Vec<PathBuf>>,
    /// What the audit log names this token by; the tenant when unset.
    #[serde(default)]
    pub name: Option<String>,
    /// Whether the token may also read every tenant's audit log (`GET /api/audit`).
    #[serde(default)]
    pub admin: bool,
    /// This tenant's budget, over `[agent.budget]` field by field.
    #[serde(default)]
    pub budget: Option<crate::policy::Budget>,
    /// Permission rules of this tenant: they add to the server's and never weaken them.
    #[serde(default)]
    pub rules: Vec<crate::policy::RuleSpec>,
}

impl TokenConfig {
    /// A tenant with its token given directly and the global workspace roots.
    pub fn new(tenant: impl Into<String>, token: impl Into<String>) -> TokenConfig {
        TokenConfig {
            tenant: tenant.into(),
            token: Some(token.into()),
            token_env: None,
            workspace_roots: None,
            name: None,
            admin: false,
            budget: None,
            rules: Vec::new(),
        }
    }
}

/// A resolved token and the tenant it admits.
#[derive(Clone)]
pub struct TenantToken {
    pub tenant: String,
    pub token: String,
    /// What the audit log calls it.
    pub name: String,
    /// May read every tenant's audit log.
    pub admin: bool,
}

impl std::fmt::Debug for TenantToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TenantToken {{ tenant: {:?}, token: <redacted> }}", self.tenant)
    }
}
