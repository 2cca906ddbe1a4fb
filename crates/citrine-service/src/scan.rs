//! Foreground partition scans and secondary-index queries (an AS_MSG
//! without a DIGEST field; `shared/protocol/04-batch-scan-query.md` §3),
//! streamed in chunks.
//!
//! `start` validates the request (PID and digest arrays, set, limits,
//! projection) and builds a [`ScanCursor`]; each step
//! (`ScanCursor::step`) appends one frame of record messages (about
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
//!   copy as complete. Asked by partition list, an acting master also
//!   serves the partitions it claims (see [`crate::migration`]) from its
//!   whole copy, and checks each again once walked: one whose claim ended
//!   meanwhile is reported unavailable (the client resumes it after its
//!   last record). Clients treat a partition not reported unavailable as
//!   finished when the stream ends.
//!
//! Throttle: RECS_PER_SEC (field 10, records a second, 0 = none) caps each
//! step at a tenth of a second's worth of records (at least one) and
//! names the time the next step is due, `ScanCursor::not_before_ms`:
//! when `sent` records are due at that rate since the scan's first step.
//! The connection loop holds the connection until then (serving the
//! others), and the stream's LAST message until its records are due, so N
//! records take at least N / rate seconds (as the reference's per-record
//! throttle does), never longer than `MAX_PACED_PAUSE_MS` at a time: a wall
//! clock stepped back makes the next step start the schedule again. The
//! blocking [`crate::Service::handle`] path does not wait.
//!
//! Filter expressions (field 43) are evaluated against each record's
//! stored bins (whatever bins the scan projects): a record that does not
//! pass is skipped, not counted against `max_records`.
//!
//! Projection: a scan that names bins (or read ops) returns a record only
//! when at least one of them answers there; a record holding none of the
//! bins is left out, as the reference leaves it out (it is not counted
//! against `max_records` either). With `RESPOND_ALL_OPS` (how clients send
//! read ops) every op answers, a nil where it has nothing, so every record
//! is returned. A record on which an op fails (a bin of another type) is
//! left out too, as the reference leaves it out. An aggregation's bin names are not a
//! projection: its stream sees whole records, as the reference's does.
//!
//! Queries (INDEX_RANGE, field 22): the index is found by name, expression
//! or bin, key type, collection type and context (`citrine_sindex::Registry::for_query`;
//! none → 201; still being built → 203), and only the partitions its
//! summary shows holding entries in the query's ranges are looked at (a
//! selective query passes the others without a look). A partition's
//! records then come from the index's tree in
//! `(bval, digest)` order, resuming strictly after the client's
//! `(BVAL, DIGEST)`; each is checked against the record itself (live, in
//! the set, still holding a value in range) and returned once, at its
//! smallest matching bval, with a BVAL field (15, i64 LE) for the client's
//! next resume point. A query is not a snapshot: a record updated while the
//! query runs is returned as it is when the query reaches it (or not at
//! all, if the update moved its smallest matching value behind the query's
//! position), as the reference's queries are not snapshots either. A scan
//! of a set that has a built set index (`indextype=SET`, servers 8.1.2+)
//! reads the set's records from that index instead of walking the
//! namespace.
//!
//! Background scans and queries (`info2 WRITE` with write ops) use the
//! same cursor, collecting digests instead of writing record messages, for
//! [`crate::job`]. A client's scan, query or aggregation is a job too
//! while it streams (a `job::monitor::Watch` in the cursor): `query-show`
//! lists it while it runs and among the last finished.
//!
//! What it reaches: the two layers ([`crate::Layers`]: the namespaces and
//! their records; the view and migrations that say which partitions this
//! node serves; the node's counters), the secondary indexes of the
//! namespace a request names ([`IndexesOf`]) and the registry of the jobs
//! `query-show` shows ([`Monitors`]) — never the service itself.
//!
//! A legacy scan (a pre-6.0 client's, without `info3` PARTITION_DONE)
//! answers 16, as the reference answers it; aggregations (UDF_OP 1) start
//! in [`crate::udf`], not here.

use crate::filter::RecordView;
use crate::job::monitor::{Counts, JobType, Monitor, Monitors, Origin, Reason, Watch};
use crate::namespace::Namespace;
use crate::transaction::{self, is_live, Now};
use crate::Layers;
use citrine_distribution::Distribution;
use citrine_record::BodyView;
use citrine_types::{
    Digest, ParticleType, PartitionId, ResultCode, BIN_NAME_MAX, DIGEST_SIZE, PARTITIONS,
};
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
    /// Resume strictly after this digest (in ascending digest order; for a
    /// query, after `(after_bval, digest)` in the index's order).
    after: Option<Digest>,
    /// A query's resume bval (BVAL_ARRAY); 0 for scans.
    after_bval: i64,
}

/// A secondary-index query's part of a cursor: the index, the filter, and
/// reused buffers.
/// A query lists the partitions holding its entries when they are at most
/// this many `(bval, partition)` pairs; past it, it visits every partition.
const HOLDERS_MAX_PAIRS: usize = 4096;

struct Query {
    index: Arc<citrine_sindex::Sindex>,
    filter: citrine_sindex::Filter,
    /// The bval ranges the filter reads, sorted and disjoint.
    ranges: Vec<(i64, i64)>,
    /// The partitions holding entries in those ranges when the query
    /// started (`None`: too many to list, visit every one); the others are
    /// passed without a look at their trees.
    holders: Option<Vec<bool>>,
    /// One step's `(bval, digest)` candidates from the index.
    candidates: Vec<(i64, Digest)>,
    /// One record's keys, when checking it.
    keys: Vec<citrine_sindex::Key>,
    /// Whether records carry their bval (BVAL_ARRAY) for the client's
    /// resume point: a query's do, a scan read from a set index's do not.
    send_bval: bool,
}

/// One visit's entries from a query's index.
struct Candidates {
    /// `(bval, digest)` in index order.
    entries: Vec<(i64, Digest)>,
    /// The index holds more entries past these.
    more_in_tree: bool,
    /// What checking one costs against the step's examine budget.
    cost: usize,
}

impl Query {
    /// The index's entries in range in `cursor`'s partition past its
    /// resume point: as many as the step's examine budget left after
    /// `examined` allows (at least one), or every one for a `whole`
    /// selection. Takes the reused buffer (give it back when done).
    fn take_candidates(
        &mut self,
        cursor: PartitionCursor,
        examined: usize,
        whole: bool,
    ) -> Candidates {
        let mut entries = std::mem::take(&mut self.candidates);
        entries.clear();
        // A background job takes a partition's whole selection at once: its
        // writes move records within the index, so resuming part-way by
        // index position could select a record it already wrote.
        let cost = self.filter.check_cost();
        let budget = if whole {
            usize::MAX - 1
        } else {
            (EXAMINE_BUDGET.saturating_sub(examined) / cost).max(1)
        };
        self.index.candidates(
            cursor.partition,
            &self.ranges,
            cursor.after.map(|digest| (cursor.after_bval, digest)),
            budget + 1,
            &mut entries,
        );
        // More entries past this step's budget: the visit stops at the last
        // one it looks at.
        let more_in_tree = entries.len() > budget;
        entries.truncate(budget);
        Candidates {
            entries,
            more_in_tree,
            cost,
        }
    }
}

/// Which records a scan returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SetFilter {
    /// Every record of the namespace.
    All,
    /// Records of this set id.
    Only(u16),
}

impl ScanCursor {
    /// A cursor over `partitions` of `namespace` returning the records of
    /// `set`, whole, with no filter, limit or throttle (the caller sets
    /// what its request asks).
    fn new(namespace: Arc<Namespace>, partitions: Vec<PartitionCursor>, set: SetFilter) -> Self {
        ScanCursor {
            namespace,
            partitions,
            next: 0,
            set,
            projection: Vec::new(),
            no_bins: false,
            respond_all_ops: false,
            filter: None,
            query: None,
            collected: None,
            max_records: 0,
            sent: 0,
            omitted: 0,
            failed: 0,
            rate: 0,
            paced_since_ms: None,
            step_end: u64::MAX,
            set_names: HashMap::new(),
            digests: Vec::new(),
            key_field: Vec::new(),
            unavailable: Vec::new(),
            wait_for_whole: false,
            blocked: false,
            recheck: false,
            pins: None,
            watch: None,
            filtered: 0,
            started: None,
        }
    }

    /// Whether a record with `meta` is one the scan may return: in its set
    /// and live (not expired, not truncated).
    fn admits(&self, meta: &citrine_index::RecordMeta, now: Now) -> bool {
        let in_set = match self.set {
            SetFilter::All => true,
            SetFilter::Only(id) => meta.set_id == id,
        };
        in_set && is_live(&self.namespace, meta, now)
    }
}

/// A scan in progress: what is left and the limits that apply.
pub struct ScanCursor {
    namespace: Arc<Namespace>,
    /// Partitions to visit, ascending id; `partitions[next..]` are left.
    partitions: Vec<PartitionCursor>,
    next: usize,
    set: SetFilter,
    /// The projection: bin reads by name, and (servers 8.1.2+) read ops
    /// evaluated on each record — list/map, bit, HLL and expression reads,
    /// path expressions — answered in order as an operate's would be.
    /// Empty = every bin.
    projection: Vec<ProjectionOp>,
    /// Metadata only (`info1 GET_NO_BINS`).
    no_bins: bool,
    /// `info2 RESPOND_ALL_OPS`: each projected op answers on every record,
    /// a nil value where it has nothing (so no record is left out).
    respond_all_ops: bool,
    /// The filter expression (field 43) a record must pass to be returned.
    filter: Option<Box<citrine_exp::Expression>>,
    /// A secondary-index query: records come from the index, not from a
    /// walk of the partition.
    query: Option<Box<Query>>,
    /// A background job's cursor: the digests of the records that pass go
    /// here instead of into record messages.
    collected: Option<Vec<Digest>>,
    /// Record limit (0 = none).
    max_records: u64,
    /// Records returned so far.
    sent: u64,
    /// Records selected but left out because none of the projection's bins
    /// or ops answered on them (not counted against `max_records`).
    omitted: u64,
    /// Records left out because a projected op failed on them.
    failed: u64,
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
    /// A background job's cursor: a partition this node masters but is
    /// still filling is visited only once it is whole (others go first).
    wait_for_whole: bool,
    /// Set by a step that stopped because every partition left is still
    /// filling here: the job tries again later.
    blocked: bool,
    /// A foreground scan or query in a cluster that may serve partitions
    /// this node claims as acting master: each partition is checked again
    /// once walked (see [`ScanCursor::keep_served_partitions`]).
    recheck: bool,
    /// A background job's partitions not walked yet, pinned so that their
    /// copies stay here until walked.
    pins: Option<PinGuard>,
    /// A client's foreground scan or query: the job `query-show` shows,
    /// told of the walk's counts after each step and ended with its stream
    /// (or, when the cursor is dropped before, as abandoned).
    watch: Option<Watch>,
    /// Records a filter expression left out.
    filtered: u64,
    /// When a client's short foreground scan or query (`info1
    /// SHORT_QUERY`) began: its latency goes to `{NS}-pi-query` or
    /// `{NS}-si-query` when its stream ends.
    started: Option<std::time::Instant>,
}

/// Pins on the partitions a background job's cursor still has to walk
/// (see [`crate::migration::JobPins`]): each is released once its walk is
/// done, and the rest when the cursor goes (the job ended or was aborted).
#[derive(Debug)]
struct PinGuard {
    pins: Arc<crate::migration::JobPins>,
    namespace: String,
    held: Vec<u16>,
}

impl PinGuard {
    /// Releases `partition`'s pin, dropping its copy if that waited for it.
    fn release(&mut self, dist: &Distribution, partition: PartitionId) {
        let id = partition.index() as u16;
        let Some(at) = self.held.iter().position(|held| *held == id) else {
            return;
        };
        self.held.swap_remove(at);
        if let Some(epoch) = self.pins.unpin(&self.namespace, id) {
            dist.drop_deferred(&self.namespace, partition, epoch);
        }
    }
}

impl Drop for PinGuard {
    fn drop(&mut self) {
        for partition in self.held.drain(..) {
            self.pins.unpin_later(&self.namespace, partition);
        }
    }
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
pub(crate) fn refuse(
    layers: Layers<'_>,
    out: &mut Vec<u8>,
    code: ResultCode,
) -> Option<ScanCursor> {
    layers.stats.scan.refused.fetch_add(1, Ordering::Relaxed);
    transaction::write_stream_end(out, code);
    None
}

/// The UDF_OP field's values.
pub(crate) mod udf_op {
    /// A stream UDF over the records the query selects.
    pub const AGGREGATE: u8 = 1;
    /// A record UDF applied to each selected record by a background job.
    pub const BACKGROUND: u8 = 2;
}

/// How a scan finds the secondary indexes of the namespace it names (each
/// namespace has its own; the service holds them).
pub(crate) type IndexesOf<'s> = &'s dyn Fn(&Namespace) -> &'s citrine_sindex::Registry;

/// Whether a scan or query request is a background job's ([`crate::job`]):
/// it writes, or it names a background UDF. A background UDF job may come
/// with a read header (the Go client's ExecuteUDF sends no write policy):
/// UDF_OP 2 says background.
pub(crate) fn is_background(message: &Message<'_>) -> bool {
    message.header.info2 & (info2::WRITE | info2::DELETE) != 0
        || message.field(field_type::UDF_OP) == Some(&[udf_op::BACKGROUND][..])
}

/// The checks every scan request passes, foreground or `background`,
/// before its fields are parsed: its UDF fields, no transaction, a client
/// that tracks partitions (or a job), and a namespace of this node's.
/// Answers that namespace, or the refusal's code.
pub(crate) fn check_request(
    layers: Layers<'_>,
    message: &Message<'_>,
    background: bool,
) -> Result<Arc<Namespace>, ResultCode> {
    let has = |kind: u8| message.field(kind).is_some();
    match message.field(field_type::UDF_OP) {
        None if has(field_type::UDF_FILENAME) => return Err(ResultCode::Parameter),
        None => {}
        // Aggregations start in `crate::udf::start_aggregate`.
        // A background UDF job: checked with the job's other fields.
        Some([udf_op::BACKGROUND]) if background => {}
        Some(_) => return Err(ResultCode::Parameter),
    }
    if has(field_type::TXN_ID) {
        return Err(ResultCode::EnterpriseOnly);
    }
    if message.header.info3 & info3::PARTITION_DONE == 0 && !background {
        // A legacy (pre-6.0 client) scan, as the reference server answers it.
        return Err(ResultCode::UnsupportedFeature);
    }
    message
        .field(field_type::NAMESPACE)
        .and_then(|name| layers.data.namespace_shared(name))
        .ok_or(ResultCode::Namespace)
}

/// Starts a foreground scan or query (background ones are jobs:
/// [`crate::job::start`]): validates the request and returns the cursor
/// whose steps produce the stream, or `None` after writing a one-message
/// refusal (or, for an unknown set, an empty complete stream). A client's
/// scan is a job `query-show` shows (see [`crate::job::monitor`]), kept in
/// `monitors`.
pub(crate) fn start(
    layers: Layers<'_>,
    monitors: &Monitors,
    indexes: IndexesOf<'_>,
    message: &Message<'_>,
    out: &mut Vec<u8>,
    origin: Origin,
) -> Option<ScanCursor> {
    let namespace = match check_request(layers, message, false) {
        Ok(namespace) => namespace,
        Err(code) => return refuse(layers, out, code),
    };
    let parsed = match parse(message, Arc::clone(&namespace), indexes(&namespace), false) {
        Ok(parsed) => parsed,
        Err(code) => return refuse(layers, out, code),
    };
    let watch = match origin {
        Origin::Client(from) => {
            let index = parsed.as_ref().and_then(ScanCursor::index_name);
            match watch(layers, monitors, message, &namespace, index, from) {
                Ok(watch) => Some(watch),
                Err(code) => return refuse(layers, out, code),
            }
        }
        Origin::Peer => None,
    };
    layers.stats.scan.started.fetch_add(1, Ordering::Relaxed);
    let Some(mut cursor) = parsed else {
        // Unknown set: nothing to return, the stream completes normally.
        end_empty(layers, out, watch);
        return None;
    };
    cursor.keep_partitions(layers, lists_partitions(message));
    // Only a client's short queries are timed, as the reference times them.
    if watch.is_some() && message.header.info1 & info1::SHORT_QUERY != 0 {
        cursor.started = Some(std::time::Instant::now());
    }
    cursor.watch = watch;
    Some(cursor)
}

/// The job `query-show` shows of a client's foreground scan or query
/// (`index`: a query's), registered in `monitors`; refused when its task
/// id names an active job. A short query's is not registered: the
/// reference's `query-show` never lists one.
fn watch(
    layers: Layers<'_>,
    monitors: &Monitors,
    message: &Message<'_>,
    namespace: &Namespace,
    index: Option<String>,
    from: Option<std::net::SocketAddr>,
) -> Result<Watch, ResultCode> {
    let monitor = Monitor::new(
        message,
        JobType::Basic,
        &namespace.config.name,
        index,
        from,
        layers.now().unix_ms,
    );
    if message.header.info1 & info1::SHORT_QUERY != 0 {
        return Ok(Monitors::unlisted(monitor, layers.data.clock_shared()));
    }
    monitors.add_foreground(monitor, layers.data.clock_shared())
}

/// A scan of a set never written: an empty, complete stream.
fn end_empty(layers: Layers<'_>, out: &mut Vec<u8>, watch: Option<Watch>) {
    layers.stats.scan.completed.fetch_add(1, Ordering::Relaxed);
    let start = out.len();
    transaction::write_stream_end(out, ResultCode::Ok);
    if let Some(watch) = watch {
        watch.monitor.add_net_io(out.len() - start);
        watch.finish(Reason::Ok);
    }
}

/// Parses the scan's fields and ops (a background scan's ops are the
/// writes each record gets, checked before by [`crate::job::check_ops`]; a
/// foreground scan's are the bins it projects). `Ok(None)` when the set
/// does not exist.
pub(crate) fn parse(
    message: &Message<'_>,
    namespace: Arc<Namespace>,
    indexes: &citrine_sindex::Registry,
    background: bool,
) -> Result<Option<ScanCursor>, ResultCode> {
    let aggregation = check_udf_ops(message, background)?;
    let set_name = set_name(message)?;
    let known_set = set_name.is_empty() || namespace.sets.existing_id(set_name).is_some();
    if !known_set && (background || aggregation) {
        // A job or an aggregation over a set never written selects nothing,
        // whatever its filter names (the reference's answer); a plain
        // query still needs its index first (201 without one).
        return Ok(None);
    }
    let query = match message.field(field_type::INDEX_RANGE) {
        Some(range) => Some(query(message, indexes, range)?),
        None => None,
    };
    let partitions = resume_points(message, query.is_some())?;
    let max_records = fixed_field(message, field_type::MAX_RECORDS)?.map_or(0, u64::from_be_bytes);
    let rate = fixed_field(message, field_type::RECORDS_PER_SECOND)?.map_or(0, u32::from_be_bytes);
    let Some(set) = set_filter(&namespace, set_name) else {
        return Ok(None);
    };
    // A scan of a set that has a built set index reads the set's records
    // from it instead of walking every record of each partition. Its
    // entries are all 0, so a resume at a digest (bval 0) needs no bvals.
    let query = query.or_else(|| {
        std::str::from_utf8(set_name)
            .ok()
            .filter(|set| !set.is_empty())
            .and_then(|set| indexes.set_index(set))
            .map(set_index_scan)
    });
    let projection = match background || aggregation {
        true => Vec::new(),
        false => projection(message)?,
    };
    let filter = match message.field(field_type::FILTER_EXPRESSION) {
        Some(bytes) => Some(Box::new(crate::filter::parse(bytes)?)),
        None => None,
    };
    Ok(Some(ScanCursor {
        projection,
        no_bins: background || message.header.info1 & info1::GET_NO_BINS != 0,
        respond_all_ops: message.header.info2 & info2::RESPOND_ALL_OPS != 0,
        filter,
        query,
        collected: background.then(Vec::new),
        max_records: if background { 0 } else { max_records },
        // A background job paces its writes itself (`job`).
        rate: if background { 0 } else { rate },
        ..ScanCursor::new(namespace, partitions, set)
    }))
}

/// Whether the request is an aggregation (UDF_OP 1, in the foreground).
/// A UDF request has no ops of its own (4): an aggregation's bin reads
/// are the bins its client selected, and its stream sees whole records
/// all the same, as the reference's does.
fn check_udf_ops(message: &Message<'_>, background: bool) -> Result<bool, ResultCode> {
    let udf_op = message.field(field_type::UDF_OP);
    let aggregation = !background && udf_op == Some(&[udf_op::AGGREGATE][..]);
    if udf_op.is_some()
        && message
            .ops()
            .any(|op| !aggregation || op.op_type != op_type::READ)
    {
        return Err(ResultCode::Parameter);
    }
    Ok(aggregation)
}

/// The SET field (empty: none), checked.
fn set_name<'m>(message: &Message<'m>) -> Result<&'m [u8], ResultCode> {
    let set_name = message.field(field_type::SET).unwrap_or_default();
    if set_name.len() > citrine_types::SET_NAME_MAX || set_name.contains(&0) {
        return Err(ResultCode::Parameter);
    }
    Ok(set_name)
}

/// Which records of `namespace` a scan of `set_name` returns; `None` for
/// a set never written.
fn set_filter(namespace: &Namespace, set_name: &[u8]) -> Option<SetFilter> {
    if set_name.is_empty() {
        return Some(SetFilter::All);
    }
    namespace.sets.existing_id(set_name).map(SetFilter::Only)
}

/// A fixed-size field's bytes (big-endian numbers), `None` when absent;
/// one of another size → 4.
fn fixed_field<const N: usize>(
    message: &Message<'_>,
    kind: u8,
) -> Result<Option<[u8; N]>, ResultCode> {
    message
        .field(kind)
        .map(|bytes| bytes.try_into().map_err(|_| ResultCode::Parameter))
        .transpose()
}

/// The partitions the request names and where each resumes (see
/// [`partitions`]). A query resumes at `(bval, digest)`: with a
/// DIGEST_ARRAY, the BVAL_ARRAY is required.
fn resume_points(message: &Message<'_>, query: bool) -> Result<Vec<PartitionCursor>, ResultCode> {
    let bvals = message.field(field_type::BVAL_ARRAY);
    if query && bvals.is_none() && message.field(field_type::DIGEST_ARRAY).is_some() {
        return Err(ResultCode::Parameter);
    }
    partitions(
        message.field(field_type::PID_ARRAY),
        message.field(field_type::DIGEST_ARRAY),
        bvals.filter(|_| query),
    )
}

/// A foreground scan's projection: its bin reads and read ops (writes
/// belong to background jobs: 4). Empty: every bin.
fn projection(message: &Message<'_>) -> Result<Vec<ProjectionOp>, ResultCode> {
    let mut projection = Vec::new();
    for op in message.ops() {
        if let Some(op) = ProjectionOp::parse(&op)? {
            projection.push(op);
        }
    }
    if projection.iter().all(|op| op.op_type == op_type::READ)
        && message
            .ops()
            .any(|op| op.op_type == op_type::READ && op.name.is_empty())
    {
        // Bin names beside a read of every bin: every bin, once.
        projection.clear();
    }
    Ok(projection)
}

/// A query's index and filter: INDEX_RANGE (22) with INDEX_TYPE (26),
/// INDEX_CONTEXT (23), INDEX_NAME (21) or INDEX_EXPRESSION (24) naming the
/// index. No such index → 201.
fn query(
    message: &Message<'_>,
    indexes: &citrine_sindex::Registry,
    range: &[u8],
) -> Result<Box<Query>, ResultCode> {
    use citrine_sindex::{CollectionType, Filter, FilterError, Lookup};
    let filter = Filter::parse(range).map_err(|error| match error {
        FilterError::Parameter => ResultCode::Parameter,
        FilterError::Unsupported => ResultCode::UnsupportedFeature,
    })?;
    let collection = match message.field(field_type::INDEX_TYPE) {
        None => CollectionType::Default,
        Some([byte]) => CollectionType::from_wire(*byte).ok_or(ResultCode::Parameter)?,
        Some(_) => return Err(ResultCode::Parameter),
    };
    let name = match message.field(field_type::INDEX_NAME) {
        None | Some([]) => None,
        Some(bytes) => Some(std::str::from_utf8(bytes).map_err(|_| ResultCode::Parameter)?),
    };
    let set = message
        .field(field_type::SET)
        .filter(|set| !set.is_empty())
        .and_then(|set| std::str::from_utf8(set).ok());
    let lookup = Lookup {
        name,
        expression: message.field(field_type::INDEX_EXPRESSION),
        bin: &filter.bin,
        key_type: filter.key_type,
        collection,
        context: message.field(field_type::INDEX_CONTEXT),
    };
    let index = indexes
        .for_query(set, &lookup)
        .ok_or(ResultCode::SindexNotFound)?;
    if index.def.key_type != filter.key_type || index.def.is_set_index() {
        // Named, but of another type than the filter's value, or a set
        // index (which answers scans of its set, not filters).
        return Err(ResultCode::Parameter);
    }
    if !index.is_loaded() {
        // Still being built: its answer would miss records (as the
        // reference, 203).
        return Err(ResultCode::SindexNotReadable);
    }
    index.stats().queries.fetch_add(1, Ordering::Relaxed);
    let ranges = filter.bval_ranges();
    let holders = index.partitions_in(&ranges, HOLDERS_MAX_PAIRS);
    Ok(Box::new(Query {
        index,
        ranges,
        holders,
        filter,
        candidates: Vec::new(),
        keys: Vec::new(),
        send_bval: true,
    }))
}

/// The query part of a scan that reads its set's records from the set's
/// index: every entry (bval 0), no BVAL field in the records (the client
/// asked for a scan, not a query).
fn set_index_scan(index: Arc<citrine_sindex::Sindex>) -> Box<Query> {
    debug_assert!(index.def.is_set_index());
    index.stats().queries.fetch_add(1, Ordering::Relaxed);
    let ranges = vec![(0, 0)];
    let holders = index.partitions_in(&ranges, HOLDERS_MAX_PAIRS);
    Box::new(Query {
        index,
        filter: citrine_sindex::Filter {
            bin: Vec::new(),
            key_type: citrine_sindex::KeyType::Numeric,
            range: citrine_sindex::Range::Int { begin: 0, end: 0 },
        },
        ranges,
        holders,
        candidates: Vec::new(),
        keys: Vec::new(),
        send_bval: false,
    })
}

/// True when this node serves `partition` to a scan: it masters it in
/// `map` and holds it whole, or (`follow_claims`, AP only) it claims it as
/// its acting master. For a strong-consistency namespace the master is the
/// view's SC map's (none while the partition is unavailable or the view
/// undecided), and a master still filling its copy does not serve it: SC
/// has no acting masters.
fn serves(
    layers: Layers<'_>,
    map: &citrine_distribution::cluster_state::NamespaceMap,
    sc: bool,
    partition: PartitionId,
    follow_claims: bool,
) -> bool {
    let migrations = &layers.dist.migrations;
    let me = layers.node_id();
    let namespace = map.name.as_str();
    if sc {
        return map
            .sc
            .get()
            .is_some_and(|sc| sc.replicas(partition).first() == Some(&me))
            && migrations.serves_whole(namespace, partition);
    }
    (map.map.replicas(partition).first() == Some(&me)
        && migrations.serves_whole(namespace, partition))
        || (follow_claims
            && migrations.master_claim(namespace, partition, me)
                == crate::migration::MasterClaim::Acting)
}

/// True when the request names the partitions it wants (PID_ARRAY or
/// DIGEST_ARRAY), as partition-tracking clients send scans and queries.
pub(crate) fn lists_partitions(message: &Message<'_>) -> bool {
    message.field(field_type::PID_ARRAY).is_some()
        || message.field(field_type::DIGEST_ARRAY).is_some()
}

/// The partitions a scan visits, ascending: PID_ARRAY (u16 LE ids, from the
/// start) and DIGEST_ARRAY (resume after each digest in its partition; a
/// query's BVAL_ARRAY gives each its bval, i64 LE), or every partition when
/// neither is present.
fn partitions(
    pid_array: Option<&[u8]>,
    digest_array: Option<&[u8]>,
    bval_array: Option<&[u8]>,
) -> Result<Vec<PartitionCursor>, ResultCode> {
    if pid_array.is_none() && digest_array.is_none() {
        return Ok(PartitionId::all()
            .map(|partition| PartitionCursor {
                partition,
                after: None,
                after_bval: 0,
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
                after_bval: 0,
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
        let bvals = match bval_array {
            None => None,
            Some(bvals) if bvals.len() == bytes.len() / DIGEST_SIZE * 8 => Some(bvals),
            // One bval per digest, or none.
            Some(_) => return Err(ResultCode::Parameter),
        };
        for (position, chunk) in bytes.chunks_exact(DIGEST_SIZE).enumerate() {
            let mut digest = [0u8; DIGEST_SIZE];
            digest.copy_from_slice(chunk);
            let digest = Digest(digest);
            let partition = digest.partition();
            if std::mem::replace(&mut seen[partition.index()], true) {
                return Err(ResultCode::Parameter);
            }
            let after_bval = bvals
                .and_then(|bvals| bvals.get(position * 8..position * 8 + 8))
                .and_then(|word| word.try_into().ok())
                .map_or(0, i64::from_le_bytes);
            chosen.push(PartitionCursor {
                partition,
                after: Some(digest),
                after_bval,
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

    /// The index a query uses.
    pub(crate) fn index_name(&self) -> Option<String> {
        self.query
            .as_ref()
            .map(|query| query.index.def.name.clone())
    }

    /// A background job's digests collected since the last call.
    pub(crate) fn take_collected(&mut self) -> Vec<Digest> {
        self.collected
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// How much of the scan is done, in hundredths of a percent of its
    /// partitions.
    pub(crate) fn progress_hundredths(&self) -> u64 {
        match self.partitions.len() {
            0 => 10_000,
            total => (self.next * 10_000 / total) as u64,
        }
    }

    /// The walk's counts so far, as `query-show` shows them: records sent
    /// or left out for their projection succeeded (the reference counts
    /// both), those a projected op failed on failed, and every one went
    /// through the throttle when the scan has a rate.
    pub(crate) fn counts(&self) -> Counts {
        let succeeded = self.sent + self.omitted;
        Counts {
            succeeded,
            failed: self.failed,
            filtered: self.filtered,
            throttled: if self.rate > 0 { succeeded } else { 0 },
        }
    }

    /// Records the filter expression left out since the last call (a
    /// background job's, which counts them itself).
    pub(crate) fn take_filtered(&mut self) -> u64 {
        std::mem::take(&mut self.filtered)
    }

    /// Takes the partitions found unavailable (they are then not reported
    /// in the stream).
    pub(crate) fn take_unavailable(&mut self) -> Vec<PartitionId> {
        std::mem::take(&mut self.unavailable)
    }

    /// For a background job in a cluster: keeps the partitions this node
    /// masters, whole or still filling; a filling one is visited once it is
    /// whole ([`ScanCursor::blocked`] meanwhile, when nothing else is left).
    /// The others are their masters' part of the job. The partitions kept
    /// are pinned until walked: a view that moves one away defers the drop
    /// of this node's copy until the job has walked it.
    pub(crate) fn keep_mastered_partitions(&mut self, layers: Layers<'_>) {
        let cluster = layers.dist.cluster();
        let Some(map) = cluster.namespace(&self.namespace.config.name) else {
            return;
        };
        let me = layers.node_id();
        self.partitions
            .retain(|cursor| map.map.replicas(cursor.partition).first() == Some(&me));
        self.wait_for_whole = true;
        let held: Vec<u16> = self
            .partitions
            .iter()
            .map(|cursor| cursor.partition.index() as u16)
            .collect();
        let pins = Arc::clone(&layers.dist.migrations.pins);
        pins.pin(&self.namespace.config.name, held.iter().copied());
        self.pins = Some(PinGuard {
            pins,
            namespace: self.namespace.config.name.clone(),
            held,
        });
    }

    /// True when the last step stopped only because every partition left
    /// is still being filled here.
    pub(crate) fn blocked(&self) -> bool {
        self.blocked
    }

    /// Whether the partition at `next` may be visited now; else puts a
    /// later one that may in its place, if any. A partition may be visited
    /// once it is whole here, or once this node no longer masters it (what
    /// is left of it here is visited, its writes taking the ordinary path).
    fn next_is_ready(&mut self, layers: Layers<'_>) -> bool {
        let name = &self.namespace.config.name;
        let cluster = layers.dist.cluster();
        let map = cluster.namespace(name);
        let me = layers.node_id();
        let ready = |partition: PartitionId| {
            layers.dist.migrations.serves_whole(name, partition)
                || map.is_none_or(|map| map.map.replicas(partition).first() != Some(&me))
        };
        let Some(current) = self.partitions.get(self.next) else {
            return true;
        };
        if current.after.is_some() || ready(current.partition) {
            return true;
        }
        let later = self.partitions[self.next + 1..]
            .iter()
            .position(|cursor| ready(cursor.partition));
        match later {
            Some(offset) => {
                self.partitions.swap(self.next, self.next + 1 + offset);
                true
            }
            None => false,
        }
    }

    /// In a cluster: keeps the partitions this node masters and holds whole,
    /// and — when `follow_claims` — those it claims as their acting master
    /// (it holds their only copy while their master fills); moves the
    /// others to `unavailable`.
    ///
    /// Only requests that list their partitions follow claims: the client
    /// chose a node for each partition. A request for all partitions (no
    /// list: legacy scans, the official clients' aggregations) goes to
    /// every node at once, and each node's share is decided at a different
    /// moment: were it to follow the claims, which move as each partition's
    /// fill completes, one node could cover a partition the node asked a
    /// moment later covers too, or neither could.
    ///
    /// Such a request checks each partition again once walked: an acting
    /// master hands its claim back before the master is whole (and may then
    /// drop its copy), and a view change can move a master's partition, so
    /// a partition no longer served when its walk ends is reported
    /// unavailable. A scan's client resumes it after the last record it
    /// got; an aggregation, which has no per-partition answers, fails (11).
    pub(crate) fn keep_served_partitions(&mut self, layers: Layers<'_>, follow_claims: bool) {
        let cluster = layers.dist.cluster();
        let sc = crate::sc::is_sc(&self.namespace);
        let Some(map) = cluster.namespace(&self.namespace.config.name) else {
            if sc {
                // No view yet: no SC partition is available.
                self.unavailable = self.partitions.drain(..).map(|c| c.partition).collect();
                return;
            }
            return self.keep_serving_partitions();
        };
        let namespace = Arc::clone(&self.namespace);
        let mut unavailable = Vec::new();
        self.partitions.retain(|cursor| {
            let served = namespace.serving(cursor.partition).is_ok()
                && serves(layers, map, sc, cursor.partition, follow_claims);
            if !served {
                unavailable.push(cursor.partition);
            }
            served
        });
        self.unavailable = unavailable;
        // An SC master can change during the walk too (a new view).
        self.recheck = follow_claims || sc;
    }

    /// Keeps only the partitions this node serves to the request, the
    /// others reported unavailable: in a cluster (or for a
    /// strong-consistency namespace, whose partitions this node serves only
    /// as the view's SC map's master, alone or not) those
    /// [`ScanCursor::keep_served_partitions`] keeps, else those
    /// [`ScanCursor::keep_serving_partitions`] keeps.
    pub(crate) fn keep_partitions(&mut self, layers: Layers<'_>, follow_claims: bool) {
        if layers.dist.routes() || crate::sc::is_sc(&self.namespace) {
            self.keep_served_partitions(layers, follow_claims);
        } else {
            self.keep_serving_partitions();
        }
    }

    /// Keeps only the partitions that still serve, the others reported
    /// unavailable: one a change was cut short in serves nothing until
    /// restart (`Namespace::serving`), clustered or not.
    pub(crate) fn keep_serving_partitions(&mut self) {
        let namespace = Arc::clone(&self.namespace);
        let mut unavailable = Vec::new();
        self.partitions.retain(|cursor| {
            let serving = namespace.serving(cursor.partition).is_ok();
            if !serving {
                unavailable.push(cursor.partition);
            }
            serving
        });
        self.unavailable = unavailable;
    }

    /// Appends one frame of the stream. Returns the cursor while the stream
    /// continues, `None` once the frame ended with the LAST message.
    pub(crate) fn step(
        mut self: Box<Self>,
        layers: Layers<'_>,
        now: Now,
        out: &mut Vec<u8>,
    ) -> Option<Box<ScanCursor>> {
        if self.advance(layers, now, out) {
            None
        } else {
            Some(self)
        }
    }

    /// [`ScanCursor::step`] in place: true once the stream ended.
    pub(crate) fn advance(&mut self, layers: Layers<'_>, now: Now, out: &mut Vec<u8>) -> bool {
        let frame_start = out.len();
        let finished = self.walk_step(layers, now, out);
        if let Some(watch) = &self.watch {
            watch.monitor.add_net_io(out.len() - frame_start);
            watch
                .monitor
                .set_counts(self.counts(), self.progress_hundredths());
            if finished {
                // (Ended by an abort: `user-aborted`, see `Monitor::finish`.)
                watch.finish(Reason::Ok);
            }
        }
        finished
    }

    /// One step's frame (see [`ScanCursor::advance`]); a client's scan
    /// that `query-abort` stopped ends here with 15 (query aborted).
    fn walk_step(&mut self, layers: Layers<'_>, now: Now, out: &mut Vec<u8>) -> bool {
        if self
            .watch
            .as_ref()
            .is_some_and(|watch| watch.monitor.abort_requested())
        {
            transaction::write_stream_end(out, ResultCode::QueryAbort);
            layers.stats.scan.completed.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        let mut budget = StepBudget {
            frame_start: out.len(),
            examined: 0,
        };
        out.extend_from_slice(&[0u8; PROTO_HEADER_SIZE]);
        for partition in std::mem::take(&mut self.unavailable) {
            // Partition-done with 11: retry this partition on another round.
            write_unavailable(out, partition);
        }
        let sent_before = self.sent;
        self.pace(now);
        self.blocked = false;
        let walked = self.walk_partitions(layers, now, out, &mut budget);
        layers
            .stats
            .scan
            .records
            .fetch_add(self.sent - sent_before, Ordering::Relaxed);
        // A throttled scan ends no sooner than its records are due: the
        // LAST message waits for a step of its own when this one is ahead
        // of the rate, so N records take at least N / rate seconds.
        let finished = walked
            && !self
                .not_before_ms()
                .is_some_and(|due| self.sent > sent_before && due > now.unix_ms);
        self.close_frame(layers, out, budget.frame_start, finished);
        finished
    }

    /// Under RECS_PER_SEC: starts the schedule at the first step (again
    /// when the wall clock went back) and sets where this step ends.
    fn pace(&mut self, now: Now) {
        if self.rate == 0 {
            return;
        }
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

    /// Visits partitions in turn: true once the walk is over (every
    /// partition visited, or the record limit reached); false when the
    /// step's budget is spent, or a job's partitions left are all still
    /// filling here ([`ScanCursor::blocked`]).
    fn walk_partitions(
        &mut self,
        layers: Layers<'_>,
        now: Now,
        out: &mut Vec<u8>,
        budget: &mut StepBudget,
    ) -> bool {
        loop {
            if self.limit_reached() || self.next >= self.partitions.len() {
                return true;
            }
            if self.wait_for_whole && !self.next_is_ready(layers) {
                self.blocked = true;
                return false;
            }
            if let Visit::Finished = self.visit_partition(now, out, budget) {
                self.partition_walked(layers, out);
            }
            if self.limit_reached() || self.next >= self.partitions.len() {
                return true;
            }
            if budget.spent(out) || self.sent >= self.step_end {
                return false;
            }
        }
    }

    /// The current partition's walk is done: it is checked again when the
    /// cursor rechecks (see [`ScanCursor::keep_served_partitions`]), its
    /// pin goes, and the next partition is current.
    fn partition_walked(&mut self, layers: Layers<'_>, out: &mut Vec<u8>) {
        if self.recheck {
            self.recheck_walked(layers, out);
        }
        if let (Some(pins), Some(cursor)) = (self.pins.as_mut(), self.partitions.get(self.next)) {
            pins.release(layers.dist, cursor.partition);
        }
        self.next += 1;
    }

    /// Ends the step's frame begun at `frame_start`: with the LAST message
    /// once the stream is `finished`; otherwise it is patched, or taken
    /// back when no message went into it (no empty frame is sent).
    fn close_frame(
        &self,
        layers: Layers<'_>,
        out: &mut Vec<u8>,
        frame_start: usize,
        finished: bool,
    ) {
        if finished {
            let last = MsgHeader {
                info3: info3::LAST,
                ..MsgHeader::default()
            };
            MessageWriter::begin_bare(out, &last).finish();
            ProtoHeader::patch(&mut out[frame_start..], MessageType::Message);
            if self.collected.is_none() {
                // Foreground scans only (jobs have `query-show`).
                layers.stats.scan.completed.fetch_add(1, Ordering::Relaxed);
                self.record_latency(layers);
            }
        } else if out.len() == frame_start + PROTO_HEADER_SIZE {
            // Nothing matched in this step: send no (empty) frame at all.
            out.truncate(frame_start);
        } else {
            ProtoHeader::patch(&mut out[frame_start..], MessageType::Message);
        }
    }

    /// Counts a client's finished scan or query in its namespace's
    /// `pi-query` or `si-query` histogram.
    fn record_latency(&self, layers: Layers<'_>) {
        let Some(started) = self.started else {
            return;
        };
        let name = self.namespace.config.name.as_bytes();
        if let Some(index) = layers.data.namespace_index(name) {
            let op = if self.query.is_some() {
                crate::latency::Op::SiQuery
            } else {
                crate::latency::Op::PiQuery
            };
            layers.latencies.record(index, op, started);
        }
    }

    /// The partition just walked is reported unavailable (11) when this
    /// node no longer serves it (see [`ScanCursor::keep_served_partitions`]).
    fn recheck_walked(&self, layers: Layers<'_>, out: &mut Vec<u8>) {
        let Some(cursor) = self.partitions.get(self.next) else {
            return;
        };
        let cluster = layers.dist.cluster();
        let sc = crate::sc::is_sc(&self.namespace);
        let still = cluster
            .namespace(&self.namespace.config.name)
            .is_some_and(|map| serves(layers, map, sc, cursor.partition, true));
        if !still {
            write_unavailable(out, cursor.partition);
        }
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
    fn visit_partition(&mut self, now: Now, out: &mut Vec<u8>, budget: &mut StepBudget) -> Visit {
        let Some(cursor) = self.partitions.get(self.next).copied() else {
            return Visit::Finished;
        };
        if self.query.is_some() {
            return self.visit_index(cursor, now, out, budget);
        }
        let namespace = Arc::clone(&self.namespace);
        let partition = namespace.index.partition(cursor.partition).read();
        budget.examined += partition.len();
        let mut digests = std::mem::take(&mut self.digests);
        digests.clear();
        digests.extend(
            partition
                .iter()
                .filter(|(digest, entry)| {
                    cursor.after.is_none_or(|after| *digest > after)
                        && self.admits(&entry.meta(), now)
                })
                .map(|(digest, _)| digest),
        );
        digests.sort_unstable();
        let mut visit = Visit::Finished;
        let total = digests.len();
        for (position, digest) in digests.iter().enumerate() {
            if let Some(entry) = partition.get(digest) {
                if self.emit(&namespace, digest, entry, now, out, None) {
                    self.sent += 1;
                }
            }
            budget.examined += 1;
            let more_here = position + 1 < total;
            if more_here
                && (self.limit_reached() || budget.spent(out) || self.sent >= self.step_end)
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

    /// A query's visit of the current partition, under its read lock: the
    /// index's entries in range past the resume point, in `(bval, digest)`
    /// order, each checked against the record (live, in the query's set,
    /// still holding a matching value) before it is returned.
    fn visit_index(
        &mut self,
        cursor: PartitionCursor,
        now: Now,
        out: &mut Vec<u8>,
        budget: &mut StepBudget,
    ) -> Visit {
        let Some(mut query) = self.query.take() else {
            return Visit::Finished;
        };
        if query
            .holders
            .as_ref()
            .is_some_and(|holders| !holders[cursor.partition.index()])
        {
            // No entry in range here when the query started.
            self.query = Some(query);
            return Visit::Finished;
        }
        let namespace = Arc::clone(&self.namespace);
        let partition = namespace.index.partition(cursor.partition).read();
        let candidates = query.take_candidates(cursor, budget.examined, self.collected.is_some());
        self.query = Some(query);
        let visit = self.emit_candidates(&namespace, &partition, &candidates, now, out, budget);
        drop(partition);
        if let Some(query) = self.query.as_mut() {
            query.candidates = candidates.entries;
        }
        visit
    }

    /// Emits a query's `candidates` from `partition` (its read lock held),
    /// in order; stops at the resume point it sets when the frame, the
    /// step's throttle or the record limit ends the step before the last
    /// (a background job's cursor takes them all).
    fn emit_candidates(
        &mut self,
        namespace: &Namespace,
        partition: &citrine_index::PartitionIndex,
        candidates: &Candidates,
        now: Now,
        out: &mut Vec<u8>,
        budget: &mut StepBudget,
    ) -> Visit {
        let total = candidates.entries.len();
        for (position, &(bval, digest)) in candidates.entries.iter().enumerate() {
            budget.examined += candidates.cost;
            if let Some(entry) = partition.get(&digest) {
                if self.admits(&entry.meta(), now)
                    && self.emit(namespace, &digest, entry, now, out, Some(bval))
                {
                    self.sent += 1;
                    if let Some(query) = &self.query {
                        query
                            .index
                            .stats()
                            .query_records
                            .fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            let more_here = position + 1 < total || candidates.more_in_tree;
            let stop = more_here
                && self.collected.is_none()
                && (position + 1 == total
                    || self.limit_reached()
                    || budget.frame_full(out)
                    || self.sent >= self.step_end);
            if stop {
                if let Some(current) = self.partitions.get_mut(self.next) {
                    current.after = Some(digest);
                    current.after_bval = bval;
                }
                return Visit::Stopped;
            }
        }
        Visit::Finished
    }

    /// Whether a query's candidate record still holds a value the filter
    /// selects, and this entry is the first of the record's matching
    /// entries in index order (a record whose list holds several values in
    /// range is returned once, at the smallest).
    fn query_selects(&mut self, record: &RecordView<'_>, last_update_ms: u64, bval: i64) -> bool {
        let Some(query) = self.query.as_mut() else {
            return true;
        };
        let mut keys = std::mem::take(&mut query.keys);
        query.index.keys(record, last_update_ms, &mut keys);
        let first = keys
            .iter()
            .filter(|key| query.filter.matches(key))
            .map(citrine_sindex::Key::bval)
            .min();
        query.keys = keys;
        // A geo entry is a cell: the shape itself decides.
        first == Some(bval)
            && query
                .index
                .geo_selects(&query.filter, record, last_update_ms)
    }

    /// Writes one record message (`bval`: a query's, sent back in the
    /// BVAL field for the client's resume point). False when the record
    /// does not pass the scan's filter or the query's check, or its body
    /// could not be read (logged; the record is skipped rather than failing
    /// the scan), or the projection leaves it out.
    fn emit(
        &mut self,
        namespace: &Namespace,
        digest: &Digest,
        entry: &citrine_index::IndexEntry,
        now: Now,
        out: &mut Vec<u8>,
        bval: Option<i64>,
    ) -> bool {
        if self.filter.is_none() && bval.is_none() {
            if let Some(collected) = self.collected.as_mut() {
                // A background scan with nothing to check: no body to read.
                collected.push(*digest);
                return true;
            }
        }
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
        // What filters and projected ops read (a few references: cheap).
        let record = RecordView::stored(
            namespace,
            &digest.0,
            &view,
            meta,
            entry.location.size() as u64,
        );
        if !self.selects(&record, meta.last_update_ms, now, bval) {
            return false;
        }
        if let Some(collected) = self.collected.as_mut() {
            collected.push(*digest);
            return true;
        }
        let message_start = out.len();
        let mut writer = self.begin_record(namespace, digest, meta, &view, bval, out);
        let projected = self.write_bins(&mut writer, &view, &record, now);
        writer.finish();
        self.keep_record(out, message_start, projected)
    }

    /// Whether a record read for the scan passes the query's check (at its
    /// candidate entry's `bval`) and the filter expression (one that does
    /// not is counted as filtered).
    fn selects(
        &mut self,
        record: &RecordView<'_>,
        last_update_ms: u64,
        now: Now,
        bval: Option<i64>,
    ) -> bool {
        if let Some(bval) = bval {
            if !self.query_selects(record, last_update_ms, bval) {
                return false;
            }
        }
        if let Some(filter) = &self.filter {
            if crate::filter::check(filter, record, now).is_err() {
                self.filtered += 1;
                return false;
            }
        }
        true
    }

    /// Begins a record's message in `out`: its generation and void time,
    /// namespace, digest, set, key, and (a query's) the bval.
    fn begin_record<'o>(
        &mut self,
        namespace: &Namespace,
        digest: &Digest,
        meta: citrine_index::RecordMeta,
        view: &BodyView<'_>,
        bval: Option<i64>,
        out: &'o mut Vec<u8>,
    ) -> MessageWriter<'o> {
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
        if let Some(bval) = bval.filter(|_| self.query.as_ref().is_some_and(|q| q.send_bval)) {
            writer.field(field_type::BVAL_ARRAY, &bval.to_le_bytes());
        }
        writer
    }

    /// Writes the record's bins: none (metadata only), every bin, or what
    /// the projection's ops answer.
    fn write_bins(
        &self,
        writer: &mut MessageWriter<'_>,
        view: &BodyView<'_>,
        record: &RecordView<'_>,
        now: Now,
    ) -> Projected {
        if self.no_bins {
            return Projected::default();
        }
        if self.projection.is_empty() {
            for bin in view.bins() {
                writer.op(op_type::READ, bin.particle_type, &bin.name, &bin.value);
            }
            return Projected::default();
        }
        self.write_projection(writer, view, record, now)
    }

    /// Writes the projection's answers in order: a bin read's bin, a read
    /// op's value (with `RESPOND_ALL_OPS`, a nil where either has nothing);
    /// stops at an op that fails on the record.
    fn write_projection(
        &self,
        writer: &mut MessageWriter<'_>,
        view: &BodyView<'_>,
        record: &RecordView<'_>,
        now: Now,
    ) -> Projected {
        let mut projected = Projected::default();
        for op in &self.projection {
            if op.op_type == op_type::READ {
                if let Some(bin) = view.bin(&op.name) {
                    writer.op(op_type::READ, bin.particle_type, &bin.name, &bin.value);
                    projected.answered = true;
                } else if self.respond_all_ops {
                    writer.op(op_type::READ, ParticleType::Null as u8, &op.name, &[]);
                    projected.answered = true;
                }
                continue;
            }
            match op.evaluate(view, record, now) {
                Answer::Value(particle_type, value) => {
                    writer.op(op.op_type, particle_type, &op.name, &value);
                    projected.answered = true;
                }
                Answer::Nothing if self.respond_all_ops => {
                    writer.op(op.op_type, ParticleType::Null as u8, &op.name, &[]);
                    projected.answered = true;
                }
                Answer::Nothing => {}
                Answer::Failed => {
                    projected.failed = true;
                    break;
                }
            }
        }
        projected
    }

    /// Keeps the record message written from `message_start`, or takes it
    /// back when the projection leaves the record out.
    fn keep_record(
        &mut self,
        out: &mut Vec<u8>,
        message_start: usize,
        projected: Projected,
    ) -> bool {
        if projected.failed {
            // An op failed on this record (a bin of another type, say): a
            // query has no way to answer one record's error, so the record
            // is left out (`recs-failed`), as the reference leaves it out.
            out.truncate(message_start);
            self.failed += 1;
            return false;
        }
        if !self.no_bins && !self.projection.is_empty() && !projected.answered {
            // None of the projection's bins or ops answered here: the
            // record is left out, as the reference leaves it out.
            out.truncate(message_start);
            self.omitted += 1;
            return false;
        }
        true
    }
}

/// What a record's projection answered.
#[derive(Clone, Copy, Debug, Default)]
struct Projected {
    /// At least one of its bins or ops answered.
    answered: bool,
    /// One of its ops failed on the record.
    failed: bool,
}

/// What one step has spent: its frame's bytes (from `frame_start`) and
/// the index entries it looked at.
struct StepBudget {
    frame_start: usize,
    examined: usize,
}

impl StepBudget {
    /// The frame holds [`CHUNK_BYTES`] or more.
    fn frame_full(&self, out: &[u8]) -> bool {
        out.len() - self.frame_start >= CHUNK_BYTES
    }

    /// The frame is full, or [`EXAMINE_BUDGET`] entries were looked at.
    fn spent(&self, out: &[u8]) -> bool {
        self.frame_full(out) || self.examined >= EXAMINE_BUDGET
    }
}

/// Appends a PARTITION_DONE message of result 11 for `partition`: the
/// client retries it in a later round.
fn write_unavailable(out: &mut Vec<u8>, partition: PartitionId) {
    let done = MsgHeader {
        info3: info3::PARTITION_DONE,
        generation: partition.index() as u32,
        result_code: ResultCode::Unavailable.code(),
        ..MsgHeader::default()
    };
    MessageWriter::begin_bare(out, &done).finish();
}

/// One read op of a query's projection.
struct ProjectionOp {
    op_type: u8,
    name: Vec<u8>,
    value: Vec<u8>,
    /// An `EXP_READ`'s expression, parsed.
    expression: Option<citrine_exp::ReadOp>,
}

/// What one projected op answers on one record.
enum Answer {
    /// A value (particle type and bytes).
    Value(u8, Vec<u8>),
    /// Nothing: its bin is missing, or its expression has no value.
    Nothing,
    /// It failed there (a bin of another type, an expression that cannot
    /// be evaluated on this record).
    Failed,
}

impl ProjectionOp {
    /// One op of a foreground scan: a bin read (`None` for a read of
    /// every bin, which is no projection) or a read op, its expression
    /// parsed once here, not for every record.
    fn parse(op: &citrine_wire::msg::Op<'_>) -> Result<Option<ProjectionOp>, ResultCode> {
        match op.op_type {
            op_type::READ => {
                if op.name.len() > BIN_NAME_MAX {
                    return Err(ResultCode::BinName);
                }
                if op.name.is_empty() {
                    // A read of every bin: the same as no projection.
                    return Ok(None);
                }
            }
            op_type::CDT_READ | op_type::BITS_READ | op_type::HLL_READ | op_type::EXP_READ => {
                if !citrine_record::valid_bin_name(op.name) {
                    return Err(ResultCode::BinName);
                }
            }
            // Writes belong to background jobs, not to a foreground query.
            _ => return Err(ResultCode::Parameter),
        }
        let expression = (op.op_type == op_type::EXP_READ)
            .then(|| citrine_exp::ReadOp::parse(op.value))
            .transpose()
            .map_err(citrine_exp::ExpError::result_code)?;
        Ok(Some(ProjectionOp {
            op_type: op.op_type,
            name: op.name.to_vec(),
            value: op.value.to_vec(),
            expression,
        }))
    }

    /// The op's result on one record (not a plain bin read).
    fn evaluate(&self, view: &BodyView<'_>, record: &RecordView<'_>, now: Now) -> Answer {
        let answer = |result: Option<(u8, Vec<u8>)>| match result {
            Some((particle_type, value)) => Answer::Value(particle_type, value),
            None => Answer::Nothing,
        };
        if let Some(expression) = &self.expression {
            return match expression.evaluate(record, now.unix_ms) {
                Ok(result) => answer(result),
                Err(_) => Answer::Failed,
            };
        }
        let Some((family, _)) = crate::transaction::bin_op_family(self.op_type) else {
            return Answer::Failed;
        };
        let bin = view.bin(&self.name);
        let current = bin
            .as_ref()
            .map(|bin| (bin.particle_type, bin.value.as_ref()));
        let outcome =
            if family == citrine_cdt::Family::Cdt && citrine_cdt::path::is_path(&self.value) {
                citrine_exp::path_op(&self.value, current, false, record, now.unix_ms).ok()
            } else {
                citrine_cdt::apply(family, &self.value, current, false).ok()
            };
        match outcome {
            Some(outcome) => answer(outcome.result),
            None => Answer::Failed,
        }
    }
}

#[cfg(test)]
mod tests;
