//! `citrine-sim`: offline simulations of Citrine's cluster algorithms.
//!
//! `citrine-sim balance` computes partition maps for synthetic clusters
//! (see [`citrine_sim::balance`]) and reports how evenly the 4096
//! partitions are spread over the nodes (per column: master, replica 1,
//! ...) by each algorithm — Table 1 alone, Table 1 with the paper's
//! uniform-balance pass, and the stable placement — and how many partition
//! copies move when one node joins (node `N`) or leaves (node `N / 2`), and
//! over a fixed random sequence of 20 joins and leaves.
//!
//! `citrine-sim scale --nodes N` runs the membership simulator on a
//! well-behaved cluster of exactly N nodes (formation; with `--departure`,
//! 10 % of the members crashing at once and their return) and reports the
//! convergence times, the wall-clock cost of one simulated second, and the
//! heartbeat traffic per node.

use std::fmt::Write as _;
use std::time::Instant;

use citrine_sim::balance::{measure, timed, Algorithm, Report, Stats, SEQUENCE_STEPS};
use citrine_sim::{run_seed, SimConfig};
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
    /// Membership simulation of a large cluster.
    Scale(ScaleArgs),
}

#[derive(Args, Debug)]
struct ScaleArgs {
    /// Number of nodes.
    #[arg(long, default_value_t = 100)]
    nodes: usize,
    /// Also crash 10 % of the members at once, then restart them.
    #[arg(long)]
    departure: bool,
    /// Seed of the run.
    #[arg(long, default_value_t = 45)]
    seed: u64,
}

fn run_scale(args: &ScaleArgs) -> bool {
    let cfg = SimConfig::scale(args.nodes, args.departure);
    let started = Instant::now();
    let (result, cpu_ms) = timed(|| run_seed(args.seed, &cfg));
    let wall = started.elapsed().as_secs_f64();
    let cpu = cpu_ms / 1000.0;
    let report = match result {
        Ok(report) => report,
        Err(failure) => {
            println!("nodes {}: FAILED after {wall:.1} s\n{failure}", args.nodes);
            return false;
        }
    };
    let sim_s = report.end_ms as f64 / 1000.0;
    let node_s = report.node_ms as f64 / 1000.0;
    println!(
        "nodes {}, seed {}: ok; simulated {sim_s:.1} s in {cpu:.1} s of CPU ({:.3} s per simulated second; {wall:.1} s wall)",
        report.nodes,
        report.seed,
        cpu / sim_s
    );
    println!(
        "  convergence after each event (ms): {:?}; {} departed at once, out of every view in {:?} ms; view changes {}",
        report.convergence_ms, report.departed, report.departure_ms, report.view_changes
    );
    println!(
        "  heartbeats per node: {:.1} messages/s, {:.0} bytes/s ({:.0} bytes each)",
        report.heartbeats_sent as f64 / node_s,
        report.heartbeat_bytes as f64 / node_s,
        report.heartbeat_bytes as f64 / report.heartbeats_sent.max(1) as f64
    );
    true
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
    /// Print a Markdown table for 5, 10, 100 and 1000 nodes, without racks
    /// and with 3 racks (uses --replication-factor, ignores --nodes/--racks).
    #[arg(long)]
    table: bool,
}

const ALGORITHMS: [Algorithm; 3] = [Algorithm::Table1, Algorithm::Paper, Algorithm::Stable];

fn column_name(column: usize) -> String {
    if column == 0 {
        "master".to_string()
    } else {
        format!("replica {column}")
    }
}

fn ratio(moved: usize, optimum: f64) -> String {
    format!("{moved} / {optimum:.1} ({:.2})", moved as f64 / optimum)
}

fn print_report(n: usize, racks: u32, rf: usize, algorithm: Algorithm) {
    let report = measure(n, racks, rf, algorithm);
    println!(
        "nodes {n}, racks {}, replication factor {rf}, map {} (computed in {:.1} ms, after a join in {:.1} ms)",
        if racks > 1 { racks } else { 0 },
        algorithm.name(),
        report.map_ms,
        report.join_ms
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
    println!("  add 1 node:    {}", ratio(report.added.0, report.added.1));
    match report.removed {
        Some((moved, optimum)) => println!("  remove 1 node: {}", ratio(moved, optimum)),
        None => println!("  remove 1 node: n/a (single node)"),
    }
    let s = report.sequence;
    println!(
        "  {SEQUENCE_STEPS} random joins/leaves: {}, worst column max/mean {:.3}, worst excess over ceil {}",
        ratio(s.moved, s.optimum),
        s.worst_ratio,
        s.worst_excess
    );
    println!();
}

fn cell(s: &Stats) -> String {
    format!("{}/{:.2}/{} ({:.3})", s.min, s.mean, s.max, s.ratio())
}

fn table_row(out: &mut String, n: usize, racks: u32, rf: usize, report: &Report, name: &str) {
    let _ = write!(
        out,
        "| {n} | {} | {name} |",
        if racks > 1 { racks } else { 0 }
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
    let removed = report
        .removed
        .map_or_else(|| "–".to_string(), |(m, o)| ratio(m, o));
    let s = report.sequence;
    let _ = writeln!(
        out,
        " {:.3} | {} | {} | {} | {} | {:.1} | {:.1} |",
        report.all.ratio(),
        ratio(report.added.0, report.added.1),
        removed,
        ratio(s.moved, s.optimum),
        s.worst_excess,
        report.map_ms,
        report.join_ms
    );
}

fn print_table(rf: usize) {
    let mut out = String::new();
    let _ = write!(out, "| nodes | racks | map |");
    for c in 0..rf {
        let _ = write!(out, " {} min/mean/max (max/mean) |", column_name(c));
    }
    let _ = writeln!(
        out,
        " all copies max/mean | add 1: moved / optimum | remove 1: moved / optimum | {SEQUENCE_STEPS} joins/leaves: moved / optimum | worst column max over ceil in them | map ms | join ms |"
    );
    let _ = write!(out, "|---:|---:|:---|");
    for _ in 0..rf {
        let _ = write!(out, "---|");
    }
    let _ = writeln!(out, "---:|---|---|---|---:|---:|---:|");
    for racks in [1u32, 3] {
        for n in [5usize, 10, 100, 1000] {
            for algorithm in ALGORITHMS {
                let report = measure(n, racks, rf, algorithm);
                table_row(&mut out, n, racks, rf, &report, algorithm.name());
            }
        }
    }
    print!("{out}");
}

fn main() {
    let cli = Cli::parse();
    match cli.command {
        Command::Scale(args) => {
            if !run_scale(&args) {
                std::process::exit(1);
            }
        }
        Command::Balance(args) => {
            let rf = usize::from(args.replication_factor);
            if args.table {
                print_table(rf);
                return;
            }
            for algorithm in ALGORITHMS {
                print_report(usize::from(args.nodes), args.racks, rf, algorithm);
            }
        }
    }
}
