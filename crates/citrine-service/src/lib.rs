//! The transaction service: everything a node does with one request.
//!
//! [`Service::handle`] takes one decoded proto frame and writes its reply
//! (or asks for the connection to be closed when the frame cannot be
//! trusted). Most requests are answered by one frame; batches and scans are
//! answered by a stream of frames, which [`Service::handle_streaming`]
//! produces one chunk at a time: it returns a [`Continuation`] that
//! [`Service::resume`] turns into the next chunk, so the connection loop can
//! write each chunk and yield between them. A request (and each chunk of a
//! stream) runs to completion on the calling thread: no queues, no
//! hand-offs, no global lock — the partition lock of the record in question
//! is the only lock a transaction takes.
//!
//! Modules: [`transaction`] (single-record reads, writes, deletes),
//! [`batch`] (batch-index requests), [`scan`] (partition scans),
//! [`info`] (info commands), [`cluster_state`] (the view and partition maps),
//! [`replication`] (proxying to masters, synchronous replica writes),
//! [`migration`] (copying partitions to new replicas after view changes),
//! [`nsup`] (expiry and eviction passes), [`noop`] (the no-op mode that
//! benchmarks measure their ceiling with),
//! [`namespace`] (per-namespace state), [`config`] (validated settings).
//!
//! Architecture invariant: this crate does no network I/O. The server crate
//! owns sockets and threads and calls in here; time comes from a [`Clock`].

#![forbid(unsafe_code)]

pub mod batch;
pub mod cluster_state;
pub mod config;
pub mod device;
pub mod filter;
pub mod info;
pub mod job;
pub mod lookahead;
pub mod migration;
pub mod namespace;
pub mod noop;
pub mod nsup;
mod offload;
pub mod replication;
pub mod scan;
pub mod sindex;
mod smd;
pub mod transaction;
mod truncate;
pub mod udf;
mod work;

use citrine_types::{NodeId, ResultCode};
use citrine_wire::frame::{inflate, MessageType, ProtoHeader};
use citrine_wire::msg::{field_type, info1, Message};
use cluster_state::ClusterState;
use config::ServiceConfig;
use namespace::Namespace;
use parking_lot::RwLock;
use replication::{Fabric, Remote};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use transaction::Now;

/// A source of wall-clock time, injected so tests can move time.
pub trait Clock: Send + Sync + 'static {
    /// Unix time in milliseconds.
    fn now_unix_ms(&self) -> u64;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_unix_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|since| since.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// A clock tests set by hand.
#[derive(Debug, Default)]
pub struct ManualClock {
    unix_ms: AtomicU64,
}

impl ManualClock {
    pub fn new(unix_ms: u64) -> ManualClock {
        ManualClock {
            unix_ms: AtomicU64::new(unix_ms),
        }
    }
    pub fn advance_ms(&self, milliseconds: u64) {
        self.unix_ms.fetch_add(milliseconds, Ordering::Relaxed);
    }
    /// Steps the clock back, as a wall clock corrected by NTP can be.
    pub fn rewind_ms(&self, milliseconds: u64) {
        self.unix_ms.fetch_sub(milliseconds, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_unix_ms(&self) -> u64 {
        self.unix_ms.load(Ordering::Relaxed)
    }
}

/// The connection must be closed: the frame could not be trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseConnection(pub String);

/// Node-wide counters.
#[derive(Debug, Default)]
pub struct NodeStats {
    pub client_connections: AtomicU64,
    pub client_connections_opened: AtomicU64,
    pub client_connections_closed: AtomicU64,
    /// Connections handed from one service thread to another (load
    /// balancing between requests).
    pub client_connections_moved: AtomicU64,
    /// Receives stopped because a connection held more than its current
    /// frame plus the read-ahead (its replies were not being taken; the
    /// client is held back by TCP until they are).
    pub client_read_ahead_pauses: AtomicU64,
    pub proto_errors: AtomicU64,
    pub info_requests: AtomicU64,
    pub admin_requests: AtomicU64,
    /// Every AS_MSG request: striped, as every request adds to it.
    pub transactions: citrine_types::stripes::Counter,
    pub compressed_requests: AtomicU64,
    /// Requests forwarded to their partition's master.
    pub proxied_out: AtomicU64,
    /// Forwarded requests executed here.
    pub proxied_in: AtomicU64,
    /// Reads served by this node as a replica (client replica policy).
    pub replica_reads: AtomicU64,
    /// Replica writes sent again after a failed or unanswered attempt.
    pub replica_write_retries: AtomicU64,
    /// Requests refused (11) because the cluster runtime had not run for
    /// longer than the heartbeat timeout (see [`Service::cluster_ticked`]).
    pub stall_refusals: AtomicU64,
    /// Requests refused (9) because their deadline had passed, or nearly,
    /// when they reached the master (a forwarded request held up on its
    /// way, or at a stalled node), when their duplicate resolution ended,
    /// or when a stalled service thread read them after their client's
    /// timeout had run out ([`Service::handle_streaming_since`]).
    pub expired_refusals: AtomicU64,
    /// Turns of a service thread that began more than its stall slack later
    /// than their wait allowed: the process was stopped, paused or starved
    /// of a CPU (counted by the server's service threads).
    pub service_stalls: AtomicU64,
    /// Replica writes refused (11) because this node neither is a replica
    /// of the record's partition nor holds a copy of it any more (a write
    /// that arrived after the migration that ended its part).
    pub replica_writes_refused_not_holder: AtomicU64,
    /// Requests refused because they had been forwarded
    /// [`replication::MAX_PROXY_HOPS`] times without reaching a node that
    /// runs them (the nodes' views or claims disagreed meanwhile).
    pub proxy_hops_exceeded: AtomicU64,
    /// Records whose state was sent again to replicas that had not
    /// acknowledged a write, until all did.
    pub reconciles_done: AtomicU64,
    /// Records given up on (not acknowledged in time, or the queue full).
    pub reconciles_dropped: AtomicU64,
    pub batch: batch::BatchStats,
    pub scan: scan::ScanStats,
}

/// The rest of a streamed reply (batch or scan), produced chunk by chunk by
/// [`Service::resume`]. Dropping it abandons the stream (the connection is
/// closing).
#[derive(Debug)]
pub struct Continuation(Pending);

#[derive(Debug)]
enum Pending {
    Batch(batch::BatchCursor),
    /// Boxed: a cursor is several times the size of the other variants.
    Scan(Box<scan::ScanCursor>),
    /// Fabric work (proxy or replication) before the reply is final.
    Remote(Box<Remote>),
    /// Batch rows waiting for the fabric, then the rest of the batch.
    BatchRemote(Box<batch::BatchRemote>),
    /// An aggregation (a query with a stream UDF).
    Aggregate(Box<udf::AggregateRun>),
    /// An aggregation whose first step is fabric work: the parts of
    /// partitions it must cover that acting masters hold (see
    /// [`udf::AggregateRun::run_delegated`]); then the rest, here.
    AggregateRemote(Box<udf::AggregateRun>),
    /// An info answer that stands once the other members acknowledged the
    /// shared stores its commands changed ([`Service::sync_stores`]).
    SyncStores(Vec<smd::Store>),
}

impl Continuation {
    /// True when the next chunk needs fabric work: produce it with
    /// [`Service::complete_remote`] (on an event loop), not `resume`.
    pub fn is_remote(&self) -> bool {
        matches!(
            self.0,
            Pending::Remote(_)
                | Pending::BatchRemote(_)
                | Pending::AggregateRemote(_)
                | Pending::SyncStores(_)
        )
    }

    fn of_batch(next: batch::BatchNext) -> Option<Continuation> {
        match next {
            batch::BatchNext::Done => None,
            batch::BatchNext::More(cursor) => Some(Continuation(Pending::Batch(cursor))),
            batch::BatchNext::Remote(remote) => Some(Continuation(Pending::BatchRemote(remote))),
        }
    }
}

/// The transaction service of one node.
pub struct Service {
    pub config: ServiceConfig,
    pub node_id: NodeId,
    namespaces: Vec<Arc<Namespace>>,
    clock: Arc<dyn Clock>,
    pub stats: NodeStats,
    /// Most rows a batch request may carry (`batch-max-requests`; above → 151).
    pub batch_max_requests: AtomicU32,
    started_unix_ms: u64,
    /// The current cluster view and partition maps, replaced on view changes.
    cluster: RwLock<Arc<ClusterState>>,
    /// True while the published view has other members.
    clustered: AtomicBool,
    /// How this node reaches the others (installed by the server).
    fabric: OnceLock<Arc<dyn Fabric>>,
    /// Migration plan and counters (see [`migration`]).
    pub migrations: migration::Migrations,
    /// Started to join a cluster and not serving yet: it claims no
    /// partition and answers 11 to data requests (see [`Service::set_orphan`]).
    orphan: AtomicBool,
    /// Unix ms of the cluster runtime's last tick (0: the runtime does not
    /// report its ticks), and how long without one means it stalled (see
    /// [`Service::cluster_ticked`]).
    cluster_tick_ms: AtomicU64,
    cluster_stall_ms: AtomicU64,
    /// The view's clock skew as the cluster runtime last measured it (ms).
    cluster_clock_skew_ms: AtomicU64,
    /// Set with `orphan`: for a node holding records, the orphan ends only
    /// once a view with other members has had its exchange resolved, or a
    /// view of this node alone is published (see [`Service::set_orphan`]).
    joining: AtomicBool,
    /// No-op mode (see [`noop`]): data requests are answered without
    /// touching a namespace. Set once, before the node serves.
    noop: AtomicBool,
    /// Secondary-index builds waiting for the builder thread, and the
    /// definitions the cluster shares (see [`sindex`]).
    pub(crate) sindex_builds: sindex::Builds,
    /// Background scans and queries (see [`job`]).
    pub(crate) jobs: job::Jobs,
    /// UDF modules (see [`udf`]).
    pub(crate) udfs: udf::Udfs,
    /// Truncation thresholds the cluster shares (see [`truncate`]).
    pub(crate) truncations: truncate::Truncations,
    /// Records to send to their replicas again (see
    /// [`Service::reconcile_pending`]).
    pub(crate) reconciles: replication::Reconciles,
    /// This service itself, once the server shares it
    /// ([`Service::set_shared`]): for work handed to a thread of its own.
    shared: OnceLock<std::sync::Weak<Service>>,
}

impl Service {
    /// A service. Opening a device namespace can fail: this panics then, so
    /// the server uses [`Service::open`].
    pub fn new(config: ServiceConfig, clock: Arc<dyn Clock>) -> Service {
        Service::open(config, clock).unwrap_or_else(|error| panic!("{error}"))
    }

    /// A service, opening every namespace (device namespaces rebuild their
    /// index: fast restart or cold start).
    pub fn open(config: ServiceConfig, clock: Arc<dyn Clock>) -> Result<Service, String> {
        let now = Now::from_unix_ms(clock.now_unix_ms());
        let namespaces = config
            .namespaces
            .iter()
            .cloned()
            .map(|namespace| Namespace::open(namespace, now).map(Arc::new))
            .collect::<Result<Vec<_>, String>>()?;
        let started_unix_ms = clock.now_unix_ms();
        let node_id = NodeId(config.node_id);
        let cluster = ClusterState::single(
            node_id,
            config.rack_id,
            config.access_address.clone(),
            &Service::namespace_factors(&config),
        );
        Ok(Service {
            node_id,
            cluster: RwLock::new(Arc::new(cluster)),
            clustered: AtomicBool::new(false),
            fabric: OnceLock::new(),
            migrations: migration::Migrations::new(
                config
                    .namespaces
                    .iter()
                    .map(|namespace| namespace.name.as_str()),
                node_id.0.rotate_left(29) ^ started_unix_ms,
            ),
            orphan: AtomicBool::new(false),
            cluster_tick_ms: AtomicU64::new(0),
            cluster_stall_ms: AtomicU64::new(0),
            cluster_clock_skew_ms: AtomicU64::new(0),
            joining: AtomicBool::new(false),
            noop: AtomicBool::new(false),
            sindex_builds: sindex::Builds::default(),
            jobs: job::Jobs::default(),
            udfs: udf::Udfs::default(),
            truncations: truncate::Truncations::default(),
            reconciles: replication::Reconciles::default(),
            shared: OnceLock::new(),
            config,
            namespaces,
            clock,
            stats: NodeStats::default(),
            batch_max_requests: AtomicU32::new(batch::BATCH_MAX_REQUESTS_DEFAULT),
            started_unix_ms,
        })
    }

    /// (name, replication factor) of every namespace, the input of partition maps.
    pub fn namespace_factors(config: &ServiceConfig) -> Vec<(String, usize)> {
        config
            .namespaces
            .iter()
            .map(|namespace| {
                (
                    namespace.name.clone(),
                    usize::from(namespace.replication_factor),
                )
            })
            .collect()
    }

    /// The current cluster state.
    pub fn cluster(&self) -> Arc<ClusterState> {
        self.cluster.read().clone()
    }

    /// Marks a node that starts to join a cluster (it has seeds), or that
    /// left its view, as not serving until it is back in one:
    ///
    /// - a node restarted under the same id must not, for the seconds
    ///   before it joins, claim every partition to clients that already
    ///   know its address and answer "not found" for records the cluster
    ///   holds;
    /// - in a view with other members, a node that holds records (it
    ///   restarted with its device, or left its view and came back) serves
    ///   again only once that view's partition-version exchange is
    ///   resolved, which brings it the truncations it missed (synced with
    ///   each peer before the exchange resolves): before, it would serve
    ///   records truncated while it was away, and execute writes against
    ///   them. Its partitions answer 11 for those milliseconds (the
    ///   reference's answer while a node's initial partition balance is
    ///   unresolved; the official clients give up on it at once).
    ///
    /// A node holding nothing serves as soon as it is in a view, and a view
    /// of this node alone ends it at once: there is nobody to learn from.
    pub fn set_orphan(&self) {
        self.joining.store(true, Ordering::Relaxed);
        self.orphan.store(true, Ordering::Release);
    }

    /// The cluster runtime reports a tick, its effects carried out: this
    /// node is heartbeating and its view is current as far as it knows.
    /// Once ticks are reported, a request a node of a cluster receives more
    /// than `stall_after_ms` (the cluster node's stall bound,
    /// `ClusterNode::stall_bound_ms`: the heartbeat timeout less two
    /// intervals) after the last one is refused with 11: the runtime has
    /// not run for that long — the process was frozen or starved — so the
    /// peers may have timed this node out and may master its partitions by
    /// now. Requests queued while the process was frozen are answered so
    /// until the runtime's first tick after the thaw, which gives the stale
    /// view up.
    pub fn cluster_ticked(&self, stall_after_ms: u64) {
        self.cluster_stall_ms
            .store(stall_after_ms, Ordering::Relaxed);
        self.cluster_tick_ms
            .store(self.now().unix_ms, Ordering::Release);
    }

    /// The cluster runtime reports the largest clock skew between the
    /// members of this node's view, as its heartbeats measure it (the
    /// `cluster_clock_skew_ms` statistic).
    pub fn set_cluster_clock_skew(&self, skew_ms: u64) {
        self.cluster_clock_skew_ms.store(skew_ms, Ordering::Relaxed);
    }

    /// The last skew [`Service::set_cluster_clock_skew`] reported (ms).
    pub fn cluster_clock_skew_ms(&self) -> u64 {
        self.cluster_clock_skew_ms.load(Ordering::Relaxed)
    }

    /// Whether ticks are reported and none came within the stall bound
    /// before `now_ms` (see [`Service::cluster_ticked`]). Checked for every
    /// data request a client sends a node of a cluster, and for every
    /// single-record request another node forwards to it.
    pub(crate) fn cluster_stalled(&self, now_ms: u64) -> bool {
        let tick = self.cluster_tick_ms.load(Ordering::Acquire);
        tick != 0 && now_ms.saturating_sub(tick) > self.cluster_stall_ms.load(Ordering::Relaxed)
    }

    /// Ends the orphan state of [`Service::set_orphan`]: the node serves.
    fn end_orphan(&self) {
        if self.joining.swap(false, Ordering::AcqRel) {
            tracing::info!("serving: the view's partition versions are exchanged");
        }
        self.orphan.store(false, Ordering::Release);
    }

    /// Puts the node in no-op mode (`citrined --noop`, the benchmark
    /// ceiling, see [`noop`]): from now on every AS_MSG is answered with
    /// success and nothing is read or stored.
    pub fn set_noop(&self) {
        self.noop.store(true, Ordering::Relaxed);
    }

    /// Whether the node is in no-op mode.
    pub fn is_noop(&self) -> bool {
        self.noop.load(Ordering::Relaxed)
    }

    /// True from [`Service::set_orphan`] until the node is back in a
    /// view whose exchange is resolved (or alone).
    pub fn is_orphan(&self) -> bool {
        self.orphan.load(Ordering::Acquire)
    }

    /// Publishes a new cluster state (after a view change) and starts the
    /// partition-version exchange it calls for (the migration driver does
    /// the rest). An orphan serves from now on when the view is of this
    /// node alone, else once the exchange is resolved.
    pub fn publish_cluster(&self, state: ClusterState) {
        debug_assert_eq!(state.self_id, self.node_id);
        let clustered = state.size() > 1;
        // Saved before any write of this regime can reach the devices.
        self.save_regime(state.cluster_key);
        let state = Arc::new(state);
        *self.cluster.write() = state.clone();
        self.clustered.store(clustered, Ordering::Release);
        self.plan_migrations(state);
        if !clustered || !self.joining.load(Ordering::Acquire) || self.holds_nothing() {
            self.end_orphan();
        }
    }

    /// True when no namespace holds a record (or tombstone).
    fn holds_nothing(&self) -> bool {
        self.namespaces()
            .all(|namespace| namespace.index.record_count() == 0)
    }

    /// The exchange of the published view is resolved: an orphan waiting
    /// for it serves from now on.
    pub(crate) fn exchange_resolved(&self) {
        if self.joining.load(Ordering::Acquire) {
            self.end_orphan();
        }
    }

    /// Installs the fabric through which requests are proxied and writes
    /// replicated. Without one, every node serves what it is sent.
    pub fn set_fabric(&self, fabric: Arc<dyn Fabric>) {
        let _ = self.fabric.set(fabric);
    }

    /// The installed fabric, if any (the server's migration thread sends
    /// through it).
    pub fn fabric(&self) -> Option<Arc<dyn Fabric>> {
        self.fabric.get().cloned()
    }

    /// Lets the service hand work that may run long to a thread of its own
    /// (see [`offload`]); without it (tests, tools) such work runs inline.
    pub fn set_shared(self: &Arc<Service>) {
        let _ = self.shared.set(Arc::downgrade(self));
    }

    /// This service, shared, when [`Service::set_shared`] was called.
    pub(crate) fn shared(&self) -> Option<Arc<Service>> {
        self.shared.get().and_then(std::sync::Weak::upgrade)
    }

    /// True when single-record requests are routed by the partition map
    /// (other members and a fabric): one relaxed load on the alone path.
    #[inline]
    pub(crate) fn routes(&self) -> bool {
        self.clustered.load(Ordering::Relaxed) && self.fabric.get().is_some()
    }

    /// Completes the fabric work of a request whose
    /// [`Continuation::is_remote`] is true and leaves its final reply in
    /// `out` (the proxied answer, the local reply once every replica
    /// acknowledged, or an error). No lock is held while it waits.
    ///
    /// For batch rows that waited for the fabric it writes their row
    /// messages and returns the rest of the batch (resume it, or complete it
    /// again when it [`Continuation::is_remote`]).
    pub async fn complete_remote(
        &self,
        continuation: Continuation,
        out: &mut Vec<u8>,
    ) -> Option<Continuation> {
        match continuation.0 {
            Pending::Remote(remote) => {
                self.complete_row(*remote, out).await;
                None
            }
            Pending::BatchRemote(rows) => rows
                .complete(self, out)
                .await
                .map(|cursor| Continuation(Pending::Batch(cursor))),
            Pending::AggregateRemote(run) => run
                .run_delegated(self, out)
                .await
                .map(|run| Continuation(Pending::Aggregate(run))),
            Pending::SyncStores(stores) => {
                self.sync_stores(&stores).await;
                None
            }
            other => Some(Continuation(other)),
        }
    }

    /// Completes one request's fabric work into its reply frame.
    pub(crate) async fn complete_row(&self, remote: Remote, out: &mut Vec<u8>) {
        if matches!(remote, Remote::Proxy { .. }) {
            self.stats.proxied_out.fetch_add(1, Ordering::Relaxed);
        }
        self.complete(remote, out).await;
    }

    /// Runs a batch row as the single-record request `body` (in a
    /// cluster); its reply frame goes to `out` unless fabric work remains.
    pub(crate) fn execute_row_body(&self, body: &[u8], out: &mut Vec<u8>) -> Option<Box<Remote>> {
        self.execute_body(body, replication::Hop::CLIENT, false, out)
    }

    /// Runs a single-record request body (client or proxied) and writes its
    /// reply; returns the fabric work still to do.
    pub(crate) fn execute_single(
        &self,
        body: &[u8],
        hop: replication::Hop,
        out: &mut Vec<u8>,
    ) -> Option<Box<Remote>> {
        self.stats.transactions.fetch_add(1, Ordering::Relaxed);
        self.execute_body(body, hop, false, out)
    }

    /// Runs a single-record request body after its duplicate resolution
    /// (no second resolution, not counted again).
    pub(crate) fn execute_resolved(
        &self,
        body: &[u8],
        hop: replication::Hop,
        out: &mut Vec<u8>,
    ) -> Option<Box<Remote>> {
        self.execute_body(body, hop, true, out)
    }

    fn execute_body(
        &self,
        body: &[u8],
        hop: replication::Hop,
        resolved: bool,
        out: &mut Vec<u8>,
    ) -> Option<Box<Remote>> {
        match Message::decode(body) {
            Ok(message)
                if message.header.info1 & info1::BATCH == 0
                    && message.field(field_type::DIGEST).is_some() =>
            {
                transaction::execute(self, &message, body, hop, resolved, out)
            }
            _ => {
                self.stats.proto_errors.fetch_add(1, Ordering::Relaxed);
                transaction::write_result(out, ResultCode::Parameter);
                None
            }
        }
    }

    /// The namespace called `name`.
    #[inline]
    pub fn namespace(&self, name: &[u8]) -> Option<&Namespace> {
        self.namespace_index(name)
            .map(|index| self.namespaces[index].as_ref())
    }

    /// The namespace called `name`, shared (for work that outlives the
    /// request: a scan cursor, a background removal).
    pub(crate) fn namespace_shared(&self, name: &[u8]) -> Option<Arc<Namespace>> {
        self.namespace_index(name)
            .map(|index| Arc::clone(&self.namespaces[index]))
    }

    /// The position of the namespace called `name` in configuration order.
    #[inline]
    pub fn namespace_index(&self, name: &[u8]) -> Option<usize> {
        self.namespaces
            .iter()
            .position(|namespace| namespace.config.name.as_bytes() == name)
    }

    /// All namespaces, in configuration order.
    pub fn namespaces(&self) -> impl Iterator<Item = &Namespace> {
        self.namespaces.iter().map(Arc::as_ref)
    }

    /// The current time.
    #[inline]
    pub fn now(&self) -> Now {
        Now::from_unix_ms(self.clock.now_unix_ms())
    }

    /// Seconds since the service started.
    pub fn uptime_seconds(&self) -> u64 {
        self.clock
            .now_unix_ms()
            .saturating_sub(self.started_unix_ms)
            / 1000
    }

    /// Handles one request frame and appends its whole reply to `out` (every
    /// chunk of a streamed reply: for tests and tools; the server streams
    /// with [`Service::handle_streaming`]).
    ///
    /// Returns `Err` when the connection must be closed (the body of a frame
    /// that cannot be trusted); any request that parses answers with a result
    /// code instead.
    pub fn handle(
        &self,
        header: ProtoHeader,
        body: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), CloseConnection> {
        let mut pending = self.handle_streaming(header, body, out)?;
        while let Some(continuation) = pending {
            pending = self.resume(continuation, out);
        }
        Ok(())
    }

    /// Handles one request frame and appends the first chunk of its reply to
    /// `out` (for most requests, the whole reply). When the reply is a stream
    /// that continues (a batch or scan bigger than one chunk), returns the
    /// [`Continuation`] to pass to [`Service::resume`] for the next chunk.
    /// The caller must write the chunk before resuming and must not start
    /// another request on this connection until the stream has ended.
    pub fn handle_streaming(
        &self,
        header: ProtoHeader,
        body: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<Option<Continuation>, CloseConnection> {
        self.handle_streaming_since(header, body, out, None)
    }

    /// [`Service::handle_streaming`] for a request that may have waited in
    /// this node's socket since `waiting_since_ms` (unix ms): the thread
    /// reading it was stalled (stopped, paused, starved of a CPU) from then
    /// until now, so it cannot tell when the request arrived. A request
    /// whose client timeout (`transaction_ttl`) has run out since then is
    /// refused with 9 (`expired_refusals`) instead of run after its client
    /// gave up — and maybe after that client's next, acknowledged, write of
    /// the same record; a single-record request that goes on carries that
    /// deadline to the node it is forwarded to. `None`: read as it arrived.
    pub fn handle_streaming_since(
        &self,
        header: ProtoHeader,
        body: &[u8],
        out: &mut Vec<u8>,
        waiting_since_ms: Option<u64>,
    ) -> Result<Option<Continuation>, CloseConnection> {
        self.handle_streaming_from(header, body, out, waiting_since_ms, None)
    }

    /// [`Service::handle_streaming_since`] for a request from the client at
    /// `from` (when known: `query-show` names it as a scan's origin).
    pub fn handle_streaming_from(
        &self,
        header: ProtoHeader,
        body: &[u8],
        out: &mut Vec<u8>,
        waiting_since_ms: Option<u64>,
        from: Option<std::net::SocketAddr>,
    ) -> Result<Option<Continuation>, CloseConnection> {
        let origin = job::Origin::Client(from);
        match header.message_type {
            MessageType::Info => {
                self.stats.info_requests.fetch_add(1, Ordering::Relaxed);
                let changed = info::answer_request(self, body, out);
                let peers = !changed.is_empty() && self.routes() && !self.peers().0.is_empty();
                Ok(peers.then(|| Continuation(Pending::SyncStores(changed))))
            }
            MessageType::Admin => {
                self.stats.admin_requests.fetch_add(1, Ordering::Relaxed);
                // No security: every admin request, including login, is answered
                // "security not enabled", which clients take as "no login needed".
                citrine_wire::admin::write_reply(out, ResultCode::SecurityNotEnabled.code());
                Ok(None)
            }
            MessageType::Message => self.handle_message(body, out, waiting_since_ms, origin),
            MessageType::Compressed => {
                self.stats
                    .compressed_requests
                    .fetch_add(1, Ordering::Relaxed);
                let (_, inner) =
                    inflate(body).map_err(|error| self.proto_error(error.to_string()))?;
                self.handle_message(&inner, out, waiting_since_ms, origin)
            }
            MessageType::InternalXdr => {
                Err(self.proto_error("XDR messages are not accepted on the service port".into()))
            }
        }
    }

    /// How long the connection loop should hold `continuation` before
    /// resuming it: a scan or aggregation throttled by RECS_PER_SEC that is
    /// ahead of its rate (see [`scan`]). `None`: resume it now.
    pub fn pause_of(&self, continuation: &Continuation) -> Option<std::time::Duration> {
        let due = match &continuation.0 {
            Pending::Scan(cursor) => cursor.not_before_ms()?,
            // An aggregation's walk is throttled as a scan's is.
            Pending::Aggregate(run) => run.not_before_ms()?,
            _ => return None,
        };
        let now = self.clock.now_unix_ms();
        // Never longer than one step's interval: past that the wall clock
        // was stepped back, and the next step starts the schedule again.
        (due > now)
            .then(|| std::time::Duration::from_millis((due - now).min(scan::MAX_PACED_PAUSE_MS)))
    }

    /// Appends the next chunk of a streamed reply to `out`; returns the
    /// continuation while the stream goes on, `None` once its LAST message
    /// has been written.
    pub fn resume(&self, continuation: Continuation, out: &mut Vec<u8>) -> Option<Continuation> {
        match continuation.0 {
            Pending::Batch(cursor) => Continuation::of_batch(cursor.step(self, out)),
            Pending::Scan(cursor) => cursor
                .step(self, self.now(), out)
                .map(|cursor| Continuation(Pending::Scan(cursor))),
            // Blocking: for tests and tools only; an event loop awaits
            // `complete_remote` instead.
            Pending::Remote(remote) => {
                block_on(self.complete_row(*remote, out));
                None
            }
            Pending::BatchRemote(rows) => block_on(rows.complete(self, out))
                .map(|cursor| Continuation(Pending::Batch(cursor))),
            Pending::Aggregate(run) => run
                .step(self, out)
                .map(|run| Continuation(Pending::Aggregate(run))),
            Pending::AggregateRemote(run) => block_on(run.run_delegated(self, out))
                .map(|run| Continuation(Pending::Aggregate(run))),
            Pending::SyncStores(stores) => {
                block_on(self.sync_stores(&stores));
                None
            }
        }
    }

    fn handle_message(
        &self,
        body: &[u8],
        out: &mut Vec<u8>,
        waiting_since_ms: Option<u64>,
        origin: job::Origin,
    ) -> Result<Option<Continuation>, CloseConnection> {
        self.stats.transactions.fetch_add(1, Ordering::Relaxed);
        if self.is_noop() {
            noop::reply(body, self.batch_max_requests.load(Ordering::Relaxed), out);
            return Ok(None);
        }
        if self.orphan.load(Ordering::Acquire) {
            // Not in a cluster yet: the client tries another node.
            transaction::write_refusal(out, body, ResultCode::Unavailable);
            return Ok(None);
        }
        if self.routes() && self.cluster_stalled(self.now().unix_ms) {
            // The view may be stale (see `cluster_ticked`): single-record
            // requests, batches, scans, queries and aggregations alike.
            self.stats.stall_refusals.fetch_add(1, Ordering::Relaxed);
            transaction::write_refusal(out, body, ResultCode::Unavailable);
            return Ok(None);
        }
        let message = match Message::decode(body) {
            Ok(message) => message,
            Err(error) => {
                // The frame boundary is intact, so the stream is still in step:
                // answer with a parameter error and keep serving.
                self.stats.proto_errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("malformed AS_MSG: {error}");
                transaction::write_refusal(out, body, ResultCode::Parameter);
                return Ok(None);
            }
        };
        let deadline_ms = held_deadline_ms(waiting_since_ms, message.header.transaction_ttl);
        if deadline_ms.is_some_and(|deadline_ms| self.now().unix_ms >= deadline_ms) {
            // Its client gave up while it waited here.
            self.stats.expired_refusals.fetch_add(1, Ordering::Relaxed);
            transaction::write_refusal(out, body, ResultCode::Timeout);
            return Ok(None);
        }
        match message {
            message if message.header.info1 & info1::BATCH != 0 => {
                Ok(Continuation::of_batch(batch::start(self, &message, out)))
            }
            message
                if message.field(field_type::DIGEST).is_none() && udf::is_aggregation(&message) =>
            {
                Ok(
                    udf::start_aggregate(self, &message, out, origin).and_then(|run| {
                        if run.has_delegated() {
                            Some(Continuation(Pending::AggregateRemote(run)))
                        } else {
                            run.step(self, out)
                                .map(|run| Continuation(Pending::Aggregate(run)))
                        }
                    }),
                )
            }
            message if message.field(field_type::DIGEST).is_none() => {
                // No digest: a scan or a query.
                Ok(scan::start(self, &message, out, origin)
                    .and_then(|cursor| Box::new(cursor).step(self, self.now(), out))
                    .map(|cursor| Continuation(Pending::Scan(cursor))))
            }
            message => Ok(transaction::execute(
                self,
                &message,
                body,
                replication::Hop::client(deadline_ms),
                false,
                out,
            )
            .map(|remote| Continuation(Pending::Remote(remote)))),
        }
    }

    fn proto_error(&self, why: String) -> CloseConnection {
        self.stats.proto_errors.fetch_add(1, Ordering::Relaxed);
        CloseConnection(why)
    }
}

/// The deadline (unix ms) of a client's request with timeout
/// `transaction_ttl` (ms) that may have waited since `waiting_since_ms`;
/// `None` when it did not wait or its client set no timeout (0: the client
/// waits for the answer, however late).
fn held_deadline_ms(waiting_since_ms: Option<u64>, transaction_ttl: u32) -> Option<u64> {
    let since = waiting_since_ms?;
    (transaction_ttl > 0).then(|| since.saturating_add(u64::from(transaction_ttl)))
}

/// Runs a future to completion on the calling thread (parking between
/// wake-ups). Only for the blocking [`Service::handle`] / `resume` path.
pub(crate) fn block_on<F: std::future::Future>(future: F) -> F::Output {
    struct ThreadWaker(std::thread::Thread);
    impl std::task::Wake for ThreadWaker {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut context = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let std::task::Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        std::thread::park();
    }
}

#[cfg(test)]
pub(crate) mod tests;
