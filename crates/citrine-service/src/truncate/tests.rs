#![allow(clippy::unwrap_used)]

use super::*;
use crate::batch::tests::{service, START_MS};
use crate::replication::ReplicaWrite;
use crate::tests::info;
use citrine_distribution::truncations::TRUNCATIONS_FILE;
use citrine_types::ResultCode;
use citrine_wire::digest::{of_key, UserKey};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// A copy applied to `service`'s node by the replica-write rule (the
/// distribution layer's, through the node's handle).
fn apply_replica_write(
    service: &crate::Service,
    write: &crate::replication::ReplicaWrite,
) -> citrine_types::ResultCode {
    crate::replication::apply_replica_write(service.dist(), write)
}

/// A stored body with one integer bin `v`.
fn body(value: i64) -> Vec<u8> {
    citrine_record::encode_body(
        None,
        &[citrine_record::Bin {
            name: b"v".as_slice().into(),
            particle_type: 1,
            value: value.to_be_bytes().to_vec().into(),
        }],
    )
    .unwrap()
}

/// Record `key` of `set` as a copy another node sends (`None`: a delete
/// marker).
fn copy_in(
    set: &str,
    key: i64,
    generation: u16,
    last_update_ms: u64,
    body: Option<Vec<u8>>,
) -> ReplicaWrite {
    ReplicaWrite {
        namespace: "test".into(),
        digest: of_key(set, &UserKey::Integer(key)),
        generation,
        life: 0,
        durable: false,
        void_time: 0,
        last_update_ms,
        set_name: set.as_bytes().to_vec(),
        body,
        xdr_write: false,
    }
}

/// Stores record `key` of `set` as a master's replica write would, last
/// updated at `last_update_ms`.
fn store(service: &Service, set: &str, key: i64, last_update_ms: u64) -> ResultCode {
    apply_replica_write(
        service,
        &copy_in(set, key, 1, last_update_ms, Some(body(key))),
    )
}

/// Records of `set` the node holds (live or not).
fn held(service: &Service, set: &str) -> i64 {
    let namespace = service.namespace(b"test").unwrap();
    namespace.sets.existing_id(set.as_bytes()).map_or(0, |id| {
        namespace.sets.stats(id).objects.load(Ordering::Relaxed)
    })
}

fn command(service: &Service, text: &str) -> String {
    info(service, &[text]).remove(0).1
}

/// Waits for the background removal a merge started.
fn wait_held(service: &Service, set: &str, expected: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while held(service, set) != expected {
        assert!(
            Instant::now() < deadline,
            "{set}: {} held",
            held(service, set)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_truncation_made_on_one_node_reaches_the_others_and_only_grows() {
    let (a, clock) = service();
    let (b, clock_b) = service();
    for service in [&a, &b] {
        for key in 0..3 {
            assert_eq!(store(service, "s", key, START_MS - 1_000), ResultCode::Ok);
        }
        for key in 0..2 {
            assert_eq!(store(service, "t", key, START_MS - 1_000), ResultCode::Ok);
        }
    }
    clock.advance_ms(10);
    assert_eq!(command(&a, "truncate:namespace=test;set=s"), "ok");
    assert_eq!((held(&a, "s"), held(&a, "t")), (0, 2));
    // A command without a lut covers its own millisecond.
    let lut = START_MS + 11;
    assert_eq!(
        a.dist().truncations_text(),
        format!("namespace=test;set=s;lut={lut};generation=1\n")
    );
    // B learns it from A's push: the records are hidden at once and
    // removed in the background; the other set keeps its records.
    b.dist().merge_truncations(&a.dist().truncations_text());
    let namespace = b.namespace(b"test").unwrap();
    let s = namespace.sets.existing_id(b"s").unwrap();
    assert!(namespace.is_truncated(s, START_MS - 1_000));
    wait_held(&b, "s", 0);
    assert_eq!(held(&b, "t"), 2);
    assert_eq!(b.dist().truncations_text(), a.dist().truncations_text());
    // A copy from before the threshold (a node that missed the command
    // migrating its records) is acknowledged and not stored; a later one is.
    assert_eq!(store(&b, "s", 7, lut - 1), ResultCode::Ok);
    assert_eq!(held(&b, "s"), 0);
    assert_eq!(store(&b, "s", 8, lut), ResultCode::Ok);
    assert_eq!(held(&b, "s"), 1);
    // An earlier threshold, from a peer or a command, changes nothing.
    b.dist()
        .merge_truncations(&format!("namespace=test;set=s;lut={}\n", lut - 500));
    let cut_ns = (lut - 500) * 1_000_000;
    assert_eq!(
        command(&b, &format!("truncate:namespace=test;set=s;lut={cut_ns}")),
        "ok"
    );
    assert_eq!(b.dist().truncations_text(), a.dist().truncations_text());
    assert_eq!(held(&b, "s"), 1);
    // A later one, the whole namespace, from B back to A.
    clock.advance_ms(10);
    clock_b.advance_ms(20);
    assert_eq!(store(&a, "t", 5, START_MS + 15), ResultCode::Ok);
    let cut_ns = (START_MS + 12) * 1_000_000;
    assert_eq!(
        command(
            &b,
            &format!("truncate-namespace:namespace=test;lut={cut_ns}")
        ),
        "ok"
    );
    assert_eq!(held(&b, "t"), 0);
    a.dist().merge_truncations(&b.dist().truncations_text());
    wait_held(&a, "t", 1);
    assert_eq!(
        a.dist().truncations_text(),
        format!(
            "namespace=test;lut={};generation=1\nnamespace=test;set=s;lut={lut};generation=1\n",
            START_MS + 12
        )
    );
}

#[test]
fn a_set_this_node_never_stored_is_truncated_for_the_records_that_come_later() {
    let (a, clock) = service();
    let (b, _) = service();
    assert_eq!(store(&a, "only_a", 1, START_MS - 5), ResultCode::Ok);
    clock.advance_ms(1);
    assert_eq!(command(&a, "truncate:namespace=test;set=only_a"), "ok");
    b.dist().merge_truncations(&a.dist().truncations_text());
    // B had no record of the set; the old copy A's peer migrates later is
    // refused, a newer one is stored.
    assert_eq!(store(&b, "only_a", 1, START_MS - 5), ResultCode::Ok);
    assert_eq!(held(&b, "only_a"), 0);
    assert_eq!(store(&b, "only_a", 2, START_MS + 5), ResultCode::Ok);
    assert_eq!(held(&b, "only_a"), 1);
}

#[test]
fn truncations_are_kept_in_the_work_directory() {
    let directory = std::env::temp_dir().join(format!(
        "citrine-truncate-{}-{:x}",
        std::process::id(),
        START_MS
    ));
    let _ = std::fs::remove_dir_all(&directory);
    std::fs::create_dir_all(&directory).unwrap();
    let (a, clock) = service();
    a.dist().keep_truncations(&directory).unwrap();
    clock.advance_ms(3);
    assert_eq!(command(&a, "truncate-namespace:namespace=test"), "ok");
    let file = directory.join(TRUNCATIONS_FILE);
    let saved = std::fs::read_to_string(&file).unwrap();
    assert_eq!(
        saved,
        format!("namespace=test;lut={};generation=1\n", START_MS + 4)
    );
    // A restart (a memory namespace comes back empty) keeps the threshold:
    // an older copy offered later is not stored. A line that is not a
    // truncation is dropped from the file.
    std::fs::write(&file, format!("{saved}namespace=;lut=5\nnonsense\n")).unwrap();
    let (restarted, _) = service();
    restarted.dist().keep_truncations(&directory).unwrap();
    assert_eq!(restarted.dist().truncations_text(), saved);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), saved);
    assert_eq!(store(&restarted, "s", 1, START_MS), ResultCode::Ok);
    assert_eq!(held(&restarted, "s"), 0);
    let _ = std::fs::remove_dir_all(&directory);
}

#[test]
fn bad_truncation_commands_and_pushes_change_nothing() {
    let (a, _) = service();
    assert_eq!(store(&a, "s", 1, START_MS - 5), ResultCode::Ok);
    for (text, expected) in [
        (
            "truncate:namespace=test;set=",
            "ERROR:4:missing 'set' value",
        ),
        (
            "truncate:set=;namespace=test",
            "ERROR:4:missing 'set' value",
        ),
        ("truncate:namespace=test", "ERROR:4:missing 'set'"),
        (
            "truncate:namespace=;set=s",
            "ERROR:20:missing 'namespace' value",
        ),
        ("truncate:set=s", "ERROR:20:missing 'namespace'"),
        ("truncate:ns=test;set=s", "ERROR:20:missing 'namespace'"),
        ("truncate-namespace:ns=test", "ERROR:20:missing 'namespace'"),
        ("truncate:namespace", "ERROR:20:missing 'namespace'"),
        ("truncate:namespace=test;set", "ERROR:4:missing 'set'"),
        ("truncate", "ERROR:20:missing 'namespace'"),
        (
            "truncate-namespace:namespace=",
            "ERROR:20:missing 'namespace' value",
        ),
        (
            "truncate-namespace:namespace=test;set=s",
            "ERROR:4:unexpected set name",
        ),
        (
            "truncate:namespace=test;set=s;lut=",
            "ERROR:4:missing 'lut' value",
        ),
        (
            "truncate:namespace=test;set=s;lut=12",
            "ERROR:4:would truncate to 0",
        ),
        (
            "truncate:namespace=test;set=s;lut=2147483649",
            "ERROR:4:would truncate to 0",
        ),
        (
            "truncate:namespace=test;set=s;lut=1262304000000999999",
            "ERROR:4:would truncate to 0",
        ),
        (
            "truncate:namespace=test;set=s;lut=x",
            "ERROR:4:would truncate to 0",
        ),
        (
            "truncate:namespace=test;set=s;lut=99999999999999999999",
            "ERROR:4:would truncate in the future",
        ),
        (
            "truncate:namespace=test;set=s;lut=-5",
            "ERROR:4:would truncate in the future",
        ),
        (
            "truncate-namespace:namespace=test;lut=1800000000000000000",
            "ERROR:4:would truncate in the future",
        ),
    ] {
        assert_eq!(command(&a, text), expected, "{text}");
        assert_eq!(held(&a, "s"), 1, "{text} removed a record");
    }
    let long_set = "s".repeat(64);
    assert_eq!(
        command(&a, &format!("truncate:namespace=test;set={long_set}")),
        "ERROR:4:'set' value too long"
    );
    // A namespace this node does not have: ok, as the reference answers,
    // and nothing is recorded or removed.
    assert_eq!(command(&a, "truncate:namespace=nope;set=s"), "ok");
    assert_eq!(command(&a, "truncate-namespace:namespace=nope"), "ok");
    assert_eq!(a.dist().truncations_text(), "");
    assert_eq!(held(&a, "s"), 1);
    // Nothing to undo: ok, and nothing recorded.
    assert_eq!(command(&a, "truncate-undo:namespace=test;set=s"), "ok");
    assert_eq!(command(&a, "truncate-namespace-undo:namespace=test"), "ok");
    assert_eq!(a.dist().truncations_text(), "");
    a.dist()
        .merge_truncations("garbage\nnamespace=test;lut=zero\nnamespace=test;set=s\n\n");
    assert_eq!(a.dist().truncations_text(), "");
    assert_eq!(held(&a, "s"), 1);
    // A namespace this node does not have is kept (and pushed on).
    a.dist().merge_truncations("namespace=elsewhere;lut=5\n");
    assert_eq!(
        a.dist().truncations_text(),
        "namespace=elsewhere;lut=5;generation=0\n"
    );
    assert_eq!(held(&a, "s"), 1);
}

/// A master's copy written afresh after a truncation (generation 1) reaches
/// a replica that has not learned the truncation yet and still holds the
/// truncated copy (or its tombstone) at a higher generation. The replica
/// must take it: answering "ok" while keeping its own copy would lose the
/// acknowledged write once the truncation arrives and removes that copy.
#[test]
fn a_replica_that_missed_a_truncation_takes_the_masters_fresh_copy() {
    use crate::replication::{call_kind, replica_payload};
    let (master, clock) = service();
    let (replica, _) = service();
    let copy = |key: i64, generation: u16, last_update_ms: u64, body: Option<Vec<u8>>| {
        copy_in("s", key, generation, last_update_ms, body)
    };
    // Key 1: both hold generation 19. Key 2: both hold its tombstone at
    // generation 20 (deleted before the truncation too).
    let old = START_MS - 1_000;
    for node in [&master, &replica] {
        assert_eq!(
            apply_replica_write(node, &copy(1, 19, old, Some(body(19)))),
            ResultCode::Ok
        );
        assert_eq!(
            apply_replica_write(node, &copy(2, 20, old, None)),
            ResultCode::Ok
        );
    }
    clock.advance_ms(10);
    assert_eq!(command(&master, "truncate:namespace=test;set=s"), "ok");
    assert_eq!(held(&master, "s"), 0);
    // The master writes both keys afresh; the truncation's push has not
    // reached the replica.
    let namespace = master.namespace(b"test").unwrap();
    let key = replica.cluster().cluster_key;
    for k in [1, 2] {
        let fresh = copy(k, 1, START_MS + 20, Some(body(100 + k)));
        let payload = replica_payload(key, namespace, &fresh);
        let answer = crate::block_on(replica.serve_fabric(call_kind::REPLICA_WRITE, &payload));
        assert_eq!(answer, vec![0]);
        let replica_namespace = replica.namespace(b"test").unwrap();
        let partition = replica_namespace
            .index
            .partition(fresh.digest.partition())
            .read();
        let stored = partition.get(&fresh.digest).map(|entry| {
            let meta = entry.meta();
            (meta.generation, meta.last_update_ms)
        });
        assert_eq!(stored, Some((1, START_MS + 20)), "key {k}");
    }
    // A master that knows no truncation (of set `u`) leaves the replica's
    // rule as it was: a copy at a higher generation wins over generation 1.
    let (other, _) = service();
    assert_eq!(
        apply_replica_write(&replica, &copy_in("u", 3, 19, old, Some(body(19)))),
        ResultCode::Ok
    );
    let payload = replica_payload(
        key,
        other.namespace(b"test").unwrap(),
        &copy_in("u", 3, 1, START_MS + 20, Some(body(103))),
    );
    let answer = crate::block_on(replica.serve_fabric(call_kind::REPLICA_WRITE, &payload));
    assert_eq!(answer, vec![0]);
    let replica_namespace = replica.namespace(b"test").unwrap();
    let digest = of_key("u", &UserKey::Integer(3));
    let generation = replica_namespace
        .index
        .partition(digest.partition())
        .read()
        .get(&digest)
        .map(|entry| entry.meta().generation);
    assert_eq!(generation, Some(19));
}

#[test]
fn a_replica_takes_the_truncation_a_copy_carries_before_its_push_arrives() {
    use crate::replication::{call_kind, replica_payload};
    let (master, clock) = service();
    let (replica, _) = service();
    let old = START_MS - 1_000;
    for node in [&master, &replica] {
        for k in 0..4 {
            assert_eq!(store(node, "s", k, old), ResultCode::Ok);
            assert_eq!(store(node, "t", k, old), ResultCode::Ok);
            assert_eq!(store(node, "", k, old), ResultCode::Ok);
        }
    }
    clock.advance_ms(10);
    assert_eq!(command(&master, "truncate:namespace=test;set=s"), "ok");
    // A command without a lut covers its own millisecond.
    let lut = START_MS + 11;
    assert_eq!(
        master.dist().truncations_text(),
        format!("namespace=test;set=s;lut={lut};generation=1\n")
    );
    // A copy of set `t`, which no truncation covers, teaches nothing.
    let key = replica.cluster().cluster_key;
    let namespace = master.namespace(b"test").unwrap();
    let send = |write: &ReplicaWrite| {
        let payload = replica_payload(key, namespace, write);
        crate::block_on(replica.serve_fabric(call_kind::REPLICA_WRITE, &payload))
    };
    assert_eq!(
        send(&copy_in("t", 9, 1, START_MS + 20, Some(body(9)))),
        vec![0]
    );
    assert_eq!(replica.dist().truncations_text(), "");
    // The master's fresh write of key 0 of `s` carries its threshold: the
    // replica takes the truncation as its own (kept, pushed on) and removes
    // the set's older records, before the push has come.
    assert_eq!(
        send(&copy_in("s", 0, 1, START_MS + 20, Some(body(100)))),
        vec![0]
    );
    // Marked as taken from a copy, below the command's own entry.
    assert_eq!(
        replica.dist().truncations_text(),
        format!("namespace=test;set=s;lut={lut};generation=0;carried=1\n")
    );
    let replica_namespace = replica.namespace(b"test").unwrap();
    let s = replica_namespace.sets.existing_id(b"s").unwrap();
    assert!(replica_namespace.is_truncated(s, old));
    wait_held(&replica, "s", 1);
    assert_eq!((held(&replica, "t"), held(&replica, "")), (5, 4));
    // A whole-namespace truncation reaches a record in no set the same way.
    clock.advance_ms(10);
    let cut = START_MS + 15;
    assert_eq!(
        command(
            &master,
            &format!("truncate-namespace:namespace=test;lut={}", cut * 1_000_000)
        ),
        "ok"
    );
    assert_eq!(
        send(&copy_in("", 0, 1, START_MS + 30, Some(body(200)))),
        vec![0]
    );
    assert!(replica.dist().truncations_text().contains(&format!(
        "namespace=test;lut={cut};generation=0;carried=1\n"
    )));
    // Only the copies written after it stay (key 9 of `t` at +20 too).
    wait_held(&replica, "", 1);
    wait_held(&replica, "t", 1);
    wait_held(&replica, "s", 1);
    // The push that follows changes nothing more.
    replica
        .dist()
        .merge_truncations(&master.dist().truncations_text());
    assert_eq!(
        replica.dist().truncations_text(),
        master.dist().truncations_text()
    );
}

/// The same for the other ways a copy travels while a truncation's push is
/// on its way: a migration batch and its delta, and a duplicate-resolution
/// answer, each carry the sender's threshold for the record's set.
#[test]
fn migrations_and_duplicate_resolution_carry_the_senders_truncation() {
    use crate::migration::encode_partition_ref;
    use crate::replication::{call_kind, DupResAnswer, DupResRequest};
    let (sender, clock) = service();
    let (target, _) = service();
    let digest = of_key("s", &UserKey::Integer(4));
    let partition = digest.partition();
    let copy = |generation: u16, last_update_ms: u64, value: i64| {
        copy_in("s", 4, generation, last_update_ms, Some(body(value)))
    };
    let old = START_MS - 1_000;
    for node in [&sender, &target] {
        assert_eq!(
            apply_replica_write(node, &copy(19, old, 19)),
            ResultCode::Ok
        );
    }
    clock.advance_ms(10);
    assert_eq!(command(&sender, "truncate:namespace=test;set=s"), "ok");
    // A command without a lut covers its own millisecond.
    let lut = START_MS + 11;
    let fresh = copy(1, START_MS + 20, 1);
    assert_eq!(apply_replica_write(&sender, &fresh), ResultCode::Ok);
    let generation_at = |node: &Service| {
        let namespace = node.namespace(b"test").unwrap();
        let partition = namespace.index.partition(partition).read();
        partition.get(&digest).map(|entry| entry.meta().generation)
    };
    assert_eq!(generation_at(&sender), Some(1));

    // The delta: the target's manifest lists generation 19, from before
    // the sender's threshold, so the fresh copy is sent.
    let manifest = target
        .dist()
        .manifest(&encode_partition_ref("test", partition));
    let manifest = crate::migration::parse_manifest(&manifest).unwrap();
    let delta = sender
        .dist()
        .migration_delta("test", partition, &[digest], &manifest);
    assert_eq!(delta, Some(vec![digest]));

    // The batch carries the threshold, and the target takes the copy.
    let (batch, consumed) = sender
        .dist()
        .migration_batch(0, "test", partition, &[digest], 0);
    assert_eq!(consumed, 1);
    assert_eq!(batch.truncated_before, vec![(b"s".to_vec(), lut)]);
    assert_eq!(
        target.dist().apply_migrate_batch(&batch.encode()),
        ResultCode::Ok
    );
    assert_eq!(generation_at(&target), Some(1));

    // Duplicate resolution: the sender's answer carries it too, and a
    // master holding the old copy takes the answer's.
    let (master, _) = service();
    assert_eq!(
        apply_replica_write(&master, &copy(19, old, 19)),
        ResultCode::Ok
    );
    let request = DupResRequest {
        cluster_key: sender.cluster().cluster_key,
        namespace: "test".into(),
        digest,
    };
    let answer = crate::block_on(sender.serve_fabric(call_kind::DUPRES, &request.encode()));
    let answer = DupResAnswer::decode(&answer).unwrap();
    assert_eq!(answer.truncated_before, lut);
    let record = answer.record.unwrap();
    assert_eq!(
        crate::replication::apply_copy(master.dist(), &record, answer.truncated_before),
        ResultCode::Ok
    );
    assert_eq!(generation_at(&master), Some(1));
}

/// A copy sent before a truncation and sent again after it (its
/// acknowledgment was lost) carries the truncation the second time, and a
/// target that has not learned it yet does not let it replace the copy
/// written after the truncation.
#[test]
fn a_copy_sent_again_after_a_truncation_carries_it() {
    use crate::replication::{refresh_truncation, replica_payload, split_replica_payload};
    let (sender, clock) = service();
    let (target, _) = service();
    let digest = of_key("s", &UserKey::Integer(5));
    let copy = |generation: u16, last_update_ms: u64| {
        copy_in(
            "s",
            5,
            generation,
            last_update_ms,
            Some(body(i64::from(generation))),
        )
    };
    let old = copy(28, START_MS - 1_000);
    assert_eq!(apply_replica_write(&sender, &old), ResultCode::Ok);
    let namespace = sender.namespace(b"test").unwrap();
    let mut payload = replica_payload(target.cluster().cluster_key, namespace, &old);
    let (mut batch, _) = sender
        .dist()
        .migration_batch(0, "test", digest.partition(), &[digest], 0);
    assert_eq!(batch.truncated_before, vec![(b"s".to_vec(), 0)]);
    clock.advance_ms(10);
    assert_eq!(command(&sender, "truncate:namespace=test;set=s"), "ok");
    // A command without a lut covers its own millisecond.
    let lut = START_MS + 11;
    refresh_truncation(namespace, &mut payload);
    assert_eq!(
        split_replica_payload(&payload).map(|(_, t, _)| t),
        Some(lut)
    );
    sender.dist().refresh_truncations(&mut batch);
    assert_eq!(batch.truncated_before, vec![(b"s".to_vec(), lut)]);
    // The target already holds the copy written after the truncation.
    let fresh = copy(1, START_MS + 20);
    assert_eq!(apply_replica_write(&target, &fresh), ResultCode::Ok);
    let generation = || {
        let namespace = target.namespace(b"test").unwrap();
        let partition = namespace.index.partition(digest.partition()).read();
        partition.get(&digest).map(|entry| entry.meta().generation)
    };
    let answer = crate::block_on(
        target.serve_fabric(crate::replication::call_kind::REPLICA_WRITE, &payload),
    );
    assert_eq!(answer, vec![0]);
    assert_eq!(generation(), Some(1));
    assert_eq!(
        target.dist().apply_migrate_batch(&batch.encode()),
        ResultCode::Ok
    );
    assert_eq!(generation(), Some(1));
    // The target took the truncation from the first copy.
    assert_eq!(
        target.dist().truncations_text(),
        format!("namespace=test;set=s;lut={lut};generation=0;carried=1\n")
    );
    // Without the truncation the copy carries, at a node that does not
    // know it, the old copy wins by generation.
    let (unaware, _) = service();
    assert_eq!(apply_replica_write(&unaware, &fresh), ResultCode::Ok);
    assert_eq!(
        crate::replication::apply_copy(unaware.dist(), &old, 0),
        ResultCode::Ok
    );
    let namespace = unaware.namespace(b"test").unwrap();
    let partition = namespace.index.partition(digest.partition()).read();
    let held = partition.get(&digest).map(|entry| entry.meta().generation);
    assert_eq!(held, Some(28));
}

/// `truncate-undo` and `truncate-namespace-undo`: the threshold goes here
/// at once and on a peer with the push; what was removed stays removed,
/// copies from before the old threshold are stored again, and a copy
/// still carrying the undone threshold does not bring it back.
#[test]
fn an_undone_truncation_lets_older_copies_in_again_everywhere() {
    let (a, clock) = service();
    let (b, _) = service();
    for node in [&a, &b] {
        assert_eq!(store(node, "s", 1, START_MS - 1_000), ResultCode::Ok);
    }
    clock.advance_ms(10);
    let lut = START_MS + 11;
    assert_eq!(command(&a, "truncate:namespace=test;set=s"), "ok");
    b.dist().merge_truncations(&a.dist().truncations_text());
    wait_held(&b, "s", 0);
    let epoch_ms = citrine_types::CITRUSLEAF_EPOCH_UNIX_SECONDS * 1000;
    let shown = format!(":truncate_lut={}:", lut - epoch_ms);
    assert!(command(&a, "sets/test/s").contains(&shown));

    assert_eq!(command(&a, "truncate-undo:namespace=test;set=s"), "ok");
    assert_eq!(
        a.dist().truncations_text(),
        format!("namespace=test;set=s;lut=0;generation=2;highest={lut}\n")
    );
    assert!(command(&a, "sets/test/s").contains(":truncate_lut=0:"));
    // Removed records stay removed; an older copy is stored again.
    assert_eq!(held(&a, "s"), 0);
    assert_eq!(store(&a, "s", 2, START_MS - 1_000), ResultCode::Ok);
    assert_eq!(held(&a, "s"), 1);
    // The push takes the undo to B; B's own earlier entry does not win.
    b.dist().merge_truncations(&a.dist().truncations_text());
    assert_eq!(b.dist().truncations_text(), a.dist().truncations_text());
    assert_eq!(store(&b, "s", 2, START_MS - 1_000), ResultCode::Ok);
    assert_eq!(held(&b, "s"), 1);
    // A copy from a node that missed the undo carries the old threshold:
    // not taken again, and the push of the old entry loses.
    b.dist().adopt_carried_truncation("test", b"s", lut);
    b.dist()
        .merge_truncations(&format!("namespace=test;set=s;lut={lut};generation=1\n"));
    assert_eq!(b.dist().truncations_text(), a.dist().truncations_text());
    assert_eq!(held(&b, "s"), 1);
    // A later truncation after the undo may be at an earlier lut.
    let earlier = START_MS - 500;
    let command_text = format!("truncate:namespace=test;set=s;lut={}", earlier * 1_000_000);
    assert_eq!(command(&a, &command_text), "ok");
    wait_held(&a, "s", 0);

    // The namespace's own truncation is undone the same way.
    clock.advance_ms(10);
    assert_eq!(command(&a, "truncate-namespace:namespace=test"), "ok");
    assert!(command(&a, "namespace/test")
        .contains(&format!(";truncate_lut={};", START_MS + 21 - epoch_ms)));
    assert_eq!(store(&a, "t", 1, START_MS), ResultCode::Ok);
    assert_eq!(held(&a, "t"), 0);
    assert_eq!(command(&a, "truncate-namespace-undo:namespace=test"), "ok");
    assert!(command(&a, "namespace/test").contains(";truncate_lut=0;"));
    assert_eq!(store(&a, "t", 1, START_MS), ResultCode::Ok);
    assert_eq!(held(&a, "t"), 1);
}

/// A truncation of a set no record of which is held here creates no set
/// (`sets` does not list it, as the reference's); the first record that
/// comes creates it, with the truncation's threshold (not reported: the
/// reference's set shows truncate_lut=0).
#[test]
fn a_truncation_waits_for_its_sets_first_record() {
    let (a, clock) = service();
    clock.advance_ms(10);
    assert_eq!(command(&a, "truncate:namespace=test;set=never"), "ok");
    assert_eq!(command(&a, "sets/test/never"), "");
    assert_eq!(command(&a, "sets"), "");
    assert_eq!(store(&a, "never", 1, START_MS - 1_000), ResultCode::Ok);
    assert_eq!(held(&a, "never"), 0);
    // The threshold refuses the older copy, but the set reports none: the
    // reference ignores a truncation of a set it does not have.
    assert!(command(&a, "sets/test/never").contains(":truncate_lut=0:"));
    assert_eq!(store(&a, "never", 2, START_MS + 20), ResultCode::Ok);
    assert_eq!(held(&a, "never"), 1);
    // A truncation of the set once it exists is reported.
    clock.advance_ms(10);
    assert_eq!(command(&a, "truncate:namespace=test;set=never"), "ok");
    let epoch_ms = citrine_types::CITRUSLEAF_EPOCH_UNIX_SECONDS * 1000;
    let shown = format!(":truncate_lut={}:", START_MS + 21 - epoch_ms);
    assert!(command(&a, "sets/test/never").contains(&shown));
}
