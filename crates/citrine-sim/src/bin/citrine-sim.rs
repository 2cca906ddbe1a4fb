//! `citrine-sim`: offline simulations of Citrine's cluster algorithms.
//!
//! `citrine-sim balance` computes [`PartitionMap`]s for synthetic clusters and
//! reports how evenly the 4096 partitions are spread over the nodes (per
//! column: master, replica 1, ...) with and without the uniform-balance
//! adjustment, and how many partition copies move when one node joins or
//! leaves.
//!
//! Synthetic node ids imitate Aerospike's: the service port 3001 (`0x0BB9`) in
//! the top 16 bits and a Docker-bridge MAC `02:42:ac:11:hi:lo` (byte-reversed,
//! as Aerospike stores it) in the low 48 bits, where `hi:lo` is `i + 2` for
//! node `i` — node 0 is `BB9020011AC4202`. With `--racks K` (K ≥ 2) node `i`
//! is on rack `i % K + 1`; otherwise every node is on rack 0 (no rack
//! awareness). The joining node is node `N`; the leaving node is node `N / 2`.
//!
//! "Copies moved" counts, over all partitions, the replicas in the new map
//! that the node did not already hold in the old map (copies that must be
//! migrated). The optimum is the joining node's fair share,
//! `rf × 4096 / (N + 1)`, or the leaving node's share, `rf × 4096 / N`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Instant;

use citrine_cluster::partition_map::{NodeEntry, PartitionMap, PartitionMapConfig};
use citrine_types::{NodeId, PartitionId, PARTITIONS};
use clap::{Args, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "citrine-sim",
    about = "Offline simulations of Citrine cluster algorithms"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Partition balance and migration cost of the partition map.
    Balance(BalanceArgs),
}

#[derive(Args, Debug)]
struct BalanceArgs {
    /// Number of nodes in the cluster (1..=4096).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..=4096))]
    nodes: u16,
    /// Copies per partition.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=16))]
    replication_factor: u8,
    /// Number of racks; 0 or 1 means no rack awareness.
    #[arg(long, default_value_t = 1)]
    racks: u32,
    /// Only show the map without the uniform-balance adjustment.
    #[arg(long)]
    no_balance: bool,
    /// Print a Markdown table for 5, 10, 100 and 1000 nodes, without racks
    /// and with 3 racks (uses --replication-factor, ignores --nodes/--racks).
    #[arg(long)]
    table: bool,
}

/// Synthetic node id of node `i` (see the module documentation).
fn node_id(i: usize) -> NodeId {
    let mac = (i + 2) as u64;
    let lo = mac & 0xff;
    let hi = (mac >> 8) & 0xff;
    NodeId(0x0BB9_0000_0000_0000 | (lo << 40) | (hi << 32) | 0x11AC_4202)
}

fn node_entry(i: usize, racks: u32) -> NodeEntry {
    let rack_id = if racks > 1 { (i as u32 % racks) + 1 } else { 0 };
    NodeEntry {
        id: node_id(i),
        rack_id,
    }
}

fn cluster(n: usize, racks: u32) -> Vec<NodeEntry> {
    (0..n).map(|i| node_entry(i, racks)).collect()
}

/// Per-node count statistics.
#[derive(Clone, Copy, Debug)]
struct Stats {
    min: usize,
    mean: f64,
    max: usize,
}

impl Stats {
    fn ratio(&self) -> f64 {
        self.max as f64 / self.mean
    }
}

/// Statistics of the per-node counts of `column`, or of all columns together
/// when `column` is `None`.
fn stats(map: &PartitionMap, column: Option<usize>) -> Stats {
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

/// Copies present in `new` on a node that did not hold that partition in `old`.
fn copies_moved(old: &PartitionMap, new: &PartitionMap) -> usize {
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

/// Everything reported for one (nodes, racks, rf, balance) configuration.
struct Report {
    columns: Vec<Stats>,
    all: Stats,
    added_moved: usize,
    added_optimum: f64,
    removed_moved: Option<usize>,
    removed_optimum: f64,
    millis: f64,
}

fn run(n: usize, racks: u32, rf: usize, balance: bool) -> Report {
    let config = PartitionMapConfig {
        replication_factor: rf,
        uniform_balance: balance,
    };
    let nodes = cluster(n, racks);
    let started = Instant::now();
    let base = PartitionMap::compute(&nodes, &config);
    let millis = started.elapsed().as_secs_f64() * 1000.0;

    let mut grown = nodes.clone();
    grown.push(node_entry(n, racks));
    let added = PartitionMap::compute(&grown, &config);

    let removed_moved = (n > 1).then(|| {
        let mut shrunk = nodes.clone();
        shrunk.remove(n / 2);
        copies_moved(&base, &PartitionMap::compute(&shrunk, &config))
    });

    let eff = base.replication_factor();
    Report {
        columns: (0..eff).map(|c| stats(&base, Some(c))).collect(),
        all: stats(&base, None),
        added_moved: copies_moved(&base, &added),
        added_optimum: (rf.min(n + 1) * PARTITIONS) as f64 / (n + 1) as f64,
        removed_moved,
        removed_optimum: (eff * PARTITIONS) as f64 / n as f64,
        millis,
    }
}

fn column_name(column: usize) -> String {
    if column == 0 {
        "master".to_string()
    } else {
        format!("replica {column}")
    }
}

fn print_report(n: usize, racks: u32, rf: usize, balance: bool) {
    let report = run(n, racks, rf, balance);
    println!(
        "nodes {n}, racks {}, replication factor {rf}, uniform balance {} (map computed in {:.1} ms)",
        if racks > 1 { racks } else { 0 },
        if balance { "on" } else { "off" },
        report.millis
    );
    println!(
        "  {:<12} {:>6} {:>9} {:>6} {:>9}",
        "column", "min", "mean", "max", "max/mean"
    );
    let rows = report
        .columns
        .iter()
        .enumerate()
        .map(|(c, s)| (column_name(c), s))
        .chain(std::iter::once(("all copies".to_string(), &report.all)));
    for (name, s) in rows {
        println!(
            "  {:<12} {:>6} {:>9.3} {:>6} {:>9.4}",
            name,
            s.min,
            s.mean,
            s.max,
            s.ratio()
        );
    }
    println!(
        "  add 1 node:    {} copies moved, optimum {:.1} (ratio {:.2})",
        report.added_moved,
        report.added_optimum,
        report.added_moved as f64 / report.added_optimum
    );
    match report.removed_moved {
        Some(moved) => println!(
            "  remove 1 node: {} copies moved, optimum {:.1} (ratio {:.2})",
            moved,
            report.removed_optimum,
            moved as f64 / report.removed_optimum
        ),
        None => println!("  remove 1 node: n/a (single node)"),
    }
    println!();
}

fn cell(s: &Stats) -> String {
    format!("{}/{:.2}/{} ({:.3})", s.min, s.mean, s.max, s.ratio())
}

fn print_table(rf: usize) {
    let mut out = String::new();
    let _ = write!(out, "| nodes | racks | balance |");
    for c in 0..rf {
        let _ = write!(out, " {} min/mean/max (max/mean) |", column_name(c));
    }
    let _ = writeln!(
        out,
        " all copies max/mean | add 1: moved / optimum | remove 1: moved / optimum | map ms |"
    );
    let _ = write!(out, "|---:|---:|:---|");
    for _ in 0..rf {
        let _ = write!(out, "---|");
    }
    let _ = writeln!(out, "---:|---|---|---:|");
    for racks in [1u32, 3] {
        for n in [5usize, 10, 100, 1000] {
            for balance in [false, true] {
                let report = run(n, racks, rf, balance);
                let _ = write!(
                    out,
                    "| {n} | {} | {} |",
                    if racks > 1 { racks } else { 0 },
                    if balance { "on" } else { "off" }
                );
                for c in 0..rf {
                    match report.columns.get(c) {
                        Some(s) => {
                            let _ = write!(out, " {} |", cell(s));
                        }
                        None => {
                            let _ = write!(out, " – |");
                        }
                    }
                }
                let removed = match report.removed_moved {
                    Some(moved) => format!(
                        "{moved} / {:.1} ({:.2})",
                        report.removed_optimum,
                        moved as f64 / report.removed_optimum
                    ),
                    None => "–".to_string(),
                };
                let _ = writeln!(
                    out,
                    " {:.3} | {} / {:.1} ({:.2}) | {} | {:.1} |",
                    report.all.ratio(),
                    report.added_moved,
                    report.added_optimum,
                    report.added_moved as f64 / report.added_optimum,
                    removed,
                    report.millis
                );
            }
        }
    }
    print!("{out}");
}

fn main() {
    let cli = Cli::parse();
    match cli.command {
        Command::Balance(args) => {
            let rf = usize::from(args.replication_factor);
            if args.table {
                print_table(rf);
                return;
            }
            let n = usize::from(args.nodes);
            print_report(n, args.racks, rf, false);
            if !args.no_balance {
                print_report(n, args.racks, rf, true);
            }
        }
    }
}
