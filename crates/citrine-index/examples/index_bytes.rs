//! Primary-index memory benchmark (issue 44, point 1): loads RECORDS
//! entries as a device namespace holds them (a device address each,
//! metadata of a written record) into a fresh 4096-partition index, then
//! prints what `index_used_bytes` reports (`PartitionTable::table_bytes`,
//! the same call the statistic makes) and the growth of the process's
//! resident set, each per record, with where the bytes go: the slot, its
//! tag, the tables' fill, the partitions' fixed part. Last, the time of a
//! lookup of a random existing key (one thread, read lock, entry, meta).
//!
//!   cargo run --release -p citrine-index --example index_bytes [RECORDS] [LOOKUPS]
//!
//! One count per process, so the resident set starts from the same place.

use citrine_index::{IndexEntry, Partition, PartitionTable, RecordMeta, SLOT_BYTES};
use citrine_storage::{DeviceAddress, Location};
use citrine_types::{Digest, PARTITIONS};
use std::hint::black_box;
use std::time::Instant;

fn digest(seed: u64) -> Digest {
    Digest(citrine_testsupport::digest_bytes(seed))
}

/// Resident bytes of this process (`/proc/self/statm`'s second field).
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|field| field.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// The entry a written device record has: set 1, a TTL, a last-update
/// time of now, a 1 536-byte record somewhere on one of 4 devices.
fn entry(seed: u64) -> IndexEntry {
    let meta = RecordMeta {
        generation: 1 + (seed % 7) as u16,
        set_id: 1,
        void_time: 600_000_000 + (seed % 1000) as u32,
        last_update_ms: 1_795_000_000_000 + seed,
        ..RecordMeta::default()
    };
    let address = DeviceAddress::new((seed % 4) as usize, seed * 12 % (1 << 30), 12);
    IndexEntry::new(meta, Location::device(address.expect("fits")))
}

fn load(table: &PartitionTable, records: u64) -> f64 {
    let started = Instant::now();
    for seed in 0..records {
        let key = digest(seed);
        table
            .partition(key.partition())
            .write()
            .insert(key, entry(seed));
    }
    started.elapsed().as_nanos() as f64 / records as f64
}

/// Median over 5 rounds of ns per lookup of `lookups` random existing keys.
fn lookup_ns(table: &PartitionTable, records: u64, lookups: u64) -> f64 {
    let mut rounds = Vec::new();
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    for _ in 0..5 {
        let started = Instant::now();
        let mut sum = 0u64;
        for _ in 0..lookups {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let key = digest(state % records);
            let partition = table.partition(key.partition()).read();
            if let Some(found) = partition.get(&key) {
                sum += u64::from(found.meta().generation);
            }
        }
        black_box(sum);
        rounds.push(started.elapsed().as_nanos() as f64 / lookups as f64);
    }
    rounds.sort_by(f64::total_cmp);
    rounds[rounds.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let records: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let lookups: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let table = PartitionTable::new();
    let rss_before = rss_bytes();
    let load_ns = load(&table, records);
    let rss_after = rss_bytes();
    let used = table.table_bytes() as f64;
    let slots = table.slot_count() as f64;
    let fixed = (PARTITIONS * std::mem::size_of::<Partition>()) as f64;
    let n = records as f64;
    println!(
        "records {records} index_used_bytes {:.0} = {:.2} B/record; rss growth {:.2} B/record; \
         slot {SLOT_BYTES} B + 1 tag, fill {:.3} (slots {:.0}); partitions' fixed part {:.2} B/record; \
         insert {load_ns:.0} ns; lookup {:.1} ns",
        used,
        used / n,
        (rss_after.saturating_sub(rss_before)) as f64 / n,
        n / slots,
        slots,
        fixed / n,
        lookup_ns(&table, records, lookups),
    );
}
