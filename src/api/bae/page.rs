//! The shared pagination of every BAE list: `?cursor=<opaque>&limit=<n>`.

use super::problem::Problem;
use crate::http::Request;

pub const DEFAULT_LIMIT: usize = 50;
pub const MAX_LIMIT: usize = 200;

/// The cursor (what the previous page ended at; empty or absent: the start) and the limit
/// (default 50; above 200 is 200; not a positive integer: 400).
pub fn parse(request: &Request) -> Result<(u64, usize), Problem> {
    let after = match request.query("cursor") {
        None | Some("") => 0,
        Some(cursor) => {
            cursor.parse::<u64>().map_err(|_| Problem::bad_request(format!("invalid cursor: {cursor:?}")))?
        }
    };
    let limit = match request.query("limit") {
        None => DEFAULT_LIMIT,
        Some(limit) => match limit.parse::<i64>() {
            Ok(n) if n > 0 => (n as u64).min(MAX_LIMIT as u64) as usize,
            _ => return Err(Problem::bad_request("limit must be a positive integer")),
        },
    };
    Ok((after, limit))
}
