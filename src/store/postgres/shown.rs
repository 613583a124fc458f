//! A store URL as it may be shown: in `GET /api/config`, the server's start-up error line,
//! `kestrel migrate`'s output and the log. The one place a PostgreSQL URL is redacted.
//!
//! The password goes, in whichever form the client library takes it: the `user:pass@` part,
//! any query parameter (`?password=`, `?PassWord=`, `?pass%77ord=`, `sslpassword`, `sslkey`,
//! `options`, ...) except the few that are only ever settings (`ALLOWED`), the fragment, and
//! the `password` of a `key=value` connection string. A text that neither parses as a URL
//! nor as a connection string is shown as none of itself: it may be a password typed into the
//! wrong place.

use std::str::FromStr;

/// Query parameters shown as they are: settings, never credentials.
pub const ALLOWED: [&str; 4] = ["sslmode", "application_name", "connect_timeout", "target_session_attrs"];

/// libpq's connection keywords (PostgreSQL 17): a hidden parameter is shown by its name when it
/// is one of these, and as `***` whole when it is not (a stray word may be the password).
const KEYWORDS: [&str; 43] = [
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "passfile",
    "require_auth",
    "channel_binding",
    "connect_timeout",
    "client_encoding",
    "options",
    "application_name",
    "fallback_application_name",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
    "replication",
    "gssencmode",
    "sslmode",
    "requiressl",
    "sslcompression",
    "sslcert",
    "sslkey",
    "sslpassword",
    "sslcertmode",
    "sslrootcert",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "requirepeer",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "krbsrvname",
    "gsslib",
    "gssdelegation",
    "service",
    "target_session_attrs",
    "load_balance_hosts",
    "sslnegotiation",
    "scram_client_key",
];

const MASK: &str = "***";

fn allowed(name: &str) -> bool {
    ALLOWED.iter().any(|allowed| name.eq_ignore_ascii_case(allowed))
}

/// `url` with every secret replaced by `***`.
pub fn redacted(url: &str) -> String {
    if let Some(parsed) = as_url(url) {
        return redacted_url(parsed);
    }
    match postgres::Config::from_str(url) {
        Ok(config) => redacted_config(&config),
        // Shown as none of itself: it may be a password mistyped into the wrong place.
        Err(_) => "(an unreadable URL)".into(),
    }
}

/// Every secret `url` holds, as it may appear in a message (raw and percent-decoded).
pub fn secrets(url: &str) -> Vec<String> {
    let mut found = Vec::new();
    if let Some(parsed) = as_url(url) {
        if let Some(password) = parsed.password() {
            found.push(password.to_string());
            found.push(decoded(password));
        }
        for (name, value) in raw_pairs(&parsed) {
            if !allowed(&decoded(name)) {
                found.extend([decoded(name), decoded(value), name.to_string(), value.to_string()]);
            }
        }
        found.extend(parsed.fragment().map(str::to_string));
    }
    if let Ok(config) = postgres::Config::from_str(url) {
        found.extend(config.get_password().map(|password| String::from_utf8_lossy(password).into_owned()));
        found.extend(config.get_options().map(str::to_string));
    }
    found.retain(|secret| !secret.is_empty() && !KEYWORDS.iter().any(|keyword| secret.eq_ignore_ascii_case(keyword)));
    found.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
    found.dedup();
    found
}

/// A message with every secret of `url` taken out, should it quote one.
pub fn scrub(message: &str, url: &str) -> String {
    secrets(url).iter().fold(message.to_string(), |message, secret| message.replace(secret.as_str(), MASK))
}

/// `url` as a URL, when it is a PostgreSQL one.
fn as_url(url: &str) -> Option<url::Url> {
    let parsed = url::Url::parse(url.trim()).ok()?;
    matches!(parsed.scheme(), "postgres" | "postgresql").then_some(parsed)
}

fn redacted_url(mut url: url::Url) -> String {
    if url.password().is_some() {
        let _ = url.set_password(Some(MASK));
    }
    let pairs: Vec<String> = raw_pairs(&url)
        .map(|(name, value)| {
            let plain = decoded(name);
            if allowed(&plain) {
                format!("{name}={value}")
            } else if KEYWORDS.iter().any(|keyword| plain.eq_ignore_ascii_case(keyword)) {
                format!("{plain}={MASK}")
            } else {
                format!("{MASK}={MASK}")
            }
        })
        .collect();
    url.set_query(None);
    url.set_fragment(None);
    let mut shown = url.to_string();
    if !pairs.is_empty() {
        shown.push('?');
        shown.push_str(&pairs.join("&"));
    }
    shown
}

/// The query's `name=value` pairs as written (not decoded).
fn raw_pairs(url: &url::Url) -> impl Iterator<Item = (&str, &str)> {
    url.query()
        .unwrap_or_default()
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
}

fn decoded(text: &str) -> String {
    url::form_urlencoded::parse(format!("{text}=").as_bytes())
        .next()
        .map(|(name, _)| name.into_owned())
        .unwrap_or_default()
}

/// A connection string (`host=… password=…`), or a URL the client takes and the URL parser
/// does not (several hosts), as the client read it: where it goes, never how it logs in.
fn redacted_config(config: &postgres::Config) -> String {
    let mut shown = Vec::new();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|host| match host {
            postgres::config::Host::Tcp(name) => name.clone(),
            postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    if !hosts.is_empty() {
        shown.push(format!("host={}", hosts.join(",")));
    }
    let ports: Vec<String> = config.get_ports().iter().map(u16::to_string).collect();
    if !ports.is_empty() {
        shown.push(format!("port={}", ports.join(",")));
    }
    shown.extend(config.get_user().map(|user| format!("user={user}")));
    shown.extend(config.get_dbname().map(|dbname| format!("dbname={dbname}")));
    shown.extend(config.get_password().map(|_| format!("password={MASK}")));
    shown.extend(config.get_options().map(|_| format!("options={MASK}")));
    shown.extend(config.get_application_name().map(|name| format!("application_name={name}")));
    shown.extend(config.get_connect_timeout().map(|timeout| format!("connect_timeout={}", timeout.as_secs())));
    shown.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "hunter2-secret";

    /// Every form a password can take, one row each: what is shown keeps the rest readable.
    #[test]
    fn every_form_of_a_password_is_hidden() {
        let rows = [
            (format!("postgres://k:{SECRET}@db:5432/kestrel"), "postgres://k:***@db:5432/kestrel"),
            (format!("postgres://k@db/kestrel?password={SECRET}"), "postgres://k@db/kestrel?password=***"),
            (
                format!("postgres://k@db/kestrel?sslmode=disable&PassWord={SECRET}"),
                "postgres://k@db/kestrel?sslmode=disable&PassWord=***",
            ),
            (format!("postgres://k@db/kestrel?pass%77ord={SECRET}"), "postgres://k@db/kestrel?password=***"),
            (format!("postgres://k@db/kestrel?sslpassword={SECRET}"), "postgres://k@db/kestrel?sslpassword=***"),
            (format!("postgres://k@db/kestrel?sslkey=/keys/{SECRET}"), "postgres://k@db/kestrel?sslkey=***"),
            (
                format!("postgres://k@db/kestrel?options=-c%20x%3D{SECRET}&application_name=kestrel"),
                "postgres://k@db/kestrel?options=***&application_name=kestrel",
            ),
            (format!("postgres://k@db/kestrel?{SECRET}"), "postgres://k@db/kestrel?***=***"),
            (format!("postgres://k@db/kestrel#{SECRET}"), "postgres://k@db/kestrel"),
            (format!("postgresql://k:{SECRET}@db/kestrel?password={SECRET}"), "postgresql://k:***@db/kestrel?password=***"),
            (
                "postgres://k@db/kestrel?sslmode=require&application_name=a&connect_timeout=5&target_session_attrs=read-write"
                    .to_string(),
                "postgres://k@db/kestrel?sslmode=require&application_name=a&connect_timeout=5&target_session_attrs=read-write",
            ),
            (
                format!("host=db port=5432 user=k password={SECRET} dbname=kestrel"),
                "host=db port=5432 user=k dbname=kestrel password=***",
            ),
            (format!("host=db user=k password='{SECRET} with spaces'"), "host=db user=k password=***"),
            (format!("postgres://k:{SECRET}@db1:5432,db2:5433/kestrel"), "host=db1,db2 port=5432,5433 user=k dbname=kestrel password=***"),
            (SECRET.to_string(), "(an unreadable URL)"),
            (format!("mysql://k:{SECRET}@db/x"), "(an unreadable URL)"),
        ];
        for (url, expected) in rows {
            let shown = redacted(&url);
            assert_eq!(shown, expected, "{url}");
            assert!(!shown.contains(SECRET), "{url}: {shown}");
        }
        // URLs that do not parse, whatever either parser makes of them.
        for url in [
            format!("postgres://k@[::1/kestrel?password={SECRET}"),
            format!("postgres://k:{SECRET}@db:notaport/kestrel"),
            format!("postgres://k:{SECRET}@/kestrel"),
            format!("host=db password='{SECRET}"),
            format!("postgres://k:{SECRET}"),
        ] {
            let shown = redacted(&url);
            assert!(!shown.contains(SECRET), "{url}: {shown}");
        }
    }

    #[test]
    fn messages_lose_every_secret_they_quote() {
        let url = format!("postgres://k:{SECRET}@db/kestrel?sslpassword=pass%2Dword-2&application_name=visible");
        let message = format!("failed with {SECRET}, pass-word-2 and pass%2Dword-2 as application visible");
        assert_eq!(scrub(&message, &url), "failed with ***, *** and *** as application visible");
        let kv = format!("host=db password={SECRET}");
        assert_eq!(scrub(&format!("no: {SECRET}"), &kv), "no: ***");
        assert_eq!(scrub("nothing to hide", "postgres://k@db/kestrel"), "nothing to hide");
    }
}
