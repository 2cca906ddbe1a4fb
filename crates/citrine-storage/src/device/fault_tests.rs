//! The engine over the faulty [`SimDisk`]: what a power cut leaves, what a
//! restart recovers, and the sticky failed state after a failed write or
//! sync.

#![allow(clippy::unwrap_used)]

use super::io::{Fault, IoOp, PowerCut, SimDisk, Trigger};
use super::tests::{body, digest, life_of, temp_dir, FakeIndex};
use super::*;
use std::collections::BTreeMap;

const WBLOCK: u32 = 64 << 10;
const DISK_BYTES: u64 = (1 << 20) + 32 * WBLOCK as u64;
const BODY: usize = 300;

fn sim_config(disk: &SimDisk) -> DeviceConfig {
    DeviceConfig {
        write_block_size: WBLOCK,
        media: Media::Simulated(vec![disk.clone()]),
        ..DeviceConfig::new("test", vec!["sim0".into()], 0)
    }
}

/// A record's state: absent, or (generation, seed of its body).
type State = Option<(u16, u64)>;

/// An engine on a simulated disk, with what it was told to do: the state of
/// every key as of the last sync, and the states written since.
struct Rig {
    disk: SimDisk,
    engine: DeviceEngine,
    index: FakeIndex,
    synced: BTreeMap<u64, State>,
    current: BTreeMap<u64, State>,
    since_sync: BTreeMap<u64, Vec<State>>,
}

impl Rig {
    fn new(seed: u64) -> Rig {
        let disk = SimDisk::new(DISK_BYTES, seed);
        let engine = DeviceEngine::open(sim_config(&disk)).unwrap();
        let index = FakeIndex::default();
        engine.cold_start(&index.sink(), &|_| {});
        Rig {
            disk,
            engine,
            index,
            synced: BTreeMap::new(),
            current: BTreeMap::new(),
            since_sync: BTreeMap::new(),
        }
    }

    fn put(&mut self, key: u64, generation: u16, body_seed: u64) {
        let state = Some((generation, body_seed));
        self.index
            .put(&self.engine, digest(key), generation, body(body_seed, BODY));
        self.current.insert(key, state);
        self.since_sync.entry(key).or_default().push(state);
    }

    fn delete(&mut self, key: u64) {
        self.index.delete(&self.engine, digest(key));
        self.current.insert(key, None);
        self.since_sync.entry(key).or_default().push(None);
    }

    fn sync(&mut self) {
        self.engine.flush_tick().unwrap();
        self.synced = self.current.clone();
        self.since_sync.clear();
    }

    /// Cuts the power and restarts on what the disk kept (a cold start):
    /// the state of every key.
    fn crash(&mut self, cut: PowerCut) -> BTreeMap<u64, State> {
        self.disk = self.disk.power_cut(cut);
        self.engine = DeviceEngine::open(sim_config(&self.disk)).unwrap();
        self.index = FakeIndex::default();
        self.engine.cold_start(&self.index.sink(), &|_| {});
        self.recovered()
    }

    /// The state of every key the index holds, its body read back and
    /// matched to the body seed it was written with.
    fn recovered(&self) -> BTreeMap<u64, State> {
        let entries = self.index.entries.lock();
        let mut out = BTreeMap::new();
        for key in self.current.keys() {
            let state = entries.get(&digest(*key)).map(|(generation, location)| {
                let bytes = self.engine.read(location).unwrap();
                let seed = (0..1000u64)
                    .map(|offset| key + offset * 1000)
                    .find(|seed| bytes.as_ref() == body(*seed, BODY).as_slice())
                    .unwrap_or_else(|| panic!("key {key}: a body never written"));
                (*generation, seed)
            });
            out.insert(*key, state);
        }
        out
    }

    /// Writes, then deletes and rewrites, some of it synced, the rest not.
    /// Body seeds are `key + 1000 × version`.
    fn workload(&mut self) {
        for key in 0..300 {
            self.put(key, 1, key);
        }
        for key in 250..300 {
            self.delete(key); // deletes that will be synced
        }
        for key in 0..50 {
            self.put(key, 2, key + 1000);
        }
        self.sync();
        for key in 50..100 {
            self.put(key, 2, key + 1000); // updates not synced
        }
        for key in 100..150 {
            self.delete(key); // deletes not synced
        }
        for key in 250..260 {
            self.put(key, 3, key + 3000); // re-creates not synced
        }
        for key in 300..600 {
            self.put(key, 1, key); // new records not synced
        }
        // More than a block: a sealed block reached the disk unsynced.
        assert!(self.disk.unsynced_bytes() >= WBLOCK as usize);
    }

    /// The state of every key as of the last sync (absent if never synced).
    fn expected(&self) -> BTreeMap<u64, State> {
        self.current
            .keys()
            .map(|key| (*key, self.synced.get(key).copied().unwrap_or(None)))
            .collect()
    }
}

#[test]
fn a_power_cut_loses_exactly_the_unsynced_writes_and_deletes() {
    let mut rig = Rig::new(1);
    rig.workload();
    let recovered = rig.crash(PowerCut::LoseUnsynced);
    assert_eq!(recovered, rig.expected());
    // Spelled out: a lost update or delete leaves the previous copy, a
    // synced delete stays, lost records are absent.
    assert_eq!(recovered[&60], Some((1, 60)));
    assert_eq!(recovered[&120], Some((1, 120)));
    assert_eq!(recovered[&10], Some((2, 1010)));
    assert_eq!(recovered[&255], None);
    assert_eq!(recovered[&320], None);
    assert_eq!(recovered[&590], None);
}

/// A torn, reordered write-back: each key ends in its synced state or in a
/// state written after it, never an older one, and every record the
/// restart admits reads back intact.
#[test]
fn a_scrambled_power_cut_leaves_each_key_synced_or_later() {
    let mut kept_unsynced = 0;
    for seed in 0..12 {
        let mut rig = Rig::new(seed);
        rig.workload();
        let synced = rig.synced.clone();
        let since = rig.since_sync.clone();
        let recovered = rig.crash(PowerCut::Scramble);
        for (key, state) in &recovered {
            let allowed = synced.get(key).copied().unwrap_or(None) == *state
                || since.get(key).is_some_and(|states| states.contains(state));
            assert!(
                allowed,
                "seed {seed} key {key}: {state:?}, synced {:?}, since {:?}",
                synced.get(key),
                since.get(key)
            );
            kept_unsynced += usize::from(synced.get(key).copied().unwrap_or(None) != *state);
        }
    }
    assert!(
        kept_unsynced > 0,
        "no unsynced write ever survived a scramble"
    );
}

#[test]
fn fast_restart_then_a_crash_recovers_every_synced_record() {
    let dir = temp_dir("fault-fast");
    let image = dir.join("test.index");
    let mut rig = Rig::new(3);
    for key in 0..100 {
        rig.put(key, 1, key);
    }
    for key in 90..100 {
        rig.delete(key);
    }
    let entries: Vec<SavedEntry> = rig
        .index
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
    rig.engine
        .save_index(&image, &[b"s".to_vec()], &entries)
        .unwrap();
    rig.synced = rig.current.clone();
    rig.since_sync.clear();
    assert_eq!(rig.disk.unsynced_bytes(), 0, "a clean shutdown syncs all");
    // A clean restart on the same disk: the image is used.
    rig.engine = DeviceEngine::open(sim_config(&rig.disk)).unwrap();
    rig.index = FakeIndex::default();
    let mut sink = |digest: &Digest, record: &RecoveredRecord<'_>| {
        rig.index.entries.lock().insert(
            *digest,
            (record.generation, Location::device(record.address)),
        );
        Recovered::Live
    };
    let report = rig.engine.fast_restart(&image, &mut sink).unwrap().unwrap();
    assert_eq!((report.live, report.tombstones), (90, 10));
    assert_eq!(rig.recovered(), rig.synced);
    // Then synced and unsynced work, and a crash: a cold start (the image
    // was consumed) finds what was synced, before and after the restart.
    for key in 100..150 {
        rig.put(key, 1, key);
    }
    rig.sync();
    for key in 150..200 {
        rig.put(key, 1, key);
    }
    for key in 0..10 {
        rig.delete(key);
    }
    rig.disk = rig.disk.power_cut(PowerCut::LoseUnsynced);
    rig.engine = DeviceEngine::open(sim_config(&rig.disk)).unwrap();
    rig.index = FakeIndex::default();
    assert!(rig
        .engine
        .fast_restart(&image, &mut |_, _| Recovered::Live)
        .unwrap()
        .is_none());
    rig.engine.cold_start(&rig.index.sink(), &|_| {});
    assert_eq!(rig.recovered(), rig.expected());
    let _ = std::fs::remove_dir_all(&dir);
}

fn refused(result: Result<Location, StorageError>) -> bool {
    matches!(result, Err(StorageError::DeviceFailed))
}

fn meta() -> StoreMeta<'static> {
    StoreMeta {
        generation: 1,
        set_name: b"s",
        ..StoreMeta::default()
    }
}

fn pair(engine: &DeviceEngine, name: &str) -> String {
    engine
        .info_pairs()
        .into_iter()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value)
        .unwrap()
}

#[test]
fn a_failed_sync_makes_the_engine_refuse_writes_and_keep_serving_reads() {
    let mut rig = Rig::new(4);
    for key in 0..20 {
        rig.put(key, 1, key);
    }
    rig.sync();
    for key in 20..40 {
        rig.put(key, 1, key);
    }
    assert_eq!(pair(&rig.engine, "device_failed"), "false");
    rig.disk.inject(Fault {
        op: IoOp::Sync,
        trigger: Trigger::Nth(rig.disk.operations(IoOp::Sync) + 1),
    });
    assert_eq!(rig.engine.flush_tick(), Err(StorageError::DeviceFailed));
    assert!(rig.engine.failed());
    // Refused: writes and tombstones, from now on, though the fault is gone.
    assert!(refused(rig.engine.write(
        &digest(100),
        &meta(),
        vec![1; 10]
    )));
    assert_eq!(
        rig.engine.write_tombstone(&digest(0), &meta()),
        Err(StorageError::DeviceFailed)
    );
    assert_eq!(rig.engine.flush_tick(), Err(StorageError::DeviceFailed));
    assert!(refused(rig.engine.write(
        &digest(101),
        &meta(),
        vec![1; 10]
    )));
    // Served: every record, synced or not.
    assert_eq!(rig.recovered(), rig.current);
    assert_eq!(pair(&rig.engine, "device_failed"), "true");
    assert_eq!(pair(&rig.engine, "device_writes_refused"), "3");
    // Nothing more reaches the disk: no flush, no defrag, no metadata.
    let writes = rig.disk.operations(IoOp::Write);
    let syncs = rig.disk.operations(IoOp::Sync);
    assert!(!rig.engine.defrag_step(&rig.index).worked);
    assert!(rig.engine.persist_truncation(None, 5).is_err());
    assert!(rig.engine.flush_all().is_err());
    assert_eq!(
        (
            rig.disk.operations(IoOp::Write),
            rig.disk.operations(IoOp::Sync)
        ),
        (writes, syncs)
    );
}

/// The case the failed state exists for: defrag moved records, the sync
/// of their new block failed (the kernel dropped the writes), and a later
/// sync that succeeds must not be taken as making the moves durable — the
/// emptied blocks must not be freed. A crash then still finds every record
/// in its old block.
#[test]
fn a_failed_sync_never_frees_the_blocks_defrag_emptied() {
    let mut rig = Rig::new(5);
    for key in 0..200 {
        rig.put(key, 1, key);
    }
    rig.sync();
    for key in (0..180).filter(|key| key % 10 != 0) {
        rig.put(key, 2, key + 1000);
    }
    rig.sync();
    let mut moved = 0;
    while rig.engine.defrag_step(&rig.index).worked {
        moved += 1;
    }
    assert!(
        moved > 0
            && rig
                .engine
                .stats
                .defrag_records_moved
                .load(Ordering::Relaxed)
                > 0
    );
    rig.disk.inject(Fault {
        op: IoOp::Sync,
        trigger: Trigger::Nth(rig.disk.operations(IoOp::Sync) + 1),
    });
    assert!(rig.engine.flush_tick().is_err());
    // The fault was one sync: a retry would succeed and free the blocks.
    let _ = rig.engine.flush_tick();
    let _ = rig.engine.flush_all();
    let recovered = rig.crash(PowerCut::LoseUnsynced);
    assert_eq!(recovered, rig.expected());
}

#[test]
fn a_failed_write_block_write_fails_the_engine() {
    let rig = Rig::new(6);
    rig.disk.inject(Fault {
        op: IoOp::Write,
        trigger: Trigger::From(rig.disk.operations(IoOp::Write) + 1),
    });
    // Fill the client buffer until sealing it must write.
    let mut key = 0;
    let outcome = loop {
        match rig.engine.write(&digest(key), &meta(), body(key, BODY)) {
            Ok(_) => key += 1,
            Err(error) => break error,
        }
        assert!(key < 10_000);
    };
    assert_eq!(outcome, StorageError::DeviceFailed);
    assert!(key > 100, "the first block filled in memory");
    rig.disk.clear_faults();
    assert!(refused(rig.engine.write(
        &digest(key),
        &meta(),
        vec![1; 10]
    )));
}

#[test]
fn a_failed_commit_sync_refuses_that_write_and_every_later_one() {
    let disk = SimDisk::new(DISK_BYTES, 7);
    let engine = DeviceEngine::open(DeviceConfig {
        commit_to_device: true,
        ..sim_config(&disk)
    })
    .unwrap();
    engine.cold_start(&|_, _| Recovered::Live, &|_| {});
    let first = engine.write(&digest(1), &meta(), vec![1; 100]).unwrap();
    disk.inject(Fault {
        op: IoOp::Sync,
        trigger: Trigger::Nth(disk.operations(IoOp::Sync) + 1),
    });
    assert!(refused(engine.write(&digest(2), &meta(), vec![2; 100])));
    assert!(refused(engine.write(&digest(3), &meta(), vec![3; 100])));
    assert_eq!(engine.read(&first).unwrap().as_ref(), &[1; 100][..]);
}

#[test]
fn a_failed_read_is_an_error_of_that_read_only() {
    let mut rig = Rig::new(8);
    for key in 0..400 {
        rig.put(key, 1, key);
    }
    rig.sync();
    // After a restart nothing is cached: reads go to the disk.
    rig.crash(PowerCut::LoseUnsynced);
    let address = rig.index.entries.lock()[&digest(0)]
        .1
        .device_address()
        .unwrap();
    let location = Location::device(address);
    let start = address.rblock() * RBLOCK as u64;
    rig.disk.inject(Fault {
        op: IoOp::Read,
        trigger: Trigger::Range {
            start,
            end: start + address.bytes(),
        },
    });
    assert!(matches!(
        rig.engine.read(&location),
        Err(StorageError::Io(_))
    ));
    assert!(!rig.engine.failed());
    rig.put(1000, 1, 1000);
    rig.sync();
}
