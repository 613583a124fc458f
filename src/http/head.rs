//! Screening a request head before tiny_http sees it.
//!
//! Pure logic, run on the connection's `kestrel-conn` thread. A head that passes is at least
//! as strict as what tiny_http 0.12 accepts (ASCII everywhere, `Name: value` lines, HTTP/1.0 or
//! 1.1), so tiny_http never rejects what the gate forwards; what fails is answered here with the
//! status RFC 9110/9112 gives it. The declared body length is checked against the limit here,
//! which is what keeps tiny_http's body drain from ever allocating what a client merely claims.

use super::EdgeError;

/// Header lines a head may carry at most.
pub const MAX_HEADERS: usize = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    Http10,
    Http11,
}

impl Version {
    pub fn as_str(self) -> &'static str {
        match self {
            Version::Http10 => "HTTP/1.0",
            Version::Http11 => "HTTP/1.1",
        }
    }
}

/// A head that passed screening.
#[derive(Debug, Clone)]
pub struct Head {
    pub method: String,
    pub target: String,
    pub version: Version,
    /// Every header line, names as sent, values trimmed.
    pub headers: Vec<(String, String)>,
    pub content_length: usize,
    /// The body comes in chunks (`Transfer-Encoding: chunked`); `content_length` is 0 until
    /// the gate has decoded it.
    pub chunked: bool,
    /// `Expect: 100-continue` was sent.
    pub expect_continue: bool,
    /// The client wants the connection kept open after this exchange.
    pub keep_alive: bool,
}

impl Head {
    /// The path part of the target, for choosing how to word an error.
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }

    /// The head as it goes to tiny_http: the same request line and headers, minus those the gate
    /// handles itself (connection management, `Expect`, our own connection id), plus `conn_header`.
    pub fn forwarded(&self, conn_header: &str, conn_id: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(format!("{} {} HTTP/1.1\r\n", self.method, self.target).as_bytes());
        for (name, value) in &self.headers {
            let hop_by_hop =
                ["connection", "keep-alive", "expect", "te", "transfer-encoding", "upgrade", "proxy-connection"]
                    .iter()
                    .any(|h| name.eq_ignore_ascii_case(h));
            if hop_by_hop || name.eq_ignore_ascii_case(conn_header) || name.eq_ignore_ascii_case("content-length") {
                continue;
            }
            out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
        if self.content_length > 0 {
            out.extend_from_slice(format!("Content-Length: {}\r\n", self.content_length).as_bytes());
        }
        out.extend_from_slice(format!("{conn_header}: {conn_id}\r\n\r\n").as_bytes());
        out
    }
}

/// Where the head ends in `buffer`: the index just past its blank line.
pub fn head_end(buffer: &[u8]) -> Option<usize> {
    buffer.windows(4).position(|w| w == b"\r\n\r\n").map(|at| at + 4)
}

/// The path of a request line that may be malformed otherwise, for wording an early error.
pub fn rough_path(buffer: &[u8]) -> Option<String> {
    let line = buffer.split(|&b| b == b'\n').next()?;
    let target = line.split(|&b| b == b' ').nth(1)?;
    let target = std::str::from_utf8(target).ok()?;
    Some(target.split('?').next().unwrap_or("").to_string())
}

/// Screens a request line alone (ending in CRLF), so garbage is refused before a whole head
/// has arrived.
pub fn check_request_line(line: &[u8]) -> Result<(), EdgeError> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    parse_request_line(strip_cr(line)?).map(|_| ())
}

/// Screens a complete head (through its blank line) against `body_limit`.
pub fn parse(head: &[u8], body_limit: usize) -> Result<Head, EdgeError> {
    // Without the blank line's `\n\r\n`, every line still ends in its `\r`.
    let text = head.strip_suffix(b"\n\r\n").ok_or_else(|| bad("the request head must end with a blank line"))?;
    let mut lines = text.split(|&b| b == b'\n');
    let request_line = lines.next().unwrap_or_default();
    let (method, target, version) = parse_request_line(strip_cr(request_line)?)?;
    let mut parsed = Head {
        method,
        target,
        version,
        headers: Vec::new(),
        content_length: 0,
        chunked: false,
        expect_continue: false,
        keep_alive: version == Version::Http11,
    };
    let mut content_length: Option<u64> = None;
    for line in lines {
        let line = strip_cr(line)?;
        if parsed.headers.len() == MAX_HEADERS {
            return Err(EdgeError::HeadTooLarge);
        }
        let (name, value) = parse_header(line)?;
        if name.eq_ignore_ascii_case("content-length") {
            let length = parse_length(&value)?;
            if content_length.is_some_and(|seen| seen != length) {
                return Err(bad("conflicting Content-Length headers"));
            }
            content_length = Some(length);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            // Only `chunked`, once, on HTTP/1.1; any other coding the body would need undoing.
            if parsed.chunked || version == Version::Http10 {
                return Err(bad("Transfer-Encoding is not accepted here"));
            }
            if !value.eq_ignore_ascii_case("chunked") {
                return Err(EdgeError::LengthRequired);
            }
            parsed.chunked = true;
        } else if name.eq_ignore_ascii_case("expect") {
            if !value.eq_ignore_ascii_case("100-continue") {
                return Err(EdgeError::ExpectationFailed);
            }
            parsed.expect_continue = true;
        } else if name.eq_ignore_ascii_case("connection") {
            for option in value.split(',').map(str::trim) {
                if option.eq_ignore_ascii_case("close") {
                    parsed.keep_alive = false;
                } else if option.eq_ignore_ascii_case("keep-alive") && version == Version::Http10 {
                    parsed.keep_alive = true;
                }
            }
        }
        parsed.headers.push((name, value));
    }
    // Any `Connection: close` wins over a keep-alive seen earlier.
    if parsed.headers.iter().any(|(n, v)| {
        n.eq_ignore_ascii_case("connection") && v.split(',').any(|o| o.trim().eq_ignore_ascii_case("close"))
    }) {
        parsed.keep_alive = false;
    }
    if parsed.chunked && content_length.is_some() {
        // Both framings at once is how requests are smuggled past proxies.
        return Err(bad("a request cannot have both Content-Length and Transfer-Encoding"));
    }
    let length = content_length.unwrap_or(0);
    if length > body_limit as u64 {
        return Err(EdgeError::BodyTooLarge { limit: body_limit });
    }
    parsed.content_length = length as usize;
    Ok(parsed)
}

fn bad(message: &str) -> EdgeError {
    EdgeError::BadRequest(message.to_string())
}

/// Every line ends in CRLF; a bare LF is refused (tiny_http would read it differently).
fn strip_cr(line: &[u8]) -> Result<&[u8], EdgeError> {
    line.strip_suffix(b"\r").ok_or_else(|| bad("header lines must end with CRLF"))
}

fn parse_request_line(line: &[u8]) -> Result<(String, String, Version), EdgeError> {
    let mut parts = line.split(|&b| b == b' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("the request line must be `METHOD TARGET HTTP/1.1`"));
    };
    let version = parse_version(version)?;
    if method.is_empty() || !method.iter().all(|&b| is_tchar(b)) {
        return Err(bad("the method is not a valid token"));
    }
    if target.is_empty() || !target.iter().all(|&b| b.is_ascii_graphic()) {
        return Err(bad("the request target must be visible ASCII; percent-encode other bytes"));
    }
    let target = origin_form(target).ok_or_else(|| bad("the request target must be a path starting with `/`"))?;
    Ok((ascii(method), ascii(target), version))
}

/// The path and query of a target: as sent (`/a?b`, `*`), or out of the absolute form
/// (`http://host/a?b`) that RFC 9112 §3.2.2 says a server must accept.
fn origin_form(target: &[u8]) -> Option<&[u8]> {
    if target[0] == b'/' || target == b"*" {
        return Some(target);
    }
    let lower = target.to_ascii_lowercase();
    let scheme = [&b"http://"[..], &b"https://"[..]].into_iter().find(|s| lower.starts_with(s))?;
    let rest = &target[scheme.len()..];
    match rest.iter().position(|&b| b == b'/' || b == b'?') {
        Some(at) if rest[at] == b'/' => Some(&rest[at..]),
        // `http://host` and `http://host?q` name the root.
        _ => Some(b"/"),
    }
}

fn parse_version(version: &[u8]) -> Result<Version, EdgeError> {
    match version {
        b"HTTP/1.1" => Ok(Version::Http11),
        b"HTTP/1.0" => Ok(Version::Http10),
        _ => {
            // `HTTP/2.0` (the HTTP/2 preface's request line), `HTTP/3`, `HTTP/9.9`: a version
            // this server does not speak. Anything else is not HTTP at all.
            let digits = version.strip_prefix(b"HTTP/").unwrap_or_default();
            let well_formed = !digits.is_empty() && digits.iter().all(|&b| b.is_ascii_digit() || b == b'.');
            if well_formed && digits[0] != b'0' && digits[0] != b'1' {
                Err(EdgeError::VersionNotSupported)
            } else {
                Err(bad("the request line must end with HTTP/1.0 or HTTP/1.1"))
            }
        }
    }
}

fn parse_header(line: &[u8]) -> Result<(String, String), EdgeError> {
    if line.first().is_some_and(|&b| b == b' ' || b == b'\t') {
        return Err(bad("folded header lines are not accepted"));
    }
    let colon = line.iter().position(|&b| b == b':').ok_or_else(|| bad("a header line has no `:`"))?;
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
        return Err(bad("a header name is not a valid token"));
    }
    if !value.iter().all(|&b| b == b'\t' || (b' '..=b'~').contains(&b)) {
        return Err(bad("header values must be printable ASCII"));
    }
    Ok((ascii(name), ascii(value).trim().to_string()))
}

/// A Content-Length: decimal digits only (no sign, no spaces), at most 19 of them.
fn parse_length(value: &str) -> Result<u64, EdgeError> {
    if value.is_empty() || value.len() > 19 || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("Content-Length must be a decimal number"));
    }
    value.parse().map_err(|_| bad("Content-Length must be a decimal number"))
}

/// RFC 9110 `tchar`.
fn is_tchar(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte)
}

/// Bytes already checked to be ASCII.
fn ascii(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| b as char).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn screen(head: &str) -> Result<Head, EdgeError> {
        parse(head.as_bytes(), 1000)
    }

    #[test]
    fn accepts_an_ordinary_head_and_forwards_it_normalized() {
        let head = screen(
            "POST /api/x?y=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nConnection: keep-alive\r\n\
             Expect: 100-continue\r\nX-Kestrel-Conn: 99\r\n\r\n",
        )
        .unwrap();
        assert_eq!((head.method.as_str(), head.path(), head.version), ("POST", "/api/x", Version::Http11));
        assert_eq!(head.content_length, 5);
        assert!(head.expect_continue && head.keep_alive);
        let forwarded = String::from_utf8(head.forwarded("X-Kestrel-Conn", 7)).unwrap();
        assert_eq!(forwarded, "POST /api/x?y=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nX-Kestrel-Conn: 7\r\n\r\n");
    }

    #[test]
    fn an_absolute_target_is_taken_as_its_path() {
        let target = |line: &str| screen(&format!("GET {line} HTTP/1.1\r\n\r\n")).unwrap().target;
        assert_eq!(target("http://example.com/api/health?x=1"), "/api/health?x=1");
        assert_eq!(target("HTTPS://example.com:8080/a"), "/a");
        assert_eq!(target("http://example.com"), "/");
        assert_eq!(target("*"), "*");
    }

    #[test]
    fn keep_alive_follows_the_version_and_the_connection_header() {
        assert!(!screen("GET / HTTP/1.0\r\n\r\n").unwrap().keep_alive);
        assert!(screen("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").unwrap().keep_alive);
        assert!(!screen("GET / HTTP/1.1\r\nConnection: close\r\n\r\n").unwrap().keep_alive);
        assert!(!screen("GET / HTTP/1.1\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n").unwrap().keep_alive);
    }

    #[test]
    fn refuses_what_tiny_http_would_mishandle() {
        let status = |head: &str| screen(head).map(|_| 200).unwrap_or_else(|e| e.status());
        assert_eq!(status("GET /é HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(status("GET / HTTP/1.1\r\nX-Name: caf\u{e9}\r\n\r\n"), 400);
        assert_eq!(status("GET / HTTP/2.0\r\n\r\n"), 505);
        assert_eq!(status("PRI * HTTP/2.0\r\n\r\n"), 505);
        assert_eq!(status("GET / HTTP/3\r\n\r\n"), 505);
        assert_eq!(status("GET / HTTP/1.2x\r\n\r\n"), 400);
        assert_eq!(status("GET / FOO\r\n\r\n"), 400);
        assert_eq!(status("GET  / HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(status("GET / HTTP/1.1\nHost: a\r\n\r\n"), 400);
        assert_eq!(status("GET / HTTP/1.1\r\n folded\r\n\r\n"), 400);
        assert_eq!(status("GET / HTTP/1.1\r\nNo colon\r\n\r\n"), 400);
        assert_eq!(status("GET / HTTP/1.1\r\nBad Name: x\r\n\r\n"), 400);
        assert_eq!(status("GET ftp://a/ HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(status("GET api/x HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(status("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"), 411);
        assert_eq!(status("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"), 400);
        assert_eq!(status("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"), 400);
        assert_eq!(status("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"), 400);
        assert!(screen("POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n").unwrap().chunked);
        assert_eq!(status("GET / HTTP/1.1\r\nExpect: 200-ok\r\n\r\n"), 417);
    }

    #[test]
    fn content_length_is_plain_digits_within_the_limit() {
        let status = |length: &str| {
            screen(&format!("POST / HTTP/1.1\r\nContent-Length: {length}\r\n\r\n"))
                .map(|_| 200)
                .unwrap_or_else(|e| e.status())
        };
        assert_eq!(status("1000"), 200);
        assert_eq!(status("1001"), 413);
        assert_eq!(status("999999999999"), 413);
        assert_eq!(status("18446744073709551615"), 400, "20 digits");
        assert_eq!(status("9999999999999999999"), 413, "19 digits, past any limit");
        assert_eq!(status("+5"), 400);
        assert_eq!(status("-1"), 400);
        assert_eq!(status("5 5"), 400);
        assert_eq!(status(""), 400);
        let twice = screen("POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n");
        assert_eq!(twice.unwrap_err().status(), 400);
        assert_eq!(
            screen("POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n").unwrap().content_length,
            3
        );
    }

    #[test]
    fn too_many_headers_are_431() {
        let mut head = String::from("GET / HTTP/1.1\r\n");
        for i in 0..=MAX_HEADERS {
            head.push_str(&format!("X-{i}: v\r\n"));
        }
        head.push_str("\r\n");
        assert_eq!(screen(&head).unwrap_err().status(), 431);
    }

    #[test]
    fn finds_the_end_of_a_head_and_a_rough_path() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nrest"), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n"), None);
        assert_eq!(rough_path(b"GET /api/v1/x?y HTTP/9\r\n").as_deref(), Some("/api/v1/x"));
    }
}
