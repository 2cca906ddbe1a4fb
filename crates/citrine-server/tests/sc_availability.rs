//! Strong-consistency availability over real `citrined` processes: three
//! nodes with an SC namespace on a device file with `commit-to-device`,
//! the roster set from the observed nodes and `recluster:`. Every
//! partition becomes available with a non-zero regime; with two of the
//! three nodes killed the survivor reports all 4096 unavailable; once they
//! are back (from their work directories) every partition is available
//! again, in a higher regime. A second SC namespace in memory lost the
//! restarted nodes' copies: every partition is dead until `revive:` and
//! `recluster:`. Data requests on the SC namespace answer 11 throughout
//! (the SC write path does not exist yet).

#![allow(clippy::unwrap_used)]

mod common;

use common::cluster::{wait_for_cluster, Node};
use common::*;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Namespace `test` as `examples/cluster.toml` has it (AP); `sc`, a
/// strong-consistency namespace with two copies on a file in the work
/// directory, every write committed to it; `mem`, one in memory.
fn config() -> String {
    let example = std::fs::read_to_string(workspace_root().join("examples/cluster.toml")).unwrap();
    format!(
        "{example}\n[[namespace]]\nname = \"sc\"\nreplication-factor = 2\nstrong-consistency = true\n\n\
         [namespace.storage-engine]\ntype = \"device\"\nfile = \"sc.dat\"\nfilesize = \"8M\"\n\
         write-block-size = \"64K\"\ncommit-to-device = true\n\n\
         [[namespace]]\nname = \"mem\"\nreplication-factor = 2\nstrong-consistency = true\n\n\
         [namespace.storage-engine]\ntype = \"memory\"\ndata-size = \"64M\"\n"
    )
}

/// Three nodes, each with its own work directory.
fn nodes() -> (Vec<Node>, Vec<PathBuf>) {
    let config = config();
    let mut directories = Vec::new();
    let nodes = (0..3)
        .map(|index| {
            let directory = std::env::temp_dir().join(format!(
                "citrine-sc-availability-{}-{index}-{}",
                std::process::id(),
                free_port()
            ));
            let _ = std::fs::remove_dir_all(&directory);
            std::fs::create_dir_all(&directory).unwrap();
            let path = directory.join("cluster.toml");
            std::fs::write(&path, &config).unwrap();
            let mut node = Node::new(0x40 + index);
            node.config = Some(path);
            node.data_dir = Some(directory.clone());
            directories.push(directory);
            node
        })
        .collect();
    (nodes, directories)
}

/// `name` in `node`'s `namespace/NS` statistics.
fn stat_of(node: &Node, namespace: &str, name: &str) -> Option<u64> {
    let answer = node.info_value(&format!("namespace/{namespace}"))?;
    answer
        .split(';')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))?
        .parse()
        .ok()
}

/// The regime of `sc` in `node`'s `replicas` answer.
fn regime(node: &Node) -> Option<u64> {
    let answer = node.info_value("replicas")?;
    answer
        .split(';')
        .find_map(|namespace| namespace.strip_prefix("sc:"))?
        .split(',')
        .next()?
        .parse()
        .ok()
}

/// Waits until `node` reports `unavailable` unavailable partitions of `sc`
/// (and no dead one), then returns its regime.
fn wait_for_unavailable(node: &Node, unavailable: u64) -> u64 {
    wait_for_partitions(node, "sc", (unavailable, 0));
    regime(node).unwrap()
}

/// Waits until `node` reports (unavailable, dead) partitions of `namespace`.
fn wait_for_partitions(node: &Node, namespace: &str, expected: (u64, u64)) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let seen = (
            stat_of(node, namespace, "unavailable_partitions"),
            stat_of(node, namespace, "dead_partitions"),
        );
        if seen == (Some(expected.0), Some(expected.1)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {} {namespace}: (unavailable, dead) {seen:?}, expected {expected:?}",
            node.id
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Which of `nodes` masters each partition of `sc` (from their `replicas`
/// answers); every partition must have exactly one.
fn masters(nodes: &[Node]) -> Vec<usize> {
    let mut owner = vec![usize::MAX; 4096];
    for (index, node) in nodes.iter().enumerate() {
        let answer = node.info_value("replicas-master").unwrap();
        let bitmap = answer
            .split(';')
            .find_map(|namespace| namespace.strip_prefix("sc:"))
            .unwrap();
        let bytes = base64_decode(bitmap);
        for (partition, slot) in owner.iter_mut().enumerate() {
            if bytes[partition / 8] & (0x80 >> (partition % 8)) != 0 {
                assert_eq!(*slot, usize::MAX, "partition {partition} mastered twice");
                *slot = index;
            }
        }
    }
    owner
}

/// Per partition of `namespace`, the indexes of the nodes holding it in
/// any column of their `replicas` answers, ascending.
fn holders(nodes: &[Node], namespace: &str) -> Vec<Vec<usize>> {
    let mut holders = vec![Vec::new(); 4096];
    let prefix = format!("{namespace}:");
    for (index, node) in nodes.iter().enumerate() {
        let answer = node.info_value("replicas").unwrap();
        let fields: Vec<&str> = answer
            .split(';')
            .find_map(|entry| entry.strip_prefix(prefix.as_str()))
            .unwrap()
            .split(',')
            .collect();
        for column in &fields[2..] {
            let bytes = base64_decode(column);
            for (partition, list) in holders.iter_mut().enumerate() {
                if bytes[partition / 8] & (0x80 >> (partition % 8)) != 0 {
                    list.push(index);
                }
            }
        }
    }
    holders
}

fn base64_decode(text: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap()
}

#[test]
fn a_rostered_sc_namespace_serves_its_partitions_only_with_a_majority() {
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
    // No roster yet: nothing is available.
    assert_eq!(wait_for_unavailable(&nodes[0], 4096), 0);
    let observed = nodes[0].info_value("roster:namespace=sc").unwrap();
    let observed = observed
        .split(':')
        .find_map(|pair| pair.strip_prefix("observed_nodes="))
        .unwrap()
        .to_owned();
    for namespace in ["sc", "mem"] {
        let staged = format!("roster-set:namespace={namespace};nodes={observed}");
        assert_eq!(nodes[1].info_value(&staged).unwrap(), "ok");
    }
    assert_eq!(nodes[1].info_value("recluster:").unwrap(), "ok");
    // A new view: every partition available, in a non-zero regime that
    // every node answers, each mastered by exactly one node.
    let first: Vec<u64> = nodes
        .iter()
        .map(|node| wait_for_unavailable(node, 0))
        .collect();
    assert!(
        first[0] > 0 && first.iter().all(|r| *r == first[0]),
        "{first:?}"
    );
    let owner = masters(&nodes);
    assert!(owner.iter().all(|index| *index < 3));
    assert!(
        nodes[0].info_value("cluster-stable:namespace=sc").unwrap() != "ERROR::unstable-cluster"
    );
    // Data requests stay refused: the SC write path does not exist yet.
    let mut stream = nodes[0].connect();
    let write = write_request("sc", "k", &[(2, 3, "a", b"v".to_vec())]);
    let (_, body) = round_trip(&mut stream, &write).unwrap();
    assert_eq!(decode_reply(&body).0.result_code, 11);

    // Two of three killed: the survivor serves nothing (no majority, never
    // both roster replicas), and none of it is dead (the roster is not
    // whole).
    nodes[1].kill();
    nodes[2].kill();
    wait_for_cluster(&[&nodes[0]], 1, Duration::from_secs(30));
    let alone = wait_for_unavailable(&nodes[0], 4096);
    assert_eq!(
        nodes[0].info_value("cluster-stable:").unwrap(),
        "ERROR::unstable-cluster"
    );
    // Back from their work directories: everything again, higher regime.
    nodes[1].start_seeds(&seeds);
    nodes[2].start_seeds(&seeds);
    wait_for_cluster(
        &nodes.iter().collect::<Vec<_>>(),
        3,
        Duration::from_secs(30),
    );
    let back: Vec<u64> = nodes
        .iter()
        .map(|node| wait_for_unavailable(node, 0))
        .collect();
    assert!(
        back[0] > alone && alone > first[0],
        "{first:?} {alone} {back:?}"
    );
    assert!(back.iter().all(|r| *r == back[0]), "{back:?}");
    masters(&nodes);
    // In memory, the two restarted nodes lost their copies: with the whole
    // roster back, the partitions whose two roster replicas were both
    // restarted are dead until `revive:` (asked of one node) and
    // `recluster:`; the others serve from the survivor's copy.
    let lost = holders(&nodes, "sc")
        .iter()
        .filter(|holders| **holders == [1, 2])
        .count() as u64;
    assert!(lost > 1000, "{lost}");
    for node in &nodes {
        wait_for_partitions(node, "mem", (lost, lost));
    }
    assert_eq!(nodes[2].info_value("revive:namespace=mem").unwrap(), "ok");
    assert_eq!(nodes[0].info_value("recluster:").unwrap(), "ok");
    for node in &nodes {
        wait_for_partitions(node, "mem", (0, 0));
    }
    drop(nodes);
    for directory in directories {
        let _ = std::fs::remove_dir_all(directory);
    }
}
