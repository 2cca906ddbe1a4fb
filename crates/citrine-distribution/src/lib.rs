//! The distribution layer (paper 001 §2): where a request runs (routing,
//! proxying, acting masters), replication, duplicate resolution, partition
//! versions, the exchange and migrations, and the metadata the members
//! share — over the data layer ([`citrine_data::Data`]) and the
//! [`replication::Fabric`] the server (or the simulator) installs.
//!
//! Modules: [`cluster_state`] (the view and partition maps a node
//! serves), [`replication`] (routing decisions, proxying, synchronous
//! replica writes, duplicate resolution, the fabric calls it serves),
//! [`migration`] (partition versions, the exchange, migration plans,
//! batches, manifests, drops, and its [`migration::driver`]), [`smd`]
//! (versions, files and pushes of shared metadata), [`truncations`] (the
//! truncation thresholds the members share), and [`Distribution`], the
//! handle that holds a node's view of the cluster.
//!
//! Invariants: the decisions are pure functions of the view, the
//! migration state, the request and the time passed in; the I/O is the
//! injected fabric's and the pauses the injected [`migration::driver::Pause`]'s, so
//! the simulator runs this code over its fake network and clock and a
//! seed replays exactly; no lock is held across an await; the crate spawns
//! no thread, never sleeps and reads no system clock (clippy's
//! `disallowed-methods`, see `clippy.toml`); it depends on the data layer,
//! never on the features above it (they reach it through [`LocalExecutor`]
//! when a proxied or resolved request must run here).

#![forbid(unsafe_code)]
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod cluster_state;
pub mod migration;
pub mod replication;
pub mod sc;
pub mod smd;
pub mod truncations;
mod view;

use citrine_data::{Clock, Data, Namespace, Now};
use citrine_types::NodeId;
use cluster_state::ClusterState;
use parking_lot::RwLock;
use replication::{Fabric, Hop, Remote};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, OnceLock};

/// Runs a single-record request on this node: what the layer above
/// provides so a request forwarded here, or one whose duplicate resolution
/// just ended, can run (record UDFs included) without this layer knowing
/// the features.
pub trait LocalExecutor: Sync {
    /// Runs a single-record request body (client or proxied) and writes its
    /// reply; returns the fabric work still to do.
    fn execute_single(&self, body: &[u8], hop: Hop, out: &mut Vec<u8>) -> Option<Box<Remote>>;

    /// The same after the request's duplicate resolution (no second
    /// resolution).
    fn execute_resolved(&self, body: &[u8], hop: Hop, out: &mut Vec<u8>) -> Option<Box<Remote>>;
}

/// What the distribution layer counts (the node's statistics include them).
#[derive(Debug, Default)]
pub struct DistributionStats {
    /// Requests forwarded to their partition's master.
    pub proxied_out: AtomicU64,
    /// Forwarded requests executed here.
    pub proxied_in: AtomicU64,
    /// Reads served by this node as a replica (client replica policy).
    pub replica_reads: AtomicU64,
    /// Replica writes sent again after a failed or unanswered attempt.
    pub replica_write_retries: AtomicU64,
    /// Requests refused (11) because the cluster runtime had not run for
    /// longer than the heartbeat timeout (see [`Distribution::cluster_ticked`]).
    pub stall_refusals: AtomicU64,
    /// Requests refused (9) because their deadline had passed, or nearly,
    /// when they reached the master (a forwarded request held up on its
    /// way, or at a stalled node), when their duplicate resolution ended,
    /// or when a stalled service thread read them after their client's
    /// timeout had run out.
    pub expired_refusals: AtomicU64,
    /// Replica writes refused (11) because this node neither is a replica
    /// of the record's partition nor holds a copy of it any more (a write
    /// that arrived after the migration that ended its part).
    pub replica_writes_refused_not_holder: AtomicU64,
    /// Copies of records refused as malformed input from another node: a
    /// replica write, a migration batch (the whole batch) or a
    /// duplicate-resolution answer that does not decode, names another
    /// namespace, partition or record than it belongs to, or fails
    /// [`citrine_data::copy::ReplicaWrite::check`]. Nothing of it is stored.
    pub peer_messages_malformed: AtomicU64,
    /// Requests refused because they had been forwarded
    /// [`replication::MAX_PROXY_HOPS`] times without reaching a node that
    /// runs them (the nodes' views or claims disagreed meanwhile).
    pub proxy_hops_exceeded: AtomicU64,
    /// Records whose state was sent again to replicas that had not
    /// acknowledged a write, until all did.
    pub reconciles_done: AtomicU64,
    /// Records given up on (not acknowledged in time, or the queue full).
    pub reconciles_dropped: AtomicU64,
}

/// Runs work that may take long (the removal of the records a merged
/// truncation covers) where the node decides: on a thread of the server's,
/// or inline (tests, the simulator).
pub type BackgroundRunner = Box<dyn Fn(Box<dyn FnOnce() + Send>) + Send + Sync>;

/// One node's view of the cluster and everything it does with the other
/// members.
pub struct Distribution {
    pub node_id: NodeId,
    data: Arc<Data>,
    /// The current cluster view and partition maps, replaced on view changes.
    cluster: RwLock<Arc<ClusterState>>,
    /// True while the published view has other members.
    clustered: AtomicBool,
    /// How this node reaches the others (installed by the server).
    fabric: OnceLock<Arc<dyn Fabric>>,
    /// Migration plan and counters (see [`migration`]).
    pub migrations: migration::Migrations,
    /// Started to join a cluster and not serving yet: it claims no
    /// partition and answers 11 to data requests (see
    /// [`Distribution::set_orphan`]).
    orphan: AtomicBool,
    /// Unix ms of the cluster runtime's last tick (0: the runtime does not
    /// report its ticks), and how long without one means it stalled (see
    /// [`Distribution::cluster_ticked`]).
    cluster_tick_ms: AtomicU64,
    cluster_stall_ms: AtomicU64,
    /// The view's clock skew as the cluster runtime last measured it (ms).
    cluster_clock_skew_ms: AtomicU64,
    /// Set with `orphan`: for a node holding records, the orphan ends only
    /// once a view with other members has had its exchange resolved, or a
    /// view of this node alone is published (see [`Distribution::set_orphan`]).
    joining: AtomicBool,
    /// The migration plan epoch when the node last became an orphan: only
    /// the exchange of a view published after it ends the orphan state.
    orphaned_at: AtomicU64,
    /// Truncation thresholds the cluster shares (see [`truncations`]).
    pub truncations: truncations::Truncations,
    /// Strong-consistency rosters the cluster shares (see [`sc::store`]).
    pub rosters: sc::store::Rosters,
    /// This node's strong-consistency partition versions (see
    /// [`sc::partitions`]).
    pub sc_partitions: sc::partitions::ScPartitions,
    /// Records to send to their replicas again (see
    /// [`Distribution::reconcile_pending`]).
    pub reconciles: replication::Reconciles,
    /// Strong consistency: records written here whose replication is not
    /// known complete (see [`sc::data_path`]).
    pub sc_unreplicated: sc::data_path::Unreplicated,
    pub stats: DistributionStats,
    /// Where long work goes (see [`BackgroundRunner`]); inline without one.
    background: OnceLock<BackgroundRunner>,
}

impl Distribution {
    /// A node alone in a view of itself, over `data`.
    pub fn new(
        node_id: NodeId,
        rack_id: u32,
        access_address: String,
        data: Arc<Data>,
        namespace_factors: &[(String, usize)],
    ) -> Distribution {
        let started_unix_ms = data.started_unix_ms();
        let cluster = ClusterState::single(node_id, rack_id, access_address, namespace_factors);
        Distribution {
            node_id,
            cluster: RwLock::new(Arc::new(cluster)),
            clustered: AtomicBool::new(false),
            fabric: OnceLock::new(),
            migrations: migration::Migrations::new(
                namespace_factors.iter().map(|(name, _)| name.as_str()),
                node_id.0.rotate_left(29) ^ started_unix_ms,
            ),
            orphan: AtomicBool::new(false),
            cluster_tick_ms: AtomicU64::new(0),
            cluster_stall_ms: AtomicU64::new(0),
            cluster_clock_skew_ms: AtomicU64::new(0),
            joining: AtomicBool::new(false),
            orphaned_at: AtomicU64::new(0),
            truncations: truncations::Truncations::default(),
            rosters: sc::store::Rosters::default(),
            sc_partitions: sc::partitions::ScPartitions::default(),
            reconciles: replication::Reconciles::default(),
            sc_unreplicated: sc::data_path::Unreplicated::default(),
            stats: DistributionStats::default(),
            background: OnceLock::new(),
            data,
        }
    }

    /// The data layer under this one.
    pub fn data(&self) -> &Arc<Data> {
        &self.data
    }

    /// The namespace called `name`.
    #[inline]
    pub fn namespace(&self, name: &[u8]) -> Option<&Namespace> {
        self.data.namespace(name)
    }

    /// The namespace called `name`, shared (for work that outlives the
    /// call: a removal run in the background).
    pub fn namespace_shared(&self, name: &[u8]) -> Option<Arc<Namespace>> {
        self.data.namespace_shared(name)
    }

    /// All namespaces, in configuration order.
    pub fn namespaces(&self) -> impl Iterator<Item = &Namespace> {
        self.data.namespaces()
    }

    /// The current time.
    #[inline]
    pub fn now(&self) -> Now {
        self.data.now()
    }

    /// The clock.
    pub fn clock(&self) -> &dyn Clock {
        self.data.clock()
    }

    /// The current cluster state.
    pub fn cluster(&self) -> Arc<ClusterState> {
        self.cluster.read().clone()
    }

    /// Has long work run by `runner` (the server: a thread of its own)
    /// instead of inline.
    pub fn set_background_runner(&self, runner: BackgroundRunner) {
        let _ = self.background.set(runner);
    }

    /// Runs `work` where the node decided ([`BackgroundRunner`]), inline
    /// without a runner.
    pub fn run_in_background(&self, work: Box<dyn FnOnce() + Send>) {
        match self.background.get() {
            Some(runner) => runner(work),
            None => work(),
        }
    }
}
