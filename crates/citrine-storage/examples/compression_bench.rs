//! Measures storage compression in the device engine: for each setting
//! (none, lz4, zstd at levels 1, 3 and 9) and each kind of data
//! (compressible JSON-like text, incompressible random bytes), in one run,
//! the write rate, the read rate from the device (post-write queue off, page
//! cache warm), the stored bytes and `data_compression_ratio`, and the
//! thread CPU per write and per read. Every combination runs ROUNDS times,
//! the rounds interleaved (a loaded machine drifts); the table gives the
//! median of each figure and the range of the CPU figures. Results go to
//! bench/RESULTS.md.
//!
//!   cargo run --release -p citrine-storage --example compression_bench -- [DIR] [RECORDS] [BODY_BYTES] [ROUNDS]

#![allow(clippy::unwrap_used)]

use citrine_storage::compress::{Algorithm, Compression};
use citrine_storage::device::{DeviceConfig, Recovered};
use citrine_storage::{Location, StorageEngine, StoreMeta};
use citrine_types::Digest;
use std::time::Instant;

fn digest(seed: u64) -> Digest {
    Digest(citrine_testsupport::digest_bytes(seed))
}

/// CPU seconds of the calling thread.
fn thread_cpu() -> f64 {
    let text = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    let fields: Vec<&str> = text
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks = |index: usize| {
        fields
            .get(index)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the stat line (11 and 12 after the name).
    (ticks(11) + ticks(12)) / 100.0
}

struct Xorshift(u64);

impl Xorshift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// A JSON-like document of about `length` bytes: repeated field names,
/// varying numbers and words (compresses about as user profiles do).
fn compressible(seed: u64, length: usize) -> Vec<u8> {
    let words = [
        "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
    ];
    let mut random = Xorshift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut text = String::from("{");
    let mut field = 0;
    while text.len() < length {
        let value = random.next();
        text.push_str(&format!(
            "\"field_{field}\":{{\"id\":{},\"name\":\"{}-{}\",\"score\":{}.{},\"active\":{}}},",
            value % 100_000,
            words[(value >> 20) as usize % words.len()],
            value % 977,
            (value >> 8) % 100,
            (value >> 16) % 10,
            value & 1 == 0
        ));
        field += 1;
    }
    let mut bytes = text.into_bytes();
    bytes.truncate(length);
    bytes
}

fn incompressible(seed: u64, length: usize) -> Vec<u8> {
    let mut random = Xorshift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    (0..length).map(|_| random.next() as u8).collect()
}

struct Run {
    setting: String,
    data: &'static str,
    writes_per_s: f64,
    write_cpu_us: f64,
    reads_per_s: f64,
    read_cpu_us: f64,
    ratio: f64,
    used_bytes: u64,
}

fn run(
    dir: &std::path::Path,
    compression: Compression,
    data: &'static str,
    records: u64,
    body_bytes: usize,
) -> Run {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let file_size = records * (body_bytes as u64 + 256) + (64 << 20);
    let engine = citrine_storage::DeviceEngine::open(DeviceConfig {
        post_write_queue: 0,
        compression,
        ..DeviceConfig::new("bench", vec![dir.join("bench.dat")], file_size)
    })
    .unwrap();
    engine.cold_start(&|_, _| Recovered::Live, &|_| {});
    let bodies: Vec<Vec<u8>> = (0..1024u64)
        .map(|seed| match data {
            "compressible" => compressible(seed, body_bytes),
            _ => incompressible(seed, body_bytes),
        })
        .collect();
    let (started, cpu) = (Instant::now(), thread_cpu());
    let mut locations: Vec<Location> = Vec::with_capacity(records as usize);
    for seed in 0..records {
        let meta = StoreMeta {
            generation: 1,
            set_name: b"bench",
            ..StoreMeta::default()
        };
        let body = bodies[(seed % 1024) as usize].clone();
        locations.push(engine.write(&digest(seed), &meta, body).unwrap());
    }
    engine.flush_all().unwrap();
    let write_seconds = started.elapsed().as_secs_f64();
    let write_cpu = thread_cpu() - cpu;
    let mut random = Xorshift(7);
    let reads = records;
    let (started, cpu) = (Instant::now(), thread_cpu());
    let mut checked = 0usize;
    for _ in 0..reads {
        let seed = random.next() % records;
        let body = engine.read(&locations[seed as usize]).unwrap();
        checked += body.len();
        assert_eq!(body.len(), body_bytes);
    }
    let read_seconds = started.elapsed().as_secs_f64();
    let read_cpu = thread_cpu() - cpu;
    assert_eq!(checked, reads as usize * body_bytes);
    let ratio = engine.compression_stats.ratio();
    let used_bytes = engine.used_bytes();
    let setting = match compression.algorithm {
        Algorithm::Zstd => format!("zstd {}", compression.level),
        other => other.name().to_owned(),
    };
    Run {
        setting,
        data,
        writes_per_s: records as f64 / write_seconds,
        write_cpu_us: write_cpu * 1e6 / records as f64,
        reads_per_s: reads as f64 / read_seconds,
        read_cpu_us: read_cpu * 1e6 / reads as f64,
        ratio,
        used_bytes,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = std::path::PathBuf::from(args.get(1).cloned().unwrap_or_else(|| {
        std::env::temp_dir()
            .join("citrine-compression-bench")
            .display()
            .to_string()
    }));
    let records: u64 = args
        .get(2)
        .and_then(|text| text.parse().ok())
        .unwrap_or(200_000);
    let body_bytes: usize = args
        .get(3)
        .and_then(|text| text.parse().ok())
        .unwrap_or(1500);
    let settings = [
        Compression::default(),
        Compression {
            algorithm: Algorithm::Lz4,
            level: 0,
        },
        Compression {
            algorithm: Algorithm::Zstd,
            level: 1,
        },
        Compression {
            algorithm: Algorithm::Zstd,
            level: 3,
        },
        Compression {
            algorithm: Algorithm::Zstd,
            level: 9,
        },
    ];
    let rounds: usize = args.get(4).and_then(|text| text.parse().ok()).unwrap_or(3);
    let combinations: Vec<(&'static str, Compression)> = ["compressible", "incompressible"]
        .into_iter()
        .flat_map(|data| settings.into_iter().map(move |setting| (data, setting)))
        .collect();
    let mut results: Vec<Vec<Run>> = combinations.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds {
        for (index, (data, setting)) in combinations.iter().enumerate() {
            results[index].push(run(&dir, *setting, data, records, body_bytes));
        }
    }
    println!("{records} records of {body_bytes} bytes, one writer and one reader thread, {rounds} rounds");
    println!("| data | compression | writes/s | write CPU µs [range] | reads/s | read CPU µs [range] | data_compression_ratio | device_used_bytes |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for runs in &results {
        let figure = |read: &dyn Fn(&Run) -> f64| -> (f64, f64, f64) {
            let mut values: Vec<f64> = runs.iter().map(read).collect();
            values.sort_by(f64::total_cmp);
            (
                values[values.len() / 2],
                values[0],
                values[values.len() - 1],
            )
        };
        let (write_cpu, write_low, write_high) = figure(&|run| run.write_cpu_us);
        let (read_cpu, read_low, read_high) = figure(&|run| run.read_cpu_us);
        println!(
            "| {} | {} | {:.0} | {write_cpu:.2} [{write_low:.2}-{write_high:.2}] | {:.0} | {read_cpu:.2} [{read_low:.2}-{read_high:.2}] | {:.3} | {} |",
            runs[0].data,
            runs[0].setting,
            figure(&|run| run.writes_per_s).0,
            figure(&|run| run.reads_per_s).0,
            runs[0].ratio,
            runs[0].used_bytes
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
