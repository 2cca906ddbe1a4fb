//! The data-mode simulator's fake world below the nodes: simulated time,
//! the fake network, the fabric calls carried over it, timers, and the
//! deterministic single-threaded executor that polls every node's async
//! work (fabric serving, proxying and replication, the migration driver).
//!
//! Owns: [`Core`] (time, packet queue, pending fabric calls, timers — shared
//! by the world and by the futures it polls, behind one mutex that is never
//! held while a future is polled), [`SimFabric`] (the
//! [`citrine_service::replication::Fabric`] of one node incarnation),
//! [`SimPause`] (the migration driver's [`Pause`]) and [`Executor`].
//!
//! Invariants:
//! - time only moves when the world advances [`Core::now`]; a fabric call
//!   whose answer has not arrived by its deadline resolves to
//!   [`FabricError::Timeout`] at exactly that simulated time;
//! - all randomness (loss, delay) comes from the core's [`SimRng`], drawn
//!   in the order packets are sent, which the executor's fixed polling
//!   order (tasks by id) makes a pure function of the seed; every packet is
//!   mixed into the trace hash;
//! - packets are never duplicated (the fabric is a TCP connection in the
//!   server: a proxied increment must not run twice); a "lost" packet is
//!   retransmitted 200–600 ms late, as TCP would, or vanishes when
//!   [`NetParams::vanish`] is set; delays reorder packets (more than TCP
//!   would: a late packet does not hold back the ones after it); a packet
//!   for a node that is down, or an answer for a call whose caller died, is
//!   dropped;
//! - a node's tasks die with it: crashing a node drops its futures, which
//!   removes their pending calls.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use citrine_service::migration::driver::{Pause, Sleep};
use citrine_service::replication::{Fabric, FabricError, FabricFuture};
use citrine_types::NodeId;
use parking_lot::Mutex;

use crate::rng::SimRng;

/// The world's shared core.
pub(crate) type Shared = Arc<Mutex<Core>>;

/// What travels on the fake network.
#[derive(Debug)]
pub(crate) enum Packet {
    /// A cluster (heartbeat / Paxos) envelope.
    Cluster {
        from: usize,
        to: usize,
        bytes: Vec<u8>,
    },
    /// A fabric call.
    Request {
        call: u64,
        from: usize,
        to: usize,
        kind: u8,
        payload: Vec<u8>,
    },
    /// The answer to a fabric call.
    Response {
        call: u64,
        to: usize,
        payload: Vec<u8>,
    },
    /// A client's request frame (proto header included).
    ClientRequest {
        client: usize,
        req: u64,
        to: usize,
        frame: Vec<u8>,
    },
    /// A node's reply frame to a client.
    ClientReply {
        client: usize,
        req: u64,
        frame: Vec<u8>,
    },
}

impl Packet {
    /// The node a packet is for (client replies go to a client).
    pub fn dest(&self) -> Option<usize> {
        match self {
            Packet::Cluster { to, .. }
            | Packet::Request { to, .. }
            | Packet::Response { to, .. }
            | Packet::ClientRequest { to, .. } => Some(*to),
            Packet::ClientReply { .. } => None,
        }
    }

    fn code(&self) -> u64 {
        match self {
            Packet::Cluster { from, to, bytes } => {
                1 ^ (*from as u64) << 8 ^ (*to as u64) << 16 ^ (bytes.len() as u64) << 24
            }
            Packet::Request {
                call,
                from,
                to,
                kind,
                payload,
            } => {
                2 ^ (*from as u64) << 8
                    ^ (*to as u64) << 16
                    ^ u64::from(*kind) << 20
                    ^ (payload.len() as u64) << 24
                    ^ call << 40
            }
            Packet::Response { call, to, payload } => {
                3 ^ (*to as u64) << 16 ^ (payload.len() as u64) << 24 ^ call << 40
            }
            Packet::ClientRequest {
                client,
                req,
                to,
                frame,
            } => {
                4 ^ (*client as u64) << 8
                    ^ (*to as u64) << 16
                    ^ (frame.len() as u64) << 24
                    ^ req << 40
            }
            Packet::ClientReply { client, req, frame } => {
                5 ^ (*client as u64) << 8 ^ (frame.len() as u64) << 24 ^ req << 40
            }
        }
    }
}

/// A pending fabric call.
struct Call {
    answer: Option<Vec<u8>>,
    waker: Option<Waker>,
}

/// Network parameters (changed by the scenario).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct NetParams {
    /// Probability that a packet is lost.
    pub loss: f64,
    /// Smallest one-way delay, ms (>= 1).
    pub base_delay: u64,
    /// Extra uniform delay, 0..=jitter ms.
    pub jitter: u64,
    /// A lost packet vanishes (true) or, as on the server's TCP
    /// connections, arrives 200–600 ms late after a retransmission (false).
    pub vanish: bool,
}

/// Time, network and timers of one run.
pub(crate) struct Core {
    /// Simulated real time, ms since the start of the run.
    pub now: u64,
    /// The same, readable by node clocks without the lock.
    pub clock: Arc<AtomicU64>,
    rng: SimRng,
    seq: u64,
    /// Packets in flight, each with the incarnation of its destination
    /// when sent: a connection does not outlive the process it led to.
    queue: BTreeMap<(u64, u64), (Packet, u64)>,
    timers: BTreeMap<(u64, u64), Waker>,
    calls: BTreeMap<u64, Call>,
    next_call: u64,
    /// Node index by id (every node that ever exists).
    pub index: BTreeMap<NodeId, usize>,
    /// Which nodes are up.
    pub up: Vec<bool>,
    /// Boots per node (its incarnation).
    pub boots: Vec<u64>,
    pub params: NetParams,
    /// Hash over every packet sent, dropped and delivered.
    pub hash: u64,
    pub sent: u64,
    pub lost: u64,
    /// A network partition (strong-consistency runs): each node's side;
    /// cluster messages and fabric calls between sides are dropped as
    /// they are sent (clients reach every side).
    pub split: Option<Vec<bool>>,
}

pub(crate) fn mix(h: u64, v: u64) -> u64 {
    let mut s = h ^ v;
    crate::rng::splitmix64(&mut s)
}

/// Whole milliseconds of `d`, rounded up.
pub(crate) fn ceil_ms(d: Duration) -> u64 {
    u64::try_from(d.as_micros().div_ceil(1000)).unwrap_or(u64::MAX)
}

impl Core {
    pub fn new(seed: u64, nodes: usize, params: NetParams) -> Core {
        Core {
            now: 0,
            clock: Arc::new(AtomicU64::new(0)),
            rng: SimRng::new(seed ^ 0x0DA7_A0DA_7A00_0001),
            seq: 0,
            queue: BTreeMap::new(),
            timers: BTreeMap::new(),
            calls: BTreeMap::new(),
            next_call: 1,
            index: BTreeMap::new(),
            up: vec![false; nodes],
            boots: vec![0; nodes],
            params,
            hash: seed,
            sent: 0,
            lost: 0,
            split: None,
        }
    }

    /// Moves time to `t`.
    pub fn set_now(&mut self, t: u64) {
        self.now = t;
        self.clock.store(t, Ordering::Relaxed);
    }

    /// Queues `packet` with a random delay, unless it is lost.
    pub fn send(&mut self, packet: Packet) {
        self.sent += 1;
        let code = packet.code();
        if self.crosses_split(&packet) {
            self.lost += 1;
            self.hash = mix(self.hash, code ^ 0x5B11);
            return;
        }
        let mut delay = self.params.base_delay.max(1) + self.rng.below(self.params.jitter + 1);
        if self.rng.chance(self.params.loss) {
            self.lost += 1;
            if self.params.vanish {
                self.hash = mix(self.hash, code ^ 0x1055);
                return;
            }
            // A TCP connection retransmits: the packet comes late.
            delay += self.rng.range(200, 600);
        }
        let due = self.now + delay;
        self.seq += 1;
        self.hash = mix(self.hash, code ^ due.rotate_left(32));
        let boot = packet.dest().map_or(0, |to| self.boots[to]);
        self.queue.insert((due, self.seq), (packet, boot));
    }

    /// Whether `packet` goes between the two sides of the network
    /// partition in force. Answers to calls are not cut: they may come
    /// late, as any message may.
    fn crosses_split(&self, packet: &Packet) -> bool {
        let Some(side) = &self.split else {
            return false;
        };
        let (from, to) = match packet {
            Packet::Cluster { from, to, .. } | Packet::Request { from, to, .. } => (*from, *to),
            _ => return false,
        };
        side.get(from) != side.get(to)
    }

    /// The next packet due at or before now: `Some(None)` for one dropped
    /// because its destination crashed (or restarted) since it was sent.
    pub fn pop_due(&mut self) -> Option<Option<Packet>> {
        let entry = self.queue.first_entry()?;
        if entry.key().0 > self.now {
            return None;
        }
        let (packet, boot) = entry.remove();
        let alive = packet
            .dest()
            .is_none_or(|to| self.up[to] && self.boots[to] == boot);
        Some(alive.then_some(packet))
    }

    /// Wakers of timers due at or before now.
    pub fn due_timers(&mut self) -> Vec<Waker> {
        let mut out = Vec::new();
        while let Some(entry) = self.timers.first_entry() {
            if entry.key().0 > self.now {
                break;
            }
            out.push(entry.remove());
        }
        out
    }

    /// Hands an answer to its call (dropped when the caller is gone).
    pub fn answer(&mut self, call: u64, payload: Vec<u8>) {
        if let Some(slot) = self.calls.get_mut(&call) {
            slot.answer = Some(payload);
            if let Some(waker) = slot.waker.take() {
                waker.wake();
            }
        }
    }

    fn timer(&mut self, at: u64, waker: &Waker) {
        self.seq += 1;
        self.timers.insert((at, self.seq), waker.clone());
    }

    /// Packets in flight.
    pub fn in_flight(&self) -> usize {
        self.queue.len()
    }
}

/// A future that completes at simulated time `at`.
pub(crate) struct Timer {
    core: Shared,
    at: u64,
}

impl Timer {
    pub fn at(core: Shared, at: u64) -> Timer {
        Timer { core, at }
    }
}

impl Future for Timer {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut core = self.core.lock();
        if core.now >= self.at {
            return Poll::Ready(());
        }
        core.timer(self.at, cx.waker());
        Poll::Pending
    }
}

/// The migration driver's sleeps, on simulated time.
pub(crate) struct SimPause {
    pub core: Shared,
}

impl Pause for SimPause {
    fn sleep(&self, duration: Duration) -> Sleep {
        let at = self.core.lock().now + ceil_ms(duration);
        Box::pin(Timer::at(self.core.clone(), at))
    }
}

/// The fabric of one node: calls travel as [`Packet::Request`]s.
pub(crate) struct SimFabric {
    pub core: Shared,
    pub node: usize,
}

struct CallFuture {
    core: Shared,
    id: u64,
    deadline: u64,
}

impl Future for CallFuture {
    type Output = Result<Vec<u8>, FabricError>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let id = self.id;
        let deadline = self.deadline;
        let mut core = self.core.lock();
        let answered = core
            .calls
            .get_mut(&id)
            .is_some_and(|slot| slot.answer.is_some());
        if answered {
            let answer = core.calls.remove(&id).and_then(|slot| slot.answer);
            return Poll::Ready(answer.ok_or(FabricError::Timeout));
        }
        if core.now >= deadline {
            core.calls.remove(&id);
            return Poll::Ready(Err(FabricError::Timeout));
        }
        if let Some(slot) = core.calls.get_mut(&id) {
            slot.waker = Some(cx.waker().clone());
        }
        core.timer(deadline, cx.waker());
        Poll::Pending
    }
}

impl Drop for CallFuture {
    fn drop(&mut self) {
        self.core.lock().calls.remove(&self.id);
    }
}

impl Fabric for SimFabric {
    fn call(&self, to: NodeId, kind: u8, payload: Vec<u8>, timeout: Duration) -> FabricFuture {
        let mut core = self.core.lock();
        let Some(&to) = core.index.get(&to) else {
            return Box::pin(std::future::ready(Err(FabricError::Unreachable)));
        };
        let id = core.next_call;
        core.next_call += 1;
        let deadline = core.now + ceil_ms(timeout);
        core.calls.insert(
            id,
            Call {
                answer: None,
                waker: None,
            },
        );
        core.send(Packet::Request {
            call: id,
            from: self.node,
            to,
            kind,
            payload,
        });
        drop(core);
        Box::pin(CallFuture {
            core: self.core.clone(),
            id,
            deadline,
        })
    }
}

struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::Relaxed);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::Relaxed);
    }
}

struct Task {
    /// The node whose incarnation owns the task.
    node: usize,
    future: Pin<Box<dyn Future<Output = ()>>>,
    flag: Arc<Flag>,
    waker: Waker,
}

/// Polls tasks in id order, only those woken since their last poll.
#[derive(Default)]
pub(crate) struct Executor {
    tasks: BTreeMap<u64, Task>,
    next: u64,
    /// Nodes frozen: their woken tasks wait until they thaw.
    frozen: BTreeSet<usize>,
    /// Polls so far.
    pub polls: u64,
}

/// The executor spun without reaching rest.
#[derive(Debug)]
pub(crate) struct Livelock;

impl Executor {
    /// Adds a task owned by `node`; it is polled at the next
    /// [`Executor::run`].
    pub fn spawn(&mut self, node: usize, future: impl Future<Output = ()> + 'static) {
        let flag = Arc::new(Flag(AtomicBool::new(true)));
        let waker = Waker::from(flag.clone());
        self.next += 1;
        self.tasks.insert(
            self.next,
            Task {
                node,
                future: Box::pin(future),
                flag,
                waker,
            },
        );
    }

    /// Drops every task of `node` (it crashed).
    pub fn kill(&mut self, node: usize) {
        self.tasks.retain(|_, task| task.node != node);
        self.frozen.remove(&node);
    }

    /// Stops (or resumes) polling the tasks of `node`.
    pub fn set_frozen(&mut self, node: usize, frozen: bool) {
        if frozen {
            self.frozen.insert(node);
        } else {
            self.frozen.remove(&node);
        }
    }

    /// Tasks alive.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Polls woken tasks until none is woken; `Err` after `budget` rounds.
    pub fn run(&mut self, budget: u32) -> Result<(), Livelock> {
        for _ in 0..budget {
            let ready: Vec<u64> = self
                .tasks
                .iter()
                .filter(|(_, task)| {
                    task.flag.0.load(Ordering::Relaxed) && !self.frozen.contains(&task.node)
                })
                .map(|(id, _)| *id)
                .collect();
            if ready.is_empty() {
                return Ok(());
            }
            for id in ready {
                let Some(task) = self.tasks.get_mut(&id) else {
                    continue;
                };
                task.flag.0.store(false, Ordering::Relaxed);
                let waker = task.waker.clone();
                let mut cx = Context::from_waker(&waker);
                self.polls += 1;
                if task.future.as_mut().poll(&mut cx).is_ready() {
                    self.tasks.remove(&id);
                }
            }
        }
        Err(Livelock)
    }
}
