//! Validated configuration the service runs with. Parsing (TOML, flags) is
//! the server binary's job; these structs only hold values already checked.
//! A namespace's settings are the data layer's ([`citrine_data::config`],
//! re-exported here); the node's are [`ServiceConfig`].

pub use citrine_data::config::*;

/// Node-wide settings the service needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceConfig {
    pub node_id: u64,
    /// The rack this node joins its views with; what it reports (`rack-ids`,
    /// `racks:`) before its first view.
    pub rack_id: u32,
    pub cluster_name: String,
    /// Address clients reach this node at (for `service-clear-std`), `host:port`.
    pub access_address: String,
    pub port: u16,
    /// Where TLS clients reach this node (`service-tls-std`), `host:port`;
    /// empty when the node has no TLS service port.
    pub tls_access_address: String,
    pub namespaces: Vec<NamespaceConfig>,
}

impl ServiceConfig {
    /// Node `node_id` of cluster `citrine` in rack 0, reached at
    /// 127.0.0.1:3000, serving `namespaces`: the settings of a node that
    /// tests, examples and simulations build without a server around it.
    pub fn local(node_id: u64, namespaces: Vec<NamespaceConfig>) -> ServiceConfig {
        ServiceConfig {
            node_id,
            rack_id: 0,
            cluster_name: "citrine".into(),
            access_address: "127.0.0.1:3000".into(),
            port: 3000,
            tls_access_address: String::new(),
            namespaces,
        }
    }
}
