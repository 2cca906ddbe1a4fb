//! The data-mode simulator on a strong-consistency namespace
//! (`DataConfig::sc`: roster, crashes of any number of nodes, network
//! partitions, linearizable reads checked, every key read back at the
//! end). One short seed in CI; sweep more with
//! `cargo run --release -p citrine-sim --example soak -- --data --sc --seeds 0..300`.
//!
//! Seeds that lost acknowledged writes (`LostWrite`: a put key read back
//! absent after restarts of roster replicas) until 2725d1b — a restarted
//! master took its fill's batches before it resolved the view and then
//! emptied them as an untrusted copy: 2 and 5 of the short runs, 1 and 2
//! of `DataConfig::sc()`, run by the on-demand test below (the in-process
//! test `a_batch_that_arrives_before_the_exchange_is_resolved_is_not_emptied`
//! is the cheap one CI runs for it).

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
    DataConfig::sc_short()
}

#[test]
fn sc_short_run_loses_no_acknowledged_write() {
    run(&[1], &short());
}

#[test]
#[ignore = "on demand (~15 s): the seeds that lost writes before 2725d1b"]
fn sc_seeds_that_lost_writes_before_the_early_batch_fix() {
    // As the seeds were drawn then, before the clock steps.
    let before = |cfg: DataConfig| DataConfig {
        clock_jumps: false,
        ..cfg
    };
    run(&[2, 5], &before(short()));
    run(&[1, 2], &before(DataConfig::sc()));
}

#[test]
#[ignore = "on demand (~1 min in debug): seeds whose delete answered 2 unreplicated"]
fn sc_seeds_whose_delete_answered_from_an_unreplicated_tombstone() {
    // A durable delete answered 9 (its replica write cut by a split), the
    // next delete of the key 2 from the master's own tombstone, then the
    // replica's older record served (399: a stale read; 67: the record
    // back at the end). Before clock steps were drawn.
    let full = DataConfig {
        clock_jumps: false,
        ..DataConfig::sc()
    };
    run(&[399, 67], &full);
}
