//! Measures the device engine: write throughput, random record reads with
//! pread (page cache) against O_DIRECT, cold-start scan rate and fast-restart
//! rate. Results are recorded in bench/RESULTS.md.
//!
//!   cargo run --release -p citrine-storage --example device_bench -- [DIR] [RECORDS] [BODY_BYTES]
//!
//! Environment: CITRINE_BENCH_COMMIT (commit-to-device), CITRINE_BENCH_WRITERS
//! (writer threads), CITRINE_BENCH_SHADOW=DIR (each device shadowed by a
//! file in DIR), CITRINE_BENCH_SHADOW_SYNC (the shadows written before a
//! write counts instead of from their queues).

#![allow(clippy::unwrap_used)]

use citrine_storage::device::{DeviceConfig, IoMode, Recovered, SavedEntry};
use citrine_storage::{DeviceAddress, Location, StorageEngine, StoreMeta};
use citrine_types::Digest;
use std::time::Instant;

fn digest(seed: u64) -> Digest {
    Digest(citrine_testsupport::digest_bytes(seed))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = std::path::PathBuf::from(args.get(1).cloned().unwrap_or_else(|| {
        std::env::temp_dir()
            .join("citrine-device-bench")
            .display()
            .to_string()
    }));
    let records: u64 = args
        .get(2)
        .and_then(|text| text.parse().ok())
        .unwrap_or(400_000);
    let body_bytes: usize = args
        .get(3)
        .and_then(|text| text.parse().ok())
        .unwrap_or(1500);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let paths = vec![dir.join("bench0.dat"), dir.join("bench1.dat")];
    let per_device = (records * (body_bytes as u64 + 200) / 2) * 2 + (64 << 20);
    let commit = std::env::var_os("CITRINE_BENCH_COMMIT").is_some();
    // CITRINE_BENCH_SHADOW=DIR: each device shadowed by a file in DIR.
    let shadows: Vec<Option<std::path::PathBuf>> = match std::env::var_os("CITRINE_BENCH_SHADOW") {
        Some(shadow_dir) => {
            let shadow_dir = std::path::PathBuf::from(shadow_dir);
            let _ = std::fs::remove_dir_all(&shadow_dir);
            std::fs::create_dir_all(&shadow_dir).unwrap();
            (0..paths.len())
                .map(|index| Some(shadow_dir.join(format!("bench{index}-shadow.dat"))))
                .collect()
        }
        None => Vec::new(),
    };
    let config = |mode: IoMode| DeviceConfig {
        commit_to_device: commit,
        io_mode: mode,
        post_write_queue: 0,
        shadows: shadows.clone(),
        shadow_queue_bytes: match std::env::var_os("CITRINE_BENCH_SHADOW_SYNC") {
            Some(_) => 0,
            None => citrine_storage::device::SHADOW_QUEUE_DEFAULT_BYTES,
        },
        ..DeviceConfig::new("bench", paths.clone(), per_device)
    };

    let engine = DeviceEngine::open(config(IoMode::Buffered)).unwrap();
    engine.cold_start(&|_, _| Recovered::Live, &|_| {});
    let body = vec![0x5Au8; body_bytes];
    let started = Instant::now();
    let writers: u64 = std::env::var("CITRINE_BENCH_WRITERS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(1)
        .max(1);
    let addresses: Vec<(Digest, DeviceAddress)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..writers)
            .map(|writer| {
                let (engine, body) = (&engine, &body);
                scope.spawn(move || {
                    let mut mine = Vec::new();
                    for seed in (writer..records).step_by(writers as usize) {
                        let meta = StoreMeta {
                            generation: 1,
                            life: 0,
                            void_time: 0,
                            last_update_ms: seed,
                            set_name: b"bench",
                        };
                        let location = engine.write(&digest(seed), &meta, body.clone()).unwrap();
                        let address = location.device_address().expect("a device location");
                        mine.push((digest(seed), address));
                    }
                    mine
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|handle| handle.join().unwrap())
            .collect()
    });
    engine.flush_all().unwrap();
    let seconds = started.elapsed().as_secs_f64();
    println!("write (commit-to-device {commit}, {writers} writers): {records} records of {body_bytes} B in {seconds:.2} s = {:.0} records/s, {:.0} MiB/s", records as f64 / seconds, records as f64 * body_bytes as f64 / seconds / 1048576.0);
    let entries: Vec<SavedEntry> = addresses
        .iter()
        .map(|(digest, address)| SavedEntry {
            digest: *digest,
            generation: 1,
            life: 0,
            void_time: 0,
            last_update_ms: 0,
            set: 1,
            address: *address,
        })
        .collect();
    let image = dir.join("bench.index");
    let started = Instant::now();
    engine
        .save_index(&image, &[Vec::new(), b"bench".to_vec()], &entries)
        .unwrap();
    println!(
        "index image save: {records} entries in {:.3} s",
        started.elapsed().as_secs_f64()
    );
    let checkpoint = dir.join("bench.checkpoint");
    let _ = std::fs::remove_file(&checkpoint);
    let started = Instant::now();
    let written = engine.write_checkpoint(&checkpoint).unwrap();
    println!(
        "index checkpoint, built from every sealed block: {} entries, {} blocks read, {} bytes in {:.3} s",
        written.entries,
        written.blocks_read,
        written.bytes,
        started.elapsed().as_secs_f64()
    );
    drop(engine);

    for mode in [IoMode::Buffered, IoMode::Direct] {
        let engine = DeviceEngine::open(config(mode)).unwrap();
        if mode == IoMode::Buffered {
            let started = Instant::now();
            let mut count = 0u64;
            let report = engine.fast_restart(&image, &mut |_, _| {
                count += 1;
                Recovered::Live
            });
            let seconds = started.elapsed().as_secs_f64();
            println!(
                "fast restart: {:?} records in {seconds:.3} s = {:.0} records/s",
                report.map(|report| report.map(|report| report.live)),
                count as f64 / seconds
            );
            let engine = DeviceEngine::open(config(mode)).unwrap();
            let started = Instant::now();
            let report = engine
                .checkpoint_restart(&checkpoint, &|_, _| Recovered::Live)
                .unwrap()
                .unwrap();
            let seconds = started.elapsed().as_secs_f64();
            println!(
                "checkpoint restart: {} records ({} blocks replayed) in {seconds:.3} s = {:.0} records/s",
                report.live,
                report.blocks_replayed,
                report.live as f64 / seconds
            );
        }
        let engine = DeviceEngine::open(config(mode)).unwrap();
        let started = Instant::now();
        let report = engine.cold_start(&|_, _| Recovered::Live, &|_| {});
        let seconds = started.elapsed().as_secs_f64();
        println!(
            "cold start ({mode:?}): {} records in {seconds:.2} s = {:.0} records/s",
            report.live,
            report.records_read as f64 / seconds
        );
        for threads in [1usize, 4] {
            let reads_per_thread = 50_000u64;
            let started = Instant::now();
            std::thread::scope(|scope| {
                for thread in 0..threads {
                    let engine = &engine;
                    let addresses = &addresses;
                    scope.spawn(move || {
                        let mut state = 0x1234_5678u64 + thread as u64;
                        for _ in 0..reads_per_thread {
                            state ^= state << 13;
                            state ^= state >> 7;
                            state ^= state << 17;
                            let (_, address) = addresses[(state % addresses.len() as u64) as usize];
                            let location = Location::device(address);
                            let body = engine.read(&location).unwrap();
                            assert_eq!(body.len(), body_bytes);
                        }
                    });
                }
            });
            let seconds = started.elapsed().as_secs_f64();
            let total = reads_per_thread * threads as u64;
            println!("random reads ({mode:?}, {threads} threads): {total} in {seconds:.2} s = {:.0} reads/s, {:.1} us/read/thread", total as f64 / seconds, seconds * 1e6 / reads_per_thread as f64);
        }
    }
    if std::env::var_os("CITRINE_BENCH_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

use citrine_storage::DeviceEngine;
