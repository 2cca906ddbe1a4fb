//! The cluster as the service sees it: the current view (cluster key and
//! members), the partition map of every namespace computed from it, and the
//! generations the clients poll to notice changes.
//!
//! The cluster runtime (in the server) publishes a new [`ClusterState`]
//! whenever a view is committed; info answers read the current one. The
//! answers for this node (`replicas` bitmaps) are computed once per view, not
//! per request.
//!
//! Invariants:
//! - `members` is sorted by node id, without duplicates, and contains this node;
//! - `partition_generation` and `peers_generation` only grow while the process lives;
//! - every node of one view computes the same partition maps (the map is a
//!   pure function of the members and the namespace's replication factor,
//!   or, under `prefer-minimal-migration`, the one map the view's
//!   principal decided).

use base64::Engine as _;
use citrine_cluster::partition_map::{NodeEntry, PartitionMap, PartitionMapConfig};
use citrine_types::{NodeId, PartitionId, PARTITIONS};

/// One member of the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterMember {
    pub node_id: NodeId,
    pub rack_id: u32,
    /// Where clients reach it, `host:port` (empty when unknown yet).
    pub service_address: String,
    /// Where TLS clients reach it, and the name its certificate carries
    /// (`None`: no TLS service port).
    pub tls: Option<TlsEndpoint>,
}

/// A member's TLS service port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsEndpoint {
    /// `host:port`.
    pub address: String,
    /// The TLS name clients check the certificate for.
    pub name: String,
}

/// The partition map of one namespace and this node's share of it.
#[derive(Debug)]
pub struct NamespaceMap {
    pub name: String,
    pub map: PartitionMap,
    /// Base64 bitmaps, one per column, of the partitions this node holds.
    pub column_bitmaps: Vec<String>,
    /// Number of partitions this node holds per column.
    pub column_counts: Vec<usize>,
    /// For a strong-consistency namespace, the SC partition map of the
    /// view once its exchange is decided (availability, regime and working
    /// replicas; see [`crate::sc::partitions`]); unset before, when every
    /// partition is unavailable. Never set for an AP namespace.
    pub sc: std::sync::OnceLock<crate::sc::partitions::ScMap>,
}

/// A published cluster state.
#[derive(Debug)]
pub struct ClusterState {
    pub self_id: NodeId,
    pub cluster_key: u64,
    pub members: Vec<ClusterMember>,
    pub partition_generation: u64,
    pub peers_generation: u64,
    pub namespaces: Vec<NamespaceMap>,
}

/// Encodes a 4096-bit partition bitmap as the clients expect (684 base64 characters).
pub fn bitmap_base64(owned: impl Iterator<Item = PartitionId>) -> String {
    let mut bitmap = [0u8; PARTITIONS / 8];
    for partition in owned {
        let index = partition.index();
        bitmap[index >> 3] |= 0x80 >> (index & 7);
    }
    base64::engine::general_purpose::STANDARD.encode(bitmap)
}

impl ClusterState {
    /// Builds the state of a view. `namespaces` are (name, replication factor).
    pub fn new(
        self_id: NodeId,
        cluster_key: u64,
        members: Vec<ClusterMember>,
        namespaces: &[(String, usize)],
        partition_generation: u64,
        peers_generation: u64,
    ) -> ClusterState {
        let generations = (partition_generation, peers_generation);
        ClusterState::with_maps(
            self_id,
            cluster_key,
            members,
            namespaces,
            Vec::new(),
            generations,
        )
    }

    /// Builds the state of a view whose namespaces listed in `maps` use
    /// that map (the stable placement the view's principal decided, see
    /// `citrine_cluster::partition_map::agreement`); the others compute the
    /// paper's map. `generations`: (partition, peers).
    pub fn with_maps(
        self_id: NodeId,
        cluster_key: u64,
        mut members: Vec<ClusterMember>,
        namespaces: &[(String, usize)],
        mut maps: Vec<(String, PartitionMap)>,
        (partition_generation, peers_generation): (u64, u64),
    ) -> ClusterState {
        members.sort_by_key(|member| member.node_id);
        members.dedup_by_key(|member| member.node_id);
        assert!(
            members.iter().any(|member| member.node_id == self_id),
            "a node is always a member of its own cluster state"
        );
        let entries: Vec<NodeEntry> = members
            .iter()
            .map(|member| NodeEntry {
                id: member.node_id,
                rack_id: member.rack_id,
            })
            .collect();
        let namespaces = namespaces
            .iter()
            .map(|(name, replication_factor)| {
                let decided = maps.iter().position(|(decided, _)| decided == name);
                let map = match decided {
                    Some(index) => maps.swap_remove(index).1,
                    None => {
                        let config = PartitionMapConfig {
                            replication_factor: *replication_factor,
                            uniform_balance: true,
                        };
                        PartitionMap::compute(&entries, &config)
                    }
                };
                let columns = map.replication_factor();
                let mut owned: Vec<Vec<PartitionId>> = vec![Vec::new(); columns];
                for (partition, column) in map.columns_of(self_id) {
                    if let Some(list) = owned.get_mut(column) {
                        list.push(partition);
                    }
                }
                let column_counts = owned.iter().map(Vec::len).collect();
                let column_bitmaps = owned
                    .into_iter()
                    .map(|list| bitmap_base64(list.into_iter()))
                    .collect();
                NamespaceMap {
                    name: name.clone(),
                    map,
                    column_bitmaps,
                    column_counts,
                    sc: std::sync::OnceLock::new(),
                }
            })
            .collect();
        ClusterState {
            self_id,
            cluster_key,
            members,
            partition_generation,
            peers_generation,
            namespaces,
        }
    }

    /// The state of a node alone, in its rack: it masters every partition.
    pub fn single(
        self_id: NodeId,
        rack_id: u32,
        service_address: String,
        namespaces: &[(String, usize)],
    ) -> ClusterState {
        let cluster_key = self_id.0.rotate_left(17) ^ 0x5A5A_C17A_1CE5_0001;
        let member = ClusterMember {
            node_id: self_id,
            rack_id,
            service_address,
            tls: None,
        };
        ClusterState::new(self_id, cluster_key.max(1), vec![member], namespaces, 1, 1)
    }

    /// Number of members.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// The principal: the highest node id.
    pub fn principal(&self) -> NodeId {
        self.members
            .last()
            .map_or(self.self_id, |member| member.node_id)
    }

    /// The other members.
    pub fn peers(&self) -> impl Iterator<Item = &ClusterMember> {
        self.members
            .iter()
            .filter(move |member| member.node_id != self.self_id)
    }

    /// The map of namespace `name`.
    pub fn namespace(&self, name: &str) -> Option<&NamespaceMap> {
        self.namespaces
            .iter()
            .find(|namespace| namespace.name == name)
    }

    /// `peers-clear-std` value: `<gen>,3000,[[id,,[addr]],...]` for the other
    /// members; an address on port 3000 is printed without the port.
    pub fn peers_value(&self) -> String {
        let peers: Vec<String> = self
            .peers()
            .filter(|member| !member.service_address.is_empty())
            .map(|member| {
                let address = member
                    .service_address
                    .strip_suffix(":3000")
                    .unwrap_or(&member.service_address);
                format!("[{},,[{}]]", member.node_id, address)
            })
            .collect();
        format!("{},3000,[{}]", self.peers_generation, peers.join(","))
    }

    /// `peers-tls-std` value: the other members with a TLS service port,
    /// each with its TLS name; `default_port` is this node's TLS port (an
    /// address on it is listed without the port, as the clear list omits
    /// 3000).
    pub fn peers_tls_value(&self, default_port: u16) -> String {
        let suffix = format!(":{default_port}");
        let peers: Vec<String> = self
            .peers()
            .filter_map(|member| {
                let tls = member.tls.as_ref()?;
                let address = tls.address.strip_suffix(&suffix).unwrap_or(&tls.address);
                Some(format!("[{},{},[{}]]", member.node_id, tls.name, address))
            })
            .collect();
        format!(
            "{},{default_port},[{}]",
            self.peers_generation,
            peers.join(",")
        )
    }

    /// `services` value: the other members' `host:port`, `;`-separated.
    pub fn services_value(&self) -> String {
        self.peers()
            .filter(|member| !member.service_address.is_empty())
            .map(|member| member.service_address.clone())
            .collect::<Vec<_>>()
            .join(";")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u64, port: u16) -> ClusterMember {
        ClusterMember {
            node_id: NodeId(id),
            rack_id: 0,
            service_address: format!("127.0.0.1:{port}"),
            tls: None,
        }
    }

    #[test]
    fn tls_peers_list_the_members_with_a_tls_port() {
        let mut a = member(1, 3000);
        let mut b = member(2, 3100);
        let c = member(3, 3200);
        a.tls = Some(TlsEndpoint {
            address: "127.0.0.1:4333".into(),
            name: "node-a".into(),
        });
        b.tls = Some(TlsEndpoint {
            address: "127.0.0.1:4433".into(),
            name: "node-b".into(),
        });
        let state = ClusterState::new(NodeId(3), 9, vec![a, b, c], &[], 5, 7);
        // This node (3) has no TLS port of its own: its default is 4333.
        assert_eq!(
            state.peers_tls_value(4333),
            "7,4333,[[1,node-a,[127.0.0.1]],[2,node-b,[127.0.0.1:4433]]]"
        );
        assert_eq!(
            state.peers_value(),
            "7,3000,[[1,,[127.0.0.1]],[2,,[127.0.0.1:3100]]]"
        );
    }

    #[test]
    fn single_node_owns_everything() {
        let state =
            ClusterState::single(NodeId(7), 0, "127.0.0.1:3000".into(), &[("test".into(), 2)]);
        let namespace = state.namespace("test").expect("namespace");
        assert_eq!(namespace.column_bitmaps.len(), 1);
        assert_eq!(namespace.column_counts, vec![PARTITIONS]);
        assert_eq!(namespace.column_bitmaps[0].len(), 684);
        assert!(namespace.column_bitmaps[0].ends_with("8="));
        assert_eq!(state.peers_value(), "1,3000,[]");
    }

    #[test]
    fn three_nodes_split_the_columns() {
        let members = vec![member(1, 3000), member(2, 3100), member(3, 3200)];
        let namespaces = [("test".to_owned(), 2)];
        let states: Vec<ClusterState> = (1..=3)
            .map(|id| ClusterState::new(NodeId(id), 99, members.clone(), &namespaces, 5, 5))
            .collect();
        for column in 0..2 {
            let total: usize = states
                .iter()
                .map(|state| state.namespaces[0].column_counts[column])
                .sum();
            assert_eq!(
                total, PARTITIONS,
                "column {column} covers every partition once"
            );
        }
        assert_eq!(
            states[1].peers_value(),
            "5,3000,[[1,,[127.0.0.1]],[3,,[127.0.0.1:3200]]]"
        );
        assert_eq!(states[0].services_value(), "127.0.0.1:3100;127.0.0.1:3200");
        assert_eq!(
            states[0].namespaces[0].map.fingerprint(),
            states[2].namespaces[0].map.fingerprint()
        );
    }
}
