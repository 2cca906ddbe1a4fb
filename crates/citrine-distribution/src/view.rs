//! The view this node serves, as the cluster runtime publishes it: the
//! current [`ClusterState`], whether the node serves at all (the orphan
//! state of a node joining or left behind), whether its cluster runtime
//! stalled, and the fabric to the other members.
//!
//! Publishing a view ([`Distribution::publish_cluster`]) saves its regime
//! first (see [`crate::migration`]), swaps the [`ClusterState`] in, and
//! snapshots the partition versions and starts the view's exchange
//! ([`Distribution::plan_migrations`]) before it returns, so
//! `cluster-stable` accounts for the view from the moment it is visible.
//!
//! The orphan state ([`Distribution::set_orphan`]): a node started with
//! seeds other than itself, or one that left its view, claims nothing in
//! its `replicas` answers and answers data requests 11, so clients that
//! know its address (a node restarted under the same id) move on to the
//! nodes that hold the data. It serves again when a view of itself alone
//! is published, when it holds nothing, or — holding records, in a view
//! with other members — once that view's exchange is resolved
//! ([`Distribution::exchange_resolved`]), because the exchange brings it
//! the truncations it missed: it must neither serve a record truncated
//! while it was away nor execute a write against one.
//!
//! The stall guard ([`Distribution::cluster_ticked`],
//! [`Distribution::cluster_stalled`]): the cluster runtime reports each
//! tick with its stall bound (`ClusterNode::stall_bound_ms`, the heartbeat
//! timeout less two intervals); while it has not ticked for longer, every
//! data request is refused with 11 (`stall_refusals`).
//!
//! Invariants: a node that holds records serves in a view with other
//! members only once that view's exchange is resolved (it has learned the
//! truncations it missed); a node whose runtime has not ticked for the
//! stall bound refuses requests (its peers may have moved on without it).

use crate::cluster_state::ClusterState;
use crate::replication::Fabric;
use crate::Distribution;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Distribution {
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
        self.orphaned_at
            .store(self.migrations.epoch(), Ordering::Release);
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

    /// The last skew [`Distribution::set_cluster_clock_skew`] reported (ms).
    pub fn cluster_clock_skew_ms(&self) -> u64 {
        self.cluster_clock_skew_ms.load(Ordering::Relaxed)
    }

    /// Whether ticks are reported and none came within the stall bound
    /// before `now_ms` (see [`Distribution::cluster_ticked`]). Checked for every
    /// data request a client sends a node of a cluster, and for every
    /// single-record request another node forwards to it.
    pub fn cluster_stalled(&self, now_ms: u64) -> bool {
        let tick = self.cluster_tick_ms.load(Ordering::Acquire);
        tick != 0 && now_ms.saturating_sub(tick) > self.cluster_stall_ms.load(Ordering::Relaxed)
    }

    /// Ends the orphan state of [`Distribution::set_orphan`]: the node serves.
    fn end_orphan(&self) {
        if self.joining.swap(false, Ordering::AcqRel) {
            tracing::info!("serving: the view's partition versions are exchanged");
        }
        self.orphan.store(false, Ordering::Release);
    }

    /// True from [`Distribution::set_orphan`] until the node is back in a
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
        // On the principal, the rosters pending when the view formed (after
        // the snapshot its exchange answers: the members decide this view
        // with the rosters they hold, and the principal asks for another
        // once they converged). Here rather than in the driver's first
        // step, so that a `roster-set:` after this view stays pending.
        let applied = self.apply_pending_rosters_at_view();
        if !applied.is_empty() {
            tracing::info!(?applied, "pending rosters applied at the new view");
        }
        if !clustered || !self.joining.load(Ordering::Acquire) || self.holds_nothing() {
            self.end_orphan();
        }
    }

    /// True when no namespace holds a record (or tombstone).
    fn holds_nothing(&self) -> bool {
        self.data.holds_nothing()
    }

    /// The exchange of the published view is resolved: an orphan waiting
    /// for it serves from now on — unless it became an orphan after that
    /// view was published (it left the view whose exchange was still
    /// running: serving again in it, it would answer from a regime its
    /// former peers have left, without the writes they acknowledged since).
    pub fn exchange_resolved(&self) {
        let left_since = self.orphaned_at.load(Ordering::Acquire) >= self.migrations.epoch();
        if self.joining.load(Ordering::Acquire) && !left_since {
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

    /// True when single-record requests are routed by the partition map
    /// (other members and a fabric): one relaxed load on the alone path.
    #[inline]
    pub fn routes(&self) -> bool {
        self.clustered.load(Ordering::Relaxed) && self.fabric.get().is_some()
    }
}
