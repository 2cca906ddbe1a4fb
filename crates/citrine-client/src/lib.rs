//! Citrine's async smart client for the Aerospike client wire protocol.
//!
//! What it owns (2016 paper 001 §2.3, Citrusleaf 003 §2.2): from one or more
//! seed hosts it discovers every node through the peers info commands, keeps
//! the partition map in memory and refreshes it whenever a node's
//! partition-generation changes (tend loop, 1 s), and sends each
//! single-record command in one hop to the node owning the key's partition.
//! Per-node connection pools, socket and total timeouts, retries with
//! backoff, per-node failure counts and cluster consultation make failures
//! mostly invisible to the application.
//!
//! It works against any server speaking the protocol (`shared/protocol/`).
//!
//! ```no_run
//! # async fn demo() -> citrine_client::Result<()> {
//! use citrine_client::{Bin, Bins, Client, ClientConfig, Key, ReadPolicy, WritePolicy};
//! let client = Client::connect(ClientConfig::new(["127.0.0.1:3000"])).await?;
//! let key = Key::new("test", "demo", "key1");
//! client.put(&WritePolicy::default(), &key, &[Bin::new("a", 1i64)]).await?;
//! let record = client.get(&ReadPolicy::default(), &key, Bins::All).await?;
//! # Ok(()) }
//! ```
//!
//! Module map: [`error`] typed errors; [`value`] bin values; [`policy`]
//! policies; [`command`] keys, ops and wire encoding; [`peers`] and
//! [`partition`] info-answer parsers; [`conn`] connections and pools;
//! [`node`] node health; [`cluster`] tend loop; [`client`] the API and
//! single-record commands; [`cdt`] list and map operations; [`msgpack`]
//! list and map values; [`batch`] batch commands; [`query`] scans,
//! queries, background jobs and index management; [`udf`] Lua modules
//! and UDF calls on one record, a batch, or (background, aggregation)
//! a scan or query.

#![forbid(unsafe_code)]

pub mod admin;
pub mod batch;
pub mod cdt;
pub mod client;
pub mod cluster;
pub mod command;
pub mod conn;
pub mod error;
pub mod msgpack;
pub mod node;
pub mod partition;
pub mod peers;
pub mod policy;
pub mod query;
pub mod udf;
pub mod value;
pub mod xdr;

pub use batch::{BatchPolicy, BatchWrite};
pub use citrine_types::{NodeId, ResultCode};
pub use citrine_wire::digest::UserKey;
pub use client::{Client, ClientStats, NodeSummary};
pub use command::{Bins, IntoUserKey, Key, Operation, Record};
pub use error::{Error, Result, UdfModuleError};
pub use msgpack::Element;
pub use policy::{
    Expiration, GenerationPolicy, Policy, ReadModeSc, ReadPolicy, RecordExistsAction, Replica,
    WritePolicy,
};
pub use query::{
    BackgroundTask, FilterValue, IndexCollection, IndexFilter, IndexType, JobStatus, KeyRecord,
    PartitionFilter, RecordStream, ScanPolicy, Statement,
};
pub use udf::{udf_hash, AggregateOutput, BatchUdfResult, UdfModule};
pub use value::{Bin, Value};

use std::time::Duration;

/// How to reach and manage the cluster.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Seed hosts: `host`, `host:port`, `[v6]:port` (port 3000 when omitted).
    pub seeds: Vec<String>,
    /// Period of the tend loop.
    pub tend_interval: Duration,
    /// Deadline of each info exchange of the tend loop and of node validation.
    pub tend_timeout: Duration,
    /// Connections per node (idle plus in use).
    pub max_connections_per_node: usize,
    /// Idle connections older than this are closed instead of reused.
    pub idle_timeout: Duration,
    /// Consecutive failures after which a node may be dropped (if no peer lists it).
    pub max_node_failures: u32,
    /// The client's rack, for [`Replica::PreferRack`]; enables `rack-ids` polling.
    pub rack_id: Option<u32>,
}

impl ClientConfig {
    /// A configuration with default settings and these seeds.
    pub fn new<S: Into<String>>(seeds: impl IntoIterator<Item = S>) -> ClientConfig {
        ClientConfig {
            seeds: seeds.into_iter().map(Into::into).collect(),
            ..ClientConfig::default()
        }
    }
}

impl Default for ClientConfig {
    fn default() -> ClientConfig {
        ClientConfig {
            seeds: vec!["127.0.0.1:3000".into()],
            tend_interval: Duration::from_secs(1),
            tend_timeout: Duration::from_secs(1),
            max_connections_per_node: 256,
            idle_timeout: Duration::from_secs(55),
            max_node_failures: 5,
            rack_id: None,
        }
    }
}

/// Runs info commands on the server at `host` (`host`, `host:port`,
/// `[v6]:port`; port 3000 when omitted) over a fresh connection, without
/// cluster discovery — what `asinfo` does. Returns (command, value) pairs in
/// answer order. An empty `commands` asks for the server's summary.
pub async fn info_at(
    host: &str,
    commands: &[&str],
    timeout: Duration,
) -> Result<Vec<(String, String)>> {
    info_at_as(host, commands, timeout, None).await
}

/// [`info_at`] on a connection first logged in with `credentials` (a
/// node with security on answers nothing else).
pub async fn info_at_as(
    host: &str,
    commands: &[&str],
    timeout: Duration,
    credentials: Option<&admin::Credentials>,
) -> Result<Vec<(String, String)>> {
    let mut connection = connect_at(host, timeout).await?;
    let deadline = Some(std::time::Instant::now() + timeout);
    if let Some(credentials) = credentials {
        connection.login(credentials, deadline).await?;
    }
    connection.info(commands, deadline).await
}

/// One connection to `host` (the first of its addresses that answers).
pub async fn connect_at(host: &str, timeout: Duration) -> Result<conn::Connection> {
    let (name, port) = peers::parse_host(host, 3000).map_err(Error::InvalidArgument)?;
    let mut last_error = None;
    for address in cluster::resolve(&name, port).await? {
        let deadline = Some(std::time::Instant::now() + timeout);
        match conn::Connection::connect(address, deadline).await {
            Ok(connection) => return Ok(connection),
            Err(error) => last_error = Some(error),
        }
    }
    Err(last_error
        .unwrap_or_else(|| Error::InvalidArgument(format!("{host} resolves to no address"))))
}
