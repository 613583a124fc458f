//! Scheduled runs (docs/schedules.md): a cron expression in a time zone that sends a message to
//! a session, or to a new session each time. Schedules are stored (`store/schedules.rs`); the
//! `kestrel-scheduler` thread fires them by the server's clock (`crate::clock`); a fire whose
//! session is running is skipped and recorded; fires missed while the server was down follow
//! the schedule's `catch_up`.

mod fire;
mod scheduler;

use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub use scheduler::{NewSchedule, PlanFactory, ScheduleError, SchedulerHandle, Schedules, MAX_PER_TENANT};

/// A schedule as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    pub id: String,
    pub tenant: String,
    pub cron: String,
    pub timezone: String,
    pub target: Target,
    /// The message each fire sends.
    pub message: String,
    pub catch_up: CatchUp,
    pub paused: bool,
    /// When it fires next (ms since the epoch); `None` when paused or never again.
    pub next_at: Option<i64>,
    pub last_fired_at: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

/// Whom a fire sends its message to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Target {
    /// An existing session of the tenant.
    SessionId(String),
    /// A new session each fire, made like `POST /api/sessions`.
    Session(NewSessionSpec),
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSessionSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

/// What a start does about fires missed while the server was down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatchUp {
    /// Nothing: the missed fires are recorded as one skip, and the schedule goes on.
    None,
    /// The latest missed fire runs at once, once.
    Latest,
}

impl CatchUp {
    pub fn as_str(self) -> &'static str {
        match self {
            CatchUp::None => "none",
            CatchUp::Latest => "latest",
        }
    }

    pub fn parse(text: &str) -> Option<CatchUp> {
        match text {
            "none" => Some(CatchUp::None),
            "latest" => Some(CatchUp::Latest),
            _ => None,
        }
    }
}

/// One fire of a schedule, or its skip.
#[derive(Debug, Clone, PartialEq)]
pub struct Fire {
    pub seq: u64,
    pub schedule_id: String,
    /// The time it was due (RFC 3339).
    pub due_at: String,
    /// When it happened.
    pub at: String,
    /// `fired` or `skipped`.
    pub outcome: FireOutcome,
    /// Why it was skipped: `session_busy`, `missed`, `min_interval`, `session_limit`,
    /// `session_not_found`, `budget_exceeded`, …
    pub reason: Option<String>,
    pub session_id: Option<String>,
    pub run_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FireOutcome {
    Fired,
    Skipped,
}

impl FireOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            FireOutcome::Fired => "fired",
            FireOutcome::Skipped => "skipped",
        }
    }

    pub fn parse(text: &str) -> Option<FireOutcome> {
        match text {
            "fired" => Some(FireOutcome::Fired),
            "skipped" => Some(FireOutcome::Skipped),
            _ => None,
        }
    }
}

/// Fires of a new schedule looked at for its shortest gap (`Timing::shortest_gap`).
const FIRES_LOOKED_AT: usize = 1_000;
/// How far from its first fire a new schedule's fires are looked at.
const GAP_HORIZON_MS: i64 = 2 * 366 * 86_400_000;

/// `ms` down to its whole second.
fn whole_second(ms: i64) -> i64 {
    ms.div_euclid(1000) * 1000
}

/// A cron expression in a time zone: five fields (minute hour day month weekday), or six with
/// seconds first; `croner`'s syntax (`L`, `W`, `#`, names).
pub struct Timing {
    cron: croner::Cron,
    zone: chrono_tz::Tz,
}

/// Why a cron expression or a time zone is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimingError {
    Cron(String),
    Timezone(String),
    /// The expression never matches (`0 0 31 2 *`).
    Never,
}

impl std::fmt::Display for TimingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TimingError::Cron(why) => write!(f, "`cron` is not a cron expression: {why}"),
            TimingError::Timezone(zone) => write!(f, "`timezone` {zone:?} is not an IANA time zone"),
            TimingError::Never => write!(f, "`cron` never matches"),
        }
    }
}

impl Timing {
    pub fn parse(cron: &str, timezone: &str) -> Result<Timing, TimingError> {
        let fields = cron.split_whitespace().count();
        if !(5..=6).contains(&fields) {
            return Err(TimingError::Cron(format!("{fields} fields; five, or six with seconds first")));
        }
        let parser = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .year(croner::parser::Year::Disallowed)
            .build();
        let cron = parser.parse(cron).map_err(|error| TimingError::Cron(error.to_string()))?;
        let zone = chrono_tz::Tz::from_str(timezone).map_err(|_| TimingError::Timezone(timezone.to_string()))?;
        Ok(Timing { cron, zone })
    }

    /// The first time it matches strictly after `after_ms`, in ms since the epoch: always a
    /// whole second. The search starts from the whole second at or before `after_ms`, since
    /// `croner` keeps the fraction of the time it starts from (a schedule made at `…00.640`
    /// fired 640 ms late); a match strictly after that second is past `after_ms` too.
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        let second = whole_second(after_ms);
        let after = chrono::DateTime::from_timestamp_millis(second)?.with_timezone(&self.zone);
        let next = self.cron.find_next_occurrence(&after, false).ok()?;
        Some(whole_second(next.timestamp_millis()))
    }

    /// The last time it matches at or before `at_ms`: a whole second.
    pub fn last_at_or_before(&self, at_ms: i64) -> Option<i64> {
        let at = chrono::DateTime::from_timestamp_millis(whole_second(at_ms))?.with_timezone(&self.zone);
        let previous = self.cron.find_previous_occurrence(&at, true).ok()?;
        Some(whole_second(previous.timestamp_millis()))
    }

    /// The shortest time between two of its fires, in ms, over its next `FIRES_LOOKED_AT`
    /// fires from `from_ms` or the two years after the first, whichever ends first: a cron's
    /// fields repeat within a year, and one that fires often shows its shortest gap in its
    /// first thousand fires. `None` when it fires once at most in that time.
    pub fn shortest_gap(&self, from_ms: i64) -> Option<i64> {
        let first = self.next_after(from_ms)?;
        let horizon = first.saturating_add(GAP_HORIZON_MS);
        let mut previous = first;
        let mut shortest: Option<i64> = None;
        for _ in 0..FIRES_LOOKED_AT {
            let Some(next) = self.next_after(previous).filter(|next| *next <= horizon) else { break };
            let gap = next - previous;
            shortest = Some(shortest.map_or(gap, |s| s.min(gap)));
            previous = next;
        }
        shortest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> i64 {
        chrono::DateTime::parse_from_rfc3339(text).unwrap().timestamp_millis()
    }

    #[test]
    fn five_and_six_fields_in_a_zone_with_its_summer_time() {
        let nine_in_oslo = Timing::parse("0 9 * * *", "Europe/Oslo").unwrap();
        // CET in winter, CEST in summer.
        assert_eq!(nine_in_oslo.next_after(at("2026-03-01T07:59:00Z")), Some(at("2026-03-01T08:00:00Z")));
        assert_eq!(nine_in_oslo.next_after(at("2026-07-01T08:00:00Z")), Some(at("2026-07-02T07:00:00Z")));
        let every_ten_seconds = Timing::parse("*/10 * * * * *", "UTC").unwrap();
        assert_eq!(every_ten_seconds.next_after(at("2026-03-01T00:00:03Z")), Some(at("2026-03-01T00:00:10Z")));
        assert_eq!(nine_in_oslo.last_at_or_before(at("2026-03-03T07:00:00Z")), Some(at("2026-03-02T08:00:00Z")));
        assert!(matches!(Timing::parse("0 9 * *", "UTC"), Err(TimingError::Cron(_))));
        assert!(matches!(Timing::parse("0 0 9 * * * 2027", "UTC"), Err(TimingError::Cron(_))));
        assert!(matches!(Timing::parse("61 * * * *", "UTC"), Err(TimingError::Cron(_))));
        assert!(matches!(Timing::parse("0 9 * * *", "Mars/Olympus"), Err(TimingError::Timezone(_))));
    }

    /// Issue 35, finding 17: a schedule made at `…00.640` fired 640 ms late.
    #[test]
    fn fires_fall_on_whole_seconds_whatever_the_milliseconds_of_now() {
        let minutely = Timing::parse("* * * * *", "UTC").unwrap();
        assert_eq!(minutely.next_after(at("2026-03-02T12:00:00.640Z")), Some(at("2026-03-02T12:01:00Z")));
        assert_eq!(minutely.next_after(at("2026-03-02T12:00:59.999Z")), Some(at("2026-03-02T12:01:00Z")));
        let every_second = Timing::parse("* * * * * *", "UTC").unwrap();
        assert_eq!(every_second.next_after(at("2026-03-02T12:00:00.640Z")), Some(at("2026-03-02T12:00:01Z")));
        assert_eq!(every_second.next_after(at("2026-03-02T12:00:01Z")), Some(at("2026-03-02T12:00:02Z")));
        assert_eq!(minutely.last_at_or_before(at("2026-03-02T12:01:00.640Z")), Some(at("2026-03-02T12:01:00Z")));
    }

    /// What `schedules.min_interval_secs` is checked against at create.
    #[test]
    fn the_shortest_gap_between_fires_is_found_however_rarely_it_comes() {
        let now = at("2026-03-02T12:00:00.640Z");
        let gap = |cron: &str| Timing::parse(cron, "UTC").unwrap().shortest_gap(now);
        assert_eq!(gap("* * * * * *"), Some(1_000));
        assert_eq!(gap("*/10 * * * * *"), Some(10_000));
        assert_eq!(gap("0,30 * * * * *"), Some(30_000));
        assert_eq!(gap("* * * * *"), Some(60_000));
        assert_eq!(gap("0 9 * * *"), Some(86_400_000));
        assert_eq!(gap("59 23 * * *"), Some(86_400_000));
        // Four times a day, 23:59 and the next day's 00:00 a minute apart.
        assert_eq!(gap("0,59 0,23 * * *"), Some(60_000));
        // Every second, on one day of the year only.
        assert_eq!(gap("* * * 1 1 *"), Some(1_000));
        assert_eq!(gap("0 0 1 1 *"), Some(365 * 86_400_000));
    }
}

#[cfg(test)]
mod clock_changes {
    use super::Timing;

    fn at(text: &str) -> i64 {
        chrono::DateTime::parse_from_rfc3339(text).unwrap().timestamp_millis()
    }

    /// What docs/schedules.md says of summer time.
    #[test]
    fn a_skipped_time_fires_at_the_jump_and_a_doubled_one_fires_once() {
        let half_past_two = Timing::parse("30 2 * * *", "Europe/Oslo").unwrap();
        // Spring: 02:00 jumps to 03:00 on 2026-03-29; 02:30 never comes, it fires at 03:00.
        assert_eq!(half_past_two.next_after(at("2026-03-28T23:00:00Z")), Some(at("2026-03-29T01:00:00Z")));
        // Autumn: 03:00 falls back to 02:00 on 2026-10-25; 02:30 comes twice, it fires the
        // first time, then the next day.
        let first = half_past_two.next_after(at("2026-10-24T23:00:00Z")).unwrap();
        assert_eq!(first, at("2026-10-25T00:30:00Z"));
        assert_eq!(half_past_two.next_after(first), Some(at("2026-10-26T01:30:00Z")));
    }
}
