//! Multi-record transactions (MRT, issue 40) in the data path of one node,
//! as the official clients drive them (`shared/protocol/02-as-msg.md`
//! §2.4, §11; `08-sc-xdr-ops.md` §2).
//!
//! Owns: the gate ([`allowed`]: strong-consistency namespaces only), the
//! answer an AP namespace gives (the reference's: 25), and on an allowed
//! namespace every transactional step of a record: reads that answer the
//! record version (field 3), writes that lock the record with a
//! provisional version only their transaction sees ([`table`]), verify
//! reads (121 on a changed version), roll forward and roll back, the
//! monitor records in set [`MONITOR_SET`] and their deadlines
//! ([`monitor`]), and the roll of expired transactions ([`recovery`]).
//!
//! Invariants:
//! - nothing here runs on a namespace [`allowed`] refuses: there, a
//!   request carrying a transaction id or a verify/roll bit answers 25,
//!   except a delete (the reference's CE deletes it as if untransacted);
//! - a record with a provisional version refuses every write but its
//!   transaction's (120, counted in `fail_mrt_blocked`), and every read
//!   outside a transaction answers its last committed version: the index
//!   is not touched before the roll forward;
//! - deadlines are Citrusleaf-epoch seconds (our choice: the clients only
//!   echo the value the monitor's reply gave them).

pub mod monitor;
pub mod recovery;
pub mod replica;
pub mod table;

pub use table::{Monitor, Provisional, Settled, TxnTables, Version};

use crate::namespace::Namespace;
use crate::record::{self, is_live, Now, Request};
use citrine_index::RecordMeta;
use citrine_types::{ResultCode, CITRUSLEAF_EPOCH_UNIX_MS};
use citrine_wire::msg::{field_type, info2, Field, MsgHeader};
use citrine_wire::txn::{add_reply_field, info4, RecordVersion, TxnFields};
use std::sync::atomic::Ordering;

/// The set of the monitor records.
pub const MONITOR_SET: &[u8] = b"<ERO~MRT";
/// Bounds and default of `mrt-duration` (seconds).
pub const DURATION_MIN: u32 = 1;
pub const DURATION_MAX: u32 = 120;
pub const DURATION_DEFAULT: u32 = 10;

/// Whether `namespace` runs transactions: a strong-consistency namespace
/// (or, in tests, one [`TxnTables::enable_for_tests`] enabled).
#[inline]
pub fn allowed(namespace: &Namespace) -> bool {
    namespace.config.sc.strong_consistency || namespace.txn.enabled_for_tests()
}

/// The transaction fields of a request as it came.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxnPart {
    /// The fields, or `None` when one has the wrong size.
    pub fields: Option<TxnFields>,
    /// A transaction id field is present (whatever its size).
    pub carries_id: bool,
}

impl Default for TxnPart {
    /// No transaction field.
    fn default() -> TxnPart {
        TxnPart {
            fields: Some(TxnFields::default()),
            carries_id: false,
        }
    }
}

impl TxnPart {
    /// The transaction part of a request's (or batch row's) fields,
    /// which `fields` iterates afresh at each call: one pass when it has
    /// none (nearly every request), a second to parse them.
    pub fn of<'a, I: Iterator<Item = Field<'a>>>(fields: impl Fn() -> I) -> TxnPart {
        let mut carries_id = false;
        let mut any = false;
        for field in fields() {
            match field.field_type {
                field_type::TXN_ID => (carries_id, any) = (true, true),
                field_type::RECORD_VERSION | field_type::TXN_DEADLINE => any = true,
                _ => {}
            }
        }
        if !any {
            return TxnPart::default();
        }
        TxnPart {
            carries_id,
            fields: TxnFields::parse(fields()).ok(),
        }
    }

    /// The transaction id, when the request runs in one.
    pub fn id(&self) -> Option<u64> {
        self.fields.and_then(|fields| fields.id)
    }
}

/// The version transactions compare of a record with `meta`.
pub fn version_of(meta: &RecordMeta) -> RecordVersion {
    RecordVersion::new(
        meta.last_update_ms.saturating_sub(CITRUSLEAF_EPOCH_UNIX_MS),
        meta.generation,
    )
}

/// Runs `request` when it is a transactional step this module answers
/// whole (a verify, a roll, a transaction's delete, a monitor write, or
/// any of them on a namespace that runs no transactions); `None` leaves
/// it to the ordinary read and write paths, which ask [`read_source`] and
/// [`begin_write`] themselves.
pub fn dispatch(
    namespace: &Namespace,
    request: &Request<'_>,
    now: Now,
    out: &mut Vec<u8>,
) -> Option<Result<(), ResultCode>> {
    let header = &request.header;
    let delete = header.info2 & (info2::WRITE | info2::DELETE) == info2::WRITE | info2::DELETE;
    if !allowed(namespace) {
        let refused = header.info4 & info4::COMMIT_BITS != 0 || (request.txn.carries_id && !delete);
        return refused.then_some(Err(ResultCode::EnterpriseOnly));
    }
    let Some(fields) = request.txn.fields else {
        return Some(Err(ResultCode::Parameter));
    };
    if header.info4 & info4::VERIFY_READ != 0 {
        return Some(verify(namespace, request, fields, now, out));
    }
    if header.info4 & (info4::ROLL_FORWARD | info4::ROLL_BACK) != 0 {
        return Some(roll(namespace, request, fields, now, out));
    }
    if request.set == MONITOR_SET && header.info2 & info2::WRITE != 0 {
        return Some(monitor::write(namespace, request, now, out));
    }
    if fields.id.is_some() && delete {
        return Some(delete_in(namespace, request, fields, now, out));
    }
    None
}

/// A verify read: the record's committed version must be the one sent
/// (121 otherwise, or when the record is gone) and no transaction may
/// hold it (120: its writer could still commit after this one).
fn verify(
    namespace: &Namespace,
    request: &Request<'_>,
    fields: TxnFields,
    now: Now,
    out: &mut Vec<u8>,
) -> Result<(), ResultCode> {
    let sent = fields.version.ok_or(ResultCode::Parameter)?;
    let stats = &namespace.txn.stats;
    let outcome = {
        let partition = namespace.index.partition(request.digest.partition()).read();
        if namespace.txn.provisional(&request.digest).is_some() {
            Err(ResultCode::MrtBlocked)
        } else {
            let current = partition
                .get(&request.digest)
                .map(|entry| entry.meta())
                .filter(|meta| is_live(namespace, meta, now))
                .map(|meta| version_of(&meta));
            match current {
                Some(version) if version == sent => Ok(()),
                _ => Err(ResultCode::MrtVersionMismatch),
            }
        }
    };
    let counter = match outcome {
        Ok(()) => &stats.verify_read_success,
        Err(ResultCode::MrtBlocked) => &stats.fail_mrt_blocked,
        Err(_) => &stats.fail_mrt_version_mismatch,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    if outcome.is_err() {
        stats.verify_read_error.fetch_add(1, Ordering::Relaxed);
    }
    outcome?;
    record::begin_reply(out, MsgHeader::default(), request.reply).finish();
    Ok(())
}

/// A roll forward or back of the request's transaction on its record. A
/// record its transaction does not hold (rolled already, or its write
/// never landed) answers 0: rolls are repeated until they succeed.
fn roll(
    namespace: &Namespace,
    request: &Request<'_>,
    fields: TxnFields,
    now: Now,
    out: &mut Vec<u8>,
) -> Result<(), ResultCode> {
    let bits = request.header.info4 & (info4::ROLL_FORWARD | info4::ROLL_BACK);
    let (Some(txn_id), false) = (fields.id, bits == info4::ROLL_FORWARD | info4::ROLL_BACK) else {
        return Err(ResultCode::Parameter);
    };
    let forward = bits == info4::ROLL_FORWARD;
    let rolled = roll_record(namespace, &request.digest, txn_id, forward, now);
    let stats = &namespace.txn.stats;
    let counter = match (forward, rolled.is_ok()) {
        (true, true) => &stats.roll_forward_success,
        (true, false) => &stats.roll_forward_error,
        (false, true) => &stats.roll_back_success,
        (false, false) => &stats.roll_back_error,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    rolled?;
    record::begin_reply(out, MsgHeader::default(), request.reply).finish();
    Ok(())
}

/// Rolls transaction `txn_id` on `digest`: its provisional version
/// installed (forward) or dropped (back), under the partition's write
/// lock, and the transaction remembered as settled on it. Nothing to do
/// when the transaction holds no version there.
pub fn roll_record(
    namespace: &Namespace,
    digest: &citrine_types::Digest,
    txn_id: u64,
    forward: bool,
    now: Now,
) -> Result<(), ResultCode> {
    let mut partition = namespace.index.partition(digest.partition()).write();
    let Some(held) = namespace
        .txn
        .provisional(digest)
        .filter(|held| held.txn_id == txn_id)
    else {
        return Ok(());
    };
    let replaced = if forward {
        commit_version(namespace, &mut partition, digest, held.version, now)?
    } else {
        None
    };
    // Dropped only once committed: a failed install leaves the lock held
    // and the roll to be repeated. Settled: no copy built before this
    // roll brings the lock back (`replica::fill`).
    namespace.txn.take(digest, txn_id);
    let until = held.deadline.max(now.citrusleaf_seconds);
    let until = until.saturating_add(table::SETTLED_MARGIN_SECONDS);
    namespace.txn.settle(*digest, txn_id, until);
    drop(partition);
    if let Some(old) = replaced {
        old.release(namespace);
    }
    Ok(())
}

/// Installs a provisional version as the record's committed one (a
/// removal leaves a durable tombstone), under the partition's write lock.
fn commit_version(
    namespace: &Namespace,
    partition: &mut citrine_index::PartitionIndex,
    digest: &citrine_types::Digest,
    version: Version,
    now: Now,
) -> Result<Option<record::Replaced>, ResultCode> {
    match version {
        Version::Store { mut meta, body } => {
            meta.last_update_ms = namespace.version_lut_ms(meta.set_id, now.unix_ms);
            record::install(namespace, partition, *digest, meta, body)
        }
        Version::Delete => {
            let live = partition
                .get(digest)
                .map(|entry| entry.meta())
                .filter(|meta| is_live(namespace, meta, now));
            if let Some(meta) = live {
                record::write_tombstone(namespace, digest, &meta, now)?;
                record::remove_deleted(namespace, partition, digest, now.unix_ms, true);
                let stats = &namespace.txn.stats;
                stats.roll_tombstone_creates.fetch_add(1, Ordering::Relaxed);
            }
            Ok(None)
        }
    }
}

/// What a read inside a transaction reads.
pub enum TxnRead {
    /// Not in a transaction: the committed record, as always.
    Plain,
    /// The committed record, answered with its version (field 3).
    Committed,
    /// The transaction's own provisional version.
    Own { meta: RecordMeta, body: Vec<u8> },
}

/// Where `request`'s read reads from; called under the partition's read
/// lock. A transaction reading a record another transaction holds is
/// refused (120); its own deleted record is not found (2).
pub fn read_source(namespace: &Namespace, request: &Request<'_>) -> Result<TxnRead, ResultCode> {
    let Some(txn_id) = request.txn.id().filter(|_| allowed(namespace)) else {
        return Ok(TxnRead::Plain);
    };
    match namespace.txn.provisional(&request.digest) {
        None => Ok(TxnRead::Committed),
        Some(held) if held.txn_id != txn_id => {
            let stats = &namespace.txn.stats;
            stats.fail_mrt_blocked.fetch_add(1, Ordering::Relaxed);
            Err(ResultCode::MrtBlocked)
        }
        Some(held) => match held.version {
            Version::Store { meta, body } => Ok(TxnRead::Own { meta, body }),
            Version::Delete => Err(ResultCode::NotFound),
        },
    }
}

/// A transaction's command on a record it read before carries that
/// read's version (field 3): the committed record must still be that
/// version (121 otherwise, or when it is gone), else the transaction
/// would read two versions of it, or write over a version it never read.
/// `live` is the committed record as the command finds it, under its
/// partition's lock; nothing to check outside a transaction, without a
/// version, or on a record the transaction holds (its caller does not
/// ask then).
pub fn check_read_version(
    namespace: &Namespace,
    request: &Request<'_>,
    live: Option<&RecordMeta>,
) -> Result<(), ResultCode> {
    let Some(fields) = request.txn.fields.filter(|_| allowed(namespace)) else {
        return Ok(());
    };
    let (Some(_), Some(sent)) = (fields.id, fields.version) else {
        return Ok(());
    };
    if live.map(version_of) == Some(sent) {
        return Ok(());
    }
    let stats = &namespace.txn.stats;
    stats
        .fail_mrt_version_mismatch
        .fetch_add(1, Ordering::Relaxed);
    Err(ResultCode::MrtVersionMismatch)
}

/// Adds the record version of `meta` to the reply that starts at
/// `out[start..]`.
pub fn add_version(out: &mut Vec<u8>, start: usize, reply: record::Reply, meta: &RecordMeta) {
    let framed = reply == record::Reply::Frame;
    let version = version_of(meta).encode();
    add_reply_field(out, start, framed, field_type::RECORD_VERSION, &version);
}

/// The committed record a transaction's write looked at and refused for
/// what it found (3, 5, 27): the write read it, so its reply carries the
/// record's version for the commit to verify, as the reference answers
/// writes "that don't touch". `None` for any other write or refusal, or
/// when the transaction holds the record.
pub fn failed_write_read(
    namespace: &Namespace,
    request: &Request<'_>,
    code: ResultCode,
    now: Now,
) -> Option<RecordMeta> {
    let looked = matches!(
        code,
        ResultCode::Generation | ResultCode::RecordExists | ResultCode::FilteredOut
    );
    let txn_id = request.txn.id()?;
    if !looked || request.header.info2 & info2::WRITE == 0 || !allowed(namespace) {
        return None;
    }
    let partition = namespace.index.partition(request.digest.partition()).read();
    if namespace
        .txn
        .provisional(&request.digest)
        .is_some_and(|held| held.txn_id == txn_id)
    {
        return None;
    }
    partition
        .get(&request.digest)
        .map(|entry| entry.meta())
        .filter(|meta| is_live(namespace, meta, now))
}

/// A write inside a transaction, allowed to go on: its id, deadline, and
/// the provisional version it already holds on the record, if any.
pub struct TxnWrite {
    pub txn_id: u64,
    pub deadline: u32,
    pub own: Option<Version>,
}

/// The transaction checks of a write (put, operate, touch) under the
/// partition's write lock: `None` for a write outside a transaction on a
/// record no transaction holds; 120 for any write on a record another
/// transaction holds; for a transaction's write, 22 when the namespace
/// has `disable-mrt-writes`, 122 past its deadline, 126 when it must lock
/// the record (`info4` lock-only) and already holds it.
pub fn begin_write(
    namespace: &Namespace,
    request: &Request<'_>,
    now: Now,
) -> Result<Option<TxnWrite>, ResultCode> {
    if !allowed(namespace) {
        return Ok(None);
    }
    let held = namespace.txn.provisional(&request.digest);
    let txn_id = request.txn.id();
    if let Some(held) = &held {
        if Some(held.txn_id) != txn_id {
            let stats = &namespace.txn.stats;
            stats.fail_mrt_blocked.fetch_add(1, Ordering::Relaxed);
            return Err(ResultCode::MrtBlocked);
        }
    }
    let Some(txn_id) = txn_id else {
        return Ok(None);
    };
    if namespace.txn.writes_disabled.load(Ordering::Relaxed) {
        return Err(ResultCode::Forbidden);
    }
    let deadline = deadline_of(namespace, request, now)?;
    if held.is_some() && request.header.info4 & info4::ON_LOCKING_ONLY != 0 {
        return Err(ResultCode::MrtAlreadyLocked);
    }
    Ok(Some(TxnWrite {
        txn_id,
        deadline,
        own: held.map(|held| held.version),
    }))
}

/// The deadline a transaction's write carries (field 6), or one
/// `mrt-duration` from now when it carries none; 122 once it has passed.
fn deadline_of(namespace: &Namespace, request: &Request<'_>, now: Now) -> Result<u32, ResultCode> {
    let sent = request.txn.fields.and_then(|fields| fields.deadline);
    let duration = namespace.txn.duration_seconds.load(Ordering::Relaxed);
    let deadline = sent.unwrap_or_else(|| now.citrusleaf_seconds.saturating_add(duration));
    if deadline < now.citrusleaf_seconds {
        return Err(ResultCode::MrtExpired);
    }
    Ok(deadline)
}

/// Keeps what a transaction's write decided as the record's provisional
/// version; called under the partition's write lock.
pub fn keep(namespace: &Namespace, request: &Request<'_>, write: &TxnWrite, version: Version) {
    namespace.txn.keep(
        request.digest,
        Provisional {
            txn_id: write.txn_id,
            deadline: write.deadline,
            version,
        },
    );
}

/// A transaction's delete: the record as the transaction sees it must
/// exist (2) and pass the generation check (3); its provisional version
/// becomes the removal, committed by the roll forward.
fn delete_in(
    namespace: &Namespace,
    request: &Request<'_>,
    fields: TxnFields,
    now: Now,
    out: &mut Vec<u8>,
) -> Result<(), ResultCode> {
    let partition = namespace
        .index
        .partition(request.digest.partition())
        .write();
    let write = begin_write(namespace, request, now)?.ok_or(ResultCode::Parameter)?;
    let generation = match &write.own {
        Some(Version::Store { meta, .. }) => Some(meta.generation),
        Some(Version::Delete) => None,
        None => {
            let live = partition
                .get(&request.digest)
                .map(|entry| entry.meta())
                .filter(|meta| is_live(namespace, meta, now));
            check_read_version(namespace, request, live.as_ref())?;
            live.map(|meta| meta.generation)
        }
    };
    let generation = generation.ok_or(ResultCode::NotFound)?;
    record::check_generation(&request.header, generation)?;
    debug_assert_eq!(Some(write.txn_id), fields.id);
    keep(namespace, request, &write, Version::Delete);
    drop(partition);
    namespace
        .stats
        .client_delete_success
        .fetch_add(1, Ordering::Relaxed);
    record::begin_reply(out, MsgHeader::default(), request.reply).finish();
    Ok(())
}

/// The reference's statistics of `namespace`'s transactions, in its
/// order, as `namespace/NS` lists them (the CE reference lists them too,
/// all 0). `mrt_monitors` and `mrt_monitors_active` both count the open
/// monitors here; no step times out yet, so the `_timeout` counters stay 0.
pub fn stat_pairs(namespace: &Namespace) -> Vec<(String, String)> {
    let stats = &namespace.txn.stats;
    let counters = [
        ("mrt_provisionals", &stats.provisionals),
        ("mrt_monitors", &stats.monitors_active),
        ("mrt_monitors_active", &stats.monitors_active),
        ("mrt_verify_read_success", &stats.verify_read_success),
        ("mrt_verify_read_error", &stats.verify_read_error),
        ("mrt_verify_read_timeout", &stats.verify_read_timeout),
        ("mrt_roll_forward_success", &stats.roll_forward_success),
        ("mrt_roll_forward_error", &stats.roll_forward_error),
        ("mrt_roll_forward_timeout", &stats.never),
        (
            "mrt_monitor_roll_forward_success",
            &stats.monitor_roll_forward_success,
        ),
        ("mrt_monitor_roll_forward_error", &stats.monitor_roll_error),
        ("mrt_monitor_roll_forward_timeout", &stats.never),
        ("mrt_roll_back_success", &stats.roll_back_success),
        ("mrt_roll_back_error", &stats.roll_back_error),
        ("mrt_roll_back_timeout", &stats.never),
        (
            "mrt_monitor_roll_back_success",
            &stats.monitor_roll_back_success,
        ),
        ("mrt_monitor_roll_back_error", &stats.monitor_roll_error),
        ("mrt_monitor_roll_back_timeout", &stats.never),
        ("fail_mrt_blocked", &stats.fail_mrt_blocked),
        (
            "fail_mrt_version_mismatch",
            &stats.fail_mrt_version_mismatch,
        ),
        (
            "mrt_monitor_roll_tombstone_creates",
            &stats.roll_tombstone_creates,
        ),
    ];
    counters
        .into_iter()
        .map(|(name, counter)| (name.to_owned(), counter.load(Ordering::Relaxed).to_string()))
        .collect()
}

/// The transaction settings `get-config` lists for `namespace`:
/// `mrt-duration` (0 on a namespace without transactions, as the CE
/// reference answers) and `disable-mrt-writes`.
pub fn config_pairs(namespace: &Namespace) -> [(String, String); 2] {
    let duration = match allowed(namespace) {
        true => namespace.txn.duration_seconds.load(Ordering::Relaxed),
        false => 0,
    };
    let disabled = namespace.txn.writes_disabled.load(Ordering::Relaxed);
    [
        ("disable-mrt-writes".to_owned(), disabled.to_string()),
        ("mrt-duration".to_owned(), duration.to_string()),
    ]
}

#[cfg(test)]
mod tests;
