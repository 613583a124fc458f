//! Why an engine operation was refused or failed; each door gives each its status and code.

use super::structured;
use crate::domain::SessionStatus;
use crate::store::StoreError;
use crate::tools::workspace::{PathError, WorkspaceRefusal};

#[derive(Debug)]
pub enum EngineError {
    SessionNotFound,
    InvalidModel(String),
    InvalidWorkspace(String),
    /// A workspace outside the tenant's roots or overlapping a protected path.
    WorkspaceForbidden(String),
    SessionBusy,
    NotResumable(SessionStatus),
    ShuttingDown,
    /// The server could not start a thread for the run (out of memory or threads).
    Overloaded,
    /// A bug: the detail is logged where it happened.
    Internal(&'static str),
    ApprovalNotFound,
    /// An Idempotency-Key already answered a different request.
    IdempotencyConflict,
    /// The first request with this Idempotency-Key is still being handled.
    IdempotencyInFlight,
    /// A workspace path was refused or could not be read.
    Workspace(PathError),
    /// The model provider failed; the message is safe to show (no keys, no headers).
    Provider(String),
    /// A compaction did not produce a summary; the history is untouched.
    Compaction(String),
    /// Checkpoints are off, or the workspace is past their limits: why, for people.
    CheckpointsDisabled(String),
    CheckpointNotFound,
    /// A checkpoint's capture took too long and was abandoned: why, for people.
    CheckpointTimedOut(String),
    MessageNotFound,
    /// A rewind names a message that is not the user's.
    InvalidRewindTarget,
    /// A permission rule whose pattern does not compile: why.
    InvalidRule(String),
    RuleNotFound,
    /// A config file rule: the API does not revoke it.
    ConfigRule,
    /// An approval's edited arguments do not fit the tool's schema: why.
    InvalidEdit(String),
    /// An approval's edited arguments are denied by a rule: what the model would be told.
    EditDenied(String),
    /// A decision this approval cannot take (a `remember` on withheld paths): why.
    InvalidDecision(String),
    /// A new run would pass its scope's budget (or its runs at once): why.
    BudgetExceeded(String),
    /// The tenant has this many sessions, as many as it may (`agent.max_sessions_per_tenant`).
    SessionLimit(u64),
    /// A message's `responseFormat` cannot be used.
    InvalidResponseFormat(structured::FormatError),
    /// The final answer was not valid against the requested schema, a repair included: the
    /// last answer's validation errors.
    StructuredOutputInvalid(Vec<String>),
    Store(StoreError),
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::SessionNotFound => write!(f, "session not found"),
            EngineError::InvalidModel(model) => write!(f, "model `{model}` is not registered"),
            EngineError::InvalidWorkspace(why) | EngineError::WorkspaceForbidden(why) => write!(f, "{why}"),
            EngineError::SessionBusy => write!(f, "a run is already active in this session"),
            EngineError::NotResumable(status) => {
                write!(f, "only interrupted or failed sessions can be resumed; this one is {}", status.as_str())
            }
            EngineError::ShuttingDown => write!(f, "the server is shutting down"),
            EngineError::Internal(what) => write!(f, "internal error: {what}"),
            EngineError::Overloaded => write!(
                f,
                "the server cannot start a run right now; the message is stored and the session can be resumed"
            ),
            EngineError::ApprovalNotFound => write!(f, "no pending approval with that id"),
            EngineError::IdempotencyConflict => {
                write!(f, "this Idempotency-Key was already used for a different request")
            }
            EngineError::IdempotencyInFlight => {
                write!(f, "a request with this Idempotency-Key is still being handled; retry shortly")
            }
            EngineError::Workspace(error) => write!(f, "{error}"),
            EngineError::Provider(message) => write!(f, "{message}"),
            EngineError::Compaction(detail) => write!(f, "compaction failed: {detail}"),
            EngineError::CheckpointsDisabled(reason) => write!(f, "checkpoints are disabled: {reason}"),
            EngineError::CheckpointNotFound => write!(f, "no checkpoint with that id in this session"),
            EngineError::CheckpointTimedOut(why) => write!(f, "{why}"),
            EngineError::MessageNotFound => write!(f, "no message with that id in this session"),
            EngineError::InvalidRewindTarget => write!(f, "only a user message can be rewound to"),
            EngineError::InvalidRule(why) => write!(f, "{why}"),
            EngineError::RuleNotFound => write!(f, "no rule with that id here"),
            EngineError::ConfigRule => write!(f, "rules from the config file are changed in the config file"),
            EngineError::InvalidEdit(why) => write!(f, "the edited arguments do not fit the tool's schema: {why}"),
            EngineError::EditDenied(why) => write!(f, "the edited call is denied: {why}"),
            EngineError::InvalidDecision(why) => write!(f, "{why}"),
            EngineError::BudgetExceeded(why) => write!(f, "budget exceeded: {why}"),
            EngineError::SessionLimit(max) => write!(
                f,
                "a tenant may have at most {max} sessions (agent.max_sessions_per_tenant); delete one to make room"
            ),
            EngineError::InvalidResponseFormat(why) => write!(f, "{why}"),
            EngineError::StructuredOutputInvalid(errors) => write!(
                f,
                "structured_output_invalid: the final answer is not valid against the schema: {}",
                errors.join("; ")
            ),
            EngineError::Store(error) => write!(f, "{error}"),
        }
    }
}

impl std::error::Error for EngineError {}

impl From<StoreError> for EngineError {
    fn from(error: StoreError) -> Self {
        match error {
            // A session deleted between its check and a write to it.
            StoreError::MissingSession => EngineError::SessionNotFound,
            StoreError::SessionLimit(max) => EngineError::SessionLimit(max),
            error => EngineError::Store(error),
        }
    }
}

impl From<WorkspaceRefusal> for EngineError {
    fn from(refusal: WorkspaceRefusal) -> Self {
        match refusal {
            WorkspaceRefusal::Invalid(why) => EngineError::InvalidWorkspace(why),
            WorkspaceRefusal::Forbidden(why) => EngineError::WorkspaceForbidden(why),
        }
    }
}
