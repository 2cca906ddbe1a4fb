//! Foreground partition scans (an AS_MSG without a DIGEST field and without
//! secondary-index fields; `shared/protocol/04-batch-scan-query.md` §3),
//! streamed in chunks.
//!
//! [`start`] validates the request and builds a [`ScanCursor`]; each
//! [`ScanCursor::step`] appends one frame of record messages (about
//! [`CHUNK_BYTES`], or after [`EXAMINE_BUDGET`] index entries looked at) and
//! hands the cursor back until the stream is complete, when the frame ends
//! with the LAST message (result 0). The connection loop writes each chunk
//! and yields to its event loop before asking for the next, so a scan of
//! millions of records never builds one giant buffer and never starves the
//! other connections of its service thread.
//!
//! Order and resume: partitions are visited in ascending id; inside a
//! partition records go in ascending digest order. The cursor remembers the
//! last digest it looked at in the current partition, and a client resuming
//! with DIGEST_ARRAY gets the records strictly after its digest in the same
//! order, so a resumed scan neither repeats nor skips a record that existed
//! throughout.
//!
//! Invariants:
//! - a partition's read lock is held only while one step collects that
//!   partition's digests past the resume point and emits records from it —
//!   never across steps, never across an await;
//! - expired and truncated records are never returned (same liveness test
//!   as single-record reads);
//! - every step makes progress (at least one record emitted or one partition
//!   finished), so a scan always ends;
//! - at most MAX_RECORDS records are returned;
//! - a node alone serves every partition and sends no PARTITION_DONE
//!   message; in a cluster, a partition the node does not master in its
//!   current map, or masters but is still filling (migrations, or the
//!   view's exchange not resolved), is reported with a PARTITION_DONE
//!   message of result 11 at the start of the stream and not scanned —
//!   clients retry it in a later round — so a scan never returns a partial
//!   copy as complete. Clients treat a partition not reported unavailable
//!   as finished when the stream ends.
//!
//! Throttle: RECS_PER_SEC (field 10, records a second, 0 = none) caps each
//! step at a tenth of a second's worth of records (at least one) and
//! names the time the next step is due, `ScanCursor::not_before_ms`:
//! when `sent` records are due at that rate since the scan's first step.
//! The connection loop holds the connection until then (serving the
//! others), never longer than `MAX_PACED_PAUSE_MS` at a time: a wall
//! clock stepped back makes the next step start the schedule again. The
//! blocking [`Service::handle`] path does not wait.
//!
//! Filter expressions (field 43) are evaluated against each record's
//! stored bins (whatever bins the scan projects): a record that does not
//! pass is skipped, not counted against `max_records`.
//!
//! Not yet: secondary-index queries answer 201 (no index exists); UDF scans and
//! queries (field 33) and background write scans (`info2 WRITE`) answer 16.

use crate::filter::RecordView;
use crate::namespace::Namespace;
use crate::transaction::{self, is_live, Now};
use crate::Service;
use citrine_record::BodyView;
use citrine_types::{Digest, PartitionId, ResultCode, BIN_NAME_MAX, DIGEST_SIZE, PARTITIONS};
use citrine_wire::frame::{MessageType, ProtoHeader, PROTO_HEADER_SIZE};
use citrine_wire::msg::{
    field_type, info1, info2, info3, op_type, Message, MessageWriter, MsgHeader,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A throttled scan's steps a second: each carries at most `rate / 10`
/// records (at least one).
const PACED_STEPS_PER_SECOND: u32 = 10;
/// The longest a throttled scan waits between steps: one record at one a
/// second. A longer wait means the wall clock was stepped back.
pub(crate) const MAX_PACED_PAUSE_MS: u64 = 1000;

/// A step ends once its frame holds this many bytes.
pub const CHUNK_BYTES: usize = 1024 * 1024;
/// A step ends once it has looked at this many index entries (bounds the
/// time a step runs when a set filter rejects most records).
pub const EXAMINE_BUDGET: usize = 64 * 1024;

/// Scan counters.
#[derive(Debug, Default)]
pub struct ScanStats {
    /// Foreground scans started.
    pub started: AtomicU64,
    /// Foreground scans whose LAST message was written.
    pub completed: AtomicU64,
    /// Scans and queries refused (any non-zero LAST).
    pub refused: AtomicU64,
    /// Records returned by scans.
    pub records: AtomicU64,
}

/// Where a partition's scan stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PartitionCursor {
    partition: PartitionId,
    /// Resume strictly after this digest (in ascending digest order).
    after: Option<Digest>,
}

/// Which records a scan returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SetFilter {
    /// Every record of the namespace.
    All,
    /// Records of this set id.
    Only(u16),
}

/// A scan in progress: what is left and the limits that apply.
pub struct ScanCursor {
    namespace: Arc<Namespace>,
    /// Partitions to visit, ascending id; `partitions[next..]` are left.
    partitions: Vec<PartitionCursor>,
    next: usize,
    set: SetFilter,
    /// Projected bin names; empty = every bin.
    bins: Vec<Vec<u8>>,
    /// Metadata only (`info1 GET_NO_BINS`).
    no_bins: bool,
    /// The filter expression (field 43) a record must pass to be returned.
    filter: Option<Box<citrine_exp::Expression>>,
    /// Record limit (0 = none).
    max_records: u64,
    /// Records returned so far.
    sent: u64,
    /// RECS_PER_SEC: records a second, 0 = no throttle.
    rate: u32,
    /// When the first step ran (unix ms), for the throttle.
    paced_since_ms: Option<u64>,
    /// The current step ends once `sent` reaches this (throttle).
    step_end: u64,
    /// Set names by id, fetched once per scan.
    set_names: HashMap<u16, Option<Vec<u8>>>,
    /// Reused buffer for one partition's sorted digests.
    digests: Vec<Digest>,
    /// Reused buffer for a KEY field.
    key_field: Vec<u8>,
    /// Partitions this node cannot serve whole (not their master in the
    /// current map, or still being filled): reported unavailable (11) at
    /// the start of the stream, so the client retries them elsewhere.
    unavailable: Vec<PartitionId>,
}

impl std::fmt::Debug for ScanCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScanCursor")
            .field("namespace", &self.namespace.config.name)
            .field("partitions_left", &(self.partitions.len() - self.next))
            .field("current", &self.partitions.get(self.next))
            .field("set", &self.set)
            .field("sent", &self.sent)
            .field("max_records", &self.max_records)
            .finish_non_exhaustive()
    }
}

/// Why a scan request was refused: the code for its LAST message.
fn refuse(service: &Service, out: &mut Vec<u8>, code: ResultCode) -> Option<ScanCursor> {
    service.stats.scan.refused.fetch_add(1, Ordering::Relaxed);
    transaction::write_stream_end(out, code);
    None
}

/// Starts a scan (or refuses a query): validates the request and returns the
/// cursor whose steps produce the stream, or `None` after writing a
/// one-message refusal (or, for an unknown set, an empty complete stream).
pub(crate) fn start(
    service: &Service,
    message: &Message<'_>,
    out: &mut Vec<u8>,
) -> Option<ScanCursor> {
    let header = message.header;
    let has = |kind: u8| message.field(kind).is_some();
    if has(field_type::UDF_OP)
        || has(field_type::UDF_FILENAME)
        || header.info2 & (info2::WRITE | info2::DELETE) != 0
    {
        // Aggregations, background UDF scans and background operations: not yet.
        return refuse(service, out, ResultCode::UnsupportedFeature);
    }
    if has(field_type::INDEX_RANGE)
        || has(field_type::INDEX_NAME)
        || has(field_type::INDEX_EXPRESSION)
    {
        // A secondary-index query: no index exists.
        return refuse(service, out, ResultCode::SindexNotFound);
    }
    if has(field_type::TXN_ID) {
        return refuse(service, out, ResultCode::EnterpriseOnly);
    }
    if header.info3 & info3::PARTITION_DONE == 0 {
        // A legacy (pre-6.0 client) scan, as the reference server answers it.
        return refuse(service, out, ResultCode::UnsupportedFeature);
    }
    let Some(namespace) = message.field(field_type::NAMESPACE).and_then(|name| {
        service
            .namespaces
            .iter()
            .find(|namespace| namespace.config.name.as_bytes() == name)
            .cloned()
    }) else {
        return refuse(service, out, ResultCode::Namespace);
    };
    let cursor = match parse(message, namespace) {
        Ok(Some(mut cursor)) => {
            if service.routes() {
                cursor.keep_served_partitions(service);
            }
            cursor
        }
        Ok(None) => {
            // Unknown set: nothing to return, the stream completes normally.
            service.stats.scan.started.fetch_add(1, Ordering::Relaxed);
            service.stats.scan.completed.fetch_add(1, Ordering::Relaxed);
            transaction::write_stream_end(out, ResultCode::Ok);
            return None;
        }
        Err(code) => return refuse(service, out, code),
    };
    service.stats.scan.started.fetch_add(1, Ordering::Relaxed);
    Some(cursor)
}

/// Parses the scan's fields and ops. `Ok(None)` when the set does not exist.
fn parse(
    message: &Message<'_>,
    namespace: Arc<Namespace>,
) -> Result<Option<ScanCursor>, ResultCode> {
    let partitions = partitions(
        message.field(field_type::PID_ARRAY),
        message.field(field_type::DIGEST_ARRAY),
    )?;
    let max_records = match message.field(field_type::MAX_RECORDS) {
        None => 0,
        Some(bytes) => {
            let word: [u8; 8] = bytes.try_into().map_err(|_| ResultCode::Parameter)?;
            u64::from_be_bytes(word)
        }
    };
    let rate = match message.field(field_type::RECORDS_PER_SECOND) {
        None => 0,
        Some(bytes) => {
            let word: [u8; 4] = bytes.try_into().map_err(|_| ResultCode::Parameter)?;
            u32::from_be_bytes(word)
        }
    };
    let set_name = message.field(field_type::SET).unwrap_or_default();
    if set_name.len() > citrine_types::SET_NAME_MAX || set_name.contains(&0) {
        return Err(ResultCode::Parameter);
    }
    let set = if set_name.is_empty() {
        SetFilter::All
    } else {
        match namespace.sets.existing_id(set_name) {
            Some(id) => SetFilter::Only(id),
            None => return Ok(None),
        }
    };
    let mut bins = Vec::new();
    for op in message.ops() {
        if op.op_type != op_type::READ {
            return Err(ResultCode::Parameter);
        }
        if op.name.len() > BIN_NAME_MAX {
            return Err(ResultCode::BinName);
        }
        if !op.name.is_empty() {
            bins.push(op.name.to_vec());
        }
    }
    let no_bins = message.header.info1 & info1::GET_NO_BINS != 0;
    let filter = match message.field(field_type::FILTER_EXPRESSION) {
        Some(bytes) => Some(Box::new(crate::filter::parse(bytes)?)),
        None => None,
    };
    Ok(Some(ScanCursor {
        namespace,
        partitions,
        next: 0,
        set,
        bins,
        no_bins,
        filter,
        max_records,
        sent: 0,
        rate,
        paced_since_ms: None,
        step_end: u64::MAX,
        set_names: HashMap::new(),
        digests: Vec::new(),
        key_field: Vec::new(),
        unavailable: Vec::new(),
    }))
}

/// The partitions a scan visits, ascending: PID_ARRAY (u16 LE ids, from the
/// start) and DIGEST_ARRAY (resume after each digest in its partition), or
/// every partition when neither is present.
fn partitions(
    pid_array: Option<&[u8]>,
    digest_array: Option<&[u8]>,
) -> Result<Vec<PartitionCursor>, ResultCode> {
    if pid_array.is_none() && digest_array.is_none() {
        return Ok(PartitionId::all()
            .map(|partition| PartitionCursor {
                partition,
                after: None,
            })
            .collect());
    }
    let mut seen = vec![false; PARTITIONS];
    let mut chosen = Vec::new();
    if let Some(bytes) = pid_array {
        if bytes.is_empty() || bytes.len() % 2 != 0 || bytes.len() / 2 > PARTITIONS {
            return Err(ResultCode::Parameter);
        }
        for pair in bytes.chunks_exact(2) {
            let partition = PartitionId::new(u16::from_le_bytes([pair[0], pair[1]]))
                .ok_or(ResultCode::Parameter)?;
            if std::mem::replace(&mut seen[partition.index()], true) {
                return Err(ResultCode::Parameter);
            }
            chosen.push(PartitionCursor {
                partition,
                after: None,
            });
        }
    }
    if let Some(bytes) = digest_array {
        if bytes.is_empty()
            || bytes.len() % DIGEST_SIZE != 0
            || bytes.len() / DIGEST_SIZE > PARTITIONS
        {
            return Err(ResultCode::Parameter);
        }
        for chunk in bytes.chunks_exact(DIGEST_SIZE) {
            let mut digest = [0u8; DIGEST_SIZE];
            digest.copy_from_slice(chunk);
            let digest = Digest(digest);
            let partition = digest.partition();
            if std::mem::replace(&mut seen[partition.index()], true) {
                return Err(ResultCode::Parameter);
            }
            chosen.push(PartitionCursor {
                partition,
                after: Some(digest),
            });
        }
    }
    chosen.sort_unstable_by_key(|cursor| cursor.partition);
    Ok(chosen)
}

/// How a partition's visit ended.
enum Visit {
    /// Every record past the resume point was looked at.
    Finished,
    /// A budget or the record limit stopped the visit; `after` is set.
    Stopped,
}

impl ScanCursor {
    /// Records returned so far.
    pub fn records_sent(&self) -> u64 {
        self.sent
    }

    /// Appends one frame of the stream. Returns the cursor while the stream
    /// continues, `None` once the frame ended with the LAST message.
    /// In a cluster: keeps the partitions this node masters and holds whole,
    /// moves the others to `unavailable`.
    fn keep_served_partitions(&mut self, service: &Service) {
        let cluster = service.cluster();
        let name = &self.namespace.config.name;
        let Some(map) = cluster.namespace(name) else {
            return;
        };
        let mut unavailable = Vec::new();
        self.partitions.retain(|cursor| {
            let served = map.map.replicas(cursor.partition).first() == Some(&service.node_id)
                && service.migrations.serves_whole(name, cursor.partition);
            if !served {
                unavailable.push(cursor.partition);
            }
            served
        });
        self.unavailable = unavailable;
    }

    pub(crate) fn step(
        mut self: Box<Self>,
        service: &Service,
        now: Now,
        out: &mut Vec<u8>,
    ) -> Option<Box<ScanCursor>> {
        let frame_start = out.len();
        out.extend_from_slice(&[0u8; PROTO_HEADER_SIZE]);
        for partition in std::mem::take(&mut self.unavailable) {
            // Partition-done with 11: retry this partition on another round.
            let done = MsgHeader {
                info3: info3::PARTITION_DONE,
                generation: partition.index() as u32,
                result_code: ResultCode::Unavailable.code(),
                ..MsgHeader::default()
            };
            MessageWriter::begin_bare(out, &done).finish();
        }
        let mut examined = 0usize;
        let sent_before = self.sent;
        if self.rate > 0 {
            self.paced_since_ms.get_or_insert(now.unix_ms);
            if self
                .not_before_ms()
                .is_some_and(|due| due > now.unix_ms + MAX_PACED_PAUSE_MS)
            {
                // The wall clock went back: go on from now at the same
                // rate rather than hold the scan for the jump.
                self.paced_since_ms = Some(now.unix_ms.saturating_sub(self.schedule_ms()));
            }
            let per_step = (self.rate / PACED_STEPS_PER_SECOND).max(1);
            self.step_end = self.sent + u64::from(per_step);
        }
        let finished = loop {
            if self.limit_reached() || self.next >= self.partitions.len() {
                break true;
            }
            let visit = self.visit_partition(now, out, frame_start, &mut examined);
            if let Visit::Finished = visit {
                self.next += 1;
            }
            if self.limit_reached() || self.next >= self.partitions.len() {
                break true;
            }
            if out.len() - frame_start >= CHUNK_BYTES
                || examined >= EXAMINE_BUDGET
                || self.sent >= self.step_end
            {
                break false;
            }
        };
        service
            .stats
            .scan
            .records
            .fetch_add(self.sent - sent_before, Ordering::Relaxed);
        if finished {
            let last = MsgHeader {
                info3: info3::LAST,
                ..MsgHeader::default()
            };
            MessageWriter::begin_bare(out, &last).finish();
            ProtoHeader::patch(&mut out[frame_start..], MessageType::Message);
            service.stats.scan.completed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        if out.len() == frame_start + PROTO_HEADER_SIZE {
            // Nothing matched in this step: send no (empty) frame at all.
            out.truncate(frame_start);
        } else {
            ProtoHeader::patch(&mut out[frame_start..], MessageType::Message);
        }
        Some(self)
    }

    fn limit_reached(&self) -> bool {
        self.max_records != 0 && self.sent >= self.max_records
    }

    /// When the next step is due (unix ms) under the scan's RECS_PER_SEC:
    /// the time by which the records sent so far are due at that rate,
    /// counted from the first step. `None` when the scan is not throttled.
    pub(crate) fn not_before_ms(&self) -> Option<u64> {
        if self.rate == 0 {
            return None;
        }
        Some(self.paced_since_ms? + self.schedule_ms())
    }

    /// How long after the first step the records sent so far are due at
    /// the scan's rate (0 when it has none).
    fn schedule_ms(&self) -> u64 {
        match self.rate {
            0 => 0,
            rate => self.sent * 1000 / u64::from(rate),
        }
    }

    /// Visits the current partition under its read lock: collects the live
    /// matching digests past the resume point, sorted, and emits records
    /// until the partition is done or a budget is spent.
    fn visit_partition(
        &mut self,
        now: Now,
        out: &mut Vec<u8>,
        frame_start: usize,
        examined: &mut usize,
    ) -> Visit {
        let Some(cursor) = self.partitions.get(self.next).copied() else {
            return Visit::Finished;
        };
        let namespace = Arc::clone(&self.namespace);
        let partition = namespace.index.partition(cursor.partition).read();
        *examined += partition.len();
        let mut digests = std::mem::take(&mut self.digests);
        digests.clear();
        digests.extend(
            partition
                .iter()
                .filter(|(digest, entry)| {
                    cursor.after.is_none_or(|after| **digest > after)
                        && match self.set {
                            SetFilter::All => true,
                            SetFilter::Only(id) => entry.meta().set_id == id,
                        }
                        && is_live(&namespace, &entry.meta(), now)
                })
                .map(|(digest, _)| *digest),
        );
        digests.sort_unstable();
        let mut visit = Visit::Finished;
        let total = digests.len();
        for (position, digest) in digests.iter().enumerate() {
            if let Some(entry) = partition.get(digest) {
                if self.emit(&namespace, digest, entry, now, out) {
                    self.sent += 1;
                }
            }
            *examined += 1;
            let more_here = position + 1 < total;
            if more_here
                && (self.limit_reached()
                    || out.len() - frame_start >= CHUNK_BYTES
                    || *examined >= EXAMINE_BUDGET
                    || self.sent >= self.step_end)
            {
                if let Some(current) = self.partitions.get_mut(self.next) {
                    current.after = Some(*digest);
                }
                visit = Visit::Stopped;
                break;
            }
        }
        drop(partition);
        self.digests = digests;
        visit
    }

    /// Writes one record message. False when the record does not pass the
    /// scan's filter, or its body could not be read (logged; the record is
    /// skipped rather than failing the scan).
    fn emit(
        &mut self,
        namespace: &Namespace,
        digest: &Digest,
        entry: &citrine_index::IndexEntry,
        now: Now,
        out: &mut Vec<u8>,
    ) -> bool {
        let body = match namespace.storage.read(&entry.location) {
            Ok(body) => body,
            Err(error) => {
                tracing::warn!(?digest, "scan skips a record it cannot read: {error}");
                return false;
            }
        };
        let Ok(view) = BodyView::parse(&body) else {
            tracing::warn!(?digest, "scan skips a record with a corrupt body");
            return false;
        };
        let meta = entry.meta();
        if let Some(filter) = &self.filter {
            let record = RecordView::stored(
                namespace,
                &digest.0,
                &view,
                meta,
                entry.location.size() as u64,
            );
            if crate::filter::check(filter, &record, now).is_err() {
                return false;
            }
        }
        let header = MsgHeader {
            generation: u32::from(meta.generation),
            record_ttl: meta.void_time,
            ..MsgHeader::default()
        };
        let set_id = meta.set_id;
        let set_name = self
            .set_names
            .entry(set_id)
            .or_insert_with(|| namespace.sets.name(set_id));
        let mut writer = MessageWriter::begin_bare(out, &header);
        writer
            .field(field_type::NAMESPACE, namespace.config.name.as_bytes())
            .field(field_type::DIGEST, &digest.0);
        if let Some(name) = set_name {
            writer.field(field_type::SET, name);
        }
        if let Some((particle_type, bytes)) = view.key() {
            self.key_field.clear();
            self.key_field.push(particle_type);
            self.key_field.extend_from_slice(bytes);
            writer.field(field_type::KEY, &self.key_field);
        }
        if !self.no_bins {
            if self.bins.is_empty() {
                for bin in view.bins() {
                    writer.op(op_type::READ, bin.particle_type, &bin.name, &bin.value);
                }
            } else {
                for name in &self.bins {
                    if let Some(bin) = view.bin(name) {
                        writer.op(op_type::READ, bin.particle_type, &bin.name, &bin.value);
                    }
                }
            }
        }
        writer.finish();
        true
    }
}

#[cfg(test)]
mod tests;
