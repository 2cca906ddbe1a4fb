//! Truncation thresholds as data: a namespace's or one set's threshold
//! taking effect on this node ([`take_effect`]: durable on the device
//! first, then in the namespace's thresholds, which every read and write
//! checks from then on), and the removal of the records already held that
//! it covers ([`Removal`]). Which thresholds the cluster shares, and when,
//! is the distribution layer's; this module knows one node.
//!
//! Invariant: a threshold only grows (`fetch_max`); a record last updated
//! before its set's threshold is never live again, removed or not yet.

use crate::namespace::Namespace;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Puts a threshold into effect here: recorded on the device first (a
/// device namespace's restart must not load the covered records again),
/// then in the namespace's thresholds. Returns the set's id (`None` for the
/// whole namespace); a set this node never stored gets its id now, so the
/// threshold covers its records that arrive later.
pub fn take_effect(
    namespace: &Namespace,
    set: Option<&str>,
    lut_ms: u64,
) -> Result<Option<u16>, String> {
    if let Some(device) = namespace.storage.device() {
        device
            .persist_truncation(set.map(str::as_bytes), lut_ms)
            .map_err(|error| format!("cannot persist the truncation: {error}"))?;
    }
    match set {
        Some(set) => {
            let id = namespace
                .sets
                .id_of(set.as_bytes())
                .ok_or_else(|| format!("set {set:?} cannot be created: too many sets"))?;
            namespace
                .sets
                .truncation(id)
                .fetch_max(lut_ms, Ordering::Relaxed);
            Ok(Some(id))
        }
        None => {
            namespace
                .stats
                .truncate_lut_ms
                .fetch_max(lut_ms, Ordering::Relaxed);
            Ok(None)
        }
    }
}

/// Records already held that a threshold covers, still to be removed. The
/// caller decides where it runs (inline, or on a thread the server owns).
pub struct Removal {
    pub namespace: Arc<Namespace>,
    pub set_id: Option<u16>,
    pub lut_ms: u64,
}

impl Removal {
    /// Removes the records (a walk of every partition under its lock).
    pub fn run(self) {
        let removed = crate::nsup::remove_truncated(&self.namespace, self.set_id, self.lut_ms);
        tracing::info!(namespace = %self.namespace.config.name, set_id = ?self.set_id, lut_ms = self.lut_ms, removed, "truncated");
    }
}
