//! Eviction's pace and thresholds through the service: one nsup pass
//! evicts at most `evict-tenths-pct` tenths of a percent of a namespace's
//! records (whole void-time buckets only, none when the first bucket alone
//! is over), on memory and device namespaces, and the next passes go on.

use super::*;
use citrine_storage::device::io::SimDisk;
use citrine_storage::device::{DeviceConfig, Media};

/// Writes `count` records of `bytes` bytes with TTLs `ttl(i)`; all must
/// be stored.
fn fill(service: &Service, count: u32, bytes: usize, ttl: impl Fn(u32) -> u32) {
    let value = vec![7u8; bytes];
    for index in 0..count {
        let frame = request(
            &format!("k{index}"),
            MsgHeader {
                info2: info2::WRITE,
                record_ttl: ttl(index),
                ..MsgHeader::default()
            },
            &Ops::new().op(op_type::WRITE, 4, "b", &value),
            false,
        );
        assert_eq!(send(service, &frame).header.result_code, 0, "write {index}");
    }
}

fn found(service: &Service, key: &str) -> bool {
    send(service, &get(key)).header.result_code == 0
}

fn memory_namespace(data_size: u64) -> NamespaceConfig {
    NamespaceConfig {
        storage_engine: StorageEngineConfig::Memory {
            data_size,
            evict_used_pct: 50,
            stop_writes_used_pct: 90,
        },
        ..NamespaceConfig::in_memory("test")
    }
}

/// Memory: 2 000 records, each its own TTL, well over evict-used-pct: a
/// pass at the default 5 tenths evicts at most 10 (the soonest to
/// expire), the next pass 10 more; at 1000 tenths a pass evicts many.
#[test]
fn a_memory_pass_evicts_at_most_evict_tenths_pct_of_the_records() {
    let (service, clock) = service_with(memory_namespace(2 << 20));
    fill(&service, 2000, 600, |index| 1000 + index);
    let namespace = service.namespace(b"test").unwrap();
    assert!(namespace.used_pct() > 55, "used {}%", namespace.used_pct());
    clock.advance_ms(1);
    let first = nsup::run_pass(namespace, service.now()).evicted;
    assert!((1..=10).contains(&first), "first pass evicted {first}");
    assert!(!found(&service, "k0") && found(&service, "k10"));
    let second = nsup::run_pass(namespace, service.now()).evicted;
    assert!((1..=10).contains(&second), "second pass evicted {second}");
    assert!(!found(&service, "k9") && found(&service, "k20"));
    assert!(namespace.used_pct() > 50);
    namespace.thresholds.set_evict_tenths_pct(1000);
    let unbounded = nsup::run_pass(namespace, service.now()).evicted;
    assert!(unbounded > 200, "an unbounded pass evicted {unbounded}");
    assert!(found(&service, "k1999"));
}

/// When the records soonest to expire (one histogram bucket: here every
/// record has the same TTL) are more than a pass may evict, the pass
/// evicts none, as the reference (it never evicts part of a bucket).
#[test]
fn a_first_bucket_over_the_limit_evicts_nothing() {
    let (service, clock) = service_with(memory_namespace(2 << 20));
    fill(&service, 2000, 600, |_| 5000);
    let namespace = service.namespace(b"test").unwrap();
    clock.advance_ms(1);
    assert_eq!(nsup::run_pass(namespace, service.now()).evicted, 0);
    assert!(found(&service, "k0"));
    namespace.thresholds.set_evict_tenths_pct(1000);
    assert_eq!(nsup::run_pass(namespace, service.now()).evicted, 2000);
}

/// Device (simulated disk of 32 write blocks of 64 KiB): 1 500 records,
/// over evict-used-pct 30; a pass evicts at most 7 (0.5 %), soonest to
/// expire first, each with its tombstone.
#[test]
fn a_device_pass_evicts_at_most_evict_tenths_pct_of_the_records() {
    let disk = SimDisk::new((1 << 20) + 32 * (64 << 10), 7);
    let engine = DeviceConfig {
        write_block_size: 64 << 10,
        evict_used_pct: 30,
        media: Media::Simulated(vec![disk]),
        ..DeviceConfig::new("test", vec!["sim0".into()], 0)
    };
    let (service, clock) = service_with(NamespaceConfig {
        storage_engine: StorageEngineConfig::Device {
            engine,
            flush_max_ms: 1000,
            index_image: None,
        },
        ..NamespaceConfig::in_memory("test")
    });
    fill(&service, 1500, 600, |index| 1000 + index);
    let namespace = service.namespace(b"test").unwrap();
    assert!(namespace.used_pct() > 31, "used {}%", namespace.used_pct());
    clock.advance_ms(1);
    let first = nsup::run_pass(namespace, service.now()).evicted;
    assert!((1..=7).contains(&first), "first pass evicted {first}");
    assert!(!found(&service, "k0") && found(&service, "k7"));
    namespace.thresholds.set_evict_tenths_pct(1000);
    let unbounded = nsup::run_pass(namespace, service.now()).evicted;
    assert!(unbounded > 100, "an unbounded pass evicted {unbounded}");
    assert!(found(&service, "k1499"));
}
