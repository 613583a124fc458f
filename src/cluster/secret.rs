//! The cluster's secret, and the check of the one another node presents (docs/cluster.md,
//! Forwarding).
//!
//! Both values are reduced to HMAC-SHA256 tags under a key drawn when the node starts, and
//! the two tags, always 32 bytes, are compared in constant time (`hmac`'s `verify_slice`, over
//! `subtle`). So the time a check takes depends on neither the presented value's length nor
//! where it differs from the secret, and a presented value is never compared byte by byte
//! with the secret itself. Runs on request threads.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The length of the tags compared: the same whatever was presented.
const TAG_BYTES: usize = 32;

/// The cluster's secret: presented to other nodes as it is, checked as a tag.
pub struct ClusterSecret {
    value: String,
    /// The key both tags are made under; this process's own, never shown.
    key: [u8; 32],
    /// The secret's tag under `key`.
    tag: [u8; TAG_BYTES],
}

impl ClusterSecret {
    pub fn new(value: &str) -> ClusterSecret {
        let mut key = [0u8; 32];
        getrandom::getrandom(&mut key).expect("the operating system's random source works");
        let tag = tag_under(&key, value.as_bytes());
        ClusterSecret { value: value.to_string(), key, tag }
    }

    /// The secret, as this node presents it to others.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// Whether `presented` is the secret: its tag against the secret's, in constant time.
    pub fn admits(&self, presented: &str) -> bool {
        self.mac(presented.as_bytes()).verify_slice(&self.tag).is_ok()
    }

    fn mac(&self, value: &[u8]) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key).expect("HMAC takes a key of any length");
        mac.update(value);
        mac
    }
}

fn tag_under(key: &[u8], value: &[u8]) -> [u8; TAG_BYTES] {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(value);
    mac.finalize().into_bytes().into()
}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(***)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "s3cret-cluster";

    #[test]
    fn values_of_other_lengths_are_refused_after_the_same_fixed_length_comparison() {
        let secret = ClusterSecret::new(SECRET);
        for wrong in ["", "s", "s3cret-cluste", "s3cret-cluster-", &"s3cret-cluster".repeat(1000)] {
            assert!(!secret.admits(wrong), "{wrong:?}");
            // What is compared is a tag as long as the secret's, whatever the length presented.
            assert_eq!(secret.mac(wrong.as_bytes()).finalize().into_bytes().len(), secret.tag.len());
        }
    }

    #[test]
    fn values_of_the_same_length_are_refused_wherever_they_differ() {
        let secret = ClusterSecret::new(SECRET);
        for wrong in
            ["x3cret-cluster", "s3cret-clustex", "s3cret-cLuster", "S3CRET-CLUSTER", "\0\0\0\0\0\0\0\0\0\0\0\0\0\0"]
        {
            assert_eq!(wrong.len(), SECRET.len());
            assert!(!secret.admits(wrong), "{wrong:?}");
        }
    }

    #[test]
    fn the_same_value_is_admitted_under_any_nodes_key() {
        let (here, there) = (ClusterSecret::new(SECRET), ClusterSecret::new(SECRET));
        assert!(here.admits(there.value()) && there.admits(here.value()));
        assert_ne!(here.key, there.key, "each node draws its own key");
        assert!(!format!("{here:?}").contains(SECRET));
    }
}
