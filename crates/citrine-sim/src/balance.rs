//! Offline measurements of the partition map algorithms: how evenly each
//! spreads the 4096 partitions, and how many copies a membership change
//! moves (what `citrine-sim balance` prints and its tests check).
//!
//! Owns: the synthetic clusters ([`node_id`], [`node_entry`]), the
//! [`Algorithm`]s compared, a [`Cluster`] that applies joins and leaves
//! the way a running cluster would (the stable placement rebalanced from
//! the previous one, the other maps recomputed from the members), and the
//! [`Report`] of one configuration.
//!
//! Synthetic node ids imitate Aerospike's: the service port 3001
//! (`0x0BB9`) in the top 16 bits and a Docker-bridge MAC
//! `02:42:ac:11:hi:lo` (byte-reversed, as Aerospike stores it) in the low
//! 48 bits, where `hi:lo` is `i + 2` for node `i`. With `racks` ≥ 2, node
//! `i` is on rack `i % racks + 1`; otherwise every node is on rack 0.
//!
//! "Copies moved" counts, over all partitions, the replicas in the new map
//! that the node did not already hold in the old map (copies that must be
//! migrated). The optimum is the joining node's fair share,
//! `rf × 4096 / (N + 1)`, or the leaving node's share, `rf × 4096 / N`.
//!
//! Invariant: everything is a pure function of the arguments (the random
//! sequence comes from a fixed-seed [`SimRng`]); only `map_ms` and
//! `join_ms` are time measurements (this thread's CPU time, or wall-clock
//! time if that clock is unavailable; the fastest of [`TIMING_RUNS`]).

use std::collections::HashMap;
use std::time::Instant;

use citrine_cluster::partition_map::{NodeEntry, PartitionMap, PartitionMapConfig, Placement};
use citrine_types::{NodeId, PartitionId, PARTITIONS};

use crate::rng::SimRng;

/// Which partition map is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// VLDB 2016 Table 1 alone (`prefer-uniform-balance` off in the
    /// reference).
    Table1,
    /// Table 1 with the VLDB 2023 §2.1 uniform-balance pass, recomputed
    /// from the members at every change.
    Paper,
    /// The stable placement, rebalanced from the previous one.
    Stable,
}

impl Algorithm {
    /// Short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Table1 => "table 1",
            Algorithm::Paper => "paper",
            Algorithm::Stable => "stable",
        }
    }
}

/// Synthetic node id of node `i` (see the module documentation).
pub fn node_id(i: usize) -> NodeId {
    let mac = (i + 2) as u64;
    let lo = mac & 0xff;
    let hi = (mac >> 8) & 0xff;
    NodeId(0x0BB9_0000_0000_0000 | (lo << 40) | (hi << 32) | 0x11AC_4202)
}

/// Node `i` with its rack.
pub fn node_entry(i: usize, racks: u32) -> NodeEntry {
    let rack_id = if racks > 1 { (i as u32 % racks) + 1 } else { 0 };
    NodeEntry {
        id: node_id(i),
        rack_id,
    }
}

/// A cluster whose map follows membership changes.
#[derive(Clone)]
pub struct Cluster {
    algorithm: Algorithm,
    rf: usize,
    racks: u32,
    members: Vec<NodeEntry>,
    placement: Option<Placement>,
    map: PartitionMap,
    /// Index of the next node to join.
    next: usize,
}

impl Cluster {
    /// Nodes `0..n`, their map computed from scratch.
    pub fn new(n: usize, racks: u32, rf: usize, algorithm: Algorithm) -> Cluster {
        let members: Vec<NodeEntry> = (0..n).map(|i| node_entry(i, racks)).collect();
        let mut cluster = Cluster {
            algorithm,
            rf,
            racks,
            map: PartitionMap::compute(&[], &PartitionMapConfig::default()),
            members,
            placement: None,
            next: n,
        };
        cluster.recompute();
        cluster
    }

    /// The current map.
    pub fn map(&self) -> &PartitionMap {
        &self.map
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always false: a cluster is built with members and keeps one.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    fn recompute(&mut self) {
        self.map = match self.algorithm {
            Algorithm::Table1 | Algorithm::Paper => {
                let config = PartitionMapConfig {
                    replication_factor: self.rf,
                    uniform_balance: self.algorithm == Algorithm::Paper,
                };
                PartitionMap::compute(&self.members, &config)
            }
            Algorithm::Stable => {
                let next = Placement::compute(self.placement.as_ref(), &self.members, self.rf);
                let map = next.partition_map(self.rf);
                self.placement = Some(next);
                map.unwrap_or_else(|| PartitionMap::compute(&[], &PartitionMapConfig::default()))
            }
        };
    }

    /// The next node joins; returns (copies moved, optimum).
    pub fn join(&mut self) -> (usize, f64) {
        self.members.push(node_entry(self.next, self.racks));
        self.next += 1;
        let before = self.map.clone();
        self.recompute();
        let optimum = self.share();
        (copies_moved(&before, &self.map), optimum)
    }

    /// Member `index` (in join order) leaves; returns (copies moved,
    /// optimum).
    pub fn leave(&mut self, index: usize) -> (usize, f64) {
        let optimum = self.share();
        self.members.remove(index);
        let before = self.map.clone();
        self.recompute();
        (copies_moved(&before, &self.map), optimum)
    }

    /// One node's fair share of the copies in the current map.
    fn share(&self) -> f64 {
        (self.map.replication_factor() * PARTITIONS) as f64 / self.members.len().max(1) as f64
    }
}

/// Per-node count statistics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stats {
    pub min: usize,
    pub mean: f64,
    pub max: usize,
}

impl Stats {
    /// max / mean.
    pub fn ratio(&self) -> f64 {
        self.max as f64 / self.mean
    }
}

/// Statistics of the per-node counts of `column`, or of all columns
/// together when `column` is `None`.
pub fn stats(map: &PartitionMap, column: Option<usize>) -> Stats {
    let mut counts: HashMap<NodeId, usize> = map.nodes().iter().map(|&id| (id, 0)).collect();
    for partition in PartitionId::all() {
        for (c, node) in map.replicas(partition).iter().enumerate() {
            if column.is_none_or(|want| want == c) {
                *counts.entry(*node).or_insert(0) += 1;
            }
        }
    }
    let total: usize = counts.values().sum();
    Stats {
        min: counts.values().copied().min().unwrap_or(0),
        mean: total as f64 / counts.len().max(1) as f64,
        max: counts.values().copied().max().unwrap_or(0),
    }
}

/// Copies present in `new` on a node that did not hold that partition in
/// `old`.
pub fn copies_moved(old: &PartitionMap, new: &PartitionMap) -> usize {
    PartitionId::all()
        .map(|partition| {
            let before = old.replicas(partition);
            new.replicas(partition)
                .iter()
                .filter(|node| !before.contains(node))
                .count()
        })
        .sum()
}

/// Everything reported for one (nodes, racks, rf, algorithm).
#[derive(Clone, Debug)]
pub struct Report {
    pub columns: Vec<Stats>,
    pub all: Stats,
    pub added: (usize, f64),
    pub removed: Option<(usize, f64)>,
    /// The random sequence.
    pub sequence: Sequence,
    /// Time to compute the first map, ms (see [`timed`]).
    pub map_ms: f64,
    /// Time to compute the map after the join, ms (see [`timed`]).
    pub join_ms: f64,
}

/// Joins and leaves in the random sequence.
pub const SEQUENCE_STEPS: usize = 20;
/// Seed of the random sequence.
pub const SEQUENCE_SEED: u64 = 45;

/// Measures one configuration: the map of nodes `0..n`, node `n` joining
/// it, node `n / 2` leaving it, and [`SEQUENCE_STEPS`] random joins and
/// leaves from it.
pub fn measure(n: usize, racks: u32, rf: usize, algorithm: Algorithm) -> Report {
    let (base, map_ms) = fastest(|| timed(|| Cluster::new(n, racks, rf, algorithm)));
    let eff = base.map().replication_factor();
    let (added, join_ms) = fastest(|| {
        let mut grown = base.clone();
        timed(|| grown.join())
    });
    let removed = (n > 1).then(|| base.clone().leave(n / 2));
    Report {
        columns: (0..eff).map(|c| stats(base.map(), Some(c))).collect(),
        all: stats(base.map(), None),
        added,
        removed,
        sequence: sequence(base, SEQUENCE_STEPS),
        map_ms,
        join_ms,
    }
}

/// Runs of a timed measurement (the fastest is kept).
pub const TIMING_RUNS: usize = 3;

/// CPU time this thread has run, ns (`CLOCK_THREAD_CPUTIME_ID`); `None`
/// if the clock is unavailable.
#[allow(unsafe_code)]
fn thread_cpu_ns() -> Option<u64> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec for the duration of the
    // call; clock_gettime only writes into it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    if rc != 0 {
        return None;
    }
    let secs = u64::try_from(now.tv_sec).ok()?;
    let nanos = u64::try_from(now.tv_nsec).ok()?;
    Some(secs * 1_000_000_000 + nanos)
}

/// `f()` and the time it took, ms: CPU time of this thread where the
/// system reports it (so other processes' load does not count), else
/// wall-clock time.
pub fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let cpu = thread_cpu_ns();
    let started = Instant::now();
    let value = f();
    let wall = started.elapsed().as_secs_f64() * 1000.0;
    let ms = match (cpu, thread_cpu_ns()) {
        (Some(before), Some(after)) => after.saturating_sub(before) as f64 / 1e6,
        _ => wall,
    };
    (value, ms)
}

/// The result of the fastest of [`TIMING_RUNS`] runs of `run` (which
/// times itself), so that load from other processes inflates it less.
fn fastest<T>(mut run: impl FnMut() -> (T, f64)) -> (T, f64) {
    let (mut value, mut best) = run();
    for _ in 1..TIMING_RUNS {
        let (next, ms) = run();
        if ms < best {
            (value, best) = (next, ms);
        }
    }
    (value, best)
}

/// What a random sequence of joins and leaves cost.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sequence {
    /// Copies moved, all steps.
    pub moved: usize,
    /// Sum of the steps' optima.
    pub optimum: f64,
    /// Worst column max/mean after any step.
    pub worst_ratio: f64,
    /// Most any column's max exceeded `ceil(4096 / N)` after any step.
    pub worst_excess: usize,
}

/// `steps` random joins and leaves (a leave only with at least two
/// members), drawn from a generator seeded with [`SEQUENCE_SEED`].
pub fn sequence(mut cluster: Cluster, steps: usize) -> Sequence {
    let mut rng = SimRng::new(SEQUENCE_SEED);
    let mut out = Sequence {
        moved: 0,
        optimum: 0.0,
        worst_ratio: 0.0,
        worst_excess: 0,
    };
    for _ in 0..steps {
        let (m, o) = if cluster.len() < 2 || rng.chance(0.5) {
            cluster.join()
        } else {
            let index = rng.index(cluster.len());
            cluster.leave(index)
        };
        out.moved += m;
        out.optimum += o;
        let rf = cluster.map().replication_factor();
        let ceil = PARTITIONS.div_ceil(cluster.len());
        for column in 0..rf {
            let column = stats(cluster.map(), Some(column));
            out.worst_ratio = out.worst_ratio.max(column.ratio());
            out.worst_excess = out.worst_excess.max(column.max.saturating_sub(ceil));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The acceptance figures of issue 45 at 100 nodes, with and without
    /// racks: the stable placement is as even as the paper's map and moves
    /// at most 1.25x the optimum; the paper's map, recomputed, fails that.
    #[test]
    fn hundred_nodes_stable_is_even_and_moves_the_minimum() {
        for racks in [1, 3] {
            let mut stable = Cluster::new(100, racks, 2, Algorithm::Stable);
            for column in 0..2 {
                let s = stats(stable.map(), Some(column));
                assert!(s.ratio() <= 1.01, "racks {racks} column {column}: {s:?}");
            }
            let mut paper = Cluster::new(100, racks, 2, Algorithm::Paper);
            let (moved, optimum) = stable.join();
            assert!(
                moved as f64 <= 1.25 * optimum,
                "racks {racks}: {moved} / {optimum}"
            );
            let (old, _) = paper.join();
            assert!(
                old as f64 > 1.25 * optimum,
                "racks {racks}: paper {old} / {optimum}"
            );
            let (moved, optimum) = stable.leave(50);
            assert!(
                moved as f64 <= 1.25 * optimum,
                "racks {racks}: {moved} / {optimum}"
            );
            let (old, _) = paper.leave(50);
            assert!(
                old as f64 > 1.25 * optimum,
                "racks {racks}: paper {old} / {optimum}"
            );
        }
    }

    /// A short random sequence keeps every column within its ceiling and
    /// moves close to the sum of optima.
    #[test]
    fn short_sequence_stays_even_and_cheap() {
        let s = sequence(Cluster::new(30, 3, 2, Algorithm::Stable), 6);
        assert_eq!(s.worst_excess, 0, "{s:?}");
        assert!(s.moved as f64 <= 1.25 * s.optimum, "{s:?}");
    }

    #[test]
    fn table1_alone_is_uneven() {
        let cluster = Cluster::new(100, 1, 2, Algorithm::Table1);
        assert!(stats(cluster.map(), Some(0)).ratio() > 1.05);
    }
}
