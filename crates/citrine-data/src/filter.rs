//! Expressions against a record (protocol 05 §4): the service's views of a
//! record as a [`citrine_exp::Record`], and the filter check every
//! transaction kind applies.
//!
//! Owns: [`RecordView`] (a stored body or an operate's working bins, with
//! the record's metadata) and [`check`] (a filter's outcome as the result
//! the transaction answers).
//!
//! Invariants: a filter passes only when it evaluates to true (false and
//! "unknown" answer FILTERED_OUT, 27, or skip the record in a scan); the
//! set name is looked up only when an expression asks for it.

use crate::clock::Now;
use crate::namespace::Namespace;
pub use citrine_exp::Expression;
use citrine_exp::Truth;
use citrine_index::RecordMeta;
use citrine_record::{Bin, BodyView};
use citrine_types::{ResultCode, CITRUSLEAF_EPOCH_UNIX_SECONDS};
use std::borrow::Cow;
use std::cell::OnceCell;

/// Where a [`RecordView`]'s bins come from.
pub enum Bins<'r> {
    /// The stored body (reads, deletes, the first look of a write).
    Stored(&'r BodyView<'r>),
    /// An operate's working bins, as the ops so far left them.
    Working(&'r [Bin<'r>]),
}

/// The reference's per-record header in its flat storage format, bytes.
const FLAT_RECORD_HEADER: u64 = 35;
/// The reference's storage allocation unit (rblock), bytes.
const RBLOCK: u64 = 16;

/// One record as expressions see it.
pub struct RecordView<'r> {
    pub bins: Bins<'r>,
    pub key: Option<(u8, &'r [u8])>,
    pub digest: &'r [u8; 20],
    /// The live record's metadata; `None` while a write creates it.
    pub meta: Option<RecordMeta>,
    /// The stored size of the record, bytes.
    pub size: u64,
    pub namespace: &'r Namespace,
    /// The record's set: the live record's, or the one a write names.
    set_id: Option<u16>,
    set_name: OnceCell<Vec<u8>>,
}

impl<'r> RecordView<'r> {
    pub fn new(
        namespace: &'r Namespace,
        digest: &'r [u8; 20],
        bins: Bins<'r>,
        key: Option<(u8, &'r [u8])>,
        meta: Option<RecordMeta>,
        size: u64,
    ) -> RecordView<'r> {
        RecordView {
            bins,
            key,
            digest,
            meta,
            size,
            namespace,
            set_id: meta.map(|meta| meta.set_id),
            set_name: OnceCell::new(),
        }
    }

    /// The view of a record in set `set_id` whatever its metadata says:
    /// a write's record is in its set while the write creates it, and
    /// after a delete op of the same operate.
    pub fn in_set(mut self, set_id: u16) -> RecordView<'r> {
        self.set_id = Some(set_id);
        self
    }
}

impl<'r> RecordView<'r> {
    /// The view with its set named `name` (a write's request names the
    /// record's set: its digest is of that set), also while the write
    /// creates the record and no metadata names it yet.
    pub fn with_set_name(self, name: &[u8]) -> RecordView<'r> {
        let _ = self.set_name.set(name.to_vec());
        self
    }

    /// A stored, live record: its body, metadata and stored size.
    pub fn stored(
        namespace: &'r Namespace,
        digest: &'r [u8; 20],
        view: &'r BodyView<'r>,
        meta: RecordMeta,
        size: u64,
    ) -> RecordView<'r> {
        RecordView::new(
            namespace,
            digest,
            Bins::Stored(view),
            view.key(),
            Some(meta),
            size,
        )
    }
}

impl citrine_exp::Record for RecordView<'_> {
    fn bin(&self, name: &[u8]) -> Option<(u8, &[u8])> {
        let bins: &[Bin<'_>] = match &self.bins {
            Bins::Working(bins) => bins,
            Bins::Stored(view) => {
                // A stored body's bins borrow the body itself.
                let bin = view.bin(name)?;
                return match bin.value {
                    Cow::Borrowed(value) => Some((bin.particle_type, value)),
                    Cow::Owned(_) => {
                        debug_assert!(false, "a stored body's bins borrow it");
                        None
                    }
                };
            }
        };
        bins.iter()
            .find(|bin| bin.name.as_ref() == name)
            .map(|bin| (bin.particle_type, bin.value.as_ref()))
    }

    fn key(&self) -> Option<(u8, &[u8])> {
        self.key
    }

    fn digest(&self) -> &[u8; 20] {
        self.digest
    }

    fn set_name(&self) -> &[u8] {
        self.set_name.get_or_init(|| {
            self.set_id
                .and_then(|set_id| self.namespace.sets.name(set_id))
                .unwrap_or_default()
        })
    }

    fn last_update_ms(&self) -> u64 {
        self.meta.map_or(0, |meta| meta.last_update_ms)
    }

    fn void_time_s(&self) -> Option<u64> {
        match self.meta {
            Some(meta) if meta.void_time != 0 => {
                Some(u64::from(meta.void_time) + CITRUSLEAF_EPOCH_UNIX_SECONDS)
            }
            _ => None,
        }
    }

    fn record_size(&self) -> u64 {
        if !self.in_memory() {
            // A device record: the whole rblocks it occupies, header
            // included, as the reference counts its own.
            return self.size;
        }
        // In memory the body alone is stored. Answer what the reference's
        // memory storage (7.0+: flat records in 16-byte rblocks) would:
        // its 35-byte record header, the void time when the record
        // expires, the set name with its length, then the key and bins,
        // rounded up to 16 bytes. Expressions written against the
        // reference ("bigger than 64 bytes") then select alike.
        let void_time = if self.void_time_s().is_some() { 4 } else { 0 };
        let set = self.set_name().len() as u64;
        let set = if set == 0 { 0 } else { 1 + set };
        (FLAT_RECORD_HEADER + void_time + set + self.size).next_multiple_of(RBLOCK)
    }

    fn is_tombstone(&self) -> bool {
        false
    }

    fn exists(&self) -> bool {
        self.meta.is_some()
    }

    fn in_memory(&self) -> bool {
        self.namespace.storage.device().is_none()
    }
}

/// Parses a request's filter (field 43), refusing malformed or unsupported
/// expressions with their result code.
pub fn parse(bytes: &[u8]) -> Result<Expression, ResultCode> {
    Expression::parse(bytes).map_err(citrine_exp::ExpError::result_code)
}

/// Whether a record copy ([`crate::copy::capture`]'s, with a body) passes
/// `filter`: what XDR asks of a record before it ships it (a DC's filter
/// expression). A copy without a body, or one that does not parse, does
/// not pass.
pub fn copy_passes(
    namespace: &Namespace,
    copy: &crate::copy::ReplicaWrite,
    filter: &Expression,
    now: Now,
) -> bool {
    let Some(body) = &copy.body else {
        return false;
    };
    let Ok(view) = BodyView::parse(body) else {
        return false;
    };
    let meta = RecordMeta {
        generation: copy.generation,
        life: copy.life,
        set_id: namespace.sets.existing_id(&copy.set_name).unwrap_or(0),
        void_time: copy.void_time,
        last_update_ms: copy.last_update_ms,
        xdr_write: false,
    };
    let record = RecordView::stored(namespace, &copy.digest.0, &view, meta, body.len() as u64)
        .with_set_name(&copy.set_name);
    check(filter, &record, now).is_ok()
}

/// Applies `filter` to `record`: `Ok` when it passes, FILTERED_OUT (27)
/// otherwise (counted in `namespace`'s `client_*_filtered_out` by the
/// caller's failure accounting).
pub fn check(filter: &Expression, record: &RecordView<'_>, now: Now) -> Result<(), ResultCode> {
    match filter.filter(record, now.unix_ms) {
        Truth::True => Ok(()),
        Truth::False | Truth::Unknown => Err(ResultCode::FilteredOut),
    }
}
