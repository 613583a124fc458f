//! Who is calling: bearer tokens parsed one way for every front door, compared in constant
//! time, and the principal a token admits.
//!
//! Pure logic, used on connection threads. A presented token is reduced to its SHA-256 digest
//! once, and that digest is compared with every configured token's, each comparison over the
//! same 32 bytes with no early exit: the time an answer takes says nothing about how close a
//! guess was, nor how long a configured token is.
//! Kestrel's tenant tokens live here; the BAE door's keys (client, session, admin) will add
//! their principals beside them.

pub mod keys;

use crate::config::TenantToken;

/// Why an `Authorization` header gave no token; the messages are BAE's, word for word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BearerError {
    Missing,
    NotBearer,
    Empty,
}

impl std::fmt::Display for BearerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BearerError::Missing => "missing Authorization header",
            BearerError::NotBearer => "Authorization header must be a Bearer token",
            BearerError::Empty => "empty bearer token",
        })
    }
}

/// The token of an `Authorization: Bearer <token>` header (`bearer` is accepted too).
pub fn bearer(header: Option<&str>) -> Result<&str, BearerError> {
    let header = header.ok_or(BearerError::Missing)?;
    let token =
        header.strip_prefix("Bearer ").or_else(|| header.strip_prefix("bearer ")).ok_or(BearerError::NotBearer)?;
    match token.trim() {
        "" => Err(BearerError::Empty),
        token => Ok(token),
    }
}

/// Whom a request acts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// A Kestrel tenant: its sessions, and nobody else's.
    Tenant(String),
}

/// Whom a server with no token serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tokenless {
    /// Only the user the server runs as (and root), on the loopback: the default, so that
    /// another account of the machine cannot drive it (`http::peer`).
    OwnUser,
    /// Anyone who reaches it (`server.allow_unauthenticated`).
    Anyone,
}

pub struct TokenSet {
    tokens: Vec<TenantToken>,
    tokenless: Tokenless,
    /// Each token's SHA-256 digest, in the order of `tokens`: what a presented token is
    /// compared with.
    digests: Vec<[u8; 32]>,
}

impl TokenSet {
    pub fn new(tokens: Vec<TenantToken>) -> TokenSet {
        let digests = tokens.iter().map(|token| digest(&token.token)).collect();
        TokenSet { tokens, digests, tokenless: Tokenless::OwnUser }
    }

    /// The same tokens; with none, serving `whom`.
    pub fn serving(self, whom: Tokenless) -> TokenSet {
        TokenSet { tokenless: whom, ..self }
    }

    /// Whom the server serves when `is_open`.
    pub fn tokenless(&self) -> Tokenless {
        self.tokenless
    }

    /// True when no token is configured: every request is the default tenant's.
    pub fn is_open(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Whom a presented token admits.
    pub fn principal(&self, presented: &str) -> Option<Principal> {
        self.tenant_for(presented).map(|tenant| Principal::Tenant(tenant.to_string()))
    }

    /// The tenant a presented token belongs to.
    pub fn tenant_for(&self, presented: &str) -> Option<&str> {
        self.holder(presented).map(|token| token.tenant.as_str())
    }

    /// The configured token that was presented.
    pub fn holder(&self, presented: &str) -> Option<&TenantToken> {
        let presented = digest(presented);
        let mut found = None;
        for (candidate, candidate_digest) in self.tokens.iter().zip(&self.digests) {
            // No early exit: every token is compared whatever matched before.
            if same_digest(candidate_digest, &presented) {
                found = Some(candidate);
            }
        }
        found
    }
}

fn digest(token: &str) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(token.as_bytes()).into()
}

/// Compares two digests over all their bytes, whatever differs first.
fn same_digest(a: &[u8; 32], b: &[u8; 32]) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_only_the_whole_token() {
        let set = TokenSet::new(vec![
            TenantToken { tenant: "a".into(), token: "secret-a".into(), name: "a".into(), admin: false },
            TenantToken { tenant: "b".into(), token: "secret-b".into(), name: "b".into(), admin: false },
        ]);
        assert_eq!(set.tenant_for("secret-b"), Some("b"));
        assert_eq!(set.tenant_for("secret-"), None);
        assert_eq!(set.tenant_for("secret-bb"), None);
        assert_eq!(set.tenant_for(""), None);
        assert_eq!(set.principal("secret-a"), Some(Principal::Tenant("a".into())));
        assert!(!set.is_open());
    }

    #[test]
    fn bearer_headers_are_parsed_the_one_way() {
        assert_eq!(bearer(Some("Bearer abc")), Ok("abc"));
        assert_eq!(bearer(Some("bearer  abc ")), Ok("abc"));
        assert_eq!(bearer(None), Err(BearerError::Missing));
        assert_eq!(bearer(Some("Basic abc")), Err(BearerError::NotBearer));
        assert_eq!(bearer(Some("BEARER abc")), Err(BearerError::NotBearer));
        assert_eq!(bearer(Some("Bearer")), Err(BearerError::NotBearer));
        assert_eq!(bearer(Some("Bearer   ")), Err(BearerError::Empty));
        assert_eq!(BearerError::Empty.to_string(), "empty bearer token");
    }
}
