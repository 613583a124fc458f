//! Who is on the other end of a loopback connection: the user that owns the client's socket.
//!
//! A server with no token trusts whoever reaches it, which on the loopback is every account of
//! the machine. The Kestrel door asks this module whether a request came from the server's own
//! user (or root, who can read the server's memory anyway) before it serves a token-less
//! request. TCP has no `SO_PEERCRED`, so the answer comes from the kernel's socket table: the
//! client's socket is the one whose local address is the peer's and whose remote address is
//! ours, and its owner is the user that made it. It is asked of the kernel's `sock_diag`
//! netlink family for that one socket (a hash lookup); where that family answers nothing (a
//! kernel without `inet_diag`), the rows of `/proc/net/tcp` (or `tcp6`) are read instead, a
//! walk whose cost grows with every socket of the machine.
//!
//! Looked up once per connection, the first time a request asks (`PeerUser::user`), on that
//! connection's `kestrel-conn` thread. The table's parse is pure (`owner_in`) and tested with
//! rows as the kernel writes them.

use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;

/// A connection's two ends, and the user owning the peer's, looked up when first asked.
#[derive(Debug)]
pub struct PeerUser {
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    user: OnceLock<Option<u32>>,
}

impl PeerUser {
    pub fn new(local: Option<SocketAddr>, peer: Option<SocketAddr>) -> PeerUser {
        PeerUser { local, peer, user: OnceLock::new() }
    }

    /// The user owning the peer's socket, for a loopback peer whose row the kernel shows;
    /// `None` for any other peer, or when the table cannot be read.
    pub fn user(&self) -> Option<u32> {
        *self.user.get_or_init(|| {
            let (local, peer) = (self.local?, self.peer?);
            if !peer.ip().is_loopback() && !is_mapped_loopback(peer.ip()) {
                return None;
            }
            match diag::owner(peer, local) {
                Ok(owner) => owner,
                Err(error) => {
                    log::debug!("sock_diag cannot say who owns a socket ({error}); reading /proc/net/tcp");
                    let table = match (peer.ip(), local.ip()) {
                        (IpAddr::V4(_), IpAddr::V4(_)) => "/proc/net/tcp",
                        _ => "/proc/net/tcp6",
                    };
                    owner_in(&std::fs::read_to_string(table).ok()?, peer, local)
                }
            }
        })
    }

    /// Whether the peer is this process's own user, or root: the only callers a server with
    /// no token serves.
    pub fn is_own_user(&self) -> bool {
        let own = nix::unistd::geteuid().as_raw();
        self.user().is_some_and(|user| user == own || user == 0)
    }
}

fn is_mapped_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
        IpAddr::V4(_) => false,
    }
}

/// One socket's owner, asked of the kernel's `sock_diag` netlink family.
mod diag {
    use std::net::{IpAddr, SocketAddr};

    use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_REQUEST};
    use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6, IPPROTO_TCP};
    use netlink_packet_sock_diag::inet::{ExtensionFlags, InetRequest, SocketId, StateFlags};
    use netlink_packet_sock_diag::SockDiagMessage;
    use netlink_sys::{protocols::NETLINK_SOCK_DIAG, Socket, SocketAddr as NetlinkAddr};

    /// Why the kernel gave no answer.
    #[derive(Debug)]
    pub enum DiagError {
        Io(std::io::Error),
        /// The answer could not be read, or was the kernel's error for the request.
        Answer(String),
    }

    impl std::fmt::Display for DiagError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self {
                DiagError::Io(error) => write!(f, "{error}"),
                DiagError::Answer(why) => f.write_str(why),
            }
        }
    }

    /// The owner of the TCP socket whose local address is `socket` and whose remote one is
    /// `connected_to`: `Ok(None)` when the kernel knows no such socket.
    pub fn owner(socket: SocketAddr, connected_to: SocketAddr) -> Result<Option<u32>, DiagError> {
        let family = match (socket.ip(), connected_to.ip()) {
            (IpAddr::V4(_), IpAddr::V4(_)) => AF_INET,
            _ => AF_INET6,
        };
        let (source, destination) = match family {
            AF_INET => (socket.ip(), connected_to.ip()),
            _ => (v6(socket.ip()), v6(connected_to.ip())),
        };
        let id = SocketId {
            source_port: socket.port(),
            destination_port: connected_to.port(),
            source_address: source,
            destination_address: destination,
            interface_id: 0,
            // All ones: find the socket by its addresses alone.
            cookie: [0xff; 8],
        };
        let request = InetRequest {
            family,
            protocol: IPPROTO_TCP,
            extensions: ExtensionFlags::empty(),
            states: StateFlags::all(),
            socket_id: id,
        };
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST;
        let mut packet = NetlinkMessage::new(header, SockDiagMessage::InetRequest(request).into());
        packet.finalize();
        let mut bytes = vec![0; packet.buffer_len()];
        packet.serialize(&mut bytes);

        let mut netlink = Socket::new(NETLINK_SOCK_DIAG).map_err(DiagError::Io)?;
        netlink.bind_auto().map_err(DiagError::Io)?;
        netlink.connect(&NetlinkAddr::new(0, 0)).map_err(DiagError::Io)?;
        netlink.send(&bytes, 0).map_err(DiagError::Io)?;
        let mut answer = Vec::with_capacity(4096);
        netlink.recv(&mut answer, 0).map_err(DiagError::Io)?;
        let message = NetlinkMessage::<SockDiagMessage>::deserialize(&answer)
            .map_err(|error| DiagError::Answer(format!("an answer that does not read: {error}")))?;
        match message.payload {
            NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(response)) => Ok(Some(response.header.uid)),
            // No such socket: the client is already gone.
            NetlinkPayload::Error(error) if error.code.is_some_and(|code| code.get() == -nix::libc::ENOENT) => Ok(None),
            NetlinkPayload::Error(error) => Err(DiagError::Answer(format!("the kernel refused: {error:?}"))),
            // The crate's enum is non-exhaustive: whatever else, it is not the answer.
            _ => Err(DiagError::Answer("not an answer about the socket".into())),
        }
    }

    /// An address as an IPv6 socket names it (an IPv4 one mapped).
    fn v6(ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(v4) => IpAddr::V6(v4.to_ipv6_mapped()),
            IpAddr::V6(_) => ip,
        }
    }
}

/// The `uid` of the row of a `/proc/net/tcp{,6}` table whose local address is `socket` and
/// whose remote address is `connected_to`.
fn owner_in(table: &str, socket: SocketAddr, connected_to: SocketAddr) -> Option<u32> {
    let (local, remote) = (encoded(socket), encoded(connected_to));
    table.lines().skip(1).find_map(|row| {
        let fields: Vec<&str> = row.split_whitespace().collect();
        let matches = fields.get(1).is_some_and(|f| f.eq_ignore_ascii_case(&local))
            && fields.get(2).is_some_and(|f| f.eq_ignore_ascii_case(&remote));
        match matches {
            true => fields.get(7)?.parse().ok(),
            false => None,
        }
    })
}

/// An address as the kernel writes it in those tables: each 32-bit word of the address in the
/// machine's byte order as eight hex digits, a colon, the port as four. An IPv4 address in
/// `tcp6` is written IPv4-mapped.
fn encoded(address: SocketAddr) -> String {
    let words: Vec<u32> = match address.ip() {
        IpAddr::V4(v4) => vec![u32::from_ne_bytes(v4.octets())],
        IpAddr::V6(v6) => v6.octets().chunks(4).map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect(),
    };
    let mut text: String = words.iter().map(|word| format!("{word:08X}")).collect();
    text.push_str(&format!(":{:04X}", address.port()));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows as a little-endian kernel writes them: a listener, a client of it and its
    /// accepted end.
    #[cfg(target_endian = "little")]
    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1001 1 0000000000000000 100 0 0 10 0
   1: 0100007F:D431 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 1002 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 1003 1 0000000000000000 20 4 30 10 -1
";

    #[cfg(target_endian = "little")]
    #[test]
    fn the_clients_row_names_its_user() {
        let server: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let client: SocketAddr = "127.0.0.1:54321".parse().unwrap();
        assert_eq!(owner_in(TCP, client, server), Some(1000));
        assert_eq!(owner_in(TCP, server, client), Some(0), "the accepted end is the server's");
        let stranger: SocketAddr = "127.0.0.1:54322".parse().unwrap();
        assert_eq!(owner_in(TCP, stranger, server), None);
    }

    #[cfg(target_endian = "little")]
    #[test]
    fn addresses_are_written_as_the_kernel_writes_them() {
        assert_eq!(encoded("127.0.0.1:8080".parse().unwrap()), "0100007F:1F90");
        assert_eq!(encoded("[::1]:8080".parse().unwrap()), "00000000000000000000000001000000:1F90");
        assert_eq!(encoded("[::ffff:127.0.0.1]:80".parse().unwrap()), "0000000000000000FFFF00000100007F:0050");
    }

    #[test]
    fn a_real_loopback_connection_is_this_process_s_user() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, peer) = listener.accept().unwrap();
        let user = PeerUser::new(accepted.local_addr().ok(), Some(peer));
        assert_eq!(user.user(), Some(nix::unistd::geteuid().as_raw()));
        assert!(user.is_own_user());
        drop(client);
    }

    #[test]
    fn the_kernel_names_a_loopback_client_s_owner_and_knows_no_socket_that_is_gone() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, peer) = listener.accept().unwrap();
        let local = accepted.local_addr().unwrap();
        let own = nix::unistd::geteuid().as_raw();
        assert_eq!(diag::owner(peer, local).unwrap(), Some(own));
        let stranger: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(diag::owner(stranger, local).unwrap(), None);
        drop(client);
    }

    #[test]
    fn a_peer_off_the_loopback_has_no_user() {
        let local: SocketAddr = "10.0.0.1:8080".parse().unwrap();
        let peer: SocketAddr = "10.0.0.2:40000".parse().unwrap();
        assert_eq!(PeerUser::new(Some(local), Some(peer)).user(), None);
        assert!(!PeerUser::new(None, None).is_own_user());
    }
}
