//! Which sub-cluster may serve a partition of a strong-consistency
//! namespace (paper 000 §4.1–4.2), who masters it there, which copies the
//! master must merge first, and how every member's partition version
//! changes at the view — as pure functions of the roster, the present
//! roster nodes and their versions.
//!
//! Owns: [`RosterPlacement`] (roster-master and roster-replicas of every
//! partition, computed from the roster, never from the present nodes),
//! [`ScVersion`] (what a node holds of, and knows about, one partition),
//! [`decide`] (the availability rules), [`next_versions`],
//! [`fill_complete`], [`drop_copies`] and [`revive`] (the version
//! transitions), [`view_regime`], [`decide_all`] (the SC partition map of
//! a view) and [`summarize`]. No I/O, clock or
//! randomness: every node of a sub-cluster that is given the same versions
//! computes the same answer.
//!
//! # Terms
//!
//! - *Roster replicas* `RR` of partition `p`: the first `rf` columns of the
//!   partition map computed over the whole roster (with its racks); with
//!   an active rack (`active-rack`, the roster's `M<rack>|`) the first of
//!   them on that rack is moved to the front. `RR[0]` is the
//!   *roster-master*. `N` is the roster size, `rf` the replication factor
//!   capped at `N`.
//! - Only roster nodes take part; nodes of the view outside the roster are
//!   observed but hold nothing of the namespace.
//! - A node's version carries its [`Holding`] (none, subset, full), the
//!   regime of the last view in which it was a replica (`copy_regime`),
//!   and the highest regime in which it knows the partition was available
//!   (`known_regime`). The *latest* regime of a sub-cluster is the highest
//!   `known_regime` among its counted nodes. A copy is *current* when its
//!   `copy_regime` is the latest; a *full current* copy holds every write
//!   ever acknowledged. A full copy from an older regime is *stale*: the
//!   partition was available since without it (this is how a roster
//!   replica that was cut off learns that it fell behind — the paper's
//!   versions have the same job; our encoding is our own).
//! - *Counted* nodes: present roster nodes whose version has no `evade`
//!   flag (§4.2: nodes restarted after an unclean shutdown without
//!   commit-to-device, or with emptied drives, are excluded while counting
//!   majorities, and their copies are not trusted, until they are
//!   inducted again: as a replica whose fill ended, or as a non-replica
//!   whose copy was dropped once the replicas were full). `c` is their
//!   number.
//!
//! # The rules implemented (in this order; the first that holds decides)
//!
//! - *Fresh*: no counted node knows the partition was ever available, no
//!   present node holds a copy, and the whole roster is present and
//!   counted — a new roster: the partition starts empty.
//! - *R1* (§4.2 rule 1): every roster replica is counted and a full current
//!   copy is counted.
//! - *R2* (rule 2): `2c > N`, some roster replica (master included) is
//!   counted, and a full current copy is counted.
//! - *R3* (rule 3): `2c == N`, the roster-master is counted, and a full
//!   current copy is counted.
//! - *Revived*: the current copies were revived ([`revive`]) and not filled
//!   since, and the whole roster is counted (every revived copy is there
//!   to be merged).
//!
//! Otherwise the partition is unavailable, and *dead* when the whole
//! roster is present: every node that held its latest full data lost its
//! trust (evade), or a node did while a revived partition waited for its
//! fill — the operator's `revive:` ([`revive`]) accepts what is left.
//!
//! **Not implemented: rule 4** (super-majority: fewer than `rf` nodes
//! missing, subsets together suffice). Its argument needs every
//! acknowledged write on `rf` nodes that still hold it; that fails after a
//! view served by fewer than `rf` nodes (R3, or a small majority), after a
//! revive, or once a copy was lost to an unclean shutdown, and these
//! versions do not record it. With rule 4 (even restricted to majorities)
//! the property tests, during development, lost acknowledged writes in 29
//! of 2000 seeds (the first: 1, 137, 147, 306, 370), so a partition whose counted
//! copies are all subsets waits for a full copy (or for the fill that
//! makes one). The paper's literal rule 4 (no majority condition) would
//! also let two disjoint sub-clusters both serve when `rf > N/2`.
//!
//! A source holding a full current copy that is not in the replica list
//! is added to it for the view (it takes the writes too), so its copy stays
//! full and current until the fill ends — the paper's "adds more write
//! copies on the fly in situations where they are necessary" (§4).
//!
//! When available, the working replica list is the counted-or-not present
//! roster replicas in column order, then the other present roster nodes in
//! the partition's hash order (Table 1 of 001: "the next in the row",
//! Figure 10's alternate replica), cut at `rf`; its first node is the
//! master (§4.1: a roster replica is promoted when the roster-master is
//! away; Figure 12: a roster-master holding a subset still masters, and
//! resolves record by record against the other copies). The master merges
//! first ([`Assignment::sources`]): nothing when its own copy is full and
//! current; else one counted full current copy; else (revived) every
//! counted copy.
//!
//! # Regimes
//!
//! Every view of a sub-cluster gets the regime [`view_regime`]: two more
//! than the highest regime any member knows (the reference logs
//! `regime 475 -> 477` for one rebalance). Every partition available in
//! the view is served in that regime, so each change of master comes with
//! a higher regime, and — because any two sub-clusters that satisfy the
//! rules share a counted node (majorities intersect; R1 holds every roster
//! replica and every other rule holds at least one; R3's half holds the
//! roster-master) — every regime a partition is served in is higher than
//! every earlier one.
//!
//! # Invariants (checked by the property tests in `tests.rs`)
//!
//! - no two disjoint sub-clusters have the same partition available;
//! - where a partition is available, the master's copy and its sources
//!   hold every acknowledged write;
//! - the regimes a partition is served in strictly increase;
//! - with the whole roster present and no evaded node, every partition is
//!   available.
//!
//! # Left to do
//!
//! Rule 4 (above), the reference's version `family` and its 64-bit packing
//! (`ckey:48, family:4, revived, master, subset, evade` in the reference's
//! public `as_partition_version`), wrapping of the 6-bit regime in record
//! versions, the roster kept across restarts, and stopping writes on clock
//! skew are not done here. [`super::partitions`] wires these rules into
//! the node's views.

use super::roster::RosterNode;
use citrine_cluster::partition_map::{node_hash, NodeEntry, PartitionMap, PartitionMapConfig};
use citrine_types::{NodeId, PartitionId};

/// The roster-master and roster-replicas of every partition: the partition
/// map of the whole roster (with its racks), whoever is present.
#[derive(Clone, Debug)]
pub struct RosterPlacement {
    /// Roster node ids, ascending.
    nodes: Vec<NodeId>,
    map: PartitionMap,
    /// With an active rack, every partition's roster replicas with the
    /// first one on that rack moved to the front (indexed by partition).
    active: Option<Vec<Vec<NodeId>>>,
}

impl RosterPlacement {
    /// The placement of `roster` for `replication_factor` copies.
    pub fn new(roster: &[RosterNode], replication_factor: usize) -> RosterPlacement {
        let entries: Vec<NodeEntry> = roster
            .iter()
            .map(|node| NodeEntry {
                id: node.id,
                rack_id: node.rack_id,
            })
            .collect();
        let config = PartitionMapConfig {
            replication_factor,
            uniform_balance: true,
        };
        let map = PartitionMap::compute(&entries, &config);
        RosterPlacement {
            nodes: map.nodes().to_vec(),
            map,
            active: None,
        }
    }

    /// The placement of `roster` with every roster-master on
    /// `active_rack` (`active-rack`, the roster's `M<rack>|`): each
    /// partition's first roster replica on that rack becomes its
    /// roster-master, the others keep their order. A partition with no
    /// roster replica on the rack (fewer copies than racks) keeps its
    /// order. `None`: [`RosterPlacement::new`].
    pub fn with_active_rack(
        roster: &[RosterNode],
        replication_factor: usize,
        active_rack: Option<u32>,
    ) -> RosterPlacement {
        let mut placement = RosterPlacement::new(roster, replication_factor);
        let Some(rack) = active_rack else {
            return placement;
        };
        let on_rack = |id: &NodeId| {
            roster
                .iter()
                .any(|node| node.id == *id && node.rack_id == rack)
        };
        let lists = PartitionId::all()
            .map(|partition| {
                let mut list = placement.map.replicas(partition).to_vec();
                if let Some(at) = list.iter().position(on_rack) {
                    list[..=at].rotate_right(1);
                }
                list
            })
            .collect();
        placement.active = Some(lists);
        placement
    }

    /// Number of roster nodes (`N`).
    pub fn roster_size(&self) -> usize {
        self.nodes.len()
    }

    /// The replication factor capped at the roster size (`rf`).
    pub fn replication_factor(&self) -> usize {
        self.map.replication_factor()
    }

    /// Whether `id` is a roster node.
    pub fn contains(&self, id: NodeId) -> bool {
        self.nodes.binary_search(&id).is_ok()
    }

    /// The roster replicas of `partition`, roster-master first.
    pub fn roster_replicas(&self, partition: PartitionId) -> &[NodeId] {
        match &self.active {
            Some(lists) => lists
                .get(partition.index())
                .map_or(&[][..], |list| list.as_slice()),
            None => self.map.replicas(partition),
        }
    }

    /// The roster-master of `partition`.
    pub fn roster_master(&self, partition: PartitionId) -> Option<NodeId> {
        self.roster_replicas(partition).first().copied()
    }

    /// The order in which present roster nodes take `partition`'s columns:
    /// its present roster replicas in column order, then the other present
    /// roster nodes by node hash (then id). Non-roster ids are left out.
    pub fn succession(&self, partition: PartitionId, present: &[NodeId]) -> Vec<NodeId> {
        let replicas = self.roster_replicas(partition);
        let mut order: Vec<NodeId> = replicas
            .iter()
            .copied()
            .filter(|id| present.contains(id))
            .collect();
        let mut others: Vec<(u32, NodeId)> = present
            .iter()
            .copied()
            .filter(|id| self.contains(*id) && !replicas.contains(id))
            .map(|id| (node_hash(id, partition), id))
            .collect();
        others.sort_unstable();
        others.dedup();
        order.extend(others.into_iter().map(|(_, id)| id));
        order
    }
}

/// What a node holds of one partition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Holding {
    /// No copy.
    #[default]
    Absent,
    /// A copy that may lack writes acknowledged before it became a replica
    /// (an alternate replica, or a node that came back, still filling).
    Subset,
    /// A copy with every write acknowledged up to its `copy_regime`.
    Full,
}

/// One node's version of one partition of a strong-consistency namespace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ScVersion {
    pub holding: Holding,
    /// The regime of the last view in which this node was a replica of the
    /// partition (0: never).
    pub copy_regime: u32,
    /// The highest regime in which this node knows the partition was
    /// available (0: never).
    pub known_regime: u32,
    /// Cluster key of the view that last set this version.
    pub ckey: u64,
    /// Not trusted, not counted: the node came back from an unclean
    /// shutdown without commit-to-device, or with its drives emptied.
    pub evade: bool,
    /// Made available again by `revive:` after it was dead.
    pub revived: bool,
    /// This node mastered the partition in `copy_regime`.
    pub master: bool,
}

impl ScVersion {
    /// The version after an unclean restart without commit-to-device: the
    /// copy and what the node knew may have lost their last updates.
    pub fn evaded(self) -> ScVersion {
        ScVersion {
            evade: true,
            ..self
        }
    }

    /// The version of a node whose drives were emptied: nothing held or
    /// known, and not counted until inducted again.
    pub fn wiped() -> ScVersion {
        ScVersion {
            evade: true,
            ..ScVersion::default()
        }
    }
}

/// A present node and its version of the partition decided on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    pub id: NodeId,
    pub version: ScVersion,
}

/// Which rule made a partition available.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rule {
    Fresh,
    AllRosterReplicas,
    Majority,
    HalfWithRosterMaster,
    Revived,
}

/// Who serves an available partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    pub rule: Rule,
    /// The working replica list, master first.
    pub replicas: Vec<NodeId>,
    /// The copies the master must merge (duplicate resolution, then
    /// migration) before its answers are complete; empty when its own copy
    /// is full and current.
    pub sources: Vec<NodeId>,
    /// The regime whose copies the decision took as current (see
    /// [`latest_regime`]); [`next_versions`] keeps those full.
    pub latest: u32,
}

impl Assignment {
    /// The master (the first replica; [`decide`] never returns an empty
    /// list).
    pub fn master(&self) -> Option<NodeId> {
        self.replicas.first().copied()
    }
}

/// The verdict for one partition in one sub-cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Availability {
    Available(Assignment),
    /// Another sub-cluster may serve it, or none can until nodes return.
    Unavailable,
    /// Unavailable with the whole roster present: only `revive:` helps.
    Dead,
}

impl Availability {
    /// The assignment, when available.
    pub fn assignment(&self) -> Option<&Assignment> {
        match self {
            Availability::Available(assignment) => Some(assignment),
            _ => None,
        }
    }
}

/// What the rules look at, gathered from the members.
struct Tally {
    /// Present roster nodes (any order).
    present: Vec<NodeId>,
    /// Present roster nodes without evade.
    counted: Vec<NodeId>,
    latest: u32,
    /// Counted nodes holding a full copy of the latest regime.
    full_current: Vec<NodeId>,
    /// Some present node holds a copy.
    any_copy: bool,
    /// Some counted current copy was revived and not filled since: the
    /// master merges every counted copy.
    revived: bool,
}

fn tally(placement: &RosterPlacement, members: &[Member]) -> Tally {
    let mut present: Vec<NodeId> = Vec::with_capacity(members.len());
    let mut counted_members: Vec<&Member> = Vec::with_capacity(members.len());
    for member in members {
        if !placement.contains(member.id) || present.contains(&member.id) {
            continue;
        }
        present.push(member.id);
        if !member.version.evade {
            counted_members.push(member);
        }
    }
    let whole_roster_counted = counted_members.len() == placement.roster_size();
    let latest = latest_regime(&counted_members, whole_roster_counted);
    let current = |member: &&&Member| {
        member.version.holding != Holding::Absent && member.version.copy_regime == latest
    };
    Tally {
        any_copy: members
            .iter()
            .any(|member| member.version.holding != Holding::Absent),
        revived: counted_members
            .iter()
            .any(|member| current(&member) && member.version.revived),
        full_current: counted_members
            .iter()
            .filter(|member| current(member) && member.version.holding == Holding::Full)
            .map(|member| member.id)
            .collect(),
        counted: counted_members.iter().map(|member| member.id).collect(),
        present,
        latest,
    }
}

/// The latest regime of the counted members: the highest one any of them
/// knows, unless the whole roster is counted and no full copy carries that
/// regime — then the highest regime a full counted copy carries (except
/// while a revived copy carries a higher one: a revived regime serves with
/// subsets only).
///
/// Why the fallback is safe: a regime's replicas are roster nodes, and a
/// write is acknowledged only once every replica of its regime stored it,
/// which each does only after applying the regime's decision (before, it
/// refuses). Every regime that serves a partition (but a revived one) has a
/// full current copy among its replicas, which keeps it full and marked
/// with that regime (`copy_regime`) once applied; it loses the mark only to
/// a later regime's mark, or with its copy once a later regime's replicas
/// are full. So with the whole roster here, a regime `L` above every full
/// copy's mark was not applied by all of its replicas, and no write was
/// acknowledged in it. Such regimes arise when a view's decision is applied
/// by some members only (the others moved to the next view first): members
/// that were not replicas then know `L`, or one replica holds a subset
/// marked `L`, and without the fallback every full copy looks stale — the
/// partition is dead with every node present (seen in
/// `scripts/sc-verify.sh`, 5 nodes, ring partitions). With a roster node
/// away its copy may carry `L`, so the highest known regime stands.
fn latest_regime(counted: &[&Member], whole_roster_counted: bool) -> u32 {
    let known = counted
        .iter()
        .map(|member| member.version.known_regime)
        .max()
        .unwrap_or(0);
    let full = counted
        .iter()
        .filter(|member| member.version.holding == Holding::Full)
        .map(|member| member.version.copy_regime)
        .max();
    let Some(full) = full.filter(|&full| whole_roster_counted && full < known) else {
        return known;
    };
    let revived_above = counted.iter().any(|member| {
        member.version.revived
            && member.version.holding != Holding::Absent
            && member.version.copy_regime > full
    });
    if revived_above {
        known
    } else {
        full
    }
}

/// The rule that makes the partition available, if any (see the module
/// documentation).
fn rule(placement: &RosterPlacement, partition: PartitionId, tally: &Tally) -> Option<Rule> {
    let roster_size = placement.roster_size();
    let counted = tally.counted.len();
    let roster_replicas = placement.roster_replicas(partition);
    let is_counted = |id: &NodeId| tally.counted.contains(id);
    let has_full = !tally.full_current.is_empty();
    if tally.latest == 0 && !tally.any_copy && counted == roster_size && roster_size > 0 {
        return Some(Rule::Fresh);
    }
    if has_full && !roster_replicas.is_empty() && roster_replicas.iter().all(is_counted) {
        return Some(Rule::AllRosterReplicas);
    }
    let majority = 2 * counted > roster_size;
    if has_full && majority && roster_replicas.iter().any(is_counted) {
        return Some(Rule::Majority);
    }
    let roster_master_counted = roster_replicas.first().is_some_and(is_counted);
    if has_full && 2 * counted == roster_size && roster_master_counted {
        return Some(Rule::HalfWithRosterMaster);
    }
    if tally.revived && counted == roster_size {
        return Some(Rule::Revived);
    }
    None
}

/// Decides `partition` for the sub-cluster whose present nodes are
/// `members` (non-roster members are ignored).
pub fn decide(
    placement: &RosterPlacement,
    partition: PartitionId,
    members: &[Member],
) -> Availability {
    let tally = tally(placement, members);
    let Some(rule) = rule(placement, partition, &tally) else {
        return if tally.present.len() == placement.roster_size() && !tally.present.is_empty() {
            Availability::Dead
        } else {
            Availability::Unavailable
        };
    };
    let mut replicas = placement.succession(partition, &tally.present);
    replicas.truncate(placement.replication_factor());
    let Some(&master) = replicas.first() else {
        return Availability::Unavailable;
    };
    let sources = sources(members, &tally, master);
    // A source with a full current copy takes the view's writes too, until
    // the fill ends: its copy stays full and current, so the next view
    // still finds one.
    if let Some(&full) = sources
        .iter()
        .find(|full| tally.full_current.contains(full))
    {
        if !replicas.contains(&full) {
            replicas.push(full);
        }
    }
    Availability::Available(Assignment {
        rule,
        replicas,
        sources,
        latest: tally.latest,
    })
}

/// The present nodes whose copies a fill of `assignment` may take records
/// from: the counted full current copies, the sources, and the master's
/// own copy when it is counted and of the latest regime (a subset of the
/// current lineage holds no write that conflicts with an acknowledged
/// one). Any other copy (stale, evaded, a subset outside the master) is
/// not merged: a replica holding one — the master included — empties it
/// before its fill, a non-replica drops it. A stale copy may hold a write
/// no one acknowledged that has more writes than the acknowledged
/// version of its record, and would win a merge.
pub fn trusted_copies(
    placement: &RosterPlacement,
    members: &[Member],
    assignment: &Assignment,
) -> Vec<NodeId> {
    let tally = tally(placement, members);
    let mut trusted = tally.full_current;
    trusted.extend(assignment.sources.iter().copied());
    let current_master = assignment.master().filter(|master| {
        members.iter().any(|member| {
            member.id == *master
                && !member.version.evade
                && member.version.holding != Holding::Absent
                && member.version.copy_regime == tally.latest
        })
    });
    trusted.extend(current_master);
    trusted.sort_unstable();
    trusted.dedup();
    trusted
}

/// The copies `master` must merge (see [`Assignment::sources`]).
fn sources(members: &[Member], tally: &Tally, master: NodeId) -> Vec<NodeId> {
    if !tally.revived {
        if tally.full_current.contains(&master) {
            return Vec::new();
        }
        if let Some(&full) = tally.full_current.first() {
            return vec![full];
        }
    }
    members
        .iter()
        .filter(|member| member.id != master && tally.counted.contains(&member.id))
        .filter(|member| member.version.holding != Holding::Absent)
        .map(|member| member.id)
        .collect()
}

/// The regime of a new view: two more than the highest regime a member
/// knows (`member_regimes`: each member's namespace regime). A node keeps
/// its namespace regime where it keeps the roster (system metadata), not on
/// the data devices: with every node's devices emptied, regimes restarting
/// from 0 would fall behind what clients recorded (the property tests
/// found this with both nodes of a 2-node roster wiped).
pub fn view_regime(member_regimes: impl Iterator<Item = u32>) -> u32 {
    member_regimes.max().unwrap_or(0).saturating_add(2)
}

/// Every member's version after the view with `regime` and cluster key
/// `ckey` decided `availability` (in `members`' order).
pub fn next_versions(
    members: &[Member],
    availability: &Availability,
    regime: u32,
    ckey: u64,
) -> Vec<ScVersion> {
    let Some(assignment) = availability.assignment() else {
        let known = members
            .iter()
            .filter(|member| !member.version.evade)
            .map(|member| member.version.known_regime)
            .max()
            .unwrap_or(0);
        return members
            .iter()
            .map(|member| ScVersion {
                known_regime: member.version.known_regime.max(known),
                master: false,
                ..member.version
            })
            .collect();
    };
    members
        .iter()
        .map(|member| served_version(member, assignment, assignment.latest, regime, ckey))
        .collect()
}

/// One member's version in a view that serves the partition.
fn served_version(
    member: &Member,
    assignment: &Assignment,
    latest: u32,
    regime: u32,
    ckey: u64,
) -> ScVersion {
    let old = member.version;
    let Some(column) = assignment.replicas.iter().position(|&id| id == member.id) else {
        // Not a replica: keeps its copy (and its evade flag) as it is,
        // learns the regime. An evaded node stays uncounted until its copy
        // is dropped once the replicas are full ([`drop_copies`]): counted
        // before, it would stand for writes it lost that the replicas do
        // not hold yet.
        return ScVersion {
            known_regime: regime,
            ckey,
            master: false,
            ..old
        };
    };
    let full_current = !old.evade && old.holding == Holding::Full && old.copy_regime == latest;
    let fresh = assignment.rule == Rule::Fresh;
    ScVersion {
        holding: if full_current || fresh {
            Holding::Full
        } else {
            Holding::Subset
        },
        copy_regime: regime,
        known_regime: regime,
        ckey,
        evade: old.evade && !fresh,
        revived: old.revived,
        master: column == 0,
    }
}

/// The versions once the master merged its sources and every replica of
/// the view received the merged copy: replicas are full (and inducted).
pub fn fill_complete(members: &[Member], assignment: &Assignment) -> Vec<ScVersion> {
    members
        .iter()
        .map(|member| {
            if assignment.replicas.contains(&member.id) {
                ScVersion {
                    holding: Holding::Full,
                    evade: false,
                    revived: false,
                    ..member.version
                }
            } else {
                member.version
            }
        })
        .collect()
}

/// The versions once the copies outside the replica list were dropped
/// (after [`fill_complete`]).
pub fn drop_copies(members: &[Member], assignment: &Assignment) -> Vec<ScVersion> {
    members
        .iter()
        .map(|member| {
            if assignment.replicas.contains(&member.id) {
                member.version
            } else {
                ScVersion {
                    holding: Holding::Absent,
                    copy_regime: 0,
                    evade: false,
                    ..member.version
                }
            }
        })
        .collect()
}

/// `revive:` of a dead partition (with the whole roster present): every
/// present node's copy (an empty one where it holds none) is trusted as a
/// subset of the latest regime any of them knows, marked `revived`,
/// accepting that writes only the lost copies held are gone. Until a fill
/// ends ([`fill_complete`]) the partition is served only with the whole
/// roster counted (rule *Revived*), and its master merges every copy.
pub fn revive(members: &[Member]) -> Vec<ScVersion> {
    let latest = members
        .iter()
        .map(|member| member.version.known_regime)
        .max()
        .unwrap_or(0);
    members
        .iter()
        .map(|member| ScVersion {
            holding: Holding::Subset,
            copy_regime: latest,
            known_regime: latest,
            evade: false,
            revived: true,
            ..member.version
        })
        .collect()
}

/// Decides every partition of a namespace for one sub-cluster, with
/// `members_of(partition)` the present nodes' versions of each: the SC
/// partition map of the view, indexed by partition id.
pub fn decide_all(
    placement: &RosterPlacement,
    mut members_of: impl FnMut(PartitionId) -> Vec<Member>,
) -> Vec<Availability> {
    PartitionId::all()
        .map(|partition| decide(placement, partition, &members_of(partition)))
        .collect()
}

/// Unavailable and dead partitions of a namespace in one sub-cluster
/// (the `unavailable_partitions` and `dead_partitions` statistics; a dead
/// partition is counted in both, as unavailable ones).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub unavailable: usize,
    pub dead: usize,
}

/// Counts the unavailable and dead partitions among `partitions`, with
/// `members_of(partition)` the present nodes' versions of each.
pub fn summarize(
    placement: &RosterPlacement,
    partitions: impl Iterator<Item = PartitionId>,
    mut members_of: impl FnMut(PartitionId) -> Vec<Member>,
) -> Summary {
    let mut summary = Summary::default();
    for partition in partitions {
        match decide(placement, partition, &members_of(partition)) {
            Availability::Available(_) => {}
            Availability::Unavailable => summary.unavailable += 1,
            Availability::Dead => {
                summary.unavailable += 1;
                summary.dead += 1;
            }
        }
    }
    summary
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 5-node roster (one rack), replication factor 2, and a partition.
    fn five() -> (RosterPlacement, PartitionId) {
        let roster: Vec<RosterNode> = (1..=5)
            .map(|id| RosterNode {
                id: NodeId(id),
                rack_id: 0,
            })
            .collect();
        let partition = PartitionId::new(77).expect("partition");
        (RosterPlacement::new(&roster, 2), partition)
    }

    fn full(regime: u32) -> ScVersion {
        ScVersion {
            holding: Holding::Full,
            copy_regime: regime,
            known_regime: regime,
            ..ScVersion::default()
        }
    }

    fn knows(regime: u32) -> ScVersion {
        ScVersion {
            known_regime: regime,
            ..ScVersion::default()
        }
    }

    /// `ids` with the versions `version_of(id)`.
    fn members(ids: &[NodeId], version_of: impl Fn(NodeId) -> ScVersion) -> Vec<Member> {
        ids.iter()
            .map(|&id| Member {
                id,
                version: version_of(id),
            })
            .collect()
    }

    /// The roster-master, the roster-replica and the three others.
    fn cast(placement: &RosterPlacement, partition: PartitionId) -> (NodeId, NodeId, Vec<NodeId>) {
        let replicas = placement.roster_replicas(partition);
        let others = (1..=5)
            .map(NodeId)
            .filter(|id| !replicas.contains(id))
            .collect();
        (replicas[0], replicas[1], others)
    }

    /// The whole roster after a steady state at regime 2: the roster
    /// replicas full, the others knowing the regime.
    fn steady(
        placement: &RosterPlacement,
        partition: PartitionId,
    ) -> impl Fn(NodeId) -> ScVersion + '_ {
        move |id| {
            if placement.roster_replicas(partition).contains(&id) {
                full(2)
            } else {
                knows(2)
            }
        }
    }

    #[test]
    fn a_new_roster_starts_every_partition_and_its_whole_steady_state_serves() {
        let (placement, partition) = five();
        let all: Vec<NodeId> = (1..=5).map(NodeId).collect();
        let verdict = decide(
            &placement,
            partition,
            &members(&all, |_| ScVersion::default()),
        );
        let assignment = verdict.assignment().expect("fresh");
        assert_eq!(assignment.rule, Rule::Fresh);
        assert_eq!(assignment.replicas, placement.roster_replicas(partition));
        let without_one = &all[1..];
        let verdict = decide(
            &placement,
            partition,
            &members(without_one, |_| ScVersion::default()),
        );
        assert_eq!(
            verdict,
            Availability::Unavailable,
            "a new roster waits for every node"
        );
        // Figure 8: the cluster whole.
        let verdict = decide(
            &placement,
            partition,
            &members(&all, steady(&placement, partition)),
        );
        let assignment = verdict.assignment().expect("whole");
        assert_eq!(assignment.rule, Rule::AllRosterReplicas);
        assert!(assignment.sources.is_empty());
    }

    /// `active-rack`: with two racks of two nodes and two copies, every
    /// partition's roster-master (and so its master while the whole roster
    /// is there) is on the active rack; without it, masters spread over
    /// both racks. A missing active-rack node hands its masters to the
    /// other rack.
    #[test]
    fn an_active_rack_holds_every_master() {
        let roster: Vec<RosterNode> = [(1, 1), (2, 1), (3, 2), (4, 2)]
            .iter()
            .map(|&(id, rack_id)| RosterNode {
                id: NodeId(id),
                rack_id,
            })
            .collect();
        let rack_of = |id: NodeId| roster.iter().find(|n| n.id == id).map(|n| n.rack_id);
        let plain = RosterPlacement::new(&roster, 2);
        let masters_on = |placement: &RosterPlacement, rack: u32| {
            PartitionId::all()
                .filter(|&p| placement.roster_master(p).and_then(rack_of) == Some(rack))
                .count()
        };
        assert!(masters_on(&plain, 1) > 1000 && masters_on(&plain, 2) > 1000);
        let active = RosterPlacement::with_active_rack(&roster, 2, Some(2));
        assert_eq!(masters_on(&active, 2), citrine_types::PARTITIONS);
        let all: Vec<NodeId> = (1..=4).map(NodeId).collect();
        for partition in PartitionId::all().step_by(97) {
            let replicas = active.roster_replicas(partition);
            let mut sorted = replicas.to_vec();
            sorted.sort();
            let mut before = plain.roster_replicas(partition).to_vec();
            before.sort();
            assert_eq!(sorted, before, "same copies, another order");
            let verdict = decide(
                &active,
                partition,
                &members(&all, steady(&active, partition)),
            );
            let assignment = verdict.assignment().expect("whole roster");
            assert_eq!(rack_of(assignment.replicas[0]), Some(2));
            let away = assignment.replicas[0];
            let present: Vec<NodeId> = all.iter().copied().filter(|&id| id != away).collect();
            let verdict = decide(
                &active,
                partition,
                &members(&present, steady(&active, partition)),
            );
            let assignment = verdict.assignment().expect("a majority with a full copy");
            assert_eq!(rack_of(assignment.replicas[0]), Some(1));
        }
    }

    #[test]
    fn the_papers_five_node_splits() {
        let (placement, partition) = five();
        let (master, replica, others) = cast(&placement, partition);
        let version = steady(&placement, partition);
        // Figure 9: a minority with both roster replicas serves; the
        // majority without them does not.
        let minority = members(&[master, replica], &version);
        let verdict = decide(&placement, partition, &minority);
        assert_eq!(
            verdict.assignment().map(|a| a.rule),
            Some(Rule::AllRosterReplicas)
        );
        assert_eq!(
            decide(&placement, partition, &members(&others, &version)),
            Availability::Unavailable
        );
        // Figure 10: the roster-replica in the majority is promoted and an
        // alternate replica is made; the roster-master's side stops.
        let majority_ids = [replica, others[0], others[1]];
        let majority = members(&majority_ids, &version);
        let verdict = decide(&placement, partition, &majority);
        let assignment = verdict.assignment().expect("majority serves");
        assert_eq!(assignment.rule, Rule::Majority);
        assert_eq!(assignment.master(), Some(replica));
        assert_eq!(assignment.replicas.len(), 2);
        let alternate = assignment.replicas[1];
        let cut_off = members(&[master, others[2]], &version);
        assert_eq!(
            decide(&placement, partition, &cut_off),
            Availability::Unavailable
        );
        let next = next_versions(&majority, &verdict, 4, 9);
        let after: Vec<Member> = majority_ids
            .iter()
            .zip(&next)
            .map(|(&id, &version)| Member { id, version })
            .collect();
        let alternate_version = after.iter().find(|m| m.id == alternate).map(|m| m.version);
        assert_eq!(alternate_version.map(|v| v.holding), Some(Holding::Subset));
        // Figure 11: split further, the roster replicas in two minorities.
        let of = |id: NodeId| {
            after
                .iter()
                .find(|m| m.id == id)
                .map_or(version(id), |m| m.version)
        };
        let pieces = [
            vec![replica, others[2]],
            vec![master, others[0]],
            vec![others[1]],
        ];
        for piece in &pieces {
            assert_eq!(
                decide(&placement, partition, &members(piece, of)),
                Availability::Unavailable,
                "{piece:?}"
            );
        }
        // The roster-master's full copy is stale once the majority served
        // without it: a majority with it and a node of the serving view
        // refuses (the paper's literal rule 2 would serve it, losing the
        // writes of regime 4).
        let stale = members(&[master, others[0], others[2]], of);
        assert_eq!(
            decide(&placement, partition, &stale),
            Availability::Unavailable
        );
        // Rejoined with the serving copy, the partition serves again.
        let healed: Vec<NodeId> = (1..=5).map(NodeId).collect();
        let verdict = decide(&placement, partition, &members(&healed, of));
        assert_eq!(
            verdict.assignment().and_then(Assignment::master),
            Some(master)
        );
        assert_eq!(
            verdict.assignment().map(|a| a.sources.clone()),
            Some(vec![replica])
        );
    }

    /// A view decided regime 4 while only members that were not replicas
    /// of the partition resolved it (the view changed again first on the
    /// others): they know regime 4, no copy carries it. Seen in a real run
    /// as 1 208 partitions dead with all five nodes back.
    #[test]
    fn a_regime_only_non_replicas_applied_leaves_no_dead_partition() {
        let (placement, partition) = five();
        let (master, replica, others) = cast(&placement, partition);
        let all: Vec<NodeId> = (1..=5).map(NodeId).collect();
        let of = |id: NodeId| {
            if id == master || id == replica {
                full(2)
            } else {
                knows(4)
            }
        };
        let verdict = decide(&placement, partition, &members(&all, of));
        let assignment = verdict.assignment().expect("available, not dead");
        assert_eq!(assignment.rule, Rule::AllRosterReplicas);
        assert_eq!(assignment.master(), Some(master));
        assert!(assignment.sources.is_empty());
        // The replicas' copies stay full in the new regime.
        let next = next_versions(&members(&all, of), &verdict, 6, 9);
        for (member, version) in members(&all, of).iter().zip(&next) {
            if member.id == master || member.id == replica {
                assert_eq!((version.holding, version.copy_regime), (Holding::Full, 6));
            }
        }
        // A replica of regime 4 that applied it alone holds a subset marked
        // 4 (its partner did not apply it): still no write of regime 4.
        let subset = |id: NodeId| {
            if id == others[0] {
                ScVersion {
                    holding: Holding::Subset,
                    copy_regime: 4,
                    known_regime: 4,
                    ..ScVersion::default()
                }
            } else {
                of(id)
            }
        };
        let verdict = decide(&placement, partition, &members(&all, subset));
        assert_eq!(
            verdict.assignment().map(|a| (a.rule, a.latest)),
            Some((Rule::AllRosterReplicas, 2))
        );
        // Revived copies serve as subsets: their regime stands.
        let revived = |id: NodeId| ScVersion {
            revived: true,
            ..subset(id)
        };
        assert_eq!(
            decide(&placement, partition, &members(&all, revived))
                .assignment()
                .map(|a| a.latest),
            Some(4)
        );
        // With a roster node away, that node may carry regime 4 (and writes
        // acknowledged in it): the known regime stands.
        let without = members(&[master, replica, others[0], others[1]], of);
        assert_eq!(
            decide(&placement, partition, &without),
            Availability::Unavailable
        );
    }

    #[test]
    fn exactly_half_serves_only_with_the_roster_master() {
        let roster: Vec<RosterNode> = (1..=4)
            .map(|id| RosterNode {
                id: NodeId(id),
                rack_id: 0,
            })
            .collect();
        let placement = RosterPlacement::new(&roster, 2);
        let partition = PartitionId::new(5).expect("partition");
        let replicas = placement.roster_replicas(partition).to_vec();
        let others: Vec<NodeId> = (1..=4)
            .map(NodeId)
            .filter(|id| !replicas.contains(id))
            .collect();
        let version = |id: NodeId| {
            if replicas.contains(&id) {
                full(2)
            } else {
                knows(2)
            }
        };
        let with_master = members(&[replicas[0], others[0]], version);
        let verdict = decide(&placement, partition, &with_master);
        assert_eq!(
            verdict.assignment().map(|a| a.rule),
            Some(Rule::HalfWithRosterMaster)
        );
        let with_replica = members(&[replicas[1], others[1]], version);
        assert_eq!(
            decide(&placement, partition, &with_replica),
            Availability::Unavailable
        );
    }

    #[test]
    fn evaded_roster_replicas_make_a_dead_partition_until_revived() {
        let (placement, partition) = five();
        let all: Vec<NodeId> = (1..=5).map(NodeId).collect();
        let version = steady(&placement, partition);
        let evaded = |id| {
            let v = version(id);
            if v.holding == Holding::Full {
                v.evaded()
            } else {
                v
            }
        };
        let view = members(&all, evaded);
        assert_eq!(decide(&placement, partition, &view), Availability::Dead);
        let summary = summarize(&placement, [partition].into_iter(), |_| view.clone());
        assert_eq!(
            summary,
            Summary {
                unavailable: 1,
                dead: 1
            }
        );
        // With commit-to-device nothing is evaded: the same nodes serve.
        assert!(decide(&placement, partition, &members(&all, &version))
            .assignment()
            .is_some());
        // revive: then recluster: every copy merged by the master.
        let revived = revive(&view);
        let view: Vec<Member> = all
            .iter()
            .zip(revived)
            .map(|(&id, version)| Member { id, version })
            .collect();
        let verdict = decide(&placement, partition, &view);
        let assignment = verdict.assignment().expect("revived");
        assert_eq!(assignment.rule, Rule::Revived);
        // Every other node's copy is merged (revive made the empty ones
        // empty subsets).
        assert_eq!(assignment.sources.len(), 4, "{assignment:?}");
        // Revived copies serve only with the whole roster until filled.
        assert_eq!(
            decide(&placement, partition, &view[..4]),
            Availability::Unavailable
        );
        let filled = fill_complete(&view, assignment);
        assert!(filled.iter().filter(|v| v.holding == Holding::Full).count() == 2);
        assert!(filled.iter().all(|v| !v.evade));
    }

    #[test]
    fn masters_follow_the_roster_not_the_present_nodes() {
        let roster: Vec<RosterNode> = (1..=4)
            .map(|id| RosterNode {
                id: NodeId(id),
                rack_id: (id % 2) as u32,
            })
            .collect();
        let placement = RosterPlacement::new(&roster, 2);
        let all: Vec<NodeId> = (1..=4).map(NodeId).collect();
        let fresh = decide_all(&placement, |_| members(&all, |_| ScVersion::default()));
        assert!(fresh.iter().all(|verdict| verdict.assignment().is_some()));
        // Rack aware: the two copies of every partition on the two racks.
        for (index, verdict) in fresh.iter().enumerate() {
            let replicas = &verdict.assignment().expect("available").replicas;
            assert_eq!(replicas.len(), 2);
            assert_ne!(replicas[0].0 % 2, replicas[1].0 % 2, "partition {index}");
        }
        // Node 4 away, the others full: a partition whose roster-master is
        // present keeps it as master; the others promote their roster
        // replica — never the master a map of the three present nodes
        // would pick.
        let present = &all[..3];
        let steady = |partition: PartitionId| {
            members(present, |id| {
                if placement.roster_replicas(partition).contains(&id) {
                    full(2)
                } else {
                    knows(2)
                }
            })
        };
        let split = decide_all(&placement, steady);
        let mut promoted = 0;
        for (partition, verdict) in PartitionId::all().zip(&split) {
            let roster_replicas = placement.roster_replicas(partition);
            let master = verdict.assignment().and_then(Assignment::master);
            if roster_replicas[0] == NodeId(4) {
                promoted += 1;
                assert_eq!(master, Some(roster_replicas[1]));
            } else {
                assert_eq!(master, Some(roster_replicas[0]));
            }
        }
        assert!(promoted > 0);
        let summary = summarize(&placement, PartitionId::all(), steady);
        assert_eq!(summary, Summary::default(), "3 of 4 serve everything");
    }

    #[test]
    fn regimes_grow_by_two_past_every_member() {
        assert_eq!(view_regime([475u32, 3, 0].into_iter()), 477);
        assert_eq!(view_regime(std::iter::empty()), 2);
    }
}
