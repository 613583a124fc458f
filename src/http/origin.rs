//! Which browsers' requests the server answers: the `Host` a request names, the `Origin` it
//! comes from and the media type of its body, screened before any door sees it (issue 35; the
//! class of opencode's CVE-2026-22812, docs/security.md).
//!
//! A server with no token on the loopback is reachable by every web page its user opens: by
//! CSRF (blind requests a form, an image or `fetch` may send without asking) and by DNS
//! rebinding (the attacker's name made to resolve to 127.0.0.1, so the page reads the
//! answers). Three checks stop both, on every listener and every door:
//!
//! - **Host.** Rebinding needs a DNS name the attacker owns, so a request is refused unless its
//!   `Host` is an IP literal (v4, or v6 in brackets), `localhost` or a name under `.localhost`
//!   (browsers resolve those to the loopback themselves), one of the server's own names (its
//!   bind address's host and a cluster node's advertised URL's host) or a name in
//!   `server.allowed_hosts`: exact names, `.example.com` for a domain and every name under it,
//!   or `"*"` to turn the check off. The port is not compared. A request with no `Host` (HTTP/1.0,
//!   never a browser) passes.
//! - **Origin.** A cross-origin request is refused on every route but the public static files
//!   (the console and plugins' web files), which any page may load. Same-origin means the
//!   `Origin`'s host and port are the `Host`'s (the console's own page); an origin listed in
//!   `server.allowed_origins` passes too; `Origin: null` never does. A request with no `Origin`
//!   (a non-browser client, or a browser's GET of its own origin) passes, unless its Fetch
//!   Metadata (`Sec-Fetch-Site`) says another site sent it.
//! - **Media type.** A request with a body (a `Content-Length` above 0, or chunked) must say
//!   `Content-Type: application/json` (parameters allowed), or another type its door accepts
//!   (BAE's `/rpc` also takes `application/x-ndjson`). Pages may send `text/plain`, forms and
//!   Blobs to any origin without a CORS preflight; JSON they may not.
//!
//! Pure logic over a request's headers and what its door says of its path (`Exposure`), run on
//! the connection's `kestrel-conn` thread; it knows no route and no error shape.

use std::net::{Ipv4Addr, Ipv6Addr};

/// The one media type every API body may have.
pub const JSON: &[&str] = &["application/json"];
/// BAE's `/rpc`: JSON, as BAE's own SDKs send it, or NDJSON, as BAE's reference documents it.
pub const JSON_OR_NDJSON: &[&str] = &["application/json", "application/x-ndjson"];

/// What a door says of a request's route, for the screening.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposure {
    /// A public static file: any origin may load it.
    Asset,
    /// An API route: only its own origin (or an allowed one) may call it, and a body must be
    /// one of these media types.
    Api { bodies: &'static [&'static str] },
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A `Host` that names neither this server nor an allowed name (or more than one `Host`).
    Host,
    /// A cross-origin `Origin` (or `Origin: null`, or a cross-site `Sec-Fetch-Site`).
    Origin,
    /// A body of another media type than these (or of none).
    MediaType { accepted: &'static [&'static str] },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Host => write!(
                f,
                "the Host header names neither this server's address, localhost nor a name in server.allowed_hosts"
            ),
            Refusal::Origin => write!(
                f,
                "a request from another origin is refused; an origin that may call this server goes in \
                 server.allowed_origins"
            ),
            Refusal::MediaType { accepted } => {
                write!(f, "a request body must be sent with Content-Type: {}", accepted.join(" or "))
            }
        }
    }
}

/// Why a setting of the policy cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyError {
    /// An `allowed_hosts` entry that is not a host name, `.domain` or `*`.
    Host(String),
    /// An `allowed_origins` entry that is not `scheme://host[:port]`.
    Origin(String),
}

impl std::fmt::Display for PolicyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PolicyError::Host(entry) => {
                write!(f, "server.allowed_hosts: {entry:?} is not a host name, a `.domain` or `*`")
            }
            PolicyError::Origin(entry) => {
                write!(f, "server.allowed_origins: {entry:?} is not an origin such as `https://app.example.com`")
            }
        }
    }
}

impl std::error::Error for PolicyError {}

/// The names and origins a server answers beyond the loopback's and its own origin.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// `allowed_hosts` held `"*"`: any Host passes.
    any_host: bool,
    /// Exact names, lower case.
    names: Vec<String>,
    /// Domains (`.example.com` as `example.com`): the name itself and every name under it.
    domains: Vec<String>,
    origins: Vec<Origin>,
}

impl Policy {
    /// The policy of `allowed_hosts` and `allowed_origins`, and of the server's own names (the
    /// host of its bind address and of its advertised URL, when those are names).
    pub fn new(
        allowed_hosts: &[String],
        allowed_origins: &[String],
        own_names: &[String],
    ) -> Result<Policy, PolicyError> {
        let mut policy = Policy::default();
        for entry in allowed_hosts {
            let entry = entry.trim().to_ascii_lowercase();
            if entry == "*" {
                policy.any_host = true;
            } else if let Some(domain) = entry.strip_prefix('.').filter(|domain| is_name(domain)) {
                policy.domains.push(domain.trim_end_matches('.').to_string());
            } else if is_name(&entry) {
                policy.names.push(entry.trim_end_matches('.').to_string());
            } else {
                return Err(PolicyError::Host(entry));
            }
        }
        for name in own_names {
            let name = name.trim().trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
            if is_name(&name) {
                policy.names.push(name.trim_end_matches('.').to_string());
            }
        }
        for entry in allowed_origins {
            let origin = Origin::parse(entry.trim()).ok_or_else(|| PolicyError::Origin(entry.clone()))?;
            policy.origins.push(origin);
        }
        Ok(policy)
    }

    fn admits_name(&self, name: &str) -> bool {
        self.any_host
            || name == "localhost"
            || name.ends_with(".localhost")
            || self.names.iter().any(|allowed| allowed == name)
            || self.domains.iter().any(|domain| {
                name == domain || name.strip_suffix(domain.as_str()).is_some_and(|rest| rest.ends_with('.'))
            })
    }
}

/// Screens a request by its headers (`(name, value)` as sent) and what its door says of its
/// route: `Ok` when it may go on.
pub fn screen(policy: &Policy, headers: &[(String, String)], exposure: Exposure) -> Result<(), Refusal> {
    let hosts = values(headers, "host");
    let host = match hosts.as_slice() {
        [] => None,
        [host] => Some(Authority::parse(host).ok_or(Refusal::Host)?),
        _ => return Err(Refusal::Host),
    };
    if let Some(host) = &host {
        if !host.is_ip && !policy.admits_name(&host.host) {
            return Err(Refusal::Host);
        }
    }
    let bodies = match exposure {
        Exposure::Asset => JSON,
        Exposure::Api { bodies } => {
            check_origin(policy, headers, host.as_ref())?;
            bodies
        }
    };
    if has_body(headers) {
        let accepted = Refusal::MediaType { accepted: bodies };
        let kinds = values(headers, "content-type");
        let [kind] = kinds.as_slice() else { return Err(accepted) };
        let media = kind.split(';').next().unwrap_or_default().trim();
        if !bodies.iter().any(|body| media.eq_ignore_ascii_case(body)) {
            return Err(accepted);
        }
    }
    Ok(())
}

fn check_origin(policy: &Policy, headers: &[(String, String)], host: Option<&Authority>) -> Result<(), Refusal> {
    let origins = values(headers, "origin");
    let origin = match origins.as_slice() {
        [] => {
            // No Origin: a client that is no browser, or a browser's request that carries none
            // (a GET of its own origin, an image, a link). Fetch Metadata tells the last apart.
            let site = values(headers, "sec-fetch-site");
            let own =
                site.iter().all(|site| site.eq_ignore_ascii_case("same-origin") || site.eq_ignore_ascii_case("none"));
            return if own { Ok(()) } else { Err(Refusal::Origin) };
        }
        [origin] => Origin::parse(origin).ok_or(Refusal::Origin)?,
        _ => return Err(Refusal::Origin),
    };
    let same = host.is_some_and(|host| {
        host.host == origin.host
            && host.port.unwrap_or(origin.default_port()) == origin.port.unwrap_or(origin.default_port())
    });
    if same || policy.origins.iter().any(|allowed| allowed.same_as(&origin)) {
        Ok(())
    } else {
        Err(Refusal::Origin)
    }
}

/// The values of every header named `name`.
fn values<'a>(headers: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.trim()).collect()
}

/// Whether the request carries a body: a `Content-Length` above 0, or any transfer coding.
fn has_body(headers: &[(String, String)]) -> bool {
    headers.iter().any(|(name, value)| {
        (name.eq_ignore_ascii_case("content-length") && !value.trim().trim_start_matches('0').is_empty())
            || name.eq_ignore_ascii_case("transfer-encoding")
    })
}

/// A DNS name as a Host may carry it: letters, digits, `-`, `_` and dots.
fn is_name(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 253
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && !text.starts_with('.')
}

/// A `Host` header: its host (lower case, one trailing dot dropped) and port.
#[derive(Debug, PartialEq, Eq)]
struct Authority {
    host: String,
    port: Option<u16>,
    is_ip: bool,
}

impl Authority {
    fn parse(text: &str) -> Option<Authority> {
        let text = text.trim();
        let (host, port, is_ip) = if let Some(rest) = text.strip_prefix('[') {
            let (inside, after) = rest.split_once(']')?;
            inside.parse::<Ipv6Addr>().ok()?;
            let port = match after {
                "" => None,
                after => Some(after.strip_prefix(':')?),
            };
            (format!("[{}]", inside.to_ascii_lowercase()), port, true)
        } else {
            let (host, port) = match text.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (text, None),
            };
            let host = host.to_ascii_lowercase();
            let host = host.strip_suffix('.').unwrap_or(&host).to_string();
            if !is_name(&host) {
                return None;
            }
            let is_ip = host.parse::<Ipv4Addr>().is_ok();
            (host, port, is_ip)
        };
        let port = match port {
            None => None,
            Some(digits) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
                Some(digits.parse().ok()?)
            }
            Some(_) => return None,
        };
        Some(Authority { host, port, is_ip })
    }
}

/// An origin (`scheme://host[:port]`), lower case.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Origin {
    scheme: String,
    host: String,
    port: Option<u16>,
}

impl Origin {
    /// An origin as a browser serializes it; `null` and anything with a path is none.
    fn parse(text: &str) -> Option<Origin> {
        let (scheme, rest) = text.split_once("://")?;
        let scheme = scheme.to_ascii_lowercase();
        if scheme.is_empty() || !scheme.bytes().all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b)) {
            return None;
        }
        let authority = Authority::parse(rest.strip_suffix('/').unwrap_or(rest))?;
        Some(Origin { scheme, host: authority.host, port: authority.port })
    }

    fn default_port(&self) -> u16 {
        match self.scheme.as_str() {
            "https" | "wss" => 443,
            _ => 80,
        }
    }

    fn same_as(&self, other: &Origin) -> bool {
        self.scheme == other.scheme
            && self.host == other.host
            && self.port.unwrap_or(self.default_port()) == other.port.unwrap_or(other.default_port())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const API: Exposure = Exposure::Api { bodies: JSON };

    fn headers(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
    }

    fn policy(hosts: &[&str], origins: &[&str]) -> Policy {
        let strings = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Policy::new(&strings(hosts), &strings(origins), &["kestrel.internal".into(), "127.0.0.1".into()]).unwrap()
    }

    fn host(value: &str) -> Result<(), Refusal> {
        screen(&policy(&["exact.example", ".corp.example"], &[]), &headers(&[("Host", value)]), API)
    }

    /// Every Host the loopback's and the configured names admit, one row each.
    #[test]
    fn hosts_admitted() {
        for value in [
            "127.0.0.1",
            "127.0.0.1:8080",
            "10.0.0.7:1",
            "[::1]:8080",
            "[::1]",
            "[2001:DB8::1]:443",
            "localhost",
            "LOCALHOST:8080",
            "localhost.:8080",
            "app.localhost:3000",
            "kestrel.internal:8080",
            "exact.example",
            "corp.example",
            "a.b.corp.example:9",
        ] {
            assert_eq!(host(value), Ok(()), "{value}");
        }
    }

    /// Every Host refused, one row each.
    #[test]
    fn hosts_refused() {
        for value in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "evillocalhost",
            "127.0.0.1.nip.io",
            "sub.exact.example",
            "notcorp.example",
            "corp.example.evil",
            "127.1",
            "2130706433",
            "::1",
            "[::1",
            "[evil]:80",
            "localhost:80:80",
            "localhost:http",
            "localhost:99999",
            "user@localhost",
            "",
            "localhost/x",
        ] {
            assert_eq!(host(value), Err(Refusal::Host), "{value:?}");
        }
        let twice = headers(&[("Host", "localhost"), ("Host", "evil.example")]);
        assert_eq!(screen(&policy(&[], &[]), &twice, API), Err(Refusal::Host));
        assert_eq!(screen(&policy(&[], &[]), &headers(&[]), API), Ok(()), "no Host: not a browser");
        let any = policy(&["*"], &[]);
        assert_eq!(screen(&any, &headers(&[("Host", "anything.example")]), API), Ok(()));
    }

    fn origin(value: &str, exposure: Exposure) -> Result<(), Refusal> {
        let policy = policy(&[], &["https://app.example.com", "http://tool.example:8081"]);
        screen(&policy, &headers(&[("Host", "127.0.0.1:8080"), ("Origin", value)]), exposure)
    }

    /// Origins that may call the API, one row each.
    #[test]
    fn origins_admitted() {
        for value in [
            "http://127.0.0.1:8080",
            "HTTP://127.0.0.1:8080",
            "https://127.0.0.1:8080",
            "https://app.example.com",
            "https://app.example.com:443",
            "http://tool.example:8081",
        ] {
            assert_eq!(origin(value, API), Ok(()), "{value}");
        }
    }

    /// Origins refused, one row each; a public file takes any of them.
    #[test]
    fn origins_refused() {
        for value in [
            "http://evil.example",
            "null",
            "http://127.0.0.1:8081",
            "http://127.0.0.1",
            "http://localhost:8080",
            "http://app.example.com",
            "https://app.example.com:8443",
            "http://tool.example",
            "file://",
            "http://127.0.0.1:8080/path",
            "127.0.0.1:8080",
            "",
        ] {
            assert_eq!(origin(value, API), Err(Refusal::Origin), "{value:?}");
            assert_eq!(origin(value, Exposure::Asset), Ok(()), "{value:?} for a public file");
        }
        let no_host = headers(&[("Origin", "http://127.0.0.1:8080")]);
        assert_eq!(screen(&policy(&[], &[]), &no_host, API), Err(Refusal::Origin), "no Host to be the same as");
        let twice = headers(&[("Host", "localhost"), ("Origin", "http://localhost"), ("Origin", "http://localhost")]);
        assert_eq!(screen(&policy(&[], &[]), &twice, API), Err(Refusal::Origin));
    }

    /// Fetch Metadata without an Origin, one row each.
    #[test]
    fn fetch_sites() {
        for (site, expected) in [
            ("same-origin", Ok(())),
            ("none", Ok(())),
            ("cross-site", Err(Refusal::Origin)),
            ("same-site", Err(Refusal::Origin)),
            ("anything", Err(Refusal::Origin)),
        ] {
            let sent = headers(&[("Host", "localhost"), ("Sec-Fetch-Site", site)]);
            assert_eq!(screen(&policy(&[], &[]), &sent, API), expected, "{site}");
            assert_eq!(screen(&policy(&[], &[]), &sent, Exposure::Asset), Ok(()), "{site} for a public file");
        }
    }

    fn body(kind: Option<&str>, bodies: &'static [&'static str]) -> Result<(), Refusal> {
        let mut sent = headers(&[("Host", "localhost"), ("Content-Length", "2")]);
        if let Some(kind) = kind {
            sent.push(("Content-Type".into(), kind.into()));
        }
        screen(&policy(&[], &[]), &sent, Exposure::Api { bodies })
    }

    /// Media types, one row each.
    #[test]
    fn media_types() {
        let json = Err(Refusal::MediaType { accepted: JSON });
        for (kind, expected) in [
            (Some("application/json"), Ok(())),
            (Some("application/json; charset=utf-8"), Ok(())),
            (Some("Application/JSON"), Ok(())),
            (Some(" application/json ;x=y"), Ok(())),
            (None, json.clone()),
            (Some(""), json.clone()),
            (Some("text/plain"), json.clone()),
            (Some("text/plain; charset=application/json"), json.clone()),
            (Some("application/x-www-form-urlencoded"), json.clone()),
            (Some("multipart/form-data; boundary=x"), json.clone()),
            (Some("application/octet-stream"), json.clone()),
            (Some("application/jsonx"), json.clone()),
            (Some("application/x-ndjson"), json.clone()),
        ] {
            assert_eq!(body(kind, JSON), expected, "{kind:?}");
        }
        assert_eq!(body(Some("application/x-ndjson"), JSON_OR_NDJSON), Ok(()));
        assert_eq!(body(Some("text/plain"), JSON_OR_NDJSON), Err(Refusal::MediaType { accepted: JSON_OR_NDJSON }));
        let chunked =
            headers(&[("Host", "localhost"), ("Transfer-Encoding", "chunked"), ("Content-Type", "text/plain")]);
        assert_eq!(screen(&policy(&[], &[]), &chunked, API), json, "a chunked body is a body");
        let empty = headers(&[("Host", "localhost"), ("Content-Length", "00")]);
        assert_eq!(screen(&policy(&[], &[]), &empty, API), Ok(()), "no body, no type needed");
        let two =
            headers(&[("Content-Length", "2"), ("Content-Type", "application/json"), ("Content-Type", "text/plain")]);
        assert_eq!(screen(&policy(&[], &[]), &two, API), json, "two types are none");
    }

    #[test]
    fn settings_are_checked() {
        let strings = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for bad in ["http://x.example", "a b", "", "x/y", "..x"] {
            assert!(matches!(Policy::new(&strings(&[bad]), &[], &[]), Err(PolicyError::Host(_))), "{bad:?}");
        }
        for bad in ["app.example.com", "null", "https://x.example/path", "https://"] {
            assert!(matches!(Policy::new(&[], &strings(&[bad]), &[]), Err(PolicyError::Origin(_))), "{bad:?}");
        }
        assert!(
            Policy::new(&strings(&["x.example", ".y.example", "*"]), &strings(&["https://a.example/"]), &[]).is_ok()
        );
    }
}
