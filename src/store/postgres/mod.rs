//! PostgreSQL, the second store (issue 23, under way): connecting with a URL whose password
//! never reaches a message, and the versioned schema applied under an advisory lock
//! (`migrate.rs`), so several processes starting at once apply each version once. The
//! `postgres` crate is a synchronous client over an internal single-threaded tokio runtime
//! of its own (README: "no async runtime" is said with that caveat).
//!
//! The backend itself (the store traits over this schema) is not here yet; nothing selects
//! PostgreSQL at start until it is.

mod migrate;

use std::str::FromStr;
use std::time::Duration;

pub use migrate::{migrate, Migrated, VERSIONS};

/// How long a statement may run before the server cancels it: a stuck query never holds a
/// request thread forever.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the store could not use the database, in one line that never holds the password.
#[derive(Debug)]
pub enum PgError {
    /// The URL is not a PostgreSQL URL: why.
    Url(String),
    /// The server could not be reached (its address, redacted).
    Unreachable(String, String),
    /// The server refused the user or the password.
    Auth(String),
    /// The database does not exist.
    NoDatabase(String),
    /// Anything else the server said.
    Server(String),
}

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PgError::Url(why) => write!(f, "store.url is not a PostgreSQL URL: {why}"),
            PgError::Unreachable(url, why) => write!(f, "PostgreSQL at {url} cannot be reached: {why}"),
            PgError::Auth(url) => write!(f, "PostgreSQL at {url} refused the user or its password"),
            PgError::NoDatabase(url) => write!(f, "PostgreSQL at {url}: the database does not exist"),
            PgError::Server(why) => write!(f, "PostgreSQL: {why}"),
        }
    }
}

impl std::error::Error for PgError {}

/// A URL as it may be shown: the password replaced by `***`.
pub fn redacted(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        Ok(parsed) => parsed.to_string(),
        // Not a URL: show none of it, it may be a password mistyped into the wrong place.
        Err(_) => "(an unreadable URL)".into(),
    }
}

/// Connects, with the statement timeout set for the session.
pub fn connect(url: &str) -> Result<postgres::Client, PgError> {
    let mut config = postgres::Config::from_str(url).map_err(|error| PgError::Url(scrub(&error.to_string(), url)))?;
    config.connect_timeout(CONNECT_TIMEOUT);
    config.options(&format!("-c statement_timeout={}", STATEMENT_TIMEOUT.as_millis()));
    config.application_name("kestrel");
    config.connect(postgres::NoTls).map_err(|error| classify(&error, url))
}

/// What a failed connection means, in words that name the problem.
fn classify(error: &postgres::Error, url: &str) -> PgError {
    let shown = redacted(url);
    match error.as_db_error().map(|db| db.code().clone()) {
        Some(code) if code == postgres::error::SqlState::INVALID_PASSWORD => PgError::Auth(shown),
        Some(code) if code == postgres::error::SqlState::INVALID_AUTHORIZATION_SPECIFICATION => PgError::Auth(shown),
        Some(code) if code == postgres::error::SqlState::INVALID_CATALOG_NAME => PgError::NoDatabase(shown),
        Some(_) => PgError::Server(scrub(&error.to_string(), url)),
        None => {
            let why = std::error::Error::source(error).map_or_else(|| error.to_string(), |source| source.to_string());
            PgError::Unreachable(shown, scrub(&why, url))
        }
    }
}

/// A message with the URL's password taken out, should the client have quoted it.
fn scrub(message: &str, url: &str) -> String {
    match url::Url::parse(url).ok().and_then(|parsed| parsed.password().map(str::to_string)) {
        Some(password) if !password.is_empty() => message.replace(&password, "***"),
        _ => message.to_string(),
    }
}

impl From<postgres::Error> for PgError {
    fn from(error: postgres::Error) -> Self {
        PgError::Server(error.as_db_error().map_or_else(|| error.to_string(), |db| db.message().to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_never_shown() {
        assert_eq!(redacted("postgres://k:s3cret@db:5432/kestrel"), "postgres://k:***@db:5432/kestrel");
        assert_eq!(redacted("postgres://k@db/kestrel"), "postgres://k@db/kestrel");
        assert_eq!(redacted("s3cret"), "(an unreadable URL)");
        let error = connect("postgres://k:s3cret@db:notaport/kestrel").err().expect("a bad port").to_string();
        assert!(!error.contains("s3cret") && error.starts_with("store.url is not a PostgreSQL URL"), "{error}");
    }
}
