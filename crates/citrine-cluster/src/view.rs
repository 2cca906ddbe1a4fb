//! The cluster view: the tuple (cluster key, succession list) of 001 §2.1.1.
//!
//! Owns: [`ClusterView`], [`Ballot`] and the deterministic derivation of new
//! cluster keys ([`derive_cluster_key`]).
//!
//! Invariants (enforced by [`ClusterView::new`], the only constructor):
//! - the cluster key is never 0 (0 means "no cluster", i.e. an orphan node);
//! - the succession list is non-empty, sorted ascending and free of
//!   duplicates, so two nodes holding the same view hold byte-identical lists;
//! - the principal of a view is its highest node id (the last entry).
//!
//! The paper calls the key "randomly generated"; this crate may not use
//! randomness, so keys are a strong 64-bit mix of the proposer id, its ballot,
//! the time it was proposed, the previous key and the new members. Two
//! different commits produce the same key only by a 2^-64 accident.

use citrine_types::NodeId;

/// Largest succession list the wire format accepts.
pub const MAX_CLUSTER_SIZE: usize = 4096;

/// A committed (or proposed) cluster membership.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClusterView {
    key: u64,
    succession: Vec<NodeId>,
}

impl ClusterView {
    /// Builds a view; `None` unless `key != 0` and `succession` is non-empty,
    /// strictly ascending and at most [`MAX_CLUSTER_SIZE`] long.
    pub fn new(key: u64, succession: Vec<NodeId>) -> Option<ClusterView> {
        let sorted = succession.windows(2).all(|w| w[0] < w[1]);
        let ok =
            key != 0 && !succession.is_empty() && succession.len() <= MAX_CLUSTER_SIZE && sorted;
        ok.then_some(ClusterView { key, succession })
    }

    /// The cluster key identifying this instance of the membership.
    pub fn key(&self) -> u64 {
        self.key
    }

    /// Member node ids, ascending.
    pub fn succession(&self) -> &[NodeId] {
        &self.succession
    }

    /// The principal: the highest node id of the view.
    pub fn principal(&self) -> NodeId {
        // Non-empty by construction; the fallback is unreachable.
        self.succession.last().copied().unwrap_or_default()
    }

    /// Whether `id` is a member.
    pub fn contains(&self, id: NodeId) -> bool {
        self.succession.binary_search(&id).is_ok()
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.succession.len()
    }

    /// Always false (views are never empty); present for API symmetry.
    pub fn is_empty(&self) -> bool {
        self.succession.is_empty()
    }
}

/// A Paxos ballot number, ordered by `(round, node)` so that two proposers
/// never issue equal ballots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Ballot {
    /// Monotonic round counter (highest seen + 1 when proposing).
    pub round: u64,
    /// The proposing node, which breaks ties.
    pub node: NodeId,
}

/// One step of the splitmix64 finaliser; a bijection on `u64`.
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Derives the key of a new view from everything that makes the proposal
/// unique. Never returns 0.
pub fn derive_cluster_key(
    ballot: Ballot,
    now_ms: u64,
    previous_key: u64,
    succession: &[NodeId],
) -> u64 {
    let mut h = mix64(ballot.node.0 ^ 0xC1_7A1E);
    for v in [ballot.round, now_ms, previous_key, succession.len() as u64] {
        h = mix64(h ^ v);
    }
    for id in succession {
        h = mix64(h ^ id.0);
    }
    if h == 0 {
        1
    } else {
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view_validation() {
        assert!(ClusterView::new(0, vec![NodeId(1)]).is_none());
        assert!(ClusterView::new(5, vec![]).is_none());
        assert!(ClusterView::new(5, vec![NodeId(2), NodeId(1)]).is_none());
        assert!(ClusterView::new(5, vec![NodeId(1), NodeId(1)]).is_none());
        let v = ClusterView::new(5, vec![NodeId(1), NodeId(9)]);
        let v = v.expect("valid view");
        assert_eq!(v.principal(), NodeId(9));
        assert!(v.contains(NodeId(1)));
        assert!(!v.contains(NodeId(2)));
        assert_eq!(v.len(), 2);
    }

    #[test]
    fn keys_differ_and_are_nonzero() {
        let b = Ballot {
            round: 1,
            node: NodeId(7),
        };
        let s = [NodeId(1), NodeId(7)];
        let k1 = derive_cluster_key(b, 100, 0, &s);
        let k2 = derive_cluster_key(b, 101, 0, &s);
        let k3 = derive_cluster_key(b, 100, 0, &s[1..]);
        assert_ne!(k1, 0);
        assert_ne!(k1, k2);
        assert_ne!(k1, k3);
        assert_eq!(k1, derive_cluster_key(b, 100, 0, &s));
    }

    #[test]
    fn ballot_order() {
        let a = Ballot {
            round: 2,
            node: NodeId(1),
        };
        let b = Ballot {
            round: 2,
            node: NodeId(3),
        };
        let c = Ballot {
            round: 3,
            node: NodeId(0),
        };
        assert!(a < b && b < c);
    }
}
