//! The engine over devices with shadows: every write block and sync reaches
//! the shadow, a blank device is rebuilt from its shadow at open with
//! every synced record back, and a shadow that holds another device is
//! refused.

#![allow(clippy::unwrap_used)]

use super::io::{PowerCut, SimDisk};
use super::tests::{body, digest, FakeIndex};
use super::*;

const WBLOCK: u32 = 64 << 10;
const DISK_BYTES: u64 = (1 << 20) + 32 * WBLOCK as u64;

/// One device on `primary` shadowed by `shadow`.
fn shadowed(primary: &SimDisk, shadow: &SimDisk) -> DeviceConfig {
    DeviceConfig {
        write_block_size: WBLOCK,
        media: Media::Simulated(vec![primary.clone(), shadow.clone()]),
        shadows: vec![Some("shadow0".into())],
        ..DeviceConfig::new("test", vec!["sim0".into()], 0)
    }
}

/// Opens and cold-starts `config`: the engine and what its index holds.
fn open(config: DeviceConfig) -> (DeviceEngine, FakeIndex) {
    let engine = DeviceEngine::open(config).unwrap();
    let index = FakeIndex::default();
    engine.cold_start(&index.sink(), &|_| {});
    (engine, index)
}

#[test]
fn a_lost_device_is_rebuilt_from_its_shadow_with_every_synced_record() {
    let primary = SimDisk::new(DISK_BYTES, 1);
    let shadow = SimDisk::new(DISK_BYTES, 2);
    let (engine, index) = open(shadowed(&primary, &shadow));
    for key in 0..400 {
        index.put(&engine, digest(key), 1, body(key, 300));
    }
    engine.flush_tick().unwrap();
    assert_eq!(shadow.unsynced_bytes(), 0, "the sync reached the shadow");
    drop(engine);
    // The device is lost: a blank one takes its place.
    let replacement = SimDisk::new(DISK_BYTES, 3);
    let (engine, index) = open(shadowed(&replacement, &shadow));
    let entries = index.entries.lock();
    assert_eq!(entries.len(), 400);
    for key in 0..400 {
        let (_, location) = &entries[&digest(key)];
        assert_eq!(engine.read(location).unwrap().as_ref(), body(key, 300));
    }
    // Reads come from the rebuilt device, which holds the header now.
    let header = replacement.read_at(0, format::DEVICE_HEADER_BYTES).unwrap();
    assert!(format::DeviceHeader::decode(&header).unwrap().is_some());
}

#[test]
fn a_blank_shadow_is_filled_and_a_foreign_one_refused() {
    let primary = SimDisk::new(DISK_BYTES, 1);
    let plain = DeviceConfig {
        write_block_size: WBLOCK,
        media: Media::Simulated(vec![primary.clone()]),
        ..DeviceConfig::new("test", vec!["sim0".into()], 0)
    };
    let (engine, index) = open(plain);
    for key in 0..100 {
        index.put(&engine, digest(key), 1, body(key, 300));
    }
    engine.flush_tick().unwrap();
    drop(engine);
    // A shadow added later is filled from the device at open.
    let shadow = SimDisk::new(DISK_BYTES, 2);
    let (engine, _) = open(shadowed(&primary, &shadow));
    drop(engine);
    let (engine, index) = open(shadowed(&SimDisk::new(DISK_BYTES, 4), &shadow));
    assert_eq!(index.entries.lock().len(), 100);
    drop(engine);
    // Another device set's disk as the shadow: refused, nothing copied.
    let other = SimDisk::new(DISK_BYTES, 5);
    drop(open(shadowed(&other, &SimDisk::new(DISK_BYTES, 6))));
    let error = DeviceEngine::open(shadowed(&primary, &other))
        .err()
        .unwrap();
    assert!(error.contains("holds another device"), "{error}");
}

/// The shadow is written asynchronously (the default): the device is lost
/// and its shadow cut off with writes still unsynced on it (torn as a
/// power cut tears them); the device rebuilt from the shadow has every
/// record the engine had synced, and the later ones only whole or not at
/// all.
#[test]
fn an_asynchronous_shadow_rebuilds_every_flushed_record() {
    for cut in [PowerCut::LoseUnsynced, PowerCut::Scramble] {
        let primary = SimDisk::new(DISK_BYTES, 1);
        let shadow = SimDisk::new(DISK_BYTES, 2);
        let config = shadowed(&primary, &shadow);
        assert!(config.shadow_queue_bytes > 0, "asynchronous by default");
        let (engine, index) = open(config);
        for key in 0..400 {
            index.put(&engine, digest(key), 1, body(key, 300));
        }
        engine.flush_tick().unwrap();
        for key in 400..700 {
            index.put(&engine, digest(key), 1, body(key, 300));
        }
        let survivor = shadow.power_cut(cut);
        drop(engine);
        let replacement = SimDisk::new(DISK_BYTES, 3);
        let (engine, index) = open(shadowed(&replacement, &survivor));
        let entries = index.entries.lock();
        for key in 0..400 {
            let (_, location) = &entries[&digest(key)];
            assert_eq!(engine.read(location).unwrap().as_ref(), body(key, 300));
        }
        for key in 400..700 {
            if let Some((_, location)) = entries.get(&digest(key)) {
                assert_eq!(engine.read(location).unwrap().as_ref(), body(key, 300));
            }
        }
    }
}
