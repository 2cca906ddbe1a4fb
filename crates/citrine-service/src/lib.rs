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
//! Layers: the node's data layer ([`citrine_data::Data`]: namespaces,
//! records, the clock) and distribution layer
//! ([`citrine_distribution::Distribution`]: the view, routing, replication,
//! migrations) are held by [`Service`]. [`Layers`] is the handle the
//! features move to (the two layers and the node's settings and counters,
//! plus, explicitly, any other feature a feature builds on), so that only
//! dispatch sees the whole service: batch, scan and query and background
//! jobs take it, secondary indexes take `sindex::Indexes` (the layers and
//! the indexes), aggregations `udf::Aggregations` (the layers, the indexes,
//! the modules, the jobs, and the dispatcher's runner of a part here as a
//! `udf::LocalParts`); of the info commands, the dispatcher and some
//! answers (statistics, configuration, truncation, the roster) still take
//! `&Service`, the others `Layers` or a feature's handle. `Service`
//! implements the distribution layer's
//! [`citrine_distribution::LocalExecutor`], so a
//! request proxied here, or one whose duplicate resolution ended, runs with
//! its record UDF, and serves the features' fabric calls
//! ([`Service::serve_fabric`]: index definitions, UDF modules, aggregation
//! parts; the others are the distribution layer's).
//!
//! Modules: dispatch in this file ([`Service::handle_streaming`]: info,
//! admin, and an AS_MSG to a batch, an aggregation, a scan or query, or a
//! single-record request), [`transaction`] (a single-record request
//! checked, routed, and run here: the data layer's record operations or a
//! record UDF), [`batch`] (batch-index requests), [`scan`] (scans and
//! queries), [`job`] (background scans and queries, `query-show`), [`udf`]
//! (modules, record UDFs, aggregations), [`sindex`] (index upkeep as the
//! namespaces' record hook, builds, definitions), [`info`] (info
//! commands), [`latency`] (latency histograms, `latencies:`),
//! [`prometheus`] (every statistic in Prometheus's text format), `smd` (the
//! shared stores' info side), `truncate` (the truncate commands),
//! [`lookahead`] (prefetching a wake-up's lookups), [`noop`] (the no-op
//! mode benchmarks measure their ceiling with), [`config`] (validated
//! settings), `offload` and `work` (where background work runs). Re-exported from below: [`namespace`], [`filter`], [`nsup`],
//! [`device`] (data) and [`cluster_state`], [`replication`],
//! [`migration`] (distribution).
//!
//! Invariants: this crate does no network I/O (the server owns the
//! sockets and calls in here); the node's time comes from the [`Clock`] —
//! though the features still measure elapsed time and pace their work with
//! `std::time::Instant` (batch timings, background jobs' pacing, an
//! aggregation's part retries), and `offload` runs an aggregation part
//! (and the pause between its retries) on a thread of its own, off the
//! fabric's serving thread.

#![forbid(unsafe_code)]

pub mod batch;
pub mod benchmarks;
pub mod client_limits;
mod compression_info;
pub mod config;
mod eviction_info;
pub mod info;
pub mod job;
pub mod latency;
pub mod lookahead;
pub mod noop;
mod offload;
pub mod prometheus;
mod sc;
pub mod scan;
pub mod security;
pub mod session;
pub mod sindex;
pub mod smd;
pub mod storage_bench;
pub mod transaction;
mod truncate;
mod txn;
mod txn_recovery;
pub mod udf;
mod work;

pub use citrine_data::{device, filter, namespace, nsup};
pub use citrine_data::{Clock, ManualClock};
pub use citrine_distribution::{cluster_state, migration, replication};

use citrine_data::Data;
use citrine_distribution::Distribution;
use citrine_types::{NodeId, ResultCode};
use citrine_wire::frame::{inflate, MessageType, ProtoHeader};
use citrine_wire::msg::{field_type, info1, Message};
use config::ServiceConfig;
use namespace::Namespace;
use replication::{Fabric, Remote};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use transaction::Now;

/// The system clock: where wall-clock time enters the node (the server
/// passes it in; the layers below read only the clock they are given).
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

/// The connection must be closed: the frame could not be trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseConnection(pub String);

/// Node-wide counters.
#[derive(Debug, Default)]
pub struct NodeStats {
    pub client_connections: AtomicU64,
    pub client_connections_opened: AtomicU64,
    pub client_connections_closed: AtomicU64,
    /// Client connections closed because nothing moved on them for
    /// `proto-fd-idle-ms`.
    pub reaped_fds: AtomicU64,
    /// Client connections closed at accept because `proto-fd-max` were
    /// open (a Citrine statistic: the reference only logs them).
    pub proto_fd_max_refused: AtomicU64,
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
    /// Turns of a service thread that began more than its stall slack later
    /// than their wait allowed: the process was stopped, paused or starved
    /// of a CPU (counted by the server's service threads).
    pub service_stalls: AtomicU64,
    pub batch: batch::BatchStats,
    pub scan: scan::ScanStats,
}

/// How a request arrived, as the connection loop knows it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Arrival {
    /// It may have waited in a stalled node's socket since then (unix
    /// ms; see [`Service::handle_streaming_since`]).
    pub waiting_since_ms: Option<u64>,
    /// The client (`query-show` names it as a scan's origin).
    pub from: Option<std::net::SocketAddr>,
    /// When it was received: its latency counts from here (`None`: from
    /// when the service takes it).
    pub received: Option<std::time::Instant>,
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
    /// Fabric work (proxy or replication) before the reply is final, and
    /// the histogram its latency goes to once it is.
    Remote(Box<Remote>, Option<latency::Timed>),
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
    /// A LOGIN waiting for the LDAP directory
    /// ([`Service::complete_ldap_login`]).
    LdapLogin(Box<security::external::LdapLogin>),
}

impl Continuation {
    /// True when the next chunk needs fabric work: produce it with
    /// [`Service::complete_remote`] (on an event loop), not `resume`.
    pub fn is_remote(&self) -> bool {
        matches!(
            self.0,
            Pending::Remote(..)
                | Pending::BatchRemote(_)
                | Pending::AggregateRemote(_)
                | Pending::SyncStores(_)
                | Pending::LdapLogin(_)
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

/// What a feature (batch, scan and query, background jobs, UDF execution,
/// secondary indexes, info) is handed: the two layers and the node's
/// identity, settings and counters. Features take this (and, explicitly,
/// any other feature they build on: a `&Sindexes`, the `&Udfs`, a
/// [`citrine_distribution::LocalExecutor`] for sub-requests), never the
/// [`Service`], so what a feature reaches is in its signature; only
/// dispatch sees the whole service.
#[derive(Clone, Copy)]
pub struct Layers<'s> {
    /// The data layer: namespaces, records, the clock.
    pub data: &'s Data,
    /// The distribution layer: the view, routing, replication, migrations.
    pub dist: &'s Distribution,
    /// This node's settings.
    pub config: &'s ServiceConfig,
    /// This node's counters.
    pub stats: &'s NodeStats,
    /// This node's latency histograms.
    pub latencies: &'s latency::Latencies,
}

impl<'s> Layers<'s> {
    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.dist.node_id
    }

    /// The current time from the data layer's clock.
    pub fn now(&self) -> Now {
        self.data.now()
    }

    /// The namespace called `name`, if the node has one.
    pub fn namespace(&self, name: &[u8]) -> Option<&'s Namespace> {
        self.data.namespace(name)
    }

    /// Every namespace, in configuration order.
    pub fn namespaces(&self) -> impl Iterator<Item = &'s Namespace> {
        self.data.namespaces()
    }

    /// The current cluster state.
    pub fn cluster(&self) -> Arc<cluster_state::ClusterState> {
        self.dist.cluster()
    }

    /// The migrations' state (and acting-master claims).
    pub fn migrations(&self) -> &'s migration::Migrations {
        &self.dist.migrations
    }

    /// Whether the node is in no cluster view (it holds nothing).
    pub fn is_orphan(&self) -> bool {
        self.dist.is_orphan()
    }
}

/// The transaction service of one node.
pub struct Service {
    pub config: ServiceConfig,
    pub node_id: NodeId,
    /// The data layer: namespaces and the clock.
    data: Arc<Data>,
    /// Each namespace's secondary indexes and their upkeep (its record
    /// hook), in the namespaces' order.
    sindexes: Vec<Arc<sindex::Sindexes>>,
    pub stats: NodeStats,
    /// Latency histograms (see [`latency`]).
    latencies: latency::Latencies,
    /// Most rows a batch request may carry (`batch-max-requests`; above → 151;
    /// 0, the default, is no limit).
    pub batch_max_requests: AtomicU32,
    /// `proto-fd-max` and `proto-fd-idle-ms` (see [`client_limits`]).
    pub client_limits: client_limits::ClientLimits,
    /// The distribution layer: the view, the fabric, replication and
    /// migrations.
    dist: Arc<Distribution>,
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
    /// The user agents of the open client connections (`user-agents`).
    pub(crate) user_agents: Arc<session::UserAgents>,
    /// This service itself, once the server shares it
    /// ([`Service::set_shared`]): for work handed to a thread of its own.
    shared: OnceLock<std::sync::Weak<Service>>,
    /// XDR's info commands, when the server installed them.
    xdr: OnceLock<Arc<dyn XdrInfo>>,
    /// Access control, when the node runs with it (see [`security`]).
    security: OnceLock<security::Guard>,
    /// The `network` context of `get-config`, as the server resolved it
    /// ([`Service::set_network_config`]).
    network: OnceLock<Vec<(String, String)>>,
}

/// XDR's part of the info commands (`set-config`, `get-config` and
/// `get-stats` with `context=xdr`), answered by the server that ships.
pub trait XdrInfo: Send + Sync {
    fn set_config(&self, params: &[(&str, &str)]) -> String;
    fn get_config(&self, params: &[(&str, &str)]) -> String;
    fn get_stats(&self, params: &[(&str, &str)]) -> String;
    /// `xdr-set-filter:dc=DC;namespace=NS;exp=BASE64|null`.
    fn set_filter(&self, params: &[(&str, &str)]) -> String;
    /// Another member's last-ship times (an `XDR_LSTS` fabric call's
    /// payload); false when the payload is malformed.
    fn receive_lsts(&self, payload: &[u8]) -> bool;
    /// `xdr-get-filter:dc=DC[;namespace=NS][;b64=BOOL]`.
    fn get_filter(&self, params: &[(&str, &str)]) -> String;
    /// The filters the cluster shares, as pushed to the other members.
    fn filters_text(&self) -> String;
    /// Another member's filters (an `XDR_FILTERS` push).
    fn merge_filters(&self, text: &str);
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
        let data = Arc::new(Data::open(&config.namespaces, clock)?);
        let sindexes = sindex::Sindexes::install(&data)?;
        let node_id = NodeId(config.node_id);
        let latencies = latency::Latencies::new(config.namespaces.iter().map(|n| n.name.as_str()));
        let dist = Arc::new(Distribution::new(
            node_id,
            config.rack_id,
            config.access_address.clone(),
            Arc::clone(&data),
            &Service::namespace_factors(&config),
        ));
        Ok(Service {
            node_id,
            dist,
            noop: AtomicBool::new(false),
            sindex_builds: sindex::Builds::default(),
            jobs: job::Jobs::default(),
            udfs: udf::Udfs::default(),
            user_agents: Arc::default(),
            shared: OnceLock::new(),
            xdr: OnceLock::new(),
            security: OnceLock::new(),
            network: OnceLock::new(),
            config,
            data,
            sindexes,
            stats: NodeStats::default(),
            latencies,
            batch_max_requests: AtomicU32::new(batch::BATCH_MAX_REQUESTS_DEFAULT),
            client_limits: client_limits::ClientLimits::default(),
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

    /// Puts the node in no-op mode (`citrined --noop`, the benchmark
    /// ceiling, see [`noop`]): from now on every AS_MSG is answered with
    /// success and nothing is read or stored.
    pub fn set_noop(&self) {
        self.noop.store(true, Ordering::Relaxed);
    }

    /// Whether the node is in no-op mode.
    /// Installs XDR's info commands (once).
    pub fn set_xdr(&self, xdr: Arc<dyn XdrInfo>) {
        let _ = self.xdr.set(xdr);
    }

    /// XDR's info commands, if installed.
    pub fn xdr(&self) -> Option<&Arc<dyn XdrInfo>> {
        self.xdr.get()
    }

    pub fn is_noop(&self) -> bool {
        self.noop.load(Ordering::Relaxed)
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

    /// The two layers and the node's settings and counters, as features
    /// are handed them.
    pub fn layers(&self) -> Layers<'_> {
        Layers {
            data: &self.data,
            dist: &self.dist,
            config: &self.config,
            stats: &self.stats,
            latencies: &self.latencies,
        }
    }

    /// The latency histograms (see [`latency`]).
    pub fn latencies(&self) -> &latency::Latencies {
        &self.latencies
    }

    /// The distribution layer.
    pub fn dist(&self) -> &Arc<Distribution> {
        &self.dist
    }

    /// The migration plan and counters (the distribution layer's).
    pub fn migrations(&self) -> &migration::Migrations {
        &self.dist.migrations
    }

    /// The current cluster state.
    pub fn cluster(&self) -> Arc<cluster_state::ClusterState> {
        self.dist.cluster()
    }

    /// See [`Distribution::set_orphan`].
    pub fn set_orphan(&self) {
        self.dist.set_orphan();
    }

    /// See [`Distribution::cluster_ticked`].
    pub fn cluster_ticked(&self, stall_after_ms: u64) {
        self.dist.cluster_ticked(stall_after_ms);
    }

    /// See [`Distribution::set_cluster_clock_skew`].
    pub fn set_cluster_clock_skew(&self, skew_ms: u64) {
        self.dist.set_cluster_clock_skew(skew_ms);
    }

    /// See [`Distribution::is_orphan`].
    pub fn is_orphan(&self) -> bool {
        self.dist.is_orphan()
    }

    /// See [`Distribution::publish_cluster`].
    pub fn publish_cluster(&self, state: cluster_state::ClusterState) {
        self.dist.publish_cluster(state);
    }

    /// See [`Distribution::set_fabric`].
    pub fn set_fabric(&self, fabric: Arc<dyn Fabric>) {
        self.dist.set_fabric(fabric);
    }

    /// The installed fabric, if any.
    pub fn fabric(&self) -> Option<Arc<dyn Fabric>> {
        self.dist.fabric()
    }

    /// True when single-record requests are routed by the partition map
    /// (other members and a fabric): one relaxed load on the alone path.
    #[inline]
    pub(crate) fn routes(&self) -> bool {
        self.dist.routes()
    }

    /// Finishes a request's fabric work (the distribution layer's, with
    /// this node running what must run here) into its reply in `out`.
    pub(crate) async fn complete(&self, remote: Remote, out: &mut Vec<u8>) {
        self.dist.complete(remote, self, out).await;
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
            Pending::Remote(remote, timed) => {
                let stage = benchmarks::Stage::after(&remote);
                self.complete_row(*remote, out).await;
                self.record_latency(timed, stage);
                None
            }
            Pending::BatchRemote(rows) => rows
                .complete(self.row_context(), out)
                .await
                .map(|cursor| Continuation(Pending::Batch(cursor))),
            Pending::AggregateRemote(run) => run
                .run_delegated(&self.aggregations(), out)
                .await
                .map(|run| Continuation(Pending::Aggregate(run))),
            Pending::SyncStores(stores) => {
                self.sync_stores(&stores).await;
                None
            }
            Pending::LdapLogin(login) => {
                self.complete_ldap_login(*login, out).await;
                None
            }
            other => Some(Continuation(other)),
        }
    }

    /// Completes one request's fabric work into its reply frame.
    pub(crate) async fn complete_row(&self, remote: Remote, out: &mut Vec<u8>) {
        if matches!(remote, Remote::Proxy { .. }) {
            self.dist.stats.proxied_out.fetch_add(1, Ordering::Relaxed);
        }
        self.complete(remote, out).await;
    }

    /// Runs a single-record request's AS_MSG `body`; `timed` learns its
    /// histogram.
    fn execute_body(
        &self,
        body: &[u8],
        hop: replication::Hop,
        resolved: bool,
        out: &mut Vec<u8>,
        timed: &mut latency::Timed,
    ) -> Option<Box<Remote>> {
        match Message::decode(body) {
            Ok(message)
                if message.header.info1 & info1::BATCH == 0
                    && message.field(field_type::DIGEST).is_some() =>
            {
                let call = transaction::Call {
                    hop,
                    resolved,
                    timed,
                };
                transaction::execute(self, &message, body, call, out)
            }
            _ => {
                self.stats.proto_errors.fetch_add(1, Ordering::Relaxed);
                transaction::write_result(out, ResultCode::Parameter);
                None
            }
        }
    }

    /// The data layer.
    pub fn data(&self) -> &Arc<Data> {
        &self.data
    }

    /// The namespace called `name`.
    #[inline]
    pub fn namespace(&self, name: &[u8]) -> Option<&Namespace> {
        self.data.namespace(name)
    }

    /// The namespace called `name`, shared (for work that outlives the
    /// request: a scan cursor, a background removal).
    pub(crate) fn namespace_shared(&self, name: &[u8]) -> Option<Arc<Namespace>> {
        self.data.namespace_shared(name)
    }

    /// The position of the namespace called `name` in configuration order.
    #[inline]
    pub fn namespace_index(&self, name: &[u8]) -> Option<usize> {
        self.data.namespace_index(name)
    }

    /// All namespaces, in configuration order.
    /// Logs the partitions that stopped serving because a change to them
    /// was cut short by a panic (see [`Namespace::serving`]): the server
    /// calls it after a request panicked. Returns how many are failed.
    pub fn report_failed_partitions(&self) -> usize {
        self.namespaces()
            .map(Namespace::report_failed_partitions)
            .sum()
    }

    pub fn namespaces(&self) -> impl Iterator<Item = &Namespace> {
        self.data.namespaces()
    }

    /// The secondary indexes of `namespace` (one of this node's).
    pub(crate) fn sindexes(&self, namespace: &Namespace) -> &citrine_sindex::Registry {
        self.indexes().of(namespace)
    }

    /// The index feature's handle: the layers, every namespace's indexes,
    /// their builds and definitions.
    pub(crate) fn indexes(&self) -> sindex::Indexes<'_> {
        sindex::Indexes::new(self.layers(), &self.sindexes, &self.sindex_builds)
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

    /// Seconds since the service started.
    pub fn uptime_seconds(&self) -> u64 {
        self.clock()
            .now_unix_ms()
            .saturating_sub(self.data.started_unix_ms())
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
        let arrival = Arrival {
            waiting_since_ms,
            ..Arrival::default()
        };
        self.handle_streaming_from(header, body, out, arrival)
    }

    /// An info request, on a connection whose state is `session` when the
    /// caller has one (`user-agent-set` needs it); the continuation waits
    /// for the other members to take the shared stores it changed.
    pub(crate) fn handle_info(
        &self,
        body: &[u8],
        out: &mut Vec<u8>,
        session: Option<&mut session::Session>,
    ) -> Option<Continuation> {
        self.stats.info_requests.fetch_add(1, Ordering::Relaxed);
        let changed = info::answer_request(self, body, out, session);
        let peers = !changed.is_empty() && self.routes() && !self.dist.peers().0.is_empty();
        peers.then(|| Continuation(Pending::SyncStores(changed)))
    }

    /// [`Service::handle_streaming_since`] for a request that arrived as
    /// `arrival` says (its client, when it was received).
    pub fn handle_streaming_from(
        &self,
        header: ProtoHeader,
        body: &[u8],
        out: &mut Vec<u8>,
        arrival: Arrival,
    ) -> Result<Option<Continuation>, CloseConnection> {
        match header.message_type {
            MessageType::Info => Ok(self.handle_info(body, out, None)),
            MessageType::Admin => {
                self.stats.admin_requests.fetch_add(1, Ordering::Relaxed);
                // No security: every admin request, including login, is answered
                // "security not enabled", which clients take as "no login needed".
                citrine_wire::admin::write_reply(out, ResultCode::SecurityNotEnabled.code());
                Ok(None)
            }
            MessageType::Message => self.handle_message(body, out, arrival, &[]),
            MessageType::Compressed => {
                self.stats
                    .compressed_requests
                    .fetch_add(1, Ordering::Relaxed);
                let (_, inner) =
                    inflate(body).map_err(|error| self.proto_error(error.to_string()))?;
                self.handle_message(&inner, out, arrival, &[])
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
        let now = self.clock().now_unix_ms();
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
            Pending::Batch(cursor) => Continuation::of_batch(cursor.step(self.row_context(), out)),
            Pending::Scan(cursor) => cursor
                .step(self.layers(), self.now(), out)
                .map(|cursor| Continuation(Pending::Scan(cursor))),
            // Blocking: for tests and tools only; an event loop awaits
            // `complete_remote` instead.
            Pending::Remote(remote, timed) => {
                let stage = benchmarks::Stage::after(&remote);
                block_on(self.complete_row(*remote, out));
                self.record_latency(timed, stage);
                None
            }
            Pending::BatchRemote(rows) => block_on(rows.complete(self.row_context(), out))
                .map(|cursor| Continuation(Pending::Batch(cursor))),
            Pending::Aggregate(run) => run
                .step(&self.aggregations(), out)
                .map(|run| Continuation(Pending::Aggregate(run))),
            Pending::AggregateRemote(run) => {
                let run = block_on(run.run_delegated(&self.aggregations(), out));
                run.map(|run| Continuation(Pending::Aggregate(run)))
            }
            Pending::SyncStores(stores) => {
                block_on(self.sync_stores(&stores));
                None
            }
            Pending::LdapLogin(login) => {
                block_on(self.complete_ldap_login(*login, out));
                None
            }
        }
    }

    /// Runs an AS_MSG; a batch answers the rows in `refused` (sorted by
    /// row index) with their code instead of running them (see
    /// [`security`]).
    fn handle_message(
        &self,
        body: &[u8],
        out: &mut Vec<u8>,
        arrival: Arrival,
        refused: &[(u32, ResultCode)],
    ) -> Result<Option<Continuation>, CloseConnection> {
        let (waiting_since_ms, received) = (arrival.waiting_since_ms, arrival.received);
        let origin = job::Origin::Client(arrival.from);
        self.stats.transactions.fetch_add(1, Ordering::Relaxed);
        if self.is_noop() {
            noop::reply(body, self.batch_max_requests.load(Ordering::Relaxed), out);
            return Ok(None);
        }
        if let Some(code) = self.refusal() {
            transaction::write_refusal(out, body, code);
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
            self.dist
                .stats
                .expired_refusals
                .fetch_add(1, Ordering::Relaxed);
            transaction::write_refusal(out, body, ResultCode::Timeout);
            return Ok(None);
        }
        Ok(self.dispatch(
            &message,
            body,
            (deadline_ms, received),
            out,
            (origin, refused),
        ))
    }

    /// Runs a client's single-record request ([`transaction::execute`])
    /// and counts its latency in its namespace's histogram — once it is
    /// answered here, or once its fabric work ends; a proxied one is
    /// counted by the node that runs it.
    fn execute_timed(
        &self,
        message: &Message<'_>,
        body: &[u8],
        (hop, mut timed): (replication::Hop, latency::Timed),
        out: &mut Vec<u8>,
    ) -> Option<Continuation> {
        let call = transaction::Call {
            hop,
            resolved: false,
            timed: &mut timed,
        };
        let remote = transaction::execute(self, message, body, call, out);
        if remote
            .as_deref()
            .is_none_or(|remote| matches!(remote, Remote::Replicate { .. }))
        {
            self.latencies.stage(&mut timed, benchmarks::Stage::Run);
        }
        match remote {
            None => {
                self.latencies.record_timed(timed);
                None
            }
            Some(remote) => {
                let timed = Some(timed).filter(|_| !matches!(*remote, Remote::Proxy { .. }));
                Some(Continuation(Pending::Remote(remote, timed)))
            }
        }
    }

    /// Runs `body` through [`Service::execute_body`]; a request answered
    /// here counts its latency (`batch_row`: in a batch-sub histogram).
    fn execute_body_timed(
        &self,
        body: &[u8],
        hop: replication::Hop,
        batch_row: bool,
        out: &mut Vec<u8>,
    ) -> Option<Box<Remote>> {
        let mut timed = latency::Timed::start(batch_row);
        let remote = self.execute_body(body, hop, false, out, &mut timed);
        if remote
            .as_deref()
            .is_none_or(|remote| matches!(remote, Remote::Replicate { .. }))
        {
            self.latencies.stage(&mut timed, benchmarks::Stage::Run);
        }
        if remote.is_none() {
            self.latencies.record_timed(timed);
        }
        remote
    }

    /// Counts a request's latency once its fabric work (ending `stage`)
    /// ended.
    fn record_latency(&self, timed: Option<latency::Timed>, stage: Option<benchmarks::Stage>) {
        if let Some(mut timed) = timed {
            if let Some(stage) = stage {
                self.latencies.stage(&mut timed, stage);
            }
            self.latencies.record_timed(timed);
        }
    }

    /// Why every AS_MSG request is refused now, if it is: the node is not
    /// in a cluster yet, or its view may be stale.
    fn refusal(&self) -> Option<ResultCode> {
        if self.dist.is_orphan() {
            // Not in a cluster yet: the client tries another node.
            return Some(ResultCode::Unavailable);
        }
        if self.routes() && self.dist.cluster_stalled(self.now().unix_ms) {
            // The view may be stale (see `cluster_ticked`): single-record
            // requests, batches, scans, queries and aggregations alike.
            self.dist
                .stats
                .stall_refusals
                .fetch_add(1, Ordering::Relaxed);
            return Some(ResultCode::Unavailable);
        }
        None
    }

    /// Routes a decoded AS_MSG request to its feature: a batch, a
    /// single-record request (its deadline, if it waited here, goes with
    /// it, and when it was received, for its latency), an aggregation, or
    /// a scan or query.
    fn dispatch(
        &self,
        message: &Message<'_>,
        body: &[u8],
        (deadline_ms, received): (Option<u64>, Option<std::time::Instant>),
        out: &mut Vec<u8>,
        (origin, refused): (job::Origin, &[(u32, ResultCode)]),
    ) -> Option<Continuation> {
        if message.header.info1 & info1::BATCH != 0 {
            let max_rows = self.batch_max_requests.load(Ordering::Relaxed);
            let next = batch::start(self.row_context(), (max_rows, refused), message, out);
            return Continuation::of_batch(next);
        }
        if message.field(field_type::DIGEST).is_some() {
            let hop = replication::Hop::client(deadline_ms);
            let timed = match received {
                Some(received) => latency::Timed::since(received),
                None => latency::Timed::start(false),
            };
            return self.execute_timed(message, body, (hop, timed), out);
        }
        if let Some(code) = crate::sc::refuses(self, message) {
            transaction::write_result(out, code);
            return None;
        }
        if udf::is_aggregation(message) {
            let aggregations = self.aggregations();
            return udf::start_aggregate(&aggregations, message, out, origin).and_then(|run| {
                if run.has_delegated() {
                    Some(Continuation(Pending::AggregateRemote(run)))
                } else {
                    run.step(&aggregations, out)
                        .map(|run| Continuation(Pending::Aggregate(run)))
                }
            });
        }
        // No digest: a scan or a query.
        self.start_scan(message, out, origin)
    }

    /// A scan or query: a background one is a job, answered at once
    /// ([`job::start`]); a foreground one streams from its cursor.
    fn start_scan(
        &self,
        message: &Message<'_>,
        out: &mut Vec<u8>,
        origin: job::Origin,
    ) -> Option<Continuation> {
        let indexes = move |namespace: &Namespace| self.sindexes(namespace);
        if scan::is_background(message) {
            job::start(
                self.job_runner(),
                self.udf_registry(),
                &indexes,
                message,
                out,
                origin,
            );
            return None;
        }
        let layers = self.layers();
        scan::start(layers, &self.jobs.monitors, &indexes, message, out, origin)
            .and_then(|cursor| Box::new(cursor).step(layers, layers.now(), out))
            .map(|cursor| Continuation(Pending::Scan(cursor)))
    }

    /// What a batch runs its rows with (see [`batch`]).
    fn row_context(&self) -> batch::RowContext<'_> {
        batch::RowContext {
            layers: self.layers(),
            modules: self.udf_registry(),
            executor: self,
        }
    }

    /// What starts and runs background jobs (see [`job`]).
    fn job_runner(&self) -> job::Runner<'_> {
        job::Runner {
            layers: self.layers(),
            jobs: &self.jobs,
            writes: self,
        }
    }

    /// Runs background jobs until `stopping` is set (the server's
    /// `citrine-jobs` thread). While it runs, jobs are queued there instead
    /// of running inline in the request that started them.
    pub fn run_background_jobs(&self, stopping: &AtomicBool) {
        self.job_runner().run(stopping);
    }

    /// The lookup a single-record AS_MSG body will make (see
    /// [`lookahead`]); `None` for everything in no-op mode.
    pub fn lookup_of(&self, body: &[u8]) -> Option<lookahead::Lookup> {
        if self.is_noop() {
            return None;
        }
        lookahead::lookup_of(&self.data, body)
    }

    /// Starts the cache misses of `lookups` (see [`lookahead::prefetch`]).
    pub fn prefetch(&self, lookups: &[lookahead::Lookup]) {
        lookahead::prefetch(&self.data, lookups);
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
mod compression_tests;
#[cfg(test)]
pub(crate) mod tests;

/// How the distribution layer runs a request here: a proxied one, and one
/// whose duplicate resolution ended (record UDFs included, which this
/// layer runs and the one below does not know).
impl citrine_distribution::LocalExecutor for Service {
    fn execute_single(
        &self,
        body: &[u8],
        hop: replication::Hop,
        out: &mut Vec<u8>,
    ) -> Option<Box<Remote>> {
        self.stats.transactions.fetch_add(1, Ordering::Relaxed);
        self.execute_body_timed(body, hop, false, out)
    }

    fn execute_resolved(
        &self,
        body: &[u8],
        hop: replication::Hop,
        out: &mut Vec<u8>,
    ) -> Option<Box<Remote>> {
        // Counted where it started (the node that resolved it).
        self.execute_body(
            body,
            hop,
            true,
            out,
            &mut latency::Timed::counted_elsewhere(),
        )
    }
}

/// How a batch runs a row a cluster routes: as a client's single-record
/// request (counted with its batch, not as a transaction of its own).
impl batch::RowExecutor for Service {
    fn execute_row(&self, body: &[u8], out: &mut Vec<u8>) -> Option<Box<Remote>> {
        self.execute_body_timed(body, replication::Hop::CLIENT, true, out)
    }

    fn finish_row<'a>(
        &'a self,
        remote: Remote,
        out: &'a mut Vec<u8>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'a>> {
        Box::pin(self.complete_row(remote, out))
    }
}

/// How a background job's record writes run: as a client's requests,
/// timed as the sub-transactions they are (the `udf-sub` and `ops-sub`
/// benchmark groups, no `latencies:` histogram).
impl job::WritePath for Service {
    fn run(
        &self,
        header: ProtoHeader,
        body: &[u8],
        reply: &mut Vec<u8>,
    ) -> Result<(), CloseConnection> {
        if header.message_type != MessageType::Message {
            return self.handle(header, body, reply);
        }
        let mut pending = self.handle_sub(body, reply);
        while let Some(continuation) = pending {
            pending = self.resume(continuation, reply);
        }
        Ok(())
    }
}

impl Service {
    /// A background job's single-record write (see [`job::WritePath`]):
    /// refused as a client's would be, else run and timed as a
    /// sub-transaction.
    fn handle_sub(&self, body: &[u8], out: &mut Vec<u8>) -> Option<Continuation> {
        self.stats.transactions.fetch_add(1, Ordering::Relaxed);
        let Ok(message) = Message::decode(body) else {
            transaction::write_refusal(out, body, ResultCode::Parameter);
            return None;
        };
        if let Some(code) = self.refusal() {
            // Refused before it ran: the sub-transaction's tsvc error.
            let udf = message.field(field_type::UDF_FILENAME).is_some();
            let named = message.field(field_type::NAMESPACE);
            if let Some(namespace) = named.and_then(|name| self.namespace(name)) {
                let tally = citrine_data::tally::Tally::sub(udf);
                namespace
                    .stats
                    .count(tally, citrine_data::tally::Outcome::Refused);
            }
            transaction::write_refusal(out, body, code);
            return None;
        }
        if message.field(field_type::DIGEST).is_none() {
            transaction::write_refusal(out, body, ResultCode::Parameter);
            return None;
        }
        let hop = replication::Hop::client(None);
        self.execute_timed(&message, body, (hop, latency::Timed::sub()), out)
    }
}

impl Service {
    /// Serves one fabric call from another node; returns the answer: the
    /// features' calls here (index definitions, UDF modules, aggregation
    /// parts), the distribution layer's there (with this node running what
    /// must run here).
    pub async fn serve_fabric(&self, kind: u8, payload: &[u8]) -> Vec<u8> {
        use replication::call_kind;
        let merge = |merge: &dyn Fn(&str)| match std::str::from_utf8(payload) {
            Ok(text) => {
                merge(text);
                vec![ResultCode::Ok.code()]
            }
            Err(_) => vec![ResultCode::Parameter.code()],
        };
        match kind {
            call_kind::SINDEX_DEFINITIONS => merge(&|text| self.indexes().merge_definitions(text)),
            call_kind::UDF_MODULES => merge(&|text| self.udf_modules().merge(text)),
            call_kind::SECURITY => merge(&|text| self.merge_security(text)),
            call_kind::AGGREGATE_PART => self.serve_aggregate_part(payload).await,
            call_kind::XDR_FILTERS => merge(&|text| {
                if let Some(xdr) = self.xdr() {
                    xdr.merge_filters(text);
                }
            }),
            call_kind::XDR_LSTS => {
                let taken = self.xdr().is_none_or(|xdr| xdr.receive_lsts(payload));
                vec![if taken {
                    ResultCode::Ok
                } else {
                    ResultCode::Parameter
                }
                .code()]
            }
            _ => self
                .dist
                .serve_call(kind, payload, self)
                .await
                .unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod migration_tests;
#[cfg(test)]
mod replication_tests;
