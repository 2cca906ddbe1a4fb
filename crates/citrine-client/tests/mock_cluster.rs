//! Multi-node behaviour against in-process mock nodes that speak just the
//! protocol (info + AS_MSG): peer discovery from one seed, one-hop routing by
//! the partition map, rack-preferring reads, and cluster consultation before
//! dropping an unreachable node (001 §2.3.3.2).
//!
//! Each mock node answers every AS_MSG with a success carrying one bin,
//! `node` = its own id, so the test sees which node served each command.
//! Its UDF modules hash as the reference's do, not as Citrine's: not the
//! source's SHA-1.

use citrine_client::partition::encode_bitmap;
use citrine_client::{Bins, Client, ClientConfig, Key, ReadPolicy, Replica, Value};
use citrine_wire::frame::{MessageType, ProtoHeader, PROTO_HEADER_SIZE};
use citrine_wire::info::{request_lines, InfoResponse};
use citrine_wire::msg::{field_type, info3, Message, MessageWriter, MsgHeader};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

struct MockNode {
    id: String,
    port: u16,
    /// (node id, port) of the peers it lists.
    peers: Mutex<Vec<(String, u16)>>,
    peers_generation: AtomicU64,
    /// Partitions mastered: even (0) or odd (1); the other parity is held as replica.
    parity: AtomicUsize,
    partition_generation: AtomicU64,
    rack: u32,
    alive: AtomicBool,
    /// The next this-many AS_MSG answers carry `fail_code` instead of success.
    fail_next: AtomicU64,
    fail_code: AtomicU64,
    /// UDF modules it lists: (filename, hash).
    udfs: Mutex<Vec<(String, String)>>,
    /// The next this-many AS_MSG requests are read, then the connection is
    /// closed without an answer (the node may have acted on them).
    drop_next: AtomicU64,
    /// AS_MSG requests read.
    messages: AtomicU64,
}

/// The hash a mock node lists for every module: any hex but the source's
/// SHA-1, as the reference hashes its stored metadata instead.
const METADATA_HASH: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c";

impl MockNode {
    async fn start(id: &str, parity: usize, rack: u32) -> Arc<MockNode> {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let node = Arc::new(MockNode {
            id: id.to_owned(),
            port,
            peers: Mutex::new(Vec::new()),
            peers_generation: AtomicU64::new(1),
            parity: AtomicUsize::new(parity),
            partition_generation: AtomicU64::new(1),
            rack,
            alive: AtomicBool::new(true),
            fail_next: AtomicU64::new(0),
            fail_code: AtomicU64::new(0),
            udfs: Mutex::new(Vec::new()),
            drop_next: AtomicU64::new(0),
            messages: AtomicU64::new(0),
        });
        let serving = node.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let node = serving.clone();
                tokio::spawn(async move { node.serve(stream).await });
            }
        });
        node
    }

    fn set_peers(&self, peers: &[&Arc<MockNode>]) {
        *self.peers.lock().expect("lock") = peers
            .iter()
            .map(|peer| (peer.id.clone(), peer.port))
            .collect();
        self.peers_generation.fetch_add(1, Ordering::SeqCst);
    }

    fn bitmap(&self, parity: usize) -> String {
        let mut bytes = vec![0u8; 512];
        for p in (parity..4096).step_by(2) {
            bytes[p >> 3] |= 0x80 >> (p & 7);
        }
        encode_bitmap(&bytes)
    }

    /// Lists module `filename` (as a node does once the module reached it).
    fn hold_udf(&self, filename: &str) {
        let mut udfs = self.udfs.lock().expect("lock");
        udfs.retain(|(name, _)| name != filename);
        udfs.push((filename.to_owned(), METADATA_HASH.to_owned()));
    }

    fn info(&self, line: &str) -> String {
        if let Some(params) = line.strip_prefix("udf-put:") {
            let filename = params
                .split(';')
                .find_map(|param| param.strip_prefix("filename="))
                .unwrap_or_default();
            self.hold_udf(filename);
            return "ok".into();
        }
        match line {
            "udf-list" => self
                .udfs
                .lock()
                .expect("lock")
                .iter()
                .map(|(name, hash)| format!("filename={name},hash={hash},type=LUA;"))
                .collect(),
            "node" => self.id.clone(),
            "build" => "8.1.2.0".into(),
            "partition-generation" => self.partition_generation.load(Ordering::SeqCst).to_string(),
            "peers-generation" => self.peers_generation.load(Ordering::SeqCst).to_string(),
            "rebalance-generation" => "1".into(),
            "peers-clear-std" => {
                let peers = self.peers.lock().expect("lock");
                let list: Vec<String> = peers
                    .iter()
                    .map(|(id, port)| format!("[{id},,[127.0.0.1:{port}]]"))
                    .collect();
                format!(
                    "{},3000,[{}]",
                    self.peers_generation.load(Ordering::SeqCst),
                    list.join(",")
                )
            }
            "replicas" => {
                let parity = self.parity.load(Ordering::SeqCst);
                format!(
                    "test:0,2,{},{}",
                    self.bitmap(parity),
                    self.bitmap(1 - parity)
                )
            }
            "rack-ids" => format!("test:{}", self.rack),
            _ => "ERROR:4:unrecognized command".into(),
        }
    }

    async fn serve(&self, mut stream: tokio::net::TcpStream) {
        let mut header = [0u8; PROTO_HEADER_SIZE];
        loop {
            if !self.alive.load(Ordering::SeqCst) || stream.read_exact(&mut header).await.is_err() {
                return;
            }
            let Ok(proto) = ProtoHeader::decode(&header) else {
                return;
            };
            let mut body = vec![0u8; proto.size as usize];
            if stream.read_exact(&mut body).await.is_err() || !self.alive.load(Ordering::SeqCst) {
                return;
            }
            let mut out = Vec::new();
            if proto.message_type != MessageType::Info {
                self.messages.fetch_add(1, Ordering::SeqCst);
                if self.drop_next.load(Ordering::SeqCst) > 0 {
                    self.drop_next.fetch_sub(1, Ordering::SeqCst);
                    return;
                }
            }
            match proto.message_type {
                MessageType::Info => {
                    let mut response = InfoResponse::new();
                    for line in request_lines(&body) {
                        response.push(&line, &self.info(&line));
                    }
                    response.write_frame(&mut out);
                }
                _ if self.fail_next.load(Ordering::SeqCst) > 0 => {
                    self.fail_next.fetch_sub(1, Ordering::SeqCst);
                    let code = self.fail_code.load(Ordering::SeqCst) as u8;
                    // LAST too, so that a stream (an aggregation) ends here.
                    MessageWriter::begin(
                        &mut out,
                        &MsgHeader {
                            info3: info3::LAST,
                            result_code: code,
                            ..MsgHeader::default()
                        },
                    )
                    .finish();
                }
                _ if Message::decode(&body)
                    .is_ok_and(|message| message.field(field_type::UDF_OP).is_some()) =>
                {
                    // An aggregation: one value (this node's count, 1),
                    // then LAST.
                    let mut writer = MessageWriter::begin(&mut out, &MsgHeader::default());
                    writer.op(1, 1, b"SUCCESS", &1i64.to_be_bytes());
                    writer.finish();
                    let last = MsgHeader {
                        info3: info3::LAST,
                        ..MsgHeader::default()
                    };
                    MessageWriter::begin_bare(&mut out, &last).finish();
                    ProtoHeader::patch(&mut out, MessageType::Message);
                }
                _ => {
                    let mut writer = MessageWriter::begin(
                        &mut out,
                        &MsgHeader {
                            generation: 1,
                            ..MsgHeader::default()
                        },
                    );
                    writer.op(1, 3, b"node", self.id.as_bytes());
                    writer.finish();
                }
            }
            if stream.write_all(&out).await.is_err() {
                return;
            }
        }
    }
}

/// Two mock nodes that list each other: A1 (rack `a_rack`) masters the
/// even partitions, B2 (rack 1) the odd ones.
async fn pair(a_rack: u32) -> (Arc<MockNode>, Arc<MockNode>) {
    let a = MockNode::start("A1", 0, a_rack).await;
    let b = MockNode::start("B2", 1, 1).await;
    a.set_peers(&[&b]);
    b.set_peers(&[&a]);
    (a, b)
}

fn config(seed: &Arc<MockNode>) -> ClientConfig {
    let mut config = ClientConfig::new([format!("127.0.0.1:{}", seed.port)]);
    config.tend_interval = Duration::from_millis(100);
    config.tend_timeout = Duration::from_millis(300);
    config.max_node_failures = 2;
    config
}

async fn served_by(client: &Client, policy: &ReadPolicy, key: &Key) -> String {
    let record = client
        .get(policy, key, Bins::All)
        .await
        .expect("get")
        .expect("found");
    match record.bin("node") {
        Some(Value::String(id)) => id.clone(),
        other => panic!("unexpected answer {other:?}"),
    }
}

#[tokio::test]
async fn discovers_peers_from_one_seed_and_routes_in_one_hop() {
    let (a, _b) = pair(2).await;
    let client = Client::connect(config(&a)).await.expect("connect");
    let mut ids: Vec<String> = client.nodes().iter().map(|n| n.id.to_string()).collect();
    ids.sort();
    assert_eq!(
        ids,
        vec!["A1", "B2"],
        "B was discovered through A's peers list"
    );
    let policy = ReadPolicy::default();
    for i in 0..64i64 {
        let key = Key::new("test", "s", i);
        let expected = if key.partition().get().is_multiple_of(2) {
            "A1"
        } else {
            "B2"
        };
        assert_eq!(
            served_by(&client, &policy, &key).await,
            expected,
            "key {i} partition {}",
            key.partition().get()
        );
    }
    client.close();
}

#[tokio::test]
async fn prefer_rack_reads_go_to_the_local_rack() {
    let (a, _b) = pair(2).await;
    let mut config = config(&a);
    config.rack_id = Some(1);
    let client = Client::connect(config).await.expect("connect");
    let mut policy = ReadPolicy::default();
    policy.base.replica = Replica::PreferRack;
    for i in 0..32i64 {
        let key = Key::new("test", "s", i);
        assert_eq!(
            served_by(&client, &policy, &key).await,
            "B2",
            "rack 1 is B2's rack (master or replica of every partition)"
        );
    }
    client.close();
}

#[tokio::test]
async fn unreachable_node_is_kept_while_a_peer_lists_it() {
    let (a, b) = pair(1).await;
    let client = Client::connect(config(&a)).await.expect("connect");
    assert_eq!(client.nodes().len(), 2);

    // The client loses B, but A still lists B: keep it (cluster consultation).
    b.alive.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let nodes = client.nodes();
    assert_eq!(nodes.len(), 2, "B is kept while A lists it: {nodes:?}");
    let b_view = nodes
        .iter()
        .find(|n| n.id.to_string() == "B2")
        .expect("B present");
    assert!(b_view.failures >= 2 && !b_view.reachable, "{b_view:?}");

    // A stops listing B: now B goes.
    a.set_peers(&[]);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let ids: Vec<String> = client.nodes().iter().map(|n| n.id.to_string()).collect();
    assert_eq!(ids, vec!["A1"]);
    assert!(client.stats().nodes_removed >= 1);

    // B comes back and A lists it again: it is rediscovered.
    b.alive.store(true, Ordering::SeqCst);
    a.set_peers(&[&b]);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(client.nodes().len(), 2);
    client.close();
}

#[tokio::test]
async fn retryable_result_codes_are_retried_others_are_not() {
    let (a, _b) = pair(1).await;
    let client = Client::connect(config(&a)).await.expect("connect");
    let key = (0..)
        .map(|i: i64| Key::new("test", "s", i))
        .find(|k| k.partition().get().is_multiple_of(2))
        .expect("an even key");
    let mut policy = ReadPolicy::default();
    policy.base.max_retries = 3;

    for code in [11u64, 9, 14, 18] {
        a.fail_code.store(code, Ordering::SeqCst);
        a.fail_next.store(2, Ordering::SeqCst);
        let before = client.stats().retries;
        assert_eq!(
            served_by(&client, &policy, &key).await,
            "A1",
            "code {code} retried until success"
        );
        assert_eq!(
            client.stats().retries - before,
            2,
            "code {code}: two retries"
        );
    }
    // More failures than retries: the caller gets the server's code.
    a.fail_code.store(14, Ordering::SeqCst);
    a.fail_next.store(10, Ordering::SeqCst);
    let error = client
        .get(&policy, &key, Bins::All)
        .await
        .expect_err("exhausted");
    assert_eq!(error.raw_code(), Some(14), "{error}");
    a.fail_next.store(0, Ordering::SeqCst);
    // A non-retryable code is returned at once.
    a.fail_code.store(4, Ordering::SeqCst);
    a.fail_next.store(1, Ordering::SeqCst);
    let before = client.stats().retries;
    let error = client
        .get(&policy, &key, Bins::All)
        .await
        .expect_err("parameter error");
    assert_eq!(error.raw_code(), Some(4));
    assert_eq!(client.stats().retries, before, "no retry for code 4");
    // Sequence replica policy: the retry of a read goes to the replica (B).
    a.fail_code.store(11, Ordering::SeqCst);
    a.fail_next.store(1, Ordering::SeqCst);
    policy.base.replica = Replica::Sequence;
    assert_eq!(
        served_by(&client, &policy, &key).await,
        "B2",
        "retry moved to the replica"
    );
    client.close();
}

#[tokio::test]
async fn partition_map_follows_partition_generation_changes() {
    let (a, b) = pair(1).await;
    let client = Client::connect(config(&a)).await.expect("connect");
    let policy = ReadPolicy::default();
    let even = (0..)
        .map(|i: i64| Key::new("test", "s", i))
        .find(|k| k.partition().get().is_multiple_of(2))
        .expect("even key");
    assert_eq!(served_by(&client, &policy, &even).await, "A1");
    let refreshes = client.stats().partition_refreshes;
    // Ownership swaps (a rebalance): both nodes bump their partition generation.
    a.parity.store(1, Ordering::SeqCst);
    b.parity.store(0, Ordering::SeqCst);
    a.partition_generation.fetch_add(1, Ordering::SeqCst);
    b.partition_generation.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        client.stats().partition_refreshes >= refreshes + 2,
        "{:?}",
        client.stats()
    );
    assert_eq!(
        served_by(&client, &policy, &even).await,
        "B2",
        "the map was re-read after the generation change"
    );
    // Without a generation change the map is not re-read.
    let refreshes = client.stats().partition_refreshes;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(client.stats().partition_refreshes, refreshes);
    client.close();
}

/// A server that hashes its modules otherwise than Citrine (the reference
/// hashes its metadata): `register_udf` waits for the hash the node that took
/// the put lists, on every node, and returns once the last one has it.
#[tokio::test]
async fn register_udf_waits_for_every_node_whatever_the_server_hashes() {
    let (a, b) = pair(1).await;
    let client = Arc::new(Client::connect(config(&a)).await.expect("connect"));
    assert_eq!(client.nodes().len(), 2);
    let registering = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .register_udf("sums.lua", b"function one() return 1 end")
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        !registering.is_finished(),
        "one node lists the module, the other does not yet"
    );
    // The module reaches the node that did not take the put.
    a.hold_udf("sums.lua");
    b.hold_udf("sums.lua");
    let outcome = tokio::time::timeout(Duration::from_secs(5), registering)
        .await
        .expect("register returns once every node lists the module")
        .expect("task");
    assert!(outcome.is_ok(), "{outcome:?}");
    client.close();
}

/// A batch whose stream breaks after it was sent: read rows are sent again,
/// UDF rows are not (a UDF need not be idempotent; running it twice could
/// count twice) and fail in doubt.
#[tokio::test]
async fn batch_udf_rows_are_never_sent_twice() {
    let a = MockNode::start("A1", 0, 1).await;
    let client = Client::connect(config(&a)).await.expect("connect");
    // Keys of partitions A masters.
    let keys: Vec<Key> = (0..)
        .map(|i: i64| Key::new("test", "s", i))
        .filter(|key| key.partition().get().is_multiple_of(2))
        .take(4)
        .collect();
    let policy = citrine_client::BatchPolicy::default();
    assert!(policy.base.max_retries > 0, "the default retries");

    a.drop_next.store(1, Ordering::SeqCst);
    let before = a.messages.load(Ordering::SeqCst);
    let _ = client.batch_get(&policy, &keys, Bins::All).await;
    assert_eq!(
        a.messages.load(Ordering::SeqCst) - before,
        2,
        "a read batch is sent again after the broken stream"
    );

    a.drop_next.store(1, Ordering::SeqCst);
    let before = a.messages.load(Ordering::SeqCst);
    let rows = client
        .batch_udf(&policy, &keys, "sums", "add", &[Value::Int(1)])
        .await
        .expect("batch");
    assert_eq!(
        a.messages.load(Ordering::SeqCst) - before,
        1,
        "the UDF rows went out once"
    );
    for row in &rows {
        let error = row.as_ref().expect_err("no answer came");
        assert!(error.in_doubt(), "{error:?}");
    }
    client.close();
}

/// A background job goes to every node; a node that refused it with a
/// retryable code is asked again on its own, and one whose answer was lost
/// after the request went out is not (the job may have started there).
#[tokio::test]
async fn background_jobs_retry_a_node_only_when_it_surely_did_not_start() {
    let (a, b) = pair(1).await;
    let client = Client::connect(config(&a)).await.expect("connect");
    assert_eq!(client.nodes().len(), 2);
    let ops = [citrine_client::Operation::Write(citrine_client::Bin::new(
        "flag", 1,
    ))];
    let statement = citrine_client::Statement::new("test", "s");
    let write = citrine_client::WritePolicy::default();
    let sent = |node: &MockNode| node.messages.load(Ordering::SeqCst);

    // A refuses once with 11 (partition unavailable): asked again.
    a.fail_code.store(11, Ordering::SeqCst);
    a.fail_next.store(1, Ordering::SeqCst);
    let (a0, b0) = (sent(&a), sent(&b));
    client
        .execute_background(&write, &statement, &ops[..])
        .await
        .expect("accepted on the second try");
    assert_eq!((sent(&a) - a0, sent(&b) - b0), (2, 1));

    // B's answer is lost after it read the request: not sent again.
    b.drop_next.store(1, Ordering::SeqCst);
    let (a0, b0) = (sent(&a), sent(&b));
    let error = client
        .execute_background(&write, &statement, &ops[..])
        .await
        .expect_err("B's outcome is unknown");
    assert!(error.in_doubt(), "{error:?}");
    assert_eq!((sent(&a) - a0, sent(&b) - b0), (1, 1));
    client.close();
}

/// A record UDF is sent again after a refusal that surely did not run it
/// (14, key busy), never after a failure that may have (a server's 9, a
/// lost answer): those come back in doubt.
#[tokio::test]
async fn a_record_udf_is_retried_only_when_it_surely_did_not_run() {
    let (a, _b) = pair(1).await;
    let client = Client::connect(config(&a)).await.expect("connect");
    let key = (0..)
        .map(|i: i64| Key::new("test", "s", i))
        .find(|key| key.partition().get().is_multiple_of(2))
        .expect("a key of A");
    let write = citrine_client::WritePolicy::default();
    let call = || client.execute_udf(&write, &key, "m", "f", &[]);
    let sent = || a.messages.load(Ordering::SeqCst);

    a.fail_code.store(14, Ordering::SeqCst);
    a.fail_next.store(1, Ordering::SeqCst);
    let before = sent();
    call().await.expect("runs on the second try");
    assert_eq!(sent() - before, 2);

    a.fail_code.store(9, Ordering::SeqCst);
    a.fail_next.store(1, Ordering::SeqCst);
    let before = sent();
    let error = call().await.expect_err("9: may have run");
    assert_eq!(error.raw_code(), Some(9));
    assert!(error.in_doubt(), "{error:?}");
    assert_eq!(sent() - before, 1);

    a.drop_next.store(1, Ordering::SeqCst);
    let before = sent();
    let error = call().await.expect_err("the answer was lost");
    assert!(error.in_doubt(), "{error:?}");
    assert_eq!(sent() - before, 1);
    client.close();
}

/// An aggregation refused by a node with a retryable code (11: a partition
/// it does not serve, as while a master fills) is run again whole on a
/// fresh map — no value of the failed attempt is returned — and one that
/// failed otherwise is not.
#[tokio::test]
async fn an_aggregation_refused_retryably_runs_again_whole() {
    let (a, b) = pair(1).await;
    let client = Client::connect(config(&a)).await.expect("connect");
    assert_eq!(client.nodes().len(), 2);
    let statement = citrine_client::Statement::new("test", "s");
    let policy = citrine_client::ScanPolicy::default();
    let run = || client.query_aggregate_raw(&policy, &statement, "m", "count", &[]);
    let sent = |node: &MockNode| node.messages.load(Ordering::SeqCst);
    let ones = |outputs: &[citrine_client::AggregateOutput]| -> Vec<Vec<Value>> {
        outputs.iter().map(|output| output.values.clone()).collect()
    };

    let (a0, b0) = (sent(&a), sent(&b));
    let outputs = run().await.expect("both nodes answer");
    assert_eq!(
        ones(&outputs),
        vec![vec![Value::Int(1)], vec![Value::Int(1)]]
    );
    assert_eq!((sent(&a) - a0, sent(&b) - b0), (1, 1));

    a.fail_code.store(11, Ordering::SeqCst);
    a.fail_next.store(1, Ordering::SeqCst);
    let (a0, b0) = (sent(&a), sent(&b));
    let outputs = run().await.expect("the second attempt succeeds");
    assert_eq!(
        ones(&outputs),
        vec![vec![Value::Int(1)], vec![Value::Int(1)]]
    );
    assert_eq!((sent(&a) - a0, sent(&b) - b0), (2, 2), "run again whole");

    a.fail_code.store(4, Ordering::SeqCst);
    a.fail_next.store(1, Ordering::SeqCst);
    let (a0, b0) = (sent(&a), sent(&b));
    let error = run().await.expect_err("4 is no reason to try again");
    assert_eq!(error.raw_code(), Some(4));
    assert_eq!((sent(&a) - a0, sent(&b) - b0), (1, 1));
    client.close();
}
