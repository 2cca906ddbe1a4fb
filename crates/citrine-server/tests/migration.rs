//! Migrations over real `citrined` processes (replication factor 2,
//! `examples/cluster.toml`): after a node joins, or restarts empty, and
//! `cluster-stable` answers the cluster key on every node, the two nodes of
//! each partition's replica list hold identical copies of it
//! (`partition-checksums`; other nodes' leftover copies are ignored) and
//! every acknowledged write reads back from every node.
//!
//! The node helpers are those of `tests/replication.rs`.

#![allow(clippy::unwrap_used)]

mod common;

use common::cluster::*;
use common::*;
use std::time::{Duration, Instant};

/// Every partition's two replica-list nodes hold identical copies (count
/// and checksum), and the list holders' copies add up to `records`.
fn assert_copies_match_the_map(group: &[&Node], records: u64) {
    assert_eq!(
        copies_matching_the_map(group),
        records,
        "records held by the replica lists"
    );
}

fn assert_all_readable(group: &[&Node], keys: &[String]) {
    for node in group {
        let mut stream = connect(node.port);
        for key in keys {
            assert_eq!(
                get(&mut stream, key),
                (0, Some(format!("value-{key}").into_bytes())),
                "{key} from node {}",
                node.id
            );
        }
    }
}

fn write_records(node: &Node, prefix: &str, count: usize) -> Vec<String> {
    let mut stream = connect(node.port);
    let started = Instant::now();
    let keys: Vec<String> = (0..count)
        .map(|index| format!("{prefix}-{index}"))
        .collect();
    for key in &keys {
        assert_eq!(
            put(&mut stream, key, &format!("value-{key}")),
            0,
            "put {key}"
        );
    }
    println!("{count} writes in {:?}", started.elapsed());
    keys
}

fn migrated(group: &[&Node]) -> (u64, u64) {
    let field = |node: &Node, name: &str| -> u64 {
        let text = node.info_value("statistics").unwrap();
        text.split(';')
            .find_map(|pair| pair.strip_prefix(name))
            .unwrap()
            .parse()
            .unwrap()
    };
    (
        group
            .iter()
            .map(|node| field(node, "migrate_records_sent="))
            .sum(),
        group
            .iter()
            .map(|node| field(node, "migrate_partitions_sent="))
            .sum(),
    )
}

const RECORDS_DEFAULT: usize = 3000;

/// Records written before the view changes (`$CITRINE_MIGRATION_RECORDS`
/// for timings on bigger data).
fn records() -> usize {
    std::env::var("CITRINE_MIGRATION_RECORDS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(RECORDS_DEFAULT)
}

#[test]
fn a_joining_node_receives_its_partitions() {
    let mut nodes = start_cluster(20);
    let records = records();
    let keys = write_records(&nodes[0], "key", records);
    let three: Vec<&Node> = nodes.iter().collect();
    wait_for_stable(&three, Duration::from_secs(10));
    // A client keeps writing through the view change and the migrations:
    // fresh records, and overwrites (same value, new generation) of
    // records being migrated. Acknowledged ones must read back.
    let writing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let writer = {
        let port = nodes[1].port;
        let writing = writing.clone();
        let overwrite = keys.clone();
        std::thread::spawn(move || {
            let mut stream = connect(port);
            let mut acknowledged = Vec::new();
            let mut index = 0;
            while writing.load(std::sync::atomic::Ordering::Relaxed) {
                let fresh = format!("during-{index}");
                if put(&mut stream, &fresh, &format!("value-{fresh}")) == 0 {
                    acknowledged.push(fresh);
                }
                let old = &overwrite[index % overwrite.len()];
                assert!([0, 9].contains(&put(&mut stream, old, &format!("value-{old}"))));
                index += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            (index, acknowledged)
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let mut fourth = Node::new(23);
    let started = Instant::now();
    fourth.start(&nodes[0].heartbeat_address());
    nodes.push(fourth);
    let group: Vec<&Node> = nodes.iter().collect();
    let formed = wait_for_cluster(&group, 4, Duration::from_secs(20));
    let settled = wait_for_stable(&group, Duration::from_secs(30));
    writing.store(false, std::sync::atomic::Ordering::Relaxed);
    let (attempted, during) = writer.join().unwrap();
    println!(
        "{} of {attempted} fresh writes during the join acknowledged",
        during.len()
    );
    let (sent, partitions) = migrated(&group);
    println!(
        "join: cluster of 4 after {formed:?}, migrations settled {settled:?} later ({:?} from start): {sent} records in {partitions} partitions ({:.0} records/s after the view)",
        started.elapsed(),
        sent as f64 / settled.as_secs_f64().max(1e-3)
    );
    assert!(sent > 0 && partitions > 0);
    // Writes answered 9 may or may not be stored.
    let held = copies_matching_the_map(&group);
    assert!(
        held >= (records + during.len()) as u64 && held <= (records + attempted) as u64,
        "{held} records held"
    );
    assert_all_readable(&group, &keys);
    assert_all_readable(&group, &during);
    // The new node holds a share.
    assert!(!nodes[3].checksums().is_empty());
}

#[test]
fn a_node_restarted_empty_gets_its_copies_back() {
    let mut nodes = start_cluster(24);
    let records = records();
    let mut keys = write_records(&nodes[1], "key", records);
    wait_for_stable(&nodes.iter().collect::<Vec<_>>(), Duration::from_secs(10));
    nodes[2].kill();
    let survivors = [&nodes[0], &nodes[1]];
    wait_for_cluster(&survivors, 2, Duration::from_secs(20));
    let settled = wait_for_stable(&survivors, Duration::from_secs(30));
    println!("kill: migrations to the survivors settled in {settled:?}");
    assert_copies_match_the_map(&survivors, records as u64);
    keys.extend(write_records(&nodes[0], "while-down", 200));
    assert_all_readable(&survivors, &keys);
    // Restart empty (memory namespace): it gets back its share.
    restart_and_settle(&mut nodes, 2, "restart");
    let group: Vec<&Node> = nodes.iter().collect();
    assert!(!nodes[2].checksums().is_empty());
    assert_copies_match_the_map(&group, (records + 200) as u64);
    assert_all_readable(&group, &keys);
}

/// A node killed and started again before the others notice it left (well
/// within the heartbeat timeout) comes back empty under the same node id:
/// its heartbeats carry no cluster key, the principal forms a new view, the
/// exchange sees its empty copies, and it is filled again.
#[test]
fn a_node_restarted_within_the_heartbeat_timeout_is_refilled() {
    let mut nodes = start_cluster(28);
    let records = records();
    let keys = write_records(&nodes[1], "key", records);
    let group: Vec<&Node> = nodes.iter().collect();
    wait_for_stable(&group, Duration::from_secs(10));
    let key_before = nodes[0].info_value("cluster-key");
    nodes[2].kill();
    restart_and_settle(&mut nodes, 2, "quick restart");
    let group: Vec<&Node> = nodes.iter().collect();
    assert_copies_match_the_map(&group, records as u64);
    assert_all_readable(&group, &keys);
    assert_ne!(nodes[0].info_value("cluster-key"), key_before);
}

/// Starts node `index` again (seeded by node 0) and waits until the three
/// form a cluster and their migrations are done; prints how long it took.
fn restart_and_settle(nodes: &mut [Node], index: usize, what: &str) {
    let seed = nodes[0].heartbeat_address();
    let started = Instant::now();
    nodes[index].start(&seed);
    let group: Vec<&Node> = nodes.iter().collect();
    wait_for_cluster(&group, 3, Duration::from_secs(20));
    let settled = wait_for_stable(&group, Duration::from_secs(30));
    println!(
        "{what}: migrations settled {settled:?} after the cluster of 3 ({:?} from the restart)",
        started.elapsed()
    );
}
