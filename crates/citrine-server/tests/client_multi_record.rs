//! Citrine's client (`citrine-client`) running batch commands, scans,
//! secondary-index queries and background jobs on a real three-node
//! cluster (`examples/cluster.toml`, two copies of every record): a batch
//! splits its keys by node, a scan or query sends each node its master
//! partitions, and a node SIGKILLed in the middle of a scan or a query
//! costs the caller nothing: the partitions it left unfinished are resumed
//! on their new masters after the last record delivered, so every record
//! arrives exactly once.

#![allow(clippy::unwrap_used)]

mod common;

use citrine_client::{
    BatchPolicy, Bin, Bins, Client, ClientConfig, IndexCollection, IndexFilter, IndexType, Key,
    KeyRecord, Operation, Policy, RecordStream, ScanPolicy, Statement, Value, WritePolicy,
};
use common::cluster::{start_cluster, wait_for_stable, Node};
use std::collections::BTreeMap;
use std::time::Duration;

const RECORDS: i64 = 6000;

fn key(index: i64) -> Key {
    Key::new("test", "m", index)
}

/// Retries generous enough to ride out a node's death and the new view's
/// migrations (about 2 s with the test cluster's 1.5 s heartbeat timeout).
fn patient(base: Policy) -> Policy {
    Policy {
        max_retries: 200,
        backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(250),
        ..base
    }
}

async fn connect(nodes: &[Node]) -> Client {
    let client = Client::connect(ClientConfig::new(nodes.iter().map(Node::service_address)))
        .await
        .unwrap();
    assert_eq!(client.nodes().len(), nodes.len());
    client
}

fn int_bin(record: &KeyRecord, name: &str) -> i64 {
    match record.record.bin(name) {
        Some(Value::Int(value)) => *value,
        other => panic!("bin {name}: {other:?}"),
    }
}

/// Reads the whole stream, killing `victim` once `kill_after` records
/// have arrived; returns how many times each record (by bin `n`) came.
async fn drain_killing(
    mut stream: RecordStream,
    kill_after: usize,
    victim: &mut Node,
) -> BTreeMap<i64, usize> {
    let mut seen = BTreeMap::new();
    let mut received = 0;
    while let Some(record) = stream.next().await {
        let record = record.unwrap_or_else(|error| panic!("after {received} records: {error}"));
        *seen.entry(int_bin(&record, "n")).or_insert(0) += 1;
        received += 1;
        if received == kill_after {
            println!("killing node {} after {received} records", victim.id);
            victim.kill();
        }
    }
    assert!(received > kill_after, "the node was killed mid-stream");
    seen
}

fn assert_each_once(seen: &BTreeMap<i64, usize>, expected: impl Iterator<Item = i64>, what: &str) {
    let expected: Vec<i64> = expected.collect();
    let repeated: Vec<(&i64, &usize)> = seen.iter().filter(|(_, count)| **count > 1).collect();
    assert!(
        repeated.is_empty(),
        "{what}: records delivered twice: {repeated:?}"
    );
    let missing: Vec<i64> = expected
        .iter()
        .copied()
        .filter(|n| !seen.contains_key(n))
        .collect();
    assert!(
        missing.is_empty(),
        "{what}: {} records missing: {:?}",
        missing.len(),
        &missing[..missing.len().min(20)]
    );
    assert_eq!(seen.len(), expected.len(), "{what}: unexpected records");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_scan_query_and_jobs_across_the_cluster_survive_node_deaths() {
    let mut nodes = start_cluster(100);
    wait_for_stable(&nodes.iter().collect::<Vec<_>>(), Duration::from_secs(30));
    let client = connect(&nodes).await;

    let mut write = WritePolicy::default();
    write.base = patient(write.base);
    for index in 0..RECORDS {
        client
            .put(
                &write,
                &key(index),
                &[Bin::new("n", index), Bin::new("k", index % 7)],
            )
            .await
            .unwrap();
    }

    // A batch over every key: one request per node, every record found.
    let keys: Vec<Key> = (0..RECORDS).map(key).collect();
    let masters: std::collections::BTreeSet<_> = keys
        .iter()
        .filter_map(|key| client.master_of(key))
        .collect();
    assert_eq!(masters.len(), 3, "the keys span all three nodes");
    let batch = BatchPolicy {
        base: patient(Policy::default()),
        ..BatchPolicy::default()
    };
    let records = client.batch_get(&batch, &keys, Bins::All).await.unwrap();
    for (index, record) in records.iter().enumerate() {
        let record = record
            .as_ref()
            .unwrap_or_else(|| panic!("key {index} missing"));
        assert_eq!(record.bin("n"), Some(&Value::Int(index as i64)));
    }

    // An index, and a background job through it: +100 on every `k == 3`.
    client
        .create_index(
            "test",
            "m",
            "m_n",
            "n",
            IndexType::Numeric,
            IndexCollection::Default,
            None,
        )
        .await
        .unwrap();
    client
        .create_index(
            "test",
            "m",
            "m_k",
            "k",
            IndexType::Numeric,
            IndexCollection::Default,
            None,
        )
        .await
        .unwrap();
    for name in ["m_n", "m_k"] {
        client
            .wait_for_index("test", name, Duration::from_secs(30))
            .await
            .unwrap();
    }
    let task = client
        .execute_background(
            &WritePolicy::default(),
            &Statement::new("test", "m").filter(IndexFilter::equal("k", 3i64)),
            &[Operation::incr("bumped", 1)],
        )
        .await
        .unwrap();
    client
        .wait_for_job(task, Duration::from_secs(30))
        .await
        .unwrap();
    let bumped = client
        .batch_get(&batch, &keys, Bins::Names(vec!["bumped".into()]))
        .await
        .unwrap();
    for (index, record) in bumped.iter().enumerate() {
        let expected = (index % 7 == 3).then_some(Value::Int(1));
        assert_eq!(
            record
                .as_ref()
                .and_then(|record| record.bin("bumped"))
                .cloned(),
            expected,
            "key {index}: each selected record is written exactly once"
        );
    }

    // Paced scans and queries (each node sends 1500 records a second), so
    // the kills below land mid-stream.
    let paced = ScanPolicy {
        base: patient(ScanPolicy::default().base),
        records_per_second: 1500,
        queue_size: 16,
        ..ScanPolicy::default()
    };
    let whole = client
        .scan(&ScanPolicy::default(), &Statement::new("test", "m"))
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(whole.len(), RECORDS as usize);

    // A scan while node 2 dies.
    let stream = client.scan(&paced, &Statement::new("test", "m")).unwrap();
    let seen = drain_killing(stream, 1500, &mut nodes[2]).await;
    assert_each_once(&seen, 0..RECORDS, "scan");
    let stats = client.stats();
    println!("after the scan: {stats:?}");
    assert!(
        stats.retries > 0,
        "the scan retried the dead node's partitions"
    );
    // A batch right away, before the survivors' migrations have settled:
    // every record is read from the node that now serves it.
    let records = client.batch_get(&batch, &keys, Bins::All).await.unwrap();
    let missing = records.iter().filter(|record| record.is_none()).count();
    assert_eq!(missing, 0, "every record read after a node's death");

    // A query while node 1 dies (node 0 then holds every partition).
    wait_for_stable(&[&nodes[0], &nodes[1]], Duration::from_secs(60));
    let stream = client
        .query(
            &paced,
            &Statement::new("test", "m").filter(IndexFilter::range("n", 1000, 4999)),
        )
        .unwrap();
    let seen = drain_killing(stream, 1000, &mut nodes[1]).await;
    assert_each_once(&seen, 1000..5000, "query");

    // The last node serves everything, batches included.
    wait_for_stable(&[&nodes[0]], Duration::from_secs(60));
    let records = client.batch_get(&batch, &keys, Bins::All).await.unwrap();
    assert!(
        records.iter().all(Option::is_some),
        "every record on the last node"
    );
    client.close();
}
