//! Decoding a chunked request body (RFC 9112 §7.1), incrementally, with a size limit.
//!
//! Pure logic, fed by the gate as bytes arrive. The gate decodes the whole body before
//! tiny_http sees it and forwards it with a `Content-Length`, so tiny_http never reads chunked
//! framing from a client and the body limit holds for chunked bodies as it does for declared ones.

use super::EdgeError;

/// A chunk-size line or a trailer line longer than this is not a chunked body.
const MAX_LINE: usize = 4096;
/// Trailer fields after the last chunk, all together.
const MAX_TRAILERS: usize = 16 * 1024;

/// How far a decode got with the bytes it was given.
#[derive(Debug, PartialEq, Eq)]
pub enum Progress {
    /// More bytes are needed.
    Partial,
    /// The body ended; what is left in the buffer is the next request.
    Done,
}

#[derive(Debug, Default)]
pub struct Decoder {
    /// The decoded body so far.
    pub body: Vec<u8>,
    state: State,
}

#[derive(Debug, Default, PartialEq, Eq)]
enum State {
    /// At a chunk-size line.
    #[default]
    Size,
    /// Inside a chunk's data, this many bytes left.
    Data(usize),
    /// After a chunk's data: its CRLF.
    DataEnd,
    /// After the last chunk: trailer lines until an empty one.
    Trailers { seen: usize },
}

impl Decoder {
    /// Decodes what it can of `buffer` and removes it from the front, so the buffer never
    /// holds more than one unfinished line, however the body is cut into chunks.
    pub fn feed(&mut self, buffer: &mut Vec<u8>, limit: usize) -> Result<Progress, EdgeError> {
        let mut position = 0;
        let progress = self.decode(buffer, &mut position, limit);
        buffer.drain(..position);
        progress
    }

    fn decode(&mut self, input: &[u8], position: &mut usize, limit: usize) -> Result<Progress, EdgeError> {
        loop {
            let rest = &input[*position..];
            match self.state {
                State::Size => {
                    let Some(line) = line(rest)? else { return Ok(Progress::Partial) };
                    let size = chunk_size(&rest[..line])?;
                    *position += line + 2;
                    if size == 0 {
                        self.state = State::Trailers { seen: 0 };
                    } else if self.body.len().saturating_add(size) > limit {
                        return Err(EdgeError::BodyTooLarge { limit });
                    } else {
                        self.state = State::Data(size);
                    }
                }
                State::Data(left) => {
                    if rest.is_empty() {
                        return Ok(Progress::Partial);
                    }
                    let take = left.min(rest.len());
                    self.body.extend_from_slice(&rest[..take]);
                    *position += take;
                    self.state = if take == left { State::DataEnd } else { State::Data(left - take) };
                }
                State::DataEnd => {
                    if rest.len() < 2 {
                        return Ok(Progress::Partial);
                    }
                    if &rest[..2] != b"\r\n" {
                        return Err(bad("a chunk's data must end with CRLF"));
                    }
                    *position += 2;
                    self.state = State::Size;
                }
                State::Trailers { seen } => {
                    let Some(line) = line(rest)? else { return Ok(Progress::Partial) };
                    *position += line + 2;
                    if line == 0 {
                        return Ok(Progress::Done);
                    }
                    if seen + line > MAX_TRAILERS {
                        return Err(EdgeError::HeadTooLarge);
                    }
                    self.state = State::Trailers { seen: seen + line };
                }
            }
        }
    }
}

fn bad(message: &str) -> EdgeError {
    EdgeError::BadRequest(message.to_string())
}

/// The length of the CRLF-ended line at the start of `input`, without the CRLF.
fn line(input: &[u8]) -> Result<Option<usize>, EdgeError> {
    match input.windows(2).position(|w| w == b"\r\n") {
        Some(end) if end <= MAX_LINE => Ok(Some(end)),
        Some(_) => Err(bad("a chunk line is too long")),
        None if input.len() > MAX_LINE => Err(bad("a chunk line is too long")),
        None => Ok(None),
    }
}

/// A chunk-size line: hex digits, then optional `;extensions`, which are ignored.
fn chunk_size(line: &[u8]) -> Result<usize, EdgeError> {
    let digits = line.split(|&b| b == b';').next().unwrap_or_default();
    let digits = std::str::from_utf8(digits).map_err(|_| bad("a chunk size must be hexadecimal"))?.trim_end();
    if digits.is_empty() || digits.len() > 15 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad("a chunk size must be hexadecimal"));
    }
    usize::from_str_radix(digits, 16).map_err(|_| bad("a chunk size must be hexadecimal"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(input: &[u8], limit: usize) -> Result<(Vec<u8>, Vec<u8>), EdgeError> {
        let mut decoder = Decoder::default();
        let mut buffer = input.to_vec();
        match decoder.feed(&mut buffer, limit)? {
            Progress::Done => Ok((decoder.body, buffer)),
            Progress::Partial => Err(bad("partial")),
        }
    }

    #[test]
    fn decodes_chunks_extensions_and_trailers_and_stops_at_the_end() {
        let input = b"4\r\nWiki\r\n5;ext=1\r\npedia\r\n0\r\nX-Trailer: y\r\n\r\nGET /next";
        let (body, rest) = decode_all(input, 100).unwrap();
        assert_eq!(body, b"Wikipedia");
        assert_eq!(rest, b"GET /next");
    }

    #[test]
    fn decodes_byte_by_byte_keeping_only_an_unfinished_line() {
        let input = b"3\r\nabc\r\nA;with-a-long-extension\r\n0123456789\r\n0\r\n\r\n";
        let mut decoder = Decoder::default();
        let mut buffer = Vec::new();
        for (index, byte) in input.iter().enumerate() {
            buffer.push(*byte);
            let progress = decoder.feed(&mut buffer, 100).unwrap();
            assert!(buffer.len() <= 27, "at {index}: {} bytes held", buffer.len());
            assert_eq!(progress == Progress::Done, index == input.len() - 1, "at {index}");
        }
        assert_eq!(decoder.body, b"abc0123456789");
    }

    #[test]
    fn refuses_bad_framing_and_bodies_past_the_limit() {
        let status = |input: &[u8]| decode_all(input, 10).map(|_| 200).unwrap_or_else(|e| e.status());
        assert_eq!(status(b"b\r\nhello world\r\n0\r\n\r\n"), 413);
        assert_eq!(status(b"6\r\nhello \r\n6\r\nworld!\r\n0\r\n\r\n"), 413);
        assert_eq!(status(b"fffffffffffffffff\r\n"), 400);
        assert_eq!(status(b"zz\r\n"), 400);
        assert_eq!(status(b"\r\n"), 400);
        assert_eq!(status(b"-1\r\n"), 400);
        assert_eq!(status(b"3\r\nabcX\r\n0\r\n\r\n"), 400);
        assert_eq!(status(&[b'1'; 5000]), 400);
    }
}
