//! Which sessions streams on this node follow: a cluster's node keeps the lease of a followed
//! session (`engine/tenure.rs`), whose events its streams get from its bus.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// How many streams on this node follow each session.
#[derive(Default)]
pub(super) struct Followers(Mutex<HashMap<String, usize>>);

impl Followers {
    pub(super) fn counts(&self) -> MutexGuard<'_, HashMap<String, usize>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One stream following a session, for as long as it lives.
pub(super) struct Following {
    followers: Arc<Followers>,
    session: String,
}

impl Following {
    pub(super) fn new(followers: &Arc<Followers>, session: &str) -> Following {
        *followers.counts().entry(session.to_string()).or_default() += 1;
        Following { followers: Arc::clone(followers), session: session.to_string() }
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        let mut counts = self.followers.counts();
        if let Some(count) = counts.get_mut(&self.session) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.session);
            }
        }
    }
}
