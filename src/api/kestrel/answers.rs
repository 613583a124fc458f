//! Answers kept while no session changed: the whole session list per tenant and each
//! session's detail. A list of thousands of sessions is megabytes of JSON, a detail of
//! thousands of messages too, and clients poll both.
//!
//! An answer is kept with the sessions' version it was read at (`Engine::sessions_version`,
//! read before the answer: a change landing in between leaves an answer newer than its
//! version, never an older one), and served to requests whose version is no newer. Requests
//! that miss the same key at once read it once: the first reads, the others wait for it. At
//! most `KEPT_BYTES` are kept; past that, everything is dropped.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::ApiError;
use crate::http::Reply;

const KEPT_BYTES: usize = 64 * 1024 * 1024;

/// How long a request waits for another one reading the same answer before reading it too.
const WAIT_FOR_READER: Duration = Duration::from_secs(5);

#[derive(Default)]
pub struct AnswerCache {
    state: Mutex<State>,
    read: Condvar,
}

#[derive(Default)]
struct State {
    /// Each answer and the version it was read at.
    kept: HashMap<String, (i64, Arc<Vec<u8>>)>,
    bytes: usize,
    /// The keys a request is reading now.
    reading: HashSet<String>,
}

impl AnswerCache {
    /// The answer for `key` at `version` or newer: a kept one, or `read`'s.
    pub fn answer(
        &self,
        key: &str,
        version: i64,
        read: impl FnOnce() -> Result<Reply, ApiError>,
    ) -> Result<Reply, ApiError> {
        let mut state = self.lock();
        loop {
            if let Some((_, body)) = state.kept.get(key).filter(|(at, _)| *at >= version) {
                return Ok(Reply::Json { status: 200, body: body.to_vec(), headers: Vec::new() });
            }
            if !state.reading.contains(key) {
                break;
            }
            let (next, waited) = self.read.wait_timeout(state, WAIT_FOR_READER).unwrap_or_else(|e| e.into_inner());
            state = next;
            if waited.timed_out() {
                break;
            }
        }
        state.reading.insert(key.to_string());
        drop(state);
        let reading = Reading { cache: self, key };
        let reply = read()?;
        if let Reply::Json { status: 200, body, .. } = &reply {
            reading.keep(version, body);
        }
        Ok(reply)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A request reading an answer; when it is dropped (the answer kept, or the read failed),
/// the requests waiting for it go on.
struct Reading<'a> {
    cache: &'a AnswerCache,
    key: &'a str,
}

impl Reading<'_> {
    fn keep(&self, version: i64, body: &[u8]) {
        let mut state = self.cache.lock();
        if state.bytes + body.len() > KEPT_BYTES {
            state.kept.clear();
            state.bytes = 0;
        }
        if let Some((_, replaced)) = state.kept.insert(self.key.to_string(), (version, Arc::new(body.to_vec()))) {
            state.bytes -= replaced.len();
        }
        state.bytes += body.len();
    }
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.cache.lock().reading.remove(self.key);
        self.cache.read.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn reply(text: &str) -> Result<Reply, ApiError> {
        Ok(Reply::Json { status: 200, body: text.as_bytes().to_vec(), headers: Vec::new() })
    }

    fn body(reply: Reply) -> String {
        match reply {
            Reply::Json { body, .. } => String::from_utf8(body).unwrap(),
            _ => panic!("a JSON reply"),
        }
    }

    /// A request for `k` at version 1 on its own thread, whose read (if it reads) counts in
    /// `reads`, waits for `gate` and answers `text`.
    fn request(
        cache: &Arc<AnswerCache>,
        reads: &Arc<AtomicUsize>,
        text: &'static str,
        gate: Option<(crossbeam_channel::Sender<()>, crossbeam_channel::Receiver<()>)>,
    ) -> std::thread::JoinHandle<String> {
        let (cache, reads) = (Arc::clone(cache), Arc::clone(reads));
        std::thread::spawn(move || {
            let read = || {
                reads.fetch_add(1, Ordering::SeqCst);
                if let Some((started, release)) = gate {
                    started.send(()).unwrap();
                    release.recv().unwrap();
                }
                reply(text)
            };
            body(cache.answer("k", 1, read).unwrap())
        })
    }

    #[test]
    fn requests_missing_at_once_read_once_and_a_newer_version_reads_again() {
        let cache = Arc::new(AnswerCache::default());
        let reads = Arc::new(AtomicUsize::new(0));
        let (started_tx, started) = crossbeam_channel::bounded::<()>(1);
        let (release, released) = crossbeam_channel::bounded::<()>(1);
        let first = request(&cache, &reads, "one", Some((started_tx, released)));
        started.recv().unwrap();
        // The first is reading: these wait for it instead of reading too.
        let waiting: Vec<_> = (0..4).map(|_| request(&cache, &reads, "again", None)).collect();
        release.send(()).unwrap();
        assert_eq!(first.join().unwrap(), "one");
        for waiter in waiting {
            assert_eq!(waiter.join().unwrap(), "one");
        }
        assert_eq!(reads.load(Ordering::SeqCst), 1, "read once");
        assert_eq!(body(cache.answer("k", 2, || reply("two")).unwrap()), "two", "a newer version reads again");
        assert_eq!(body(cache.answer("k", 1, || reply("old")).unwrap()), "two", "an older one takes the newer answer");
    }

    #[test]
    fn a_failed_read_keeps_nothing_and_lets_the_next_read() {
        let cache = AnswerCache::default();
        let failed = cache.answer("k", 1, || Err(ApiError::bad_request("invalid_query", "no")));
        assert!(failed.is_err());
        assert_eq!(body(cache.answer("k", 1, || reply("read")).unwrap()), "read");
    }
}
