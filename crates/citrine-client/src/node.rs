//! One cluster node as the client sees it: identity, address, connection
//! pool, the generations last seen by the tend loop, its peers list, and its
//! health (failure count).
//!
//! Health follows the 2016 paper (001 §2.3.3): every failed command or tend
//! adds one to the node's failure count, every success resets it to zero,
//! and the node becomes a removal candidate only once the count reaches the
//! threshold; even then it is kept while any other reachable node still lists
//! it among its peers (cluster consultation, [`removal_decision`]).

use crate::conn::{Connection, Pool};
use crate::error::{Error, Result};
use crate::peers::Peer;
use citrine_types::NodeId;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// A node of the cluster.
#[derive(Debug)]
pub struct Node {
    pub id: NodeId,
    pub address: SocketAddr,
    /// Host and port as listed by the seed list or a peer.
    pub host: (String, u16),
    pub build: String,
    pub(crate) pool: Pool,
    failures: AtomicU32,
    /// The last tend of this node succeeded.
    pub(crate) reachable: AtomicBool,
    /// The node must re-fetch peers and partitions on its next good tend
    /// (after a failure the server may have restarted with equal generations).
    pub(crate) force_refresh: AtomicBool,
    pub(crate) partition_generation: AtomicI64,
    pub(crate) peers_generation: AtomicI64,
    pub(crate) rebalance_generation: AtomicI64,
    pub(crate) peers: Mutex<Vec<Peer>>,
    pub(crate) racks: Mutex<HashMap<String, u32>>,
}

/// What the tend loop decides about a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removal {
    Keep,
    /// Failure threshold reached but another node still lists it (001 §2.3.3.2).
    KeepListedByPeers,
    Remove,
}

/// The removal rule: remove a node whose identity changed, or whose failure
/// count reached `threshold` while no other reachable node lists it.
pub fn removal_decision(
    failures: u32,
    threshold: u32,
    listed_by_others: bool,
    identity_changed: bool,
) -> Removal {
    if identity_changed {
        Removal::Remove
    } else if failures < threshold {
        Removal::Keep
    } else if listed_by_others {
        Removal::KeepListedByPeers
    } else {
        Removal::Remove
    }
}

impl Node {
    pub(crate) fn new(
        id: NodeId,
        address: SocketAddr,
        host: (String, u16),
        build: String,
        pool_limit: usize,
        idle_timeout: Duration,
    ) -> Node {
        Node {
            id,
            address,
            host,
            build,
            pool: Pool::new(address, pool_limit, idle_timeout),
            failures: AtomicU32::new(0),
            reachable: AtomicBool::new(true),
            force_refresh: AtomicBool::new(true),
            partition_generation: AtomicI64::new(-1),
            peers_generation: AtomicI64::new(-1),
            rebalance_generation: AtomicI64::new(-1),
            peers: Mutex::new(Vec::new()),
            racks: Mutex::new(HashMap::new()),
        }
    }

    /// Node id as the `node` info command prints it.
    pub fn name(&self) -> String {
        self.id.to_string()
    }

    /// Current failure count.
    pub fn failures(&self) -> u32 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Records a failed command or tend; returns the new count.
    pub fn record_failure(&self) -> u32 {
        self.failures
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1)
    }

    /// Records a success: the failure count goes back to zero.
    pub fn record_success(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
    }

    /// Whether this node lists `other` among its peers.
    pub fn lists_peer(&self, other: NodeId) -> bool {
        self.peers.lock().iter().any(|peer| peer.node_id == other)
    }

    /// Rack of this node for `namespace`, if known.
    pub fn rack(&self, namespace: &str) -> Option<u32> {
        self.racks.lock().get(namespace).copied()
    }

    /// Runs info commands on a pooled connection.
    pub async fn info(
        &self,
        commands: &[&str],
        deadline: Option<Instant>,
    ) -> Result<HashMap<String, String>> {
        let mut pooled = self.pool.get(deadline).await?;
        let result = match pooled.connection() {
            Some(connection) => connection.info(commands, deadline).await,
            None => Err(Error::Closed),
        };
        match result {
            Ok(pairs) => {
                pooled.release();
                Ok(pairs.into_iter().collect())
            }
            // An ERROR answer was read whole: the connection is clean.
            Err(error @ Error::Info { .. }) => {
                pooled.release();
                Err(error)
            }
            Err(error) => {
                pooled.discard();
                if matches!(error, Error::Network { .. }) {
                    self.pool.clear_idle();
                }
                Err(error)
            }
        }
    }
}

/// Result of validating an address: the node's identity plus the
/// connection used, ready to become the first pooled connection.
pub(crate) struct Validated {
    pub id: NodeId,
    pub build: String,
    pub connection: Connection,
}

/// Connects to `address` and checks that it is a usable node: `node` is a
/// hex id (equal to `expected` when given), `partition-generation` is not -1,
/// `build` has at least three numeric parts.
pub(crate) async fn validate(
    address: SocketAddr,
    expected: Option<NodeId>,
    timeout: Duration,
) -> Result<Validated> {
    let deadline = Some(Instant::now() + timeout);
    let mut connection = Connection::connect(address, deadline).await?;
    let answer: HashMap<String, String> = connection
        .info(&["node", "partition-generation", "build"], deadline)
        .await?
        .into_iter()
        .collect();
    let invalid = |reason: String| Error::InvalidNode { address, reason };
    let node_text = answer
        .get("node")
        .map(|text| text.trim())
        .unwrap_or_default();
    if node_text.is_empty() {
        return Err(invalid("empty `node` answer".into()));
    }
    let id = node_text
        .parse::<NodeId>()
        .map_err(|e| invalid(format!("`node` answered {node_text:?}: {e}")))?;
    if let Some(expected) = expected {
        if expected != id {
            return Err(invalid(format!(
                "peers list it as {expected} but it answers {id}"
            )));
        }
    }
    let generation = answer
        .get("partition-generation")
        .map(|text| text.trim())
        .unwrap_or_default();
    match generation.parse::<i64>() {
        Ok(-1) => {
            return Err(invalid(
                "partition-generation is -1 (node not ready)".into(),
            ))
        }
        Ok(_) => {}
        Err(e) => return Err(invalid(format!("partition-generation {generation:?}: {e}"))),
    }
    let build = answer
        .get("build")
        .map(|text| text.trim().to_owned())
        .unwrap_or_default();
    let numeric_parts = build
        .split('.')
        .take_while(|part| part.parse::<u32>().is_ok())
        .count();
    if numeric_parts < 3 {
        return Err(invalid(format!(
            "build {build:?} is not a version like 8.1.2.0"
        )));
    }
    Ok(Validated {
        id,
        build,
        connection,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_count_resets_on_success() {
        let address: SocketAddr = "127.0.0.1:1".parse().expect("address");
        let node = Node::new(
            NodeId(1),
            address,
            ("127.0.0.1".into(), 1),
            "8.1.2.0".into(),
            4,
            Duration::from_secs(1),
        );
        assert_eq!(node.record_failure(), 1);
        assert_eq!(node.record_failure(), 2);
        node.record_success();
        assert_eq!(node.failures(), 0);
        assert_eq!(node.record_failure(), 1);
    }

    #[test]
    fn removal_rule() {
        assert_eq!(removal_decision(0, 5, false, false), Removal::Keep);
        assert_eq!(removal_decision(4, 5, false, false), Removal::Keep);
        assert_eq!(removal_decision(5, 5, false, false), Removal::Remove);
        assert_eq!(
            removal_decision(9, 5, true, false),
            Removal::KeepListedByPeers
        );
        assert_eq!(removal_decision(0, 5, true, true), Removal::Remove);
    }
}
