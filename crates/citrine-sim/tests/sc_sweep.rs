//! The data-mode simulator on a strong-consistency namespace
//! (`DataConfig::sc`: roster, crashes of any number of nodes, network
//! partitions, linearizable reads checked, every key read back at the
//! end). One short seed in CI; sweep more with
//! `cargo run --release -p citrine-sim --example soak -- --data --sc --seeds 0..300`.
//!
//! Seeds known to fail today (issue 39), run by the ignored test below:
//! 2 and 5 of the short runs, 1 and 2 of `DataConfig::sc()` (`LostWrite`:
//! a put key read back absent or older than its last acknowledged
//! attempt, after restarts of roster replicas whose copies were stale).

use citrine_sim::{run_data_seed, DataConfig};

fn run(seeds: &[u64], cfg: &DataConfig) {
    let failures: Vec<String> = seeds
        .iter()
        .filter_map(|seed| run_data_seed(*seed, cfg).err())
        .map(|failure| failure.to_string())
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A shorter SC run: two events, two clients, a short settle.
fn short() -> DataConfig {
    DataConfig {
        min_events: 2,
        max_events: 2,
        clients: 2,
        settle_ms: 1_000,
        ..DataConfig::sc()
    }
}

#[test]
fn sc_short_run_loses_no_acknowledged_write() {
    run(&[1], &short());
}

#[test]
#[ignore = "acknowledged SC writes still lost on these seeds (issue 39)"]
fn sc_seeds_known_to_lose_writes() {
    run(&[2, 5], &short());
    run(&[1, 2], &DataConfig::sc());
}
