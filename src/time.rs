//! Wall-clock timestamps in the wire format (`2026-01-01T00:00:00.000Z`).
//!
//! Owns nothing; pure functions used by every thread. Written by hand because the only thing
//! the server needs from a date library is RFC 3339 output in UTC.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, now.
pub fn now_millis() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// `now_rfc3339` for one thread that stamps many events a millisecond (the bus): the text is
/// formatted once per millisecond and shared after that.
#[derive(Default)]
pub struct StampClock {
    millis: i64,
    text: Option<std::sync::Arc<str>>,
}

impl StampClock {
    /// The current time as `now_rfc3339` writes it.
    /// Shared: every event of the same millisecond holds the same text.
    pub fn now(&mut self) -> std::sync::Arc<str> {
        let millis = now_millis();
        match &self.text {
            Some(text) if millis == self.millis => text.clone(),
            _ => {
                self.millis = millis;
                let text: std::sync::Arc<str> = rfc3339_from_millis(millis).into();
                self.text = Some(text.clone());
                text
            }
        }
    }
}

/// The current time as an RFC 3339 UTC string with milliseconds.
pub fn now_rfc3339() -> String {
    rfc3339_from_millis(now_millis())
}

/// Formats milliseconds since the epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn rfc3339_from_millis(millis: i64) -> String {
    let secs = millis.div_euclid(1000);
    let ms = millis.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let secs_of_day = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        secs_of_day / 3600,
        (secs_of_day % 3600) / 60,
        secs_of_day % 60
    )
}

/// Converts days since 1970-01-01 into a proleptic Gregorian (year, month, day).
/// This is Howard Hinnant's `civil_from_days`, which is exact for every i64 day count we use.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339_from_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_from_millis(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339_from_millis(1_767_225_599_999), "2025-12-31T23:59:59.999Z");
    }
}
