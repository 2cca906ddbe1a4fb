//! Measures the device engine against the disk under it (issue 44 point
//! 7): the sustained write rate of a data set written and synced (through
//! the page cache, then with `O_DIRECT` to a second file), and
//! random reads that miss the page cache, through the page cache and with
//! `O_DIRECT`, counting the device reads each read costs. `bench/storage.sh`
//! runs it beside `dd`'s sequential write bandwidth on the same directory.
//!
//! Reads miss the page cache because the files' pages are dropped
//! (`fdatasync` then `posix_fadvise(DONTNEED)`) right before each read pass,
//! and each pass reads records of distinct 4 KiB pages in random order, so
//! no read finds a page an earlier read of the pass brought in. Counted per
//! read: the engine's `reads_from_device`, the process's read syscalls and
//! bytes read from storage (`/proc/self/io` `syscr`, `read_bytes`), and the
//! reads the block device completed (`/sys/block/$BLOCK_DEV/stat`, the
//! whole machine's, so other jobs add to it).
//!
//!   cargo run --release -p citrine-storage --example disk_bench -- DIR [DATA_MIB] [BODY_BYTES] [READS]

#![allow(clippy::unwrap_used)]
// One `posix_fadvise` call (see `drop_pages`).
#![allow(unsafe_code)]

use citrine_storage::device::{DeviceConfig, IoMode, Recovered};
use citrine_storage::{DeviceAddress, DeviceEngine, Location, StorageEngine, StoreMeta};
use citrine_types::Digest;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

fn digest(seed: u64) -> Digest {
    Digest(citrine_testsupport::digest_bytes(seed))
}

fn arg<T: std::str::FromStr>(args: &[String], index: usize, default: T) -> T {
    args.get(index)
        .and_then(|text| text.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = PathBuf::from(args.get(1).expect("DIR"));
    let data_mib: u64 = arg(&args, 2, 2048);
    let body_bytes: usize = arg(&args, 3, 1500);
    let reads: usize = arg(&args, 4, 20_000);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let records = data_mib * 1_048_576 / body_bytes as u64;
    let path = dir.join("disk_bench.dat");
    let file_size = records * (body_bytes as u64 + 256) + (64 << 20);
    let config = |mode: IoMode| DeviceConfig {
        io_mode: mode,
        post_write_queue: 0,
        ..DeviceConfig::new("bench", vec![path.clone()], file_size)
    };
    let addresses = write_pass(&config(IoMode::Buffered), records, body_bytes);
    let direct = DeviceConfig {
        paths: vec![dir.join("disk_bench_direct.dat")],
        ..config(IoMode::Direct)
    };
    write_pass(&direct, records, body_bytes);
    let _ = std::fs::remove_file(&direct.paths[0]);
    let pages = one_record_per_page(&addresses, reads);
    for mode in [IoMode::Buffered, IoMode::Direct] {
        let engine = DeviceEngine::open(config(mode)).unwrap();
        engine.cold_start(&|_, _| Recovered::Live, &|_| {});
        drop_pages(&path);
        read_pass(&engine, &pages, &format!("{mode:?}, page cache dropped"));
        if mode == IoMode::Buffered {
            read_pass(&engine, &pages, "Buffered, same records again (cached)");
        }
    }
    if std::env::var_os("CITRINE_BENCH_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Writes `records` bodies of `body_bytes` with one writer and syncs;
/// prints the rate from the first write to the end of the sync.
fn write_pass(config: &DeviceConfig, records: u64, body_bytes: usize) -> Vec<DeviceAddress> {
    let engine = DeviceEngine::open(config.clone()).unwrap();
    engine.cold_start(&|_, _| Recovered::Live, &|_| {});
    let body = vec![0x5Au8; body_bytes];
    let cpu_before = cpu_seconds();
    let started = Instant::now();
    let addresses: Vec<DeviceAddress> = (0..records)
        .map(|seed| {
            let meta = StoreMeta {
                generation: 1,
                last_update_ms: seed,
                set_name: b"bench",
                ..StoreMeta::default()
            };
            let location = engine.write(&digest(seed), &meta, body.clone()).unwrap();
            location.device_address().expect("a device location")
        })
        .collect();
    engine.flush_all().unwrap();
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu_before;
    let blocks = stat(&engine, "device_wblocks_written");
    let device_mib = blocks as f64 * f64::from(config.write_block_size) / 1_048_576.0;
    println!(
        "engine write ({:?}): {records} records of {body_bytes} B in {seconds:.2} s (synced), {cpu:.2} CPU s = {:.0} records/s, bodies {:.1} MiB/s, write blocks {:.1} MiB/s",
        config.io_mode,
        records as f64 / seconds,
        records as f64 * body_bytes as f64 / seconds / 1_048_576.0,
        device_mib / seconds
    );
    addresses
}

/// At most `count` addresses, one per 4 KiB page of the file, shuffled.
fn one_record_per_page(addresses: &[DeviceAddress], count: usize) -> Vec<DeviceAddress> {
    let page_of = |address: &DeviceAddress| address.rblock() * 128 / 4096;
    let mut last_page = None;
    let mut chosen: Vec<DeviceAddress> = Vec::new();
    let mut sorted = addresses.to_vec();
    sorted.sort_unstable_by_key(|address| address.rblock());
    for address in sorted {
        let first = page_of(&address);
        let end = (address.rblock() * 128 + address.bytes() - 1) / 4096;
        if last_page.is_none_or(|last| first > last) {
            chosen.push(address);
            last_page = Some(end);
        }
    }
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for index in (1..chosen.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        chosen.swap(index, (state % (index as u64 + 1)) as usize);
    }
    chosen.truncate(count);
    chosen
}

/// Writes back and drops the file's pages from the page cache.
fn drop_pages(path: &Path) {
    let file = std::fs::File::open(path).unwrap();
    file.sync_data().unwrap();
    // SAFETY: a valid descriptor; the call only advises the kernel.
    let code = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(code, 0, "posix_fadvise");
}

/// Reads every address once and prints the time and counts per read.
fn read_pass(engine: &DeviceEngine, addresses: &[DeviceAddress], label: &str) {
    let device_before = stat(engine, "device_reads_device");
    let io_before = proc_io();
    let block_before = block_reads();
    let started = Instant::now();
    for address in addresses {
        engine.read(&Location::device(*address)).unwrap();
    }
    let seconds = started.elapsed().as_secs_f64();
    let (syscr, read_bytes) = proc_io();
    let per_read = |delta: u64| delta as f64 / addresses.len() as f64;
    println!(
        "random reads ({label}): {} in {seconds:.2} s = {:.0} reads/s, {:.1} us/read; per read: engine device reads {:.3}, read syscalls {:.3}, bytes from storage {:.0}, block-device reads {}",
        addresses.len(),
        addresses.len() as f64 / seconds,
        seconds * 1e6 / addresses.len() as f64,
        per_read(stat(engine, "device_reads_device") - device_before),
        per_read(syscr - io_before.0),
        per_read(read_bytes - io_before.1),
        match (block_before, block_reads()) {
            (Some(before), Some(after)) => format!("{:.3} (whole machine)", per_read(after - before)),
            _ => "not counted (set BLOCK_DEV)".to_owned(),
        }
    );
}

/// A counter of the engine's statistics.
fn stat(engine: &DeviceEngine, name: &str) -> u64 {
    engine
        .info_pairs()
        .into_iter()
        .find(|(key, _)| key == name)
        .and_then(|(_, value)| value.parse().ok())
        .unwrap_or_else(|| panic!("no statistic {name}"))
}

/// This process's read syscalls and bytes read from storage.
fn proc_io() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/self/io").unwrap();
    let field = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or(0)
    };
    (field("syscr:"), field("read_bytes:"))
}

/// CPU seconds (user + system) this process has used.
fn cpu_seconds() -> f64 {
    let text = std::fs::read_to_string("/proc/self/stat").unwrap();
    // Fields after the command's closing parenthesis; utime and stime are
    // the 14th and 15th of the line, in clock ticks (100 a second).
    let rest = &text[text.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

/// Reads completed by the block device `$BLOCK_DEV` (e.g. `vda`).
fn block_reads() -> Option<u64> {
    let device = std::env::var("BLOCK_DEV").ok()?;
    let text = std::fs::read_to_string(format!("/sys/block/{device}/stat")).ok()?;
    text.split_whitespace().next()?.parse().ok()
}
