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
//! Groups: one per distinct full version, plus each subset whose regime
//! has no full copy present; a copy of a regime another full copy went
//! through (that copy's lineage, [`Covers`], sent with the snapshot) is
//! skipped too. A group's **source** is its holder first in the new
//! replica list, else the one with the most records (ties: the lowest node
//! id); its **targets** are the replicas not holding exactly its version;
//! the copies outside the list that it covers are **retired** once it is
//! delivered. The **acting master** is the source of the only copy when
//! the master must receive it (it holds nothing, or only a copy that one
//! contains).
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
    /// The regimes whose full copies this copy is known to contain.
    pub covers: Covers,
}

/// Most regimes a copy remembers containing (the first learned are kept).
pub const COVERS_MAX: usize = 8;

/// The cluster keys of the regimes whose full copies a copy is known to
/// contain (its lineage): a replica that was full in regime `K` and stayed
/// full, or was filled with every copy present, contains `full(K)` whole.
/// A copy of such a regime held elsewhere (a node that left, a copy waiting
/// to be dropped, a restarted node's) is then no distinct copy: it is
/// neither merged nor sent, only replaced. In the order learned (a copy's
/// own regimes before those they went through), at most [`COVERS_MAX`], no
/// duplicates, never 0. Forgetting a key is always safe
/// (a copy is then merged that need not be).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Covers {
    keys: [u64; COVERS_MAX],
    len: u8,
}

impl Covers {
    /// Contains nothing known.
    pub const EMPTY: Covers = Covers {
        keys: [0; COVERS_MAX],
        len: 0,
    };

    /// From keys in the order learned (extra keys, zeros and repeats are
    /// left out).
    pub fn from_keys(keys: impl IntoIterator<Item = u64>) -> Covers {
        let mut covers = Covers::default();
        covers.extend(keys);
        covers
    }

    /// Adds keys after those held, while there is room.
    pub fn extend(&mut self, keys: impl IntoIterator<Item = u64>) {
        for key in keys {
            if usize::from(self.len) == COVERS_MAX {
                return;
            }
            if key != 0 && !self.contains(key) {
                self.keys[usize::from(self.len)] = key;
                self.len += 1;
            }
        }
    }

    pub fn contains(&self, ckey: u64) -> bool {
        ckey != 0 && self.keys[..usize::from(self.len)].contains(&ckey)
    }

    /// The keys, in the order learned.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.keys[..usize::from(self.len)].iter().copied()
    }

    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What a copy of `version` with these covers contains once it moves
    /// on to a later regime: its own regime when it was full, then these.
    pub fn after(&self, version: PartitionVersion) -> Covers {
        let mut covers = Covers::default();
        if !version.is_zero() && !version.subset {
            covers.extend([version.ckey]);
        }
        covers.extend(self.iter());
        covers
    }
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
    /// Present when exactly one distinct copy exists and the master (first
    /// replica) must receive it — it holds nothing, or only a copy that
    /// one contains (a subset, a copy of a regime it went through): the source of that
    /// copy, which serves the partition's reads until the master is filled
    /// (001 §2.2.1.3).
    pub acting_master: Option<NodeId>,
    /// What a replica's copy contains once it holds every copy present
    /// (the covers of its version `full(K)`, `K` the new view's key).
    pub covers_when_full: Covers,
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
    let rank = |node: NodeId| replicas.iter().position(|replica| *replica == node);
    // The distinct full versions, each with what its holders know it
    // contains.
    let mut fulls: Vec<(PartitionVersion, Covers)> = Vec::new();
    for holding in holdings.iter().filter(|holding| !holding.version.subset) {
        match fulls
            .iter_mut()
            .find(|(version, _)| *version == holding.version)
        {
            Some((_, covers)) => covers.extend(holding.covers.iter()),
            None => fulls.push((holding.version, holding.covers)),
        }
    }
    fulls.sort_by_key(|(version, _)| *version);
    let container = |version: PartitionVersion| container_of(&fulls, version);
    let mut groups: Vec<Group> = Vec::new();
    // Full versions no other full copy contains: one group each.
    for (version, _) in fulls
        .iter()
        .filter(|(version, _)| container(*version).is_none())
    {
        let holders: Vec<&Holding> = holdings
            .iter()
            .filter(|holding| holding.version == *version)
            .collect();
        groups.push(group_of(replicas, &holders, *version, &rank));
    }
    // Subsets no full copy contains: each its own.
    for holding in holdings
        .iter()
        .filter(|holding| holding.version.subset && container(holding.version).is_none())
    {
        groups.push(group_of(replicas, &[holding], holding.version, &rank));
    }
    // Copies a group contains (known subsets, full copies of regimes a
    // later copy went through), held outside the replica list, retire with
    // that group.
    for holding in holdings
        .iter()
        .filter(|holding| rank(holding.node).is_none())
    {
        if let Some(within) = container(holding.version) {
            if let Some(group) = groups.iter_mut().find(|group| group.version == within) {
                group.retire.push(holding.node);
            }
        }
    }
    groups.sort_by_key(|group| (group.records, group.source));
    // One copy, and the master must receive it (it holds nothing, or only
    // a copy that one contains): that copy's holder acts for the master.
    let acting_master = match (groups.as_slice(), replicas.first()) {
        ([only], Some(master)) if only.targets.contains(master) => Some(only.source),
        _ => None,
    };
    // Once filled, a replica holds the merge of every copy present, so it
    // contains each full one and everything those contain.
    // The latest regimes first: the groups' own, then those they contain.
    let mut own: Vec<(bool, PartitionVersion)> = fulls
        .iter()
        .map(|(version, _)| (container(*version).is_some(), *version))
        .collect();
    own.sort();
    let mut covers_when_full = Covers::default();
    covers_when_full.extend(own.iter().map(|(_, version)| version.ckey));
    for depth in 0..COVERS_MAX {
        covers_when_full.extend(
            holdings
                .iter()
                .filter_map(|holding| holding.covers.iter().nth(depth)),
        );
    }
    debug_assert!(groups.iter().all(|group| holdings
        .iter()
        .any(|holding| holding.node == group.source && holding.version == group.version)));
    Outcome {
        groups,
        acting_master,
        covers_when_full,
    }
}

/// The full version whose group contains a copy of `version`, following
/// containment to a full version nothing contains; `None` when the copy is
/// a group of its own. `fulls` are the distinct full versions present,
/// sorted, with what each is known to contain.
fn container_of(
    fulls: &[(PartitionVersion, Covers)],
    version: PartitionVersion,
) -> Option<PartitionVersion> {
    let covers_of = |version: PartitionVersion| {
        fulls
            .iter()
            .find(|(full, _)| *full == version)
            .map(|(_, covers)| *covers)
            .unwrap_or_default()
    };
    // The full copy directly containing `at`: its own regime's full copy
    // for a subset, else one that went through `at`'s regime (and not
    // the other way round, which would say both are the same).
    let direct = |at: PartitionVersion| -> Option<PartitionVersion> {
        if at.subset && fulls.iter().any(|(full, _)| full.ckey == at.ckey) {
            return Some(PartitionVersion::full(at.ckey));
        }
        let mine = covers_of(at);
        fulls
            .iter()
            .find(|(full, covers)| {
                *full != at && covers.contains(at.ckey) && !mine.contains(full.ckey)
            })
            .map(|(full, _)| *full)
    };
    let mut at = version;
    // Each step goes to a copy that went through a later regime, so a
    // chain is at most as long as the full versions present; a longer one
    // is a cycle of inconsistent claims, where nothing is trusted.
    for _ in 0..=fulls.len() {
        match direct(at) {
            Some(next) => at = next,
            None => return (at != version).then_some(at),
        }
    }
    None
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
            covers: Covers::default(),
        }
    }

    fn lineage(node: u64, version: PartitionVersion, records: u64, covers: &[u64]) -> Holding {
        Holding {
            covers: Covers::from_keys(covers.iter().copied()),
            ..hold(node, version, records)
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
        assert_eq!(
            filling.acting_master,
            Some(NodeId(1)),
            "the master holds only a known subset: the full copy acts for it"
        );
        // The master holding the only copy's version needs no one.
        let whole = resolve(&ids(&[1, 3]), &[hold(1, full, 50), hold(3, partial, 20)]);
        assert_eq!(whole.acting_master, None);
        // Two distinct copies: neither is whole, the master merges them.
        let other = PartitionVersion::full(9);
        let split = resolve(&ids(&[3, 1]), &[hold(1, full, 50), hold(2, other, 20)]);
        assert_eq!(split.acting_master, None);
    }

    #[test]
    fn copies_a_later_copy_went_through_are_replaced_not_merged() {
        // View 10 → 11: node 1 stayed a full replica (it contains full(10)),
        // node 2 left the replica list and still waits to drop its
        // full(10), node 3 was filling. View 12 makes node 3 master.
        let (old, kept) = (PartitionVersion::full(10), PartitionVersion::full(11));
        let held = [
            lineage(1, kept, 50, &[10]),
            hold(2, old, 40),
            hold(3, PartitionVersion::subset(11), 20),
        ];
        let outcome = resolve(&ids(&[3, 4]), &held);
        assert_eq!(outcome.groups.len(), 1, "{outcome:?}");
        let group = &outcome.groups[0];
        assert_eq!((group.version, group.source), (kept, NodeId(1)));
        assert_eq!(group.targets, ids(&[3, 4]));
        assert_eq!(group.retire, ids(&[2]), "the old copy goes with it");
        assert_eq!(outcome.drop_after(NodeId(2)), Some(NodeId(1)));
        assert_eq!(outcome.acting_master, Some(NodeId(1)));
        assert_eq!(
            outcome.covers_when_full.iter().collect::<Vec<_>>(),
            vec![11, 10],
            "the new full copy contains both regimes, the latest first"
        );
        // Without the lineage both full copies are merged, and no one acts.
        let merged = resolve(
            &ids(&[3, 4]),
            &[
                hold(1, kept, 50),
                hold(2, old, 40),
                hold(3, PartitionVersion::subset(11), 20),
            ],
        );
        assert_eq!(merged.groups.len(), 2);
        assert_eq!(merged.acting_master, None);
        // Containment follows chains: full(12) went through 11, 11 through
        // 10 (its holder forgot 10).
        let chain = resolve(
            &ids(&[5, 1]),
            &[
                lineage(1, PartitionVersion::full(12), 50, &[11]),
                lineage(2, kept, 50, &[10]),
                hold(3, old, 40),
            ],
        );
        assert_eq!(chain.groups.len(), 1, "{chain:?}");
        assert_eq!(chain.groups[0].retire, ids(&[2, 3]));
        assert_eq!(chain.acting_master, Some(NodeId(1)));
    }

    #[test]
    fn split_sides_stay_distinct_whatever_they_went_through() {
        // Both sides went through regime 4, each wrote in its own regime.
        let held = [
            lineage(1, PartitionVersion::full(5), 30, &[4]),
            lineage(2, PartitionVersion::full(6), 20, &[4]),
            hold(3, PartitionVersion::full(4), 10),
        ];
        let outcome = resolve(&ids(&[1, 2]), &held);
        assert_eq!(outcome.groups.len(), 2);
        assert_eq!(outcome.acting_master, None);
        assert_eq!(outcome.expected_by(NodeId(1)), ids(&[2]));
        assert_eq!(outcome.expected_by(NodeId(2)), ids(&[1]));
        assert!(outcome.drop_after(NodeId(3)).is_some(), "full(4) retires");
        // A restarted node's copy of a regime one side went through is
        // replaced; its own writes of a regime no one went through are
        // merged.
        let restarted = resolve(
            &ids(&[3, 1]),
            &[
                lineage(1, PartitionVersion::full(5), 30, &[4]),
                hold(3, PartitionVersion::subset(4), 10),
            ],
        );
        assert_eq!(restarted.groups.len(), 1);
        assert_eq!(restarted.acting_master, Some(NodeId(1)));
        let diverged = resolve(
            &ids(&[3, 1]),
            &[
                lineage(1, PartitionVersion::full(5), 30, &[4]),
                hold(3, PartitionVersion::subset(9), 10),
            ],
        );
        assert_eq!(diverged.groups.len(), 2);
        assert_eq!(diverged.acting_master, None);
        // Claims that contradict each other are not trusted.
        let mutual = resolve(
            &ids(&[1, 2]),
            &[
                lineage(1, PartitionVersion::full(7), 5, &[8]),
                lineage(2, PartitionVersion::full(8), 5, &[7]),
            ],
        );
        assert_eq!(mutual.groups.len(), 2);
    }

    #[test]
    fn covers_keep_the_first_keys_learned() {
        let mut covers = Covers::from_keys([3, 0, 3, 2]);
        assert_eq!(covers.iter().collect::<Vec<_>>(), vec![3, 2]);
        covers.extend(10..30);
        assert_eq!(covers.len(), COVERS_MAX);
        assert_eq!(covers.iter().take(3).collect::<Vec<_>>(), vec![3, 2, 10]);
        assert!(!covers.contains(0));
        let moved = covers.after(PartitionVersion::full(99));
        assert_eq!(moved.iter().next(), Some(99));
        assert_eq!(moved.len(), COVERS_MAX);
        assert!(!moved.contains(15), "the oldest key fell off");
        let filling = covers.after(PartitionVersion::subset(99));
        assert!(!filling.contains(99), "a subset contains no regime whole");
        // A full replica's lineage grows by one regime per view.
        let outcome = resolve(
            &ids(&[1]),
            &[lineage(1, PartitionVersion::full(40), 5, &[30, 20])],
        );
        assert_eq!(
            outcome.covers_when_full.iter().collect::<Vec<_>>(),
            vec![40, 30, 20]
        );
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
