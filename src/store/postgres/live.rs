//! The payloads of `kestrel_live` (docs/cluster.md, streams): how the deltas one transaction
//! streams are cut into notifications, each under PostgreSQL's 8000 bytes, and put together
//! again by a listener.
//!
//! Small deltas travel as a JSON array of events, as many as fit. A delta too large for one
//! payload travels in parts: `{"seq", "part", "parts", "data"}` objects, `data` the base64 of a
//! slice of the event's JSON. PostgreSQL hands a listener one transaction's notifications
//! together and in the order they were sent, so a listener keeps one delta in assembly and
//! drops it at any part that does not follow on.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::super::LoggedEvent;

/// The most a notification's payload holds (PostgreSQL refuses 8000 bytes or more).
const PAYLOAD_BYTES: usize = 7_800;
/// The bytes of JSON a part carries: 7,468 once in base64, with room for the envelope.
const PART_BYTES: usize = 5_600;
/// The largest delta (its JSON) sent to other nodes: 1 MiB, 188 parts. A provider's streamed
/// piece is far smaller; a larger one is streamed at its own node only.
const MAX_DELTA_BYTES: usize = 1 << 20;
/// The most parts a listener puts together, whatever a payload claims.
const MAX_PARTS: usize = MAX_DELTA_BYTES.div_ceil(PART_BYTES);

/// A slice of one delta too large for a payload of its own.
#[derive(Serialize, Deserialize)]
struct Part {
    seq: u64,
    part: usize,
    parts: usize,
    data: String,
}

/// The payloads that carry `live` (deltas at their places after `first`), in order.
pub fn payloads(first: u64, live: &[(usize, LoggedEvent)]) -> Vec<String> {
    let mut out = Vec::new();
    let mut batch = String::from("[");
    for (place, event) in live {
        let event = LoggedEvent { seq: first + *place as u64, ..event.clone() };
        let Ok(json) = serde_json::to_string(&event) else { continue };
        if json.len() + 2 > PAYLOAD_BYTES {
            if json.len() <= MAX_DELTA_BYTES {
                close(&mut batch, &mut out);
                out.extend(parts(event.seq, &json));
            }
            continue;
        }
        if batch.len() + json.len() + 2 > PAYLOAD_BYTES {
            close(&mut batch, &mut out);
        }
        if batch.len() > 1 {
            batch.push(',');
        }
        batch.push_str(&json);
    }
    close(&mut batch, &mut out);
    out
}

/// Ends the array being filled, if it holds anything, and starts another.
fn close(batch: &mut String, out: &mut Vec<String>) {
    if batch.len() > 1 {
        batch.push(']');
        out.push(std::mem::replace(batch, String::from("[")));
    }
}

fn parts(seq: u64, json: &str) -> impl Iterator<Item = String> + '_ {
    let slices: Vec<&[u8]> = json.as_bytes().chunks(PART_BYTES).collect();
    let parts = slices.len();
    slices.into_iter().enumerate().map(move |(part, slice)| {
        let part = Part { seq, part, parts, data: STANDARD.encode(slice) };
        serde_json::to_string(&part).unwrap_or_default()
    })
}

/// A listener's side: the delta being put together, if any.
#[derive(Default)]
pub struct Assembly {
    pending: Option<(Part, Vec<u8>)>,
}

impl Assembly {
    /// The deltas a payload completes: an array's, or a whole delta at its last part. A
    /// payload that is neither (or a part that does not follow on) completes nothing.
    pub fn hear(&mut self, payload: &str) -> Vec<LoggedEvent> {
        if payload.starts_with('[') {
            self.pending = None;
            return serde_json::from_str(payload).unwrap_or_default();
        }
        let Ok(part) = serde_json::from_str::<Part>(payload) else {
            self.pending = None;
            return Vec::new();
        };
        let Ok(data) = STANDARD.decode(&part.data) else {
            self.pending = None;
            return Vec::new();
        };
        let follows = match &self.pending {
            Some((last, _)) => last.seq == part.seq && last.parts == part.parts && last.part + 1 == part.part,
            None => part.part == 0,
        };
        if !follows || part.parts > MAX_PARTS || data.len() > PART_BYTES {
            self.pending = None;
            return Vec::new();
        }
        let mut json = self.pending.take().map(|(_, json)| json).unwrap_or_default();
        json.extend_from_slice(&data);
        if part.part + 1 < part.parts {
            self.pending = Some((Part { data: String::new(), ..part }, json));
            return Vec::new();
        }
        serde_json::from_slice(&json).map(|event| vec![event]).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(text: &str) -> LoggedEvent {
        LoggedEvent {
            seq: 0,
            tenant: Some("acme".into()),
            session_id: Some("s".into()),
            actor: None,
            kind: "message.delta".into(),
            at: "2026-12-02T00:00:00Z".into(),
            body: serde_json::json!({ "type": "message.delta", "delta": text }).to_string(),
            form: 1,
        }
    }

    fn heard(payloads: &[String]) -> Vec<LoggedEvent> {
        let mut assembly = Assembly::default();
        payloads.iter().flat_map(|payload| assembly.hear(payload)).collect()
    }

    #[test]
    fn small_and_large_deltas_arrive_whole_in_order_in_payloads_postgresql_accepts() {
        // Multi-byte characters and characters JSON escapes, cut wherever a part ends.
        let large: String = "é\"ü\\\n😀".repeat(4_000);
        let live: Vec<(usize, LoggedEvent)> =
            vec![(0, delta("a")), (1, delta(&large)), (2, delta("b")), (3, delta(&"c".repeat(7_000)))];
        let payloads = payloads(100, &live);
        assert!(payloads.iter().all(|p| p.len() < PAYLOAD_BYTES), "every payload fits a notification");
        assert!(payloads.len() > 5, "the large delta went in parts: {}", payloads.len());
        let expected: Vec<LoggedEvent> =
            live.iter().map(|(place, e)| LoggedEvent { seq: 100 + *place as u64, ..e.clone() }).collect();
        assert_eq!(heard(&payloads), expected);
    }

    #[test]
    fn a_delta_over_the_limit_is_not_sent() {
        let live = vec![(0, delta(&"x".repeat(MAX_DELTA_BYTES))), (1, delta("after"))];
        let heard = heard(&payloads(7, &live));
        assert_eq!(heard.len(), 1);
        assert_eq!(heard[0].seq, 8);
    }

    #[test]
    fn parts_that_do_not_follow_on_complete_nothing() {
        let whole = payloads(1, &[(0, delta(&"y".repeat(20_000)))]);
        assert_eq!(whole.len(), 4);
        // Missing, repeated, out of order, or broken by another payload.
        for broken in [
            vec![whole[0].clone(), whole[1].clone(), whole[3].clone()],
            vec![whole[0].clone(), whole[1].clone(), whole[1].clone(), whole[2].clone(), whole[3].clone()],
            vec![whole[1].clone(), whole[2].clone(), whole[3].clone()],
            vec![whole[0].clone(), whole[1].clone(), "[]".into(), whole[2].clone(), whole[3].clone()],
        ] {
            assert!(heard(&broken).is_empty());
        }
        // A part claiming more parts than any delta has, or carrying more than a part holds.
        let claims = serde_json::json!({ "seq": 1, "part": 0, "parts": MAX_PARTS + 1, "data": "" }).to_string();
        let last = serde_json::json!({ "seq": 1, "part": 1, "parts": MAX_PARTS + 1, "data": "" }).to_string();
        assert!(heard(&[claims, last]).is_empty());
        let fat = STANDARD.encode(vec![b' '; PART_BYTES + 1]);
        let fat = serde_json::json!({ "seq": 1, "part": 0, "parts": 1, "data": fat }).to_string();
        assert!(heard(&[fat]).is_empty());
        // Garbage, and a whole delta after it.
        let mut assembly = Assembly::default();
        assert!(assembly.hear("{not json").is_empty());
        assert_eq!(whole.iter().flat_map(|p| assembly.hear(p)).count(), 1);
    }
}
