//! One incremental server-sent-events parser for every wire format.
//!
//! Fed raw bytes as they come off the socket, in pieces of any size. Lines end in LF, CRLF or
//! CR, and a CR that ends one piece may be followed by the LF that starts the next. Bytes are
//! kept until a line is complete, so a UTF-8 character split across reads is decoded whole
//! (a line break is ASCII and never falls inside a character). Comments (`:`) are skipped;
//! several `data:` lines join with `\n`; an event is dispatched at a blank line.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, if any.
    pub event: Option<String>,
    pub data: String,
}

#[derive(Default)]
pub struct SseParser {
    /// Bytes of the line not yet complete.
    line: Vec<u8>,
    /// The last byte fed was a CR: an LF that comes next belongs to the same line break.
    after_cr: bool,
    event: Option<String>,
    data: Option<String>,
}

impl SseParser {
    /// Feeds bytes; returns the events completed by them, in order.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Vec<SseEvent> {
        let mut events = Vec::new();
        while !bytes.is_empty() {
            if self.after_cr && bytes[0] == b'\n' {
                bytes = &bytes[1..];
            }
            self.after_cr = false;
            // Copy whole runs of line content at once; only line ends are looked at one by one.
            let Some(end) = bytes.iter().position(|&b| b == b'\n' || b == b'\r') else {
                self.line.extend_from_slice(bytes);
                break;
            };
            self.after_cr = bytes[end] == b'\r';
            let event = if self.line.is_empty() {
                self.line_done(&bytes[..end])
            } else {
                self.line.extend_from_slice(&bytes[..end]);
                let line = std::mem::take(&mut self.line);
                let event = self.line_done(&line);
                self.line = line;
                self.line.clear();
                event
            };
            events.extend(event);
            bytes = &bytes[end + 1..];
        }
        events
    }

    /// Dispatches an event left open when the stream ends without a final blank line.
    pub fn finish(&mut self) -> Option<SseEvent> {
        let line = std::mem::take(&mut self.line);
        if !line.is_empty() {
            if let Some(event) = self.line_done(&line) {
                return Some(event);
            }
        }
        self.dispatch()
    }

    fn line_done(&mut self, line: &[u8]) -> Option<SseEvent> {
        if line.is_empty() {
            return self.dispatch();
        }
        let line = String::from_utf8_lossy(line);
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line.as_ref(), ""),
        };
        match field {
            "data" => {
                let data = self.data.get_or_insert_with(String::new);
                data.push_str(value);
                data.push('\n');
            }
            "event" => self.event = Some(value.to_string()),
            _ => {} // id, retry and unknown fields mean nothing to a model stream
        }
        None
    }

    fn dispatch(&mut self) -> Option<SseEvent> {
        let event = self.event.take();
        let mut data = self.data.take()?;
        data.pop(); // the newline after the last data line
        Some(SseEvent { event, data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &str = "event: message_start\r\ndata: {\"a\":\"h\u{e9}llo \u{1F980}\"}\r\n\r\n\
: a comment\n\
data: line one\n\
data: line two\n\
\n\
data: [DONE]\r\r";

    fn expected() -> Vec<SseEvent> {
        vec![
            SseEvent { event: Some("message_start".into()), data: "{\"a\":\"h\u{e9}llo \u{1F980}\"}".into() },
            SseEvent { event: None, data: "line one\nline two".into() },
            SseEvent { event: None, data: "[DONE]".into() },
        ]
    }

    #[test]
    fn parses_the_same_events_at_every_split() {
        let bytes = STREAM.as_bytes();
        for split in 0..=bytes.len() {
            let mut parser = SseParser::default();
            let mut events = parser.feed(&bytes[..split]);
            events.extend(parser.feed(&bytes[split..]));
            events.extend(parser.finish());
            assert_eq!(events, expected(), "split at byte {split}");
        }
    }

    #[test]
    fn parses_one_byte_at_a_time() {
        let mut parser = SseParser::default();
        let mut events = Vec::new();
        for byte in STREAM.as_bytes() {
            events.extend(parser.feed(std::slice::from_ref(byte)));
        }
        events.extend(parser.finish());
        assert_eq!(events, expected());
    }

    #[test]
    fn an_unterminated_last_event_is_dispatched_at_the_end() {
        let mut parser = SseParser::default();
        assert!(parser.feed(b"data: tail").is_empty());
        assert_eq!(parser.finish(), Some(SseEvent { event: None, data: "tail".into() }));
        assert_eq!(parser.finish(), None);
    }
}
