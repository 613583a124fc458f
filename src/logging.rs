//! The server's log: one line per record, as text (`[ts LEVEL target] message key=value…`) or,
//! with `KESTREL_LOG_FORMAT=json`, one JSON object per line (`ts`, `level`, `target`,
//! `message`, the record's key-values, and `request_id` for a line written while a request was
//! being handled).
//!
//! Nothing logged at info or above carries a secret or message content: keys are never logged,
//! and request and event bodies only at debug. At every level, every line is scrubbed before
//! it is written (`scrub`): the value of a credential header (`authorization`, `x-api-key`,
//! `api-key`, cookies, any header whose name says key, token, secret, password, auth or
//! session, and the header names configured for MCP servers) and a bearer token anywhere
//! become `***`, whoever logged them (ureq's debug dump of a request's head masks only
//! `Authorization` and `Cookie`: `x-api-key` went out in clear).

use std::borrow::Cow;
use std::io::Write;
use std::sync::{OnceLock, PoisonError, RwLock};

use regex::Regex;

/// How lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl LogFormat {
    /// `KESTREL_LOG_FORMAT`: `json`, or anything else (or unset) for text.
    pub fn from_env(value: Option<&str>) -> LogFormat {
        match value.map(str::trim) {
            Some(format) if format.eq_ignore_ascii_case("json") => LogFormat::Json,
            _ => LogFormat::Text,
        }
    }
}

/// Installs the logger with `filter` (env_logger's syntax).
pub fn init(filter: &str, format: LogFormat) {
    let mut builder = env_logger::Builder::new();
    builder.parse_filters(filter);
    match format {
        LogFormat::Json => builder.format(|out, record| writeln!(out, "{}", json_line(record))),
        LogFormat::Text => builder.format(|out, record| writeln!(out, "{}", text_line(record))),
    };
    builder.init();
}

/// Header names whose values are masked beyond the built-in ones (an MCP server's configured
/// headers), lower-cased. Process-wide, like the logger itself.
static MASKED_HEADERS: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Adds header names whose values the log masks (an MCP server's configured headers).
pub fn mask_headers<'a>(names: impl IntoIterator<Item = &'a str>) {
    let mut masked = MASKED_HEADERS.write().unwrap_or_else(PoisonError::into_inner);
    for name in names {
        let name = name.trim().to_ascii_lowercase();
        if !name.is_empty() && !masked.contains(&name) {
            masked.push(name);
        }
    }
}

fn header_line() -> &'static Regex {
    static HEADER: OnceLock<Regex> = OnceLock::new();
    HEADER.get_or_init(|| Regex::new(r"(?m)^([ \t]*)([A-Za-z0-9!#$%&'*+.^_`|~-]+)([ \t]*:[ \t]*)([^\r\n]*)").unwrap())
}

fn bearer() -> &'static Regex {
    static BEARER: OnceLock<Regex> = OnceLock::new();
    BEARER.get_or_init(|| Regex::new(r"(?i)\b(bearer|basic)([ \t]+)[A-Za-z0-9._~+/=:-]+").unwrap())
}

/// Whether a header of this name carries a credential.
fn credential(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    const WORDS: &[&str] = &["auth", "key", "token", "secret", "password", "cookie", "session", "credential"];
    WORDS.iter().any(|word| name.contains(word))
        || MASKED_HEADERS.read().unwrap_or_else(PoisonError::into_inner).contains(&name)
}

/// `text` with every credential header's value and every bearer token replaced by `***`.
pub fn scrub(text: &str) -> Cow<'_, str> {
    let masked = header_line().replace_all(text, |caps: &regex::Captures<'_>| match credential(&caps[2]) {
        true => format!("{}{}{}***", &caps[1], &caps[2], &caps[3]),
        false => caps[0].to_string(),
    });
    match bearer().replace_all(&masked, "$1$2***") {
        Cow::Borrowed(_) => masked,
        Cow::Owned(owned) => Cow::Owned(owned),
    }
}

/// A record's key-values, as JSON.
fn key_values(record: &log::Record<'_>) -> serde_json::Map<String, serde_json::Value> {
    struct Collect(serde_json::Map<String, serde_json::Value>);
    impl<'kvs> log::kv::VisitSource<'kvs> for Collect {
        fn visit_pair(&mut self, key: log::kv::Key<'kvs>, value: log::kv::Value<'kvs>) -> Result<(), log::kv::Error> {
            let value = match (value.to_u64(), value.to_i64(), value.to_borrowed_str()) {
                (Some(number), _, _) => serde_json::Value::from(number),
                (None, Some(number), _) => serde_json::Value::from(number),
                (None, None, Some(text)) => serde_json::Value::from(scrub(text).into_owned()),
                _ => serde_json::Value::from(scrub(&value.to_string()).into_owned()),
            };
            self.0.insert(key.to_string(), value);
            Ok(())
        }
    }
    let mut collect = Collect(serde_json::Map::new());
    let _ = record.key_values().visit(&mut collect);
    collect.0
}

fn json_line(record: &log::Record<'_>) -> String {
    let mut line = serde_json::json!({
        "ts": crate::time::now_rfc3339(),
        "level": record.level().as_str(),
        "target": record.target(),
        "message": scrub(&record.args().to_string()),
    });
    for (key, value) in key_values(record) {
        line.as_object_mut().map(|fields| fields.entry(key).or_insert(value));
    }
    if let Some(id) = crate::http::request_id::current() {
        line["request_id"] = serde_json::Value::String(id);
    }
    line.to_string()
}

fn text_line(record: &log::Record<'_>) -> String {
    let mut line = format!(
        "[{} {:<5} {}] {}",
        crate::time::now_rfc3339(),
        record.level(),
        record.target(),
        escape(&scrub(&record.args().to_string()))
    );
    for (key, value) in key_values(record) {
        let value = match value {
            serde_json::Value::String(text) if !text.contains(char::is_whitespace) && !text.is_empty() => text,
            other => other.to_string(),
        };
        line.push_str(&format!(" {key}={}", escape(&value)));
    }
    line
}

/// `text` on one line that shows what it holds: control characters (a newline that would
/// start a forged line, an escape sequence a terminal would obey) and bidirectional
/// formatting ones (which reorder what a reader sees) are written as `\u{…}` escapes.
fn escape(text: &str) -> Cow<'_, str> {
    let unsafe_char = |c: char| {
        c.is_control()
            || matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\n' => escaped.push_str("\\n"),
            '\r' => escaped.push_str("\\r"),
            '\t' => escaped.push_str("\\t"),
            c if unsafe_char(c) => escaped.push_str(&format!("\\u{{{:04x}}}", c as u32)),
            c => escaped.push(c),
        }
    }
    Cow::Owned(escaped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_line_is_one_object_with_the_request_id() {
        assert_eq!(LogFormat::from_env(Some("JSON")), LogFormat::Json);
        assert_eq!(LogFormat::from_env(Some("text")), LogFormat::Text);
        assert_eq!(LogFormat::from_env(None), LogFormat::Text);
        let line = crate::http::request_id::within("req-7", || {
            json_line(
                &log::Record::builder()
                    .args(format_args!("a \"quoted\"\nmessage"))
                    .level(log::Level::Info)
                    .target("kestrel::test")
                    .build(),
            )
        });
        assert!(!line.contains('\n'));
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["message"], "a \"quoted\"\nmessage");
        assert_eq!(value["level"], "INFO");
        assert_eq!(value["request_id"], "req-7");
    }

    #[test]
    fn credential_headers_and_bearer_tokens_are_masked_wherever_they_appear() {
        mask_headers(["X-Mcp-Tenant"]);
        let prelude = "writing prelude: POST /v1/messages HTTP/1.1\r\nHost: api\r\nx-api-key: sk-ant-secret\r\n\
            Authorization: Bearer tok-1\r\napi-key: az-1\r\nX-Mcp-Tenant: t-9\r\ncontent-type: application/json\r\n";
        let scrubbed = scrub(prelude);
        for secret in ["sk-ant-secret", "tok-1", "az-1", "t-9"] {
            assert!(!scrubbed.contains(secret), "{scrubbed}");
        }
        assert!(scrubbed.contains("x-api-key: ***") && scrubbed.contains("content-type: application/json"));
        assert_eq!(scrub("sent with Bearer abc.def-123 to it"), "sent with Bearer *** to it");
        assert_eq!(scrub("nothing to hide"), "nothing to hide");
    }

    #[test]
    fn a_text_line_cannot_be_forged_or_reordered() {
        let record = log::Record::builder()
            .args(format_args!("profile evil\n[2026-01-01 INFO kestrel] forged \u{1b}[31mred\u{202e}txt"))
            .level(log::Level::Error)
            .target("kestrel::test")
            .build();
        let line = text_line(&record);
        assert!(!line.contains('\n') && !line.contains('\u{1b}') && !line.contains('\u{202e}'), "{line}");
        assert!(
            line.contains("evil\\n[2026") && line.contains("\\u{001b}[31m") && line.contains("\\u{202e}"),
            "{line}"
        );
    }
}
