//! The read path: a record's bins (all, named, or none), the results of
//! CDT, bit, HLL and expression read ops, and read-touch.
//!
//! A read takes its partition's read lock once. Every read op's result is
//! computed before the reply starts, so an error (4, 12, 26...) leaves no
//! half-written reply. Invariant: a read changes nothing — except a
//! read-touch, which runs after the read answered, under the write lock,
//! through [`super::store::install`].
//!
//! Steps (`read_record`): the ops are checked before the index is touched
//! (a write op → 4, a bad bin name → 21); under the partition's read lock
//! the live entry is found (missing, expired or truncated → 2: nsup need
//! not have removed it); the storage engine returns the body (borrowed
//! from the memory engine: no copy) and `BodyView` walks its bins; a key
//! sent must equal the stored one (19); the filter expression is evaluated
//! against the stored record ([`crate::filter::check`] over a
//! [`crate::filter::RecordView`]: anything but true → 27); CDT, bit and HLL
//! reads (op types 3, 12, 15) run `citrine_cdt::apply` on their bin, path
//! expressions `citrine_exp::path_op`, expression reads (7)
//! `citrine_exp::read_op`; then the requested bins and results are copied
//! straight from the stored body into the reply buffer (`MessageWriter`).

use super::store::{install, storage_result};
use super::{
    begin_reply, bin_op_family, is_live, Now, Reply, Request, MAX_REPLY_BYTES, TTL_NEVER_EXPIRE,
};
use crate::filter::{self, RecordView};
use crate::namespace::Namespace;
use crate::txn::TxnRead;
use citrine_index::{IndexEntry, PartitionIndex, RecordMeta};
use citrine_record::{valid_bin_name, BodyView};
use citrine_types::{ParticleType, ResultCode};
use citrine_wire::msg::{field_type, info1, info2, op_type, MessageWriter, MsgHeader};
use std::sync::atomic::Ordering;

/// A read op's computed result (particle type, bytes), when it has one.
type Computed = Option<(u8, Vec<u8>)>;

/// What a read answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    /// Every bin once (GET_ALL), whatever read ops accompany it.
    AllBins,
    /// The header alone (GET_NO_BINS, which wins over everything else).
    HeaderOnly,
    /// The bins and results the ops name.
    Ops,
}

/// Reads a record, then touches it when the read carries a TTL percentage
/// (read-touch, server 7.1+).
pub(crate) fn read(
    namespace: &Namespace,
    request: &Request<'_>,
    now: Now,
    out: &mut Vec<u8>,
) -> Result<(), ResultCode> {
    let header = &request.header;
    if header.record_ttl > 100 && header.record_ttl != TTL_NEVER_EXPIRE {
        return Err(ResultCode::Parameter);
    }
    read_record(namespace, request, now, out)?;
    if (1..=100).contains(&header.record_ttl) {
        // As the reference: the read answers the record as it was, and the
        // touch follows it. The reply is written by then, so a touch that
        // fails is counted, not answered.
        let stats = &namespace.stats;
        match read_touch(namespace, request, now) {
            Ok(true) => stats.read_touch_success.fetch_add(1, Ordering::Relaxed),
            Ok(false) => stats.read_touch_skip.fetch_add(1, Ordering::Relaxed),
            Err(_) => stats.read_touch_error.fetch_add(1, Ordering::Relaxed),
        };
    }
    Ok(())
}

/// The read itself: the record as stored, answered into `out`. Inside a
/// transaction ([`crate::txn::read_source`]) it reads the transaction's
/// own provisional version when it holds one, else the committed record,
/// answered with its version (field 3).
fn read_record(
    namespace: &Namespace,
    request: &Request<'_>,
    now: Now,
    out: &mut Vec<u8>,
) -> Result<(), ResultCode> {
    let answer = validate_read(request)?;
    let partition = namespace.index.partition(request.digest.partition()).read();
    let source = crate::txn::read_source(namespace, request)?;
    if let TxnRead::Own { meta, body } = &source {
        let stored = Stored {
            body,
            meta: *meta,
            size: body.len() as u64,
        };
        return answer_read(namespace, request, answer, stored, now, out);
    }
    if let TxnRead::Committed = source {
        // A re-read must find the version the transaction read first.
        let live = partition
            .get(&request.digest)
            .map(IndexEntry::meta)
            .filter(|meta| is_live(namespace, meta, now));
        crate::txn::check_read_version(namespace, request, live.as_ref())?;
    }
    let (entry, meta) = find_live(namespace, &partition, request, now)?;
    let body = namespace
        .storage
        .read(&entry.location)
        .map_err(|_| ResultCode::ServerError)?;
    let stored = Stored {
        body: &body,
        meta,
        size: entry.location.size() as u64,
    };
    let start = out.len();
    answer_read(namespace, request, answer, stored, now, out)?;
    if let TxnRead::Committed = source {
        crate::txn::add_version(out, start, request.reply, &meta);
    }
    Ok(())
}

/// A record version a read answers from: its body, metadata and size.
struct Stored<'b> {
    body: &'b [u8],
    meta: RecordMeta,
    size: u64,
}

/// Answers a read from `stored`: key check, filter, read ops, the reply.
fn answer_read(
    namespace: &Namespace,
    request: &Request<'_>,
    answer: Answer,
    stored: Stored<'_>,
    now: Now,
    out: &mut Vec<u8>,
) -> Result<(), ResultCode> {
    let Stored { body, meta, size } = stored;
    let view = BodyView::parse(body).map_err(|_| ResultCode::ServerError)?;
    if let (Some(sent), Some(stored)) = (request.key, view.key()) {
        if sent != stored {
            return Err(ResultCode::KeyMismatch);
        }
    }
    let record = RecordView::stored(namespace, &request.digest.0, &view, meta, size);
    if let Some(expression) = request.filter {
        filter::check(expression, &record, now)?;
    }
    if request.header.n_ops == 0 && answer == Answer::Ops {
        // Neither bins, nor all of them, nor the header alone (a select of
        // no bins): the reference refuses it once the record is found and
        // has passed the filter (27 first).
        return Err(ResultCode::Parameter);
    }
    let computed = match answer {
        Answer::Ops => evaluate_reads(request, &view, &record, now)?,
        Answer::AllBins | Answer::HeaderOnly => Vec::new(),
    };
    write_read_reply(request, answer, &view, meta, computed, out)?;
    namespace
        .stats
        .client_read_success
        .fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Checks a read's ops before the index is touched (a write op → 4, a bad
/// bin name → 21); what the read answers.
fn validate_read(request: &Request<'_>) -> Result<Answer, ResultCode> {
    for op in request.ops.iter() {
        match op.op_type {
            op_type::READ => {
                if op.name.len() > citrine_types::BIN_NAME_MAX {
                    return Err(ResultCode::BinName);
                }
            }
            op_type::CDT_READ | op_type::BITS_READ | op_type::HLL_READ | op_type::EXP_READ => {
                if !valid_bin_name(op.name) {
                    return Err(ResultCode::BinName);
                }
            }
            _ => return Err(ResultCode::Parameter),
        }
    }
    // As the reference read path: GET_NO_BINS answers the header alone,
    // whatever else is asked; GET_ALL returns every bin once, whatever read
    // ops accompany it (the "one read-all op" rules are the write path's).
    let info1_bits = request.header.info1;
    Ok(if info1_bits & info1::GET_NO_BINS != 0 {
        Answer::HeaderOnly
    } else if info1_bits & info1::GET_ALL != 0 {
        Answer::AllBins
    } else {
        Answer::Ops
    })
}

/// The live index entry of the request's record and its metadata; a
/// missing, expired or truncated record is counted and answers 2.
fn find_live<'p>(
    namespace: &Namespace,
    partition: &'p PartitionIndex,
    request: &Request<'_>,
    now: Now,
) -> Result<(&'p IndexEntry, RecordMeta), ResultCode> {
    match partition
        .get(&request.digest)
        .map(|entry| (entry, entry.meta()))
    {
        Some((entry, meta)) if is_live(namespace, &meta, now) => Ok((entry, meta)),
        _ => {
            namespace
                .stats
                .client_read_not_found
                .fetch_add(1, Ordering::Relaxed);
            Err(ResultCode::NotFound)
        }
    }
}

/// The results of the CDT, bit, HLL and expression read ops, in op order,
/// computed before the reply starts (refused with 13 past
/// [`MAX_REPLY_BYTES`]).
fn evaluate_reads(
    request: &Request<'_>,
    view: &BodyView<'_>,
    record: &RecordView<'_>,
    now: Now,
) -> Result<Vec<Computed>, ResultCode> {
    let mut computed = Vec::new();
    let mut computed_bytes = 0usize;
    for op in request.ops.iter() {
        let result = if let Some((family, false)) = bin_op_family(op.op_type) {
            let bin = view.bin(op.name);
            let current = bin
                .as_ref()
                .map(|bin| (bin.particle_type, bin.value.as_ref()));
            let outcome =
                if family == citrine_cdt::Family::Cdt && citrine_cdt::path::is_path(op.value) {
                    citrine_exp::path_op(op.value, current, false, record, now.unix_ms)?
                } else {
                    citrine_cdt::apply(family, op.value, current, false)
                        .map_err(citrine_cdt::CdtError::result_code)?
                };
            outcome.result
        } else if op.op_type == op_type::EXP_READ {
            citrine_exp::read_op(op.value, record, now.unix_ms)
                .map_err(citrine_exp::ExpError::result_code)?
        } else {
            continue;
        };
        computed_bytes += result.as_ref().map_or(0, |(_, value)| value.len());
        if computed_bytes > MAX_REPLY_BYTES {
            return Err(ResultCode::RecordTooBig);
        }
        computed.push(result);
    }
    Ok(computed)
}

/// Writes a read's reply: header (generation, void time), the stored key
/// (frames only: batch rows carry none, as the reference's), then the bins
/// the read answers.
fn write_read_reply(
    request: &Request<'_>,
    answer: Answer,
    view: &BodyView<'_>,
    meta: RecordMeta,
    computed: Vec<Computed>,
    out: &mut Vec<u8>,
) -> Result<(), ResultCode> {
    let reply = MsgHeader {
        generation: u32::from(meta.generation),
        record_ttl: meta.void_time,
        ..MsgHeader::default()
    };
    let mut writer = begin_reply(out, reply, request.reply);
    if request.reply == Reply::Frame {
        if let Some((particle_type, bytes)) = view.key() {
            write_key_field(&mut writer, particle_type, bytes);
        }
    }
    match answer {
        Answer::HeaderOnly => {}
        Answer::AllBins => {
            for bin in view.bins() {
                writer.op(op_type::READ, bin.particle_type, &bin.name, &bin.value);
            }
        }
        Answer::Ops => {
            if let Err(code) = write_op_answers(request, view, computed, &mut writer) {
                writer.abandon();
                return Err(code);
            }
        }
    }
    writer.finish();
    Ok(())
}

/// The answer of each read op, in op order: a named bin, or a computed
/// result; under RESPOND_ALL_OPS a nil where there is none.
fn write_op_answers(
    request: &Request<'_>,
    view: &BodyView<'_>,
    computed: Vec<Computed>,
    writer: &mut MessageWriter<'_>,
) -> Result<(), ResultCode> {
    let respond_all = request.header.info2 & info2::RESPOND_ALL_OPS != 0;
    let mut computed = computed.into_iter();
    for op in request.ops.iter() {
        if op.name.is_empty() {
            continue;
        }
        let computes = bin_op_family(op.op_type).is_some() || op.op_type == op_type::EXP_READ;
        // A stored bin is copied from the body as it is (no allocation).
        let found = if computes {
            computed.next().flatten().map(|(particle_type, value)| {
                writer.op(op.op_type, particle_type, op.name, &value);
            })
        } else {
            view.bin(op.name).map(|bin| {
                writer.op(op.op_type, bin.particle_type, &bin.name, &bin.value);
            })
        };
        if found.is_none() && respond_all {
            writer.op(op.op_type, ParticleType::Null as u8, op.name, &[]);
        }
        if writer.written() > MAX_REPLY_BYTES {
            // Many reads of big bins: refuse before it grows further.
            return Err(ResultCode::RecordTooBig);
        }
    }
    Ok(())
}

fn write_key_field(writer: &mut MessageWriter<'_>, particle_type: u8, bytes: &[u8]) {
    let mut field = Vec::with_capacity(1 + bytes.len());
    field.push(particle_type);
    field.extend_from_slice(bytes);
    writer.field(field_type::KEY, &field);
}

/// Read-touch (server 7.1+): a read whose `record_ttl` is a percentage
/// 1..=100 resets the record's TTL — new void time and last-update time,
/// the generation kept (the reference's, asked over the wire: unlike a
/// touch op, a read-touch does not count as a change of the record's
/// content) — when at most that percentage of the TTL it was written with
/// remains. Records that never expire are left alone. Runs
/// after the read answered; true when it touched.
pub(crate) fn read_touch(
    namespace: &Namespace,
    request: &Request<'_>,
    now: Now,
) -> Result<bool, ResultCode> {
    let percent = request.header.record_ttl;
    debug_assert!((1..=100).contains(&percent));
    let mut partition = namespace
        .index
        .partition(request.digest.partition())
        .write();
    // The LUT is taken under the lock (see `Namespace::now_under_lock`).
    let now = namespace.now_under_lock(now);
    let Some(entry) = partition.get(&request.digest) else {
        return Ok(false);
    };
    if !matches!(crate::txn::begin_write(namespace, request, now), Ok(None)) {
        // Not inside a transaction, nor under one's lock: the committed
        // record is the roll forward's to change.
        return Ok(false);
    }
    let current = entry.meta();
    if current.void_time == 0 || !is_live(namespace, &current, now) {
        return Ok(false);
    }
    let written = citrine_types::citrusleaf_epoch_seconds(current.last_update_ms);
    let ttl = current.void_time.saturating_sub(written);
    let remaining = current.void_time.saturating_sub(now.citrusleaf_seconds);
    // As the reference: touched when the remaining TTL is at most the
    // percentage of the TTL (`remaining <= ttl * pct / 100`, the division
    // rounding down; for a whole number of seconds remaining the same as
    // comparing `remaining * 100` with `ttl * pct`).
    if ttl == 0 || u64::from(remaining) * 100 > u64::from(ttl) * u64::from(percent) {
        return Ok(false);
    }
    let body = namespace
        .storage
        .read(&entry.location)
        .map_err(storage_result)?
        .into_owned();
    let meta = RecordMeta {
        generation: current.generation,
        life: current.life,
        set_id: current.set_id,
        void_time: now.citrusleaf_seconds.saturating_add(ttl),
        last_update_ms: namespace.version_lut_ms(current.set_id, now.unix_ms),
        // A change made here: XDR ships it like a client's write.
        xdr_write: false,
    };
    let previous = install(namespace, &mut partition, request.digest, meta, body)?;
    drop(partition);
    if let Some(old) = previous {
        old.release(namespace);
    }
    Ok(true)
}
