//! RFC 7807 problem replies, as BAE shapes them: `{type, title, status, detail}` with a short
//! stable slug for `type` and the title its status has.

use serde::Serialize;

use crate::api::bae::core::{BaeError, Denied};
use crate::engine::EngineError;
use crate::http::origin::Refusal;
use crate::http::{EdgeError, Reply};
use crate::store::StoreError;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    #[serde(rename = "type")]
    pub slug: &'static str,
    pub title: &'static str,
    pub status: u16,
    pub detail: String,
    /// The `Allow` header of a 405.
    #[serde(skip)]
    pub allow: Option<String>,
    /// The `Retry-After` header of a 429, in seconds.
    #[serde(skip)]
    pub retry_after: Option<u64>,
}

fn title(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Payload Too Large",
        415 => "Unsupported Media Type",
        417 => "Expectation Failed",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "Internal Server Error",
    }
}

impl Problem {
    pub fn new(status: u16, slug: &'static str, detail: impl Into<String>) -> Problem {
        Problem { slug, title: title(status), status, detail: detail.into(), allow: None, retry_after: None }
    }

    /// A 405 naming the methods `path` accepts, in its detail and its `Allow` header.
    pub fn method_not_allowed(path: &str, methods: &[&str]) -> Problem {
        let allow = methods.join(", ");
        Problem {
            allow: Some(allow.clone()),
            ..Problem::new(405, "method_not_allowed", format!("{path} accepts {allow}"))
        }
    }

    pub fn bad_request(detail: impl Into<String>) -> Problem {
        Problem::new(400, "bad_request", detail)
    }

    pub fn unauthorized(detail: impl Into<String>) -> Problem {
        Problem::new(401, "unauthorized", detail)
    }

    pub fn not_found(detail: impl Into<String>) -> Problem {
        Problem::new(404, "not_found", detail)
    }

    /// A failure whose cause is logged here and not shown.
    pub fn internal(cause: &dyn std::fmt::Display) -> Problem {
        log::error!("BAE request failed: {cause}");
        Problem::new(500, "internal", "an internal error occurred")
    }

    pub fn into_reply(self) -> Reply {
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let mut headers = self.allow.clone().map(|allow| vec![("Allow", allow)]).unwrap_or_default();
        if let Some(seconds) = self.retry_after {
            headers.push(("Retry-After", seconds.to_string()));
        }
        Reply::Json { status: self.status, body, headers }
    }

    /// `429 rate_limited` (Kestrel's extension: a profile's `budget.requests_per_second`).
    pub fn rate_limited(wait: std::time::Duration) -> Problem {
        let seconds = wait.as_secs_f64().ceil().max(1.0) as u64;
        let detail = format!("too many requests for this profile; retry in {seconds} s");
        Problem { retry_after: Some(seconds), ..Problem::new(429, "rate_limited", detail) }
    }
}

impl From<BaeError> for Problem {
    fn from(error: BaeError) -> Problem {
        match error {
            BaeError::Unauthorized(Denied::ClientKey) => Problem::unauthorized("invalid client key"),
            BaeError::Unauthorized(Denied::SessionKey) => Problem::unauthorized("invalid session key"),
            BaeError::Unauthorized(Denied::AdminKey) => Problem::unauthorized("invalid admin key"),
            BaeError::ProfileNotFound(id) => Problem::not_found(format!("no profile {id}")),
            BaeError::DuplicateProfileName => {
                Problem::new(409, "duplicate_name", "a profile with that name already exists")
            }
            BaeError::ProfileInUse(keys) => Problem::new(
                409,
                "profile_in_use",
                format!("profile has {keys} active client key(s); revoke them before deleting"),
            ),
            BaeError::ProfileUnavailable => {
                Problem::new(422, "profile_unavailable", "the profile bound to this client key is no longer available")
            }
            BaeError::NoActiveProfile(id) => {
                Problem::new(422, "profile_unavailable", format!("no active profile {id}"))
            }
            BaeError::ClientKeyNotFound(id) => Problem::not_found(format!("no active client key {id}")),
            BaeError::SessionNotFound(id) => Problem::not_found(format!("no session {id}")),
            BaeError::SessionEnded(state) => {
                Problem::new(409, "session_closed", format!("session is already {}", state.as_str()))
            }
            BaeError::ProfileMismatch => {
                Problem::new(403, "profile_mismatch", "the client key's profile does not match this session's profile")
            }
            BaeError::ToolNotAllowed(name) => {
                Problem::new(403, "tool_not_allowed", format!("tool {name:?} is not in the profile's allowlist"))
            }
            BaeError::ReservedToolName => Problem::new(422, "reserved_tool_name", "remote_subagent_status is reserved"),
            BaeError::InvalidSubagentTools(detail) => Problem::new(422, "invalid_subagent_tools", detail),
            BaeError::PrimaryProviderUnavailable(name) => Problem::new(
                422,
                "primary_provider_unavailable",
                format!("the profile's primary provider {name:?} is not configured"),
            ),
            BaeError::Engine(EngineError::Store(StoreError::Closed)) | BaeError::Engine(EngineError::ShuttingDown) => {
                Problem {
                    retry_after: Some(crate::store::RETRY_AFTER_SECS),
                    ..Problem::new(503, "unavailable", "the server is shutting down")
                }
            }
            BaeError::Engine(EngineError::Store(StoreError::Unrepresentable(_))) => {
                Problem::new(400, "bad_request", "the request holds a NUL character, which the database cannot keep")
            }
            BaeError::Engine(EngineError::Store(error @ (StoreError::Unavailable(_) | StoreError::Fenced(_)))) => {
                log::warn!("a request could not be kept for now: {error}");
                let detail = "the database is unavailable for now; retry shortly";
                Problem {
                    retry_after: Some(crate::store::RETRY_AFTER_SECS),
                    ..Problem::new(503, "unavailable", detail)
                }
            }
            BaeError::Engine(error) => Problem::internal(&error),
        }
    }
}

impl From<&EdgeError> for Problem {
    fn from(error: &EdgeError) -> Problem {
        let slug = match error {
            EdgeError::BodyTooLarge { .. } => "payload_too_large",
            EdgeError::Timeout => "request_timeout",
            EdgeError::TooManyConnections | EdgeError::Unavailable => "unavailable",
            EdgeError::Forbidden | EdgeError::Refused(Refusal::Host | Refusal::Origin) => "forbidden",
            EdgeError::Refused(Refusal::MediaType { .. }) => "unsupported_media_type",
            _ => "bad_request",
        };
        Problem::new(error.status(), slug, error.to_string())
    }
}
