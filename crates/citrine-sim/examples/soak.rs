//! Long-running seed sweep of the cluster simulator.
//!
//! ```text
//! cargo run --release -p citrine-sim --example soak -- --seeds 1000..      # until stopped
//! cargo run --release -p citrine-sim --example soak -- --seeds 0..500 --quick
//! cargo run --release -p citrine-sim --example soak -- --seed 1234 -v      # replay one seed
//! cargo run --release -p citrine-sim --example soak -- --data --seeds 0..1000
//! cargo run --release -p citrine-sim --example soak -- --data --early-restart --seed 7 -v
//! cargo run --release -p citrine-sim --example soak -- --data --device --seeds 0..300
//! cargo run --release -p citrine-sim --example soak -- --data --device-faults --seeds 0..300
//! cargo run --release -p citrine-sim --example soak -- --data --sc --seeds 0..300
//! cargo run --release -p citrine-sim --example soak -- --data --short --seeds 0..1000
//! ```
//!
//! `--data` runs the data-mode simulator (real services and clients under
//! membership changes, `citrine_sim::data`) instead of the membership-only
//! one; `--early-restart` lets a crashed node restart before the survivors
//! noticed the crash (`DataConfig::restart_before_noticed`); `--vanish`
//! makes lost messages vanish instead of arriving late
//! (`DataConfig::messages_vanish`); `--device` keeps the records on
//! simulated disks, so a crashed node restarts with what it had synced
//! (`DataConfig::device`); `--device-faults` implies it and lets one node's
//! disk fail its syncs (`DataConfig::device_faults`); `--sc` makes the
//! namespace strong-consistency, with crashes of any number of nodes,
//! network partitions and linearizable reads checked (`DataConfig::sc`);
//! `--short` implies it with two events and two clients a run
//! (`DataConfig::sc_short`, as the CI test); `--no-clock-jumps` leaves
//! out the SC runs' wall-clock steps (`DataConfig::clock_jumps`: the
//! seeds of runs before they were added replay as they were).
//!
//! To see why a data-mode seed failed, replay it with `-v` and these in
//! the environment (their notes join the recent events):
//! `CITRINE_SIM_TRACE_CLUSTER=1` every cluster message but heartbeats;
//! `CITRINE_SIM_TRACE_COUNTER=N` / `CITRINE_SIM_TRACE_PUT=N` every attempt
//! on counter or put key N (and, for a put key, the traffic of its
//! partition); `CITRINE_SIM_TRACE_PARTITION=P` every migration batch, drop
//! and replica write of partition P.
//!
//! Prints every failing seed with its invariant and recent events, and a
//! progress line every 100 seeds. Exits non-zero if any seed failed (for a
//! bounded range).

use std::process::ExitCode;
use std::time::Instant;

use citrine_sim::{run_data_seed, run_seed, DataConfig, DataReport, SimConfig};

struct Args {
    start: u64,
    end: Option<u64>,
    quick: bool,
    verbose: bool,
    no_pmap: bool,
    trace: bool,
    data: bool,
    early_restart: bool,
    vanish: bool,
    device: bool,
    device_faults: bool,
    sc: bool,
    short: bool,
    no_clock_jumps: bool,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        start: 0,
        end: None,
        quick: false,
        verbose: false,
        no_pmap: false,
        trace: false,
        data: false,
        early_restart: false,
        vanish: false,
        device: false,
        device_faults: false,
        sc: false,
        short: false,
        no_clock_jumps: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--seeds" => {
                let spec = it.next().ok_or("--seeds needs START.. or START..END")?;
                let (s, e) = spec.split_once("..").ok_or("expected START..[END]")?;
                args.start = s.parse().map_err(|_| format!("bad start {s}"))?;
                if !e.is_empty() {
                    args.end = Some(e.parse().map_err(|_| format!("bad end {e}"))?);
                }
            }
            "--seed" => {
                let s = it.next().ok_or("--seed needs a value")?;
                args.start = s.parse().map_err(|_| format!("bad seed {s}"))?;
                args.end = Some(args.start + 1);
            }
            "--quick" => args.quick = true,
            "--trace" => args.trace = true,
            "--data" => args.data = true,
            "--early-restart" => args.early_restart = true,
            "--vanish" => args.vanish = true,
            "--device" => args.device = true,
            "--device-faults" => {
                args.device = true;
                args.device_faults = true;
            }
            "--no-pmap" => args.no_pmap = true,
            "--sc" => args.sc = true,
            "--no-clock-jumps" => args.no_clock_jumps = true,
            "--short" => {
                args.sc = true;
                args.short = true;
            }
            "-v" | "--verbose" => args.verbose = true,
            "-h" | "--help" => {
                return Err("usage: soak [--seeds START..[END] | --seed S] [--quick] [--no-pmap] [--trace] [--data [--early-restart] [--vanish] [--device] [--device-faults] [--sc] [--short] [--no-clock-jumps]] [-v]"
                    .to_string())
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

/// Sums of the passing data-mode seeds' reports.
#[derive(Default)]
struct Totals {
    acked: u64,
    in_doubt: u64,
    refused: u64,
    reads_checked: u64,
    unavailable_at_end: u64,
    seeds_with_unavailable: u64,
}

impl Totals {
    fn add(&mut self, r: &DataReport) {
        self.acked += r.acked;
        self.in_doubt += r.in_doubt;
        self.refused += r.refused;
        self.reads_checked += r.reads_checked;
        self.unavailable_at_end += r.unavailable_at_end as u64;
        self.seeds_with_unavailable += u64::from(r.unavailable_at_end > 0);
    }
}

impl std::fmt::Display for Totals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "passing seeds: {} ops acknowledged, {} in doubt, {} refused, {} reads checked, \
             {} keys unavailable at the end (in {} seeds)",
            self.acked,
            self.in_doubt,
            self.refused,
            self.reads_checked,
            self.unavailable_at_end,
            self.seeds_with_unavailable
        )
    }
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let mut cfg = if args.quick {
        SimConfig::quick()
    } else {
        SimConfig::full()
    };
    cfg.trace_paxos = args.trace;
    if args.no_pmap {
        cfg.check_partition_maps = false;
    }
    let started = Instant::now();
    let mut failures = 0u64;
    let mut runs = 0u64;
    let mut max_conv = 0u64;
    let mut max_dep = 0u64;
    let mut totals = Totals::default();
    let mut seed = args.start;
    loop {
        if args.end.is_some_and(|e| seed >= e) {
            break;
        }
        if args.data {
            let mut data_cfg = if args.short {
                DataConfig::sc_short()
            } else if args.sc {
                DataConfig::sc()
            } else {
                DataConfig::quick()
            };
            data_cfg.restart_before_noticed = args.early_restart;
            data_cfg.messages_vanish = args.vanish;
            data_cfg.device |= args.device;
            data_cfg.device_faults = args.device_faults;
            data_cfg.clock_jumps &= !args.no_clock_jumps;
            match run_data_seed(seed, &data_cfg) {
                Ok(r) => {
                    totals.add(&r);
                    if r.unavailable_at_end > 0 {
                        println!(
                            "seed {seed}: {} keys unavailable at the end (commit-to-device \
                             {}), events {:?}",
                            r.unavailable_at_end, r.commit_to_device, r.events
                        );
                    }
                    if args.verbose {
                        println!("{r:?}");
                    }
                }
                Err(f) => {
                    failures += 1;
                    println!("FAIL {f}");
                }
            }
        } else {
            match run_seed(seed, &cfg) {
                Ok(r) => {
                    max_conv = max_conv.max(r.convergence_ms.iter().copied().max().unwrap_or(0));
                    max_dep = max_dep.max(r.departure_ms.unwrap_or(0));
                    if args.verbose {
                        println!("{r:?}");
                    }
                }
                Err(f) => {
                    failures += 1;
                    println!("FAIL {f}");
                }
            }
        }
        runs += 1;
        seed += 1;
        if runs.is_multiple_of(100) {
            println!(
                "{runs} seeds ({}..{seed}), {failures} failed, max convergence {max_conv} ms, \
                 max departure {max_dep} ms, {:.1} s",
                args.start,
                started.elapsed().as_secs_f64()
            );
        }
    }
    println!(
        "done: {runs} seeds, {failures} failed, max convergence {max_conv} ms, max departure \
         {max_dep} ms, {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if args.data {
        println!("{totals}");
    }
    if failures > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
