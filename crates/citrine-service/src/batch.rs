//! Batch-index requests (`info1 BATCH`, field 41/42): many single-record
//! reads, writes, deletes and operates in one request, answered as a stream
//! of row messages and a LAST message (`shared/protocol/04-batch-scan-query.md`
//! §2).
//!
//! A request is handled in two passes over the BATCH_INDEX payload:
//! 1. `validate` walks every row once and checks every length (row header,
//!    fields, ops), the row count (0 → 4, above `batch-max-requests` → 151)
//!    and the REPEAT rules. Any structural fault answers a single LAST
//!    message with result 4 and nothing else.
//! 2. `BatchCursor::step` executes the rows in request order, each as the
//!    single-record transaction it describes (`transaction::perform_here`,
//!    the same code as a single request, a record UDF row included, with
//!    what is left of the batch's time), writing one bare row message per
//!    row whose `transaction_ttl` holds the row's batch index.
//!
//! In a cluster (the distribution layer routes), each row runs as the
//! single-record request it describes (fields plus the digest, ops), through
//! the same routing as a single request: a row mastered elsewhere is
//! proxied, a write is replicated, a row on a partition being filled goes
//! through duplicate resolution. Rows that need the fabric wait together
//! (`BatchRemote`, at most `REMOTE_ROWS_MAX` per step) and their row
//! messages follow once their answers are in.
//!
//! What it reaches: a [`RowContext`] — the two layers ([`crate::Layers`]),
//! the UDF modules a row may call, and, for the rows a cluster routes, the
//! service's request path as a narrow [`RowExecutor`] (such a row is a
//! whole single-record request) — never the service itself.
//!
//! Invariants:
//! - every row is answered exactly once, followed by one LAST message with
//!   result 0 (the "answer every row" behaviour the protocol notes
//!   recommend; valid whatever the parent flags ask); rows are answered in
//!   request order, except that in a cluster rows that waited for the
//!   fabric come after the rows of their step (each carries its index);
//! - no frame is empty;
//! - row-level problems (unknown namespace 20, transactions 25, a
//!   malformed UDF call or row filter 4, bad key or set 4) are row
//!   results, never
//!   batch failures; the parent's filter expression is parsed once per
//!   batch and applies to every row without one; a row's own replaces it,
//!   and a row that does not pass its filter answers FILTERED_OUT (27);
//! - response messages are packed into frames of about [`FRAME_TARGET_BYTES`];
//!   when a step has filled its budget the rest of the batch continues from
//!   a cursor that owns a copy of the payload, so a connection streams a big
//!   batch frame by frame and no partition lock is held between rows;
//! - parsing never panics: every read is bounds-checked (`get`), and pass 2
//!   only re-walks bytes pass 1 accepted.

use crate::namespace::Namespace;
use crate::replication::Remote;
use crate::transaction::{self, Now, Ops, Reply, Request};
use crate::udf::UdfCall;
use crate::Layers;
use citrine_types::{Digest, ResultCode, DIGEST_SIZE, SET_NAME_MAX};
use citrine_wire::frame::{MessageType, ProtoHeader, PROTO_HEADER_SIZE};
use citrine_wire::msg::{field_type, info3, Message, MessageWriter, MsgHeader, MSG_HEADER_SIZE};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Default limit on rows per batch request (`batch-max-requests`): 0, no
/// limit, as the reference's (CE 8.1.2 answers `batch-max-requests=0` and
/// runs a batch of 10 000 rows).
pub const BATCH_MAX_REQUESTS_DEFAULT: u32 = 0;

/// A response frame is closed (and a step ends) once it holds this many bytes.
pub const FRAME_TARGET_BYTES: usize = 1024 * 1024;

/// Row type bits (§2.3).
pub mod row_flags {
    /// Reuse the previous full row's namespace, set, flags, fields and ops.
    pub const REPEAT: u8 = 0x01;
    /// `info2` and `info3` follow `info1`.
    pub const INFO: u8 = 0x02;
    /// A u16 generation follows.
    pub const GENERATION: u8 = 0x04;
    /// A u32 record TTL (writes) / read-touch percent (reads) follows.
    pub const TTL: u8 = 0x08;
    /// `info4` follows (transactions).
    pub const INFO4: u8 = 0x10;
    /// Every bit a row type may carry.
    pub const KNOWN: u8 = REPEAT | INFO | GENERATION | TTL | INFO4;
}

/// `info3` bits a legacy read row inherits from the parent (SC read mode).
const SC_READ_BITS: u8 = info3::SC_READ_TYPE | info3::SC_READ_RELAX;

/// Batch counters.
#[derive(Debug, Default)]
pub struct BatchStats {
    /// Batch requests accepted (rows dispatched).
    pub requests: AtomicU64,
    /// Rows executed.
    pub rows: AtomicU64,
    /// Batch requests refused before dispatch (4, 151).
    pub errors: AtomicU64,
}

/// What a full row carries (a REPEAT row reuses its predecessor's).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowBody<'a> {
    /// info1..4, generation, record_ttl, n_fields, n_ops of the row.
    pub header: MsgHeader,
    /// The row's fields (validated: every size fits).
    pub fields: &'a [u8],
    /// The row's ops (validated as `Message::decode` validates ops).
    pub ops: &'a [u8],
}

impl<'a> RowBody<'a> {
    /// Iterates the row's fields (type, data).
    pub fn fields(&self) -> impl Iterator<Item = (u8, &'a [u8])> {
        let mut rest = self.fields;
        std::iter::from_fn(move || {
            let (field_type, data, used) = parse_field(rest)?;
            rest = rest.get(used..)?;
            Some((field_type, data))
        })
    }

    /// The data of the first field of `wanted` type.
    pub fn field(&self, wanted: u8) -> Option<&'a [u8]> {
        self.fields()
            .find(|(field_type, _)| *field_type == wanted)
            .map(|(_, data)| data)
    }
}

/// One batch row: its index, digest and body.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Row<'a> {
    pub index: u32,
    pub digest: Digest,
    pub body: RowBody<'a>,
}

/// Why a payload was refused before dispatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BatchError {
    /// Structural fault: result 4.
    Malformed(&'static str),
    /// Too many rows: result 151.
    TooManyRows,
}

impl BatchError {
    pub(crate) fn code(self) -> ResultCode {
        match self {
            BatchError::Malformed(_) => ResultCode::Parameter,
            BatchError::TooManyRows => ResultCode::BatchMaxRequests,
        }
    }
}

/// Settings a row inherits from the parent message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Parent {
    /// The parent's SC read bits (legacy rows inherit them).
    pub sc_bits: u8,
    /// The parent's record_ttl (legacy rows inherit it: read-touch percent).
    pub record_ttl: u32,
    /// The parent's total timeout (ms, 0 = none): the deadline of rows
    /// that need the fabric in a cluster.
    pub transaction_ttl: u32,
    /// When the batch began. Its UDF rows share one time limit counted
    /// from here, as the reference's sub-transactions share the batch's
    /// deadline: a batch of slow UDFs holds a service thread for that
    /// limit, not for the limit once per row. Real time, as a UDF's own
    /// limit is. `None`: each UDF row has the whole limit.
    pub started: Option<Instant>,
}

impl Parent {
    /// What is left of the batch's UDF time limit; `None` once it is spent
    /// (the row answers TIMEOUT without running).
    fn udf_time_left(self) -> Option<Duration> {
        let limit = crate::udf::time_limit(self.transaction_ttl);
        let elapsed = self
            .started
            .map_or(Duration::ZERO, |started| started.elapsed());
        limit.checked_sub(elapsed).filter(|left| !left.is_zero())
    }
}

/// The fixed part of a BATCH_INDEX payload: row count and parent flags.
pub(crate) fn payload_header(payload: &[u8]) -> Result<(u32, u8), BatchError> {
    let count = payload
        .get(..4)
        .map(|bytes| u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
        .ok_or(BatchError::Malformed("row count"))?;
    let flags = *payload.get(4).ok_or(BatchError::Malformed("batch flags"))?;
    Ok((count, flags))
}

/// Offset of the first row in a payload.
const ROWS_START: usize = 5;

/// Reads rows one after another, remembering the last full row for REPEAT.
#[derive(Clone, Debug)]
pub(crate) struct RowReader<'a> {
    payload: &'a [u8],
    at: usize,
    parent: Parent,
    /// The last full row and its offset (REPEAT rows reuse it).
    previous: Option<(usize, RowBody<'a>)>,
    /// The last full row carried a KEY field (a REPEAT may not follow it).
    previous_has_key: bool,
}

impl<'a> RowReader<'a> {
    /// A reader at the first row of `payload`.
    pub fn new(payload: &'a [u8], parent: Parent) -> RowReader<'a> {
        RowReader {
            payload,
            at: ROWS_START,
            parent,
            previous: None,
            previous_has_key: false,
        }
    }

    /// A reader positioned at `at`, with the last full row at `previous`
    /// (both offsets a previous reader over the same payload handed out).
    fn resume(
        payload: &'a [u8],
        parent: Parent,
        at: usize,
        previous: Option<usize>,
    ) -> Result<RowReader<'a>, BatchError> {
        let mut reader = RowReader::new(payload, parent);
        if let Some(previous_at) = previous {
            reader.at = previous_at;
            reader.next_row()?;
        }
        reader.at = at;
        Ok(reader)
    }

    /// Offset of the next row.
    pub fn offset(&self) -> usize {
        self.at
    }

    /// Offset of the last full row, if any.
    fn previous_offset(&self) -> Option<usize> {
        self.previous.map(|(at, _)| at)
    }

    /// True when every byte has been read.
    pub fn at_end(&self) -> bool {
        self.at >= self.payload.len()
    }

    fn take(&mut self, length: usize, what: &'static str) -> Result<&'a [u8], BatchError> {
        let end = self
            .at
            .checked_add(length)
            .ok_or(BatchError::Malformed(what))?;
        let bytes = self
            .payload
            .get(self.at..end)
            .ok_or(BatchError::Malformed(what))?;
        self.at = end;
        Ok(bytes)
    }

    fn byte(&mut self, what: &'static str) -> Result<u8, BatchError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, BatchError> {
        let bytes = self.take(2, what)?;
        Ok(u16::from_be_bytes([bytes[0], bytes[1]]))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, BatchError> {
        let bytes = self.take(4, what)?;
        Ok(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    /// Reads the next row, checking every length.
    pub fn next_row(&mut self) -> Result<Row<'a>, BatchError> {
        let row_start = self.at;
        let index = self.u32("batch index")?;
        let mut digest = [0u8; DIGEST_SIZE];
        digest.copy_from_slice(self.take(DIGEST_SIZE, "row digest")?);
        let digest = Digest(digest);
        let row_type = self.byte("row type")?;
        if row_type & !row_flags::KNOWN != 0 {
            return Err(BatchError::Malformed("unknown row type bits"));
        }
        if row_type & row_flags::REPEAT != 0 {
            let body = self.repeated(row_type)?;
            return Ok(Row {
                index,
                digest,
                body,
            });
        }
        let header = self.row_header(row_type)?;
        let (fields, has_key) = self.row_fields(header.n_fields)?;
        let ops = self.row_ops(header.n_ops)?;
        let body = RowBody {
            header,
            fields,
            ops,
        };
        self.previous = Some((row_start, body));
        self.previous_has_key = has_key;
        Ok(Row {
            index,
            digest,
            body,
        })
    }

    /// A REPEAT row's body: the last full row's. REPEAT comes alone, not
    /// on the first row, and not after a row with a key.
    fn repeated(&self, row_type: u8) -> Result<RowBody<'a>, BatchError> {
        if row_type != row_flags::REPEAT {
            return Err(BatchError::Malformed("REPEAT with other row bits"));
        }
        let Some((_, body)) = self.previous else {
            return Err(BatchError::Malformed("REPEAT on the first row"));
        };
        if self.previous_has_key {
            return Err(BatchError::Malformed("REPEAT after a row with a key"));
        }
        Ok(body)
    }

    /// A full row's header: the info bytes, generation and TTL its type
    /// says it carries (else the parent's SC read bits and TTL), the
    /// parent's timeout, and its field and op counts.
    fn row_header(&mut self, row_type: u8) -> Result<MsgHeader, BatchError> {
        let mut header = MsgHeader {
            info1: self.byte("row info1")?,
            info3: self.parent.sc_bits,
            record_ttl: self.parent.record_ttl,
            // The request's server-side timeout (a row has none of its
            // own): a UDF row's time limit comes from it.
            transaction_ttl: self.parent.transaction_ttl,
            ..MsgHeader::default()
        };
        if row_type & row_flags::INFO != 0 {
            header.info2 = self.byte("row info2")?;
            header.info3 = self.byte("row info3")?;
        }
        if row_type & row_flags::INFO4 != 0 {
            header.info4 = self.byte("row info4")?;
        }
        if row_type & row_flags::GENERATION != 0 {
            header.generation = u32::from(self.u16("row generation")?);
        }
        if row_type & row_flags::TTL != 0 {
            header.record_ttl = self.u32("row ttl")?;
        }
        header.n_fields = match self.u16("row field count")? {
            // Old clients sent 0 and meant the namespace field alone.
            0 => 1,
            count => count,
        };
        header.n_ops = self.u16("row op count")?;
        Ok(header)
    }

    /// Reads a row's `count` fields, checking each (the first is the
    /// namespace): their bytes, and whether one is a KEY.
    fn row_fields(&mut self, count: u16) -> Result<(&'a [u8], bool), BatchError> {
        let fields_start = self.at;
        let mut has_key = false;
        for position in 0..count {
            let rest = self.payload.get(self.at..).unwrap_or_default();
            let (field_type, _, used) =
                parse_field(rest).ok_or(BatchError::Malformed("row field"))?;
            if position == 0 && field_type != field_type::NAMESPACE {
                return Err(BatchError::Malformed(
                    "first row field is not the namespace",
                ));
            }
            has_key |= field_type == field_type::KEY;
            self.at += used;
        }
        Ok((&self.payload[fields_start..self.at], has_key))
    }

    /// Reads a row's `count` ops, checking each: their bytes.
    fn row_ops(&mut self, count: u16) -> Result<&'a [u8], BatchError> {
        let ops_start = self.at;
        for _ in 0..count {
            let rest = self.payload.get(self.at..).unwrap_or_default();
            let (_, used) =
                citrine_wire::msg::split_op(rest).ok_or(BatchError::Malformed("row op"))?;
            self.at += used;
        }
        Ok(&self.payload[ops_start..self.at])
    }
}

/// Parses one field at the start of `bytes`: (type, data, bytes used).
fn parse_field(bytes: &[u8]) -> Option<(u8, &[u8], usize)> {
    let size = bytes.get(..4)?;
    let size = u32::from_be_bytes([size[0], size[1], size[2], size[3]]) as usize;
    if size == 0 {
        return None;
    }
    let end = size.checked_add(4)?;
    let field_type = *bytes.get(4)?;
    let data = bytes.get(5..end)?;
    Some((field_type, data, end))
}

/// Pass 1: checks the whole payload. Returns the number of rows.
pub(crate) fn validate(payload: &[u8], parent: Parent, max_rows: u32) -> Result<u32, BatchError> {
    let (count, _flags) = payload_header(payload)?;
    if count == 0 {
        return Err(BatchError::Malformed("zero rows"));
    }
    if max_rows != 0 && count > max_rows {
        return Err(BatchError::TooManyRows);
    }
    let mut reader = RowReader::new(payload, parent);
    for _ in 0..count {
        reader.next_row()?;
    }
    if !reader.at_end() {
        return Err(BatchError::Malformed("bytes after the last row"));
    }
    Ok(count)
}

/// The parent's filter expression: its bytes (forwarded with rows a
/// cluster routes) and its parsed form.
#[derive(Debug)]
pub(crate) struct ParentFilter {
    bytes: Vec<u8>,
    expression: citrine_exp::Expression,
}

/// The batch left to answer once a step has filled its frame budget.
#[derive(Debug)]
pub struct BatchCursor {
    payload: Vec<u8>,
    parent: Parent,
    filter: Option<Box<ParentFilter>>,
    at: usize,
    previous: Option<usize>,
    rows_left: u32,
    /// Rows answered with a code instead of run (access control), by index.
    refused: Vec<(u32, ResultCode)>,
}

/// How a batch runs a row in a cluster: as the single-record request it
/// describes, through the service's request path (routing, proxying,
/// duplicate resolution, replication), which the service implements this
/// for. It is all a batch reaches of the service.
pub(crate) trait RowExecutor: Sync {
    /// Runs `body` (a single-record AS_MSG body) as a client's request —
    /// not counted as a transaction of its own — and writes its reply
    /// frame to `out`, unless fabric work remains (returned).
    fn execute_row(&self, body: &[u8], out: &mut Vec<u8>) -> Option<Box<Remote>>;

    /// Completes a row's fabric work into its reply frame in `out`.
    fn finish_row<'a>(
        &'a self,
        remote: Remote,
        out: &'a mut Vec<u8>,
    ) -> Pin<Box<dyn Future<Output = ()> + 'a>>;
}

/// What a batch runs its rows with: the two layers, the UDF modules (a
/// row may call a record UDF), and the request path of rows a cluster
/// routes.
#[derive(Clone, Copy)]
pub(crate) struct RowContext<'s> {
    pub(crate) layers: Layers<'s>,
    pub(crate) modules: &'s citrine_udf::Registry,
    pub(crate) executor: &'s dyn RowExecutor,
}

/// Starts a batch request: validates it (at most `max_rows` rows), then
/// answers as many rows as fit in one step. Returns what follows.
pub(crate) fn start(
    context: RowContext<'_>,
    (max_rows, refused): (u32, &[(u32, ResultCode)]),
    message: &Message<'_>,
    out: &mut Vec<u8>,
) -> BatchNext {
    let stats = &context.layers.stats.batch;
    let refuse = |out: &mut Vec<u8>, code: ResultCode| {
        stats.errors.fetch_add(1, Ordering::Relaxed);
        transaction::write_stream_end(out, code);
        BatchNext::Done
    };
    let payload = message
        .field(field_type::BATCH_INDEX)
        .or_else(|| message.field(field_type::BATCH_INDEX_WITH_SET));
    let Some(payload) = payload else {
        return refuse(out, ResultCode::Parameter);
    };
    let parent = Parent {
        sc_bits: message.header.info3 & SC_READ_BITS,
        record_ttl: message.header.record_ttl,
        transaction_ttl: message.header.transaction_ttl,
        started: Some(Instant::now()),
    };
    let filter = match parent_filter(message) {
        Ok(filter) => filter,
        Err(code) => return refuse(out, code),
    };
    let rows = match validate(payload, parent, max_rows) {
        Ok(rows) => rows,
        Err(error) => {
            tracing::debug!("batch refused: {error:?}");
            return refuse(out, error.code());
        }
    };
    stats.requests.fetch_add(1, Ordering::Relaxed);
    let reader = RowReader::new(payload, parent);
    let chunk = run_rows(context, reader, (rows, refused), filter.as_deref(), out);
    chunk.next(|(at, previous, rows_left)| BatchCursor {
        payload: payload.to_vec(),
        parent,
        filter,
        at,
        previous,
        rows_left,
        refused: refused.to_vec(),
    })
}

/// The parent's filter expression (field 43), parsed; a malformed one
/// refuses the batch.
fn parent_filter(message: &Message<'_>) -> Result<Option<Box<ParentFilter>>, ResultCode> {
    let Some(bytes) = message.field(field_type::FILTER_EXPRESSION) else {
        return Ok(None);
    };
    let expression = crate::filter::parse(bytes)?;
    Ok(Some(Box::new(ParentFilter {
        bytes: bytes.to_vec(),
        expression,
    })))
}

/// What follows a step of a batch.
#[derive(Debug)]
pub(crate) enum BatchNext {
    /// Every row answered, LAST written.
    Done,
    /// More rows to run.
    More(BatchCursor),
    /// Rows that need the fabric before their answers (then the rest).
    Remote(Box<BatchRemote>),
}

/// Rows of a step that need the fabric (in a cluster: proxying to their
/// master, replication, duplicate resolution) before their answers are
/// final; [`BatchRemote::complete`] runs them concurrently and writes their
/// row messages (rows answer in any order: each carries its batch index).
#[derive(Debug)]
pub(crate) struct BatchRemote {
    /// (row index, fabric work, the reply so far: a replicated write's
    /// local reply stands once the replicas acknowledged).
    rows: Vec<RemoteRow>,
    /// The rest of the batch; `None`: the LAST message follows these rows.
    rest: Option<BatchCursor>,
    /// When the batch began (its latency is counted with its LAST).
    started: Option<Instant>,
}

impl BatchRemote {
    /// Completes the rows' fabric work and writes one frame with their row
    /// messages (and LAST when the batch ends); returns the rest.
    pub(crate) async fn complete(
        self,
        context: RowContext<'_>,
        out: &mut Vec<u8>,
    ) -> Option<BatchCursor> {
        let runs = self
            .rows
            .into_iter()
            .map(|(index, remote, mut reply)| async move {
                context.executor.finish_row(*remote, &mut reply).await;
                (index, reply)
            })
            .collect();
        let replies = crate::replication::join_all(runs).await;
        let frame_start = out.len();
        out.extend_from_slice(&[0u8; PROTO_HEADER_SIZE]);
        for (index, reply) in replies {
            append_row_reply(out, &reply, index);
        }
        if self.rest.is_none() {
            write_last(out, ResultCode::Ok);
            if let Some(started) = self.started {
                context.layers.latencies.record_batch(started);
            }
        }
        ProtoHeader::patch(&mut out[frame_start..], MessageType::Message);
        self.rest
    }
}

/// Where a step of rows ended.
struct Chunk {
    /// Where to resume (row offset, last full row offset, rows left);
    /// `None` when every row was run.
    resume: Option<(usize, Option<usize>, u32)>,
    /// Rows waiting for the fabric.
    remote: Vec<RemoteRow>,
    /// When the batch began.
    started: Option<Instant>,
}

/// A batch row waiting for the fabric: index, work, reply so far.
type RemoteRow = (u32, Box<Remote>, Vec<u8>);

impl Chunk {
    fn next(self, cursor: impl FnOnce((usize, Option<usize>, u32)) -> BatchCursor) -> BatchNext {
        let rest = self.resume.map(cursor);
        match (rest, self.remote.is_empty()) {
            (None, true) => BatchNext::Done,
            (Some(rest), true) => BatchNext::More(rest),
            (rest, false) => BatchNext::Remote(Box::new(BatchRemote {
                rows: self.remote,
                rest,
                started: self.started,
            })),
        }
    }
}

impl BatchCursor {
    /// Answers the next frame's worth of rows; `None` when the batch is done
    /// (the LAST message has been written).
    pub(crate) fn step(mut self, context: RowContext<'_>, out: &mut Vec<u8>) -> BatchNext {
        let reader = match RowReader::resume(&self.payload, self.parent, self.at, self.previous) {
            Ok(reader) => reader,
            Err(_) => {
                // Unreachable: the payload passed validation. Finish cleanly.
                transaction::write_stream_end(out, ResultCode::ServerError);
                return BatchNext::Done;
            }
        };
        let rows = (self.rows_left, &self.refused[..]);
        let chunk = run_rows(context, reader, rows, self.filter.as_deref(), out);
        chunk.next(|(at, previous, rows_left)| {
            self.at = at;
            self.previous = previous;
            self.rows_left = rows_left;
            self
        })
    }
}

/// Executes up to `rows_left` rows into one frame. The chunk ends when every
/// row was run (LAST written unless some rows wait for the fabric) or the
/// frame is full.
fn run_rows(
    context: RowContext<'_>,
    mut reader: RowReader<'_>,
    (mut rows_left, refused): (u32, &[(u32, ResultCode)]),
    filter: Option<&ParentFilter>,
    out: &mut Vec<u8>,
) -> Chunk {
    let frame_start = out.len();
    out.extend_from_slice(&[0u8; PROTO_HEADER_SIZE]);
    let now = context.layers.now();
    let mut remote = Vec::new();
    while rows_left > 0 {
        let Ok(row) = reader.next_row() else {
            // Unreachable after validation; end the stream rather than panic.
            write_last(out, ResultCode::ServerError);
            ProtoHeader::patch(&mut out[frame_start..], MessageType::Message);
            return Chunk {
                resume: None,
                remote: Vec::new(),
                started: None,
            };
        };
        rows_left -= 1;
        let refusal = refused.binary_search_by_key(&row.index, |(index, _)| *index);
        if let Ok(at) = refusal {
            transaction::write_error(out, refused[at].1, Reply::Row(row.index));
        } else if let Some(waiting) = execute_row(context, &row, reader.parent, filter, now, out) {
            remote.push(waiting);
        }
        if rows_left > 0
            && (out.len() - frame_start >= FRAME_TARGET_BYTES || remote.len() >= REMOTE_ROWS_MAX)
        {
            close_frame(out, frame_start);
            return Chunk {
                resume: Some((reader.offset(), reader.previous_offset(), rows_left)),
                remote,
                started: reader.parent.started,
            };
        }
    }
    if remote.is_empty() {
        write_last(out, ResultCode::Ok);
        if let Some(started) = reader.parent.started {
            context.layers.latencies.record_batch(started);
        }
    }
    close_frame(out, frame_start);
    Chunk {
        resume: None,
        remote,
        started: reader.parent.started,
    }
}

/// Patches the frame started at `frame_start`, or removes it when no
/// message went into it (every row of the step waits for the fabric):
/// clients are never sent an empty frame.
fn close_frame(out: &mut Vec<u8>, frame_start: usize) {
    if out.len() == frame_start + PROTO_HEADER_SIZE {
        out.truncate(frame_start);
    } else {
        ProtoHeader::patch(&mut out[frame_start..], MessageType::Message);
    }
}

/// Most rows of one step that wait for the fabric together.
const REMOTE_ROWS_MAX: usize = 256;

/// Appends the reply frame of a single-record request as the row message
/// of batch row `index` (its `transaction_ttl` carries the index).
fn append_row_reply(out: &mut Vec<u8>, reply: &[u8], index: u32) {
    let message = reply.get(PROTO_HEADER_SIZE..).unwrap_or_default();
    if message.len() < MSG_HEADER_SIZE {
        transaction::write_error(out, ResultCode::ServerError, Reply::Row(index));
        return;
    }
    let at = out.len();
    out.extend_from_slice(message);
    // transaction_ttl: bytes 14..18 of the message header.
    out[at + 14..at + 18].copy_from_slice(&index.to_be_bytes());
}

/// The single-record request (AS_MSG body) a batch row describes: its
/// header, its fields plus the digest (and the parent's filter), its ops.
/// `None` when the fields added overflow the header's 16-bit field count
/// (a row may already carry 65 535).
fn single_body(row: &Row<'_>, parent: Parent, parent_filter: Option<&[u8]>) -> Option<Vec<u8>> {
    // The parent's filter travels with a row that has none of its own.
    let parent_filter =
        parent_filter.filter(|_| row.body.field(field_type::FILTER_EXPRESSION).is_none());
    let n_fields = u16::try_from(row.body.fields().count())
        .ok()?
        .checked_add(1 + u16::from(parent_filter.is_some()))?;
    let header = MsgHeader {
        n_fields,
        transaction_ttl: parent.transaction_ttl,
        ..row.body.header
    };
    let mut body = Vec::with_capacity(
        MSG_HEADER_SIZE
            + row.body.fields.len()
            + DIGEST_SIZE
            + 5
            + parent_filter.map_or(0, |bytes| bytes.len() + 5)
            + row.body.ops.len(),
    );
    header.encode_into(&mut body);
    body.extend_from_slice(row.body.fields);
    if let Some(bytes) = parent_filter {
        body.extend_from_slice(&(bytes.len() as u32 + 1).to_be_bytes());
        body.push(field_type::FILTER_EXPRESSION);
        body.extend_from_slice(bytes);
    }
    body.extend_from_slice(&(DIGEST_SIZE as u32 + 1).to_be_bytes());
    body.push(field_type::DIGEST);
    body.extend_from_slice(&row.digest.0);
    body.extend_from_slice(row.body.ops);
    Some(body)
}

/// Appends a bare LAST message.
fn write_last(out: &mut Vec<u8>, code: ResultCode) {
    let header = MsgHeader {
        info3: info3::LAST,
        result_code: code.code(),
        ..MsgHeader::default()
    };
    MessageWriter::begin_bare(out, &header).finish();
}

/// Runs one row and writes its row message, or returns the fabric work it
/// needs first (in a cluster).
fn execute_row(
    context: RowContext<'_>,
    row: &Row<'_>,
    parent: Parent,
    parent_filter: Option<&ParentFilter>,
    now: Now,
    out: &mut Vec<u8>,
) -> Option<RemoteRow> {
    context
        .layers
        .stats
        .batch
        .rows
        .fetch_add(1, Ordering::Relaxed);
    let reply = Reply::Row(row.index);
    let body = &row.body;
    let mut parent = parent;
    let (namespace, fields, udf) = match check_row(context, body, &mut parent) {
        Ok(checked) => checked,
        Err(code) => {
            transaction::write_error(out, code, reply);
            return None;
        }
    };
    if crate::sc::data_closed(namespace) {
        transaction::write_error(out, ResultCode::Unavailable, reply);
        return None;
    }
    if context.layers.dist.routes() {
        // In a cluster a row goes where a single-record request would: to
        // its master (proxied), through duplicate resolution, replicated.
        return execute_routed(context.executor, row, parent, parent_filter, out);
    }
    if crate::sc::refuses_alone(context.layers.dist, namespace, &row.digest) {
        transaction::write_error(out, ResultCode::Unavailable, reply);
        return None;
    }
    let started = Instant::now();
    let request = Request {
        header: body.header,
        digest: row.digest,
        set: fields.set,
        key: fields.key,
        ops: Ops::Raw(body.ops),
        reply,
        filter: fields
            .filter
            .as_ref()
            .or(parent_filter.map(|filter| &filter.expression)),
        txn: crate::txn::row_part(|| body.fields()),
        tally: Default::default(),
    };
    transaction::perform_here(namespace, &request, udf.as_ref(), now, out);
    if let Some(index) = context
        .layers
        .data
        .namespace_index(namespace.config.name.as_bytes())
    {
        let op = crate::latency::Op::of(body.header.info2, udf.is_some(), true);
        let latencies = context.layers.latencies;
        if let Some(groups @ (group, _)) = op.benchmark_group() {
            if latencies.benchmarks().on(index, group) {
                let unit = latencies.unit().nanos();
                let run = crate::benchmarks::Stage::Run;
                latencies
                    .benchmarks()
                    .record(index, groups, run, started.elapsed(), unit);
            }
        }
        latencies.record(index, op, started);
    }
    None
}

/// A row's own fields, checked: its set, key and filter expression.
struct RowFields<'a> {
    set: &'a [u8],
    key: Option<(u8, &'a [u8])>,
    filter: Option<citrine_exp::Expression>,
}

/// A row's namespace, own fields ([`row_fields`]) and record UDF call
/// ([`row_udf`]), checked in that order: the first refusal is the row's
/// result.
fn check_row<'a>(
    context: RowContext<'a>,
    body: &RowBody<'a>,
    parent: &mut Parent,
) -> Result<(&'a Namespace, RowFields<'a>, Option<UdfCall<'a>>), ResultCode> {
    let namespace = body
        .field(field_type::NAMESPACE)
        .and_then(|name| context.layers.namespace(name))
        .ok_or(ResultCode::Namespace)?;
    let fields = row_fields(body)?;
    let udf = row_udf(context.modules, body, parent)?;
    Ok((namespace, fields, udf))
}

/// Checks a row's fields in their order (a bad key 4, a UDF_OP 4, a
/// malformed filter expression), then its set name. (Transaction fields
/// are the transaction path's: `crate::txn`.)
fn row_fields<'a>(body: &RowBody<'a>) -> Result<RowFields<'a>, ResultCode> {
    let mut fields = RowFields {
        set: &[],
        key: None,
        filter: None,
    };
    for (kind, data) in body.fields() {
        match kind {
            field_type::NAMESPACE => {}
            field_type::SET => fields.set = data,
            field_type::KEY => fields.key = Some(transaction::parse_key(data)?),
            field_type::UDF_OP => return Err(ResultCode::Parameter),
            field_type::FILTER_EXPRESSION => fields.filter = Some(crate::filter::parse(data)?),
            _ => {}
        }
    }
    if fields.set.len() > SET_NAME_MAX || fields.set.contains(&0) {
        return Err(ResultCode::Parameter);
    }
    Ok(fields)
}

/// The row's record UDF call, if it names one (from the UDF `modules`),
/// limited to what is left of the batch's time: none left → 9. The row's
/// `parent` then carries what is left as its timeout (a routed row's).
fn row_udf<'a>(
    modules: &'a citrine_udf::Registry,
    body: &RowBody<'a>,
    parent: &mut Parent,
) -> Result<Option<UdfCall<'a>>, ResultCode> {
    let mut udf = crate::udf::parse_call(modules, |kind| body.field(kind))?;
    if let Some(call) = udf.as_mut() {
        let left = parent.udf_time_left().ok_or(ResultCode::Timeout)?;
        call.time_limit = Some(left);
        // A routed row carries what is left as its own timeout.
        parent.transaction_ttl = u32::try_from(left.as_millis()).unwrap_or(u32::MAX);
    }
    Ok(udf)
}

/// Runs a row in a cluster as the single-record request it describes
/// ([`single_body`]) through `executor`; its row message follows at once
/// unless fabric work remains (returned with the reply so far).
fn execute_routed(
    executor: &dyn RowExecutor,
    row: &Row<'_>,
    parent: Parent,
    parent_filter: Option<&ParentFilter>,
    out: &mut Vec<u8>,
) -> Option<RemoteRow> {
    let filter = parent_filter.map(|filter| &filter.bytes[..]);
    let Some(body) = single_body(row, parent, filter) else {
        transaction::write_error(out, ResultCode::Parameter, Reply::Row(row.index));
        return None;
    };
    let mut reply = Vec::new();
    match executor.execute_row(&body, &mut reply) {
        Some(work) => Some((row.index, work, reply)),
        None => {
            append_row_reply(out, &reply, row.index);
            None
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
