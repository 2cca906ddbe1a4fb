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
    /// of this node alone ends it at once: there is nobody to learn from.
    pub fn set_orphan(&self) {
        self.joining.store(true, Ordering::Relaxed);
        self.orphan.store(true, Ordering::Release);
    }

    /// view up.
    pub fn cluster_ticked(&self, stall_after_ms: u64) {
        self.cluster_stall_ms
            .store(stall_after_ms, Ordering::Relaxed);
        self.cluster_tick_ms
            .store(self.now().unix_ms, Ordering::Release);
    }

    /// `cluster_clock_skew_ms` statistic).
    pub fn set_cluster_clock_skew(&self, skew_ms: u64) {
        self.cluster_clock_skew_ms.store(skew_ms, Ordering::Relaxed);
    }

    /// The last skew [`Distribution::set_cluster_clock_skew`] reported (ms).
    pub fn cluster_clock_skew_ms(&self) -> u64 {
        self.cluster_clock_skew_ms.load(Ordering::Relaxed)
    }

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

    /// view whose exchange is resolved (or alone).
    pub fn is_orphan(&self) -> bool {
        self.orphan.load(Ordering::Acquire)
    }

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
        self.data.holds_nothing()
    }

    /// for it serves from now on.
    pub fn exchange_resolved(&self) {
        if self.joining.load(Ordering::Acquire) {
            self.end_orphan();
        }
    }

    /// replicated. Without one, every node serves what it is sent.
    pub fn set_fabric(&self, fabric: Arc<dyn Fabric>) {
        let _ = self.fabric.set(fabric);
    }

    /// through it).
    pub fn fabric(&self) -> Option<Arc<dyn Fabric>> {
        self.fabric.get().cloned()
    }

    /// (other members and a fabric): one relaxed load on the alone path.
    #[inline]
    pub fn routes(&self) -> bool {
        self.clustered.load(Ordering::Relaxed) && self.fabric.get().is_some()
    }
}
