//! Eviction and stop-writes thresholds in the info protocol:
//! `evict-hist-buckets`, `evict-tenths-pct`,
//! `storage-engine.evict-used-pct`, `storage-engine.stop-writes-avail-pct`
//! and `storage-engine.stop-writes-used-pct` in
//! `get-config:context=namespace` (the reference's names).
//!
//! Invariant: what `get-config` shows is the live value the stop-writes
//! check and nsup read ([`citrine_data::config::Thresholds`]), not the
//! configuration file's.

use crate::namespace::Namespace;

/// The thresholds of `namespace`, as `get-config` lists them.
pub(crate) fn config_pairs(namespace: &Namespace) -> Vec<(String, String)> {
    let thresholds = &namespace.thresholds;
    vec![
        (
            "evict-hist-buckets".to_owned(),
            thresholds.evict_hist_buckets().to_string(),
        ),
        (
            "evict-tenths-pct".to_owned(),
            thresholds.evict_tenths_pct().to_string(),
        ),
        (
            "storage-engine.evict-used-pct".to_owned(),
            thresholds.evict_used_pct().to_string(),
        ),
        (
            "storage-engine.stop-writes-avail-pct".to_owned(),
            thresholds.stop_writes_avail_pct().to_string(),
        ),
        (
            "storage-engine.stop-writes-used-pct".to_owned(),
            thresholds.stop_writes_used_pct().to_string(),
        ),
    ]
}
