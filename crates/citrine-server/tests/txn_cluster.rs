//! Multi-record transactions over real `citrined` processes (issue 40,
//! the cluster part): three nodes, a strong-consistency namespace with two
//! copies, the roster set. Three transactions (raw frames, as the official
//! clients send them: the monitor record in `<ERO~MRT`, writes with the
//! transaction id and deadline, single-record rolls, the monitor's close)
//! each write two records whose masters are different nodes, their
//! monitors on the first record's master; that node is killed before they
//! end. The new masters must hold the provisional versions (a plain write
//! finds the record locked, 120; the transaction reads its own version)
//! and the monitors (a mark to roll forward succeeds): the commit then
//! shows both writes, the abort neither, and the transaction its client
//! marked before the kill and left is rolled forward by the cluster at its
//! deadline. Before they end, both survivors hold a copy of every
//! provisional version and monitor (those whose other copy was on the
//! killed node were sent to the node filled in its place).

#![allow(clippy::unwrap_used)]

mod common;

use citrine_wire::digest::{compute, of_key, UserKey};
use citrine_wire::msg::{field_type, info1, info2, op_type, MessageWriter, MsgHeader};
use citrine_wire::txn::info4;
use common::cluster::{set_roster_to_observed, wait_for_cluster, Node};
use common::*;
use std::net::TcpStream;
use std::time::{Duration, Instant};

const MONITOR_SET: &[u8] = b"<ERO~MRT";

fn config() -> String {
    let example = std::fs::read_to_string(workspace_root().join("examples/cluster.toml")).unwrap();
    format!(
        "{example}\n[[namespace]]\nname = \"sc\"\nreplication-factor = 2\nstrong-consistency = true\n\
         strong-consistency-serve-data = true\n\n\
         [namespace.storage-engine]\ntype = \"memory\"\ndata-size = \"64M\"\n"
    )
}

/// Three nodes on the SC configuration, in a view, the roster set.
fn sc_cluster() -> Vec<Node> {
    let config = config();
    let directory = std::env::temp_dir().join(format!(
        "citrine-txn-cluster-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&directory).unwrap();
    let path = directory.join("cluster.toml");
    std::fs::write(&path, config).unwrap();
    let mut nodes: Vec<Node> = (0..3)
        .map(|index| {
            let mut node = Node::new(0x50 + index);
            node.config = Some(path.clone());
            node
        })
        .collect();
    let seeds: Vec<String> = nodes.iter().map(Node::heartbeat_address).collect();
    for node in nodes.iter_mut() {
        node.start_seeds(&seeds);
    }
    let group: Vec<&Node> = nodes.iter().collect();
    wait_for_cluster(&group, 3, Duration::from_secs(30));
    set_roster_to_observed(&nodes[0], "sc");
    for node in &nodes {
        wait_for_available(node);
    }
    nodes
}

/// `name` in `node`'s `namespace/sc` statistics.
fn stat_of(node: &Node, name: &str) -> Option<u64> {
    let answer = node.info_value("namespace/sc")?;
    answer
        .split(';')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))?
        .parse()
        .ok()
}

fn wait_for_available(node: &Node) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while stat_of(node, "unavailable_partitions") != Some(0) {
        assert!(Instant::now() < deadline, "node {} unavailable", node.id);
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Which node (index) masters each partition of `sc`.
fn masters(nodes: &[Node]) -> Vec<usize> {
    use base64::Engine as _;
    let mut owner = vec![usize::MAX; 4096];
    for (index, node) in nodes.iter().enumerate() {
        let answer = node.info_value("replicas-master").unwrap();
        let bitmap = answer
            .split(';')
            .find_map(|namespace| namespace.strip_prefix("sc:"))
            .unwrap();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(bitmap)
            .unwrap();
        for (partition, slot) in owner.iter_mut().enumerate() {
            if bytes[partition / 8] & (0x80 >> (partition % 8)) != 0 {
                *slot = index;
            }
        }
    }
    owner
}

fn partition_of(digest: &[u8; 20]) -> usize {
    usize::from(u16::from_le_bytes([digest[0], digest[1]]) & 0x0fff)
}

/// A record of set "demo" or a monitor record, by digest.
struct Target {
    set: &'static [u8],
    digest: [u8; 20],
}

fn record(key: &str) -> Target {
    Target {
        set: b"demo",
        digest: of_key("demo", &UserKey::String(key.into())).0,
    }
}

fn monitor(txn_id: u64) -> Target {
    let key = (txn_id as i64).to_be_bytes();
    Target {
        set: MONITOR_SET,
        digest: compute(MONITOR_SET, 1, &key).0,
    }
}

/// One request; (result code, reply fields and bins). Retried while the
/// cluster answers 9 or 11 (a view settling), for up to 10 s.
fn send(
    stream: &mut TcpStream,
    target: &Target,
    header: MsgHeader,
    fields: &[(u8, Vec<u8>)],
    ops: &[(u8, u8, &str, Vec<u8>)],
) -> (u8, Vec<u8>, Vec<ReplyBin>) {
    let mut frame = Vec::new();
    let mut writer = MessageWriter::begin(&mut frame, &header);
    writer
        .field(field_type::NAMESPACE, b"sc")
        .field(field_type::SET, target.set)
        .field(field_type::DIGEST, &target.digest);
    for (kind, data) in fields {
        writer.field(*kind, data);
    }
    for (op, particle, name, value) in ops {
        writer.op(*op, *particle, name.as_bytes(), value);
    }
    writer.finish();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, body) = round_trip(stream, &frame).unwrap();
        let message = citrine_wire::msg::Message::decode(&body).unwrap();
        let code = message.header.result_code;
        if matches!(code, 9 | 11) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        let deadline_field = message
            .field(field_type::TXN_DEADLINE)
            .map(<[u8]>::to_vec)
            .unwrap_or_default();
        let bins = message
            .ops()
            .map(|op| (op.name.to_vec(), op.particle_type, op.value.to_vec()))
            .collect();
        return (code, deadline_field, bins);
    }
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

/// Bin `v` of `key`, read outside (`txn` None) or inside a transaction.
fn value(stream: &mut TcpStream, key: &str, txn: Option<u64>) -> (u8, Option<Vec<u8>>) {
    let fields: Vec<(u8, Vec<u8>)> = txn
        .map(|id| (field_type::TXN_ID, id.to_le_bytes().to_vec()))
        .into_iter()
        .collect();
    let read = header(info1::READ | info1::GET_ALL, 0, 0);
    let (code, _, bins) = send(stream, &record(key), read, &fields, &[]);
    let found = bins.into_iter().find(|(name, _, _)| name == b"v");
    (code, found.map(|(_, _, value)| value))
}

/// The `keyds` bin: a list of the digests as blobs.
fn keyds(digests: &[[u8; 20]]) -> Vec<u8> {
    let mut list = vec![0x90 | digests.len() as u8];
    for digest in digests {
        // A msgpack string of 21 bytes: the blob particle type, then the
        // digest (how the server stores a client's bytes value in a list).
        list.extend_from_slice(&[0xa0 | 21, 4]);
        list.extend_from_slice(digest);
    }
    list
}

/// Per transaction: keys `a` (mastered by node 0) and `b` (by node 1),
/// and a transaction id whose monitor node 0 masters.
fn choose(masters: &[usize], count: usize) -> Vec<(String, String, u64)> {
    let master_of = |target: &Target| masters[partition_of(&target.digest)];
    let keys = |owner: usize| {
        (0..)
            .map(|n| format!("k{n}"))
            .filter(move |key| master_of(&record(key)) == owner)
    };
    let ids = (1u64..).filter(|id| master_of(&monitor(*id)) == 0);
    keys(0)
        .zip(keys(1))
        .zip(ids)
        .map(|((a, b), id)| (a, b, id))
        .take(count)
        .collect()
}

/// How a transaction ends after node 0 was killed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum End {
    /// The client commits.
    Commit,
    /// The client aborts.
    Abort,
    /// The client marked the commit before the kill and is gone: the
    /// cluster rolls forward at the deadline.
    Recover,
}

/// One transaction of the scenario.
struct Txn {
    end: End,
    a: String,
    b: String,
    id: u64,
}

impl Txn {
    fn id_field(&self) -> (u8, Vec<u8>) {
        (field_type::TXN_ID, self.id.to_le_bytes().to_vec())
    }

    /// Writes 1 to `a` and `b`, then in the transaction 2 (the monitor
    /// first, its deadline 8 s away for [`End::Recover`], else 30 s); a
    /// transaction to recover is marked to roll forward.
    fn begin(&self, stream: &mut TcpStream) {
        let write = header(0, info2::WRITE, 0);
        for key in [&self.a, &self.b] {
            let put = [(op_type::WRITE, 1, "v", int(1))];
            assert_eq!(send(stream, &record(key), write, &[], &put).0, 0);
        }
        let mut create = header(0, info2::WRITE | info2::RESPOND_ALL_OPS, 0);
        create.record_ttl = if self.end == End::Recover { 8 } else { 30 };
        let listed = keyds(&[record(&self.a).digest, record(&self.b).digest]);
        let ops = [
            (op_type::WRITE, 1, "id", int(self.id as i64)),
            (op_type::WRITE, 20, "keyds", listed),
        ];
        let (code, deadline, _) = send(stream, &monitor(self.id), create, &[], &ops);
        assert_eq!(code, 0, "monitor created");
        let fields = [self.id_field(), (field_type::TXN_DEADLINE, deadline)];
        for key in [&self.a, &self.b] {
            let put = [(op_type::WRITE, 1, "v", int(2))];
            let code = send(stream, &record(key), write, &fields, &put).0;
            assert_eq!(code, 0, "provisional write of {key}");
        }
        assert_eq!(value(stream, &self.a, None), (0, Some(int(1))));
        if self.end == End::Recover {
            assert_eq!(self.mark(stream), 0, "marked before the kill");
        }
    }

    fn mark(&self, stream: &mut TcpStream) -> u8 {
        let mark = [(op_type::WRITE, 17, "fwd", vec![1])];
        let write = header(0, info2::WRITE, 0);
        send(stream, &monitor(self.id), write, &[], &mark).0
    }

    /// After the kill: the new master of `a` holds the transaction's
    /// version and its lock; the client commits or aborts.
    fn end(&self, stream: &mut TcpStream) {
        let a = &self.a;
        assert_eq!(value(stream, a, Some(self.id)), (0, Some(int(2))));
        let other = [(op_type::WRITE, 1, "v", int(9))];
        let write = header(0, info2::WRITE, 0);
        let blocked = send(stream, &record(a), write, &[], &other).0;
        assert_eq!(blocked, 120, "a plain write finds `{a}` locked");
        let bit = match self.end {
            End::Commit => {
                assert_eq!(
                    self.mark(stream),
                    0,
                    "the monitor is open on its new master"
                );
                info4::ROLL_FORWARD
            }
            _ => info4::ROLL_BACK,
        };
        let roll = header(0, info2::WRITE | info2::DURABLE_DELETE, bit);
        for key in [&self.a, &self.b] {
            let id = [self.id_field()];
            assert_eq!(
                send(stream, &record(key), roll, &id, &[]).0,
                0,
                "roll of {key}"
            );
        }
        let close = header(0, info2::WRITE | info2::DELETE | info2::DURABLE_DELETE, 0);
        assert_eq!(send(stream, &monitor(self.id), close, &[], &[]).0, 0);
    }
}

/// Waits (up to 5 s) until the two survivors each hold a copy of every
/// provisional version and monitor of `txns`: also those whose other
/// copy was on the killed node (the fill carries the transaction state
/// with the records; the master also re-sends it after the view change).
fn wait_for_copies(survivors: &[&Node], txns: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let sum = |name: &str| {
        survivors
            .iter()
            .map(|node| stat_of(node, name).unwrap_or(0))
            .sum::<u64>()
    };
    let expected = (2 * 2 * txns as u64, 2 * txns as u64);
    loop {
        let seen = (sum("mrt_provisionals"), sum("mrt_monitors_active"));
        if seen == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "copies {seen:?}, expected {expected:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits (up to 20 s) until the survivors hold no transaction state.
fn wait_for_no_transaction(survivors: &[&Node]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let open = |node: &&Node| {
        stat_of(node, "mrt_provisionals") != Some(0)
            || stat_of(node, "mrt_monitors_active") != Some(0)
    };
    while survivors.iter().any(open) {
        assert!(Instant::now() < deadline, "a transaction was never rolled");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn transactions_end_as_asked_after_the_master_of_their_records_is_killed() {
    let mut nodes = sc_cluster();
    let ends = [End::Commit, End::Abort, End::Recover];
    let chosen = choose(&masters(&nodes), ends.len());
    let txns: Vec<Txn> = ends
        .into_iter()
        .zip(chosen)
        .map(|(end, (a, b, id))| Txn { end, a, b, id })
        .collect();
    let mut stream = nodes[2].connect();
    for txn in &txns {
        txn.begin(&mut stream);
    }
    nodes[0].kill();
    let survivors: Vec<&Node> = nodes[1..].iter().collect();
    wait_for_cluster(&survivors, 2, Duration::from_secs(20));
    for node in &survivors {
        wait_for_available(node);
    }
    wait_for_copies(&survivors, txns.len());
    for txn in txns.iter().filter(|txn| txn.end != End::Recover) {
        txn.end(&mut stream);
    }
    wait_for_no_transaction(&survivors);
    for txn in &txns {
        let expected = if txn.end == End::Abort { 1 } else { 2 };
        for key in [&txn.a, &txn.b] {
            let read = value(&mut stream, key, None);
            assert_eq!(read, (0, Some(int(expected))), "{key} after {:?}", txn.end);
        }
    }
}
