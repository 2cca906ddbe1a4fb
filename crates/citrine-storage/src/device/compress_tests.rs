//! Storage compression in the device engine: compressed and raw records
//! side by side across run-time setting changes, cold and fast restarts,
//! defragmentation, a device file written by the version without
//! compression, and corrupt compressed bodies read as errors.

#![allow(clippy::unwrap_used)]

use super::tests::{digest, life_of, temp_dir, FakeIndex};
use super::*;
use crate::compress::Algorithm;
use std::io::Read;

fn config(dir: &std::path::Path, compression: Compression) -> DeviceConfig {
    DeviceConfig {
        write_block_size: 64 * 1024,
        compression,
        ..DeviceConfig::new(
            "test",
            vec![dir.join("dev0.dat")],
            (1 << 20) + 32 * (64 * 1024),
        )
    }
}

const LZ4: Compression = Compression {
    algorithm: Algorithm::Lz4,
    level: 0,
};
const ZSTD: Compression = Compression {
    algorithm: Algorithm::Zstd,
    level: 5,
};

/// Text that compresses well.
fn compressible(seed: u64) -> Vec<u8> {
    format!("compressible record {seed}, ")
        .repeat(20 + (seed % 13) as usize)
        .into_bytes()
}

/// Bytes that do not compress (xorshift).
fn incompressible(seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..300 + (seed % 200) as usize)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn body_of(seed: u64) -> Vec<u8> {
    if seed.is_multiple_of(3) {
        incompressible(seed)
    } else {
        compressible(seed)
    }
}

fn read_all(
    engine: &DeviceEngine,
    index: &FakeIndex,
    expected: &dyn Fn(u64) -> Vec<u8>,
    seeds: std::ops::Range<u64>,
) {
    let entries = index.entries.lock();
    for seed in seeds {
        let (_, location) = entries.get(&digest(seed)).unwrap();
        assert_eq!(
            engine.read(location).unwrap().as_ref(),
            &expected(seed)[..],
            "record {seed}"
        );
    }
}

/// The flags of the stored record at `location`.
fn stored_flags(engine: &DeviceEngine, location: &Location) -> u8 {
    let address = location.device_address().unwrap();
    let (block, offset) = engine.locate(address).unwrap();
    let bytes = engine.devices[0]
        .io
        .read_at(
            engine.block_offset(block) + offset as u64,
            address.bytes() as usize,
        )
        .unwrap();
    format::decode_record(&bytes, None).unwrap().header.flags
}

/// Writes 300 records in three settings (LZ4, then zstd, then none),
/// one in three incompressible.
fn write_mixed(engine: &DeviceEngine, index: &FakeIndex) {
    for (part, setting) in [LZ4, ZSTD, Compression::default()].into_iter().enumerate() {
        engine.set_compression(setting);
        for seed in part as u64 * 100..(part as u64 + 1) * 100 {
            index.put(engine, digest(seed), 1, body_of(seed));
        }
    }
}

#[test]
fn compressed_and_raw_records_coexist_across_setting_changes_and_restarts() {
    let dir = temp_dir("compress-restart");
    let image = dir.join("test.index");
    let index = FakeIndex::default();
    {
        let engine = DeviceEngine::open(config(&dir, LZ4)).unwrap();
        engine.cold_start(&index.sink(), &|_| {});
        write_mixed(&engine, &index);
        // From the write buffer and the post-write queue.
        read_all(&engine, &index, &body_of, 0..300);
        engine.flush_tick().unwrap();
        let stats = &engine.compression_stats;
        assert_eq!(
            stats.compressed_records.load(Ordering::Relaxed),
            // Compressible ones written under LZ4 or zstd.
            (0..200u64).filter(|seed| seed % 3 != 0).count() as u64
        );
        assert!(stats.ratio() < 0.8, "ratio {}", stats.ratio());
        let entries = index.entries.lock();
        let flags = |seed: u64| stored_flags(&engine, &entries[&digest(seed)].1);
        assert_eq!(flags(1), format::FLAG_LZ4);
        assert_eq!(flags(101), format::FLAG_ZSTD);
        assert_eq!(flags(201), 0, "written with compression none");
        assert_eq!(flags(3), 0, "incompressible: stored raw");
        // A compressed record takes fewer read blocks than its body.
        let rblocks = entries[&digest(1)].1.device_address().unwrap().rblocks() as usize;
        assert!(rblocks < format::rblocks_for(1, compressible(1).len()));
        let saved: Vec<SavedEntry> = entries
            .iter()
            .map(|(digest, (generation, location))| SavedEntry {
                digest: *digest,
                generation: *generation,
                life: life_of(*generation),
                void_time: 0,
                last_update_ms: 1,
                set: 0,
                address: location.device_address().unwrap(),
            })
            .collect();
        engine.save_index(&image, &[b"s".to_vec()], &saved).unwrap();
    }
    // Fast restart, opened with another setting: every record reads back.
    let fast = FakeIndex::default();
    let engine = DeviceEngine::open(config(&dir, ZSTD)).unwrap();
    let sink = fast.sink();
    let report = engine
        .fast_restart(&image, &mut |digest, record| sink(digest, record))
        .unwrap()
        .unwrap();
    assert_eq!(report.live, 300);
    read_all(&engine, &fast, &body_of, 0..300);
    drop(engine);
    // Cold start: the scan checks compressed records by their stored bytes.
    let cold = FakeIndex::default();
    let engine = DeviceEngine::open(config(&dir, Compression::default())).unwrap();
    let report = engine.cold_start(&cold.sink(), &|_| {});
    assert_eq!(
        (report.live, report.corrupt_records),
        (300, 0),
        "{report:?}"
    );
    read_all(&engine, &cold, &body_of, 0..300);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn defrag_moves_compressed_records_intact() {
    let dir = temp_dir("compress-defrag");
    let index = FakeIndex::default();
    let engine = DeviceEngine::open(config(&dir, ZSTD)).unwrap();
    engine.cold_start(&index.sink(), &|_| {});
    // Three rounds rewrite three records in four: the first round's blocks
    // keep a quarter of their bytes live, which defrag moves.
    let expected = |seed: u64| {
        if seed.is_multiple_of(4) {
            body_of(seed)
        } else {
            body_of(seed + 3000)
        }
    };
    for round in 0..4u64 {
        for seed in (0..400u64).filter(|seed| round == 0 || seed % 4 != 0) {
            index.put(
                &engine,
                digest(seed),
                round as u16 + 1,
                body_of(seed + round * 1000),
            );
        }
        engine.flush_tick().unwrap();
        while engine.defrag_step(&index).worked {}
    }
    assert!(engine.stats.defrag_records_moved.load(Ordering::Relaxed) > 0);
    read_all(&engine, &index, &expected, 0..400);
    drop(engine);
    let cold = FakeIndex::default();
    let engine = DeviceEngine::open(config(&dir, ZSTD)).unwrap();
    assert_eq!(engine.cold_start(&cold.sink(), &|_| {}).live, 400);
    read_all(&engine, &cold, &expected, 0..400);
    let _ = std::fs::remove_dir_all(&dir);
}

/// What the fixture generator wrote, before compression existed.
fn fixture_body(seed: u64) -> Vec<u8> {
    format!("record {seed} of the version 1 fixture; ")
        .repeat(1 + (seed % 20) as usize)
        .into_bytes()
}

fn unpack_fixture(name: &str, to: &std::path::Path) {
    let packed = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src/device/testdata")
            .join(format!("{name}.gz")),
    )
    .unwrap();
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(&packed[..])
        .read_to_end(&mut bytes)
        .unwrap();
    std::fs::write(to.join(name), bytes).unwrap();
}

/// The fixture: 200 records (the first 20 rewritten, the last 10 deleted)
/// written and saved for a fast restart by the engine before compression.
fn check_fixture(engine: &DeviceEngine, index: &FakeIndex) {
    let entries = index.entries.lock();
    assert_eq!(entries.len(), 190);
    for seed in 0..190u64 {
        let (generation, location) = &entries[&digest(seed)];
        let expected = if seed < 20 {
            (2, fixture_body(seed + 1000))
        } else {
            (1, fixture_body(seed))
        };
        assert_eq!(*generation, expected.0);
        assert_eq!(engine.read(location).unwrap().as_ref(), &expected.1[..]);
    }
}

#[test]
fn a_device_written_before_compression_reads_back_then_takes_compressed_records() {
    let dir = temp_dir("compress-v1");
    unpack_fixture("v1.dat", &dir);
    unpack_fixture("v1.index", &dir);
    let open = || {
        DeviceEngine::open(DeviceConfig {
            write_block_size: 64 * 1024,
            compression: LZ4,
            ..DeviceConfig::new("test", vec![dir.join("v1.dat")], (1 << 20) + 8 * 64 * 1024)
        })
        .unwrap()
    };
    let fast = FakeIndex::default();
    {
        let engine = open();
        let sink = fast.sink();
        let report = engine
            .fast_restart(&dir.join("v1.index"), &mut |digest, record| {
                sink(digest, record)
            })
            .unwrap()
            .unwrap();
        assert_eq!(report.live, 190);
        check_fixture(&engine, &fast);
        for seed in 500..540u64 {
            fast.put(&engine, digest(seed), 1, compressible(seed));
        }
        engine.flush_tick().unwrap();
    }
    let cold = FakeIndex::default();
    let engine = open();
    let report = engine.cold_start(&cold.sink(), &|_| {});
    assert_eq!(report.live, 230, "{report:?}");
    {
        let mut entries = cold.entries.lock();
        let new: Vec<_> = (500..540u64)
            .map(|seed| entries.remove(&digest(seed)).unwrap())
            .collect();
        for (offset, (_, location)) in new.iter().enumerate() {
            assert_eq!(stored_flags(&engine, location), format::FLAG_LZ4);
            assert_eq!(
                engine.read(location).unwrap().as_ref(),
                &compressible(500 + offset as u64)[..]
            );
        }
    }
    check_fixture(&engine, &cold);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Writes `stored` as a record body flagged `flag` (a valid record, so its
/// checksums pass) and reads it back.
fn read_crafted(
    engine: &DeviceEngine,
    seed: u64,
    stored: &[u8],
    flag: u8,
) -> Result<Vec<u8>, StorageError> {
    let meta = StoreMeta {
        generation: 1,
        set_name: b"s",
        ..StoreMeta::default()
    };
    let address = engine
        .write_record(&digest(seed), &meta, stored, flag)
        .unwrap();
    let location = Location::device(address);
    let result = engine.read(&location).map(|body| body.into_owned());
    engine.release(location);
    result
}

/// Corrupt compressed bodies whose checksums are right (written so): every
/// read is an error or a body of the declared length, never a panic, and
/// a declared length beyond a write block is refused before decompressing.
#[test]
fn corrupt_compressed_bodies_are_errors() {
    let dir = temp_dir("compress-corrupt");
    let engine = DeviceEngine::open(config(&dir, Compression::default())).unwrap();
    engine.cold_start(
        &|_: &Digest, _: &RecoveredRecord<'_>| Recovered::Live,
        &|_| {},
    );
    let original = compressible(7);
    let mut errors = 0;
    let mut seed = 0;
    for setting in [LZ4, ZSTD] {
        let flag = format::compression_flag(setting.algorithm);
        let good = crate::compress::compress(setting, &original).unwrap();
        assert_eq!(read_crafted(&engine, 0, &good, flag).unwrap(), original);
        let mut noise = 0x1234_5678_9ABC_DEF0u64 ^ u64::from(flag);
        for round in 0..300usize {
            seed += 1;
            let mut bad = good.clone();
            noise ^= noise << 13;
            noise ^= noise >> 7;
            noise ^= noise << 17;
            let at = 4 + (noise as usize % (bad.len() - 4));
            bad[at] ^= (noise >> 32) as u8 | 1;
            if round % 3 == 0 {
                bad.truncate(at.max(1));
            }
            match read_crafted(&engine, seed, &bad, flag) {
                Ok(body) => assert_eq!(body.len(), original.len()),
                Err(StorageError::Corrupt(_)) => errors += 1,
                Err(other) => panic!("unexpected {other:?}"),
            }
        }
        let mut huge = good.clone();
        huge[..4].copy_from_slice(&(64u32 * 1024 + 1).to_le_bytes());
        let error = read_crafted(&engine, 9999, &huge, flag).unwrap_err();
        assert!(format!("{error}").contains("more than"), "{error}");
    }
    assert!(errors > 100, "only {errors} corruptions detected");
    let both = read_crafted(
        &engine,
        10_000,
        &[0; 16],
        format::FLAG_LZ4 | format::FLAG_ZSTD,
    );
    assert!(matches!(both, Err(StorageError::Corrupt(_))));
    assert!(engine.stats.read_errors.load(Ordering::Relaxed) >= errors);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The size check counts the uncompressed body (as the reference): a body
/// that only fits a write block compressed is refused.
#[test]
fn the_uncompressed_size_is_checked() {
    let dir = temp_dir("compress-size");
    let engine = DeviceEngine::open(config(&dir, ZSTD)).unwrap();
    engine.cold_start(
        &|_: &Digest, _: &RecoveredRecord<'_>| Recovered::Live,
        &|_| {},
    );
    let meta = StoreMeta::default();
    let too_big = vec![b'a'; 64 * 1024];
    assert_eq!(
        engine.write(&digest(1), &meta, too_big).unwrap_err(),
        StorageError::TooBig
    );
    let fits = vec![b'a'; 60 * 1024];
    let location = engine.write(&digest(2), &meta, fits.clone()).unwrap();
    assert!(location.device_address().unwrap().rblocks() < 4);
    assert_eq!(engine.read(&location).unwrap().as_ref(), &fits[..]);
    let _ = std::fs::remove_dir_all(&dir);
}
