//! Single-record transactions on one namespace of this node: the read
//! path, the write path (put, operate, touch), delete and read-touch, each
//! executed to completion on the calling thread.
//!
//! A transaction takes its partition's lock once — a read lock to read, the
//! write lock to modify — and holds it until the record is decided, so every
//! operate is atomic on its record and there is no global lock anywhere.
//!
//! Semantics follow `shared/protocol/02-as-msg.md` §6-§9: generation checks,
//! record-exists actions, TTL encodings, send-key, respond-all-ops, and the
//! reference server's validation of op combinations. Every failure is
//! answered with the protocol's own result code.
//!
//! Entry: [`perform`] runs one checked request ([`prepare`] made it from
//! the decoded message: digest, set, key, ops, and the filter expression
//! its caller parsed once) on the namespace the caller found — first
//! [`Namespace::serving`](crate::namespace::Namespace::serving) (a
//! partition a panic cut a change short in answers 1), then a
//! transactional step ([`crate::txn::dispatch`]: verify, roll, a
//! transaction's delete, a monitor write, or the refusal where no
//! transactions run), else the read, write or delete its header names —
//! and writes exactly one reply, the error reply included.
//!
//! Modules: [`read`] (reads and read-touch), [`write`](mod@write) (put,
//! operate, touch), [`delete`], [`bins`] (one op applied to the working
//! bins), [`store`] (installing a version, tombstones, removals — the only
//! code that changes a partition's index, calling the namespace's
//! [`crate::hook::RecordHook`] as it does). Where a request runs (this node
//! or another) is the distribution layer's business; record UDFs run above
//! this layer and use [`store`] to install what they wrote.

pub mod bins;
pub mod delete;
pub mod read;
pub mod store;
pub mod write;

pub use crate::clock::Now;
pub use store::{
    drop_entry, install, is_durable_delete, remove_deleted, retire_entry, start_after,
    storage_result, write_tombstone, Replaced,
};
pub use write::{admit_write, check_record_size, set_of_new_record, void_time_for};

use crate::namespace::Namespace;
use citrine_exp::Expression;
use citrine_index::RecordMeta;
use citrine_types::{Digest, ParticleType, ResultCode, DIGEST_SIZE, SET_NAME_MAX};
use citrine_wire::msg::{
    field_type, info1, info2, info3, op_type, Message, MessageWriter, MsgHeader, Op, OpIter,
};

/// Largest reply a single-record command may build (the largest message
/// the clients read). Many read ops of one big bin, or big expression and
/// CDT results, could otherwise build replies of any size; past this the
/// command answers RECORD_TOO_BIG (13) instead.
pub const MAX_REPLY_BYTES: usize = 128 * 1024 * 1024;

/// Largest TTL a write may ask for: ten years.
pub const TTL_MAX_SECONDS: u32 = 315_360_000;
/// Record TTL encoding: never expire.
pub const TTL_NEVER_EXPIRE: u32 = 0xFFFF_FFFF;
/// Record TTL encoding: keep the record's current TTL.
pub const TTL_DONT_UPDATE: u32 = 0xFFFF_FFFE;

/// Runs one checked request on this node — read, write/operate/touch or
/// delete, as its header says — and writes its one reply (a frame, or a
/// batch row message) to `out`, including the error reply when it fails.
/// (A record UDF is run above this layer, not here.)
pub fn perform(namespace: &Namespace, request: &Request<'_>, now: Now, out: &mut Vec<u8>) {
    let header = &request.header;
    let outcome = if let Err(code) = namespace.serving(request.digest.partition()) {
        Err(code)
    } else if let Some(outcome) = crate::txn::dispatch(namespace, request, now, out) {
        outcome
    } else if header.info2 & info2::WRITE != 0 {
        if header.info2 & info2::DELETE != 0 {
            delete::delete(namespace, request, now, out)
        } else {
            write::write(namespace, request, now, out)
        }
    } else if header.info1 & info1::READ != 0 {
        read::read(namespace, request, now, out)
    } else {
        Err(ResultCode::Parameter)
    };
    if let Err(code) = outcome {
        count_failure(namespace, header, code, (false, request.tally));
        let start = out.len();
        write_error(out, code, request.reply);
        if let Some(meta) = crate::txn::failed_write_read(namespace, request, code, now) {
            crate::txn::add_version(out, start, request.reply, &meta);
        }
    }
}

/// How a transaction's reply is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// A complete frame (proto header included): a single-record request.
    Frame,
    /// A bare AS_MSG inside a batch response frame; `transaction_ttl`
    /// carries the row's batch index.
    Row(u32),
}

/// Starts the reply message for `header` in the form `reply` asks for.
#[inline]
pub fn begin_reply<'b>(out: &'b mut Vec<u8>, header: MsgHeader, reply: Reply) -> MessageWriter<'b> {
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
pub fn write_error(out: &mut Vec<u8>, code: ResultCode, reply: Reply) {
    let header = MsgHeader {
        result_code: code.code(),
        ..MsgHeader::default()
    };
    begin_reply(out, header, reply).finish();
}

/// The ops of a request: a decoded message's, or a batch row's raw op bytes
/// (validated by the batch parser with the same checks as `Message::decode`).
#[derive(Clone, Copy, Debug)]
pub enum Ops<'m> {
    Message(Message<'m>),
    Raw(&'m [u8]),
}

impl<'m> Ops<'m> {
    /// Iterates the ops in wire order.
    #[inline]
    pub fn iter(&self) -> OpsIter<'m> {
        match self {
            Ops::Message(message) => OpsIter::Message(message.ops()),
            Ops::Raw(bytes) => OpsIter::Raw(bytes),
        }
    }
}

/// Iterator over [`Ops`].
pub enum OpsIter<'m> {
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
pub struct Request<'m> {
    pub header: MsgHeader,
    pub digest: Digest,
    pub set: &'m [u8],
    pub key: Option<(u8, &'m [u8])>,
    pub ops: Ops<'m>,
    pub reply: Reply,
    /// The filter expression (field 43) the record must pass, if any.
    pub filter: Option<&'m Expression>,
    /// Its transaction fields (see [`crate::txn`]).
    pub txn: crate::txn::TxnPart,
    /// Whose statistics its outcome counts in (a client's, or a
    /// background job's sub-transaction).
    pub tally: crate::tally::Tally,
}

/// The checked request of a decoded single-record message whose DIGEST
/// field is `digest_bytes`: set, key and ops as the message carries them,
/// answered as a frame.
pub fn prepare<'m>(
    message: &Message<'m>,
    digest_bytes: &[u8],
    filter: Option<&'m Expression>,
) -> Result<Request<'m>, ResultCode> {
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
        txn: crate::txn::TxnPart::of(|| message.fields()),
        tally: crate::tally::Tally::Client,
    })
}

/// A KEY field checked: its particle type and value bytes.
pub fn parse_key(field: &[u8]) -> Result<(u8, &[u8]), ResultCode> {
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

/// The source's last-update time (Unix ms) a write shipped by XDR carries
/// (info1 `XDR` and field 14 `LUT`: Citrusleaf-epoch ms in the low 40
/// bits, the source id above); `None` for any other write. Such a write
/// keeps this time as its own, so both sites hold one LUT per version.
pub fn xdr_lut_ms(request: &Request<'_>) -> Option<u64> {
    if request.header.info1 & info1::XDR == 0 {
        return None;
    }
    let Ops::Message(message) = &request.ops else {
        return None;
    };
    let field: [u8; 8] = message.field(field_type::LUT)?.try_into().ok()?;
    Some(citrine_wire::msg::xdr_lut_unix_ms(field))
}

/// Conflict resolution of an XDR write by last-update time: it loses
/// (28) to a local copy or delete at least as recent.
pub fn check_xdr_conflict(
    incoming_ms: Option<u64>,
    local_ms: Option<u64>,
) -> Result<(), ResultCode> {
    match (incoming_ms, local_ms) {
        (Some(incoming), Some(local)) if local >= incoming => Err(ResultCode::LostConflict),
        _ => Ok(()),
    }
}

/// True when the index entry is a live record (not expired, not truncated).
#[inline]
pub fn is_live(namespace: &Namespace, meta: &RecordMeta, now: Now) -> bool {
    !meta.is_expired(now.citrusleaf_seconds)
        && !namespace.is_truncated(meta.set_id, meta.last_update_ms)
}

/// Checks the generation condition of a write or delete.
pub fn check_generation(header: &MsgHeader, current: u16) -> Result<(), ResultCode> {
    let expected = header.generation;
    if header.info2 & info2::GENERATION != 0 && expected != u32::from(current) {
        return Err(ResultCode::Generation);
    }
    if header.info2 & info2::GENERATION_GT != 0 && expected <= u32::from(current) {
        return Err(ResultCode::Generation);
    }
    Ok(())
}

/// The family of a bin op that `citrine_cdt::apply` evaluates (list/map,
/// bits, HLL), and whether the op type is the modifying one.
pub fn bin_op_family(op_type: u8) -> Option<(citrine_cdt::Family, bool)> {
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

/// Counts a request that failed with `code` before or instead of its work
/// (`udf`: a record UDF call, counted as the UDF's error whatever stopped
/// it, as its failures while running are) in `tally`'s statistics.
pub fn count_failure(
    namespace: &Namespace,
    header: &MsgHeader,
    code: ResultCode,
    (udf, tally): (bool, crate::tally::Tally),
) {
    let outcome = crate::tally::Outcome::Failed {
        code,
        info2: header.info2,
        udf,
    };
    namespace.stats.count(tally, outcome);
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
pub fn write_refusal(out: &mut Vec<u8>, body: &[u8], code: ResultCode) {
    if body.get(1).is_some_and(|bits| bits & info1::BATCH != 0) {
        write_stream_end(out, code);
    } else {
        write_result(out, code);
    }
}

#[cfg(test)]
mod cut_short_tests;
#[cfg(test)]
mod reference_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod xdr_tests;
