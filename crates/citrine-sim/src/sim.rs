//! One deterministic simulation run: N [`ClusterNode`]s on one thread, a fake
//! network, fake drifting clocks, crashes and restarts, and the invariant
//! checks.
//!
//! Owns: the scenario script of a run, the network model and the checks.
//!
//! Script of a run (all choices drawn from the seed):
//! 1. 3..=max nodes with random 64-bit ids boot within the first 2 s; nodes
//!    0 and 1 are everyone's mesh seeds; with probability `flaky_chance`
//!    (if >= 6 nodes) one node is *flaky*: `flaky_loss` on all its links,
//!    both ways, for the whole run.
//! 2. Chaos for `chaos_ms`: every 0.3–2.5 s one of symmetric partition,
//!    one-way link cuts, healing of cuts, crash, restart, freeze (a node
//!    stalls for 0.2–5 s: it is not ticked and sends nothing, and what
//!    reaches it waits until it thaws — then it is ticked first, its clock
//!    having jumped, and reads the held messages after), new global
//!    loss/duplication/jitter, new reordering rate.
//! 3. Heal: cuts cleared, loss <= 2 %, duplication <= 3 %, jitter <= 20 ms,
//!    reordering <= 2 %; frozen nodes thaw; crashed nodes restart, except
//!    possibly one that stays dead. Convergence is required within
//!    `converge_quanta` quanta.
//!    Then, with probability `hb_cut_chance`, the *heartbeat* channel (only)
//!    between two members is cut; surrogate fabric traffic continues.
//! 4. Stable watch for `stable_ms`: no view change may happen.
//! 5. Departure: 1–3 members (or `departure_share` of them) crash at the
//!    same instant; they must leave every
//!    view within the departure bound and each survivor must change view
//!    exactly once; then a stable watch.
//! 6. Rejoin: the crashed members restart at the same instant (heartbeat-only
//!    cut healed); convergence with exactly one view change per survivor,
//!    then a final stable watch.
//!
//! Throughout, members exchange fabric (surrogate) messages every 100 ms.
//!
//! Invariants of the simulator itself:
//! - everything random comes from one [`SimRng`] seeded by the run's seed,
//!   and all collections are `BTreeMap`/`BTreeSet`/`Vec`, so a run is a pure
//!   function of `(seed, SimConfig)`; the trace hash proves it;
//! - simulated real time advances in `tick_ms` steps; each node sees
//!   `offset + t * (1 + drift)` on its own clock, which is monotonic across
//!   the node's restarts;
//! - every message is encoded to bytes at send, decoded and checked to
//!   re-encode to the same bytes, so the wire format is exercised by every
//!   run; a message sent to many targets at once (a heartbeat round) is
//!   encoded and decoded once and its decoding shared by its deliveries.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::rc::Rc;

use citrine_cluster::partition_map::{NodeEntry, PartitionMap, PartitionMapConfig};
use citrine_cluster::{ClusterConfig, ClusterNode, Effect, Envelope, Message, PeerAddr};
use citrine_types::NodeId;

use crate::rng::SimRng;

/// Shape of the runs.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// Fewest nodes in a run.
    pub min_nodes: usize,
    /// Most nodes in a run.
    pub max_nodes: usize,
    /// Length of the chaos phase (faults injected), ms.
    pub chaos_ms: u64,
    /// How long a converged cluster is watched for flapping, ms.
    pub stable_ms: u64,
    /// Simulation step, ms.
    pub tick_ms: u64,
    /// Probability that a run (with >= 6 nodes) has one flaky node.
    pub flaky_chance: f64,
    /// Loss on every link of the flaky node, each direction.
    pub flaky_loss: f64,
    /// Probability that a run cuts the heartbeat channel (only) between two
    /// members during the stable phases, leaving surrogates to keep them
    /// adjacent.
    pub hb_cut_chance: f64,
    /// Crash one member after the first stable phase and check removal.
    pub departure: bool,
    /// Compute the partition map on every node at every view change and
    /// compare fingerprints (costly in debug builds).
    pub check_partition_maps: bool,
    /// Largest clock drift magnitude, parts per million.
    pub max_drift_ppm: u64,
    /// Bound on convergence after the network becomes stable, in quanta.
    pub converge_quanta: u64,
    /// Record every Paxos message in the recent-events log (debugging).
    pub trace_paxos: bool,
    /// Share of the members that crash at once in the departure phase
    /// (at least one, leaving the healthy peers the health test needs);
    /// `None`: 1–3 members, drawn from the seed.
    pub departure_share: Option<f64>,
}

impl SimConfig {
    /// Small, fast runs for debug-build unit tests.
    pub fn quick() -> SimConfig {
        SimConfig {
            min_nodes: 3,
            max_nodes: 7,
            chaos_ms: 10_000,
            stable_ms: 5_000,
            tick_ms: 20,
            flaky_chance: 0.5,
            flaky_loss: 0.6,
            hb_cut_chance: 0.3,
            departure: true,
            check_partition_maps: false,
            max_drift_ppm: 5_000,
            converge_quanta: 5,
            trace_paxos: false,
            departure_share: None,
        }
    }

    /// A large, well-behaved cluster of exactly `nodes` nodes: no chaos,
    /// no flaky node, no heartbeat-only cut; it forms, then (with
    /// `departure`) 10 % of its members crash at once and later restart
    /// at once. Convergence within 3 quanta and identical partition maps
    /// are checked.
    pub fn scale(nodes: usize, departure: bool) -> SimConfig {
        SimConfig {
            min_nodes: nodes,
            max_nodes: nodes,
            chaos_ms: 0,
            stable_ms: 3_000,
            tick_ms: 10,
            flaky_chance: 0.0,
            hb_cut_chance: 0.0,
            departure,
            check_partition_maps: true,
            converge_quanta: 3,
            departure_share: Some(0.1),
            ..SimConfig::quick()
        }
    }

    /// Larger, longer runs for release sweeps and the soak example.
    pub fn full() -> SimConfig {
        SimConfig {
            min_nodes: 3,
            max_nodes: 12,
            chaos_ms: 30_000,
            stable_ms: 15_000,
            tick_ms: 10,
            check_partition_maps: true,
            ..SimConfig::quick()
        }
    }
}

/// The invariants a run checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Invariant {
    /// Every message decodes to exactly what was sent.
    Codec,
    /// The view reported by effects equals the machine's view, and contains
    /// the node itself.
    ViewBookkeeping,
    /// All nodes holding one cluster key hold identical succession lists.
    SameKeySameSuccession,
    /// A non-principal only applies a key its principal applied first.
    CommitOrder,
    /// All nodes of a view compute the identical partition map.
    PartitionMapAgreement,
    /// Once the network is stable, each connected component converges to
    /// one view (exactly its live, healthy nodes) within the bound.
    Convergence,
    /// No view changes while the network is stable and converged.
    NoFlapping,
    /// A crashed node is out of every view within the departure bound.
    Departure,
    /// One event — members crashing at once (up to three, or the configured
    /// `departure_share`), or all of them restarting at once — causes exactly
    /// one view change on each member
    /// that stayed up.
    OneChangePerEvent,
    /// A principal commits at most one view per cluster-change quantum.
    OneCommitPerQuantum,
    /// A flaky (lossy) node is never in a healthy node's view once stable.
    FlakyExcluded,
    /// A node frozen past the heartbeat timeout gives up, at its first tick
    /// after thawing, a view it shared with others; it never holds that
    /// view again, and holds no view of itself alone for as long as an
    /// orphan waits for peers on probation, while a peer of that view that
    /// was running when the freeze began is up and within reach.
    StallOrphan,
    /// Data mode: the cluster comes to rest (one view of every live node,
    /// every node `cluster-stable`, the executor idle) within its bound.
    Quiescence,
    /// Data mode: after quiescence every record is held by exactly its
    /// partition's replicas in the final map, and by no other node.
    Placement,
    /// Data mode: after quiescence the replicas' copies of a record agree
    /// byte for byte (generation, void time, last-update time, set, body).
    ReplicaAgreement,
    /// Data mode: no acknowledged write is lost (counters hold at least
    /// their acknowledged increments; a put key holds its last
    /// acknowledged value or a later attempt's).
    LostWrite,
    /// Data mode: nothing is invented (counters hold at most their
    /// acknowledged plus in-doubt increments; values read were written).
    PhantomWrite,
    /// Data mode, strong consistency: a linearizable read shows no state
    /// older than one acknowledged before the read was sent.
    StaleRead,
    /// Data mode: every reply decodes and carries an expected result code.
    ClientResult,
    /// Data mode: after quiescence every live node knows the truncation a
    /// client issued at one node, holds no record it covers, and no put
    /// acknowledged well before it (by every clock) is read back.
    Truncation,
    /// Data mode: every node starts — its service opens (on restart, from
    /// the device file it wrote before its crash) and keeps its work
    /// directory.
    NodeStart,
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A violated invariant, with what is needed to reproduce it.
#[derive(Clone, Debug)]
pub struct Failure {
    /// The run's seed: `run_seed(seed, cfg)` reproduces the failure.
    pub seed: u64,
    /// Which invariant broke.
    pub invariant: Invariant,
    /// Simulated real time of detection, ms.
    pub at_ms: u64,
    /// Human-readable specifics.
    pub detail: String,
    /// The last notable events before the failure.
    pub recent: Vec<String>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed {} violated {} at {} ms: {}",
            self.seed, self.invariant, self.at_ms, self.detail
        )?;
        writeln!(f, "recent events:")?;
        for e in &self.recent {
            writeln!(f, "  {e}")?;
        }
        Ok(())
    }
}

/// Summary of a successful run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunReport {
    /// The seed.
    pub seed: u64,
    /// Number of nodes.
    pub nodes: usize,
    /// Whether one node was flaky.
    pub flaky: bool,
    /// Whether a heartbeat-only cut was active in the stable phases.
    pub hb_cut: bool,
    /// Hash over every delivery, effect and fault, in order.
    pub trace_hash: u64,
    /// Messages delivered.
    pub deliveries: u64,
    /// View changes reported by all nodes.
    pub view_changes: u64,
    /// Time from "network stable" to convergence, ms, per convergence phase.
    pub convergence_ms: Vec<u64>,
    /// Time from the crash to the departed node leaving every view, ms.
    pub departure_ms: Option<u64>,
    /// Simulated time at the end, ms.
    pub end_ms: u64,
    /// Members crashed together in the departure phase.
    pub departed: usize,
    /// Heartbeat messages sent, all nodes.
    pub heartbeats_sent: u64,
    /// Encoded bytes of those heartbeats.
    pub heartbeat_bytes: u64,
    /// Node-milliseconds of machines running (for per-node rates).
    pub node_ms: u64,
}

/// Runs one seed.
pub fn run_seed(seed: u64, cfg: &SimConfig) -> Result<RunReport, Box<Failure>> {
    let mut sim = Sim::new(seed, cfg.clone());
    sim.run().map_err(Box::new)
}

struct SimNode {
    id: NodeId,
    cfg: ClusterConfig,
    machine: Option<ClusterNode>,
    offset: u64,
    drift_ppm: i64,
    /// The view as reported by effects.
    view: Option<(u64, Vec<NodeId>)>,
    flaky: bool,
    /// Frozen until this simulated time: not ticked, sends nothing, and
    /// what is delivered to it waits in `held` until it thaws.
    frozen_until: Option<u64>,
    /// Messages that arrived while it was frozen, in arrival order.
    held: Vec<Delivery>,
    /// When it last booted (simulated time).
    booted_at: u64,
    /// When it was last frozen, and the view it held then.
    frozen_at: u64,
    view_before_freeze: Option<(u64, Vec<NodeId>)>,
    /// After a thaw from a freeze past the heartbeat timeout, when it held
    /// a view shared with others: until when (simulated time) it must not
    /// hold a view of itself alone, and that view (key, members).
    thawed: Option<(u64, (u64, Vec<NodeId>))>,
}

struct Delivery {
    from: usize,
    to: usize,
    /// `None` for a fabric (surrogate) message.
    msg: Option<Rc<Sent>>,
}

/// One encoded message and what its bytes decode to, shared by every
/// delivery of it: a heartbeat round sends one message to every target,
/// and it is encoded, decoded and checked once, not once per target.
struct Sent {
    bytes_len: u64,
    env: Envelope,
}

struct Net {
    cut: BTreeSet<(usize, usize)>,
    hb_cut: BTreeSet<(usize, usize)>,
    loss: f64,
    dup: f64,
    base_delay: u64,
    jitter: u64,
    reorder: f64,
}

/// What a convergence phase follows, which decides what comes next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// The chaos phase ended and the network became stable.
    Healed,
    /// Some members crashed at once ("a switch failed").
    Departed,
    /// The crashed members restarted at once.
    Rejoined,
}

#[derive(Clone, Debug)]
enum Phase {
    Chaos,
    Converge {
        stage: Stage,
        since: u64,
        deadline: u64,
        /// Per-node view-change counters when the event happened; survivors
        /// must change exactly once (not checked after the chaos phase).
        changes_before: Vec<u64>,
    },
    Stable {
        stage: Stage,
        until: u64,
    },
    Done,
}

const FABRIC_EVERY_MS: u64 = 100;
const RECENT: usize = 60;
const RECENT_TRACED: usize = 400;

struct Sim {
    seed: u64,
    cfg: SimConfig,
    rng: SimRng,
    now: u64,
    nodes: Vec<SimNode>,
    addr_index: BTreeMap<PeerAddr, usize>,
    boot_at: Vec<u64>,
    queue: BTreeMap<(u64, u64), Delivery>,
    seq: u64,
    net: Net,
    hash: u64,
    recent: VecDeque<String>,
    deliveries: u64,
    view_changes: u64,
    changes_per_node: Vec<u64>,
    principal_keys: BTreeSet<u64>,
    fp_by_key: BTreeMap<u64, u64>,
    /// Partition map fingerprint per succession list (the map is a pure
    /// function of it, so each list is computed once).
    fp_by_succession: BTreeMap<Vec<NodeId>, u64>,
    /// Node index by node id.
    index_of: BTreeMap<NodeId, usize>,
    heartbeats_sent: u64,
    heartbeat_bytes: u64,
    node_ms: u64,
    phase: Phase,
    chaos_end: u64,
    next_chaos: u64,
    convergence_ms: Vec<u64>,
    departure_ms: Option<u64>,
    hb_cut_pair: Option<(usize, usize)>,
    /// Nodes crashed together in the departure phase.
    victims: Vec<usize>,
    /// Boots per node (a machine life counter).
    boots: Vec<u64>,
    /// (life, quantum index) of each node's last commit as principal.
    last_commit: Vec<Option<(u64, u64)>>,
    pending_failure: Option<Failure>,
}

fn mix(h: u64, v: u64) -> u64 {
    let mut s = h ^ v;
    crate::rng::splitmix64(&mut s)
}

fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl Sim {
    fn new(seed: u64, cfg: SimConfig) -> Sim {
        assert!(cfg.min_nodes >= 2 && cfg.min_nodes <= cfg.max_nodes);
        assert!(cfg.tick_ms > 0);
        let mut rng = SimRng::new(seed);
        let n = rng.range(cfg.min_nodes as u64, cfg.max_nodes as u64) as usize;
        let mut ids = BTreeSet::new();
        while ids.len() < n {
            ids.insert(rng.next_u64() >> rng.below(40));
        }
        let mut ids: Vec<u64> = ids.into_iter().collect();
        // Shuffle so that index order says nothing about id order.
        for i in (1..ids.len()).rev() {
            let j = rng.index(i + 1);
            ids.swap(i, j);
        }
        let addrs: Vec<PeerAddr> = (0..n)
            .filter_map(|i| PeerAddr::new(format!("10.0.0.{i}:3002")))
            .collect();
        assert_eq!(addrs.len(), n);
        let seeds: Vec<PeerAddr> = addrs.iter().take(2).cloned().collect();
        let flaky_idx = (n >= 6 && rng.chance(cfg.flaky_chance)).then(|| rng.index(n));
        let mut nodes = Vec::with_capacity(n);
        let mut addr_index = BTreeMap::new();
        for i in 0..n {
            let id = NodeId(ids[i]);
            let cc = ClusterConfig::new(id, addrs[i].clone(), seeds.clone());
            addr_index.insert(addrs[i].clone(), i);
            let drift = cfg.max_drift_ppm as i64;
            nodes.push(SimNode {
                id,
                cfg: cc,
                machine: None,
                offset: rng.below(1 << 40),
                drift_ppm: rng.range(0, 2 * drift as u64) as i64 - drift,
                view: None,
                flaky: flaky_idx == Some(i),
                frozen_until: None,
                held: Vec::new(),
                booted_at: 0,
                frozen_at: 0,
                view_before_freeze: None,
                thawed: None,
            });
        }
        let boot_at = (0..n).map(|_| rng.below(2000)).collect();
        let index_of = nodes
            .iter()
            .enumerate()
            .map(|(i, node)| (node.id, i))
            .collect();
        let chaos_end = cfg.chaos_ms;
        let next_chaos = rng.range(300, 2500);
        Sim {
            seed,
            cfg,
            rng,
            now: 0,
            nodes,
            addr_index,
            boot_at,
            queue: BTreeMap::new(),
            seq: 0,
            net: Net {
                cut: BTreeSet::new(),
                hb_cut: BTreeSet::new(),
                loss: 0.01,
                dup: 0.01,
                base_delay: 1,
                jitter: 5,
                reorder: 0.01,
            },
            hash: seed,
            recent: VecDeque::new(),
            deliveries: 0,
            view_changes: 0,
            changes_per_node: vec![0; n],
            principal_keys: BTreeSet::new(),
            fp_by_key: BTreeMap::new(),
            fp_by_succession: BTreeMap::new(),
            index_of,
            heartbeats_sent: 0,
            heartbeat_bytes: 0,
            node_ms: 0,
            phase: Phase::Chaos,
            chaos_end,
            next_chaos,
            convergence_ms: Vec::new(),
            departure_ms: None,
            hb_cut_pair: None,
            victims: Vec::new(),
            boots: vec![0; n],
            last_commit: vec![None; n],
            pending_failure: None,
        }
    }

    fn timing(&self) -> (u64, u64, u64, u64, u64) {
        let c = &self.nodes[0].cfg;
        (
            c.heartbeat.timeout_ms,
            c.quantum_ms,
            c.retry_delay_ms,
            c.paxos_timeout_ms,
            c.heartbeat.interval_ms,
        )
    }

    /// Scales a local-clock duration to a safe real-time bound.
    fn drift_bound(&self, ms: u64) -> u64 {
        ms + ms * 2 * self.cfg.max_drift_ppm / 1_000_000 + 2 * self.cfg.tick_ms
    }

    fn converge_bound(&self) -> u64 {
        let (_, quantum, ..) = self.timing();
        self.drift_bound(self.cfg.converge_quanta * quantum)
    }

    fn departure_bound(&self) -> u64 {
        let (timeout, quantum, _, _, interval) = self.timing();
        // Timeout plus one quantum, as 001 §2.1.3 promises: detection (the
        // timeout runs from the last message, which left up to one interval
        // before the crash) and the wait for the next quantum, plus 400 ms
        // for the round itself and network delays. (A retried round — when
        // the departed node was the principal and a survivor noticed it a
        // little later than its successor — could exceed this; no seed has
        // shown it yet.)
        self.drift_bound(timeout + interval + quantum) + 400
    }

    /// Fingerprint of the partition map every member of succession `s`
    /// computes (every node on rack 0).
    fn map_fingerprint(&mut self, s: &[NodeId]) -> u64 {
        if let Some(fp) = self.fp_by_succession.get(s) {
            return *fp;
        }
        let entries: Vec<NodeEntry> = s
            .iter()
            .map(|id| NodeEntry {
                id: *id,
                rack_id: 0,
            })
            .collect();
        let fp = PartitionMap::compute(&entries, &PartitionMapConfig::default()).fingerprint();
        self.fp_by_succession.insert(s.to_vec(), fp);
        fp
    }

    fn local(&self, i: usize, t: u64) -> u64 {
        let n = &self.nodes[i];
        let skew = (i128::from(t) * i128::from(n.drift_ppm)) / 1_000_000;
        let v = i128::from(n.offset) + i128::from(t) + skew;
        u64::try_from(v).unwrap_or(0)
    }

    fn note(&mut self, text: String) {
        let cap = if self.cfg.trace_paxos {
            RECENT_TRACED
        } else {
            RECENT
        };
        if self.recent.len() >= cap {
            self.recent.pop_front();
        }
        self.recent.push_back(format!("{:>7} ms  {text}", self.now));
    }

    fn fail(&self, invariant: Invariant, detail: String) -> Failure {
        Failure {
            seed: self.seed,
            invariant,
            at_ms: self.now,
            detail,
            recent: self.recent.iter().cloned().collect(),
        }
    }

    fn describe_views(&self) -> String {
        let mut s = String::new();
        for (i, n) in self.nodes.iter().enumerate() {
            let state = match (&n.machine, &n.view) {
                (None, _) => "down".to_string(),
                (Some(_), None) => "orphan".to_string(),
                (Some(_), Some((k, succ))) => format!(
                    "key {k:016x} [{}]",
                    succ.iter()
                        .map(|id| id.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                ),
            };
            let flaky = if n.flaky { " (flaky)" } else { "" };
            s.push_str(&format!("\n    #{i} {}{flaky}: {state}", n.id));
        }
        s
    }

    fn boot(&mut self, i: usize) {
        let local = self.local(i, self.now);
        match ClusterNode::new(self.nodes[i].cfg.clone(), local) {
            Ok(m) => {
                self.nodes[i].machine = Some(m);
                self.nodes[i].booted_at = self.now;
            }
            Err(e) => {
                self.pending_failure =
                    Some(self.fail(Invariant::ViewBookkeeping, format!("config rejected: {e}")));
            }
        }
        self.nodes[i].view = None;
        self.boots[i] += 1;
        self.hash = mix(self.hash, 0xB007 ^ (i as u64));
        let id = self.nodes[i].id;
        self.note(format!("boot #{i} {id}"));
    }

    fn crash(&mut self, i: usize) {
        self.nodes[i].machine = None;
        self.nodes[i].view = None;
        self.nodes[i].frozen_until = None;
        self.nodes[i].held.clear();
        self.nodes[i].thawed = None;
        self.hash = mix(self.hash, 0xDEAD ^ (i as u64));
        let id = self.nodes[i].id;
        self.note(format!("crash #{i} {id}"));
    }

    fn live(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|i| self.nodes[*i].machine.is_some())
            .collect()
    }

    fn enqueue(&mut self, from: usize, to: usize, msg: Option<Rc<Sent>>, is_hb: bool) {
        if self.net.cut.contains(&(from, to)) || (is_hb && self.net.hb_cut.contains(&(from, to))) {
            return;
        }
        let mut loss = self.net.loss;
        if self.nodes[from].flaky || self.nodes[to].flaky {
            loss = 1.0 - (1.0 - loss) * (1.0 - self.cfg.flaky_loss);
        }
        if self.rng.chance(loss) {
            return;
        }
        let copies = if self.rng.chance(self.net.dup) { 2 } else { 1 };
        for c in 0..copies {
            let mut delay = self.net.base_delay + self.rng.below(self.net.jitter + 1);
            if self.rng.chance(self.net.reorder) {
                delay += self.rng.range(20, 200);
            }
            self.seq += 1;
            let due = self.now + delay;
            let d = Delivery {
                from,
                to,
                msg: msg.clone(),
            };
            self.queue.insert((due, self.seq), d);
            let len = msg.as_ref().map_or(0, |m| m.bytes_len);
            self.hash = mix(
                self.hash,
                (due << 20) ^ ((from as u64) << 10) ^ to as u64 ^ (c << 9),
            );
            self.hash = mix(self.hash, len);
        }
    }

    fn handle(&mut self, i: usize, effects: Vec<Effect>) -> Result<(), Failure> {
        let me = self.nodes[i].id;
        // The last message encoded, its bytes' hash and its shared decoding.
        let mut last: Option<(Message, u64, Rc<Sent>)> = None;
        for e in effects {
            match e {
                Effect::Send { to, msg } => {
                    let Some(&j) = self.addr_index.get(&to) else {
                        continue;
                    };
                    if self.cfg.trace_paxos && !matches!(msg, Message::Heartbeat(_)) {
                        self.note(format!("#{i} -> #{j}: {msg:?}"));
                    }
                    let is_hb = matches!(msg, Message::Heartbeat(_));
                    let (digest, sent) = match &last {
                        Some((prev, digest, sent)) if *prev == msg => (*digest, Rc::clone(sent)),
                        _ => {
                            let (digest, sent) = self.encode_checked(me, &msg)?;
                            last = Some((msg, digest, Rc::clone(&sent)));
                            (digest, sent)
                        }
                    };
                    if is_hb {
                        self.heartbeats_sent += 1;
                        self.heartbeat_bytes += sent.bytes_len;
                    }
                    self.hash = mix(self.hash, digest);
                    self.enqueue(i, j, Some(sent), is_hb);
                }
                Effect::ViewChanged {
                    cluster_key,
                    succession,
                } => {
                    self.on_view_change(i, Some((cluster_key, succession)))?;
                }
                Effect::Orphaned => self.on_view_change(i, None)?,
            }
        }
        Ok(())
    }

    fn on_view_change(
        &mut self,
        i: usize,
        view: Option<(u64, Vec<NodeId>)>,
    ) -> Result<(), Failure> {
        let me = self.nodes[i].id;
        self.view_changes += 1;
        self.changes_per_node[i] += 1;
        match &view {
            Some((k, s)) => {
                self.hash = mix(self.hash, *k ^ (i as u64));
                let text = s
                    .iter()
                    .map(|id| id.to_string())
                    .collect::<Vec<_>>()
                    .join(",");
                self.note(format!("#{i} {me} view {k:016x} [{text}]"));
                // A view of itself alone formed during the orphan wait after
                // a freeze, while a peer of the view it gave up is in reach.
                // (One formed while every such peer was out of reach is the
                // node's right; it merges when they meet again.)
                if let Some((until, (_, members))) = &self.nodes[i].thawed {
                    if s.len() == 1 && self.now < *until && self.reachable_peer(i, members) {
                        return Err(self.fail(
                            Invariant::StallOrphan,
                            format!(
                                "#{i} formed a view of itself alone {} ms before its orphan wait ends",
                                until - self.now
                            ),
                        ));
                    }
                }
                if s.last() == Some(&me) {
                    self.principal_keys.insert(*k);
                    let life = self.boots[i];
                    // The quantum that decided the view, not the one the
                    // tick that emitted it ended in (seed 45816: a retry
                    // decided at its deadline, and the boundary's new round,
                    // fell due at one tick).
                    let q = self.nodes[i]
                        .machine
                        .as_ref()
                        .and_then(ClusterNode::last_commit_quantum)
                        .unwrap_or(0);
                    if self.last_commit[i] == Some((life, q)) {
                        return Err(self.fail(
                            Invariant::OneCommitPerQuantum,
                            format!("#{i} committed twice in quantum {q}"),
                        ));
                    }
                    self.last_commit[i] = Some((life, q));
                } else if !self.principal_keys.contains(k) {
                    return Err(self.fail(
                        Invariant::CommitOrder,
                        format!("#{i} applied key {k:016x} before its principal did"),
                    ));
                }
                if self.cfg.check_partition_maps {
                    let fp = self.map_fingerprint(s);
                    match self.fp_by_key.get(k) {
                        Some(prev) if *prev != fp => {
                            return Err(self.fail(
                                Invariant::PartitionMapAgreement,
                                format!("#{i} key {k:016x} fingerprint {fp:x} != {prev:x}"),
                            ));
                        }
                        Some(_) => {}
                        None => {
                            self.fp_by_key.insert(*k, fp);
                        }
                    }
                }
            }
            None => {
                self.hash = mix(self.hash, 0x0_4FA2 ^ (i as u64));
                self.note(format!("#{i} {me} orphaned"));
            }
        }
        self.nodes[i].view = view;
        let flaky = self.nodes[i].flaky;
        if let Phase::Stable { .. } = self.phase {
            if !flaky {
                return Err(self.fail(
                    Invariant::NoFlapping,
                    format!(
                        "#{i} {me} changed view while stable{}",
                        self.describe_views()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Encodes `msg` from `me`, decodes the bytes and checks that they
    /// re-encode to themselves; returns their hash and the decoding.
    fn encode_checked(&self, me: NodeId, msg: &Message) -> Result<(u64, Rc<Sent>), Failure> {
        let bytes = Envelope {
            from: me,
            msg: msg.clone(),
        }
        .encode();
        let env = match Envelope::decode(&bytes) {
            Ok(env) => env,
            Err(e) => return Err(self.fail(Invariant::Codec, format!("decode failed: {e}"))),
        };
        // The encoding is canonical: re-encoding what was decoded must
        // give back the bytes that were sent.
        if env.encode() != bytes || env.msg != *msg {
            return Err(self.fail(
                Invariant::Codec,
                format!("{:?} does not re-encode to the bytes sent", env.msg),
            ));
        }
        let sent = Sent {
            bytes_len: bytes.len() as u64,
            env,
        };
        Ok((fnv(&bytes), Rc::new(sent)))
    }

    fn deliver_due(&mut self) -> Result<(), Failure> {
        while let Some(entry) = self.queue.first_entry() {
            if entry.key().0 > self.now {
                break;
            }
            let ((due, _), d) = entry.remove_entry();
            self.deliveries += 1;
            if self.nodes[d.to].frozen_until.is_some() {
                self.nodes[d.to].held.push(d);
                continue;
            }
            self.deliver(d, due)?;
        }
        Ok(())
    }

    /// Hands one delivery to its node at simulated time `at`.
    fn deliver(&mut self, d: Delivery, at: u64) -> Result<(), Failure> {
        let to = d.to;
        let local = self.local(to, at);
        let from_id = self.nodes[d.from].id;
        let Some(machine) = self.nodes[to].machine.as_mut() else {
            return Ok(());
        };
        match d.msg {
            None => machine.on_fabric_message(from_id, local),
            Some(sent) => {
                let eff = machine.on_message(sent.env.from, sent.env.msg.clone(), local);
                self.handle(to, eff)?;
            }
        }
        Ok(())
    }

    /// Freezes node `i` for `ms` (a stalled process: SIGSTOP, a long
    /// pause of its machine).
    fn freeze(&mut self, i: usize, ms: u64) {
        self.nodes[i].frozen_until = Some(self.now + ms);
        self.nodes[i].frozen_at = self.now;
        self.nodes[i].view_before_freeze = self.nodes[i].view.clone();
        self.hash = mix(self.hash, 0xF4EE ^ (i as u64) ^ (ms << 8));
        let id = self.nodes[i].id;
        self.note(format!("freeze #{i} {id} for {ms} ms"));
    }

    /// Node `i` carries on: it is ticked first (its clock jumped), then
    /// reads what was held for it, in arrival order — the order that
    /// tempts a node to time out every peer at once.
    fn thaw(&mut self, i: usize) -> Result<(), Failure> {
        self.nodes[i].frozen_until = None;
        let held = std::mem::take(&mut self.nodes[i].held);
        let id = self.nodes[i].id;
        self.note(format!("thaw #{i} {id} ({} messages held)", held.len()));
        let local = self.local(i, self.now);
        if let Some(machine) = self.nodes[i].machine.as_mut() {
            let eff = machine.tick(local);
            self.handle(i, eff)?;
        }
        // Frozen for longer than the timeout by every clock: the stall rule
        // applies (its local gap exceeds the timeout).
        let (timeout, ..) = self.timing();
        let frozen_for = self.now - self.nodes[i].frozen_at;
        if self.nodes[i].machine.is_some() && frozen_for > self.drift_bound(timeout) {
            let me = self.nodes[i].id;
            let shared = self.nodes[i]
                .view_before_freeze
                .take()
                .filter(|(_, members)| members.iter().any(|m| *m != me));
            if let Some(shared) = shared {
                if self.nodes[i].view.as_ref().map(|(key, _)| *key) == Some(shared.0) {
                    return Err(self.fail(
                        Invariant::StallOrphan,
                        format!("#{i} thawed after {frozen_for} ms still holds its view"),
                    ));
                }
                let health = &self.nodes[i].cfg.health;
                let wait = (u64::from(health.probation_windows) + 2) * health.window_ms;
                // Less a window (for the drift): a conservative bound.
                let until = self.now + wait.saturating_sub(health.window_ms);
                self.nodes[i].thawed = Some((until, shared));
            }
        }
        for d in held {
            self.deliver(d, self.now)?;
        }
        Ok(())
    }

    fn chaos_event(&mut self) {
        let n = self.nodes.len();
        let kind = self.rng.below(9);
        match kind {
            0 => {
                // Symmetric partition into two random groups.
                self.net.cut.clear();
                let side: Vec<bool> = (0..n).map(|_| self.rng.chance(0.5)).collect();
                for a in 0..n {
                    for b in 0..n {
                        if side[a] != side[b] {
                            self.net.cut.insert((a, b));
                        }
                    }
                }
                self.note(format!("partition {side:?}"));
            }
            1 => {
                // One-way cuts.
                let k = self.rng.range(1, n as u64);
                for _ in 0..k {
                    let a = self.rng.index(n);
                    let b = self.rng.index(n);
                    if a != b {
                        self.net.cut.insert((a, b));
                        self.note(format!("one-way cut #{a} -> #{b}"));
                    }
                }
            }
            2 => {
                self.net.cut.clear();
                self.note("heal links".to_string());
            }
            3 => {
                let live = self.live();
                if live.len() > 1 {
                    let v = live[self.rng.index(live.len())];
                    self.crash(v);
                }
            }
            4 | 5 => {
                let down: Vec<usize> = (0..n)
                    .filter(|i| self.nodes[*i].machine.is_none() && self.boot_at[*i] <= self.now)
                    .collect();
                if !down.is_empty() {
                    let v = down[self.rng.index(down.len())];
                    self.boot(v);
                }
            }
            8 => {
                let live: Vec<usize> = self
                    .live()
                    .into_iter()
                    .filter(|i| self.nodes[*i].frozen_until.is_none())
                    .collect();
                if !live.is_empty() {
                    let v = live[self.rng.index(live.len())];
                    let ms = self.rng.range(200, 5000);
                    self.freeze(v, ms);
                }
            }
            6 => {
                self.net.loss = self.rng.unit() * 0.1;
                self.net.dup = self.rng.unit() * 0.05;
                self.net.jitter = self.rng.range(0, 30);
                self.note(format!(
                    "loss {:.3} dup {:.3} jitter {}",
                    self.net.loss, self.net.dup, self.net.jitter
                ));
            }
            _ => {
                self.net.reorder = self.rng.unit() * 0.2;
                self.note(format!("reorder {:.3}", self.net.reorder));
            }
        }
        self.hash = mix(self.hash, 0xC4A05 ^ kind);
    }

    fn heal(&mut self) {
        self.net.cut.clear();
        // Frozen nodes carry on at the next step.
        for node in &mut self.nodes {
            if node.frozen_until.is_some() {
                node.frozen_until = Some(self.now);
            }
        }
        self.net.loss = self.rng.unit() * 0.02;
        self.net.dup = self.rng.unit() * 0.03;
        self.net.jitter = self.rng.range(0, 20);
        self.net.reorder = self.rng.unit() * 0.02;
        let n = self.nodes.len();
        let healthy: Vec<usize> = (0..n).filter(|i| !self.nodes[*i].flaky).collect();
        // Maybe one node stays dead for good.
        let dead = (healthy.len() >= 4 && self.rng.chance(0.3))
            .then(|| healthy[self.rng.index(healthy.len())]);
        for i in 0..n {
            let down = self.nodes[i].machine.is_none();
            if Some(i) == dead {
                if !down {
                    self.crash(i);
                }
            } else if down {
                self.boot(i);
            }
        }
        self.note(format!(
            "network stable: loss {:.3} dup {:.3} jitter {} reorder {:.3}",
            self.net.loss, self.net.dup, self.net.jitter, self.net.reorder
        ));
        self.hash = mix(self.hash, 0x4EA1);
    }

    /// Live, non-flaky nodes: the component expected to converge.
    fn expected_members(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|i| self.nodes[*i].machine.is_some() && !self.nodes[*i].flaky)
            .collect()
    }

    fn converged(&self) -> Option<u64> {
        let members = self.expected_members();
        let mut ids: Vec<NodeId> = members.iter().map(|i| self.nodes[*i].id).collect();
        ids.sort();
        let principal = *ids.last()?;
        let mut key = None;
        // All views first: each later check costs a walk of a member's
        // adjacency, which a run of 1000 nodes cannot pay for every member
        // at every tick.
        for i in &members {
            let (k, s) = self.nodes[*i].view.as_ref()?;
            if *s != ids || key.is_some_and(|x| x != *k) {
                return None;
            }
            key = Some(*k);
        }
        for i in &members {
            // Agreement must also be a fixpoint, not a coincidence left over
            // from before the network settled: every member follows the
            // principal, and the principal's eligible set is exactly the
            // expected membership (so it has no change pending).
            // Every member also regards every other member as eligible
            // (past health probation), so any later change of a single
            // channel is judged against an established adjacency.
            let machine = self.nodes[*i].machine.as_ref()?;
            if machine.principal() != principal {
                return None;
            }
            let eligible = machine.eligible();
            if machine.id() == principal && !eligible.iter().eq(ids.iter()) {
                return None;
            }
            if !ids.iter().all(|id| eligible.contains(id)) {
                return None;
            }
        }
        key
    }

    /// Whether node `i` (not flaky, no link of it cut) has a peer among
    /// `members` (the view it held before its freeze) that is up, not
    /// frozen and not flaky, and was already running when the freeze
    /// began: a node with one such peer never has to form a view of itself
    /// alone. A peer booted since (it crashed before, or meanwhile) is a
    /// newcomer the node has not heard yet, whose absence the stall did not
    /// cause.
    fn reachable_peer(&self, i: usize, members: &[NodeId]) -> bool {
        if self.nodes[i].flaky || self.net.cut.iter().any(|(a, b)| *a == i || *b == i) {
            return false;
        }
        let frozen_at = self.nodes[i].frozen_at;
        self.nodes.iter().any(|n| {
            n.id != self.nodes[i].id
                && members.contains(&n.id)
                && n.machine.is_some()
                && n.booted_at <= frozen_at
                && n.frozen_until.is_none()
                && !n.flaky
        })
    }

    fn safety(&self) -> Result<(), Failure> {
        let mut by_key: BTreeMap<u64, (usize, &Vec<NodeId>)> = BTreeMap::new();
        for (i, n) in self.nodes.iter().enumerate() {
            let Some(machine) = &n.machine else { continue };
            let actual = machine.view().map(|v| (v.key(), v.succession()));
            let recorded = n.view.as_ref().map(|(k, s)| (*k, s.as_slice()));
            if actual != recorded {
                return Err(self.fail(
                    Invariant::ViewBookkeeping,
                    format!("#{i}: machine view {actual:?} != reported {recorded:?}"),
                ));
            }
            let Some((k, s)) = &n.view else { continue };
            if !s.contains(&n.id) {
                return Err(self.fail(Invariant::ViewBookkeeping, format!("#{i} not in its view")));
            }
            if let Some((_, (stale, _))) = &n.thawed {
                if stale == k {
                    return Err(self.fail(
                        Invariant::StallOrphan,
                        format!("#{i} holds again the view {k:016x} it held before its freeze"),
                    ));
                }
            }
            match by_key.get(k) {
                Some((j, other)) if *other != s => {
                    return Err(self.fail(
                        Invariant::SameKeySameSuccession,
                        format!("#{i} and #{j} hold key {k:016x} with different lists"),
                    ));
                }
                Some(_) => {}
                None => {
                    by_key.insert(*k, (i, s));
                }
            }
        }
        Ok(())
    }

    fn flaky_check(&self) -> Result<(), Failure> {
        let Some(f) = self.nodes.iter().position(|n| n.flaky) else {
            return Ok(());
        };
        let fid = self.nodes[f].id;
        for (i, n) in self.nodes.iter().enumerate() {
            if i == f || n.machine.is_none() {
                continue;
            }
            if n.view.as_ref().is_some_and(|(_, s)| s.contains(&fid)) {
                return Err(self.fail(
                    Invariant::FlakyExcluded,
                    format!("#{i} has flaky #{f} in its view{}", self.describe_views()),
                ));
            }
        }
        Ok(())
    }

    fn fabric_traffic(&mut self) {
        let step = self.now / self.cfg.tick_ms;
        let every = (FABRIC_EVERY_MS / self.cfg.tick_ms).max(1);
        for i in 0..self.nodes.len() {
            if self.nodes[i].machine.is_none()
                || self.nodes[i].frozen_until.is_some()
                || step % every != (i as u64) % every
            {
                continue;
            }
            let Some((_, succ)) = self.nodes[i].view.clone() else {
                continue;
            };
            let me = self.nodes[i].id;
            for m in succ {
                if m == me {
                    continue;
                }
                if let Some(&j) = self.index_of.get(&m) {
                    // Fabric traffic is not subject to the heartbeat-only cut.
                    self.enqueue(i, j, None, false);
                }
            }
        }
    }

    fn phase_step(&mut self) -> Result<(), Failure> {
        let now = self.now;
        match self.phase.clone() {
            Phase::Chaos => {
                if now >= self.next_chaos && now < self.chaos_end {
                    self.chaos_event();
                    self.next_chaos = now + self.rng.range(300, 2500);
                }
                if now >= self.chaos_end {
                    self.heal();
                    self.phase = Phase::Converge {
                        stage: Stage::Healed,
                        since: now,
                        deadline: now + self.converge_bound(),
                        changes_before: Vec::new(),
                    };
                }
            }
            Phase::Converge {
                stage,
                since,
                deadline,
                changes_before,
            } => self.converge_step(stage, since, deadline, &changes_before)?,
            Phase::Stable { stage, until } => {
                self.flaky_check()?;
                if now >= until {
                    self.after_stable(stage);
                }
            }
            Phase::Done => {}
        }
        Ok(())
    }

    fn converge_step(
        &mut self,
        stage: Stage,
        since: u64,
        deadline: u64,
        changes_before: &[u64],
    ) -> Result<(), Failure> {
        let now = self.now;
        // Victims of a departure must leave every view within the bound.
        if stage == Stage::Departed {
            let present: Vec<usize> = (0..self.nodes.len())
                .filter(|i| {
                    let n = &self.nodes[*i];
                    n.machine.is_some()
                        && n.view.as_ref().is_some_and(|(_, s)| {
                            self.victims.iter().any(|v| s.contains(&self.nodes[*v].id))
                        })
                })
                .collect();
            if present.is_empty() {
                if self.departure_ms.is_none() {
                    self.departure_ms = Some(now - since);
                    self.note(format!("departure handled after {} ms", now - since));
                }
            } else if now > since + self.departure_bound() {
                return Err(self.fail(
                    Invariant::Departure,
                    format!(
                        "{:?} crashed {} ms ago; still in views of {present:?}{}",
                        self.victims,
                        now - since,
                        self.describe_views()
                    ),
                ));
            }
        }
        // Faults from before the heal may still be in flight (a peer cut just
        // before it times out a little after it), so agreement only counts
        // once every such timeout has expired.
        let (timeout, _, _, _, interval) = self.timing();
        let settled =
            stage != Stage::Healed || now >= since + self.drift_bound(timeout + 2 * interval) + 250;
        if settled && self.converged().is_some() {
            self.convergence_ms.push(now - since);
            self.note(format!("converged after {} ms", now - since));
            if stage != Stage::Healed {
                for i in self.expected_members() {
                    if self.victims.contains(&i) {
                        continue;
                    }
                    let changes = self.changes_per_node[i] - changes_before[i];
                    if changes != 1 {
                        return Err(self.fail(
                            Invariant::OneChangePerEvent,
                            format!(
                                "#{i} changed view {changes} times after {stage:?}{}",
                                self.describe_views()
                            ),
                        ));
                    }
                }
            } else {
                self.maybe_cut_heartbeats();
            }
            self.phase = Phase::Stable {
                stage,
                until: now + self.cfg.stable_ms,
            };
        } else if now > deadline {
            return Err(self.fail(
                Invariant::Convergence,
                format!(
                    "not converged {} ms after {stage:?}{}",
                    now - since,
                    self.describe_views()
                ),
            ));
        }
        Ok(())
    }

    fn after_stable(&mut self, stage: Stage) {
        let now = self.now;
        let next = match stage {
            Stage::Healed if self.cfg.departure => Some(Stage::Departed),
            Stage::Departed => Some(Stage::Rejoined),
            _ => None,
        };
        let members = self.expected_members();
        match next {
            Some(Stage::Departed) => {
                // With a flaky node around, keep enough healthy peers for the
                // health score's outlier test (HealthConfig::min_peers + 1).
                let flaky = self.nodes.iter().any(|n| n.flaky && n.machine.is_some());
                let keep = if flaky { 3 } else { 2 };
                if members.len() <= keep {
                    self.phase = Phase::Done;
                    return;
                }
                let k = match self.cfg.departure_share {
                    Some(share) => {
                        let wanted = (members.len() as f64 * share).round() as usize;
                        wanted.clamp(1, members.len() - keep)
                    }
                    None => {
                        let max = (members.len() - keep).min(3) as u64;
                        self.rng.range(1, max) as usize
                    }
                };
                let mut pool = members;
                let mut victims = Vec::new();
                for _ in 0..k {
                    victims.push(pool.remove(self.rng.index(pool.len())));
                }
                victims.sort_unstable();
                let changes_before = self.changes_per_node.clone();
                for v in &victims {
                    self.crash(*v);
                }
                self.victims = victims;
                self.phase = Phase::Converge {
                    stage: Stage::Departed,
                    since: now,
                    deadline: now + self.departure_bound() + self.converge_bound(),
                    changes_before,
                };
            }
            Some(Stage::Rejoined) => {
                // A restarted node cannot build adjacency over a cut
                // heartbeat channel (surrogates only sustain an existing
                // adjacency), so the heartbeat-only cut ends here.
                if self.hb_cut_pair.is_some() {
                    self.net.hb_cut.clear();
                    self.note("heartbeat-only cut healed".to_string());
                }
                let changes_before = self.changes_per_node.clone();
                for v in self.victims.clone() {
                    self.boot(v);
                }
                self.phase = Phase::Converge {
                    stage: Stage::Rejoined,
                    since: now,
                    deadline: now + self.converge_bound(),
                    changes_before,
                };
            }
            _ => self.phase = Phase::Done,
        }
    }

    fn maybe_cut_heartbeats(&mut self) {
        let members = self.expected_members();
        if members.len() >= 2 && self.rng.chance(self.cfg.hb_cut_chance) {
            let a = members[self.rng.index(members.len())];
            let mut b = members[self.rng.index(members.len())];
            if a == b {
                b = members
                    [(members.iter().position(|x| *x == a).unwrap_or(0) + 1) % members.len()];
            }
            self.net.hb_cut.insert((a, b));
            self.net.hb_cut.insert((b, a));
            self.hb_cut_pair = Some((a, b));
            self.note(format!("heartbeats (only) cut between #{a} and #{b}"));
        }
    }

    fn run(&mut self) -> Result<RunReport, Failure> {
        let n = self.nodes.len();
        loop {
            self.now += self.cfg.tick_ms;
            for i in 0..n {
                if self.boot_at[i] <= self.now
                    && self.boot_at[i] + self.cfg.tick_ms > self.now
                    && self.nodes[i].machine.is_none()
                {
                    self.boot(i);
                }
            }
            self.deliver_due()?;
            self.fabric_traffic();
            for i in 0..n {
                match self.nodes[i].frozen_until {
                    Some(until) if until <= self.now => {
                        self.thaw(i)?;
                        continue;
                    }
                    Some(_) => continue,
                    None => {}
                }
                let local = self.local(i, self.now);
                let Some(machine) = self.nodes[i].machine.as_mut() else {
                    continue;
                };
                self.node_ms += self.cfg.tick_ms;
                let eff = machine.tick(local);
                self.handle(i, eff)?;
            }
            if let Some(f) = self.pending_failure.take() {
                return Err(f);
            }
            self.safety()?;
            self.phase_step()?;
            if matches!(self.phase, Phase::Done) {
                break;
            }
        }
        Ok(RunReport {
            seed: self.seed,
            nodes: n,
            flaky: self.nodes.iter().any(|x| x.flaky),
            hb_cut: self.hb_cut_pair.is_some(),
            trace_hash: self.hash,
            deliveries: self.deliveries,
            view_changes: self.view_changes,
            convergence_ms: self.convergence_ms.clone(),
            departure_ms: self.departure_ms,
            end_ms: self.now,
            departed: self.victims.len(),
            heartbeats_sent: self.heartbeats_sent,
            heartbeat_bytes: self.heartbeat_bytes,
            node_ms: self.node_ms,
        })
    }
}
