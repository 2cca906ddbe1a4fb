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
//! Invariant: lookahead never changes what a request does. It reads the
//! frame without validating it (the request's own parse does that), and a
//! wrong or stale guess costs a wasted prefetch, nothing else.

use crate::Service;
use citrine_types::Digest;
use citrine_wire::msg::{field_type, info1, MSG_HEADER_SIZE};

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

impl Service {
    /// The lookup a single-record AS_MSG body (the frame after its proto
    /// header) will make; `None` for batches, scans, unknown namespaces and
    /// anything malformed.
    pub fn lookup_of(&self, body: &[u8]) -> Option<Lookup> {
        if body.len() < MSG_HEADER_SIZE || body[1] & info1::BATCH != 0 {
            return None;
        }
        let fields = u16::from_be_bytes([body[18], body[19]]);
        let mut rest = &body[MSG_HEADER_SIZE..];
        let mut namespace = None;
        let mut digest = None;
        for _ in 0..fields {
            let size = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
            let field = rest.get(4..4usize.checked_add(size)?)?;
            let (&kind, data) = field.split_first()?;
            match kind {
                field_type::NAMESPACE => namespace = Some(data),
                field_type::DIGEST => digest = Some(Digest(data.try_into().ok()?)),
                _ => {}
            }
            if let (Some(name), Some(digest)) = (namespace, digest) {
                let namespace = self
                    .namespaces
                    .iter()
                    .position(|namespace| namespace.config.name.as_bytes() == name)?;
                return Some(Lookup { namespace, digest });
            }
            rest = &rest[4 + size..];
        }
        None
    }

    /// Starts the cache misses of `lookups` in three waves: every
    /// partition's lock line; every record's first tag and slot (whose
    /// addresses are read from the partition lines the first wave loaded);
    /// every in-memory record's body (found through the lines the second
    /// wave loaded).
    pub fn prefetch(&self, lookups: &[Lookup]) {
        for lookup in lookups {
            if let Some(namespace) = self.namespaces.get(lookup.namespace) {
                namespace
                    .index
                    .prefetch_partition(lookup.digest.partition());
            }
        }
        for lookup in lookups {
            if let Some(namespace) = self.namespaces.get(lookup.namespace) {
                namespace.index.prefetch_record(&lookup.digest);
            }
        }
        for lookup in lookups {
            if let Some(namespace) = self.namespaces.get(lookup.namespace) {
                namespace.index.prefetch_body(&lookup.digest);
            }
        }
    }
}
