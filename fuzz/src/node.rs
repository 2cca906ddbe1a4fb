//! One in-memory node for the targets that feed a `Service` (`fabric_calls`,
//! `service_requests`): namespace `test`, a view of its own, no fabric and no
//! work directory, so nothing leaves the process and no file is written.

use citrine_service::cluster_state::{ClusterMember, ClusterState};
use citrine_service::config::{NamespaceConfig, ServiceConfig};
use citrine_service::{ManualClock, Service};
use citrine_types::NodeId;
use std::sync::Arc;

/// A node `node_id` alone in a view with `cluster_key`, keeping
/// `replication_factor` copies of `test`, on a clock the caller moves.
pub fn single_node(
    node_id: u64,
    cluster_key: u64,
    replication_factor: usize,
) -> (Arc<ManualClock>, Service) {
    let config = ServiceConfig {
        node_id,
        rack_id: 0,
        cluster_name: "citrine".into(),
        access_address: "127.0.0.1:3000".into(),
        port: 3000,
        tls_access_address: String::new(),
        namespaces: vec![NamespaceConfig::in_memory("test")],
    };
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let service = Service::new(config, clock.clone());
    let member = ClusterMember {
        node_id: NodeId(node_id),
        rack_id: 0,
        service_address: "127.0.0.1:3000".into(),
        tls: None,
    };
    service.publish_cluster(ClusterState::new(
        NodeId(node_id),
        cluster_key,
        vec![member],
        &[("test".into(), replication_factor)],
        1,
        1,
    ));
    (clock, service)
}
