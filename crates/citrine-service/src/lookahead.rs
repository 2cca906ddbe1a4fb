//! Lookahead: where a single-record request's index lookup will go, read
//! from its frame before it runs, so a service thread can start the cache
//! misses of every request of one wake-up at once.
//!
//! A lookup misses the cache up to three times (the partition's lock word,
//! the table's tag bytes, the slot), one after the other. Run one request
//! after another, a batch of N requests stalls 3N times in sequence;
//! prefetched first, the misses of the whole batch overlap
//! (`bench/RESULTS.md` has the measurement).
//!
//! It reads only the data layer (the namespaces' indexes); dispatch
//! ([`crate::Service::lookup_of`], [`crate::Service::prefetch`]) calls it.
//!
//! Invariant: lookahead never changes what a request does. It reads the
//! frame without validating it (the request's own parse does that), and a
//! wrong or stale guess costs a wasted prefetch, nothing else.

use citrine_data::Data;
use citrine_index::PartitionTable;
use citrine_types::Digest;
use citrine_wire::msg::{field_type, info1, FieldIter, MsgHeader};

/// One request's index lookup: the namespace (by position) and digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lookup {
    namespace: usize,
    digest: Digest,
}

impl Lookup {
    /// The lookup of `digest` in the namespace at position `namespace`.
    pub fn new(namespace: usize, digest: Digest) -> Lookup {
        Lookup { namespace, digest }
    }
}

/// The lookup a single-record AS_MSG body (the frame after its proto
/// header) will make in `data`; `None` for batches, scans, unknown
/// namespaces and anything malformed.
pub fn lookup_of(data: &Data, body: &[u8]) -> Option<Lookup> {
    let header = MsgHeader::decode(body).ok()?;
    if header.info1 & info1::BATCH != 0 {
        return None;
    }
    let mut namespace = None;
    let mut digest = None;
    for field in FieldIter::unchecked(body).take(usize::from(header.n_fields)) {
        match field.field_type {
            field_type::NAMESPACE => namespace = Some(field.data),
            field_type::DIGEST => digest = Some(Digest(field.data.try_into().ok()?)),
            _ => {}
        }
        if let (Some(name), Some(digest)) = (namespace, digest) {
            let namespace = data.namespace_index(name)?;
            return Some(Lookup { namespace, digest });
        }
    }
    None
}

/// The index a lookup goes to.
fn index_of<'d>(data: &'d Data, lookup: &Lookup) -> Option<&'d PartitionTable> {
    data.namespaces_shared()
        .get(lookup.namespace)
        .map(|namespace| &namespace.index)
}

/// Starts the cache misses of `lookups` in `data` in three waves: every
/// partition's lock line; every record's first tag and slot (whose
/// addresses are read from the partition lines the first wave loaded);
/// every in-memory record's body (found through the lines the second wave
/// loaded).
pub fn prefetch(data: &Data, lookups: &[Lookup]) {
    for lookup in lookups {
        if let Some(index) = index_of(data, lookup) {
            index.prefetch_partition(lookup.digest.partition());
        }
    }
    for lookup in lookups {
        if let Some(index) = index_of(data, lookup) {
            index.prefetch_record(&lookup.digest);
        }
    }
    for lookup in lookups {
        if let Some(index) = index_of(data, lookup) {
            index.prefetch_body(&lookup.digest);
        }
    }
}
