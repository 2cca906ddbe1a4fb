//! Measures what a client write on a device namespace pays for the
//! stop-writes check: writes of small records each preceded by
//! [`DeviceEngine::stop_writes`] (as the service's write path does), and
//! the check alone, on simulated disks (memory, so the disk's speed does
//! not hide the check). Results are recorded in bench/RESULTS.md.
//!
//!   cargo run --release -p citrine-storage --example stop_writes_bench -- [ROUNDS] [RECORDS] [DEVICES]
//!
//! Each round opens a fresh engine over DEVICES disks, writes RECORDS
//! records of 100 bytes, then calls the check alone 10 M times; it prints
//! nanoseconds per write and per check.

#![allow(clippy::unwrap_used)]

use citrine_storage::device::io::SimDisk;
use citrine_storage::device::{DeviceConfig, Media, Recovered};
use citrine_storage::{DeviceEngine, StorageEngine, StoreMeta};
use citrine_types::Digest;
use std::hint::black_box;
use std::time::Instant;

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|text| text.parse().unwrap())
        .collect();
    let rounds = args.first().copied().unwrap_or(3);
    let records = args.get(1).copied().unwrap_or(300_000);
    let devices = args.get(2).copied().unwrap_or(4) as usize;
    for round in 0..rounds {
        let (write_ns, check_ns) = one_round(records, devices);
        println!("round {round}: write {write_ns:.1} ns, stop_writes {check_ns:.2} ns");
    }
}

/// ns per checked write, ns per check alone.
fn one_round(records: u64, devices: usize) -> (f64, f64) {
    let per_device = records * 256 / devices as u64 + (64 << 20);
    let disks: Vec<SimDisk> = (0..devices)
        .map(|index| SimDisk::new(per_device, index as u64 + 1))
        .collect();
    let paths = (0..devices)
        .map(|index| format!("sim{index}").into())
        .collect();
    let engine = DeviceEngine::open(DeviceConfig {
        media: Media::Simulated(disks),
        post_write_queue: 0,
        ..DeviceConfig::new("bench", paths, per_device)
    })
    .unwrap();
    engine.cold_start(&|_, _| Recovered::Live, &|_| {});
    let body = vec![0x5Au8; 100];
    let started = Instant::now();
    for seed in 0..records {
        let meta = StoreMeta {
            generation: 1,
            life: 0,
            void_time: 0,
            last_update_ms: seed,
            set_name: b"bench",
        };
        assert!(!engine.stop_writes());
        let digest = Digest(citrine_testsupport::digest_bytes(seed));
        black_box(engine.write(&digest, &meta, body.clone()).unwrap());
    }
    let write_ns = started.elapsed().as_nanos() as f64 / records as f64;
    let checks = 10_000_000u64;
    let started = Instant::now();
    for _ in 0..checks {
        black_box(black_box(&engine).stop_writes());
    }
    let check_ns = started.elapsed().as_nanos() as f64 / checks as f64;
    (write_ns, check_ns)
}
