//! Data distribution on the request path (AP mode): synchronous replication
//! of writes from a partition's master to its replicas, and proxying of
//! single-record requests that reach a node which does not master the
//! record's partition.
//!
//! The service owns no sockets: it talks to other nodes through a
//! [`Fabric`] handle the server installs ([`crate::Distribution::set_fabric`]),
//! which sends a payload to a node and resolves to that node's answer.
//!
//! Routing ([`route`]), once the node is in a cluster of more than one
//! member and a fabric is installed:
//! - the current partition map's master of the record's partition executes
//!   the request; any other node forwards the request body to the master
//!   ([`call_kind::PROXY`], payload `u8 hops | u64 deadline | AS_MSG body`,
//!   the inflated body when the client compressed it; see [`Hop`]) and
//!   returns the
//!   master's reply frame unchanged — except a plain read reaching a
//!   replica whose copy is whole (a client reading from replicas by
//!   policy), which the replica serves. A request that has been proxied
//!   [`MAX_PROXY_HOPS`] times (the nodes' views disagreed for a moment)
//!   is answered 9, which every official client retries — they give up
//!   at once on 11;
//! - on the master, a write or delete that succeeded locally is captured —
//!   the record's full new state (generation, void time, last-update time,
//!   set name, body) or a delete marker, never the ops — and sent
//!   ([`call_kind::REPLICA_WRITE`]) to every other replica of the partition
//!   in the current map before the client's reply is released. Replicas
//!   that do not acknowledge are sent the write again, in rounds (each
//!   waits up to [`ATTEMPT_TIMEOUT_MS`] for the one-byte answers), until the
//!   client's deadline; before each round the replica list is read from the
//!   current map again, so a replica that left the map is no longer waited
//!   for and a node that joined it gets the write. If some replica of the
//!   current map still has not acknowledged at the deadline the client gets
//!   9 (timeout: the write is in doubt, as with any timeout). A replica
//!   write carries the cluster key of the view it was executed in
//!   (`u64 key | write`); a replica under another view refuses it (7), and
//!   a master whose own view changed before every replica acknowledged
//!   answers 9 — a write executed under one view is never acknowledged
//!   under the next, where another node may already master the partition
//!   with a copy that looked equal at the exchange. A write some replica
//!   did not acknowledge (a view change, or every try lost) is queued:
//!   the migration driver sends the record's state again, under the
//!   current view, to its current replicas until all of them acknowledge
//!   it ([`Distribution::reconcile_pending`], for up to [`RECONCILE_FOR_MS`];
//!   statistics `replica_reconciles_done` / `_dropped`), so the copies
//!   converge by conflict resolution even where the next
//!   view finds the partition's versions equal and migrates nothing;
//! - a proxied request is sent once (it may not be idempotent); no answer
//!   before the deadline → 9. The deadline travels with it (fixed by the
//!   first node, on its clock: now plus the client's timeout,
//!   [`DEFAULT_DEADLINE_MS`] when it sent none), and the master refuses it with 9 (counted in
//!   `expired_refusals`) once less than [`PROXY_CLOCK_MARGIN_MS`] of it is
//!   left: a request held up on its way, or at a master that was stalled,
//!   must not run after the node that forwarded it answered 9 — the client
//!   may have written the record again since, and the late write would
//!   overwrite the newer one. A request whose deadline passed during its
//!   duplicate resolution is refused the same way;
//! - on a master whose partition is still being filled (or while the
//!   view's exchange runs), a request first runs duplicate resolution
//!   ([`crate::migration`] decides: [`call_kind::DUPRES`] to the sources it
//!   still expects, or to every member while exchanging), each answer's
//!   copy applied with the replica-write rule (and on a
//!   strong-consistency namespace its transaction state, as a migration
//!   fills it), then the request executes
//!   ([`LocalExecutor::execute_resolved`]: no second resolution); a source
//!   that does not answer within min([`DUPRES_TIMEOUT_MS`], the deadline)
//!   (or whose copy cannot be applied) → 9, not executed — the official
//!   clients retry 9 and give up at once on 11 — rather than a possible
//!   lost update. Reads of a partition whose master
//!   holds nothing go to its acting master (hop flag [`PROXY_ACTING`]);
//! - a node that is not in a view yet ([`crate::Distribution::set_orphan`])
//!   answers proxied requests 11 and duplicate-resolution requests nothing:
//!   it never executes on, or vouches for, copies it does not have;
//! - a replica write is stored only by a node that is one of the
//!   partition's replicas in the current view or still holds a copy of it
//!   (the acting master, a source whose copy is not dropped yet); any
//!   other answers 11 (`replica_writes_refused_not_holder`): a write to the
//!   acting master that the network held up until after its copy was
//!   dropped would otherwise bring back a copy outside the replica list
//!   that no migration drops. "Still holds" is checked under the
//!   partition's write lock, which the drop takes too
//!   ([`Admit::IfHeld`]), so a drop cannot come between the check and the
//!   store.
//!
//! Invariants:
//! - no partition lock is held across an await: the local write runs to
//!   completion under its lock, the lock is released, the state is captured
//!   under a read lock, and only then are the replicas awaited;
//! - a replica applies a replica write only when it wins over its copy
//!   under the namespace's `conflict-resolution-policy`
//!   ([`citrine_data::namespace::compare_versions`]: the record's life first, then
//!   generation then last-update time by default, or last-update time then
//!   generation; a delete marker carries its tombstone's life and
//!   generation), so retries and reordered deliveries are harmless;
//! - a copy from another node (replica write, migrated record,
//!   duplicate-resolution answer) that does not decode, names another
//!   record than asked, or fails [`ReplicaWrite::check`] is malformed
//!   input: refused, counted (`peer_messages_malformed`) and logged, never
//!   stored nor a reason to stop — a peer cannot make this node panic;
//! - a node alone (or without a fabric) never enters this module's async
//!   path and allocates nothing for it.
//!
//! Strong-consistency namespaces ([`crate::sc::data_path`]) take the same
//! path with the view's SC map in place of the AP map: an unavailable
//! partition answers 11; only the master serves (no replica or acting
//! master reads; a read while filling is resolved like a write); replica
//! writes go to the SC map's replicas only, as [`call_kind::SC_REPLICA_WRITE`]
//! carrying the regime, which a replica of another regime refuses (7); a
//! write not acknowledged by all of them answers 9 and leaves its record
//! unreplicated; a read of an unreplicated or just-resolved record, and
//! every LINEARIZE read, stands only once the record's state here reached
//! every replica in the regime ([`MasterRun::confirm`]).
//!
//! Batch rows in a cluster take the same route one by one (the service's
//! `batch`); a read-touch that rewrote the record is replicated like a
//! write; scans serve only whole, mastered (or claimed) partitions (the
//! service's `scan`). Migrations ([`crate::migration`]) send records in
//! the [`ReplicaWrite`] encoding and apply them with the same rule
//! ([`apply_copy`], over the data layer's `store_copy`).

use crate::migration::{Disposition, MasterClaim};
use crate::sc::data_path::{self, ReadMode};
use crate::{Distribution, LocalExecutor};
pub use citrine_data::copy::{
    capture, copy_holds, delete_marker, fetch, store_copy, truncated_before_of, version_of, Admit,
    Reader, ReplicaWrite,
};
use citrine_data::namespace::Namespace;
use citrine_data::record::{self as transaction, Request};
use citrine_data::txn::replica::{self as txn_replica, TxnCopy};
use citrine_data::Now;
use citrine_types::{Digest, NodeId, PartitionId, ResultCode, DIGEST_SIZE};
use citrine_wire::frame::{ProtoHeader, PROTO_HEADER_SIZE};
use citrine_wire::msg::info2;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Most times a request may be forwarded before it is refused with 9.
pub const MAX_PROXY_HOPS: u8 = 3;
/// Bit of a proxied request's hop byte: a read the master hands to the
/// partition's acting master (see [`crate::migration`]).
pub const PROXY_ACTING: u8 = 0x80;
/// Deadline of a proxied or replicated request whose client sent none.
pub const DEFAULT_DEADLINE_MS: u64 = 5_000;
/// How much of a forwarded request's deadline must be left for the master
/// to run it (ms): the clock skew between nodes this covers. A master whose
/// clock runs behind the forwarder's by more could still run a request the
/// forwarder has already answered 9.
pub const PROXY_CLOCK_MARGIN_MS: u64 = 5;

/// Longest wait for one replica's answer before the write is sent again.
pub const ATTEMPT_TIMEOUT_MS: u64 = 250;

/// How a single-record request reached this node, and its deadline once a
/// node fixed it.
///
/// On the fabric a forwarded request is `u8 hop byte | u64 deadline (unix
/// ms, little-endian) | AS_MSG body` ([`call_kind::PROXY`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hop {
    /// How often the request was forwarded, with the [`PROXY_ACTING`] flag.
    pub byte: u8,
    /// The deadline the first node computed from the client's timeout (on
    /// that node's clock); `None` until then.
    pub deadline_ms: Option<u64>,
}

impl Hop {
    /// A request straight from a client.
    pub const CLIENT: Hop = Hop {
        byte: 0,
        deadline_ms: None,
    };

    /// A request straight from a client whose deadline is already fixed
    /// (it waited in a stalled node's socket: the service's `handle_streaming_since`)
    /// or, with `None`, is fixed when it is routed.
    pub fn client(deadline_ms: Option<u64>) -> Hop {
        Hop {
            byte: 0,
            deadline_ms,
        }
    }

    /// Bytes before the AS_MSG body in a forwarded request.
    const ENCODED_LEN: usize = 9;

    /// How often the request was forwarded.
    pub fn count(self) -> u8 {
        self.byte & !PROXY_ACTING
    }

    /// The payload forwarding `body` with hop byte `byte` and deadline
    /// `deadline_ms`.
    pub fn payload(byte: u8, deadline_ms: u64, body: &[u8]) -> Vec<u8> {
        let mut payload = Vec::with_capacity(Self::ENCODED_LEN + body.len());
        payload.push(byte);
        payload.extend_from_slice(&deadline_ms.to_le_bytes());
        payload.extend_from_slice(body);
        payload
    }

    /// Splits a forwarded request's payload into its hop and body; `None`
    /// when it is too short.
    pub fn decode(payload: &[u8]) -> Option<(Hop, &[u8])> {
        let (&byte, rest) = payload.split_first()?;
        let (deadline, body) = rest.split_first_chunk::<8>()?;
        Some((
            Hop {
                byte,
                deadline_ms: Some(u64::from_le_bytes(*deadline)),
            },
            body,
        ))
    }
}

/// How long a record queued for [`Distribution::reconcile_pending`] is sent
/// again before it is given up on (ms).
pub const RECONCILE_FOR_MS: u64 = 30_000;
/// Most records one [`Distribution::reconcile_pending`] call sends.
const RECONCILE_BATCH: usize = 256;
/// Most records queued at once; more are counted and dropped.
const RECONCILE_QUEUE_MAX: usize = 100_000;

/// Records whose replicas may lack this node's copy (a replica write that
/// was not acknowledged by all of them), for
/// [`Distribution::reconcile_pending`].
#[derive(Default)]
pub struct Reconciles {
    pending: parking_lot::Mutex<Vec<PendingReconcile>>,
}

impl Reconciles {
    /// How many records wait to be sent again.
    pub fn pending_count(&self) -> usize {
        self.pending.lock().len()
    }
}

struct PendingReconcile {
    namespace: String,
    partition: PartitionId,
    digest: Digest,
    /// When it was queued (ms).
    since_ms: u64,
}
/// Most sends of one replica write (bounded also by the deadline).
pub const MAX_ATTEMPTS: u32 = 40;

/// Kinds of fabric calls.
pub mod call_kind {
    /// A client request forwarded to the master: `u8 hops | u64 deadline |
    /// AS_MSG body` ([`super::Hop`]); the answer is the reply frame for the
    /// client.
    pub const PROXY: u8 = 1;
    /// A record's new state for a replica ([`super::ReplicaWrite`]); the
    /// answer is one result-code byte.
    pub const REPLICA_WRITE: u8 = 2;
    /// A batch of a partition's records sent by a migration
    /// ([`crate::migration::MigrateBatch`]); the answer is one result-code
    /// byte.
    pub const MIGRATE: u8 = 3;
    /// Duplicate resolution: a new master asks for a record's version
    /// ([`super::DupResRequest`]); the answer is [`super::DupResAnswer`].
    pub const DUPRES: u8 = 4;
    /// A member's partition-version snapshot for a view: `u64 cluster
    /// key`; the answer is a status byte
    /// ([`crate::migration::exchange_status`]) and, when ready, the
    /// snapshot.
    pub const EXCHANGE: u8 = 5;
    /// The source of a group delivered it: a copy it covers outside the
    /// replica list may be dropped (`crate::migration::encode_drop`); the
    /// answer is one result-code byte.
    pub const DROP: u8 = 6;
    /// The digests, generations and last-update times of a partition's
    /// records, for a delta migration
    /// (`crate::migration::encode_partition_ref`).
    pub const MANIFEST: u8 = 7;
    /// Every secondary-index definition the sender knows, with versions
    /// and tombstones (`crate::sindex::smd`, one text line each); the
    /// answer is one result-code byte.
    pub const SINDEX_DEFINITIONS: u8 = 8;
    /// Every UDF module the sender knows, with versions and tombstones
    /// (`crate::udf`, one line each); the answer is one result-code byte.
    pub const UDF_MODULES: u8 = 9;
    /// Every truncation threshold the sender knows (`crate::truncate`, one
    /// line each); the answer is one result-code byte and, on success,
    /// every threshold the answering node knows (same lines).
    pub const TRUNCATIONS: u8 = 10;
    /// A part of an aggregation for all partitions: the AS_MSG body of the
    /// aggregation, listing the partitions the asking master is filling
    /// and the answering node acts for (`crate::udf`); the answer is a
    /// result-code byte and, on success, the part's whole stream (value
    /// frames, then LAST).
    pub const AGGREGATE_PART: u8 = 11;
    /// Every user and role the sender knows, with the store's version
    /// (the service's `security::store`, one line each); the answer is
    /// one result-code byte.
    pub const SECURITY: u8 = 20;
    /// Every namespace's strong-consistency rosters the sender knows, with
    /// versions (`crate::sc::store`, one line each); the answer is one
    /// result-code byte.
    pub const ROSTERS: u8 = 21;
    /// A migration source asks a strong-consistency replica to empty the
    /// copy the view's decision does not trust before filling it
    /// (`crate::migration::encode_clear`); the answer is one result-code
    /// byte (11: that view's exchange is not resolved there yet).
    pub const CLEAR: u8 = 22;
    /// A replica write of a strong-consistency namespace: `u32 regime |
    /// u32 length | transaction state | REPLICA_WRITE payload`
    /// (`crate::sc::data_path::sc_payload`); the
    /// answer is one result-code byte (7: another regime, or not a replica
    /// of the partition in it).
    pub const SC_REPLICA_WRITE: u8 = 23;
    /// The last-ship times of the partitions the sender masters, for one
    /// XDR destination and namespace (`citrine_xdr::lst_push`); the answer
    /// is one result-code byte.
    pub const XDR_LSTS: u8 = 24;
    /// Every XDR filter expression the sender knows, with versions and
    /// removals (the server's `xdr::filters`, one line each); the answer
    /// is one result-code byte.
    pub const XDR_FILTERS: u8 = 25;
}

/// Longest wait for one member's duplicate-resolution answer.
pub const DUPRES_TIMEOUT_MS: u64 = 1_000;

/// A duplicate-resolution request: `u64 cluster key | u8 ns len | ns |
/// digest`, big-endian.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DupResRequest {
    pub cluster_key: u64,
    pub namespace: String,
    pub digest: Digest,
}

impl DupResRequest {
    pub fn encode(&self) -> Vec<u8> {
        let namespace = &self.namespace.as_bytes()[..self.namespace.len().min(255)];
        let mut out = Vec::with_capacity(9 + namespace.len() + DIGEST_SIZE);
        out.extend_from_slice(&self.cluster_key.to_be_bytes());
        out.push(namespace.len() as u8);
        out.extend_from_slice(namespace);
        out.extend_from_slice(&self.digest.0);
        out
    }

    /// Decodes; `None` for anything malformed (including trailing bytes).
    pub fn decode(bytes: &[u8]) -> Option<DupResRequest> {
        let mut reader = Reader { bytes, at: 0 };
        let cluster_key = u64::from_be_bytes(reader.take(8)?.try_into().ok()?);
        let namespace_len = usize::from(reader.u8()?);
        let namespace = std::str::from_utf8(reader.take(namespace_len)?)
            .ok()?
            .to_owned();
        let digest: [u8; DIGEST_SIZE] = reader.take(DIGEST_SIZE)?.try_into().ok()?;
        if reader.at != bytes.len() {
            return None;
        }
        Some(DupResRequest {
            cluster_key,
            namespace,
            digest: Digest(digest),
        })
    }
}

/// A member's answer to a [`DupResRequest`]: `u8 flags | (TXN) u32 length
/// | transaction state | (FOUND) u64 truncated before | replica write`.
/// The replica write is a delete marker when the member keeps the
/// record's tombstone; the word before it is the member's truncation
/// threshold for the record's set (see [`replica_payload`]), which the
/// asking master applies to its own copy. The transaction state
/// (strong consistency: `citrine_data::txn::replica::TxnCopy`, read with
/// the copy) is there only when the record has one — an answer of an
/// older node never has it, and an older master refuses one that has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DupResAnswer {
    /// The member's live copy (full state), or `None` when absent.
    pub record: Option<ReplicaWrite>,
    /// The member's truncation threshold for the record's set (0: none, or
    /// no record).
    pub truncated_before: u64,
    /// The record's encoded transaction state; empty when it has none.
    pub txn: Vec<u8>,
}

const DUPRES_FOUND: u8 = 2;
const DUPRES_TXN: u8 = 4;

impl DupResAnswer {
    pub fn encode(&self) -> Vec<u8> {
        let mut flags = 0;
        let record = self.record.as_ref().map(ReplicaWrite::encode);
        if record.is_some() {
            flags |= DUPRES_FOUND;
        }
        if !self.txn.is_empty() {
            flags |= DUPRES_TXN;
        }
        let mut out = vec![flags];
        if !self.txn.is_empty() {
            out.extend_from_slice(&(self.txn.len() as u32).to_be_bytes());
            out.extend_from_slice(&self.txn);
        }
        if let Some(record) = record {
            out.extend_from_slice(&self.truncated_before.to_be_bytes());
            out.extend_from_slice(&record);
        }
        out
    }

    /// Decodes; `None` for anything malformed.
    pub fn decode(bytes: &[u8]) -> Option<DupResAnswer> {
        let (&flags, mut rest) = bytes.split_first()?;
        if flags & !(DUPRES_FOUND | DUPRES_TXN) != 0 {
            return None;
        }
        let mut txn = Vec::new();
        if flags & DUPRES_TXN != 0 {
            let (length, after) = rest.split_first_chunk::<4>()?;
            let length = u32::from_be_bytes(*length) as usize;
            if length == 0 || after.len() < length {
                return None;
            }
            txn = after[..length].to_vec();
            rest = &after[length..];
        }
        if flags & DUPRES_FOUND == 0 {
            return rest.is_empty().then_some(DupResAnswer {
                record: None,
                truncated_before: 0,
                txn,
            });
        }
        let (truncated_before, record) = rest.split_first_chunk::<8>()?;
        Some(DupResAnswer {
            record: Some(ReplicaWrite::decode(record)?),
            truncated_before: u64::from_be_bytes(*truncated_before),
            txn,
        })
    }
}

/// Why a fabric call produced no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FabricError {
    /// No answer within the timeout (or the connection dropped the request).
    Timeout,
    /// The node is not known to the fabric (no address).
    Unreachable,
}

/// The answer of a fabric call, resolved on whatever event loop awaits it.
pub type FabricFuture = Pin<Box<dyn Future<Output = Result<Vec<u8>, FabricError>> + Send>>;

/// "Send this to node X over the fabric and await the answer", implemented
/// by the server on its fabric connections.
pub trait Fabric: Send + Sync + 'static {
    /// Sends `payload` of kind `kind` to `to`; resolves to the answer, or
    /// an error after `timeout`. The payload is on its way when `call`
    /// returns: dropping the future unpolled abandons only the answer.
    fn call(&self, to: NodeId, kind: u8, payload: Vec<u8>, timeout: Duration) -> FabricFuture;
}

/// Work a request still has to do over the fabric before its reply is final.
#[derive(Debug)]
pub enum Remote {
    /// Forward to the master; its answer replaces the (empty) reply.
    Proxy {
        to: NodeId,
        payload: Vec<u8>,
        deadline_ms: u64,
    },
    /// The local reply stands once every target acknowledged `payload`
    /// under the view (`cluster_key`) the write was executed in.
    Replicate {
        namespace: String,
        partition: PartitionId,
        targets: Vec<NodeId>,
        cluster_key: u64,
        payload: Vec<u8>,
        deadline_ms: u64,
        /// Strong consistency: the master's regime (the payload is then an
        /// `SC_REPLICA_WRITE`'s, and a failure leaves the record
        /// unreplicated).
        regime: Option<u32>,
        /// Strong consistency: the record's transaction state
        /// (`citrine_data::txn::replica::TxnCopy`), empty when the write
        /// leaves the replicas' state as it is (a regime marker).
        txn: Vec<u8>,
    },
    /// Fetch the record's version from every other member, apply the
    /// newest, then execute `body` here (duplicate resolution).
    DupRes {
        request: DupResRequest,
        sources: Vec<NodeId>,
        body: Vec<u8>,
        /// How the request came, with the deadline fixed.
        hop: Hop,
    },
}

/// Where a single-record request runs, decided by [`route`].
#[derive(Debug)]
pub enum Route {
    /// Refused before it ran: `out` holds the answer (11 for a stalled
    /// node, 9 past its deadline or after too many forwards).
    Answered,
    /// Forwarded, or resolved first: the fabric work to complete.
    Remote(Box<Remote>),
    /// A read this node serves as it stands (acting master, or a replica
    /// whose copy is whole); nothing to replicate.
    Read,
    /// Run here as the master; then [`replicate_after`] says what to send
    /// the replicas.
    Master(MasterRun),
}

/// What the master must know, after it ran a request, to replicate it.
#[derive(Debug, Clone, Copy)]
pub struct MasterRun {
    /// The request's deadline (fixed here, or earlier on its way).
    pub deadline_ms: u64,
    /// A plain read: nothing to replicate.
    pub read: bool,
    /// A read-touch: the record's version (generation, last-update and
    /// void time) before it ran; it replicates only when the touch changed
    /// it (a read-touch keeps the generation).
    pub touch_before: Option<Option<(u16, u64, u32)>>,
    /// Where the reply starts in `out`.
    pub reply_at: usize,
    /// Strong consistency: what a read must have confirmed by the
    /// replicas before its answer stands.
    pub confirm: Confirm,
    /// The view (cluster key) it was routed in: a strong-consistency write
    /// or confirmation is never answered under another.
    pub cluster_key: u64,
}

/// What a strong-consistency read needs from the partition's replicas
/// before its answer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirm {
    /// Nothing (an AP read, a write, a SESSION read of a replicated record).
    Nothing,
    /// That they are in this node's regime (a LINEARIZE read): an
    /// `SC_REPLICA_WRITE` of a marker that stores nothing.
    Regime,
    /// That they stored the record's state here (a read of an unreplicated
    /// record, or of one just resolved from other nodes).
    Replicated,
}

/// What a request is, as routing sees it.
#[derive(Debug, Clone, Copy)]
pub struct RouteRequest {
    /// A plain read: no write bit and no record UDF (a UDF may write).
    pub read: bool,
    /// A read-touch (a read with a TTL percentage 1-100): it may rewrite
    /// the record, so it runs at the master, like a write.
    pub read_touch: bool,
    /// Its client timeout (`transaction_ttl`), ms; 0: the default.
    pub transaction_ttl: u32,
    /// Its strong-consistency read mode (info3; ignored for AP).
    pub read_mode: ReadMode,
}

impl RouteRequest {
    /// The routing view of a checked request whose record UDF, if any, is
    /// `has_udf`.
    pub fn of(request: &Request<'_>, has_udf: bool) -> RouteRequest {
        let header = &request.header;
        RouteRequest {
            read: header.info2 & info2::WRITE == 0 && !has_udf,
            read_touch: (1..=100).contains(&header.record_ttl),
            transaction_ttl: header.transaction_ttl,
            read_mode: ReadMode::of_info3(header.info3),
        }
    }
}

/// Decides where a single-record request runs in a cluster: refused here,
/// forwarded to the master (or an acting master, or resolved first), served
/// here as a read, or run here as the master. `body` is the request's
/// AS_MSG body (forwarded as is), `hop` how it came here, `resolved` true
/// after its duplicate resolution. A pure function of the view, the
/// migration state, the request and the time.
#[allow(clippy::too_many_arguments)]
pub fn route(
    dist: &Distribution,
    namespace: &Namespace,
    digest: &Digest,
    request: RouteRequest,
    body: &[u8],
    hop: Hop,
    resolved: bool,
    out: &mut Vec<u8>,
) -> Route {
    let now = dist.now();
    let Some(deadline_ms) = admit_routed(dist, request, hop, now, out) else {
        return Route::Answered;
    };
    let cluster = dist.cluster();
    let partition = digest.partition();
    let name = &namespace.config.name;
    let sc = data_path::is_sc(namespace);
    let replicas = data_path::replicas_for(&cluster, namespace, partition);
    if sc && replicas.is_empty() {
        // Unavailable (or undecided) in this view.
        transaction::write_result(out, ResultCode::Unavailable);
        return Route::Answered;
    }
    let forward = Forward {
        dist,
        hop,
        deadline_ms,
        body,
    };
    if let Some(master) = replicas.first().filter(|master| **master != dist.node_id) {
        if sc {
            // Strong consistency: only the master in its regime serves.
            return forward.to(*master, 0, out);
        }
        return route_to_master(
            dist, name, partition, replicas, *master, request, forward, out,
        );
    }
    if !resolved {
        if let Some(route) = route_while_filling(dist, namespace, digest, request, forward, out) {
            return route;
        }
    }
    let touch_before = (request.read && request.read_touch).then(|| version_of(namespace, digest));
    let confirm = if !sc {
        Confirm::Nothing
    } else if dist.sc_unreplicated.contains(name, digest) {
        // Reads and writes alike: a write that changes nothing (a delete
        // of what an unreplicated delete removed: 2) must not answer
        // before that state reached the replicas.
        Confirm::Replicated
    } else if !request.read {
        Confirm::Nothing
    } else if resolved {
        Confirm::Replicated
    } else if request.read_mode == ReadMode::Linearize {
        Confirm::Regime
    } else {
        Confirm::Nothing
    };
    Route::Master(MasterRun {
        deadline_ms,
        read: request.read,
        touch_before,
        reply_at: out.len(),
        confirm,
        cluster_key: cluster.cluster_key,
    })
}

/// The checks a routed request passes before anything: a request a peer
/// forwarded is refused (11) by a node whose cluster runtime stalled, and
/// one past its deadline (9). Its deadline: fixed earlier — by the node
/// that forwarded it (on that node's clock, hence the margin), here before
/// its duplicate resolution, or here from a stall it waited through (the
/// service's `handle_streaming_since`) — or now from its client timeout.
fn admit_routed(
    dist: &Distribution,
    request: RouteRequest,
    hop: Hop,
    now: Now,
    out: &mut Vec<u8>,
) -> Option<u64> {
    let hops = hop.count();
    if hops != 0 && dist.cluster_stalled(now.unix_ms) {
        // A client's own request was checked on arrival.
        dist.stats.stall_refusals.fetch_add(1, Ordering::Relaxed);
        transaction::write_result(out, ResultCode::Unavailable);
        return None;
    }
    let Some(deadline_ms) = hop.deadline_ms else {
        return Some(
            now.unix_ms
                + match request.transaction_ttl {
                    0 => DEFAULT_DEADLINE_MS,
                    ttl => u64::from(ttl),
                },
        );
    };
    let margin = if hops == 0 { 0 } else { PROXY_CLOCK_MARGIN_MS };
    if now.unix_ms.saturating_add(margin) >= deadline_ms {
        dist.stats.expired_refusals.fetch_add(1, Ordering::Relaxed);
        transaction::write_result(out, ResultCode::Timeout);
        return None;
    }
    Some(deadline_ms)
}

/// How a request goes on to another node.
#[derive(Clone, Copy)]
struct Forward<'a> {
    dist: &'a Distribution,
    hop: Hop,
    deadline_ms: u64,
    body: &'a [u8],
}

impl Forward<'_> {
    /// Forwards the request to `to` (with hop `flags`), unless it has been
    /// forwarded [`MAX_PROXY_HOPS`] times already (9).
    fn to(self, to: NodeId, flags: u8, out: &mut Vec<u8>) -> Route {
        let hops = self.hop.count();
        if hops >= MAX_PROXY_HOPS {
            self.dist
                .stats
                .proxy_hops_exceeded
                .fetch_add(1, Ordering::Relaxed);
            transaction::write_result(out, ResultCode::Timeout);
            return Route::Answered;
        }
        Route::Remote(Box::new(Remote::Proxy {
            to,
            payload: Hop::payload((hops + 1) | flags, self.deadline_ms, self.body),
            deadline_ms: self.deadline_ms,
        }))
    }
}

/// Another node masters the partition: a plain read is served here when
/// this node is the acting master holding the copy (sent here by the
/// master, or claimed by this node) or a replica whose copy is whole;
/// anything else is forwarded to the master.
#[allow(clippy::too_many_arguments)]
fn route_to_master(
    dist: &Distribution,
    name: &str,
    partition: PartitionId,
    replicas: &[NodeId],
    master: NodeId,
    request: RouteRequest,
    forward: Forward<'_>,
    out: &mut Vec<u8>,
) -> Route {
    let plain_read = request.read && !request.read_touch;
    let acting_read = forward.hop.byte & PROXY_ACTING != 0;
    let claimed_read = plain_read
        && !acting_read
        && dist.migrations.master_claim(name, partition, dist.node_id) == MasterClaim::Acting;
    if (acting_read || claimed_read)
        && request.read
        && dist.migrations.is_acting(name, partition, dist.node_id)
    {
        // The master is filling and this node holds the copy.
        dist.migrations.acting_reads.fetch_add(1, Ordering::Relaxed);
        return Route::Read;
    }
    // Every acknowledged write reached a whole replica's copy before it
    // was acknowledged.
    if plain_read
        && replicas[1..].contains(&dist.node_id)
        && dist.migrations.serves_whole(name, partition)
    {
        dist.stats.replica_reads.fetch_add(1, Ordering::Relaxed);
        return Route::Read;
    }
    forward.to(master, 0, out)
}

/// This node masters the partition but may still be filling it: the
/// request goes to the acting master holding the whole copy, or first
/// through a duplicate resolution against the previous holders; `None`
/// when it runs here now. A read-touch may rewrite the record: it runs
/// here, like a write, never at the acting master.
fn route_while_filling(
    dist: &Distribution,
    namespace: &Namespace,
    digest: &Digest,
    request: RouteRequest,
    forward: Forward<'_>,
    out: &mut Vec<u8>,
) -> Option<Route> {
    let name = &namespace.config.name;
    // Strong consistency: no acting master; a read is resolved like a write.
    let plain_read = request.read && !request.read_touch && !data_path::is_sc(namespace);
    match dist
        .migrations
        .disposition(name, digest.partition(), plain_read)
    {
        Disposition::Normal => None,
        Disposition::Acting(acting) => Some(forward.to(acting, PROXY_ACTING, out)),
        Disposition::DupRes {
            cluster_key,
            sources,
        } if !sources.is_empty() => Some(Route::Remote(Box::new(Remote::DupRes {
            request: DupResRequest {
                cluster_key,
                namespace: name.clone(),
                digest: *digest,
            },
            sources,
            body: forward.body.to_vec(),
            hop: Hop {
                byte: forward.hop.byte,
                deadline_ms: Some(forward.deadline_ms),
            },
        }))),
        Disposition::DupRes { .. } => None,
    }
}

/// After the master ran a request ([`Route::Master`]): the replica writes
/// still to do, if any — for a write that succeeded, or a read-touch that
/// changed the record, the record's state now, to every replica of the
/// current map (and the acting master while one serves the partition).
/// For a strong-consistency namespace see [`replicate_in_regime`] (which
/// may replace the reply in `out`).
pub fn replicate_after(
    dist: &Distribution,
    namespace: &Namespace,
    digest: &Digest,
    run: MasterRun,
    out: &mut Vec<u8>,
) -> Option<Box<Remote>> {
    if data_path::is_sc(namespace) {
        return replicate_in_regime(dist, namespace, digest, run, out);
    }
    if run.read
        && run
            .touch_before
            .is_none_or(|before| before == version_of(namespace, digest))
    {
        return None;
    }
    let cluster = dist.cluster();
    let name = &namespace.config.name;
    let partition = digest.partition();
    let mut targets = cluster
        .namespace(name)
        .map_or(&[][..], |map| map.map.replicas(partition))
        .get(1..)
        .unwrap_or_default()
        .to_vec();
    if let Some(acting) = dist.migrations.acting_target(name, partition) {
        if !targets.contains(&acting) && acting != dist.node_id {
            targets.push(acting);
        }
    }
    // Result code: proto header, then byte 5 of the message header.
    if targets.is_empty() || out.get(run.reply_at + PROXY_RESULT_AT).copied() != Some(0) {
        return None;
    }
    let write = capture(namespace, digest, dist.now());
    Some(Box::new(Remote::Replicate {
        namespace: name.clone(),
        partition,
        targets,
        cluster_key: cluster.cluster_key,
        payload: replica_payload(cluster.cluster_key, namespace, &write),
        deadline_ms: run.deadline_ms,
        regime: None,
        txn: Vec::new(),
    }))
}

/// [`replicate_after`] for a strong-consistency namespace: a write that
/// succeeded, a read-touch that changed the record, or a read that must
/// confirm ([`MasterRun::confirm`], whatever its answer) sends the record's
/// state here (or, to confirm the regime only, a marker that stores
/// nothing) to every other replica of the SC map, in the map's regime;
/// nothing goes to an acting master. The reply stands only once all of
/// them stored it. When the view changed since the request was routed,
/// the reply becomes 9 (in doubt) at once and a changed record is
/// unreplicated.
fn replicate_in_regime(
    dist: &Distribution,
    namespace: &Namespace,
    digest: &Digest,
    run: MasterRun,
    out: &mut Vec<u8>,
) -> Option<Box<Remote>> {
    let changed = !run.read
        || run
            .touch_before
            .is_some_and(|before| before != version_of(namespace, digest));
    let succeeded = out.get(run.reply_at + PROXY_RESULT_AT).copied() == Some(0);
    let changed = changed && succeeded;
    let cluster = dist.cluster();
    if run.confirm == Confirm::Nothing && !changed {
        if cluster.cluster_key != run.cluster_key {
            // A read that ran after the view it was routed in ended: the
            // copy it read may have been emptied since (an untrusted copy
            // is, as the next view is resolved).
            out.truncate(run.reply_at);
            transaction::write_result(out, ResultCode::Timeout);
        }
        return None;
    }
    let name = &namespace.config.name;
    let partition = digest.partition();
    let regime =
        data_path::regime_of(&cluster, name).filter(|_| cluster.cluster_key == run.cluster_key);
    let Some(regime) = regime else {
        if changed {
            dist.sc_unreplicated.mark(name, *digest);
        }
        out.truncate(run.reply_at);
        transaction::write_result(out, ResultCode::Timeout);
        return None;
    };
    let targets: Vec<NodeId> = data_path::replicas_for(&cluster, namespace, partition)
        .iter()
        .copied()
        .filter(|node| *node != dist.node_id)
        .collect();
    if targets.is_empty() {
        dist.sc_unreplicated.clear(name, digest);
        return None;
    }
    let (write, txn) = if changed || run.confirm == Confirm::Replicated {
        let write = capture(namespace, digest, dist.now());
        (write, TxnCopy::capture(namespace, digest).encode(namespace))
    } else {
        let marker = data_path::regime_marker(name, digest, dist.now().unix_ms);
        (marker, Vec::new())
    };
    Some(Box::new(Remote::Replicate {
        namespace: name.clone(),
        partition,
        targets,
        cluster_key: cluster.cluster_key,
        payload: replica_payload(cluster.cluster_key, namespace, &write),
        deadline_ms: run.deadline_ms,
        regime: Some(regime),
        txn,
    }))
}

/// The kind and payload of a replica write of `payload` (a
/// [`replica_payload`]): `SC_REPLICA_WRITE` carrying `regime` for a
/// strong-consistency namespace, else `REPLICA_WRITE`.
fn replica_call(regime: Option<u32>, txn: &[u8], payload: &[u8]) -> (u8, Vec<u8>) {
    match regime {
        Some(regime) => (
            call_kind::SC_REPLICA_WRITE,
            data_path::sc_payload(regime, txn, payload),
        ),
        None => (call_kind::REPLICA_WRITE, payload.to_vec()),
    }
}

/// Where a replicated write belongs: its partition, under the view (cluster
/// key) it was executed in.
#[derive(Debug, Clone, Copy)]
pub struct WriteScope<'a> {
    pub namespace: &'a str,
    pub partition: PartitionId,
    pub cluster_key: u64,
    /// Strong consistency: the regime the write was executed in.
    pub regime: Option<u32>,
    /// Strong consistency: the record's transaction state to send along
    /// (empty: none, the replicas' stays as it is).
    pub txn: &'a [u8],
}

/// A `REPLICA_WRITE` call: `u64 cluster key | u64 truncated before |
/// replica write`.
///
/// A replica whose view has another key refuses it (7): a write executed
/// under one view must not be acknowledged under the next, where another
/// node may already be master of its partition.
///
/// The second word is the master's truncation threshold for the record's
/// set (`Namespace::truncated_before`, 0 for none). A replica that has not
/// learned that truncation yet (its push is still on the way) counts a copy
/// or tombstone it holds from before it as absent, as the master did:
/// otherwise the master's copy written afresh over the truncated one
/// (generation 1) would lose to it, be acknowledged, and be gone from the
/// replica once the truncation arrives there.
pub fn replica_payload(cluster_key: u64, namespace: &Namespace, write: &ReplicaWrite) -> Vec<u8> {
    let truncated_before = truncated_before_of(namespace, &write.set_name);
    let mut payload = cluster_key.to_be_bytes().to_vec();
    payload.extend_from_slice(&truncated_before.to_be_bytes());
    payload.extend_from_slice(&write.encode());
    payload
}

/// Clears the XDR mark of the copy in a `REPLICA_WRITE` payload, for a
/// replica of a build from before the mark, which refuses (4) every copy
/// carrying it: the copy is then stored there unmarked (were that node to
/// master the record, it would ship it once back to its origin, which
/// answers 28). False when the copy had no mark.
pub fn drop_xdr_mark(payload: &mut [u8]) -> bool {
    payload
        .get_mut(16..)
        .is_some_and(citrine_data::copy::drop_xdr_mark)
}

/// Writes the namespace's current truncation threshold for the record's
/// set into a `REPLICA_WRITE` payload about to be sent again: a truncation
/// made since it was built must travel with it, or the replica could keep
/// the old copy over a newer one written after the truncation.
pub fn refresh_truncation(namespace: &Namespace, payload: &mut [u8]) {
    let Some(truncated_before) = split_replica_payload(payload)
        .and_then(|(_, _, write)| ReplicaWrite::decode(write))
        .map(|write| truncated_before_of(namespace, &write.set_name))
    else {
        return;
    };
    if let Some(field) = payload.get_mut(8..16) {
        field.copy_from_slice(&truncated_before.to_be_bytes());
    }
}

/// Splits a `REPLICA_WRITE` payload ([`replica_payload`]) into its cluster
/// key, the master's truncation threshold and the encoded replica write.
pub fn split_replica_payload(payload: &[u8]) -> Option<(u64, u64, &[u8])> {
    let (key, rest) = payload.split_first_chunk::<8>()?;
    let (truncated_before, write) = rest.split_first_chunk::<8>()?;
    Some((
        u64::from_be_bytes(*key),
        u64::from_be_bytes(*truncated_before),
        write,
    ))
}

/// Where a reply's result code is: proto header, then byte 5 of the
/// message header.
const PROXY_RESULT_AT: usize = PROTO_HEADER_SIZE + 5;

/// Applies a copy of a record to this node's copy by the replica-write
/// rule, as from a node that knows no truncation this one does not.
pub fn apply_replica_write(dist: &Distribution, write: &ReplicaWrite) -> ResultCode {
    apply_copy(dist, write, 0)
}

/// Applies a copy of a record from another node — a master's replica
/// write, a migrated record, a duplicate-resolution answer — which that
/// node sent with its truncation threshold for the record's set
/// (`truncated_before`, see [`replica_payload`]), to this node's copy. A
/// threshold later than this node's is first taken as its own
/// ([`Distribution::adopt_carried_truncation`]). A copy that fails
/// [`ReplicaWrite::check`] is malformed input from that node: refused
/// ([`ResultCode::Parameter`]) and counted, nothing stored.
pub fn apply_copy(dist: &Distribution, write: &ReplicaWrite, truncated_before: u64) -> ResultCode {
    apply_copy_admitted(dist, write, truncated_before, Admit::Always)
}

/// [`apply_copy`], storing the copy in a partition this node is not a
/// replica of only as `admit` allows.
pub fn apply_copy_admitted(
    dist: &Distribution,
    write: &ReplicaWrite,
    truncated_before: u64,
    admit: Admit,
) -> ResultCode {
    if write.check().is_err() {
        return dist.refuse_malformed("a copy of a record that is not well formed");
    }
    let Some(namespace) = dist.namespace(write.namespace.as_bytes()) else {
        return ResultCode::Namespace;
    };
    if truncated_before > 0
        && namespace
            .sets
            .id_of(&write.set_name)
            .is_some_and(|set_id| truncated_before > namespace.truncated_before(set_id))
    {
        // The sender knows a truncation this node has not heard of yet.
        dist.adopt_carried_truncation(&write.namespace, &write.set_name, truncated_before);
    }
    match store_copy(namespace, write, dist.now(), truncated_before, admit) {
        Ok(()) => ResultCode::Ok,
        Err(code) => code,
    }
}

impl Distribution {
    /// Finishes a request's fabric work and leaves its final reply in `out`
    /// (a request whose duplicate resolution ends runs here through
    /// `executor`).
    pub async fn complete(&self, remote: Remote, executor: &dyn LocalExecutor, out: &mut Vec<u8>) {
        let Some(fabric) = self.fabric.get() else {
            out.clear();
            transaction::write_result(out, ResultCode::Unavailable);
            return;
        };
        let remote = match remote {
            Remote::DupRes {
                request,
                sources,
                body,
                hop,
            } => {
                out.clear();
                debug_assert!(hop.deadline_ms.is_some(), "fixed by `route`");
                let deadline_ms = hop.deadline_ms.unwrap_or_default();
                if !self
                    .resolve(fabric.as_ref(), &request, sources, deadline_ms)
                    .await
                {
                    self.migrations
                        .dupres_failures
                        .fetch_add(1, Ordering::Relaxed);
                    transaction::write_result(out, ResultCode::Timeout);
                    return;
                }
                let next = executor.execute_resolved(&body, hop, out);
                if !self.sc_resolution_stands(&request, next.as_deref(), out) {
                    return;
                }
                match next {
                    Some(next) => *next,
                    None => return,
                }
            }
            other => other,
        };
        match remote {
            Remote::DupRes { .. } => {
                // `execute_resolved` never asks for a second resolution.
                out.clear();
                transaction::write_result(out, ResultCode::ServerError);
            }
            Remote::Proxy {
                to,
                payload,
                deadline_ms,
            } => {
                let timeout = self.remaining(deadline_ms);
                let answer = fabric.call(to, call_kind::PROXY, payload, timeout).await;
                out.clear();
                match answer {
                    Ok(frame) if is_whole_frame(&frame) => out.extend_from_slice(&frame),
                    Ok(_) => transaction::write_result(out, ResultCode::ServerError),
                    Err(_) => transaction::write_result(out, ResultCode::Timeout),
                }
            }
            Remote::Replicate {
                namespace,
                partition,
                targets,
                cluster_key,
                payload,
                deadline_ms,
                regime,
                txn,
            } => {
                let done = self
                    .replicate(
                        fabric.as_ref(),
                        WriteScope {
                            namespace: &namespace,
                            partition,
                            cluster_key,
                            regime,
                            txn: &txn,
                        },
                        targets,
                        &payload,
                        deadline_ms,
                    )
                    .await;
                if regime.is_some() {
                    self.note_sc_outcome(&namespace, &payload, done);
                }
                if !done {
                    out.clear();
                    transaction::write_result(out, ResultCode::Timeout);
                    // Some replica may lack what this node now holds (the
                    // view changed, or every try was lost): the migration
                    // driver sends the record's state again until the
                    // current replicas have it.
                    self.queue_reconcile(&namespace, partition, &payload);
                }
            }
        }
    }

    /// Strong consistency: whether a request run after its duplicate
    /// resolution (`request`; `next`, `out`: what its run left) ran in the
    /// view it was resolved in. A view change since may have emptied the
    /// copy the resolution filled (an untrusted copy is emptied as the
    /// next view is resolved) or made other nodes' copies the ones to
    /// resolve against, so its answer cannot stand: it becomes 9 (in
    /// doubt), and a write it made locally is unreplicated (no read serves
    /// it before it was replicated again). Always true for AP namespaces.
    fn sc_resolution_stands(
        &self,
        request: &DupResRequest,
        next: Option<&Remote>,
        out: &mut Vec<u8>,
    ) -> bool {
        let sc = self
            .namespace(request.namespace.as_bytes())
            .is_some_and(data_path::is_sc);
        if !sc || self.cluster().cluster_key == request.cluster_key {
            return true;
        }
        if let Some(Remote::Replicate { .. }) = next {
            self.sc_unreplicated
                .mark(&request.namespace, request.digest);
        }
        out.clear();
        transaction::write_result(out, ResultCode::Timeout);
        false
    }

    /// Sends a replica write until every replica of the partition in the
    /// current map (other than this node) has acknowledged it, or the
    /// deadline passes. Works in rounds: each round sends to every replica
    /// that has not acknowledged yet, all at once, and waits up to
    /// [`ATTEMPT_TIMEOUT_MS`]; then the replica list is looked up again, so
    /// a replica that left the map is no longer waited for and a node that
    /// joined the partition's list gets the write too.
    pub async fn replicate(
        &self,
        fabric: &dyn Fabric,
        scope: WriteScope<'_>,
        mut targets: Vec<NodeId>,
        payload: &[u8],
        deadline_ms: u64,
    ) -> bool {
        let WriteScope {
            namespace,
            partition,
            cluster_key,
            regime,
            txn,
        } = scope;
        let mut acknowledged: Vec<NodeId> = Vec::new();
        let mut payload = std::borrow::Cow::Borrowed(payload);
        // A replica answered 4 (malformed) last round.
        let mut refused = false;
        for round in 0..MAX_ATTEMPTS {
            targets.retain(|target| !acknowledged.contains(target));
            if targets.is_empty() {
                return true;
            }
            if self.cluster().cluster_key != cluster_key {
                // The view changed before every replica acknowledged: the
                // new master may already have written the record, so this
                // write is in doubt (9), never acknowledged.
                break;
            }
            let remaining = self.remaining(deadline_ms);
            if remaining.is_zero() {
                break;
            }
            if round > 0 {
                self.stats
                    .replica_write_retries
                    .fetch_add(targets.len() as u64, Ordering::Relaxed);
                if let Some(namespace) = self.namespace(namespace.as_bytes()) {
                    refresh_truncation(namespace, payload.to_mut());
                }
            }
            if std::mem::take(&mut refused) && drop_xdr_mark(payload.to_mut()) {
                tracing::info!(
                    namespace,
                    "a replica refused a copy with the XDR mark (a build from before the mark?): sent again without it"
                );
            }
            let (kind, payload) = replica_call(regime, txn, &payload);
            let payload: &[u8] = &payload;
            let timeout = remaining.min(Duration::from_millis(ATTEMPT_TIMEOUT_MS));
            let send = |target: NodeId| async move {
                let answer = fabric.call(target, kind, payload.to_vec(), timeout).await;
                match answer.as_deref() {
                    Ok([code]) => Some(*code),
                    _ => None,
                }
            };
            // Replication factor 2: one replica, awaited directly.
            let results = match targets.as_slice() {
                [target] => vec![send(*target).await],
                _ => join_all(targets.iter().map(|target| send(*target)).collect()).await,
            };
            let mut malformed = false;
            for (target, answer) in targets.iter().zip(results) {
                match answer {
                    Some(code) if code == ResultCode::Ok.code() => acknowledged.push(*target),
                    Some(code) => malformed |= code == ResultCode::Parameter.code(),
                    None => {}
                }
            }
            refused = malformed;
            if regime.is_some() {
                // Strong consistency: the replicas of the write's regime,
                // never looked up again: a view published meanwhile may
                // list none (the partition unavailable there), which must
                // not count as every replica having acknowledged. The
                // check above ends the loop when the view changed.
                continue;
            }
            targets = self.write_targets(namespace, partition);
            if let Some(acting) = self.migrations.acting_target(namespace, partition) {
                if !targets.contains(&acting) && acting != self.node_id {
                    targets.push(acting);
                }
            }
        }
        tracing::debug!(
            ?targets,
            "replica write not acknowledged before the deadline"
        );
        false
    }

    /// The replicas of `partition` in the current view other than this
    /// node: the SC map's for a strong-consistency namespace, else the
    /// AP map's.
    fn write_targets(&self, namespace: &str, partition: PartitionId) -> Vec<NodeId> {
        let cluster = self.cluster();
        let Some(namespace) = self.namespace(namespace.as_bytes()) else {
            return Vec::new();
        };
        data_path::replicas_for(&cluster, namespace, partition)
            .iter()
            .copied()
            .filter(|node| *node != self.node_id)
            .collect()
    }

    /// Strong consistency: a record whose state reached every replica is
    /// replicated; one whose replication failed is unreplicated (its
    /// client was answered 9, in doubt) and no read serves it before its
    /// state was replicated again.
    fn note_sc_outcome(&self, namespace: &str, payload: &[u8], done: bool) {
        let Some(write) =
            split_replica_payload(payload).and_then(|(_, _, write)| ReplicaWrite::decode(write))
        else {
            return;
        };
        if done {
            self.sc_unreplicated.clear(namespace, &write.digest);
        } else {
            self.sc_unreplicated.mark(namespace, write.digest);
        }
    }

    /// Answers an `SC_REPLICA_WRITE` call: refused (7) unless this node's
    /// decided SC map is in the regime the write carries and lists this
    /// node among the partition's replicas ([`data_path::regime_admits`]),
    /// then checked and stored as a `REPLICA_WRITE` (which also refuses
    /// another view's). A marker of a record the master does not know
    /// (generation 0, a read's confirmation) stores nothing.
    fn serve_sc_replica_write(&self, payload: &[u8]) -> ResultCode {
        let cluster = self.cluster();
        let Some((regime, txn, rest)) = data_path::split_sc_payload(payload) else {
            return self.refuse_malformed("an SC replica write too short for its regime");
        };
        let Some((key, truncated_before, write)) = split_replica_payload(rest) else {
            return self.refuse_malformed("a replica write too short for its header");
        };
        let Some(write) = ReplicaWrite::decode(write) else {
            return self.refuse_malformed("a replica write that does not decode");
        };
        let partition = write.digest.partition();
        if key != cluster.cluster_key
            || !data_path::regime_admits(
                &cluster,
                self.node_id,
                &write.namespace,
                partition,
                regime,
            )
        {
            return ResultCode::ClusterKeyMismatch;
        }
        let stored = if write.body.is_none() && write.generation == 0 {
            ResultCode::Ok
        } else {
            apply_copy_admitted(self, &write, truncated_before, Admit::Always)
        };
        if stored != ResultCode::Ok || txn.is_empty() {
            return stored;
        }
        self.store_txn_copy(&write, txn)
    }

    /// Makes the transaction state an SC replica write carried this
    /// node's, after its record's copy was stored
    /// ([`txn_replica::apply`]); one that does not decode is malformed.
    fn store_txn_copy(&self, write: &ReplicaWrite, txn: &[u8]) -> ResultCode {
        let Some(namespace) = self.namespace(write.namespace.as_bytes()) else {
            return ResultCode::Namespace;
        };
        let Some(copy) = TxnCopy::decode(namespace, txn) else {
            return self.refuse_malformed("a transaction state that does not decode");
        };
        match txn_replica::apply(namespace, write, copy, self.now()) {
            Ok(()) => ResultCode::Ok,
            Err(code) => code,
        }
    }

    /// The call re-sending a queued record's state (`payload`): a
    /// `REPLICA_WRITE`, or for a strong-consistency namespace an
    /// `SC_REPLICA_WRITE` in the current regime — only from the regime's
    /// master (a replica write from anyone else is refused; a read of the
    /// record re-replicates it anyway), `None` elsewhere.
    fn reconcile_call(
        &self,
        cluster: &crate::cluster_state::ClusterState,
        namespace: &Namespace,
        entry: &PendingReconcile,
        payload: &[u8],
    ) -> Option<(u8, Vec<u8>)> {
        if !data_path::is_sc(namespace) {
            return Some(replica_call(None, &[], payload));
        }
        let replicas = data_path::replicas_for(cluster, namespace, entry.partition);
        let regime = data_path::regime_of(cluster, &entry.namespace)?;
        let txn = TxnCopy::capture(namespace, &entry.digest).encode(namespace);
        (replicas.first() == Some(&self.node_id)).then(|| replica_call(Some(regime), &txn, payload))
    }

    /// What a reconcile sends of `digest`: this node's copy or tombstone,
    /// or, for a record only a transaction holds (strong consistency), a
    /// marker without a generation that carries its transaction state.
    fn reconcile_state(&self, namespace: &Namespace, digest: &Digest) -> Option<ReplicaWrite> {
        fetch(namespace, digest, self.now()).or_else(|| {
            let held = TxnCopy::capture(namespace, digest);
            let marker =
                data_path::regime_marker(&namespace.config.name, digest, self.now().unix_ms);
            (data_path::is_sc(namespace) && !held.is_empty()).then_some(marker)
        })
    }

    /// Queues the record a replica write was about for
    /// [`Distribution::reconcile_pending`]: the write was not acknowledged by
    /// every replica, so some may lack this node's copy.
    pub fn queue_reconcile(&self, namespace: &str, partition: PartitionId, payload: &[u8]) {
        let Some(write) =
            split_replica_payload(payload).and_then(|(_, _, write)| ReplicaWrite::decode(write))
        else {
            return;
        };
        self.queue_reconcile_record(namespace, partition, write.digest);
    }

    /// Queues `digest`'s state for [`Distribution::reconcile_pending`]:
    /// for a strong-consistency namespace its transaction state goes with
    /// it (the service queues the records transactions hold on the
    /// partitions this node masters after each view change, so a replica
    /// that a fill brought in gets them).
    pub fn queue_reconcile_record(&self, namespace: &str, partition: PartitionId, digest: Digest) {
        let mut pending = self.reconciles.pending.lock();
        if pending.len() >= RECONCILE_QUEUE_MAX {
            self.stats
                .reconciles_dropped
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        pending.push(PendingReconcile {
            namespace: namespace.to_owned(),
            partition,
            digest,
            since_ms: self.now().unix_ms,
        });
    }

    /// Sends the state this node holds of each queued record (a copy or
    /// a tombstone; nothing for a record it no longer knows) to the
    /// record's replicas in the current map, under the current view, so
    /// the copies converge by conflict resolution. A record stays queued
    /// until every one of them acknowledged, for up to
    /// [`RECONCILE_FOR_MS`] (a replica of another view refuses until it
    /// has this one; a lost message is sent again). The migration driver
    /// calls it each step, so it runs in the server and the simulator
    /// alike; up to [`RECONCILE_BATCH`] records a call, their sends at
    /// once.
    pub async fn reconcile_pending(&self, fabric: &dyn Fabric) {
        let batch: Vec<PendingReconcile> = {
            let mut pending = self.reconciles.pending.lock();
            let take = pending.len().min(RECONCILE_BATCH);
            pending.drain(..take).collect()
        };
        if batch.is_empty() {
            return;
        }
        let cluster = self.cluster();
        let now_ms = self.now().unix_ms;
        let timeout = Duration::from_millis(ATTEMPT_TIMEOUT_MS);
        let mut sends = Vec::new();
        let mut owners = Vec::new();
        for (at, entry) in batch.iter().enumerate() {
            let Some(namespace) = self.namespace(entry.namespace.as_bytes()) else {
                continue;
            };
            let Some(current) = self.reconcile_state(namespace, &entry.digest) else {
                continue;
            };
            let payload = replica_payload(cluster.cluster_key, namespace, &current);
            let Some((kind, payload)) = self.reconcile_call(&cluster, namespace, entry, &payload)
            else {
                continue;
            };
            for target in data_path::replicas_for(&cluster, namespace, entry.partition) {
                if *target != self.node_id {
                    sends.push(fabric.call(*target, kind, payload.clone(), timeout));
                    owners.push(at);
                }
            }
        }
        let answers = join_all(sends).await;
        // Per queued record: sent to some replica, and refused or lost.
        let mut sent = vec![false; batch.len()];
        let mut unacknowledged = vec![false; batch.len()];
        for (at, answer) in owners.into_iter().zip(answers) {
            sent[at] = true;
            if !matches!(answer.as_deref(), Ok([code]) if *code == ResultCode::Ok.code()) {
                unacknowledged[at] = true;
            }
        }
        let mut again = Vec::new();
        for ((entry, sent), unacknowledged) in batch.into_iter().zip(sent).zip(unacknowledged) {
            if !unacknowledged {
                // Nothing to send (the record is gone here, or no other
                // replica is left) ends it too.
                if sent {
                    self.sc_unreplicated.clear(&entry.namespace, &entry.digest);
                    self.stats.reconciles_done.fetch_add(1, Ordering::Relaxed);
                }
            } else if now_ms.saturating_sub(entry.since_ms) < RECONCILE_FOR_MS {
                again.push(entry);
            } else {
                self.stats
                    .reconciles_dropped
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(namespace = %entry.namespace, partition = ?entry.partition, "a record's replicas did not acknowledge its state in time; migrations and duplicate resolution remain");
            }
        }
        if !again.is_empty() {
            let mut pending = self.reconciles.pending.lock();
            again.append(&mut pending);
            *pending = again;
        }
    }
    /// Duplicate resolution: asks every member in `sources` for its copy
    /// of the record at once, applies each copy with the replica-write
    /// rule (only when newer), and marks the partition's incoming
    /// migration over when every member has nothing more to send. False
    /// when some member did not answer in time (the caller answers 9,
    /// nothing executed: the record's newest version may be there, and
    /// executing without it could lose an update).
    async fn resolve(
        &self,
        fabric: &dyn Fabric,
        request: &DupResRequest,
        sources: Vec<NodeId>,
        deadline_ms: u64,
    ) -> bool {
        self.migrations.dupres_runs.fetch_add(1, Ordering::Relaxed);
        let timeout = self
            .remaining(deadline_ms)
            .min(Duration::from_millis(DUPRES_TIMEOUT_MS));
        if timeout.is_zero() {
            return false;
        }
        let payload = request.encode();
        let ask = |source: NodeId| {
            let payload = payload.clone();
            async move {
                let answer = fabric
                    .call(source, call_kind::DUPRES, payload, timeout)
                    .await;
                answer.ok().and_then(|bytes| DupResAnswer::decode(&bytes))
            }
        };
        let answers = join_all(sources.iter().map(|source| ask(*source)).collect()).await;
        for answer in answers {
            let Some(answer) = answer else {
                return false;
            };
            if !self.apply_dupres_answer(request, answer) {
                return false;
            }
        }
        true
    }

    /// Applies one member's duplicate-resolution answer: its copy by the
    /// replica-write rule, then its transaction state as a fill does
    /// ([`txn_replica::fill`]: only what this node lacks, never a lock
    /// of a transaction settled here) — a record only a transaction holds
    /// is answered with the state alone. False when the answer is not
    /// one to apply (malformed: counted) or its copy was refused.
    fn apply_dupres_answer(&self, request: &DupResRequest, answer: DupResAnswer) -> bool {
        let Some(namespace) = self.namespace(request.namespace.as_bytes()) else {
            return false;
        };
        let state = match answer.txn.is_empty() {
            true => None,
            false => match TxnCopy::decode(namespace, &answer.txn) {
                Some(state) => Some(state),
                None => {
                    self.refuse_malformed("a duplicate-resolution answer's transaction state");
                    return false;
                }
            },
        };
        let write = match answer.record {
            Some(record) => {
                if record.namespace != request.namespace || record.digest != request.digest {
                    self.refuse_malformed("a duplicate-resolution answer naming another record");
                    return false;
                }
                if apply_copy(self, &record, answer.truncated_before) != ResultCode::Ok {
                    return false;
                }
                record
            }
            None => data_path::regime_marker(&request.namespace, &request.digest, 0),
        };
        if let Some(state) = state.filter(|_| data_path::is_sc(namespace)) {
            txn_replica::fill(namespace, &write, state, self.now());
        }
        true
    }

    /// Stores a replica write (under the current view) if this node is
    /// one of the partition's replicas, or if it still holds a copy of the
    /// partition (the acting master while the master fills, a source whose
    /// copy is not dropped yet); refuses it with
    /// [`ResultCode::Unavailable`] otherwise. A write that reaches a node
    /// after it dropped its copy — a resend to the acting master that the
    /// network held up past the end of the migration — would otherwise
    /// bring back a copy outside the replica list that no one drops. The
    /// "still holds" check and the store are one critical section
    /// ([`Admit::IfHeld`]).
    fn store_replica_write(
        &self,
        cluster: &crate::cluster_state::ClusterState,
        write: &ReplicaWrite,
        truncated_before: u64,
    ) -> ResultCode {
        let replica = cluster.namespace(&write.namespace).is_some_and(|map| {
            map.map
                .replicas(write.digest.partition())
                .contains(&self.node_id)
        });
        let admit = if replica {
            Admit::Always
        } else {
            Admit::IfHeld
        };
        let code = apply_copy_admitted(self, write, truncated_before, admit);
        if admit == Admit::IfHeld && code == ResultCode::Unavailable {
            self.stats
                .replica_writes_refused_not_holder
                .fetch_add(1, Ordering::Relaxed);
        }
        code
    }

    /// Answers a `REPLICA_WRITE` call: refused (7) under another view or
    /// for a strong-consistency namespace (whose writes carry their regime:
    /// `SC_REPLICA_WRITE`), refused as malformed ([`ResultCode::Parameter`],
    /// counted) when it does not decode, else stored by
    /// [`Distribution::store_replica_write`].
    fn serve_replica_write(&self, payload: &[u8]) -> ResultCode {
        let cluster = self.cluster();
        let Some((key, truncated_before, write)) = split_replica_payload(payload) else {
            return self.refuse_malformed("a replica write too short for its header");
        };
        if key != cluster.cluster_key {
            return ResultCode::ClusterKeyMismatch;
        }
        let Some(write) = ReplicaWrite::decode(write) else {
            return self.refuse_malformed("a replica write that does not decode");
        };
        if self
            .namespace(write.namespace.as_bytes())
            .is_some_and(data_path::is_sc)
        {
            return ResultCode::ClusterKeyMismatch;
        }
        self.store_replica_write(&cluster, &write, truncated_before)
    }

    /// Answers a `DUPRES` call: this node's copy of the record (or its
    /// delete marker) with its truncation threshold and, on a
    /// strong-consistency namespace, its transaction state; nothing for a
    /// request that does not decode or names an unknown namespace.
    fn serve_dupres(&self, payload: &[u8]) -> Vec<u8> {
        let Some(request) = DupResRequest::decode(payload) else {
            return Vec::new();
        };
        let Some(namespace) = self.namespace(request.namespace.as_bytes()) else {
            return Vec::new();
        };
        self.migrations.hit(
            &request.namespace,
            request.digest.partition().index() as u16,
        );
        let (record, state) = txn_replica::fetch_with_state(namespace, &request.digest, self.now());
        let truncated_before = record
            .as_ref()
            .map_or(0, |record| truncated_before_of(namespace, &record.set_name));
        let txn = match data_path::is_sc(namespace) && !state.is_empty() {
            true => state.encode(namespace),
            false => Vec::new(),
        };
        DupResAnswer {
            record,
            truncated_before,
            txn,
        }
        .encode()
    }

    /// Counts and logs malformed input from another node (`what` says
    /// what was wrong); the answer to send back.
    pub(crate) fn refuse_malformed(&self, what: &str) -> ResultCode {
        self.stats
            .peer_messages_malformed
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!("refused malformed input from a peer: {what}");
        ResultCode::Parameter
    }

    fn remaining(&self, deadline_ms: u64) -> Duration {
        Duration::from_millis(deadline_ms.saturating_sub(self.clock().now_unix_ms()))
    }

    /// Serves one fabric call of this layer's from another node (replica
    /// writes, migrations, exchanges, drops, manifests, truncations,
    /// duplicate resolution, proxied requests, which run through
    /// `executor`); `None` for a kind of the layers above.
    pub async fn serve_call(
        &self,
        kind: u8,
        payload: &[u8],
        executor: &dyn LocalExecutor,
    ) -> Option<Vec<u8>> {
        Some(match kind {
            call_kind::REPLICA_WRITE => vec![self.serve_replica_write(payload).code()],
            call_kind::SC_REPLICA_WRITE => vec![self.serve_sc_replica_write(payload).code()],
            call_kind::MIGRATE => vec![self.apply_migrate_batch(payload).code()],
            call_kind::EXCHANGE => match <[u8; 8]>::try_from(payload) {
                Ok(key) => self.migrations.exchange_answer(u64::from_be_bytes(key)),
                Err(_) => Vec::new(),
            },
            call_kind::DROP => vec![self.retire_copy(payload).code()],
            call_kind::CLEAR => vec![self.clear_untrusted_copy(payload).code()],
            call_kind::MANIFEST => self.manifest(payload),
            call_kind::ROSTERS => match std::str::from_utf8(payload) {
                Ok(text) => {
                    self.merge_rosters(text);
                    vec![ResultCode::Ok.code()]
                }
                Err(_) => vec![ResultCode::Parameter.code()],
            },
            call_kind::TRUNCATIONS => match std::str::from_utf8(payload) {
                Ok(text) => {
                    self.merge_truncations(text);
                    let mut answer = vec![ResultCode::Ok.code()];
                    answer.extend_from_slice(self.truncations_text().as_bytes());
                    answer
                }
                Err(_) => vec![ResultCode::Parameter.code()],
            },
            // A node not in a view yet (restarted under the same id before
            // the others noticed) knows nothing of the record: no answer
            // (the asking master answers 9), never "absent".
            call_kind::DUPRES if self.is_orphan() => Vec::new(),
            call_kind::DUPRES => self.serve_dupres(payload),
            call_kind::PROXY if self.is_orphan() => {
                // Not in a view yet: it must not execute on an empty copy.
                let mut out = Vec::new();
                transaction::write_result(&mut out, ResultCode::Unavailable);
                out
            }
            call_kind::PROXY => {
                let mut out = Vec::new();
                let Some((hop, body)) = Hop::decode(payload) else {
                    transaction::write_result(&mut out, ResultCode::Parameter);
                    return Some(out);
                };
                self.stats.proxied_in.fetch_add(1, Ordering::Relaxed);
                if let Some(remote) = executor.execute_single(body, hop, &mut out) {
                    self.complete(*remote, executor, &mut out).await;
                }
                out
            }
            _ => return None,
        })
    }
}

/// Runs every future concurrently; their outputs in order.
pub async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|context| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(context) {
                    std::task::Poll::Ready(value) => *output = Some(value),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

/// True when `bytes` is exactly one proto frame.
pub fn is_whole_frame(bytes: &[u8]) -> bool {
    bytes
        .get(..PROTO_HEADER_SIZE)
        .and_then(|header| <&[u8; PROTO_HEADER_SIZE]>::try_from(header).ok())
        .and_then(|header| ProtoHeader::decode(header).ok())
        .is_some_and(|header| header.size as usize + PROTO_HEADER_SIZE == bytes.len())
}
