//! Partition versions and the outcome of the partition-version exchange
//! that follows every view change (001 §2.2.1, §2.2.1.1–2.2.1.3).
//!
//! Every node keeps a [`PartitionVersion`] per partition of each
//! namespace. After a view is committed, every member sends every other
//! member the versions it held *when the view was published* (its
//! snapshot), with its record count per partition. With all snapshots in,
//! every node runs the same pure function, [`resolve`], per partition and
//! learns the same [`Outcome`]: which distinct copies exist (groups), which
//! node sends each of them to which new replicas, who must receive what,
//! which copies are dropped once they are no longer needed, and whether the
//! new master has to be helped by duplicate resolution or an acting master.
//!
//! Versions:
//! - [`PartitionVersion::ZERO`]: the node holds nothing of the partition
//!   (a partition with no records is reported as ZERO: there is nothing in
//!   it to merge);
//! - `full(K)`: the complete copy the replicas of the regime with cluster
//!   key `K` hold. Every replica of a partition gets a version stamped with
//!   the new cluster key at every exchange, so two sides of a split always
//!   come back with *different* versions, while copies whose holders stayed
//!   together keep *equal* versions — equal versions are the case where
//!   migration is skipped entirely;
//! - `subset(K)`: a replica of regime `K` that was still being filled.
//!   When a full copy of the same `K` is also present, the subset is known
//!   to be contained in it (every write of regime `K` reached every replica
//!   of `K`, and the fill came from copies the full holders hold too), so it
//!   is neither sent nor resolved against; otherwise it is a distinct copy
//!   of its own.
//!
//! Invariants (tested below):
//! - the outcome is a pure function of the replica list and the set of
//!   holdings (their order does not matter), so all nodes agree;
//! - every group has exactly one source, which holds that group's copy;
//! - a replica that holds a group's exact version never receives that
//!   group; every other replica receives every group;
//! - a replica with nothing to receive is full at once; copies held outside
//!   the replica list are dropped only after their group was delivered
//!   (or at once when no replica needs it).

use citrine_types::NodeId;

/// A partition's version on one node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionVersion {
    /// Cluster key of the regime the copy belongs to; 0 = no copy.
    pub ckey: u64,
    /// The copy was still being filled in that regime.
    pub subset: bool,
}

impl PartitionVersion {
    /// No copy.
    pub const ZERO: PartitionVersion = PartitionVersion {
        ckey: 0,
        subset: false,
    };

    /// The complete copy of regime `ckey`.
    pub fn full(ckey: u64) -> PartitionVersion {
        debug_assert!(ckey != 0, "cluster keys are never 0");
        PartitionVersion {
            ckey,
            subset: false,
        }
    }

    /// A copy of regime `ckey` that was still being filled.
    pub fn subset(ckey: u64) -> PartitionVersion {
        debug_assert!(ckey != 0, "cluster keys are never 0");
        PartitionVersion { ckey, subset: true }
    }

    pub fn is_zero(&self) -> bool {
        self.ckey == 0
    }

    /// One byte of flags for the wire (bit 0: subset).
    pub fn flags(&self) -> u8 {
        u8::from(self.subset)
    }

    /// From the wire form; `None` for unknown flags.
    pub fn from_wire(ckey: u64, flags: u8) -> Option<PartitionVersion> {
        match flags {
            0 | 1 => Some(PartitionVersion {
                ckey,
                subset: flags == 1,
            }),
            _ => None,
        }
    }
}

/// What one member held of a partition when the view was published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holding {
    pub node: NodeId,
    pub version: PartitionVersion,
    pub records: u64,
}

/// One distinct copy of the partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub version: PartitionVersion,
    /// The node that sends this copy.
    pub source: NodeId,
    /// Records in the source's copy.
    pub records: u64,
    /// Replicas that must receive this copy.
    pub targets: Vec<NodeId>,
    /// Nodes outside the replica list whose copies this group covers
    /// (exact holders and known subsets), other than the source: they drop
    /// their copies when the source has delivered the group.
    pub retire: Vec<NodeId>,
}

/// The result of the exchange for one partition.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Outcome {
    /// Distinct copies, smallest first (then by source id).
    pub groups: Vec<Group>,
    /// Present when the master (first replica) holds nothing and exactly
    /// one copy exists: the node with that copy, which serves the
    /// partition's reads until the master is filled (001 §2.2.1.3).
    pub acting_master: Option<NodeId>,
}

impl Outcome {
    /// The sources `node` must receive before its copy is complete (empty:
    /// complete now). Only meaningful for replicas.
    pub fn expected_by(&self, node: NodeId) -> Vec<NodeId> {
        self.groups
            .iter()
            .filter(|group| group.targets.contains(&node))
            .map(|group| group.source)
            .collect()
    }

    /// The groups `node` sends (it is their source and they have targets).
    pub fn sent_by(&self, node: NodeId) -> impl Iterator<Item = &Group> {
        self.groups
            .iter()
            .filter(move |group| group.source == node && !group.targets.is_empty())
    }

    /// For a node outside the replica list that holds a copy: `None` when
    /// it may drop its copy at once, `Some(source)` when it waits for that
    /// source to deliver its group first (itself when it is the source).
    pub fn drop_after(&self, node: NodeId) -> Option<NodeId> {
        self.groups
            .iter()
            .find(|group| {
                !group.targets.is_empty() && (group.source == node || group.retire.contains(&node))
            })
            .map(|group| group.source)
    }
}

/// Resolves one partition: `replicas` is its new replica list (master
/// first), `holdings` what the members held (ZERO holdings may be left out
/// or included; they are ignored).
pub fn resolve(replicas: &[NodeId], holdings: &[Holding]) -> Outcome {
    let mut holdings: Vec<Holding> = holdings
        .iter()
        .copied()
        .filter(|holding| !holding.version.is_zero())
        .collect();
    holdings.sort_by_key(|holding| holding.node);
    holdings.dedup_by_key(|holding| holding.node);
    let full_keys: Vec<u64> = holdings
        .iter()
        .filter(|holding| !holding.version.subset)
        .map(|holding| holding.version.ckey)
        .collect();
    let rank = |node: NodeId| replicas.iter().position(|replica| *replica == node);
    let mut groups: Vec<Group> = Vec::new();
    // Full versions: one group per distinct version.
    let mut versions: Vec<PartitionVersion> = holdings
        .iter()
        .filter(|holding| !holding.version.subset)
        .map(|holding| holding.version)
        .collect();
    versions.sort();
    versions.dedup();
    for version in versions {
        let holders: Vec<&Holding> = holdings
            .iter()
            .filter(|holding| holding.version == version)
            .collect();
        groups.push(group_of(replicas, &holders, version, &rank));
    }
    // Subsets not covered by a full copy of their regime: each its own.
    for holding in holdings
        .iter()
        .filter(|holding| holding.version.subset && !full_keys.contains(&holding.version.ckey))
    {
        groups.push(group_of(replicas, &[holding], holding.version, &rank));
    }
    // Known subsets outside the replica list retire with their full group.
    for holding in holdings.iter().filter(|holding| {
        holding.version.subset
            && full_keys.contains(&holding.version.ckey)
            && rank(holding.node).is_none()
    }) {
        if let Some(group) = groups
            .iter_mut()
            .find(|group| group.version == PartitionVersion::full(holding.version.ckey))
        {
            group.retire.push(holding.node);
        }
    }
    groups.sort_by_key(|group| (group.records, group.source));
    let master_holds = replicas
        .first()
        .is_some_and(|master| holdings.iter().any(|holding| holding.node == *master));
    let acting_master = match groups.as_slice() {
        [only] if !master_holds => Some(only.source),
        _ => None,
    };
    debug_assert!(groups.iter().all(|group| holdings
        .iter()
        .any(|holding| holding.node == group.source && holding.version == group.version)));
    Outcome {
        groups,
        acting_master,
    }
}

fn group_of(
    replicas: &[NodeId],
    holders: &[&Holding],
    version: PartitionVersion,
    rank: &impl Fn(NodeId) -> Option<usize>,
) -> Group {
    // Source: the holder first in the replica list, else the one with the
    // most records (ties: lowest node id).
    let source = holders
        .iter()
        .min_by_key(|holding| {
            (
                rank(holding.node).unwrap_or(usize::MAX),
                u64::MAX - holding.records,
                holding.node,
            )
        })
        .copied();
    let (source, records) =
        source.map_or((NodeId(0), 0), |holding| (holding.node, holding.records));
    let targets = replicas
        .iter()
        .copied()
        .filter(|replica| !holders.iter().any(|holding| holding.node == *replica))
        .collect();
    let retire = holders
        .iter()
        .map(|holding| holding.node)
        .filter(|node| *node != source && rank(*node).is_none())
        .collect();
    Group {
        version,
        source,
        records,
        targets,
        retire,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(node: u64, version: PartitionVersion, records: u64) -> Holding {
        Holding {
            node: NodeId(node),
            version,
            records,
        }
    }

    fn ids(nodes: &[u64]) -> Vec<NodeId> {
        nodes.iter().map(|node| NodeId(*node)).collect()
    }

    #[test]
    fn nothing_anywhere_means_nothing_to_move() {
        let outcome = resolve(&ids(&[1, 2]), &[hold(3, PartitionVersion::ZERO, 0)]);
        assert_eq!(outcome, Outcome::default());
        assert!(outcome.expected_by(NodeId(1)).is_empty());
    }

    #[test]
    fn equal_versions_skip_migration() {
        let v = PartitionVersion::full(7);
        let outcome = resolve(&ids(&[1, 2]), &[hold(1, v, 10), hold(2, v, 10)]);
        assert_eq!(outcome.groups.len(), 1);
        assert!(outcome.groups[0].targets.is_empty());
        assert_eq!(outcome.acting_master, None);
        assert_eq!(outcome.sent_by(NodeId(1)).count(), 0);
    }

    #[test]
    fn a_join_fills_the_new_replica_from_the_replica_that_stayed() {
        // Old list {1, 2}; new list {3 (empty, master), 1}; 2 leaves the list.
        let v = PartitionVersion::full(7);
        let holdings = [hold(1, v, 10), hold(2, v, 10)];
        let outcome = resolve(&ids(&[3, 1]), &holdings);
        let group = &outcome.groups[0];
        assert_eq!(group.source, NodeId(1), "the holder in the new list sends");
        assert_eq!(group.targets, ids(&[3]));
        assert_eq!(group.retire, ids(&[2]));
        assert_eq!(outcome.acting_master, Some(NodeId(1)));
        assert_eq!(outcome.expected_by(NodeId(3)), ids(&[1]));
        assert!(outcome.expected_by(NodeId(1)).is_empty());
        assert_eq!(outcome.drop_after(NodeId(2)), Some(NodeId(1)));
        // Order does not matter.
        let reversed = [holdings[1], holdings[0]];
        assert_eq!(resolve(&ids(&[3, 1]), &reversed), outcome);
    }

    #[test]
    fn a_source_outside_the_list_drops_after_sending() {
        let v = PartitionVersion::full(7);
        let outcome = resolve(&ids(&[3, 4]), &[hold(1, v, 10), hold(2, v, 12)]);
        let group = &outcome.groups[0];
        assert_eq!(
            group.source,
            NodeId(2),
            "most records when none is a replica"
        );
        assert_eq!(group.targets, ids(&[3, 4]));
        assert_eq!(group.retire, ids(&[1]));
        assert_eq!(outcome.drop_after(NodeId(2)), Some(NodeId(2)));
        assert_eq!(outcome.drop_after(NodeId(1)), Some(NodeId(2)));
        assert_eq!(outcome.acting_master, Some(NodeId(2)));
    }

    #[test]
    fn copies_no_replica_needs_drop_at_once() {
        let v = PartitionVersion::full(7);
        let outcome = resolve(
            &ids(&[1, 2]),
            &[hold(1, v, 5), hold(2, v, 5), hold(3, v, 5)],
        );
        assert_eq!(outcome.drop_after(NodeId(3)), None);
    }

    #[test]
    fn split_sides_merge_into_every_replica() {
        // Side A (key 8) held it on 1 and 2; side B (key 9) on 3.
        let a = PartitionVersion::full(8);
        let b = PartitionVersion::full(9);
        let outcome = resolve(
            &ids(&[1, 3]),
            &[hold(1, a, 50), hold(2, a, 50), hold(3, b, 20)],
        );
        assert_eq!(outcome.groups.len(), 2);
        assert_eq!(outcome.groups[0].version, b, "smallest first");
        assert_eq!(outcome.groups[0].targets, ids(&[1]));
        assert_eq!(outcome.groups[1].targets, ids(&[3]));
        assert_eq!(outcome.expected_by(NodeId(1)), ids(&[3]));
        assert_eq!(outcome.expected_by(NodeId(3)), ids(&[1]));
        assert_eq!(outcome.acting_master, None, "the master holds a copy");
        assert_eq!(outcome.drop_after(NodeId(2)), Some(NodeId(1)));
    }

    #[test]
    fn known_subsets_are_skipped_and_unknown_ones_merged() {
        let full = PartitionVersion::full(8);
        let partial = PartitionVersion::subset(8);
        let outcome = resolve(&ids(&[1, 2]), &[hold(1, full, 50), hold(3, partial, 20)]);
        assert_eq!(outcome.groups.len(), 1);
        assert_eq!(outcome.groups[0].retire, ids(&[3]));
        assert_eq!(outcome.expected_by(NodeId(2)), ids(&[1]));
        // Without the full copy of its regime, the subset is a copy of its own.
        let alone = resolve(&ids(&[1, 2]), &[hold(3, partial, 20)]);
        assert_eq!(alone.groups.len(), 1);
        assert_eq!(alone.groups[0].source, NodeId(3));
        assert_eq!(alone.groups[0].targets, ids(&[1, 2]));
        assert_eq!(alone.acting_master, Some(NodeId(3)));
        // A replica holding a known subset still receives the full copy.
        let filling = resolve(&ids(&[3, 1]), &[hold(1, full, 50), hold(3, partial, 20)]);
        assert_eq!(filling.expected_by(NodeId(3)), ids(&[1]));
        assert_eq!(filling.acting_master, None, "the master holds part of it");
    }

    #[test]
    fn wire_flags() {
        for version in [
            PartitionVersion::ZERO,
            PartitionVersion::full(3),
            PartitionVersion::subset(3),
        ] {
            assert_eq!(
                PartitionVersion::from_wire(version.ckey, version.flags()),
                Some(version)
            );
        }
        assert_eq!(PartitionVersion::from_wire(3, 2), None);
    }
}
