//! Single-record transactions: the read path, the write path (put, operate,
//! touch) and delete, executed to completion on the calling thread.
//!
//! A transaction takes its partition's lock once — a read lock to read, the
//! write lock to modify — and holds it until the record is decided, so every
//! operate is atomic on its record and there is no global lock anywhere.
//!
//! Semantics follow `shared/protocol/02-as-msg.md` §6-§9: generation checks,
//! record-exists actions, TTL encodings, send-key, respond-all-ops, and the
//! reference server's validation of op combinations. Every failure is
//! answered with the protocol's own result code.

use crate::filter::{self, Bins, RecordView};
use crate::namespace::Namespace;
use crate::Service;
use citrine_exp::{BinWrite, Expression};
use citrine_index::{IndexEntry, PartitionIndex, RecordMeta, Tombstone};
use citrine_record::{
    encode_body_reserving, float_from_wire, integer_from_wire, normalise_value, valid_bin_name,
    validate_value, Bin, BodyView,
};
use citrine_storage::{StorageError, StoreMeta, MEMORY_BODY_SPARE};
use citrine_types::{Digest, ParticleType, ResultCode, DIGEST_SIZE, SET_NAME_MAX};
use citrine_wire::msg::{
    field_type, info1, info2, info3, op_type, Message, MessageWriter, MsgHeader, Op, OpIter,
};
use std::borrow::Cow;
use std::sync::atomic::Ordering;

/// Largest reply a single-record command may build (the largest message
/// the clients read). Many read ops of one big bin, or big expression and
/// CDT results, could otherwise build replies of any size; past this the
/// command answers RECORD_TOO_BIG (13) instead.
pub const MAX_REPLY_BYTES: usize = 128 * 1024 * 1024;

/// Largest TTL a write may ask for: ten years.
pub const TTL_MAX_SECONDS: u32 = 315_360_000;
/// Record TTL encoding: never expire.
pub(crate) const TTL_NEVER_EXPIRE: u32 = 0xFFFF_FFFF;
/// Record TTL encoding: keep the record's current TTL.
pub(crate) const TTL_DONT_UPDATE: u32 = 0xFFFF_FFFE;

/// The time a transaction runs at.
#[derive(Clone, Copy, Debug)]
pub struct Now {
    pub unix_ms: u64,
    pub citrusleaf_seconds: u32,
}

impl Now {
    pub fn from_unix_ms(unix_ms: u64) -> Now {
        Now {
            unix_ms,
            citrusleaf_seconds: citrine_types::citrusleaf_epoch_seconds(unix_ms),
        }
    }
}

/// Executes one single-record AS_MSG request (it has a DIGEST field and no
/// `info1 BATCH`; `Service` sends batches and scans elsewhere) and writes
/// exactly one reply frame to `out`.
///
/// In a cluster (more than one member and a fabric installed) the request
/// is routed by [`crate::replication::route`]: `body` (the request's AS_MSG
/// body) is forwarded when another node masters the record, and `hop` says
/// how it came here (and its deadline, once a node fixed it). The returned work, if any, must
/// be completed ([`crate::Service::complete_remote`]) before the reply in
/// `out` is final. A node alone returns `None` and allocates nothing.
pub(crate) fn execute(
    service: &Service,
    message: &Message<'_>,
    body: &[u8],
    hop: crate::replication::Hop,
    resolved: bool,
    out: &mut Vec<u8>,
) -> Option<Box<crate::replication::Remote>> {
    let namespace_name = message.field(field_type::NAMESPACE);
    let Some(namespace) = namespace_name.and_then(|name| service.namespace(name)) else {
        write_result(out, ResultCode::Namespace);
        return None;
    };
    let Some(digest_bytes) = message.field(field_type::DIGEST) else {
        write_result(out, ResultCode::Parameter);
        return None;
    };
    // A filter is parsed once, before routing; a malformed one is refused
    // here, wherever the record lives.
    let filter = match message.field(field_type::FILTER_EXPRESSION) {
        Some(bytes) => match filter::parse(bytes) {
            Ok(expression) => Some(expression),
            Err(code) => {
                let udf = message.field(field_type::UDF_FILENAME).is_some();
                count_failure(namespace, &message.header, code, udf);
                write_result(out, code);
                return None;
            }
        },
        None => None,
    };
    let udf = match crate::udf::call_of(service.udf_registry(), message) {
        Ok(udf) => udf,
        Err(code) => {
            count_failure(namespace, &message.header, code, true);
            write_result(out, code);
            return None;
        }
    };
    let is_udf = udf.is_some();
    match prepare(message, digest_bytes, filter.as_ref(), udf) {
        Ok(request) if service.routes() => {
            crate::replication::route(service, namespace, &request, body, hop, resolved, out)
        }
        Ok(request) => {
            perform(namespace, &request, service.now(), out);
            None
        }
        Err(code) => {
            count_failure(namespace, &message.header, code, is_udf);
            write_result(out, code);
            None
        }
    }
}

/// Runs one checked request — read, write/operate/touch or delete, as its
/// header says — and writes its one reply (a frame, or a batch row message)
/// to `out`, including the error reply when it fails.
pub(crate) fn perform(namespace: &Namespace, request: &Request<'_>, now: Now, out: &mut Vec<u8>) {
    let header = &request.header;
    let outcome = if let Some(call) = &request.udf {
        crate::udf::apply(namespace, request, call, now, out)
    } else if header.info2 & info2::WRITE != 0 {
        if header.info2 & info2::DELETE != 0 {
            delete(namespace, request, now, out)
        } else {
            write(namespace, request, now, out)
        }
    } else if header.info1 & info1::READ != 0 {
        read(namespace, request, now, out)
    } else {
        Err(ResultCode::Parameter)
    };
    if let Err(code) = outcome {
        count_failure(namespace, header, code, request.udf.is_some());
        write_error(out, code, request.reply);
    }
}

/// How a transaction's reply is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// A complete frame (proto header included): a single-record request.
    Frame,
    /// A bare AS_MSG inside a batch response frame; `transaction_ttl`
    /// carries the row's batch index.
    Row(u32),
}

/// Starts the reply message for `header` in the form `reply` asks for.
#[inline]
pub(crate) fn begin_reply<'b>(
    out: &'b mut Vec<u8>,
    header: MsgHeader,
    reply: Reply,
) -> MessageWriter<'b> {
    match reply {
        Reply::Frame => MessageWriter::begin(out, &header),
        Reply::Row(index) => MessageWriter::begin_bare(
            out,
            &MsgHeader {
                transaction_ttl: index,
                ..header
            },
        ),
    }
}

/// Writes a header-only error reply carrying `code`.
pub(crate) fn write_error(out: &mut Vec<u8>, code: ResultCode, reply: Reply) {
    let header = MsgHeader {
        result_code: code.code(),
        ..MsgHeader::default()
    };
    begin_reply(out, header, reply).finish();
}

/// The ops of a request: a decoded message's, or a batch row's raw op bytes
/// (validated by the batch parser with the same checks as `Message::decode`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Ops<'m> {
    Message(Message<'m>),
    Raw(&'m [u8]),
}

impl<'m> Ops<'m> {
    /// Iterates the ops in wire order.
    #[inline]
    pub(crate) fn iter(&self) -> OpsIter<'m> {
        match self {
            Ops::Message(message) => OpsIter::Message(message.ops()),
            Ops::Raw(bytes) => OpsIter::Raw(bytes),
        }
    }
}

/// Iterator over [`Ops`].
pub(crate) enum OpsIter<'m> {
    Message(OpIter<'m>),
    Raw(&'m [u8]),
}

impl<'m> Iterator for OpsIter<'m> {
    type Item = Op<'m>;
    #[inline]
    fn next(&mut self) -> Option<Op<'m>> {
        match self {
            OpsIter::Message(ops) => ops.next(),
            OpsIter::Raw(rest) => {
                let (op, used) = citrine_wire::msg::split_op(rest)?;
                *rest = rest.get(used..)?;
                Some(op)
            }
        }
    }
}

/// The checked pieces of a single-record request (or of one batch row).
pub(crate) struct Request<'m> {
    pub header: MsgHeader,
    pub digest: Digest,
    pub set: &'m [u8],
    pub key: Option<(u8, &'m [u8])>,
    pub ops: Ops<'m>,
    pub reply: Reply,
    /// The filter expression (field 43) the record must pass, if any.
    pub filter: Option<&'m Expression>,
    /// The record UDF to run instead of ops (fields 30-32), if any.
    pub udf: Option<crate::udf::UdfCall<'m>>,
}

fn prepare<'m>(
    message: &Message<'m>,
    digest_bytes: &[u8],
    filter: Option<&'m Expression>,
    udf: Option<crate::udf::UdfCall<'m>>,
) -> Result<Request<'m>, ResultCode> {
    if message.field(field_type::TXN_ID).is_some() {
        return Err(ResultCode::EnterpriseOnly);
    }
    let digest: [u8; DIGEST_SIZE] = digest_bytes.try_into().map_err(|_| ResultCode::Parameter)?;
    let set = message.field(field_type::SET).unwrap_or_default();
    if set.len() > SET_NAME_MAX || set.contains(&0) {
        return Err(ResultCode::Parameter);
    }
    let key = match message.field(field_type::KEY) {
        Some(field) => Some(parse_key(field)?),
        None => None,
    };
    Ok(Request {
        header: message.header,
        digest: Digest(digest),
        set,
        key,
        ops: Ops::Message(*message),
        reply: Reply::Frame,
        filter,
        udf,
    })
}

pub(crate) fn parse_key(field: &[u8]) -> Result<(u8, &[u8]), ResultCode> {
    let (&particle_type, bytes) = field.split_first().ok_or(ResultCode::Parameter)?;
    let valid = match ParticleType::from_u8(particle_type) {
        Some(ParticleType::Integer) | Some(ParticleType::Float) => bytes.len() == 8,
        Some(ParticleType::String) | Some(ParticleType::Blob) => true,
        _ => false,
    };
    if valid {
        Ok((particle_type, bytes))
    } else {
        Err(ResultCode::Parameter)
    }
}

/// True when the index entry is a live record (not expired, not truncated).
#[inline]
pub(crate) fn is_live(namespace: &Namespace, meta: &RecordMeta, now: Now) -> bool {
    !meta.is_expired(now.citrusleaf_seconds)
        && !namespace.is_truncated(meta.set_id, meta.last_update_ms)
}

fn read(
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

/// The read itself: the record as stored, answered into `out`.
fn read_record(
    namespace: &Namespace,
    request: &Request<'_>,
    now: Now,
    out: &mut Vec<u8>,
) -> Result<(), ResultCode> {
    let header = &request.header;
    // Validate ops before touching the index.
    let mut get_all = header.info1 & info1::GET_ALL != 0;
    let respond_all = header.info2 & info2::RESPOND_ALL_OPS != 0;
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
            op_type::WRITE
            | op_type::CDT_MODIFY
            | op_type::INCR
            | op_type::EXP_MODIFY
            | op_type::APPEND
            | op_type::PREPEND
            | op_type::TOUCH
            | op_type::BITS_MODIFY
            | op_type::DELETE_ALL
            | op_type::HLL_MODIFY => return Err(ResultCode::Parameter),
            _ => return Err(ResultCode::Parameter),
        }
    }
    // As the reference read path: GET_NO_BINS answers the header alone,
    // whatever else is asked; GET_ALL returns every bin once, whatever read
    // ops accompany it (the "one read-all op" rules are the write path's).
    let header_only = header.info1 & info1::GET_NO_BINS != 0;
    get_all &= !header_only;

    let partition = namespace.index.partition(request.digest.partition()).read();
    let found = partition
        .get(&request.digest)
        .map(|entry| (entry, entry.meta()));
    let (entry, meta) = match found {
        Some((entry, meta)) if is_live(namespace, &meta, now) => (entry, meta),
        _ => {
            namespace
                .stats
                .client_read_not_found
                .fetch_add(1, Ordering::Relaxed);
            return Err(ResultCode::NotFound);
        }
    };
    let body = namespace
        .storage
        .read(&entry.location)
        .map_err(|_| ResultCode::ServerError)?;
    let view = BodyView::parse(&body).map_err(|_| ResultCode::ServerError)?;
    if let (Some(sent), Some(stored)) = (request.key, view.key()) {
        if sent != stored {
            return Err(ResultCode::KeyMismatch);
        }
    }
    if header.n_ops == 0 && !get_all && !header_only {
        // Neither bins, nor all of them, nor the header alone (a select of
        // no bins): the reference refuses it once the record is found.
        return Err(ResultCode::Parameter);
    }
    let record = RecordView::stored(
        namespace,
        &request.digest.0,
        &view,
        meta,
        entry.location.size() as u64,
    );
    if let Some(expression) = request.filter {
        filter::check(expression, &record, now)?;
    }
    // CDT, bit, HLL and expression reads are evaluated before the reply
    // starts, so an error leaves nothing half-written.
    let mut cdt_results = Vec::new();
    let mut computed_bytes = 0usize;
    if !get_all && !header_only {
        for op in request.ops.iter() {
            if let Some((family, false)) = bin_op_family(op.op_type) {
                let bin = view.bin(op.name);
                let current = bin
                    .as_ref()
                    .map(|bin| (bin.particle_type, bin.value.as_ref()));
                let outcome =
                    if family == citrine_cdt::Family::Cdt && citrine_cdt::path::is_path(op.value) {
                        citrine_exp::path_op(op.value, current, false, &record, now.unix_ms)?
                    } else {
                        citrine_cdt::apply(family, op.value, current, false)
                            .map_err(citrine_cdt::CdtError::result_code)?
                    };
                computed_bytes += outcome.result.as_ref().map_or(0, |(_, v)| v.len());
                cdt_results.push(outcome.result);
            } else if op.op_type == op_type::EXP_READ {
                let result = citrine_exp::read_op(op.value, &record, now.unix_ms)
                    .map_err(citrine_exp::ExpError::result_code)?;
                computed_bytes += result.as_ref().map_or(0, |(_, v)| v.len());
                cdt_results.push(result);
            }
            if computed_bytes > MAX_REPLY_BYTES {
                return Err(ResultCode::RecordTooBig);
            }
        }
    }
    let mut cdt_results = cdt_results.into_iter();
    let reply = MsgHeader {
        generation: u32::from(meta.generation),
        record_ttl: meta.void_time,
        ..MsgHeader::default()
    };
    let mut writer = begin_reply(out, reply, request.reply);
    if request.reply == Reply::Frame {
        // Batch rows carry no key (as the reference server's rows).
        if let Some((particle_type, bytes)) = view.key() {
            write_key_field(&mut writer, particle_type, bytes);
        }
    }
    if !header_only {
        if get_all {
            for bin in view.bins() {
                writer.op(op_type::READ, bin.particle_type, &bin.name, &bin.value);
            }
        } else {
            for op in request.ops.iter() {
                if op.name.is_empty() {
                    if get_all {
                        for bin in view.bins() {
                            writer.op(op_type::READ, bin.particle_type, &bin.name, &bin.value);
                        }
                    }
                    continue;
                }
                if bin_op_family(op.op_type).is_some() || op.op_type == op_type::EXP_READ {
                    match cdt_results.next().flatten() {
                        Some((particle_type, value)) => {
                            writer.op(op.op_type, particle_type, op.name, &value);
                        }
                        None if respond_all => {
                            writer.op(op.op_type, ParticleType::Null as u8, op.name, &[]);
                        }
                        None => {}
                    }
                    continue;
                }
                match view.bin(op.name) {
                    Some(bin) => {
                        writer.op(op.op_type, bin.particle_type, &bin.name, &bin.value);
                    }
                    None if respond_all => {
                        writer.op(op.op_type, ParticleType::Null as u8, op.name, &[]);
                    }
                    None => {}
                }
                if writer.written() > MAX_REPLY_BYTES {
                    // Many reads of big bins: refuse before it grows further.
                    writer.abandon();
                    return Err(ResultCode::RecordTooBig);
                }
            }
        }
    }
    writer.finish();
    namespace
        .stats
        .client_read_success
        .fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// The family of a bin op that `citrine_cdt::apply` evaluates (list/map,
/// bits, HLL), and whether the op type is the modifying one.
pub(crate) fn bin_op_family(op_type: u8) -> Option<(citrine_cdt::Family, bool)> {
    use citrine_cdt::Family;
    match op_type {
        op_type::CDT_READ => Some((Family::Cdt, false)),
        op_type::CDT_MODIFY => Some((Family::Cdt, true)),
        op_type::BITS_READ => Some((Family::Bits, false)),
        op_type::BITS_MODIFY => Some((Family::Bits, true)),
        op_type::HLL_READ => Some((Family::Hll, false)),
        op_type::HLL_MODIFY => Some((Family::Hll, true)),
        _ => None,
    }
}

fn write_key_field(writer: &mut MessageWriter<'_>, particle_type: u8, bytes: &[u8]) {
    let mut field = Vec::with_capacity(1 + bytes.len());
    field.push(particle_type);
    field.extend_from_slice(bytes);
    writer.field(field_type::KEY, &field);
}

/// Checks the generation condition of a write or delete.
pub(crate) fn check_generation(header: &MsgHeader, current: u16) -> Result<(), ResultCode> {
    let expected = header.generation;
    if header.info2 & info2::GENERATION != 0 && expected != u32::from(current) {
        return Err(ResultCode::Generation);
    }
    if header.info2 & info2::GENERATION_GT != 0 && expected <= u32::from(current) {
        return Err(ResultCode::Generation);
    }
    Ok(())
}

fn delete(
    namespace: &Namespace,
    request: &Request<'_>,
    now: Now,
    out: &mut Vec<u8>,
) -> Result<(), ResultCode> {
    let mut partition = namespace
        .index
        .partition(request.digest.partition())
        .write();
    let live = partition
        .get(&request.digest)
        .map(|entry| (entry, entry.meta()))
        .filter(|(_, meta)| is_live(namespace, meta, now));
    let Some((entry, meta)) = live else {
        namespace
            .stats
            .client_delete_not_found
            .fetch_add(1, Ordering::Relaxed);
        return Err(ResultCode::NotFound);
    };
    check_generation(&request.header, meta.generation)?;
    if let Some(expression) = request.filter {
        let body = namespace
            .storage
            .read(&entry.location)
            .map_err(|_| ResultCode::ServerError)?;
        let view = BodyView::parse(&body).map_err(|_| ResultCode::ServerError)?;
        let size = entry.location.size() as u64;
        let record = RecordView::stored(namespace, &request.digest.0, &view, meta, size);
        filter::check(expression, &record, now)?;
    }
    write_tombstone(namespace, &request.digest, &meta, now)?;
    let durable = is_durable_delete(&request.header);
    remove_deleted(
        namespace,
        &mut partition,
        &request.digest,
        now.unix_ms,
        durable,
    );
    drop(partition);
    namespace
        .stats
        .client_delete_success
        .fetch_add(1, Ordering::Relaxed);
    begin_reply(out, MsgHeader::default(), request.reply).finish();
    Ok(())
}

/// Maps a storage failure to the protocol's result code. A device engine
/// in its failed state (a device write or sync failed) refuses writes with
/// 1, SERVER_ERROR: the reference stops the process there instead, and 1
/// is its code for a failure of the server that is neither in doubt nor
/// worth a retry (the choice is explained in `citrine_storage::device`).
pub(crate) fn storage_result(error: StorageError) -> ResultCode {
    match error {
        StorageError::OutOfSpace => ResultCode::OutOfSpace,
        StorageError::TooBig => ResultCode::RecordTooBig,
        StorageError::DeviceFailed => ResultCode::ServerError,
        StorageError::Corrupt(_) | StorageError::Io(_) => ResultCode::ServerError,
    }
}

/// Makes the removal of `digest` durable before its entry goes: the device
/// engine writes a tombstone so no older copy returns after a restart (the
/// memory engine has nothing to do).
pub(crate) fn write_tombstone(
    namespace: &Namespace,
    digest: &Digest,
    meta: &RecordMeta,
    now: Now,
) -> Result<(), ResultCode> {
    if namespace.storage.device().is_none() {
        return Ok(());
    }
    let set_name = namespace.sets.name(meta.set_id).unwrap_or_default();
    let store = StoreMeta {
        generation: RecordMeta::next_generation(meta.generation),
        life: meta.life,
        void_time: 0,
        last_update_ms: now.unix_ms,
        set_name: &set_name,
    };
    namespace
        .storage
        .write_tombstone(digest, &store)
        .map_err(storage_result)
}

/// Removes an expired entry: the engine keeps an expired copy as its own
/// tombstone (its void time proves it dead after a restart too).
pub(crate) fn retire_entry(namespace: &Namespace, digest: &Digest, entry: IndexEntry) {
    let size = entry.location.size() as i64;
    let set_stats = namespace.sets.stats(entry.meta().set_id);
    set_stats.objects.fetch_sub(1, Ordering::Relaxed);
    set_stats.data_used_bytes.fetch_sub(size, Ordering::Relaxed);
    namespace.stats.objects.fetch_sub(1, Ordering::Relaxed);
    namespace.storage.retire(digest, entry.location);
}

/// True when a client asked for a durable delete (info2 DURABLE_DELETE):
/// the record written after it continues the deleted copy's life and
/// generation; after any other delete it starts the next life at
/// generation 1, as after the reference's (non-durable) deletes.
pub(crate) fn is_durable_delete(header: &MsgHeader) -> bool {
    header.info2 & info2::DURABLE_DELETE != 0
}

/// Removes a deleted record's entry (if any) and leaves its tombstone in
/// the index (see `citrine_index`): generation the deleted copy's next,
/// its life, last-update time `lut_ms`, and whether the delete was
/// durable.
pub(crate) fn remove_deleted(
    namespace: &Namespace,
    partition: &mut PartitionIndex,
    digest: &Digest,
    lut_ms: u64,
    durable: bool,
) {
    if let Some(entry) = partition.remove(digest) {
        crate::sindex::unindex(namespace, digest, &entry);
        let meta = entry.meta();
        partition.set_tombstone(
            *digest,
            Tombstone {
                generation: RecordMeta::next_generation(meta.generation),
                life: meta.life,
                durable,
                last_update_ms: lut_ms,
                set_id: meta.set_id,
            },
        );
        drop_entry(namespace, entry);
    }
}

/// Releases a removed entry's storage and updates the counters.
pub(crate) fn drop_entry(namespace: &Namespace, entry: IndexEntry) {
    let size = entry.location.size() as i64;
    let set_stats = namespace.sets.stats(entry.meta().set_id);
    set_stats.objects.fetch_sub(1, Ordering::Relaxed);
    set_stats.data_used_bytes.fetch_sub(size, Ordering::Relaxed);
    namespace.stats.objects.fetch_sub(1, Ordering::Relaxed);
    namespace.storage.release(entry.location);
}

/// A value an operate returns for one op.
struct ResponseEntry<'a> {
    op_type: u8,
    name: Cow<'a, [u8]>,
    particle_type: u8,
    value: Cow<'a, [u8]>,
}

/// Validates the ops of a write-path request before anything is decided.
fn validate_write_ops(request: &Request<'_>) -> Result<(), ResultCode> {
    let header = &request.header;
    if header.n_ops == 0 {
        return Err(ResultCode::Parameter);
    }
    let replaces = header.info3 & (info3::CREATE_OR_REPLACE | info3::REPLACE_ONLY) != 0;
    let respond_all = header.info2 & info2::RESPOND_ALL_OPS != 0;
    let get_all = header.info1 & info1::GET_ALL != 0;
    let mut read_all_ops = 0;
    let mut response_ops = 0;
    for op in request.ops.iter() {
        match op.op_type {
            op_type::READ => {
                if header.info1 & info1::READ == 0 {
                    return Err(ResultCode::Parameter);
                }
                if op.name.is_empty() {
                    if get_all {
                        read_all_ops += 1;
                    }
                } else {
                    if op.name.len() > citrine_types::BIN_NAME_MAX {
                        return Err(ResultCode::BinName);
                    }
                    response_ops += 1;
                }
            }
            op_type::WRITE | op_type::INCR | op_type::APPEND | op_type::PREPEND => {
                if !valid_bin_name(op.name) {
                    return Err(ResultCode::BinName);
                }
                validate_value(op.particle_type, op.value).map_err(|_| ResultCode::Parameter)?;
                check_geojson(op.particle_type, op.value)?;
                if op.particle_type == ParticleType::Hll as u8
                    && !citrine_cdt::hll::valid_particle(op.value)
                {
                    return Err(ResultCode::Parameter);
                }
                if op.op_type != op_type::WRITE && op.particle_type == ParticleType::Null as u8 {
                    return Err(ResultCode::Parameter);
                }
                let deletes_bin =
                    op.op_type == op_type::WRITE && op.particle_type == ParticleType::Null as u8;
                if replaces && (op.op_type != op_type::WRITE || deletes_bin) {
                    return Err(ResultCode::Parameter);
                }
            }
            op_type::TOUCH | op_type::DELETE_ALL => {
                if replaces {
                    return Err(ResultCode::Parameter);
                }
            }
            op_type::CDT_READ
            | op_type::CDT_MODIFY
            | op_type::BITS_READ
            | op_type::BITS_MODIFY
            | op_type::HLL_READ
            | op_type::HLL_MODIFY => {
                if !valid_bin_name(op.name) {
                    return Err(ResultCode::BinName);
                }
                if replaces {
                    return Err(ResultCode::Parameter);
                }
                response_ops += 1;
            }
            op_type::EXP_READ | op_type::EXP_MODIFY => {
                if !valid_bin_name(op.name) {
                    return Err(ResultCode::BinName);
                }
                if replaces {
                    return Err(ResultCode::Parameter);
                }
                response_ops += 1;
            }
            _ => return Err(ResultCode::Parameter),
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

/// Computes a record's void time for a write.
pub(crate) fn void_time_for(
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

fn find_bin(bins: &[Bin<'_>], name: &[u8]) -> Option<usize> {
    bins.iter().position(|bin| bin.name.as_ref() == name)
}

/// Applies one modify op to the working bins.
fn apply_modify<'a>(bins: &mut Vec<Bin<'a>>, op: &Op<'a>) -> Result<(), ResultCode> {
    let position = find_bin(bins, op.name);
    match op.op_type {
        op_type::WRITE => {
            if op.particle_type == ParticleType::Null as u8 {
                if let Some(index) = position {
                    bins.remove(index);
                }
                return Ok(());
            }
            let value = operand_value(op)?;
            match position {
                Some(index) => {
                    bins[index].particle_type = op.particle_type;
                    bins[index].value = value;
                }
                None => bins.push(Bin {
                    name: Cow::Borrowed(op.name),
                    particle_type: op.particle_type,
                    value,
                }),
            }
        }
        op_type::INCR => {
            let integer = ParticleType::Integer as u8;
            let float = ParticleType::Float as u8;
            let new_value: Vec<u8> = match (position.map(|index| &bins[index]), op.particle_type) {
                // As the reference: an op on a missing bin makes the bin
                // from its operand, whatever the operand's type (an add of
                // a string creates a string bin).
                (None, _) => operand_value(op)?.into_owned(),
                (Some(bin), particle) if particle == integer && bin.particle_type == integer => {
                    let current =
                        integer_from_wire(&bin.value).ok_or(ResultCode::IncompatibleType)?;
                    let delta = integer_from_wire(op.value).ok_or(ResultCode::Parameter)?;
                    current.wrapping_add(delta).to_be_bytes().to_vec()
                }
                (Some(bin), particle) if particle == float && bin.particle_type == float => {
                    let current =
                        float_from_wire(&bin.value).ok_or(ResultCode::IncompatibleType)?;
                    let delta = float_from_wire(op.value).ok_or(ResultCode::Parameter)?;
                    (current + delta).to_bits().to_be_bytes().to_vec()
                }
                (Some(_), _) => return Err(ResultCode::IncompatibleType),
            };
            match position {
                Some(index) => bins[index].value = Cow::Owned(new_value),
                None => bins.push(Bin {
                    name: Cow::Borrowed(op.name),
                    particle_type: op.particle_type,
                    value: Cow::Owned(new_value),
                }),
            }
        }
        op_type::APPEND | op_type::PREPEND => {
            let string = ParticleType::String as u8;
            let kind = ParticleType::from_u8(op.particle_type);
            let appendable =
                op.particle_type == string || kind.is_some_and(ParticleType::is_blob_like);
            match position {
                // As the reference (and as INCR): an append or prepend to a
                // missing bin makes the bin from its operand, whatever the
                // operand's type.
                None => bins.push(Bin {
                    name: Cow::Borrowed(op.name),
                    particle_type: op.particle_type,
                    value: operand_value(op)?,
                }),
                Some(index) => {
                    let bin = &mut bins[index];
                    if !appendable || bin.particle_type != op.particle_type {
                        return Err(ResultCode::IncompatibleType);
                    }
                    let mut joined = Vec::with_capacity(bin.value.len() + op.value.len());
                    if op.op_type == op_type::APPEND {
                        joined.extend_from_slice(&bin.value);
                        joined.extend_from_slice(op.value);
                    } else {
                        joined.extend_from_slice(op.value);
                        joined.extend_from_slice(&bin.value);
                    }
                    bin.value = Cow::Owned(joined);
                }
            }
        }
        _ => return Err(ResultCode::Parameter),
    }
    Ok(())
}

/// The value a WRITE op stores, or that an INCR, APPEND or PREPEND on a
/// missing bin makes the bin from: lists and maps in their stored form,
/// other particles normalised.
fn operand_value<'a>(op: &Op<'a>) -> Result<Cow<'a, [u8]>, ResultCode> {
    if op.particle_type == ParticleType::List as u8 || op.particle_type == ParticleType::Map as u8 {
        collection_value(op.particle_type, op.value)
    } else {
        Ok(normalise_value(op.particle_type, op.value))
    }
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

/// A list or map bin as a WRITE sets it: well-formed msgpack of the
/// particle's kind, nested no deeper than a stored value may be (else 4),
/// with its nested ordered lists and key-ordered maps put in canonical
/// order (the CDT ops rely on it); stored as sent when it already is. The
/// bin's own collection, when it says it is ordered, must be in order (a
/// key-ordered map's keys ascending and unique), else 4, as the reference
/// refuses it (the official C client's suite writes such bins).
fn collection_value(particle_type: u8, bytes: &[u8]) -> Result<Cow<'_, [u8]>, ResultCode> {
    use citrine_cdt::value::{self, Value};
    use std::cmp::Ordering;
    let mut decoded = value::decode_stored(bytes).map_err(|_| ResultCode::Parameter)?;
    let in_order = match &decoded {
        Value::List(list) if particle_type == ParticleType::List as u8 => {
            !list.is_ordered()
                || list
                    .items
                    .windows(2)
                    .all(|pair| value::compare(&pair[0], &pair[1]) != Ordering::Greater)
        }
        Value::Map(map) if particle_type == ParticleType::Map as u8 => {
            !map.is_key_ordered()
                || map
                    .entries
                    .windows(2)
                    .all(|pair| value::compare(&pair[0].0, &pair[1].0) == Ordering::Less)
        }
        // Not the particle's kind.
        _ => false,
    };
    // A map may hold a key once, at any depth (the reference refuses
    // duplicates in a written map, ordered or not).
    if !in_order || value::has_duplicate_keys(&decoded) {
        return Err(ResultCode::Parameter);
    }
    // Every map is stored in key order (see `value::canonicalize`); a
    // key-ordered map is also re-packed at its smallest (a client may send
    // integers wider than they need), as the reference stores it.
    let repack = matches!(&decoded, Value::Map(map) if map.is_key_ordered());
    if value::canonicalize(&mut decoded) || repack {
        Ok(Cow::Owned(value::to_bytes(&decoded)))
    } else {
        Ok(Cow::Borrowed(bytes))
    }
}

/// A GeoJSON bin value must be a shape the server can index and query
/// (`Point`, `Polygon`, `MultiPolygon`, `AeroCircle`, or a `Feature` of
/// one): anything else is refused with `GeoInvalidGeojson`, as the
/// reference refuses it, instead of being stored and never matching.
pub(crate) fn check_geojson(particle_type: u8, value: &[u8]) -> Result<(), ResultCode> {
    if particle_type != ParticleType::GeoJson as u8 {
        return Ok(());
    }
    let valid = citrine_record::geojson_text(value)
        .and_then(citrine_geo::Shape::parse)
        .is_some();
    if valid {
        Ok(())
    } else {
        Err(ResultCode::GeoInvalidGeojson)
    }
}

/// Refuses (13, counted) a record or bin of `len` bytes above the
/// namespace's `max-record-size`.
pub(crate) fn check_record_size(namespace: &Namespace, len: usize) -> Result<(), ResultCode> {
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

fn write(
    namespace: &Namespace,
    request: &Request<'_>,
    now: Now,
    out: &mut Vec<u8>,
) -> Result<(), ResultCode> {
    validate_write_ops(request)?;
    let header = &request.header;
    let set_id = admit_write(namespace, request)?;
    let respond_all = header.info2 & info2::RESPOND_ALL_OPS != 0;
    let get_all = header.info1 & info1::GET_ALL != 0;

    let mut partition = namespace
        .index
        .partition(request.digest.partition())
        .write();
    let (outcome, existed_entry) = {
        let current = partition.get(&request.digest);
        // The live record and its metadata (unpacked once).
        let live = current
            .map(|entry| (entry, entry.meta()))
            .filter(|(_, meta)| is_live(namespace, meta, now));
        let live_meta = live.map(|(_, meta)| meta);
        let live = live.map(|(entry, _)| entry);
        let body = match live {
            Some(entry) => Some(
                namespace
                    .storage
                    .read(&entry.location)
                    .map_err(|_| ResultCode::ServerError)?,
            ),
            None => None,
        };
        let view = match &body {
            Some(bytes) => Some(BodyView::parse(bytes).map_err(|_| ResultCode::ServerError)?),
            None => None,
        };
        // Record-exists action and generation.
        match live_meta {
            Some(meta) => {
                if header.info2 & info2::CREATE_ONLY != 0 {
                    return Err(ResultCode::RecordExists);
                }
                check_generation(header, meta.generation)?;
            }
            None => {
                // A touch needs the record: as the reference, 2 before the
                // generation check and any other op's error.
                let touches = request.ops.iter().any(|op| op.op_type == op_type::TOUCH);
                if touches || header.info3 & (info3::UPDATE_ONLY | info3::REPLACE_ONLY) != 0 {
                    return Err(ResultCode::NotFound);
                }
                if header.info2 & info2::GENERATION != 0 && header.generation != 0 {
                    return Err(ResultCode::Generation);
                }
            }
        }
        let stored_key = view.as_ref().and_then(BodyView::key);
        if let (Some(sent), Some(stored)) = (request.key, stored_key) {
            if sent != stored {
                return Err(ResultCode::KeyMismatch);
            }
        }
        // A filter applies to the record as it is; a write that creates
        // the record has nothing to filter (as the reference).
        let stored_size = live.map_or(0, |entry| entry.location.size() as u64);
        if let (Some(expression), Some(view), Some(meta)) = (request.filter, &view, live_meta) {
            let record = RecordView::stored(namespace, &request.digest.0, view, meta, stored_size);
            filter::check(expression, &record, now)?;
        }
        let replaces = header.info3 & (info3::CREATE_OR_REPLACE | info3::REPLACE_ONLY) != 0;
        // One allocation for the working bins: room for every stored bin and
        // one new bin per op.
        let stored_bins = match (&view, replaces) {
            (Some(view), false) => view.bin_count(),
            _ => 0,
        };
        let mut bins: Vec<Bin<'_>> = Vec::with_capacity(stored_bins + usize::from(header.n_ops));
        if let (Some(view), false) = (&view, replaces) {
            bins.extend(view.bins());
        }
        let mut responses: Vec<ResponseEntry<'_>> = Vec::new();
        let mut record_deleted = false;
        // Reply bytes of the responses so far (checked before each op and
        // after the last: see MAX_REPLY_BYTES).
        let mut reply_bytes = 0usize;
        let mut counted = 0usize;
        for op in request.ops.iter() {
            reply_bytes = count_reply_bytes(&responses, &mut counted, reply_bytes)?;
            match op.op_type {
                op_type::READ => {
                    // A nameless read is "all bins" only under GET_ALL; a
                    // header read (NOBINDATA) names the bin "" like any
                    // other, so under RESPOND_ALL_OPS it holds its slot
                    // with a nil, as the reference's write path answers.
                    if op.name.is_empty() && get_all {
                        for bin in &bins {
                            responses.push(ResponseEntry {
                                op_type: op_type::READ,
                                name: bin.name.clone(),
                                particle_type: bin.particle_type,
                                value: bin.value.clone(),
                            });
                        }
                        continue;
                    }
                    match find_bin(&bins, op.name) {
                        Some(index) => responses.push(ResponseEntry {
                            op_type: op.op_type,
                            name: Cow::Borrowed(op.name),
                            particle_type: bins[index].particle_type,
                            value: bins[index].value.clone(),
                        }),
                        None if respond_all => responses.push(null_entry(&op)),
                        None => {}
                    }
                }
                op_type::TOUCH => {
                    if live.is_none() || record_deleted {
                        return Err(ResultCode::NotFound);
                    }
                }
                op_type::DELETE_ALL => {
                    // On a missing record this deletes nothing: the ops
                    // after it may still create the record (a delete left
                    // alone answers NOT_FOUND below, as nothing is stored).
                    bins.clear();
                    record_deleted = true;
                    if respond_all {
                        responses.push(null_entry(&op));
                    }
                }
                op_type::CDT_READ
                | op_type::CDT_MODIFY
                | op_type::BITS_READ
                | op_type::BITS_MODIFY
                | op_type::HLL_READ
                | op_type::HLL_MODIFY => {
                    let (family, modify) =
                        bin_op_family(op.op_type).ok_or(ResultCode::Parameter)?;
                    let current = find_bin(&bins, op.name)
                        .map(|i| (bins[i].particle_type, bins[i].value.as_ref()));
                    let limit = u64::from(namespace.config.max_record_size);
                    let outcome = if family == citrine_cdt::Family::Cdt
                        && citrine_cdt::path::is_path(op.value)
                    {
                        // A path's filters and modify expression may read
                        // the record as it is at this op.
                        let record = RecordView::new(
                            namespace,
                            &request.digest.0,
                            Bins::Working(&bins),
                            stored_key.or(request.key),
                            live_meta.filter(|_| !record_deleted),
                            stored_size,
                        );
                        citrine_exp::path_op(op.value, current, modify, &record, now.unix_ms)?
                    } else {
                        citrine_cdt::apply_within(family, op.value, current, modify, limit)
                            .map_err(|error| match error {
                                // Refused before it was built: counted as the
                                // record-size check counts it.
                                citrine_cdt::CdtError::TooBig => record_too_big(namespace),
                                error => error.result_code(),
                            })?
                    };
                    if let Some((particle_type, value)) = outcome.bin {
                        set_bin(namespace, &mut bins, op.name, particle_type, value)?;
                    }
                    push_result(&mut responses, &op, outcome.result, respond_all);
                }
                op_type::EXP_READ | op_type::EXP_MODIFY => {
                    let stored_key = stored_key.or(request.key);
                    let record = RecordView::new(
                        namespace,
                        &request.digest.0,
                        Bins::Working(&bins),
                        stored_key,
                        live_meta.filter(|_| !record_deleted),
                        stored_size,
                    );
                    if op.op_type == op_type::EXP_READ {
                        let result = citrine_exp::read_op(op.value, &record, now.unix_ms)
                            .map_err(citrine_exp::ExpError::result_code)?;
                        push_result(&mut responses, &op, result, respond_all);
                        continue;
                    }
                    let change = citrine_exp::modify_op(op.value, op.name, &record, now.unix_ms)
                        .map_err(citrine_exp::ExpError::result_code)?;
                    match change {
                        BinWrite::Store(particle_type, value) => {
                            set_bin(namespace, &mut bins, op.name, particle_type, value)?;
                        }
                        BinWrite::Delete => {
                            if let Some(index) = find_bin(&bins, op.name) {
                                bins.remove(index);
                            }
                        }
                        BinWrite::Keep => {}
                    }
                    push_result(&mut responses, &op, None, respond_all);
                }
                _ => {
                    apply_modify(&mut bins, &op)?;
                    if respond_all {
                        responses.push(null_entry(&op));
                    }
                }
            }
        }
        count_reply_bytes(&responses, &mut counted, reply_bytes)?;
        let existing_void_time = live_meta.map(|meta| meta.void_time);
        if bins.is_empty() {
            // Nothing left: the record goes (or never comes into being).
            if live.is_none() {
                return Err(ResultCode::NotFound);
            }
            (
                WriteOutcome::Delete {
                    responses: owned(responses),
                },
                true,
            )
        } else {
            let void_time = void_time_for(namespace, header.record_ttl, existing_void_time, now)?;
            let key = request.key.or(stored_key);
            let new_body = encode_body_reserving(key, &bins, MEMORY_BODY_SPARE)
                .map_err(|_| ResultCode::Parameter)?;
            check_record_size(namespace, new_body.len())?;
            let (life, generation) = match live_meta {
                Some(meta) => (meta.life, RecordMeta::next_generation(meta.generation)),
                None => start_after(
                    current.map(IndexEntry::meta),
                    partition.tombstone(&request.digest),
                ),
            };
            let record_set = live_meta.map_or(set_id, |meta| meta.set_id);
            let meta = RecordMeta {
                generation,
                life,
                set_id: record_set,
                void_time,
                last_update_ms: namespace.version_lut_ms(record_set, now.unix_ms),
            };
            (
                WriteOutcome::Store {
                    meta,
                    body: new_body,
                    responses: owned(responses),
                },
                current.is_some(),
            )
        }
    };
    match outcome {
        WriteOutcome::Delete { responses } => {
            if let Some(entry) = partition.get(&request.digest) {
                write_tombstone(namespace, &request.digest, &entry.meta(), now)?;
            }
            let durable = is_durable_delete(header);
            remove_deleted(
                namespace,
                &mut partition,
                &request.digest,
                now.unix_ms,
                durable,
            );
            drop(partition);
            write_operate_reply(out, request.reply, 0, 0, &responses);
        }
        WriteOutcome::Store {
            meta,
            body,
            responses,
        } => {
            let previous = install(namespace, &mut partition, request.digest, meta, body)?;
            drop(partition);
            debug_assert_eq!(previous.is_some(), existed_entry);
            if let Some(old) = previous {
                old.release(namespace);
            }
            write_operate_reply(
                out,
                request.reply,
                meta.generation,
                meta.void_time,
                &responses,
            );
        }
    }
    namespace
        .stats
        .client_write_success
        .fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// The life and generation of a record written where none is live, so
/// that the new copy wins over the delete's tombstone on every replica
/// still holding it, and over every copy from before the delete, in every
/// merge:
/// - after a durable delete (its tombstone kept here), the deleted copy's
///   life, the generation past the tombstone's (as after the reference's
///   durable deletes);
/// - after any other delete, the deleted copy's next life at generation 1
///   (the client sees 1, as after the reference's non-durable deletes);
/// - else generation 1 in the life of the expired or truncated copy held
///   (as the reference's "rescue" of a doomed record; replicas count such
///   a copy as absent), or in life 0.
pub(crate) fn start_after(dead: Option<RecordMeta>, tombstone: Option<Tombstone>) -> (u16, u16) {
    match tombstone {
        Some(tombstone) if tombstone.durable => (
            tombstone.life,
            RecordMeta::next_generation(tombstone.generation),
        ),
        Some(tombstone) => (RecordMeta::next_life(tombstone.life), 1),
        None => (dead.map_or(0, |meta| meta.life), 1),
    }
}

/// The checks every write makes before it reads the record: the namespace
/// takes writes (else 8, counted) and the request's set can be named
/// (else 22); returns the set's id.
#[inline]
pub(crate) fn admit_write(namespace: &Namespace, request: &Request<'_>) -> Result<u16, ResultCode> {
    if namespace.stop_writes() {
        namespace
            .stats
            .stop_writes_count
            .fetch_add(1, Ordering::Relaxed);
        return Err(ResultCode::OutOfSpace);
    }
    namespace
        .sets
        .id_of(request.set)
        .ok_or(ResultCode::Forbidden)
}

/// Stores a new body for `digest` (copy-on-write) and points the index at it,
/// under the partition lock the caller holds. Returns the replaced entry,
/// whose storage the caller releases after dropping the lock
/// ([`Replaced::release`]); the counts already take the replacement into
/// account.
pub(crate) fn install(
    namespace: &Namespace,
    partition: &mut PartitionIndex,
    digest: Digest,
    meta: RecordMeta,
    body: Vec<u8>,
) -> Result<Option<Replaced>, ResultCode> {
    // The device engine stores the set name with the record (set ids are
    // per process); the memory engine needs none.
    let set_name = match namespace.storage.device() {
        Some(_) => namespace.sets.name(meta.set_id).unwrap_or_default(),
        None => Vec::new(),
    };
    let store = StoreMeta {
        generation: meta.generation,
        life: meta.life,
        void_time: meta.void_time,
        last_update_ms: meta.last_update_ms,
        set_name: &set_name,
    };
    // The new version's secondary-index keys, while the body is still here.
    let sindex_keys = crate::sindex::before_install(namespace, &digest, meta, &body);
    let location = namespace
        .storage
        .write(&digest, &store, body)
        .map_err(storage_result)?;
    let size = location.size() as i64;
    let previous = partition.insert(digest, IndexEntry::new(meta, location));
    if let Some(pending) = sindex_keys {
        crate::sindex::after_install(namespace, pending, &digest, previous.as_ref());
    }
    // One version replaces another: only what changed is counted (an
    // update of the same size touches no shared count).
    match &previous {
        Some(old) if old.meta().set_id == meta.set_id => {
            account(namespace, meta.set_id, 0, size - old.location.size() as i64);
        }
        Some(old) => {
            account(
                namespace,
                old.meta().set_id,
                -1,
                -(old.location.size() as i64),
            );
            account(namespace, meta.set_id, 1, size);
        }
        None => account(namespace, meta.set_id, 1, size),
    }
    Ok(previous.map(Replaced))
}

/// An index entry a new version replaced ([`install`]): no longer counted,
/// its storage still held until [`Replaced::release`].
#[must_use = "the replaced version's storage must be released"]
pub(crate) struct Replaced(IndexEntry);

impl Replaced {
    /// Releases the replaced version's storage (after the partition lock is
    /// dropped: the device engine may take its own locks).
    pub(crate) fn release(self, namespace: &Namespace) {
        namespace.storage.release(self.0.location);
    }
}

/// Adds `objects` records and `bytes` of data to set `set_id`'s and the
/// namespace's counts, skipping the counts that do not change.
#[inline]
fn account(namespace: &Namespace, set_id: u16, objects: i64, bytes: i64) {
    let set_stats = namespace.sets.stats(set_id);
    if objects != 0 {
        set_stats.objects.fetch_add(objects, Ordering::Relaxed);
        namespace
            .stats
            .objects
            .fetch_add(objects, Ordering::Relaxed);
    }
    if bytes != 0 {
        set_stats
            .data_used_bytes
            .fetch_add(bytes, Ordering::Relaxed);
    }
}

/// Read-touch (server 7.1+): a read whose `record_ttl` is a percentage
/// 1..=100 resets the record's TTL — a touch: new void time, generation and
/// last-update time — when at most that percentage of the TTL it was
/// written with remains. Records that never expire are left alone. Runs
/// after the read answered; true when it touched.
fn read_touch(namespace: &Namespace, request: &Request<'_>, now: Now) -> Result<bool, ResultCode> {
    let percent = request.header.record_ttl;
    debug_assert!((1..=100).contains(&percent));
    let mut partition = namespace
        .index
        .partition(request.digest.partition())
        .write();
    let Some(entry) = partition.get(&request.digest) else {
        return Ok(false);
    };
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
        generation: RecordMeta::next_generation(current.generation),
        life: current.life,
        set_id: current.set_id,
        void_time: now.citrusleaf_seconds.saturating_add(ttl),
        last_update_ms: namespace.version_lut_ms(current.set_id, now.unix_ms),
    };
    let previous = install(namespace, &mut partition, request.digest, meta, body)?;
    drop(partition);
    if let Some(old) = previous {
        old.release(namespace);
    }
    Ok(true)
}

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

fn null_entry<'a>(op: &Op<'a>) -> ResponseEntry<'a> {
    ResponseEntry {
        op_type: op.op_type,
        name: Cow::Borrowed(op.name),
        particle_type: ParticleType::Null as u8,
        value: Cow::Borrowed(&[]),
    }
}

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

/// Counts a request that failed with `code` before or instead of its work
/// (`udf`: a record UDF call, counted in `client_udf_error` whatever
/// stopped it, as its failures while running are).
fn count_failure(namespace: &Namespace, header: &MsgHeader, code: ResultCode, udf: bool) {
    let stats = &namespace.stats;
    match code {
        ResultCode::NotFound => {}
        ResultCode::Generation => {
            stats.fail_generation.fetch_add(1, Ordering::Relaxed);
        }
        ResultCode::FilteredOut => {
            let counter = if header.info2 & info2::WRITE == 0 {
                &stats.client_read_filtered_out
            } else if header.info2 & info2::DELETE != 0 {
                &stats.client_delete_filtered_out
            } else {
                &stats.client_write_filtered_out
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        _ if udf => {
            stats.client_udf_error.fetch_add(1, Ordering::Relaxed);
        }
        _ if header.info2 & info2::WRITE != 0 => {
            stats.client_write_error.fetch_add(1, Ordering::Relaxed);
        }
        _ => {
            stats.client_read_error.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Writes a header-only reply carrying `code`.
pub fn write_result(out: &mut Vec<u8>, code: ResultCode) {
    citrine_wire::msg::write_status(out, code.code(), 0, 0);
}

/// Writes a one-message stream end (info3 LAST) carrying `code`, the reply
/// batch, scan and query readers expect.
pub fn write_stream_end(out: &mut Vec<u8>, code: ResultCode) {
    let header = MsgHeader {
        info3: info3::LAST,
        result_code: code.code(),
        ..MsgHeader::default()
    };
    MessageWriter::begin(out, &header).finish();
}

/// Answers an AS_MSG body that will not be run with a header-only `code`,
/// in the form its reader waits for: a stream end when the body's `info1`
/// (byte 1, read without decoding the rest) says batch, else a plain reply.
pub(crate) fn write_refusal(out: &mut Vec<u8>, body: &[u8], code: ResultCode) {
    if body.get(1).is_some_and(|bits| bits & info1::BATCH != 0) {
        write_stream_end(out, code);
    } else {
        write_result(out, code);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_checks() {
        let eq = MsgHeader {
            info2: info2::WRITE | info2::GENERATION,
            generation: 3,
            ..MsgHeader::default()
        };
        assert!(check_generation(&eq, 3).is_ok());
        assert_eq!(check_generation(&eq, 2), Err(ResultCode::Generation));
        let gt = MsgHeader {
            info2: info2::WRITE | info2::GENERATION_GT,
            generation: 3,
            ..MsgHeader::default()
        };
        assert!(check_generation(&gt, 2).is_ok());
        assert_eq!(check_generation(&gt, 3), Err(ResultCode::Generation));
    }

    #[test]
    fn modify_ops() {
        let mut bins: Vec<Bin<'_>> = Vec::new();
        let five = 5i64.to_be_bytes();
        let incr = Op {
            op_type: op_type::INCR,
            particle_type: 1,
            flags: 0,
            name: b"n",
            lut: None,
            value: &five,
        };
        apply_modify(&mut bins, &incr).expect("creates");
        apply_modify(&mut bins, &incr).expect("adds");
        assert_eq!(bins[0].as_integer(), Some(10));
        let half = 0.5f64.to_bits().to_be_bytes();
        let float_incr = Op {
            op_type: op_type::INCR,
            particle_type: 2,
            flags: 0,
            name: b"n",
            lut: None,
            value: &half,
        };
        assert_eq!(
            apply_modify(&mut bins, &float_incr),
            Err(ResultCode::IncompatibleType)
        );
        let append = Op {
            op_type: op_type::APPEND,
            particle_type: 3,
            flags: 0,
            name: b"s",
            lut: None,
            value: b"lo",
        };
        let prepend = Op {
            op_type: op_type::PREPEND,
            particle_type: 3,
            flags: 0,
            name: b"s",
            lut: None,
            value: b"hel",
        };
        apply_modify(&mut bins, &append).expect("creates");
        apply_modify(&mut bins, &prepend).expect("prepends");
        assert_eq!(bins[1].value.as_ref(), b"hello");
        let append_to_int = Op {
            op_type: op_type::APPEND,
            particle_type: 3,
            flags: 0,
            name: b"n",
            lut: None,
            value: b"x",
        };
        assert_eq!(
            apply_modify(&mut bins, &append_to_int),
            Err(ResultCode::IncompatibleType)
        );
        let delete_bin = Op {
            op_type: op_type::WRITE,
            particle_type: 0,
            flags: 0,
            name: b"n",
            lut: None,
            value: b"",
        };
        apply_modify(&mut bins, &delete_bin).expect("deletes bin");
        assert_eq!(bins.len(), 1);
    }

    /// As the reference: an append or prepend of a non-string to a missing
    /// bin makes the bin from the operand; to an existing bin it is 12.
    #[test]
    fn append_or_prepend_of_a_non_string_makes_a_missing_bin() {
        let four = 4i64.to_be_bytes();
        let list = [0x91u8, 0x01];
        let mut bins: Vec<Bin<'_>> = Vec::new();
        for (op_type, particle_type, name, value) in [
            (
                op_type::PREPEND,
                ParticleType::Integer as u8,
                b"i",
                &four[..],
            ),
            (op_type::APPEND, ParticleType::List as u8, b"l", &list[..]),
        ] {
            let op = Op {
                op_type,
                particle_type,
                flags: 0,
                name,
                lut: None,
                value,
            };
            apply_modify(&mut bins, &op).expect("creates the bin");
            assert_eq!(
                apply_modify(&mut bins, &op),
                Err(ResultCode::IncompatibleType),
                "an existing {particle_type} bin"
            );
        }
        assert_eq!(bins[0].as_integer(), Some(4));
        assert_eq!(bins[1].particle_type, ParticleType::List as u8);
    }
}
