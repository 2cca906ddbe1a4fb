//! The data-mode simulator on a strong-consistency namespace
//! (`DataConfig::sc`: roster, crashes of any number of nodes, network
//! partitions, linearizable reads checked, every key read back at the
//! end). A few seeds, seconds each in a debug build; sweep more with
//! `cargo run --release -p citrine-sim --example soak -- --data --sc --seeds 0..300`.
//!
//! Seeds known to fail today (issue 39), run by the ignored tests below:
//! on devices 0 (`LostWrite`) and 4 (`StaleRead`), after restarts of
//! roster replicas with stale or rebuilt copies; in memory 2 (two
//! acknowledged increments returned the same value after a node
//! restarted empty with its work directory's SC versions).

use citrine_sim::{run_data_seed, DataConfig};

fn run(seeds: &[u64], cfg: &DataConfig) {
    let failures: Vec<String> = seeds
        .iter()
        .filter_map(|seed| run_data_seed(*seed, cfg).err())
        .map(|failure| failure.to_string())
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn sc_on_devices_loses_no_acknowledged_write() {
    run(&[1, 2, 3], &DataConfig::sc());
}

#[test]
#[ignore = "acknowledged SC writes still lost on these seeds (issue 39)"]
fn sc_seeds_known_to_lose_writes() {
    run(&[0, 4], &DataConfig::sc());
}

#[test]
#[ignore = "acknowledged SC writes still lost on this seed (issue 39)"]
fn sc_in_memory_seed_known_to_lose_writes() {
    let cfg = DataConfig {
        device: false,
        ..DataConfig::sc()
    };
    run(&[2], &cfg);
}
