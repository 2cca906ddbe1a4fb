//! Monitor records: the record a client keeps per transaction in set
//! `<ERO~MRT` (integer key = transaction id; bins `id`, `keyds` — the
//! ordered digests the transaction writes — and `fwd` once it is marked
//! to roll forward), written with ordinary write commands.
//!
//! Owns the rules those writes follow here: the write that creates a
//! monitor fixes the transaction's deadline (now plus the client's
//! timeout, carried in the header's TTL slot, or `mrt-duration`; at most
//! [`super::DURATION_MAX`]) and every write that adds digests answers it
//! in field 6; past the deadline a monitor takes no more writes (122); a
//! marked monitor takes none (124, which the client counts as success
//! for a repeated mark); a mark on a monitor that is gone answers 125
//! (the transaction was rolled back), and so does nothing else: a write
//! adding digests (no bin `id`: not the transaction's first) to a monitor
//! that is gone answers 122, as it would have before the node rolled it; the record itself never expires by
//! TTL (it is removed by its close or by [`super::recovery`]); a monitor
//! record past 90 KiB is refused (123, [`check_size`]).
//!
//! Invariant: an open monitor record has its entry in the partition's
//! table ([`super::table`]), and a closed one has none; each write runs
//! its checks, the record's write and the entry's update whole under the
//! monitor's stripe, as recovery does its roll.

use super::{Monitor, DURATION_MAX};
use crate::namespace::Namespace;
use crate::record::{self, Now, Reply, Request, TTL_NEVER_EXPIRE};
use citrine_types::ResultCode;
use citrine_wire::msg::{field_type, info2, op_type, MsgHeader};
use citrine_wire::txn::add_reply_field;
use std::sync::atomic::Ordering;

/// The largest monitor record (the reference's bound).
pub const MAX_MONITOR_RECORD_BYTES: usize = 90 * 1024;

/// A monitor record's new body of `len` bytes, on a namespace that runs
/// transactions, above [`MAX_MONITOR_RECORD_BYTES`]: 123 (the transaction
/// has too many writes to track). Our body's layout is not the
/// reference's, so the bound falls within a few bytes of its.
pub fn check_size(
    namespace: &Namespace,
    request: &Request<'_>,
    len: usize,
) -> Result<(), ResultCode> {
    if len > MAX_MONITOR_RECORD_BYTES
        && request.set == super::MONITOR_SET
        && super::allowed(namespace)
    {
        return Err(ResultCode::MrtTooManyWrites);
    }
    Ok(())
}

/// The bin a mark-roll-forward writes.
pub const FORWARD_BIN: &[u8] = b"fwd";
/// The bin holding the transaction's digests.
pub const DIGESTS_BIN: &[u8] = b"keyds";
/// The bin holding the transaction's id.
pub const ID_BIN: &[u8] = b"id";

/// A write or delete (close) of a monitor record.
pub(crate) fn write(
    namespace: &Namespace,
    request: &Request<'_>,
    now: Now,
    out: &mut Vec<u8>,
) -> Result<(), ResultCode> {
    let digest = request.digest;
    let _serialized = namespace.txn.monitor_guard(&digest);
    if request.header.info2 & info2::DELETE != 0 {
        let closed = record::delete::delete(namespace, request, now, out);
        namespace.txn.close_monitor(&digest);
        return closed;
    }
    let marks_forward = marks_forward(request);
    let monitor = next_state(namespace, request, marks_forward, now)?;
    let header = MsgHeader {
        record_ttl: TTL_NEVER_EXPIRE,
        ..request.header
    };
    let kept = Request {
        header,
        digest,
        set: request.set,
        key: request.key,
        ops: request.ops,
        reply: request.reply,
        filter: request.filter,
        txn: request.txn,
        tally: request.tally,
    };
    let start = out.len();
    record::write::write(namespace, &kept, now, out)?;
    namespace.txn.set_monitor(digest, monitor);
    if !marks_forward {
        let framed = request.reply == Reply::Frame;
        let deadline = monitor.deadline.to_le_bytes();
        add_reply_field(out, start, framed, field_type::TXN_DEADLINE, &deadline);
    }
    Ok(())
}

/// The monitor as this write leaves it, or the refusal.
fn next_state(
    namespace: &Namespace,
    request: &Request<'_>,
    marks_forward: bool,
    now: Now,
) -> Result<Monitor, ResultCode> {
    match namespace.txn.monitor(&request.digest) {
        None if marks_forward => Err(ResultCode::MrtAborted),
        // Only the first write of a transaction puts bin `id`: a later one
        // finding no monitor comes after the node rolled it (deadline).
        None if !creates(request) => Err(ResultCode::MrtExpired),
        None if namespace.txn.writes_disabled.load(Ordering::Relaxed) => Err(ResultCode::Forbidden),
        None => Ok(Monitor {
            deadline: now
                .citrusleaf_seconds
                .saturating_add(duration(namespace, request.header.record_ttl)),
            roll_forward: false,
        }),
        Some(open) if open.roll_forward => Err(ResultCode::MrtCommitted),
        Some(open) if open.deadline < now.citrusleaf_seconds => Err(ResultCode::MrtExpired),
        Some(open) => Ok(Monitor {
            roll_forward: marks_forward,
            ..open
        }),
    }
}

/// A transaction's duration: the client's timeout (seconds, the header's
/// TTL slot) within the bounds, or `mrt-duration` when it sends 0.
fn duration(namespace: &Namespace, requested: u32) -> u32 {
    match requested {
        0 => namespace.txn.duration_seconds.load(Ordering::Relaxed),
        seconds => seconds.min(DURATION_MAX),
    }
}

/// Whether the write creates the monitor: it puts bin `id`.
fn creates(request: &Request<'_>) -> bool {
    request
        .ops
        .iter()
        .any(|op| op.op_type == op_type::WRITE && op.name == ID_BIN)
}

/// Whether the write is a mark-roll-forward: one WRITE op of bin `fwd`.
fn marks_forward(request: &Request<'_>) -> bool {
    let mut ops = request.ops.iter();
    let first = ops.next();
    ops.next().is_none()
        && first.is_some_and(|op| op.op_type == op_type::WRITE && op.name == FORWARD_BIN)
}
