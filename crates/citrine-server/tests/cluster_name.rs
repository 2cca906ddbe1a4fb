//! `cluster-name` on the cluster channels: two real processes on loopback
//! with different cluster names, one seeded with the other, never form one
//! cluster, and the node that hears the other logs it as the reference
//! does ("ignoring message from ... with different cluster name ..."); a
//! third node with the first one's name joins it meanwhile.

#![allow(clippy::unwrap_used)]

mod common;

use common::cluster::{wait_for_cluster, Node};
use std::time::Duration;

fn named(index: usize, name: &str, log: &std::path::Path) -> Node {
    let mut node = Node::new(index);
    node.extra_args = vec!["--cluster-name".to_owned(), name.to_owned()];
    node.log_file = Some(log.join(format!("{}.log", node.id)));
    node
}

#[test]
fn nodes_of_another_cluster_name_do_not_join() {
    let logs = std::env::temp_dir().join(format!("citrine-cluster-name-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir_all(&logs).unwrap();
    let mut alpha = named(0x60, "alpha", &logs);
    let seed = alpha.heartbeat_address();
    alpha.start(&seed);
    let seed = alpha.heartbeat_address();
    let mut beta = named(0x61, "beta", &logs);
    beta.start(&seed);
    let mut gamma = named(0x62, "alpha", &logs);
    gamma.start(&seed);
    // The node of the same name joins: the others had that long too.
    wait_for_cluster(&[&alpha, &gamma], 2, Duration::from_secs(20));
    assert_eq!(alpha.cluster_info().map(|info| info.1), Some(2));
    assert_eq!(beta.cluster_info().map(|info| info.1), Some(1));
    let log = std::fs::read_to_string(logs.join(format!("{}.log", alpha.id))).unwrap();
    let line = format!(
        "ignoring message from {} with different cluster name 'beta'",
        beta.id
    );
    assert!(log.contains(&line), "{line} not in alpha's log:\n{log}");
    drop((alpha, beta, gamma));
    let _ = std::fs::remove_dir_all(&logs);
}

/// Mixed builds, on demand: `CITRINE_OLD_CITRINED=<a citrined built before
/// the cluster name was in the hello> cargo test -p citrine-server --test
/// cluster_name -- --ignored`. The older node reads the new node's hello
/// (its cluster name in the TLS-name text beside an empty TLS address) as
/// one without TLS, and the two form one cluster, both ways round.
#[test]
#[ignore]
fn an_older_build_joins_a_node_that_says_its_cluster_name() {
    let old = std::env::var_os("CITRINE_OLD_CITRINED").expect("CITRINE_OLD_CITRINED");
    let logs = std::env::temp_dir().join(format!("citrine-cluster-mixed-{}", std::process::id()));
    std::fs::create_dir_all(&logs).unwrap();
    let mut older = named(0x63, "alpha", &logs);
    older.binary = Some(std::path::PathBuf::from(old));
    let own = older.heartbeat_address();
    older.start(&own);
    let seed = older.heartbeat_address();
    let mut newer = named(0x64, "alpha", &logs);
    newer.start(&seed);
    wait_for_cluster(&[&older, &newer], 2, Duration::from_secs(20));
    drop((older, newer));
    let _ = std::fs::remove_dir_all(&logs);
}
