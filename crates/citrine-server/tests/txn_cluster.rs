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
//! killed node were sent to the node filled in its place). Beside them a
//! fourth transaction runs as batch rows ([`BatchTxn`]) across all three
//! masters and commits after the kill.

#![allow(clippy::unwrap_used)]

mod common;

use citrine_wire::digest::{compute, of_key, UserKey};
use citrine_wire::msg::{field_type, info1, info2, op_type, MessageWriter, MsgHeader};
use citrine_wire::txn::info4;
use common::cluster::{set_roster_to_observed, wait_for_cluster, Node};
use common::*;
use std::io::Write as _;
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
    set_roster_to_observed(&nodes, "sc");
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
    let mut batched = BatchTxn::choose(&masters(&nodes));
    batched.begin(&mut stream);
    nodes[0].kill();
    let survivors: Vec<&Node> = nodes[1..].iter().collect();
    wait_for_cluster(&survivors, 2, Duration::from_secs(20));
    for node in &survivors {
        wait_for_available(node);
    }
    batched.check_locked(&mut stream, "after the kill");
    batched.commit(&mut stream);
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

/// One batch row of set `demo` with the transaction fields (`BATCH_MSG_INFO
/// | BATCH_MSG_INFO4`, as the official clients send rows in a
/// transaction): `info` is info1..info4; `value` a write of bin `v`.
struct Row<'a> {
    key: &'a str,
    info: [u8; 4],
    fields: Vec<(u8, Vec<u8>)>,
    value: Option<i64>,
}

fn encode_row(out: &mut Vec<u8>, index: u32, row: &Row<'_>) {
    out.extend_from_slice(&index.to_be_bytes());
    out.extend_from_slice(&record(row.key).digest);
    out.push(0x02 | 0x10);
    out.extend_from_slice(&row.info);
    let namespace = [(field_type::NAMESPACE, b"sc".to_vec())];
    let set = [(field_type::SET, b"demo".to_vec())];
    let fields: Vec<&(u8, Vec<u8>)> = namespace.iter().chain(&set).chain(&row.fields).collect();
    out.extend_from_slice(&(fields.len() as u16).to_be_bytes());
    out.extend_from_slice(&u16::from(row.value.is_some()).to_be_bytes());
    for (kind, data) in fields {
        out.extend_from_slice(&(data.len() as u32 + 1).to_be_bytes());
        out.push(*kind);
        out.extend_from_slice(data);
    }
    if let Some(value) = row.value {
        out.extend_from_slice(&(4 + 1 + 8u32).to_be_bytes());
        out.extend_from_slice(&[op_type::WRITE, 1, 0, 1, b'v']);
        out.extend_from_slice(&value.to_be_bytes());
    }
}

/// Per row of a batch reply: result code, bin `v`, record version field.
type RowAnswer = (u8, Option<Vec<u8>>, Option<Vec<u8>>);

/// Sends `rows` as one batch; the rows' answers in row order. Sent again
/// while a row answers 9 or 11 (a view settling), for up to 10 s.
fn batch(stream: &mut TcpStream, rows: &[Row<'_>]) -> Vec<RowAnswer> {
    let mut payload = (rows.len() as u32).to_be_bytes().to_vec();
    payload.push(0);
    for (index, row) in rows.iter().enumerate() {
        encode_row(&mut payload, index as u32, row);
    }
    let header = MsgHeader {
        info1: info1::BATCH,
        transaction_ttl: 5_000,
        ..MsgHeader::default()
    };
    let mut frame = Vec::new();
    let mut writer = MessageWriter::begin(&mut frame, &header);
    writer.field(field_type::BATCH_INDEX, &payload);
    writer.finish();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        stream.write_all(&frame).unwrap();
        let (mut messages, _) = common::stream::read_stream(stream);
        let last = messages.pop().unwrap();
        assert_eq!(last.header.result_code, 0, "LAST of the batch");
        let mut answers = vec![(255, None, None); rows.len()];
        for message in messages {
            let value = message
                .bins
                .iter()
                .find(|(name, _)| name == b"v")
                .map(|(_, value)| value.clone());
            let version = message
                .field(field_type::RECORD_VERSION)
                .map(<[u8]>::to_vec);
            let at = message.header.transaction_ttl as usize;
            answers[at] = (message.header.result_code, value, version);
        }
        let settling = answers.iter().any(|(code, _, _)| matches!(code, 9 | 11));
        if !settling || Instant::now() >= deadline {
            return answers;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn codes(answers: &[RowAnswer]) -> Vec<u8> {
    answers.iter().map(|(code, _, _)| *code).collect()
}

fn values(answers: &[RowAnswer]) -> Vec<Option<Vec<u8>>> {
    answers.iter().map(|(_, value, _)| value.clone()).collect()
}

/// Rows of `keys`: reads (`value` None) or writes of `value`.
fn rows<'a>(
    keys: &'a [String],
    fields: &[(u8, Vec<u8>)],
    value: Option<i64>,
    info4: u8,
) -> Vec<Row<'a>> {
    let info = match value {
        None => [info1::READ | info1::GET_ALL, 0, 0, info4],
        Some(_) => [0, info2::WRITE, 0, info4],
    };
    keys.iter()
        .map(|key| Row {
            key,
            info,
            fields: fields.to_vec(),
            value,
        })
        .collect()
}

/// A transaction whose reads and writes are batch rows across the three
/// masters (two records of each rewritten, one of node 0's created, one
/// deleted, one only read), its monitor on node 0, which is killed before
/// the commit: the batch writes lock their records (a plain batch write
/// gets 120 per row, a batch read outside sees the committed values, one
/// inside its own), also on the masters that take over node 0's
/// partitions; the batch verify of the record read passes and a batch
/// roll forward commits every row.
struct BatchTxn {
    id: u64,
    written: Vec<String>,
    created: String,
    deleted: String,
    read_only: String,
    /// The version the read in the transaction answered.
    version: Vec<u8>,
}

impl BatchTxn {
    /// Keys of prefix `b`, and a transaction id (from 1 000) whose monitor
    /// node 0 masters.
    fn choose(owners: &[usize]) -> BatchTxn {
        let master_of = |key: &str| owners[partition_of(&record(key).digest)];
        let pick = |owner: usize, count: usize, prefix: &str| -> Vec<String> {
            (0..)
                .map(|n| format!("{prefix}{n}"))
                .filter(|key| master_of(key) == owner)
                .take(count)
                .collect()
        };
        let id = (1_000u64..)
            .find(|id| owners[partition_of(&monitor(*id).digest)] == 0)
            .unwrap();
        BatchTxn {
            id,
            written: (0..3).flat_map(|owner| pick(owner, 2, "bw")).collect(),
            created: pick(0, 1, "bc").remove(0),
            deleted: pick(0, 1, "bd").remove(0),
            read_only: pick(0, 1, "br").remove(0),
            version: Vec::new(),
        }
    }

    fn id_field(&self) -> (u8, Vec<u8>) {
        (field_type::TXN_ID, self.id.to_le_bytes().to_vec())
    }

    /// Every key the transaction writes (the deleted one last).
    fn writes(&self) -> Vec<String> {
        let mut keys = self.written.clone();
        keys.push(self.created.clone());
        keys.push(self.deleted.clone());
        keys
    }

    /// Committed values 1, the monitor, a read and the writes.
    fn begin(&mut self, stream: &mut TcpStream) {
        let mut before = self.written.clone();
        before.extend([self.deleted.clone(), self.read_only.clone()]);
        let plain = batch(stream, &rows(&before, &[], Some(1), 0));
        assert_eq!(codes(&plain), vec![0; before.len()]);
        let digests: Vec<[u8; 20]> = self.writes().iter().map(|key| record(key).digest).collect();
        let mut create = header(0, info2::WRITE | info2::RESPOND_ALL_OPS, 0);
        create.record_ttl = 30;
        let ops = [
            (op_type::WRITE, 1, "id", int(self.id as i64)),
            (op_type::WRITE, 20, "keyds", keyds(&digests)),
        ];
        let (code, deadline, _) = send(stream, &monitor(self.id), create, &[], &ops);
        assert_eq!(code, 0, "monitor created");
        let id_only = [self.id_field()];
        let read_only = [self.read_only.clone()];
        let read = batch(stream, &rows(&read_only, &id_only, None, 0));
        assert_eq!(codes(&read), vec![0]);
        self.version = read[0]
            .2
            .clone()
            .expect("a read in a transaction answers its version");
        let fields = [self.id_field(), (field_type::TXN_DEADLINE, deadline)];
        let mut put = self.written.clone();
        put.push(self.created.clone());
        let mut wrote = rows(&put, &fields, Some(2), 0);
        wrote.push(Row {
            key: &self.deleted,
            info: [
                0,
                info2::WRITE | info2::DELETE | info2::DURABLE_DELETE,
                0,
                0,
            ],
            fields: fields.to_vec(),
            value: None,
        });
        let answers = batch(stream, &wrote);
        assert_eq!(
            codes(&answers),
            vec![0; wrote.len()],
            "provisional batch writes"
        );
        self.check_locked(stream, "before the kill");
    }

    /// Outside the transaction the committed values (none for the record
    /// it creates) and 120 for writes; inside, its own versions.
    fn check_locked(&self, stream: &mut TcpStream, when: &str) {
        let keys = self.writes();
        let outside = batch(stream, &rows(&keys, &[], None, 0));
        let mut committed = vec![Some(int(1)); self.written.len()];
        committed.extend([None, Some(int(1))]);
        assert_eq!(values(&outside), committed, "{when}");
        let inside = batch(stream, &rows(&keys, &[self.id_field()], None, 0));
        let mut own = vec![Some(int(2)); self.written.len() + 1];
        own.push(None);
        assert_eq!(values(&inside), own, "{when}");
        assert_eq!(inside.last().unwrap().0, 2, "its own delete, {when}");
        let blocked = batch(stream, &rows(&keys, &[], Some(9), 0));
        assert_eq!(codes(&blocked), vec![120; keys.len()], "{when}");
    }

    /// Verify, mark, batch roll forward, close; then every write shows.
    fn commit(&self, stream: &mut TcpStream) {
        let verify = Row {
            key: &self.read_only,
            info: [
                info1::READ | info1::GET_NO_BINS,
                0,
                citrine_wire::msg::info3::SC_READ_TYPE,
                info4::VERIFY_READ,
            ],
            fields: vec![(field_type::RECORD_VERSION, self.version.clone())],
            value: None,
        };
        assert_eq!(codes(&batch(stream, &[verify])), vec![0], "verified");
        let mark = [(op_type::WRITE, 17, "fwd", vec![1])];
        let write = header(0, info2::WRITE, 0);
        assert_eq!(send(stream, &monitor(self.id), write, &[], &mark).0, 0);
        let keys = self.writes();
        let mut roll = rows(&keys, &[self.id_field()], None, info4::ROLL_FORWARD);
        for row in &mut roll {
            row.info = [
                0,
                info2::WRITE | info2::DURABLE_DELETE,
                0,
                info4::ROLL_FORWARD,
            ];
        }
        assert_eq!(codes(&batch(stream, &roll)), vec![0; keys.len()], "rolled");
        let close = header(0, info2::WRITE | info2::DELETE | info2::DURABLE_DELETE, 0);
        assert_eq!(send(stream, &monitor(self.id), close, &[], &[]).0, 0);
        let after = batch(stream, &rows(&keys, &[], None, 0));
        let mut committed = vec![Some(int(2)); self.written.len() + 1];
        committed.push(None);
        assert_eq!(values(&after), committed, "committed");
        assert_eq!(after.last().unwrap().0, 2, "deleted");
    }
}
