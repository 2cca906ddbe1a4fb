//! Mesh-mode heartbeating: discovery, the adjacency list and surrogate
//! heartbeats (001 §2.1.2, §2.1.2.1).
//!
//! Owns: the set of addresses this node sends heartbeats to (configured seeds
//! plus addresses learned from peers' heartbeats), the adjacency list (peers
//! heard from within `timeout_ms`), per-peer gossip (the latest cluster key
//! and succession each peer advertised), and per-peer clock offsets.
//!
//! Gossip: a heartbeat carries the addresses of some adjacent peers, from
//! which its receivers learn where to send theirs. Up to [`GOSSIP_SLICE`]
//! peers it is the whole adjacency list, every round; past that, each round
//! carries the peers that became adjacent since the previous round (so a
//! newcomer is announced at once) and, every [`GOSSIP_SLICE_EVERY`]th round,
//! the next [`GOSSIP_SLICE`] peers of the adjacency list in id order, a
//! cursor rotating through it (so an address whose announcement was lost is
//! repeated within `GOSSIP_SLICE_EVERY × adjacency / GOSSIP_SLICE` rounds).
//! Outside a burst of newcomers a heartbeat's size then grows with the
//! cluster only through its succession list, not with its adjacency.
//!
//! Clock offsets: a heartbeat carries its sender's clock when sent; the
//! sender's clock minus the local clock on arrival is the offset between
//! the two clocks less the message's delay. Delays (the network, a queue,
//! a stall of either node) only make a sample smaller, so a peer's offset is
//! estimated as the largest of its last [`CLOCK_SAMPLES`] samples.
//!
//! Invariants:
//! - a peer is in the adjacency list iff it has been heard from (heartbeat or
//!   surrogate fabric message) at most `timeout_ms` ago, as of the last
//!   [`HeartbeatState::expire`];
//! - the local node never appears in its own adjacency list or target set;
//! - a peer's advertised state only moves forward: heartbeats with an older
//!   (incarnation, seq) than already seen are counted as liveness but their
//!   gossip is ignored, so reordering cannot roll a peer's view back;
//! - the target set is bounded by [`MAX_KNOWN_ADDRS`]; learned (non-seed)
//!   addresses not heard from for `forget_after_ms` are dropped.

use std::collections::BTreeMap;
use std::ops::Bound;

use citrine_types::NodeId;

use crate::message::{Heartbeat, PeerAddr, MAX_PEERS};

/// Upper bound on the number of addresses heartbeats are sent to.
pub const MAX_KNOWN_ADDRS: usize = 4096;

/// Adjacent peers a heartbeat gossips besides the newly adjacent ones (see
/// the module doc): with this many or fewer, the whole adjacency list.
pub const GOSSIP_SLICE: usize = 32;

/// Past [`GOSSIP_SLICE`] peers, one round in this many carries the rotating
/// slice.
pub const GOSSIP_SLICE_EVERY: u64 = 4;

/// Heartbeats a peer's clock offset is estimated over (about 1.2 s at the
/// default interval).
pub const CLOCK_SAMPLES: usize = 8;

/// The last [`CLOCK_SAMPLES`] clock-offset samples of a peer (ms, its clock
/// minus ours, less each heartbeat's delay).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClockSamples {
    samples: [i64; CLOCK_SAMPLES],
    len: usize,
    next: usize,
}

impl ClockSamples {
    fn record(&mut self, sample: i64) {
        self.samples[self.next] = sample;
        self.next = (self.next + 1) % CLOCK_SAMPLES;
        self.len = (self.len + 1).min(CLOCK_SAMPLES);
    }

    /// The offset estimate: the largest sample (the least delayed).
    pub fn estimate(&self) -> Option<i64> {
        self.samples[..self.len].iter().copied().max()
    }
}

/// Heartbeat timing and seeds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeartbeatConfig {
    /// Period between heartbeat rounds, ms (Aerospike default 150).
    pub interval_ms: u64,
    /// A peer silent for longer than this leaves the adjacency list, ms.
    pub timeout_ms: u64,
    /// Learned addresses unheard for this long stop receiving heartbeats, ms.
    pub forget_after_ms: u64,
    /// Configured mesh seed addresses; never forgotten.
    pub seeds: Vec<PeerAddr>,
}

impl Default for HeartbeatConfig {
    fn default() -> Self {
        HeartbeatConfig {
            interval_ms: 150,
            timeout_ms: 1500,
            forget_after_ms: 60_000,
            seeds: Vec::new(),
        }
    }
}

/// What the local node knows about one adjacent peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerState {
    /// The peer's listening address (from its latest heartbeat).
    pub addr: PeerAddr,
    /// Local time the peer was last heard from by any channel.
    pub last_heard: u64,
    /// Local time the latest accepted heartbeat arrived.
    pub last_heartbeat: u64,
    /// (incarnation, seq) of the newest heartbeat seen.
    pub latest: (u64, u64),
    /// Cluster key the peer advertised (0 = orphan).
    pub cluster_key: u64,
    /// Succession list the peer advertised.
    pub succession: Vec<NodeId>,
    /// Its clock's offset from ours, sampled from its heartbeats.
    pub clock: ClockSamples,
    /// Local time it became adjacent (or restarted): the next round after
    /// that gossips it to every target.
    pub adjacent_since: u64,
}

#[derive(Clone, Debug)]
struct KnownAddr {
    seed: bool,
    /// Local time of the last sign of life at this address (or of learning it).
    last_seen: u64,
}

/// Outcome of receiving a heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeartbeatOutcome {
    /// A new heartbeat from a peer that was not adjacent.
    NewPeer,
    /// A new heartbeat from an adjacent peer.
    Fresh,
    /// The first heartbeat of a later incarnation of an adjacent peer: it
    /// restarted (and is judged like a new peer again).
    Restarted,
    /// A duplicate or reordered older heartbeat: liveness only.
    Stale,
    /// A heartbeat claiming to come from the local node id; ignored.
    FromSelf,
}

/// Mesh heartbeat state machine.
#[derive(Clone, Debug)]
pub struct HeartbeatState {
    me: NodeId,
    my_addr: PeerAddr,
    cfg: HeartbeatConfig,
    incarnation: u64,
    seq: u64,
    next_send: u64,
    /// When the latest heartbeat round went out (`None`: none yet).
    last_round: Option<u64>,
    /// When the round before it went out.
    previous_round: Option<u64>,
    /// The last peer the rotating gossip slice carried.
    gossip_cursor: Option<NodeId>,
    peers: BTreeMap<NodeId, PeerState>,
    known: BTreeMap<PeerAddr, KnownAddr>,
}

impl HeartbeatState {
    /// Starts heartbeating at `now`; the first round goes out on the first
    /// tick. `incarnation` must grow across restarts of the same node id
    /// (the boot time is a good choice).
    pub fn new(
        me: NodeId,
        my_addr: PeerAddr,
        cfg: HeartbeatConfig,
        incarnation: u64,
        now: u64,
    ) -> HeartbeatState {
        assert!(cfg.interval_ms > 0, "heartbeat interval must be positive");
        assert!(
            cfg.timeout_ms > cfg.interval_ms,
            "heartbeat timeout must exceed the interval"
        );
        let mut known = BTreeMap::new();
        for seed in &cfg.seeds {
            if *seed != my_addr {
                known.insert(
                    seed.clone(),
                    KnownAddr {
                        seed: true,
                        last_seen: now,
                    },
                );
            }
        }
        HeartbeatState {
            me,
            my_addr,
            cfg,
            incarnation,
            seq: 0,
            next_send: now,
            last_round: None,
            previous_round: None,
            gossip_cursor: None,
            peers: BTreeMap::new(),
            known,
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &HeartbeatConfig {
        &self.cfg
    }

    /// If a heartbeat round is due at `now`, returns the addresses to send
    /// to and the sequence number to use; advances the schedule.
    pub fn due(&mut self, now: u64) -> Option<(u64, Vec<PeerAddr>)> {
        if now < self.next_send {
            return None;
        }
        // Keep the phase, but never try to catch up on missed rounds.
        self.next_send += self.cfg.interval_ms;
        if self.next_send <= now {
            self.next_send = now + self.cfg.interval_ms;
        }
        self.seq += 1;
        self.previous_round = self.last_round;
        self.last_round = Some(now);
        let targets = self.known.keys().cloned().collect();
        Some((self.seq, targets))
    }

    /// When the latest heartbeat round went out, if any: the peers have
    /// heard no heartbeat of this node since (at best).
    pub fn last_round(&self) -> Option<u64> {
        self.last_round
    }

    /// Builds the heartbeat for round `seq`, sent at `now`, advertising the
    /// view `cluster_key` / `succession`, gossiping the peers
    /// [`HeartbeatState::gossip`] picks; call it once per round.
    pub fn build(
        &mut self,
        seq: u64,
        now: u64,
        cluster_key: u64,
        succession: &[NodeId],
    ) -> Heartbeat {
        let peers = self.gossip();
        Heartbeat {
            addr: self.my_addr.clone(),
            incarnation: self.incarnation,
            seq,
            sent_ms: now,
            cluster_key,
            succession: succession.to_vec(),
            peers,
        }
    }

    /// The peers (with addresses) the round now going out gossips: all of
    /// them up to [`GOSSIP_SLICE`]; past that, those adjacent since the
    /// previous round plus, one round in [`GOSSIP_SLICE_EVERY`], the next
    /// slice after the rotating cursor.
    fn gossip(&mut self) -> Vec<(NodeId, PeerAddr)> {
        let entry = |(id, p): (&NodeId, &PeerState)| (*id, p.addr.clone());
        if self.peers.len() <= GOSSIP_SLICE {
            return self.peers.iter().map(entry).collect();
        }
        let after = match self.gossip_cursor {
            Some(cursor) => (Bound::Excluded(cursor), Bound::Unbounded),
            None => (Bound::Unbounded, Bound::Unbounded),
        };
        let slice: Vec<(NodeId, PeerAddr)> = if self.seq.is_multiple_of(GOSSIP_SLICE_EVERY) {
            let slice: Vec<(NodeId, PeerAddr)> = self
                .peers
                .range(after)
                .chain(self.peers.iter())
                .take(GOSSIP_SLICE)
                .map(entry)
                .collect();
            self.gossip_cursor = slice.last().map(|(id, _)| *id);
            slice
        } else {
            Vec::new()
        };
        let since = self.previous_round;
        let mut out: Vec<(NodeId, PeerAddr)> = self
            .peers
            .iter()
            .filter(|(id, p)| {
                since.is_none_or(|t| p.adjacent_since > t)
                    && !slice.iter().any(|(chosen, _)| chosen == *id)
            })
            .map(entry)
            .collect();
        out.extend(slice);
        out.truncate(MAX_PEERS);
        out
    }

    /// Records a heartbeat from `from`.
    pub fn on_heartbeat(&mut self, from: NodeId, hb: &Heartbeat, now: u64) -> HeartbeatOutcome {
        if from == self.me {
            return HeartbeatOutcome::FromSelf;
        }
        // Learn the sender's address and the addresses it gossips. An
        // adjacent peer's address is known already and is not forgotten
        // while it is adjacent (see `forget`): found by id, it costs no
        // lookup by address.
        if !self.adjacent_at(from, &hb.addr) {
            self.learn(&hb.addr, now, true);
        }
        for (id, addr) in &hb.peers {
            if *id != self.me && !self.adjacent_at(*id, addr) {
                self.learn(addr, now, false);
            }
        }
        let stamp = (hb.incarnation, hb.seq);
        let offset = clock_offset(hb.sent_ms, now);
        match self.peers.get_mut(&from) {
            Some(p) => {
                p.last_heard = p.last_heard.max(now);
                if stamp <= p.latest {
                    return HeartbeatOutcome::Stale;
                }
                let restarted = stamp.0 > p.latest.0;
                p.latest = stamp;
                p.addr = hb.addr.clone();
                p.last_heartbeat = now;
                p.cluster_key = hb.cluster_key;
                p.succession.clone_from(&hb.succession);
                p.clock.record(offset);
                if restarted {
                    p.adjacent_since = now;
                    HeartbeatOutcome::Restarted
                } else {
                    HeartbeatOutcome::Fresh
                }
            }
            None => {
                let mut clock = ClockSamples::default();
                clock.record(offset);
                self.peers.insert(
                    from,
                    PeerState {
                        addr: hb.addr.clone(),
                        last_heard: now,
                        last_heartbeat: now,
                        latest: stamp,
                        cluster_key: hb.cluster_key,
                        succession: hb.succession.clone(),
                        clock,
                        adjacent_since: now,
                    },
                );
                HeartbeatOutcome::NewPeer
            }
        }
    }

    /// Peer `id`'s clock offset from ours (ms, positive when its clock is
    /// ahead), if it is adjacent and has sent a heartbeat.
    pub fn clock_offset(&self, id: NodeId) -> Option<i64> {
        self.peers.get(&id)?.clock.estimate()
    }

    fn adjacent_at(&self, id: NodeId, addr: &PeerAddr) -> bool {
        self.peers.get(&id).is_some_and(|p| p.addr == *addr)
    }

    fn learn(&mut self, addr: &PeerAddr, now: u64, heard_directly: bool) {
        if *addr == self.my_addr {
            return;
        }
        if let Some(k) = self.known.get_mut(addr) {
            if heard_directly {
                k.last_seen = k.last_seen.max(now);
            }
            return;
        }
        if self.known.len() < MAX_KNOWN_ADDRS {
            self.known.insert(
                addr.clone(),
                KnownAddr {
                    seed: false,
                    last_seen: now,
                },
            );
        }
    }

    /// A surrogate heartbeat (001 §2.1.2.1): any other message from an
    /// adjacent peer proves it alive. Messages from peers never heard by
    /// heartbeat are ignored here, as their address is unknown.
    pub fn on_fabric_message(&mut self, from: NodeId, now: u64) -> bool {
        match self.peers.get_mut(&from) {
            Some(p) => {
                p.last_heard = p.last_heard.max(now);
                true
            }
            None => false,
        }
    }

    /// Moves every adjacent peer's liveness clock (and every known address's)
    /// on by `gap`, capped at `now`: the local node stalled for `gap` and
    /// could not hear anyone, which is not the peers' silence.
    pub fn credit_silence(&mut self, gap: u64, now: u64) {
        for peer in self.peers.values_mut() {
            peer.last_heard = peer.last_heard.saturating_add(gap).min(now);
        }
        for known in self.known.values_mut() {
            known.last_seen = known.last_seen.saturating_add(gap).min(now);
        }
    }

    /// Starts a later incarnation at `now`: the peers take the heartbeats
    /// that follow for those of a restarted node.
    pub fn reincarnate(&mut self, now: u64) {
        self.incarnation = self.incarnation.saturating_add(1).max(now);
        self.seq = 0;
    }

    /// Removes peers silent for longer than the timeout and forgets stale
    /// learned addresses. Returns the peers removed, each with the
    /// incarnation it was last heard under.
    pub fn expire(&mut self, now: u64) -> Vec<(NodeId, u64)> {
        let timeout = self.cfg.timeout_ms;
        let gone: Vec<(NodeId, u64)> = self
            .peers
            .iter()
            .filter(|(_, p)| now.saturating_sub(p.last_heard) > timeout)
            .map(|(id, p)| (*id, p.latest.0))
            .collect();
        for (id, _) in &gone {
            // Its address was last heard from when the peer was.
            if let Some(peer) = self.peers.remove(id) {
                self.saw(&peer.addr, peer.last_heard);
            }
        }
        self.forget(now);
        debug_assert!(!self.peers.contains_key(&self.me));
        gone
    }

    /// Drops learned addresses unheard for `forget_after_ms`, except an
    /// adjacent peer's (one kept alive by surrogates only): that one counts
    /// as seen now. Only the few past the limit are looked at against the
    /// adjacency, so a tick costs no work per adjacent peer.
    fn forget(&mut self, now: u64) {
        let forget = self.cfg.forget_after_ms;
        let stale: Vec<PeerAddr> = self
            .known
            .iter()
            .filter(|(_, k)| !k.seed && now.saturating_sub(k.last_seen) > forget)
            .map(|(addr, _)| addr.clone())
            .collect();
        for addr in stale {
            if self.peers.values().any(|p| p.addr == addr) {
                self.saw(&addr, now);
            } else {
                self.known.remove(&addr);
            }
        }
    }

    fn saw(&mut self, addr: &PeerAddr, now: u64) {
        if let Some(k) = self.known.get_mut(addr) {
            k.last_seen = k.last_seen.max(now);
        }
    }

    /// Adjacent peers, ascending by id.
    pub fn adjacency(&self) -> impl DoubleEndedIterator<Item = NodeId> + '_ {
        self.peers.keys().copied()
    }

    /// State of one adjacent peer.
    pub fn peer(&self, id: NodeId) -> Option<&PeerState> {
        self.peers.get(&id)
    }

    /// Address of an adjacent peer.
    pub fn addr_of(&self, id: NodeId) -> Option<&PeerAddr> {
        self.peers.get(&id).map(|p| &p.addr)
    }

    /// Number of addresses heartbeats go to.
    pub fn known_addr_count(&self) -> usize {
        self.known.len()
    }
}

/// One clock-offset sample: a heartbeat sent at `sent_ms` on the sender's
/// clock arrived at `now` on ours.
fn clock_offset(sent_ms: u64, now: u64) -> i64 {
    let difference = i128::from(sent_ms) - i128::from(now);
    i64::try_from(difference).unwrap_or(if difference < 0 { i64::MIN } else { i64::MAX })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> PeerAddr {
        PeerAddr::new(s).expect("addr")
    }

    fn hb(a: &str, inc: u64, seq: u64, peers: Vec<(NodeId, PeerAddr)>) -> Heartbeat {
        Heartbeat {
            addr: addr(a),
            incarnation: inc,
            seq,
            sent_ms: 0,
            cluster_key: 0,
            succession: vec![],
            peers,
        }
    }

    #[test]
    fn a_clock_offset_is_the_least_delayed_of_the_last_samples() {
        let mut clock = ClockSamples::default();
        assert_eq!(clock.estimate(), None);
        // A peer 100 ms ahead: heartbeats delayed 2, 0, 40 ms.
        for sample in [98, 100, 60] {
            clock.record(sample);
        }
        assert_eq!(clock.estimate(), Some(100));
        // Its clock stepped back 50 ms: once the older samples have rolled
        // out of the window, the estimate follows.
        for _ in 0..CLOCK_SAMPLES - 1 {
            clock.record(49);
        }
        assert_eq!(clock.estimate(), Some(60));
        clock.record(50);
        assert_eq!(clock.estimate(), Some(50));
        assert_eq!(clock_offset(1_000, 1_250), -250);
        assert_eq!(clock_offset(u64::MAX, 0), i64::MAX);
        assert_eq!(clock_offset(0, u64::MAX), i64::MIN);
    }

    fn state() -> HeartbeatState {
        let cfg = HeartbeatConfig {
            interval_ms: 100,
            timeout_ms: 500,
            forget_after_ms: 2000,
            seeds: vec![addr("me"), addr("seed")],
        };
        HeartbeatState::new(NodeId(1), addr("me"), cfg, 0, 0)
    }

    #[test]
    fn sends_to_seeds_and_learned_peers_on_schedule() {
        let mut s = state();
        let (seq, targets) = s.due(0).expect("first round due at once");
        assert_eq!(seq, 1);
        assert_eq!(targets, vec![addr("seed")]);
        assert!(s.due(50).is_none());
        s.on_heartbeat(
            NodeId(2),
            &hb("two", 1, 1, vec![(NodeId(3), addr("three"))]),
            60,
        );
        let (_, targets) = s.due(100).expect("second round");
        assert_eq!(targets, vec![addr("seed"), addr("three"), addr("two")]);
    }

    #[test]
    fn adjacency_times_out_and_surrogates_keep_alive() {
        let mut s = state();
        assert_eq!(
            s.on_heartbeat(NodeId(2), &hb("two", 1, 1, vec![]), 0),
            HeartbeatOutcome::NewPeer
        );
        assert_eq!(
            s.on_heartbeat(NodeId(3), &hb("three", 1, 1, vec![]), 0),
            HeartbeatOutcome::NewPeer
        );
        // Node 2 only sends fabric traffic from now on.
        assert!(s.on_fabric_message(NodeId(2), 400));
        assert!(!s.on_fabric_message(NodeId(9), 400));
        assert_eq!(s.expire(500), Vec::<(NodeId, u64)>::new());
        assert_eq!(s.expire(501), vec![(NodeId(3), 1)]);
        assert_eq!(s.adjacency().collect::<Vec<_>>(), vec![NodeId(2)]);
        assert_eq!(s.expire(901), vec![(NodeId(2), 1)]);
        assert_eq!(s.adjacency().count(), 0);
    }

    #[test]
    fn stale_heartbeats_do_not_roll_back_gossip() {
        let mut s = state();
        let mut newer = hb("two", 1, 5, vec![]);
        newer.cluster_key = 77;
        newer.succession = vec![NodeId(1), NodeId(2)];
        s.on_heartbeat(NodeId(2), &newer, 0);
        assert_eq!(
            s.on_heartbeat(NodeId(2), &hb("two", 1, 4, vec![]), 1),
            HeartbeatOutcome::Stale
        );
        assert_eq!(s.peer(NodeId(2)).map(|p| p.cluster_key), Some(77));
        // A restart (higher incarnation) resets the sequence.
        assert_eq!(
            s.on_heartbeat(NodeId(2), &hb("two", 2, 1, vec![]), 2),
            HeartbeatOutcome::Restarted
        );
        assert_eq!(s.peer(NodeId(2)).map(|p| p.cluster_key), Some(0));
        assert_eq!(
            s.on_heartbeat(NodeId(1), &hb("x", 1, 1, vec![]), 3),
            HeartbeatOutcome::FromSelf
        );
    }

    /// Past [`GOSSIP_SLICE`] peers a heartbeat no longer carries the whole
    /// adjacency list (issue 45: at 1000 nodes that was 27 KB a heartbeat):
    /// each round gossips a rotating slice plus the newly adjacent peers,
    /// so every peer is still gossiped within a few rounds and a newcomer
    /// at once.
    #[test]
    fn large_adjacency_is_gossiped_in_rotating_slices() {
        let mut s = state();
        let n = 3 * GOSSIP_SLICE + 5;
        for i in 0..n as u64 {
            let hb = hb(&format!("p{i}"), 1, 1, vec![]);
            s.on_heartbeat(NodeId(100 + i), &hb, 0);
        }
        let round = |s: &mut HeartbeatState, now: u64| {
            let (seq, _) = s.due(now).expect("round due");
            s.build(seq, now, 0, &[]).peers
        };
        // The first round has no previous one: everyone is new.
        assert_eq!(round(&mut s, 0).len(), n);
        let mut seen = std::collections::BTreeSet::new();
        let rounds = n.div_ceil(GOSSIP_SLICE) as u64 * GOSSIP_SLICE_EVERY;
        for r in 1..=rounds {
            let peers = round(&mut s, 100 * r);
            // Round r has sequence number r + 1.
            let slice = (r + 1).is_multiple_of(GOSSIP_SLICE_EVERY);
            assert_eq!(
                peers.len(),
                if slice { GOSSIP_SLICE } else { 0 },
                "round {r}"
            );
            seen.extend(peers.into_iter().map(|(id, _)| id));
        }
        assert_eq!(seen.len(), n, "every peer gossiped within {rounds} rounds");
        // A peer heard after the latest round is in the next one.
        let now = 100 * rounds;
        s.on_heartbeat(NodeId(7), &hb("newcomer", 1, 1, vec![]), now + 50);
        let peers = round(&mut s, now + 100);
        assert!(peers.contains(&(NodeId(7), addr("newcomer"))), "{peers:?}");
        assert!(peers.len() <= GOSSIP_SLICE + 1);
        let peers = round(&mut s, now + 200);
        assert!(!peers.contains(&(NodeId(7), addr("newcomer"))));
    }

    #[test]
    fn learned_addresses_are_forgotten_seeds_are_not() {
        let mut s = state();
        s.on_heartbeat(
            NodeId(2),
            &hb("two", 1, 1, vec![(NodeId(3), addr("three"))]),
            0,
        );
        assert_eq!(s.known_addr_count(), 3);
        s.expire(1000); // node 2 times out
        s.expire(2500);
        assert_eq!(s.known_addr_count(), 1, "only the seed remains");
    }
}
