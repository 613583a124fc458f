//! `[store]`: where Kestrel keeps its state. Without a URL, the SQLite file in the data dir;
//! with `url = "postgres://…"` (or `KESTREL_DATABASE_URL`), that PostgreSQL database. The
//! URL's password is never shown: this section prints and serializes it redacted.

use serde::{Deserialize, Serialize, Serializer};

#[derive(Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// A PostgreSQL URL; none (or empty) keeps the SQLite file.
    #[serde(serialize_with = "redacted")]
    pub url: Option<String>,
    /// Connections the readers may hold at once (PostgreSQL): docs/postgres.md says how many
    /// for how many request threads.
    pub pool_size: u32,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig { url: None, pool_size: 16 }
    }
}

impl StoreConfig {
    /// The PostgreSQL URL, if one is set.
    pub fn postgres_url(&self) -> Option<&str> {
        self.url.as_deref().filter(|url| !url.trim().is_empty())
    }
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreConfig")
            .field("url", &self.url.as_deref().map(crate::store::postgres::redacted))
            .field("pool_size", &self.pool_size)
            .finish()
    }
}

fn redacted<S: Serializer>(url: &Option<String>, serializer: S) -> Result<S::Ok, S::Error> {
    url.as_deref().map(crate::store::postgres::redacted).serialize(serializer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_is_never_printed_nor_serialized() {
        let config = StoreConfig { url: Some("postgres://k:hunter2@db/kestrel".into()), pool_size: 4 };
        let shown = [format!("{config:?}"), serde_json::to_string(&config).unwrap()];
        for text in shown {
            assert!(!text.contains("hunter2") && text.contains("k:***@db"), "{text}");
        }
    }
}
