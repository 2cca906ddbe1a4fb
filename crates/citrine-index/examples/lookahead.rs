//! Microbenchmark of the index lookahead: batches of lookups in a 1 M-record
//! in-memory index, each batch run plainly (baseline) and with the three
//! prefetch waves first (what a service thread does for the requests of one
//! wake-up), alternating, on one thread.
//!
//!   cargo run --release -p citrine-index --example lookahead [RECORDS] [BATCH] [ROUNDS]
//!
//! Prints per mode: ns per lookup (median over rounds and its range), and
//! the p50/p99/p99.9 of the time of one whole batch. A lookup here is what
//! a read does with the index: read-lock the partition, find the entry,
//! read the first bytes of the body.

use citrine_index::{IndexEntry, PartitionTable, RecordMeta};
use citrine_storage::{Location, Stored};
use citrine_types::Digest;
use std::hint::black_box;
use std::time::Instant;

fn digest(seed: u64) -> Digest {
    Digest(citrine_testsupport::digest_bytes(seed))
}

/// One read's worth of index work; returns a byte of the body.
fn lookup(table: &PartitionTable, key: &Digest) -> u8 {
    let partition = table.partition(key.partition()).read();
    match partition.get(key) {
        Some(entry) => match entry.location.get() {
            Stored::Memory(body) => {
                body.first().copied().unwrap_or(0) ^ entry.meta().generation as u8
            }
            Stored::Device(_) => 0,
        },
        None => 0,
    }
}

fn percentile(sorted: &[u64], pct: f64) -> u64 {
    let at = ((sorted.len() as f64 - 1.0) * pct / 100.0).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut arg = |default: u64| {
        args.next()
            .and_then(|text| text.parse().ok())
            .unwrap_or(default)
    };
    let records = arg(1_000_000);
    let batch = arg(12) as usize;
    let rounds = arg(7) as usize;

    let table = PartitionTable::new();
    for seed in 0..records {
        let key = digest(seed);
        table.partition(key.partition()).write().insert(
            key,
            IndexEntry::new(
                RecordMeta {
                    generation: 1,
                    ..RecordMeta::default()
                },
                Location::memory(&[seed as u8; 40]).expect("fits"),
            ),
        );
    }
    // A large buffer swept between batches, as a request's other work
    // (sockets, parsing, replies) would, so each batch starts cold.
    let mut sweep = vec![0u8; 8 << 20];
    let batches = 20_000usize;
    let mut state = 0x1234_5678_9ABC_DEF1u64;
    let mut next_key = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        digest(state % records)
    };

    println!(
        "lookahead microbenchmark: {records} records, batches of {batch}, {batches} batches per mode per round, {rounds} rounds"
    );
    let mut per_lookup = [Vec::new(), Vec::new()];
    let mut batch_ns = [Vec::new(), Vec::new()];
    let mut keys = Vec::with_capacity(batch);
    for round in 0..rounds {
        for mode in [round % 2, 1 - round % 2] {
            let mut total = 0u64;
            let mut sink = 0u8;
            for step in 0..batches {
                keys.clear();
                keys.extend((0..batch).map(|_| next_key()));
                let at = (step * 4096) % sweep.len();
                for line in sweep[at..].iter_mut().step_by(64).take(1024) {
                    *line = line.wrapping_add(1);
                }
                let started = Instant::now();
                if mode == 1 {
                    for key in &keys {
                        table.prefetch_partition(key.partition());
                    }
                    for key in &keys {
                        table.prefetch_record(key);
                    }
                    for key in &keys {
                        table.prefetch_body(key);
                    }
                }
                for key in &keys {
                    sink ^= lookup(&table, key);
                }
                let elapsed = started.elapsed().as_nanos() as u64;
                total += elapsed;
                batch_ns[mode].push(elapsed);
            }
            black_box(sink);
            per_lookup[mode].push(total as f64 / (batches * batch) as f64);
        }
    }
    for (mode, name) in ["plain", "lookahead"].iter().enumerate() {
        let mut ns = per_lookup[mode].clone();
        ns.sort_by(f64::total_cmp);
        let mut whole = batch_ns[mode].clone();
        whole.sort_unstable();
        println!(
            "{name:>10}: {:.0} ns/lookup [{:.0}-{:.0}]; batch p50 {} ns, p99 {} ns, p99.9 {} ns",
            ns[ns.len() / 2],
            ns[0],
            ns[ns.len() - 1],
            percentile(&whole, 50.0),
            percentile(&whole, 99.0),
            percentile(&whole, 99.9),
        );
    }
    black_box(&sweep);
}
