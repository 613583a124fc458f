//! `ApiError`: every Kestrel rejection, and the one place its JSON body is built.

use serde_json::json;

use crate::engine::EngineError;
use crate::http::origin::Refusal;
use crate::http::{BodyError, EdgeError, Reply};
use crate::store::StoreError;
use crate::tools::workspace::PathError;

#[derive(Debug)]
pub struct ApiError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
    /// The `Allow` header of a 405.
    pub allow: Option<String>,
    /// The `Retry-After` header of a 429, in seconds.
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into(), allow: None, retry_after: None }
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(400, code, message)
    }

    pub fn invalid_body(message: impl Into<String>) -> ApiError {
        ApiError::bad_request("invalid_body", message)
    }

    pub fn not_found() -> ApiError {
        ApiError::new(404, "not_found", "no such route")
    }

    pub fn method_not_allowed(allowed: &[&str]) -> ApiError {
        let allow = allowed.join(", ");
        ApiError { allow: Some(allow.clone()), ..ApiError::new(405, "method_not_allowed", format!("allowed: {allow}")) }
    }

    /// `429 rate_limited`, to retry after `wait` (whole seconds, at least one).
    pub fn rate_limited(wait: std::time::Duration) -> ApiError {
        let seconds = wait.as_secs_f64().ceil().max(1.0) as u64;
        let message = format!("too many requests for this tenant; retry in {seconds} s");
        ApiError { retry_after: Some(seconds), ..ApiError::new(429, "rate_limited", message) }
    }

    /// `503 unavailable` while the database is away (a restart, a failover), to retry in a
    /// moment; what happened goes to the log.
    pub fn store_unavailable(detail: &dyn std::fmt::Display) -> ApiError {
        log::warn!("a request met the database away: {detail}");
        let message = "the database is unavailable for now; retry shortly";
        ApiError { retry_after: Some(crate::store::RETRY_AFTER_SECS), ..ApiError::new(503, "unavailable", message) }
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(401, "unauthorized", "a valid bearer token is required")
    }

    /// A server with no token, reached by another user of the machine than the one it runs as.
    pub fn not_own_user() -> ApiError {
        ApiError::new(
            403,
            "forbidden",
            "this server has no token, so it serves only the user it runs as; configure a token to serve others",
        )
    }

    /// A 500 whose message says nothing; the detail goes to the log.
    pub fn internal(detail: &dyn std::fmt::Display) -> ApiError {
        log::error!("internal error: {detail}");
        ApiError::new(500, "internal_error", "internal server error")
    }

    pub fn into_reply(self) -> Reply {
        let body = json!({ "error": { "code": self.code, "message": self.message } });
        let mut headers = vec![("Cache-Control", "no-store".to_string())];
        if let Some(allow) = self.allow {
            headers.push(("Allow", allow));
        }
        if let Some(seconds) = self.retry_after {
            headers.push(("Retry-After", seconds.to_string()));
        }
        Reply::Json { status: self.status, body: body.to_string().into_bytes(), headers }
    }
}

impl From<EngineError> for ApiError {
    fn from(error: EngineError) -> ApiError {
        let message = error.to_string();
        match error {
            EngineError::SessionNotFound => ApiError::new(404, "session_not_found", message),
            EngineError::InvalidModel(_) => ApiError::bad_request("invalid_model", message),
            EngineError::InvalidWorkspace(_) => ApiError::invalid_body(message),
            EngineError::WorkspaceForbidden(_) => ApiError::new(403, "forbidden", message),
            EngineError::SessionBusy => ApiError::new(409, "session_busy", message),
            EngineError::NotResumable(_) => ApiError::new(409, "not_resumable", message),
            // Another node (or this one once it is back) takes the request: worth retrying.
            EngineError::ShuttingDown | EngineError::Overloaded => ApiError {
                retry_after: Some(crate::store::RETRY_AFTER_SECS),
                ..ApiError::new(503, "unavailable", message)
            },
            EngineError::ApprovalNotFound => ApiError::new(404, "approval_not_found", message),
            EngineError::IdempotencyConflict => ApiError::new(409, "idempotency_conflict", message),
            EngineError::IdempotencyInFlight => ApiError::new(409, "idempotency_in_progress", message),
            EngineError::Workspace(path_error) => ApiError::from(path_error),
            EngineError::CheckpointsDisabled(_) => ApiError::new(409, "checkpoints_disabled", message),
            EngineError::CheckpointNotFound => ApiError::new(404, "checkpoint_not_found", message),
            EngineError::CheckpointTimedOut(_) => ApiError::new(503, "checkpoint_timeout", message),
            EngineError::MessageNotFound => ApiError::new(404, "message_not_found", message),
            EngineError::InvalidRewindTarget => ApiError::bad_request("invalid_rewind_target", message),
            EngineError::InvalidRule(_) => ApiError::bad_request("invalid_rule", message),
            EngineError::RuleNotFound => ApiError::new(404, "rule_not_found", message),
            EngineError::ConfigRule => ApiError::new(403, "forbidden", message),
            EngineError::InvalidEdit(_) => ApiError::bad_request("invalid_decision", message),
            EngineError::EditDenied(_) => ApiError::new(403, "forbidden", message),
            EngineError::InvalidDecision(_) => ApiError::bad_request("invalid_decision", message),
            EngineError::BudgetExceeded(_) => ApiError::new(429, "budget_exceeded", message),
            EngineError::SessionLimit(_) => ApiError::new(429, "session_limit", message),
            EngineError::InvalidResponseFormat(_) => ApiError::bad_request("invalid_response_format", message),
            // A run's end, never a request's answer.
            EngineError::StructuredOutputInvalid(_) => ApiError::new(422, "structured_output_invalid", message),
            // A unique key that already exists: the request collides with another.
            EngineError::Store(StoreError::Unavailable(_) | StoreError::Fenced(_)) => {
                ApiError::store_unavailable(&error)
            }
            EngineError::Store(StoreError::Unrepresentable(_)) => {
                ApiError::invalid_body("the request holds a NUL character, which the database cannot keep")
            }
            EngineError::Store(StoreError::Conflict(_)) => {
                ApiError::new(409, "conflict", "the request conflicts with another")
            }
            EngineError::Provider(_)
            | EngineError::Compaction(_)
            | EngineError::Store(_)
            | EngineError::Internal(_) => ApiError::internal(&error),
        }
    }
}

impl From<PathError> for ApiError {
    fn from(error: PathError) -> ApiError {
        let message = error.to_string();
        match error {
            PathError::Invalid(_) => ApiError::bad_request("invalid_path", message),
            PathError::Outside(_) => ApiError::new(403, "outside_workspace", message),
            PathError::NotFound(_) => ApiError::new(404, "not_found", message),
            PathError::Protected(_) => ApiError::new(403, "forbidden", message),
            PathError::NotRegular(_) => ApiError::bad_request("invalid_path", message),
            PathError::Io(_) => ApiError::internal(&message),
        }
    }
}

impl From<BodyError> for ApiError {
    fn from(error: BodyError) -> ApiError {
        match error {
            BodyError::TooLarge { limit } => {
                ApiError::new(413, "payload_too_large", format!("the request body is larger than {limit} bytes"))
            }
            BodyError::Truncated { expected, received } => ApiError::new(
                408,
                "request_timeout",
                format!("the body ended after {received} of its {expected} bytes; it did not arrive in time"),
            ),
            BodyError::Io(error) => {
                ApiError::bad_request("invalid_body", format!("the body could not be read: {error}"))
            }
        }
    }
}

/// Requests the HTTP edge refused before routing.
impl From<&EdgeError> for ApiError {
    fn from(error: &EdgeError) -> ApiError {
        let code = match error {
            EdgeError::BadRequest(_) => "bad_request",
            EdgeError::HeadTooLarge => "header_too_large",
            EdgeError::LengthRequired => "length_required",
            EdgeError::ExpectationFailed => "expectation_failed",
            EdgeError::VersionNotSupported => "http_version_not_supported",
            EdgeError::BodyTooLarge { .. } => "payload_too_large",
            EdgeError::Timeout => "request_timeout",
            EdgeError::TooManyConnections | EdgeError::Unavailable => "unavailable",
            EdgeError::Forbidden => "forbidden",
            EdgeError::Refused(Refusal::Host | Refusal::Origin) => "forbidden",
            EdgeError::Refused(Refusal::MediaType { .. }) => "unsupported_media_type",
        };
        ApiError::new(error.status(), code, error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_errors_map_by_kind() {
        let conflict = ApiError::from(EngineError::Store(StoreError::Conflict("UNIQUE constraint failed".into())));
        assert_eq!((conflict.status, conflict.code), (409, "conflict"));
        assert!(!conflict.message.contains("UNIQUE"), "the store's words stay in the log");
        let gone = ApiError::from(EngineError::from(StoreError::MissingSession));
        assert_eq!((gone.status, gone.code), (404, "session_not_found"));
        let full = ApiError::from(EngineError::Store(StoreError::Backend("database or disk is full".into())));
        assert_eq!((full.status, full.code), (500, "internal_error"));
    }
}
