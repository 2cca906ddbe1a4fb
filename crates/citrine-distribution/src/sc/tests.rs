//! Property tests of the availability rules, in the simulator's style: one
//! `u64` seed drives a whole history (splitmix64-seeded generator, as in
//! `citrine-sim`), and a failure names its seed and step so it replays.
//!
//! Each seed draws a roster of 2 to 8 nodes on up to 3 racks, a
//! replication factor of 1 to 3, commit-to-device on or off, and a sample
//! of partitions, then runs a history of random events: splits of the up
//! nodes into 1 to 3 sub-clusters, writes, migrations completing (fills),
//! copies dropped, clean and unclean crashes, restarts (some with emptied
//! drives) and `revive:` of dead partitions. Every sub-cluster whose
//! membership changed forms a new view that decides every partition with
//! [`decide`] and moves the versions with [`next_versions`]. The model
//! also keeps the truth the versions stand for: which acknowledged writes
//! each node's copy holds (an unclean crash without commit-to-device is
//! taken to lose all of them).
//!
//! Checked after every event: no partition is available in two
//! sub-clusters; where one is available, its master's copy and its
//! sources hold every acknowledged write (less those `revive:` gave up);
//! a partition's serving regimes strictly increase; with the whole roster
//! in one sub-cluster and no evaded version, every partition is available.

use super::availability::*;
use super::roster::RosterNode;
use citrine_types::{NodeId, PartitionId};
use std::collections::BTreeSet;

/// splitmix64: the project's seeding generator, enough for test draws.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)`, `n > 0`.
    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next()) * n as u128) >> 64) as usize
    }

    fn percent(&mut self, p: usize) -> bool {
        self.below(100) < p
    }
}

#[derive(Clone, Copy, Debug)]
struct Config {
    roster_size: usize,
    replication_factor: usize,
    commit_to_device: bool,
    steps: usize,
    partitions: usize,
}

struct Node {
    id: NodeId,
    up: bool,
    ns_regime: u32,
    versions: Vec<ScVersion>,
    /// Truth: acknowledged writes the copy holds, per sampled partition.
    held: Vec<BTreeSet<u32>>,
}

struct Group {
    /// Node indexes, ascending.
    members: Vec<usize>,
    verdicts: Vec<Availability>,
}

#[derive(Debug, Default)]
struct Stats {
    views: usize,
    split_steps: usize,
    available: usize,
    by_rule: [usize; 5],
    unavailable: usize,
    dead: usize,
    revives: usize,
    writes: usize,
    writes_given_up: usize,
    crashes_unclean: usize,
}

struct World {
    cfg: Config,
    rng: Rng,
    placement: RosterPlacement,
    partitions: Vec<PartitionId>,
    nodes: Vec<Node>,
    groups: Vec<Group>,
    /// Truth: writes acknowledged per sampled partition.
    acked: Vec<BTreeSet<u32>>,
    /// The last regime each partition was served in.
    served_regime: Vec<u32>,
    next_write: u32,
    next_ckey: u64,
    step: usize,
    stats: Stats,
    trace: bool,
    trace_partition: usize,
}

fn rule_index(rule: Rule) -> usize {
    match rule {
        Rule::Fresh => 0,
        Rule::AllRosterReplicas => 1,
        Rule::Majority => 2,
        Rule::HalfWithRosterMaster => 3,
        Rule::Revived => 4,
    }
}

impl World {
    fn new(seed: u64) -> World {
        let mut rng = Rng(seed);
        let roster_size = 2 + rng.below(7);
        let cfg = Config {
            roster_size,
            replication_factor: 1 + rng.below(3),
            commit_to_device: rng.percent(30),
            steps: 60 + rng.below(60),
            partitions: 16,
        };
        let racks = 1 + rng.below(3) as u32;
        let roster: Vec<RosterNode> = (0..roster_size)
            .map(|index| RosterNode {
                id: NodeId(0xA0 + index as u64 * 0x11 + (rng.next() & 0xF00)),
                rack_id: index as u32 % racks,
            })
            .collect();
        // A third of the seeds with an active rack (from the seed, so the
        // random stream of every seed stays as it was).
        let active_rack = seed
            .is_multiple_of(3)
            .then_some((seed / 3 % u64::from(racks)) as u32);
        let placement =
            RosterPlacement::with_active_rack(&roster, cfg.replication_factor, active_rack);
        let partitions = (0..cfg.partitions)
            .filter_map(|_| PartitionId::new(rng.below(4096) as u16))
            .collect::<Vec<_>>();
        let nodes = roster
            .iter()
            .map(|node| Node {
                id: node.id,
                up: true,
                ns_regime: 0,
                versions: vec![ScVersion::default(); partitions.len()],
                held: vec![BTreeSet::new(); partitions.len()],
            })
            .collect();
        let count = partitions.len();
        World {
            cfg,
            rng,
            placement,
            partitions,
            nodes,
            groups: Vec::new(),
            acked: vec![BTreeSet::new(); count],
            served_regime: vec![0; count],
            next_write: 1,
            next_ckey: 1,
            step: 0,
            stats: Stats::default(),
            trace: false,
            trace_partition: TRACE_PARTITION,
        }
    }

    fn fail(&self, what: String) -> String {
        format!("step {} ({:?}): {what}", self.step, self.cfg)
    }

    fn members(&self, group: &[usize], partition: usize) -> Vec<Member> {
        group
            .iter()
            .map(|&node| Member {
                id: self.nodes[node].id,
                version: self.nodes[node].versions[partition],
            })
            .collect()
    }

    fn index_of(&self, id: NodeId) -> usize {
        self.nodes
            .iter()
            .position(|node| node.id == id)
            .expect("a member is a roster node")
    }

    /// Forms a new view of `members` and decides every partition in it.
    fn form(&mut self, mut members: Vec<usize>) -> Result<Group, String> {
        members.sort_unstable();
        let regime = view_regime(members.iter().map(|&node| self.nodes[node].ns_regime));
        let ckey = self.next_ckey;
        self.next_ckey += 1;
        self.stats.views += 1;
        for &node in &members {
            self.nodes[node].ns_regime = regime;
        }
        let mut verdicts = Vec::with_capacity(self.partitions.len());
        for partition in 0..self.partitions.len() {
            let view = self.members(&members, partition);
            let verdict = decide(&self.placement, self.partitions[partition], &view);
            self.check_served(partition, &verdict, regime)?;
            if self.trace && partition == self.trace_partition {
                eprintln!(
                    "step {} view {members:?} regime {regime} -> {verdict:?}",
                    self.step
                );
            }
            let next = next_versions(&view, &verdict, regime, ckey);
            for (&node, version) in members.iter().zip(next) {
                self.nodes[node].versions[partition] = version;
            }
            verdicts.push(verdict);
        }
        Ok(Group { members, verdicts })
    }

    /// Checks a verdict as a view forms: coverage and regime order.
    fn check_served(
        &mut self,
        partition: usize,
        verdict: &Availability,
        regime: u32,
    ) -> Result<(), String> {
        match verdict {
            Availability::Unavailable => self.stats.unavailable += 1,
            Availability::Dead => self.stats.dead += 1,
            Availability::Available(assignment) => {
                self.stats.available += 1;
                self.stats.by_rule[rule_index(assignment.rule)] += 1;
                let merged = self.merged(partition, assignment);
                let missing: Vec<u32> =
                    self.acked[partition].difference(&merged).copied().collect();
                if !missing.is_empty() {
                    return Err(self.fail(format!(
                        "partition {partition} served by {assignment:?} misses acknowledged writes {missing:?}"
                    )));
                }
                if regime <= self.served_regime[partition] {
                    return Err(self.fail(format!(
                        "partition {partition} served in regime {regime} after regime {}",
                        self.served_regime[partition]
                    )));
                }
                self.served_regime[partition] = regime;
            }
        }
        Ok(())
    }

    /// Truth: what the master holds once it merged its sources.
    fn merged(&self, partition: usize, assignment: &Assignment) -> BTreeSet<u32> {
        let mut merged = BTreeSet::new();
        for id in assignment
            .master()
            .into_iter()
            .chain(assignment.sources.iter().copied())
        {
            merged.extend(
                self.nodes[self.index_of(id)].held[partition]
                    .iter()
                    .copied(),
            );
        }
        merged
    }

    /// No split brain, and the whole clean roster serves everything.
    fn check_standing(&self) -> Result<(), String> {
        for partition in 0..self.partitions.len() {
            let serving: Vec<&Group> = self
                .groups
                .iter()
                .filter(|group| group.verdicts[partition].assignment().is_some())
                .collect();
            if serving.len() > 1 {
                let sets: Vec<&Vec<usize>> = serving.iter().map(|group| &group.members).collect();
                return Err(self.fail(format!("partition {partition} available in {sets:?}")));
            }
            for group in &self.groups {
                let whole = group.members.len() == self.cfg.roster_size;
                let clean = group
                    .members
                    .iter()
                    .all(|&node| !self.nodes[node].versions[partition].evade);
                if whole && clean && group.verdicts[partition].assignment().is_none() {
                    return Err(self.fail(format!(
                        "partition {partition} {:?} with the whole roster and no evaded copy",
                        group.verdicts[partition]
                    )));
                }
            }
        }
        Ok(())
    }

    fn group_of(&self, node: usize) -> Option<usize> {
        self.groups
            .iter()
            .position(|group| group.members.contains(&node))
    }

    /// Random split of the up nodes into 1 to 3 sub-clusters.
    fn resplit(&mut self) -> Result<(), String> {
        let up: Vec<usize> = (0..self.nodes.len())
            .filter(|&node| self.nodes[node].up)
            .collect();
        let parts = 1 + self.rng.below(3);
        let mut sets: Vec<Vec<usize>> = vec![Vec::new(); parts];
        for node in up {
            let part = self.rng.below(parts);
            sets[part].push(node);
        }
        sets.retain(|set| !set.is_empty());
        if sets.len() > 1 {
            self.stats.split_steps += 1;
        }
        let old = std::mem::take(&mut self.groups);
        let (mut kept, _): (Vec<Group>, Vec<Group>) = old
            .into_iter()
            .partition(|group| sets.contains(&group.members));
        for set in sets {
            if kept.iter().any(|group| group.members == set) {
                continue;
            }
            let group = self.form(set)?;
            kept.push(group);
        }
        self.groups = kept;
        Ok(())
    }

    fn write(&mut self) {
        let Some(group) = self.random_group() else {
            return;
        };
        for partition in 0..self.partitions.len() {
            let Some(assignment) = self.groups[group].verdicts[partition].assignment().cloned()
            else {
                continue;
            };
            if !self.rng.percent(50) {
                continue;
            }
            let write = self.next_write;
            self.next_write += 1;
            self.acked[partition].insert(write);
            self.stats.writes += 1;
            for id in assignment.replicas {
                let node = self.index_of(id);
                self.nodes[node].held[partition].insert(write);
            }
        }
    }

    fn random_group(&mut self) -> Option<usize> {
        (!self.groups.is_empty()).then(|| self.rng.below(self.groups.len()))
    }

    /// Migrations of a sub-cluster complete: replicas hold the merged copy.
    fn fill(&mut self) {
        let Some(group) = self.random_group() else {
            return;
        };
        let members = self.groups[group].members.clone();
        for partition in 0..self.partitions.len() {
            let Some(assignment) = self.groups[group].verdicts[partition].assignment().cloned()
            else {
                continue;
            };
            let merged = self.merged(partition, &assignment);
            let view = self.members(&members, partition);
            let next = fill_complete(&view, &assignment);
            for (&node, version) in members.iter().zip(next) {
                self.nodes[node].versions[partition] = version;
                if assignment.replicas.contains(&self.nodes[node].id) {
                    self.nodes[node].held[partition].extend(merged.iter().copied());
                }
            }
            if self.rng.percent(50) {
                self.drop_others(partition, &members, &assignment);
            }
        }
    }

    fn drop_others(&mut self, partition: usize, members: &[usize], assignment: &Assignment) {
        let view = self.members(members, partition);
        let next = drop_copies(&view, assignment);
        for (&node, version) in members.iter().zip(next) {
            self.nodes[node].versions[partition] = version;
            if !assignment.replicas.contains(&self.nodes[node].id) {
                self.nodes[node].held[partition].clear();
            }
        }
    }

    fn crash(&mut self) -> Result<(), String> {
        let up: Vec<usize> = (0..self.nodes.len())
            .filter(|&node| self.nodes[node].up)
            .collect();
        if up.is_empty() {
            return Ok(());
        }
        let node = up[self.rng.below(up.len())];
        let unclean = self.rng.percent(50);
        self.nodes[node].up = false;
        if unclean && !self.cfg.commit_to_device {
            self.stats.crashes_unclean += 1;
            let crashed = &mut self.nodes[node];
            for (version, held) in crashed.versions.iter_mut().zip(crashed.held.iter_mut()) {
                *version = version.evaded();
                held.clear();
            }
        }
        self.leave(node)
    }

    /// `node` leaves its sub-cluster, which forms a new view without it.
    fn leave(&mut self, node: usize) -> Result<(), String> {
        let Some(index) = self.group_of(node) else {
            return Ok(());
        };
        let group = self.groups.remove(index);
        let rest: Vec<usize> = group
            .members
            .into_iter()
            .filter(|&member| member != node)
            .collect();
        if !rest.is_empty() {
            let group = self.form(rest)?;
            self.groups.push(group);
        }
        Ok(())
    }

    fn restart(&mut self) -> Result<(), String> {
        let down: Vec<usize> = (0..self.nodes.len())
            .filter(|&node| !self.nodes[node].up)
            .collect();
        if down.is_empty() {
            return Ok(());
        }
        let node = down[self.rng.below(down.len())];
        self.nodes[node].up = true;
        if self.rng.percent(10) {
            // The data devices are emptied; the namespace regime is kept
            // with the roster in the system metadata (see `view_regime`).
            let wiped = &mut self.nodes[node];
            wiped
                .versions
                .iter_mut()
                .for_each(|version| *version = ScVersion::wiped());
            wiped.held.iter_mut().for_each(BTreeSet::clear);
        }
        let mut members = vec![node];
        if let Some(index) = self.random_group().filter(|_| self.rng.percent(70)) {
            members.extend(self.groups.remove(index).members);
        }
        let group = self.form(members)?;
        self.groups.push(group);
        Ok(())
    }

    /// `revive:` then `recluster:` with the whole roster in one sub-cluster.
    fn revive_dead(&mut self) -> Result<(), String> {
        let Some(index) = self
            .groups
            .iter()
            .position(|group| group.members.len() == self.cfg.roster_size)
        else {
            return Ok(());
        };
        let members = self.groups[index].members.clone();
        for partition in 0..self.partitions.len() {
            if self.groups[index].verdicts[partition] != Availability::Dead {
                continue;
            }
            self.stats.revives += 1;
            let view = self.members(&members, partition);
            let next = revive(&view);
            let mut kept = BTreeSet::new();
            for (&node, version) in members.iter().zip(next) {
                self.nodes[node].versions[partition] = version;
                kept.extend(self.nodes[node].held[partition].iter().copied());
            }
            let before = self.acked[partition].len();
            self.acked[partition].retain(|write| kept.contains(write));
            self.stats.writes_given_up += before - self.acked[partition].len();
        }
        self.groups.remove(index);
        let group = self.form(members)?;
        self.groups.push(group);
        Ok(())
    }

    fn event(&mut self) -> Result<(), String> {
        let draw = self.rng.below(100);
        if self.trace {
            eprintln!(
                "step {} event {draw} acked {:?}",
                self.step, self.acked[self.trace_partition]
            );
            for (index, node) in self.nodes.iter().enumerate() {
                let v = node.versions[self.trace_partition];
                eprintln!(
                    "   n{index} {} up {} held {:?} {:?} copy {} known {} evade {}",
                    node.id,
                    node.up,
                    node.held[self.trace_partition],
                    v.holding,
                    v.copy_regime,
                    v.known_regime,
                    v.evade
                );
            }
        }
        match draw {
            0..=24 => self.resplit()?,
            25..=54 => self.write(),
            55..=69 => self.fill(),
            70..=79 => self.crash()?,
            80..=92 => self.restart()?,
            _ => self.revive_dead()?,
        }
        self.check_standing()
    }

    fn run(mut self) -> Result<Stats, String> {
        let all: Vec<usize> = (0..self.nodes.len()).collect();
        let group = self.form(all)?;
        self.groups.push(group);
        self.check_standing()?;
        for step in 1..=self.cfg.steps {
            self.step = step;
            self.event()?;
        }
        Ok(self.stats)
    }
}

/// The sampled partition (index) [`trace_seed`] prints by default.
const TRACE_PARTITION: usize = 1;

/// Replays one seed printing every event and view of one partition:
/// `SEED=12330 TRACE_PARTITION=1 cargo test -p citrine-distribution --lib
/// sc::tests::trace_seed -- --ignored --nocapture`.
#[test]
#[ignore]
fn trace_seed() {
    let number = |name: &str| std::env::var(name).ok().and_then(|s| s.parse().ok());
    let mut world = World::new(number("SEED").unwrap_or(10));
    world.trace = true;
    world.trace_partition = number("TRACE_PARTITION").map_or(TRACE_PARTITION, |p: u64| p as usize);
    eprintln!("{:?}", world.run().map(|_| ()));
}

fn run_seed(seed: u64) -> Result<Stats, String> {
    World::new(seed)
        .run()
        .map_err(|error| format!("seed {seed}: {error}"))
}

#[test]
fn random_histories_keep_the_invariants() {
    let mut total = Stats::default();
    let mut failures = Vec::new();
    // CI runs the first 300 seeds (about 2 s of CPU in a debug build); a deeper sweep:
    // CITRINE_SC_SEEDS=100000 cargo test --release -p citrine-distribution sc::tests
    let seeds: u64 = std::env::var("CITRINE_SC_SEEDS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(300);
    for seed in 0..seeds {
        match run_seed(seed) {
            Ok(stats) => {
                total.views += stats.views;
                total.split_steps += stats.split_steps;
                total.available += stats.available;
                total.unavailable += stats.unavailable;
                total.dead += stats.dead;
                total.revives += stats.revives;
                total.writes += stats.writes;
                total.writes_given_up += stats.writes_given_up;
                total.crashes_unclean += stats.crashes_unclean;
                for (sum, count) in total.by_rule.iter_mut().zip(stats.by_rule) {
                    *sum += count;
                }
            }
            Err(failure) => {
                eprintln!("{failure}");
                failures.push(failure);
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} seeds failed, first: {:#?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    // The histories exercise what they claim to.
    assert!(
        total.split_steps as u64 > seeds * 5 && total.writes as u64 > seeds * 40,
        "{total:?}"
    );
    assert!(
        total.by_rule.iter().all(|&count| count > 0),
        "every rule used: {total:?}"
    );
    assert!(
        total.dead > 0 && total.revives > 0 && total.unavailable > 0,
        "{total:?}"
    );
    eprintln!("{total:?}");
}

/// Seeds that failed during development, each on a rule or transition
/// since fixed (12330, beyond the CI range: a full current copy that was
/// not the first source was not made a replica, went stale, and the whole
/// clean roster found the partition dead).
#[test]
fn seeds_that_once_failed() {
    for seed in [3, 10, 306, 370, 845, 1315, 1516, 12330] {
        if let Err(failure) = run_seed(seed) {
            panic!("{failure}");
        }
    }
}

#[test]
fn a_seed_replays_exactly() {
    let a = run_seed(7).map(|stats| format!("{stats:?}"));
    let b = run_seed(7).map(|stats| format!("{stats:?}"));
    assert_eq!(a, b);
}
