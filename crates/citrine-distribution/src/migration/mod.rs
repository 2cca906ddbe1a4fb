//! Migrations (001 §2.2.1): after every view change, the members exchange
//! their partition versions, each works out from them what it sends,
//! receives and drops, and records move until every replica of every
//! partition holds the merge of every distinct copy.
//!
//! This module owns the bookkeeping and the record work; [`driver`] runs
//! the exchange and the sending as an async loop over the
//! [`Fabric`](crate::replication::Fabric) (the server runs it on its own
//! thread, the simulator on its fake network).
//!
//! Versions ([`PartitionVersion`], defined in [`citrine_cluster::exchange`]
//! with the pure decision): per partition of each namespace, ZERO (no
//! copy), `full(K)` (the complete copy of the regime with cluster key `K`)
//! or `subset(K)` (a replica of regime `K` still being filled).
//!
//! The steps of one view (cluster key `K`):
//! 1. **Publish** ([`Distribution::plan_migrations`], synchronously with the
//!    view): this node snapshots its [`PartitionVersion`]s and record
//!    counts — what it answers every member's `EXCHANGE` call for `K` —
//!    and enters *exchanging*. A node alone resolves at once.
//! 2. **Exchange** (driver): it fetches every other member's snapshot for
//!    `K` (an `EXCHANGE` answer starts with [`exchange_status`]: READY and
//!    the snapshot with its lineages, NOT_YET, or STALE), retried until
//!    every member answered; [`Distribution::finish_exchange`] runs
//!    [`citrine_cluster::exchange::resolve`] for every partition — the same
//!    pure function on every node, so all agree — and applies this node's
//!    part: a replica that holds a copy equal to every distinct copy
//!    present is full at once (version `full(K)`), one that must receive is
//!    *filling* (`subset(K)`) until each expected source has delivered; a
//!    node that sends a group gets a task; a copy outside the new replica
//!    list is dropped once its group was delivered (at once when no replica
//!    needs it).
//! 3. **Send** (driver): tasks run hottest first (partitions whose records
//!    were asked for by duplicate resolution or acting-master reads here),
//!    then smallest first (§2.2.1.4), at most `migrate-max-partitions` at
//!    once, batch by batch with an ack each. A target that held some copy
//!    first sends its manifest (digest, generation, last-update time of
//!    every record) and receives only the records it lacks or holds older —
//!    the delta (§2.2.1.1); when its copy is one the source's contains (a
//!    restarted node's), the records it holds newer than the source's copy
//!    or tombstone, or alone and written recently enough that a delete's
//!    tombstone would still be kept (writes that reached only it), are
//!    fetched from it first ([`Distribution::migration_pulls`]), so the copies
//!    end equal. (A record the target holds, older than that window, that
//!    the source lacks may be one deleted at the source whose tombstone is
//!    gone: it is not fetched, and stays on that target alone — a known
//!    gap.) Records go in [`MigrateBatch`]es (at most [`BATCH_RECORDS`]
//!    records or [`BATCH_BYTES`], with the source's truncation thresholds
//!    of their sets) as `MIGRATE` calls, one awaiting its ack per partition
//!    and target; every batch, a partition's lone LAST included, first
//!    waits its turn under `migrate-max-records-per-sec` (node-wide,
//!    [`Migrations::throttle`]), and one that carried records is followed
//!    by `migrate-sleep` µs. The last batch of a source (possibly empty)
//!    carries [`FLAG_LAST`].
//! 4. **Apply** (receiver, [`Distribution::apply_migrate_batch`] on the
//!    fabric's serving path): every record with the replica-write rule
//!    (only when it wins under the namespace's conflict resolution), so
//!    client writes during migration are never regressed and resends are
//!    harmless. A LAST from an expected source completes that source; with
//!    none left the copy is `full(K)` and the partition stops filling.
//!    LASTs and `DROP`s that arrive before this node resolved its own
//!    exchange are remembered (an SC namespace's batches are refused until
//!    then: see below).
//! 5. **Retire**: when a group is delivered, its source tells the copies it
//!    covers outside the replica list to drop (`DROP`,
//!    [`Distribution::retire_copy`]), and drops its own copy when it is not
//!    a replica; a dropped copy's records and tombstones are removed and
//!    its version becomes ZERO. A copy a background job still has to walk
//!    is dropped only once the job walked it ([`JobPins`];
//!    `migrate_pinned_copies`).
//!
//! The throttles (`migrate-max-partitions`, `migrate-sleep`,
//! `migrate-max-records-per-sec`) are `[service]` settings that
//! `set-config:context=service;...` changes at run time. Statistics:
//! `migrate_tx/rx_partitions_remaining`, `migrate_records_sent/received/
//! skipped`, `migrate_partitions_sent/dropped`, `migrate_exchanges`,
//! `migrate_dupres_runs`, `migrate_acting_reads`.
//!
//! While a partition's master is filling, single-record transactions on it
//! run duplicate resolution first against exactly the sources it still
//! expects (the previous holders of the other versions); while exchanging,
//! against every member. When one copy exists and the master must receive
//! it — it held nothing (a node joined) or only a copy that one contains (a
//! view changed while it filled; see [`Covers`]) — that copy's holder is
//! the **acting master**: reads are
//! proxied to it and served from its copy without duplicate resolution,
//! and writes — still executed by the master after duplicate resolution —
//! are also replicated to it, so the reads it serves stay current
//! (§2.2.1.3). Both end when the master's last expected source delivered.
//!
//! Like the reference's working master, the acting master also *claims*
//! the partition's master column in its `replicas` answer while the master
//! cedes it ([`MasterClaim`]; each change bumps the partition generation
//! clients poll, the view's plus [`Migrations::claims_generation`]): clients send it the partition's reads, which it serves,
//! its scans and queries, which it serves from its whole copy instead of
//! the master refusing them while it fills (a scan checks each claimed
//! partition again once walked, and reports it unavailable if the claim
//! ended meanwhile), and its writes and read-touches, which it proxies to
//! the master. It gives the claim back just before it sends the
//! master its last batch ([`Handover`]): from then on writes the master
//! acknowledges may no longer reach its copy. Requests for all partitions
//! (no partition list: the official clients' aggregations) do not follow
//! claims — each node's share would be decided at a different moment — and
//! keep failing (11) while a master they need fills; an aggregation that
//! lists its partitions follows them, and fails (11) if a claim it used
//! ends before the partition's walk does.
//!
//! Each version carries its lineage ([`Lineage`]): the regimes whose full
//! copies the copy is known to contain. A replica filled (or full at once)
//! under `K` contains every full copy present at `K`'s exchange and their
//! lineages; a filling one keeps what it held. Copies of a regime another
//! full copy went through are replaced, not merged.
//!
//! Invariants:
//! - versions change only when an exchange completes (replicas), when a
//!   fill completes (`subset(K)` → `full(K)`) and when a copy is dropped
//!   (→ ZERO); the snapshot answered for `K` is the one taken at publish;
//! - a partition with no records is reported as ZERO (nothing to merge);
//!   records present without a version (loaded from a device at start)
//!   are reported with this boot's own key: an unknown lineage, merged;
//! - the request path checks one relaxed atomic per partition (plus one
//!   for the exchange) and takes the mutex only for partitions in
//!   migration;
//! - `tx_remaining`/`rx_remaining` are set synchronously with the publish,
//!   so `cluster-stable` never sees a view whose migrations are not
//!   counted yet;
//! - no lock is held across an await;
//! - a batch this node builds holds records of its own partition only
//!   (asserted, release builds too); a batch received is validated whole —
//!   every record decodes, is of the batch's namespace and partition and
//!   passes `ReplicaWrite::check` — before any record is applied, and one
//!   that is not is malformed input from its source: refused, counted
//!   (`peer_messages_malformed`), never a panic.
//!
//! Transactions (strong consistency, issue 40): a record's transaction
//! state (its provisional version, its monitor entry) travels in the batch
//! with its copy, taken under the same read lock ([`FLAG_TXN`],
//! [`MigrateBatch::txn`]; a wire change between nodes — an older node
//! refuses such a batch as malformed); a record only a transaction holds
//! goes as a marker without a generation, and a record holding state is
//! sent even to a target whose manifest has its version. The target fills
//! in only the state it lacks (`txn_replica::fill`), never the lock of a
//! transaction settled there (rolled since the batch was built). A copy
//! dropped or emptied loses its state with its records (its settled
//! entries stay). Duplicate resolution carries the state the same way
//! (`DupResAnswer::txn`).
//!
//! Deletes migrate too: a deleted record's tombstone (kept in the index
//! for `tomb-raider-eligible-age`) is listed in snapshots' counts,
//! manifests and batches as a delete marker, so a copy that missed the
//! delete cannot bring the record back.
//!
//! Strong-consistency namespaces (see [`crate::sc::partitions`]): the
//! snapshot ends with the members' SC versions, the exchange first decides
//! the view's SC map, and each partition then migrates over its
//! assignment's working replicas, not the AP map, merging only the copies
//! the decision trusts (a stale or evaded copy outside the list is dropped
//! at once; one on a replica is emptied by its holder while it resolves
//! the exchange, before it publishes the view's SC map, so before any
//! request of the view ran on it — each source first sends it `CLEAR`,
//! which waits for that resolution and empties nothing itself, and every
//! batch of the view waits for it too — the resolution empties a copy
//! that held nothing at the snapshot and took a batch early just the same);
//! an unavailable partition does not migrate and no copy of it is dropped.
//! A replica whose fill ends takes `fill_complete`, a copy retired after
//! delivery `drop_copies`.
//!
//! Across restarts a node keeps only the regime of the last view it
//! published ([`REGIME_FILE`], saved before the view takes effect): the
//! copies loaded at start are `subset(K)` of that regime (or of unknown
//! lineage, merged, without the file; the file is removed when it cannot
//! be written). Such a copy is contained in any full copy that went
//! through `K`, so it is replaced by delta — only what the restarted node
//! missed is sent to it, and the survivor first fetches the few records it
//! holds newer or alone (its unacknowledged last writes) — and the
//! survivor acts for the partitions the restarted node masters while it
//! fills ([`Distribution::keep_partition_lineage`]). Tombstones are not
//! kept across restarts (the device engine's own tombstones keep deleted
//! records dead locally).

pub mod driver;

use crate::cluster_state::ClusterState;
use crate::replication::ReplicaWrite;
use crate::sc::partitions::ScSection;
use crate::Distribution;
use citrine_cluster::exchange::{self, Covers, Holding, PartitionVersion};
use citrine_data::namespace::Version;
use citrine_data::txn::replica::{self as txn_replica, TxnCopy};
use citrine_types::{Digest, NodeId, PartitionId, ResultCode, DIGEST_SIZE, PARTITIONS};
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// The last batch of a source's delivery of a partition.
pub const FLAG_LAST: u8 = 1;
/// The first batch of a partition.
pub const FLAG_FIRST: u8 = 2;
/// The batch ends with the transaction state of some of its records
/// ([`MigrateBatch::txn`]); a batch without it is laid out as before it
/// existed.
pub const FLAG_TXN: u8 = 4;
/// Most records in one batch.
pub const BATCH_RECORDS: usize = 512;
/// A batch is closed once its records take this many bytes.
pub const BATCH_BYTES: usize = 1 << 20;
/// Default most partitions migrated at once by one node.
pub const MAX_PARTITIONS_DEFAULT: u32 = 4;
/// The file in the work directory naming the regime (cluster key) of the
/// latest view this node published, saved before the view takes effect:
/// the copies its devices hold contain no write of a later regime.
pub const REGIME_FILE: &str = "regime";

/// Status byte of an `EXCHANGE` answer.
pub mod exchange_status {
    /// The snapshot follows.
    pub const READY: u8 = 0;
    /// This node has not published that view yet: ask again.
    pub const NOT_YET: u8 = 1;
    /// This node has moved past that view.
    pub const STALE: u8 = 2;
}

/// A copy this node sends to some replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrateTask {
    pub namespace: String,
    pub partition: PartitionId,
    /// Replicas to fill, each with the version it held (ZERO: it has
    /// nothing, so no manifest is asked).
    pub targets: Vec<(NodeId, PartitionVersion)>,
    /// Nodes outside the replica list to tell to drop their copies once
    /// the targets are filled.
    pub retire: Vec<NodeId>,
    /// This node is not a replica: drop the copy once sent.
    pub drop_after: bool,
    /// Records when planned (the order key after hotness: smallest first).
    pub records: u64,
    /// Targets holding a copy no group comes from (one this copy contains,
    /// such as a restarted node's): the records they hold newer — writes
    /// that reached only them — are fetched before anything is sent. A
    /// target whose copy is a group of its own sends it instead.
    pub pull_from: Vec<NodeId>,
    /// Strong consistency: targets holding a copy the decision does not
    /// trust; each is asked (`CLEAR`,
    /// [`Distribution::clear_untrusted_copy`]) whether it emptied it (at
    /// its resolution of the exchange) before anything is sent to it.
    pub clear: Vec<NodeId>,
}

/// What the driver has to do next.
#[derive(Debug)]
pub enum Work {
    Idle,
    /// Fetch the snapshots of `peers` for `cluster_key`.
    Exchange {
        epoch: u64,
        cluster_key: u64,
        peers: Vec<NodeId>,
    },
    /// Send these copies.
    Send {
        epoch: u64,
        cluster_key: u64,
        tasks: Vec<MigrateTask>,
    },
}

/// The routing a master's request needs while its partition migrates.
#[derive(Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Execute here.
    Normal,
    /// Resolve the record against `sources` first.
    DupRes {
        cluster_key: u64,
        sources: Vec<NodeId>,
    },
    /// A read: let the acting master serve it.
    Acting(NodeId),
}

/// Per-partition flag bits read on the request path.
/// This node masters the partition and is filling it.
const ROUTE_FILLING: u8 = 1;
/// The partition has an acting master (kept on the master and on it).
const ROUTE_ACTING: u8 = 2;
/// This node's copy is filling, whatever its role.
const ROUTE_INCOMPLETE: u8 = 4;

/// Who claims a partition's master column in this node's `replicas`
/// answer while it migrates (the node clients send its reads, writes,
/// scans and queries to), as the reference's working master does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MasterClaim {
    /// No migration changes it: the partition map's master claims it.
    Ordinary,
    /// This node masters the partition but is filling it and another node
    /// holds the only copy: that acting master claims it meanwhile.
    Ceded,
    /// This node is the acting master and claims it: the master has not
    /// been sent the last batch yet, so every write reaches this copy.
    Acting,
    /// This node was the acting master and is sending the master its last
    /// batch: once the master is whole it stops replicating its writes
    /// here, so this copy serves no client request any more (they are
    /// refused or proxied, and tried again at the master).
    Releasing,
}

/// Where an acting master is in handing its claim back to the master.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Handover {
    /// Claiming (the master has not been sent its last batch).
    #[default]
    Claiming,
    /// The last batch to the master is on its way.
    Releasing,
    /// The master acknowledged its last batch: it claims the partition.
    Released,
}

/// The partitions background jobs still have to walk on this node, and the
/// copies whose drop waits for them. A job keeps the partitions its node
/// mastered when it started and walks them even after a view moved them
/// away (its writes then take the ordinary path to the new master): the
/// new master may have joined after the job started, or skipped the
/// partition as not its own, so this copy is the only place the job can
/// find those records. Dropping it would lose them from the job.
///
/// Invariant: a copy is dropped only when no job pins it; a drop asked
/// while pinned is done when the last pin is released, if no later plan
/// (view) has been made since: a later plan decides the copy's fate
/// anew (it may have to send it first), and asks again if it drops it.
#[derive(Debug, Default)]
pub struct JobPins {
    state: Mutex<PinState>,
}

#[derive(Debug, Default)]
struct PinState {
    /// Jobs still to walk each partition.
    counts: HashMap<(String, u16), u32>,
    /// Drops asked while pinned, with the plan epoch that asked.
    deferred: HashMap<(String, u16), u64>,
    /// Deferred drops whose last pin was released where no [`Distribution`]
    /// was at hand (a job ended early): done by
    /// [`Distribution::drop_released_copies`].
    due: Vec<(String, u16, u64)>,
}

impl JobPins {
    pub fn pin(&self, namespace: &str, partitions: impl Iterator<Item = u16>) {
        let mut state = self.state.lock();
        for partition in partitions {
            *state
                .counts
                .entry((namespace.to_owned(), partition))
                .or_default() += 1;
        }
    }

    /// Releases one pin; when a drop waited for it and no pin is left,
    /// the epoch of the plan that asked (the caller then drops the copy
    /// through [`Distribution::drop_deferred`]).
    pub fn unpin(&self, namespace: &str, partition: u16) -> Option<u64> {
        let mut state = self.state.lock();
        let key = (namespace.to_owned(), partition);
        match state.counts.get_mut(&key) {
            Some(count) if *count > 1 => {
                *count -= 1;
                None
            }
            Some(_) => {
                state.counts.remove(&key);
                state.deferred.remove(&key)
            }
            None => {
                debug_assert!(false, "a pin released twice");
                None
            }
        }
    }

    /// [`JobPins::unpin`] where the copy cannot be dropped at once: it is
    /// left for [`Distribution::drop_released_copies`].
    pub fn unpin_later(&self, namespace: &str, partition: u16) {
        if let Some(epoch) = self.unpin(namespace, partition) {
            self.state
                .lock()
                .due
                .push((namespace.to_owned(), partition, epoch));
        }
    }

    /// True when the copy is pinned: its drop, asked by plan `epoch`, is
    /// deferred until the last pin is released.
    fn defer_drop(&self, namespace: &str, partition: u16, epoch: u64) -> bool {
        let mut state = self.state.lock();
        let key = (namespace.to_owned(), partition);
        if !state.counts.contains_key(&key) {
            return false;
        }
        state.deferred.insert(key, epoch);
        true
    }

    /// Copies a job pinned that are not dropped yet (`migrate_pinned_copies`).
    pub fn deferred(&self) -> usize {
        self.state.lock().deferred.len()
    }
}

/// A copy's version and the regimes it is known to contain.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Lineage {
    pub version: PartitionVersion,
    pub covers: Covers,
}

impl Lineage {
    /// No copy.
    pub const ZERO: Lineage = Lineage {
        version: PartitionVersion::ZERO,
        covers: Covers::EMPTY,
    };
}

#[derive(Debug, Default, Clone)]
struct PartitionState {
    /// Sources still to deliver (this node is a replica being filled).
    expect: Vec<NodeId>,
    /// The partition's acting master (kept on the master and the acting
    /// master itself).
    acting: Option<NodeId>,
    /// Not a replica: drop the copy when this source delivered its group.
    drop_after: Option<NodeId>,
    /// This node is the partition's master.
    master: bool,
    /// On the acting master: where its claim of the master column is.
    handover: Handover,
    /// What this replica's copy contains once filled.
    covers_when_full: Covers,
}

impl PartitionState {
    fn master_claim(&self, self_id: NodeId) -> MasterClaim {
        match self.acting {
            Some(acting) if acting == self_id && !self.master => match self.handover {
                Handover::Claiming => MasterClaim::Acting,
                Handover::Releasing => MasterClaim::Releasing,
                Handover::Released => MasterClaim::Ordinary,
            },
            Some(_) if self.master && !self.expect.is_empty() => MasterClaim::Ceded,
            _ => MasterClaim::Ordinary,
        }
    }
}

#[derive(Debug, Default)]
struct State {
    cluster_key: u64,
    /// Other members of the view.
    peers: Vec<NodeId>,
    current: Option<Arc<ClusterState>>,
    /// The exchange of `cluster_key` is resolved.
    exchanged: bool,
    /// The exchange was handed to the driver.
    exchange_taken: bool,
    /// The answer to `EXCHANGE` for `cluster_key`.
    snapshot: Arc<Vec<u8>>,
    /// Per namespace, per partition: this node's copy's version and what
    /// it is known to contain.
    versions: HashMap<String, Vec<Lineage>>,
    /// Partitions in migration on this node.
    parts: HashMap<(String, u16), PartitionState>,
    /// Copies still to send.
    pending: HashSet<(String, u16)>,
    tasks: Vec<MigrateTask>,
    /// LAST batches and DROP calls that arrived before the exchange was
    /// resolved here.
    early_lasts: HashSet<(String, u16, NodeId)>,
    early_drops: HashSet<(String, u16, NodeId)>,
    /// Requests that needed a migrating partition here (hottest first).
    hits: HashMap<(String, u16), u64>,
}

/// A node's migration bookkeeping.
#[derive(Debug)]
pub struct Migrations {
    state: Mutex<State>,
    /// Held shared while a strong-consistency batch is checked against
    /// the view and applied, exclusively while an exchange is resolved
    /// (its copies emptied and dropped): a batch checked under one view
    /// lands before the next view's resolution or is refused by it, never
    /// in a copy that resolution emptied. Taken before `state`.
    sc_apply_gate: RwLock<()>,
    /// Per namespace (in service order), per partition: ROUTE_* bits.
    route: Vec<(String, Box<[AtomicU8]>)>,
    exchanging: AtomicBool,
    /// Bumped by every plan; running work whose epoch is stale stops.
    epoch: AtomicU64,
    /// Key of records held without a version (loaded at start).
    boot_key: u64,
    tx_remaining: AtomicU64,
    rx_remaining: AtomicU64,
    /// Duplicate resolutions run (a fetch from the other copies).
    pub dupres_runs: AtomicU64,
    /// Duplicate resolutions that could not complete (a source did not
    /// answer in time, or its copy could not be applied).
    pub dupres_failures: AtomicU64,
    /// Reads served as acting master.
    pub acting_reads: AtomicU64,
    /// Bumped whenever this node's claims of master columns change during
    /// a view (an acting master's claim begins or ends): added to the
    /// view's partition generation, so clients fetch `replicas` again.
    claims_generation: AtomicU64,
    /// Most partitions sent at once (`migrate-max-partitions`).
    pub max_partitions: AtomicU32,
    /// Pause after each acknowledged batch, microseconds (`migrate-sleep`).
    pub sleep_us: AtomicU32,
    /// Most records sent per second, 0 = no limit
    /// (`migrate-max-records-per-sec`).
    pub max_records_per_sec: AtomicU64,
    /// When the rate limit lets the next batch go, microseconds.
    throttle_next_us: Mutex<u64>,
    /// Records sent and acknowledged / received and applied.
    pub records_sent: AtomicU64,
    pub records_received: AtomicU64,
    /// Records a delta left out (the target already held them).
    pub records_skipped: AtomicU64,
    /// Records fetched from a target that held them newer (writes that
    /// reached only it; see [`Distribution::migration_pulls`]).
    pub records_pulled: AtomicU64,
    pub partitions_sent: AtomicU64,
    /// Copies dropped (no longer a replica).
    pub partitions_dropped: AtomicU64,
    pub exchanges: AtomicU64,
    /// Where the latest published regime is kept (see [`REGIME_FILE`]).
    regime_file: std::sync::OnceLock<std::path::PathBuf>,
    /// Partitions background jobs still walk here.
    pub pins: Arc<JobPins>,
}

impl Migrations {
    /// The bookkeeping of a node with these namespaces; `boot_key` marks
    /// the records it holds at start.
    pub fn new<'a>(namespaces: impl Iterator<Item = &'a str>, boot_key: u64) -> Migrations {
        let route = namespaces
            .map(|name| {
                (
                    name.to_owned(),
                    (0..PARTITIONS).map(|_| AtomicU8::new(0)).collect(),
                )
            })
            .collect();
        Migrations {
            state: Mutex::new(State::default()),
            sc_apply_gate: RwLock::new(()),
            route,
            exchanging: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
            boot_key: boot_key.max(1),
            tx_remaining: AtomicU64::new(0),
            rx_remaining: AtomicU64::new(0),
            dupres_runs: AtomicU64::new(0),
            dupres_failures: AtomicU64::new(0),
            acting_reads: AtomicU64::new(0),
            claims_generation: AtomicU64::new(0),
            max_partitions: AtomicU32::new(MAX_PARTITIONS_DEFAULT),
            sleep_us: AtomicU32::new(0),
            max_records_per_sec: AtomicU64::new(0),
            throttle_next_us: Mutex::new(0),
            records_sent: AtomicU64::new(0),
            records_received: AtomicU64::new(0),
            records_skipped: AtomicU64::new(0),
            records_pulled: AtomicU64::new(0),
            partitions_sent: AtomicU64::new(0),
            partitions_dropped: AtomicU64::new(0),
            exchanges: AtomicU64::new(0),
            regime_file: std::sync::OnceLock::new(),
            pins: Arc::new(JobPins::default()),
        }
    }

    /// The current epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Partitions this node still has to send.
    pub fn tx_remaining(&self) -> u64 {
        self.tx_remaining.load(Ordering::Relaxed)
    }

    /// Partitions this node is still filling.
    pub fn rx_remaining(&self) -> u64 {
        self.rx_remaining.load(Ordering::Relaxed)
    }

    /// True while the exchange of the current view is not resolved here.
    pub fn exchanging(&self) -> bool {
        self.exchanging.load(Ordering::Relaxed)
    }

    /// Partitions of `namespace` still to send / still filling.
    pub fn namespace_remaining(&self, namespace: &str) -> (u64, u64) {
        let state = self.state.lock();
        let tx = state
            .pending
            .iter()
            .filter(|(name, _)| name == namespace)
            .count() as u64;
        let rx = state
            .parts
            .iter()
            .filter(|((name, _), part)| name == namespace && !part.expect.is_empty())
            .count() as u64;
        (tx, rx)
    }

    /// This node's version of a partition.
    pub fn version(&self, namespace: &str, partition: PartitionId) -> PartitionVersion {
        let state = self.state.lock();
        state
            .versions
            .get(namespace)
            .and_then(|versions| versions.get(partition.index()))
            .map(|lineage| lineage.version)
            .unwrap_or_default()
    }

    /// What the driver has to do next (each exchange and each task list is
    /// handed out once).
    pub fn next_work(&self) -> Work {
        let mut state = self.state.lock();
        let epoch = self.epoch();
        if !state.exchanged {
            if state.exchange_taken || state.current.is_none() {
                return Work::Idle;
            }
            state.exchange_taken = true;
            return Work::Exchange {
                epoch,
                cluster_key: state.cluster_key,
                peers: state.peers.clone(),
            };
        }
        if state.tasks.is_empty() {
            return Work::Idle;
        }
        Work::Send {
            epoch,
            cluster_key: state.cluster_key,
            tasks: std::mem::take(&mut state.tasks),
        }
    }

    fn route_flags(&self, namespace: &str) -> Option<&[AtomicU8]> {
        self.route
            .iter()
            .find(|(name, _)| name == namespace)
            .map(|(_, flags)| &flags[..])
    }

    fn set_route(&self, namespace: &str, partition: u16, part: Option<&PartitionState>) {
        let bits = part.map_or(0, |part| {
            let mut bits = 0;
            if part.master && !part.expect.is_empty() {
                bits |= ROUTE_FILLING;
            }
            if !part.expect.is_empty() {
                bits |= ROUTE_INCOMPLETE;
            }
            if part.acting.is_some() {
                bits |= ROUTE_ACTING;
            }
            bits
        });
        if let Some(flag) = self
            .route_flags(namespace)
            .and_then(|flags| flags.get(usize::from(partition)))
        {
            flag.store(bits, Ordering::Release);
        }
    }

    fn route_bits(&self, namespace: &str, partition: PartitionId) -> u8 {
        self.route_flags(namespace)
            .and_then(|flags| flags.get(partition.index()))
            .map_or(0, |flag| flag.load(Ordering::Acquire))
    }

    /// How the master runs a request on `partition` (see the module doc).
    /// Two relaxed loads when the partition is not migrating.
    #[inline]
    pub fn disposition(&self, namespace: &str, partition: PartitionId, read: bool) -> Disposition {
        let exchanging = self.exchanging.load(Ordering::Relaxed);
        if !exchanging && self.route_bits(namespace, partition) == 0 {
            return Disposition::Normal;
        }
        let mut state = self.state.lock();
        let key = (namespace.to_owned(), partition.index() as u16);
        if !state.exchanged {
            return Disposition::DupRes {
                cluster_key: state.cluster_key,
                sources: state.peers.clone(),
            };
        }
        let cluster_key = state.cluster_key;
        let Some(part) = state.parts.get(&key).cloned() else {
            return Disposition::Normal;
        };
        if !part.master || part.expect.is_empty() {
            return Disposition::Normal;
        }
        *state.hits.entry(key).or_default() += 1;
        match part.acting {
            Some(acting) if read => Disposition::Acting(acting),
            _ => Disposition::DupRes {
                cluster_key,
                sources: part.expect,
            },
        }
    }

    /// True when this node's copy of `partition` is whole as far as
    /// migrations know: the view's exchange is resolved and the partition
    /// is not being filled here (as master or replica). One or two relaxed
    /// loads.
    pub fn serves_whole(&self, namespace: &str, partition: PartitionId) -> bool {
        !self.exchanging.load(Ordering::Relaxed)
            && self.route_bits(namespace, partition) & ROUTE_INCOMPLETE == 0
    }

    /// The acting master a filling master also replicates its writes to
    /// (callers skip it when it is a replica anyway).
    #[inline]
    pub fn acting_target(&self, namespace: &str, partition: PartitionId) -> Option<NodeId> {
        if self.route_bits(namespace, partition) & ROUTE_ACTING == 0 {
            return None;
        }
        let state = self.state.lock();
        let part = state
            .parts
            .get(&(namespace.to_owned(), partition.index() as u16))?;
        (part.master && !part.expect.is_empty())
            .then_some(part.acting)
            .flatten()
    }

    /// True when this node (`self_id`) is the acting master of `partition`
    /// and still holds its copy: it serves the reads its master proxies.
    pub fn is_acting(&self, namespace: &str, partition: PartitionId, self_id: NodeId) -> bool {
        if self.route_bits(namespace, partition) & ROUTE_ACTING == 0 {
            return false;
        }
        let mut state = self.state.lock();
        let key = (namespace.to_owned(), partition.index() as u16);
        let acting = state
            .parts
            .get(&key)
            .is_some_and(|part| part.acting == Some(self_id));
        if acting {
            *state.hits.entry(key).or_default() += 1;
        }
        acting
    }

    /// Who claims `partition`'s master column, as far as this node
    /// (`self_id`) knows (see [`MasterClaim`]). One relaxed load when the
    /// partition has no acting master.
    #[inline]
    pub fn master_claim(
        &self,
        namespace: &str,
        partition: PartitionId,
        self_id: NodeId,
    ) -> MasterClaim {
        if self.route_bits(namespace, partition) & ROUTE_ACTING == 0 {
            return MasterClaim::Ordinary;
        }
        let state = self.state.lock();
        state
            .parts
            .get(&(namespace.to_owned(), partition.index() as u16))
            .map_or(MasterClaim::Ordinary, |part| part.master_claim(self_id))
    }

    /// The partitions of `namespace` whose master column this node
    /// (`self_id`) cedes to an acting master, and those it claims as one,
    /// each in ascending order.
    pub fn claim_overrides(
        &self,
        namespace: &str,
        self_id: NodeId,
    ) -> (Vec<PartitionId>, Vec<PartitionId>) {
        let state = self.state.lock();
        let (mut ceded, mut taken) = (Vec::new(), Vec::new());
        for ((name, partition), part) in &state.parts {
            if name != namespace {
                continue;
            }
            let Some(partition) = PartitionId::new(*partition) else {
                continue;
            };
            match part.master_claim(self_id) {
                MasterClaim::Ceded => ceded.push(partition),
                MasterClaim::Acting => taken.push(partition),
                MasterClaim::Ordinary | MasterClaim::Releasing => {}
            }
        }
        ceded.sort_unstable();
        taken.sort_unstable();
        (ceded, taken)
    }

    /// How many times this node's master-column claims changed within
    /// views (see `claims_generation`).
    pub fn claims_generation(&self) -> u64 {
        self.claims_generation.load(Ordering::Acquire)
    }

    /// The acting master (`self_id`) of `partition` is about to send the
    /// master its last batch (`to`: [`Handover::Releasing`]) or has had it
    /// acknowledged ([`Handover::Released`]), under plan `epoch`.
    pub fn hand_over(
        &self,
        epoch: u64,
        namespace: &str,
        partition: PartitionId,
        self_id: NodeId,
        to: Handover,
    ) {
        let mut state = self.state.lock();
        if self.epoch() != epoch {
            return;
        }
        let key = (namespace.to_owned(), partition.index() as u16);
        let Some(part) = state.parts.get_mut(&key) else {
            return;
        };
        if part.acting != Some(self_id) || part.master || part.handover == to {
            return;
        }
        debug_assert!(
            to != Handover::Claiming,
            "a claim handed back is not taken again within a view"
        );
        part.handover = to;
        self.claims_generation.fetch_add(1, Ordering::AcqRel);
    }

    /// A duplicate-resolution request for `partition` was served here.
    pub fn hit(&self, namespace: &str, partition: u16) {
        let mut state = self.state.lock();
        let key = (namespace.to_owned(), partition);
        if state.pending.contains(&key) {
            *state.hits.entry(key).or_default() += 1;
        }
    }

    /// The position in `queue` (in plan order: smallest first) of the task
    /// to send next: the hottest, the first among equals. One lock; no
    /// lookups while nothing is hot.
    pub fn hottest(&self, queue: &[MigrateTask]) -> usize {
        let state = self.state.lock();
        if state.hits.is_empty() {
            return 0;
        }
        let mut best = (0, 0u64);
        for (at, task) in queue.iter().enumerate() {
            let hits = state
                .hits
                .get(&(task.namespace.clone(), task.partition.index() as u16))
                .copied()
                .unwrap_or(0);
            if hits > best.1 {
                best = (at, hits);
            }
        }
        best.0
    }

    /// The answer to an `EXCHANGE` call for `cluster_key`.
    pub fn exchange_answer(&self, cluster_key: u64) -> Vec<u8> {
        let state = self.state.lock();
        if state.current.is_none() || state.cluster_key != cluster_key {
            // A key this node has not published yet, or one it left.
            let newer = state.current.is_some() && state.cluster_key != cluster_key;
            let status = if newer && state.exchanged {
                exchange_status::STALE
            } else {
                exchange_status::NOT_YET
            };
            return vec![status];
        }
        let mut out = Vec::with_capacity(1 + state.snapshot.len());
        out.push(exchange_status::READY);
        out.extend_from_slice(&state.snapshot);
        out
    }

    /// Marks a copy of plan `epoch` sent.
    pub fn finished(&self, epoch: u64, namespace: &str, partition: PartitionId) {
        let mut state = self.state.lock();
        if self.epoch() != epoch {
            return;
        }
        let key = (namespace.to_owned(), partition.index() as u16);
        if state.pending.remove(&key) {
            self.partitions_sent.fetch_add(1, Ordering::Relaxed);
        }
        state.hits.remove(&key);
        self.tx_remaining
            .store(state.pending.len() as u64, Ordering::Relaxed);
    }

    /// How long to wait before sending `records` more under the
    /// `migrate-max-records-per-sec` limit (asked just before they go; the
    /// records are counted as sent at the end of the wait).
    pub fn throttle(&self, records: u64, now_us: u64) -> std::time::Duration {
        let rate = self.max_records_per_sec.load(Ordering::Relaxed);
        if rate == 0 || records == 0 {
            return std::time::Duration::ZERO;
        }
        let mut next = self.throttle_next_us.lock();
        let start = (*next).max(now_us);
        *next = start + records.saturating_mul(1_000_000) / rate;
        std::time::Duration::from_micros(start - now_us)
    }

    /// Installs a resolved exchange's tasks (smallest first) and marks the
    /// exchange resolved: pending sends, the claims of acting masters, the
    /// counts `cluster-stable` reads.
    fn install_plan(&self, state: &mut State, mut tasks: Vec<MigrateTask>) {
        tasks.sort_by_key(|task| (task.records, task.partition.index()));
        state.pending = tasks
            .iter()
            .map(|task| (task.namespace.clone(), task.partition.index() as u16))
            .collect();
        state.tasks = tasks;
        if state.parts.values().any(|part| part.acting.is_some()) {
            // Acting masters claim what their masters cede.
            self.claims_generation.fetch_add(1, Ordering::AcqRel);
        }
        state.exchanged = true;
        state.early_lasts.clear();
        state.early_drops.clear();
        self.update_counts(state);
        self.exchanges.fetch_add(1, Ordering::Relaxed);
    }

    fn update_counts(&self, state: &State) {
        self.tx_remaining
            .store(state.pending.len() as u64, Ordering::Relaxed);
        let filling = state
            .parts
            .values()
            .filter(|part| !part.expect.is_empty())
            .count();
        self.rx_remaining.store(filling as u64, Ordering::Relaxed);
    }
}

/// A namespace's snapshot: `u8 ns len | ns | u16 count | count × (u16
/// partition | u64 ckey | u8 flags | u64 records | u8 covers | covers ×
/// u64 ckey)`, big-endian; the snapshot is the namespaces one after
/// another.
fn encode_snapshot(out: &mut Vec<u8>, namespace: &str, holdings: &[(u16, Lineage, u64)]) {
    let name = &namespace.as_bytes()[..namespace.len().min(255)];
    out.push(name.len() as u8);
    out.extend_from_slice(name);
    out.extend_from_slice(&(holdings.len() as u16).to_be_bytes());
    for (partition, lineage, records) in holdings {
        out.extend_from_slice(&partition.to_be_bytes());
        out.extend_from_slice(&lineage.version.ckey.to_be_bytes());
        out.push(lineage.version.flags());
        out.extend_from_slice(&records.to_be_bytes());
        out.push(lineage.covers.len() as u8);
        for ckey in lineage.covers.iter() {
            out.extend_from_slice(&ckey.to_be_bytes());
        }
    }
}

/// A member's snapshot: per namespace, its holdings, and the SC section
/// that ends it when the member has strong-consistency namespaces (see
/// [`crate::sc::partitions`]: a name length of 0 marks it).
#[derive(Default)]
struct Snapshot {
    namespaces: HashMap<String, Vec<(u16, Lineage, u64)>>,
    sc: ScSection,
}

/// Decodes a snapshot; `None` when malformed.
fn decode_snapshot(bytes: &[u8]) -> Option<Snapshot> {
    let mut at = 0usize;
    let mut snapshot = Snapshot::default();
    loop {
        let Some(&length) = bytes.get(at) else {
            return Some(snapshot);
        };
        if length == 0 {
            snapshot.sc = crate::sc::partitions::decode_section(bytes.get(at + 1..)?)?;
            return Some(snapshot);
        }
        let (namespace, used) = decode_namespace(bytes.get(at..)?)?;
        at += used;
        snapshot.namespaces.insert(namespace.0, namespace.1);
    }
}

/// One namespace's holdings in a snapshot.
type NamespaceHoldings = (String, Vec<(u16, Lineage, u64)>);

/// One namespace's part of a snapshot and the bytes it took.
fn decode_namespace(bytes: &[u8]) -> Option<(NamespaceHoldings, usize)> {
    let mut at = 0usize;
    let mut take = |length: usize| -> Option<&[u8]> {
        let slice = bytes.get(at..at.checked_add(length)?)?;
        at += length;
        Some(slice)
    };
    let length = take(1)?;
    let name = std::str::from_utf8(take(usize::from(length[0]))?)
        .ok()?
        .to_owned();
    let count = u16::from_be_bytes(take(2)?.try_into().ok()?);
    let mut holdings = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let partition = u16::from_be_bytes(take(2)?.try_into().ok()?);
        let ckey = u64::from_be_bytes(take(8)?.try_into().ok()?);
        let version = PartitionVersion::from_wire(ckey, take(1)?[0])?;
        let records = u64::from_be_bytes(take(8)?.try_into().ok()?);
        let covered = usize::from(take(1)?[0]);
        if usize::from(partition) >= PARTITIONS
            || version.is_zero()
            || covered > exchange::COVERS_MAX
        {
            return None;
        }
        let mut covers = Covers::EMPTY;
        for _ in 0..covered {
            let ckey = u64::from_be_bytes(take(8)?.try_into().ok()?);
            if ckey == 0 || covers.contains(ckey) {
                return None;
            }
            covers.extend([ckey]);
        }
        holdings.push((partition, Lineage { version, covers }, records));
    }
    Some(((name, holdings), at))
}

/// What resolving an exchange leaves to do once the state is unlocked:
/// copies to drop and groups to send.
#[derive(Default)]
struct ExchangePlan {
    drops: Vec<(String, PartitionId)>,
    /// Strong consistency: copies outside the replica list that no fill
    /// may merge (stale or evaded), dropped at once without inducting
    /// their holder.
    untrusted_drops: Vec<(String, PartitionId)>,
    tasks: Vec<MigrateTask>,
}

/// One partition of one namespace as an exchange resolves it.
struct PartitionExchange<'a> {
    name: &'a str,
    partition: PartitionId,
    /// The partition's replicas in the new view, master first.
    replicas: &'a [NodeId],
    /// Every member's copy of it.
    held: &'a [Holding],
    cluster_key: u64,
    /// Strong consistency: replicas holding a copy the fill may not merge.
    untrusted: &'a [NodeId],
}

/// Per partition of namespace `name`, every member's copy as the
/// snapshots list them.
fn holdings_of(name: &str, snapshots: &[(NodeId, Snapshot)]) -> Vec<Vec<Holding>> {
    let mut holdings: Vec<Vec<Holding>> = vec![Vec::new(); PARTITIONS];
    for (node, snapshot) in snapshots {
        for (partition, lineage, records) in snapshot.namespaces.get(name).into_iter().flatten() {
            if let Some(list) = holdings.get_mut(usize::from(*partition)) {
                list.push(Holding {
                    node: *node,
                    version: lineage.version,
                    records: *records,
                    covers: lineage.covers,
                });
            }
        }
    }
    holdings
}

/// The regime a [`REGIME_FILE`] names; `None` when it names none.
pub fn parse_regime(text: &str) -> Option<u64> {
    let key = text.trim().strip_prefix("citrine-regime 1 ")?;
    u64::from_str_radix(key, 16).ok().filter(|key| *key != 0)
}

impl Distribution {
    /// Keeps the regime of every view this node publishes in `directory`
    /// from now on ([`REGIME_FILE`]), and gives the copies loaded at start
    /// the lineage the file names: `subset(K)`, `K` the last regime saved.
    /// A copy of that regime is then known to be contained in any full
    /// copy that went through `K` (it is replaced, not merged, and that
    /// copy's holder may act for this node while it fills); without the
    /// file, loaded copies are of unknown lineage and merged. Call it once,
    /// after the devices are loaded and before the first view.
    pub fn keep_partition_lineage(&self, directory: &std::path::Path) -> Result<(), String> {
        let path = directory.join(REGIME_FILE);
        let text = crate::smd::read(&path)?;
        let migrations = &self.migrations;
        if migrations.regime_file.set(path.clone()).is_err() {
            return Err("the regime file is already set".to_owned());
        }
        let Some(regime) = parse_regime(&text) else {
            if !text.is_empty() {
                tracing::warn!(
                    file = %path.display(),
                    "regime file not understood: the copies loaded are merged as of unknown lineage"
                );
            }
            return Ok(());
        };
        let mut state = migrations.state.lock();
        let mut copies = 0usize;
        for namespace in self.namespaces() {
            let versions = state
                .versions
                .entry(namespace.config.name.clone())
                .or_insert_with(|| vec![Lineage::ZERO; PARTITIONS]);
            for partition in PartitionId::all() {
                let held = {
                    let index = namespace.index.partition(partition).read();
                    index.len() + index.tombstone_count() > 0
                };
                if held {
                    // Never full: the device may have lost its last
                    // writes, and this node claims to contain nothing.
                    versions[partition.index()] = Lineage {
                        version: PartitionVersion::subset(regime),
                        covers: Covers::EMPTY,
                    };
                    copies += 1;
                }
            }
        }
        tracing::info!(
            regime = format!("{regime:x}"),
            copies,
            "copies loaded belong to the last regime saved"
        );
        Ok(())
    }

    /// Saves the regime of a view about to be published (see
    /// [`Distribution::keep_partition_lineage`]). A view cannot wait for a
    /// disk, so when the file cannot be written it is removed: the copies
    /// are then of unknown lineage at the next start, never of a regime
    /// older than their writes.
    pub fn save_regime(&self, cluster_key: u64) {
        let Some(path) = self.migrations.regime_file.get() else {
            return;
        };
        if let Err(error) =
            crate::smd::save_atomically(path, &format!("citrine-regime 1 {cluster_key:x}\n"))
        {
            let removed = std::fs::remove_file(path);
            tracing::error!(
                removed = removed.is_ok(),
                "{error}: the copies held will be merged as of unknown lineage after a restart"
            );
        }
    }

    /// Starts the migrations of a newly published view (see the module
    /// doc): snapshot, then exchange (at once when alone).
    pub fn plan_migrations(&self, published: Arc<ClusterState>) {
        let migrations = &self.migrations;
        let mut snapshot = Vec::new();
        let mut own = Snapshot::default();
        let mut state = migrations.state.lock();
        for namespace in self.namespaces() {
            let name = &namespace.config.name;
            let versions = state
                .versions
                .entry(name.clone())
                .or_insert_with(|| vec![Lineage::ZERO; PARTITIONS]);
            let mut holdings = Vec::new();
            for partition in PartitionId::all() {
                let records = {
                    let index = namespace.index.partition(partition).read();
                    (index.len() + index.tombstone_count()) as u64
                };
                if records == 0 {
                    continue;
                }
                let lineage = match versions[partition.index()] {
                    lineage if lineage.version.is_zero() => Lineage {
                        version: PartitionVersion::full(migrations.boot_key),
                        covers: Covers::EMPTY,
                    },
                    lineage => lineage,
                };
                holdings.push((partition.index() as u16, lineage, records));
            }
            encode_snapshot(&mut snapshot, name, &holdings);
            own.namespaces.insert(name.clone(), holdings);
        }
        // Strong-consistency namespaces' versions last (nothing without).
        own.sc = self.sc_section();
        crate::sc::partitions::encode_section(&mut snapshot, &own.sc);
        let alone = published.members.len() <= 1;
        state.cluster_key = published.cluster_key;
        state.peers = published.peers().map(|member| member.node_id).collect();
        state.snapshot = Arc::new(snapshot);
        state.exchanged = false;
        state.exchange_taken = false;
        state.pending.clear();
        state.tasks.clear();
        state.early_lasts.clear();
        state.early_drops.clear();
        state.hits.clear();
        // Exchanging first, so no request runs unresolved in between.
        migrations.exchanging.store(!alone, Ordering::Relaxed);
        for (name, partition) in state.parts.keys() {
            migrations.set_route(name, *partition, None);
        }
        if state.parts.values().any(|part| part.acting.is_some()) {
            migrations.claims_generation.fetch_add(1, Ordering::AcqRel);
        }
        state.parts.clear();
        state.current = Some(published);
        // Until resolved, anything may move: count the exchange as work
        // left, so `cluster-stable` waits for it.
        migrations.tx_remaining.store(0, Ordering::Relaxed);
        migrations.rx_remaining.store(0, Ordering::Relaxed);
        migrations.epoch.fetch_add(1, Ordering::AcqRel);
        drop(state);
        if alone {
            let epoch = migrations.epoch();
            self.resolve_exchange(epoch, vec![(self.node_id, own)]);
        }
    }

    /// Resolves the exchange of plan `epoch` with the other members'
    /// `EXCHANGE` answers (status byte included); false when an answer is
    /// malformed or the plan moved on.
    pub fn finish_exchange(&self, epoch: u64, answers: Vec<(NodeId, Vec<u8>)>) -> bool {
        let mut snapshots = Vec::with_capacity(answers.len() + 1);
        for (node, answer) in answers {
            let Some((&exchange_status::READY, body)) = answer.split_first() else {
                return false;
            };
            let Some(snapshot) = decode_snapshot(body) else {
                tracing::warn!(node = %node, "malformed partition-version snapshot");
                return false;
            };
            snapshots.push((node, snapshot));
        }
        let own = {
            let state = self.migrations.state.lock();
            match decode_snapshot(&state.snapshot) {
                Some(own) => own,
                None => return false,
            }
        };
        snapshots.push((self.node_id, own));
        self.resolve_exchange(epoch, snapshots)
    }

    /// Resolves the exchange of plan `epoch` from every member's snapshot
    /// (this node's included): validate that the plan still stands, resolve
    /// every partition, install the resulting bookkeeping, then drop the
    /// copies no replica needs and report. False when the plan moved on.
    fn resolve_exchange(&self, epoch: u64, snapshots: Vec<(NodeId, Snapshot)>) -> bool {
        let migrations = &self.migrations;
        // No SC batch is between its view check and its apply while
        // copies are emptied and dropped here.
        let _gate = migrations.sc_apply_gate.write();
        let mut state = migrations.state.lock();
        if migrations.epoch() != epoch || state.exchanged {
            return false;
        }
        let Some(current) = state.current.clone() else {
            return false;
        };
        let cluster_key = current.cluster_key;
        self.publish_sc_maps(&current, &snapshots);
        let mut plan = ExchangePlan::default();
        for namespace in self.namespaces() {
            let name = namespace.config.name.as_str();
            let Some(map) = current.namespace(name) else {
                continue;
            };
            let holdings = holdings_of(name, &snapshots);
            for partition in PartitionId::all() {
                // An SC partition moves only where its assignment says, and
                // not at all while unavailable (no copy is dropped then).
                let held = &holdings[partition.index()];
                let (replicas, trusted) =
                    match (namespace.config.sc.strong_consistency, map.sc.get()) {
                        (false, _) => (map.map.replicas(partition), None),
                        (true, Some(sc)) if sc.is_available(partition) => {
                            let trusted =
                                self.trusted_holdings(&mut plan, name, partition, sc, held);
                            (sc.replicas(partition), Some(trusted))
                        }
                        (true, _) => continue,
                    };
                let (held, untrusted) = match &trusted {
                    Some((held, untrusted)) => (held.as_slice(), untrusted.as_slice()),
                    None => (held.as_slice(), &[][..]),
                };
                let at = PartitionExchange {
                    name,
                    partition,
                    replicas,
                    held,
                    cluster_key,
                    untrusted,
                };
                self.resolve_partition(&mut state, &mut plan, &at);
            }
        }
        let drops = std::mem::take(&mut plan.drops);
        migrations.install_plan(&mut state, plan.tasks);
        let planned = state.pending.len();
        let filling = migrations.rx_remaining();
        drop(state);
        for (name, partition) in &drops {
            self.drop_copy(name, *partition);
        }
        for (name, partition) in &plan.untrusted_drops {
            self.drop_copy_as(name, *partition, false);
        }
        // Only now (drops done) may `cluster-stable` report the view.
        migrations.exchanging.store(false, Ordering::Relaxed);
        self.exchange_resolved();
        if planned > 0 || filling > 0 || !drops.is_empty() {
            tracing::info!(
                send = planned,
                receive = filling,
                dropped = drops.len(),
                cluster_key = format!("{cluster_key:x}"),
                "partition versions exchanged"
            );
        }
        true
    }

    /// Strong consistency: the holdings of `partition` its fill may merge
    /// (those of the SC map's trusted copies), and the replicas holding an
    /// untrusted copy (emptied before their fill). This node's own
    /// untrusted copy outside the replica list is dropped at once.
    fn trusted_holdings(
        &self,
        plan: &mut ExchangePlan,
        name: &str,
        partition: PartitionId,
        sc: &crate::sc::partitions::ScMap,
        held: &[Holding],
    ) -> (Vec<Holding>, Vec<NodeId>) {
        let trusted = sc.trusted(partition);
        let replicas = sc.replicas(partition);
        let untrusted: Vec<NodeId> = held
            .iter()
            .map(|holding| holding.node)
            .filter(|node| !trusted.contains(node))
            .collect();
        if untrusted.contains(&self.node_id) && !replicas.contains(&self.node_id) {
            plan.untrusted_drops.push((name.to_owned(), partition));
        }
        let kept = held
            .iter()
            .filter(|holding| trusted.contains(&holding.node))
            .copied()
            .collect();
        let untrusted_replicas = untrusted
            .into_iter()
            .filter(|node| replicas.contains(node))
            .collect();
        (kept, untrusted_replicas)
    }

    /// Decides the view's strong-consistency namespaces from the members'
    /// SC sections and publishes their maps in `current` (see
    /// [`crate::sc::partitions`]); clients are told to fetch `replicas`
    /// again.
    fn publish_sc_maps(&self, current: &ClusterState, snapshots: &[(NodeId, Snapshot)]) {
        let sections: Vec<(NodeId, &ScSection)> = snapshots
            .iter()
            .map(|(node, snapshot)| (*node, &snapshot.sc))
            .collect();
        let maps = self.decide_sc(current.cluster_key, &sections);
        if maps.is_empty() {
            return;
        }
        for (name, map) in maps {
            self.empty_untrusted_copies(&name, &map);
            if let Some(namespace) = current.namespace(&name) {
                tracing::info!(
                    namespace = %name,
                    regime = map.regime,
                    unavailable = map.unavailable,
                    dead = map.dead,
                    "strong-consistency partitions decided"
                );
                let _ = namespace.sc.set(map);
            }
        }
        self.migrations
            .claims_generation
            .fetch_add(1, Ordering::AcqRel);
    }

    /// Strong consistency: empties this node's copy of every partition of
    /// `name` that `map` serves with this node as a replica but does not
    /// trust (a stale or evaded copy; see
    /// [`crate::sc::availability::trusted_copies`]). Runs while the
    /// exchange is resolved, under the migration state's lock and before
    /// `map` is published: no request of the view has run on the partition
    /// yet (without its map every SC request answers 11 and every SC
    /// replica write is refused) and no batch of the view has landed (a
    /// source's `CLEAR` waits for the resolution), so nothing the view
    /// served is lost, and the copy the fill builds holds trusted records
    /// only.
    fn empty_untrusted_copies(&self, name: &str, map: &crate::sc::partitions::ScMap) {
        let Some(namespace) = self.namespace(name.as_bytes()) else {
            return;
        };
        let mut emptied = 0usize;
        for partition in PartitionId::all() {
            if !map.replicas(partition).contains(&self.node_id)
                || map.trusted(partition).contains(&self.node_id)
            {
                continue;
            }
            let mut index = namespace.index.partition(partition).write();
            if index.len() + index.tombstone_count() > 0 {
                remove_every_record(namespace, partition, &mut index);
                emptied += 1;
            }
        }
        if emptied > 0 {
            tracing::debug!(
                namespace = name,
                partitions = emptied,
                "untrusted SC copies emptied before the view serves them"
            );
        }
    }

    /// Applies this node's part of one partition's exchange outcome: its
    /// version and what it still expects as a replica, its drop as a
    /// holder outside the replica list, the acting master, and the groups
    /// it sends. A partition with work left is entered in `state.parts`
    /// and routed through the migration path.
    fn resolve_partition(
        &self,
        state: &mut State,
        plan: &mut ExchangePlan,
        at: &PartitionExchange<'_>,
    ) {
        let outcome = exchange::resolve(at.replicas, at.held);
        let (mine, my_covers) = at
            .held
            .iter()
            .find(|holding| holding.node == self.node_id)
            .map(|holding| (holding.version, holding.covers))
            .unwrap_or_default();
        let mut part = PartitionState {
            master: at.replicas.first() == Some(&self.node_id),
            ..PartitionState::default()
        };
        let replica = at.replicas.contains(&self.node_id);
        if replica {
            let lineage =
                self.fill_as_replica(state, &mut part, at, &outcome, my_covers.after(mine));
            if let Some(versions) = state.versions.get_mut(at.name) {
                versions[at.partition.index()] = lineage;
            }
        } else if !mine.is_zero() {
            self.plan_drop(state, &mut part, plan, at, &outcome);
        }
        if let Some(acting) = outcome.acting_master {
            if part.master || acting == self.node_id {
                part.acting = Some(acting);
            }
        }
        plan.tasks.extend(self.tasks_sent(at, &outcome, replica));
        let busy = !part.expect.is_empty() || part.acting.is_some() || part.drop_after.is_some();
        if busy {
            let pid = at.partition.index() as u16;
            self.migrations.set_route(at.name, pid, Some(&part));
            state.parts.insert((at.name.to_owned(), pid), part);
        }
    }

    /// A replica's part of an exchange: the sources it still expects (less
    /// those whose LAST batch came early) and the lineage it now has —
    /// `full(K)` with everything the outcome covers when it expects
    /// nothing, else `subset(K)` still containing `held_covers`, what it
    /// held.
    fn fill_as_replica(
        &self,
        state: &State,
        part: &mut PartitionState,
        at: &PartitionExchange<'_>,
        outcome: &exchange::Outcome,
        held_covers: Covers,
    ) -> Lineage {
        let pid = at.partition.index() as u16;
        part.expect = outcome.expected_by(self.node_id);
        part.expect.retain(|source| {
            !state
                .early_lasts
                .contains(&(at.name.to_owned(), pid, *source))
        });
        part.covers_when_full = outcome.covers_when_full;
        if part.expect.is_empty() {
            // (An untrusted copy here was emptied before the SC map was
            // published: nothing to receive leaves it full.)
            self.sc_fill_complete(at.name, at.partition, at.cluster_key);
            Lineage {
                version: PartitionVersion::full(at.cluster_key),
                covers: outcome.covers_when_full,
            }
        } else {
            // It still contains what it held.
            Lineage {
                version: PartitionVersion::subset(at.cluster_key),
                covers: held_covers,
            }
        }
    }

    /// A holder outside the replica list: its copy goes at once when no
    /// replica needs it (or the source that covers it already said so),
    /// else once that source delivered; never while it sends the copy
    /// itself (its task drops it).
    fn plan_drop(
        &self,
        state: &State,
        part: &mut PartitionState,
        plan: &mut ExchangePlan,
        at: &PartitionExchange<'_>,
        outcome: &exchange::Outcome,
    ) {
        let pid = at.partition.index() as u16;
        match outcome.drop_after(self.node_id) {
            None => plan.drops.push((at.name.to_owned(), at.partition)),
            Some(source) if source == self.node_id => {}
            Some(source) => {
                if state
                    .early_drops
                    .contains(&(at.name.to_owned(), pid, source))
                {
                    plan.drops.push((at.name.to_owned(), at.partition));
                } else {
                    part.drop_after = Some(source);
                }
            }
        }
    }

    /// The tasks of the groups this node sends: each target with the
    /// version it held, and the targets to pull newer records from first
    /// (those that held a copy and send none of their own).
    fn tasks_sent(
        &self,
        at: &PartitionExchange<'_>,
        outcome: &exchange::Outcome,
        replica: bool,
    ) -> Vec<MigrateTask> {
        let held_by = |node: NodeId| {
            at.held
                .iter()
                .find(|holding| holding.node == node)
                .map(|holding| holding.version)
                .unwrap_or_default()
        };
        outcome
            .sent_by(self.node_id)
            .map(|group| {
                let targets: Vec<(NodeId, PartitionVersion)> = group
                    .targets
                    .iter()
                    .map(|target| (*target, held_by(*target)))
                    .collect();
                let pull_from = targets
                    .iter()
                    .filter(|(target, version)| {
                        !version.is_zero()
                            && !outcome.groups.iter().any(|other| other.source == *target)
                    })
                    .map(|(target, _)| *target)
                    .collect();
                let clear = targets
                    .iter()
                    .map(|(target, _)| *target)
                    .filter(|target| at.untrusted.contains(target))
                    .collect();
                MigrateTask {
                    namespace: at.name.to_owned(),
                    partition: at.partition,
                    targets,
                    retire: group.retire.clone(),
                    drop_after: !replica,
                    records: group.records,
                    pull_from,
                    clear,
                }
            })
            .collect()
    }

    /// Drops this node's copy of a partition it no longer holds a place
    /// for: every record goes, the version becomes ZERO.
    pub fn drop_copy(&self, namespace_name: &str, partition: PartitionId) {
        self.drop_copy_as(namespace_name, partition, true);
    }

    /// [`Distribution::drop_copy`]; for a strong-consistency namespace,
    /// `inducted` when the replicas were filled first (the holder's version
    /// takes `drop_copies`), not for an untrusted copy dropped at once.
    fn drop_copy_as(&self, namespace_name: &str, partition: PartitionId, inducted: bool) {
        let Some(namespace) = self.namespace(namespace_name.as_bytes()) else {
            return;
        };
        let migrations = &self.migrations;
        if migrations
            .pins
            .defer_drop(namespace_name, partition.index() as u16, migrations.epoch())
        {
            tracing::debug!(
                namespace = namespace_name,
                partition = partition.index(),
                "a background job still walks this copy: dropped once it has"
            );
            return;
        }
        let mut state = migrations.state.lock();
        let key = (namespace_name.to_owned(), partition.index() as u16);
        let sc = namespace.config.sc.strong_consistency;
        let current = state.current.clone();
        if current.as_ref().is_some_and(|current| {
            current
                .namespace(namespace_name)
                .is_some_and(|map| match (sc, map.sc.get()) {
                    (false, _) => map.map.replicas(partition).contains(&self.node_id),
                    (true, Some(decided)) => {
                        !decided.is_available(partition)
                            || decided.replicas(partition).contains(&self.node_id)
                    }
                    (true, None) => true,
                })
        }) {
            // A replica again under a newer view (or, strong consistency, a
            // view that has not decided to serve the partition without
            // this copy): keep it.
            return;
        }
        if let Some(current) = current.as_ref().filter(|_| sc) {
            self.sc_copy_dropped(namespace_name, partition, current.cluster_key, inducted);
        }
        if let Some(versions) = state.versions.get_mut(namespace_name) {
            versions[partition.index()] = Lineage::ZERO;
        }
        if state
            .parts
            .remove(&key)
            .is_some_and(|part| part.master_claim(self.node_id) != MasterClaim::Ordinary)
        {
            migrations.claims_generation.fetch_add(1, Ordering::AcqRel);
        }
        migrations.set_route(namespace_name, key.1, None);
        let mut index = namespace.index.partition(partition).write();
        drop(state);
        let dropped = remove_every_record(namespace, partition, &mut index);
        drop(index);
        migrations
            .partitions_dropped
            .fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            namespace = namespace_name,
            partition = partition.index(),
            records = dropped,
            "dropped a copy this node no longer holds"
        );
    }

    /// Drops the copies whose last job pin was released without a drop
    /// at hand (see [`JobPins::unpin_later`]).
    pub fn drop_released_copies(&self) {
        let due = std::mem::take(&mut self.migrations.pins.state.lock().due);
        for (namespace, partition, epoch) in due {
            if let Some(partition) = PartitionId::new(partition) {
                self.drop_deferred(&namespace, partition, epoch);
            }
        }
    }

    /// Drops a copy whose drop plan `epoch` deferred for a job, unless a
    /// later plan was made since (it decides anew; see [`JobPins`]).
    pub fn drop_deferred(&self, namespace: &str, partition: PartitionId, epoch: u64) {
        if self.migrations.epoch() == epoch {
            self.drop_copy(namespace, partition);
        }
    }

    /// Answers a `CLEAR` call ([`encode_clear`]) from a source about to
    /// fill this node's copy of an SC partition that the view's decision
    /// does not trust: OK once this node resolved that view's exchange —
    /// which emptied every such copy before the view's SC map was
    /// published ([`Distribution::empty_untrusted_copies`]) — so no batch
    /// of the view lands in a copy not emptied yet; before that, 11 (asked
    /// again). It empties nothing itself: by the time it arrives this node
    /// may have served the partition in the view (records fetched by
    /// duplicate resolution, writes it acknowledged), and emptying then
    /// would lose them.
    pub fn clear_untrusted_copy(&self, payload: &[u8]) -> ResultCode {
        let Some((key, reference)) = payload.split_first_chunk::<8>() else {
            return ResultCode::Parameter;
        };
        let Some((name, pid)) = decode_partition_ref(reference) else {
            return ResultCode::Parameter;
        };
        if self.namespace(name.as_bytes()).is_none() || PartitionId::new(pid).is_none() {
            return ResultCode::Parameter;
        }
        let state = self.migrations.state.lock();
        if state.cluster_key != u64::from_be_bytes(*key) || !state.exchanged {
            return ResultCode::Unavailable;
        }
        ResultCode::Ok
    }

    /// True when this node is in the view of `cluster_key` and resolved
    /// its exchange.
    fn resolved_view(&self, cluster_key: u64) -> bool {
        let state = self.migrations.state.lock();
        state.cluster_key == cluster_key && state.exchanged
    }

    /// `source` delivered its group of `partition` (its LAST batch).
    fn source_done(&self, cluster_key: u64, namespace: &str, partition: u16, source: NodeId) {
        let migrations = &self.migrations;
        let mut state = migrations.state.lock();
        if state.cluster_key != cluster_key {
            return;
        }
        let key = (namespace.to_owned(), partition);
        if !state.exchanged {
            state
                .early_lasts
                .insert((namespace.to_owned(), partition, source));
            return;
        }
        let Some(part) = state.parts.get_mut(&key) else {
            return;
        };
        if !part.expect.contains(&source) {
            return;
        }
        let ceded = part.master_claim(self.node_id) == MasterClaim::Ceded;
        part.expect.retain(|node| *node != source);
        if part.expect.is_empty() {
            if ceded {
                // Filled: the master claims its partition again.
                migrations.claims_generation.fetch_add(1, Ordering::AcqRel);
            }
            part.acting = None;
            let lineage = Lineage {
                version: PartitionVersion::full(cluster_key),
                covers: part.covers_when_full,
            };
            if let Some(versions) = state.versions.get_mut(namespace) {
                versions[usize::from(partition)] = lineage;
            }
            if let Some(partition) = PartitionId::new(partition) {
                self.sc_fill_complete(namespace, partition, cluster_key);
            }
            state.parts.remove(&key);
            migrations.set_route(namespace, partition, None);
        } else {
            let part = part.clone();
            migrations.set_route(namespace, partition, Some(&part));
        }
        migrations.update_counts(&state);
    }

    /// `source` delivered the group that covers this node's copy: drop it
    /// (answers the `DROP` call; the answer is one result-code byte).
    pub fn retire_copy(&self, payload: &[u8]) -> ResultCode {
        let Some((cluster_key, namespace, partition, source)) = decode_drop(payload) else {
            return ResultCode::Parameter;
        };
        let Some(partition_id) = PartitionId::new(partition) else {
            return ResultCode::Parameter;
        };
        let mut state = self.migrations.state.lock();
        if state.cluster_key != cluster_key {
            return ResultCode::Ok;
        }
        if !state.exchanged {
            state.early_drops.insert((namespace, partition, source));
            return ResultCode::Ok;
        }
        let waiting = state
            .parts
            .get(&(namespace.clone(), partition))
            .is_some_and(|part| part.drop_after == Some(source));
        drop(state);
        if waiting {
            self.drop_copy(&namespace, partition_id);
        }
        ResultCode::Ok
    }

    /// The digests of a partition's records and tombstones, in no
    /// particular order, then (strong consistency) those of records only
    /// a transaction holds (a provisional create, its monitor's record
    /// not written yet), in digest order.
    pub fn migration_digests(&self, namespace: &str, partition: PartitionId) -> Vec<Digest> {
        let Some(namespace) = self.namespace(namespace.as_bytes()) else {
            return Vec::new();
        };
        let index = namespace.index.partition(partition).read();
        let mut digests: Vec<Digest> = index
            .iter()
            .map(|(digest, _)| digest)
            .chain(index.tombstones().map(|(digest, _)| *digest))
            .collect();
        if crate::sc::data_path::is_sc(namespace) && !namespace.txn.partition_is_empty(partition) {
            let mut held = namespace.txn.held_digests(partition);
            held.retain(|digest| index.get(digest).is_none() && index.tombstone(digest).is_none());
            held.sort_unstable();
            held.dedup();
            digests.extend(held);
        }
        digests
    }

    /// This node's manifest of a partition (answers `MANIFEST`): `u8 1 |
    /// u32 count | count × (digest | u16 generation | u16 life | u64
    /// last-update ms)`; `[0]` for an unknown namespace or partition.
    pub fn manifest(&self, payload: &[u8]) -> Vec<u8> {
        let Some((namespace, partition)) = decode_partition_ref(payload) else {
            return vec![0];
        };
        let (Some(namespace), Some(partition)) = (
            self.namespace(namespace.as_bytes()),
            PartitionId::new(partition),
        ) else {
            return vec![0];
        };
        let now = self.now();
        let index = namespace.index.partition(partition).read();
        let mut out = Vec::with_capacity(5 + index.len() * MANIFEST_ENTRY);
        out.push(1);
        out.extend_from_slice(&[0; 4]);
        let mut count = 0u32;
        let live = index
            .iter()
            .map(|(digest, entry)| (digest, entry.meta()))
            .filter(|(_, meta)| citrine_data::record::is_live(namespace, meta, now))
            .map(|(digest, meta)| (digest, Version::of(&meta)));
        let deleted = index
            .tombstones()
            .map(|(digest, tombstone)| (*digest, Version::of_tombstone(tombstone)));
        for (digest, version) in live.chain(deleted) {
            out.extend_from_slice(&digest.0);
            out.extend_from_slice(&version.generation.to_be_bytes());
            out.extend_from_slice(&version.life.to_be_bytes());
            out.extend_from_slice(&version.last_update_ms.to_be_bytes());
            count += 1;
        }
        out[1..5].copy_from_slice(&count.to_be_bytes());
        out
    }

    /// The digests of `digests` a target with `theirs` (its parsed
    /// `MANIFEST` answer) lacks or holds an older copy of: the delta to
    /// send. `None` for an unknown namespace.
    pub fn migration_delta(
        &self,
        namespace_name: &str,
        partition: PartitionId,
        digests: &[Digest],
        theirs: &Manifest,
    ) -> Option<Vec<Digest>> {
        let namespace = self.namespace(namespace_name.as_bytes())?;
        let index = namespace.index.partition(partition).read();
        let sc =
            crate::sc::data_path::is_sc(namespace) && !namespace.txn.partition_is_empty(partition);
        let delta: Vec<Digest> = digests
            .iter()
            .filter(|digest| {
                if sc && !TxnCopy::capture(namespace, digest).is_empty() {
                    // The state travels with the record, even to a
                    // target holding the same committed version.
                    return true;
                }
                let Some((ours, set_id)) = held_version(&index, digest) else {
                    return false;
                };
                match theirs.get(&digest.0) {
                    None => true,
                    // Their copy is from before a truncation this node
                    // knows (and they may not yet): it counts as absent.
                    Some(their) if their.last_update_ms < namespace.truncated_before(set_id) => {
                        true
                    }
                    Some(their) => !crate::replication::copy_holds(
                        namespace.config.conflict_resolution_policy,
                        *their,
                        ours,
                    ),
                }
            })
            .copied()
            .collect();
        drop(index);
        self.migrations
            .records_skipped
            .fetch_add((digests.len() - delta.len()) as u64, Ordering::Relaxed);
        Some(delta)
    }

    /// The digests of records a target with `manifest` holds a newer copy
    /// of than this node does (by the namespace's conflict resolution), or
    /// holds alone: writes that reached the target only — it applied them
    /// and the replication to this node never completed, so none was
    /// acknowledged (a node that crashed after writing, restarted with its
    /// device). The delta sends nothing for them, so this node fetches them
    /// (`DUPRES`) before its sends: otherwise the two copies would stay
    /// different.
    ///
    /// A record this node lacks entirely (no copy, no tombstone) may also
    /// be one deleted here whose tombstone is gone, which must not come
    /// back: it is fetched only when it was written within
    /// `tomb-raider-eligible-age` (less [`PULL_CLOCK_MARGIN_MS`]) of now,
    /// since the tombstone of a later delete would still be kept.
    /// `None` for an unknown namespace.
    pub fn migration_pulls(
        &self,
        namespace_name: &str,
        partition: PartitionId,
        theirs: &Manifest,
    ) -> Option<Vec<Digest>> {
        let namespace = self.namespace(namespace_name.as_bytes())?;
        let policy = namespace.config.conflict_resolution_policy;
        let tombstones_kept_since = self
            .now()
            .unix_ms
            .saturating_sub(u64::from(namespace.config.tomb_raider_eligible_age) * 1000)
            .saturating_add(PULL_CLOCK_MARGIN_MS);
        let index = namespace.index.partition(partition).read();
        let mut pulls: Vec<Digest> = theirs
            .iter()
            .filter_map(|(digest, their)| {
                let digest = Digest(*digest);
                let Some((ours, set_id)) = held_version(&index, &digest) else {
                    // Only theirs: a write that reached only them, or
                    // (written before the tombstones kept) perhaps a record
                    // deleted here long ago.
                    let recent = their.last_update_ms >= tombstones_kept_since
                        && their.last_update_ms >= namespace.truncated_before(0);
                    return recent.then_some(digest);
                };
                let newer = !crate::replication::copy_holds(policy, ours, *their)
                    && their.last_update_ms >= namespace.truncated_before(set_id);
                newer.then_some(digest)
            })
            .collect();
        drop(index);
        // In digest order, not the map's: the simulator replays a seed
        // exactly.
        pulls.sort_unstable();
        Some(pulls)
    }

    /// Brings a batch's truncation thresholds up to date before it is sent
    /// again: a truncation made since it was built must travel with its
    /// records, which are then older than it.
    pub fn refresh_truncations(&self, batch: &mut MigrateBatch) {
        let Some(namespace) = self.namespace(batch.namespace.as_bytes()) else {
            return;
        };
        for (set, lut) in &mut batch.truncated_before {
            *lut = crate::replication::truncated_before_of(namespace, set);
        }
    }

    /// Applies a target's answer for a record [`Distribution::migration_pulls`]
    /// listed (its copy, by the replica-write rule).
    pub fn apply_pulled(
        &self,
        namespace: &str,
        digest: &Digest,
        answer: crate::replication::DupResAnswer,
    ) {
        let Some(record) = answer.record else {
            return; // gone there meanwhile
        };
        if record.namespace != namespace || record.digest != *digest {
            self.refuse_malformed("a pulled record's answer names another record");
            return;
        }
        let code = crate::replication::apply_copy(self, &record, answer.truncated_before);
        if code == ResultCode::Ok {
            self.migrations
                .records_pulled
                .fetch_add(1, Ordering::Relaxed);
        } else {
            tracing::warn!(
                namespace,
                code = code.code(),
                "a pulled record could not be applied"
            );
        }
    }

    /// Encodes the records of `digests` still live as one batch of
    /// partition `partition`; returns the batch and how many digests it
    /// consumed (at most [`BATCH_RECORDS`], fewer once [`BATCH_BYTES`] is
    /// reached). When it consumed the rest, the batch carries
    /// [`FLAG_LAST`].
    ///
    /// Every digest must be of `partition` (they come from this node's
    /// index of it): asserted, release builds too — a record sent in
    /// another partition's batch would be this node's bug, and the target
    /// refuses the whole batch.
    pub fn migration_batch(
        &self,
        cluster_key: u64,
        namespace_name: &str,
        partition: PartitionId,
        digests: &[Digest],
        flags: u8,
    ) -> (MigrateBatch, usize) {
        let mut batch = MigrateBatch {
            cluster_key,
            source: self.node_id,
            flags,
            namespace: namespace_name.to_owned(),
            partition: partition.index() as u16,
            records: Vec::new(),
            truncated_before: Vec::new(),
            txn: Vec::new(),
        };
        let Some(namespace) = self.namespace(namespace_name.as_bytes()) else {
            batch.flags |= FLAG_LAST;
            return (batch, digests.len());
        };
        let content = batch_records(namespace, partition, digests, self.now());
        batch.records = content.records;
        batch.truncated_before = content
            .truncated
            .into_iter()
            .map(|(set_id, lut)| (namespace.sets.name(set_id).unwrap_or_default(), lut))
            .collect();
        if !content.txn.is_empty() {
            batch.flags |= FLAG_TXN;
            batch.txn = content.txn;
        }
        if content.consumed == digests.len() {
            batch.flags |= FLAG_LAST;
        }
        (batch, content.consumed)
    }

    /// Applies a received batch; the answer is one result-code byte.
    ///
    /// Steps: decode, validate every record (`validate_batch`), apply
    /// each by the replica-write rule, then count and, for a LAST batch,
    /// complete its source. A batch that does not decode, or holds one
    /// record that does not decode, is of another namespace or partition
    /// than the batch, or fails [`ReplicaWrite::check`], is malformed
    /// input from its source: refused whole ([`ResultCode::Parameter`],
    /// counted in `peer_messages_malformed`), nothing of it applied.
    pub fn apply_migrate_batch(&self, payload: &[u8]) -> ResultCode {
        let Some(batch) = MigrateBatch::decode(payload) else {
            return self.refuse_malformed("a migration batch that does not decode");
        };
        let Some(namespace) = self.namespace(batch.namespace.as_bytes()) else {
            return ResultCode::Namespace;
        };
        let sc = namespace.config.sc.strong_consistency;
        // Checked and applied under the gate: a newer view's resolution
        // cannot empty the copy between the two.
        let _gate = sc.then(|| self.migrations.sc_apply_gate.read());
        if sc && !self.resolved_view(batch.cluster_key) {
            // Resolving the view's exchange empties every copy here the
            // view does not trust — one that held nothing and took a batch
            // early included — so a batch waits for it (the source sends
            // it again), as `CLEAR` does.
            return ResultCode::Unavailable;
        }
        let writes = match validate_batch(&batch) {
            Ok(writes) => writes,
            Err(what) => {
                tracing::warn!(source = %batch.source, partition = batch.partition, "{what}");
                return self.refuse_malformed("a migration batch with a malformed record");
            }
        };
        let code = self.apply_batch_writes(&batch, &writes);
        if code != ResultCode::Ok {
            return code;
        }
        self.migrations
            .records_received
            .fetch_add(writes.len() as u64, Ordering::Relaxed);
        if batch.flags & FLAG_LAST != 0 {
            self.source_done(
                batch.cluster_key,
                &batch.namespace,
                batch.partition,
                batch.source,
            );
        }
        ResultCode::Ok
    }
}

/// What one batch of a partition carries: the encoded copies, the
/// truncation threshold of each set they belong to, the transaction
/// states by record (strong consistency), and how many digests were
/// consumed.
struct BatchContent {
    records: Vec<Vec<u8>>,
    truncated: BTreeMap<u16, u64>,
    txn: Vec<(u32, Vec<u8>)>,
    consumed: usize,
}

impl Distribution {
    /// Applies a validated batch's records (`writes`, in its order), each
    /// by the replica-write rule, then its transaction state
    /// ([`txn_replica::fill`]: only what this node lacks); a record
    /// without a generation that carries a state stores nothing itself.
    /// Every state is decoded before any record is applied: one that does
    /// not decode refuses the batch whole.
    fn apply_batch_writes(&self, batch: &MigrateBatch, writes: &[ReplicaWrite]) -> ResultCode {
        let Some(namespace) = self.namespace(batch.namespace.as_bytes()) else {
            return ResultCode::Namespace;
        };
        let mut states: Vec<Option<TxnCopy>> = vec![None; writes.len()];
        for (record, state) in &batch.txn {
            let Some(copy) = TxnCopy::decode(namespace, state) else {
                return self.refuse_malformed("a migrated transaction state that does not decode");
            };
            states[*record as usize] = Some(copy);
        }
        for (write, state) in writes.iter().zip(states) {
            let marker = write.body.is_none() && write.generation == 0;
            if !(marker && state.is_some()) {
                let truncated_before = batch.truncated_before_of(&write.set_name);
                let code = crate::replication::apply_copy(self, write, truncated_before);
                if code != ResultCode::Ok {
                    return code;
                }
            }
            if let Some(copy) = state {
                txn_replica::fill(namespace, write, copy, self.now());
            }
        }
        ResultCode::Ok
    }
}

/// The content of one batch of `partition` from `digests` — each live
/// record, or the delete marker of a kept tombstone, and, on a
/// strong-consistency namespace, each record's transaction state taken
/// under the same read lock (a record only a transaction holds goes as a
/// marker without a generation) — consuming at most [`BATCH_RECORDS`],
/// the batch closed after the record that reaches [`BATCH_BYTES`].
fn batch_records(
    namespace: &citrine_data::namespace::Namespace,
    partition: PartitionId,
    digests: &[Digest],
    now: citrine_data::Now,
) -> BatchContent {
    let index = namespace.index.partition(partition).read();
    let sc = crate::sc::data_path::is_sc(namespace);
    let mut content = BatchContent {
        records: Vec::new(),
        truncated: BTreeMap::new(),
        txn: Vec::new(),
        consumed: 0,
    };
    let mut bytes = 0;
    for digest in digests.iter().take(BATCH_RECORDS) {
        assert_eq!(
            digest.partition(),
            partition,
            "a migration batch carries records of its own partition only"
        );
        content.consumed += 1;
        let state = if sc {
            txn_state(namespace, digest)
        } else {
            None
        };
        let copy = batch_copy(namespace, &index, digest, now).or_else(|| {
            let name = &namespace.config.name;
            let marker = crate::sc::data_path::regime_marker(name, digest, now.unix_ms);
            state.as_ref().map(|_| (marker.encode(), 0, false))
        });
        let Some((encoded, set_id, live)) = copy else {
            continue;
        };
        if let Some(state) = state {
            content.txn.push((content.records.len() as u32, state));
        }
        bytes += encoded.len();
        content.records.push(encoded);
        content
            .truncated
            .insert(set_id, namespace.truncated_before(set_id));
        if live && bytes >= BATCH_BYTES {
            break;
        }
    }
    content
}

/// `digest`'s transaction state, encoded, when it has one; the caller
/// holds the record's index partition lock.
fn txn_state(namespace: &citrine_data::namespace::Namespace, digest: &Digest) -> Option<Vec<u8>> {
    let state = TxnCopy::capture(namespace, digest);
    (!state.is_empty()).then(|| state.encode(namespace))
}

/// One record's copy for a migration batch: the encoded [`ReplicaWrite`]
/// of its live record (`true`) or the delete marker of its tombstone
/// (`false`), with its set; `None` when neither is held (or the record
/// expired, or its body cannot be read).
fn batch_copy(
    namespace: &citrine_data::namespace::Namespace,
    index: &citrine_index::PartitionIndex,
    digest: &Digest,
    now: citrine_data::Now,
) -> Option<(Vec<u8>, u16, bool)> {
    let Some(entry) = index.get(digest) else {
        let tombstone = index.tombstone(digest)?;
        let marker = crate::replication::delete_marker(namespace, digest, &tombstone);
        return Some((marker.encode(), tombstone.set_id, false));
    };
    let meta = entry.meta();
    if !citrine_data::record::is_live(namespace, &meta, now) {
        return None;
    }
    let body = namespace.storage.read(&entry.location).ok()?;
    let write = ReplicaWrite {
        namespace: namespace.config.name.clone(),
        digest: *digest,
        generation: meta.generation,
        life: meta.life,
        durable: false,
        void_time: meta.void_time,
        last_update_ms: meta.last_update_ms,
        set_name: namespace.sets.name(meta.set_id).unwrap_or_default(),
        body: Some(body.into_owned()),
        xdr_write: meta.xdr_write,
    };
    Some((write.encode(), meta.set_id, true))
}

/// The records of a received batch, decoded, once every one is found to
/// belong to it: of its namespace and partition, and well formed
/// ([`ReplicaWrite::check`]). The error says what was wrong.
fn validate_batch(batch: &MigrateBatch) -> Result<Vec<ReplicaWrite>, &'static str> {
    batch
        .records
        .iter()
        .map(|record| {
            let write =
                ReplicaWrite::decode(record).ok_or("a migrated record that does not decode")?;
            if write.namespace != batch.namespace {
                return Err("a migrated record of another namespace than its batch");
            }
            if write.digest.partition().index() != usize::from(batch.partition) {
                return Err("a migrated record of another partition than its batch");
            }
            write
                .check()
                .map_err(|_| "a migrated record that is not well formed")?;
            Ok(write)
        })
        .collect()
}

/// The version and set of the copy of `digest` this node holds — the
/// record, else its tombstone; `None` for neither.
fn held_version(index: &citrine_index::PartitionIndex, digest: &Digest) -> Option<(Version, u16)> {
    match index.get(digest) {
        Some(entry) => {
            let meta = entry.meta();
            Some((Version::of(&meta), meta.set_id))
        }
        None => index
            .tombstone(digest)
            .map(|tombstone| (Version::of_tombstone(&tombstone), tombstone.set_id)),
    }
}

/// How far clocks may disagree when [`Distribution::migration_pulls`] decides
/// whether a tombstone would still be kept, ms.
pub const PULL_CLOCK_MARGIN_MS: u64 = 60_000;

/// A target's copy of a partition as its `MANIFEST` answer lists it:
/// digest → the copy's version.
pub type Manifest = HashMap<[u8; DIGEST_SIZE], Version>;

/// Bytes of one `MANIFEST` entry: digest, u16 generation, u16 life, u64
/// last-update ms.
const MANIFEST_ENTRY: usize = DIGEST_SIZE + 12;

/// A `MANIFEST` answer's entries; `None` when it is malformed.
pub fn parse_manifest(manifest: &[u8]) -> Option<Manifest> {
    let (&1, rest) = manifest.split_first()? else {
        return None;
    };
    let count = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
    let entries = rest.get(4..)?;
    if entries.len() != count.checked_mul(MANIFEST_ENTRY)? {
        return None;
    }
    entries
        .chunks_exact(MANIFEST_ENTRY)
        .map(|entry| {
            let digest: [u8; DIGEST_SIZE] = entry[..DIGEST_SIZE].try_into().ok()?;
            let field = |at: usize| entry.get(DIGEST_SIZE + at..DIGEST_SIZE + at + 2);
            let generation = u16::from_be_bytes(field(0)?.try_into().ok()?);
            let life = u16::from_be_bytes(field(2)?.try_into().ok()?);
            if life >= citrine_index::LIVES {
                return None;
            }
            let lut = u64::from_be_bytes(entry.get(DIGEST_SIZE + 4..)?.try_into().ok()?)
                .min(citrine_index::MAX_LAST_UPDATE_MS);
            Some((
                digest,
                Version {
                    life,
                    generation,
                    last_update_ms: lut,
                },
            ))
        })
        .collect()
}

/// `u8 ns len | ns | u16 partition`.
/// Removes every record and tombstone of `partition` from `namespace`
/// (`index`, its write-locked index); returns how many records went.
fn remove_every_record(
    namespace: &citrine_data::namespace::Namespace,
    partition: PartitionId,
    index: &mut citrine_index::PartitionIndex,
) -> u64 {
    let mut removed = 0u64;
    index.clear_tombstones();
    namespace.clear_partition(partition);
    // The copy's transaction state goes with its records.
    namespace.txn.clear_partition(partition);
    index.remove_where(
        |_, _| true,
        |_, entry| {
            citrine_data::record::drop_entry(namespace, entry);
            removed += 1;
        },
    );
    removed
}

/// A `CLEAR` call: `u64 cluster key | partition ref`.
pub fn encode_clear(cluster_key: u64, namespace: &str, partition: PartitionId) -> Vec<u8> {
    let mut out = cluster_key.to_be_bytes().to_vec();
    out.extend_from_slice(&encode_partition_ref(namespace, partition));
    out
}

pub fn encode_partition_ref(namespace: &str, partition: PartitionId) -> Vec<u8> {
    let name = &namespace.as_bytes()[..namespace.len().min(255)];
    let mut out = Vec::with_capacity(3 + name.len());
    out.push(name.len() as u8);
    out.extend_from_slice(name);
    out.extend_from_slice(&(partition.index() as u16).to_be_bytes());
    out
}

fn decode_partition_ref(bytes: &[u8]) -> Option<(String, u16)> {
    let (&length, rest) = bytes.split_first()?;
    let name = std::str::from_utf8(rest.get(..usize::from(length))?).ok()?;
    let partition = rest.get(usize::from(length)..)?;
    let partition = u16::from_be_bytes(partition.try_into().ok()?);
    (usize::from(partition) < PARTITIONS).then(|| (name.to_owned(), partition))
}

/// A `DROP` call: `u64 cluster key | u64 source | partition ref`.
pub fn encode_drop(
    cluster_key: u64,
    source: NodeId,
    namespace: &str,
    partition: PartitionId,
) -> Vec<u8> {
    let mut out = cluster_key.to_be_bytes().to_vec();
    out.extend_from_slice(&source.0.to_be_bytes());
    out.extend_from_slice(&encode_partition_ref(namespace, partition));
    out
}

/// Reads a `DROP` call ([`encode_drop`]): cluster key, namespace,
/// partition, source.
pub fn decode_drop(bytes: &[u8]) -> Option<(u64, String, u16, NodeId)> {
    let cluster_key = u64::from_be_bytes(bytes.get(..8)?.try_into().ok()?);
    let source = u64::from_be_bytes(bytes.get(8..16)?.try_into().ok()?);
    let (namespace, partition) = decode_partition_ref(bytes.get(16..)?)?;
    Some((cluster_key, namespace, partition, NodeId(source)))
}

/// One batch of a partition's records from one source: `u64 cluster key |
/// u64 source | u8 flags | u8 ns len | ns | u16 partition | u32 count |
/// count × (u32 len | replica write) | u16 sets | sets × (u8 set len | set
/// | u64 truncated before)`, big-endian.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrateBatch {
    pub cluster_key: u64,
    /// The node sending it (a LAST batch completes that source).
    pub source: NodeId,
    pub flags: u8,
    pub namespace: String,
    pub partition: u16,
    /// Encoded [`ReplicaWrite`]s.
    pub records: Vec<Vec<u8>>,
    /// The source's truncation threshold (`Namespace::truncated_before`,
    /// 0 for none) of each set of the records (the empty name: records
    /// without a set), as of the batch's last send
    /// ([`Distribution::refresh_truncations`]). The target counts a copy it
    /// holds, or one in the batch, from before the threshold as absent
    /// even if it has not learned that truncation yet (see
    /// `replication::replica_payload`).
    pub truncated_before: Vec<(Vec<u8>, u64)>,
    /// Strong consistency: the transaction state (an encoded
    /// `citrine_data::txn::replica::TxnCopy`) of the records that have
    /// one, by their place in `records`; on the wire only with
    /// [`FLAG_TXN`], as `u32 count | count × (u32 record | u32 len |
    /// state)` after the sets.
    pub txn: Vec<(u32, Vec<u8>)>,
}

impl MigrateBatch {
    /// The source's truncation threshold for records of `set` (0: none).
    pub fn truncated_before_of(&self, set: &[u8]) -> u64 {
        self.truncated_before
            .iter()
            .find(|(name, _)| name.as_slice() == set)
            .map_or(0, |(_, lut)| *lut)
    }
}

impl MigrateBatch {
    pub fn encode(&self) -> Vec<u8> {
        let size: usize = self.records.iter().map(|record| record.len() + 4).sum();
        let mut out = Vec::with_capacity(28 + self.namespace.len() + size);
        out.extend_from_slice(&self.cluster_key.to_be_bytes());
        out.extend_from_slice(&self.source.0.to_be_bytes());
        out.push(self.flags);
        let namespace = &self.namespace.as_bytes()[..self.namespace.len().min(255)];
        out.push(namespace.len() as u8);
        out.extend_from_slice(namespace);
        out.extend_from_slice(&self.partition.to_be_bytes());
        out.extend_from_slice(&(self.records.len() as u32).to_be_bytes());
        for record in &self.records {
            out.extend_from_slice(&(record.len() as u32).to_be_bytes());
            out.extend_from_slice(record);
        }
        let sets = &self.truncated_before[..self.truncated_before.len().min(usize::from(u16::MAX))];
        out.extend_from_slice(&(sets.len() as u16).to_be_bytes());
        for (set, lut) in sets {
            let set = &set[..set.len().min(255)];
            out.push(set.len() as u8);
            out.extend_from_slice(set);
            out.extend_from_slice(&lut.to_be_bytes());
        }
        if self.flags & FLAG_TXN != 0 {
            out.extend_from_slice(&(self.txn.len() as u32).to_be_bytes());
            for (record, state) in &self.txn {
                out.extend_from_slice(&record.to_be_bytes());
                out.extend_from_slice(&(state.len() as u32).to_be_bytes());
                out.extend_from_slice(state);
            }
        }
        out
    }

    /// Decodes; `None` for anything malformed (including trailing bytes).
    pub fn decode(bytes: &[u8]) -> Option<MigrateBatch> {
        let mut at = 0usize;
        let mut take = |length: usize| -> Option<&[u8]> {
            let slice = bytes.get(at..at.checked_add(length)?)?;
            at += length;
            Some(slice)
        };
        let cluster_key = u64::from_be_bytes(take(8)?.try_into().ok()?);
        let source = NodeId(u64::from_be_bytes(take(8)?.try_into().ok()?));
        let flags = take(1)?[0];
        let namespace_len = usize::from(take(1)?[0]);
        let namespace = std::str::from_utf8(take(namespace_len)?).ok()?.to_owned();
        let partition = u16::from_be_bytes(take(2)?.try_into().ok()?);
        if usize::from(partition) >= PARTITIONS {
            return None;
        }
        let count = u32::from_be_bytes(take(4)?.try_into().ok()?) as usize;
        let mut records = Vec::with_capacity(count.min(BATCH_RECORDS));
        for _ in 0..count {
            let length = u32::from_be_bytes(take(4)?.try_into().ok()?) as usize;
            records.push(take(length)?.to_vec());
        }
        let sets = u16::from_be_bytes(take(2)?.try_into().ok()?);
        let mut truncated_before = Vec::new();
        for _ in 0..sets {
            let length = usize::from(take(1)?[0]);
            let set = take(length)?.to_vec();
            let lut = u64::from_be_bytes(take(8)?.try_into().ok()?);
            truncated_before.push((set, lut));
        }
        let mut txn = Vec::new();
        if flags & FLAG_TXN != 0 {
            let count = u32::from_be_bytes(take(4)?.try_into().ok()?);
            for _ in 0..count {
                let record = u32::from_be_bytes(take(4)?.try_into().ok()?);
                let length = u32::from_be_bytes(take(4)?.try_into().ok()?) as usize;
                if record as usize >= records.len() {
                    return None;
                }
                txn.push((record, take(length)?.to_vec()));
            }
        }
        if at != bytes.len() {
            return None;
        }
        Some(MigrateBatch {
            cluster_key,
            source,
            flags,
            namespace,
            partition,
            records,
            truncated_before,
            txn,
        })
    }
}

#[cfg(test)]
mod tests;
