//! The server's log: env_logger's lines by default, or with `KESTREL_LOG_FORMAT=json` one
//! JSON object per line (`ts`, `level`, `target`, `message`, and `request_id` for a line
//! written while a request was being handled). Nothing logged at info or above carries a
//! secret or message content: keys are never logged, and request and event bodies only at
//! debug.

use std::io::Write;

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
    if format == LogFormat::Json {
        builder.format(|out, record| writeln!(out, "{}", json_line(record)));
    }
    builder.init();
}

fn json_line(record: &log::Record<'_>) -> String {
    let mut line = serde_json::json!({
        "ts": crate::time::now_rfc3339(),
        "level": record.level().as_str(),
        "target": record.target(),
        "message": record.args().to_string(),
    });
    if let Some(id) = crate::http::request_id::current() {
        line["request_id"] = serde_json::Value::String(id);
    }
    line.to_string()
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
}
