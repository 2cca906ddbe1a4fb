//! Parsing of the `peers-clear-std` family (03-info §2.3) and of host
//! strings given by users (`host`, `host:port`, `[v6]`, `[v6]:port`, bare v6).
//!
//! Invariant: the parsers never panic and never allocate unboundedly on any
//! input; a malformed answer is an error, not a partial list.

use citrine_types::NodeId;

/// One node listed by a peer: its id, TLS name and addresses (host, port).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub node_id: NodeId,
    pub tls_name: String,
    pub hosts: Vec<(String, u16)>,
}

/// A parsed peers answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peers {
    pub generation: u64,
    pub default_port: u16,
    pub peers: Vec<Peer>,
}

/// Parses `<gen>,<port>,[[<id>,<tls>,[<addr>,...]],...]`.
pub fn parse_peers(text: &str) -> Result<Peers, String> {
    let text = text.trim();
    let mut parser = Parser {
        text: text.as_bytes(),
        at: 0,
    };
    let generation = parser
        .token_until(b',')?
        .parse::<u64>()
        .map_err(|e| format!("peers generation: {e}"))?;
    parser.expect(b',')?;
    let default_port = parser
        .token_until(b',')?
        .parse::<u16>()
        .map_err(|e| format!("peers default port: {e}"))?;
    parser.expect(b',')?;
    parser.expect(b'[')?;
    let mut peers = Vec::new();
    if parser.peek() != Some(b']') {
        loop {
            peers.push(parser.peer(default_port)?);
            match parser.next() {
                Some(b',') => continue,
                Some(b']') => break,
                _ => return Err("expected ',' or ']' after a peer".into()),
            }
        }
    } else {
        parser.at += 1;
    }
    if parser.at != parser.text.len() {
        return Err("trailing characters after the peers list".into());
    }
    Ok(Peers {
        generation,
        default_port,
        peers,
    })
}

struct Parser<'a> {
    text: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let byte = self.peek()?;
        self.at += 1;
        Some(byte)
    }

    fn expect(&mut self, byte: u8) -> Result<(), String> {
        match self.next() {
            Some(found) if found == byte => Ok(()),
            Some(found) => Err(format!(
                "expected '{}' at {}, found '{}'",
                byte as char,
                self.at - 1,
                found as char
            )),
            None => Err(format!("expected '{}' at end of input", byte as char)),
        }
    }

    /// Text up to (not including) the next top-level `stop`, `]` or end.
    fn token_until(&mut self, stop: u8) -> Result<String, String> {
        let start = self.at;
        while let Some(byte) = self.peek() {
            if byte == stop || byte == b']' || byte == b'[' {
                break;
            }
            self.at += 1;
        }
        Ok(String::from_utf8_lossy(&self.text[start..self.at]).into_owned())
    }

    fn peer(&mut self, default_port: u16) -> Result<Peer, String> {
        self.expect(b'[')?;
        let id_text = self.token_until(b',')?;
        let node_id = id_text
            .parse::<NodeId>()
            .map_err(|e| format!("peer node id {id_text:?}: {e}"))?;
        self.expect(b',')?;
        let tls_name = self.token_until(b',')?;
        self.expect(b',')?;
        let mut hosts = Vec::new();
        // Departed nodes in the delta form have no address list: `[id,,]`.
        if self.peek() == Some(b'[') {
            self.at += 1;
            if self.peek() == Some(b']') {
                self.at += 1;
            } else {
                loop {
                    hosts.push(self.address(default_port)?);
                    match self.next() {
                        Some(b',') => continue,
                        Some(b']') => break,
                        _ => return Err("expected ',' or ']' in an address list".into()),
                    }
                }
            }
        }
        self.expect(b']')?;
        Ok(Peer {
            node_id,
            tls_name,
            hosts,
        })
    }

    fn address(&mut self, default_port: u16) -> Result<(String, u16), String> {
        let start = self.at;
        if self.peek() == Some(b'[') {
            // [v6] or [v6]:port
            while let Some(byte) = self.next() {
                if byte == b']' {
                    break;
                }
            }
        }
        while let Some(byte) = self.peek() {
            if byte == b',' || byte == b']' {
                break;
            }
            self.at += 1;
        }
        let text = String::from_utf8_lossy(&self.text[start..self.at]).into_owned();
        parse_host(&text, default_port)
    }
}

/// Parses a host as users and servers write it: `host`, `host:port`,
/// `[v6]`, `[v6]:port`, or a bare IPv6 address (which takes `default_port`).
pub fn parse_host(text: &str, default_port: u16) -> Result<(String, u16), String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty host".into());
    }
    if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("unclosed '[' in {text:?}"))?;
        let port = match after {
            "" => default_port,
            _ => after
                .strip_prefix(':')
                .ok_or_else(|| format!("expected ':port' after ']' in {text:?}"))?
                .parse::<u16>()
                .map_err(|e| format!("port in {text:?}: {e}"))?,
        };
        return Ok((host.to_owned(), port));
    }
    match text.matches(':').count() {
        0 => Ok((text.to_owned(), default_port)),
        1 => {
            let (host, port) = text.split_once(':').ok_or("unreachable")?;
            let port = port
                .parse::<u16>()
                .map_err(|e| format!("port in {text:?}: {e}"))?;
            Ok((host.to_owned(), port))
        }
        // A bare IPv6 address.
        _ => Ok((text.to_owned(), default_port)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_cluster() {
        let peers = parse_peers("0,3000,[]").expect("parses");
        assert_eq!(
            peers,
            Peers {
                generation: 0,
                default_port: 3000,
                peers: vec![]
            }
        );
    }

    #[test]
    fn reference_example_with_ports_and_ipv6() {
        let text = "7,3000,[[BB9050011AC4202,,[172.17.0.5]],[BB9070011AC4202,,[172.17.0.7:3100,[2001:db8::7]]]]";
        let peers = parse_peers(text).expect("parses");
        assert_eq!(peers.generation, 7);
        assert_eq!(peers.peers.len(), 2);
        assert_eq!(peers.peers[0].node_id, NodeId(0xBB9050011AC4202));
        assert_eq!(peers.peers[0].hosts, vec![("172.17.0.5".to_owned(), 3000)]);
        assert_eq!(
            peers.peers[1].hosts,
            vec![
                ("172.17.0.7".to_owned(), 3100),
                ("2001:db8::7".to_owned(), 3000)
            ]
        );
    }

    #[test]
    fn ipv6_with_port_tls_name_and_departed_node() {
        let text = "12,4000,[[A1,tls1,[[::1]:4001,127.0.0.1]],[B2,,]]";
        let peers = parse_peers(text).expect("parses");
        assert_eq!(peers.default_port, 4000);
        assert_eq!(peers.peers[0].tls_name, "tls1");
        assert_eq!(
            peers.peers[0].hosts,
            vec![("::1".to_owned(), 4001), ("127.0.0.1".to_owned(), 4000)]
        );
        assert!(peers.peers[1].hosts.is_empty());
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "x,3000,[]",
            "1,3000",
            "1,3000,[",
            "1,3000,[[ZZ,,[a]]]",
            "1,3000,[]x",
            "1,99999,[]",
            "1,3000,[[A,,[a]]",
        ] {
            assert!(parse_peers(bad).is_err(), "{bad:?} should fail");
        }
    }

    #[test]
    fn host_forms() {
        assert_eq!(parse_host("a", 3000), Ok(("a".into(), 3000)));
        assert_eq!(parse_host("a:3100", 3000), Ok(("a".into(), 3100)));
        assert_eq!(parse_host("[::1]", 3000), Ok(("::1".into(), 3000)));
        assert_eq!(parse_host("[::1]:3100", 3000), Ok(("::1".into(), 3100)));
        assert_eq!(parse_host("fe80::1", 3000), Ok(("fe80::1".into(), 3000)));
        assert!(parse_host("a:b", 3000).is_err());
        assert!(parse_host("[::1", 3000).is_err());
        assert!(parse_host("", 3000).is_err());
    }
}
