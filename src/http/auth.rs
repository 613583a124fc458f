//! Bearer tokens and the tenants they admit.
//!
//! Pure logic, used on request threads. Every candidate token is compared in full, in
//! constant time, so the time an answer takes says nothing about how close a guess was.

use crate::config::TenantToken;

pub struct TokenSet {
    tokens: Vec<TenantToken>,
}

impl TokenSet {
    pub fn new(tokens: Vec<TenantToken>) -> TokenSet {
        TokenSet { tokens }
    }

    /// True when no token is configured: every request is the default tenant's.
    pub fn is_open(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The tenant a presented token belongs to.
    pub fn tenant_for(&self, presented: &str) -> Option<&str> {
        let mut found = None;
        for candidate in &self.tokens {
            // No early exit: every token is compared whatever matched before.
            if constant_time_eq(candidate.token.as_bytes(), presented.as_bytes()) {
                found = Some(candidate.tenant.as_str());
            }
        }
        found
    }
}

/// Compares two byte strings in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut difference = (a.len() ^ b.len()) as u64;
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        difference |= u64::from(x ^ y);
    }
    difference == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_only_the_whole_token() {
        let set = TokenSet::new(vec![
            TenantToken { tenant: "a".into(), token: "secret-a".into() },
            TenantToken { tenant: "b".into(), token: "secret-b".into() },
        ]);
        assert_eq!(set.tenant_for("secret-b"), Some("b"));
        assert_eq!(set.tenant_for("secret-"), None);
        assert_eq!(set.tenant_for("secret-bb"), None);
        assert_eq!(set.tenant_for(""), None);
        assert!(!set.is_open());
    }
}
