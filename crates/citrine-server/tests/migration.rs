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

/// A cluster of two nodes whose namespace lives on a device file in each
/// node's work directory.
fn device_pair(first: usize) -> (Vec<Node>, Vec<std::path::PathBuf>) {
    let base = workspace_root().join("examples/cluster.toml");
    let text = std::fs::read_to_string(base).unwrap();
    let memory = text.find("[namespace.storage-engine]").unwrap();
    let config = format!(
        "{}[namespace.storage-engine]\ntype = \"device\"\nfile = \"test.dat\"\nfilesize = \"64M\"\nwrite-block-size = \"128K\"\nflush-max-ms = 50\n",
        &text[..memory]
    );
    let mut directories = Vec::new();
    let nodes = (first..first + 2)
        .map(|index| {
            let directory = std::env::temp_dir().join(format!(
                "citrine-lineage-{}-{index}-{}",
                std::process::id(),
                free_port()
            ));
            let _ = std::fs::remove_dir_all(&directory);
            std::fs::create_dir_all(&directory).unwrap();
            let path = directory.join("cluster.toml");
            std::fs::write(&path, &config).unwrap();
            let mut node = Node::new(index);
            node.config = Some(path);
            node.data_dir = Some(directory.clone());
            directories.push(directory);
            node
        })
        .collect();
    (nodes, directories)
}

/// A node killed and started again with its device keeps the regime of
/// its last view (`regime` in its work directory). Its copies are then
/// known to be contained in the survivor's, which went through that
/// regime: only the survivor sends (the writes made while it was down),
/// the restarted node sends nothing, and while it fills the partitions it
/// masters, the survivor acts for it (reads served from the whole copy).
#[test]
fn a_node_restarted_with_its_device_gets_only_what_it_missed() {
    let (mut nodes, directories) = device_pair(32);
    let seed = nodes[0].heartbeat_address();
    nodes[0].start(&seed);
    nodes[1].start(&seed);
    let pair: Vec<&Node> = nodes.iter().collect();
    wait_for_cluster(&pair, 2, Duration::from_secs(30));
    wait_for_stable(&pair, Duration::from_secs(30));
    let mut keys = write_records(&nodes[0], "key", 2000);
    wait_for_stable(&pair, Duration::from_secs(30));
    // Past the flush window, so the device holds every record.
    std::thread::sleep(Duration::from_millis(300));
    let regime = std::fs::read_to_string(directories[1].join("regime")).unwrap();
    assert!(regime.starts_with("citrine-regime 1 "), "{regime:?}");
    nodes[1].kill();
    wait_for_cluster(&[&nodes[0]], 1, Duration::from_secs(20));
    wait_for_stable(&[&nodes[0]], Duration::from_secs(30));
    let missed = write_records(&nodes[0], "while-down", 200);
    // The survivor sends the missed records slowly: the restarted node
    // fills its partitions for about ten seconds.
    assert_eq!(
        nodes[0]
            .info_value("set-config:context=service;migrate-max-records-per-sec=20")
            .as_deref(),
        Some("ok")
    );
    nodes[1].start(&seed);
    let pair: Vec<&Node> = nodes.iter().collect();
    wait_for_cluster(&pair, 2, Duration::from_secs(30));
    let remaining = |node: &Node| statistic(&mut node.connect(), "migrate_rx_partitions_remaining");
    let deadline = Instant::now() + Duration::from_secs(10);
    while remaining(&nodes[1]) == 0 {
        assert!(Instant::now() < deadline, "the restarted node fills");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Reads sent to the restarted node while it fills: every record, each
    // of a partition it masters served by the survivor acting for it.
    let dupres = |node: &Node| statistic(&mut node.connect(), "migrate_dupres_runs");
    let resolved = dupres(&nodes[1]);
    let mut stream = nodes[1].connect();
    for key in &missed {
        // Retry 9 and 11: the survivor may not have resolved the view's
        // exchange yet when the first reads reach it (11), and a duplicate
        // resolution or a proxy meeting views that still disagree answers
        // 9, which the official clients retry (a CI run got 9 here).
        let mut answer = get(&mut stream, key);
        for _ in 0..100 {
            if answer.0 != 9 && answer.0 != 11 {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            answer = get(&mut stream, key);
        }
        assert_eq!(
            answer,
            (0, Some(format!("value-{key}").into_bytes())),
            "{key} while filling"
        );
    }
    assert!(remaining(&nodes[1]) > 0, "the reads ran while it filled");
    assert_eq!(
        dupres(&nodes[1]),
        resolved,
        "no read needed duplicate resolution: the survivor acts for every filling partition"
    );
    assert!(
        statistic(&mut nodes[0].connect(), "migrate_acting_reads") > 0,
        "the survivor acted for the filling master"
    );
    nodes[0].info_value("set-config:context=service;migrate-max-records-per-sec=0");
    wait_for_stable(&pair, Duration::from_secs(60));
    let sent = |node: &Node, name: &str| statistic(&mut node.connect(), name);
    assert_eq!(
        (
            sent(&nodes[1], "migrate_partitions_sent"),
            sent(&nodes[1], "migrate_records_sent")
        ),
        (0, 0),
        "the restarted node's copies are contained in the survivor's"
    );
    assert!(sent(&nodes[0], "migrate_records_sent") >= 200);
    keys.extend(missed);
    assert_copies_match_the_map(&pair, keys.len() as u64);
    assert_all_readable(&pair, &keys);
    drop(nodes);
    for directory in directories {
        let _ = std::fs::remove_dir_all(directory);
    }
}
