//! `[schedules]`: how often a schedule may fire (docs/schedules.md).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulesConfig {
    /// The shortest time between two fires of one schedule, in seconds: a cron that would fire
    /// more often is refused at create, and a fire that comes sooner after the last is skipped.
    pub min_interval_secs: u64,
}

impl Default for SchedulesConfig {
    fn default() -> Self {
        SchedulesConfig { min_interval_secs: 60 }
    }
}
