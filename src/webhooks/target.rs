//! Where a webhook may point: `http` or `https`, no credentials in the URL, and unless
//! `allow_private_targets` no loopback, private, link-local, shared or multicast address,
//! checked when the endpoint is made and again at every connection (`GuardedResolver`, which
//! ureq asks for the addresses it connects to), so a name that later resolves to an inside
//! address is refused then too.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};

/// The longest URL an endpoint may have.
pub const MAX_URL: usize = 2048;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetError {
    /// Not an absolute http(s) URL with a host, or too long, or with credentials: why.
    Invalid(String),
    /// It resolves to an address the server does not send to.
    Private(String),
    /// Its host does not resolve.
    Unresolvable(String),
}

impl std::fmt::Display for TargetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TargetError::Invalid(why) => write!(f, "`url` {why}"),
            TargetError::Private(host) => write!(
                f,
                "`url` resolves to a loopback, private or link-local address ({host}); the server sends webhooks to public addresses only"
            ),
            TargetError::Unresolvable(host) => write!(f, "`url`'s host {host} does not resolve"),
        }
    }
}

/// Checks an endpoint's URL; its normalized text.
pub fn check(text: &str, allow_private: bool) -> Result<String, TargetError> {
    if text.len() > MAX_URL {
        return Err(TargetError::Invalid(format!("is longer than {MAX_URL} bytes")));
    }
    let url = url::Url::parse(text).map_err(|error| TargetError::Invalid(format!("is not a URL: {error}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(TargetError::Invalid("must be http or https".into()));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(TargetError::Invalid("must not carry credentials".into()));
    }
    let host = url.host_str().filter(|host| !host.is_empty()).ok_or(TargetError::Invalid("has no host".into()))?;
    let port = url.port_or_known_default().unwrap_or(443);
    if !allow_private {
        let netloc = format!("{host}:{port}");
        let addresses =
            netloc.to_socket_addrs().map_err(|_| TargetError::Unresolvable(host.to_string()))?.collect::<Vec<_>>();
        if addresses.is_empty() {
            return Err(TargetError::Unresolvable(host.to_string()));
        }
        if addresses.iter().any(|address| !is_public(address.ip())) {
            return Err(TargetError::Private(host.to_string()));
        }
    }
    Ok(url.to_string())
}

/// Whether the server may send to `ip` when private targets are not allowed.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => public_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => public_v4(v4),
            None => public_v6(v6),
        },
    }
}

fn public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    let shared = a == 100 && (64..128).contains(&b); // 100.64.0.0/10, carrier-grade NAT
    let this_network = a == 0;
    !(ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_unspecified()
        || ip.is_documentation()
        || shared
        || this_network
        || a >= 240)
}

fn public_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    let unique_local = (first & 0xfe00) == 0xfc00;
    let link_local = (first & 0xffc0) == 0xfe80;
    let nat64 = first == 0x64 && ip.segments()[1] == 0xff9b;
    !(ip.is_loopback() || ip.is_unspecified() || ip.is_multicast() || unique_local || link_local || nat64)
}

/// ureq's resolver for webhook connections: the addresses a name resolves to, inside ones
/// dropped unless allowed; none left is an error, so nothing connects.
pub struct GuardedResolver {
    pub allow_private: bool,
}

impl ureq::Resolver for GuardedResolver {
    fn resolve(&self, netloc: &str) -> io::Result<Vec<SocketAddr>> {
        let addresses: Vec<SocketAddr> = netloc.to_socket_addrs()?.collect();
        if self.allow_private {
            return Ok(addresses);
        }
        let public: Vec<SocketAddr> = addresses.into_iter().filter(|address| is_public(address.ip())).collect();
        if public.is_empty() {
            let why = format!("{netloc} resolves only to addresses webhooks are not sent to");
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, why));
        }
        Ok(public)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inside_addresses_are_refused_and_outside_ones_kept() {
        for inside in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "224.0.0.1",
        ] {
            assert!(!is_public(inside.parse().unwrap()), "{inside}");
        }
        for outside in ["1.1.1.1", "93.184.216.34", "2606:4700::1111"] {
            assert!(is_public(outside.parse().unwrap()), "{outside}");
        }
    }

    /// The seven encodings issue 35 found accepted: an IPv4 loopback inside IPv6 forms,
    /// deprecated and reserved IPv6 space, and IPv4 special-purpose blocks.
    #[test]
    fn the_special_purpose_addresses_issue_35_found_are_refused() {
        for inside in
            ["::127.0.0.1", "::ffff:0:7f00:1", "2002:7f00:1::", "fec0::1", "100::1", "198.18.0.1", "192.0.0.1"]
        {
            assert!(!is_public(inside.parse().unwrap()), "{inside}");
            let url = format!("http://{}/hook", if inside.contains(':') { format!("[{inside}]") } else { inside.into() });
            assert!(matches!(check(&url, false), Err(TargetError::Private(_))), "{url}");
        }
    }

    #[test]
    fn urls_are_checked_for_shape_and_address() {
        assert!(matches!(check("ftp://example.com/", true), Err(TargetError::Invalid(_))));
        assert!(matches!(check("https://user:pw@example.com/", true), Err(TargetError::Invalid(_))));
        assert!(matches!(check("not a url", true), Err(TargetError::Invalid(_))));
        assert!(matches!(check("http://127.0.0.1:9/hook", false), Err(TargetError::Private(_))));
        assert!(matches!(check("http://localhost:9/hook", false), Err(TargetError::Private(_))));
        assert!(matches!(check("http://[::1]:9/hook", false), Err(TargetError::Private(_))));
        assert_eq!(check("http://127.0.0.1:9/hook", true).unwrap(), "http://127.0.0.1:9/hook");
        let refused = GuardedResolver { allow_private: false };
        assert_eq!(
            ureq::Resolver::resolve(&refused, "127.0.0.1:80").unwrap_err().kind(),
            io::ErrorKind::PermissionDenied
        );
    }
}
