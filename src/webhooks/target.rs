//! Where a webhook may point: `http` or `https`, no credentials in the URL, and unless
//! `allow_private_targets` no address of the special-purpose table (`special.rs`: loopback,
//! private, link-local, shared, multicast, reserved, and IPv6 forms carrying such an IPv4
//! address), checked when the endpoint is made and again at every connection. ureq connects
//! only to the addresses its resolver gives (one after the other until one answers), and the
//! resolver here (`GuardedResolver`) gives only those the table allows; so the socket's peer
//! is always an address that was checked, and a name that later resolves to an inside
//! address, or to an inside and an outside one, never reaches the inside one.

use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

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
                "`url` resolves to a loopback, private, link-local or other special-purpose address ({host}); the server sends webhooks to public addresses only"
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

/// Whether the server may send to `ip` when private targets are not allowed: no row of the
/// special-purpose table holds it (`special.rs`).
pub fn is_public(ip: IpAddr) -> bool {
    super::special::is_public(ip)
}

/// How a name is looked up: `host:port` to its addresses.
pub type Lookup = std::sync::Arc<dyn Fn(&str) -> io::Result<Vec<SocketAddr>> + Send + Sync>;

/// ureq's resolver for webhook connections: the addresses a name resolves to, inside ones
/// dropped unless allowed; none left is an error, so nothing connects. ureq connects only to
/// what this returns, so the peer of every webhook connection is an address checked here.
pub struct GuardedResolver {
    pub allow_private: bool,
    /// The system's resolver (`GuardedResolver::system`), or a test's.
    pub lookup: Lookup,
}

impl GuardedResolver {
    /// Over the system's resolver.
    pub fn system(allow_private: bool) -> GuardedResolver {
        let lookup: Lookup = std::sync::Arc::new(|netloc: &str| Ok(netloc.to_socket_addrs()?.collect()));
        GuardedResolver { allow_private, lookup }
    }
}

impl ureq::Resolver for GuardedResolver {
    fn resolve(&self, netloc: &str) -> io::Result<Vec<SocketAddr>> {
        let addresses: Vec<SocketAddr> = (self.lookup)(netloc)?;
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
            let url =
                format!("http://{}/hook", if inside.contains(':') { format!("[{inside}]") } else { inside.into() });
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
        let refused = GuardedResolver::system(false);
        assert_eq!(
            ureq::Resolver::resolve(&refused, "127.0.0.1:80").unwrap_err().kind(),
            io::ErrorKind::PermissionDenied
        );
    }

    /// A name that resolves to an inside address first and an outside one second: the
    /// connection never reaches the inside one. With inside addresses allowed, the same
    /// agent connects to the first address the resolver gives: ureq's peer is the resolver's.
    #[test]
    fn a_name_resolving_inside_and_outside_never_reaches_the_inside_address() {
        use std::io::{Read, Write};
        let inside = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let inside_addr = inside.local_addr().unwrap();
        // Public: unreachable from here, or answered by whatever stands in for the internet.
        let outside: SocketAddr = "203.0.114.1:9".parse().unwrap();
        let lookup: Lookup = std::sync::Arc::new(move |_: &str| Ok(vec![inside_addr, outside]));
        let guarded = GuardedResolver { allow_private: false, lookup: lookup.clone() };
        assert_eq!(ureq::Resolver::resolve(&guarded, "hook.example:80").unwrap(), vec![outside]);
        let agent = |resolver| {
            ureq::AgentBuilder::new().resolver(resolver).timeout(std::time::Duration::from_millis(500)).build()
        };
        match agent(guarded).post("http://hook.example/x").send_bytes(b"{}") {
            Ok(answer) | Err(ureq::Error::Status(_, answer)) => assert_eq!(answer.remote_addr(), outside),
            Err(ureq::Error::Transport(_)) => {}
        }
        inside.set_nonblocking(true).unwrap();
        assert_eq!(inside.accept().unwrap_err().kind(), io::ErrorKind::WouldBlock, "nothing reached the inside");

        inside.set_nonblocking(false).unwrap();
        let answering = std::thread::spawn(move || {
            let (mut socket, _) = inside.accept().unwrap();
            let mut head = [0u8; 1024];
            let _ = socket.read(&mut head);
            socket.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").unwrap();
        });
        let open = GuardedResolver { allow_private: true, lookup };
        let answer = agent(open).post("http://hook.example/x").send_bytes(b"{}").unwrap();
        assert_eq!(answer.remote_addr(), inside_addr);
        answering.join().unwrap();
    }
}
