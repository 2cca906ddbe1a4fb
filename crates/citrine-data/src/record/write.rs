//! The write path: put, operate and touch on one record.
//!
//! Steps, under the record partition's write lock, held until the record
//! is decided: the ops are validated first (`validate_write_ops`); then
//! the record is found (`Found`), the record-exists action, generation,
//! stored key and filter are checked, the set of a record the write
//! creates comes into being (`set_of_new_record`), each op is applied in
//! order to a working copy of the bins that borrows from the stored body and the
//! request (`Working`), the outcome decided (a new version, or a removal
//! when no bin is left), and committed through [`super::store`]. Any error
//! drops the whole working copy, so nothing of the transaction is stored.
//!
//! Answers, in the order they are checked. Before the lock: the ops (bin
//! names → 21; values, unknown op types and the reference's illegal
//! combinations → 4), then [`admit_write`]: stop-writes → 8 (a memory
//! namespace compares its striped counts' cheap total, within 1 % of the
//! budget; a device namespace its free write blocks, `min-avail-pct`).
//! Under the lock: the record-exists action (5 / 2), generation (3),
//! stored key (19), the filter against the existing record (27; a write
//! that creates the record is not filtered), the new record's set (4 when
//! the namespace holds all the sets it can: the set exists from here on,
//! even if an op then refuses the write, as the reference's), each op
//! (GeoJSON parsed as it applies: 160) (a CDT, bit or HLL op decodes its bin, applies the op with
//! `citrine_cdt::apply` and puts the re-encoded value back; an expression
//! op sees the working bins as the earlier ops left them; results join
//! the reply), the new body's size (13, [`check_record_size`]). The commit
//! stores the body copy-on-write (a new `Location`; the device engine
//! appends it to its write buffer and, with `commit-to-device`, writes and
//! syncs it before returning) and points the index at it; the replaced
//! version's storage is released and the reply written once the lock is
//! dropped.
//!
//! Transactions ([`crate::txn::begin_write`], under the lock, first): a
//! record another transaction holds refuses the write (120); a write
//! inside a transaction starts from its own provisional version when it
//! holds one, and what it decides is kept as the provisional version
//! instead of committed (the index and storage are untouched until the
//! roll forward).

use super::bins::{apply_modify, find_bin};
use super::store::{install, is_durable_delete, remove_deleted, start_after, write_tombstone};
use super::{
    begin_reply, bin_op_family, check_generation, is_live, Now, Reply, Request, MAX_REPLY_BYTES,
    TTL_DONT_UPDATE, TTL_MAX_SECONDS, TTL_NEVER_EXPIRE,
};
use crate::filter::{self, Bins, RecordView};
use crate::namespace::Namespace;
use citrine_exp::BinWrite;
use citrine_index::{IndexEntry, PartitionIndex, RecordMeta};
use citrine_record::{encode_body_reserving, valid_bin_name, validate_value, Bin, BodyView};
use citrine_storage::MEMORY_BODY_SPARE;
use citrine_types::{ParticleType, ResultCode};
use citrine_wire::msg::{info1, info2, info3, op_type, MsgHeader, Op};
use std::borrow::Cow;
use std::sync::atomic::Ordering;

/// Runs a put, operate or touch and writes its reply.
pub(crate) fn write(
    namespace: &Namespace,
    request: &Request<'_>,
    now: Now,
    out: &mut Vec<u8>,
) -> Result<(), ResultCode> {
    validate_write_ops(request)?;
    admit_write(namespace)?;
    let mut partition = namespace
        .index
        .partition(request.digest.partition())
        .write();
    // The LUT is taken under the lock (see `Namespace::now_under_lock`).
    let now = namespace.now_under_lock(now);
    let txn = crate::txn::begin_write(namespace, request, now)?;
    let own = txn.as_ref().and_then(|txn| txn.own.as_ref());
    let outcome = {
        let current = partition.get(&request.digest);
        let (live, body) = match own {
            // The transaction's own provisional version is its record.
            Some(version) => provisional_base(version),
            None => committed_base(namespace, current, now)?,
        };
        if txn.is_some() && own.is_none() {
            crate::txn::check_read_version(namespace, request, live.as_ref())?;
        }
        let mut found = Found::new(current, live, body.as_deref())?;
        if own.is_some() {
            found.size = body.as_ref().map_or(0, |body| body.len() as u64);
        }
        check_preconditions(namespace, request, &found, now)?;
        if let shipped @ Some(_) = super::xdr_lut_ms(request) {
            // Only a write XDR shipped looks up a tombstone for its
            // conflict check; a client's write never does.
            let local_lut = live
                .map(|meta| meta.last_update_ms)
                .or_else(|| Some(partition.tombstone(&request.digest)?.last_update_ms));
            super::check_xdr_conflict(shipped, local_lut)?;
        }
        let record_set = match found.live {
            Some(meta) => meta.set_id,
            None => set_of_new_record(namespace, request.set)?,
        };
        let working = apply_ops(namespace, request, &found, record_set, now)?;
        decide(namespace, request, &partition, &found, working, now)?
    };
    if let Some(txn) = txn {
        let (version, reply) = provisional_of(outcome);
        crate::txn::keep(namespace, request, &txn, version);
        drop(partition);
        reply.finish(namespace, request, out);
        return Ok(());
    }
    let committed = commit(namespace, request, &mut partition, outcome, now)?;
    drop(partition);
    committed.finish(namespace, request, out);
    Ok(())
}

/// The record a write starts from: its live metadata and body (none when
/// missing).
type Base<'a> = (Option<RecordMeta>, Option<Cow<'a, [u8]>>);

/// The committed record a write starts from.
fn committed_base<'a>(
    namespace: &'a Namespace,
    current: Option<&'a IndexEntry>,
    now: Now,
) -> Result<Base<'a>, ResultCode> {
    let live = current
        .map(IndexEntry::meta)
        .filter(|meta| is_live(namespace, meta, now));
    let body = match (current, live) {
        (Some(entry), Some(_)) => Some(
            namespace
                .storage
                .read(&entry.location)
                .map_err(|_| ResultCode::ServerError)?,
        ),
        _ => None,
    };
    Ok((live, body))
}

/// A transaction's provisional version as the base of its next write.
fn provisional_base(version: &crate::txn::Version) -> (Option<RecordMeta>, Option<Cow<'_, [u8]>>) {
    match version {
        crate::txn::Version::Store { meta, body } => {
            (Some(*meta), Some(Cow::Borrowed(body.as_slice())))
        }
        crate::txn::Version::Delete => (None, None),
    }
}

/// What a transaction's write keeps as its provisional version, and the
/// reply it answers (no storage replaced: the committed record stays).
fn provisional_of(outcome: WriteOutcome) -> (crate::txn::Version, Committed) {
    match outcome {
        WriteOutcome::Store {
            meta,
            body,
            responses,
        } => (
            crate::txn::Version::Store { meta, body },
            Committed {
                previous: None,
                generation: meta.generation,
                void_time: meta.void_time,
                responses,
            },
        ),
        WriteOutcome::Delete { responses } => (
            crate::txn::Version::Delete,
            Committed {
                previous: None,
                generation: 0,
                void_time: 0,
                responses,
            },
        ),
    }
}

/// The record as a write finds it, under the lock.
struct Found<'a> {
    /// The index entry held, live or not (where a new version starts).
    current: Option<&'a IndexEntry>,
    /// The live record's metadata: `None` when missing, expired or
    /// truncated.
    live: Option<RecordMeta>,
    /// The live record's body.
    view: Option<BodyView<'a>>,
    /// The live record's stored size.
    size: u64,
}

impl<'a> Found<'a> {
    fn new(
        current: Option<&'a IndexEntry>,
        live: Option<RecordMeta>,
        body: Option<&'a [u8]>,
    ) -> Result<Found<'a>, ResultCode> {
        let view = match body {
            Some(bytes) => Some(BodyView::parse(bytes).map_err(|_| ResultCode::ServerError)?),
            None => None,
        };
        let size = match (current, live) {
            (Some(entry), Some(_)) => entry.location.size() as u64,
            _ => 0,
        };
        Ok(Found {
            current,
            live,
            view,
            size,
        })
    }

    /// The key stored with the record, if any.
    fn stored_key(&self) -> Option<(u8, &'a [u8])> {
        self.view.as_ref().and_then(BodyView::key)
    }
}

/// The checks made before any op: record-exists action and generation
/// (a touch on a missing record answers 2 first, as the reference; a
/// missing record has generation 0, so GENERATION_GT fails on it with 3
/// before any op could fail or create it), the stored key against the one
/// sent, and the filter expression against the record as it is (a write
/// that creates the record is not filtered).
fn check_preconditions(
    namespace: &Namespace,
    request: &Request<'_>,
    found: &Found<'_>,
    now: Now,
) -> Result<(), ResultCode> {
    let header = &request.header;
    match found.live {
        Some(meta) => {
            if header.info2 & info2::CREATE_ONLY != 0 {
                return Err(ResultCode::RecordExists);
            }
            check_generation(header, meta.generation)?;
        }
        None => {
            let touches = request.ops.iter().any(|op| op.op_type == op_type::TOUCH);
            if touches || header.info3 & (info3::UPDATE_ONLY | info3::REPLACE_ONLY) != 0 {
                return Err(ResultCode::NotFound);
            }
            check_generation(header, 0)?;
        }
    }
    if let (Some(sent), Some(stored)) = (request.key, found.stored_key()) {
        if sent != stored {
            return Err(ResultCode::KeyMismatch);
        }
    }
    if let (Some(expression), Some(view), Some(meta)) = (request.filter, &found.view, found.live) {
        let record = RecordView::stored(namespace, &request.digest.0, view, meta, found.size);
        filter::check(expression, &record, now)?;
    }
    Ok(())
}

/// An operate's working copy: the bins as the ops so far left them, the
/// values to answer, and whether a delete-record op emptied it.
struct Working<'a> {
    bins: Vec<Bin<'a>>,
    /// The record's set: the live record's, else the request's.
    set_id: u16,
    responses: Vec<ResponseEntry<'a>>,
    deleted: bool,
    /// Reply bytes of `responses[..counted]` (see [`count_reply_bytes`]).
    reply_bytes: usize,
    counted: usize,
}

impl<'a> Working<'a> {
    /// The record as the ops so far left it, for the ops that read it
    /// (expressions, path ops). As the reference: its key is the stored
    /// one (a key sent with this write is not stored yet), and its set is
    /// known even while the write creates it or after a delete op.
    fn view(
        &self,
        namespace: &'a Namespace,
        request: &'a Request<'_>,
        found: &Found<'a>,
    ) -> RecordView<'_> {
        RecordView::new(
            namespace,
            &request.digest.0,
            Bins::Working(&self.bins),
            found.stored_key(),
            found.live.filter(|_| !self.deleted),
            found.size,
        )
        .in_set(self.set_id)
    }
}

/// Applies every op in order to a working copy of the stored bins (none
/// when the request replaces the record) of a record in set `set_id`.
fn apply_ops<'a>(
    namespace: &'a Namespace,
    request: &'a Request<'a>,
    found: &Found<'a>,
    set_id: u16,
    now: Now,
) -> Result<Working<'a>, ResultCode> {
    let header = &request.header;
    let replaces = header.info3 & (info3::CREATE_OR_REPLACE | info3::REPLACE_ONLY) != 0;
    let stored = found.view.as_ref().filter(|_| !replaces);
    // One allocation for the working bins: room for every stored bin and
    // one new bin per op.
    let stored_bins = stored.map_or(0, BodyView::bin_count);
    let mut working = Working {
        bins: Vec::with_capacity(stored_bins + usize::from(header.n_ops)),
        set_id,
        responses: Vec::new(),
        deleted: false,
        reply_bytes: 0,
        counted: 0,
    };
    if let Some(view) = stored {
        working.bins.extend(view.bins());
    }
    for op in request.ops.iter() {
        working.reply_bytes = count_reply_bytes(
            &working.responses,
            &mut working.counted,
            working.reply_bytes,
        )?;
        apply_op(namespace, request, found, &mut working, &op, now)?;
    }
    working.reply_bytes = count_reply_bytes(
        &working.responses,
        &mut working.counted,
        working.reply_bytes,
    )?;
    Ok(working)
}

/// Applies one op to the working copy.
fn apply_op<'a>(
    namespace: &'a Namespace,
    request: &'a Request<'a>,
    found: &Found<'a>,
    working: &mut Working<'a>,
    op: &Op<'a>,
    now: Now,
) -> Result<(), ResultCode> {
    let respond_all = request.header.info2 & info2::RESPOND_ALL_OPS != 0;
    match op.op_type {
        op_type::READ => read_working_bin(request, working, op),
        // A touch of a missing record was answered 2 before any op; after
        // a delete op it touches nothing (the record is removed, or
        // rewritten by the ops after it), as the reference.
        op_type::TOUCH => Ok(()),
        op_type::DELETE_ALL => {
            // On a missing record this deletes nothing: the ops after it
            // may still create the record (a delete left alone answers
            // NOT_FOUND, as nothing is stored).
            working.bins.clear();
            working.deleted = true;
            if respond_all {
                working.responses.push(null_entry(op));
            }
            Ok(())
        }
        op_type::EXP_READ | op_type::EXP_MODIFY => {
            expression_op(namespace, request, found, working, op, now)
        }
        kind if bin_op_family(kind).is_some() => {
            collection_op(namespace, request, found, working, op, now)
        }
        _ => {
            apply_modify(&mut working.bins, op)?;
            if respond_all {
                working.responses.push(null_entry(op));
            }
            Ok(())
        }
    }
}

/// A READ op inside an operate: the bin as the ops so far left it. A
/// nameless read is "all bins" only under GET_ALL; a header read
/// (NOBINDATA) names the bin "" like any other, so under RESPOND_ALL_OPS
/// it holds its slot with a nil, as the reference's write path answers.
fn read_working_bin<'a>(
    request: &Request<'a>,
    working: &mut Working<'a>,
    op: &Op<'a>,
) -> Result<(), ResultCode> {
    let header = &request.header;
    if op.name.is_empty() && header.info1 & info1::GET_ALL != 0 {
        for bin in &working.bins {
            working.responses.push(ResponseEntry {
                op_type: op_type::READ,
                name: bin.name.clone(),
                particle_type: bin.particle_type,
                value: bin.value.clone(),
            });
        }
        return Ok(());
    }
    match find_bin(&working.bins, op.name) {
        Some(index) => working.responses.push(ResponseEntry {
            op_type: op.op_type,
            name: Cow::Borrowed(op.name),
            particle_type: working.bins[index].particle_type,
            value: working.bins[index].value.clone(),
        }),
        None if header.info2 & info2::RESPOND_ALL_OPS != 0 => {
            working.responses.push(null_entry(op));
        }
        None => {}
    }
    Ok(())
}

/// A CDT, bit or HLL op (read or modify) on one bin of the working copy;
/// a CDT op whose payload is a path reads the record as it is at this op.
fn collection_op<'a>(
    namespace: &'a Namespace,
    request: &'a Request<'a>,
    found: &Found<'a>,
    working: &mut Working<'a>,
    op: &Op<'a>,
    now: Now,
) -> Result<(), ResultCode> {
    let (family, modify) = bin_op_family(op.op_type).ok_or(ResultCode::Parameter)?;
    let outcome = {
        let current = find_bin(&working.bins, op.name).map(|i| {
            (
                working.bins[i].particle_type,
                working.bins[i].value.as_ref(),
            )
        });
        if family == citrine_cdt::Family::Cdt && citrine_cdt::path::is_path(op.value) {
            let record = working.view(namespace, request, found);
            citrine_exp::path_op(op.value, current, modify, &record, now.unix_ms)?
        } else {
            let limit = u64::from(namespace.config.max_record_size);
            citrine_cdt::apply_within(family, op.value, current, modify, limit).map_err(
                |error| match error {
                    // Refused before it was built: counted as the
                    // record-size check counts it.
                    citrine_cdt::CdtError::TooBig => record_too_big(namespace),
                    error => error.result_code(),
                },
            )?
        }
    };
    if let Some((particle_type, value)) = outcome.bin {
        set_bin(namespace, &mut working.bins, op.name, particle_type, value)?;
    }
    let respond_all = request.header.info2 & info2::RESPOND_ALL_OPS != 0;
    push_result(&mut working.responses, op, outcome.result, respond_all);
    Ok(())
}

/// An expression op: EXP_READ answers a value; EXP_MODIFY stores, deletes
/// or keeps its bin. Both read the record as the ops so far left it.
fn expression_op<'a>(
    namespace: &'a Namespace,
    request: &'a Request<'a>,
    found: &Found<'a>,
    working: &mut Working<'a>,
    op: &Op<'a>,
    now: Now,
) -> Result<(), ResultCode> {
    let respond_all = request.header.info2 & info2::RESPOND_ALL_OPS != 0;
    if op.op_type == op_type::EXP_READ {
        let result = {
            let record = working.view(namespace, request, found);
            citrine_exp::read_op(op.value, &record, now.unix_ms)
                .map_err(citrine_exp::ExpError::result_code)?
        };
        push_result(&mut working.responses, op, result, respond_all);
        return Ok(());
    }
    let change = {
        let record = working.view(namespace, request, found);
        citrine_exp::modify_op(op.value, op.name, &record, now.unix_ms)
            .map_err(citrine_exp::ExpError::result_code)?
    };
    match change {
        BinWrite::Store(particle_type, value) => {
            set_bin(namespace, &mut working.bins, op.name, particle_type, value)?;
        }
        BinWrite::Delete => {
            if let Some(index) = find_bin(&working.bins, op.name) {
                working.bins.remove(index);
            }
        }
        BinWrite::Keep => {}
    }
    push_result(&mut working.responses, op, None, respond_all);
    Ok(())
}

/// What the ops leave: a new version of the record (its metadata and
/// encoded body), or its removal when no bin is left (2 when there was no
/// record to remove, or when a replace left no bin).
fn decide(
    namespace: &Namespace,
    request: &Request<'_>,
    partition: &PartitionIndex,
    found: &Found<'_>,
    working: Working<'_>,
    now: Now,
) -> Result<WriteOutcome, ResultCode> {
    let responses = owned(working.responses);
    if working.bins.is_empty() {
        // Nothing to remove, or a replace that wrote no bin: 2, and the
        // record (if any) stays as it was, as the reference answers.
        let replaces = request.header.info3 & (info3::CREATE_OR_REPLACE | info3::REPLACE_ONLY) != 0;
        if found.live.is_none() || replaces {
            return Err(ResultCode::NotFound);
        }
        return Ok(WriteOutcome::Delete { responses });
    }
    let existing_void_time = found.live.map(|meta| meta.void_time);
    let void_time = void_time_for(
        namespace,
        request.header.record_ttl,
        existing_void_time,
        now,
    )?;
    let key = request.key.or(found.stored_key());
    let body = encode_body_reserving(key, &working.bins, MEMORY_BODY_SPARE)
        .map_err(|_| ResultCode::Parameter)?;
    check_record_size(namespace, body.len())?;
    crate::txn::monitor::check_size(namespace, request, body.len())?;
    let (life, generation) = match found.live {
        Some(meta) => (meta.life, RecordMeta::next_generation(meta.generation)),
        None => start_after(
            found.current.map(IndexEntry::meta),
            partition.tombstone(&request.digest),
        ),
    };
    let record_set = working.set_id;
    let shipped_lut = super::xdr_lut_ms(request);
    let meta = RecordMeta {
        generation,
        life,
        set_id: record_set,
        void_time,
        last_update_ms: shipped_lut
            .unwrap_or_else(|| namespace.version_lut_ms(record_set, now.unix_ms)),
        xdr_write: shipped_lut.is_some(),
    };
    if let Some(lut_ms) = shipped_lut {
        namespace
            .xdr_arrivals
            .note(request.digest.partition(), lut_ms);
    }
    Ok(WriteOutcome::Store {
        meta,
        body,
        responses,
    })
}

/// What a committed write leaves to do once the lock is released: free
/// the replaced version's storage (the device engine may take its own
/// locks) and answer.
struct Committed {
    previous: Option<super::store::Replaced>,
    generation: u16,
    void_time: u32,
    responses: Vec<OwnedEntry>,
}

/// Carries out the outcome under the lock: the removal with its
/// tombstone, or the install of the new version.
fn commit(
    namespace: &Namespace,
    request: &Request<'_>,
    partition: &mut PartitionIndex,
    outcome: WriteOutcome,
    now: Now,
) -> Result<Committed, ResultCode> {
    match outcome {
        WriteOutcome::Delete { responses } => {
            if let Some(entry) = partition.get(&request.digest) {
                write_tombstone(namespace, &request.digest, &entry.meta(), now)?;
            }
            let durable = is_durable_delete(&request.header);
            remove_deleted(namespace, partition, &request.digest, now.unix_ms, durable);
            Ok(Committed {
                previous: None,
                generation: 0,
                void_time: 0,
                responses,
            })
        }
        WriteOutcome::Store {
            meta,
            body,
            responses,
        } => Ok(Committed {
            previous: install(namespace, partition, request.digest, meta, body)?,
            generation: meta.generation,
            void_time: meta.void_time,
            responses,
        }),
    }
}

impl Committed {
    /// After the lock is released: frees the replaced storage, answers,
    /// counts the success.
    fn finish(self, namespace: &Namespace, request: &Request<'_>, out: &mut Vec<u8>) {
        if let Some(old) = self.previous {
            old.release(namespace);
        }
        let (generation, void_time) = (self.generation, self.void_time);
        write_operate_reply(out, request.reply, generation, void_time, &self.responses);
        namespace
            .stats
            .count(request.tally, crate::tally::Outcome::WriteSuccess);
    }
}

/// How one op counts toward the reference's rules on read ops.
enum OpCount {
    /// A nameless read under GET_ALL ("read all bins").
    ReadAll,
    /// An op that answers a value (a named read, CDT, bit, HLL, expression).
    Response,
    /// Neither.
    Other,
}

/// Validates the ops of a write-path request before anything is decided:
/// each op on its own ([`validate_write_op`]), then the reference's rules
/// on "read all" ops (exactly one under GET_ALL, alone, without
/// RESPOND_ALL_OPS).
fn validate_write_ops(request: &Request<'_>) -> Result<(), ResultCode> {
    let header = &request.header;
    if header.n_ops == 0 {
        return Err(ResultCode::Parameter);
    }
    let respond_all = header.info2 & info2::RESPOND_ALL_OPS != 0;
    let get_all = header.info1 & info1::GET_ALL != 0;
    let mut read_all_ops = 0;
    let mut response_ops = 0;
    for op in request.ops.iter() {
        match validate_write_op(header, &op)? {
            OpCount::ReadAll => read_all_ops += 1,
            OpCount::Response => response_ops += 1,
            OpCount::Other => {}
        }
    }
    if get_all && read_all_ops == 0 {
        return Err(ResultCode::Parameter);
    }
    if read_all_ops > 1 || (read_all_ops > 0 && (respond_all || response_ops > 0)) {
        return Err(ResultCode::Parameter);
    }
    Ok(())
}

/// One op of a write-path request: its bin name (21), its value (4), and
/// the reference's illegal combinations (4): in a replace, any op that
/// needs the old record (increment, append, prepend, a collection modify,
/// touch, delete) and a bin removal; reads and expression ops are allowed.
fn validate_write_op(header: &MsgHeader, op: &Op<'_>) -> Result<OpCount, ResultCode> {
    let replaces = header.info3 & (info3::CREATE_OR_REPLACE | info3::REPLACE_ONLY) != 0;
    match op.op_type {
        op_type::READ => {
            if header.info1 & info1::READ == 0 {
                return Err(ResultCode::Parameter);
            }
            if op.name.is_empty() {
                let get_all = header.info1 & info1::GET_ALL != 0;
                return Ok(if get_all {
                    OpCount::ReadAll
                } else {
                    OpCount::Other
                });
            }
            if op.name.len() > citrine_types::BIN_NAME_MAX {
                return Err(ResultCode::BinName);
            }
            Ok(OpCount::Response)
        }
        op_type::WRITE | op_type::INCR | op_type::APPEND | op_type::PREPEND => {
            validate_bin_write(op, replaces)?;
            Ok(OpCount::Other)
        }
        op_type::TOUCH | op_type::DELETE_ALL if replaces => Err(ResultCode::Parameter),
        op_type::TOUCH | op_type::DELETE_ALL => Ok(OpCount::Other),
        op_type::CDT_READ
        | op_type::CDT_MODIFY
        | op_type::BITS_READ
        | op_type::BITS_MODIFY
        | op_type::HLL_READ
        | op_type::HLL_MODIFY
        | op_type::EXP_READ
        | op_type::EXP_MODIFY => {
            if !valid_bin_name(op.name) {
                return Err(ResultCode::BinName);
            }
            // A replace starts from no bins: a collection modify would
            // need the old value, so it is refused; reads and expression
            // writes see the replaced (empty) record and run.
            let collection_modify = matches!(
                op.op_type,
                op_type::CDT_MODIFY | op_type::BITS_MODIFY | op_type::HLL_MODIFY
            );
            if replaces && collection_modify {
                return Err(ResultCode::Parameter);
            }
            Ok(OpCount::Response)
        }
        _ => Err(ResultCode::Parameter),
    }
}

/// A WRITE, INCR, APPEND or PREPEND op's bin name and value; a nil value
/// only for a WRITE (which removes the bin), and not in a replace.
fn validate_bin_write(op: &Op<'_>, replaces: bool) -> Result<(), ResultCode> {
    if !valid_bin_name(op.name) {
        return Err(ResultCode::BinName);
    }
    validate_value(op.particle_type, op.value).map_err(|_| ResultCode::Parameter)?;
    if op.particle_type == ParticleType::Hll as u8 && !citrine_cdt::hll::valid_particle(op.value) {
        return Err(ResultCode::Parameter);
    }
    let null = op.particle_type == ParticleType::Null as u8;
    if op.op_type != op_type::WRITE && null {
        return Err(ResultCode::Parameter);
    }
    if replaces && (op.op_type != op_type::WRITE || null) {
        return Err(ResultCode::Parameter);
    }
    Ok(())
}

/// Computes a record's void time for a write.
pub fn void_time_for(
    namespace: &Namespace,
    ttl: u32,
    existing_void_time: Option<u32>,
    now: Now,
) -> Result<u32, ResultCode> {
    let default = || match namespace.config.default_ttl {
        0 => 0,
        seconds => now.citrusleaf_seconds.saturating_add(seconds),
    };
    let void_time = match ttl {
        TTL_NEVER_EXPIRE => 0,
        TTL_DONT_UPDATE => existing_void_time.unwrap_or_else(default),
        0 => default(),
        seconds if seconds > TTL_MAX_SECONDS => return Err(ResultCode::Parameter),
        seconds => now.citrusleaf_seconds.saturating_add(seconds),
    };
    let changed = Some(void_time) != existing_void_time;
    if void_time != 0
        && changed
        && namespace.config.nsup_period == 0
        && !namespace.config.allow_ttl_without_nsup
    {
        return Err(ResultCode::Forbidden);
    }
    Ok(void_time)
}

/// The check every write makes before it reads the record: the namespace
/// takes writes (else 8, counted).
#[inline]
pub fn admit_write(namespace: &Namespace) -> Result<(), ResultCode> {
    if namespace.stop_writes() {
        namespace
            .stats
            .stop_writes_count
            .fetch_add(1, Ordering::Relaxed);
        return Err(ResultCode::OutOfSpace);
    }
    Ok(())
}

/// The id of set `name` for a record a write creates, the set created if
/// it is new; a namespace that has all the sets it can hold refuses a new
/// one with 4, as the reference does.
pub fn set_of_new_record(namespace: &Namespace, name: &[u8]) -> Result<u16, ResultCode> {
    namespace.sets.id_of(name).ok_or(ResultCode::Parameter)
}

/// Refuses (13, counted) a record or bin of `len` bytes above the
/// namespace's `max-record-size`.
pub fn check_record_size(namespace: &Namespace, len: usize) -> Result<(), ResultCode> {
    if len > namespace.config.max_record_size as usize {
        return Err(record_too_big(namespace));
    }
    Ok(())
}

/// Counts a record refused for its size; answers 13.
fn record_too_big(namespace: &Namespace) -> ResultCode {
    namespace
        .stats
        .fail_record_too_big
        .fetch_add(1, Ordering::Relaxed);
    ResultCode::RecordTooBig
}

/// Sets bin `name` of the working bins to a value an op computed. Checked
/// against `max-record-size` per op, not only for the whole record at the
/// end: ops that each grow a bin must not build a record many times the
/// limit under the lock.
fn set_bin<'a>(
    namespace: &Namespace,
    bins: &mut Vec<Bin<'a>>,
    name: &'a [u8],
    particle_type: u8,
    value: Vec<u8>,
) -> Result<(), ResultCode> {
    check_record_size(namespace, value.len())?;
    match find_bin(bins, name) {
        Some(index) => {
            bins[index].particle_type = particle_type;
            bins[index].value = Cow::Owned(value);
        }
        None => bins.push(Bin {
            name: Cow::Borrowed(name),
            particle_type,
            value: Cow::Owned(value),
        }),
    }
    Ok(())
}

/// The reply entry of an op that computes a value: the value, or (none)
/// a null entry under RESPOND_ALL_OPS.
fn push_result<'a>(
    responses: &mut Vec<ResponseEntry<'a>>,
    op: &Op<'a>,
    result: Option<(u8, Vec<u8>)>,
    respond_all: bool,
) {
    match result {
        Some((particle_type, value)) => responses.push(ResponseEntry {
            op_type: op.op_type,
            name: Cow::Borrowed(op.name),
            particle_type,
            value: Cow::Owned(value),
        }),
        None if respond_all => responses.push(null_entry(op)),
        None => {}
    }
}

/// Adds the reply bytes of `responses[*counted..]` to `so_far`; refuses
/// (13) past [`MAX_REPLY_BYTES`].
fn count_reply_bytes(
    responses: &[ResponseEntry<'_>],
    counted: &mut usize,
    so_far: usize,
) -> Result<usize, ResultCode> {
    let added: usize = responses[*counted..]
        .iter()
        .map(|entry| 8 + entry.name.len() + entry.value.len())
        .sum();
    *counted = responses.len();
    let total = so_far.saturating_add(added);
    if total > MAX_REPLY_BYTES {
        return Err(ResultCode::RecordTooBig);
    }
    Ok(total)
}

/// Writes an operate's reply: header (generation, void time) and the
/// values its ops answer.
fn write_operate_reply(
    out: &mut Vec<u8>,
    mode: Reply,
    generation: u16,
    void_time: u32,
    responses: &[OwnedEntry],
) {
    let reply = MsgHeader {
        generation: u32::from(generation),
        record_ttl: void_time,
        ..MsgHeader::default()
    };
    let mut writer = begin_reply(out, reply, mode);
    for entry in responses {
        writer.op(
            entry.op_type,
            entry.particle_type,
            &entry.name,
            &entry.value,
        );
    }
    writer.finish();
}

/// What a write leaves, decided under the lock.
enum WriteOutcome {
    Store {
        meta: RecordMeta,
        body: Vec<u8>,
        responses: Vec<OwnedEntry>,
    },
    Delete {
        responses: Vec<OwnedEntry>,
    },
}

/// A value to answer, owned (it outlives the borrowed working copy).
struct OwnedEntry {
    op_type: u8,
    name: Vec<u8>,
    particle_type: u8,
    value: Vec<u8>,
}

fn owned(entries: Vec<ResponseEntry<'_>>) -> Vec<OwnedEntry> {
    entries
        .into_iter()
        .map(|entry| OwnedEntry {
            op_type: entry.op_type,
            name: entry.name.into_owned(),
            particle_type: entry.particle_type,
            value: entry.value.into_owned(),
        })
        .collect()
}

/// The nil answer of an op under RESPOND_ALL_OPS.
fn null_entry<'a>(op: &Op<'a>) -> ResponseEntry<'a> {
    ResponseEntry {
        op_type: op.op_type,
        name: Cow::Borrowed(op.name),
        particle_type: ParticleType::Null as u8,
        value: Cow::Borrowed(&[]),
    }
}

/// A value an operate returns for one op.
struct ResponseEntry<'a> {
    op_type: u8,
    name: Cow<'a, [u8]>,
    particle_type: u8,
    value: Cow<'a, [u8]>,
}
