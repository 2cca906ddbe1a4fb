//! The cluster view: the set of live nodes, the partition map, and the tend
//! loop that keeps both current (001 §2.3.1–2.3.3, 03-info §3).
//!
//! Every tend (default 1 s) asks each node `node`, `peers-generation`,
//! `partition-generation` (and `rebalance-generation` when rack-aware); a
//! changed peers generation re-reads `peers-clear-std`, a changed partition
//! generation re-reads `partition-generation` + `replicas`. New peers are
//! validated and added; unhealthy nodes are removed per
//! [`crate::node::removal_decision`]. When no node is left the seeds are tried
//! again on every tend.
//!
//! Invariant: readers see an immutable [`ClusterState`] snapshot behind an
//! `Arc`; the tend loop (the only writer, serialised by `tend_lock`) builds a
//! new snapshot and swaps it in, so commands never wait on a tend.

use crate::error::{Error, Result};
use crate::node::{removal_decision, validate, Node, Removal};
use crate::partition::{parse_replicas, PartitionMap};
use crate::peers::{parse_host, parse_peers};
use crate::ClientConfig;
use citrine_types::NodeId;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// An immutable snapshot of the cluster.
#[derive(Debug, Default)]
pub struct ClusterState {
    pub nodes: Vec<Arc<Node>>,
    pub by_id: HashMap<NodeId, Arc<Node>>,
    pub map: PartitionMap,
}

/// Counters the client exposes (all monotonic).
#[derive(Debug, Default)]
pub struct Counters {
    pub commands: AtomicU64,
    pub retries: AtomicU64,
    pub command_failures: AtomicU64,
    pub tends: AtomicU64,
    pub tend_failures: AtomicU64,
    pub nodes_added: AtomicU64,
    pub nodes_removed: AtomicU64,
    pub partition_refreshes: AtomicU64,
    pub peers_refreshes: AtomicU64,
}

/// Shared cluster object behind every `Client` clone.
#[derive(Debug)]
pub struct Cluster {
    pub(crate) config: ClientConfig,
    state: RwLock<Arc<ClusterState>>,
    tend_lock: tokio::sync::Mutex<()>,
    pub(crate) counters: Counters,
    pub(crate) closed: AtomicBool,
}

/// Resolves `host:port` to socket addresses.
pub(crate) async fn resolve(host: &str, port: u16) -> Result<Vec<SocketAddr>> {
    let target = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let addresses: Vec<SocketAddr> = tokio::net::lookup_host(&target)
        .await
        .map_err(|error| Error::Network {
            address: target.clone(),
            message: format!("resolve: {error}"),
            in_doubt: false,
        })?
        .collect();
    if addresses.is_empty() {
        return Err(Error::Network {
            address: target,
            message: "resolves to no address".into(),
            in_doubt: false,
        });
    }
    Ok(addresses)
}

impl Cluster {
    pub(crate) fn new(config: ClientConfig) -> Cluster {
        Cluster {
            config,
            state: RwLock::new(Arc::new(ClusterState::default())),
            tend_lock: tokio::sync::Mutex::new(()),
            counters: Counters::default(),
            closed: AtomicBool::new(false),
        }
    }

    /// The current snapshot.
    pub fn state(&self) -> Arc<ClusterState> {
        self.state.read().clone()
    }

    fn tend_deadline(&self) -> Option<Instant> {
        Some(Instant::now() + self.config.tend_timeout)
    }

    /// Validates one host (all its resolved addresses until one works).
    async fn add_host(&self, host: &(String, u16), expected: Option<NodeId>) -> Result<Node> {
        let mut last_error = None;
        for address in resolve(&host.0, host.1).await? {
            match validate(address, expected, self.config.tend_timeout).await {
                Ok(validated) => {
                    let node = Node::new(
                        validated.id,
                        address,
                        host.clone(),
                        validated.build,
                        self.config.max_connections_per_node,
                        self.config.idle_timeout,
                    );
                    node.pool.put_idle(validated.connection);
                    return Ok(node);
                }
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| Error::InvalidNode {
            address: SocketAddr::from(([0, 0, 0, 0], host.1)),
            reason: "no address".into(),
        }))
    }

    /// Tries every seed; returns the nodes validated and the reasons of failures.
    async fn seed(&self) -> (Vec<Node>, Vec<String>) {
        let mut nodes: Vec<Node> = Vec::new();
        let mut reasons = Vec::new();
        for seed in &self.config.seeds {
            let host = match parse_host(seed, 3000) {
                Ok(host) => host,
                Err(error) => {
                    reasons.push(format!("{seed}: {error}"));
                    continue;
                }
            };
            match self.add_host(&host, None).await {
                Ok(node) => {
                    if !nodes.iter().any(|known| known.id == node.id) {
                        nodes.push(node);
                    }
                }
                Err(error) => reasons.push(format!("{seed}: {error}")),
            }
        }
        (nodes, reasons)
    }

    /// One tend pass. Returns an error only when the cluster is empty and no
    /// seed could be validated.
    pub async fn tend(&self) -> Result<()> {
        let _guard = self.tend_lock.lock().await;
        self.counters.tends.fetch_add(1, Ordering::Relaxed);
        let current = self.state();
        let mut pass = TendPass {
            nodes: current.nodes.clone(),
            map: current.map.clone(),
            changed: false,
        };
        if pass.nodes.is_empty() {
            self.add_seeds(&mut pass).await?;
        }
        let identity_changed = self.refresh_all(&mut pass).await;
        self.add_peers(&mut pass).await;
        self.remove_unhealthy(&mut pass, &identity_changed);
        if pass.changed {
            let TendPass { nodes, map, .. } = pass;
            let by_id = nodes.iter().map(|node| (node.id, node.clone())).collect();
            *self.state.write() = Arc::new(ClusterState { nodes, by_id, map });
        }
        Ok(())
    }

    /// An empty cluster's nodes from its seeds; the error when no seed
    /// could be validated.
    async fn add_seeds(&self, pass: &mut TendPass) -> Result<()> {
        let (seeded, reasons) = self.seed().await;
        if seeded.is_empty() {
            self.counters.tend_failures.fetch_add(1, Ordering::Relaxed);
            return Err(Error::NoSeed {
                seeds: self.config.seeds.join(", "),
                reasons: reasons.join("; "),
            });
        }
        for node in seeded {
            tracing::info!(node = %node.id, address = %node.address, "node added from seed");
            self.counters.nodes_added.fetch_add(1, Ordering::Relaxed);
            pass.nodes.push(Arc::new(node));
        }
        pass.changed = true;
        Ok(())
    }

    /// Refreshes every node; returns the nodes that answered with another
    /// node's id.
    async fn refresh_all(&self, pass: &mut TendPass) -> Vec<NodeId> {
        let mut identity_changed: Vec<NodeId> = Vec::new();
        for node in &pass.nodes {
            match self.refresh_node(node, &mut pass.map).await {
                Ok(RefreshOutcome {
                    map_changed,
                    identity_ok,
                }) => {
                    pass.changed |= map_changed;
                    if !identity_ok {
                        identity_changed.push(node.id);
                    }
                }
                Err(error) => {
                    tracing::debug!(node = %node.id, %error, "tend failed");
                    self.counters.tend_failures.fetch_add(1, Ordering::Relaxed);
                    node.record_failure();
                    node.reachable.store(false, Ordering::Relaxed);
                    node.force_refresh.store(true, Ordering::Relaxed);
                }
            }
        }
        identity_changed
    }

    /// Adds the peers reachable nodes list that the cluster does not hold
    /// yet (each through the first of its hosts that validates).
    async fn add_peers(&self, pass: &mut TendPass) {
        let mut wanted: Vec<crate::peers::Peer> = Vec::new();
        for node in pass
            .nodes
            .iter()
            .filter(|node| node.reachable.load(Ordering::Relaxed))
        {
            for peer in node.peers.lock().iter() {
                if !pass.nodes.iter().any(|known| known.id == peer.node_id)
                    && !wanted.iter().any(|w| w.node_id == peer.node_id)
                {
                    wanted.push(peer.clone());
                }
            }
        }
        for peer in wanted {
            for host in &peer.hosts {
                match self.add_host(host, Some(peer.node_id)).await {
                    Ok(node) => {
                        self.add_peer(pass, Arc::new(node), peer.node_id).await;
                        break;
                    }
                    Err(error) => {
                        tracing::debug!(node = %peer.node_id, host = ?host, %error, "peer validation failed")
                    }
                }
            }
        }
    }

    /// Adds a validated peer once its first tend succeeds.
    async fn add_peer(&self, pass: &mut TendPass, node: Arc<Node>, peer: NodeId) {
        match self.refresh_node(&node, &mut pass.map).await {
            Ok(_) => {
                tracing::info!(node = %node.id, address = %node.address, "peer node added");
                self.counters.nodes_added.fetch_add(1, Ordering::Relaxed);
                pass.nodes.push(node);
                pass.changed = true;
            }
            Err(error) => {
                tracing::debug!(node = %peer, %error, "new peer failed its first tend")
            }
        }
    }

    /// Removes the unhealthy nodes, consulting the others first.
    fn remove_unhealthy(&self, pass: &mut TendPass, identity_changed: &[NodeId]) {
        let snapshot = pass.nodes.clone();
        let TendPass {
            nodes,
            map,
            changed,
        } = pass;
        nodes.retain(|node| {
            let listed = snapshot.iter().any(|other| {
                other.id != node.id
                    && other.reachable.load(Ordering::Relaxed)
                    && other.lists_peer(node.id)
            });
            let decision = removal_decision(
                node.failures(),
                self.config.max_node_failures,
                listed,
                identity_changed.contains(&node.id),
            );
            match decision {
                Removal::Keep => true,
                Removal::KeepListedByPeers => {
                    tracing::debug!(node = %node.id, "unreachable but still listed by peers: kept");
                    true
                }
                Removal::Remove => {
                    tracing::info!(node = %node.id, failures = node.failures(), "node removed");
                    self.counters.nodes_removed.fetch_add(1, Ordering::Relaxed);
                    map.remove_node(node.id);
                    node.pool.close();
                    *changed = true;
                    false
                }
            }
        });
    }

    async fn refresh_node(&self, node: &Node, map: &mut PartitionMap) -> Result<RefreshOutcome> {
        let rack_aware = self.config.rack_id.is_some();
        let mut commands = vec!["node", "peers-generation", "partition-generation"];
        if rack_aware {
            commands.push("rebalance-generation");
        }
        let answer = node.info(&commands, self.tend_deadline()).await?;
        let value = |name: &str| {
            answer
                .get(name)
                .map(|text| text.trim().to_owned())
                .unwrap_or_default()
        };
        let id_text = value("node");
        if id_text.parse::<NodeId>().ok() != Some(node.id) {
            return Ok(RefreshOutcome {
                map_changed: false,
                identity_ok: false,
            });
        }
        for name in &commands {
            if crate::conn::is_info_error(&value(name)) {
                return Err(Error::Info {
                    node: node.name(),
                    command: (*name).to_owned(),
                    code: 1,
                    message: value(name),
                });
            }
        }
        node.record_success();
        let was_unreachable = !node.reachable.swap(true, Ordering::Relaxed);
        let force = node.force_refresh.swap(false, Ordering::Relaxed) || was_unreachable;

        let peers_generation = value("peers-generation").parse::<i64>().unwrap_or(-2);
        if force || peers_generation != node.peers_generation.load(Ordering::Relaxed) {
            self.refresh_peers(node, peers_generation).await?;
        }
        let partition_generation = value("partition-generation").parse::<i64>().unwrap_or(-2);
        let map_changed =
            force || partition_generation != node.partition_generation.load(Ordering::Relaxed);
        if map_changed {
            self.refresh_partitions(node, map, partition_generation)
                .await?;
        }
        if rack_aware {
            let rebalance = value("rebalance-generation").parse::<i64>().unwrap_or(-2);
            if force || rebalance != node.rebalance_generation.load(Ordering::Relaxed) {
                self.refresh_racks(node, rebalance).await;
            }
        }
        Ok(RefreshOutcome {
            map_changed,
            identity_ok: true,
        })
    }

    /// Reads the node's peers (`peers-clear-std`), now at `generation`.
    async fn refresh_peers(&self, node: &Node, generation: i64) -> Result<()> {
        let answer = node
            .info(&["peers-clear-std"], self.tend_deadline())
            .await?;
        let text = answer.get("peers-clear-std").cloned().unwrap_or_default();
        match parse_peers(&text) {
            Ok(peers) => {
                *node.peers.lock() = peers.peers;
                node.peers_generation.store(generation, Ordering::Relaxed);
                self.counters
                    .peers_refreshes
                    .fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(error) => Err(unparsed_answer(node, "peers-clear-std", &error)),
        }
    }

    /// Reads the partitions the node holds (`replicas`) into `map`; the
    /// node's partition generation is the one answered with them, else
    /// `generation`.
    async fn refresh_partitions(
        &self,
        node: &Node,
        map: &mut PartitionMap,
        generation: i64,
    ) -> Result<()> {
        let answer = node
            .info(&["partition-generation", "replicas"], self.tend_deadline())
            .await?;
        let text = answer.get("replicas").cloned().unwrap_or_default();
        match parse_replicas(&text) {
            Ok(replicas) => {
                map.apply(node.id, &replicas);
                let generation = answer
                    .get("partition-generation")
                    .and_then(|text| text.trim().parse::<i64>().ok())
                    .unwrap_or(generation);
                node.partition_generation
                    .store(generation, Ordering::Relaxed);
                self.counters
                    .partition_refreshes
                    .fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(error) => Err(unparsed_answer(node, "replicas", &error)),
        }
    }

    /// Reads the node's racks (`rack-ids`), now at rebalance generation
    /// `generation`; a failed read keeps the racks known.
    async fn refresh_racks(&self, node: &Node, generation: i64) {
        node.rebalance_generation
            .store(generation, Ordering::Relaxed);
        if let Ok(answer) = node.info(&["rack-ids"], self.tend_deadline()).await {
            let text = answer.get("rack-ids").cloned().unwrap_or_default();
            *node.racks.lock() = parse_rack_ids(&text);
        }
    }
}

/// A node's info answer (`command`) that did not parse: the node is
/// refreshed in full at the next tend, and the error names the node.
fn unparsed_answer(node: &Node, command: &str, error: &dyn std::fmt::Display) -> Error {
    node.force_refresh.store(true, Ordering::Relaxed);
    Error::Protocol {
        address: node.address.to_string(),
        message: format!("{command}: {error}"),
    }
}

/// A tend pass's working copy of the cluster: its nodes and partition
/// map, and whether either changed (then it is published).
struct TendPass {
    nodes: Vec<Arc<Node>>,
    map: PartitionMap,
    changed: bool,
}

struct RefreshOutcome {
    map_changed: bool,
    identity_ok: bool,
}

/// Parses `rack-ids`: `<ns>:<rack>;<ns>:<rack>`. Error answers give an empty map.
pub fn parse_rack_ids(text: &str) -> HashMap<String, u32> {
    if crate::conn::is_info_error(text) {
        return HashMap::new();
    }
    text.split(';')
        .filter_map(|item| {
            let (namespace, rack) = item.split_once(':')?;
            Some((namespace.to_owned(), rack.trim().parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rack_ids() {
        let racks = parse_rack_ids("test:1;bar:2");
        assert_eq!(racks.get("test"), Some(&1));
        assert_eq!(racks.get("bar"), Some(&2));
        assert!(parse_rack_ids("ERROR:25:enterprise only").is_empty());
    }
}
