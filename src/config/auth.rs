//! `[auth]`: the tokens that admit tenants, each with its name, its roots, its rules, its
//! budget and its sandbox, and a token as the server holds it once resolved.

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
    /// How this tenant's commands are contained, in place of `agent.sandbox` (either way:
    /// this is the operator's config, docs/sandbox.md).
    #[serde(default)]
    pub sandbox: Option<crate::domain::SandboxMode>,
    /// Whether this tenant's sandboxed commands may use the network, in place of
    /// `agent.sandbox_network`.
    #[serde(default)]
    pub sandbox_network: Option<bool>,
}

/// A tenant's own sandbox settings, as its tokens set them.
pub type TenantSandbox = (String, Option<crate::domain::SandboxMode>, Option<bool>);

impl AuthConfig {
    /// The tenants whose tokens set `sandbox` or `sandbox_network`, with what they set. Two
    /// tokens of one tenant that set either differently are an error naming the tenant: a
    /// tenant's commands are contained one way, whichever token started the session.
    pub fn tenant_sandboxes(&self) -> Result<Vec<TenantSandbox>, super::ConfigError> {
        let mut found: Vec<TenantSandbox> = Vec::new();
        for token in self.tokens.iter().filter(|t| t.sandbox.is_some() || t.sandbox_network.is_some()) {
            let entry = (token.tenant.clone(), token.sandbox, token.sandbox_network);
            match found.iter().find(|(tenant, ..)| *tenant == token.tenant) {
                Some(seen) if *seen != entry => {
                    return Err(super::ConfigError::Invalid(format!(
                        "the tokens of tenant `{}` set sandbox or sandbox_network differently",
                        token.tenant
                    )));
                }
                Some(_) => {}
                None => found.push(entry),
            }
        }
        Ok(found)
    }
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
            sandbox: None,
            sandbox_network: None,
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

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use crate::domain::SandboxMode;

    #[test]
    fn a_tenant_sets_its_own_sandbox_and_its_tokens_must_agree() {
        let config: Config = toml::from_str(
            r#"
            [agent]
            sandbox = "read-only"
            sandbox_network = true
            [[auth.tokens]]
            tenant = "acme"
            token = "a"
            sandbox = "off"
            [[auth.tokens]]
            tenant = "acme"
            token = "b"
            sandbox = "off"
            [[auth.tokens]]
            tenant = "globex"
            token = "c"
            sandbox_network = false
            [[auth.tokens]]
            tenant = "initech"
            token = "d"
            "#,
        )
        .unwrap();
        assert_eq!((config.agent.sandbox, config.agent.sandbox_network), (SandboxMode::ReadOnly, true));
        assert_eq!(
            config.auth.tenant_sandboxes().unwrap(),
            [("acme".to_string(), Some(SandboxMode::Off), None), ("globex".to_string(), None, Some(false))]
        );
        let mut split = config.clone();
        split.auth.tokens[1].sandbox = Some(SandboxMode::WorkspaceWrite);
        let error = split.auth.tenant_sandboxes().unwrap_err().to_string();
        assert!(error.contains("`acme`"), "{error}");
        assert!(toml::from_str::<Config>("[agent]\nsandbox = \"none\"").is_err(), "an unknown mode is refused");
        assert_eq!(Config::default().agent.sandbox, SandboxMode::WorkspaceWrite, "sandboxed by default");
    }
}
