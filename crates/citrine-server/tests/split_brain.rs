//! AP split brain with data, over a real network split between two network
//! namespaces (`common::netns`; needs root, `CITRINE_SKIP_NETNS=1` skips
//! it): a cluster of four `citrined` processes (two per side, replication
//! factor 2, `examples/cluster.toml`: conflict-resolution-policy
//! `generation`) splits into two clusters that both keep serving reads and
//! writes; then the network heals and the clusters merge.
//!
//! Writes during the split, each through a node of one side (and read back
//! through the other node of that side):
//! - `only-a-*` / `only-b-*`: records created on one side only;
//! - `both-*`: records written before the split, then updated on both
//!   sides, a different number of times;
//! - `new-both-*`: records created on both sides during the split, a
//!   different number of times;
//! - `gone-*`: records written before the split and deleted on one side
//!   during it: the delete (a tombstone) must win over the other side's
//!   older copy, on every node.
//!
//! For every record written on both sides, the side with more updates
//! writes first and the side with fewer writes last, so the generation
//! policy and the last-update-time policy would pick different winners:
//! the more-updated copy (higher generation) must win.
//!
//! After the merge and `cluster-stable` on every node: every record reads
//! as its winner through every node, the record's master has the winner's
//! copy (value and generation, read with a scan of the node), and every
//! partition's holders have identical copies (`partition-checksums`).
//!
//! At the merge the partition versions of the two sides differ, so every
//! copy is merged into every replica of the merged map (by delta), and a
//! replica's master resolves records against the other side's copy until
//! it is filled. Copies left on nodes outside a partition's replica list
//! are dropped (checked by `copies_matching_the_map`).

#![allow(clippy::unwrap_used)]

mod common;

use citrine_wire::digest::{of_key, UserKey};
use citrine_wire::frame::MessageType;
use citrine_wire::msg::{
    field_type, info1, info2, info3, op_type, Message, MessageWriter, MsgHeader,
};
use common::cluster::*;
use common::netns::{self, SplitNetwork};
use common::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Records of each kind.
const RECORDS: usize = 24;

/// What one record must hold after the merge.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Expected {
    value: String,
    generation: u16,
}

/// Writes `key` `times` times through `node`, values `{label}-{n}`; reads
/// the last one back through `reader` (the other node of the same side).
/// Returns the generation the last write answered (a side that held no
/// copy of a record written before the split starts it again at 1).
fn update(node: &Node, reader: &Node, key: &str, label: &str, times: usize) -> u16 {
    let mut stream = node.connect();
    let mut generation = 0;
    for n in 1..=times {
        let request = record_request(
            "test",
            key,
            MsgHeader {
                info2: info2::WRITE,
                transaction_ttl: 5000,
                ..MsgHeader::default()
            },
            &[(op_type::WRITE, 3, "v", format!("{label}-{n}").into_bytes())],
        );
        let (_, body) = round_trip(&mut stream, &request).unwrap();
        let header = decode_reply(&body).0;
        assert_eq!(
            header.result_code, 0,
            "write {n} of {key} through node {}",
            node.id
        );
        generation = header.generation as u16;
    }
    let (code, value) = get(&mut reader.connect(), key);
    assert_eq!(
        (code, value),
        (0, Some(format!("{label}-{times}").into_bytes())),
        "{key} read back through node {} during the split",
        reader.id
    );
    generation
}

/// Deletes `key` through `node`; checks through `reader` that it is gone.
/// Returns the delete's result code: 0, or 2 when this side held no copy.
fn delete_on_side(node: &Node, reader: &Node, key: &str) -> u8 {
    let code = delete(&mut node.connect(), key);
    assert!(code == 0 || code == 2, "delete {key}: {code}");
    assert_eq!(
        get(&mut reader.connect(), key).0,
        2,
        "{key} gone on its side"
    );
    code
}

/// A scan of namespace `test`, set `demo` on one node: its copies of the
/// partitions it masters (the others are reported unavailable) as digest →
/// (value of bin "v", generation).
fn local_copies(node: &Node) -> BTreeMap<[u8; 20], (String, u16)> {
    let mut frame = Vec::new();
    let header = MsgHeader {
        info1: info1::READ,
        info3: info3::PARTITION_DONE,
        ..MsgHeader::default()
    };
    let mut writer = MessageWriter::begin(&mut frame, &header);
    writer
        .field(field_type::NAMESPACE, b"test")
        .field(field_type::SET, b"demo")
        .field(field_type::TASK_ID, &11u64.to_be_bytes());
    writer.finish();
    let mut stream = node.connect();
    use std::io::Write;
    stream.write_all(&frame).unwrap();
    let mut copies = BTreeMap::new();
    loop {
        let (header, body) = read_frame(&mut stream).unwrap();
        assert_eq!(header.message_type, MessageType::Message);
        let mut rest = body.as_slice();
        while !rest.is_empty() {
            let (message, used) = Message::decode_prefix(rest).unwrap();
            rest = &rest[used..];
            if message.header.info3 & info3::LAST != 0 {
                assert_eq!(message.header.result_code, 0, "scan of node {}", node.id);
                return copies;
            }
            if message.header.info3 & info3::PARTITION_DONE != 0 {
                continue;
            }
            let digest = message
                .fields()
                .find(|field| field.field_type == field_type::DIGEST)
                .map(|field| <[u8; 20]>::try_from(field.data).unwrap())
                .unwrap();
            let value = message
                .ops()
                .find(|op| op.name == b"v")
                .map(|op| String::from_utf8_lossy(op.value).into_owned())
                .unwrap_or_default();
            copies.insert(digest, (value, message.header.generation as u16));
        }
    }
}

#[test]
fn a_split_brain_merges_to_the_generation_winner_on_every_replica() {
    if netns::skipped() {
        return;
    }
    let started = Instant::now();
    let network = SplitNetwork::new();
    let nodes = network.start_cluster(0x48);
    let all: Vec<&Node> = nodes.iter().collect();
    wait_for_stable(&all, Duration::from_secs(30));
    println!("4 nodes stable after {:?}", started.elapsed());

    let mut expected: BTreeMap<String, Expected> = BTreeMap::new();
    // Before the split: the `both-*` records, generation 1.
    let mut stream = nodes[0].connect();
    for i in 0..RECORDS {
        assert_eq!(put(&mut stream, &format!("both-{i}"), "base"), 0);
        assert_eq!(put(&mut stream, &format!("gone-{i}"), "base"), 0);
    }

    network.set_link(false);
    let took_a = wait_for_cluster(&all[..2], 2, Duration::from_secs(30));
    let took_b = wait_for_cluster(&all[2..], 2, Duration::from_secs(30));
    assert_ne!(
        nodes[0].cluster_info().unwrap().0,
        nodes[2].cluster_info().unwrap().0,
        "the two sides are distinct clusters"
    );
    wait_for_stable(&all[..2], Duration::from_secs(30));
    wait_for_stable(&all[2..], Duration::from_secs(30));
    println!("split into two clusters in {took_a:?} / {took_b:?}, each side stable");

    let (a, a_reader, b, b_reader) = (&nodes[0], &nodes[1], &nodes[2], &nodes[3]);
    for i in 0..RECORDS {
        let times = 1 + i % 3;
        for (side, writer, reader) in [("a", a, a_reader), ("b", b, b_reader)] {
            let key = format!("only-{side}-{i}");
            let generation = update(writer, reader, &key, &key, times);
            expected.insert(
                key.clone(),
                Expected {
                    value: format!("{key}-{times}"),
                    generation,
                },
            );
        }
    }
    // Deleted on one side only: the delete must win over the other side's
    // untouched (older) copy at the merge.
    // A side whose nodes held no replica of the record deletes nothing
    // (2): then the other side deletes it. A record the other side still
    // reads after the delete had copies on both sides (contested).
    let gone: Vec<String> = (0..RECORDS).map(|i| format!("gone-{i}")).collect();
    let mut contested = 0;
    for (i, key) in gone.iter().enumerate() {
        let (this, other) = if i.is_multiple_of(2) {
            ((a, a_reader), (b, b_reader))
        } else {
            ((b, b_reader), (a, a_reader))
        };
        let survivor = if delete_on_side(this.0, this.1, key) == 0 {
            other
        } else {
            assert_eq!(
                delete_on_side(other.0, other.1, key),
                0,
                "{key} is somewhere"
            );
            this
        };
        if get(&mut survivor.0.connect(), key).0 == 0 {
            contested += 1;
        }
    }
    println!("{contested} of {RECORDS} deleted records still live on the other side");
    assert!(contested > 0, "no deleted record had a copy on both sides");
    // Both sides: more updates first, on side A for even i and side B for
    // odd i; the other side updates fewer times afterwards (a later
    // last-update time).
    for (prefix, more, fewer) in [("both", 3, 1), ("new-both", 2, 1)] {
        let keys: Vec<String> = (0..RECORDS).map(|i| format!("{prefix}-{i}")).collect();
        let sides = |i: usize| {
            if i.is_multiple_of(2) {
                ((a, a_reader, "a"), (b, b_reader, "b"))
            } else {
                ((b, b_reader, "b"), (a, a_reader, "a"))
            }
        };
        let mut winners = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let ((writer, reader, side), _) = sides(i);
            let label = format!("{key}-{side}");
            let generation = update(writer, reader, key, &label, more);
            winners.push(Expected {
                value: format!("{label}-{more}"),
                generation,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
        for ((i, key), winner) in keys.iter().enumerate().zip(winners) {
            let (_, (writer, reader, side)) = sides(i);
            let generation = update(writer, reader, key, &format!("{key}-{side}"), fewer);
            assert!(
                generation < winner.generation,
                "{key}: the copy updated fewer times has generation {generation}, the other {}",
                winner.generation
            );
            expected.insert(key.clone(), winner);
        }
    }
    println!(
        "{} records written during the split, at {:?}",
        expected.len(),
        started.elapsed()
    );

    network.set_link(true);
    let took = wait_for_cluster(&all, 4, Duration::from_secs(40));
    let settled = wait_for_stable(&all, Duration::from_secs(60));
    println!("healed and merged in {took:?}, stable {settled:?} later");

    // Every record reads as its winner through every node.
    let mut wrong_reads = Vec::new();
    for node in &nodes {
        let mut stream = node.connect();
        for (key, winner) in &expected {
            let (code, value) = get(&mut stream, key);
            let value = value.map(|bytes| String::from_utf8_lossy(&bytes).into_owned());
            if (code, value.as_deref()) != (0, Some(winner.value.as_str())) {
                wrong_reads.push(format!(
                    "{key} through node {}: {code} {value:?}, expected {:?}",
                    node.id, winner.value
                ));
            }
        }
    }
    for node in &nodes {
        let mut stream = node.connect();
        for key in &gone {
            let (code, value) = get(&mut stream, key);
            if code != 2 {
                wrong_reads.push(format!(
                    "{key} through node {}: {code} {value:?}, deleted during the split",
                    node.id
                ));
            }
        }
    }
    // Every record's master has the winner's copy (a scan returns the
    // partitions a node masters); the replicas' copies equal the masters'
    // (checksums, below).
    let held: Vec<Vec<bool>> = nodes.iter().map(mastered_partitions).collect();
    let copies: Vec<_> = nodes.iter().map(local_copies).collect();
    let mut wrong_copies = Vec::new();
    for (key, winner) in &expected {
        let digest = of_key("demo", &UserKey::String(key.clone()));
        let pid = usize::from(digest.partition().get());
        for (index, node) in nodes.iter().enumerate() {
            if !held[index][pid] {
                continue;
            }
            let copy = copies[index].get(&digest.0);
            if copy != Some(&(winner.value.clone(), winner.generation)) {
                wrong_copies.push(format!(
                    "{key} (partition {pid}) on node {}: {copy:?}, expected {:?} generation {}",
                    node.id, winner.value, winner.generation
                ));
            }
        }
    }
    for key in &gone {
        let digest = of_key("demo", &UserKey::String(key.clone()));
        for (index, node) in nodes.iter().enumerate() {
            if let Some(copy) = copies[index].get(&digest.0) {
                wrong_copies.push(format!(
                    "{key} on node {}: {copy:?}, deleted during the split",
                    node.id
                ));
            }
        }
    }
    println!(
        "{} wrong reads, {} wrong copies",
        wrong_reads.len(),
        wrong_copies.len()
    );
    assert!(
        wrong_reads.is_empty() && wrong_copies.is_empty(),
        "after the merge:\nreads: {wrong_reads:#?}\ncopies: {wrong_copies:#?}"
    );
    // And every partition's holders agree byte for byte.
    assert_eq!(
        copies_matching_the_map(&all),
        (RECORDS * 4) as u64,
        "records held by the replica lists"
    );
    println!("done in {:?}", started.elapsed());
}
