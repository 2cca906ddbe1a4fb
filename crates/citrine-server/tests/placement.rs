//! `prefer-minimal-migration` over real `citrined` processes (issue 45):
//! every node answers `replicas` with the same map, a join and a leave move
//! close to the optimum (replication factor × 4096 / nodes copies, read
//! from the maps and from the migration statistics), and a member with the
//! option off keeps the whole cluster on the paper's map.

#![allow(clippy::unwrap_used)]

mod common;

use citrine_cluster::partition_map::{NodeEntry, PartitionMap, PartitionMapConfig};
use citrine_types::{NodeId, PartitionId};
use common::cluster::*;
use common::*;
use std::path::PathBuf;
use std::time::Duration;

/// `examples/cluster.toml` with `prefer-minimal-migration` set to `on`.
fn config(on: bool) -> PathBuf {
    let text = std::fs::read_to_string(workspace_root().join("examples/cluster.toml")).unwrap();
    let text = text.replacen(
        "replication-factor = 2\n",
        &format!("replication-factor = 2\nprefer-minimal-migration = {on}\n"),
        1,
    );
    assert!(text.contains("prefer-minimal-migration"));
    let directory = std::env::temp_dir().join(format!("citrine-placement-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let path = directory.join(format!("cluster-{on}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

fn start(index: usize, on: bool, seed: Option<&str>) -> Node {
    let mut node = Node::new(index);
    node.config = Some(config(on));
    let own = node.heartbeat_address();
    node.start(seed.unwrap_or(&own));
    node
}

/// The map every node of `group` answers with `replicas`: for each
/// partition its (master, replica). Panics unless each column of each
/// partition is claimed by exactly one node.
fn agreed_map(group: &[&Node]) -> Vec<[NodeId; 2]> {
    let mut map = vec![[NodeId(0); 2]; 4096];
    let mut claims = vec![[0usize; 2]; 4096];
    for node in group {
        let id = NodeId(u64::from_str_radix(&node.id, 16).unwrap());
        let columns = replica_columns(node);
        assert_eq!(columns.len(), 2, "node {}", node.id);
        for (column, held) in columns.iter().enumerate() {
            for pid in (0..4096).filter(|&pid| held[pid]) {
                map[pid][column] = id;
                claims[pid][column] += 1;
            }
        }
    }
    for (pid, claim) in claims.iter().enumerate() {
        assert_eq!(*claim, [1, 1], "partition {pid}: columns claimed {claim:?}");
    }
    map
}

/// The paper's map of `group`'s nodes (every node on rack 0).
fn paper_map(group: &[&Node]) -> Vec<[NodeId; 2]> {
    let entries: Vec<NodeEntry> = group
        .iter()
        .map(|node| NodeEntry {
            id: NodeId(u64::from_str_radix(&node.id, 16).unwrap()),
            rack_id: 0,
        })
        .collect();
    let config = PartitionMapConfig {
        replication_factor: 2,
        uniform_balance: true,
    };
    let map = PartitionMap::compute(&entries, &config);
    PartitionId::all()
        .map(|p| [map.replicas(p)[0], map.replicas(p)[1]])
        .collect()
}

/// Copies of `new` on a node that held no copy of that partition in `old`.
fn moved(old: &[[NodeId; 2]], new: &[[NodeId; 2]]) -> usize {
    old.iter()
        .zip(new)
        .map(|(before, after)| after.iter().filter(|n| !before.contains(n)).count())
        .sum()
}

fn partitions_sent(group: &[&Node]) -> u64 {
    group
        .iter()
        .map(|node| statistic(&mut node.connect(), "migrate_partitions_sent"))
        .sum()
}

fn write_records(node: &Node, count: usize) {
    let mut stream = connect(node.port);
    for index in 0..count {
        let key = format!("placement-{index}");
        assert_eq!(put(&mut stream, &key, "value"), 0, "put {key}");
    }
}

/// Partitions with at least one record, from `partition-checksums`.
fn filled(group: &[&Node]) -> Vec<bool> {
    let mut filled = vec![false; 4096];
    for node in group {
        for (pid, summary) in node.checksums() {
            if !summary.starts_with("0:") {
                filled[usize::from(pid)] = true;
            }
        }
    }
    filled
}

/// Copies that must migrate from `old` to `new`: the moved copies of the
/// partitions holding records.
fn must_migrate(old: &[[NodeId; 2]], new: &[[NodeId; 2]], filled: &[bool]) -> usize {
    (0..4096)
        .filter(|&pid| filled[pid])
        .map(|pid| moved(&old[pid..=pid], &new[pid..=pid]))
        .sum()
}

#[test]
fn a_join_and_a_leave_agree_and_move_close_to_the_optimum() {
    let first = start(70, true, None);
    let seed = first.heartbeat_address();
    let mut nodes = vec![
        first,
        start(71, true, Some(&seed)),
        start(72, true, Some(&seed)),
    ];
    let group: Vec<&Node> = nodes.iter().collect();
    wait_for_cluster(&group, 3, Duration::from_secs(30));
    wait_for_stable(&group, Duration::from_secs(30));
    write_records(&nodes[0], 6000);
    let three = agreed_map(&group);
    let filled_partitions = filled(&group);
    let sent_before = partitions_sent(&group);

    // Node 73 joins: it has the highest id, so it decides the view's map
    // from the base the others share.
    nodes.push(start(73, true, Some(&seed)));
    let group: Vec<&Node> = nodes.iter().collect();
    wait_for_cluster(&group, 4, Duration::from_secs(30));
    wait_for_stable(&group, Duration::from_secs(60));
    let four = agreed_map(&group);
    let join_sent = partitions_sent(&group) - sent_before;
    let join_moved = moved(&three, &four);
    let paper_moved = moved(&three, &paper_map(&group));
    let join_needed = must_migrate(&three, &four, &filled_partitions);
    println!(
        "join: {join_moved} copies moved (optimum 2048, paper map {paper_moved}); \
         {join_sent} partitions migrated for {join_needed} filled partitions' new copies"
    );
    assert_ne!(
        four,
        paper_map(&group),
        "the stable placement is not in use"
    );
    assert!(join_moved <= 2560, "join moved {join_moved} copies");
    assert!(
        join_sent as usize <= join_needed && join_sent > 0,
        "join sent {join_sent}"
    );

    // Node 71 leaves; migrations are counted on the nodes that stay.
    nodes.remove(1).kill();
    let sent_before = partitions_sent(&nodes.iter().collect::<Vec<_>>());
    let group: Vec<&Node> = nodes.iter().collect();
    wait_for_cluster(&group, 3, Duration::from_secs(30));
    wait_for_stable(&group, Duration::from_secs(60));
    let after = agreed_map(&group);
    let leave_sent = partitions_sent(&group) - sent_before;
    let leave_moved = moved(&four, &after);
    let leave_needed = must_migrate(&four, &after, &filled_partitions);
    println!(
        "leave: {leave_moved} copies moved (optimum 2048); \
         {leave_sent} partitions migrated for {leave_needed} filled partitions' new copies"
    );
    assert!(leave_moved <= 2560, "leave moved {leave_moved} copies");
    assert!(
        leave_sent as usize <= leave_needed && leave_sent > 0,
        "leave sent {leave_sent}"
    );
}

#[test]
fn a_member_with_the_option_off_keeps_every_node_on_the_paper_map() {
    let first = start(80, true, None);
    let seed = first.heartbeat_address();
    let mut nodes = vec![
        first,
        start(81, false, Some(&seed)),
        start(82, true, Some(&seed)),
    ];
    let group: Vec<&Node> = nodes.iter().collect();
    wait_for_cluster(&group, 3, Duration::from_secs(30));
    wait_for_stable(&group, Duration::from_secs(30));
    nodes.push(start(83, true, Some(&seed)));
    let group: Vec<&Node> = nodes.iter().collect();
    wait_for_cluster(&group, 4, Duration::from_secs(30));
    wait_for_stable(&group, Duration::from_secs(60));
    assert_eq!(agreed_map(&group), paper_map(&group));
    // The option shows in the namespace's configuration.
    let config = nodes[1]
        .info_value("get-config:context=namespace;id=test")
        .unwrap();
    assert!(
        config.contains("prefer-minimal-migration=false"),
        "{config}"
    );
    let config = nodes[0]
        .info_value("get-config:context=namespace;id=test")
        .unwrap();
    assert!(config.contains("prefer-minimal-migration=true"), "{config}");
}

/// Rolling upgrade, on demand: `CITRINE_OLD_CITRINED=<a citrined built
/// before prefer-minimal-migration> cargo test -p citrine-server --test
/// placement -- --ignored`. Node 90 runs the older binary (with the
/// example configuration, which it understands); nodes 91 and 92 have the
/// option on. Node 92, the principal, hears no offer from node 90 and
/// decides the paper's map: every node answers the same map.
#[test]
#[ignore]
fn an_older_member_keeps_every_node_on_the_paper_map() {
    let old = std::env::var_os("CITRINE_OLD_CITRINED").expect("CITRINE_OLD_CITRINED");
    let mut first = Node::new(90);
    first.binary = Some(PathBuf::from(old));
    let own = first.heartbeat_address();
    first.start(&own);
    let seed = first.heartbeat_address();
    let nodes = [
        first,
        start(91, true, Some(&seed)),
        start(92, true, Some(&seed)),
    ];
    let group: Vec<&Node> = nodes.iter().collect();
    wait_for_cluster(&group, 3, Duration::from_secs(30));
    wait_for_stable(&group, Duration::from_secs(60));
    assert_eq!(agreed_map(&group), paper_map(&group));
}

/// Rolling upgrade, on demand (as above): the older binary is node 95,
/// the principal, which never answers offers. Nodes 93 and 94 (option
/// on) must not publish a map of their own for the view: only the older
/// node serves it, on the paper's map.
#[test]
#[ignore]
fn an_older_principal_is_refused_rather_than_split() {
    let old = std::env::var_os("CITRINE_OLD_CITRINED").expect("CITRINE_OLD_CITRINED");
    let mut principal = Node::new(95);
    principal.binary = Some(PathBuf::from(old));
    let own = principal.heartbeat_address();
    principal.start(&own);
    let seed = principal.heartbeat_address();
    let nodes = [
        principal,
        start(93, true, Some(&seed)),
        start(94, true, Some(&seed)),
    ];
    wait_for_cluster(&[&nodes[0]], 3, Duration::from_secs(30));
    let (key, _) = nodes[0].cluster_info().unwrap();
    // Four heartbeat timeouts (6 s) and then some: the offering nodes
    // report the silent principal and still publish nothing of that view.
    std::thread::sleep(Duration::from_secs(9));
    for node in &nodes[1..] {
        let info = node.cluster_info();
        assert!(
            info.as_ref().is_none_or(|(published, _)| *published != key),
            "node {} published the view: {info:?}",
            node.id
        );
    }
    assert_eq!(nodes[0].cluster_info().unwrap(), (key, 3));
}
