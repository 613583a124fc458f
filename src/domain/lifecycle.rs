//! What ends or reshapes a session, as its events carry it: faults, close reasons and
//! compactions.

use serde::{Deserialize, Serialize};

/// What went wrong in a session, with what each kind of fault carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Fault {
    ProviderConfig {
        detail: String,
    },
    ProviderCallFailed {
        provider: String,
        detail: String,
    },
    AllProvidersFailed {
        attempts: u32,
    },
    LoopLimit {
        max_iterations: u32,
    },
    ProfileUnavailable {
        profile_id: String,
    },
    PrimaryProviderUnavailable {
        profile_id: String,
        primary_provider: String,
    },
    DriverTurnAbandoned {
        owner_client_key_id: String,
    },
    ToolResultMergeInvalid {
        detail: String,
    },
    /// The profile's budget was spent: the turn stopped before its next model call. The
    /// session stays open.
    BudgetExceeded {
        detail: String,
    },
}

impl Fault {
    /// Whether the session cannot go on after it.
    pub fn is_terminal(&self) -> bool {
        !matches!(
            self,
            Fault::ProviderCallFailed { .. } | Fault::DriverTurnAbandoned { .. } | Fault::BudgetExceeded { .. }
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CloseReason {
    ClientClose,
    ClientKeyRevoked,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompactionTrigger {
    Auto,
    Client,
}

/// A compaction that replaced the history before it with a summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompactionCompleted {
    pub session_id: String,
    pub trigger: CompactionTrigger,
    /// The messages the summary replaced.
    pub compacted_message_count: u64,
    pub input_tokens: u64,
    pub summary_tokens: u64,
    /// The seqs of the events that announced the stored preamble and summary.
    pub preamble_event: u64,
    pub summary_event: u64,
}
