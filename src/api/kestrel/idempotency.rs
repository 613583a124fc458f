//! The `Idempotency-Key` header on `POST /api/sessions` and `POST …/messages`.
//!
//! A repeat with the same key (per tenant, for 24 hours, across restarts) gets the first
//! answer again, marked `Idempotency-Replayed: true`, and creates nothing; the same key on a
//! different request (another route, another body) is `409 idempotency_conflict`. The engine
//! stores the answer in the same transaction as what the request created.

use sha2::{Digest, Sha256};

use super::{ApiError, Caller, KestrelApi};
use crate::engine::idempotency::Render;
use crate::engine::{Idempotent, Lookup};
use crate::http::{Reply, Request};

const HEADER: &str = "Idempotency-Key";
const MAX_KEY_CHARS: usize = 255;

/// The request's key, if it sent one: 1 to 255 visible ASCII characters.
pub fn key(request: &Request) -> Result<Option<String>, ApiError> {
    let Some(key) = request.header(HEADER) else { return Ok(None) };
    if key.is_empty() || key.len() > MAX_KEY_CHARS || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiError::bad_request(
            "invalid_idempotency_key",
            format!("{HEADER} must be 1 to {MAX_KEY_CHARS} visible ASCII characters"),
        ));
    }
    Ok(Some(key.to_string()))
}

/// Runs `handle` at most once per key: with a new key it gets the `Idempotent` to pass to the
/// engine; a repeat is answered from the store without calling it.
pub fn once(
    api: &KestrelApi,
    caller: &Caller,
    key: Option<String>,
    request: (&str, &str, &[u8]),
    render: Render,
    handle: impl FnOnce(Option<Idempotent>) -> Result<Reply, ApiError>,
) -> Result<Reply, ApiError> {
    let Some(key) = key else { return handle(None) };
    let fingerprint = fingerprint(request);
    match api.engine.idempotency(&caller.tenant, &key, &fingerprint)? {
        Lookup::Replay { status, body } => {
            Ok(Reply::Json { status, body, headers: vec![("Idempotency-Replayed", "true".to_string())] })
        }
        Lookup::Fresh(claim) => {
            let idempotent = Idempotent { tenant: caller.tenant.clone(), key, fingerprint, render };
            let reply = handle(Some(idempotent));
            drop(claim);
            reply
        }
    }
}

/// SHA-256 of the method, the path and the body.
fn fingerprint((method, path, body): (&str, &str, &[u8])) -> String {
    let mut hash = Sha256::new();
    hash.update(method.as_bytes());
    hash.update(b"\n");
    hash.update(path.as_bytes());
    hash.update(b"\n");
    hash.update(body);
    format!("{:x}", hash.finalize())
}
