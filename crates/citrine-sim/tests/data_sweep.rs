//! Seed sweep of the data-mode simulator (real services, clients,
//! membership changes; see `citrine_sim::data`).
//!
//! `cargo test -p citrine-sim` runs `DEBUG_SEEDS` seeds in a debug build,
//! split over two tests so the harness uses both cores; the second half
//! mixes in the `--early-restart` and `--vanish` modes, a quarter of both
//! the `--device` mode, and half of those the `--device-faults` mode;
//! `cargo test --release -p citrine-sim` runs `RELEASE_SEEDS`.
//! `CITRINE_SIM_DATA_SEEDS=N` overrides the count, `CITRINE_SIM_START=S`
//! the first seed. Replay a failing seed with
//! `cargo run --release -p citrine-sim --example soak -- --data --seed S -v`
//! (with `--early-restart` / `--vanish` / `--device` / `--device-faults`
//! as the seed's mode asks).

use std::time::Instant;

use citrine_sim::{run_data_seed, DataConfig};

const DEBUG_SEEDS: u64 = 40;
const RELEASE_SEEDS: u64 = 300;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn half(which: u64) {
    let default = if cfg!(debug_assertions) {
        DEBUG_SEEDS
    } else {
        RELEASE_SEEDS
    };
    let total = env_u64("CITRINE_SIM_DATA_SEEDS").unwrap_or(default);
    // Seeds of their own, apart from the membership sweep's.
    let start = 2_000_000 + env_u64("CITRINE_SIM_START").unwrap_or(0);
    let first = start + which * (total / 2);
    let count = if which == 0 {
        total / 2
    } else {
        total - total / 2
    };
    let t = Instant::now();
    let mut failures = Vec::new();
    for seed in first..first + count {
        // The second half also runs the harsher modes: a node restarted
        // before the others noticed it died, and messages that vanish.
        // Every fourth seed of both keeps its records on simulated disks,
        // so restarted nodes come back with what they had synced; every
        // eighth also has a disk that starts failing its syncs.
        let cfg = DataConfig {
            restart_before_noticed: which == 1 && seed % 2 == 0,
            messages_vanish: which == 1 && seed % 3 == 0,
            device: seed % 4 == 1,
            device_faults: seed % 8 == 1,
            ..DataConfig::quick()
        };
        if let Err(f) = run_data_seed(seed, &cfg) {
            failures.push(f.to_string());
        }
    }
    eprintln!(
        "data sweep: {count} seeds from {first} in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} of {count} seeds failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn data_seed_sweep_first_half() {
    half(0);
}

#[test]
fn data_seed_sweep_second_half() {
    half(1);
}
