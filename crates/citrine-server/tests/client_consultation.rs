//! Cluster consultation (001 §2.3.3.2) through Citrine's own smart client,
//! over a real network (`common::netns`; needs root, `CITRINE_SKIP_NETNS=1`
//! skips it): two `citrined` processes, one in each of two network
//! namespaces joined by a veth link (replication factor 2 from
//! `examples/cluster.toml`, so each node holds a copy of every record), and
//! the client in the test's own namespace, seeded from node A.
//!
//! 1. The test takes away its own route to node B. The client can no
//!    longer reach B, but A and B still see each other, and A's peers list
//!    names B. The client counts B's failures past its threshold and keeps
//!    B all the same: B is not gone, only out of the client's reach.
//!    Reads that may go to a replica (`Replica::Sequence`) all return the
//!    values written before; reads pinned to the master fail for B's keys.
//! 2. The link between the namespaces is cut too. A's view drops B, A's
//!    peers list stops naming it, and the client removes B. A masters every
//!    partition and takes every write.
//! 3. The link and the route come back. The nodes merge, A lists B again,
//!    and the client finds B from that list (no seed names B). Once the
//!    cluster is stable, reads from the masters return the writes of
//!    step 2.

#![allow(clippy::unwrap_used)]

mod common;

use citrine_client::{
    Bin, Bins, Client, ClientConfig, Key, NodeSummary, Policy, ReadPolicy, Replica, Value,
    WritePolicy,
};
use common::cluster::*;
use common::netns::{self, SplitNetwork};
use std::time::{Duration, Instant};

const KEYS: i64 = 60;

/// The client drops an unreachable node after this many failed tends, if
/// no reachable node lists it.
const THRESHOLD: u32 = 3;

fn key(index: i64) -> Key {
    Key::new("test", "consult", index)
}

/// Commands that keep trying for up to 20 s, each attempt short.
fn patient() -> Policy {
    Policy {
        total_timeout: Duration::from_secs(20),
        socket_timeout: Duration::from_millis(300),
        max_retries: 1_000,
        backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(200),
        ..Policy::default()
    }
}

/// Polls the client's node list until `done` holds; panics with the list
/// after `limit`.
async fn wait_for_nodes(
    client: &Client,
    what: &str,
    limit: Duration,
    done: impl Fn(&[NodeSummary]) -> bool,
) -> Vec<NodeSummary> {
    let deadline = Instant::now() + limit;
    loop {
        let nodes = client.nodes();
        if done(&nodes) {
            return nodes;
        }
        assert!(Instant::now() < deadline, "{what}: nodes {nodes:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn write_all(client: &Client, offset: i64) {
    let policy = WritePolicy {
        base: patient(),
        ..WritePolicy::default()
    };
    for index in 0..KEYS {
        client
            .put(&policy, &key(index), &[Bin::new("v", index + offset)])
            .await
            .unwrap_or_else(|error| panic!("write of key {index}: {error}"));
    }
}

async fn read_all(client: &Client, policy: &ReadPolicy, offset: i64) {
    for index in 0..KEYS {
        let record = client
            .get(policy, &key(index), Bins::All)
            .await
            .unwrap_or_else(|error| panic!("read of key {index}: {error}"))
            .unwrap_or_else(|| panic!("key {index} not found"));
        assert_eq!(
            record.bins.get("v"),
            Some(&Value::Int(index + offset)),
            "key {index}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_out_of_the_clients_reach_is_kept_while_its_peer_lists_it() {
    if netns::skipped() {
        return;
    }
    let network = SplitNetwork::new();
    let nodes = network.start_pair(0x70);
    let group: Vec<&Node> = nodes.iter().collect();
    wait_for_stable(&group, Duration::from_secs(30));
    let (a, b) = (&nodes[0], &nodes[1]);

    let mut config = ClientConfig::new([a.service_address()]);
    config.tend_interval = Duration::from_millis(300);
    config.tend_timeout = Duration::from_millis(300);
    config.max_node_failures = THRESHOLD;
    let client = Client::connect(config).await.unwrap();
    let both = wait_for_nodes(
        &client,
        "B found from A's peers",
        Duration::from_secs(10),
        |n| n.len() == 2,
    )
    .await;
    let b_id = both
        .iter()
        .find(|node| node.address.to_string() == b.service_address())
        .unwrap_or_else(|| panic!("no node at {} in {both:?}", b.service_address()))
        .id;
    write_all(&client, 0).await;
    let of_b: Vec<i64> = (0..KEYS)
        .filter(|index| client.master_of(&key(*index)) == Some(b_id))
        .collect();
    assert!(
        !of_b.is_empty() && of_b.len() < KEYS as usize,
        "B masters some keys, not all: {of_b:?}"
    );

    // 1. Out of the client's reach, still in A's view: kept.
    network.set_reach(1, false);
    let limit = Duration::from_secs(15);
    wait_for_nodes(&client, "B's failures counted", limit, |nodes| {
        nodes
            .iter()
            .any(|node| node.id == b_id && !node.reachable && node.failures >= THRESHOLD + 2)
    })
    .await;
    let kept = client.nodes();
    assert_eq!(kept.len(), 2, "B kept while A lists it: {kept:?}");
    assert_eq!(a.cluster_info().map(|(_, size)| size), Some(2));

    let sequence = ReadPolicy {
        base: Policy {
            replica: Replica::Sequence,
            ..patient()
        },
        ..ReadPolicy::default()
    };
    read_all(&client, &sequence, 0).await;
    let master_only = ReadPolicy {
        base: Policy {
            total_timeout: Duration::from_millis(500),
            socket_timeout: Duration::from_millis(200),
            ..Policy::default()
        },
        ..ReadPolicy::default()
    };
    for index in &of_b {
        assert!(
            client
                .get(&master_only, &key(*index), Bins::All)
                .await
                .is_err(),
            "key {index}: its master B answered through a removed route"
        );
    }

    // 2. The link between the sides is cut: A's view drops B, so does the client.
    network.set_link(false);
    wait_for_cluster(&[a], 1, Duration::from_secs(20));
    let alone = wait_for_nodes(&client, "B removed", Duration::from_secs(15), |nodes| {
        nodes.len() == 1
    })
    .await;
    assert_ne!(alone[0].id, b_id);
    assert!(client.stats().nodes_removed >= 1);
    write_all(&client, 1_000).await;

    // 3. Link and route back: B is found again through A's peers list.
    network.set_link(true);
    network.set_reach(1, true);
    wait_for_cluster(&group, 2, Duration::from_secs(40));
    wait_for_nodes(&client, "B found again", Duration::from_secs(15), |nodes| {
        nodes.iter().any(|node| node.id == b_id && node.reachable)
    })
    .await;
    wait_for_stable(&group, Duration::from_secs(60));
    let master = ReadPolicy {
        base: patient(),
        ..ReadPolicy::default()
    };
    read_all(&client, &master, 1_000).await;
    client.close();
}
