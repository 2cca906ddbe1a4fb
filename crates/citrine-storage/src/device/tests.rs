#![allow(clippy::unwrap_used)]

use super::*;
use parking_lot::Mutex as PlMutex;
use std::collections::HashMap;

/// A stand-in for the primary index.
#[derive(Default)]
pub(super) struct FakeIndex {
    pub(super) entries: PlMutex<HashMap<Digest, (u16, Location)>>,
}

impl Relocator for FakeIndex {
    fn relocate(
        &self,
        digest: &Digest,
        from: &Location,
        copy: &mut dyn FnMut() -> Result<Location, StorageError>,
    ) -> bool {
        let mut entries = self.entries.lock();
        match entries.get_mut(digest) {
            Some((_, location)) if location == from => match copy() {
                Ok(new) => {
                    *location = new;
                    true
                }
                Err(_) => false,
            },
            _ => false,
        }
    }
}

impl FakeIndex {
    pub(super) fn put(
        &self,
        engine: &DeviceEngine,
        digest: Digest,
        generation: u16,
        body: Vec<u8>,
    ) {
        let meta = StoreMeta {
            generation,
            life: life_of(generation),
            void_time: 0,
            last_update_ms: 1,
            set_name: b"s",
        };
        let location = engine.write(&digest, &meta, body).unwrap();
        if let Some((_, old)) = self.entries.lock().insert(digest, (generation, location)) {
            engine.release(old);
        }
    }
    pub(super) fn delete(&self, engine: &DeviceEngine, digest: Digest) {
        engine
            .write_tombstone(&digest, &StoreMeta::default())
            .unwrap();
        if let Some((_, old)) = self.entries.lock().remove(&digest) {
            engine.release(old);
        }
    }
    pub(super) fn sink(&self) -> impl Fn(&Digest, &RecoveredRecord<'_>) -> Recovered + Sync + '_ {
        move |digest, record| {
            assert_eq!(record.life, life_of(record.generation), "the life survives");
            self.entries.lock().insert(
                *digest,
                (record.generation, Location::device(record.address)),
            );
            Recovered::Live
        }
    }
}

/// The life the fake index gives a record of `generation`, so that a
/// restart can check the life came back with the generation.
pub(super) fn life_of(generation: u16) -> u16 {
    generation.wrapping_mul(3) % 1024
}

pub(super) fn digest(seed: u64) -> Digest {
    Digest(citrine_testsupport::digest_bytes(seed))
}

pub(super) fn temp_dir(name: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("citrine-storage-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path).unwrap();
    path
}

fn config(dir: &std::path::Path, devices: usize) -> DeviceConfig {
    let paths = (0..devices)
        .map(|index| dir.join(format!("dev{index}.dat")))
        .collect();
    DeviceConfig {
        write_block_size: 64 * 1024,
        ..DeviceConfig::new("test", paths, (1 << 20) + 64 * (64 * 1024))
    }
}

pub(super) fn body(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|index| (seed as usize + index) as u8)
        .collect()
}

#[test]
fn write_read_and_cold_restart_keep_the_newest_copy() {
    let dir = temp_dir("cold");
    let index = FakeIndex::default();
    {
        let engine = DeviceEngine::open(config(&dir, 2)).unwrap();
        engine.cold_start(&index.sink(), &|_| {});
        for seed in 0..500u64 {
            index.put(&engine, digest(seed), 1, body(seed, 200));
        }
        for seed in 0..100u64 {
            index.put(&engine, digest(seed), 2, body(seed + 1000, 300));
        }
        for seed in 400..450u64 {
            index.delete(&engine, digest(seed));
        }
        // Recent records are served from memory.
        let (_, location) = index
            .entries
            .lock()
            .get(&digest(7))
            .map(|(generation, location)| {
                (
                    *generation,
                    Location::device(location.device_address().unwrap()),
                )
            })
            .unwrap();
        assert_eq!(
            engine.read(&location).unwrap().as_ref(),
            &body(1007, 300)[..]
        );
        engine.flush_tick().unwrap();
    }
    let recovered = FakeIndex::default();
    let engine = DeviceEngine::open(config(&dir, 2)).unwrap();
    let report = engine.cold_start(&recovered.sink(), &|_| {});
    assert_eq!(report.live, 450, "{report:?}");
    assert_eq!(report.tombstones, 50);
    let entries = recovered.entries.lock();
    for seed in 0..500u64 {
        let entry = entries.get(&digest(seed));
        if (400..450).contains(&seed) {
            assert!(entry.is_none(), "deleted record {seed} came back");
            continue;
        }
        let (generation, location) = entry.unwrap();
        let expected = if seed < 100 {
            (2, body(seed + 1000, 300))
        } else {
            (1, body(seed, 200))
        };
        assert_eq!(*generation, expected.0);
        assert_eq!(engine.read(location).unwrap().as_ref(), &expected.1[..]);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn defrag_reclaims_blocks_and_keeps_records() {
    let dir = temp_dir("defrag");
    let index = FakeIndex::default();
    let engine = DeviceEngine::open(config(&dir, 1)).unwrap();
    engine.cold_start(&index.sink(), &|_| {});
    // 64 blocks of 64 KiB; rewrite 100 records of ~2 KiB many times: without
    // defrag this would need far more than 64 blocks.
    for round in 0..60u64 {
        for seed in 0..100u64 {
            index.put(
                &engine,
                digest(seed),
                round as u16 + 1,
                body(seed + round, 2000),
            );
        }
        engine.flush_tick().unwrap();
        while engine.defrag_step(&index).worked {}
        engine.flush_tick().unwrap();
    }
    assert!(engine.stats.defrag_blocks.load(Ordering::Relaxed) > 0);
    assert!(
        engine.available_pct() > 50,
        "available {}",
        engine.available_pct()
    );
    for seed in 0..100u64 {
        let entries = index.entries.lock();
        let (_, location) = entries.get(&digest(seed)).unwrap();
        assert_eq!(
            engine.read(location).unwrap().as_ref(),
            &body(seed + 59, 2000)[..]
        );
    }
    // A cold restart after defrag sees the same records.
    engine.flush_all().unwrap();
    drop(engine);
    let recovered = FakeIndex::default();
    let engine = DeviceEngine::open(config(&dir, 1)).unwrap();
    let report = engine.cold_start(&recovered.sink(), &|_| {});
    assert_eq!(report.live, 100);
    for seed in 0..100u64 {
        let entries = recovered.entries.lock();
        let (generation, location) = entries.get(&digest(seed)).unwrap();
        assert_eq!(*generation, 60);
        assert_eq!(
            engine.read(location).unwrap().as_ref(),
            &body(seed + 59, 2000)[..]
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `stop-writes-used-pct` stops client writes by live bytes, whatever the
/// free blocks; `evict-used-pct` gives nsup its threshold.
#[test]
fn stop_writes_by_used_pct_and_evict_threshold() {
    let dir = temp_dir("usedpct");
    let engine = DeviceEngine::open(DeviceConfig {
        stop_writes_used_pct: 30,
        evict_used_pct: 20,
        stop_writes_avail_pct: 0,
        ..config(&dir, 1)
    })
    .unwrap();
    let index = FakeIndex::default();
    engine.cold_start(&index.sink(), &|_| {});
    assert_eq!(
        engine.evict_threshold_bytes(),
        Some(engine.total_bytes() / 100 * 20)
    );
    let mut written = 0u64;
    while !engine.stop_writes() {
        let meta = StoreMeta {
            generation: 1,
            ..StoreMeta::default()
        };
        let location = engine
            .write(&digest(written), &meta, body(written, 4000))
            .unwrap();
        index.entries.lock().insert(digest(written), (1, location));
        written += 1;
        assert!(written < 100_000);
    }
    assert!(engine.used_pct() >= 30 && engine.available_pct() > 50);
    for seed in 0..written / 2 {
        index.delete(&engine, digest(seed));
    }
    assert!(!engine.stop_writes(), "used {}%", engine.used_pct());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn out_of_space_then_recovers_after_deletes() {
    let dir = temp_dir("space");
    let index = FakeIndex::default();
    let engine = DeviceEngine::open(DeviceConfig {
        stop_writes_avail_pct: 10,
        ..config(&dir, 1)
    })
    .unwrap();
    engine.cold_start(&index.sink(), &|_| {});
    let mut written = 0u64;
    loop {
        let meta = StoreMeta {
            generation: 1,
            ..StoreMeta::default()
        };
        match engine.write(&digest(written), &meta, body(written, 4000)) {
            Ok(location) => {
                index.entries.lock().insert(digest(written), (1, location));
                written += 1;
            }
            Err(StorageError::OutOfSpace) => break,
            Err(other) => panic!("{other}"),
        }
        assert!(written < 100_000);
    }
    assert!(engine.stop_writes());
    for seed in 0..written {
        if seed % 4 != 0 {
            index.delete(&engine, digest(seed));
        }
    }
    for _ in 0..200 {
        engine.flush_tick().unwrap();
        engine.defrag_step(&index);
    }
    engine.flush_tick().unwrap();
    assert!(
        !engine.stop_writes(),
        "available {}",
        engine.available_pct()
    );
    index.put(&engine, digest(1_000_000), 1, body(1, 4000));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn torn_block_is_skipped_not_fatal() {
    let dir = temp_dir("torn");
    let index = FakeIndex::default();
    {
        let engine = DeviceEngine::open(config(&dir, 1)).unwrap();
        engine.cold_start(&index.sink(), &|_| {});
        for seed in 0..200u64 {
            index.put(&engine, digest(seed), 1, body(seed, 1000));
        }
        engine.flush_all().unwrap();
    }
    // Corrupt the middle of block 0 and the header of block 1 (records after
    // the damage in block 0 are found again by resynchronising).
    let path = dir.join("dev0.dat");
    let mut bytes = std::fs::read(&path).unwrap();
    let block0 = RESERVED_BYTES as usize;
    for byte in &mut bytes[block0 + 5000..block0 + 5100] {
        *byte ^= 0x5A;
    }
    let block1 = block0 + 64 * 1024;
    bytes[block1 + 10] ^= 0xFF;
    std::fs::write(&path, &bytes).unwrap();
    let recovered = FakeIndex::default();
    let engine = DeviceEngine::open(config(&dir, 1)).unwrap();
    let report = engine.cold_start(&recovered.sink(), &|_| {});
    assert!(
        report.corrupt_records >= 1 && report.corrupt_blocks == 1,
        "{report:?}"
    );
    assert!(report.live > 100 && report.live < 200, "{report:?}");
    for (_, location) in recovered.entries.lock().values() {
        engine.read(location).unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fast_restart_round_trip_and_rejects_a_stale_image() {
    let dir = temp_dir("fast");
    let image = dir.join("test.index");
    let index = FakeIndex::default();
    {
        let engine = DeviceEngine::open(config(&dir, 2)).unwrap();
        engine.cold_start(&index.sink(), &|_| {});
        for seed in 0..300u64 {
            index.put(&engine, digest(seed), 1, body(seed, 500));
        }
        for seed in 0..30u64 {
            index.delete(&engine, digest(seed));
        }
        let entries: Vec<SavedEntry> = index
            .entries
            .lock()
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
        engine
            .save_index(&image, &[b"s".to_vec()], &entries)
            .unwrap();
    }
    let recovered = FakeIndex::default();
    let engine = DeviceEngine::open(config(&dir, 2)).unwrap();
    let mut sink = |digest: &Digest, record: &RecoveredRecord<'_>| {
        assert_eq!(record.set_name, b"s");
        assert_eq!(record.life, life_of(record.generation));
        recovered.entries.lock().insert(
            *digest,
            (record.generation, Location::device(record.address)),
        );
        Recovered::Live
    };
    let report = engine.fast_restart(&image, &mut sink).unwrap().unwrap();
    assert_eq!(report.live, 270);
    assert_eq!(report.tombstones, 30);
    assert!(!image.exists(), "the image is consumed at start");
    for (_, location) in recovered.entries.lock().values() {
        engine.read(location).unwrap();
    }
    // No image now: a second start must cold start.
    assert!(engine
        .fast_restart(&image, &mut |_, _| Recovered::Live)
        .unwrap()
        .is_none());
    // A corrupted image is refused.
    std::fs::write(&image, b"CITRIDX\0garbage-garbage").unwrap();
    assert!(engine
        .fast_restart(&image, &mut |_, _| Recovered::Live)
        .is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn expired_copy_hides_older_copies_and_tombstones_are_collected() {
    let dir = temp_dir("expire");
    let index = FakeIndex::default();
    let engine = DeviceEngine::open(config(&dir, 1)).unwrap();
    engine.cold_start(&index.sink(), &|_| {});
    index.put(&engine, digest(1), 1, body(1, 100));
    let meta = StoreMeta {
        generation: 2,
        life: 0,
        void_time: 5,
        last_update_ms: 2,
        set_name: b"",
    };
    let newer = engine.write(&digest(1), &meta, body(2, 100)).unwrap();
    let (_, older) = index.entries.lock().remove(&digest(1)).unwrap();
    engine.release(older);
    engine.retire(&digest(1), newer);
    assert_eq!(engine.tombstones(), 1);
    engine.flush_all().unwrap();
    drop(engine);
    let engine = DeviceEngine::open(config(&dir, 1)).unwrap();
    let sink = |_: &Digest, record: &RecoveredRecord<'_>| {
        if record.void_time != 0 {
            Recovered::Expired
        } else {
            Recovered::Live
        }
    };
    let report = engine.cold_start(&sink, &|_| {});
    assert_eq!((report.live, report.expired), (0, 1), "{report:?}");
    // Rewrite a lot: old blocks get defragged and freed, and the tombstone goes.
    let index = FakeIndex::default();
    for round in 0..40u64 {
        for seed in 10..60u64 {
            index.put(&engine, digest(seed), round as u16 + 1, body(seed, 3000));
        }
        engine.flush_tick().unwrap();
        while engine.defrag_step(&index).worked {}
        engine.flush_tick().unwrap();
        engine.collect_tombstones();
    }
    assert_eq!(engine.tombstones(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn concurrent_writes_deletes_defrag_and_flush_stay_consistent() {
    let dir = temp_dir("concurrent");
    let engine = DeviceEngine::open(DeviceConfig {
        file_size: (1 << 20) + 48 * (64 * 1024),
        ..config(&dir, 2)
    })
    .unwrap();
    let index = FakeIndex::default();
    engine.cold_start(&index.sink(), &|_| {});
    let stop = std::sync::atomic::AtomicBool::new(false);
    // The expected final state, written under the same lock as the index.
    let expected: PlMutex<HashMap<Digest, Option<Vec<u8>>>> = PlMutex::new(HashMap::new());
    // Stops the background threads even when a writer panics, so a failure
    // fails the test instead of hanging it.
    struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    std::thread::scope(|scope| {
        let _stop_guard = StopOnDrop(&stop);
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                engine.defrag_step(&index);
            }
        });
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                engine.flush_tick().unwrap();
                engine.collect_tombstones();
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        });
        let writers: Vec<_> = (0..3u64)
            .map(|thread| {
                let (engine, index, expected) = (&engine, &index, &expected);
                scope.spawn(move || {
                    for step in 0..4000u64 {
                        let key = digest(thread * 1000 + step % 200);
                        // The index lock stands in for the partition lock.
                        let mut entries = index.entries.lock();
                        if step % 7 == 0 {
                            if entries.contains_key(&key) {
                                engine.write_tombstone(&key, &StoreMeta::default()).unwrap();
                                let (_, old) = entries.remove(&key).unwrap();
                                engine.release(old);
                                expected.lock().insert(key, None);
                            }
                        } else {
                            let value = body(step, 300 + (step % 5) as usize * 200);
                            let meta = StoreMeta {
                                generation: (step % 60_000) as u16 + 1,
                                life: life_of((step % 60_000) as u16 + 1),
                                void_time: 0,
                                last_update_ms: step,
                                set_name: b"s",
                            };
                            // Under CPU pressure defrag can fall behind the
                            // writers: the engine then answers OutOfSpace
                            // (stop-writes) until blocks are freed. That is
                            // the designed behaviour, so wait for defrag —
                            // with the index lock released, since defrag
                            // needs it — and try again, for at most 30 s.
                            let deadline =
                                std::time::Instant::now() + std::time::Duration::from_secs(30);
                            let location = loop {
                                match engine.write(&key, &meta, value.clone()) {
                                    Ok(location) => break location,
                                    Err(StorageError::OutOfSpace)
                                        if std::time::Instant::now() < deadline =>
                                    {
                                        drop(entries);
                                        std::thread::sleep(std::time::Duration::from_millis(2));
                                        entries = index.entries.lock();
                                    }
                                    Err(error) => panic!("write failed: {error}"),
                                }
                            };
                            if let Some((_, old)) = entries.insert(key, (meta.generation, location))
                            {
                                engine.release(old);
                            }
                            expected.lock().insert(key, Some(value));
                        }
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(
        engine.stats.defrag_blocks.load(Ordering::Relaxed) > 10,
        "defrag barely ran"
    );
    let check = |engine: &DeviceEngine, entries: &HashMap<Digest, (u16, Location)>| {
        for (key, value) in expected.lock().iter() {
            match (value, entries.get(key)) {
                (Some(value), Some((_, location))) => {
                    assert_eq!(engine.read(location).unwrap().as_ref(), &value[..])
                }
                (None, None) => {}
                (value, entry) => panic!(
                    "mismatch: expected {:?}, index has {:?}",
                    value.as_ref().map(Vec::len),
                    entry.map(|(generation, _)| generation)
                ),
            }
        }
    };
    check(&engine, &index.entries.lock());
    engine.flush_all().unwrap();
    drop(engine);
    let recovered = FakeIndex::default();
    let engine = DeviceEngine::open(DeviceConfig {
        file_size: (1 << 20) + 48 * (64 * 1024),
        ..config(&dir, 2)
    })
    .unwrap();
    engine.cold_start(&recovered.sink(), &|_| {});
    check(&engine, &recovered.entries.lock());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Write blocks up to 128 MiB take records of their size less the headers
/// (issue 44 point 6): a 20 MiB record in a 32 MiB block reads back from
/// the buffer and after a cold start; one of a whole block is refused.
#[test]
fn a_record_of_20_mib_in_a_32_mib_write_block_survives_a_cold_start() {
    let dir = temp_dir("big-record");
    let config = || DeviceConfig {
        write_block_size: 32 << 20,
        post_write_queue: 1,
        ..DeviceConfig::new(
            "test",
            vec![dir.join("big.dat")],
            (1 << 20) + 8 * (32 << 20),
        )
    };
    let big: Vec<u8> = (0..20u32 << 20)
        .map(|index| (index.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let index = FakeIndex::default();
    {
        let engine = DeviceEngine::open(config()).unwrap();
        engine.cold_start(&index.sink(), &|_| {});
        index.put(&engine, digest(1), 1, big.clone());
        index.put(&engine, digest(2), 1, body(2, 100));
        let location =
            Location::device(index.entries.lock()[&digest(1)].1.device_address().unwrap());
        assert!(engine.read(&location).unwrap().as_ref() == &big[..]);
        let whole_block = vec![0u8; 32 << 20];
        assert_eq!(
            engine
                .write(&digest(3), &StoreMeta::default(), whole_block)
                .unwrap_err(),
            StorageError::TooBig
        );
        engine.flush_tick().unwrap();
    }
    let recovered = FakeIndex::default();
    let engine = DeviceEngine::open(config()).unwrap();
    assert_eq!(engine.cold_start(&recovered.sink(), &|_| {}).live, 2);
    let entries = recovered.entries.lock();
    assert!(engine.read(&entries[&digest(1)].1).unwrap().as_ref() == &big[..]);
    assert_eq!(
        engine.read(&entries[&digest(2)].1).unwrap().as_ref(),
        &body(2, 100)[..]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// What the storage benchmarks saw (`enable-benchmarks-storage`).
#[derive(Default)]
struct SeenIo {
    sizes: [AtomicU64; 2],
    io: [AtomicU64; 3],
}

impl crate::bench::StorageBenchmarks for SeenIo {
    fn record_size(&self, write: bool, _bytes: u64) {
        self.sizes[usize::from(write)].fetch_add(1, Ordering::Relaxed);
    }
    fn device_io(&self, device: usize, kind: crate::bench::IoKind, _elapsed: std::time::Duration) {
        assert_eq!(device, 0);
        self.io[kind as usize].fetch_add(1, Ordering::Relaxed);
    }
}

/// While the storage benchmarks are on, the engine reports every record
/// stored, every record read from the device (not from memory), every
/// write block written out and every block defragmentation reads; while
/// off, nothing.
#[test]
fn storage_benchmarks_see_each_device_operation_only_while_on() {
    use crate::bench::IoKind;
    let dir = temp_dir("bench");
    let index = FakeIndex::default();
    let engine = DeviceEngine::open(DeviceConfig {
        post_write_queue: 0,
        ..config(&dir, 1)
    })
    .unwrap();
    engine.cold_start(&index.sink(), &|_| {});
    let seen = Arc::new(SeenIo::default());
    let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
    index.put(&engine, digest(1000), 1, body(1000, 100));
    engine.flush_tick().unwrap();
    assert_eq!(load(&seen.sizes[1]), 0);
    let sink = seen.clone();
    engine.benchmarks().set(|| sink, true);
    // ~2 KiB records: 32 to a 64 KiB block; rewritten, their first blocks
    // fall below the defrag threshold.
    for round in 1..=2u16 {
        for seed in 0..100u64 {
            index.put(&engine, digest(seed), round, body(seed, 2000));
        }
        engine.flush_tick().unwrap();
    }
    assert_eq!(load(&seen.sizes[1]), 200);
    assert!(load(&seen.io[IoKind::Write as usize]) >= 6);
    let address = index.entries.lock()[&digest(1000)].1.device_address();
    let location = Location::device(address.unwrap());
    assert_eq!(
        engine.read(&location).unwrap().as_ref(),
        &body(1000, 100)[..]
    );
    assert_eq!(load(&seen.io[IoKind::Read as usize]), 1);
    assert_eq!(load(&seen.sizes[0]), 1);
    while engine.defrag_step(&index).worked {}
    assert!(load(&seen.io[IoKind::LargeBlockRead as usize]) > 0);
    engine
        .benchmarks()
        .set(|| unreachable!("the sink stays"), false);
    let before = load(&seen.io[IoKind::Read as usize]);
    let _ = engine.read(&location).unwrap();
    index.put(&engine, digest(1001), 1, body(1001, 100));
    assert_eq!(load(&seen.io[IoKind::Read as usize]), before);
    assert_eq!(load(&seen.sizes[1]), 200);
    let _ = std::fs::remove_dir_all(&dir);
}
