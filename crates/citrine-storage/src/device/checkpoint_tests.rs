//! Index checkpoints over the faulty [`SimDisk`]: a restart from a
//! checkpoint and the blocks written after it finds what a cold scan of the
//! same disk finds, after kill -9 (unsynced writes kept), a power cut
//! (lost), a torn write-back (scrambled) and with defrag, deletes and
//! truncations between the checkpoint and the crash; a damaged checkpoint
//! is refused before anything reaches the index.

#![allow(clippy::unwrap_used)]

use super::io::{Fault, IoOp, PowerCut, SimDisk, Trigger};
use super::tests::{body, digest, temp_dir, FakeIndex};
use super::*;
use std::collections::BTreeMap;
use std::path::Path;

const WBLOCK: u32 = 64 << 10;
const DISK_BYTES: u64 = (1 << 20) + 48 * WBLOCK as u64;

fn sim_config(disk: &SimDisk, commit: bool) -> DeviceConfig {
    DeviceConfig {
        write_block_size: WBLOCK,
        media: Media::Simulated(vec![disk.clone()]),
        commit_to_device: commit,
        ..DeviceConfig::new("test", vec!["sim0".into()], 0)
    }
}

fn open(disk: &SimDisk) -> (DeviceEngine, FakeIndex) {
    let engine = DeviceEngine::open(sim_config(disk, false)).unwrap();
    let index = FakeIndex::default();
    engine.cold_start(&index.sink(), &|_| {});
    (engine, index)
}

/// Digest → (generation, body).
type Records = BTreeMap<Digest, (u16, Vec<u8>)>;
/// One change to a checkpoint file.
type Damage = Box<dyn Fn(&mut Vec<u8>)>;

/// What a restart gave the index: digest → (generation, body), every body
/// read back, and the tombstones held.
fn state(engine: &DeviceEngine, index: &FakeIndex) -> (Records, usize, u64) {
    let records = index
        .entries
        .lock()
        .iter()
        .map(|(digest, (generation, location))| {
            (
                *digest,
                (*generation, engine.read(location).unwrap().into_owned()),
            )
        })
        .collect();
    (records, engine.tombstones(), engine.used_bytes())
}

/// Restarts twice on the same disk (restarts never write): a cold scan and
/// a checkpoint restart; checks they agree and returns the checkpoint's
/// report.
fn both_restarts(
    disk: &SimDisk,
    path: &Path,
) -> (ColdStartReport, BTreeMap<Digest, (u16, Vec<u8>)>) {
    let (cold, cold_index) = open(disk);
    let cold_state = state(&cold, &cold_index);
    drop(cold);
    let engine = DeviceEngine::open(sim_config(disk, false)).unwrap();
    let index = FakeIndex::default();
    let report = engine
        .checkpoint_restart(path, &index.sink())
        .unwrap()
        .unwrap();
    let checkpoint_state = state(&engine, &index);
    assert_eq!(checkpoint_state.1, cold_state.1, "tombstones differ");
    assert!(
        checkpoint_state.0 == cold_state.0,
        "records differ from the cold scan's"
    );
    assert_eq!(checkpoint_state.2, cold_state.2, "used bytes differ");
    (report, checkpoint_state.0)
}

/// Writes, overwrites and deletes `keys`, version `round`.
fn churn(engine: &DeviceEngine, index: &FakeIndex, keys: std::ops::Range<u64>, round: u64) {
    for key in keys {
        match (key + round) % 5 {
            0 => index.delete(engine, digest(key)),
            _ => index.put(
                engine,
                digest(key),
                round as u16 + 1,
                body(key + 1000 * round, 300 + (key % 7) as usize * 40),
            ),
        }
    }
}

fn defrag_all(engine: &DeviceEngine, index: &FakeIndex) {
    while engine.defrag_step(index).worked {}
    engine.flush_tick().unwrap();
}

#[test]
fn checkpoint_and_replay_find_what_the_cold_scan_finds_after_any_crash() {
    let dir = temp_dir("ckpt-equal");
    for seed in 0..6u64 {
        for cut in [
            PowerCut::KeepUnsynced,
            PowerCut::LoseUnsynced,
            PowerCut::Scramble,
        ] {
            let path = dir.join(format!("s{seed}-{cut:?}.checkpoint"));
            let disk = SimDisk::new(DISK_BYTES, seed);
            let (engine, index) = open(&disk);
            churn(&engine, &index, 0..400, 0);
            churn(&engine, &index, 0..200, 1);
            engine.flush_tick().unwrap();
            let first = engine.write_checkpoint(&path).unwrap();
            assert!(first.rebuilt && first.entries > 0, "{first:?}");
            let covered = engine.covered_now();
            // After it: overwrites and deletes of covered records, defrag
            // freeing (and reusing) covered blocks, tombstones collected.
            churn(&engine, &index, 0..400, 2 + seed % 2);
            defrag_all(&engine, &index);
            engine.collect_tombstones();
            let second = engine.write_checkpoint(&path).unwrap();
            assert!(!second.rebuilt && second.blocks_read > 0, "{second:?}");
            churn(&engine, &index, 100..300, 4);
            defrag_all(&engine, &index);
            churn(&engine, &index, 300..450, 5); // partly unsynced
            let reused = covered[0]
                .iter()
                .zip(&engine.covered_now()[0])
                .filter(|(then, now)| **then != 0 && *then != *now)
                .count();
            assert!(
                reused > 0,
                "no covered block was freed after the checkpoint"
            );
            let disk = disk.power_cut(cut);
            drop(engine);
            let (report, _) = both_restarts(&disk, &path);
            assert!(
                report.blocks_replayed > 0 && report.checkpoint_entries > 0,
                "{report:?}"
            );
        }
    }

    let _ = std::fs::remove_dir_all(&dir);
}

/// An incremental checkpoint where newer copies and tombstones of covered
/// records land in new blocks while the old blocks stay covered: the new
/// checkpoint must hold the newer copies (nothing is replayed for them).
#[test]
fn an_incremental_checkpoint_keeps_the_newest_copy() {
    let dir = temp_dir("ckpt-incremental");
    let path = dir.join("test.checkpoint");
    let disk = SimDisk::new(DISK_BYTES, 9);
    let (engine, index) = open(&disk);
    for key in 0..300 {
        index.put(&engine, digest(key), 1, body(key, 400));
    }
    engine.flush_all().unwrap();
    assert!(engine.write_checkpoint(&path).unwrap().rebuilt);
    for key in 0..50 {
        index.put(&engine, digest(key), 2, body(key + 1000, 400));
    }
    for key in 50..80 {
        index.delete(&engine, digest(key));
    }
    engine.flush_all().unwrap();
    let second = engine.write_checkpoint(&path).unwrap();
    assert!(!second.rebuilt && second.blocks_read > 0, "{second:?}");
    let disk = disk.power_cut(PowerCut::KeepUnsynced);
    drop(engine);
    let (report, recovered) = both_restarts(&disk, &path);
    assert_eq!(report.blocks_replayed, 0, "{report:?}");
    assert_eq!(recovered.len(), 270);
    assert!((0..50).all(|key| recovered[&digest(key)].0 == 2));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Tombstones the checkpoint holds are collected once every older block
/// is free: the restart must not bring them back (nor the records).
#[test]
fn collected_tombstones_stay_collected() {
    let dir = temp_dir("ckpt-collect");
    let path = dir.join("test.checkpoint");
    let disk = SimDisk::new(DISK_BYTES, 10);
    let (engine, index) = open(&disk);
    churn(&engine, &index, 0..200, 1);
    for key in 0..100 {
        index.delete(&engine, digest(key));
    }
    engine.flush_all().unwrap();
    let checkpoint = engine.write_checkpoint(&path).unwrap();
    churn(&engine, &index, 100..200, 6);
    engine.flush_all().unwrap();
    defrag_all(&engine, &index);
    engine.flush_all().unwrap();
    assert_eq!(engine.collect_tombstones(), 100, "{checkpoint:?}");
    // The block the tombstones were moved to empties and is freed too.
    defrag_all(&engine, &index);
    engine.flush_all().unwrap();
    let disk = disk.power_cut(PowerCut::KeepUnsynced);
    drop(engine);
    let (report, recovered) = both_restarts(&disk, &path);
    assert_eq!(recovered.len(), 80, "{report:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_delete_or_truncation_after_the_checkpoint_keeps_the_old_copies_away() {
    let dir = temp_dir("ckpt-delete");
    let path = dir.join("test.checkpoint");
    let disk = SimDisk::new(DISK_BYTES, 11);
    let (engine, index) = open(&disk);
    let put = |key: u64, lut: u64| {
        let meta = StoreMeta {
            generation: 1,
            last_update_ms: lut,
            set_name: b"s",
            ..StoreMeta::default()
        };
        let location = engine.write(&digest(key), &meta, body(key, 500)).unwrap();
        if let Some((_, old)) = index.entries.lock().insert(digest(key), (1, location)) {
            engine.release(old);
        }
    };
    for key in 0..300 {
        put(key, 5);
    }
    engine.flush_tick().unwrap();
    engine.write_checkpoint(&path).unwrap();
    // Deletes of 0..100; "truncation" of everything written at 5 (the
    // index drops 100..300), new records at 20; defrag empties the blocks.
    for key in 0..100 {
        index.delete(&engine, digest(key));
    }
    for key in 100..300 {
        let (_, location) = index.entries.lock().remove(&digest(key)).unwrap();
        engine.release(location);
    }
    for key in 300..400 {
        put(key, 20);
    }
    defrag_all(&engine, &index);
    let disk = disk.power_cut(PowerCut::LoseUnsynced);
    drop(engine);
    let engine = DeviceEngine::open(sim_config(&disk, false)).unwrap();
    let admitted = parking_lot::Mutex::new(Vec::new());
    let sink = |digest: &Digest, record: &RecoveredRecord<'_>| {
        if record.last_update_ms <= 10 {
            return Recovered::Truncated;
        }
        admitted.lock().push(*digest);
        Recovered::Live
    };
    let report = engine.checkpoint_restart(&path, &sink).unwrap().unwrap();
    let admitted = admitted.into_inner();
    assert!(
        (0..300).all(|key| !admitted.contains(&digest(key))),
        "a deleted or truncated record came back"
    );
    assert_eq!(admitted.len(), 100, "{report:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_committed_write_survives_a_power_cut_after_the_checkpoint() {
    let dir = temp_dir("ckpt-commit");
    let path = dir.join("test.checkpoint");
    let disk = SimDisk::new(DISK_BYTES, 12);
    let engine = DeviceEngine::open(sim_config(&disk, true)).unwrap();
    let index = FakeIndex::default();
    engine.cold_start(&index.sink(), &|_| {});
    churn(&engine, &index, 0..300, 0);
    engine.write_checkpoint(&path).unwrap();
    // Acknowledged with commit-to-device, never flushed by a tick.
    churn(&engine, &index, 0..350, 1);
    let acknowledged: BTreeMap<Digest, u16> = index
        .entries
        .lock()
        .iter()
        .map(|(digest, (generation, _))| (*digest, *generation))
        .collect();
    let disk = disk.power_cut(PowerCut::LoseUnsynced);
    drop(engine);
    let (_, recovered) = both_restarts(&disk, &path);
    let recovered: BTreeMap<Digest, u16> = recovered
        .into_iter()
        .map(|(digest, (generation, _))| (digest, generation))
        .collect();
    assert_eq!(recovered, acknowledged);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Writers run while checkpoints are written; a crash then.
#[test]
fn checkpoints_written_beside_client_writes_stay_consistent() {
    let dir = temp_dir("ckpt-concurrent");
    let path = dir.join("test.checkpoint");
    let disk = SimDisk::new(DISK_BYTES, 13);
    let (engine, index) = open(&disk);
    let stop = AtomicBool::new(false);
    // Round r of writes starts only once r checkpoints were written, so
    // checkpoints and writes interleave however the threads are scheduled
    // (a loaded machine once let the writer finish before a second one).
    let checkpoints = std::sync::atomic::AtomicU64::new(0);
    let written = std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            for round in 0..6 {
                while checkpoints.load(Ordering::Acquire) < round {
                    std::thread::yield_now();
                }
                churn(&engine, &index, 0..300, round);
                engine.flush_tick().unwrap();
                while engine.defrag_step(&index).worked {}
            }
            stop.store(true, Ordering::Release);
        });
        while !stop.load(Ordering::Acquire) {
            engine.write_checkpoint(&path).unwrap();
            checkpoints.fetch_add(1, Ordering::AcqRel);
        }
        writer.join().unwrap();
        checkpoints.load(Ordering::Acquire)
    });
    assert!(written >= 5, "{written} checkpoints");
    let disk = disk.power_cut(PowerCut::KeepUnsynced);
    drop(engine);
    both_restarts(&disk, &path);
    let _ = std::fs::remove_dir_all(&dir);
}

fn rewrite(path: &Path, change: impl FnOnce(&mut Vec<u8>)) {
    let mut bytes = std::fs::read(path).unwrap();
    change(&mut bytes);
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_damaged_or_foreign_checkpoint_is_refused_before_the_index_sees_it() {
    let dir = temp_dir("ckpt-damaged");
    let path = dir.join("test.checkpoint");
    let disk = SimDisk::new(DISK_BYTES, 14);
    let (engine, index) = open(&disk);
    churn(&engine, &index, 0..300, 0);
    engine.flush_tick().unwrap();
    engine.write_checkpoint(&path).unwrap();
    drop(engine);
    let good = std::fs::read(&path).unwrap();
    // A valid checksum over a changed header: what an older build or
    // another device set would have written.
    let resum = |bytes: &mut Vec<u8>| {
        let end = bytes.len() - 4;
        let crc = format::crc32c(&bytes[..end]);
        bytes[end..].copy_from_slice(&crc.to_le_bytes());
    };
    let cases: Vec<(&str, Damage)> = vec![
        (
            "checksum",
            Box::new(|bytes: &mut Vec<u8>| {
                let middle = bytes.len() / 2;
                bytes[middle] ^= 0x40;
            }),
        ),
        (
            "checksum",
            Box::new(|bytes: &mut Vec<u8>| bytes.truncate(bytes.len() * 2 / 3)),
        ),
        (
            "checksum",
            Box::new(|bytes: &mut Vec<u8>| bytes.truncate(bytes.len() - 1)),
        ),
        (
            "version",
            Box::new(move |bytes: &mut Vec<u8>| {
                bytes[8..12].copy_from_slice(&(CHECKPOINT_VERSION - 1).to_le_bytes());
                resum(bytes);
            }),
        ),
        (
            "another device set",
            Box::new(move |bytes: &mut Vec<u8>| {
                bytes[12] ^= 1;
                resum(bytes);
            }),
        ),
        (
            "not an index checkpoint",
            Box::new(move |bytes: &mut Vec<u8>| {
                bytes[0] = b'X';
                resum(bytes);
            }),
        ),
        (
            "truncated",
            Box::new(|bytes: &mut Vec<u8>| bytes.truncate(3)),
        ),
        (
            "flags",
            Box::new(move |bytes: &mut Vec<u8>| {
                // The first entry's flags (after a header of one device).
                let end = bytes.len() - 4 - 55;
                bytes[end + 54] = 7;
                resum(bytes);
            }),
        ),
    ];
    for (expected, damage) in cases {
        std::fs::write(&path, &good).unwrap();
        rewrite(&path, |bytes| damage(bytes));
        let engine = DeviceEngine::open(sim_config(&disk, false)).unwrap();
        let calls = AtomicUsize::new(0);
        let sink = |_: &Digest, _: &RecoveredRecord<'_>| {
            calls.fetch_add(1, Ordering::Relaxed);
            Recovered::Live
        };
        let error = engine.checkpoint_restart(&path, &sink).unwrap_err();
        assert!(error.contains(expected), "{expected}: {error}");
        assert_eq!(calls.load(Ordering::Relaxed), 0);
        // The next checkpoint does not trust it either: a rebuild.
        let (engine, _index) = (engine, FakeIndex::default());
        engine.cold_start(&_index.sink(), &|_| {});
        assert!(engine.write_checkpoint(&path).unwrap().rebuilt);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_failed_sync_writes_no_checkpoint_and_fails_the_engine() {
    let dir = temp_dir("ckpt-sync");
    let path = dir.join("test.checkpoint");
    let disk = SimDisk::new(DISK_BYTES, 15);
    let (engine, index) = open(&disk);
    churn(&engine, &index, 0..300, 0);
    engine.write_checkpoint(&path).unwrap();
    let before = std::fs::read(&path).unwrap();
    churn(&engine, &index, 0..300, 1);
    disk.inject(Fault {
        op: IoOp::Sync,
        trigger: Trigger::Nth(disk.operations(IoOp::Sync) + 1),
    });
    assert!(engine.write_checkpoint(&path).is_err());
    assert!(engine.failed());
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the old checkpoint stays"
    );
    assert!(!engine.checkpoint_due(std::time::Duration::ZERO));
    let disk = disk.power_cut(PowerCut::LoseUnsynced);
    drop(engine);
    both_restarts(&disk, &path);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_checkpoint_is_due_after_a_quarter_more_blocks_or_its_period() {
    let dir = temp_dir("ckpt-due");
    let path = dir.join("test.checkpoint");
    let disk = SimDisk::new(DISK_BYTES, 16);
    let (engine, index) = open(&disk);
    let hour = std::time::Duration::from_secs(3600);
    assert!(!engine.checkpoint_due(hour), "nothing sealed yet");
    churn(&engine, &index, 0..2000, 0);
    assert!(engine.checkpoint_due(hour));
    let report = engine.write_checkpoint(&path).unwrap();
    assert!(!engine.checkpoint_due(hour));
    assert!(report.blocks_covered >= 8, "{report:?}");
    let sealed = |engine: &DeviceEngine| engine.stats.blocks_written.load(Ordering::Relaxed);
    let start = sealed(&engine);
    let mut key = 1000;
    while sealed(&engine) < start + report.blocks_covered.div_ceil(4) {
        index.put(&engine, digest(key), 1, body(key, 500));
        key += 1;
    }
    assert!(engine.checkpoint_due(hour));
    engine.write_checkpoint(&path).unwrap();
    // One block more: not yet a quarter, but due once the period passed.
    let start = sealed(&engine);
    while sealed(&engine) == start {
        index.put(&engine, digest(key), 1, body(key, 500));
        key += 1;
    }
    assert!(!engine.checkpoint_due(hour));
    assert!(engine.checkpoint_due(std::time::Duration::ZERO));
    // Or once writes went quiet.
    std::thread::sleep(checkpoint::QUIET + std::time::Duration::from_millis(100));
    assert!(engine.checkpoint_due(hour));
    let _ = std::fs::remove_dir_all(&dir);
}
