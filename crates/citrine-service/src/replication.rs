//! Data distribution on the request path (AP mode): synchronous replication
//! of writes from a partition's master to its replicas, and proxying of
//! single-record requests that reach a node which does not master the
//! record's partition.
//!
//! The service owns no sockets: it talks to other nodes through a
//! [`Fabric`] handle the server installs ([`crate::Service::set_fabric`]),
//! which sends a payload to a node and resolves to that node's answer.
//!
//! Routing ([`route`]), once the node is in a cluster of more than one
//! member and a fabric is installed:
//! - the current partition map's master of the record's partition executes
//!   the request; any other node forwards the request body to the master
//!   ([`call_kind::PROXY`], payload `u8 hops | u64 deadline | AS_MSG body`,
//!   see [`Hop`]) and returns the
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
//!   that do not acknowledge are sent the write again, in rounds, until the
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
//!   it ([`Service::reconcile_pending`], for up to [`RECONCILE_FOR_MS`]),
//!   so the copies converge by conflict resolution even where the next
//!   view finds the partition's versions equal and migrates nothing;
//! - a proxied request is sent once (it may not be idempotent); no answer
//!   before the deadline → 9. The deadline travels with it (the first
//!   node's clock), and the master refuses it with 9 (counted in
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
//!   copy applied with the replica-write rule, then the request executes;
//!   a source that does not answer in time (or whose copy cannot be
//!   applied) → 9, not executed — the client retries — rather than a
//!   possible lost update. Reads of a partition whose master
//!   holds nothing go to its acting master (hop flag [`PROXY_ACTING`]);
//! - a node that is not in a view yet ([`crate::Service::set_orphan`])
//!   answers proxied requests 11 and duplicate-resolution requests nothing:
//!   it never executes on, or vouches for, copies it does not have.
//!
//! Invariants:
//! - no partition lock is held across an await: the local write runs to
//!   completion under its lock, the lock is released, the state is captured
//!   under a read lock, and only then are the replicas awaited;
//! - a replica applies a replica write only when it wins over its copy
//!   under the namespace's `conflict-resolution-policy`
//!   ([`crate::namespace::compare_versions`]: the record's life first, then
//!   generation then last-update time by default, or last-update time then
//!   generation; a delete marker carries its tombstone's life and
//!   generation), so retries and reordered deliveries are harmless;
//! - a node alone (or without a fabric) never enters this module's async
//!   path and allocates nothing for it.
//!
//! Batch rows in a cluster take the same route one by one
//! ([`crate::batch`]); a read-touch that rewrote the record is replicated
//! like a write; scans serve only whole, mastered partitions
//! ([`crate::scan`]). Migrations ([`crate::migration`])
//! send records in this module's [`ReplicaWrite`] encoding and apply them
//! with the same rule.

use crate::migration::{Disposition, MasterClaim};
use crate::namespace::Namespace;
use crate::transaction::{self, Request};
use crate::udf::UdfCall;
use crate::Service;
pub use citrine_data::copy::{
    capture, copy_holds, delete_marker, fetch, generation_of, store_copy, truncated_before_of,
    Admit, Reader, ReplicaWrite,
};
use citrine_types::{Digest, NodeId, PartitionId, ResultCode, DIGEST_SIZE};
use citrine_wire::frame::{ProtoHeader, PROTO_HEADER_SIZE};
use citrine_wire::msg::info2;
use std::future::Future;
use std::pin::Pin;
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
pub(crate) struct Hop {
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
    /// (it waited in a stalled node's socket: [`Service::handle_streaming_since`])
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
    fn payload(byte: u8, deadline_ms: u64, body: &[u8]) -> Vec<u8> {
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

/// How long a record queued for [`Service::reconcile_pending`] is sent
/// again before it is given up on (ms).
pub const RECONCILE_FOR_MS: u64 = 30_000;
/// Most records one [`Service::reconcile_pending`] call sends.
const RECONCILE_BATCH: usize = 256;
/// Most records queued at once; more are counted and dropped.
const RECONCILE_QUEUE_MAX: usize = 100_000;

/// Records whose replicas may lack this node's copy (a replica write that
/// was not acknowledged by all of them), for
/// [`Service::reconcile_pending`].
#[derive(Default)]
pub(crate) struct Reconciles {
    pending: parking_lot::Mutex<Vec<PendingReconcile>>,
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

/// A member's answer to a [`DupResRequest`]: `u8 flags | (FOUND) u64
/// truncated before | replica write`. The replica write is a delete marker
/// when the member keeps the record's tombstone; the word before it is the
/// member's truncation threshold for the record's set (see
/// [`replica_payload`]), which the asking master applies to its own copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DupResAnswer {
    /// The member's live copy (full state), or `None` when absent.
    pub record: Option<ReplicaWrite>,
    /// The member's truncation threshold for the record's set (0: none, or
    /// no record).
    pub truncated_before: u64,
}

const DUPRES_FOUND: u8 = 2;

impl DupResAnswer {
    pub fn encode(&self) -> Vec<u8> {
        let mut flags = 0;
        let record = self.record.as_ref().map(ReplicaWrite::encode);
        if record.is_some() {
            flags |= DUPRES_FOUND;
        }
        let mut out = vec![flags];
        if let Some(record) = record {
            out.extend_from_slice(&self.truncated_before.to_be_bytes());
            out.extend_from_slice(&record);
        }
        out
    }

    /// Decodes; `None` for anything malformed.
    pub fn decode(bytes: &[u8]) -> Option<DupResAnswer> {
        let (&flags, rest) = bytes.split_first()?;
        if flags & !DUPRES_FOUND != 0 {
            return None;
        }
        if flags & DUPRES_FOUND == 0 {
            return rest.is_empty().then_some(DupResAnswer {
                record: None,
                truncated_before: 0,
            });
        }
        let (truncated_before, record) = rest.split_first_chunk::<8>()?;
        Some(DupResAnswer {
            record: Some(ReplicaWrite::decode(record)?),
            truncated_before: u64::from_be_bytes(*truncated_before),
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
pub(crate) enum Remote {
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

/// Runs a single-record request in a cluster: forwards it to the master, or
/// executes it here and returns the replication still to do. `body` is the
/// request's AS_MSG body (forwarded as is), `hop` how it came here.
#[allow(clippy::too_many_arguments)]
pub(crate) fn route(
    service: &Service,
    namespace: &Namespace,
    request: &Request<'_>,
    udf: Option<&UdfCall<'_>>,
    body: &[u8],
    hop: Hop,
    resolved: bool,
    out: &mut Vec<u8>,
) -> Option<Box<Remote>> {
    let now = service.now();
    let hops = hop.count();
    if hops != 0 && service.cluster_stalled(now.unix_ms) {
        // Forwarded by a peer (a client's own request was checked on
        // arrival, in `Service::handle_message`): the cluster runtime has
        // not run for longer than the heartbeat timeout, and the peers may
        // have moved on without this node.
        service
            .stats
            .stall_refusals
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        transaction::write_result(out, ResultCode::Unavailable);
        return None;
    }
    let cluster = service.cluster();
    let partition = request.digest.partition();
    let name = &namespace.config.name;
    let replicas = cluster
        .namespace(name)
        .map_or(&[][..], |map| map.map.replicas(partition));
    let deadline_ms = match hop.deadline_ms {
        Some(deadline_ms) => {
            // Fixed earlier: by the node that forwarded it (on that node's
            // clock, hence the margin), or here before its duplicate
            // resolution, or here from a stall it waited through
            // (`Service::handle_streaming_since`).
            let margin = if hops == 0 { 0 } else { PROXY_CLOCK_MARGIN_MS };
            if now.unix_ms.saturating_add(margin) >= deadline_ms {
                service
                    .stats
                    .expired_refusals
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                transaction::write_result(out, ResultCode::Timeout);
                return None;
            }
            deadline_ms
        }
        None => {
            now.unix_ms
                + match request.header.transaction_ttl {
                    0 => DEFAULT_DEADLINE_MS,
                    ttl => u64::from(ttl),
                }
        }
    };
    let acting_read = hop.byte & PROXY_ACTING != 0;
    // A record UDF may write whatever its header says.
    let read = request.header.info2 & info2::WRITE == 0 && udf.is_none();
    let proxy = |to: NodeId, flags: u8, out: &mut Vec<u8>| {
        if hops >= MAX_PROXY_HOPS {
            service
                .stats
                .proxy_hops_exceeded
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            transaction::write_result(out, ResultCode::Timeout);
            return None;
        }
        Some(Box::new(Remote::Proxy {
            to,
            payload: Hop::payload((hops + 1) | flags, deadline_ms, body),
            deadline_ms,
        }))
    };
    match replicas.first() {
        Some(master) if *master != service.node_id => {
            // A plain read (no read-touch) sent here by a client, while
            // this node claims the master column as the acting master.
            let claimed_read = read
                && !acting_read
                && !(1..=100).contains(&request.header.record_ttl)
                && service
                    .migrations
                    .master_claim(name, partition, service.node_id)
                    == MasterClaim::Acting;
            if (acting_read || claimed_read)
                && read
                && service
                    .migrations
                    .is_acting(name, partition, service.node_id)
            {
                // The master is filling and this node holds the copy.
                service
                    .migrations
                    .acting_reads
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                transaction::perform_here(namespace, request, udf, now, out);
                return None;
            }
            // A plain read (a client reading from replicas by policy) on a
            // replica whose copy is whole is served here: every
            // acknowledged write reached this copy before it was acked.
            if read
                && !(1..=100).contains(&request.header.record_ttl)
                && replicas[1..].contains(&service.node_id)
                && service.migrations.serves_whole(name, partition)
            {
                service
                    .stats
                    .replica_reads
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                transaction::perform_here(namespace, request, udf, now, out);
                return None;
            }
            return proxy(*master, 0, out);
        }
        _ => {}
    }
    if !resolved {
        // A read-touch may rewrite the record: it runs here, like a write,
        // never at the acting master.
        let plain_read = read && !(1..=100).contains(&request.header.record_ttl);
        match service.migrations.disposition(name, partition, plain_read) {
            Disposition::Normal => {}
            Disposition::Acting(acting) => return proxy(acting, PROXY_ACTING, out),
            Disposition::DupRes {
                cluster_key,
                sources,
            } if !sources.is_empty() => {
                return Some(Box::new(Remote::DupRes {
                    request: DupResRequest {
                        cluster_key,
                        namespace: name.clone(),
                        digest: request.digest,
                    },
                    sources,
                    body: body.to_vec(),
                    hop: Hop {
                        byte: hop.byte,
                        deadline_ms: Some(deadline_ms),
                    },
                }));
            }
            Disposition::DupRes { .. } => {}
        }
    }
    let start = out.len();
    // A read-touch (read with a TTL percentage) may rewrite the record's
    // void time and generation: then it is replicated like a write.
    let touch = read && (1..=100).contains(&request.header.record_ttl);
    let generation_before = touch.then(|| generation_of(namespace, &request.digest));
    transaction::perform_here(namespace, request, udf, now, out);
    if read
        && generation_before
            .is_none_or(|before| before == generation_of(namespace, &request.digest))
    {
        return None;
    }
    let mut targets = replicas.get(1..).unwrap_or_default().to_vec();
    if let Some(acting) = service.migrations.acting_target(name, partition) {
        if !targets.contains(&acting) && acting != service.node_id {
            targets.push(acting);
        }
    }
    if targets.is_empty() {
        return None;
    }
    // Result code: proto header, then byte 5 of the message header.
    if out.get(start + PROXY_RESULT_AT).copied() != Some(0) {
        return None;
    }
    let write = capture(namespace, &request.digest, now);
    Some(Box::new(Remote::Replicate {
        namespace: name.clone(),
        partition,
        targets,
        cluster_key: cluster.cluster_key,
        payload: replica_payload(cluster.cluster_key, namespace, &write),
        deadline_ms,
    }))
}

/// Where a replicated write belongs: its partition, under the view (cluster
/// key) it was executed in.
#[derive(Debug, Clone, Copy)]
struct WriteScope<'a> {
    namespace: &'a str,
    partition: PartitionId,
    cluster_key: u64,
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

/// Writes the namespace's current truncation threshold for the record's
/// set into a `REPLICA_WRITE` payload about to be sent again: a truncation
/// made since it was built must travel with it, or the replica could keep
/// the old copy over a newer one written after the truncation.
pub(crate) fn refresh_truncation(namespace: &Namespace, payload: &mut [u8]) {
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
pub fn apply_replica_write(service: &Service, write: &ReplicaWrite) -> ResultCode {
    apply_copy(service, write, 0)
}

/// Applies a copy of a record from another node — a master's replica
/// write, a migrated record, a duplicate-resolution answer — which that
/// node sent with its truncation threshold for the record's set
/// (`truncated_before`, see [`replica_payload`]), to this node's copy. A
/// threshold later than this node's is first taken as its own
/// ([`Service::adopt_carried_truncation`]).
pub fn apply_copy(service: &Service, write: &ReplicaWrite, truncated_before: u64) -> ResultCode {
    apply_copy_admitted(service, write, truncated_before, Admit::Always)
}

fn apply_copy_admitted(
    service: &Service,
    write: &ReplicaWrite,
    truncated_before: u64,
    admit: Admit,
) -> ResultCode {
    let Some(namespace) = service.namespace(write.namespace.as_bytes()) else {
        return ResultCode::Namespace;
    };
    if truncated_before > 0
        && namespace
            .sets
            .id_of(&write.set_name)
            .is_some_and(|set_id| truncated_before > namespace.truncated_before(set_id))
    {
        // The sender knows a truncation this node has not heard of yet.
        service.adopt_carried_truncation(&write.namespace, &write.set_name, truncated_before);
    }
    match store_copy(namespace, write, service.now(), truncated_before, admit) {
        Ok(()) => ResultCode::Ok,
        Err(code) => code,
    }
}

impl Service {
    /// Finishes a request's fabric work and leaves its final reply in `out`.
    pub(crate) async fn complete(&self, remote: Remote, out: &mut Vec<u8>) {
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
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    transaction::write_result(out, ResultCode::Timeout);
                    return;
                }
                match self.execute_resolved(&body, hop, out) {
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
            } => {
                let done = self
                    .replicate(
                        fabric.as_ref(),
                        WriteScope {
                            namespace: &namespace,
                            partition,
                            cluster_key,
                        },
                        targets,
                        &payload,
                        deadline_ms,
                    )
                    .await;
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

    /// Sends a replica write until every replica of the partition in the
    /// current map (other than this node) has acknowledged it, or the
    /// deadline passes. Works in rounds: each round sends to every replica
    /// that has not acknowledged yet, all at once, and waits up to
    /// [`ATTEMPT_TIMEOUT_MS`]; then the replica list is looked up again, so
    /// a replica that left the map is no longer waited for and a node that
    /// joined the partition's list gets the write too.
    async fn replicate(
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
        } = scope;
        let mut acknowledged: Vec<NodeId> = Vec::new();
        let mut payload = std::borrow::Cow::Borrowed(payload);
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
                    .fetch_add(targets.len() as u64, std::sync::atomic::Ordering::Relaxed);
                if let Some(namespace) = self.namespace(namespace.as_bytes()) {
                    refresh_truncation(namespace, payload.to_mut());
                }
            }
            let payload: &[u8] = &payload;
            let timeout = remaining.min(Duration::from_millis(ATTEMPT_TIMEOUT_MS));
            let send = |target: NodeId| async move {
                let answer = fabric
                    .call(target, call_kind::REPLICA_WRITE, payload.to_vec(), timeout)
                    .await;
                matches!(answer.as_deref(), Ok([code]) if *code == ResultCode::Ok.code())
            };
            // Replication factor 2: one replica, awaited directly.
            let results = match targets.as_slice() {
                [target] => vec![send(*target).await],
                _ => join_all(targets.iter().map(|target| send(*target)).collect()).await,
            };
            for (target, done) in targets.iter().zip(results) {
                if done {
                    acknowledged.push(*target);
                }
            }
            targets = self
                .cluster()
                .namespace(namespace)
                .map_or(Vec::new(), |map| {
                    map.map
                        .replicas(partition)
                        .iter()
                        .copied()
                        .filter(|node| *node != self.node_id)
                        .collect()
                });
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

    /// Queues the record a replica write was about for
    /// [`Service::reconcile_pending`]: the write was not acknowledged by
    /// every replica, so some may lack this node's copy.
    fn queue_reconcile(&self, namespace: &str, partition: PartitionId, payload: &[u8]) {
        let Some(write) =
            split_replica_payload(payload).and_then(|(_, _, write)| ReplicaWrite::decode(write))
        else {
            return;
        };
        let mut pending = self.reconciles.pending.lock();
        if pending.len() >= RECONCILE_QUEUE_MAX {
            self.stats
                .reconciles_dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return;
        }
        pending.push(PendingReconcile {
            namespace: namespace.to_owned(),
            partition,
            digest: write.digest,
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
    pub(crate) async fn reconcile_pending(&self, fabric: &dyn Fabric) {
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
            let Some(current) = fetch(namespace, &entry.digest, self.now()) else {
                continue;
            };
            let payload = replica_payload(cluster.cluster_key, namespace, &current);
            let Some(map) = cluster.namespace(&entry.namespace) else {
                continue;
            };
            for target in map.map.replicas(entry.partition) {
                if *target != self.node_id {
                    sends.push(fabric.call(
                        *target,
                        call_kind::REPLICA_WRITE,
                        payload.clone(),
                        timeout,
                    ));
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
                    self.stats
                        .reconciles_done
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            } else if now_ms.saturating_sub(entry.since_ms) < RECONCILE_FOR_MS {
                again.push(entry);
            } else {
                self.stats
                    .reconciles_dropped
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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
        self.migrations
            .dupres_runs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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
            if let Some(record) = answer.record {
                if record.namespace != request.namespace || record.digest != request.digest {
                    return false;
                }
                if apply_copy(self, &record, answer.truncated_before) != ResultCode::Ok {
                    return false;
                }
            }
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
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        code
    }

    fn remaining(&self, deadline_ms: u64) -> Duration {
        Duration::from_millis(deadline_ms.saturating_sub(self.clock().now_unix_ms()))
    }

    /// Serves one fabric call from another node; returns the answer.
    pub async fn serve_fabric(&self, kind: u8, payload: &[u8]) -> Vec<u8> {
        match kind {
            call_kind::REPLICA_WRITE => {
                let cluster = self.cluster();
                let code = match split_replica_payload(payload) {
                    Some((key, _, _)) if key != cluster.cluster_key => {
                        ResultCode::ClusterKeyMismatch
                    }
                    Some((_, truncated_before, write)) => match ReplicaWrite::decode(write) {
                        Some(write) => self.store_replica_write(&cluster, &write, truncated_before),
                        None => ResultCode::Parameter,
                    },
                    None => ResultCode::Parameter,
                };
                vec![code.code()]
            }
            call_kind::MIGRATE => vec![self.apply_migrate_batch(payload).code()],
            call_kind::EXCHANGE => match <[u8; 8]>::try_from(payload) {
                Ok(key) => self.migrations.exchange_answer(u64::from_be_bytes(key)),
                Err(_) => Vec::new(),
            },
            call_kind::DROP => vec![self.retire_copy(payload).code()],
            call_kind::MANIFEST => self.manifest(payload),
            call_kind::SINDEX_DEFINITIONS => match std::str::from_utf8(payload) {
                Ok(text) => {
                    self.merge_sindex_definitions(text);
                    vec![ResultCode::Ok.code()]
                }
                Err(_) => vec![ResultCode::Parameter.code()],
            },
            call_kind::UDF_MODULES => match std::str::from_utf8(payload) {
                Ok(text) => {
                    self.merge_udf_modules(text);
                    vec![ResultCode::Ok.code()]
                }
                Err(_) => vec![ResultCode::Parameter.code()],
            },
            call_kind::AGGREGATE_PART => self.serve_aggregate_part(payload).await,
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
            call_kind::DUPRES => {
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
                let record = fetch(namespace, &request.digest, self.now());
                let truncated_before = record
                    .as_ref()
                    .map_or(0, |record| truncated_before_of(namespace, &record.set_name));
                DupResAnswer {
                    record,
                    truncated_before,
                }
                .encode()
            }
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
                    return out;
                };
                self.stats
                    .proxied_in
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if let Some(remote) = self.execute_single(body, hop, &mut out) {
                    self.complete(*remote, &mut out).await;
                }
                out
            }
            _ => Vec::new(),
        }
    }
}

/// Runs every future concurrently; their outputs in order.
pub(crate) async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
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
fn is_whole_frame(bytes: &[u8]) -> bool {
    bytes
        .get(..PROTO_HEADER_SIZE)
        .and_then(|header| <&[u8; PROTO_HEADER_SIZE]>::try_from(header).ok())
        .and_then(|header| ProtoHeader::decode(header).ok())
        .is_some_and(|header| header.size as usize + PROTO_HEADER_SIZE == bytes.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn sample(body: Option<Vec<u8>>) -> ReplicaWrite {
        ReplicaWrite {
            namespace: "test".into(),
            digest: Digest([7; DIGEST_SIZE]),
            generation: 3,
            life: 0,
            durable: false,
            void_time: 1_000_000_000, // live: expires after the test clock's now
            last_update_ms: 99_000,
            set_name: b"demo".to_vec(),
            body,
        }
    }

    fn memory_service(node_id: u64) -> Service {
        memory_service_on(
            node_id,
            std::sync::Arc::new(crate::ManualClock::new(1_700_000_000_000)),
        )
    }

    /// A service with namespace `test` in memory, reading `clock`.
    fn memory_service_on(node_id: u64, clock: std::sync::Arc<crate::ManualClock>) -> Service {
        let config = crate::config::ServiceConfig::local(
            node_id,
            vec![crate::config::NamespaceConfig::in_memory("test")],
        );
        Service::new(config, clock)
    }

    /// The view of nodes 1 and 2 as node `me` holds it, under cluster key
    /// `key`: namespace `test`, replication factor 2.
    fn view_of_two(me: u64, key: u64) -> crate::cluster_state::ClusterState {
        let members = [1u64, 2].map(|id| crate::cluster_state::ClusterMember {
            node_id: NodeId(id),
            rack_id: 0,
            service_address: format!("127.0.0.1:{}", 3000 + id),
        });
        crate::cluster_state::ClusterState::new(
            NodeId(me),
            key,
            members.to_vec(),
            &[("test".into(), 2)],
            2,
            2,
        )
    }

    /// User keys `k0`..`k999` of set `demo` (with their digests) whose
    /// partition `node` masters in `state`.
    fn keys_mastered_by(
        state: &crate::cluster_state::ClusterState,
        node: u64,
    ) -> impl Iterator<Item = (String, Digest)> + '_ {
        use citrine_wire::digest::{of_key, UserKey};
        (0..1000)
            .map(|index| format!("k{index}"))
            .map(|key| {
                let digest = of_key("demo", &UserKey::String(key.clone()));
                (key, digest)
            })
            .filter(move |(_, digest)| {
                state.namespaces[0].map.master(digest.partition()) == Some(NodeId(node))
            })
    }

    fn namespace_of(service: &Service) -> &Namespace {
        service.namespace(b"test").expect("namespace test")
    }

    fn stored(service: &Service, digest: &Digest) -> Option<(citrine_index::RecordMeta, Vec<u8>)> {
        let namespace = service.namespace(b"test")?;
        let partition = namespace.index.partition(digest.partition()).read();
        let entry = partition.get(digest)?;
        let body = namespace.storage.read(&entry.location).ok()?.into_owned();
        Some((entry.meta(), body))
    }

    #[test]
    fn replicas_apply_newer_states_only() {
        let service = memory_service(7);
        let mut write = sample(Some(vec![1, 2, 3]));
        assert_eq!(apply_replica_write(&service, &write), ResultCode::Ok);
        let (meta, body) = stored(&service, &write.digest).expect("stored");
        assert_eq!(
            (meta.generation, meta.void_time, meta.last_update_ms),
            (3, 1_000_000_000, 99_000)
        );
        assert_eq!(body, vec![1, 2, 3]);
        assert_eq!(
            service
                .namespace(b"test")
                .map(|ns| ns.sets.existing_id(b"demo")),
            Some(Some(meta.set_id))
        );
        // A retry of the same state and an older state change nothing.
        assert_eq!(apply_replica_write(&service, &write), ResultCode::Ok);
        let older = ReplicaWrite {
            generation: 2,
            life: 0,
            durable: false,
            last_update_ms: 98_000,
            body: Some(vec![9]),
            ..write.clone()
        };
        assert_eq!(apply_replica_write(&service, &older), ResultCode::Ok);
        assert_eq!(
            stored(&service, &write.digest).map(|(_, body)| body),
            Some(vec![1, 2, 3])
        );
        // A newer state replaces it; a newer delete removes it.
        write.generation = 4;
        write.last_update_ms = 99_500;
        write.body = Some(vec![4]);
        assert_eq!(apply_replica_write(&service, &write), ResultCode::Ok);
        assert_eq!(
            stored(&service, &write.digest).map(|(meta, body)| (meta.generation, body)),
            Some((4, vec![4]))
        );
        let stale_delete = ReplicaWrite {
            last_update_ms: 99_400,
            body: None,
            ..write.clone()
        };
        assert_eq!(apply_replica_write(&service, &stale_delete), ResultCode::Ok);
        assert!(stored(&service, &write.digest).is_some());
        let delete = ReplicaWrite {
            last_update_ms: 100_000,
            generation: 0,
            life: 0,
            durable: false,
            body: None,
            ..write.clone()
        };
        assert_eq!(apply_replica_write(&service, &delete), ResultCode::Ok);
        assert!(stored(&service, &write.digest).is_none());
        assert_eq!(
            service
                .namespace(b"test")
                .map(|ns| ns.stats.objects.load(std::sync::atomic::Ordering::Relaxed)),
            Some(0)
        );
        let unknown = ReplicaWrite {
            namespace: "nosuch".into(),
            ..write
        };
        assert_eq!(
            apply_replica_write(&service, &unknown),
            ResultCode::Namespace
        );
    }

    /// A record written after a non-durable delete starts its next life at
    /// generation 1: a copy from the earlier life (a node that missed the
    /// delete, with more writes than the new copy) never wins over it nor
    /// over the delete's tombstone, whatever the policy; the new life wins
    /// over the tombstone and over a stale copy a replica still holds.
    #[test]
    fn a_copy_from_an_earlier_life_never_wins() {
        let service = memory_service(7);
        let stale = ReplicaWrite {
            generation: 9,
            last_update_ms: 90_000,
            body: Some(vec![1]),
            ..sample(None)
        };
        let tombstone = ReplicaWrite {
            generation: 10,
            last_update_ms: 95_000,
            body: None,
            ..stale.clone()
        };
        let reborn = ReplicaWrite {
            generation: 1,
            life: 1,
            last_update_ms: 96_000,
            body: Some(vec![2]),
            ..stale.clone()
        };
        // The tombstone holds the earlier life's copies off.
        assert_eq!(apply_replica_write(&service, &tombstone), ResultCode::Ok);
        assert_eq!(apply_replica_write(&service, &stale), ResultCode::Ok);
        assert!(stored(&service, &stale.digest).is_none());
        // The new life wins over the tombstone, then over the stale copy
        // sent again (with more writes and, under last-update-time, a later
        // write too).
        assert_eq!(apply_replica_write(&service, &reborn), ResultCode::Ok);
        let later_stale = ReplicaWrite {
            generation: 30,
            last_update_ms: 99_000,
            ..stale.clone()
        };
        for copy in [&stale, &later_stale, &tombstone] {
            assert_eq!(apply_replica_write(&service, copy), ResultCode::Ok);
            let held = stored(&service, &stale.digest).map(|(meta, body)| (meta.life, body));
            assert_eq!(held, Some((1, vec![2])));
        }
        // A replica still holding the stale copy takes the new life.
        let replica = memory_service(8);
        assert_eq!(apply_replica_write(&replica, &later_stale), ResultCode::Ok);
        assert_eq!(apply_replica_write(&replica, &reborn), ResultCode::Ok);
        let held = stored(&replica, &stale.digest).map(|(meta, _)| (meta.life, meta.generation));
        assert_eq!(held, Some((1, 1)));
    }

    /// Records every call and answers replica writes with `Ok`, proxied
    /// requests with a fixed frame.
    struct FakeFabric {
        calls: parking_lot::Mutex<Vec<(NodeId, u8, Vec<u8>)>>,
    }

    impl Fabric for FakeFabric {
        fn call(&self, to: NodeId, kind: u8, payload: Vec<u8>, _: Duration) -> FabricFuture {
            self.calls.lock().push((to, kind, payload));
            let answer = if kind == call_kind::PROXY {
                let mut frame = Vec::new();
                transaction::write_result(&mut frame, ResultCode::KeyBusy);
                frame
            } else {
                vec![0]
            };
            Box::pin(async move { Ok(answer) })
        }
    }

    #[test]
    fn masters_replicate_and_others_proxy() {
        use citrine_wire::digest::{of_key, UserKey};
        let service = memory_service(1);
        let fabric = std::sync::Arc::new(FakeFabric {
            calls: parking_lot::Mutex::new(Vec::new()),
        });
        service.set_fabric(fabric.clone());
        let state = view_of_two(1, 5);
        let key_mastered_by = |node: u64| keys_mastered_by(&state, node).next().expect("a key").0;
        let (mine, theirs) = (key_mastered_by(1), key_mastered_by(2));
        service.publish_cluster(state);
        let put = |key: &str| {
            let digest = of_key("demo", &UserKey::String(key.into()));
            let frame = put_frame(&digest, 0);
            let out = handle_frame(&service, &frame);
            (digest, frame, out)
        };
        // Mastered here: applied locally, then replicated as a full state.
        let (digest, _, out) = put(&mine);
        assert_eq!(out[PROTO_HEADER_SIZE + 5], 0);
        let mut calls = std::mem::take(&mut *fabric.calls.lock());
        // The view's exchange has not run (no driver here): the record is
        // resolved with the other member first (the fake answers "absent").
        assert_eq!((calls[0].0, calls[0].1), (NodeId(2), call_kind::DUPRES));
        calls.remove(0);
        assert_eq!(calls.len(), 1);
        assert_eq!(
            (calls[0].0, calls[0].1),
            (NodeId(2), call_kind::REPLICA_WRITE)
        );
        // Stamped with the view's cluster key, and no truncation known.
        let (key, truncated_before, write) =
            split_replica_payload(&calls[0].2).expect("a replica payload");
        assert_eq!(key, service.cluster().cluster_key);
        assert_eq!(truncated_before, 0);
        let write = ReplicaWrite::decode(write).expect("replica write");
        assert_eq!(
            (write.digest, write.generation, write.set_name.as_slice()),
            (digest, 1, &b"demo"[..])
        );
        assert_eq!(
            Some(write.body.expect("body")),
            stored(&service, &digest).map(|(_, body)| body)
        );
        // Mastered elsewhere: forwarded unchanged (hop 1, with the deadline
        // the client's timeout gives), answer passed through.
        let before = service.now().unix_ms;
        let (digest, frame, out) = put(&theirs);
        assert!(stored(&service, &digest).is_none());
        assert_eq!(out[PROTO_HEADER_SIZE + 5], ResultCode::KeyBusy.code());
        let calls = std::mem::take(&mut *fabric.calls.lock());
        assert_eq!(calls.len(), 1);
        assert_eq!((calls[0].0, calls[0].1), (NodeId(2), call_kind::PROXY));
        let (hop, forwarded) = Hop::decode(&calls[0].2).expect("a proxy payload");
        assert_eq!(hop.byte, 1);
        let deadline = hop.deadline_ms.expect("a deadline");
        assert!(
            (before + DEFAULT_DEADLINE_MS..=service.now().unix_ms + DEFAULT_DEADLINE_MS)
                .contains(&deadline),
            "{deadline} from {before}"
        );
        assert_eq!(forwarded, &frame[PROTO_HEADER_SIZE..]);
        // A request proxied too often is refused with 9 (clients retry it).
        let answer = block_on_test(service.serve_fabric(
            call_kind::PROXY,
            &Hop::payload(MAX_PROXY_HOPS, u64::MAX, &frame[PROTO_HEADER_SIZE..]),
        ));
        assert_eq!(answer[PROTO_HEADER_SIZE + 5], ResultCode::Timeout.code());
        assert_eq!(
            service
                .stats
                .proxy_hops_exceeded
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        assert!(fabric.calls.lock().is_empty());
    }

    #[test]
    fn a_node_whose_cluster_runtime_stalled_refuses_requests() {
        use citrine_wire::msg::{field_type, info1, info3, MessageWriter, MsgHeader};
        let clock = std::sync::Arc::new(crate::ManualClock::new(1_700_000_000_000));
        let service = memory_service_on(1, clock.clone());
        let fabric = std::sync::Arc::new(FakeFabric {
            calls: parking_lot::Mutex::new(Vec::new()),
        });
        service.set_fabric(fabric.clone());
        let state = view_of_two(1, 5);
        let (_, digest) = keys_mastered_by(&state, 2)
            .next()
            .expect("a key mastered by node 2");
        service.publish_cluster(state);
        let mut frame = Vec::new();
        let mut writer = MessageWriter::begin(
            &mut frame,
            &MsgHeader {
                info1: info1::READ | info1::GET_ALL,
                ..MsgHeader::default()
            },
        );
        writer
            .field(field_type::NAMESPACE, b"test")
            .field(field_type::DIGEST, &digest.0);
        writer.finish();
        let header_bytes: [u8; PROTO_HEADER_SIZE] =
            frame[..PROTO_HEADER_SIZE].try_into().expect("header");
        let header = ProtoHeader::decode(&header_bytes).expect("header");
        let read = || {
            let mut out = Vec::new();
            service
                .handle(header, &frame[PROTO_HEADER_SIZE..], &mut out)
                .expect("handled");
            (out[PROTO_HEADER_SIZE + 5], fabric.calls.lock().len())
        };
        // No tick reported (the simulator, a lone node): no stall check.
        assert_eq!(read(), (ResultCode::KeyBusy.code(), 1));
        service.cluster_ticked(1_500);
        clock.advance_ms(1_500);
        // Within the bound: forwarded to the master as before.
        assert_eq!(read(), (ResultCode::KeyBusy.code(), 2));
        // Past it: refused here, nothing forwarded.
        let refusals = || {
            service
                .stats
                .stall_refusals
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        clock.advance_ms(1);
        assert_eq!(read(), (ResultCode::Unavailable.code(), 2));
        assert_eq!(refusals(), 1);
        // A scan as well, and a read another node forwards.
        let mut scan = Vec::new();
        let mut writer = MessageWriter::begin(
            &mut scan,
            &MsgHeader {
                info1: info1::READ,
                info3: info3::PARTITION_DONE,
                ..MsgHeader::default()
            },
        );
        writer.field(field_type::NAMESPACE, b"test");
        writer.finish();
        let scan_header: [u8; PROTO_HEADER_SIZE] =
            scan[..PROTO_HEADER_SIZE].try_into().expect("header");
        let mut out = Vec::new();
        service
            .handle(
                ProtoHeader::decode(&scan_header).expect("header"),
                &scan[PROTO_HEADER_SIZE..],
                &mut out,
            )
            .expect("handled");
        assert_eq!(out[PROTO_HEADER_SIZE + 5], ResultCode::Unavailable.code());
        assert_eq!(refusals(), 2, "the scan refused on arrival");
        let forwarded = block_on_test(service.serve_fabric(
            call_kind::PROXY,
            &Hop::payload(1, u64::MAX, &frame[PROTO_HEADER_SIZE..]),
        ));
        assert_eq!(
            forwarded[PROTO_HEADER_SIZE + 5],
            ResultCode::Unavailable.code()
        );
        assert_eq!(fabric.calls.lock().len(), 2);
        assert_eq!(refusals(), 3);
        // The runtime ticks again: served.
        service.cluster_ticked(1_500);
        assert_eq!(read(), (ResultCode::KeyBusy.code(), 3));
    }

    /// The frame of a put of bin `v` = "x" to `digest` in `test`/`demo`,
    /// with the client timeout `transaction_ttl` (ms, 0 for none).
    fn put_frame(digest: &Digest, transaction_ttl: u32) -> Vec<u8> {
        write_frame(
            digest,
            transaction_ttl,
            citrine_wire::msg::op_type::WRITE,
            3,
            b"x",
        )
    }

    /// The frame of a write of one op (`op`, particle type `particle`,
    /// `value`) on bin `v` of `digest` in `test`/`demo`, with the client
    /// timeout `transaction_ttl` (ms, 0 for none).
    fn write_frame(
        digest: &Digest,
        transaction_ttl: u32,
        op: u8,
        particle: u8,
        value: &[u8],
    ) -> Vec<u8> {
        use citrine_wire::msg::{field_type, MessageWriter, MsgHeader};
        let mut frame = Vec::new();
        let header = MsgHeader {
            info2: info2::WRITE,
            transaction_ttl,
            ..MsgHeader::default()
        };
        let mut writer = MessageWriter::begin(&mut frame, &header);
        writer
            .field(field_type::NAMESPACE, b"test")
            .field(field_type::SET, b"demo")
            .field(field_type::DIGEST, &digest.0)
            .op(op, particle, b"v", value);
        writer.finish();
        frame
    }

    /// `service`'s reply to the client request `frame`.
    fn handle_frame(service: &Service, frame: &[u8]) -> Vec<u8> {
        let header_bytes: [u8; PROTO_HEADER_SIZE] =
            frame[..PROTO_HEADER_SIZE].try_into().expect("header");
        let header = ProtoHeader::decode(&header_bytes).expect("header");
        let mut out = Vec::new();
        service
            .handle(header, &frame[PROTO_HEADER_SIZE..], &mut out)
            .expect("handled");
        out
    }

    /// [`FakeFabric`], whose duplicate-resolution answers take
    /// `resolve_ms` of `clock`'s time.
    struct SlowResolution {
        fake: FakeFabric,
        clock: std::sync::Arc<crate::ManualClock>,
        resolve_ms: AtomicU64,
    }

    impl Fabric for SlowResolution {
        fn call(&self, to: NodeId, kind: u8, payload: Vec<u8>, timeout: Duration) -> FabricFuture {
            if kind == call_kind::DUPRES {
                self.clock
                    .advance_ms(self.resolve_ms.load(Ordering::Relaxed));
            }
            self.fake.call(to, kind, payload, timeout)
        }
    }

    #[test]
    fn a_request_past_its_deadline_is_not_run() {
        let clock = std::sync::Arc::new(crate::ManualClock::new(1_700_000_000_000));
        let service = memory_service_on(1, clock.clone());
        let fabric = std::sync::Arc::new(SlowResolution {
            fake: FakeFabric {
                calls: parking_lot::Mutex::new(Vec::new()),
            },
            clock: clock.clone(),
            resolve_ms: AtomicU64::new(0),
        });
        service.set_fabric(fabric.clone());
        let state = view_of_two(1, 5);
        let mine: Vec<Digest> = keys_mastered_by(&state, 1)
            .map(|(_, digest)| digest)
            .take(6)
            .collect();
        service.publish_cluster(state);
        // A put of `digest` with a 50 ms client timeout.
        let put = |digest: &Digest| put_frame(digest, 50);
        let expired = || service.stats.expired_refusals.load(Ordering::Relaxed);
        // Forwarded by a peer, with `left_ms` of its deadline left here:
        // the result code, and whether the write was applied.
        let forwarded = |digest: &Digest, left_ms: u64| {
            let deadline = service.now().unix_ms + left_ms;
            let payload = Hop::payload(1, deadline, &put(digest)[PROTO_HEADER_SIZE..]);
            let answer = block_on_test(service.serve_fabric(call_kind::PROXY, &payload));
            (
                answer[PROTO_HEADER_SIZE + 5],
                stored(&service, digest).is_some(),
            )
        };
        assert_eq!(
            forwarded(&mine[0], PROXY_CLOCK_MARGIN_MS + 1),
            (ResultCode::Ok.code(), true)
        );
        assert_eq!(expired(), 0);
        // Held up on its way (or here, while this node was stalled) until
        // the forwarder has answered 9, or may have: not run.
        assert_eq!(
            forwarded(&mine[1], PROXY_CLOCK_MARGIN_MS),
            (ResultCode::Timeout.code(), false)
        );
        assert_eq!(expired(), 1);
        let passed = Hop::payload(
            1,
            service.now().unix_ms - 1_000,
            &put(&mine[2])[PROTO_HEADER_SIZE..],
        );
        let answer = block_on_test(service.serve_fabric(call_kind::PROXY, &passed));
        assert_eq!(answer[PROTO_HEADER_SIZE + 5], ResultCode::Timeout.code());
        assert!(stored(&service, &mine[2]).is_none());
        assert_eq!(expired(), 2);
        // A client's own request whose duplicate resolution outlasted its
        // timeout is not run either; one resolved in time is.
        let client = |digest: &Digest, resolve_ms: u64| {
            fabric.resolve_ms.store(resolve_ms, Ordering::Relaxed);
            let out = handle_frame(&service, &put(digest));
            (
                out[PROTO_HEADER_SIZE + 5],
                stored(&service, digest).is_some(),
            )
        };
        assert_eq!(client(&mine[3], 49), (ResultCode::Ok.code(), true));
        assert_eq!(expired(), 2);
        assert_eq!(client(&mine[4], 50), (ResultCode::Timeout.code(), false));
        assert_eq!(expired(), 3);
        // A payload too short for its hop is refused, not read past.
        let answer = block_on_test(service.serve_fabric(call_kind::PROXY, &[1, 0, 0]));
        assert_eq!(answer[PROTO_HEADER_SIZE + 5], ResultCode::Parameter.code());
    }

    /// A client's request that waited in this node's socket through a
    /// stall is forwarded with the deadline its client's timeout gives
    /// from when it may have arrived, not from now.
    #[test]
    fn a_held_request_is_forwarded_with_its_deadline_from_the_stall() {
        let clock = std::sync::Arc::new(crate::ManualClock::new(1_700_000_000_000));
        let service = memory_service_on(1, clock);
        service.set_fabric(std::sync::Arc::new(FakeFabric {
            calls: parking_lot::Mutex::new(Vec::new()),
        }));
        let state = view_of_two(1, 5);
        let (_, theirs) = keys_mastered_by(&state, 2)
            .next()
            .expect("a key node 2 masters");
        service.publish_cluster(state);
        let frame = put_frame(&theirs, 50);
        let header: [u8; PROTO_HEADER_SIZE] =
            frame[..PROTO_HEADER_SIZE].try_into().expect("header");
        let header = ProtoHeader::decode(&header).expect("header");
        let handle_held = |waiting_since_ms: Option<u64>| {
            let mut out = Vec::new();
            let pending = service
                .handle_streaming_since(
                    header,
                    &frame[PROTO_HEADER_SIZE..],
                    &mut out,
                    waiting_since_ms,
                )
                .expect("handled");
            (pending, out)
        };
        let proxied = |waiting_since_ms: Option<u64>| {
            let (pending, out) = handle_held(waiting_since_ms);
            match pending.map(|continuation| continuation.0) {
                Some(crate::Pending::Remote(remote)) => match *remote {
                    Remote::Proxy {
                        to,
                        payload,
                        deadline_ms,
                    } => {
                        assert_eq!(to, NodeId(2));
                        let (hop, _) = Hop::decode(&payload).expect("a hop");
                        assert_eq!(hop.deadline_ms, Some(deadline_ms));
                        deadline_ms
                    }
                    other => panic!("not forwarded: {other:?}"),
                },
                other => panic!("not forwarded: {other:?}, answer {out:?}"),
            }
        };
        let now = service.now().unix_ms;
        assert_eq!(proxied(None), now + 50);
        assert_eq!(proxied(Some(now - 20)), now + 30);
        // Its time ran out while it waited: refused here, not forwarded.
        let (pending, out) = handle_held(Some(now - 50));
        assert!(pending.is_none());
        assert_eq!(out[PROTO_HEADER_SIZE + 5], ResultCode::Timeout.code());
    }

    #[test]
    fn every_replica_is_sent_to_at_once() {
        let joined = crate::block_on(join_all(
            vec![3, 1, 2]
                .into_iter()
                .map(|value| async move { value })
                .collect(),
        ));
        assert_eq!(joined, vec![3, 1, 2]);
        assert!(crate::block_on(join_all(Vec::<std::future::Ready<u8>>::new())).is_empty());
        // Three replicas: both others get the record's state.
        use crate::cluster_state::{ClusterMember, ClusterState};
        let service = memory_service(1);
        let fabric = std::sync::Arc::new(FakeFabric {
            calls: parking_lot::Mutex::new(Vec::new()),
        });
        service.set_fabric(fabric.clone());
        let members = [1u64, 2, 3].map(|id| ClusterMember {
            node_id: NodeId(id),
            rack_id: 0,
            service_address: format!("127.0.0.1:{}", 3000 + id),
        });
        let state = ClusterState::new(NodeId(1), 5, members.to_vec(), &[("test".into(), 3)], 2, 2);
        let partition = (0..4096u16)
            .filter_map(PartitionId::new)
            .find(|pid| state.namespaces[0].map.master(*pid) == Some(NodeId(1)))
            .expect("a partition mastered here");
        service.publish_cluster(state);
        let remote = Remote::Replicate {
            namespace: "test".into(),
            partition,
            targets: vec![NodeId(2), NodeId(3)],
            cluster_key: service.cluster().cluster_key,
            payload: replica_payload(
                service.cluster().cluster_key,
                namespace_of(&service),
                &sample(None),
            ),
            deadline_ms: u64::MAX,
        };
        let mut out = Vec::new();
        transaction::write_result(&mut out, ResultCode::Ok);
        let before = out.clone();
        crate::block_on(service.complete(remote, &mut out));
        assert_eq!(out, before);
        let mut called: Vec<NodeId> = fabric.calls.lock().iter().map(|call| call.0).collect();
        called.sort();
        assert_eq!(called, vec![NodeId(2), NodeId(3)]);
    }

    /// Never answers.
    struct DeadFabric;

    impl Fabric for DeadFabric {
        fn call(&self, _: NodeId, _: u8, _: Vec<u8>, _: Duration) -> FabricFuture {
            Box::pin(async { Err(FabricError::Timeout) })
        }
    }

    #[test]
    fn unacknowledged_writes_time_out_unless_the_replica_left_the_map() {
        let service = memory_service(1);
        service.set_fabric(std::sync::Arc::new(DeadFabric));
        let partition = PartitionId::new(7).expect("partition");
        let replicate = |service: &Service| {
            let remote = Remote::Replicate {
                namespace: "test".into(),
                partition,
                targets: vec![NodeId(2)],
                cluster_key: service.cluster().cluster_key,
                payload: replica_payload(
                    service.cluster().cluster_key,
                    namespace_of(service),
                    &sample(None),
                ),
                deadline_ms: u64::MAX,
            };
            let mut out = Vec::new();
            transaction::write_result(&mut out, ResultCode::Ok);
            crate::block_on(service.complete(remote, &mut out));
            out[PROTO_HEADER_SIZE + 5]
        };
        // The published map is this node alone: node 2 left, the write stands.
        assert_eq!(replicate(&service), ResultCode::Ok.code());
        // Node 2 is the partition's other replica and never answers: 9.
        service.publish_cluster(view_of_two(1, 5));
        assert_eq!(replicate(&service), ResultCode::Timeout.code());
        assert_eq!(
            service
                .stats
                .replica_write_retries
                .load(std::sync::atomic::Ordering::Relaxed),
            u64::from(MAX_ATTEMPTS - 1)
        );
    }

    /// Answers every call with `code`, recording the calls.
    struct Answering {
        code: u8,
        calls: parking_lot::Mutex<Vec<(NodeId, u8, Vec<u8>)>>,
    }

    impl Fabric for Answering {
        fn call(&self, to: NodeId, kind: u8, payload: Vec<u8>, _: Duration) -> FabricFuture {
            self.calls.lock().push((to, kind, payload));
            let code = self.code;
            Box::pin(async move { Ok(vec![code]) })
        }
    }

    #[test]
    fn a_write_a_replica_missed_is_sent_again_until_it_is_acknowledged() {
        use std::sync::atomic::Ordering::Relaxed;
        let clock = std::sync::Arc::new(crate::ManualClock::new(1_700_000_000_000));
        let service = memory_service_on(1, clock.clone());
        let view = |key| view_of_two(1, key);
        service.publish_cluster(view(5));
        // This node holds the record (its write); node 2 never answers.
        let write = sample(Some(vec![1, 2, 3]));
        assert_eq!(apply_replica_write(&service, &write), ResultCode::Ok);
        service.set_fabric(std::sync::Arc::new(DeadFabric));
        let remote = Remote::Replicate {
            namespace: "test".into(),
            partition: write.digest.partition(),
            targets: vec![NodeId(2)],
            cluster_key: 5,
            payload: replica_payload(5, namespace_of(&service), &write),
            deadline_ms: u64::MAX,
        };
        let mut out = Vec::new();
        transaction::write_result(&mut out, ResultCode::Ok);
        crate::block_on(service.complete(remote, &mut out));
        assert_eq!(out[PROTO_HEADER_SIZE + 5], ResultCode::Timeout.code());
        assert_eq!(service.reconciles.pending.lock().len(), 1);
        // A new view; node 2 still in the old one refuses (7): kept.
        service.publish_cluster(view(6));
        let refusing = Answering {
            code: ResultCode::ClusterKeyMismatch.code(),
            calls: parking_lot::Mutex::new(Vec::new()),
        };
        crate::block_on(service.reconcile_pending(&refusing));
        assert_eq!(refusing.calls.lock().len(), 1);
        assert_eq!(service.reconciles.pending.lock().len(), 1);
        // Once node 2 takes it: the record's state under the current view,
        // and the queue is empty.
        let taking = Answering {
            code: 0,
            calls: parking_lot::Mutex::new(Vec::new()),
        };
        crate::block_on(service.reconcile_pending(&taking));
        let calls = std::mem::take(&mut *taking.calls.lock());
        assert_eq!(
            (calls[0].0, calls[0].1),
            (NodeId(2), call_kind::REPLICA_WRITE)
        );
        let (key, _, sent) = split_replica_payload(&calls[0].2).expect("a replica payload");
        assert_eq!(key, 6);
        let sent = ReplicaWrite::decode(sent).expect("a replica write");
        assert_eq!((sent.digest, sent.generation), (write.digest, 3));
        assert!(service.reconciles.pending.lock().is_empty());
        assert_eq!(service.stats.reconciles_done.load(Relaxed), 1);
        crate::block_on(service.reconcile_pending(&taking));
        assert!(taking.calls.lock().is_empty());
        // One never acknowledged is given up on after RECONCILE_FOR_MS.
        service.queue_reconcile("test", write.digest.partition(), &calls[0].2);
        crate::block_on(service.reconcile_pending(&refusing));
        assert_eq!(service.reconciles.pending.lock().len(), 1);
        clock.advance_ms(RECONCILE_FOR_MS);
        crate::block_on(service.reconcile_pending(&refusing));
        assert!(service.reconciles.pending.lock().is_empty());
        assert_eq!(service.stats.reconciles_dropped.load(Relaxed), 1);
    }

    #[test]
    fn a_replica_write_to_a_node_without_the_partition_is_refused() {
        // Node 1 in a view of three (replication factor 2): it is a replica
        // of some partitions and not of others.
        use crate::cluster_state::{ClusterMember, ClusterState};
        use std::sync::atomic::Ordering::Relaxed;
        let service = memory_service(1);
        let members = [1u64, 2, 3].map(|id| ClusterMember {
            node_id: NodeId(id),
            rack_id: 0,
            service_address: format!("127.0.0.1:{}", 3000 + id),
        });
        let state = ClusterState::new(NodeId(1), 5, members.to_vec(), &[("test".into(), 2)], 2, 2);
        let holds_here = |partition: PartitionId| {
            state.namespaces[0]
                .map
                .replicas(partition)
                .contains(&NodeId(1))
        };
        // Records of a partition node 1 is a replica of, and of two it is
        // not: one it still holds a copy of (a migration source, or the
        // acting master), one it holds nothing of (its copy dropped).
        let write_in = |replica: bool, skip: usize| {
            let digest = (0u32..)
                .map(|n| {
                    let mut bytes = [0u8; DIGEST_SIZE];
                    bytes[..4].copy_from_slice(&n.to_le_bytes());
                    Digest(bytes)
                })
                .filter(|digest| holds_here(digest.partition()) == replica)
                .nth(skip)
                .expect("a digest");
            ReplicaWrite {
                digest,
                ..sample(Some(vec![1, 2, 3]))
            }
        };
        let (replica, held, dropped) = (write_in(true, 0), write_in(false, 0), write_in(false, 1));
        assert_ne!(held.digest.partition(), dropped.digest.partition());
        assert_eq!(apply_replica_write(&service, &held), ResultCode::Ok);
        service.publish_cluster(state);
        let send = |write: &ReplicaWrite| {
            let payload = replica_payload(5, namespace_of(&service), write);
            block_on_test(service.serve_fabric(call_kind::REPLICA_WRITE, &payload))
        };
        assert_eq!(send(&replica), vec![ResultCode::Ok.code()]);
        assert!(stored(&service, &replica.digest).is_some());
        let newer = ReplicaWrite {
            generation: 4,
            life: 0,
            durable: false,
            ..held.clone()
        };
        assert_eq!(send(&newer), vec![ResultCode::Ok.code()]);
        assert_eq!(
            stored(&service, &held.digest).map(|(meta, _)| meta.generation),
            Some(4)
        );
        // Nothing of the partition here: the write would bring back a copy
        // outside the replica list that no migration drops.
        assert_eq!(send(&dropped), vec![ResultCode::Unavailable.code()]);
        assert!(stored(&service, &dropped.digest).is_none());
        assert_eq!(
            service
                .stats
                .replica_writes_refused_not_holder
                .load(Relaxed),
            1
        );
    }

    #[test]
    fn a_copy_admitted_if_held_needs_a_record_or_tombstone_of_the_partition() {
        let service = memory_service(1);
        let record = sample(Some(vec![1, 2, 3]));
        // Nothing of the partition here: refused, nothing stored.
        assert_eq!(
            apply_copy_admitted(&service, &record, 0, Admit::IfHeld),
            ResultCode::Unavailable
        );
        assert!(stored(&service, &record.digest).is_none());
        // A tombstone of another record of the partition is a held copy.
        let mut other = record.digest;
        other.0[DIGEST_SIZE - 1] ^= 0xff;
        assert_eq!(other.partition(), record.digest.partition());
        let delete = ReplicaWrite {
            digest: other,
            generation: 2,
            life: 0,
            durable: false,
            ..sample(None)
        };
        assert_eq!(
            apply_copy_admitted(&service, &delete, 0, Admit::Always),
            ResultCode::Ok
        );
        assert!(stored(&service, &other).is_none());
        assert_eq!(
            apply_copy_admitted(&service, &record, 0, Admit::IfHeld),
            ResultCode::Ok
        );
        assert!(stored(&service, &record.digest).is_some());
    }

    fn block_on_test<F: std::future::Future>(future: F) -> F::Output {
        crate::block_on(future)
    }

    /// Answers DUPRES with `answer` (or times out when `None`), acks the rest.
    struct DupResFabric {
        answer: Option<DupResAnswer>,
        calls: parking_lot::Mutex<Vec<u8>>,
    }

    impl Fabric for DupResFabric {
        fn call(&self, _: NodeId, kind: u8, _: Vec<u8>, _: Duration) -> FabricFuture {
            self.calls.lock().push(kind);
            let answer = match (kind, &self.answer) {
                (call_kind::DUPRES, Some(answer)) => Ok(answer.encode()),
                (call_kind::DUPRES, None) => Err(FabricError::Timeout),
                _ => Ok(vec![0]),
            };
            Box::pin(async move { answer })
        }
    }

    #[test]
    fn dupres_messages_round_trip() {
        let request = DupResRequest {
            cluster_key: 42,
            namespace: "test".into(),
            digest: Digest([9; DIGEST_SIZE]),
        };
        assert_eq!(
            DupResRequest::decode(&request.encode()),
            Some(request.clone())
        );
        assert_eq!(DupResRequest::decode(&request.encode()[1..]), None);
        for answer in [
            DupResAnswer {
                record: None,
                truncated_before: 0,
            },
            DupResAnswer {
                record: Some(sample(Some(vec![1, 2, 3]))),
                truncated_before: 1_700_000_000_000,
            },
        ] {
            assert_eq!(DupResAnswer::decode(&answer.encode()), Some(answer.clone()));
        }
        assert_eq!(DupResAnswer::decode(&[0, 1]), None);
        assert_eq!(DupResAnswer::decode(&[1]), None);
        assert_eq!(DupResAnswer::decode(&[]), None);
    }

    /// A write at a master whose partition is incoming builds on the newest
    /// copy held elsewhere; unanswered resolution → 9, nothing executed.
    #[test]
    fn an_incoming_master_resolves_before_executing() {
        use citrine_wire::digest::{of_key, UserKey};
        use citrine_wire::msg::{field_type, op_type, MessageWriter, MsgHeader};
        let incr = |service: &Service, key: &str| {
            let digest = of_key("demo", &UserKey::String(key.into()));
            let frame = write_frame(&digest, 0, op_type::INCR, 1, &1i64.to_be_bytes());
            (digest, handle_frame(service, &frame)[PROTO_HEADER_SIZE + 5])
        };
        // The old holder: three increments.
        let old = memory_service(2);
        let make_state = || view_of_two(1, 5);
        let state = make_state();
        let (key, _) = keys_mastered_by(&state, 1).next().expect("a key");
        for _ in 0..3 {
            assert_eq!(incr(&old, &key).1, 0);
        }
        let digest = of_key("demo", &UserKey::String(key.clone()));
        let copy = fetch(old.namespace(b"test").expect("ns"), &digest, old.now()).expect("copy");
        assert_eq!(copy.generation, 3);
        // The new master (base: alone) resolves with node 2 first.
        let service = memory_service(1);
        let fabric = std::sync::Arc::new(DupResFabric {
            answer: Some(DupResAnswer {
                record: Some(copy.clone()),
                truncated_before: 0,
            }),
            calls: parking_lot::Mutex::new(Vec::new()),
        });
        service.set_fabric(fabric.clone());
        service.publish_cluster(make_state());
        // Exchanging: resolution against every other member.
        assert_eq!(
            service
                .migrations
                .disposition("test", digest.partition(), false),
            Disposition::DupRes {
                cluster_key: 5,
                sources: vec![NodeId(2)]
            }
        );
        assert_eq!(incr(&service, &key).1, 0);
        assert_eq!(
            fabric.calls.lock().as_slice(),
            &[call_kind::DUPRES, call_kind::REPLICA_WRITE]
        );
        assert_eq!(
            stored(&service, &digest).map(|(meta, _)| meta.generation),
            Some(4)
        );
        // Unreachable member: 9 (not executed; clients retry a 9, never
        // an 11), the local copy untouched.
        let service = memory_service(1);
        service.set_fabric(std::sync::Arc::new(DupResFabric {
            answer: None,
            calls: parking_lot::Mutex::new(Vec::new()),
        }));
        service.publish_cluster(make_state());
        assert_eq!(incr(&service, &key).1, ResultCode::Timeout.code());
        assert!(stored(&service, &digest).is_none());
        assert_eq!(
            service
                .migrations
                .dupres_failures
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        // After the exchange: node 2 held the only copy and node 1 nothing,
        // so node 1 expects node 2 (resolution against it alone) and node
        // 2 is the acting master (reads go there) until its last batch.
        let service = memory_service(1);
        service.set_fabric(std::sync::Arc::new(DupResFabric {
            answer: Some(DupResAnswer {
                record: None,
                truncated_before: 0,
            }),
            calls: parking_lot::Mutex::new(Vec::new()),
        }));
        service.publish_cluster(make_state());
        old.publish_cluster(view_of_two(2, 5));
        assert!(service.finish_exchange(
            service.migrations.epoch(),
            vec![(NodeId(2), old.migrations.exchange_answer(5))]
        ));
        let partition = digest.partition();
        assert_eq!(
            service.migrations.disposition("test", partition, false),
            Disposition::DupRes {
                cluster_key: 5,
                sources: vec![NodeId(2)]
            }
        );
        assert_eq!(
            service.migrations.disposition("test", partition, true),
            Disposition::Acting(NodeId(2))
        );
        assert_eq!(
            service.migrations.acting_target("test", partition),
            Some(NodeId(2))
        );
        assert_eq!(
            service.migrations.rx_remaining(),
            service.migrations.namespace_remaining("test").1
        );

        // Claims: node 1 cedes the partition's master column to node 2,
        // which claims it as the acting master (the reference's working
        // master) once its own exchange is resolved; each change moves the
        // partition generation clients poll.
        let claims = |node: &Service| -> (bool, u64) {
            let answer = crate::tests::info(node, &["replicas-master", "partition-generation"]);
            let bitmap = answer[0].1.split_once(':').expect("ns:bitmap").1;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(bitmap)
                .expect("base64");
            let at = partition.index();
            let claimed = bytes[at >> 3] & (0x80 >> (at & 7)) != 0;
            (claimed, answer[1].1.parse().expect("generation"))
        };
        use crate::migration::{Handover, MasterClaim};
        use base64::Engine as _;
        assert_eq!(
            service
                .migrations
                .master_claim("test", partition, NodeId(1)),
            MasterClaim::Ceded
        );
        assert!(!claims(&service).0, "the filling master cedes it");
        let old_fabric = std::sync::Arc::new(DupResFabric {
            answer: None,
            calls: parking_lot::Mutex::new(Vec::new()),
        });
        old.set_fabric(old_fabric.clone());
        let (claimed, before) = claims(&old);
        assert!(!claimed, "node 2 is no master in the map");
        assert!(old.finish_exchange(
            old.migrations.epoch(),
            vec![(NodeId(1), service.migrations.exchange_answer(5))]
        ));
        let (claimed, acting_generation) = claims(&old);
        assert!(claimed, "the acting master claims it");
        assert!(acting_generation > before);
        // A plain read a client sends the acting master is served there.
        let read = |node: &Service| {
            let mut frame = Vec::new();
            let header = MsgHeader {
                info1: citrine_wire::msg::info1::READ | citrine_wire::msg::info1::GET_ALL,
                ..MsgHeader::default()
            };
            let mut writer = MessageWriter::begin(&mut frame, &header);
            writer
                .field(field_type::NAMESPACE, b"test")
                .field(field_type::SET, b"demo")
                .field(field_type::DIGEST, &digest.0);
            writer.finish();
            handle_frame(node, &frame)
        };
        let reply = read(&old);
        assert_eq!(reply[PROTO_HEADER_SIZE + 5], 0, "found");
        assert!(old_fabric.calls.lock().is_empty(), "served, not proxied");
        assert_eq!(
            old.migrations
                .acting_reads
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        // Before its last batch to the master it hands the claim back; from
        // then on a client's read is served only as a replica's (node 2 is
        // one here; the master replicates every write to it).
        let epoch = old.migrations.epoch();
        let hand_over = |to: Handover, then: MasterClaim| {
            old.migrations
                .hand_over(epoch, "test", partition, NodeId(2), to);
            assert_eq!(
                old.migrations.master_claim("test", partition, NodeId(2)),
                then
            );
        };
        hand_over(Handover::Releasing, MasterClaim::Releasing);
        let (claimed, releasing_generation) = claims(&old);
        assert!(!claimed);
        assert!(releasing_generation > acting_generation);
        let reply = read(&old);
        assert_eq!(reply[PROTO_HEADER_SIZE + 5], 0, "found");
        assert!(old_fabric.calls.lock().is_empty(), "served, not proxied");
        let load = |counter: &std::sync::atomic::AtomicU64| {
            counter.load(std::sync::atomic::Ordering::Relaxed)
        };
        assert_eq!(load(&old.migrations.acting_reads), 1);
        assert_eq!(load(&old.stats.replica_reads), 1);
        hand_over(Handover::Released, MasterClaim::Ordinary);
        let (_, master_generation) = claims(&service);

        let last = crate::migration::MigrateBatch {
            cluster_key: 5,
            source: NodeId(2),
            flags: crate::migration::FLAG_FIRST | crate::migration::FLAG_LAST,
            namespace: "test".into(),
            partition: partition.index() as u16,
            records: vec![copy.encode()],
            truncated_before: Vec::new(),
        };
        assert_eq!(service.apply_migrate_batch(&last.encode()), ResultCode::Ok);
        assert_eq!(
            service.migrations.disposition("test", partition, false),
            Disposition::Normal
        );
        let (claimed, generation) = claims(&service);
        assert!(claimed, "the filled master claims it again");
        assert!(generation > master_generation);
        assert_eq!(
            service.migrations.version("test", partition),
            citrine_cluster::exchange::PartitionVersion::full(5)
        );
        assert_eq!(
            stored(&service, &digest).map(|(meta, _)| meta.generation),
            Some(3)
        );
    }

    /// A write executed under one view is never acknowledged under the
    /// next: the replica refuses another view's key, and a master whose view
    /// moved on stops (9: in doubt).
    #[test]
    fn replica_writes_belong_to_one_view() {
        let replica = memory_service(2);
        let key = replica.cluster().cluster_key;
        let write = sample(Some(vec![7]));
        let answer = |payload: Vec<u8>| {
            crate::block_on(replica.serve_fabric(call_kind::REPLICA_WRITE, &payload))
        };
        assert_eq!(
            answer(replica_payload(key ^ 1, namespace_of(&replica), &write)),
            vec![ResultCode::ClusterKeyMismatch.code()]
        );
        assert!(stored(&replica, &write.digest).is_none());
        assert_eq!(
            answer(replica_payload(key, namespace_of(&replica), &write)),
            vec![0]
        );
        assert!(stored(&replica, &write.digest).is_some());
        assert_eq!(answer(vec![1, 2]), vec![ResultCode::Parameter.code()]);
        // The master side: its own view moved on.
        let master = memory_service(1);
        let fabric = AlwaysOk;
        let done = crate::block_on(master.replicate(
            &fabric,
            WriteScope {
                namespace: "test",
                partition: write.digest.partition(),
                cluster_key: master.cluster().cluster_key ^ 1,
            },
            vec![NodeId(2)],
            &replica_payload(key, namespace_of(&master), &write),
            u64::MAX,
        ));
        assert!(!done);
    }

    struct AlwaysOk;

    impl Fabric for AlwaysOk {
        fn call(&self, _: NodeId, _: u8, _: Vec<u8>, _: Duration) -> FabricFuture {
            Box::pin(async { Ok(vec![0]) })
        }
    }

    #[test]
    fn whole_frames() {
        let mut frame = Vec::new();
        transaction::write_result(&mut frame, ResultCode::Ok);
        assert!(is_whole_frame(&frame));
        assert!(!is_whole_frame(&frame[..frame.len() - 1]));
        assert!(!is_whole_frame(&[]));
    }
}
