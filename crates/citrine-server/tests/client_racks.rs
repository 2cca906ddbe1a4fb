//! Rack-aware reads through Citrine's own smart client on real `citrined`
//! processes: two nodes on racks 1 and 2 (`--rack-id`, replication factor
//! 2 from `examples/cluster.toml`, so each rack holds a copy of every
//! partition). The nodes answer `rack-ids`; a client on rack 2 reading with
//! `Replica::PreferRack` is served by the rack-2 node alone, whichever
//! node masters the key, and reads the values the masters wrote. (When
//! the nodes answered `rack-ids` with `ERROR:25`, as the reference's
//! Community Edition does, those reads split 98/102 between the nodes.)

#![allow(clippy::unwrap_used)]

mod common;

use citrine_client::{
    Bin, Bins, Client, ClientConfig, Key, ReadPolicy, Replica, Value, WritePolicy,
};
use common::cluster::*;
use std::time::Duration;

const KEYS: i64 = 200;

/// Reads of namespace `test` served by `node` so far (found and not
/// found).
fn reads(node: &Node) -> u64 {
    let stats = node.info_value("namespace/test").unwrap();
    let counter = |name: &str| -> u64 {
        stats
            .split(';')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("no {name} in {stats}"))
            .parse()
            .unwrap()
    };
    counter("client_read_success") + counter("client_read_not_found")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefer_rack_reads_are_served_on_the_clients_rack() {
    let mut nodes: Vec<Node> = (0x61..0x63).map(Node::new).collect();
    nodes[0].rack_id = Some(1);
    nodes[1].rack_id = Some(2);
    let seed = nodes[0].heartbeat_address();
    nodes[0].start(&seed);
    let seed = nodes[0].heartbeat_address();
    nodes[1].start(&seed);
    let group: Vec<&Node> = nodes.iter().collect();
    wait_for_cluster(&group, 2, Duration::from_secs(30));
    wait_for_stable(&group, Duration::from_secs(30));
    assert_eq!(nodes[0].info_value("rack-ids").as_deref(), Some("test:1"));
    assert_eq!(nodes[1].info_value("rack-ids").as_deref(), Some("test:2"));

    let mut config = ClientConfig::new([nodes[0].service_address()]);
    config.rack_id = Some(2);
    let client = Client::connect(config).await.unwrap();
    let write = WritePolicy::default();
    for index in 0..KEYS {
        let key = Key::new("test", "racks", index);
        client
            .put(&write, &key, &[Bin::new("v", index)])
            .await
            .unwrap();
    }
    // Reads from the master split between the nodes; on the rack, all go
    // to the rack-2 node, masters of half the keys or not.
    let read_all = |policy: ReadPolicy| {
        let client = &client;
        async move {
            for index in 0..KEYS {
                let key = Key::new("test", "racks", index);
                let record = client.get(&policy, &key, Bins::All).await.unwrap().unwrap();
                assert_eq!(record.bins.get("v"), Some(&Value::Int(index)));
            }
        }
    };
    let before: Vec<u64> = nodes.iter().map(reads).collect();
    read_all(ReadPolicy::default()).await;
    let after: Vec<u64> = nodes.iter().map(reads).collect();
    let by_master = [after[0] - before[0], after[1] - before[1]];
    assert_eq!(by_master[0] + by_master[1], KEYS as u64);
    assert!(by_master[0] > 0 && by_master[1] > 0, "{by_master:?}");

    let mut on_rack = ReadPolicy::default();
    on_rack.base.replica = Replica::PreferRack;
    read_all(on_rack).await;
    let last: Vec<u64> = nodes.iter().map(reads).collect();
    assert_eq!(
        [last[0] - after[0], last[1] - after[1]],
        [0, KEYS as u64],
        "every read on the client's rack"
    );
    client.close();
}
