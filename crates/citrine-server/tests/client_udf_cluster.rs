//! Citrine's client (`citrine-client`) using Lua UDFs on a real three-node
//! cluster (`examples/cluster.toml`): a module registered through one node
//! is listed by every node with the source's hash before `register_udf`
//! returns; record calls go to each key's master; a batch UDF splits its
//! keys by node; a background UDF job runs on every node; an aggregation
//! returns one partial result per node, which add up to the whole.

#![allow(clippy::unwrap_used)]

mod common;

use citrine_client::{
    udf_hash, BackgroundTask, BatchPolicy, Bin, Bins, Client, ClientConfig, Key, Operation, Policy,
    ScanPolicy, Statement, Value, WritePolicy,
};
use citrine_wire::msg::{field_type, info1, info3, Message, MessageWriter, MsgHeader};
use common::cluster::{start_cluster, wait_for_cluster, wait_for_stable, Node};
use common::{read_frame, statistic};
use std::collections::BTreeSet;
use std::io::Write as _;
use std::time::Duration;

const RECORDS: i64 = 300;

const MODULE: &str = r#"
function add(rec, bin, by)
  rec[bin] = (rec[bin] or 0) + by
  aerospike:update(rec)
  return rec[bin]
end

function mark(rec, value)
  rec['mark'] = value
  aerospike:update(rec)
end

local function plus(a, b) return a + b end

function count(stream)
  return stream : map(function(rec) return 1 end) : reduce(plus)
end
"#;

/// Counts the records of set `m` with an aggregation sent to every node
/// as the official clients send it (no partition list: each node covers
/// the partitions it claims); the first node's refusal code instead.
fn count_on_every_node(nodes: &[Node]) -> Result<i64, u8> {
    let mut frame = Vec::new();
    let header = MsgHeader {
        info1: info1::READ,
        transaction_ttl: 10_000,
        ..MsgHeader::default()
    };
    let mut writer = MessageWriter::begin(&mut frame, &header);
    writer
        .field(field_type::NAMESPACE, b"test")
        .field(field_type::SET, b"m")
        .field(field_type::TASK_ID, &0x5EED_u64.to_be_bytes())
        .field(field_type::UDF_OP, &[1])
        .field(field_type::UDF_FILENAME, b"cluster_m")
        .field(field_type::UDF_FUNCTION, b"count")
        .field(field_type::UDF_ARGLIST, &[0x90]);
    writer.finish();
    let mut counted = 0;
    for node in nodes {
        let mut stream = node.connect();
        stream.write_all(&frame).unwrap();
        'stream: loop {
            let (_, body) = read_frame(&mut stream).unwrap();
            let mut at = 0;
            while at < body.len() {
                let (message, used) = Message::decode_prefix(&body[at..]).unwrap();
                at += used;
                if message.header.info3 & info3::LAST != 0 {
                    match message.header.result_code {
                        0 => break 'stream,
                        code => return Err(code),
                    }
                }
                for op in message.ops() {
                    assert_eq!(op.name, b"SUCCESS");
                    counted += i64::from_be_bytes(op.value.try_into().unwrap());
                }
            }
        }
    }
    Ok(counted)
}

/// Writes that ride out a view change (retried every 50 ms, 20 times).
/// Starts `nodes[index]` (seeded by `seed`) and waits until every node and
/// the client see all of them.
async fn join(client: &Client, nodes: &mut [Node], index: usize, seed: &str) {
    nodes[index].start(seed);
    let size = nodes.len();
    wait_for_cluster(
        &nodes.iter().collect::<Vec<_>>(),
        size,
        Duration::from_secs(30),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while client.nodes().len() < size {
        assert!(
            std::time::Instant::now() < deadline,
            "the client sees {size} nodes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Scans `statement` to its end: how many records, after checking none
/// came twice.
async fn scan_each_once(client: &Client, scan: &ScanPolicy, statement: &Statement) -> i64 {
    let mut stream = client.scan(scan, statement).unwrap();
    let mut seen = BTreeSet::new();
    while let Some(record) = stream.next().await {
        let record = record.unwrap();
        assert!(seen.insert(record.key.digest), "a record delivered twice");
    }
    seen.len() as i64
}

fn patient_write() -> WritePolicy {
    WritePolicy {
        base: Policy {
            max_retries: 20,
            backoff: Duration::from_millis(50),
            ..Policy::default()
        },
        ..WritePolicy::default()
    }
}

fn key(index: i64) -> Key {
    Key::new("test", "u", index)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udfs_across_a_three_node_cluster() {
    let nodes = start_cluster(0x70);
    wait_for_stable(&nodes.iter().collect::<Vec<_>>(), Duration::from_secs(30));
    let client = Client::connect(ClientConfig::new(nodes.iter().map(Node::service_address)))
        .await
        .unwrap();
    assert_eq!(client.nodes().len(), 3);

    client
        .register_udf("cluster_m.lua", MODULE.as_bytes())
        .await
        .unwrap();
    // Every node lists it with the source's hash as soon as the call returns.
    let line = format!(
        "filename=cluster_m.lua,hash={},type=LUA;",
        udf_hash(MODULE.as_bytes())
    );
    for node in &nodes {
        let listed = node.info_value("udf-list").unwrap_or_default();
        assert!(listed.contains(&line), "node {}: {listed:?}", node.id);
    }

    let write = patient_write();
    for index in 0..RECORDS {
        client
            .put(&write, &key(index), &[Bin::new("n", index)])
            .await
            .unwrap();
    }
    let keys: Vec<Key> = (0..RECORDS).map(key).collect();
    let masters: BTreeSet<_> = keys
        .iter()
        .filter_map(|key| client.master_of(key))
        .collect();
    assert_eq!(masters.len(), 3, "the keys span all three nodes");

    // Record calls, each on its key's master.
    for index in 0..30 {
        let result = client
            .execute_udf(
                &write,
                &key(index),
                "cluster_m",
                "add",
                &[Value::from("n"), Value::Int(1000)],
            )
            .await
            .unwrap();
        assert_eq!(result, Value::Int(index + 1000));
    }

    // A batch over every key: one request per node.
    let batch = BatchPolicy {
        base: write.base.clone(),
        ..BatchPolicy::default()
    };
    let results = client
        .batch_udf(
            &batch,
            &keys,
            "cluster_m",
            "add",
            &[Value::from("n"), Value::Int(1)],
        )
        .await
        .unwrap();
    for (index, result) in results.iter().enumerate() {
        let index = index as i64;
        let expected = index + 1 + if index < 30 { 1000 } else { 0 };
        assert_eq!(
            result.as_ref().ok(),
            Some(&Value::Int(expected)),
            "key {index}"
        );
    }

    // One hop: every call and batch row reached its key's master directly.
    let proxied: u64 = nodes
        .iter()
        .map(|node| {
            let statistics = node.info_value("statistics").unwrap_or_default();
            statistics
                .split(';')
                .find_map(|pair| pair.strip_prefix("proxied_out="))
                .and_then(|count| count.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("node {}: no proxied_out in {statistics}", node.id))
        })
        .sum();
    assert_eq!(proxied, 0, "requests proxied between nodes");

    // A background job on every node.
    let task = client
        .execute_background(
            &write,
            &Statement::new("test", "u"),
            BackgroundTask::Udf {
                module: "cluster_m",
                function: "mark",
                args: &[Value::from("done")],
            },
        )
        .await
        .unwrap();
    client
        .wait_for_job(task, Duration::from_secs(30))
        .await
        .unwrap();
    let records = client.batch_get(&batch, &keys, Bins::All).await.unwrap();
    for (index, record) in records.iter().enumerate() {
        assert_eq!(
            record.as_ref().and_then(|record| record.bin("mark")),
            Some(&Value::from("done")),
            "key {index}"
        );
    }

    // An aggregation: a count per partition holding records, from every
    // node, adding up to every record once.
    let outputs = client
        .query_aggregate_raw(
            &ScanPolicy::default(),
            &Statement::new("test", "u"),
            "cluster_m",
            "count",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(outputs.len(), 3, "{outputs:?}");
    let mut total = 0;
    for output in &outputs {
        assert!(!output.values.is_empty(), "node {}", output.node);
        for value in &output.values {
            match value {
                Value::Int(count) if *count > 0 => total += count,
                other => panic!("node {}: {other:?}", output.node),
            }
        }
    }
    assert_eq!(total, RECORDS, "{outputs:?}");

    client.remove_udf("cluster_m.lua").await.unwrap();
    for node in &nodes {
        let listed = node.info_value("udf-list").unwrap_or_default();
        assert!(
            !listed.contains("cluster_m.lua"),
            "node {}: {listed:?}",
            node.id
        );
    }
    client.close();
}

/// While a joining node's partitions are still filling: an aggregation's
/// stream has no per-partition answers to say what it left out, so it
/// counts every record or fails with 11 (partition unavailable), never a
/// count that silently misses the filling partitions (before: 1 333 of
/// 2 000); once migrations are done it counts every record. A background job started
/// then walks the filling partitions once they are whole: every record
/// gets its write (before: 673 of 2 000 missed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_migrations_acting_masters_serve_and_jobs_miss_no_record() {
    const LOADED: i64 = 2000;
    let mut nodes: Vec<Node> = (0x78..0x7B).map(Node::new).collect();
    let seed = nodes[0].heartbeat_address();
    nodes[0].start(&seed);
    let seed = nodes[0].heartbeat_address();
    nodes[1].start(&seed);
    wait_for_cluster(&[&nodes[0], &nodes[1]], 2, Duration::from_secs(30));
    wait_for_stable(&[&nodes[0], &nodes[1]], Duration::from_secs(30));
    let client = Client::connect(ClientConfig::new([nodes[0].service_address()]))
        .await
        .unwrap();
    client
        .register_udf("cluster_m.lua", MODULE.as_bytes())
        .await
        .unwrap();
    let write = patient_write();
    let write_all = || async {
        for index in 0..LOADED {
            client
                .put(
                    &write,
                    &Key::new("test", "m", index),
                    &[Bin::new("n", index)],
                )
                .await
                .unwrap();
        }
    };
    write_all().await;
    let (scan, statement) = (ScanPolicy::default(), Statement::new("test", "m"));
    let count = || client.query_aggregate_raw(&scan, &statement, "cluster_m", "count", &[]);
    let total = |outputs: &[citrine_client::AggregateOutput]| -> i64 {
        outputs
            .iter()
            .flat_map(|output| &output.values)
            .map(|value| match value {
                Value::Int(count) => *count,
                other => panic!("{other:?}"),
            })
            .sum()
    };
    assert_eq!(total(&count().await.unwrap()), LOADED);

    // Migrations to the third node crawl (20 records a second from each
    // source): its partitions stay filling for about half a minute.
    for node in &nodes[..2] {
        assert_eq!(
            node.info_value("set-config:context=service;migrate-max-records-per-sec=20")
                .as_deref(),
            Some("ok")
        );
    }
    join(&client, &mut nodes, 2, &seed).await;
    // An aggregation has no per-partition answers to retry just the
    // partitions it missed. One that lists its partitions (as this client
    // sends it) follows the acting masters' claims, and fails (11) where
    // the client's map is a handover behind (frequent here: most
    // partitions hold one or two records) or a claim ends during the walk:
    // it counts all or fails, never a part.
    for _ in 0..5 {
        match count().await {
            Err(error) => assert_eq!(error.raw_code(), Some(11), "{error}"),
            Ok(outputs) => assert_eq!(total(&outputs), LOADED, "{outputs:?}"),
        }
    }
    // One sent to every node for all partitions (as the official clients
    // send it) keeps to the map's masters; the joining node runs the part
    // of the partitions it fills on the acting masters holding them, and
    // runs a part again, routed afresh, when a handover refused it (its
    // whole answer arrives before any of it is relayed). It counts all or
    // fails, never a part. Without the second run, 5 and 7 of 10 counted
    // all in two runs, the rest failed (11); with it, 10 of 10 in two.
    let counted: Vec<Result<i64, u8>> = (0..10).map(|_| count_on_every_node(&nodes)).collect();
    assert!(
        counted
            .iter()
            .all(|count| *count == Ok(LOADED) || *count == Err(11)),
        "{counted:?}"
    );
    assert!(
        counted.iter().filter(|count| **count == Ok(LOADED)).count() >= 9,
        "{counted:?}"
    );
    // Meanwhile the nodes holding the only copies of the partitions the
    // joining node fills claim them as acting masters: a scan (partition
    // by partition, retrying the ones refused) and a batch read see every
    // record, and the acting masters serve reads.
    let filling = |node: &Node| {
        let mut stream = node.connect();
        statistic(&mut stream, "migrate_rx_partitions_remaining")
    };
    assert_eq!(
        scan_each_once(&client, &scan, &statement).await,
        LOADED,
        "a scan during migrations"
    );
    let keys: Vec<Key> = (0..LOADED)
        .map(|index| Key::new("test", "m", index))
        .collect();
    let read = BatchPolicy::default();
    let records = client.batch_get(&read, &keys, Bins::All).await.unwrap();
    assert!(records.iter().all(Option::is_some), "a batch read");
    assert!(
        filling(&nodes[2]) > 0,
        "all of it ran while the joining node was still filling"
    );
    let acting_reads: u64 = nodes[..2]
        .iter()
        .map(|node| statistic(&mut node.connect(), "migrate_acting_reads"))
        .sum();
    assert!(acting_reads > 0, "acting masters served reads");
    // Every record is written again: the joining node now holds part of
    // each partition it still fills (the master executes the write, the
    // replicas receive it). A fourth node joins meanwhile. Where the third
    // masters a partition it holds only part of, the holders of the only
    // copy act for it again, so a scan still sees every record once.
    write_all().await;
    assert!(filling(&nodes[2]) > 0, "the third node still fills");
    nodes.push(Node::new(0x7B));
    join(&client, &mut nodes, 3, &seed).await;
    assert_eq!(
        scan_each_once(&client, &scan, &statement).await,
        LOADED,
        "a scan during the second join"
    );
    assert!(
        filling(&nodes[2]) > 0,
        "the scan ran while the third node was still filling"
    );
    // A background job started now: the joining node walks its filling
    // partitions once they are whole, so every record gets the write.
    let task = client
        .execute_background(
            &write,
            &statement,
            &[Operation::Write(Bin::new("flag", 7))][..],
        )
        .await
        .unwrap();

    for node in &nodes[..2] {
        node.info_value("set-config:context=service;migrate-max-records-per-sec=0");
    }
    wait_for_stable(&nodes.iter().collect::<Vec<_>>(), Duration::from_secs(60));
    // The client may still hold the map of a moment ago: retry a refusal.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let outputs = loop {
        match count().await {
            Ok(outputs) => break outputs,
            Err(error) if error.raw_code() == Some(11) => {
                assert!(std::time::Instant::now() < deadline, "{error}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("{error}"),
        }
    };
    assert_eq!(total(&outputs), LOADED, "{outputs:?}");
    assert_eq!(count_on_every_node(&nodes), Ok(LOADED));
    client
        .wait_for_job(task, Duration::from_secs(60))
        .await
        .unwrap();
    let batch = BatchPolicy {
        base: write.base.clone(),
        ..BatchPolicy::default()
    };
    let records = client.batch_get(&batch, &keys, Bins::All).await.unwrap();
    let missed: Vec<usize> = records
        .iter()
        .enumerate()
        .filter(|(_, record)| {
            record.as_ref().and_then(|record| record.bin("flag")) != Some(&Value::Int(7))
        })
        .map(|(index, _)| index)
        .collect();
    assert!(
        missed.is_empty(),
        "{} of {LOADED} records missed by the job: {:?}",
        missed.len(),
        &missed[..missed.len().min(10)]
    );
    client.close();
}
