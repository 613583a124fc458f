//! `[cluster]`: several Kestrel nodes on one PostgreSQL database (docs/cluster.md). A node
//! joins the cluster when a shared secret is set (`secret`, or `KESTREL_CLUSTER_SECRET`);
//! without one it runs alone, as always. The secret is never shown: this section prints and
//! serializes it as `***`.

use serde::{Deserialize, Serialize, Serializer};

#[derive(Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// This node's id; by default the host's name and the port it listens on.
    pub node_id: Option<String>,
    /// The URL other nodes reach this one at; by default `http://` and the bound address.
    pub advertise_url: Option<String>,
    /// What nodes present to one another; calls between nodes without it are refused.
    #[serde(serialize_with = "hidden")]
    pub secret: Option<String>,
    /// How long a node's hold of a session lasts without being renewed, in milliseconds.
    pub lease_ms: u64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig { node_id: None, advertise_url: None, secret: None, lease_ms: 10_000 }
    }
}

impl ClusterConfig {
    /// The secret, when this node is one of a cluster.
    pub fn secret(&self) -> Option<&str> {
        self.secret.as_deref().filter(|secret| !secret.is_empty())
    }
}

impl std::fmt::Debug for ClusterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterConfig")
            .field("node_id", &self.node_id)
            .field("advertise_url", &self.advertise_url)
            .field("secret", &self.secret.as_ref().map(|_| "***"))
            .field("lease_ms", &self.lease_ms)
            .finish()
    }
}

fn hidden<S: Serializer>(secret: &Option<String>, serializer: S) -> Result<S::Ok, S::Error> {
    secret.as_ref().map(|_| "***").serialize(serializer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secret_is_never_printed_nor_serialized() {
        let config = ClusterConfig { secret: Some("hunter2".into()), ..ClusterConfig::default() };
        for text in [format!("{config:?}"), serde_json::to_string(&config).unwrap()] {
            assert!(!text.contains("hunter2") && text.contains("***"), "{text}");
        }
    }
}
