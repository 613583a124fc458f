//! Where a webhook is never sent (unless `allow_private_targets`): the IANA special-purpose
//! address registries for IPv4 and IPv6 (RFC 6890 and the RFCs each row names), IPv4
//! multicast, and the IPv6 space outside global unicast (`2000::/3`, IANA's IPv6 address space
//! registry), as one table. The first row holding an address decides, so a block inside a
//! larger one comes first. An IPv6 form that carries an IPv4 address is judged by that
//! address where the form is in use (IPv4-mapped, NAT64's well-known prefix, 6to4); the
//! others are refused whole (IPv4-compatible, IPv4-translated, Teredo, local-use NAT64).
//!
//! Pure: no I/O. `target.rs` asks it at an endpoint's create and at every connection.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A block of addresses: the first address and the prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefix {
    V4(Ipv4Addr, u8),
    V6(Ipv6Addr, u8),
}

/// What becomes of an address a row holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Treatment {
    /// Never sent to.
    Refused,
    /// Judged by the IPv4 address in its last 32 bits (IPv4-mapped, NAT64).
    EmbedsLast32,
    /// Judged by the IPv4 address in bits 16 to 47 (6to4).
    Embeds6to4,
}

/// One row: the block, its name in the registry, the RFC that defines it, and what becomes of
/// its addresses.
#[derive(Debug)]
pub struct Special {
    pub prefix: Prefix,
    pub name: &'static str,
    pub rfc: &'static str,
    pub treatment: Treatment,
}

const fn v4(a: u8, b: u8, c: u8, d: u8, len: u8, name: &'static str, rfc: &'static str) -> Special {
    Special { prefix: Prefix::V4(Ipv4Addr::new(a, b, c, d), len), name, rfc, treatment: Treatment::Refused }
}

const fn v6(segments: [u16; 8], len: u8, name: &'static str, rfc: &'static str, treatment: Treatment) -> Special {
    let [a, b, c, d, e, f, g, h] = segments;
    Special { prefix: Prefix::V6(Ipv6Addr::new(a, b, c, d, e, f, g, h), len), name, rfc, treatment }
}

use Treatment::{Embeds6to4, EmbedsLast32, Refused};

/// Every block a webhook is not sent to; the first row holding an address decides.
pub const SPECIAL: &[Special] = &[
    // IPv4: the special-purpose registry, then multicast.
    v4(0, 0, 0, 0, 8, "This network", "RFC 791"),
    v4(10, 0, 0, 0, 8, "Private-Use", "RFC 1918"),
    v4(100, 64, 0, 0, 10, "Shared Address Space", "RFC 6598"),
    v4(127, 0, 0, 0, 8, "Loopback", "RFC 1122"),
    v4(169, 254, 0, 0, 16, "Link Local", "RFC 3927"),
    v4(172, 16, 0, 0, 12, "Private-Use", "RFC 1918"),
    v4(192, 0, 0, 0, 24, "IETF Protocol Assignments", "RFC 6890"),
    v4(192, 0, 2, 0, 24, "Documentation (TEST-NET-1)", "RFC 5737"),
    v4(192, 31, 196, 0, 24, "AS112-v4", "RFC 7535"),
    v4(192, 52, 193, 0, 24, "AMT", "RFC 7450"),
    v4(192, 88, 99, 0, 24, "Deprecated (6to4 Relay Anycast)", "RFC 7526"),
    v4(192, 168, 0, 0, 16, "Private-Use", "RFC 1918"),
    v4(192, 175, 48, 0, 24, "Direct Delegation AS112 Service", "RFC 7534"),
    v4(198, 18, 0, 0, 15, "Benchmarking", "RFC 2544"),
    v4(198, 51, 100, 0, 24, "Documentation (TEST-NET-2)", "RFC 5737"),
    v4(203, 0, 113, 0, 24, "Documentation (TEST-NET-3)", "RFC 5737"),
    v4(224, 0, 0, 0, 4, "Multicast", "RFC 5771"),
    v4(255, 255, 255, 255, 32, "Limited Broadcast", "RFC 919"),
    v4(240, 0, 0, 0, 4, "Reserved", "RFC 1112"),
    // IPv6: the special-purpose registry, with the forms that carry an IPv4 address.
    v6([0, 0, 0, 0, 0, 0, 0, 0], 128, "Unspecified Address", "RFC 4291", Refused),
    v6([0, 0, 0, 0, 0, 0, 0, 1], 128, "Loopback Address", "RFC 4291", Refused),
    v6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96, "IPv4-mapped Address", "RFC 4291", EmbedsLast32),
    v6([0, 0, 0, 0, 0xffff, 0, 0, 0], 96, "IPv4-translated Address", "RFC 2765", Refused),
    v6([0, 0, 0, 0, 0, 0, 0, 0], 96, "IPv4-compatible Address (deprecated)", "RFC 4291", Refused),
    v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96, "IPv4-IPv6 Translation", "RFC 6052", EmbedsLast32),
    v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48, "IPv4-IPv6 Translation (local use)", "RFC 8215", Refused),
    v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64, "Discard-Only Address Block", "RFC 6666", Refused),
    v6([0x100, 0, 0, 1, 0, 0, 0, 0], 64, "Dummy IPv6 Prefix", "RFC 9780", Refused),
    v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 32, "TEREDO", "RFC 4380", Refused),
    v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23, "IETF Protocol Assignments", "RFC 2928", Refused),
    v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32, "Documentation", "RFC 3849", Refused),
    v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16, "6to4", "RFC 3056", Embeds6to4),
    v6([0x2620, 0x4f, 0x8000, 0, 0, 0, 0, 0], 48, "Direct Delegation AS112 Service", "RFC 7534", Refused),
    v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, "Documentation", "RFC 9637", Refused),
    v6([0x5f00, 0, 0, 0, 0, 0, 0, 0], 16, "Segment Routing (SRv6) SIDs", "RFC 9602", Refused),
    v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, "Unique-Local", "RFC 4193", Refused),
    v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, "Link-Local Unicast", "RFC 4291", Refused),
    v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, "Site-Local Unicast (deprecated)", "RFC 3879", Refused),
    v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, "Multicast", "RFC 4291", Refused),
    // IPv6: everything outside global unicast (2000::/3) not named above.
    v6([0, 0, 0, 0, 0, 0, 0, 0], 8, "Reserved by IETF", "RFC 4291", Refused),
    v6([0x100, 0, 0, 0, 0, 0, 0, 0], 8, "Reserved by IETF", "RFC 4291", Refused),
    v6([0x200, 0, 0, 0, 0, 0, 0, 0], 7, "Reserved by IETF", "RFC 4048", Refused),
    v6([0x400, 0, 0, 0, 0, 0, 0, 0], 6, "Reserved by IETF", "RFC 4291", Refused),
    v6([0x800, 0, 0, 0, 0, 0, 0, 0], 5, "Reserved by IETF", "RFC 4291", Refused),
    v6([0x1000, 0, 0, 0, 0, 0, 0, 0], 4, "Reserved by IETF", "RFC 4291", Refused),
    v6([0x4000, 0, 0, 0, 0, 0, 0, 0], 3, "Reserved by IETF", "RFC 4291", Refused),
    v6([0x6000, 0, 0, 0, 0, 0, 0, 0], 3, "Reserved by IETF", "RFC 4291", Refused),
    v6([0x8000, 0, 0, 0, 0, 0, 0, 0], 3, "Reserved by IETF", "RFC 4291", Refused),
    v6([0xa000, 0, 0, 0, 0, 0, 0, 0], 3, "Reserved by IETF", "RFC 4291", Refused),
    v6([0xc000, 0, 0, 0, 0, 0, 0, 0], 3, "Reserved by IETF", "RFC 4291", Refused),
    v6([0xe000, 0, 0, 0, 0, 0, 0, 0], 4, "Reserved by IETF", "RFC 4291", Refused),
    v6([0xf000, 0, 0, 0, 0, 0, 0, 0], 5, "Reserved by IETF", "RFC 4291", Refused),
    v6([0xf800, 0, 0, 0, 0, 0, 0, 0], 6, "Reserved by IETF", "RFC 4291", Refused),
    v6([0xfe00, 0, 0, 0, 0, 0, 0, 0], 9, "Reserved by IETF", "RFC 4291", Refused),
];

impl Prefix {
    /// Its first address as a number, its length, and its family's width in bits.
    fn bits(self) -> (u128, u8, u32) {
        match self {
            Prefix::V4(first, len) => (u128::from(u32::from(first)), len, 32),
            Prefix::V6(first, len) => (u128::from(first), len, 128),
        }
    }

    pub fn contains(self, ip: IpAddr) -> bool {
        let (first, len, width) = self.bits();
        let address = match (self, ip) {
            (Prefix::V4(..), IpAddr::V4(ip)) => u128::from(u32::from(ip)),
            (Prefix::V6(..), IpAddr::V6(ip)) => u128::from(ip),
            _ => return false,
        };
        let host_bits = width - u32::from(len);
        address.checked_shr(host_bits).unwrap_or(0) == first.checked_shr(host_bits).unwrap_or(0)
    }

    /// Its first and last addresses.
    pub fn bounds(self) -> (IpAddr, IpAddr) {
        let (first, len, width) = self.bits();
        let host_bits = width - u32::from(len);
        let hosts = 1u128.checked_shl(host_bits).map_or(u128::MAX, |n| n - 1);
        let last = first | hosts;
        match self {
            Prefix::V4(..) => (address_v4(first), address_v4(last)),
            Prefix::V6(..) => (IpAddr::V6(Ipv6Addr::from(first)), IpAddr::V6(Ipv6Addr::from(last))),
        }
    }

    /// The first address after the block, unless it ends its family's space.
    pub fn after(self) -> Option<IpAddr> {
        let (_, last) = self.bounds();
        match last {
            IpAddr::V4(ip) => u32::from(ip).checked_add(1).map(|n| IpAddr::V4(Ipv4Addr::from(n))),
            IpAddr::V6(ip) => u128::from(ip).checked_add(1).map(|n| IpAddr::V6(Ipv6Addr::from(n))),
        }
    }
}

fn address_v4(bits: u128) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(bits as u32))
}

/// The row that decides `ip`, if any holds it.
pub fn row_of(ip: IpAddr) -> Option<&'static Special> {
    SPECIAL.iter().find(|row| row.prefix.contains(ip))
}

/// Whether a webhook may go to `ip` when private targets are not allowed.
pub fn is_public(ip: IpAddr) -> bool {
    let Some(row) = row_of(ip) else { return true };
    match (row.treatment, ip) {
        (Treatment::Refused, _) | (_, IpAddr::V4(_)) => false,
        (Treatment::EmbedsLast32, IpAddr::V6(v6)) => {
            let [.., a, b, c, d] = v6.octets();
            is_public(IpAddr::V4(Ipv4Addr::new(a, b, c, d)))
        }
        (Treatment::Embeds6to4, IpAddr::V6(v6)) => {
            let [_, _, a, b, c, d, ..] = v6.octets();
            is_public(IpAddr::V4(Ipv4Addr::new(a, b, c, d)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The IPv4 address `row` would carry `embedded` as, for a row that embeds one.
    fn carrying(row: &Special, embedded: Ipv4Addr) -> IpAddr {
        let Prefix::V6(first, _) = row.prefix else { unreachable!("only IPv6 rows embed") };
        let mut octets = first.octets();
        match row.treatment {
            Treatment::EmbedsLast32 => octets[12..].copy_from_slice(&embedded.octets()),
            Treatment::Embeds6to4 => octets[2..6].copy_from_slice(&embedded.octets()),
            Treatment::Refused => unreachable!("a refused row embeds nothing"),
        }
        IpAddr::V6(Ipv6Addr::from(octets))
    }

    /// Every row: its first and last addresses are refused (or, for a form carrying an IPv4
    /// address, refused when it carries a loopback one and allowed when a public one); the
    /// first address after it is allowed where no other row holds it.
    #[test]
    fn every_row_refuses_what_it_holds_and_the_first_address_after_it_is_allowed() {
        let public = Ipv4Addr::new(1, 1, 1, 1);
        let loopback = Ipv4Addr::new(127, 0, 0, 1);
        for row in SPECIAL {
            let what = format!("{:?} ({}, {})", row.prefix, row.name, row.rfc);
            let (first, last) = row.prefix.bounds();
            assert!(row.prefix.contains(first) && row.prefix.contains(last), "{what}");
            match row.treatment {
                Treatment::Refused => {
                    assert!(!is_public(first), "{what}: {first}");
                    assert!(!is_public(last), "{what}: {last}");
                }
                Treatment::EmbedsLast32 | Treatment::Embeds6to4 => {
                    assert!(!is_public(carrying(row, loopback)), "{what}: {}", carrying(row, loopback));
                    assert!(is_public(carrying(row, public)), "{what}: {}", carrying(row, public));
                }
            }
            if let Some(after) = row.prefix.after().filter(|after| row_of(*after).is_none()) {
                assert!(is_public(after), "{what}: {after}");
            }
        }
    }

    /// A row inside a larger one comes before it, or it would never decide anything: each
    /// row decides its first or its last address.
    #[test]
    fn no_row_is_shadowed_by_an_earlier_one() {
        for row in SPECIAL {
            let (first, last) = row.prefix.bounds();
            let decides = |ip| row_of(ip).is_some_and(|decided| decided.prefix == row.prefix);
            assert!(decides(first) || decides(last), "{:?} ({}) decides nothing", row.prefix, row.name);
        }
    }

    #[test]
    fn global_unicast_and_public_ipv4_are_allowed() {
        for outside in ["1.1.1.1", "8.8.8.8", "93.184.216.34", "2606:4700::1111", "2a00:1450::1", "64:ff9b::808:808"] {
            assert!(is_public(outside.parse().unwrap()), "{outside}");
        }
    }
}
