//! The shared pagination of every BAE list: `?cursor=<opaque>&limit=<n>`.

use super::problem::Problem;
use crate::http::Request;

pub const DEFAULT_LIMIT: usize = 50;
pub const MAX_LIMIT: usize = 200;

/// The cursor (what the previous page ended at; empty or absent: the start) and the limit
/// (default 50; above 200, however far, is 200; not a positive integer: 400).
pub fn parse(request: &Request) -> Result<(u64, usize), Problem> {
    let after = match request.query("cursor") {
        None | Some("") => 0,
        // Past every seq there is: an empty page (the store's seqs are SQLite integers).
        Some(cursor) if cursor.bytes().all(|b| b.is_ascii_digit()) => {
            cursor.parse::<u64>().unwrap_or(u64::MAX).min(i64::MAX as u64)
        }
        Some(cursor) => return Err(Problem::bad_request(format!("invalid cursor: {cursor:?}"))),
    };
    let limit = match request.query("limit") {
        None => DEFAULT_LIMIT,
        // Any positive integer, however large, means "as many as a page holds".
        Some(limit) if !limit.is_empty() && limit.bytes().all(|b| b.is_ascii_digit()) => {
            match limit.trim_start_matches('0') {
                "" => return Err(Problem::bad_request("limit must be a positive integer")),
                digits => digits.parse::<usize>().map_or(MAX_LIMIT, |n| n.min(MAX_LIMIT)),
            }
        }
        Some(_) => return Err(Problem::bad_request("limit must be a positive integer")),
    };
    Ok((after, limit))
}
