//! Data mode: N real [`citrine_service::Service`]s on the fake network, with
//! clients writing and reading while nodes join, crash and come back (empty,
//! or with what their simulated disks kept), and the checks that nothing
//! acknowledged is lost.
//!
//! Owns: the data-mode scenario ([`run_data_seed`], [`DataConfig`]), the
//! simulated clients and their history, and the data invariants checked
//! after quiescence. The fake world below (time, network, fabric,
//! executor) is [`net`].
//!
//! A node is a [`ClusterNode`] (heartbeats and Paxos over the fake network,
//! exactly as in [`crate::sim`]) plus a `Service` (in-memory namespace
//! `test`, replication factor 2) whose clock reads the node's simulated
//! time, whose fabric is [`net::SimFabric`] and whose migration driver
//! (`citrine_service::migration::driver::run`) is a task on the executor.
//! Views come from the state machines: when a node's `ClusterNode` reports
//! `ViewChanged` (or `Orphaned`), the node publishes a `ClusterState` of
//! that view to its service, as `citrine-server`'s cluster runtime does.
//!
//! Script of a run (all choices from the seed):
//! 1. 3 or 4 nodes boot within 300 ms (one or two more stay spare); the
//!    run waits until they agree on one view and are migration-stable;
//! 2. clients start: each keeps one request outstanding — increments of
//!    shared counters, puts of unique values to keys it owns, reads —
//!    and, with [`DataConfig::deletes`], deletes (durable or not) of those
//!    keys, so a key goes through several lives —
//!    sent to the master in some node's current map (or, sometimes, to a
//!    random node, which proxies), retried on 9, 11 and timeouts;
//!    With [`DataConfig::truncate`], some puts go to keys of set `trunc`;
//! 3. 3–5 membership events 1.5–4 s apart: a spare node joins, a node
//!    crashes (only when the cluster is stable: with replication factor 2
//!    one node may be lost at a time), a node freezes for 0.5–4 s (also
//!    only when stable: its state machine, tasks and flusher stop and what
//!    reaches it is held; when it thaws, its tick or the held packets go
//!    first, drawn, and the held client requests reach its service as
//!    having waited since the freeze began, as a stalled service thread
//!    reports them), a crashed node restarts — empty, or
//!    with [`DataConfig::device`] with what its disk kept; with
//!    [`DataConfig::device_faults`], once, a node's disk starts failing
//!    its syncs (also only when stable): the node refuses writes from its
//!    next flush on and is crashed 0.2–2 s later; the
//!    network loses up to `max_loss` of packets and delays them 1–6 ms, but
//!    is never partitioned. With [`DataConfig::truncate`], a client
//!    truncates set `trunc` through one node shortly before or after one
//!    of the events (its threshold 2 × `max_skew_ms` behind that node's
//!    clock);
//! 4. clients stop; the run waits for quiescence (one view of every live
//!    node, every node `cluster-stable`, for `settle_ms`);
//! 5. the checks ([`Invariant`] data variants: every record on exactly its
//!    replicas, their copies equal byte for byte, counters between their
//!    acknowledged and acknowledged + in-doubt increments, acknowledged
//!    increments having returned distinct values, a put key holding its
//!    last acknowledged value or a later attempt's; for the truncation: every
//!    node knows it, no node holds a record it covers, no put acknowledged
//!    before it by every clock is read back, and the last put acknowledged
//!    after it is).
//!
//! With [`DataConfig::sc`] the namespace is strong-consistency and the
//! events, the end of the run and the checks are those of [`sc`].
//!
//! Invariants of the simulator itself: as for [`crate::sim`] — one seed,
//! `BTreeMap`s and `Vec`s only, a fixed polling order — so a run is a pure
//! function of `(seed, DataConfig)`, and the trace hash (packets, views,
//! client outcomes, final copies) proves it.

pub(crate) mod net;
mod sc;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use citrine_cluster::{
    ClusterConfig, ClusterNode, Effect, Envelope, Message as ClusterMessage, PeerAddr,
};
use citrine_service::cluster_state::{ClusterMember, ClusterState};
use citrine_service::config::{NamespaceConfig, ServiceConfig, StorageEngineConfig};
use citrine_service::replication::ReplicaWrite;
use citrine_service::{Clock, Service};
use citrine_storage::device::io::{Fault, IoOp, PowerCut, SimDisk, Trigger};
use citrine_types::{Digest, NodeId, PartitionId};
use citrine_wire::digest::{of_key, UserKey};
use citrine_wire::frame::{ProtoHeader, PROTO_HEADER_SIZE};
use citrine_wire::msg::{field_type, info1, info2, op_type, Message, MessageWriter, MsgHeader};
use parking_lot::Mutex;

use crate::rng::SimRng;
use crate::sim::{Failure, Invariant};
use net::{mix, Core, Executor, NetParams, Packet, Shared, SimFabric, SimPause};

/// Unix time of simulated time 0 on every node (before its skew).
const BASE_UNIX_MS: u64 = 1_700_000_000_000;
const NAMESPACE: &str = "test";
const SET: &str = "sim";
/// The set one truncation covers (see [`DataConfig::truncate`]).
const TRUNCATED_SET: &str = "trunc";
/// Keys of [`TRUNCATED_SET`] per client.
const TRUNCATED_KEYS_PER_CLIENT: usize = 2;
const TICK_MS: u64 = 10;
const RECENT: usize = 400;
/// Executor rounds allowed per simulated millisecond.
const POLL_BUDGET: u32 = 10_000;
/// Flush periods a device run draws from (ms); the server's default is
/// 1000.
const FLUSH_PERIODS_MS: [u64; 4] = [5, 50, 250, 1_000];
/// How often the simulated flusher collects tombstones, as the server's.
const TOMBSTONE_COLLECT_MS: u64 = 5_000;
/// Size of each node's (simulated) device, and its write-block size: small
/// blocks so that a run fills, seals and defragments several.
const DEVICE_FILE_BYTES: u64 = 8 << 20;
const DEVICE_WBLOCK_BYTES: u32 = 64 << 10;

/// Shape of data-mode runs.
#[derive(Clone, Debug, PartialEq)]
pub struct DataConfig {
    /// Nodes booted at the start (3 or 4 drawn between these).
    pub min_initial: usize,
    pub max_initial: usize,
    /// Nodes that may join later.
    pub spares: usize,
    /// Simulated clients.
    pub clients: usize,
    /// Shared counters (incremented by every client).
    pub counters: usize,
    /// Put keys per client.
    pub puts_per_client: usize,
    /// Membership events (drawn between these).
    pub min_events: usize,
    pub max_events: usize,
    /// Largest packet-loss probability.
    pub max_loss: f64,
    /// Largest clock skew between nodes, ms.
    pub max_skew_ms: u64,
    /// Client transaction deadline (sent as the transaction ttl), ms.
    pub client_timeout_ms: u64,
    /// How long the cluster must stay stable before the checks, ms.
    pub settle_ms: u64,
    /// Bound on reaching quiescence after the clients stop, ms.
    pub quiesce_bound_ms: u64,
    /// Restart a crashed node as soon as it is picked, even before the
    /// survivors noticed the crash (off: a node restarts only once it is in
    /// no live node's view, as after an ordinary restart).
    pub restart_before_noticed: bool,
    /// Lost messages vanish instead of arriving late (the server's cluster
    /// and fabric links are TCP connections, which retransmit: off by
    /// default).
    pub messages_vanish: bool,
    /// Clients also put to keys of set `trunc`, and one of them truncates
    /// that set at one node before a membership event (the other nodes
    /// learn it from its push or in that event's exchange).
    pub truncate: bool,
    /// Some ops on a client's put keys are deletes, durable or not (a put
    /// after a non-durable delete starts the record's next life at
    /// generation 1): the final state of a key must be the effect of its
    /// last acknowledged attempt or of a later one in doubt, a delete's
    /// effect being absence.
    pub deletes: bool,
    /// Nodes keep namespace `test` on a device (the log-structured engine
    /// over a simulated disk, `citrine_storage::device::io::SimDisk`)
    /// instead of in memory. The simulation is the flusher: every node's
    /// write buffers are written out and synced every flush period (drawn
    /// per run, 5 ms to 1 s), with a defrag step each time and a tombstone
    /// collection every 5 s. A crash cuts the disk's power: what was not
    /// synced is lost — or, half the crashes (drawn), every sector the
    /// unsynced writes touched keeps a drawn one of its versions (torn and
    /// reordered writes); a crashed node restarts with what its disk kept
    /// (a cold start), or, one time in four, on a blank disk (a replaced
    /// drive). Each node also has a work directory, where it keeps its
    /// truncations and regime as the server does.
    pub device: bool,
    /// With [`DataConfig::device`]: one of the events (at most one per
    /// run) is a node's disk failing every sync from then on. The node's
    /// engine enters its failed state at its next flush and refuses writes
    /// (result code 1, which clients see as refused); 0.2–2 s later the
    /// node is crashed, and it may restart with what its disk kept.
    pub device_faults: bool,
    /// The membership events are scripted instead of drawn: adds while a
    /// spare never ran, then crashes of drawn live nodes (with one spare
    /// and `min_events = max_events = 2`: a join, then a leave).
    pub join_then_leave: bool,
    /// Strong consistency ([`sc`]): namespace `test` is an SC namespace
    /// with `strong-consistency-serve-data`, its roster the initial nodes;
    /// the events also crash nodes without waiting for the copies (any
    /// number, all at once sometimes) and partition the network; reads are
    /// linearizable and checked as such; at the end every node restarts
    /// and every key is read back through the clients' path.
    pub sc: bool,
    /// With [`DataConfig::sc`]: an event may step a live node's wall clock
    /// (the one its service reads, not its state machine's monotonic one)
    /// to 1–60 s ahead or behind true time, or back to it.
    pub clock_jumps: bool,
}

impl DataConfig {
    /// Runs fast enough for a debug-build seed sweep.
    pub fn quick() -> DataConfig {
        DataConfig {
            min_initial: 3,
            max_initial: 4,
            spares: 1,
            clients: 4,
            counters: 12,
            puts_per_client: 16,
            min_events: 3,
            max_events: 5,
            max_loss: 0.02,
            max_skew_ms: 3,
            client_timeout_ms: 1_000,
            settle_ms: 5_000,
            quiesce_bound_ms: 60_000,
            restart_before_noticed: false,
            messages_vanish: false,
            truncate: true,
            deletes: true,
            device: false,
            device_faults: false,
            join_then_leave: false,
            sc: false,
            clock_jumps: false,
        }
    }

    /// Strong-consistency runs ([`DataConfig::sc`]) on simulated disks
    /// (`commit-to-device` drawn per run): no truncation (the SC path
    /// does not take it yet), durable deletes only (as the reference
    /// without `strong-consistency-allow-expunge`).
    pub fn sc() -> DataConfig {
        DataConfig {
            sc: true,
            clock_jumps: true,
            device: true,
            truncate: false,
            min_events: 4,
            max_events: 8,
            ..DataConfig::quick()
        }
    }

    /// A shorter SC run ([`DataConfig::sc`] with two events, two clients
    /// and a short settle): the CI test's seeds and `soak --sc --short`.
    pub fn sc_short() -> DataConfig {
        DataConfig {
            min_events: 2,
            max_events: 2,
            clients: 2,
            settle_ms: 1_000,
            ..DataConfig::sc()
        }
    }

    /// A 20-node cluster (issue 45) with clients writing, taken through
    /// one join and one leave.
    pub fn twenty_nodes() -> DataConfig {
        DataConfig {
            min_initial: 20,
            max_initial: 20,
            spares: 1,
            min_events: 2,
            max_events: 2,
            join_then_leave: true,
            ..DataConfig::quick()
        }
    }
}

/// Summary of a successful data-mode run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataReport {
    pub seed: u64,
    /// Nodes that ever ran.
    pub nodes: usize,
    /// The membership events, in order.
    pub events: Vec<String>,
    pub trace_hash: u64,
    /// Client operations acknowledged (writes and reads).
    pub acked: u64,
    /// Of those, deletes (of a record or of none).
    pub deletes_acked: u64,
    /// Write attempts that ended in doubt (timeout, 9).
    pub in_doubt: u64,
    /// Attempts refused before execution (11, or 1 from a node whose
    /// device failed).
    pub refused: u64,
    /// Of those, refused with 1 by a failed device
    /// ([`DataConfig::device_faults`]).
    pub device_refused: u64,
    /// Records present at the end.
    pub records: usize,
    /// View changes reported by all nodes.
    pub view_changes: u64,
    /// Packets sent / lost.
    pub packets: u64,
    pub lost: u64,
    /// Simulated time at the end, ms.
    pub end_ms: u64,
    /// Strong consistency: reads checked against what was acknowledged
    /// before they were sent (during the run and at the end).
    pub reads_checked: u64,
    /// Strong consistency: keys still unavailable (11) when read back at
    /// the end (their partitions dead).
    pub unavailable_at_end: usize,
    /// Strong consistency: the run's namespace had `commit-to-device`.
    pub commit_to_device: bool,
}

/// What a fabric call does to `partition`, for the trace; `None` when it
/// concerns another partition (or is of another kind).
fn describe_call(kind: u8, payload: &[u8], partition: u16) -> Option<String> {
    use citrine_service::migration::{decode_drop, MigrateBatch};
    use citrine_service::replication::{call_kind, split_replica_payload};
    match kind {
        call_kind::MIGRATE => {
            let batch = MigrateBatch::decode(payload)?;
            (batch.partition == partition).then(|| {
                let records: Vec<String> = batch
                    .records
                    .iter()
                    .filter_map(|bytes| ReplicaWrite::decode(bytes))
                    .map(|write| format!("{:02x?} gen {}", &write.digest.0[..4], write.generation))
                    .collect();
                format!(
                    "MIGRATE key {:016x} source {} flags {} records {} {records:?}",
                    batch.cluster_key,
                    batch.source,
                    batch.flags,
                    batch.records.len()
                )
            })
        }
        call_kind::DROP => {
            let (key, _, dropped, source) = decode_drop(payload)?;
            (dropped == partition).then(|| format!("DROP key {key:016x} source {source}"))
        }
        call_kind::PROXY => {
            use citrine_wire::msg::{field_type, FieldIter, MsgHeader};
            // u8 hops | u64 deadline | AS_MSG body.
            let body = payload.get(9..)?;
            let header = MsgHeader::decode(body).ok()?;
            let digest = FieldIter::unchecked(body)
                .take(usize::from(header.n_fields))
                .find(|field| field.field_type == field_type::DIGEST)?;
            let digest = Digest(digest.data.try_into().ok()?);
            (digest.partition().index() as u16 == partition)
                .then(|| format!("PROXY {:02x?} hops {}", &digest.0[..4], payload[0]))
        }
        call_kind::REPLICA_WRITE | call_kind::SC_REPLICA_WRITE => {
            let (regime, payload) = match kind {
                call_kind::SC_REPLICA_WRITE => {
                    let (regime, _, rest) =
                        citrine_distribution::sc::data_path::split_sc_payload(payload)?;
                    (format!("SC regime {regime} "), rest)
                }
                _ => (String::new(), payload),
            };
            let (key, _, write) = split_replica_payload(payload)?;
            let write = ReplicaWrite::decode(write)?;
            (write.digest.partition().index() as u16 == partition).then(|| {
                format!(
                    "{regime}REPLICA_WRITE key {key:016x} {:02x?} gen {} lut {} {}",
                    &write.digest.0[..4],
                    write.generation,
                    write.last_update_ms,
                    match &write.body {
                        Some(body) =>
                            format!("store {:02x?}", &body[body.len().saturating_sub(8)..]),
                        None => "delete".into(),
                    }
                )
            })
        }
        _ => None,
    }
}

/// The partition of a single-record request's `body` (AS_MSG), if it
/// names a digest.
fn request_partition(body: &[u8]) -> Option<u16> {
    use citrine_wire::msg::FieldIter;
    let header = MsgHeader::decode(body).ok()?;
    let digest = FieldIter::unchecked(body)
        .take(usize::from(header.n_fields))
        .find(|field| field.field_type == field_type::DIGEST)?;
    let digest = Digest(digest.data.try_into().ok()?);
    Some(digest.partition().index() as u16)
}

/// Runs one data-mode seed.
pub fn run_data_seed(seed: u64, cfg: &DataConfig) -> Result<DataReport, Box<Failure>> {
    let mut world = World::new(seed, cfg.clone());
    world.run().map_err(Box::new)
}

/// A node's service clock: its simulated time plus its skew, stepped by
/// its jump ([`DataConfig::clock_jumps`]).
struct NodeClock {
    time: Arc<AtomicU64>,
    skew_ms: u64,
    jump_ms: Arc<AtomicI64>,
}

impl Clock for NodeClock {
    fn now_unix_ms(&self) -> u64 {
        let now = BASE_UNIX_MS + self.skew_ms + self.time.load(Ordering::Relaxed);
        now.saturating_add_signed(self.jump_ms.load(Ordering::Relaxed))
    }
}

/// A directory of its own for one run's work directories, removed when the
/// run ends. On tmpfs (`/dev/shm`) where there is one.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(seed: u64) -> std::io::Result<Scratch> {
        static RUNS: AtomicU64 = AtomicU64::new(0);
        let shm = std::path::Path::new("/dev/shm");
        let base = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let run = RUNS.fetch_add(1, Ordering::Relaxed);
        let dir = base.join(format!("citrine-sim-{}-{seed}-{run}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(Scratch(dir))
    }

    /// Empties node `node`'s work directory.
    fn wipe(&self, node: usize) {
        let _ = std::fs::remove_dir_all(self.0.join(format!("node-{node}")));
    }

    /// Node `node`'s work directory (created).
    fn work(&self, node: usize) -> std::io::Result<std::path::PathBuf> {
        let dir = self.0.join(format!("node-{node}"));
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Up {
    service: Arc<Service>,
    machine: ClusterNode,
    view: Option<(u64, Vec<NodeId>)>,
    published: Option<Vec<NodeId>>,
    partition_generation: u64,
    peers_generation: u64,
    stopping: Arc<AtomicBool>,
    /// Frozen until this simulated time (a stalled process): not ticked,
    /// its tasks and flusher not run, and what reaches it held.
    frozen_until: Option<u64>,
    /// When its current freeze began.
    frozen_at: u64,
    /// Packets that reached it while frozen, in arrival order.
    held: Vec<Packet>,
}

struct DNode {
    id: NodeId,
    cfg: ClusterConfig,
    skew_ms: u64,
    /// How far its wall clock was stepped from true time (the machine's:
    /// kept across restarts).
    jump_ms: Arc<AtomicI64>,
    up: Option<Up>,
    boots: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Pending,
    Acked,
    /// Timed out or 9: may or may not have been applied.
    InDoubt,
    /// Refused before execution (11).
    Failed,
}

#[derive(Clone, Copy, Debug)]
enum OpKind {
    Incr {
        counter: usize,
    },
    Put {
        key: usize,
        value: i64,
        attempt: usize,
    },
    /// A delete of a put key (`durable`: info2 DURABLE_DELETE).
    Delete {
        key: usize,
        attempt: usize,
        durable: bool,
    },
    /// A read of a counter; `floor`: increments acknowledged before it
    /// was sent (strong consistency: it sees at least those).
    Read {
        counter: usize,
        floor: u64,
    },
    /// A read of a put key (strong consistency); `floor`: its last
    /// attempt acknowledged before the read was sent.
    ReadPut {
        key: usize,
        floor: Option<usize>,
    },
    /// A put to a key of [`TRUNCATED_SET`].
    TruncatedPut {
        key: usize,
        value: i64,
        attempt: usize,
    },
}

impl OpKind {
    fn is_read(&self) -> bool {
        matches!(self, OpKind::Read { .. } | OpKind::ReadPut { .. })
    }
}

#[derive(Clone, Debug)]
struct InFlight {
    kind: OpKind,
    req: u64,
    sent_at: u64,
    tries: u32,
    /// The node it was sent to.
    to: Option<usize>,
}

#[derive(Clone, Debug)]
enum ClientState {
    Idle { next_at: u64 },
    Waiting(InFlight),
    Stopped,
}

#[derive(Default, Clone, Debug)]
struct CounterHistory {
    acked: u64,
    in_doubt: u64,
    /// Attempts sent so far (bounds what a read may see).
    attempts: u64,
    /// The new values acknowledged increments returned: each at most once
    /// (two acknowledged increments that saw the same result mean one was
    /// applied to a copy without the other).
    returned: BTreeSet<i64>,
}

/// An attempt on a put key: a put of `value`, or a delete (`None`).
#[derive(Clone, Debug)]
struct PutAttempt {
    value: Option<i64>,
    outcome: Outcome,
}

/// A put to a key of [`TRUNCATED_SET`], with when it was sent and when
/// its outcome was known (simulated ms).
#[derive(Clone, Debug)]
struct TruncatedPut {
    value: i64,
    outcome: Outcome,
    sent_at: u64,
    done_at: u64,
}

/// The truncation a client issued.
#[derive(Clone, Copy, Debug)]
struct Truncation {
    /// Its threshold (Unix ms on every node's clock).
    lut_ms: u64,
    /// Simulated time it was issued (and answered: info runs inline).
    at: u64,
    /// A put acknowledged at or before this simulated time was executed
    /// before the threshold by every node's clock.
    covers_acked_until: u64,
}

const MAX_TRIES: u32 = 6;

struct World {
    seed: u64,
    cfg: DataConfig,
    rng: SimRng,
    core: Shared,
    exec: Executor,
    nodes: Vec<DNode>,
    addr_index: BTreeMap<PeerAddr, usize>,
    clients: Vec<ClientState>,
    /// The nodes the clients know (tended like a smart client's node list).
    known: BTreeSet<usize>,
    next_tend: u64,
    /// Clients finish their attempt in flight and send no more.
    stopping: bool,
    /// Notes every attempt on this counter (`CITRINE_SIM_TRACE_COUNTER`).
    trace_counter: Option<usize>,
    /// Notes every attempt on this put key (`CITRINE_SIM_TRACE_PUT`).
    trace_put: Option<usize>,
    /// Notes every migration batch, drop and replica write of this
    /// partition that reaches a node (`CITRINE_SIM_TRACE_PARTITION`).
    trace_partition: Option<u16>,
    /// The traced fabric calls in flight, by call id: what their answer
    /// is noted as.
    traced_calls: BTreeMap<u64, String>,
    /// While a thawed node's held packets are delivered: when its freeze
    /// began (what its service is told a held client request may have
    /// waited since).
    held_since: Option<u64>,
    /// Notes every cluster message but heartbeats, as it is sent
    /// (`CITRINE_SIM_TRACE_CLUSTER=1`).
    trace_cluster: bool,
    next_req: u64,
    counters: Vec<CounterHistory>,
    puts: Vec<Vec<PutAttempt>>,
    truncated_puts: Vec<Vec<TruncatedPut>>,
    truncation: Option<Truncation>,
    acked: u64,
    deletes_acked: u64,
    in_doubt: u64,
    refused: u64,
    view_changes: u64,
    events: Vec<String>,
    recent: VecDeque<String>,
    hash: u64,
    /// The work directories' directory ([`DataConfig::device`]).
    scratch: Option<Scratch>,
    /// Each node's disk ([`DataConfig::device`]); `None` until first used,
    /// and after a drive is replaced.
    disks: Vec<Option<SimDisk>>,
    /// When a disk began failing its syncs ([`DataConfig::device_faults`]);
    /// from then on a reply 1 is a refusal of that node's failed engine.
    device_fault_at: Option<u64>,
    device_refused: u64,
    /// The simulated flusher's period ([`DataConfig::device`]).
    flush_ms: u64,
    /// Strong consistency on a device: `commit-to-device` (drawn).
    commit_to_device: bool,
    /// Strong consistency: the network partition in force ends then.
    split_until: Option<u64>,
    /// Strong consistency: a node restarted on a blank device since every
    /// partition was last available with its copies in place. A second
    /// one then restarts on its device: two replicas' drives lost together
    /// lose what only they held, beyond what replication factor 2
    /// protects (seen: full seed 20 read a counter back one acknowledged
    /// increment short after three of four drives and work directories
    /// were lost in one crash of every node).
    rebuilt_unsettled: bool,
    /// Strong consistency: the reply to the final reader's request.
    final_reply: Option<(u64, Vec<u8>)>,
    reads_checked: u64,
    unavailable_at_end: usize,
}

fn counter_key(i: usize) -> String {
    format!("counter-{i}")
}

fn put_key(i: usize) -> String {
    format!("put-{i}")
}

fn truncated_key(i: usize) -> String {
    format!("trunc-{i}")
}

fn digest_in(set: &str, key: &str) -> Digest {
    of_key(set, &UserKey::String(key.to_owned()))
}

/// A single-record request frame for `key` of `set`.
fn request_frame_in(
    set: &str,
    key: &str,
    header: MsgHeader,
    op: Option<(u8, &str, i64)>,
) -> Vec<u8> {
    let digest = digest_in(set, key);
    let mut out = Vec::new();
    let mut writer = MessageWriter::begin(&mut out, &header);
    writer
        .field(field_type::NAMESPACE, NAMESPACE.as_bytes())
        .field(field_type::SET, set.as_bytes())
        .field(field_type::DIGEST, &digest.0);
    if let Some((op, bin, value)) = op {
        writer.op(op, 1, bin.as_bytes(), &value.to_be_bytes());
        if op == op_type::INCR {
            // Read the new value back in the same request.
            writer.op(op_type::READ, 0, bin.as_bytes(), &[]);
        }
    }
    writer.finish();
    out
}

/// (result code, integer value of the first bin) of a reply frame.
fn parse_reply(frame: &[u8]) -> Option<(u8, Option<i64>)> {
    let header: &[u8; PROTO_HEADER_SIZE] = frame.get(..PROTO_HEADER_SIZE)?.try_into().ok()?;
    ProtoHeader::decode(header).ok()?;
    let message = Message::decode(frame.get(PROTO_HEADER_SIZE..)?).ok()?;
    let value = message
        .ops()
        .next()
        .and_then(|op| <[u8; 8]>::try_from(op.value).ok())
        .map(i64::from_be_bytes);
    Some((message.header.result_code, value))
}

/// `n` distinct node ids, of scattered magnitudes, in a random order.
fn node_ids(rng: &mut SimRng, n: usize) -> Vec<u64> {
    let mut ids = BTreeSet::new();
    while ids.len() < n {
        ids.insert(rng.next_u64() >> rng.below(40) | 1);
    }
    let mut ids: Vec<u64> = ids.into_iter().collect();
    for i in (1..ids.len()).rev() {
        let j = rng.index(i + 1);
        ids.swap(i, j);
    }
    ids
}

/// The partition whose fabric calls are traced: `CITRINE_SIM_TRACE_PARTITION`,
/// else that of the traced put key (`CITRINE_SIM_TRACE_PUT`).
fn traced_partition() -> Option<u16> {
    std::env::var("CITRINE_SIM_TRACE_PARTITION")
        .ok()
        .and_then(|v| v.parse().ok())
        .or_else(|| {
            // A traced put key's partition is traced too.
            let key: usize = std::env::var("CITRINE_SIM_TRACE_PUT").ok()?.parse().ok()?;
            Some(digest_in(SET, &put_key(key)).partition().index() as u16)
        })
}

impl World {
    fn new(seed: u64, cfg: DataConfig) -> World {
        assert!(cfg.min_initial >= 3 && cfg.min_initial <= cfg.max_initial);
        let mut rng = SimRng::new(seed);
        let initial = rng.range(cfg.min_initial as u64, cfg.max_initial as u64) as usize;
        let n = initial + cfg.spares;
        let ids = node_ids(&mut rng, n);
        let addrs: Vec<PeerAddr> = (0..n)
            .filter_map(|i| PeerAddr::new(format!("10.0.1.{i}:3002")))
            .collect();
        assert_eq!(addrs.len(), n);
        // Every initial node is a mesh seed, so a joiner finds a live one.
        let seeds: Vec<PeerAddr> = addrs.iter().take(initial).cloned().collect();
        let params = NetParams {
            loss: rng.unit() * cfg.max_loss,
            base_delay: 1,
            jitter: rng.range(0, 5),
            vanish: cfg.messages_vanish,
        };
        let mut core = Core::new(seed, n, params);
        let mut nodes = Vec::with_capacity(n);
        let mut addr_index = BTreeMap::new();
        for i in 0..n {
            let id = NodeId(ids[i]);
            core.index.insert(id, i);
            addr_index.insert(addrs[i].clone(), i);
            nodes.push(DNode {
                id,
                cfg: ClusterConfig::new(id, addrs[i].clone(), seeds.clone()),
                skew_ms: rng.range(0, cfg.max_skew_ms),
                jump_ms: Arc::new(AtomicI64::new(0)),
                up: None,
                boots: 0,
            });
        }
        let clients = vec![ClientState::Stopped; cfg.clients];
        let counters = vec![CounterHistory::default(); cfg.counters];
        let puts = vec![Vec::new(); cfg.clients * cfg.puts_per_client];
        let truncated_puts = vec![Vec::new(); cfg.clients * TRUNCATED_KEYS_PER_CLIENT];
        let flush_ms = if cfg.device {
            FLUSH_PERIODS_MS[rng.index(FLUSH_PERIODS_MS.len())]
        } else {
            0
        };
        let commit_to_device = cfg.sc && cfg.device && rng.chance(0.5);
        World {
            seed,
            cfg,
            rng,
            core: Arc::new(Mutex::new(core)),
            exec: Executor::default(),
            nodes,
            addr_index,
            clients,
            known: BTreeSet::new(),
            next_tend: 0,
            stopping: false,
            trace_counter: std::env::var("CITRINE_SIM_TRACE_COUNTER")
                .ok()
                .and_then(|v| v.parse().ok()),
            trace_put: std::env::var("CITRINE_SIM_TRACE_PUT")
                .ok()
                .and_then(|v| v.parse().ok()),
            trace_cluster: std::env::var_os("CITRINE_SIM_TRACE_CLUSTER").is_some(),
            traced_calls: BTreeMap::new(),
            held_since: None,
            trace_partition: traced_partition(),
            next_req: 1,
            counters,
            puts,
            truncated_puts,
            truncation: None,
            acked: 0,
            deletes_acked: 0,
            in_doubt: 0,
            refused: 0,
            view_changes: 0,
            events: Vec::new(),
            recent: VecDeque::new(),
            hash: seed,
            scratch: None,
            disks: vec![None; n],
            device_fault_at: None,
            device_refused: 0,
            flush_ms,
            commit_to_device,
            split_until: None,
            rebuilt_unsettled: false,
            final_reply: None,
            reads_checked: 0,
            unavailable_at_end: 0,
        }
    }

    fn now(&self) -> u64 {
        self.core.lock().now
    }

    fn note(&mut self, text: String) {
        if self.recent.len() >= RECENT {
            self.recent.pop_front();
        }
        let now = self.now();
        self.recent.push_back(format!("{now:>7} ms  {text}"));
    }

    fn fail(&self, invariant: Invariant, detail: String) -> Failure {
        Failure {
            seed: self.seed,
            invariant,
            at_ms: self.now(),
            detail,
            recent: self.recent.iter().cloned().collect(),
        }
    }

    /// The node's local clock for its state machine.
    fn local(&self, i: usize) -> u64 {
        self.now() + self.nodes[i].skew_ms
    }

    // ----- nodes -----

    /// The namespace's storage on node `i`: memory, or its disk
    /// ([`DataConfig::device`]; a blank one the first time and after a
    /// drive was replaced).
    fn storage_of(&mut self, i: usize) -> Result<StorageEngineConfig, Failure> {
        if self.cfg.sc {
            self.ensure_scratch()?;
        }
        if !self.cfg.device {
            return Ok(StorageEngineConfig::Memory {
                data_size: 64 << 20,
                evict_used_pct: 0,
                stop_writes_used_pct: 90,
            });
        }
        self.ensure_scratch()?;
        let disk = match &self.disks[i] {
            Some(disk) => disk.clone(),
            None => {
                // Its own generator: the run's draws stay as they were.
                let seed = mix(
                    self.seed,
                    0xD15C ^ (i as u64) << 8 ^ self.nodes[i].boots << 16,
                );
                let disk = SimDisk::new(DEVICE_FILE_BYTES, seed);
                self.disks[i] = Some(disk.clone());
                disk
            }
        };
        let path = std::path::PathBuf::from(format!("node-{i}.dat"));
        let mut engine =
            citrine_storage::device::DeviceConfig::new(NAMESPACE, vec![path], DEVICE_FILE_BYTES);
        engine.write_block_size = DEVICE_WBLOCK_BYTES;
        engine.commit_to_device = self.commit_to_device;
        engine.media = citrine_storage::device::Media::Simulated(vec![disk]);
        Ok(StorageEngineConfig::Device {
            engine,
            flush_max_ms: self.flush_ms as u32,
            index_image: None,
        })
    }

    /// Empties node `i`'s work directory (a node rebuilt from scratch).
    fn wipe_work(&self, i: usize) {
        if let Some(scratch) = &self.scratch {
            scratch.wipe(i);
        }
    }

    /// Creates the run's work directories' directory, once.
    fn ensure_scratch(&mut self) -> Result<(), Failure> {
        if self.scratch.is_none() {
            let scratch = Scratch::new(self.seed)
                .map_err(|e| self.fail(Invariant::NodeStart, format!("scratch directory: {e}")))?;
            self.scratch = Some(scratch);
        }
        Ok(())
    }

    fn boot(&mut self, i: usize) -> Result<(), Failure> {
        let time = self.core.lock().clock.clone();
        let storage_engine = self.storage_of(i)?;
        let config = ServiceConfig {
            node_id: self.nodes[i].id.0,
            rack_id: 0,
            cluster_name: "citrine".into(),
            access_address: format!("10.0.1.{i}:3000"),
            port: 3000,
            tls_access_address: String::new(),
            namespaces: vec![self.namespace_config(storage_engine)],
        };
        let clock = Arc::new(NodeClock {
            time,
            skew_ms: self.nodes[i].skew_ms,
            jump_ms: self.nodes[i].jump_ms.clone(),
        });
        let service = Arc::new(
            Service::open(config, clock)
                .map_err(|e| self.fail(Invariant::NodeStart, format!("service: {e}")))?,
        );
        // As the server with a work directory: the truncations and the
        // regime the copies just loaded belong to are kept there.
        if let Some(scratch) = &self.scratch {
            let kept = scratch.work(i).map_err(|e| e.to_string()).and_then(|dir| {
                service.dist().keep_truncations(&dir)?;
                if self.cfg.sc {
                    service.dist().keep_rosters(&dir)?;
                    service.dist().keep_sc_versions(&dir)?;
                }
                service.dist().keep_partition_lineage(&dir)
            });
            if let Err(e) = kept {
                return Err(self.fail(Invariant::NodeStart, format!("work directory: {e}")));
            }
        }
        service.set_fabric(Arc::new(SimFabric {
            core: self.core.clone(),
            node: i,
        }));
        // As the server: a node with seeds other than itself serves nothing
        // until its first view is published.
        let own = &self.nodes[i].cfg.addr;
        if self.nodes[i]
            .cfg
            .heartbeat
            .seeds
            .iter()
            .any(|seed| seed != own)
        {
            service.set_orphan();
        }
        let machine = ClusterNode::new(self.nodes[i].cfg.clone(), self.local(i))
            .map_err(|e| self.fail(Invariant::NodeStart, format!("config: {e}")))?;
        let stopping = Arc::new(AtomicBool::new(false));
        let pause: Arc<dyn citrine_service::migration::driver::Pause> = Arc::new(SimPause {
            core: self.core.clone(),
        });
        self.exec.spawn(
            i,
            citrine_service::migration::driver::run(
                service.dist().clone(),
                pause,
                stopping.clone(),
            ),
        );
        self.nodes[i].up = Some(Up {
            service,
            machine,
            view: None,
            published: None,
            partition_generation: 0,
            peers_generation: 0,
            stopping,
            frozen_until: None,
            frozen_at: 0,
            held: Vec::new(),
        });
        self.nodes[i].boots += 1;
        {
            let mut core = self.core.lock();
            core.up[i] = true;
            core.boots[i] += 1;
        }
        let held = self.records_held(i);
        self.hash = mix(self.hash, 0xB007 ^ i as u64 ^ (held as u64) << 8);
        let id = self.nodes[i].id;
        self.note(format!("boot #{i} {id} ({held} records)"));
        Ok(())
    }

    /// Records (and tombstones) node `i` holds, 0 when it is down.
    fn records_held(&self, i: usize) -> usize {
        self.nodes[i].up.as_ref().map_or(0, |up| {
            PartitionId::all()
                .map(|p| up.service.dist().migration_digests(NAMESPACE, p).len())
                .sum()
        })
    }

    /// The simulated flusher of node `i`'s device: every flush period,
    /// writes its buffers out, runs one defrag step and, every
    /// [`TOMBSTONE_COLLECT_MS`], collects tombstones; what it has not
    /// written yet is what a crash loses.
    fn storage_tick(&self, i: usize, now: u64) {
        if self.flush_ms == 0 || !(now + i as u64).is_multiple_of(self.flush_ms) {
            return;
        }
        let Some(up) = self.nodes[i].up.as_ref() else {
            return;
        };
        for namespace in up.service.namespaces() {
            citrine_service::device::flush_tick(namespace);
            citrine_service::device::defrag_step(namespace);
            if (now + i as u64).is_multiple_of(TOMBSTONE_COLLECT_MS) {
                citrine_service::device::collect_tombstones(namespace);
            }
        }
    }

    fn crash(&mut self, i: usize) {
        if let Some(up) = self.nodes[i].up.take() {
            up.stopping.store(true, Ordering::Relaxed);
        }
        self.core.lock().up[i] = false;
        self.exec.kill(i);
        self.hash = mix(self.hash, 0xDEAD ^ i as u64);
        let id = self.nodes[i].id;
        let cut = self.power_cut(i);
        self.note(format!("crash #{i} {id}{cut}"));
    }

    /// Cuts the power of node `i`'s disk (a crashed node's): what its
    /// unsynced writes leave is drawn, its faults go with the power cycle.
    /// Describes the cut for the notes.
    fn power_cut(&mut self, i: usize) -> String {
        let Some(disk) = self.disks[i].take() else {
            return String::new();
        };
        let cut = if self.rng.chance(0.5) {
            PowerCut::Scramble
        } else {
            PowerCut::LoseUnsynced
        };
        let unsynced = disk.unsynced_bytes();
        disk.clear_faults();
        self.disks[i] = Some(disk.power_cut(cut));
        self.hash = mix(
            self.hash,
            0xC07 ^ (unsynced as u64) << 1 ^ u64::from(cut == PowerCut::Scramble),
        );
        format!(", power cut {cut:?} with {unsynced} unsynced bytes")
    }

    /// True when node `i` is up and its device engine is in its failed
    /// state.
    fn device_failed(&self, i: usize) -> bool {
        self.nodes[i].up.as_ref().is_some_and(|up| {
            up.service
                .namespace(NAMESPACE.as_bytes())
                .and_then(|namespace| namespace.storage.device())
                .is_some_and(|engine| engine.failed())
        })
    }

    /// [`DataConfig::device_faults`]: node `i`'s disk fails every sync
    /// from now on; once its engine noticed (at its next flush), clients
    /// run against it for `ms`, then it is crashed.
    fn fail_device(&mut self, i: usize, ms: u64) -> Result<(), Failure> {
        let Some(disk) = self.disks[i].clone() else {
            return Ok(());
        };
        disk.inject(Fault {
            op: IoOp::Sync,
            trigger: Trigger::Always,
        });
        self.device_fault_at = Some(self.now());
        self.hash = mix(self.hash, 0xFA11 ^ i as u64);
        self.note(format!("device #{i} fails every sync from now"));
        self.wait_until(
            self.cfg.quiesce_bound_ms,
            "the failed sync noticed",
            true,
            |w| w.device_failed(i),
        )?;
        self.note(format!("device #{i} failed: writes refused"));
        self.run_for(ms, false)?;
        self.crash(i);
        Ok(())
    }

    fn live(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|i| self.nodes[*i].up.is_some())
            .collect()
    }

    fn effects(&mut self, i: usize, effects: Vec<Effect>) {
        let me = self.nodes[i].id;
        for effect in effects {
            match effect {
                Effect::Send { to, msg } => {
                    let Some(&j) = self.addr_index.get(&to) else {
                        continue;
                    };
                    if self.trace_cluster && !matches!(msg, ClusterMessage::Heartbeat(_)) {
                        self.note(format!("#{i} -> #{j}: {msg:?}"));
                    }
                    let bytes = Envelope { from: me, msg }.encode();
                    self.core.lock().send(Packet::Cluster {
                        from: i,
                        to: j,
                        bytes,
                    });
                }
                Effect::ViewChanged {
                    cluster_key,
                    succession,
                } => self.publish(i, cluster_key, succession),
                Effect::Orphaned => {
                    // As the server: no serving until the next view.
                    self.note(format!("#{i} orphaned"));
                    if let Some(up) = self.nodes[i].up.as_mut() {
                        up.view = None;
                        up.service.set_orphan();
                    }
                }
            }
        }
    }

    /// Publishes a view to the node's service, as the server's cluster
    /// runtime does.
    fn publish(&mut self, i: usize, key: u64, succession: Vec<NodeId>) {
        self.view_changes += 1;
        self.hash = mix(self.hash, key ^ i as u64);
        let text = succession
            .iter()
            .map(|id| id.to_string())
            .collect::<Vec<_>>()
            .join(",");
        self.note(format!("#{i} view {key:016x} [{text}]"));
        let members: Vec<ClusterMember> = succession
            .iter()
            .map(|id| ClusterMember {
                node_id: *id,
                rack_id: 0,
                service_address: self
                    .nodes
                    .iter()
                    .position(|n| n.id == *id)
                    .map(|j| format!("10.0.1.{j}:3000"))
                    .unwrap_or_default(),
                tls: None,
            })
            .collect();
        let Some(up) = self.nodes[i].up.as_mut() else {
            return;
        };
        up.partition_generation += 1;
        if up.published.as_ref() != Some(&succession) {
            up.peers_generation += 1;
        }
        let factors = Service::namespace_factors(&up.service.config);
        let state = ClusterState::new(
            up.service.node_id,
            key,
            members,
            &factors,
            up.partition_generation,
            up.peers_generation,
        );
        up.service.publish_cluster(state);
        up.view = Some((key, succession.clone()));
        up.published = Some(succession);
    }

    /// Every live node holds one view of exactly the live nodes.
    fn converged(&self) -> bool {
        let live = self.live();
        let mut ids: Vec<NodeId> = live.iter().map(|i| self.nodes[*i].id).collect();
        ids.sort();
        let mut key = None;
        for i in &live {
            let Some(up) = &self.nodes[*i].up else {
                return false;
            };
            let Some((k, s)) = &up.view else { return false };
            if *s != ids || key.is_some_and(|x| x != *k) {
                return false;
            }
            key = Some(*k);
        }
        key.is_some()
    }

    /// Converged and every node `cluster-stable` (nothing to exchange,
    /// send or receive).
    fn settled(&self) -> bool {
        // A frozen node is a node lost for now (its copies unreachable),
        // however settled its frozen state looks.
        self.converged()
            && self.live().iter().all(|i| {
                self.nodes[*i].up.as_ref().is_some_and(|up| {
                    let m = &up.service.migrations();
                    up.frozen_until.is_none()
                        && !m.exchanging()
                        && m.tx_remaining() == 0
                        && m.rx_remaining() == 0
                })
            })
    }

    // ----- the network -----

    fn deliver(&mut self, packet: Packet) -> Result<(), Failure> {
        match packet {
            Packet::Cluster { from: _, to, bytes } => {
                let local = self.local(to);
                let Some(up) = self.nodes[to].up.as_mut() else {
                    return Ok(());
                };
                let env = match Envelope::decode(&bytes) {
                    Ok(env) => env,
                    Err(e) => return Err(self.fail(Invariant::Codec, format!("decode: {e}"))),
                };
                let effects = up.machine.on_message(env.from, env.msg, local);
                self.effects(to, effects);
            }
            Packet::Request {
                call,
                from,
                to,
                kind,
                payload,
            } => self.deliver_request(call, (from, to), kind, payload),
            Packet::Response { call, to, payload } => {
                if let Some(what) = self.traced_calls.remove(&call) {
                    let head = &payload[..payload.len().min(4)];
                    self.note(format!("#{to} <- {what}: {head:02x?}"));
                }
                let mut core = self.core.lock();
                if core.up[to] {
                    core.answer(call, payload);
                }
            }
            Packet::ClientRequest {
                client,
                req,
                to,
                frame,
            } => self.deliver_client_request(client, req, to, frame)?,
            Packet::ClientReply { client, req, frame } if client == sc::FINAL_READER => {
                self.final_reply = Some((req, frame));
            }
            Packet::ClientReply { client, req, frame } => self.on_reply(client, req, &frame)?,
        }
        Ok(())
    }

    /// A fabric call from node `from` to node `to`: served there by its
    /// service, whose answer goes back as a response.
    fn deliver_request(
        &mut self,
        call: u64,
        (from, to): (usize, usize),
        kind: u8,
        payload: Vec<u8>,
    ) {
        if let Some(partition) = self.trace_partition {
            if let Some(what) = describe_call(kind, &payload, partition) {
                self.note(format!("#{from} -> #{to}: {what}"));
                self.traced_calls
                    .insert(call, format!("#{to}'s answer to {what}"));
            }
        }
        let Some(up) = self.nodes[to].up.as_ref() else {
            return;
        };
        let service = up.service.clone();
        let core = self.core.clone();
        self.exec.spawn(to, async move {
            let answer = service.serve_fabric(kind, &payload).await;
            core.lock().send(Packet::Response {
                call,
                to: from,
                payload: answer,
            });
        });
    }

    /// A client's request `frame` at node `to`: answered at once, or once
    /// its fabric work is done.
    fn deliver_client_request(
        &mut self,
        client: usize,
        req: u64,
        to: usize,
        frame: Vec<u8>,
    ) -> Result<(), Failure> {
        let Some(up) = self.nodes[to].up.as_ref() else {
            return Ok(());
        };
        let service = up.service.clone();
        let Some(header) = frame
            .get(..PROTO_HEADER_SIZE)
            .and_then(|h| <&[u8; PROTO_HEADER_SIZE]>::try_from(h).ok())
            .and_then(|h| ProtoHeader::decode(h).ok())
        else {
            return Err(self.fail(Invariant::ClientResult, "bad request frame".into()));
        };
        let mut out = Vec::new();
        let body = frame.get(PROTO_HEADER_SIZE..).unwrap_or_default();
        if self.trace_partition.is_some() && self.trace_partition == request_partition(body) {
            let regime =
                citrine_distribution::sc::data_path::regime_of(&service.cluster(), NAMESPACE);
            self.note(format!(
                "#{to} receives client {client}'s request {req} (regime {regime:?})"
            ));
        }
        match service.handle_streaming_since(header, body, &mut out, self.held_since) {
            Ok(None) => self.core.lock().send(Packet::ClientReply {
                client,
                req,
                frame: out,
            }),
            Ok(Some(continuation)) if continuation.is_remote() => {
                let core = self.core.clone();
                self.exec.spawn(to, async move {
                    service.complete_remote(continuation, &mut out).await;
                    core.lock().send(Packet::ClientReply {
                        client,
                        req,
                        frame: out,
                    });
                });
            }
            Ok(Some(_)) | Err(_) => {
                return Err(self.fail(
                    Invariant::ClientResult,
                    "a single-record request was streamed or refused".into(),
                ))
            }
        }
        Ok(())
    }

    // ----- clients -----

    /// A smart client's tend: the nodes it keeps are the live ones listed
    /// in the view (peers) of some *other* known live node — a node no
    /// other node references is dropped, as the Aerospike clients do, so a
    /// node that restarted and has not joined the cluster yet (alone in
    /// its own view) is not used.
    fn tend(&mut self) {
        let mut known = BTreeSet::new();
        for i in &self.known {
            let Some(up) = &self.nodes[*i].up else {
                continue;
            };
            let Some((_, members)) = &up.view else {
                continue;
            };
            for id in members {
                match self.nodes.iter().position(|n| n.id == *id) {
                    Some(j) if j != *i && self.nodes[j].up.is_some() => {
                        known.insert(j);
                    }
                    _ => {}
                }
            }
        }
        if known.is_empty() {
            return; // keep what it had rather than nothing
        }
        if known != self.known {
            self.note(format!("clients know {known:?}"));
            self.known = known;
        }
    }

    fn start_clients(&mut self) {
        self.known = self.live().into_iter().collect();
        let now = self.now();
        for c in 0..self.clients.len() {
            self.clients[c] = ClientState::Idle {
                next_at: now + self.rng.range(0, 20),
            };
        }
        self.note("clients start".into());
    }

    fn clients_idle(&self) -> bool {
        self.clients
            .iter()
            .all(|c| matches!(c, ClientState::Stopped))
    }

    /// Where a smart client sends a request for `digest`. An Aerospike
    /// client learns which partitions a node masters from that node's own
    /// `replicas` answer, so it sends to the master named by a known node's
    /// map only when that master is known and its own current map agrees;
    /// otherwise (and sometimes at random) to a known node, which proxies.
    fn route(&mut self, digest: &Digest) -> Option<usize> {
        let live: Vec<usize> = self
            .known
            .iter()
            .copied()
            .filter(|i| self.nodes[*i].up.is_some())
            .collect();
        if live.is_empty() {
            return None;
        }
        let via = live[self.rng.index(live.len())];
        if self.rng.chance(0.15) {
            return Some(via);
        }
        let master_in = |world: &World, i: usize| {
            let up = world.nodes[i].up.as_ref()?;
            let cluster = up.service.cluster();
            let id = cluster
                .namespace(NAMESPACE)
                .and_then(|map| map.map.master(digest.partition()))?;
            world.nodes.iter().position(|n| n.id == id)
        };
        match master_in(self, via) {
            Some(m) if self.known.contains(&m) && master_in(self, m) == Some(m) => Some(m),
            _ => Some(via),
        }
    }

    fn new_op(&mut self, c: usize) -> OpKind {
        if self.cfg.truncate && self.rng.chance(0.12) {
            let key = c + self.cfg.clients * self.rng.index(TRUNCATED_KEYS_PER_CLIENT);
            return self.new_truncated_put(key);
        }
        let roll = self.rng.below(100);
        if roll < 45 {
            OpKind::Incr {
                counter: self.rng.index(self.cfg.counters),
            }
        } else if roll < 80 {
            let key = c + self.cfg.clients * self.rng.index(self.cfg.puts_per_client);
            if self.cfg.deletes && self.rng.chance(0.25) {
                self.new_delete(key)
            } else {
                self.new_put(c, key)
            }
        } else if self.cfg.sc && self.rng.chance(0.5) {
            // Any client reads any put key.
            let key = self.rng.index(self.puts.len());
            OpKind::ReadPut {
                key,
                floor: self.last_acked(key),
            }
        } else {
            let counter = self.rng.index(self.cfg.counters);
            OpKind::Read {
                counter,
                floor: self.counters[counter].acked,
            }
        }
    }

    fn new_put(&mut self, c: usize, key: usize) -> OpKind {
        let attempt = self.puts[key].len();
        let value = ((c as i64) << 40) | ((key as i64) << 20) | attempt as i64;
        self.puts[key].push(PutAttempt {
            value: Some(value),
            outcome: Outcome::Pending,
        });
        OpKind::Put {
            key,
            value,
            attempt,
        }
    }

    fn new_delete(&mut self, key: usize) -> OpKind {
        let attempt = self.puts[key].len();
        self.puts[key].push(PutAttempt {
            value: None,
            outcome: Outcome::Pending,
        });
        OpKind::Delete {
            key,
            attempt,
            // Strong consistency: durable deletes only.
            durable: self.cfg.sc || self.rng.chance(0.5),
        }
    }

    fn new_truncated_put(&mut self, key: usize) -> OpKind {
        let attempt = self.truncated_puts[key].len();
        let value = (1 << 60) | ((key as i64) << 20) | attempt as i64;
        let now = self.now();
        self.truncated_puts[key].push(TruncatedPut {
            value,
            outcome: Outcome::Pending,
            sent_at: now,
            done_at: now,
        });
        OpKind::TruncatedPut {
            key,
            value,
            attempt,
        }
    }

    fn send_op(&mut self, c: usize, kind: OpKind, tries: u32) {
        let ttl = self.cfg.client_timeout_ms as u32;
        let write = MsgHeader {
            info2: info2::WRITE,
            transaction_ttl: ttl,
            ..MsgHeader::default()
        };
        let (set, key, header, op) = match kind {
            OpKind::Incr { counter } => {
                self.counters[counter].attempts += 1;
                let header = MsgHeader {
                    info1: info1::READ,
                    ..write
                };
                let op = Some((op_type::INCR, "n", 1));
                (SET, counter_key(counter), header, op)
            }
            OpKind::Put { key, value, .. } => {
                (SET, put_key(key), write, Some((op_type::WRITE, "v", value)))
            }
            OpKind::Delete { key, durable, .. } => {
                let durable = if durable { info2::DURABLE_DELETE } else { 0 };
                let header = MsgHeader {
                    info2: info2::WRITE | info2::DELETE | durable,
                    ..write
                };
                (SET, put_key(key), header, None)
            }
            OpKind::TruncatedPut { key, value, .. } => (
                TRUNCATED_SET,
                truncated_key(key),
                write,
                Some((op_type::WRITE, "v", value)),
            ),
            OpKind::Read { counter, .. } => (SET, counter_key(counter), self.read_header(), None),
            OpKind::ReadPut { key, .. } => (SET, put_key(key), self.read_header(), None),
        };
        let frame = request_frame_in(set, &key, header, op);
        let req = self.next_req;
        self.next_req += 1;
        let now = self.now();
        let to = self.route(&digest_in(set, &key));
        self.clients[c] = ClientState::Waiting(InFlight {
            kind,
            req,
            sent_at: now,
            tries,
            to,
        });
        let Some(to) = to else {
            return;
        };
        self.core.lock().send(Packet::ClientRequest {
            client: c,
            req,
            to,
            frame,
        });
    }

    fn clients_step(&mut self, stopping: bool) -> Result<(), Failure> {
        let now = self.now();
        if now >= self.next_tend {
            self.tend();
            self.next_tend = now + 1_000;
        }
        for c in 0..self.clients.len() {
            match self.clients[c].clone() {
                ClientState::Idle { .. } if stopping => {
                    self.clients[c] = ClientState::Stopped;
                }
                ClientState::Idle { next_at } if now >= next_at => {
                    let kind = self.new_op(c);
                    self.send_op(c, kind, 1);
                }
                ClientState::Waiting(op)
                    if now >= op.sent_at + self.cfg.client_timeout_ms + 500 =>
                {
                    // No answer: the request or its reply was lost, or the
                    // node died.
                    self.hash = mix(self.hash, 0x7173 ^ op.req);
                    self.finish(c, op, None, stopping)?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn on_reply(&mut self, c: usize, req: u64, frame: &[u8]) -> Result<(), Failure> {
        let ClientState::Waiting(op) = self.clients[c].clone() else {
            return Ok(());
        };
        if op.req != req {
            return Ok(()); // a late reply to an attempt already given up
        }
        let Some(reply) = parse_reply(frame) else {
            return Err(self.fail(Invariant::ClientResult, "undecodable reply".into()));
        };
        self.hash = mix(self.hash, req ^ u64::from(reply.0) << 56);
        self.finish(c, op, Some(reply), false)
    }

    /// Records the outcome of an attempt; retries or moves on.
    fn finish(
        &mut self,
        c: usize,
        op: InFlight,
        reply: Option<(u8, Option<i64>)>,
        stopping: bool,
    ) -> Result<(), Failure> {
        self.trace_attempt(c, &op, reply);
        let outcome = self.outcome_of(&op, reply.map(|r| r.0))?;
        match outcome {
            Outcome::Acked => {
                self.acked += 1;
                if matches!(op.kind, OpKind::Delete { .. }) {
                    self.deletes_acked += 1;
                }
            }
            Outcome::InDoubt if !op.kind.is_read() => self.in_doubt += 1,
            Outcome::Failed => self.refused += 1,
            _ => {}
        }
        self.check_attempt(&op, outcome, reply)?;
        let now = self.now();
        if outcome != Outcome::Acked && op.tries < MAX_TRIES && !stopping && !self.stopping {
            // Retry like a smart client: a new attempt (a put with a new
            // value, so every value names one attempt).
            let kind = match op.kind {
                OpKind::Put { key, .. } => self.new_put(c, key),
                OpKind::Delete { key, durable, .. } => match self.new_delete(key) {
                    OpKind::Delete { key, attempt, .. } => OpKind::Delete {
                        key,
                        attempt,
                        durable,
                    },
                    other => other,
                },
                OpKind::TruncatedPut { key, .. } => self.new_truncated_put(key),
                other => other,
            };
            self.clients[c] = ClientState::Idle { next_at: now };
            self.send_op(c, kind, op.tries + 1);
            return Ok(());
        }
        self.clients[c] = ClientState::Idle {
            next_at: now + self.rng.range(2, 25),
        };
        Ok(())
    }

    /// Notes an attempt on the traced counter or put (`--trace-*`).
    fn trace_attempt(&mut self, c: usize, op: &InFlight, reply: Option<(u8, Option<i64>)>) {
        if self.trace_counter.is_some_and(|t| {
            matches!(op.kind, OpKind::Incr { counter } | OpKind::Read { counter, .. } if counter == t)
        }) || self
            .trace_put
            .is_some_and(|t| {
                matches!(op.kind, OpKind::Put { key, .. } | OpKind::Delete { key, .. } | OpKind::ReadPut { key, .. } if key == t)
            })
        {
            self.note(format!(
                "client {c} {:?} via {:?} (sent {} ms) -> {reply:?}",
                op.kind, op.to, op.sent_at
            ));
        }
    }

    /// What the result `code` (`None`: no answer) makes of an attempt; a
    /// code no client may see fails the run.
    fn outcome_of(&mut self, op: &InFlight, code: Option<u8>) -> Result<Outcome, Failure> {
        Ok(match code {
            Some(0) => Outcome::Acked,
            // A read or delete that found no record: answered, and the
            // record is absent after it.
            Some(2) if op.kind.is_read() || matches!(op.kind, OpKind::Delete { .. }) => {
                Outcome::Acked
            }
            None | Some(9) => Outcome::InDoubt,
            Some(11) => Outcome::Failed,
            // A failed device's engine refuses before anything is applied.
            Some(1)
                if !op.kind.is_read()
                    && self.device_fault_at.is_some_and(|at| self.now() >= at) =>
            {
                self.device_refused += 1;
                Outcome::Failed
            }
            Some(other) => {
                return Err(self.fail(
                    Invariant::ClientResult,
                    format!("{:?} answered {other}", op.kind),
                ))
            }
        })
    }

    /// Keeps an attempt's outcome with its operation's history, and checks
    /// what it answered: no two acknowledged increments return the same
    /// value, no read sees more increments than were sent.
    fn check_attempt(
        &mut self,
        op: &InFlight,
        outcome: Outcome,
        reply: Option<(u8, Option<i64>)>,
    ) -> Result<(), Failure> {
        match op.kind {
            OpKind::Incr { counter } => match outcome {
                Outcome::Acked => {
                    self.counters[counter].acked += 1;
                    let value = reply.and_then(|r| r.1).unwrap_or(-1);
                    if !self.counters[counter].returned.insert(value) {
                        return Err(self.fail(
                            Invariant::LostWrite,
                            format!(
                                "two acknowledged increments of counter {counter} both \
                                 returned {value}"
                            ),
                        ));
                    }
                }
                Outcome::InDoubt => self.counters[counter].in_doubt += 1,
                _ => {}
            },
            OpKind::Put { key, attempt, .. } | OpKind::Delete { key, attempt, .. } => {
                if let Some(a) = self.puts[key].get_mut(attempt) {
                    a.outcome = outcome;
                }
            }
            OpKind::TruncatedPut { key, attempt, .. } => {
                let now = self.now();
                if let Some(a) = self.truncated_puts[key].get_mut(attempt) {
                    a.outcome = outcome;
                    a.done_at = now;
                }
            }
            OpKind::Read { counter, floor } => {
                let seen = match reply {
                    Some((0, value)) => value,
                    _ => None,
                };
                let bound = self.counters[counter].attempts;
                if let Some(v) = seen {
                    if v < 0 || v as u64 > bound {
                        return Err(self.fail(
                            Invariant::PhantomWrite,
                            format!("counter {counter} read {v}, only {bound} increments sent"),
                        ));
                    }
                }
                if self.cfg.sc && outcome == Outcome::Acked {
                    self.check_counter_read(counter, floor, seen.unwrap_or(0))?;
                }
            }
            OpKind::ReadPut { key, floor } => {
                if outcome == Outcome::Acked {
                    let seen = reply.and_then(|(code, value)| (code == 0).then_some(value)?);
                    self.check_put_read(key, floor, seen)?;
                }
            }
        }
        Ok(())
    }

    // ----- the run -----

    /// Advances one millisecond: deliveries, timers, state-machine ticks,
    /// then every woken task.
    fn step(&mut self) -> Result<(), Failure> {
        let now = {
            let mut core = self.core.lock();
            let now = core.now + 1;
            core.set_now(now);
            now
        };
        loop {
            let packet = self.core.lock().pop_due();
            match packet {
                None => break,
                Some(None) => {}
                Some(Some(packet)) => {
                    // A frozen node reads nothing; an answer to its own
                    // call waits in its (unpolled) task instead.
                    let frozen = packet
                        .dest()
                        .and_then(|to| self.nodes[to].up.as_mut())
                        .filter(|up| up.frozen_until.is_some());
                    match frozen {
                        Some(up) if !matches!(packet, Packet::Response { .. }) => {
                            up.held.push(packet);
                        }
                        _ => self.deliver(packet)?,
                    }
                }
            }
        }
        if self.split_until.is_some_and(|until| now >= until) {
            self.heal();
        }
        let wakers = self.core.lock().due_timers();
        for w in wakers {
            w.wake();
        }
        for i in 0..self.nodes.len() {
            match self.nodes[i].up.as_ref().and_then(|up| up.frozen_until) {
                Some(until) if until <= now => self.thaw(i)?,
                Some(_) => continue,
                None => {}
            }
            self.storage_tick(i, now);
            if !(now + i as u64).is_multiple_of(TICK_MS) {
                continue;
            }
            self.tick_node(i);
        }
        if self.exec.run(POLL_BUDGET).is_err() {
            return Err(self.fail(
                Invariant::Quiescence,
                "the executor does not come to rest".into(),
            ));
        }
        Ok(())
    }

    /// Ticks node `i`'s state machine, carries out its effects and reports
    /// the tick to its service, as `citrine-server`'s cluster runtime does.
    fn tick_node(&mut self, i: usize) {
        let local = self.local(i);
        let Some(up) = self.nodes[i].up.as_mut() else {
            return;
        };
        let effects = up.machine.tick(local);
        if up.service.dist().take_recluster_request() {
            // Strong consistency: `recluster:` or a roster not yet decided
            // with, as the server's cluster runtime does.
            up.machine.request_recluster();
        }
        self.effects(i, effects);
        if let Some(up) = self.nodes[i].up.as_ref() {
            up.service.cluster_ticked(up.machine.stall_bound_ms());
            up.service
                .set_cluster_clock_skew(up.machine.clock_skew_ms());
        }
    }

    /// Freezes node `i` for `ms` (SIGSTOP, a paused machine).
    fn freeze(&mut self, i: usize, ms: u64) {
        let now = self.now();
        let until = now + ms;
        if let Some(up) = self.nodes[i].up.as_mut() {
            up.frozen_until = Some(until);
            up.frozen_at = now;
            self.exec.set_frozen(i, true);
            self.hash = mix(self.hash, 0xF4EE ^ (i as u64) ^ (ms << 8));
            self.note(format!("freeze #{i} for {ms} ms"));
        }
    }

    /// Node `i` carries on. Its cluster thread and its service threads
    /// resume together, so either may go first: the state machine's tick
    /// (which notices the stall), or the service reading what reached the
    /// node meanwhile (which the stall guard refuses until that tick).
    fn thaw(&mut self, i: usize) -> Result<(), Failure> {
        let tick_first = self.rng.chance(0.5);
        let Some(up) = self.nodes[i].up.as_mut() else {
            return Ok(());
        };
        up.frozen_until = None;
        let held = std::mem::take(&mut up.held);
        let frozen_at = up.frozen_at;
        self.exec.set_frozen(i, false);
        self.note(format!(
            "thaw #{i} ({} packets held, {} first)",
            held.len(),
            if tick_first { "tick" } else { "packets" }
        ));
        if tick_first {
            self.tick_node(i);
        }
        // The requests that waited in its sockets: the service thread
        // that reads them knows only that it was stalled since then.
        self.held_since = Some(frozen_at);
        let delivered = held.into_iter().try_for_each(|packet| self.deliver(packet));
        self.held_since = None;
        delivered?;
        if !tick_first {
            self.tick_node(i);
        }
        Ok(())
    }

    fn wait_until(
        &mut self,
        bound_ms: u64,
        what: &str,
        clients: bool,
        mut done: impl FnMut(&World) -> bool,
    ) -> Result<(), Failure> {
        let start = self.now();
        while !done(self) {
            if self.now() > start + bound_ms {
                let views = self.describe();
                return Err(self.fail(
                    Invariant::Quiescence,
                    format!("{what} not reached within {bound_ms} ms{views}"),
                ));
            }
            self.step()?;
            if clients {
                self.clients_step(false)?;
            }
        }
        Ok(())
    }

    fn run_for(&mut self, ms: u64, stopping: bool) -> Result<(), Failure> {
        for _ in 0..ms {
            self.step()?;
            self.clients_step(stopping)?;
        }
        Ok(())
    }

    fn describe(&self) -> String {
        let mut s = format!(
            "\n    {} packets in flight, {} tasks",
            self.core.lock().in_flight(),
            self.exec.len()
        );
        for (i, n) in self.nodes.iter().enumerate() {
            let state = match &n.up {
                None => "down".to_string(),
                Some(up) => {
                    let m = &up.service.migrations();
                    format!(
                        "view {:?} exchanging {} tx {} rx {}",
                        up.view.as_ref().map(|(k, s)| (
                            format!("{k:016x}"),
                            s.iter().map(|x| x.to_string()).collect::<Vec<_>>()
                        )),
                        m.exchanging(),
                        m.tx_remaining(),
                        m.rx_remaining()
                    )
                }
            };
            s.push_str(&format!("\n    #{i} {}: {state}", n.id));
        }
        s
    }

    fn event(&mut self) -> Result<(), Failure> {
        let never: Vec<usize> = (0..self.nodes.len())
            .filter(|i| self.nodes[*i].boots == 0)
            .collect();
        let down: Vec<usize> = (0..self.nodes.len())
            .filter(|i| self.nodes[*i].boots > 0 && self.nodes[*i].up.is_none())
            .collect();
        let options = self.event_options(&never, &down);
        if options.is_empty() {
            return Ok(());
        }
        match options[self.rng.index(options.len())] {
            0 => {
                let i = never[self.rng.index(never.len())];
                self.events.push(format!("add #{i}"));
                self.boot(i)?;
            }
            1 => self.crash_one()?,
            3 => self.freeze_one()?,
            4 => self.fail_one_device()?,
            _ => self.restart_one(&down)?,
        }
        if self.rng.chance(0.3) {
            let params = NetParams {
                loss: self.rng.unit() * self.cfg.max_loss,
                base_delay: 1,
                jitter: self.rng.range(0, 5),
                vanish: self.cfg.messages_vanish,
            };
            self.note(format!("network {params:?}"));
            self.core.lock().params = params;
        }
        Ok(())
    }

    /// The events possible now ([`World::event`]): 0 add a node that never
    /// ran (one of `never`), 1 crash, 2 restart one of `down`, 3 freeze,
    /// 4 a device failure.
    fn event_options(&self, never: &[usize], down: &[usize]) -> Vec<u8> {
        let live = self.live();
        let mut options = Vec::new();
        if !never.is_empty() {
            options.push(0);
        }
        if live.len() >= 3 {
            options.push(1);
        }
        if !down.is_empty() {
            options.push(2);
        }
        let frozen = self
            .nodes
            .iter()
            .any(|n| n.up.as_ref().is_some_and(|up| up.frozen_until.is_some()));
        if live.len() >= 3 && !frozen {
            options.push(3);
        }
        if self.cfg.device
            && self.cfg.device_faults
            && live.len() >= 3
            && !frozen
            && self.device_fault_at.is_none()
        {
            options.push(4);
        }
        if self.cfg.join_then_leave {
            // Add while a spare never ran, then crash.
            let wanted = if never.is_empty() { 1 } else { 0 };
            options.retain(|&option| option == wanted);
        }
        options
    }

    /// Crashes a live node, once every partition has its copies (only one
    /// node may be lost at a time).
    fn crash_one(&mut self) -> Result<(), Failure> {
        self.wait_until(
            self.cfg.quiesce_bound_ms,
            "stability before a crash",
            true,
            |w| w.settled(),
        )?;
        let live = self.live();
        let i = live[self.rng.index(live.len())];
        self.events.push(format!("crash #{i}"));
        self.crash(i);
        Ok(())
    }

    /// Freezes a live node for a while: a loss for that while, so as
    /// before a crash, every partition has its copies first.
    fn freeze_one(&mut self) -> Result<(), Failure> {
        self.wait_until(
            self.cfg.quiesce_bound_ms,
            "stability before a freeze",
            true,
            |w| w.settled(),
        )?;
        let live = self.live();
        let i = live[self.rng.index(live.len())];
        let ms = self.rng.range(500, 4_000);
        self.events.push(format!("freeze #{i} for {ms} ms"));
        self.freeze(i, ms);
        Ok(())
    }

    /// Fails a live node's device (a node lost for good): as before a
    /// crash, every partition has its copies first.
    fn fail_one_device(&mut self) -> Result<(), Failure> {
        self.wait_until(
            self.cfg.quiesce_bound_ms,
            "stability before a device failure",
            true,
            |w| w.settled(),
        )?;
        let live = self.live();
        let i = live[self.rng.index(live.len())];
        let ms = self.rng.range(200, 2_000);
        self.events
            .push(format!("device #{i} fails syncs, crash {ms} ms after"));
        self.fail_device(i, ms)
    }

    /// Restarts one of the `down` nodes (once the others noticed its
    /// crash, unless configured not to wait): empty, with its device, or
    /// on a blank one.
    fn restart_one(&mut self, down: &[usize]) -> Result<(), Failure> {
        let i = down[self.rng.index(down.len())];
        if !self.cfg.restart_before_noticed {
            let id = self.nodes[i].id;
            self.wait_until(
                self.cfg.quiesce_bound_ms,
                "the crash noticed before a restart",
                true,
                |w| {
                    w.live().iter().all(|j| {
                        w.nodes[*j].up.as_ref().is_some_and(|up| {
                            up.view.as_ref().is_some_and(|(_, s)| !s.contains(&id))
                        })
                    })
                },
            )?;
        }
        // Drawn only with a device, as before SC runs limited it.
        let blank = self.cfg.device && self.rng.chance(0.25);
        let what = if !self.cfg.device {
            format!("restart #{i} empty")
        } else if !blank || (self.cfg.sc && self.rebuilt_unsettled) {
            format!("restart #{i} with its device")
        } else {
            self.disks[i] = None;
            if self.cfg.sc {
                // Its copies are lost either way (see `rebuilt_unsettled`).
                // The SC versions are kept in the work directory, beside
                // the rosters: a replaced drive under a kept directory
                // must not claim the copies they describe (the node sees
                // its drive came up blank). A node rebuilt from scratch
                // loses both.
                self.rebuilt_unsettled = true;
                if self.rng.chance(0.5) {
                    format!("restart #{i} on a blank device (work directory kept)")
                } else {
                    self.wipe_work(i);
                    format!("restart #{i} on a blank device and work directory")
                }
            } else {
                format!("restart #{i} on a blank device")
            }
        };
        self.note(what.clone());
        self.events.push(what);
        self.boot(i)
    }

    /// A client truncates [`TRUNCATED_SET`] through one live node, with a
    /// threshold far enough behind that node's clock that every put sent
    /// from now on is executed after it by any node's clock.
    fn truncate(&mut self) -> Result<(), Failure> {
        let live = self.live();
        if live.is_empty() {
            return Ok(());
        }
        let i = live[self.rng.index(live.len())];
        let Some(up) = &self.nodes[i].up else {
            return Ok(());
        };
        let skew = self.cfg.max_skew_ms;
        let lut_ms = up.service.now().unix_ms.saturating_sub(2 * skew + 1);
        let command = format!(
            "truncate:namespace={NAMESPACE};set={TRUNCATED_SET};lut={}",
            u128::from(lut_ms) * 1_000_000
        );
        let frame = citrine_wire::info::request_frame(&[command.as_str()]);
        let mut out = Vec::new();
        citrine_service::info::handle(
            &up.service,
            frame.get(PROTO_HEADER_SIZE..).unwrap_or_default(),
            &mut out,
        );
        let answer = out
            .get(PROTO_HEADER_SIZE..)
            .map(citrine_wire::info::parse_response)
            .unwrap_or_default();
        if answer.first().map(|(_, value)| value.as_str()) != Some("ok") {
            return Err(self.fail(
                Invariant::Truncation,
                format!("{command} at #{i} answered {answer:?}"),
            ));
        }
        let now = self.now();
        self.truncation = Some(Truncation {
            lut_ms,
            at: now,
            // A truncation covers a last-update time before its threshold
            // (as the reference's). Executed at or before `at - 3 skew -
            // 2`, a put's lut is at most `at - 2 skew - 2` on the fastest
            // clock: before the threshold, which the slowest clock put at
            // `at - 2 skew - 1` or after it.
            covers_acked_until: now.saturating_sub(3 * skew + 2),
        });
        self.events
            .push(format!("truncate {TRUNCATED_SET} at #{i}"));
        self.note(format!("truncate {TRUNCATED_SET} at #{i}, lut {lut_ms}"));
        self.hash = mix(self.hash, 0x7247 ^ lut_ms);
        Ok(())
    }

    /// Steps 1–4 of the script: everything before the checks.
    fn run_to_quiescence(&mut self) -> Result<(), Failure> {
        let initial: Vec<usize> = (0..self.nodes.len() - self.cfg.spares).collect();
        let mut boot_at: Vec<(u64, usize)> =
            initial.iter().map(|i| (self.rng.below(300), *i)).collect();
        boot_at.sort_unstable();
        for (at, i) in boot_at {
            while self.now() < at {
                self.step()?;
            }
            self.boot(i)?;
        }
        self.wait_until(30_000, "initial convergence", false, |w| w.settled())?;
        if self.cfg.sc {
            self.set_roster()?;
        }
        self.start_clients();
        self.run_for(1_000, false)?;
        let events = self
            .rng
            .range(self.cfg.min_events as u64, self.cfg.max_events as u64);
        // Around which event the truncation is issued: half the time
        // 100-1500 ms before it (its push goes out within the drivers'
        // idle poll, and the event's exchange syncs it again: a node
        // restarted empty learns it there), half the time 20-600 ms after
        // it, while that event's migrations run (copies of the truncated
        // set cross the push in flight).
        let truncate_at = self
            .cfg
            .truncate
            .then(|| (self.rng.below(events.max(1)), self.rng.chance(0.5)));
        for event in 0..events {
            if truncate_at == Some((event, false)) {
                self.truncate()?;
                let gap = self.rng.range(100, 1_500);
                self.run_for(gap, false)?;
            }
            if self.cfg.sc {
                self.sc_event()?;
            } else {
                self.event()?;
            }
            let mut gap = self.rng.range(1_500, 4_000);
            if truncate_at == Some((event, true)) {
                let after = self.rng.range(20, 600);
                self.run_for(after, false)?;
                self.truncate()?;
                gap -= after;
            }
            self.run_for(gap, false)?;
        }
        // Clients stop: outstanding attempts finish or time out.
        self.note("clients stop".into());
        self.stopping = true;
        let bound = self.cfg.client_timeout_ms + 1_000;
        let start = self.now();
        while !self.clients_idle() {
            if self.now() > start + bound {
                return Err(self.fail(Invariant::Quiescence, "clients do not stop".into()));
            }
            self.step()?;
            self.clients_step(true)?;
        }
        if self.cfg.sc {
            self.heal_and_restart_all()?;
        }
        // Quiescence: settled, and still settled `settle_ms` later.
        let deadline = self.now() + self.cfg.quiesce_bound_ms;
        let mut since: Option<u64> = None;
        loop {
            let now = self.now();
            if self.settled() {
                let s = *since.get_or_insert(now);
                if now >= s + self.cfg.settle_ms {
                    break;
                }
            } else {
                since = None;
            }
            if now > deadline {
                let views = self.describe();
                return Err(self.fail(
                    Invariant::Quiescence,
                    format!(
                        "not quiescent {} ms after the clients stopped{views}",
                        self.cfg.quiesce_bound_ms
                    ),
                ));
            }
            self.step()?;
        }
        self.note("quiescent".into());
        Ok(())
    }

    fn run(&mut self) -> Result<DataReport, Failure> {
        self.run_to_quiescence()?;
        let records = if self.cfg.sc {
            self.sc_check()?
        } else {
            self.check()?
        };
        let core = self.core.lock();
        Ok(DataReport {
            seed: self.seed,
            nodes: self.nodes.iter().filter(|n| n.boots > 0).count(),
            events: self.events.clone(),
            trace_hash: mix(self.hash, core.hash),
            acked: self.acked,
            deletes_acked: self.deletes_acked,
            in_doubt: self.in_doubt,
            refused: self.refused,
            device_refused: self.device_refused,
            records,
            view_changes: self.view_changes,
            packets: core.sent,
            lost: core.lost,
            end_ms: core.now,
            reads_checked: self.reads_checked,
            unavailable_at_end: self.unavailable_at_end,
            commit_to_device: self.commit_to_device,
        })
    }

    // ----- the checks -----

    /// Every record of every live node: digest → node → its state as a
    /// replica write (generation, void time, last-update time, set, body).
    fn copies(&self) -> BTreeMap<Digest, BTreeMap<usize, ReplicaWrite>> {
        let mut out: BTreeMap<Digest, BTreeMap<usize, ReplicaWrite>> = BTreeMap::new();
        for i in self.live() {
            let Some(up) = &self.nodes[i].up else {
                continue;
            };
            let service = &up.service;
            for partition in PartitionId::all() {
                let mut digests = service.dist().migration_digests(NAMESPACE, partition);
                digests.sort();
                let mut at = 0;
                while at < digests.len() {
                    let (batch, consumed) = service.dist().migration_batch(
                        0,
                        NAMESPACE,
                        partition,
                        digests.get(at..).unwrap_or_default(),
                        0,
                    );
                    at += consumed.max(1);
                    for bytes in &batch.records {
                        if let Some(write) = ReplicaWrite::decode(bytes) {
                            out.entry(write.digest).or_default().insert(i, write);
                        }
                    }
                }
            }
        }
        out
    }

    /// Reads `key` at its master (the cluster is quiescent: no proxy, no
    /// duplicate resolution).
    fn final_read(&self, key: &str) -> Result<Option<i64>, Failure> {
        self.final_read_in(SET, key)
    }

    /// [`World::final_read`] of `key` in `set`.
    fn final_read_in(&self, set: &str, key: &str) -> Result<Option<i64>, Failure> {
        let digest = digest_in(set, key);
        let live = self.live();
        let via = live
            .first()
            .and_then(|i| self.nodes[*i].up.as_ref())
            .map(|up| up.service.cluster());
        let master = via
            .as_ref()
            .and_then(|c| c.namespace(NAMESPACE))
            .and_then(|m| m.map.master(digest.partition()));
        let node = master.and_then(|m| self.nodes.iter().position(|n| n.id == m));
        let Some(up) = node.and_then(|i| self.nodes[i].up.as_ref()) else {
            return Err(self.fail(Invariant::Placement, format!("no live master for {key}")));
        };
        let header = MsgHeader {
            info1: info1::READ | info1::GET_ALL,
            ..MsgHeader::default()
        };
        let frame = request_frame_in(set, key, header, None);
        let mut out = Vec::new();
        let proto = frame
            .get(..PROTO_HEADER_SIZE)
            .and_then(|h| <&[u8; PROTO_HEADER_SIZE]>::try_from(h).ok())
            .and_then(|h| ProtoHeader::decode(h).ok());
        let body = frame.get(PROTO_HEADER_SIZE..).unwrap_or_default();
        let handled = proto.map(|p| up.service.handle_streaming(p, body, &mut out));
        if !matches!(handled, Some(Ok(None))) {
            return Err(self.fail(
                Invariant::Quiescence,
                format!("final read of {key} at its master did not complete locally"),
            ));
        }
        match parse_reply(&out) {
            Some((0, value)) => Ok(value),
            Some((2, _)) => Ok(None),
            other => Err(self.fail(
                Invariant::ClientResult,
                format!("final read of {key}: {other:?}"),
            )),
        }
    }

    fn check(&mut self) -> Result<usize, Failure> {
        let live = self.live();
        let Some(state) = live
            .first()
            .and_then(|i| self.nodes[*i].up.as_ref())
            .map(|up| up.service.cluster())
        else {
            return Err(self.fail(Invariant::Quiescence, "no live node".into()));
        };
        let Some(map) = state.namespace(NAMESPACE) else {
            return Err(self.fail(Invariant::Placement, "no map".into()));
        };
        let copies = self.copies();
        self.check_copies(&copies, &map.map)?;
        self.check_counters()?;
        self.check_puts()?;
        self.check_truncation(&copies)?;
        Ok(copies.len())
    }

    /// (a) exactly the replicas hold each record; (b) byte for byte.
    fn check_copies(
        &mut self,
        copies: &BTreeMap<Digest, BTreeMap<usize, ReplicaWrite>>,
        map: &citrine_cluster::partition_map::PartitionMap,
    ) -> Result<(), Failure> {
        for (digest, holders) in copies {
            let replicas: BTreeSet<usize> = map
                .replicas(digest.partition())
                .iter()
                .filter_map(|id| self.nodes.iter().position(|n| n.id == *id))
                .collect();
            let held: BTreeSet<usize> = holders.keys().copied().collect();
            if held != replicas {
                return Err(self.fail(
                    Invariant::Placement,
                    format!(
                        "record {} (partition {}) is on {held:?}, its replicas are {replicas:?}",
                        hex(&digest.0),
                        digest.partition().index()
                    ),
                ));
            }
            let mut versions = holders.iter();
            if let Some((first_node, first)) = versions.next() {
                let bytes = first.encode();
                self.hash = mix(self.hash, crate::data::fnv(&bytes));
                for (node, other) in versions {
                    if other.encode() != bytes {
                        return Err(self.fail(
                            Invariant::ReplicaAgreement,
                            format!(
                                "record {} differs: #{first_node} gen {} lut {} vs #{node} gen {} lut {}",
                                hex(&digest.0),
                                first.generation,
                                first.last_update_ms,
                                other.generation,
                                other.last_update_ms
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// (c) for the counters: no acknowledged increment lost, none
    /// invented.
    fn check_counters(&mut self) -> Result<(), Failure> {
        for counter in 0..self.counters.len() {
            let value = self.final_read(&counter_key(counter))?.unwrap_or(0);
            self.judge_counter(counter, value)?;
        }
        Ok(())
    }

    /// Counter `counter` holds `value` at the end: at least its
    /// acknowledged increments, at most those plus the ones in doubt.
    fn judge_counter(&mut self, counter: usize, value: i64) -> Result<(), Failure> {
        {
            let h = self.counters[counter].clone();
            let value = u64::try_from(value).unwrap_or(u64::MAX);
            if value < h.acked {
                return Err(self.fail(
                    Invariant::LostWrite,
                    format!(
                        "counter {counter} is {value} after {} acknowledged increments ({} in doubt)",
                        h.acked, h.in_doubt
                    ),
                ));
            }
            if value > h.acked + h.in_doubt {
                return Err(self.fail(
                    Invariant::PhantomWrite,
                    format!(
                        "counter {counter} is {value}: {} acknowledged + {} in doubt increments",
                        h.acked, h.in_doubt
                    ),
                ));
            }
        }
        Ok(())
    }

    /// (c) for the puts and deletes: each key shows an attempt not older
    /// than its last acknowledged one, and one that was sent.
    fn check_puts(&mut self) -> Result<(), Failure> {
        for key in 0..self.puts.len() {
            let value = self.final_read(&put_key(key))?;
            self.judge_put(key, value)?;
        }
        Ok(())
    }

    /// Put key `key` holds `value` (`None`: absent) at the end: the effect
    /// of its last acknowledged attempt or of a later one.
    fn judge_put(&mut self, key: usize, value: Option<i64>) -> Result<(), Failure> {
        {
            let attempts = self.puts[key].clone();
            let last_acked = attempts.iter().rposition(|a| a.outcome == Outcome::Acked);
            // The attempt whose effect the key shows: the put of its value,
            // or (absent) the last delete not refused.
            let found = attempts
                .iter()
                .rposition(|a| a.value == value && a.outcome != Outcome::Failed);
            let ok = match (value, found) {
                // Absent with nothing acknowledged: no write to lose.
                (None, None) => last_acked.is_none(),
                (Some(_), None) => false,
                (_, Some(j)) => last_acked.is_none_or(|l| j >= l),
            };
            if !ok {
                let lost = match value {
                    None => true,
                    Some(_) => found.is_some_and(|j| Some(j) < last_acked),
                };
                let invariant = if lost {
                    Invariant::LostWrite
                } else {
                    Invariant::PhantomWrite
                };
                return Err(self.fail(
                    invariant,
                    format!(
                        "put key {key} holds {value:?} (attempt {found:?}); attempts {:?}",
                        attempts
                            .iter()
                            .map(|a| (a.value, a.outcome))
                            .collect::<Vec<_>>()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The [`Invariant::Truncation`] checks, when a truncation was issued.
    fn check_truncation(
        &self,
        copies: &BTreeMap<Digest, BTreeMap<usize, ReplicaWrite>>,
    ) -> Result<(), Failure> {
        let Some(truncation) = self.truncation else {
            return Ok(());
        };
        // The command's own entry (its first change of the set), not only
        // one taken from a copy: every member got the push.
        let line = format!(
            "namespace={NAMESPACE};set={TRUNCATED_SET};lut={};generation=1",
            truncation.lut_ms
        );
        for i in self.live() {
            let Some(up) = &self.nodes[i].up else {
                continue;
            };
            let known = up.service.dist().truncations_text();
            if !known.lines().any(|known| known == line) {
                return Err(self.fail(
                    Invariant::Truncation,
                    format!("#{i} does not know {line}: it knows {known:?}"),
                ));
            }
        }
        for (digest, holders) in copies {
            for (node, copy) in holders {
                if copy.set_name == TRUNCATED_SET.as_bytes()
                    && copy.body.is_some()
                    && copy.last_update_ms < truncation.lut_ms
                {
                    return Err(self.fail(
                        Invariant::Truncation,
                        format!(
                            "#{node} holds record {} of {TRUNCATED_SET}, last updated at {} (the threshold is {})",
                            hex(&digest.0),
                            copy.last_update_ms,
                            truncation.lut_ms
                        ),
                    ));
                }
            }
        }
        for key in 0..self.truncated_puts.len() {
            let attempts = &self.truncated_puts[key];
            let value = self.final_read_in(TRUNCATED_SET, &truncated_key(key))?;
            let found = value.and_then(|v| attempts.iter().position(|a| a.value == v));
            if let Some(j) = found {
                let attempt = &attempts[j];
                if attempt.outcome == Outcome::Acked
                    && attempt.done_at <= truncation.covers_acked_until
                {
                    return Err(self.fail(
                        Invariant::Truncation,
                        format!(
                            "truncated key {key} holds attempt {j}, acknowledged at {} ms, before the truncation at {} ms",
                            attempt.done_at, truncation.at
                        ),
                    ));
                }
            }
            // Puts sent after the truncation are after its threshold: the
            // last acknowledged one (or a later attempt) is what is held.
            let last_acked = attempts
                .iter()
                .rposition(|a| a.outcome == Outcome::Acked && a.sent_at > truncation.at);
            if let Some(last) = last_acked {
                let kept =
                    found.is_some_and(|j| j >= last && attempts[j].outcome != Outcome::Failed);
                if !kept {
                    return Err(self.fail(
                        Invariant::LostWrite,
                        format!(
                            "truncated key {key} holds {value:?} (attempt {found:?}); attempt {last}, sent after the truncation, was acknowledged; attempts (outcome, sent, done) {:?}",
                            attempts
                                .iter()
                                .map(|a| (a.outcome, a.sent_at, a.done_at))
                                .collect::<Vec<_>>()
                        ),
                    ));
                }
            } else if value.is_some() && found.is_none() {
                return Err(self.fail(
                    Invariant::PhantomWrite,
                    format!("truncated key {key} holds {value:?}, which no attempt wrote"),
                ));
            }
        }
        Ok(())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_seed_twice_same_trace() {
        let cfg = DataConfig::quick();
        let a = run_data_seed(1, &cfg).map_err(|f| f.to_string());
        let b = run_data_seed(1, &cfg).map_err(|f| f.to_string());
        assert_eq!(a, b, "seed 1 is not reproducible");
        let report = a.as_ref().map_err(String::as_str);
        assert!(
            report.is_ok_and(|r| r.acked > 0 && r.records > 0),
            "{report:?}"
        );
        let c = run_data_seed(2, &cfg).map(|r| r.trace_hash).ok();
        assert_ne!(
            a.map(|r| r.trace_hash).ok(),
            c,
            "different seeds should differ"
        );
    }

    /// A quiescent world and one record's copy on its master.
    fn quiescent(seed: u64) -> (World, usize, ReplicaWrite, Vec<usize>) {
        let mut world = World::new(seed, DataConfig::quick());
        let done = world.run_to_quiescence().map_err(|f| f.to_string());
        assert!(done.is_ok(), "{done:?}");
        let copies = world.copies();
        let digest = digest_in(SET, &counter_key(0));
        let holders = copies.get(&digest).cloned().unwrap_or_default();
        let (&master, write) = holders.iter().next().expect("counter 0 is stored");
        let others: Vec<usize> = world
            .live()
            .into_iter()
            .filter(|i| !holders.contains_key(i))
            .collect();
        (world, master, write.clone(), others)
    }

    fn plant(world: &World, node: usize, write: &ReplicaWrite) {
        let service = &world.nodes[node].up.as_ref().expect("live").service;
        let code = citrine_service::replication::apply_replica_write(service.dist(), write);
        assert_eq!(code, citrine_types::ResultCode::Ok);
    }

    #[test]
    fn the_checks_catch_planted_faults() {
        // A copy on a node that is not a replica (the first seed whose final
        // cluster has a node outside counter 0's replica list).
        let (mut world, _, write, others) = (1..40)
            .map(quiescent)
            .find(|(_, _, _, others)| !others.is_empty())
            .expect("a seed with a non-replica node");
        plant(&world, others[0], &write);
        let invariant = world.check().err().map(|f| f.invariant);
        assert_eq!(invariant, Some(Invariant::Placement));

        // Replicas that disagree.
        let (mut world, holder, mut write, _) = quiescent(2);
        write.last_update_ms += 1;
        plant(&world, holder, &write);
        let invariant = world.check().err().map(|f| f.invariant);
        assert_eq!(invariant, Some(Invariant::ReplicaAgreement));

        // An older counter value written over both copies: increments lost.
        let (mut world, _, write, _) = quiescent(2);
        let mut older = write.clone();
        older.last_update_ms += 1;
        let holders: Vec<usize> = world
            .copies()
            .get(&write.digest)
            .map(|h| h.keys().copied().collect())
            .unwrap_or_default();
        older.body = Some(small_counter_body(&write));
        for node in holders {
            plant(&world, node, &older);
        }
        let invariant = world.check().err().map(|f| f.invariant);
        assert_eq!(invariant, Some(Invariant::LostWrite));
    }

    /// The stored body of counter 0 holding the value 0, taken from a
    /// standalone service that ran one write.
    fn small_counter_body(like: &ReplicaWrite) -> Vec<u8> {
        let service = Service::new(
            ServiceConfig {
                node_id: 7,
                rack_id: 0,
                cluster_name: "c".into(),
                access_address: "x:1".into(),
                port: 1,
                tls_access_address: String::new(),
                namespaces: vec![NamespaceConfig::in_memory(NAMESPACE)],
            },
            Arc::new(citrine_service::ManualClock::new(BASE_UNIX_MS)),
        );
        let header = MsgHeader {
            info2: info2::WRITE,
            ..MsgHeader::default()
        };
        let frame = request_frame_in(SET, &counter_key(0), header, Some((op_type::WRITE, "n", 0)));
        let proto = frame
            .get(..PROTO_HEADER_SIZE)
            .and_then(|h| <&[u8; PROTO_HEADER_SIZE]>::try_from(h).ok())
            .and_then(|h| ProtoHeader::decode(h).ok())
            .expect("header");
        let mut out = Vec::new();
        assert!(service
            .handle(proto, &frame[PROTO_HEADER_SIZE..], &mut out)
            .is_ok());
        let digests = service
            .dist()
            .migration_digests(NAMESPACE, like.digest.partition());
        let (batch, _) =
            service
                .dist()
                .migration_batch(0, NAMESPACE, like.digest.partition(), &digests, 0);
        let write = batch
            .records
            .first()
            .and_then(|bytes| ReplicaWrite::decode(bytes))
            .expect("one record");
        write.body.expect("a body")
    }
}
