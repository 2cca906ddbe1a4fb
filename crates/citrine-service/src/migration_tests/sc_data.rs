//! Strong-consistency namespaces on the request path, through whole
//! services in one [`World`]: the master of the view's SC map runs every
//! request and acknowledges a write only once every replica of the map
//! stored it; replicas refuse another regime's writes; a write whose
//! replication failed answers 9 and its record is served by no read until
//! it was replicated again; unavailable partitions answer 11.

use super::*;
use crate::replication::{call_kind, replica_payload, split_replica_payload};
use citrine_distribution::sc::data_path;
use citrine_wire::digest::{of_key, UserKey};
use citrine_wire::frame::{ProtoHeader, PROTO_HEADER_SIZE};
use citrine_wire::msg::{field_type, info1, info2, info3, op_type, MessageWriter, MsgHeader};

/// A request on `digest` of `test`/`demo`: a write of `value` to bin `v`,
/// or (`None`) a read of every bin in read mode `info3`.
fn frame(digest: &Digest, value: Option<&[u8]>, info3: u8) -> Vec<u8> {
    let header = MsgHeader {
        info1: if value.is_none() {
            info1::READ | info1::GET_ALL
        } else {
            0
        },
        info2: if value.is_some() { info2::WRITE } else { 0 },
        info3,
        transaction_ttl: 2_000,
        ..MsgHeader::default()
    };
    let mut out = Vec::new();
    let mut writer = MessageWriter::begin(&mut out, &header);
    writer
        .field(field_type::NAMESPACE, b"test")
        .field(field_type::SET, b"demo")
        .field(field_type::DIGEST, &digest.0);
    if let Some(value) = value {
        writer.op(op_type::WRITE, 3, b"v", value);
    }
    writer.finish();
    out
}

/// `node`'s result code for the request `frame`.
fn result_of(node: &Service, frame: &[u8]) -> u8 {
    let header_bytes: [u8; PROTO_HEADER_SIZE] = frame[..PROTO_HEADER_SIZE].try_into().unwrap();
    let header = ProtoHeader::decode(&header_bytes).unwrap();
    let mut out = Vec::new();
    node.handle(header, &frame[PROTO_HEADER_SIZE..], &mut out)
        .unwrap();
    out[PROTO_HEADER_SIZE + 5]
}

/// The generation `node` holds of `digest`.
fn generation(node: &Service, digest: &Digest) -> Option<u16> {
    let namespace = node.namespace(b"test")?;
    let index = namespace.index.partition(digest.partition()).read();
    Some(index.get(digest)?.meta().generation)
}

/// A key of set `demo` whose partition's SC replicas in `node`'s view
/// are `replicas` (master first), with its digest.
fn key_with_replicas(node: &Service, replicas: [u64; 2]) -> Digest {
    let cluster = node.dist().cluster();
    let sc = cluster.namespace("test").unwrap().sc.get().unwrap();
    (0..10_000)
        .map(|index| of_key("demo", &UserKey::String(format!("k{index}"))))
        .find(|digest| sc.replicas(digest.partition()) == replicas.map(NodeId))
        .unwrap()
}

fn cut_between(world: &World, a: u64, b: u64) {
    let mut cut = world.cut.lock();
    cut.insert((NodeId(a), NodeId(b)));
    cut.insert((NodeId(b), NodeId(a)));
}

#[test]
fn sc_writes_reach_every_replica_before_their_answer() {
    let ids = [1u64, 2, 3];
    let world = sc_world(&ids);
    world.publish(0x10, &ids);
    world.settle(&ids);
    let digest = key_with_replicas(&world.node(1), [1, 2]);
    // Sent to the node outside the replica list: run by the master, stored
    // by both replicas before the answer.
    assert_eq!(result_of(&world.node(3), &frame(&digest, Some(b"a"), 0)), 0);
    assert_eq!(generation(&world.node(1), &digest), Some(1));
    assert_eq!(generation(&world.node(2), &digest), Some(1));
    assert_eq!(generation(&world.node(3), &digest), None);
    // A SESSION read at the replica goes to the master.
    let replica = world.node(2);
    assert_eq!(result_of(&replica, &frame(&digest, None, 0)), 0);
    assert_eq!(
        replica.dist().stats.replica_reads.load(Ordering::Relaxed),
        0
    );
    // An ALLOW_REPLICA read too (the master serves: stricter).
    let allow_replica = info3::SC_READ_RELAX;
    assert_eq!(result_of(&replica, &frame(&digest, None, allow_replica)), 0);
    assert_eq!(
        replica.dist().stats.replica_reads.load(Ordering::Relaxed),
        0
    );
    // A delete reaches both replicas before its answer too.
    let mut delete = frame(&digest, None, 0);
    delete[PROTO_HEADER_SIZE + 1] = 0; // info1
    delete[PROTO_HEADER_SIZE + 2] = info2::WRITE | info2::DELETE;
    assert_eq!(result_of(&world.node(3), &delete), 0);
    assert_eq!(generation(&world.node(1), &digest), None);
    assert_eq!(generation(&world.node(2), &digest), None);
    assert_eq!(
        result_of(&replica, &frame(&digest, None, 0)),
        ResultCode::NotFound.code()
    );
}

#[test]
fn an_unreplicated_write_is_in_doubt_and_not_read_until_replicated() {
    let ids = [1u64, 2, 3];
    let world = sc_world(&ids);
    world.publish(0x10, &ids);
    world.settle(&ids);
    let digest = key_with_replicas(&world.node(1), [1, 2]);
    let master = world.node(1);
    assert_eq!(result_of(&master, &frame(&digest, Some(b"a"), 0)), 0);
    // The replica unreachable: the write is applied here, answered 9 (in
    // doubt) and its record marked unreplicated.
    cut_between(&world, 1, 2);
    assert_eq!(
        result_of(&master, &frame(&digest, Some(b"b"), 0)),
        ResultCode::Timeout.code()
    );
    assert_eq!(generation(&master, &digest), Some(2));
    assert_eq!(generation(&world.node(2), &digest), Some(1));
    assert_eq!(master.dist().sc_unreplicated.count(), 1);
    // No read serves it while it cannot be replicated again.
    assert_eq!(
        result_of(&master, &frame(&digest, None, 0)),
        ResultCode::Timeout.code()
    );
    // Reachable again: the read replicates it first, then answers.
    world.cut.lock().clear();
    assert_eq!(result_of(&master, &frame(&digest, None, 0)), 0);
    assert_eq!(generation(&world.node(2), &digest), Some(2));
    assert_eq!(master.dist().sc_unreplicated.count(), 0);
}

/// A durable delete of `digest` (`test`/`demo`).
fn delete_frame(digest: &Digest) -> Vec<u8> {
    let header = MsgHeader {
        info2: info2::WRITE | info2::DELETE | info2::DURABLE_DELETE,
        transaction_ttl: 2_000,
        ..MsgHeader::default()
    };
    let mut out = Vec::new();
    let mut writer = MessageWriter::begin(&mut out, &header);
    writer
        .field(field_type::NAMESPACE, b"test")
        .field(field_type::SET, b"demo")
        .field(field_type::DIGEST, &digest.0);
    writer.finish();
    out
}

/// A delete whose replica write failed (9) leaves the master's tombstone
/// unreplicated; the next delete of the key changes nothing there. It must
/// not answer 2 before the replica holds the tombstone too: before, it
/// did at once, and the replica's record outlived the master (the SC
/// simulator's seeds 67 and 399).
#[test]
fn a_delete_of_an_unreplicated_delete_waits_for_its_replication() {
    let ids = [1u64, 2, 3];
    let world = sc_world(&ids);
    world.publish(0x10, &ids);
    world.settle(&ids);
    let digest = key_with_replicas(&world.node(1), [1, 2]);
    let master = world.node(1);
    assert_eq!(result_of(&master, &frame(&digest, Some(b"a"), 0)), 0);
    cut_between(&world, 1, 2);
    let delete = delete_frame(&digest);
    assert_eq!(result_of(&master, &delete), ResultCode::Timeout.code());
    assert_eq!(
        result_of(&master, &delete),
        ResultCode::Timeout.code(),
        "answered while the replica still holds the record"
    );
    world.cut.lock().clear();
    assert_eq!(result_of(&master, &delete), ResultCode::NotFound.code());
    assert_eq!(generation(&world.node(2), &digest), None);
    assert_eq!(master.dist().sc_unreplicated.count(), 0);
}

#[test]
fn a_linearize_read_needs_every_replica_in_the_regime() {
    let ids = [1u64, 2, 3];
    let world = sc_world(&ids);
    world.publish(0x10, &ids);
    world.settle(&ids);
    let digest = key_with_replicas(&world.node(1), [1, 2]);
    let master = world.node(1);
    assert_eq!(result_of(&master, &frame(&digest, Some(b"a"), 0)), 0);
    let linearize = info3::SC_READ_TYPE;
    assert_eq!(result_of(&master, &frame(&digest, None, linearize)), 0);
    cut_between(&world, 1, 2);
    // SESSION still answers; LINEARIZE cannot confirm the regime.
    assert_eq!(result_of(&master, &frame(&digest, None, 0)), 0);
    assert_eq!(
        result_of(&master, &frame(&digest, None, linearize)),
        ResultCode::Timeout.code()
    );
    // An absent record too needs the confirmation.
    let absent = key_with_replicas(&master, [1, 2]);
    let absent = Digest([
        absent.0[0],
        absent.0[1],
        9,
        9,
        9,
        9,
        9,
        9,
        9,
        9,
        9,
        9,
        9,
        9,
        9,
        9,
        9,
        9,
        9,
        9,
    ]);
    assert_eq!(
        result_of(&master, &frame(&absent, None, linearize)),
        ResultCode::Timeout.code()
    );
    world.cut.lock().clear();
    assert_eq!(
        result_of(&master, &frame(&absent, None, linearize)),
        ResultCode::NotFound.code()
    );
    assert_eq!(generation(&world.node(2), &absent), None, "nothing stored");
}

#[test]
fn replicas_refuse_writes_of_another_regime_or_partition() {
    let ids = [1u64, 2, 3];
    let world = sc_world(&ids);
    world.publish(0x10, &ids);
    world.settle(&ids);
    let master = world.node(1);
    let digest = key_with_replicas(&master, [1, 2]);
    assert_eq!(result_of(&master, &frame(&digest, Some(b"a"), 0)), 0);
    let cluster = master.dist().cluster();
    let regime = data_path::regime_of(&cluster, "test").unwrap();
    let namespace = master.namespace(b"test").unwrap();
    let mut write = crate::replication::capture(namespace, &digest, master.now());
    write.generation = 5;
    let plain = replica_payload(cluster.cluster_key, namespace, &write);
    assert!(split_replica_payload(&plain).is_some());
    let send = |to: u64, regime: u32| {
        crate::block_on(world.node(to).serve_fabric(
            call_kind::SC_REPLICA_WRITE,
            &data_path::sc_payload(regime, &[], &plain),
        ))
    };
    let refused = vec![ResultCode::ClusterKeyMismatch.code()];
    // An older regime, a newer one: refused, nothing stored.
    assert_eq!(send(2, regime - 2), refused);
    assert_eq!(send(2, regime + 2), refused);
    assert_eq!(generation(&world.node(2), &digest), Some(1));
    // A replica write without a regime.
    let plain_write = crate::block_on(world.node(2).serve_fabric(call_kind::REPLICA_WRITE, &plain));
    assert_eq!(plain_write, refused);
    assert_eq!(generation(&world.node(2), &digest), Some(1));
    // A node that is not a replica of the partition in the regime.
    assert_eq!(send(3, regime), refused);
    assert_eq!(generation(&world.node(3), &digest), None);
    // The regime's replica stores it.
    assert_eq!(send(2, regime), vec![0]);
    assert_eq!(generation(&world.node(2), &digest), Some(5));
}

#[test]
fn sc_partitions_without_a_majority_answer_unavailable() {
    let ids = [1u64, 2, 3];
    let world = sc_world(&ids);
    world.publish(0x10, &ids);
    world.settle(&ids);
    let digest = key_with_replicas(&world.node(1), [1, 3]);
    assert_eq!(result_of(&world.node(2), &frame(&digest, Some(b"a"), 0)), 0);
    // 3 away: 1 and 2 (a majority) go on serving, and the write reads back.
    world.publish(0x20, &[1, 2]);
    exchange_only(&world, &[1, 2]);
    world.settle(&[1, 2]);
    assert_eq!(result_of(&world.node(2), &frame(&digest, Some(b"b"), 0)), 0);
    assert_eq!(result_of(&world.node(1), &frame(&digest, None, 0)), 0);
    assert_eq!(generation(&world.node(2), &digest), Some(2));
    // 1 alone (a minority): every partition unavailable, nothing written.
    // (a node alone resolves its exchange as the view is published)
    world.publish(0x30, &[1]);
    assert_eq!(
        result_of(&world.node(1), &frame(&digest, Some(b"c"), 0)),
        ResultCode::Unavailable.code()
    );
    assert_eq!(
        result_of(&world.node(1), &frame(&digest, None, 0)),
        ResultCode::Unavailable.code()
    );
    assert_eq!(generation(&world.node(1), &digest), Some(2));
}

/// The result codes of a batch of writes (or, `value` `None`, reads) of
/// `keys` sent to `node`, by row index.
fn batch_codes(node: &Service, keys: &[String], value: Option<&[u8]>) -> Vec<u8> {
    use crate::batch::row_flags;
    use crate::batch::tests::{batch_frame, payload, run, RowSpec};
    let rows: Vec<RowSpec> = keys
        .iter()
        .enumerate()
        .map(|(index, key)| match value {
            Some(value) => RowSpec::full(
                index as u32,
                "test",
                "demo",
                key,
                row_flags::INFO | row_flags::GENERATION | row_flags::TTL,
                [0, info2::WRITE, 0, 0],
            )
            .op(op_type::WRITE, 3, "v", value),
            None => RowSpec::full(
                index as u32,
                "test",
                "demo",
                key,
                row_flags::INFO,
                [info1::READ | info1::GET_ALL, 0, 0, 0],
            ),
        })
        .collect();
    let answers = run(node, &batch_frame(&payload(&rows, 0), false));
    let (last, rows) = answers.split_last().unwrap();
    assert_eq!(
        (last.header.info3 & info3::LAST, last.header.result_code),
        (info3::LAST, 0)
    );
    let mut codes = vec![u8::MAX; keys.len()];
    for row in rows {
        codes[row.header.transaction_ttl as usize] = row.header.result_code;
    }
    codes
}

#[test]
fn sc_batch_rows_follow_the_sc_map() {
    let ids = [1u64, 2, 3];
    let world = sc_world(&ids);
    world.publish(0x10, &ids);
    world.settle(&ids);
    let keys: Vec<String> = (0..30).map(|index| format!("b{index}")).collect();
    // Every row written on both its replicas, read back through any node.
    assert_eq!(batch_codes(&world.node(3), &keys, Some(b"w")), vec![0; 30]);
    for key in &keys {
        let digest = of_key("demo", &UserKey::String(key.clone()));
        let holders = ids
            .iter()
            .filter(|id| generation(&world.node(**id), &digest) == Some(1))
            .count();
        assert_eq!(holders, 2, "{key}");
    }
    assert_eq!(batch_codes(&world.node(2), &keys, None), vec![0; 30]);
    // 1 alone: every row refused (11), nothing written.
    world.publish(0x30, &[1]);
    assert_eq!(batch_codes(&world.node(1), &keys, Some(b"x")), vec![11; 30]);
    assert_eq!(batch_codes(&world.node(1), &keys, None), vec![11; 30]);
}

#[test]
fn a_write_whose_view_moved_on_before_its_replication_is_in_doubt() {
    use crate::replication::{replicate_after, Confirm, MasterRun};
    let ids = [1u64, 2, 3];
    let world = sc_world(&ids);
    world.publish(0x10, &ids);
    world.settle(&ids);
    let master = world.node(1);
    let digest = key_with_replicas(&master, [1, 2]);
    let namespace = master.namespace(b"test").unwrap();
    let run = |cluster_key: u64| MasterRun {
        deadline_ms: u64::MAX,
        read: false,
        touch_before: None,
        reply_at: 0,
        confirm: Confirm::Nothing,
        cluster_key,
    };
    let key = master.dist().cluster().cluster_key;
    // Routed in this view: the replica write to do.
    let mut out = Vec::new();
    crate::transaction::write_result(&mut out, ResultCode::Ok);
    assert!(replicate_after(master.dist(), namespace, &digest, run(key), &mut out).is_some());
    // Routed in an earlier view: answered 9 at once, the record unreplicated.
    let mut out = Vec::new();
    crate::transaction::write_result(&mut out, ResultCode::Ok);
    assert!(replicate_after(master.dist(), namespace, &digest, run(key ^ 1), &mut out).is_none());
    assert_eq!(out[PROTO_HEADER_SIZE + 5], ResultCode::Timeout.code());
    assert!(master.dist().sc_unreplicated.contains("test", &digest));
    // A SESSION read (nothing to confirm) that ran after the view it was
    // routed in ended: its copy may have been emptied since, so 9 too;
    // in its own view its answer stands.
    let read = |cluster_key: u64| MasterRun {
        read: true,
        ..run(cluster_key)
    };
    for (cluster_key, code) in [(key, ResultCode::NotFound), (key ^ 1, ResultCode::Timeout)] {
        let mut out = Vec::new();
        crate::transaction::write_result(&mut out, ResultCode::NotFound);
        assert!(replicate_after(
            master.dist(),
            namespace,
            &digest,
            read(cluster_key),
            &mut out
        )
        .is_none());
        assert_eq!(out[PROTO_HEADER_SIZE + 5], code.code());
    }
}

/// The master's replica write is lost and, before its next try, a view
/// of the master alone is published, where no SC partition is available
/// (no replica listed): the write was not stored by its replica, so it
/// must be in doubt (9), not acknowledged. (Found by the data simulator
/// on SC, seed 2: the replica list looked up again in the new view was
/// empty, which counted as every replica having acknowledged.)
#[test]
fn a_write_whose_view_ends_before_its_replica_stored_it_is_in_doubt() {
    let ids = [1u64, 2, 3];
    let world = sc_world(&ids);
    world.publish(0x10, &ids);
    world.settle(&ids);
    let master = world.node(1);
    let digest = key_with_replicas(&master, [1, 2]);
    let alone = master.clone();
    *world.before_call.lock() = Some((
        (1, 2, call_kind::SC_REPLICA_WRITE),
        Box::new(move || alone.publish_cluster(state(1, 0x20, &[1]))),
    ));
    cut_between(&world, 1, 2);
    assert_eq!(
        result_of(&master, &frame(&digest, Some(b"a"), 0)),
        ResultCode::Timeout.code()
    );
    assert!(world.before_call.lock().is_none(), "the view changed");
    assert_eq!(generation(&world.node(2), &digest), None);
    assert!(master.dist().sc_unreplicated.contains("test", &digest));
}

/// The value of bin `v` that `node` answers for `digest` (SESSION read):
/// result code and value.
fn read_value(node: &Service, digest: &Digest) -> (u8, Option<Vec<u8>>) {
    let request = frame(digest, None, 0);
    let header_bytes: [u8; PROTO_HEADER_SIZE] = request[..PROTO_HEADER_SIZE].try_into().unwrap();
    let header = ProtoHeader::decode(&header_bytes).unwrap();
    let mut out = Vec::new();
    node.handle(header, &request[PROTO_HEADER_SIZE..], &mut out)
        .unwrap();
    let reply = &out[PROTO_HEADER_SIZE..];
    let code = reply[5];
    let value = reply
        .windows(2)
        .position(|pair| pair == b"\x01v")
        .and_then(|at| reply.get(at + 2..))
        .map(<[u8]>::to_vec);
    (code, value)
}

/// Node 3 away while partition P (roster replicas 3 then 1) took a write
/// on 1 and 2; back, 3 masters P again with a stale copy the view does
/// not trust, filled from 1. A write through 3 during the fill is
/// acknowledged once 1 stored it — and 1's fill of 3 ran while that
/// write's replica write was on its way (its `CLEAR` came after 3 had
/// applied the write, its batches before 1 had it). The untrusted copy
/// must be emptied before 3 serves the partition, never under a write it
/// acknowledged: then the write stays on 3 and every read returns it.
#[test]
fn a_write_during_the_fill_of_an_untrusted_master_survives_its_fill() {
    let ids = [1u64, 2, 3];
    let world = sc_world(&ids);
    world.publish(0x10, &ids);
    world.settle(&ids);
    let digest = key_with_replicas(&world.node(1), [3, 1]);
    assert_eq!(result_of(&world.node(1), &frame(&digest, Some(b"a"), 0)), 0);
    world.publish(0x20, &[1, 2]);
    world.settle(&[1, 2]);
    assert_eq!(result_of(&world.node(1), &frame(&digest, Some(b"b"), 0)), 0);
    assert_eq!(generation(&world.node(3), &digest), Some(1), "stale on 3");
    world.publish(0x30, &ids);
    exchange_only(&world, &ids);
    let decided = world.node(3).dist().cluster();
    let sc = decided.namespace("test").unwrap().sc.get().unwrap();
    assert_eq!(sc.replicas(digest.partition()), [NodeId(3), NodeId(1)]);
    assert!(!sc.trusted(digest.partition()).contains(&NodeId(3)));
    // 1's fill of 3 runs just before the write's replica write reaches 1.
    let source = world.node(1);
    *world.before_call.lock() = Some((
        (3, 1, call_kind::SC_REPLICA_WRITE),
        Box::new(move || {
            let pause: Arc<dyn Pause> = Arc::new(NoWait);
            crate::block_on(driver::step(source.dist(), &pause));
        }),
    ));
    assert_eq!(result_of(&world.node(3), &frame(&digest, Some(b"c"), 0)), 0);
    assert!(world.before_call.lock().is_none(), "the fill ran");
    world.settle(&ids);
    assert_eq!(generation(&world.node(1), &digest), Some(3));
    assert_eq!(generation(&world.node(3), &digest), Some(3));
    for id in ids {
        assert_eq!(
            read_value(&world.node(id), &digest),
            (0, Some(b"c".to_vec())),
            "read through {id}"
        );
    }
}

/// Runs its work once, at the first pause asked for (a migration call's
/// retry after a refusal); every pause returns at once.
struct AtFirstPause(Mutex<Option<Box<dyn FnOnce() + Send>>>);

impl Pause for AtFirstPause {
    fn sleep(&self, _: Duration) -> Sleep {
        let work = self.0.lock().take();
        if let Some(work) = work {
            work();
        }
        Box::pin(async {})
    }
}

/// Node 3 away when a key of partition P (roster replicas 3 then 1) was
/// first written: back, 3 holds nothing of P, masters it without a
/// trusted copy and is filled from 1 and 2. Their batches reach 3 before 3
/// resolved the view's exchange — the resolution empties every copy the
/// view does not trust, one filled early included (seen in a real run:
/// the record arrived, was emptied 50 ms later, and the early LAST left
/// the copy "full"; reads answered 2). 3 must refuse such a batch until it
/// resolved; the record then stays on 3.
#[test]
fn a_batch_that_arrives_before_the_exchange_is_resolved_is_not_emptied() {
    let ids = [1u64, 2, 3];
    let world = sc_world(&ids);
    world.publish(0x10, &ids);
    world.settle(&ids);
    let digest = key_with_replicas(&world.node(1), [3, 1]);
    world.publish(0x20, &[1, 2]);
    world.settle(&[1, 2]);
    assert_eq!(result_of(&world.node(1), &frame(&digest, Some(b"a"), 0)), 0);
    assert_eq!(generation(&world.node(3), &digest), None);
    world.publish(0x30, &ids);
    exchange_only(&world, &[1, 2]);
    assert!(world.node(3).migrations().exchanging());
    // 1 and 2 send; 3 resolves only when a sender pauses to retry.
    let late = world.node(3);
    let pause: Arc<dyn Pause> = Arc::new(AtFirstPause(Mutex::new(Some(Box::new(move || {
        let pause: Arc<dyn Pause> = Arc::new(NoWait);
        crate::block_on(driver::step(late.dist(), &pause));
    })))));
    for id in [1, 2] {
        crate::block_on(driver::step(world.node(id).dist(), &pause));
    }
    world.settle(&ids);
    assert!(!world.node(3).migrations().exchanging());
    assert_eq!(generation(&world.node(3), &digest), Some(1), "filled on 3");
    for id in ids {
        assert_eq!(
            read_value(&world.node(id), &digest),
            (0, Some(b"a".to_vec())),
            "read through {id}"
        );
    }
}

std::thread_local! {
    /// Armed by a thread that wants to stop at its next clock reading:
    /// it says so on the first channel and waits for the second.
    static PARK: std::cell::RefCell<Option<(std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>)>> =
        const { std::cell::RefCell::new(None) };
}

/// A fixed clock that parks the thread that armed [`PARK`] at its next
/// reading (at most 30 s: a thread that is never let go goes on).
struct ParkingClock;

impl crate::Clock for ParkingClock {
    fn now_unix_ms(&self) -> u64 {
        if let Some((parked, go)) = PARK.with(|park| park.borrow_mut().take()) {
            let _ = parked.send(());
            let _ = go.recv_timeout(Duration::from_secs(30));
        }
        1_700_000_000_000
    }
}

/// Node 3 masters partition P without a trusted copy in view 0x30 (it
/// was away when P was written) and is filled from 1. A batch of 0x30 is
/// checked against the view on 3 and, before it is applied, P is served
/// without 3 (0x38: 3's copy is stale from then on) and view 0x40
/// resolves on 3, emptying that stale copy. The batch must land before
/// that resolution or be refused by it: before the check and the apply
/// were under one gate, it landed after, and 3 held 0x30's records in the
/// copy 0x40 had just emptied as untrusted (its fill must build it from
/// trusted records only).
#[test]
fn a_batch_checked_under_an_older_view_lands_before_the_next_resolution() {
    let ids = [1u64, 2, 3];
    let world = sc_world_with_clock(&ids, || Arc::new(ParkingClock) as Arc<dyn crate::Clock>);
    world.publish(0x10, &ids);
    world.settle(&ids);
    let digest = key_with_replicas(&world.node(1), [3, 1]);
    world.publish(0x20, &[1, 2]);
    world.settle(&[1, 2]);
    assert_eq!(result_of(&world.node(1), &frame(&digest, Some(b"a"), 0)), 0);
    world.publish(0x30, &ids);
    exchange_only(&world, &ids);
    let (mut batch, _) =
        world
            .node(1)
            .dist()
            .migration_batch(0x30, "test", digest.partition(), &[digest], 0);
    // Not the source's last: 3's fill does not end with it.
    batch.flags &= !FLAG_LAST;
    let (parked_tx, parked) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel();
    let target = world.node(3);
    let applier = std::thread::spawn(move || {
        PARK.with(|park| *park.borrow_mut() = Some((parked_tx, go_rx)));
        target.dist().apply_migrate_batch(&batch.encode())
    });
    parked.recv().unwrap();
    // The batch passed its check and waits at its first record.
    world.publish(0x38, &[1, 2]);
    world.settle(&[1, 2]);
    assert_eq!(result_of(&world.node(1), &frame(&digest, Some(b"b"), 0)), 0);
    world.publish(0x40, &ids);
    let resolver = {
        let world = world.clone();
        std::thread::spawn(move || exchange_only(&world, &[3]))
    };
    // 3 resolves 0x40 unless the parked batch holds it back (2 s: a
    // resolution here takes milliseconds).
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while world.node(3).migrations().exchanging() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = go.send(());
    assert_eq!(applier.join().unwrap(), ResultCode::Ok);
    resolver.join().unwrap();
    let decided = world.node(3).dist().cluster();
    let sc = decided.namespace("test").unwrap().sc.get().unwrap();
    assert!(!sc.trusted(digest.partition()).contains(&NodeId(3)));
    assert_eq!(
        generation(&world.node(3), &digest),
        None,
        "0x40 emptied 3's stale copy: nothing of 0x30 may be in it"
    );
    exchange_only(&world, &[1, 2]);
    world.settle(&ids);
    assert_eq!(
        generation(&world.node(3), &digest),
        Some(2),
        "filled in 0x40"
    );
}

#[test]
fn scans_read_each_partition_from_its_sc_master_only() {
    use crate::tests::sc::scan_sc;
    let ids = [1u64, 2, 3];
    let world = sc_world(&ids);
    world.publish(0x10, &ids);
    world.settle(&ids);
    let keys = 60;
    for index in 0..keys {
        let digest = of_key("demo", &UserKey::String(format!("s{index}")));
        assert_eq!(result_of(&world.node(1), &frame(&digest, Some(b"v"), 0)), 0);
    }
    // Every node serves the partitions it masters in the SC map and
    // reports the others unavailable: together each partition once, each
    // record once (its replica copies are not read).
    let all: Vec<u16> = (0..citrine_types::PARTITIONS as u16).collect();
    let mut records = 0;
    let mut refused = vec![0usize; citrine_types::PARTITIONS];
    for id in ids {
        let (read, unavailable) = scan_sc(&world.node(id), &all);
        records += read;
        for partition in unavailable {
            refused[usize::from(partition)] += 1;
        }
    }
    assert_eq!(records, keys);
    assert!(refused.iter().all(|count| *count == ids.len() - 1));
    // 1 alone, a minority of the roster: it serves no partition.
    world.publish(0x30, &[1]);
    assert_eq!(scan_sc(&world.node(1), &all), (0, all.clone()));
}
