//! Request ids: every response carries `X-Request-Id`, the client's own when it sent a sane
//! one (1 to 128 characters of letters, digits and `._:-`), else a new random one. While a
//! handler runs, its thread knows the id, so log lines written meanwhile carry it.

use std::cell::RefCell;

thread_local! {
    static CURRENT: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// The id for a request that sent `incoming` (its `X-Request-Id`, if any).
pub fn for_request(incoming: Option<&str>) -> String {
    match incoming.map(str::trim) {
        Some(id) if is_sane(id) => id.to_string(),
        _ => uuid::Uuid::new_v4().simple().to_string(),
    }
}

fn is_sane(id: &str) -> bool {
    (1..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
}

/// Runs `work` with `id` as this thread's current request id.
pub fn within<T>(id: &str, work: impl FnOnce() -> T) -> T {
    CURRENT.with(|current| *current.borrow_mut() = Some(id.to_string()));
    let result = work();
    CURRENT.with(|current| *current.borrow_mut() = None);
    result
}

/// The id of the request this thread is handling, if any.
pub fn current() -> Option<String> {
    CURRENT.with(|current| current.borrow().clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_a_sane_id_and_replaces_anything_else() {
        assert_eq!(for_request(Some("req-42.a:b_c")), "req-42.a:b_c");
        for bad in ["", "has space", "semi;colon", "line\nbreak", &"x".repeat(129), "ünïcode"] {
            let id = for_request(Some(bad));
            assert_eq!(id.len(), 32, "{bad:?} gave {id}");
        }
        assert_ne!(for_request(None), for_request(None));
        assert_eq!(within("abc", current), Some("abc".into()));
        assert_eq!(current(), None);
    }
}
