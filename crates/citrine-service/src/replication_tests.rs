//! Replication through whole services: proxying, replica writes, their
//! retries and refusals, duplicate resolution, stalls and deadlines.

#![allow(clippy::unwrap_used)]

use crate::migration::Disposition;
use crate::replication::*;
use crate::transaction;
use crate::Service;
use citrine_data::namespace::Namespace;
use citrine_types::{Digest, NodeId, PartitionId, ResultCode, DIGEST_SIZE};
use citrine_wire::frame::{ProtoHeader, PROTO_HEADER_SIZE};
use citrine_wire::msg::info2;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A copy applied to `service`'s node by the replica-write rule (the
/// distribution layer's, through the node's handle).
fn apply_replica_write(
    service: &crate::Service,
    write: &crate::replication::ReplicaWrite,
) -> citrine_types::ResultCode {
    crate::replication::apply_replica_write(service.dist(), write)
}

fn sample(body: Option<Vec<u8>>) -> ReplicaWrite {
    ReplicaWrite {
        namespace: "test".into(),
        digest: Digest([7; DIGEST_SIZE]),
        generation: 3,
        life: 0,
        durable: false,
        void_time: 1_000_000_000, // live: expires after the test clock's now
        last_update_ms: 99_000,
        set_name: b"demo".to_vec(),
        body,
        xdr_write: false,
    }
}

fn memory_service(node_id: u64) -> Service {
    memory_service_on(
        node_id,
        std::sync::Arc::new(crate::ManualClock::new(1_700_000_000_000)),
    )
}

/// A service with namespace `test` in memory, reading `clock`.
fn memory_service_on(node_id: u64, clock: std::sync::Arc<crate::ManualClock>) -> Service {
    let config = crate::config::ServiceConfig::local(
        node_id,
        vec![crate::config::NamespaceConfig::in_memory("test")],
    );
    Service::new(config, clock)
}

/// The view of nodes 1 and 2 as node `me` holds it, under cluster key
/// `key`: namespace `test`, replication factor 2.
fn view_of_two(me: u64, key: u64) -> crate::cluster_state::ClusterState {
    let members = [1u64, 2].map(|id| crate::cluster_state::ClusterMember {
        node_id: NodeId(id),
        rack_id: 0,
        service_address: format!("127.0.0.1:{}", 3000 + id),
        tls: None,
    });
    crate::cluster_state::ClusterState::new(
        NodeId(me),
        key,
        members.to_vec(),
        &[("test".into(), 2)],
        2,
        2,
    )
}

/// User keys `k0`..`k999` of set `demo` (with their digests) whose
/// partition `node` masters in `state`.
fn keys_mastered_by(
    state: &crate::cluster_state::ClusterState,
    node: u64,
) -> impl Iterator<Item = (String, Digest)> + '_ {
    use citrine_wire::digest::{of_key, UserKey};
    (0..1000)
        .map(|index| format!("k{index}"))
        .map(|key| {
            let digest = of_key("demo", &UserKey::String(key.clone()));
            (key, digest)
        })
        .filter(move |(_, digest)| {
            state.namespaces[0].map.master(digest.partition()) == Some(NodeId(node))
        })
}

fn namespace_of(service: &Service) -> &Namespace {
    service.namespace(b"test").expect("namespace test")
}

fn stored(service: &Service, digest: &Digest) -> Option<(citrine_index::RecordMeta, Vec<u8>)> {
    let namespace = service.namespace(b"test")?;
    let partition = namespace.index.partition(digest.partition()).read();
    let entry = partition.get(digest)?;
    let body = namespace.storage.read(&entry.location).ok()?.into_owned();
    Some((entry.meta(), body))
}

#[test]
fn replicas_apply_newer_states_only() {
    let service = memory_service(7);
    let mut write = sample(Some(vec![1, 2, 3]));
    assert_eq!(apply_replica_write(&service, &write), ResultCode::Ok);
    let (meta, body) = stored(&service, &write.digest).expect("stored");
    assert_eq!(
        (meta.generation, meta.void_time, meta.last_update_ms),
        (3, 1_000_000_000, 99_000)
    );
    assert_eq!(body, vec![1, 2, 3]);
    assert_eq!(
        service
            .namespace(b"test")
            .map(|ns| ns.sets.existing_id(b"demo")),
        Some(Some(meta.set_id))
    );
    // A retry of the same state and an older state change nothing.
    assert_eq!(apply_replica_write(&service, &write), ResultCode::Ok);
    let older = ReplicaWrite {
        generation: 2,
        life: 0,
        durable: false,
        last_update_ms: 98_000,
        body: Some(vec![9]),
        ..write.clone()
    };
    assert_eq!(apply_replica_write(&service, &older), ResultCode::Ok);
    assert_eq!(
        stored(&service, &write.digest).map(|(_, body)| body),
        Some(vec![1, 2, 3])
    );
    // A newer state replaces it; a newer delete removes it.
    write.generation = 4;
    write.last_update_ms = 99_500;
    write.body = Some(vec![4]);
    assert_eq!(apply_replica_write(&service, &write), ResultCode::Ok);
    assert_eq!(
        stored(&service, &write.digest).map(|(meta, body)| (meta.generation, body)),
        Some((4, vec![4]))
    );
    let stale_delete = ReplicaWrite {
        last_update_ms: 99_400,
        body: None,
        ..write.clone()
    };
    assert_eq!(apply_replica_write(&service, &stale_delete), ResultCode::Ok);
    assert!(stored(&service, &write.digest).is_some());
    let delete = ReplicaWrite {
        last_update_ms: 100_000,
        generation: 0,
        life: 0,
        durable: false,
        body: None,
        ..write.clone()
    };
    assert_eq!(apply_replica_write(&service, &delete), ResultCode::Ok);
    assert!(stored(&service, &write.digest).is_none());
    assert_eq!(
        service
            .namespace(b"test")
            .map(|ns| ns.stats.objects.load(std::sync::atomic::Ordering::Relaxed)),
        Some(0)
    );
    let unknown = ReplicaWrite {
        namespace: "nosuch".into(),
        ..write
    };
    assert_eq!(
        apply_replica_write(&service, &unknown),
        ResultCode::Namespace
    );
}

/// A record written after a non-durable delete starts its next life at
/// generation 1: a copy from the earlier life (a node that missed the
/// delete, with more writes than the new copy) never wins over it nor
/// over the delete's tombstone, whatever the policy; the new life wins
/// over the tombstone and over a stale copy a replica still holds.
#[test]
fn a_copy_from_an_earlier_life_never_wins() {
    let service = memory_service(7);
    let stale = ReplicaWrite {
        generation: 9,
        last_update_ms: 90_000,
        body: Some(vec![1]),
        ..sample(None)
    };
    let tombstone = ReplicaWrite {
        generation: 10,
        last_update_ms: 95_000,
        body: None,
        ..stale.clone()
    };
    let reborn = ReplicaWrite {
        generation: 1,
        life: 1,
        last_update_ms: 96_000,
        body: Some(vec![2]),
        ..stale.clone()
    };
    // The tombstone holds the earlier life's copies off.
    assert_eq!(apply_replica_write(&service, &tombstone), ResultCode::Ok);
    assert_eq!(apply_replica_write(&service, &stale), ResultCode::Ok);
    assert!(stored(&service, &stale.digest).is_none());
    // The new life wins over the tombstone, then over the stale copy
    // sent again (with more writes and, under last-update-time, a later
    // write too).
    assert_eq!(apply_replica_write(&service, &reborn), ResultCode::Ok);
    let later_stale = ReplicaWrite {
        generation: 30,
        last_update_ms: 99_000,
        ..stale.clone()
    };
    for copy in [&stale, &later_stale, &tombstone] {
        assert_eq!(apply_replica_write(&service, copy), ResultCode::Ok);
        let held = stored(&service, &stale.digest).map(|(meta, body)| (meta.life, body));
        assert_eq!(held, Some((1, vec![2])));
    }
    // A replica still holding the stale copy takes the new life.
    let replica = memory_service(8);
    assert_eq!(apply_replica_write(&replica, &later_stale), ResultCode::Ok);
    assert_eq!(apply_replica_write(&replica, &reborn), ResultCode::Ok);
    let held = stored(&replica, &stale.digest).map(|(meta, _)| (meta.life, meta.generation));
    assert_eq!(held, Some((1, 1)));
}

/// Records every call and answers replica writes with `Ok`, proxied
/// requests with a fixed frame.
struct FakeFabric {
    calls: parking_lot::Mutex<Vec<(NodeId, u8, Vec<u8>)>>,
}

impl Fabric for FakeFabric {
    fn call(&self, to: NodeId, kind: u8, payload: Vec<u8>, _: Duration) -> FabricFuture {
        self.calls.lock().push((to, kind, payload));
        let answer = if kind == call_kind::PROXY {
            let mut frame = Vec::new();
            transaction::write_result(&mut frame, ResultCode::KeyBusy);
            frame
        } else {
            vec![0]
        };
        Box::pin(async move { Ok(answer) })
    }
}

#[test]
fn masters_replicate_and_others_proxy() {
    use citrine_wire::digest::{of_key, UserKey};
    let service = memory_service(1);
    let fabric = std::sync::Arc::new(FakeFabric {
        calls: parking_lot::Mutex::new(Vec::new()),
    });
    service.set_fabric(fabric.clone());
    let state = view_of_two(1, 5);
    let key_mastered_by = |node: u64| keys_mastered_by(&state, node).next().expect("a key").0;
    let (mine, theirs) = (key_mastered_by(1), key_mastered_by(2));
    service.publish_cluster(state);
    let benchmarks = service.latencies().benchmarks();
    benchmarks.set(0, crate::benchmarks::Group::Write, true);
    let put = |key: &str| {
        let digest = of_key("demo", &UserKey::String(key.into()));
        let frame = put_frame(&digest, 0);
        let out = handle_frame(&service, &frame);
        (digest, frame, out)
    };
    // Mastered here: applied locally, then replicated as a full state.
    let (digest, _, out) = put(&mine);
    assert_eq!(out[PROTO_HEADER_SIZE + 5], 0);
    let mut calls = std::mem::take(&mut *fabric.calls.lock());
    // The view's exchange has not run (no driver here): the record is
    // resolved with the other member first (the fake answers "absent").
    assert_eq!((calls[0].0, calls[0].1), (NodeId(2), call_kind::DUPRES));
    calls.remove(0);
    assert_eq!(calls.len(), 1);
    assert_eq!(
        (calls[0].0, calls[0].1),
        (NodeId(2), call_kind::REPLICA_WRITE)
    );
    // Stamped with the view's cluster key, and no truncation known.
    let (key, truncated_before, write) =
        split_replica_payload(&calls[0].2).expect("a replica payload");
    assert_eq!(key, service.cluster().cluster_key);
    assert_eq!(truncated_before, 0);
    let write = ReplicaWrite::decode(write).expect("replica write");
    assert_eq!(
        (write.digest, write.generation, write.set_name.as_slice()),
        (digest, 1, &b"demo"[..])
    );
    assert_eq!(
        Some(write.body.expect("body")),
        stored(&service, &digest).map(|(_, body)| body)
    );
    // Mastered elsewhere: forwarded unchanged (hop 1, with the deadline
    // the client's timeout gives), answer passed through.
    let before = service.now().unix_ms;
    let (digest, frame, out) = put(&theirs);
    assert!(stored(&service, &digest).is_none());
    assert_eq!(out[PROTO_HEADER_SIZE + 5], ResultCode::KeyBusy.code());
    let calls = std::mem::take(&mut *fabric.calls.lock());
    assert_eq!(calls.len(), 1);
    assert_eq!((calls[0].0, calls[0].1), (NodeId(2), call_kind::PROXY));
    let (hop, forwarded) = Hop::decode(&calls[0].2).expect("a proxy payload");
    assert_eq!(hop.byte, 1);
    let deadline = hop.deadline_ms.expect("a deadline");
    assert!(
        (before + DEFAULT_DEADLINE_MS..=service.now().unix_ms + DEFAULT_DEADLINE_MS)
            .contains(&deadline),
        "{deadline} from {before}"
    );
    assert_eq!(forwarded, &frame[PROTO_HEADER_SIZE..]);
    // The write run here counts once its duplicate resolution and
    // replication ended; the proxied one counts on the node that runs it.
    let writes = || crate::latency::totals(service.latencies());
    assert_eq!(writes(), [("{test}-write".to_owned(), 1)]);
    // Its stages: start, duplicate resolution (with the resolved run and
    // its replica write), response; the proxied one only started here.
    let dump = benchmarks.dump(crate::latency::Unit::Milliseconds);
    for (stage, total) in [("start", 2), ("dup-res", 1), ("master", 0), ("response", 1)] {
        let line = format!("histogram dump: {{test}}-write-{stage} ({total} total) msec");
        assert!(dump.contains(&line), "{line} in {dump:#?}");
    }
    // A request proxied too often is refused with 9 (clients retry it).
    let answer = block_on_test(service.serve_fabric(
        call_kind::PROXY,
        &Hop::payload(MAX_PROXY_HOPS, u64::MAX, &frame[PROTO_HEADER_SIZE..]),
    ));
    assert_eq!(answer[PROTO_HEADER_SIZE + 5], ResultCode::Timeout.code());
    assert_eq!(
        service
            .dist()
            .stats
            .proxy_hops_exceeded
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert!(fabric.calls.lock().is_empty());
    // Answered here (with 9): a request to this node, counted.
    assert_eq!(writes(), [("{test}-write".to_owned(), 2)]);
}

#[test]
fn a_node_whose_cluster_runtime_stalled_refuses_requests() {
    use citrine_wire::msg::{field_type, info1, info3, MessageWriter, MsgHeader};
    let clock = std::sync::Arc::new(crate::ManualClock::new(1_700_000_000_000));
    let service = memory_service_on(1, clock.clone());
    let fabric = std::sync::Arc::new(FakeFabric {
        calls: parking_lot::Mutex::new(Vec::new()),
    });
    service.set_fabric(fabric.clone());
    let state = view_of_two(1, 5);
    let (_, digest) = keys_mastered_by(&state, 2)
        .next()
        .expect("a key mastered by node 2");
    service.publish_cluster(state);
    let mut frame = Vec::new();
    let mut writer = MessageWriter::begin(
        &mut frame,
        &MsgHeader {
            info1: info1::READ | info1::GET_ALL,
            ..MsgHeader::default()
        },
    );
    writer
        .field(field_type::NAMESPACE, b"test")
        .field(field_type::DIGEST, &digest.0);
    writer.finish();
    let header_bytes: [u8; PROTO_HEADER_SIZE] =
        frame[..PROTO_HEADER_SIZE].try_into().expect("header");
    let header = ProtoHeader::decode(&header_bytes).expect("header");
    let read = || {
        let mut out = Vec::new();
        service
            .handle(header, &frame[PROTO_HEADER_SIZE..], &mut out)
            .expect("handled");
        (out[PROTO_HEADER_SIZE + 5], fabric.calls.lock().len())
    };
    // No tick reported (the simulator, a lone node): no stall check.
    assert_eq!(read(), (ResultCode::KeyBusy.code(), 1));
    service.cluster_ticked(1_500);
    clock.advance_ms(1_500);
    // Within the bound: forwarded to the master as before.
    assert_eq!(read(), (ResultCode::KeyBusy.code(), 2));
    // Past it: refused here, nothing forwarded.
    let refusals = || {
        service
            .dist()
            .stats
            .stall_refusals
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    clock.advance_ms(1);
    assert_eq!(read(), (ResultCode::Unavailable.code(), 2));
    assert_eq!(refusals(), 1);
    // A scan as well, and a read another node forwards.
    let mut scan = Vec::new();
    let mut writer = MessageWriter::begin(
        &mut scan,
        &MsgHeader {
            info1: info1::READ,
            info3: info3::PARTITION_DONE,
            ..MsgHeader::default()
        },
    );
    writer.field(field_type::NAMESPACE, b"test");
    writer.finish();
    let scan_header: [u8; PROTO_HEADER_SIZE] =
        scan[..PROTO_HEADER_SIZE].try_into().expect("header");
    let mut out = Vec::new();
    service
        .handle(
            ProtoHeader::decode(&scan_header).expect("header"),
            &scan[PROTO_HEADER_SIZE..],
            &mut out,
        )
        .expect("handled");
    assert_eq!(out[PROTO_HEADER_SIZE + 5], ResultCode::Unavailable.code());
    assert_eq!(refusals(), 2, "the scan refused on arrival");
    let forwarded = block_on_test(service.serve_fabric(
        call_kind::PROXY,
        &Hop::payload(1, u64::MAX, &frame[PROTO_HEADER_SIZE..]),
    ));
    assert_eq!(
        forwarded[PROTO_HEADER_SIZE + 5],
        ResultCode::Unavailable.code()
    );
    assert_eq!(fabric.calls.lock().len(), 2);
    assert_eq!(refusals(), 3);
    // The runtime ticks again: served.
    service.cluster_ticked(1_500);
    assert_eq!(read(), (ResultCode::KeyBusy.code(), 3));
}

/// The frame of a put of bin `v` = "x" to `digest` in `test`/`demo`,
/// with the client timeout `transaction_ttl` (ms, 0 for none).
fn put_frame(digest: &Digest, transaction_ttl: u32) -> Vec<u8> {
    write_frame(
        digest,
        transaction_ttl,
        citrine_wire::msg::op_type::WRITE,
        3,
        b"x",
    )
}

/// The frame of a write of one op (`op`, particle type `particle`,
/// `value`) on bin `v` of `digest` in `test`/`demo`, with the client
/// timeout `transaction_ttl` (ms, 0 for none).
fn write_frame(
    digest: &Digest,
    transaction_ttl: u32,
    op: u8,
    particle: u8,
    value: &[u8],
) -> Vec<u8> {
    use citrine_wire::msg::{field_type, MessageWriter, MsgHeader};
    let mut frame = Vec::new();
    let header = MsgHeader {
        info2: info2::WRITE,
        transaction_ttl,
        ..MsgHeader::default()
    };
    let mut writer = MessageWriter::begin(&mut frame, &header);
    writer
        .field(field_type::NAMESPACE, b"test")
        .field(field_type::SET, b"demo")
        .field(field_type::DIGEST, &digest.0)
        .op(op, particle, b"v", value);
    writer.finish();
    frame
}

/// `service`'s reply to the client request `frame`.
fn handle_frame(service: &Service, frame: &[u8]) -> Vec<u8> {
    let header_bytes: [u8; PROTO_HEADER_SIZE] =
        frame[..PROTO_HEADER_SIZE].try_into().expect("header");
    let header = ProtoHeader::decode(&header_bytes).expect("header");
    let mut out = Vec::new();
    service
        .handle(header, &frame[PROTO_HEADER_SIZE..], &mut out)
        .expect("handled");
    out
}

/// [`FakeFabric`], whose duplicate-resolution answers take
/// `resolve_ms` of `clock`'s time.
struct SlowResolution {
    fake: FakeFabric,
    clock: std::sync::Arc<crate::ManualClock>,
    resolve_ms: AtomicU64,
}

impl Fabric for SlowResolution {
    fn call(&self, to: NodeId, kind: u8, payload: Vec<u8>, timeout: Duration) -> FabricFuture {
        if kind == call_kind::DUPRES {
            self.clock
                .advance_ms(self.resolve_ms.load(Ordering::Relaxed));
        }
        self.fake.call(to, kind, payload, timeout)
    }
}

#[test]
fn a_request_past_its_deadline_is_not_run() {
    let clock = std::sync::Arc::new(crate::ManualClock::new(1_700_000_000_000));
    let service = memory_service_on(1, clock.clone());
    let fabric = std::sync::Arc::new(SlowResolution {
        fake: FakeFabric {
            calls: parking_lot::Mutex::new(Vec::new()),
        },
        clock: clock.clone(),
        resolve_ms: AtomicU64::new(0),
    });
    service.set_fabric(fabric.clone());
    let state = view_of_two(1, 5);
    let mine: Vec<Digest> = keys_mastered_by(&state, 1)
        .map(|(_, digest)| digest)
        .take(6)
        .collect();
    service.publish_cluster(state);
    // A put of `digest` with a 50 ms client timeout.
    let put = |digest: &Digest| put_frame(digest, 50);
    let expired = || {
        service
            .dist()
            .stats
            .expired_refusals
            .load(Ordering::Relaxed)
    };
    // Forwarded by a peer, with `left_ms` of its deadline left here:
    // the result code, and whether the write was applied.
    let forwarded = |digest: &Digest, left_ms: u64| {
        let deadline = service.now().unix_ms + left_ms;
        let payload = Hop::payload(1, deadline, &put(digest)[PROTO_HEADER_SIZE..]);
        let answer = block_on_test(service.serve_fabric(call_kind::PROXY, &payload));
        (
            answer[PROTO_HEADER_SIZE + 5],
            stored(&service, digest).is_some(),
        )
    };
    assert_eq!(
        forwarded(&mine[0], PROXY_CLOCK_MARGIN_MS + 1),
        (ResultCode::Ok.code(), true)
    );
    assert_eq!(expired(), 0);
    // Held up on its way (or here, while this node was stalled) until
    // the forwarder has answered 9, or may have: not run.
    assert_eq!(
        forwarded(&mine[1], PROXY_CLOCK_MARGIN_MS),
        (ResultCode::Timeout.code(), false)
    );
    assert_eq!(expired(), 1);
    let passed = Hop::payload(
        1,
        service.now().unix_ms - 1_000,
        &put(&mine[2])[PROTO_HEADER_SIZE..],
    );
    let answer = block_on_test(service.serve_fabric(call_kind::PROXY, &passed));
    assert_eq!(answer[PROTO_HEADER_SIZE + 5], ResultCode::Timeout.code());
    assert!(stored(&service, &mine[2]).is_none());
    assert_eq!(expired(), 2);
    // A client's own request whose duplicate resolution outlasted its
    // timeout is not run either; one resolved in time is.
    let client = |digest: &Digest, resolve_ms: u64| {
        fabric.resolve_ms.store(resolve_ms, Ordering::Relaxed);
        let out = handle_frame(&service, &put(digest));
        (
            out[PROTO_HEADER_SIZE + 5],
            stored(&service, digest).is_some(),
        )
    };
    assert_eq!(client(&mine[3], 49), (ResultCode::Ok.code(), true));
    assert_eq!(expired(), 2);
    assert_eq!(client(&mine[4], 50), (ResultCode::Timeout.code(), false));
    assert_eq!(expired(), 3);
    // A payload too short for its hop is refused, not read past.
    let answer = block_on_test(service.serve_fabric(call_kind::PROXY, &[1, 0, 0]));
    assert_eq!(answer[PROTO_HEADER_SIZE + 5], ResultCode::Parameter.code());
}

/// A client's request that waited in this node's socket through a
/// stall is forwarded with the deadline its client's timeout gives
/// from when it may have arrived, not from now.
#[test]
fn a_held_request_is_forwarded_with_its_deadline_from_the_stall() {
    let clock = std::sync::Arc::new(crate::ManualClock::new(1_700_000_000_000));
    let service = memory_service_on(1, clock);
    service.set_fabric(std::sync::Arc::new(FakeFabric {
        calls: parking_lot::Mutex::new(Vec::new()),
    }));
    let state = view_of_two(1, 5);
    let (_, theirs) = keys_mastered_by(&state, 2)
        .next()
        .expect("a key node 2 masters");
    service.publish_cluster(state);
    let frame = put_frame(&theirs, 50);
    let header: [u8; PROTO_HEADER_SIZE] = frame[..PROTO_HEADER_SIZE].try_into().expect("header");
    let header = ProtoHeader::decode(&header).expect("header");
    let handle_held = |waiting_since_ms: Option<u64>| {
        let mut out = Vec::new();
        let pending = service
            .handle_streaming_since(
                header,
                &frame[PROTO_HEADER_SIZE..],
                &mut out,
                waiting_since_ms,
            )
            .expect("handled");
        (pending, out)
    };
    let proxied = |waiting_since_ms: Option<u64>| {
        let (pending, out) = handle_held(waiting_since_ms);
        match pending.map(|continuation| continuation.0) {
            Some(crate::Pending::Remote(remote, _)) => match *remote {
                Remote::Proxy {
                    to,
                    payload,
                    deadline_ms,
                } => {
                    assert_eq!(to, NodeId(2));
                    let (hop, _) = Hop::decode(&payload).expect("a hop");
                    assert_eq!(hop.deadline_ms, Some(deadline_ms));
                    deadline_ms
                }
                other => panic!("not forwarded: {other:?}"),
            },
            other => panic!("not forwarded: {other:?}, answer {out:?}"),
        }
    };
    let now = service.now().unix_ms;
    assert_eq!(proxied(None), now + 50);
    assert_eq!(proxied(Some(now - 20)), now + 30);
    // Its time ran out while it waited: refused here, not forwarded.
    let (pending, out) = handle_held(Some(now - 50));
    assert!(pending.is_none());
    assert_eq!(out[PROTO_HEADER_SIZE + 5], ResultCode::Timeout.code());
}

#[test]
fn every_replica_is_sent_to_at_once() {
    let joined = crate::block_on(join_all(
        vec![3, 1, 2]
            .into_iter()
            .map(|value| async move { value })
            .collect(),
    ));
    assert_eq!(joined, vec![3, 1, 2]);
    assert!(crate::block_on(join_all(Vec::<std::future::Ready<u8>>::new())).is_empty());
    // Three replicas: both others get the record's state.
    use crate::cluster_state::{ClusterMember, ClusterState};
    let service = memory_service(1);
    let fabric = std::sync::Arc::new(FakeFabric {
        calls: parking_lot::Mutex::new(Vec::new()),
    });
    service.set_fabric(fabric.clone());
    let members = [1u64, 2, 3].map(|id| ClusterMember {
        node_id: NodeId(id),
        rack_id: 0,
        service_address: format!("127.0.0.1:{}", 3000 + id),
        tls: None,
    });
    let state = ClusterState::new(NodeId(1), 5, members.to_vec(), &[("test".into(), 3)], 2, 2);
    let partition = (0..4096u16)
        .filter_map(PartitionId::new)
        .find(|pid| state.namespaces[0].map.master(*pid) == Some(NodeId(1)))
        .expect("a partition mastered here");
    service.publish_cluster(state);
    let remote = Remote::Replicate {
        namespace: "test".into(),
        partition,
        targets: vec![NodeId(2), NodeId(3)],
        cluster_key: service.cluster().cluster_key,
        payload: replica_payload(
            service.cluster().cluster_key,
            namespace_of(&service),
            &sample(None),
        ),
        deadline_ms: u64::MAX,
        regime: None,
        txn: Vec::new(),
    };
    let mut out = Vec::new();
    transaction::write_result(&mut out, ResultCode::Ok);
    let before = out.clone();
    crate::block_on(service.complete(remote, &mut out));
    assert_eq!(out, before);
    let mut called: Vec<NodeId> = fabric.calls.lock().iter().map(|call| call.0).collect();
    called.sort();
    assert_eq!(called, vec![NodeId(2), NodeId(3)]);
}

/// Never answers.
struct DeadFabric;

impl Fabric for DeadFabric {
    fn call(&self, _: NodeId, _: u8, _: Vec<u8>, _: Duration) -> FabricFuture {
        Box::pin(async { Err(FabricError::Timeout) })
    }
}

#[test]
fn unacknowledged_writes_time_out_unless_the_replica_left_the_map() {
    let service = memory_service(1);
    service.set_fabric(std::sync::Arc::new(DeadFabric));
    let partition = PartitionId::new(7).expect("partition");
    let replicate = |service: &Service| {
        let remote = Remote::Replicate {
            namespace: "test".into(),
            partition,
            targets: vec![NodeId(2)],
            cluster_key: service.cluster().cluster_key,
            payload: replica_payload(
                service.cluster().cluster_key,
                namespace_of(service),
                &sample(None),
            ),
            deadline_ms: u64::MAX,
            regime: None,
            txn: Vec::new(),
        };
        let mut out = Vec::new();
        transaction::write_result(&mut out, ResultCode::Ok);
        crate::block_on(service.complete(remote, &mut out));
        out[PROTO_HEADER_SIZE + 5]
    };
    // The published map is this node alone: node 2 left, the write stands.
    assert_eq!(replicate(&service), ResultCode::Ok.code());
    // Node 2 is the partition's other replica and never answers: 9.
    service.publish_cluster(view_of_two(1, 5));
    assert_eq!(replicate(&service), ResultCode::Timeout.code());
    assert_eq!(
        service
            .dist()
            .stats
            .replica_write_retries
            .load(std::sync::atomic::Ordering::Relaxed),
        u64::from(MAX_ATTEMPTS - 1)
    );
}

/// Answers every call with `code`, recording the calls.
struct Answering {
    code: u8,
    calls: parking_lot::Mutex<Vec<(NodeId, u8, Vec<u8>)>>,
}

impl Fabric for Answering {
    fn call(&self, to: NodeId, kind: u8, payload: Vec<u8>, _: Duration) -> FabricFuture {
        self.calls.lock().push((to, kind, payload));
        let code = self.code;
        Box::pin(async move { Ok(vec![code]) })
    }
}

/// A replica of a build from before XDR marks: it refuses (4) a copy
/// whose kind byte has the mark's bit, and takes any other.
struct BeforeMarks {
    calls: parking_lot::Mutex<Vec<Vec<u8>>>,
}

impl Fabric for BeforeMarks {
    fn call(&self, _: NodeId, _: u8, payload: Vec<u8>, _: Duration) -> FabricFuture {
        let marked = payload.get(16).is_some_and(|kind| kind & 0x80 != 0);
        self.calls.lock().push(payload);
        let code = if marked {
            ResultCode::Parameter
        } else {
            ResultCode::Ok
        };
        Box::pin(async move { Ok(vec![code.code()]) })
    }
}

/// During a rolling upgrade a write that came by XDR still succeeds on a
/// master whose replica runs a build that refuses marked copies: the copy
/// is sent again without the mark and acknowledged.
#[test]
fn a_replica_refusing_the_xdr_mark_gets_the_copy_unmarked() {
    let service = memory_service(1);
    service.publish_cluster(view_of_two(1, 5));
    let write = ReplicaWrite {
        xdr_write: true,
        ..sample(Some(vec![1, 2, 3]))
    };
    assert_eq!(apply_replica_write(&service, &write), ResultCode::Ok);
    let fabric = std::sync::Arc::new(BeforeMarks {
        calls: parking_lot::Mutex::new(Vec::new()),
    });
    service.set_fabric(fabric.clone());
    let remote = Remote::Replicate {
        namespace: "test".into(),
        partition: write.digest.partition(),
        targets: vec![NodeId(2)],
        cluster_key: 5,
        payload: replica_payload(5, namespace_of(&service), &write),
        deadline_ms: u64::MAX,
        regime: None,
        txn: Vec::new(),
    };
    let mut out = Vec::new();
    transaction::write_result(&mut out, ResultCode::Ok);
    crate::block_on(service.complete(remote, &mut out));
    assert_eq!(out[PROTO_HEADER_SIZE + 5], ResultCode::Ok.code());
    let calls = fabric.calls.lock();
    assert_eq!(calls.len(), 2, "refused marked, then taken unmarked");
    let sent = |payload: &Vec<u8>| {
        let (_, _, copy) = split_replica_payload(payload).expect("a replica payload");
        ReplicaWrite::decode(copy).expect("a copy")
    };
    assert!(sent(&calls[0]).xdr_write);
    assert_eq!(
        sent(&calls[1]),
        ReplicaWrite {
            xdr_write: false,
            ..write
        }
    );
}

#[test]
fn a_write_a_replica_missed_is_sent_again_until_it_is_acknowledged() {
    use std::sync::atomic::Ordering::Relaxed;
    let clock = std::sync::Arc::new(crate::ManualClock::new(1_700_000_000_000));
    let service = memory_service_on(1, clock.clone());
    let view = |key| view_of_two(1, key);
    service.publish_cluster(view(5));
    // This node holds the record (its write); node 2 never answers.
    let write = sample(Some(vec![1, 2, 3]));
    assert_eq!(apply_replica_write(&service, &write), ResultCode::Ok);
    service.set_fabric(std::sync::Arc::new(DeadFabric));
    let remote = Remote::Replicate {
        namespace: "test".into(),
        partition: write.digest.partition(),
        targets: vec![NodeId(2)],
        cluster_key: 5,
        payload: replica_payload(5, namespace_of(&service), &write),
        deadline_ms: u64::MAX,
        regime: None,
        txn: Vec::new(),
    };
    let mut out = Vec::new();
    transaction::write_result(&mut out, ResultCode::Ok);
    crate::block_on(service.complete(remote, &mut out));
    assert_eq!(out[PROTO_HEADER_SIZE + 5], ResultCode::Timeout.code());
    assert_eq!(service.dist().reconciles.pending_count(), 1);
    // A new view; node 2 still in the old one refuses (7): kept.
    service.publish_cluster(view(6));
    let refusing = Answering {
        code: ResultCode::ClusterKeyMismatch.code(),
        calls: parking_lot::Mutex::new(Vec::new()),
    };
    crate::block_on(service.dist().reconcile_pending(&refusing));
    assert_eq!(refusing.calls.lock().len(), 1);
    assert_eq!(service.dist().reconciles.pending_count(), 1);
    // Once node 2 takes it: the record's state under the current view,
    // and the queue is empty.
    let taking = Answering {
        code: 0,
        calls: parking_lot::Mutex::new(Vec::new()),
    };
    crate::block_on(service.dist().reconcile_pending(&taking));
    let calls = std::mem::take(&mut *taking.calls.lock());
    assert_eq!(
        (calls[0].0, calls[0].1),
        (NodeId(2), call_kind::REPLICA_WRITE)
    );
    let (key, _, sent) = split_replica_payload(&calls[0].2).expect("a replica payload");
    assert_eq!(key, 6);
    let sent = ReplicaWrite::decode(sent).expect("a replica write");
    assert_eq!((sent.digest, sent.generation), (write.digest, 3));
    assert!((service.dist().reconciles.pending_count() == 0));
    assert_eq!(service.dist().stats.reconciles_done.load(Relaxed), 1);
    crate::block_on(service.dist().reconcile_pending(&taking));
    assert!(taking.calls.lock().is_empty());
    // One never acknowledged is given up on after RECONCILE_FOR_MS.
    service
        .dist()
        .queue_reconcile("test", write.digest.partition(), &calls[0].2);
    crate::block_on(service.dist().reconcile_pending(&refusing));
    assert_eq!(service.dist().reconciles.pending_count(), 1);
    clock.advance_ms(RECONCILE_FOR_MS);
    crate::block_on(service.dist().reconcile_pending(&refusing));
    assert!((service.dist().reconciles.pending_count() == 0));
    assert_eq!(service.dist().stats.reconciles_dropped.load(Relaxed), 1);
}

#[test]
fn a_replica_write_to_a_node_without_the_partition_is_refused() {
    // Node 1 in a view of three (replication factor 2): it is a replica
    // of some partitions and not of others.
    use crate::cluster_state::{ClusterMember, ClusterState};
    use std::sync::atomic::Ordering::Relaxed;
    let service = memory_service(1);
    let members = [1u64, 2, 3].map(|id| ClusterMember {
        node_id: NodeId(id),
        rack_id: 0,
        service_address: format!("127.0.0.1:{}", 3000 + id),
        tls: None,
    });
    let state = ClusterState::new(NodeId(1), 5, members.to_vec(), &[("test".into(), 2)], 2, 2);
    let holds_here = |partition: PartitionId| {
        state.namespaces[0]
            .map
            .replicas(partition)
            .contains(&NodeId(1))
    };
    // Records of a partition node 1 is a replica of, and of two it is
    // not: one it still holds a copy of (a migration source, or the
    // acting master), one it holds nothing of (its copy dropped).
    let write_in = |replica: bool, skip: usize| {
        let digest = (0u32..)
            .map(|n| {
                let mut bytes = [0u8; DIGEST_SIZE];
                bytes[..4].copy_from_slice(&n.to_le_bytes());
                Digest(bytes)
            })
            .filter(|digest| holds_here(digest.partition()) == replica)
            .nth(skip)
            .expect("a digest");
        ReplicaWrite {
            digest,
            ..sample(Some(vec![1, 2, 3]))
        }
    };
    let (replica, held, dropped) = (write_in(true, 0), write_in(false, 0), write_in(false, 1));
    assert_ne!(held.digest.partition(), dropped.digest.partition());
    assert_eq!(apply_replica_write(&service, &held), ResultCode::Ok);
    service.publish_cluster(state);
    let send = |write: &ReplicaWrite| {
        let payload = replica_payload(5, namespace_of(&service), write);
        block_on_test(service.serve_fabric(call_kind::REPLICA_WRITE, &payload))
    };
    assert_eq!(send(&replica), vec![ResultCode::Ok.code()]);
    assert!(stored(&service, &replica.digest).is_some());
    let newer = ReplicaWrite {
        generation: 4,
        life: 0,
        durable: false,
        ..held.clone()
    };
    assert_eq!(send(&newer), vec![ResultCode::Ok.code()]);
    assert_eq!(
        stored(&service, &held.digest).map(|(meta, _)| meta.generation),
        Some(4)
    );
    // Nothing of the partition here: the write would bring back a copy
    // outside the replica list that no migration drops.
    assert_eq!(send(&dropped), vec![ResultCode::Unavailable.code()]);
    assert!(stored(&service, &dropped.digest).is_none());
    assert_eq!(
        service
            .dist()
            .stats
            .replica_writes_refused_not_holder
            .load(Relaxed),
        1
    );
}

#[test]
fn a_copy_admitted_if_held_needs_a_record_or_tombstone_of_the_partition() {
    let service = memory_service(1);
    let record = sample(Some(vec![1, 2, 3]));
    // Nothing of the partition here: refused, nothing stored.
    assert_eq!(
        apply_copy_admitted(service.dist(), &record, 0, Admit::IfHeld),
        ResultCode::Unavailable
    );
    assert!(stored(&service, &record.digest).is_none());
    // A tombstone of another record of the partition is a held copy.
    let mut other = record.digest;
    other.0[DIGEST_SIZE - 1] ^= 0xff;
    assert_eq!(other.partition(), record.digest.partition());
    let delete = ReplicaWrite {
        digest: other,
        generation: 2,
        life: 0,
        durable: false,
        ..sample(None)
    };
    assert_eq!(
        apply_copy_admitted(service.dist(), &delete, 0, Admit::Always),
        ResultCode::Ok
    );
    assert!(stored(&service, &other).is_none());
    assert_eq!(
        apply_copy_admitted(service.dist(), &record, 0, Admit::IfHeld),
        ResultCode::Ok
    );
    assert!(stored(&service, &record.digest).is_some());
}

fn block_on_test<F: std::future::Future>(future: F) -> F::Output {
    crate::block_on(future)
}

/// Answers DUPRES with `answer` (or times out when `None`), acks the rest.
struct DupResFabric {
    answer: Option<DupResAnswer>,
    calls: parking_lot::Mutex<Vec<u8>>,
}

impl Fabric for DupResFabric {
    fn call(&self, _: NodeId, kind: u8, _: Vec<u8>, _: Duration) -> FabricFuture {
        self.calls.lock().push(kind);
        let answer = match (kind, &self.answer) {
            (call_kind::DUPRES, Some(answer)) => Ok(answer.encode()),
            (call_kind::DUPRES, None) => Err(FabricError::Timeout),
            _ => Ok(vec![0]),
        };
        Box::pin(async move { answer })
    }
}

#[test]
fn dupres_messages_round_trip() {
    let request = DupResRequest {
        cluster_key: 42,
        namespace: "test".into(),
        digest: Digest([9; DIGEST_SIZE]),
    };
    assert_eq!(
        DupResRequest::decode(&request.encode()),
        Some(request.clone())
    );
    assert_eq!(DupResRequest::decode(&request.encode()[1..]), None);
    for answer in [
        DupResAnswer {
            record: None,
            truncated_before: 0,
            txn: Vec::new(),
        },
        DupResAnswer {
            record: Some(sample(Some(vec![1, 2, 3]))),
            truncated_before: 1_700_000_000_000,
            txn: Vec::new(),
        },
        DupResAnswer {
            record: Some(sample(Some(vec![1, 2, 3]))),
            truncated_before: 5,
            txn: vec![2, 0, 0, 0, 9, 0],
        },
        DupResAnswer {
            record: None,
            truncated_before: 0,
            txn: vec![2, 0, 0, 0, 9, 0],
        },
    ] {
        assert_eq!(DupResAnswer::decode(&answer.encode()), Some(answer.clone()));
    }
    assert_eq!(DupResAnswer::decode(&[0, 1]), None);
    assert_eq!(DupResAnswer::decode(&[1]), None);
    assert_eq!(DupResAnswer::decode(&[]), None);
    assert_eq!(DupResAnswer::decode(&[4, 0, 0, 0, 0]), None, "empty state");
    assert_eq!(DupResAnswer::decode(&[4, 0, 0, 0, 2, 1]), None, "cut short");
}

/// A write at a master whose partition is incoming builds on the newest
/// copy held elsewhere; unanswered resolution → 9, nothing executed.
#[test]
fn an_incoming_master_resolves_before_executing() {
    use citrine_wire::digest::{of_key, UserKey};
    use citrine_wire::msg::{field_type, op_type, MessageWriter, MsgHeader};
    let incr = |service: &Service, key: &str| {
        let digest = of_key("demo", &UserKey::String(key.into()));
        let frame = write_frame(&digest, 0, op_type::INCR, 1, &1i64.to_be_bytes());
        (digest, handle_frame(service, &frame)[PROTO_HEADER_SIZE + 5])
    };
    // The old holder: three increments.
    let old = memory_service(2);
    let make_state = || view_of_two(1, 5);
    let state = make_state();
    let (key, _) = keys_mastered_by(&state, 1).next().expect("a key");
    for _ in 0..3 {
        assert_eq!(incr(&old, &key).1, 0);
    }
    let digest = of_key("demo", &UserKey::String(key.clone()));
    let copy = fetch(old.namespace(b"test").expect("ns"), &digest, old.now()).expect("copy");
    assert_eq!(copy.generation, 3);
    // The new master (base: alone) resolves with node 2 first.
    let service = memory_service(1);
    let fabric = std::sync::Arc::new(DupResFabric {
        answer: Some(DupResAnswer {
            record: Some(copy.clone()),
            truncated_before: 0,
            txn: Vec::new(),
        }),
        calls: parking_lot::Mutex::new(Vec::new()),
    });
    service.set_fabric(fabric.clone());
    service.publish_cluster(make_state());
    // Exchanging: resolution against every other member.
    assert_eq!(
        service
            .migrations()
            .disposition("test", digest.partition(), false),
        Disposition::DupRes {
            cluster_key: 5,
            sources: vec![NodeId(2)]
        }
    );
    assert_eq!(incr(&service, &key).1, 0);
    assert_eq!(
        fabric.calls.lock().as_slice(),
        &[call_kind::DUPRES, call_kind::REPLICA_WRITE]
    );
    assert_eq!(
        stored(&service, &digest).map(|(meta, _)| meta.generation),
        Some(4)
    );
    // Unreachable member: 9 (not executed; clients retry a 9, never
    // an 11), the local copy untouched.
    let service = memory_service(1);
    service.set_fabric(std::sync::Arc::new(DupResFabric {
        answer: None,
        calls: parking_lot::Mutex::new(Vec::new()),
    }));
    service.publish_cluster(make_state());
    assert_eq!(incr(&service, &key).1, ResultCode::Timeout.code());
    assert!(stored(&service, &digest).is_none());
    assert_eq!(
        service
            .migrations()
            .dupres_failures
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    // After the exchange: node 2 held the only copy and node 1 nothing,
    // so node 1 expects node 2 (resolution against it alone) and node
    // 2 is the acting master (reads go there) until its last batch.
    let service = memory_service(1);
    service.set_fabric(std::sync::Arc::new(DupResFabric {
        answer: Some(DupResAnswer {
            record: None,
            truncated_before: 0,
            txn: Vec::new(),
        }),
        calls: parking_lot::Mutex::new(Vec::new()),
    }));
    service.publish_cluster(make_state());
    old.publish_cluster(view_of_two(2, 5));
    assert!(service.dist().finish_exchange(
        service.migrations().epoch(),
        vec![(NodeId(2), old.migrations().exchange_answer(5))]
    ));
    let partition = digest.partition();
    assert_eq!(
        service.migrations().disposition("test", partition, false),
        Disposition::DupRes {
            cluster_key: 5,
            sources: vec![NodeId(2)]
        }
    );
    assert_eq!(
        service.migrations().disposition("test", partition, true),
        Disposition::Acting(NodeId(2))
    );
    assert_eq!(
        service.migrations().acting_target("test", partition),
        Some(NodeId(2))
    );
    assert_eq!(
        service.migrations().rx_remaining(),
        service.migrations().namespace_remaining("test").1
    );

    // Claims: node 1 cedes the partition's master column to node 2,
    // which claims it as the acting master (the reference's working
    // master) once its own exchange is resolved; each change moves the
    // partition generation clients poll.
    let claims = |node: &Service| -> (bool, u64) {
        let answer = crate::tests::info(node, &["replicas-master", "partition-generation"]);
        let bitmap = answer[0].1.split_once(':').expect("ns:bitmap").1;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(bitmap)
            .expect("base64");
        let at = partition.index();
        let claimed = bytes[at >> 3] & (0x80 >> (at & 7)) != 0;
        (claimed, answer[1].1.parse().expect("generation"))
    };
    use crate::migration::{Handover, MasterClaim};
    use base64::Engine as _;
    assert_eq!(
        service
            .migrations()
            .master_claim("test", partition, NodeId(1)),
        MasterClaim::Ceded
    );
    assert!(!claims(&service).0, "the filling master cedes it");
    let old_fabric = std::sync::Arc::new(DupResFabric {
        answer: None,
        calls: parking_lot::Mutex::new(Vec::new()),
    });
    old.set_fabric(old_fabric.clone());
    let (claimed, before) = claims(&old);
    assert!(!claimed, "node 2 is no master in the map");
    assert!(old.dist().finish_exchange(
        old.migrations().epoch(),
        vec![(NodeId(1), service.migrations().exchange_answer(5))]
    ));
    let (claimed, acting_generation) = claims(&old);
    assert!(claimed, "the acting master claims it");
    assert!(acting_generation > before);
    // A plain read a client sends the acting master is served there.
    let read = |node: &Service| {
        let mut frame = Vec::new();
        let header = MsgHeader {
            info1: citrine_wire::msg::info1::READ | citrine_wire::msg::info1::GET_ALL,
            ..MsgHeader::default()
        };
        let mut writer = MessageWriter::begin(&mut frame, &header);
        writer
            .field(field_type::NAMESPACE, b"test")
            .field(field_type::SET, b"demo")
            .field(field_type::DIGEST, &digest.0);
        writer.finish();
        handle_frame(node, &frame)
    };
    let reply = read(&old);
    assert_eq!(reply[PROTO_HEADER_SIZE + 5], 0, "found");
    assert!(old_fabric.calls.lock().is_empty(), "served, not proxied");
    assert_eq!(
        old.migrations()
            .acting_reads
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    // Before its last batch to the master it hands the claim back; from
    // then on a client's read is served only as a replica's (node 2 is
    // one here; the master replicates every write to it).
    let epoch = old.migrations().epoch();
    let hand_over = |to: Handover, then: MasterClaim| {
        old.migrations()
            .hand_over(epoch, "test", partition, NodeId(2), to);
        assert_eq!(
            old.migrations().master_claim("test", partition, NodeId(2)),
            then
        );
    };
    hand_over(Handover::Releasing, MasterClaim::Releasing);
    let (claimed, releasing_generation) = claims(&old);
    assert!(!claimed);
    assert!(releasing_generation > acting_generation);
    let reply = read(&old);
    assert_eq!(reply[PROTO_HEADER_SIZE + 5], 0, "found");
    assert!(old_fabric.calls.lock().is_empty(), "served, not proxied");
    let load =
        |counter: &std::sync::atomic::AtomicU64| counter.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(load(&old.migrations().acting_reads), 1);
    assert_eq!(load(&old.dist().stats.replica_reads), 1);
    hand_over(Handover::Released, MasterClaim::Ordinary);
    let (_, master_generation) = claims(&service);

    let last = crate::migration::MigrateBatch {
        cluster_key: 5,
        source: NodeId(2),
        flags: crate::migration::FLAG_FIRST | crate::migration::FLAG_LAST,
        namespace: "test".into(),
        partition: partition.index() as u16,
        records: vec![copy.encode()],
        truncated_before: Vec::new(),
        txn: Vec::new(),
    };
    assert_eq!(
        service.dist().apply_migrate_batch(&last.encode()),
        ResultCode::Ok
    );
    assert_eq!(
        service.migrations().disposition("test", partition, false),
        Disposition::Normal
    );
    let (claimed, generation) = claims(&service);
    assert!(claimed, "the filled master claims it again");
    assert!(generation > master_generation);
    assert_eq!(
        service.migrations().version("test", partition),
        citrine_cluster::exchange::PartitionVersion::full(5)
    );
    assert_eq!(
        stored(&service, &digest).map(|(meta, _)| meta.generation),
        Some(3)
    );
}

/// A write executed under one view is never acknowledged under the
/// next: the replica refuses another view's key, and a master whose view
/// moved on stops (9: in doubt).
#[test]
fn replica_writes_belong_to_one_view() {
    let replica = memory_service(2);
    let key = replica.cluster().cluster_key;
    let write = sample(Some(vec![7]));
    let answer = |payload: Vec<u8>| {
        crate::block_on(replica.serve_fabric(call_kind::REPLICA_WRITE, &payload))
    };
    assert_eq!(
        answer(replica_payload(key ^ 1, namespace_of(&replica), &write)),
        vec![ResultCode::ClusterKeyMismatch.code()]
    );
    assert!(stored(&replica, &write.digest).is_none());
    assert_eq!(
        answer(replica_payload(key, namespace_of(&replica), &write)),
        vec![0]
    );
    assert!(stored(&replica, &write.digest).is_some());
    assert_eq!(answer(vec![1, 2]), vec![ResultCode::Parameter.code()]);
    // The master side: its own view moved on.
    let master = memory_service(1);
    let fabric = AlwaysOk;
    let done = crate::block_on(master.dist().replicate(
        &fabric,
        WriteScope {
            namespace: "test",
            partition: write.digest.partition(),
            cluster_key: master.cluster().cluster_key ^ 1,
            regime: None,
            txn: &[],
        },
        vec![NodeId(2)],
        &replica_payload(key, namespace_of(&master), &write),
        u64::MAX,
    ));
    assert!(!done);
}

struct AlwaysOk;

impl Fabric for AlwaysOk {
    fn call(&self, _: NodeId, _: u8, _: Vec<u8>, _: Duration) -> FabricFuture {
        Box::pin(async { Ok(vec![0]) })
    }
}

#[test]
fn whole_frames() {
    let mut frame = Vec::new();
    transaction::write_result(&mut frame, ResultCode::Ok);
    assert!(is_whole_frame(&frame));
    assert!(!is_whole_frame(&frame[..frame.len() - 1]));
    assert!(!is_whole_frame(&[]));
}

/// A replica write a peer garbled, or one no master sends (a record at
/// generation 0, a set name no client could give), is refused as
/// malformed input and counted; nothing is stored, no set is created,
/// and the node goes on serving well-formed writes.
#[test]
fn malformed_replica_writes_are_refused_and_counted() {
    let replica = memory_service(2);
    let key = replica.cluster().cluster_key;
    let answer =
        |payload: &[u8]| crate::block_on(replica.serve_fabric(call_kind::REPLICA_WRITE, payload));
    let malformed = |write: &ReplicaWrite| replica_payload(key, namespace_of(&replica), write);
    let long_set = ReplicaWrite {
        set_name: vec![b's'; citrine_types::SET_NAME_MAX + 1],
        ..sample(Some(vec![1]))
    };
    let nul_set = ReplicaWrite {
        set_name: b"a\0b".to_vec(),
        ..sample(Some(vec![1]))
    };
    let generation_0 = ReplicaWrite {
        generation: 0,
        ..sample(Some(vec![1]))
    };
    let good = replica_payload(key, namespace_of(&replica), &sample(Some(vec![1])));
    let cases: [(&str, Vec<u8>); 5] = [
        ("short header", key.to_be_bytes().to_vec()),
        ("undecodable", good[..good.len() - 1].to_vec()),
        ("set name too long", malformed(&long_set)),
        ("set name with a NUL", malformed(&nul_set)),
        ("record at generation 0", malformed(&generation_0)),
    ];
    let refused = || {
        replica
            .dist()
            .stats
            .peer_messages_malformed
            .load(Ordering::Relaxed)
    };
    for (n, (what, payload)) in cases.iter().enumerate() {
        assert_eq!(
            answer(payload),
            vec![ResultCode::Parameter.code()],
            "{what}"
        );
        assert!(stored(&replica, &sample(None).digest).is_none(), "{what}");
        assert_eq!(refused(), n as u64 + 1, "{what}");
    }
    let sets = &namespace_of(&replica).sets;
    assert_eq!(sets.existing_id(&long_set.set_name), None);
    assert_eq!(sets.existing_id(&nul_set.set_name), None);
    assert_eq!(answer(&good), vec![ResultCode::Ok.code()]);
    assert!(stored(&replica, &sample(None).digest).is_some());
    assert_eq!(refused(), cases.len() as u64);
}
