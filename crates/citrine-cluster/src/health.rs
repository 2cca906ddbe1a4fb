//! Node health score (001 §2.1.2.2): windowed heartbeat loss, exponentially
//! smoothed, with outlier detection across peers.
//!
//! Owns: per-peer loss estimates and the resulting healthy/unhealthy verdicts.
//!
//! Only heartbeats are counted, as in the paper. Per window of `window_ms`
//! the loss is `l_w = (expected - received) /
//! expected` with `expected = window_ms / interval_ms`, and the average is
//! `l_a = alpha * l_a + (1 - alpha) * l_w` (alpha = 0.95 in the paper).
//! Deviations from the paper, all deliberate:
//! - when surrogate messages kept arriving after the last heartbeat of a
//!   window, the peer is alive and only its heartbeat channel went silent,
//!   which per 001 §2.1.2.1 must not affect the cluster view: the window is
//!   judged only up to its last heartbeat (and skipped if it had none).
//!   Likewise when the heartbeat channel was silent through the whole
//!   previous window (surrogates only) and surrogates arrived before the
//!   first heartbeat of this one (the channel came back mid-window), it is
//!   judged only from its first heartbeat: judged whole, the window in
//!   which a heartbeat-only cut heals counts the cut's half as loss (a
//!   principal evicted a member a second after such a cut healed, and
//!   admitted it back a window later: membership simulator seed 301840).
//!   The previous window's silence is required because a lossy node that
//!   talks a lot (an orphan resending its Paxos prepares every 100 ms)
//!   often has a surrogate arrive before its first heartbeat of a window:
//!   judged from that heartbeat, its loss came out low enough to pass
//!   probation (seeds 380411, 389675). A node that is erratic on every
//!   channel still delivers heartbeats spread over the window, so its
//!   windows keep counting;
//! - the average is bias-corrected (`l_a / (1 - alpha^k)` after `k` windows),
//!   so a newly seen peer is judged on the windows observed so far instead
//!   of on an optimistic zero prior;
//! - a peer's first, partial window is discarded, and a peer is *on
//!   probation* (neither healthy nor unhealthy, thus not admitted) until
//!   `probation_windows` full windows have been observed;
//! - "more than two standard deviations above the mean" is evaluated against
//!   the mean and deviation of the *other* peers (leave-one-out), because
//!   with the candidate included an outlier among n samples can never exceed
//!   `(n-1)/sqrt(n)` deviations, i.e. never 2 for n < 6; and the loss must
//!   also exceed the absolute floor `min_loss`, so uniform near-zero loss
//!   does not flag anyone. With fewer than `min_peers` other peers no
//!   verdict of unhealthiness is possible (a lossy local link cannot be told
//!   apart from a lossy peer);
//! - verdicts have hysteresis (see [`HealthConfig::hysteresis`]), and a
//!   peer whose last window was not judged (skipped, above) keeps its
//!   verdict: its average is frozen while the others' move on, which must
//!   not make it an outlier (a heartbeat-only cut between a principal and
//!   a member that was lossy earlier evicted the member: membership
//!   simulator seed 1024). Likewise a member (a peer past probation) is
//!   newly judged unhealthy only after a window that itself lost more than
//!   the threshold: an average raised by a fault that is over (a cut
//!   shorter than the heartbeat timeout) must not evict a member whose
//!   heartbeats all arrive now, only because the others' averages fell
//!   faster (membership simulator seed 335637) — and that lost at least
//!   two heartbeats, since a window judged on a short span (a
//!   heartbeat-only cut began in it) can lose a large fraction with one
//!   (seed 318403);
//! - a peer that leaves the adjacency while judged unhealthy is remembered
//!   for [`HealthConfig::departed_memory_ms`]: if it comes back under the
//!   same incarnation it resumes its record (average and verdict) instead
//!   of a fresh probation. A lossy node drops out of the adjacency now and
//!   then (its heartbeats all lost for a timeout), and each fresh
//!   probation was a new draw: three lucky windows (18 of 20 heartbeats
//!   from a node losing 60 %) admitted it (seed 316510).
//!
//! Invariants:
//! - only peers currently reported adjacent are tracked; a peer that leaves
//!   the adjacency starts from scratch (probation) when it returns, unless
//!   it left unhealthy and returns under the same incarnation within the
//!   memory (then it resumes its record, unhealthy);
//! - every stored average lies in `[-1, 1]` (windows with duplicates or
//!   early arrivals may count more than expected; this is kept, not clamped,
//!   so jitter does not bias the average upwards), and the loss reported by
//!   [`HealthTracker::loss`] lies in `[0, 1]`.

use std::collections::{BTreeMap, BTreeSet};

use citrine_types::NodeId;

/// Losses closer than this to a threshold are taken as equal to it: the
/// averages are sums of fractions like 1/3, so a loss exactly at a threshold
/// can come out a few ulps either side of it.
const ROUNDING: f64 = 1e-9;

/// Fewest heartbeats a window must lose before a member is newly judged
/// unhealthy after it: one lost heartbeat is noise, however few the window
/// expected (a window judged on a short span, where a heartbeat-only cut
/// began, came out at 60 % loss from one heartbeat lost of 2.6 expected:
/// membership simulator seed 318403).
const MIN_LOST_TO_FLAG: f64 = 2.0;

/// Health-score tuning.
#[derive(Clone, Debug, PartialEq)]
pub struct HealthConfig {
    /// Sliding window length, ms (paper: 1000).
    pub window_ms: u64,
    /// Smoothing factor alpha (paper: 0.95).
    pub alpha: f64,
    /// How many standard deviations above the others' mean is an outlier
    /// (paper: 2).
    pub sigma_factor: f64,
    /// Smallest average loss ever considered unhealthy.
    pub min_loss: f64,
    /// Fewest other peers needed before anyone can be judged unhealthy.
    pub min_peers: usize,
    /// Full windows a new peer must be observed for before admission.
    pub probation_windows: u32,
    /// Hysteresis: a healthy peer is flagged only above
    /// `threshold * (1 + hysteresis)`, an unhealthy one recovers below
    /// `threshold`, so an average hovering at the threshold cannot flap.
    pub hysteresis: f64,
    /// How long a peer that left the adjacency while unhealthy is
    /// remembered, ms: back under the same incarnation within it, it
    /// resumes its record instead of a fresh probation.
    pub departed_memory_ms: u64,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            window_ms: 1000,
            alpha: 0.95,
            sigma_factor: 2.0,
            min_loss: 0.2,
            min_peers: 2,
            probation_windows: 3,
            hysteresis: 0.25,
            departed_memory_ms: 60_000,
        }
    }
}

#[derive(Clone, Debug, Default)]
struct PeerHealth {
    /// Heartbeats counted in the current window.
    received: u32,
    /// Arrival of the first heartbeat in the current window.
    first_heartbeat: Option<u64>,
    /// Arrival of the last heartbeat in the current window.
    last_heartbeat: Option<u64>,
    /// Arrival of the first surrogate in the current window.
    first_surrogate: Option<u64>,
    /// Arrival of the last surrogate in the current window.
    last_surrogate: Option<u64>,
    /// Whether the last closed window had surrogates and no heartbeat
    /// (only the heartbeat channel was silent).
    heartbeats_down: bool,
    /// Whether the peer was tracked for the whole current window.
    full_window: bool,
    /// Raw (not bias-corrected) exponential average of window loss.
    avg: f64,
    /// Full windows folded into `avg`.
    windows: u32,
    /// `alpha^windows`, for bias correction.
    alpha_pow: f64,
    /// Whether the last closed window was judged (folded into `avg`); a
    /// peer whose last window was not keeps its verdict.
    judged: bool,
    /// Loss of the last judged window.
    last_loss: f64,
    /// Heartbeats the last judged window lost (expected less received).
    last_lost: f64,
}

impl PeerHealth {
    /// Clears what was observed in the current window.
    fn forget_window(&mut self) {
        self.received = 0;
        self.first_heartbeat = None;
        self.last_heartbeat = None;
        self.first_surrogate = None;
        self.last_surrogate = None;
    }

    /// How many heartbeats the current window (from `start`, `window_ms`
    /// long) is judged on: all it should carry, unless only the heartbeat
    /// channel was silent in part of it (see the module doc) — then those
    /// of the span from its first heartbeat (if surrogates came before it,
    /// after a window of surrogates only) to its last (if surrogates came
    /// after it), and none if it carried surrogates but no heartbeat.
    fn expected_heartbeats(&self, start: u64, window_ms: u64, interval_ms: u64) -> f64 {
        let full = window_ms as f64 / interval_ms as f64;
        let Some(first_surrogate) = self.first_surrogate else {
            return full;
        };
        let (Some(first), Some(last)) = (self.first_heartbeat, self.last_heartbeat) else {
            return 0.0;
        };
        let silent_head = self.heartbeats_down && first_surrogate + interval_ms < first;
        let silent_tail = self.last_surrogate.is_some_and(|s| s > last + interval_ms);
        if !silent_head && !silent_tail {
            return full;
        }
        let from = if silent_head { first } else { start };
        let to = if silent_tail {
            last
        } else {
            (start + window_ms).saturating_sub(interval_ms).max(last)
        };
        (to.saturating_sub(from) as f64 / interval_ms as f64 + 1.0).min(full)
    }

    fn corrected(&self) -> Option<f64> {
        if self.windows == 0 {
            return None;
        }
        let denom = 1.0 - self.alpha_pow;
        if denom <= f64::EPSILON {
            return Some(self.avg);
        }
        Some((self.avg / denom).clamp(-1.0, 1.0))
    }
}

/// Tracks the health score of every adjacent peer.
#[derive(Clone, Debug)]
pub struct HealthTracker {
    cfg: HealthConfig,
    interval_ms: u64,
    window_start: u64,
    peers: BTreeMap<NodeId, PeerHealth>,
    unhealthy: BTreeSet<NodeId>,
    /// Peers that left the adjacency while unhealthy (see the module doc).
    departed: BTreeMap<NodeId, Departed>,
}

/// The record of a peer that left the adjacency while unhealthy.
#[derive(Clone, Debug)]
struct Departed {
    health: PeerHealth,
    incarnation: u64,
    left_at: u64,
}

impl HealthTracker {
    /// Creates a tracker whose first window starts at `now`.
    pub fn new(cfg: HealthConfig, heartbeat_interval_ms: u64, now: u64) -> HealthTracker {
        assert!(cfg.window_ms > 0, "health window must be positive");
        assert!(
            heartbeat_interval_ms > 0,
            "heartbeat interval must be positive"
        );
        assert!((0.0..1.0).contains(&cfg.alpha), "alpha must be in [0, 1)");
        HealthTracker {
            cfg,
            interval_ms: heartbeat_interval_ms,
            window_start: now,
            peers: BTreeMap::new(),
            unhealthy: BTreeSet::new(),
            departed: BTreeMap::new(),
        }
    }

    /// Counts one (non-duplicate) heartbeat from `from`, received at `now`.
    pub fn record_heartbeat(&mut self, from: NodeId, now: u64) {
        if let Some(p) = self.peers.get_mut(&from) {
            p.received = p.received.saturating_add(1);
            p.first_heartbeat.get_or_insert(now);
            p.last_heartbeat = Some(now);
        }
    }

    /// `id` restarted (a later incarnation): it goes through probation
    /// again, as a new peer — a node that comes back empty under its old id
    /// must not be anyone's principal before it is admitted again.
    pub fn restarted(&mut self, id: NodeId) {
        if let Some(p) = self.peers.get_mut(&id) {
            *p = PeerHealth {
                full_window: false,
                alpha_pow: 1.0,
                ..PeerHealth::default()
            };
        }
        self.unhealthy.remove(&id);
    }

    /// `id` (heard under `incarnation`) left the adjacency at `now`: if it
    /// was judged unhealthy, its record is kept for
    /// [`HealthConfig::departed_memory_ms`] (see the module doc).
    pub fn departed(&mut self, id: NodeId, incarnation: u64, now: u64) {
        if !self.unhealthy.contains(&id) {
            return;
        }
        if let Some(health) = self.peers.get(&id) {
            let left = Departed {
                health: health.clone(),
                incarnation,
                left_at: now,
            };
            self.departed.insert(id, left);
        }
    }

    /// `id` is adjacent again, heard under `incarnation` at `now`: under the
    /// incarnation it left with, within the memory, it resumes its record —
    /// unhealthy, its current window not counted; otherwise it is a new
    /// peer.
    pub fn returned(&mut self, id: NodeId, incarnation: u64, now: u64) {
        let Some(left) = self.departed.remove(&id) else {
            return;
        };
        let fresh = now.saturating_sub(left.left_at) <= self.cfg.departed_memory_ms;
        if left.incarnation != incarnation || !fresh {
            return;
        }
        let mut health = left.health;
        health.full_window = false;
        health.heartbeats_down = false;
        health.forget_window();
        self.peers.insert(id, health);
        self.unhealthy.insert(id);
    }

    /// Forgets the records of departed peers (the caller judges every peer
    /// anew).
    pub fn forget_departed(&mut self) {
        self.departed.clear();
    }

    /// The caller stalled until `now` and heard nothing meanwhile: the
    /// windows it slept through are not judged (nor counted towards
    /// anyone's probation), and a new window starts at `now` that no peer
    /// has been observed for from its start.
    pub fn skip_stall(&mut self, now: u64) {
        self.window_start = now;
        for p in self.peers.values_mut() {
            p.full_window = false;
            p.heartbeats_down = false;
            p.forget_window();
        }
    }

    /// Notes a surrogate (fabric or Paxos) message from `from` at `now`; it
    /// does not count as a heartbeat but proves the peer alive.
    pub fn record_surrogate(&mut self, from: NodeId, now: u64) {
        if let Some(p) = self.peers.get_mut(&from) {
            p.first_surrogate.get_or_insert(now);
            p.last_surrogate = Some(now);
        }
    }

    /// Synchronises the tracked set with the adjacency list and closes every
    /// window that ended by `now`. Returns true when the verdicts changed.
    pub fn tick(&mut self, now: u64, adjacency: &[NodeId]) -> bool {
        let before = self.unhealthy.clone();
        self.track(adjacency);
        let memory = self.cfg.departed_memory_ms;
        self.departed
            .retain(|_, left| now.saturating_sub(left.left_at) <= memory);
        let mut closed = 0;
        while now >= self.window_start + self.cfg.window_ms {
            self.close_window();
            self.window_start += self.cfg.window_ms;
            closed += 1;
            if closed >= 4 {
                // Far behind (a stalled caller): restart windows from now.
                self.window_start = now;
                break;
            }
        }
        if closed > 0 {
            self.judge();
        }
        before != self.unhealthy
    }

    /// Tracks exactly the peers of `adjacency`; when they are the ones
    /// already tracked (most ticks), at the cost of one comparison.
    fn track(&mut self, adjacency: &[NodeId]) {
        if self.peers.keys().eq(adjacency.iter()) {
            return;
        }
        let adjacent: BTreeSet<NodeId> = adjacency.iter().copied().collect();
        self.peers.retain(|id, _| adjacent.contains(id));
        self.unhealthy.retain(|id| adjacent.contains(id));
        for id in &adjacent {
            self.peers.entry(*id).or_insert_with(|| PeerHealth {
                // Seen mid-window: this window does not count.
                full_window: false,
                alpha_pow: 1.0,
                ..PeerHealth::default()
            });
        }
    }

    fn close_window(&mut self) {
        let alpha = self.cfg.alpha;
        let (start, window_ms, interval_ms) =
            (self.window_start, self.cfg.window_ms, self.interval_ms);
        for p in self.peers.values_mut() {
            let expected = p.expected_heartbeats(start, window_ms, interval_ms);
            p.judged = p.full_window && expected >= 1.0;
            if p.judged {
                let lw = ((expected - f64::from(p.received)) / expected).clamp(-1.0, 1.0);
                p.avg = alpha * p.avg + (1.0 - alpha) * lw;
                p.last_loss = lw;
                p.last_lost = expected - f64::from(p.received);
                p.alpha_pow *= alpha;
                p.windows = p.windows.saturating_add(1);
                debug_assert!((-1.0..=1.0).contains(&p.avg));
            }
            p.heartbeats_down = p.first_heartbeat.is_none() && p.first_surrogate.is_some();
            p.full_window = true;
            p.forget_window();
        }
    }

    fn judge(&mut self) {
        let before = std::mem::take(&mut self.unhealthy);
        // (peer, loss, if its last window was judged: that window's loss,
        // or infinity for a peer on probation, judged on its average alone)
        let probation = self.cfg.probation_windows;
        let losses: Vec<(NodeId, f64, Option<f64>)> = self
            .peers
            .iter()
            .filter_map(|(id, p)| {
                // A member (admitted before this window) is newly flagged
                // only on a lossy window (see the module doc).
                let admitted = p.windows > probation;
                let window = if !admitted {
                    f64::INFINITY
                } else if p.last_lost < MIN_LOST_TO_FLAG - ROUNDING {
                    f64::NEG_INFINITY
                } else {
                    p.last_loss
                };
                p.corrected().map(|l| (*id, l, p.judged.then_some(window)))
            })
            .collect();
        if losses.len() <= self.cfg.min_peers {
            return;
        }
        let n = losses.len() as f64;
        let sum: f64 = losses.iter().map(|(_, l, _)| l).sum();
        let sum_sq: f64 = losses.iter().map(|(_, l, _)| l * l).sum();
        for &(id, loss, judged) in &losses {
            let was_unhealthy = before.contains(&id);
            let unhealthy = if let Some(window) = judged {
                let m = n - 1.0;
                let mean = (sum - loss) / m;
                let var = ((sum_sq - loss * loss) / m - mean * mean).max(0.0);
                let mut threshold =
                    (mean + self.cfg.sigma_factor * var.sqrt()).max(self.cfg.min_loss);
                if !was_unhealthy {
                    threshold *= 1.0 + self.cfg.hysteresis;
                }
                // Above by more than rounding: a loss exactly at the
                // threshold (5 heartbeats of 6⅔ expected, 0.25, against
                // 0.2 × 1.25) came out 2e-16 above it and kept a node just
                // booted out of a view for a window (membership simulator
                // seed 309546).
                // A member whose heartbeats arrive now is not flagged on its
                // history alone: its average was raised by a fault that is
                // over, and only the others' averages falling faster put it
                // above the threshold (seed 335637).
                let lossy_now = was_unhealthy || window > threshold + ROUNDING;
                loss > threshold + ROUNDING && lossy_now
            } else {
                // No new evidence (its heartbeats fell silent while its
                // surrogates kept coming): the verdict stands. Judged
                // afresh, its frozen average could turn into an outlier
                // only because the others' averages moved on.
                was_unhealthy
            };
            if unhealthy {
                self.unhealthy.insert(id);
            }
        }
    }

    /// Smoothed loss of `id` in `[0, 1]`, if at least one window was observed.
    pub fn loss(&self, id: NodeId) -> Option<f64> {
        self.peers
            .get(&id)
            .and_then(PeerHealth::corrected)
            .map(|l| l.clamp(0.0, 1.0))
    }

    /// Whether `id` was judged an outlier at the last window close.
    pub fn is_unhealthy(&self, id: NodeId) -> bool {
        self.unhealthy.contains(&id)
    }

    /// Whether `id` may be a cluster member: tracked, past probation and not
    /// unhealthy.
    pub fn is_eligible(&self, id: NodeId) -> bool {
        match self.peers.get(&id) {
            Some(p) => p.windows >= self.cfg.probation_windows && !self.unhealthy.contains(&id),
            None => false,
        }
    }

    /// For a tracked peer still on probation (and not unhealthy): how many
    /// ms from `now` until the window close that ends its probation.
    pub fn admission_eta(&self, id: NodeId, now: u64) -> Option<u64> {
        let p = self.peers.get(&id)?;
        if p.windows >= self.cfg.probation_windows || self.unhealthy.contains(&id) {
            return None;
        }
        // The current (possibly partial, discarded) window closes first.
        let remaining = u64::from(self.cfg.probation_windows - p.windows);
        let remaining = if p.full_window {
            remaining - 1
        } else {
            remaining
        };
        let window_end = self.window_start + self.cfg.window_ms;
        Some(window_end.saturating_sub(now) + remaining * self.cfg.window_ms)
    }

    /// Peers currently judged unhealthy, ascending.
    pub fn unhealthy(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.unhealthy.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `windows` windows; peer i receives `recv(i, w)` heartbeats in
    /// window w (10 expected per window).
    fn run(
        t: &mut HealthTracker,
        peers: &[NodeId],
        windows: u64,
        recv: impl Fn(usize, u64) -> u32,
    ) {
        for w in 0..windows {
            let start = w * 1000;
            t.tick(start, peers);
            for (i, id) in peers.iter().enumerate() {
                for k in 0..recv(i, w) {
                    t.record_heartbeat(*id, start + u64::from(k) * 100);
                }
            }
        }
        t.tick(windows * 1000, peers);
    }

    /// Windows `windows`: every peer but node 1 sends all its heartbeats;
    /// `node_1` sends what node 1 sends in the window starting at `start`.
    fn others_steady(
        t: &mut HealthTracker,
        peers: &[NodeId],
        windows: std::ops::Range<u64>,
        node_1: impl Fn(&mut HealthTracker, u64),
    ) {
        for w in windows {
            let start = w * 1000;
            t.tick(start, peers);
            for id in &peers[1..] {
                for k in 0..10 {
                    t.record_heartbeat(*id, start + k * 100);
                }
            }
            node_1(t, start);
        }
    }

    fn tracker() -> HealthTracker {
        HealthTracker::new(HealthConfig::default(), 100, 0)
    }

    fn ids(n: u64) -> Vec<NodeId> {
        (1..=n).map(NodeId).collect()
    }

    #[test]
    fn lossy_peer_is_outlier() {
        let mut t = tracker();
        let peers = ids(6);
        run(&mut t, &peers, 10, |i, w| {
            if i == 2 {
                4 + (w % 2) as u32
            } else {
                10 - (w % 3 == 0) as u32
            }
        });
        assert!(t.is_unhealthy(NodeId(3)));
        assert!(!t.is_eligible(NodeId(3)));
        for id in [1, 2, 4, 5, 6] {
            assert!(t.is_eligible(NodeId(id)), "node {id}");
        }
        let loss = t.loss(NodeId(3)).expect("observed");
        assert!((0.5..0.6).contains(&loss), "{loss}");
    }

    #[test]
    fn uniform_loss_flags_nobody() {
        let mut t = tracker();
        let peers = ids(6);
        run(&mut t, &peers, 10, |_, _| 6);
        assert_eq!(t.unhealthy().count(), 0);
    }

    #[test]
    fn too_few_peers_flags_nobody() {
        let mut t = tracker();
        let peers = ids(2);
        run(&mut t, &peers, 10, |i, _| if i == 0 { 0 } else { 10 });
        assert_eq!(t.unhealthy().count(), 0);
    }

    #[test]
    fn a_restarted_peer_goes_through_probation_again() {
        let mut t = tracker();
        let peers = ids(2);
        t.tick(500, &peers);
        run(&mut t, &peers, 4, |_, _| 10);
        assert!(t.is_eligible(NodeId(1)));
        t.restarted(NodeId(1));
        assert!(!t.is_eligible(NodeId(1)));
        assert!(t.admission_eta(NodeId(1), 4_000).is_some());
        assert!(t.is_eligible(NodeId(2)), "the others are untouched");
    }

    #[test]
    fn probation_then_admission() {
        let mut t = tracker();
        let peers = ids(2);
        t.tick(500, &peers); // seen mid-window
        assert!(!t.is_eligible(NodeId(1)));
        // Partial window to 1000, then three full ones: admitted at 4000.
        assert_eq!(t.admission_eta(NodeId(1), 500), Some(3500));
        run(&mut t, &peers, 2, |_, _| 10);
        // windows: [0,1000) partial (discarded), [1000,2000) is window 1 ...
        assert!(!t.is_eligible(NodeId(1)));
        run(&mut t, &peers, 4, |_, _| 10);
        assert!(t.is_eligible(NodeId(1)));
        // Leaving the adjacency forgets everything.
        t.tick(4500, &peers[1..]);
        assert!(!t.is_eligible(NodeId(1)));
        assert!(t.loss(NodeId(1)).is_none());
    }

    #[test]
    fn heartbeat_channel_down_with_surrogates_is_not_loss() {
        let mut t = tracker();
        let peers = ids(6);
        run(&mut t, &peers, 6, |_, _| 10);
        assert!(t.is_eligible(NodeId(1)));
        // Heartbeats from node 1 stop; replica writes keep flowing.
        others_steady(&mut t, &peers, 6..30, |t, start| {
            t.record_surrogate(NodeId(1), start + 500)
        });
        assert!(t.is_eligible(NodeId(1)));
        assert!(t.loss(NodeId(1)).is_some_and(|l| l < 0.05));
        // Without the surrogates the same silence is loss.
        others_steady(&mut t, &peers, 30..60, |_, _| {});
        assert!(t.is_unhealthy(NodeId(1)));
    }

    /// A peer that was lossy for a while (all peers were) and whose
    /// heartbeats then fall silent while its surrogates keep coming is not
    /// made an outlier by the others recovering: its verdict stands until
    /// its heartbeats give new evidence.
    #[test]
    fn a_frozen_average_does_not_become_an_outlier() {
        let mut t = tracker();
        let peers = ids(5);
        run(&mut t, &peers, 10, |i, w| {
            if w < 8 {
                4 + (i % 2) as u32
            } else {
                10
            }
        });
        assert!(peers.iter().all(|id| t.is_eligible(*id)));
        let frozen = t.loss(NodeId(1));
        others_steady(&mut t, &peers, 10..60, |t, start| {
            t.record_surrogate(NodeId(1), start + 500)
        });
        assert_eq!(t.loss(NodeId(1)), frozen, "no window judged");
        assert!(
            t.loss(NodeId(2)) < frozen,
            "the others' averages moved on: {:?} {frozen:?}",
            t.loss(NodeId(2))
        );
        assert!(t.is_eligible(NodeId(1)));
        // Heartbeats back, as lossy as before: judged again.
        others_steady(&mut t, &peers, 60..90, |t, start| {
            for k in 0..3 {
                t.record_heartbeat(NodeId(1), start + k * 100);
            }
        });
        assert!(t.is_unhealthy(NodeId(1)));
    }

    #[test]
    fn heartbeats_stopping_mid_window_with_surrogates_is_not_loss() {
        let mut t = tracker();
        let peers = ids(6);
        run(&mut t, &peers, 5, |_, _| 10);
        assert!(t.is_eligible(NodeId(1)));
        // Window [5000, 6000): node 1's heartbeats stop after 5300, its
        // replica writes go on.
        t.tick(5000, &peers);
        for id in &peers {
            let n = if *id == NodeId(1) { 4 } else { 10 };
            for k in 0..n {
                t.record_heartbeat(*id, 5000 + k * 100);
            }
        }
        for k in 0..10 {
            t.record_surrogate(NodeId(1), 5000 + k * 100 + 50);
        }
        t.tick(6000, &peers);
        assert!(t.is_eligible(NodeId(1)));
        assert!(
            t.loss(NodeId(1)).is_some_and(|l| l < 0.01),
            "{:?}",
            t.loss(NodeId(1))
        );
    }

    /// Node 1's window starting at `start`: surrogates every 100 ms, and
    /// heartbeats at `start + k × 100` for each `k` in `beats`.
    fn surrogates_and(t: &mut HealthTracker, start: u64, beats: impl IntoIterator<Item = u64>) {
        for k in beats {
            t.record_heartbeat(NodeId(1), start + k * 100);
        }
        for k in 0..10 {
            t.record_surrogate(NodeId(1), start + k * 100 + 50);
        }
    }

    #[test]
    fn heartbeats_resuming_mid_window_with_surrogates_is_not_loss() {
        let mut t = tracker();
        let peers = ids(6);
        run(&mut t, &peers, 5, |_, _| 10);
        assert!(t.is_eligible(NodeId(1)));
        // A heartbeat-only cut of node 1 through the window [5000, 6000)
        // heals at 6600; its replica writes came all along.
        others_steady(&mut t, &peers, 5..7, |t, start| {
            let first = if start == 5000 { 10 } else { 6 };
            surrogates_and(t, start, first..10);
        });
        t.tick(7000, &peers);
        assert!(t.is_eligible(NodeId(1)));
        assert!(
            t.loss(NodeId(1)).is_some_and(|l| l < 0.01),
            "{:?}",
            t.loss(NodeId(1))
        );
        // After a window with heartbeats, the same late start is loss: a
        // lossy peer that talks a lot often has a surrogate arrive before
        // its first heartbeat. 6 of 10 lost in the seventh judged window:
        // 0.6 × 0.05 / (1 − 0.95⁷) ≈ 0.099.
        others_steady(&mut t, &peers, 7..9, |t, start| {
            let first = if start == 7000 { 0 } else { 6 };
            surrogates_and(t, start, first..10);
        });
        t.tick(9000, &peers);
        let loss = t.loss(NodeId(1)).expect("observed");
        assert!((0.09..0.11).contains(&loss), "{loss}");
    }

    #[test]
    fn a_burst_of_heartbeats_inside_a_surrogate_window_is_judged_on_its_span() {
        let mut t = tracker();
        let peers = ids(6);
        run(&mut t, &peers, 5, |_, _| 10);
        // Node 1's heartbeats are cut through [5000, 6000), then come only
        // from 6300 to 6600, one of those four lost (3 of 4 expected);
        // surrogates all along.
        others_steady(&mut t, &peers, 5..7, |t, start| {
            if start == 5000 {
                surrogates_and(t, start, []);
            } else {
                surrogates_and(t, start, [3, 4, 6]);
            }
        });
        t.tick(7000, &peers);
        // One of four lost, in the fifth judged window: the bias-corrected
        // average is 0.25 × 0.05 / (1 − 0.95⁵) ≈ 0.055.
        let loss = t.loss(NodeId(1)).expect("observed");
        assert!((0.05..0.06).contains(&loss), "{loss}");
    }

    #[test]
    fn a_loss_exactly_at_the_threshold_is_not_above_it() {
        // Heartbeats every 150 ms: 6⅔ expected a window. Node 1 delivers 5
        // in each of its three probation windows, a loss of exactly 0.25,
        // the threshold for a healthy peer (0.2 × 1.25) when the others
        // lose nothing.
        let mut t = HealthTracker::new(HealthConfig::default(), 150, 0);
        let peers = ids(6);
        run(&mut t, &peers, 4, |i, _| if i == 0 { 5 } else { 7 });
        let loss = t.loss(NodeId(1)).expect("observed");
        assert!((loss - 0.25).abs() < 1e-12, "{loss}");
        assert!(!t.is_unhealthy(NodeId(1)));
        assert!(t.is_eligible(NodeId(1)));
    }

    /// Node 1 and node 3 lose most heartbeats for two windows (a cut
    /// shorter than the timeout), node 1 a little more; then every
    /// heartbeat of node 1 arrives while the others deliver more than
    /// expected (duplicates), so their averages fall faster than node 1's
    /// and the threshold drops under it. Before, node 1 was flagged three
    /// windows in a row with no loss at all (membership simulator seed
    /// 335637 evicted a member so after a healed cut).
    #[test]
    fn a_member_is_not_flagged_on_its_history_alone() {
        let mut t = tracker();
        let peers = ids(5);
        for w in 0..12u64 {
            let start = w * 1000;
            t.tick(start, &peers);
            if w >= 7 {
                assert!(!t.is_unhealthy(NodeId(1)), "flagged after window {w}");
                assert!(t.is_eligible(NodeId(1)));
            }
            let received = |i: usize| -> u64 {
                match w {
                    0..=3 => 10,
                    4 | 5 => [0, 10, 1, 10, 8][i],
                    _ => [10, 12, 12, 12, 12][i],
                }
            };
            for (i, id) in peers.iter().enumerate() {
                for k in 0..received(i) {
                    t.record_heartbeat(*id, start + k * 80);
                }
            }
        }
        let loss = t.loss(NodeId(1)).expect("observed");
        assert!(loss > 0.15, "its average is still high: {loss}");
        // The same member losing heartbeats now is flagged.
        others_steady(&mut t, &peers, 12..15, |t, start| {
            for k in 0..3 {
                t.record_heartbeat(NodeId(1), start + k * 100);
            }
        });
        t.tick(15_000, &peers);
        assert!(t.is_unhealthy(NodeId(1)));
    }

    /// Node 1 passes probation at a loss of 0.235 (under the 0.25 a healthy
    /// peer is flagged above); then its heartbeat channel goes silent
    /// early in a window while its surrogates go on, so that window is
    /// judged on its first 300 ms: one heartbeat lost of three, 33 %.
    /// That lifts its average to 0.26, yet one lost heartbeat is no
    /// evidence (seed 318403 evicted a member so).
    #[test]
    fn one_lost_heartbeat_does_not_flag_a_member() {
        let mut t = tracker();
        let peers = ids(5);
        others_steady(&mut t, &peers, 0..4, |t, start| {
            let received = if start == 3000 { 7 } else { 8 };
            for k in 0..received {
                t.record_heartbeat(NodeId(1), start + k * 100);
            }
        });
        t.tick(4000, &peers);
        assert!(t.is_eligible(NodeId(1)));
        others_steady(&mut t, &peers, 4..5, |t, start| {
            surrogates_and(t, start, [0, 2]);
        });
        t.tick(5000, &peers);
        let loss = t.loss(NodeId(1)).expect("observed");
        assert!(loss > 0.25, "{loss}");
        assert!(t.is_eligible(NodeId(1)), "flagged on one lost heartbeat");
    }

    /// Node 1 loses 80 % and is judged unhealthy, drops out of the
    /// adjacency and comes back: under the same incarnation it resumes its
    /// record (still unhealthy after three clean windows, where a fresh
    /// probation would have admitted it: seed 316510); under a later one
    /// (it restarted) it is a new peer.
    #[test]
    fn an_unhealthy_peer_back_under_its_incarnation_resumes_its_record() {
        let mut t = tracker();
        let peers = ids(6);
        run(&mut t, &peers, 6, |i, _| if i == 0 { 2 } else { 10 });
        assert!(t.is_unhealthy(NodeId(1)));
        let back = |t: &mut HealthTracker, incarnation: u64, at: u64| {
            t.departed(NodeId(1), 7, at);
            t.tick(at, &peers[1..]);
            t.returned(NodeId(1), incarnation, at + 500);
            t.tick(at + 500, &peers);
            for w in 0..4 {
                let start = at + 1000 + w * 1000;
                t.tick(start, &peers);
                for id in &peers {
                    for k in 0..10 {
                        t.record_heartbeat(*id, start + k * 100);
                    }
                }
            }
            t.tick(at + 5000, &peers);
        };
        back(&mut t, 7, 6_000);
        assert!(t.is_unhealthy(NodeId(1)), "{:?}", t.loss(NodeId(1)));
        assert!(!t.is_eligible(NodeId(1)));
        assert_eq!(t.admission_eta(NodeId(1), 11_000), None);
        back(&mut t, 8, 11_000);
        assert!(t.is_eligible(NodeId(1)), "a restarted peer starts afresh");
    }

    #[test]
    fn hysteresis_keeps_a_borderline_peer_stable() {
        let mut t = tracker();
        let peers = ids(6);
        // Node 1 loses ~22 % (just above the 0.2 floor, below 0.25).
        run(&mut t, &peers, 40, |i, w| {
            if i == 0 {
                8 - u32::from(w % 5 == 0)
            } else {
                10
            }
        });
        let loss = t.loss(NodeId(1)).expect("observed");
        assert!((0.2..0.25).contains(&loss), "{loss}");
        assert!(!t.is_unhealthy(NodeId(1)), "healthy peers need the margin");
        // Once clearly unhealthy, it stays so until below the plain threshold.
        let mut u = tracker();
        run(&mut u, &peers, 10, |i, _| if i == 0 { 5 } else { 10 });
        assert!(u.is_unhealthy(NodeId(1)));
    }

    #[test]
    fn recovered_peer_becomes_healthy_again() {
        let mut t = tracker();
        let peers = ids(6);
        run(&mut t, &peers, 6, |i, _| if i == 0 { 2 } else { 10 });
        assert!(t.is_unhealthy(NodeId(1)));
        // The second run restarts at time 0, so keep its clock moving.
        let mut t2 = t.clone();
        for w in 6..80u64 {
            t2.tick(w * 1000, &peers);
            for id in &peers {
                for k in 0..10 {
                    t2.record_heartbeat(*id, w * 1000 + k * 100);
                }
            }
        }
        t2.tick(80_000, &peers);
        assert!(!t2.is_unhealthy(NodeId(1)));
        assert!(t2.is_eligible(NodeId(1)));
    }
}
