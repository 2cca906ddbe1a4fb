//! The strong-consistency roster over real `citrined` processes: staged on
//! one node (`roster-set:` of the observed nodes), applied on another
//! (`recluster:`), read back the same from every node, and again after
//! every node was killed and started one by one (each from its own work
//! directory); data requests on the SC namespace answer 11.

#![allow(clippy::unwrap_used)]

mod common;

use common::cluster::{wait_for_cluster, Node};
use common::*;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Namespace `test` as `examples/cluster.toml` has it (AP) and `sc`, a
/// strong-consistency namespace in memory.
fn config() -> String {
    let example = std::fs::read_to_string(workspace_root().join("examples/cluster.toml")).unwrap();
    format!(
        "{example}\n[[namespace]]\nname = \"sc\"\nreplication-factor = 2\nstrong-consistency = true\n\n[namespace.storage-engine]\ntype = \"memory\"\ndata-size = \"64M\"\n"
    )
}

/// Three nodes on racks 1, 1, 2, each with its own work directory.
fn nodes() -> (Vec<Node>, Vec<PathBuf>) {
    let config = config();
    let mut directories = Vec::new();
    let nodes = (0..3)
        .map(|index| {
            let directory = std::env::temp_dir().join(format!(
                "citrine-roster-{}-{index}-{}",
                std::process::id(),
                free_port()
            ));
            let _ = std::fs::remove_dir_all(&directory);
            std::fs::create_dir_all(&directory).unwrap();
            let path = directory.join("cluster.toml");
            std::fs::write(&path, &config).unwrap();
            let mut node = Node::new(0x70 + index);
            node.config = Some(path);
            node.data_dir = Some(directory.clone());
            node.rack_id = Some(if index == 2 { 2 } else { 1 });
            directories.push(directory);
            node
        })
        .collect();
    (nodes, directories)
}

/// The `roster:namespace=sc` fields of `node`: (roster, pending, observed).
fn roster(node: &Node) -> (String, String, String) {
    let text = node.info_value("roster:namespace=sc").unwrap();
    let field = |name: &str| {
        text.split(':')
            .find_map(|pair| pair.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {text}"))
            .to_owned()
    };
    (
        field("roster="),
        field("pending_roster="),
        field("observed_nodes="),
    )
}

/// Waits until every node of `group` answers `expected` for the roster and
/// the pending roster.
fn wait_for_roster(group: &[&Node], expected: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for node in group {
        loop {
            let (roster, pending, _) = roster(node);
            if roster == expected && pending == expected {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {}: roster {roster}, pending {pending}, expected {expected}",
                node.id
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn a_roster_staged_on_one_node_is_every_nodes_and_survives_restarts() {
    let (mut nodes, directories) = nodes();
    let seeds: Vec<String> = nodes.iter().map(Node::heartbeat_address).collect();
    for node in nodes.iter_mut() {
        node.start_seeds(&seeds);
    }
    wait_for_cluster(
        &nodes.iter().collect::<Vec<_>>(),
        3,
        Duration::from_secs(30),
    );
    let (_, _, observed) = roster(&nodes[0]);
    let expected = format!("{}@2,{}@1,{}@1", nodes[2].id, nodes[1].id, nodes[0].id);
    assert_eq!(observed, expected, "the view's nodes with their racks");
    assert_eq!(
        roster(&nodes[1]),
        ("null".into(), "null".into(), expected.clone())
    );

    // Staged on one node, applied on another; every node answers it.
    let staged = format!("roster-set:namespace=sc;nodes={observed}");
    assert_eq!(nodes[1].info_value(&staged).unwrap(), "ok");
    assert_eq!(roster(&nodes[0]).0, "null", "staged, not applied");
    // Asked of every node: the principal (the highest id) applies it.
    common::cluster::recluster(&nodes.iter().collect::<Vec<_>>());
    wait_for_roster(&nodes.iter().collect::<Vec<_>>(), &expected);
    // The AP namespace has no roster.
    assert_eq!(
        nodes[0].info_value("roster:namespace=test").unwrap(),
        "ERROR:4:namespace is not strong-consistency"
    );
    // Every partition of the SC namespace is unavailable: 11 at once.
    let mut stream = nodes[0].connect();
    let write = write_request("sc", "k", &[(2, 3, "a", b"v".to_vec())]);
    let (_, body) = round_trip(&mut stream, &write).unwrap();
    assert_eq!(decode_reply(&body).0.result_code, 11);

    // Every node killed, then started alone: each reads its own file.
    for node in nodes.iter_mut() {
        node.kill();
    }
    for index in 0..3 {
        nodes[index].start_seeds(&seeds);
        wait_for_roster(&nodes[..=index].iter().collect::<Vec<_>>(), &expected);
    }
    wait_for_cluster(
        &nodes.iter().collect::<Vec<_>>(),
        3,
        Duration::from_secs(30),
    );
    wait_for_roster(&nodes.iter().collect::<Vec<_>>(), &expected);
    drop(nodes);
    for directory in directories {
        let _ = std::fs::remove_dir_all(directory);
    }
}
