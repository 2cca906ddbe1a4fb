//! Cluster formation over real `citrined` processes: nodes started with each
//! other's heartbeat addresses form one cluster, re-form when one dies, take
//! it back when it restarts, and split and merge across a real network
//! partition made with network namespaces.

#![allow(clippy::unwrap_used)]

mod common;

use common::cluster::{wait_for_cluster, Node};
use common::netns::{self, SplitNetwork};
use common::*;
use std::time::Duration;

#[test]
fn three_nodes_form_one_cluster() {
    let mut nodes: Vec<Node> = (0..3).map(|index| Node::new(0x20 + index)).collect();
    let seed = nodes[0].heartbeat_address();
    for node in nodes.iter_mut() {
        node.start(&seed);
    }
    let took = wait_for_cluster(
        &nodes.iter().collect::<Vec<_>>(),
        3,
        Duration::from_secs(30),
    );
    println!("3 nodes formed one cluster in {took:?}");
    // Every node lists the other two as peers with their service addresses.
    let mut stream = connect(nodes[1].port);
    let peers = &info(&mut stream, &["peers-clear-std"])[0].1;
    for other in [&nodes[0], &nodes[2]] {
        assert!(
            peers.contains(&format!("[{},,[127.0.0.1:{}]]", other.id, other.port)),
            "{peers}"
        );
    }
    // The clock skew the heartbeats measure: the three share this
    // machine's clock, so it is what loopback delays make of it (a few ms
    // at most), and the statistic is there on every node.
    std::thread::sleep(Duration::from_secs(2));
    for node in &nodes {
        let statistics = node.info_value("statistics").unwrap();
        let skew: u64 = statistics
            .split(';')
            .find_map(|pair| pair.strip_prefix("cluster_clock_skew_ms="))
            .and_then(|value| value.parse().ok())
            .unwrap_or_else(|| panic!("no cluster_clock_skew_ms in {statistics}"));
        println!("node {}: cluster_clock_skew_ms={skew}", node.id);
        assert!(skew < 100, "node {}: skew {skew} ms", node.id);
    }
}

#[test]
fn five_nodes_reform_after_a_kill_and_take_it_back_after_a_restart() {
    let mut nodes: Vec<Node> = (0..5).map(|index| Node::new(0x28 + index)).collect();
    let seeds: Vec<String> = nodes[..2].iter().map(Node::heartbeat_address).collect();
    for node in nodes.iter_mut() {
        node.start_seeds(&seeds);
    }
    wait_for_cluster(
        &nodes.iter().collect::<Vec<_>>(),
        5,
        Duration::from_secs(40),
    );
    // Kill the principal (highest node id): the hardest departure.
    nodes[4].kill();
    let took = wait_for_cluster(
        &nodes[..4].iter().collect::<Vec<_>>(),
        4,
        Duration::from_secs(30),
    );
    println!("kill to new view on every remaining node: {took:?}");
    nodes[4].start_seeds(&seeds);
    let took = wait_for_cluster(
        &nodes.iter().collect::<Vec<_>>(),
        5,
        Duration::from_secs(40),
    );
    println!("restart to rejoined view on every node: {took:?}");
}

/// A real network split between two network namespaces yields two clusters
/// that merge again when the network heals. Needs root (`ip netns`); set
/// CITRINE_SKIP_NETNS=1 to skip it on a machine without.
#[test]
fn a_network_split_makes_two_clusters_that_merge_when_healed() {
    if netns::skipped() {
        return;
    }
    let network = SplitNetwork::new();
    let nodes = network.start_cluster(0x40);
    let all: Vec<&Node> = nodes.iter().collect();
    network.set_link(false);
    let took_a = wait_for_cluster(&all[..2], 2, Duration::from_secs(30));
    let took_b = wait_for_cluster(&all[2..], 2, Duration::from_secs(30));
    let key_a = nodes[0].cluster_info().unwrap().0;
    let key_b = nodes[2].cluster_info().unwrap().0;
    assert_ne!(key_a, key_b, "the two sides are distinct clusters");
    println!("split into two clusters in {took_a:?} / {took_b:?}");
    network.set_link(true);
    let took = wait_for_cluster(&all, 4, Duration::from_secs(40));
    println!("healed and merged in {took:?}");
    drop(nodes);
}
