//! Transaction state through migrations of strong-consistency partitions
//! (issue 40), through whole services in one [`World`] (which runs no
//! re-send of held records after a view change: the migrations alone
//! must carry the state).

use super::*;
use citrine_data::txn::recovery::monitor_digest;
use citrine_data::txn::MONITOR_SET;
use citrine_wire::digest::{of_key, UserKey};
use citrine_wire::frame::{ProtoHeader, PROTO_HEADER_SIZE};
use citrine_wire::msg::{field_type, info1, info2, op_type, Message, MessageWriter, MsgHeader};
use citrine_wire::txn::info4;

/// One request to `node` on `digest` of `test` (set `set`); its reply.
fn request(
    node: &Service,
    header: MsgHeader,
    (set, digest): (&[u8], &Digest),
    fields: &[(u8, Vec<u8>)],
    ops: &[(u8, u8, &[u8], Vec<u8>)],
) -> (u8, Vec<u8>, Option<Vec<u8>>) {
    let mut frame = Vec::new();
    let mut writer = MessageWriter::begin(&mut frame, &header);
    writer
        .field(field_type::NAMESPACE, b"test")
        .field(field_type::SET, set)
        .field(field_type::DIGEST, &digest.0);
    for (kind, data) in fields {
        writer.field(*kind, data);
    }
    for (op, particle, name, value) in ops {
        writer.op(*op, *particle, name, value);
    }
    writer.finish();
    let header_bytes: [u8; PROTO_HEADER_SIZE] = frame[..PROTO_HEADER_SIZE].try_into().unwrap();
    let proto = ProtoHeader::decode(&header_bytes).unwrap();
    let mut out = Vec::new();
    node.handle(proto, &frame[PROTO_HEADER_SIZE..], &mut out)
        .unwrap();
    let reply = Message::decode(&out[PROTO_HEADER_SIZE..]).unwrap();
    let deadline = reply.field(field_type::TXN_DEADLINE).map(<[u8]>::to_vec);
    let value = reply
        .ops()
        .find(|op| op.name == b"v")
        .map(|op| op.value.to_vec());
    (
        reply.header.result_code,
        deadline.unwrap_or_default(),
        value,
    )
}

fn header(info1: u8, info2: u8, info4: u8) -> MsgHeader {
    MsgHeader {
        info1,
        info2,
        info4,
        transaction_ttl: 2_000,
        ..MsgHeader::default()
    }
}

fn int(value: i64) -> Vec<u8> {
    value.to_be_bytes().to_vec()
}

/// The SC replicas (master first) of `partition` in `node`'s view.
fn replicas_of(node: &Service, partition: PartitionId) -> Vec<NodeId> {
    let cluster = node.dist().cluster();
    let sc = cluster.namespace("test").unwrap().sc.get().unwrap();
    sc.replicas(partition).to_vec()
}

/// A key of set `demo` and a transaction id whose record and monitor
/// both have SC replicas `[1, 2]` in `node`'s view.
fn chosen(node: &Service) -> (Digest, u64) {
    let wanted = [NodeId(1), NodeId(2)];
    let digest = (0..10_000)
        .map(|index| of_key("demo", &UserKey::String(format!("k{index}"))))
        .find(|digest| replicas_of(node, digest.partition()) == wanted)
        .unwrap();
    let id = (1u64..)
        .find(|id| replicas_of(node, monitor_digest(*id).partition()) == wanted)
        .unwrap();
    (digest, id)
}

/// Whether `node` holds transaction `id`'s provisional version of
/// `digest` and its open monitor.
fn holds_state(node: &Service, digest: &Digest, id: u64) -> (bool, bool) {
    let tables = &node.namespace(b"test").unwrap().txn;
    let provisional = tables.provisional(digest).is_some_and(|p| p.txn_id == id);
    (provisional, tables.monitor(&monitor_digest(id)).is_some())
}

/// Transaction `id` on `master`: its monitor, then a provisional write of
/// 2 over the committed 1 of `digest`.
fn begin(master: &Service, digest: &Digest, id: u64) -> Vec<(u8, Vec<u8>)> {
    let plain = header(0, info2::WRITE, 0);
    let record = (&b"demo"[..], digest);
    let put = [(op_type::WRITE, 1, &b"v"[..], int(1))];
    assert_eq!(request(master, plain, record, &[], &put).0, 0);
    let keyds = citrine_cdt::value::to_bytes(&citrine_cdt::Value::List(citrine_cdt::value::List {
        flags: 1,
        items: vec![citrine_cdt::Value::Blob(4, digest.0.to_vec())],
    }));
    let monitor = monitor_digest(id);
    let create = header(0, info2::WRITE | info2::RESPOND_ALL_OPS, 0);
    let ops = [
        (op_type::WRITE, 1, &b"id"[..], int(id as i64)),
        (op_type::WRITE, 20, &b"keyds"[..], keyds),
    ];
    let (code, deadline, _) = request(master, create, (MONITOR_SET, &monitor), &[], &ops);
    assert_eq!(code, 0, "monitor created");
    let fields = vec![
        (field_type::TXN_ID, id.to_le_bytes().to_vec()),
        (field_type::TXN_DEADLINE, deadline),
    ];
    let put = [(op_type::WRITE, 1, &b"v"[..], int(2))];
    assert_eq!(request(master, plain, record, &fields, &put).0, 0);
    fields
}

/// Partition P of record and monitor has roster replicas 1 and 2. A
/// transaction holds P's record; 1 goes away (2 masters, 3 is filled
/// from 2), then 2 goes away before anything re-sent the state and 1
/// comes back (its copy of the older regime emptied, filled from 3). The
/// lock, the transaction's own version and the monitor reach 3, then 1,
/// with the records; the transaction then commits through 1.
#[test]
fn transaction_state_survives_a_master_change_then_the_loss_of_its_master() {
    let ids = [1u64, 2, 3];
    let world = sc_world(&ids);
    world.publish(0x10, &ids);
    world.settle(&ids);
    let (digest, id) = chosen(&world.node(1));
    let fields = begin(&world.node(1), &digest, id);
    assert_eq!(holds_state(&world.node(2), &digest, id), (true, true));
    world.publish(0x20, &[2, 3]);
    world.settle(&[2, 3]);
    assert_eq!(
        replicas_of(&world.node(2), digest.partition()),
        [NodeId(2), NodeId(3)]
    );
    assert_eq!(
        holds_state(&world.node(3), &digest, id),
        (true, true),
        "the fill of 3 carried the transaction state"
    );
    world.publish(0x30, &[1, 3]);
    world.settle(&[1, 3]);
    let master = world.node(1);
    assert_eq!(replicas_of(&master, digest.partition())[0], NodeId(1));
    assert_eq!(holds_state(&master, &digest, id), (true, true));
    let record = (&b"demo"[..], &digest);
    let read = header(info1::READ | info1::GET_ALL, 0, 0);
    let plain = header(0, info2::WRITE, 0);
    let other = [(op_type::WRITE, 1, &b"v"[..], int(9))];
    assert_eq!(request(&master, plain, record, &[], &other).0, 120);
    assert_eq!(request(&master, read, record, &[], &[]).2, Some(int(1)));
    let own = request(&master, read, record, &fields[..1], &[]);
    assert_eq!((own.0, own.2), (0, Some(int(2))), "its own version");
    let monitor = (MONITOR_SET, &monitor_digest(id));
    let mark = [(op_type::WRITE, 17, &b"fwd"[..], vec![1])];
    assert_eq!(request(&master, plain, monitor, &[], &mark).0, 0);
    let roll = header(0, info2::WRITE | info2::DURABLE_DELETE, info4::ROLL_FORWARD);
    assert_eq!(request(&master, roll, record, &fields[..1], &[]).0, 0);
    let close = header(0, info2::WRITE | info2::DELETE | info2::DURABLE_DELETE, 0);
    assert_eq!(request(&master, close, monitor, &[], &[]).0, 0);
    assert_eq!(request(&master, read, record, &[], &[]).2, Some(int(2)));
    assert_eq!(holds_state(&world.node(3), &digest, id), (false, false));
}

/// A copy dropped or emptied takes its transaction state with it: 2,
/// outside P's replicas once 3 is back, holds none of it.
#[test]
fn a_dropped_copy_leaves_no_transaction_state() {
    let ids = [1u64, 2, 3];
    let world = sc_world(&ids);
    world.publish(0x10, &ids);
    world.settle(&ids);
    let digest = (0..10_000)
        .map(|index| of_key("demo", &UserKey::String(format!("k{index}"))))
        .find(|digest| replicas_of(&world.node(1), digest.partition()) == [NodeId(1), NodeId(3)])
        .unwrap();
    world.publish(0x20, &[1, 2]);
    world.settle(&[1, 2]);
    let id = 77;
    begin(&world.node(1), &digest, id);
    let node2 = world.node(2);
    assert!(holds_state(&node2, &digest, id).0, "2 a replica");
    world.publish(0x30, &ids);
    world.settle(&ids);
    assert!(holds_state(&world.node(3), &digest, id).0, "3 filled");
    assert!(!holds_state(&node2, &digest, id).0, "2's copy dropped");
    let stats = &node2.namespace(b"test").unwrap().txn.stats;
    let left = stats.provisionals.load(Ordering::Relaxed);
    let monitors = stats.monitors_active.load(Ordering::Relaxed);
    let monitor_on_2 = replicas_of(&node2, monitor_digest(id).partition()).contains(&NodeId(2));
    assert_eq!((left, monitors), (0, u64::from(monitor_on_2)));
}

/// A key of set `demo` and a transaction id whose record and monitor
/// both have SC replicas `wanted` (master first) in `node`'s view.
fn chosen_on(node: &Service, wanted: [u64; 2]) -> (Digest, u64) {
    let wanted = wanted.map(NodeId);
    let digest = (0..10_000)
        .map(|index| of_key("demo", &UserKey::String(format!("k{index}"))))
        .find(|digest| replicas_of(node, digest.partition()) == wanted)
        .unwrap();
    let id = (1u64..)
        .find(|id| replicas_of(node, monitor_digest(*id).partition()) == wanted)
        .unwrap();
    (digest, id)
}

/// Record and monitor of partitions whose roster replicas are 3 then 1;
/// a transaction began on 1 while 3 was away. Back, 3 masters both
/// partitions with nothing of them and is filling from 1 and 2 (the
/// exchange resolved, no batch sent yet).
fn begun_while_3_was_away() -> (World, Digest, u64, Vec<(u8, Vec<u8>)>) {
    let ids = [1u64, 2, 3];
    let world = sc_world(&ids);
    world.publish(0x10, &ids);
    world.settle(&ids);
    let (digest, id) = chosen_on(&world.node(1), [3, 1]);
    world.publish(0x20, &[1, 2]);
    world.settle(&[1, 2]);
    let fields = begin(&world.node(1), &digest, id);
    assert_eq!(holds_state(&world.node(2), &digest, id), (true, true));
    world.publish(0x30, &ids);
    exchange_only(&world, &ids);
    let master = world.node(3);
    assert_eq!(replicas_of(&master, digest.partition())[0], NodeId(3));
    assert_eq!(holds_state(&master, &digest, id), (false, false));
    (world, digest, id, fields)
}

/// While 3 fills, each request it runs resolves the record against 1 and
/// 2 first: the resolution must bring the transaction's lock and monitor
/// with the committed copy. Otherwise another writer overwrites the
/// locked record (the transaction's commit then rolls forward nothing:
/// a lost write) and the mark finds no monitor (125, the commit fails).
#[test]
fn a_filling_master_resolves_the_transaction_state_with_the_record() {
    let (world, digest, id, fields) = begun_while_3_was_away();
    let master = world.node(3);
    let record = (&b"demo"[..], &digest);
    let read = header(info1::READ | info1::GET_ALL, 0, 0);
    let plain = header(0, info2::WRITE, 0);
    let other = [(op_type::WRITE, 1, &b"v"[..], int(9))];
    assert_eq!(request(&master, plain, record, &[], &other).0, 120);
    assert_eq!(request(&master, read, record, &[], &[]).2, Some(int(1)));
    let own = request(&master, read, record, &fields[..1], &[]);
    assert_eq!((own.0, own.2), (0, Some(int(2))), "its own version");
    let monitor = (MONITOR_SET, &monitor_digest(id));
    let mark = [(op_type::WRITE, 17, &b"fwd"[..], vec![1])];
    assert_eq!(request(&master, plain, monitor, &[], &mark).0, 0, "marked");
    let roll = header(0, info2::WRITE | info2::DURABLE_DELETE, info4::ROLL_FORWARD);
    assert_eq!(request(&master, roll, record, &fields[..1], &[]).0, 0);
    let close = header(0, info2::WRITE | info2::DELETE | info2::DURABLE_DELETE, 0);
    assert_eq!(request(&master, close, monitor, &[], &[]).0, 0);
    world.settle(&[1, 2, 3]);
    assert_eq!(request(&master, read, record, &[], &[]).2, Some(int(2)));
    for node in [1, 3] {
        assert_eq!(holds_state(&world.node(node), &digest, id), (false, false));
    }
}

/// A transaction rolled back through its filling master (3) just after
/// its fill source (1) built a batch holding the lock, before the batch
/// arrived: the batch must not bring the rolled-back lock back — 3 would
/// refuse every other writer until the transaction's deadline, and a
/// resolution of a later request there would find it too.
#[test]
fn a_rolled_back_lock_does_not_come_back_with_a_batch_built_before() {
    let (world, digest, id, fields) = begun_while_3_was_away();
    let master = world.node(3);
    let rolled = master.clone();
    let roll_id = fields[0].clone();
    *world.before_call.lock() = Some((
        (1, 3, crate::replication::call_kind::MIGRATE),
        Box::new(move || {
            let record = (&b"demo"[..], &digest);
            let roll = header(0, info2::WRITE | info2::DURABLE_DELETE, info4::ROLL_BACK);
            assert_eq!(request(&rolled, roll, record, &[roll_id], &[]).0, 0);
            let monitor = (MONITOR_SET, &monitor_digest(id));
            let close = header(0, info2::WRITE | info2::DELETE | info2::DURABLE_DELETE, 0);
            assert_eq!(request(&rolled, close, monitor, &[], &[]).0, 0);
        }),
    ));
    world.settle(&[1, 2, 3]);
    assert!(
        world.before_call.lock().is_none(),
        "rolled back during the fill"
    );
    for node in [1, 2, 3] {
        let held = holds_state(&world.node(node), &digest, id);
        assert_eq!(held, (false, false), "state left on {node}");
    }
    let record = (&b"demo"[..], &digest);
    let plain = header(0, info2::WRITE, 0);
    let other = [(op_type::WRITE, 1, &b"v"[..], int(10))];
    assert_eq!(
        request(&master, plain, record, &[], &other).0,
        0,
        "not locked"
    );
    let read = header(info1::READ | info1::GET_ALL, 0, 0);
    assert_eq!(request(&master, read, record, &[], &[]).2, Some(int(10)));
}
