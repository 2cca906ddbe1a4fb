//! Unit tests of the migration codecs and plans that need no node.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::replication::ReplicaWrite;
use std::time::Duration;

fn record(partition: u16, seed: u8, generation: u16) -> ReplicaWrite {
    let mut digest = [seed; 20];
    digest[0] = (partition & 0xFF) as u8;
    digest[1] = (partition >> 8) as u8;
    ReplicaWrite {
        namespace: "test".into(),
        digest: Digest(digest),
        generation,
        life: 0,
        durable: false,
        void_time: 0,
        last_update_ms: 1_700_000_000_000 - 1000 + u64::from(generation),
        set_name: b"demo".to_vec(),
        body: Some(vec![seed, 1, 2]),
        xdr_write: false,
    }
}

#[test]
fn batch_round_trip_and_garbage() {
    let batch = MigrateBatch {
        cluster_key: 0xABCD,
        source: NodeId(7),
        flags: FLAG_FIRST | FLAG_LAST,
        namespace: "test".into(),
        partition: 4095,
        records: vec![record(4095, 1, 1).encode(), vec![]],
        truncated_before: vec![(Vec::new(), 5), (b"set".to_vec(), 1_700_000_000_000)],
        txn: Vec::new(),
    };
    let bytes = batch.encode();
    assert_eq!(MigrateBatch::decode(&bytes), Some(batch.clone()));
    for cut in 0..bytes.len() {
        assert_eq!(MigrateBatch::decode(&bytes[..cut]), None, "cut {cut}");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert_eq!(MigrateBatch::decode(&longer), None);
    let bad_partition = MigrateBatch {
        partition: 4096,
        ..batch
    };
    assert_eq!(MigrateBatch::decode(&bad_partition.encode()), None);
    assert_eq!(
        decode_drop(&encode_drop(
            9,
            NodeId(3),
            "test",
            PartitionId::new(17).expect("pid")
        )),
        Some((9, "test".to_owned(), 17, NodeId(3)))
    );
    assert_eq!(
        decode_partition_ref(&[4, b't', b'e', b's', b't', 0x10]),
        None
    );
}

/// The wire change of transaction states in batches: without
/// [`FLAG_TXN`] a batch is byte for byte the layout older nodes send
/// (nothing after the sets); with it, `u32 count | count × (u32 record |
/// u32 len | state)` follows the sets, and a state naming no record of
/// the batch is refused.
#[test]
fn a_batch_carries_transaction_states_only_with_its_flag() {
    let plain = MigrateBatch {
        cluster_key: 1,
        source: NodeId(2),
        flags: FLAG_LAST,
        namespace: "ns".into(),
        partition: 3,
        records: vec![vec![9]],
        truncated_before: Vec::new(),
        txn: Vec::new(),
    };
    let old_layout = [
        &1u64.to_be_bytes()[..],
        &2u64.to_be_bytes(),
        &[
            FLAG_LAST, 2, b'n', b's', 0, 3, 0, 0, 0, 1, 0, 0, 0, 1, 9, 0, 0,
        ],
    ]
    .concat();
    assert_eq!(plain.encode(), old_layout);
    let with_state = MigrateBatch {
        flags: FLAG_LAST | FLAG_TXN,
        txn: vec![(0, vec![1, 7])],
        ..plain.clone()
    };
    let bytes = with_state.encode();
    let tail = [0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 1, 7];
    let mut flagged = old_layout.clone();
    flagged[16] |= FLAG_TXN;
    assert_eq!(bytes, [&flagged[..], &tail].concat());
    assert_eq!(MigrateBatch::decode(&bytes), Some(with_state.clone()));
    // The flag without the section, or the section without the flag.
    assert_eq!(MigrateBatch::decode(&flagged), None);
    assert_eq!(
        MigrateBatch::decode(&[&old_layout[..], &tail].concat()),
        None
    );
    let beyond = MigrateBatch {
        txn: vec![(1, vec![0])],
        ..with_state
    };
    assert_eq!(MigrateBatch::decode(&beyond.encode()), None);
}

#[test]
fn snapshots_round_trip_and_refuse_garbage() {
    let lineage = |version, covers: &[u64]| Lineage {
        version,
        covers: Covers::from_keys(covers.iter().copied()),
    };
    let holdings = vec![
        (3u16, lineage(PartitionVersion::full(8), &[7, 5]), 10u64),
        (4095, lineage(PartitionVersion::subset(9), &[]), 1),
    ];
    let mut bytes = Vec::new();
    encode_snapshot(&mut bytes, "test", &holdings);
    encode_snapshot(&mut bytes, "bar", &[]);
    let snapshot = decode_snapshot(&bytes).expect("snapshot");
    assert_eq!(snapshot.namespaces.get("test"), Some(&holdings));
    assert_eq!(snapshot.namespaces.get("bar"), Some(&Vec::new()));
    assert!(snapshot.sc.is_empty());
    // An SC section ends the snapshot; the namespaces before it decode as
    // they did.
    let mut with_sc = bytes.clone();
    let entry = crate::sc::partitions::ScEntry {
        roster: "A1".into(),
        regime: 4,
        revive: false,
        versions: vec![Default::default(); PARTITIONS],
    };
    let section = ScSection::from([("sc".to_owned(), entry)]);
    crate::sc::partitions::encode_section(&mut with_sc, &section);
    let decoded = decode_snapshot(&with_sc).expect("with SC");
    assert_eq!(decoded.namespaces.get("test"), Some(&holdings));
    assert_eq!(decoded.sc, section);
    with_sc.push(9);
    assert!(
        decode_snapshot(&with_sc).is_none(),
        "bytes after the section"
    );
    for cut in 1..bytes.len() {
        if cut != bytes.len() - 6 {
            assert!(decode_snapshot(&bytes[..cut]).is_none(), "cut {cut}");
        }
    }
    let mut zero = Vec::new();
    encode_snapshot(&mut zero, "test", &[(1, Lineage::ZERO, 1)]);
    assert!(decode_snapshot(&zero).is_none());
    // Covers past the limit, zero or repeated are refused.
    let one = |covers: &[u64]| {
        let mut bytes = Vec::new();
        encode_snapshot(
            &mut bytes,
            "t",
            &[(1, lineage(PartitionVersion::full(2), &[]), 1)],
        );
        bytes.pop();
        bytes.push(covers.len() as u8);
        for ckey in covers {
            bytes.extend_from_slice(&ckey.to_be_bytes());
        }
        decode_snapshot(&bytes)
    };
    assert!(one(&[4, 3]).is_some());
    assert!(one(&[4, 0]).is_none());
    assert!(one(&[4, 4]).is_none());
    assert!(one(&[1; exchange::COVERS_MAX + 1]).is_none());
}

#[test]
fn the_hottest_partition_goes_first_then_the_smallest() {
    let migrations = Migrations::new(["test"].into_iter(), 1);
    let task = |pid: u16, records: u64| MigrateTask {
        namespace: "test".into(),
        partition: PartitionId::new(pid).expect("pid"),
        targets: Vec::new(),
        retire: Vec::new(),
        drop_after: false,
        records,
        pull_from: Vec::new(),
        clear: Vec::new(),
    };
    let queue = vec![task(5, 1), task(9, 10), task(7, 20)];
    assert_eq!(migrations.hottest(&queue), 0, "nothing hot: plan order");
    migrations.state.lock().hits.insert(("test".into(), 7), 2);
    migrations.state.lock().hits.insert(("test".into(), 9), 3);
    assert_eq!(migrations.hottest(&queue), 1);
    migrations.state.lock().hits.insert(("test".into(), 7), 3);
    assert_eq!(migrations.hottest(&queue), 1, "ties: the earlier (smaller)");
}

#[test]
fn the_rate_limit_spaces_batches() {
    let migrations = Migrations::new(["test"].into_iter(), 1);
    assert_eq!(migrations.throttle(500, 0), Duration::ZERO);
    migrations
        .max_records_per_sec
        .store(1000, Ordering::Relaxed);
    assert_eq!(migrations.throttle(500, 1_000_000), Duration::ZERO);
    // The next 500 may go half a second after the first.
    assert_eq!(
        migrations.throttle(500, 1_100_000),
        Duration::from_millis(400)
    );
    assert_eq!(migrations.throttle(0, 1_100_000), Duration::ZERO);
}
