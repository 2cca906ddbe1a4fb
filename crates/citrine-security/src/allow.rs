//! Allow-lists ("whitelists" on the wire): per role, the client addresses
//! its users may connect from, as IP addresses or CIDR blocks.
//!
//! Invariant: a parsed [`AllowList`] holds only valid entries; a user whose
//! roles carry no allow-list may connect from anywhere, otherwise only from
//! an address some role of theirs lists.

use std::net::IpAddr;

/// One entry: an address and how many leading bits must match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowEntry {
    address: IpAddr,
    prefix: u8,
}

impl AllowEntry {
    /// Parses `10.1.2.3`, `10.0.0.0/8`, `::1`, `fd00::/8`.
    pub fn parse(text: &str) -> Option<AllowEntry> {
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix.parse::<u8>().ok()?)),
            None => (text, None),
        };
        let address: IpAddr = address.trim().parse().ok()?;
        let width = if address.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(width);
        (prefix <= width).then_some(AllowEntry { address, prefix })
    }

    /// Whether `peer` falls inside it (IPv4-mapped IPv6 peers count as IPv4).
    pub fn contains(&self, peer: IpAddr) -> bool {
        let peer = match peer {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(peer),
            v4 => v4,
        };
        let (ours, theirs, width) = match (self.address, peer) {
            (IpAddr::V4(a), IpAddr::V4(b)) => {
                (u128::from(u32::from(a)), u128::from(u32::from(b)), 32)
            }
            (IpAddr::V6(a), IpAddr::V6(b)) => (u128::from(a), u128::from(b), 128),
            _ => return false,
        };
        let shift = width - u32::from(self.prefix);
        shift >= width || (ours >> shift) == (theirs >> shift)
    }
}

/// Parses a comma-separated allow-list; `None` if any entry is invalid.
pub fn parse_list(text: &str) -> Option<Vec<String>> {
    let entries: Vec<String> = text
        .split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(str::to_string)
        .collect();
    entries
        .iter()
        .all(|entry| AllowEntry::parse(entry).is_some())
        .then_some(entries)
}

/// Whether `peer` is in any of `entries` (entries that do not parse match nothing).
pub fn allowed(entries: &[String], peer: IpAddr) -> bool {
    entries
        .iter()
        .filter_map(|entry| AllowEntry::parse(entry))
        .any(|entry| entry.contains(peer))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("ip")
    }

    #[test]
    fn addresses_and_blocks_match() {
        let list = parse_list("127.0.0.1, 10.0.0.0/8,fd00::/8").expect("valid");
        assert!(allowed(&list, ip("127.0.0.1")));
        assert!(!allowed(&list, ip("127.0.0.2")));
        assert!(allowed(&list, ip("10.200.3.4")));
        assert!(!allowed(&list, ip("11.0.0.1")));
        assert!(allowed(&list, ip("fd12::1")));
        assert!(allowed(&list, ip("::ffff:10.1.1.1")));
        assert!(allowed(&["0.0.0.0/0".to_string()], ip("1.2.3.4")));
    }

    #[test]
    fn bad_entries_are_refused() {
        assert!(parse_list("10.0.0.0/33").is_none());
        assert!(parse_list("host.example").is_none());
        assert_eq!(parse_list("").expect("empty"), Vec::<String>::new());
    }
}
