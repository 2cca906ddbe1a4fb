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

/// The namespace's thresholds as `get-config` shows them.
fn shown(service: &Service) -> Vec<(String, String)> {
    let answer = info(service, &["get-config:context=namespace;id=test"]);
    answer[0]
        .1
        .split(';')
        .filter(|pair| pair.contains("evict-") || pair.contains("stop-writes-"))
        .filter_map(|pair| pair.split_once('='))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect()
}

/// `set-config` of the thresholds answers as the reference (Aerospike CE
/// 8.1.2, asked the same commands side by side): the value stored, the
/// errors, one value per command (the first in the reference's order).
#[test]
fn set_config_of_thresholds_answers_as_the_reference() {
    let (service, _) = service_with(memory_namespace(2 << 20));
    let ask = |params: &str| {
        let command = format!("set-config:context=namespace;{params}");
        info(&service, &[&command])[0].1.clone()
    };
    let get = |name: &str| {
        let shown = shown(&service);
        let found = shown
            .iter()
            .find(|(key, _)| key == name || key.strip_prefix("storage-engine.") == Some(name));
        found.map(|(_, value)| value.clone()).unwrap_or_default()
    };
    let invalid = "ERROR:4:invalid set-config parameter";
    let cases: [(&str, &str, &str, &str); 18] = [
        (
            "id=test;evict-tenths-pct=10",
            "ok",
            "evict-tenths-pct",
            "10",
        ),
        (
            "id=test;evict-tenths-pct=-1",
            "ok",
            "evict-tenths-pct",
            "4294967295",
        ),
        (
            "id=test;evict-tenths-pct=12abc",
            "ok",
            "evict-tenths-pct",
            "12",
        ),
        ("id=test;evict-used-pct=33", "ok", "evict-used-pct", "33"),
        (
            "id=test;evict-used-pct=101",
            invalid,
            "evict-used-pct",
            "33",
        ),
        ("id=test;evict-used-pct=+5", invalid, "evict-used-pct", "33"),
        ("id=test;evict-used-pct=", "ok", "evict-used-pct", "0"),
        (
            "id=test;stop-writes-used-pct=100",
            "ok",
            "stop-writes-used-pct",
            "100",
        ),
        (
            "id=test;stop-writes-used-pct= 7",
            invalid,
            "stop-writes-used-pct",
            "100",
        ),
        (
            "id=test;stop-writes-avail-pct=41",
            "ok",
            "stop-writes-avail-pct",
            "41",
        ),
        (
            "id=test;stop-writes-avail-pct=101",
            invalid,
            "stop-writes-avail-pct",
            "41",
        ),
        (
            "id=test;evict-hist-buckets=50",
            invalid,
            "evict-hist-buckets",
            "10000",
        ),
        (
            "id=test;evict-hist-buckets=100",
            "ok",
            "evict-hist-buckets",
            "100",
        ),
        (
            "id=test;evict-hist-buckets=",
            invalid,
            "evict-hist-buckets",
            "100",
        ),
        // One value a command: evict-used-pct comes first, the rest is not
        // looked at (not even checked).
        (
            "id=test;stop-writes-used-pct=56;evict-used-pct=12",
            "ok",
            "stop-writes-used-pct",
            "100",
        ),
        (
            "id=test;stop-writes-used-pct=35;stop-writes-avail-pct=135",
            invalid,
            "stop-writes-used-pct",
            "100",
        ),
        (
            "id=test;bogus=1;evict-used-pct=13",
            "ok",
            "evict-used-pct",
            "13",
        ),
        (
            "namespace=test;evict-tenths-pct=6",
            "ok",
            "evict-tenths-pct",
            "6",
        ),
    ];
    for (params, answer, name, stored) in cases {
        assert_eq!(ask(params), answer, "{params}");
        assert_eq!(get(name), stored, "{params}: {name}");
    }
    assert_eq!(ask("evict-used-pct=5"), "ERROR:20:missing 'namespace'");
    assert_eq!(
        ask("id=;evict-used-pct=5"),
        "ERROR:20:missing 'namespace' value"
    );
    assert_eq!(
        ask("id=nope;evict-tenths-pct=5"),
        "ERROR:20:namespace not found on node"
    );
}

/// Thresholds set at run time act at once: stop-writes on a memory and
/// on a device namespace, eviction by evict-used-pct.
#[test]
fn thresholds_set_at_run_time_act() {
    let (service, clock) = service_with(memory_namespace(2 << 20));
    fill(&service, 500, 600, |index| 1000 + index);
    let set = |params: &str| {
        let command = format!("set-config:context=namespace;id=test;{params}");
        assert_eq!(info(&service, &[&command])[0].1, "ok", "{params}");
    };
    let write = |key: &str| {
        send(&service, &put(key, Ops::new().int(op_type::WRITE, "a", 1)))
            .header
            .result_code
    };
    set("stop-writes-used-pct=1");
    assert_eq!(write("refused"), ResultCode::OutOfSpace.code());
    set("stop-writes-used-pct=90");
    assert_eq!(write("accepted"), 0);
    set("stop-writes-avail-pct=100");
    assert_eq!(write("refused"), ResultCode::OutOfSpace.code());
    set("stop-writes-avail-pct=0");
    let namespace = service.namespace(b"test").unwrap();
    clock.advance_ms(1);
    assert_eq!(nsup::run_pass(namespace, service.now()).evicted, 0);
    set("evict-used-pct=1");
    set("evict-tenths-pct=1000");
    assert!(nsup::run_pass(namespace, service.now()).evicted > 0);

    let disk = SimDisk::new((1 << 20) + 32 * (64 << 10), 7);
    let engine = DeviceConfig {
        write_block_size: 64 << 10,
        media: Media::Simulated(vec![disk]),
        ..DeviceConfig::new("test", vec!["sim0".into()], 0)
    };
    let (service, _) = service_with(NamespaceConfig {
        storage_engine: StorageEngineConfig::Device {
            engine,
            flush_max_ms: 1000,
            index_image: None,
        },
        ..NamespaceConfig::in_memory("test")
    });
    fill(&service, 100, 600, |_| 0);
    let command = "set-config:context=namespace;id=test;stop-writes-used-pct=1";
    assert_eq!(info(&service, &[command])[0].1, "ok");
    let refused = send(&service, &put("x", Ops::new().int(op_type::WRITE, "a", 1)));
    assert_eq!(refused.header.result_code, ResultCode::OutOfSpace.code());
}
