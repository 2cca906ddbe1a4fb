//! Cluster-management messages and their versioned binary format.
//!
//! Owns: [`PeerAddr`], [`Heartbeat`], [`Message`], [`Envelope`] and their
//! `encode`/`decode`.
//!
//! Format (version [`FORMAT_VERSION`]), all integers little-endian:
//!
//! ```text
//! envelope := version:u8  from:u64  message      (Envelope::encode)
//! bare     := version:u8  message               (Message::encode)
//! message  := tag:u8 body
//! ballot   := round:u64 node:u64
//! view     := key:u64 count:u16 node:u64*count        (sorted, key != 0)
//! addr     := len:u16 utf8-bytes                       (len <= 255)
//! tag 1 Heartbeat: addr incarnation:u64 seq:u64 sent:u64 key:u64
//!                  count:u16 node:u64*count            (succession, may be empty)
//!                  count:u16 (node:u64 addr)*count     (adjacency)
//! tag 2 Prepare:  ballot
//! tag 3 Promise:  ballot
//! tag 4 Nack:     ballot promised:ballot principal:u64
//! tag 5 Accept:   ballot view
//! tag 6 Accepted: ballot
//! tag 7 Commit:   ballot view
//! tag 8 Committed: ballot
//! ```
//!
//! Invariants:
//! - `decode(encode(m)) == m` for every message the constructors can build;
//! - `decode` never panics and never allocates more than a small multiple of
//!   its input length: counts are bounded before allocation and every view is
//!   re-validated through [`ClusterView::new`];
//! - unknown versions are rejected, never guessed at.

use std::sync::Arc;

use citrine_types::NodeId;

use crate::codec::{DecodeError, Reader, Writer};
use crate::view::{Ballot, ClusterView, MAX_CLUSTER_SIZE};

/// Version byte leading every encoded envelope.
pub const FORMAT_VERSION: u8 = 2;
/// Longest peer address, in bytes.
pub const MAX_ADDR_LEN: usize = 255;
/// Most adjacency entries one heartbeat may carry.
pub const MAX_PEERS: usize = MAX_CLUSTER_SIZE;

/// A transport address ("host:port" for the real fabric, any label in the
/// simulator). Opaque to the cluster logic. Shared text: a clone (one per
/// heartbeat target, per gossiped peer) costs no allocation.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PeerAddr(Arc<str>);

impl PeerAddr {
    /// Builds an address; `None` when longer than [`MAX_ADDR_LEN`] bytes or
    /// empty.
    pub fn new(text: impl Into<String>) -> Option<PeerAddr> {
        let s = text.into();
        (!s.is_empty() && s.len() <= MAX_ADDR_LEN).then(|| PeerAddr(Arc::from(s)))
    }

    /// The address text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for PeerAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Periodic liveness message of mesh-mode heartbeating. It also gossips the
/// sender's adjacency (so peers learn each other's addresses) and its current
/// cluster view (so principals can spot members that fell out of sync).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Heartbeat {
    /// Where the sender listens.
    pub addr: PeerAddr,
    /// Distinguishes restarts of the same node id; a later incarnation resets
    /// the receiver's sequence tracking.
    pub incarnation: u64,
    /// Per-incarnation sequence number, +1 per heartbeat round.
    pub seq: u64,
    /// The sender's clock when it sent the heartbeat (ms): the receiver
    /// estimates the clock skew between them from it.
    pub sent_ms: u64,
    /// The sender's cluster key, 0 when it is an orphan.
    pub cluster_key: u64,
    /// The sender's succession list (empty when orphan), ascending.
    pub succession: Vec<NodeId>,
    /// The sender's adjacency list with addresses.
    pub peers: Vec<(NodeId, PeerAddr)>,
}

/// Every message the cluster subsystem exchanges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// Liveness and gossip.
    Heartbeat(Heartbeat),
    /// Paxos phase 1a: the principal asks for a promise.
    Prepare {
        /// Proposal ballot.
        ballot: Ballot,
    },
    /// Paxos phase 1b: the acceptor promises to ignore lower ballots.
    Promise {
        /// The ballot promised.
        ballot: Ballot,
    },
    /// Refusal of a Prepare or Accept.
    Nack {
        /// The ballot refused.
        ballot: Ballot,
        /// Highest ballot the refuser has promised.
        promised: Ballot,
        /// Whom the refuser regards as its principal.
        principal: NodeId,
    },
    /// Paxos phase 2a: the proposed view.
    Accept {
        /// Proposal ballot.
        ballot: Ballot,
        /// The proposed view.
        view: ClusterView,
    },
    /// Paxos phase 2b.
    Accepted {
        /// Ballot accepted.
        ballot: Ballot,
    },
    /// Phase 3: every member accepted; apply the view.
    Commit {
        /// Ballot committed.
        ballot: Ballot,
        /// The committed view.
        view: ClusterView,
    },
    /// Acknowledges a Commit (the member now holds that view), stopping its
    /// retransmission.
    Committed {
        /// Ballot committed.
        ballot: Ballot,
    },
}

/// A message together with its sender: the unit the transport carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    /// Sending node.
    pub from: NodeId,
    /// Payload.
    pub msg: Message,
}

const TAG_HEARTBEAT: u8 = 1;
const TAG_PREPARE: u8 = 2;
const TAG_PROMISE: u8 = 3;
const TAG_NACK: u8 = 4;
const TAG_ACCEPT: u8 = 5;
const TAG_ACCEPTED: u8 = 6;
const TAG_COMMIT: u8 = 7;
const TAG_COMMITTED: u8 = 8;

fn put_ballot(w: &mut Writer, b: Ballot) {
    w.u64(b.round);
    w.u64(b.node.0);
}

fn get_ballot(r: &mut Reader<'_>) -> Result<Ballot, DecodeError> {
    let round = r.u64()?;
    let node = NodeId(r.u64()?);
    Ok(Ballot { round, node })
}

fn put_ids(w: &mut Writer, ids: &[NodeId]) {
    w.count(ids.len());
    for id in ids {
        w.u64(id.0);
    }
}

fn get_ids(r: &mut Reader<'_>) -> Result<Vec<NodeId>, DecodeError> {
    let n = r.count(MAX_CLUSTER_SIZE)?;
    let mut out = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        out.push(NodeId(r.u64()?));
    }
    Ok(out)
}

fn put_view(w: &mut Writer, v: &ClusterView) {
    w.u64(v.key());
    put_ids(w, v.succession());
}

fn get_view(r: &mut Reader<'_>) -> Result<ClusterView, DecodeError> {
    let key = r.u64()?;
    let ids = get_ids(r)?;
    ClusterView::new(key, ids).ok_or(DecodeError::Invalid("cluster view"))
}

fn put_addr(w: &mut Writer, a: &PeerAddr) {
    w.bytes(a.as_str().as_bytes());
}

fn get_addr(r: &mut Reader<'_>) -> Result<PeerAddr, DecodeError> {
    let raw = r.bytes(MAX_ADDR_LEN)?;
    let text = std::str::from_utf8(raw).map_err(|_| DecodeError::Invalid("address utf8"))?;
    PeerAddr::new(text).ok_or(DecodeError::Invalid("empty address"))
}

impl Message {
    fn put(&self, w: &mut Writer) {
        match self {
            Message::Heartbeat(hb) => {
                debug_assert!(hb.succession.len() <= MAX_CLUSTER_SIZE);
                debug_assert!(hb.peers.len() <= MAX_PEERS);
                w.u8(TAG_HEARTBEAT);
                put_addr(w, &hb.addr);
                w.u64(hb.incarnation);
                w.u64(hb.seq);
                w.u64(hb.sent_ms);
                w.u64(hb.cluster_key);
                put_ids(w, &hb.succession);
                w.count(hb.peers.len());
                for (id, addr) in &hb.peers {
                    w.u64(id.0);
                    put_addr(w, addr);
                }
            }
            Message::Prepare { ballot } => {
                w.u8(TAG_PREPARE);
                put_ballot(w, *ballot);
            }
            Message::Promise { ballot } => {
                w.u8(TAG_PROMISE);
                put_ballot(w, *ballot);
            }
            Message::Nack {
                ballot,
                promised,
                principal,
            } => {
                w.u8(TAG_NACK);
                put_ballot(w, *ballot);
                put_ballot(w, *promised);
                w.u64(principal.0);
            }
            Message::Accept { ballot, view } => {
                w.u8(TAG_ACCEPT);
                put_ballot(w, *ballot);
                put_view(w, view);
            }
            Message::Accepted { ballot } => {
                w.u8(TAG_ACCEPTED);
                put_ballot(w, *ballot);
            }
            Message::Commit { ballot, view } => {
                w.u8(TAG_COMMIT);
                put_ballot(w, *ballot);
                put_view(w, view);
            }
            Message::Committed { ballot } => {
                w.u8(TAG_COMMITTED);
                put_ballot(w, *ballot);
            }
        }
    }

    fn get(r: &mut Reader<'_>) -> Result<Message, DecodeError> {
        let tag = r.u8()?;
        Ok(match tag {
            TAG_HEARTBEAT => {
                let addr = get_addr(r)?;
                let incarnation = r.u64()?;
                let seq = r.u64()?;
                let sent_ms = r.u64()?;
                let cluster_key = r.u64()?;
                let succession = get_ids(r)?;
                if !succession.windows(2).all(|w| w[0] < w[1]) {
                    return Err(DecodeError::Invalid("succession order"));
                }
                if (cluster_key == 0) != succession.is_empty() {
                    return Err(DecodeError::Invalid("orphan heartbeat"));
                }
                let n = r.count(MAX_PEERS)?;
                let mut peers = Vec::with_capacity(n.min(64));
                for _ in 0..n {
                    let id = NodeId(r.u64()?);
                    peers.push((id, get_addr(r)?));
                }
                Message::Heartbeat(Heartbeat {
                    addr,
                    incarnation,
                    seq,
                    sent_ms,
                    cluster_key,
                    succession,
                    peers,
                })
            }
            TAG_PREPARE => Message::Prepare {
                ballot: get_ballot(r)?,
            },
            TAG_PROMISE => Message::Promise {
                ballot: get_ballot(r)?,
            },
            TAG_NACK => Message::Nack {
                ballot: get_ballot(r)?,
                promised: get_ballot(r)?,
                principal: NodeId(r.u64()?),
            },
            TAG_ACCEPT => Message::Accept {
                ballot: get_ballot(r)?,
                view: get_view(r)?,
            },
            TAG_ACCEPTED => Message::Accepted {
                ballot: get_ballot(r)?,
            },
            TAG_COMMIT => Message::Commit {
                ballot: get_ballot(r)?,
                view: get_view(r)?,
            },
            TAG_COMMITTED => Message::Committed {
                ballot: get_ballot(r)?,
            },
            other => return Err(DecodeError::UnknownTag(other)),
        })
    }

    /// Short name of the message kind, for traces.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Heartbeat(_) => "heartbeat",
            Message::Prepare { .. } => "prepare",
            Message::Promise { .. } => "promise",
            Message::Nack { .. } => "nack",
            Message::Accept { .. } => "accept",
            Message::Accepted { .. } => "accepted",
            Message::Commit { .. } => "commit",
            Message::Committed { .. } => "committed",
        }
    }
}

impl Message {
    /// Serialises the message alone (version byte, tag, body), for
    /// transports that carry the sender id out of band.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u8(FORMAT_VERSION);
        self.put(&mut w);
        w.finish()
    }

    /// Parses bytes produced by [`Message::encode`]. Never panics.
    pub fn decode(input: &[u8]) -> Result<Message, DecodeError> {
        let mut r = Reader::new(input);
        let version = r.u8()?;
        if version != FORMAT_VERSION {
            return Err(DecodeError::UnsupportedVersion(version));
        }
        let msg = Message::get(&mut r)?;
        r.finish()?;
        Ok(msg)
    }
}

impl Envelope {
    /// Serialises to the versioned binary format.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u8(FORMAT_VERSION);
        w.u64(self.from.0);
        self.msg.put(&mut w);
        w.finish()
    }

    /// Parses bytes produced by [`Envelope::encode`]. Never panics; rejects
    /// unknown versions, unknown tags, malformed fields and trailing bytes.
    pub fn decode(input: &[u8]) -> Result<Envelope, DecodeError> {
        let mut r = Reader::new(input);
        let version = r.u8()?;
        if version != FORMAT_VERSION {
            return Err(DecodeError::UnsupportedVersion(version));
        }
        let from = NodeId(r.u64()?);
        let msg = Message::get(&mut r)?;
        r.finish()?;
        Ok(Envelope { from, msg })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> PeerAddr {
        PeerAddr::new(s).expect("valid addr")
    }

    fn samples() -> Vec<Message> {
        let b = Ballot {
            round: 42,
            node: NodeId(0xABCD),
        };
        let view =
            ClusterView::new(0xDEAD_BEEF, vec![NodeId(1), NodeId(5), NodeId(0xABCD)]).expect("v");
        vec![
            Message::Heartbeat(Heartbeat {
                addr: addr("10.0.0.1:3002"),
                incarnation: 9,
                seq: 1234,
                sent_ms: 1_700_000_000_123,
                cluster_key: view.key(),
                succession: view.succession().to_vec(),
                peers: vec![(NodeId(1), addr("a")), (NodeId(5), addr("b:1"))],
            }),
            Message::Heartbeat(Heartbeat {
                addr: addr("x"),
                incarnation: 0,
                seq: 0,
                sent_ms: 0,
                cluster_key: 0,
                succession: vec![],
                peers: vec![],
            }),
            Message::Prepare { ballot: b },
            Message::Promise { ballot: b },
            Message::Nack {
                ballot: b,
                promised: Ballot {
                    round: 43,
                    node: NodeId(2),
                },
                principal: NodeId(77),
            },
            Message::Accept {
                ballot: b,
                view: view.clone(),
            },
            Message::Accepted { ballot: b },
            Message::Commit { ballot: b, view },
            Message::Committed { ballot: b },
        ]
    }

    #[test]
    fn roundtrip_all_kinds() {
        for msg in samples() {
            let env = Envelope {
                from: NodeId(0x1122_3344_5566_7788),
                msg,
            };
            let bytes = env.encode();
            assert_eq!(bytes[0], FORMAT_VERSION);
            assert_eq!(Envelope::decode(&bytes), Ok(env.clone()), "{:?}", env.msg);
        }
    }

    #[test]
    fn bare_message_roundtrip() {
        for msg in samples() {
            let bytes = msg.encode();
            assert_eq!(Message::decode(&bytes), Ok(msg.clone()));
            assert!(Message::decode(&bytes[..bytes.len() - 1]).is_err());
        }
    }

    #[test]
    fn rejects_bad_version_tag_and_trailing() {
        let env = Envelope {
            from: NodeId(1),
            msg: Message::Promise {
                ballot: Ballot::default(),
            },
        };
        let mut bytes = env.encode();
        bytes[0] = 99;
        assert_eq!(
            Envelope::decode(&bytes),
            Err(DecodeError::UnsupportedVersion(99))
        );
        bytes[0] = FORMAT_VERSION;
        bytes[9] = 200;
        assert_eq!(Envelope::decode(&bytes), Err(DecodeError::UnknownTag(200)));
        let mut bytes = env.encode();
        bytes.push(0);
        assert_eq!(Envelope::decode(&bytes), Err(DecodeError::TrailingBytes));
        assert_eq!(Envelope::decode(&[]), Err(DecodeError::Truncated));
    }

    #[test]
    fn rejects_unsorted_view() {
        let env = Envelope {
            from: NodeId(1),
            msg: Message::Commit {
                ballot: Ballot::default(),
                view: ClusterView::new(3, vec![NodeId(1), NodeId(2)]).expect("v"),
            },
        };
        let mut bytes = env.encode();
        let n = bytes.len();
        // Swap the two member ids (the last 16 bytes).
        let (a, b) = bytes[n - 16..].split_at_mut(8);
        a.swap_with_slice(b);
        assert_eq!(
            Envelope::decode(&bytes),
            Err(DecodeError::Invalid("cluster view"))
        );
    }

    /// Every prefix, and many deterministic bit-flips and byte garbage, must
    /// decode to an error or a message without panicking.
    #[test]
    fn garbage_never_panics() {
        let mut state = 0x1234_5678_u64;
        let mut next = || {
            state = crate::view::mix64(state);
            state
        };
        for msg in samples() {
            let bytes = Envelope {
                from: NodeId(3),
                msg,
            }
            .encode();
            for cut in 0..bytes.len() {
                assert!(Envelope::decode(&bytes[..cut]).is_err());
            }
            for _ in 0..2000 {
                let mut b = bytes.clone();
                let flips = 1 + (next() % 4) as usize;
                for _ in 0..flips {
                    let i = (next() % b.len() as u64) as usize;
                    b[i] ^= 1 << (next() % 8);
                }
                if let Ok(env) = Envelope::decode(&b) {
                    // Whatever decoded must re-encode to the same bytes.
                    assert_eq!(env.encode(), b);
                }
            }
        }
        for len in 0..200 {
            let b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let _ = Envelope::decode(&b);
            let mut v = b.clone();
            if !v.is_empty() {
                v[0] = FORMAT_VERSION;
            }
            let _ = Envelope::decode(&v);
        }
    }
}
