//! The cluster-management state machine of one node: heartbeats + health
//! score + Paxos view change at cluster-change quanta (001 §2.1).
//!
//! Owns: the node's current [`ClusterView`] (or orphan state), its Paxos
//! acceptor state (promised ballot, accepted value) and, while it is the
//! principal, its proposer state. It is sans-I/O: the caller passes the time
//! (`now`, monotonic milliseconds) and incoming messages and carries out the
//! returned [`Effect`]s.
//!
//! Protocol summary:
//! - *eligible set*: the node itself plus adjacent peers that passed health
//!   probation and are not unhealthy. The *principal* is its highest id. A
//!   peer heard under a later incarnation (it restarted) goes through
//!   probation again, so a node back empty under its old id is nobody's
//!   principal before it is admitted; an orphan waits (bounded) for the
//!   peers it hears to pass probation before it forms a view without them.
//! - Only at a cluster-change quantum (every `quantum_ms`) does a node that
//!   is its own principal decide whether the view must change: it is an
//!   orphan, its view is led by someone else, the eligible set differs from
//!   the succession list, or a member advertises another cluster key well
//!   after the last commit. Events between quanta are batched into one
//!   change, so several nodes can join or leave at once.
//! - The change is a three-phase, Paxos-style round with ballots ordered by
//!   `(round, node)`: Prepare → Promise/Nack, Accept(view) → Accepted, Commit.
//!   An acceptor promises only to the node it regards as its own principal
//!   and only for a ballot not below one already promised. The value is
//!   chosen only with *unanimous* acceptance by the proposed succession list,
//!   so no value recovery from promises is needed; an incomplete round is
//!   abandoned, and a later ballot supersedes it. A round that would drop
//!   a member for not being eligible when it began is abandoned at its
//!   commit, and the decision taken again, if that member is eligible by
//!   then (its health recovered meanwhile): the view would only change
//!   back at the next quantum.
//! - To make one network event one view change, a principal whose decision
//!   is due while peers are in transition (silent for over two heartbeat
//!   intervals but not yet timed out, or heard but still on health
//!   probation) postpones it once, by at most half a quantum, until they
//!   have settled. When members have left the view, only members on
//!   probation (restarted ones) are waited for, not newcomers: a departed
//!   master's partitions are unavailable until the view changes.
//! - If some eligible peers do not promise, the first attempt of the quantum
//!   is abandoned and retried after `retry_delay_ms` (peers typically lag in
//!   noticing that an old principal died); the retry proceeds with whoever
//!   promised — unless a peer refused for a principal this node still
//!   hears: then that peer is no laggard but a member of a live view (its
//!   principal came back from a stall this node timed out, or has not
//!   admitted this node yet), and a view without it would serve the same
//!   partitions twice; the round is abandoned instead.
//! - Merging: when a principal of a higher id becomes adjacent (and healthy)
//!   to nodes of another cluster, it is their principal too; the lower
//!   principal stops proposing and the higher one's next round takes all of
//!   them in.
//! - A member learns a commit by the Commit message or, if that was lost, by
//!   its principal's heartbeat advertising the key of the value it accepted.
//!   A member whose principal advertises another view without it (not an
//!   orphan's lack of any view: an orphan dropped no one), or whose
//!   principal vanished (or, for a principal, who sees a higher principal)
//!   and who was not admitted into any new view for two quanta, becomes an
//!   orphan.
//! - A node that was not ticked for more than [`STALL_INTERVALS`] heartbeat
//!   intervals stalled (its process was frozen or starved): it heard nothing
//!   and sent nothing meanwhile, so that silence is not held against its
//!   peers (their liveness clocks move on by the gap, and the heartbeats
//!   queued for it are read before anyone is timed out; a Paxos round of
//!   its own gets the gap added to its deadline, so the answers queued for
//!   it are read before the round is concluded). A stall after
//!   which the peers may have timed this node out (its silence since its
//!   last heartbeat round, plus one interval for that heartbeat being
//!   lost, exceeds the heartbeat timeout) means they may have moved on
//!   without it: it gives up a view it shared with them (orphan) and
//!   judges them anew (health probation), as a booting node does, instead
//!   of serving its stale view, or forming a view of itself alone because
//!   everyone fell silent at once, or (the stall just under the timeout)
//!   waking up in the view they left and serving it. It also heartbeats
//!   under a later incarnation, so the peers judge it anew too, as a
//!   restarted node: a
//!   peer that had not timed it out yet does not keep it as its principal
//!   (while it admits no one) and refuse the view the next principal forms.
//!
//! Invariants:
//! - a held view always contains the local node (asserted);
//! - the proposer of a view is its principal (highest member), and every
//!   member accepted exactly that (ballot, view) before anyone applied it;
//! - `promised` never decreases; `ViewChanged` is emitted exactly when the
//!   held cluster key changes;
//! - no randomness, clocks, threads or I/O: the same inputs give the same
//!   outputs.

use std::collections::{BTreeMap, BTreeSet};

use citrine_types::NodeId;

use crate::health::{HealthConfig, HealthTracker};
use crate::heartbeat::{HeartbeatConfig, HeartbeatOutcome, HeartbeatState};
use crate::message::{Message, PeerAddr};
use crate::view::{derive_cluster_key, Ballot, ClusterView};

/// Everything a node needs to know to join a cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterConfig {
    /// This node's id.
    pub node_id: NodeId,
    /// Where this node listens for cluster messages.
    pub addr: PeerAddr,
    /// Heartbeat timing and mesh seeds.
    pub heartbeat: HeartbeatConfig,
    /// Health score tuning.
    pub health: HealthConfig,
    /// Cluster change interval, ms. The paper recommends twice the heartbeat
    /// timeout.
    pub quantum_ms: u64,
    /// How long a Paxos phase waits for answers, ms.
    pub paxos_timeout_ms: u64,
    /// Period of retransmission of unanswered Prepare/Accept/Commit, ms.
    pub resend_ms: u64,
    /// Delay before retrying an incomplete round, ms.
    pub retry_delay_ms: u64,
    /// How long after a commit members may still advertise an older key
    /// before the principal treats them as out of sync, ms.
    pub sync_grace_ms: u64,
}

impl ClusterConfig {
    /// Defaults derived from the heartbeat defaults (150 ms interval, 1.5 s
    /// timeout, 3 s quantum).
    pub fn new(node_id: NodeId, addr: PeerAddr, seeds: Vec<PeerAddr>) -> ClusterConfig {
        let heartbeat = HeartbeatConfig {
            seeds,
            ..HeartbeatConfig::default()
        };
        let timeout = heartbeat.timeout_ms;
        ClusterConfig {
            node_id,
            addr,
            heartbeat,
            health: HealthConfig::default(),
            quantum_ms: 2 * timeout,
            paxos_timeout_ms: timeout / 3,
            resend_ms: timeout / 15,
            retry_delay_ms: timeout,
            sync_grace_ms: timeout,
        }
    }

    /// Checks the relations between the timings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let hb = &self.heartbeat;
        if hb.interval_ms == 0 || hb.timeout_ms <= hb.interval_ms {
            return Err(ConfigError(
                "heartbeat timeout must exceed a positive interval",
            ));
        }
        if self.health.window_ms == 0 || !(0.0..1.0).contains(&self.health.alpha) {
            return Err(ConfigError(
                "health window must be positive and alpha in [0, 1)",
            ));
        }
        if self.resend_ms == 0 {
            return Err(ConfigError("resend period must be positive"));
        }
        if self.paxos_timeout_ms == 0 || self.quantum_ms <= 2 * self.paxos_timeout_ms {
            return Err(ConfigError("quantum must exceed two paxos timeouts"));
        }
        if self.retry_delay_ms + 2 * self.paxos_timeout_ms >= self.quantum_ms {
            return Err(ConfigError("a retry must fit inside one quantum"));
        }
        Ok(())
    }
}

/// A configuration whose timings are inconsistent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConfigError(pub &'static str);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid cluster config: {}", self.0)
    }
}

impl std::error::Error for ConfigError {}

/// What the caller must do on behalf of the state machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Transmit `msg` (from this node) to `to`.
    Send {
        /// Destination address.
        to: PeerAddr,
        /// The message; wrap in an [`crate::Envelope`] with this node's id.
        msg: Message,
    },
    /// A new view was committed and is now this node's view.
    ViewChanged {
        /// The new cluster key (never 0).
        cluster_key: u64,
        /// Members, ascending.
        succession: Vec<NodeId>,
    },
    /// The node left its view without a new one (its principal moved on
    /// without it, or it stalled long enough for its peers to time it
    /// out); it is an orphan until admitted again.
    Orphaned,
}

#[derive(Clone, Debug)]
enum Phase {
    Prepare {
        targets: BTreeSet<NodeId>,
        promised: BTreeSet<NodeId>,
        /// Who refused, and the principal each named in its Nack.
        refused: BTreeMap<NodeId, NodeId>,
    },
    Accept {
        view: ClusterView,
        pending: BTreeSet<NodeId>,
        /// The peers the round's Prepare went to (eligible when it began).
        asked: BTreeSet<NodeId>,
    },
}

#[derive(Clone, Debug)]
struct Round {
    ballot: Ballot,
    phase: Phase,
    deadline: u64,
    resend_at: u64,
}

/// A committed view whose Commit some members have not acknowledged yet.
#[derive(Clone, Debug)]
struct CommitDelivery {
    ballot: Ballot,
    view: ClusterView,
    unacked: BTreeSet<NodeId>,
    resend_at: u64,
    give_up_at: u64,
}

/// Counters for observability and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// Rounds started as principal.
    pub rounds_started: u64,
    /// Rounds that committed a view.
    pub rounds_committed: u64,
    /// Rounds abandoned (timeout, nack or nothing to change).
    pub rounds_abandoned: u64,
    /// Retried rounds not carried on without their refusers because one of
    /// them named a principal this node still hears (counted among the
    /// abandoned ones too).
    pub rounds_deferred_to_live_principal: u64,
    /// Views applied (including as principal).
    pub views_applied: u64,
    /// Stalls detected: gaps of more than [`STALL_INTERVALS`] heartbeat
    /// intervals between two ticks.
    pub stalls: u64,
}

/// One node's cluster-management state machine.
#[derive(Clone, Debug)]
pub struct ClusterNode {
    cfg: ClusterConfig,
    hb: HeartbeatState,
    health: HealthTracker,
    now: u64,
    /// Local time of the last tick (stall detection).
    last_tick: u64,
    view: Option<ClusterView>,
    view_since: u64,
    promised: Ballot,
    accepted: Option<(Ballot, ClusterView)>,
    max_round: u64,
    next_quantum: u64,
    round: Option<Round>,
    commit_delivery: Option<CommitDelivery>,
    retry_at: Option<u64>,
    attempt: u8,
    /// Rounds restarted at once this quantum because the only refusals were
    /// stale promises (see `finish_prepare`).
    stale_restarts: u8,
    /// Whether this quantum's decision was already postponed once.
    deferred: bool,
    /// Quanta elapsed since boot.
    quantum_index: u64,
    /// Views committed as principal since the last quantum began.
    commits_this_quantum: u32,
    /// The quantum in which the last view committed as principal was
    /// decided (`quantum_index` at the commit).
    last_commit_quantum: Option<u64>,
    /// When (at a quantum) the principal of the held view was first seen
    /// missing from the adjacency list.
    principal_lost_at: Option<u64>,
    /// A new view of the same members was asked for (`recluster:`; see
    /// [`ClusterNode::request_recluster`]); cleared when a view is applied.
    recluster: bool,
    stats: NodeStats,
}

/// Quanta after which a member whose principal vanished, and which nobody
/// admitted into a new view, gives up its stale view.
const ORPHAN_AFTER_QUANTA: u64 = 2;

/// Rounds a principal may restart at once in one quantum when the only
/// refusals were promises to a higher ballot from peers that take it for
/// their principal (each restart goes above every ballot the refusals
/// named, so one is normally enough).
const MAX_STALE_RESTARTS: u8 = 2;

/// Heartbeat intervals without a tick after which the node knows it
/// stalled (every tick may send heartbeats, so a caller that ticks on time
/// ticks at least once an interval).
pub const STALL_INTERVALS: u64 = 2;

impl ClusterNode {
    /// A fresh node booting at `now` (local milliseconds). `now` also serves
    /// as the heartbeat incarnation, so a restarted node must boot at a later
    /// local time than its previous life.
    pub fn new(cfg: ClusterConfig, now: u64) -> Result<ClusterNode, ConfigError> {
        cfg.validate()?;
        let hb = HeartbeatState::new(
            cfg.node_id,
            cfg.addr.clone(),
            cfg.heartbeat.clone(),
            now,
            now,
        );
        let health = HealthTracker::new(cfg.health.clone(), cfg.heartbeat.interval_ms, now);
        let next_quantum = now + cfg.quantum_ms;
        Ok(ClusterNode {
            cfg,
            hb,
            health,
            now,
            last_tick: now,
            view: None,
            view_since: now,
            promised: Ballot::default(),
            accepted: None,
            max_round: 0,
            next_quantum,
            round: None,
            commit_delivery: None,
            retry_at: None,
            attempt: 0,
            stale_restarts: 0,
            deferred: false,
            quantum_index: 0,
            commits_this_quantum: 0,
            last_commit_quantum: None,
            principal_lost_at: None,
            recluster: false,
            stats: NodeStats::default(),
        })
    }

    /// Asks for a new view even if the members did not change (the
    /// strong-consistency `recluster:`: the members decide their partitions
    /// again under a new cluster key). A principal starts its round at the
    /// next quantum; any other node forgets it at its next view.
    pub fn request_recluster(&mut self) {
        self.recluster = true;
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.cfg.node_id
    }

    /// The configuration.
    pub fn config(&self) -> &ClusterConfig {
        &self.cfg
    }

    /// The current view, `None` while orphan.
    pub fn view(&self) -> Option<&ClusterView> {
        self.view.as_ref()
    }

    /// The largest clock skew between members of this node's view (ms):
    /// the spread of the members' clock offsets from this node's clock (0
    /// for itself), each estimated from its heartbeats. Members not heard
    /// from yet count for nothing; 0 without a view.
    pub fn clock_skew_ms(&self) -> u64 {
        let Some(view) = &self.view else {
            return 0;
        };
        let me = self.cfg.node_id;
        let offsets = view
            .succession()
            .iter()
            .filter(|member| **member != me)
            .filter_map(|member| self.hb.clock_offset(*member))
            .chain(std::iter::once(0));
        let (low, high) = offsets.fold((i64::MAX, i64::MIN), |(low, high), offset| {
            (low.min(offset), high.max(offset))
        });
        high.abs_diff(low)
    }

    /// Adjacent peers, ascending.
    pub fn adjacency(&self) -> Vec<NodeId> {
        self.hb.adjacency().collect()
    }

    /// Health tracker (read-only).
    pub fn health(&self) -> &HealthTracker {
        &self.health
    }

    /// Number of cluster-change quanta begun since this machine booted.
    pub fn quantum_index(&self) -> u64 {
        self.quantum_index
    }

    /// The quantum in which this machine last committed a view as its
    /// principal. One `tick` can end a round of one quantum and begin the
    /// next quantum (a retry's deadline and the boundary fall due at the
    /// same tick): the view it emits belongs to the quantum that decided it,
    /// which `quantum_index` after the tick no longer tells.
    pub fn last_commit_quantum(&self) -> Option<u64> {
        self.last_commit_quantum
    }

    /// Counters.
    pub fn stats(&self) -> NodeStats {
        self.stats
    }

    /// The eligible set: self plus adjacent, admitted, healthy peers.
    pub fn eligible(&self) -> BTreeSet<NodeId> {
        let mut set: BTreeSet<NodeId> = self
            .hb
            .adjacency()
            .filter(|id| self.health.is_eligible(*id))
            .collect();
        set.insert(self.cfg.node_id);
        set
    }

    /// Whom this node regards as its principal: the highest eligible id.
    pub fn principal(&self) -> NodeId {
        let highest = self
            .hb
            .adjacency()
            .rev()
            .find(|id| self.health.is_eligible(*id));
        highest.map_or(self.cfg.node_id, |id| id.max(self.cfg.node_id))
    }

    fn advance(&mut self, now: u64) -> u64 {
        // Time never goes backwards inside the machine.
        self.now = self.now.max(now);
        self.now
    }

    /// The longest time without a tick after which this node still keeps
    /// its view (ms): past it, its silence since its last heartbeat round
    /// (up to an interval before the last tick) plus an interval for that
    /// heartbeat being lost may exceed the heartbeat timeout, so its peers
    /// may have timed it out and moved on, and its next tick gives the view
    /// up (see the module doc). A runtime refuses requests once this long
    /// has passed since the last tick, until the next one.
    pub fn stall_bound_ms(&self) -> u64 {
        let hb = &self.cfg.heartbeat;
        hb.timeout_ms.saturating_sub(2 * hb.interval_ms)
    }

    /// Advances timers: heartbeats, adjacency expiry, health windows, Paxos
    /// deadlines, retries and cluster-change quanta.
    pub fn tick(&mut self, now: u64) -> Vec<Effect> {
        let now = self.advance(now);
        let mut out = Vec::new();
        let gap = now.saturating_sub(self.last_tick);
        self.last_tick = now;
        if gap > STALL_INTERVALS * self.cfg.heartbeat.interval_ms {
            self.on_stall(gap, now, &mut out);
        }
        if let Some((seq, targets)) = self.hb.due(now) {
            let (key, succession) = match &self.view {
                Some(v) => (v.key(), v.succession().to_vec()),
                None => (0, Vec::new()),
            };
            let hb = self.hb.build(seq, now, key, &succession);
            for to in targets {
                out.push(Effect::Send {
                    to,
                    msg: Message::Heartbeat(hb.clone()),
                });
            }
        }
        for (gone, incarnation) in self.hb.expire(now) {
            self.health.departed(gone, incarnation, now);
        }
        let adjacency = self.adjacency();
        self.health.tick(now, &adjacency);

        if self.round.as_ref().is_some_and(|r| now >= r.deadline) {
            self.on_round_deadline(now, &mut out);
        }
        self.resend(now, &mut out);
        if self.retry_at.is_some_and(|t| now >= t) {
            self.retry_at = None;
            self.consider_round(now, &mut out);
        }
        if now >= self.next_quantum {
            self.next_quantum += self.cfg.quantum_ms;
            if self.next_quantum <= now {
                self.next_quantum = now + self.cfg.quantum_ms;
            }
            self.on_quantum(now, &mut out);
        }
        out
    }

    /// The machine was not ticked for `gap` ms (see the module doc): the
    /// peers' liveness clocks move on by the gap; if the peers may have
    /// timed this node out, a view shared with others is given up (and the
    /// value it accepted forgotten) and the peers go through probation
    /// again.
    fn on_stall(&mut self, gap: u64, now: u64, out: &mut Vec<Effect>) {
        self.stats.stalls += 1;
        self.hb.credit_silence(gap, now);
        self.health.skip_stall(now);
        // A round of this node's that the stall outlived did not time out
        // waiting for its peers: their answers are queued, unread. It gets
        // the gap back, so they are read before it is concluded (without
        // them, a Prepare round would go on with nobody and commit a view
        // of this node alone).
        if let Some(round) = self.round.as_mut() {
            round.deadline = round.deadline.saturating_add(gap);
        }
        // What the peers may have timed out is not the gap between ticks but
        // the silence since this node's last heartbeat round (sent up to an
        // interval before the stall began), one interval longer if that
        // heartbeat was lost. A stall just under the timeout can leave every
        // peer having timed this node out and formed a view without it,
        // while it wakes up holding the old one and serves it; so the test
        // is whether they may have, not whether they must have.
        let (interval, timeout) = (
            self.cfg.heartbeat.interval_ms,
            self.cfg.heartbeat.timeout_ms,
        );
        let silent = self
            .hb
            .last_round()
            .map_or(gap, |sent| now.saturating_sub(sent))
            .max(gap);
        if silent.saturating_add(interval) <= timeout {
            return;
        }
        for peer in self.adjacency() {
            self.health.restarted(peer);
        }
        self.health.forget_departed();
        // To the peers as well this node is a restarted one: its later
        // incarnation puts it through their probation, as it puts them
        // through its own. A peer that never timed it out (the stall just
        // past the timeout) would otherwise keep it as its principal while
        // it admits no one, and refuse the next principal's view.
        self.hb.reincarnate(now);
        let me = self.cfg.node_id;
        if self
            .view
            .as_ref()
            .is_some_and(|view| view.succession().iter().any(|member| *member != me))
        {
            self.view = None;
            self.view_since = now;
            self.principal_lost_at = None;
            // The heartbeats queued during the stall still advertise the
            // view this node accepted: they must not bring it back.
            self.accepted = None;
            out.push(Effect::Orphaned);
        }
    }

    /// Counts any non-heartbeat message from `from` (replica writes,
    /// migrations, ...) as a surrogate heartbeat: it keeps an adjacent peer
    /// in the adjacency list. For the health score a surrogate only proves
    /// the peer alive; see [`crate::health`].
    pub fn on_fabric_message(&mut self, from: NodeId, now: u64) {
        let now = self.advance(now);
        self.surrogate(from, now);
    }

    fn surrogate(&mut self, from: NodeId, now: u64) {
        if from != self.cfg.node_id && self.hb.on_fabric_message(from, now) {
            self.health.record_surrogate(from, now);
        }
    }

    /// Handles one cluster message from `from`.
    pub fn on_message(&mut self, from: NodeId, msg: Message, now: u64) -> Vec<Effect> {
        let now = self.advance(now);
        let mut out = Vec::new();
        if from == self.cfg.node_id {
            return out;
        }
        match msg {
            Message::Heartbeat(hb) => {
                let outcome = self.hb.on_heartbeat(from, &hb, now);
                match outcome {
                    HeartbeatOutcome::Restarted => self.health.restarted(from),
                    HeartbeatOutcome::NewPeer => self.health.returned(from, hb.incarnation, now),
                    _ => {}
                }
                if matches!(
                    outcome,
                    HeartbeatOutcome::Fresh
                        | HeartbeatOutcome::NewPeer
                        | HeartbeatOutcome::Restarted
                ) {
                    // A brand-new peer is registered with the tracker on the
                    // next tick; its first window is discarded anyway.
                    self.health.record_heartbeat(from, now);
                    self.maybe_adopt(from, hb.cluster_key, now, &mut out);
                }
            }
            other => {
                self.surrogate(from, now);
                self.on_paxos(from, other, now, &mut out);
            }
        }
        out
    }

    fn send(&self, to: NodeId, msg: Message, out: &mut Vec<Effect>) {
        if let Some(addr) = self.hb.addr_of(to) {
            out.push(Effect::Send {
                to: addr.clone(),
                msg,
            });
        }
    }

    fn apply_view(&mut self, view: ClusterView, now: u64, out: &mut Vec<Effect>) {
        assert!(
            view.contains(self.cfg.node_id),
            "a node may only hold a view it belongs to"
        );
        if self.view.as_ref().map(ClusterView::key) == Some(view.key()) {
            return;
        }
        out.push(Effect::ViewChanged {
            cluster_key: view.key(),
            succession: view.succession().to_vec(),
        });
        self.view = Some(view);
        self.view_since = now;
        self.principal_lost_at = None;
        self.recluster = false;
        self.stats.views_applied += 1;
    }

    /// Commit learned through the principal's heartbeat.
    fn maybe_adopt(&mut self, from: NodeId, key: u64, now: u64, out: &mut Vec<Effect>) {
        let adopt = match &self.accepted {
            Some((ballot, v)) => {
                ballot.node == from
                    && v.key() == key
                    && self.view.as_ref().map(ClusterView::key) != Some(key)
            }
            None => false,
        };
        if adopt {
            if let Some((_, v)) = self.accepted.clone() {
                self.apply_view(v, now, out);
            }
        }
    }

    fn member_out_of_sync(&self, view: &ClusterView, now: u64) -> bool {
        if now.saturating_sub(self.view_since) < self.cfg.sync_grace_ms {
            return false;
        }
        view.succession().iter().any(|m| {
            *m != self.cfg.node_id
                && self.hb.peer(*m).is_some_and(|p| {
                    p.last_heartbeat >= self.view_since + self.cfg.sync_grace_ms
                        && p.cluster_key != view.key()
                })
        })
    }

    fn on_quantum(&mut self, now: u64, out: &mut Vec<Effect>) {
        self.quantum_index += 1;
        self.commits_this_quantum = 0;
        self.attempt = 0;
        self.stale_restarts = 0;
        self.deferred = false;
        self.retry_at = None;
        // Member side: did my principal move on without me?
        let my_principal = self.principal();
        if let Some(v) = &self.view {
            let p = v.principal();
            let me = self.cfg.node_id;
            if p == me && my_principal != me {
                // I lead a view but someone higher is now my principal; it
                // should take my members in. If it never admits me, the
                // view I lead is stale.
                let t = *self.principal_lost_at.get_or_insert(now);
                if now.saturating_sub(t) >= ORPHAN_AFTER_QUANTA * self.cfg.quantum_ms {
                    self.view = None;
                    self.view_since = now;
                    self.principal_lost_at = None;
                    out.push(Effect::Orphaned);
                }
            } else if p == me {
                self.principal_lost_at = None;
            } else if now.saturating_sub(self.view_since) >= self.cfg.sync_grace_ms {
                // Dropped: the principal holds another view, without this
                // node. A principal holding none (an orphan: it restarted,
                // or stalled past the timeout and gave its view up) dropped
                // no one; its members keep their view until the next
                // principal forms one, rather than all giving theirs up at
                // once and leaving the copies they hold out of the next view.
                let dropped = self.hb.peer(p).is_some_and(|ps| {
                    ps.last_heartbeat >= self.view_since + self.cfg.sync_grace_ms
                        && ps.cluster_key != v.key()
                        && ps.cluster_key != 0
                        && !ps.succession.contains(&me)
                });
                // A principal that vanished is normally replaced by the next
                // highest member within a quantum plus a retry; only if that
                // never happens (this node is not admitted by anyone) does
                // the node give the stale view up.
                let lost_since = match self.hb.peer(p) {
                    Some(_) => {
                        self.principal_lost_at = None;
                        None
                    }
                    None => Some(*self.principal_lost_at.get_or_insert(now)),
                };
                let abandoned = lost_since.is_some_and(|t| {
                    now.saturating_sub(t) >= ORPHAN_AFTER_QUANTA * self.cfg.quantum_ms
                });
                if dropped || abandoned {
                    self.view = None;
                    self.view_since = now;
                    self.principal_lost_at = None;
                    out.push(Effect::Orphaned);
                }
            }
        }
        if self.round.is_none() {
            self.consider_round(now, out);
        }
    }

    /// Starts a round if this node is its own principal and the view must
    /// change.
    fn consider_round(&mut self, now: u64, out: &mut Vec<Effect>) {
        let me = self.cfg.node_id;
        let eligible = self.eligible();
        if self.principal() != me || self.round.is_some() {
            return;
        }
        let needed = match &self.view {
            // An orphan (booted, or dropped from its view) does not form a
            // view without the peers it hears but has not admitted yet
            // (health probation): a node restarted under its old id would
            // otherwise form a cluster of itself and serve alone, on empty
            // copies, for as long as it takes to merge. The wait is bounded
            // by one probation plus two windows — long enough for healthy
            // peers to be admitted, shorter than the two quanta after which
            // a node whose principal it is would give up its own view — so
            // a peer that never passes probation (a flaky node) does not
            // hold it back for long.
            None => {
                let waiting = self
                    .hb
                    .adjacency()
                    .any(|id| self.health.admission_eta(id, now).is_some());
                let health = &self.cfg.health;
                let bound =
                    (u64::from(health.probation_windows) + 2).saturating_mul(health.window_ms);
                !waiting || now.saturating_sub(self.view_since) >= bound
            }
            Some(v) => {
                v.principal() != me
                    || self.recluster
                    || !v.succession().iter().copied().eq(eligible.iter().copied())
                    || self.member_out_of_sync(v, now)
            }
        };
        if !needed {
            return;
        }
        if !self.deferred {
            if let Some(wait) = self.settling_time(now, &eligible) {
                // One network event should give one view change: wait for
                // the rest of it (peers about to time out, peers about to
                // finish probation) instead of deciding twice.
                self.deferred = true;
                self.retry_at = Some(now + wait);
                return;
            }
        }
        self.start_round(now, eligible, out);
    }

    /// If some peers are in transition — silent for a while but not yet timed
    /// out, or heard but not yet through health probation — and all of them
    /// will be settled within half a quantum, how long to wait for that.
    ///
    /// When members of the view have left it (`eligible` lacks them), only
    /// members are waited for: the partitions a departed node mastered are
    /// unavailable until the view changes, and a newcomer on probation
    /// (a node booting, or a flaky one back in the adjacency, which may end
    /// its probation unhealthy) joins at a later change instead of holding
    /// the departure up by as much as half a quantum (membership simulator
    /// seed 389675 missed the departure bound so).
    fn settling_time(&self, now: u64, eligible: &BTreeSet<NodeId>) -> Option<u64> {
        let hb = self.hb.config();
        let suspect_after = 2 * hb.interval_ms;
        let view = self.view.as_ref();
        let departed = view.is_some_and(|v| {
            v.succession()
                .iter()
                .any(|member| !eligible.contains(member))
        });
        let mut wait = 0u64;
        for id in self.hb.adjacency() {
            let Some(p) = self.hb.peer(id) else { continue };
            let silence = now.saturating_sub(p.last_heard);
            if self.health.is_eligible(id) && silence > suspect_after {
                wait = wait.max(hb.timeout_ms.saturating_sub(silence) + hb.interval_ms);
            }
            let member = view.is_some_and(|v| v.succession().contains(&id));
            if departed && !member {
                continue;
            }
            if let Some(eta) = self.health.admission_eta(id, now) {
                wait = wait.max(eta + hb.interval_ms);
            }
        }
        (wait > 0 && wait <= self.cfg.quantum_ms / 2).then_some(wait)
    }

    fn start_round(&mut self, now: u64, eligible: BTreeSet<NodeId>, out: &mut Vec<Effect>) {
        let me = self.cfg.node_id;
        self.max_round = self.max_round.max(self.promised.round) + 1;
        let ballot = Ballot {
            round: self.max_round,
            node: me,
        };
        debug_assert!(ballot > self.promised);
        self.promised = ballot;
        self.stats.rounds_started += 1;
        let targets: BTreeSet<NodeId> = eligible.into_iter().filter(|id| *id != me).collect();
        for t in &targets {
            self.send(*t, Message::Prepare { ballot }, out);
        }
        let done = targets.is_empty();
        self.round = Some(Round {
            ballot,
            phase: Phase::Prepare {
                targets,
                promised: BTreeSet::new(),
                refused: BTreeMap::new(),
            },
            deadline: now + self.cfg.paxos_timeout_ms,
            resend_at: now + self.cfg.resend_ms,
        });
        if done {
            self.finish_prepare(now, out);
        }
    }

    fn abandon(&mut self, now: u64, retry: bool) {
        self.round = None;
        self.stats.rounds_abandoned += 1;
        if retry && self.attempt < 2 {
            self.attempt += 1;
            self.retry_at = Some(now + self.cfg.retry_delay_ms);
        }
    }

    fn finish_prepare(&mut self, now: u64, out: &mut Vec<Effect>) {
        let me = self.cfg.node_id;
        let Some(round) = self.round.take() else {
            return;
        };
        let Phase::Prepare {
            targets,
            promised,
            refused,
        } = round.phase
        else {
            self.round = Some(round);
            return;
        };
        // Every peer answered, and those that refused take this node for
        // their principal: they only hold a promise to a higher ballot (a
        // round someone else started and abandoned, which this node never
        // saw). Their Nacks told this node that ballot, so a new round at
        // once, above it, is promised — instead of the retry delay, or of
        // a view without them.
        let stale_promises_only = !refused.is_empty()
            && promised.len() + refused.len() == targets.len()
            && refused.values().all(|principal| *principal == me)
            && self.max_round > round.ballot.round;
        if stale_promises_only && self.stale_restarts < MAX_STALE_RESTARTS {
            self.stale_restarts += 1;
            self.stats.rounds_abandoned += 1;
            let eligible = self.eligible();
            self.start_round(now, eligible, out);
            return;
        }
        if promised != targets && self.attempt == 0 {
            self.abandon(now, true);
            return;
        }
        // The retry goes on without the peers that did not promise — unless
        // one of them refused for a principal this node still hears. Such a
        // peer is not lagging behind a dead principal: it is a member of a
        // live view (the principal came back from a stall this node timed
        // out, or it has not admitted this node yet), and a view formed
        // without it would serve its partitions a second time — a split
        // brain with nothing partitioned, down to a cluster of this node
        // alone when every peer refused. Wait instead: the principal takes
        // this node in, or the peers time it out and promise.
        if refused
            .values()
            .any(|principal| *principal != me && self.hb.peer(*principal).is_some())
        {
            self.stats.rounds_deferred_to_live_principal += 1;
            self.abandon(now, true);
            return;
        }
        let mut members = promised;
        members.insert(me);
        let succession: Vec<NodeId> = members.iter().copied().collect();
        let unchanged = !self.recluster
            && self.view.as_ref().is_some_and(|v| {
                v.principal() == me
                    && v.succession() == succession.as_slice()
                    && !self.member_out_of_sync(v, now)
            });
        if unchanged {
            self.abandon(now, false);
            return;
        }
        let prev = self.view.as_ref().map_or(0, ClusterView::key);
        let key = derive_cluster_key(round.ballot, now, prev, &succession);
        let Some(view) = ClusterView::new(key, succession) else {
            debug_assert!(false, "derived view is always valid");
            self.abandon(now, false);
            return;
        };
        debug_assert_eq!(view.principal(), me);
        self.accepted = Some((round.ballot, view.clone()));
        let pending: BTreeSet<NodeId> = members.into_iter().filter(|id| *id != me).collect();
        for m in &pending {
            self.send(
                *m,
                Message::Accept {
                    ballot: round.ballot,
                    view: view.clone(),
                },
                out,
            );
        }
        let ballot = round.ballot;
        let done = pending.is_empty();
        self.round = Some(Round {
            ballot,
            phase: Phase::Accept {
                view,
                pending,
                asked: targets,
            },
            deadline: now + self.cfg.paxos_timeout_ms,
            resend_at: now + self.cfg.resend_ms,
        });
        if done {
            self.commit(now, out);
        }
    }

    fn commit(&mut self, now: u64, out: &mut Vec<Effect>) {
        let Some(round) = self.round.take() else {
            return;
        };
        let Phase::Accept {
            view,
            pending,
            asked,
        } = round.phase
        else {
            self.round = Some(round);
            return;
        };
        debug_assert!(pending.is_empty());
        if self.dropped_member_back(&view, &asked) {
            // The round was decided on an eligible set that has changed
            // since: a member it drops for not being eligible then is
            // eligible again (its health recovered at a window close during
            // the round). Committed, the view would be changed back at the
            // next quantum — two changes for nothing (membership simulator
            // seed 348167). The value is not applied anywhere yet, so the
            // round is abandoned and the decision taken again on the
            // current eligible set. (A member the round asked and that did
            // not promise is left out on purpose; see `finish_prepare`.)
            self.stats.rounds_abandoned += 1;
            self.consider_round(now, out);
            return;
        }
        let unacked: BTreeSet<NodeId> = view
            .succession()
            .iter()
            .copied()
            .filter(|m| *m != self.cfg.node_id)
            .collect();
        for m in &unacked {
            self.send(
                *m,
                Message::Commit {
                    ballot: round.ballot,
                    view: view.clone(),
                },
                out,
            );
        }
        self.commit_delivery = (!unacked.is_empty()).then(|| CommitDelivery {
            ballot: round.ballot,
            view: view.clone(),
            unacked,
            resend_at: now + self.cfg.resend_ms,
            give_up_at: now + self.cfg.sync_grace_ms,
        });
        self.stats.rounds_committed += 1;
        self.commits_this_quantum += 1;
        self.last_commit_quantum = Some(self.quantum_index);
        // Decisions happen only at quanta: a quantum starts at most one
        // round that commits (retries follow abandoned rounds only).
        debug_assert!(self.commits_this_quantum <= 1, "two commits in one quantum");
        self.retry_at = None;
        self.apply_view(view, now, out);
    }

    /// Whether a member of the held view that `view` leaves out, and that
    /// the round did not ask (it was not eligible when the round began),
    /// is eligible (adjacent, admitted and healthy) now.
    fn dropped_member_back(&self, view: &ClusterView, asked: &BTreeSet<NodeId>) -> bool {
        let Some(held) = &self.view else {
            return false;
        };
        let eligible = self.eligible();
        held.succession().iter().any(|member| {
            !view.contains(*member) && !asked.contains(member) && eligible.contains(member)
        })
    }

    /// Retransmits unanswered Prepare/Accept messages of the running round
    /// and unacknowledged Commits of the last committed view, so a single
    /// lost message does not fail a round.
    fn resend(&mut self, now: u64, out: &mut Vec<Effect>) {
        let period = self.cfg.resend_ms;
        let mut sends: Vec<(NodeId, Message)> = Vec::new();
        if let Some(r) = &mut self.round {
            if now >= r.resend_at {
                r.resend_at = now + period;
                let ballot = r.ballot;
                match &r.phase {
                    Phase::Prepare {
                        targets,
                        promised,
                        refused,
                    } => {
                        for t in targets {
                            if !promised.contains(t) && !refused.contains_key(t) {
                                sends.push((*t, Message::Prepare { ballot }));
                            }
                        }
                    }
                    Phase::Accept { view, pending, .. } => {
                        for t in pending {
                            let view = view.clone();
                            sends.push((*t, Message::Accept { ballot, view }));
                        }
                    }
                }
            }
        }
        if let Some(cd) = &mut self.commit_delivery {
            let current = self.view.as_ref().map(ClusterView::key) == Some(cd.view.key());
            if now >= cd.give_up_at || !current {
                self.commit_delivery = None;
            } else if now >= cd.resend_at {
                cd.resend_at = now + period;
                for m in &cd.unacked {
                    let msg = Message::Commit {
                        ballot: cd.ballot,
                        view: cd.view.clone(),
                    };
                    sends.push((*m, msg));
                }
            }
        }
        for (to, msg) in sends {
            self.send(to, msg, out);
        }
    }

    fn on_round_deadline(&mut self, now: u64, out: &mut Vec<Effect>) {
        match self.round.as_ref().map(|r| &r.phase) {
            Some(Phase::Prepare { .. }) => self.finish_prepare(now, out),
            Some(Phase::Accept { .. }) => self.abandon(now, true),
            None => {}
        }
    }

    fn on_paxos(&mut self, from: NodeId, msg: Message, now: u64, out: &mut Vec<Effect>) {
        match msg {
            Message::Heartbeat(_) => {}
            Message::Prepare { ballot } => self.on_prepare(from, ballot, now, out),
            Message::Accept { ballot, view } => self.on_accept(from, ballot, view, out),
            Message::Commit { ballot, view } => self.on_commit(from, ballot, view, now, out),
            Message::Committed { ballot } => self.on_committed(from, ballot),
            Message::Promise { ballot } => self.on_promise(from, ballot, now, out),
            Message::Accepted { ballot } => self.on_accepted(from, ballot, now, out),
            Message::Nack {
                ballot,
                promised,
                principal,
            } => self.on_nack(from, ballot, promised, principal, now, out),
        }
    }

    /// Acceptor: promises a ballot of the node it takes for its principal.
    fn on_prepare(&mut self, from: NodeId, ballot: Ballot, now: u64, out: &mut Vec<Effect>) {
        let me = self.cfg.node_id;
        let principal = self.principal();
        self.max_round = self.max_round.max(ballot.round);
        // A self-promise from a round that already ended binds nobody.
        let stale_self = self.promised.node == me && self.round.is_none();
        if from == principal && ballot.node == from && (ballot >= self.promised || stale_self) {
            self.promised = ballot;
            if self.round.is_some() {
                // Someone higher leads now.
                self.abandon(now, false);
            }
            self.send(from, Message::Promise { ballot }, out);
        } else {
            self.nack(from, ballot, out);
        }
    }

    /// Acceptor: accepts a view its principal proposes under a ballot it
    /// promised.
    fn on_accept(
        &mut self,
        from: NodeId,
        ballot: Ballot,
        view: ClusterView,
        out: &mut Vec<Effect>,
    ) {
        let me = self.cfg.node_id;
        let ok = ballot >= self.promised
            && ballot.node == from
            && view.principal() == from
            && view.contains(me)
            && self.principal() == from;
        if ok {
            self.promised = ballot;
            self.accepted = Some((ballot, view));
            self.send(from, Message::Accepted { ballot }, out);
        } else {
            self.nack(from, ballot, out);
        }
    }

    /// Acceptor: applies the view it accepted, and acknowledges a view it
    /// holds (a repeated Commit included).
    fn on_commit(
        &mut self,
        from: NodeId,
        ballot: Ballot,
        view: ClusterView,
        now: u64,
        out: &mut Vec<Effect>,
    ) {
        let matches = self
            .accepted
            .as_ref()
            .is_some_and(|(b, v)| *b == ballot && *v == view);
        let key = view.key();
        if matches && ballot.node == from {
            self.apply_view(view, now, out);
        }
        let holds = self.view.as_ref().is_some_and(|v| v.key() == key);
        if holds {
            self.send(from, Message::Committed { ballot }, out);
        }
    }

    /// Principal: a member holds the committed view; stop resending it.
    fn on_committed(&mut self, from: NodeId, ballot: Ballot) {
        if let Some(cd) = &mut self.commit_delivery {
            if cd.ballot == ballot {
                cd.unacked.remove(&from);
                if cd.unacked.is_empty() {
                    self.commit_delivery = None;
                }
            }
        }
    }

    /// Principal: counts a promise; the prepare phase ends when every
    /// target answered.
    fn on_promise(&mut self, from: NodeId, ballot: Ballot, now: u64, out: &mut Vec<Effect>) {
        let mut finish = false;
        if let Some(Round {
            ballot: b,
            phase:
                Phase::Prepare {
                    targets,
                    promised,
                    refused,
                },
            ..
        }) = &mut self.round
        {
            if *b == ballot && targets.contains(&from) && !refused.contains_key(&from) {
                promised.insert(from);
                finish = promised.len() + refused.len() == targets.len();
            }
        }
        if finish {
            self.finish_prepare(now, out);
        }
    }

    /// Principal: counts an acceptance; the view commits when every member
    /// accepted.
    fn on_accepted(&mut self, from: NodeId, ballot: Ballot, now: u64, out: &mut Vec<Effect>) {
        let mut finish = false;
        if let Some(Round {
            ballot: b,
            phase: Phase::Accept { pending, .. },
            ..
        }) = &mut self.round
        {
            if *b == ballot {
                pending.remove(&from);
                finish = pending.is_empty();
            }
        }
        if finish {
            self.commit(now, out);
        }
    }

    /// Principal: a refusal. In the prepare phase it counts as an answer
    /// (with the principal the peer follows); in the accept phase it ends
    /// the round, to be retried.
    fn on_nack(
        &mut self,
        from: NodeId,
        ballot: Ballot,
        promised: Ballot,
        principal: NodeId,
        now: u64,
        out: &mut Vec<Effect>,
    ) {
        self.max_round = self.max_round.max(promised.round);
        let mut finish = false;
        let mut abort = false;
        match &mut self.round {
            Some(Round {
                ballot: b,
                phase:
                    Phase::Prepare {
                        targets,
                        promised: got,
                        refused,
                    },
                ..
            }) if *b == ballot && targets.contains(&from) && !got.contains(&from) => {
                refused.insert(from, principal);
                finish = got.len() + refused.len() == targets.len();
            }
            Some(Round {
                ballot: b,
                phase: Phase::Accept { pending, .. },
                ..
            }) if *b == ballot && pending.contains(&from) => abort = true,
            _ => {}
        }
        if finish {
            self.finish_prepare(now, out);
        } else if abort {
            self.abandon(now, true);
        }
    }

    fn nack(&self, to: NodeId, ballot: Ballot, out: &mut Vec<Effect>) {
        let msg = Message::Nack {
            ballot,
            promised: self.promised,
            principal: self.principal(),
        };
        self.send(to, msg, out);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::message::Envelope;

    fn addr(i: usize) -> PeerAddr {
        PeerAddr::new(format!("n{i}")).expect("addr")
    }

    /// A lossless network with 1 ms latency, optional cut links and a
    /// record of every view change.
    struct Net {
        nodes: Vec<Option<ClusterNode>>,
        ids: Vec<NodeId>,
        queue: Vec<(u64, usize, Vec<u8>)>,
        cut: BTreeSet<(usize, usize)>,
        /// Nodes not ticked, their messages held until they thaw.
        frozen: BTreeSet<usize>,
        /// How far each node's clock is ahead of the network's (ms).
        clocks: Vec<u64>,
        changes: Vec<(u64, usize, u64)>,
        now: u64,
    }

    impl Net {
        fn new(ids: &[u64]) -> Net {
            let n = ids.len();
            let nodes = (0..n)
                .map(|i| {
                    let cfg = ClusterConfig::new(NodeId(ids[i]), addr(i), vec![addr(0)]);
                    Some(ClusterNode::new(cfg, 0).expect("valid config"))
                })
                .collect();
            Net {
                nodes,
                ids: ids.iter().copied().map(NodeId).collect(),
                queue: Vec::new(),
                cut: BTreeSet::new(),
                frozen: BTreeSet::new(),
                clocks: vec![0; n],
                changes: Vec::new(),
                now: 0,
            }
        }

        fn index_of(&self, a: &PeerAddr) -> Option<usize> {
            a.as_str().strip_prefix('n')?.parse().ok()
        }

        fn handle(&mut self, from: usize, effects: Vec<Effect>) {
            for e in effects {
                match e {
                    Effect::Send { to, msg } => {
                        let Some(j) = self.index_of(&to) else {
                            continue;
                        };
                        if self.cut.contains(&(from, j)) {
                            continue;
                        }
                        let env = Envelope {
                            from: self.ids[from],
                            msg,
                        };
                        self.queue.push((self.now + 1, j, env.encode()));
                    }
                    Effect::ViewChanged { cluster_key, .. } => {
                        self.changes.push((self.now, from, cluster_key));
                    }
                    Effect::Orphaned => self.changes.push((self.now, from, 0)),
                }
            }
        }

        fn run_until(&mut self, end: u64) {
            while self.now < end {
                self.now += 5;
                let now = self.now;
                let frozen = &self.frozen;
                let (due, rest): (Vec<_>, Vec<_>) = self
                    .queue
                    .drain(..)
                    .partition(|(t, to, _)| *t <= now && !frozen.contains(to));
                self.queue = rest;
                for (_, to, bytes) in due {
                    let env = Envelope::decode(&bytes).expect("own encoding decodes");
                    if let Some(node) = self.nodes[to].as_mut() {
                        let eff = node.on_message(env.from, env.msg, now + self.clocks[to]);
                        self.handle(to, eff);
                    }
                }
                for i in 0..self.nodes.len() {
                    if self.frozen.contains(&i) {
                        continue;
                    }
                    if let Some(node) = self.nodes[i].as_mut() {
                        let eff = node.tick(now + self.clocks[i]);
                        self.handle(i, eff);
                    }
                }
            }
        }

        /// Node `i` carries on: it is ticked before it reads the messages
        /// held for it (the order a thawed event loop may well pick).
        fn thaw(&mut self, i: usize) {
            self.frozen.remove(&i);
            if let Some(node) = self.nodes[i].as_mut() {
                let eff = node.tick(self.now + self.clocks[i]);
                self.handle(i, eff);
            }
        }

        fn view(&self, i: usize) -> Option<(u64, Vec<NodeId>)> {
            let v = self.nodes[i].as_ref()?.view()?;
            Some((v.key(), v.succession().to_vec()))
        }

        fn split(&mut self, a: &[usize], b: &[usize]) {
            for &x in a {
                for &y in b {
                    self.cut.insert((x, y));
                    self.cut.insert((y, x));
                }
            }
        }
    }

    fn sorted_ids(ids: &[u64]) -> Vec<NodeId> {
        let mut v: Vec<NodeId> = ids.iter().copied().map(NodeId).collect();
        v.sort();
        v
    }

    #[test]
    fn nodes_converge_to_one_view_led_by_highest_id() {
        let ids = [30, 10, 50, 20];
        let mut net = Net::new(&ids);
        net.run_until(15_000);
        let first = net.view(0).expect("node 0 has a view");
        assert_eq!(first.1, sorted_ids(&ids));
        for i in 1..ids.len() {
            assert_eq!(net.view(i), Some(first.clone()), "node {i}");
        }
        // Stable: no change during the next 10 quanta.
        let before = net.changes.len();
        net.run_until(45_000);
        assert_eq!(net.changes.len(), before, "{:?}", &net.changes[before..]);
    }

    #[test]
    fn view_changes_happen_only_at_quantum_boundaries() {
        let ids = [1, 2, 3];
        let mut net = Net::new(&ids);
        net.run_until(15_000);
        // Every node boots at 0 with a 3000 ms quantum. The principal (id 3,
        // index 2) decides at 3000, 6000, ...; a round takes a few ms, a
        // retried round at most retry_delay + 2 paxos timeouts more.
        for (t, who, _) in &net.changes {
            if *who == 2 {
                let into = t % 3000;
                assert!(into <= 1500 + 2 * 500 + 20, "change at {t}");
            }
        }
    }

    #[test]
    fn departed_node_is_removed_within_timeout_plus_quantum() {
        let ids = [5, 9, 7, 3];
        let mut net = Net::new(&ids);
        net.run_until(15_000);
        assert_eq!(net.view(0).map(|v| v.1.len()), Some(4));
        // Crash the principal (id 9).
        net.nodes[1] = None;
        let crash = net.now;
        let timeout = 1500;
        let quantum = 3000;
        let retry = 1500 + 2 * 500;
        net.run_until(crash + timeout + quantum + retry + 100);
        for i in [0, 2, 3] {
            let v = net.view(i).expect("view");
            assert_eq!(v.1, sorted_ids(&[3, 5, 7]), "node {i}");
        }
        assert_eq!(net.view(0), net.view(2));
        assert_eq!(net.view(0), net.view(3));
    }

    #[test]
    fn a_departure_does_not_wait_for_a_newcomer_on_probation() {
        // Ids 5, 9, 7, 3 form a view; id 8 boots at 15 400 and is on
        // probation until about 19 000; id 3 crashes at 16 000 and has timed
        // out by the principal's (id 9) quantum at 18 000.
        let ids = [5, 9, 7, 3, 8];
        let mut net = Net::new(&ids);
        net.nodes[4] = None;
        net.run_until(15_400);
        assert_eq!(net.view(0).map(|v| v.1), Some(sorted_ids(&[3, 5, 7, 9])));
        let cfg = ClusterConfig::new(NodeId(8), addr(4), vec![addr(0)]);
        net.nodes[4] = Some(ClusterNode::new(cfg, net.now).expect("valid config"));
        net.run_until(16_000);
        net.nodes[3] = None;
        net.run_until(18_000);
        assert!(
            net.nodes[1]
                .as_ref()
                .is_some_and(|p| p.health().admission_eta(NodeId(8), 18_000).is_some()),
            "the newcomer is still on probation at the quantum"
        );
        let before = net.changes.len();
        net.run_until(18_500);
        // The departure is handled at that quantum, without the newcomer...
        let principal_changes: Vec<_> = net.changes[before..]
            .iter()
            .filter(|(_, who, _)| *who == 1)
            .collect();
        assert_eq!(principal_changes.len(), 1, "{:?}", &net.changes[before..]);
        assert_eq!(net.view(1).map(|v| v.1), Some(sorted_ids(&[5, 7, 9])));
        // ...which joins at a later one.
        net.run_until(25_000);
        for i in [0, 1, 2, 4] {
            assert_eq!(
                net.view(i).map(|v| v.1),
                Some(sorted_ids(&[5, 7, 8, 9])),
                "node {i}"
            );
        }
    }

    #[test]
    fn partitions_form_two_views_and_merge_in_one_change() {
        let ids = [11, 12, 13, 14, 15, 16];
        let mut net = Net::new(&ids);
        for (i, id) in ids.iter().enumerate() {
            let cfg = ClusterConfig::new(NodeId(*id), addr(i), vec![addr(0), addr(3)]);
            net.nodes[i] = Some(ClusterNode::new(cfg, 0).expect("cfg"));
        }
        net.split(&[0, 1, 2], &[3, 4, 5]);
        net.run_until(20_000);
        assert_eq!(net.view(0).map(|v| v.1), Some(sorted_ids(&[11, 12, 13])));
        assert_eq!(net.view(3).map(|v| v.1), Some(sorted_ids(&[14, 15, 16])));
        net.cut.clear();
        let healed_at = net.now;
        net.run_until(healed_at + 20_000);
        let v0 = net.view(0).expect("view");
        assert_eq!(v0.1, sorted_ids(&ids));
        for i in 1..6 {
            assert_eq!(net.view(i), Some(v0.clone()), "node {i}");
        }
        // Every node changed view exactly once after the heal: straight
        // into the merged view.
        for i in 0..6 {
            let after: Vec<_> = net
                .changes
                .iter()
                .filter(|(t, who, _)| *who == i && *t > healed_at)
                .collect();
            assert_eq!(after.len(), 1, "node {i}: {after:?}");
        }
    }

    #[test]
    fn a_principal_goes_above_a_stale_promise_at_once() {
        // Node 0 (id 1) holds a promise to a ballot above any its principal
        // (id 3) has used — left by a round that was abandoned. When node 1
        // (id 2) dies, the principal's first Prepare is refused by node 0
        // for that promise although node 0 names it as its principal: it
        // starts again above the promise at once, instead of waiting for
        // the retry delay.
        let ids = [1, 2, 3];
        let mut net = Net::new(&ids);
        net.run_until(15_000);
        let high = Ballot {
            round: 50,
            node: NodeId(3),
        };
        let node = net.nodes[0].as_mut().expect("alive");
        let out = node.on_message(NodeId(3), Message::Prepare { ballot: high }, net.now);
        assert!(
            matches!(
                out.as_slice(),
                [Effect::Send {
                    msg: Message::Promise { .. },
                    ..
                }]
            ),
            "{out:?}"
        );
        net.nodes[1] = None;
        let started = |net: &Net| {
            net.nodes[2]
                .as_ref()
                .map_or(0, |n| n.stats().rounds_started)
        };
        let before = started(&net);
        let mut first_round = None;
        let end = net.now + 10_000;
        let changed = |net: &Net| {
            [0, 2]
                .iter()
                .all(|i| net.view(*i).map(|v| v.1) == Some(sorted_ids(&[1, 3])))
        };
        while net.now < end && !changed(&net) {
            net.run_until(net.now + 5);
            if first_round.is_none() && started(&net) > before {
                first_round = Some(net.now);
            }
        }
        assert!(changed(&net), "{:?}", net.changes);
        let first_round = first_round.expect("the principal started a round");
        assert!(
            net.now - first_round < 100,
            "the view came {} ms after the first round: {:?}",
            net.now - first_round,
            net.changes
        );
        assert_eq!(started(&net) - before, 2, "one restart, above the promise");
    }

    #[test]
    fn prepare_from_non_principal_is_refused() {
        let ids = [1, 2, 3];
        let mut net = Net::new(&ids);
        net.run_until(15_000);
        let node = net.nodes[0].as_mut().expect("alive");
        let now = 15_001;
        let bogus = Ballot {
            round: 1_000,
            node: NodeId(2),
        };
        let out = node.on_message(NodeId(2), Message::Prepare { ballot: bogus }, now);
        assert!(
            matches!(out.as_slice(), [Effect::Send { msg: Message::Nack { principal, .. }, .. }] if *principal == NodeId(3)),
            "{out:?}"
        );
        // An Accept for a view without a promise is refused too.
        let view = ClusterView::new(99, vec![NodeId(1), NodeId(2)]).expect("v");
        let out = node.on_message(
            NodeId(2),
            Message::Accept {
                ballot: bogus,
                view,
            },
            now,
        );
        assert!(matches!(
            out.as_slice(),
            [Effect::Send {
                msg: Message::Nack { .. },
                ..
            }]
        ));
        // A Commit of a value never accepted is ignored.
        let view = ClusterView::new(98, vec![NodeId(1), NodeId(3)]).expect("v");
        let before = node.view().cloned();
        let out = node.on_message(
            NodeId(3),
            Message::Commit {
                ballot: bogus,
                view,
            },
            now,
        );
        assert!(out.is_empty());
        assert_eq!(node.view().cloned(), before);
    }

    /// Freezes node `frozen` of a converged three-node cluster for
    /// `freeze_ms`, thaws it, and runs for 20 s more, checking at every
    /// step that it never holds a view of itself alone. Returns the net.
    fn freeze_and_thaw(frozen: usize, freeze_ms: u64) -> Net {
        freeze_and_thaw_after_quiet(frozen, freeze_ms, 0)
    }

    /// As [`freeze_and_thaw`], the frozen node's messages to node 1 lost
    /// for the `quiet_ms` before the freeze (which starts at 15 s): node 1
    /// times it out earlier than node 0 does. After the thaw, the nodes
    /// never frozen always share their views.
    fn freeze_and_thaw_after_quiet(frozen: usize, freeze_ms: u64, quiet_ms: u64) -> Net {
        let ids = [1, 2, 3];
        let mut net = Net::new(&ids);
        net.run_until(15_000 - quiet_ms);
        net.cut.insert((frozen, 1));
        net.run_until(15_000);
        net.cut.clear();
        let whole = net.view(0).expect("a view");
        assert_eq!(whole.1, sorted_ids(&ids));
        net.frozen.insert(frozen);
        net.run_until(net.now + freeze_ms);
        net.thaw(frozen);
        let end = net.now + 20_000;
        let others: Vec<NodeId> = (0..ids.len())
            .filter(|i| *i != frozen)
            .map(|i| NodeId(ids[i]))
            .collect();
        while net.now < end {
            net.run_until(net.now + 5);
            for i in (0..ids.len()).filter(|i| *i != frozen) {
                if let Some((_, members)) = net.view(i) {
                    assert!(
                        others.iter().all(|id| members.contains(id)),
                        "node {i} holds a view without a node never frozen at {}: {members:?} in {:?}",
                        net.now,
                        net.changes
                    );
                }
            }
            if let Some((key, members)) = net.view(frozen) {
                assert!(
                    members.len() > 1,
                    "the thawed node holds a view of itself alone at {}: {:?}",
                    net.now,
                    net.changes
                );
                assert!(
                    key != whole.0 || freeze_ms <= 1_500,
                    "the thawed node went back to its stale view at {}: {:?}",
                    net.now,
                    net.changes
                );
            }
        }
        net
    }

    #[test]
    fn a_node_frozen_past_the_timeout_is_an_orphan_until_admitted_again() {
        // A member (id 1) and the principal (id 3), each frozen for 4 s:
        // the others form a view without it meanwhile.
        for frozen in [0, 2] {
            let freeze_started = 15_000;
            let net = freeze_and_thaw(frozen, 4_000);
            let thawed_at = freeze_started + 4_000;
            let node = net.nodes[frozen].as_ref().expect("node");
            assert_eq!(node.stats().stalls, 1, "node {frozen}");
            // It gave its view up at the thaw, before anything else.
            let own: Vec<&(u64, usize, u64)> = net
                .changes
                .iter()
                .filter(|(t, who, _)| *who == frozen && *t >= thawed_at)
                .collect();
            assert_eq!(
                own.first().map(|c| (c.0, c.2)),
                Some((thawed_at, 0)),
                "{own:?}"
            );
            // Then all three share one view again.
            let whole = net.view(0).expect("a view");
            assert_eq!(whole.1, sorted_ids(&[1, 2, 3]), "{:?}", net.changes);
            assert_eq!(net.view(1), Some(whole.clone()));
            assert_eq!(net.view(2), Some(whole));
        }
    }

    #[test]
    fn a_principal_frozen_just_past_the_timeout_takes_no_member_out() {
        // The principal (id 3) frozen for about the heartbeat timeout: its
        // members may or may not have timed it out, or formed the next view,
        // when it thaws and gives its view up. Either way none of them gives
        // its view up too (a member without a view serves nothing, and two
        // members out at once would leave partitions whose copies they hold
        // out of the next view), and all three share a view again.
        // Node 1, next in line, may also time it out earlier than node 0
        // does (its last heartbeats to node 1 lost): then node 0 still has
        // it for its principal when it thaws, and node 1 forms the next
        // view.
        for (quiet_ms, freeze_ms) in [0, 400, 800, 1_200]
            .into_iter()
            .flat_map(|quiet| (1_300..1_800).step_by(20).map(move |ms| (quiet, ms)))
        {
            let net = freeze_and_thaw_after_quiet(2, freeze_ms, quiet_ms);
            let members_out: Vec<_> = net
                .changes
                .iter()
                .filter(|(t, who, key)| *t >= 15_000 && *who != 2 && *key == 0)
                .collect();
            assert!(
                members_out.is_empty(),
                "frozen {freeze_ms} ms after {quiet_ms}: {members_out:?} in {:?}",
                net.changes
            );
            let whole = net.view(0).expect("a view");
            assert_eq!(
                whole.1,
                sorted_ids(&[1, 2, 3]),
                "frozen {freeze_ms} ms after {quiet_ms}"
            );
            assert_eq!(net.view(1), Some(whole.clone()));
            assert_eq!(net.view(2), Some(whole));
        }
    }

    #[test]
    fn members_measure_the_clock_skew_between_them() {
        // Clocks 40 ms and 250 ms ahead of node 0's. Messages take 1–5 ms
        // here, which each offset sample is short by.
        let mut net = Net::new(&[1, 2, 3]);
        net.clocks = vec![0, 40, 250];
        assert_eq!(
            net.nodes[0].as_ref().map(ClusterNode::clock_skew_ms),
            Some(0)
        );
        net.run_until(15_000);
        assert_eq!(net.view(0).map(|v| v.1.len()), Some(3));
        for i in 0..3 {
            let skew = net.nodes[i].as_ref().map_or(0, ClusterNode::clock_skew_ms);
            // From node 1 the others are 40 behind and 210 ahead.
            assert!((245..=255).contains(&skew), "node {i}: {skew}");
        }
        // A member that left the view no longer counts.
        net.nodes[2] = None;
        net.run_until(25_000);
        assert_eq!(net.view(0).map(|v| v.1.len()), Some(2));
        let skew = net.nodes[0].as_ref().map_or(0, ClusterNode::clock_skew_ms);
        assert!((35..=45).contains(&skew), "{skew}");
    }

    #[test]
    fn a_node_frozen_just_under_the_timeout_serves_no_view_its_peers_left() {
        // Frozen for a little less than the timeout, a node may still be
        // timed out by its peers: they last heard it up to a heartbeat
        // interval before the freeze began. Whatever they did, it must not
        // wake up holding a view whose other members have moved on to a
        // view without it (it would serve partitions they serve too).
        // The freeze starts at every phase of the heartbeat round.
        let cases = [0, 2].into_iter().flat_map(|frozen| {
            (1_300..1_500)
                .step_by(25)
                .flat_map(move |ms| (0..150).step_by(25).map(move |phase| (frozen, ms, phase)))
        });
        for (frozen, freeze_ms, phase) in cases {
            let ids = [1, 2, 3];
            let mut net = Net::new(&ids);
            net.run_until(15_000 + phase);
            net.frozen.insert(frozen);
            net.run_until(net.now + freeze_ms);
            net.thaw(frozen);
            let me = NodeId(ids[frozen]);
            let end = net.now + 15_000;
            // Since when the frozen node's view has been left by a peer
            // (a commit reaches the members a few ms after the
            // principal applies it: only a lasting split counts).
            let mut left_since: Option<u64> = None;
            while net.now < end {
                net.run_until(net.now + 5);
                let left = net.view(frozen).and_then(|(key, members)| {
                        ids.iter().enumerate().find_map(|(i, id)| {
                            if i == frozen || !members.contains(&NodeId(*id)) {
                                return None;
                            }
                            let (theirs, their_members) = net.view(i)?;
                            (theirs != key && !their_members.contains(&me))
                                .then(|| format!("holds {key:x} {members:?} while node {i} moved on to {theirs:x} {their_members:?}"))
                        })
                    });
                match left {
                    Some(what) => {
                        let since = *left_since.get_or_insert(net.now);
                        assert!(
                            net.now - since <= 50,
                            "node {frozen}, frozen {freeze_ms} ms, {what} since {since}: {:?}",
                            net.changes
                        );
                    }
                    None => left_since = None,
                }
            }
            for i in 0..ids.len() {
                assert_eq!(net.view(i).map(|v| v.1), Some(sorted_ids(&ids)), "node {i}");
            }
        }
    }

    #[test]
    fn a_retry_waits_for_peers_that_follow_a_principal_still_heard() {
        // Node 1 (id 2, next in line) loses the principal's (id 3)
        // heartbeats for a little longer than the timeout while node 0
        // (id 1) keeps hearing it: node 1 times the principal out, hears it
        // again once the loss ends, but holds it on probation, so it is its
        // own principal and proposes. Node 0 refuses for the principal it
        // follows. The retry must not go on without node 0 (a view of node
        // 1 alone, serving every partition a second time beside the whole
        // cluster's view): node 1 hears the principal node 0 names.
        let ids = [1, 2, 3];
        let mut deferred = 0;
        for offset in (0..3_000).step_by(250) {
            for lost_ms in [1_600, 1_800] {
                let mut net = Net::new(&ids);
                let start = 15_000 + offset;
                net.run_until(start);
                let whole = net.view(0).expect("a view");
                assert_eq!(whole.1, sorted_ids(&ids));
                net.cut.insert((2, 1));
                net.run_until(start + lost_ms);
                net.cut.clear();
                let end = net.now + 15_000;
                while net.now < end {
                    net.run_until(net.now + 5);
                    for i in 0..ids.len() {
                        if let Some((_, members)) = net.view(i) {
                            assert!(
                                members.len() == ids.len(),
                                "node {i} holds {members:?} at {} (lost {lost_ms} ms from {start}): {:?}",
                                net.now,
                                net.changes
                            );
                        }
                    }
                }
                deferred += net.nodes[1]
                    .as_ref()
                    .map_or(0, |node| node.stats().rounds_deferred_to_live_principal);
                for i in 0..ids.len() {
                    assert_eq!(net.view(i).map(|v| v.1), Some(sorted_ids(&ids)), "node {i}");
                }
            }
        }
        // The case this test is about happened (node 1 did propose, and its
        // retry met node 0's refusal).
        assert!(deferred > 0, "no retry was deferred to the live principal");
    }

    #[test]
    fn a_principal_frozen_in_its_round_forms_no_view_of_itself() {
        // The principal's first round fails (the promises are lost); it
        // freezes right after it sent the Prepare of its retry, which goes
        // on with whoever promised. The promises wait in its socket.
        // Thawed, it ticks first: the retry's deadline has passed by the
        // clock, but not by the time it ran.
        let ids = [1, 2, 3];
        let proposing = |net: &Net, retry: bool| {
            (0..ids.len()).find(|&i| {
                net.nodes[i].as_ref().is_some_and(|node| {
                    (node.attempt > 0) == retry
                        && node
                            .round
                            .as_ref()
                            .is_some_and(|round| matches!(round.phase, Phase::Prepare { .. }))
                })
            })
        };
        for freeze_ms in [400, 800, 1_200] {
            let mut net = Net::new(&ids);
            let principal = loop {
                net.run_until(net.now + 5);
                if let Some(i) = proposing(&net, false) {
                    break i;
                }
                assert!(net.now < 20_000, "no round began");
            };
            // Its peers' answers to the first round are lost (the round
            // alone: their heartbeats reach it again before it times them
            // out).
            for peer in (0..ids.len()).filter(|peer| *peer != principal) {
                net.cut.insert((peer, principal));
            }
            while net.nodes[principal]
                .as_ref()
                .is_some_and(|node| node.round.is_some())
            {
                net.run_until(net.now + 5);
            }
            net.cut.clear();
            while proposing(&net, true) != Some(principal) {
                net.run_until(net.now + 5);
                assert!(net.now < 30_000, "no retry began");
            }
            net.frozen.insert(principal);
            net.run_until(net.now + freeze_ms);
            net.thaw(principal);
            let end = net.now + 10_000;
            while net.now < end {
                net.run_until(net.now + 5);
                if let Some((_, members)) = net.view(principal) {
                    assert!(
                        members.len() > 1,
                        "frozen {freeze_ms} ms in its round, the principal formed a view of itself alone at {}: {:?}",
                        net.now,
                        net.changes
                    );
                }
            }
            for i in 0..ids.len() {
                assert_eq!(net.view(i).map(|v| v.1), Some(sorted_ids(&ids)), "node {i}");
            }
        }
    }

    #[test]
    fn a_short_stall_changes_no_view() {
        // 900 ms frozen (six heartbeat intervals, under the 1.5 s timeout):
        // the stall is noticed, and no node changes its view.
        let net = freeze_and_thaw(0, 900);
        assert_eq!(net.nodes[0].as_ref().map(|n| n.stats().stalls), Some(1));
        let after: Vec<_> = net.changes.iter().filter(|(t, _, _)| *t > 15_000).collect();
        assert!(after.is_empty(), "{after:?}");
    }

    #[test]
    fn a_recluster_asked_of_the_principal_gives_a_new_view_of_the_same_members() {
        let ids = [1, 2, 3];
        let mut net = Net::new(&ids);
        net.run_until(15_000);
        let (key, members) = net.view(0).expect("a view");
        // Asked of a member that is not the principal: nothing happens,
        // and the request is not kept.
        net.nodes[0].as_mut().expect("node").request_recluster();
        net.run_until(24_000);
        assert_eq!(net.view(0), Some((key, members.clone())));
        // Asked of the principal (id 3): one new view, same members, every
        // node in it.
        net.nodes[2].as_mut().expect("node").request_recluster();
        net.run_until(30_000);
        let (new_key, new_members) = net.view(2).expect("a view");
        assert_ne!(new_key, key);
        assert_eq!(new_members, members);
        for i in 0..2 {
            assert_eq!(net.view(i), Some((new_key, members.clone())), "node {i}");
        }
        let before = net.changes.len();
        net.run_until(45_000);
        assert_eq!(net.changes.len(), before, "once");
    }

    #[test]
    fn lone_node_forms_a_solo_view_at_its_first_quantum() {
        let cfg = ClusterConfig::new(NodeId(4), addr(0), vec![addr(1)]);
        let mut node = ClusterNode::new(cfg, 100).expect("cfg");
        let mut changes = Vec::new();
        let mut t = 100;
        while t < 3200 {
            for e in node.tick(t) {
                if let Effect::ViewChanged { succession, .. } = e {
                    changes.push((t, succession));
                }
            }
            t += 10;
        }
        assert_eq!(changes, vec![(3100, vec![NodeId(4)])]);
    }

    #[test]
    fn config_validation() {
        let mut cfg = ClusterConfig::new(NodeId(1), addr(0), vec![]);
        assert!(cfg.validate().is_ok());
        cfg.heartbeat.timeout_ms = cfg.heartbeat.interval_ms;
        assert!(cfg.validate().is_err());
        let mut cfg = ClusterConfig::new(NodeId(1), addr(0), vec![]);
        cfg.quantum_ms = cfg.paxos_timeout_ms;
        assert!(ClusterNode::new(cfg, 0).is_err());
    }
}
