//! Delete: a record's removal by a client, leaving its tombstone.
//!
//! Under the partition's write lock: a record a transaction holds is
//! refused (120, [`crate::txn::begin_write`]), the live record is found (2 when
//! missing, counted), its generation and filter checked, a tombstone made
//! durable (device engine) and the entry removed with its tombstone kept
//! (the deleted copy's next generation and life, and whether the delete
//! was durable).

use super::store::{is_durable_delete, remove_deleted_by, write_delete_tombstone};
use super::{begin_reply, check_generation, is_live, Now, Request};
use crate::filter::{self, RecordView};
use crate::namespace::Namespace;
use crate::tally::Outcome;
use citrine_record::BodyView;
use citrine_types::ResultCode;
use citrine_wire::msg::MsgHeader;

/// Deletes the request's record and answers.
pub(crate) fn delete(
    namespace: &Namespace,
    request: &Request<'_>,
    now: Now,
    out: &mut Vec<u8>,
) -> Result<(), ResultCode> {
    let mut partition = namespace
        .index
        .partition(request.digest.partition())
        .write();
    // The LUT is taken under the lock (see `Namespace::now_under_lock`).
    let now = namespace.now_under_lock(now);
    // A record a transaction holds takes no other delete (120).
    crate::txn::begin_write(namespace, request, now)?;
    let live = partition
        .get(&request.digest)
        .map(|entry| (entry, entry.meta()))
        .filter(|(_, meta)| is_live(namespace, meta, now));
    let Some((entry, meta)) = live else {
        namespace
            .stats
            .count(request.tally, Outcome::DeleteNotFound);
        return Err(ResultCode::NotFound);
    };
    check_generation(&request.header, meta.generation)?;
    let shipped_lut = super::xdr_lut_ms(request);
    super::check_xdr_conflict(shipped_lut, Some(meta.last_update_ms))?;
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
    let durable = is_durable_delete(&request.header);
    let (lut_ms, xdr_write) = (shipped_lut.unwrap_or(now.unix_ms), shipped_lut.is_some());
    let digest = &request.digest;
    write_delete_tombstone(namespace, digest, &meta, lut_ms, durable, xdr_write)?;
    remove_deleted_by(
        namespace,
        &mut partition,
        digest,
        lut_ms,
        durable,
        xdr_write,
    );
    if let Some(lut_ms) = shipped_lut {
        namespace
            .xdr_arrivals
            .note(request.digest.partition(), lut_ms);
    }
    drop(partition);
    namespace.stats.count(request.tally, Outcome::DeleteSuccess);
    begin_reply(out, MsgHeader::default(), request.reply).finish();
    Ok(())
}
