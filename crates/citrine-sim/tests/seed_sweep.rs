//! Seed sweeps of the cluster simulator.
//!
//! `cargo test -p citrine-sim` runs `DEBUG_SEEDS` quick seeds in a debug
//! build; `cargo test --release -p citrine-sim` runs `RELEASE_SEEDS` quick
//! seeds plus `RELEASE_FULL_SEEDS` full-size seeds (with partition-map
//! checks). `CITRINE_SIM_SEEDS=N` overrides the quick count,
//! `CITRINE_SIM_START=S` the first seed. `regression_seeds` replays
//! quick seeds that once failed. Failing seeds are listed with the
//! violated invariant; replay one with
//! `cargo run --release -p citrine-sim --example soak -- --seed S --quick`.

use std::time::Instant;

use citrine_sim::{run_seed, SimConfig};

const DEBUG_SEEDS: u64 = 300;
const RELEASE_SEEDS: u64 = 2000;
const RELEASE_FULL_SEEDS: u64 = 200;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn sweep(start: u64, count: u64, cfg: &SimConfig) -> Vec<String> {
    let mut failures = Vec::new();
    for seed in start..start + count {
        if let Err(f) = run_seed(seed, cfg) {
            failures.push(f.to_string());
        }
    }
    failures
}

/// Runs one half of the quick sweep; the two halves are separate tests so
/// the harness runs them on both cores.
fn quick_half(half: u64) {
    let default = if cfg!(debug_assertions) {
        DEBUG_SEEDS
    } else {
        RELEASE_SEEDS
    };
    let total = env_u64("CITRINE_SIM_SEEDS").unwrap_or(default);
    let start = env_u64("CITRINE_SIM_START").unwrap_or(0);
    let first = start + half * (total / 2);
    let count = if half == 0 {
        total / 2
    } else {
        total - total / 2
    };
    let t = Instant::now();
    let failures = sweep(first, count, &SimConfig::quick());
    eprintln!(
        "quick sweep: {count} seeds from {first} in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} of {count} seeds failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Quick seeds that once failed, each with what it found (the membership
/// state machines' fix is in the commit that added it).
const REGRESSION_SEEDS: [(u64, &str); 5] = [
    // A flaky node (60 % loss) dropped out of the adjacency while judged
    // unhealthy and came back on a fresh probation, which three lucky
    // windows passed: admitted while stable (NoFlapping).
    (316_510, "flaky node admitted after a fresh probation"),
    // A member's average, raised by a partition shorter than the timeout,
    // crossed the threshold after the heal as the others' fell faster,
    // although its heartbeats all arrived: evicted while stable.
    (335_637, "member evicted on its history alone"),
    // A principal's round dropping a member unhealthy after a one-way cut
    // committed although the member recovered during the round: the view
    // changed back and forth (NoFlapping).
    (348_167, "round committed on a stale eligible set"),
    // A member back from a partition resumed its (high) record, then a
    // window judged on the short span before a heartbeat-only cut lost one
    // heartbeat of 2.6 and flagged it: evicted while stable.
    (318_403, "member flagged on one lost heartbeat"),
    // A retry round's deadline and the next quantum fell due at one tick:
    // the retry committed a view without the peer whose promises were lost
    // (quantum 2), the boundary's round took the peer in (quantum 3). The
    // simulator charged both views to quantum 3, the quantum the machine
    // was in when the tick returned (OneCommitPerQuantum, a false alarm:
    // the check now asks the machine which quantum decided the view).
    (45_816, "a retry's commit charged to the next quantum"),
];

#[test]
fn regression_seeds() {
    let failures: Vec<String> = REGRESSION_SEEDS
        .iter()
        .filter_map(|(seed, found)| {
            run_seed(*seed, &SimConfig::quick())
                .err()
                .map(|f| format!("({found}) {f}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn quick_seed_sweep_first_half() {
    quick_half(0);
}

#[test]
fn quick_seed_sweep_second_half() {
    quick_half(1);
}

#[test]
fn full_seed_sweep_in_release() {
    // Full-size runs with partition-map checks are too slow unoptimised;
    // a debug build checks a handful so the path stays exercised.
    let (count, mut cfg) = if cfg!(debug_assertions) {
        let mut cfg = SimConfig::quick();
        cfg.check_partition_maps = true;
        (3, cfg)
    } else {
        (RELEASE_FULL_SEEDS, SimConfig::full())
    };
    cfg.check_partition_maps = true;
    let start = env_u64("CITRINE_SIM_START").unwrap_or(0);
    let t = Instant::now();
    let failures = sweep(1_000_000 + start, count, &cfg);
    eprintln!(
        "full sweep: {count} seeds in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} of {count} seeds failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
