//! Truncation thresholds as data: a namespace's or one set's threshold
//! taking effect on this node ([`take_effect`]: durable on the device
//! first, then in the namespace's thresholds, which every read and write
//! checks from then on), and the removal of the records already held that
//! it covers ([`Removal`]). Which thresholds the cluster shares, and when,
//! is the distribution layer's; this module knows one node.
//!
//! Invariants:
//! - a record last updated before its set's threshold is not live, removed
//!   or not yet;
//! - a threshold is raised by a truncation and lowered (to 0, or to a
//!   later truncation's earlier lut) only by an undone one: what was
//!   removed stays removed, the records not removed yet are live again
//!   (a removal under way stops taking them), and a device namespace's
//!   cold start loads again what the device still holds of the rest, as
//!   the reference's `truncate-undo` allows.

use crate::namespace::Namespace;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Puts a threshold into effect here, as it now is (raised or lowered; 0:
/// none): recorded on the device first (a device namespace's restart must
/// not load the covered records again), then in the namespace's
/// thresholds. A set that does not exist here yet gets the threshold when
/// its first record comes. Returns the removal a raised threshold calls
/// for (`None` when it was not raised, or covers no record held here).
pub fn take_effect(
    namespace: &Arc<Namespace>,
    set: Option<&str>,
    lut_ms: u64,
) -> Result<Option<Removal>, String> {
    if let Some(device) = namespace.storage.device() {
        device
            .persist_truncation(set.map(str::as_bytes), lut_ms)
            .map_err(|error| format!("cannot persist the truncation: {error}"))?;
    }
    let (previous, set_id) = match set {
        Some(set) => {
            let sets = &namespace.sets;
            let previous = sets
                .existing_id(set.as_bytes())
                .map_or(0, |id| sets.truncation(id).load(Ordering::Relaxed));
            match sets.set_truncation(set.as_bytes(), lut_ms) {
                Some(id) => (previous, Some(id)),
                // No record of it here: nothing to remove.
                None => return Ok(None),
            }
        }
        None => (
            namespace
                .stats
                .truncate_lut_ms
                .swap(lut_ms, Ordering::Relaxed),
            None,
        ),
    };
    Ok((lut_ms > previous).then(|| Removal {
        namespace: Arc::clone(namespace),
        set_id,
        lut_ms,
    }))
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
