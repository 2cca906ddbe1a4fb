//! A namespace's eviction and stop-writes thresholds, which
//! `set-config:context=namespace` changes at run time (the reference's
//! names): `evict-used-pct`, `stop-writes-used-pct`,
//! `stop-writes-avail-pct`, `evict-tenths-pct` and `evict-hist-buckets`.
//!
//! Invariants: every value is one a configuration file or a `set-config`
//! accepted (percentages 0 to 100, buckets 100 to 10 000 000); each is
//! read with one relaxed load, so a write's stop-writes check costs no
//! lock, and a change is seen by the next check or eviction pass. The
//! values are independent: like the reference, a run-time change does not
//! compare `evict-used-pct` with `stop-writes-used-pct` (a configuration
//! file does).

use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};

/// Default `evict-tenths-pct`: one eviction pass removes at most 0.5 % of
/// the namespace's records (the reference's default).
pub const EVICT_TENTHS_PCT_DEFAULT: u32 = 5;
/// Default `evict-hist-buckets` (the reference's).
pub const EVICT_HIST_BUCKETS_DEFAULT: u32 = 10_000;
/// The range of `evict-hist-buckets` the reference accepts.
pub const EVICT_HIST_BUCKETS_RANGE: std::ops::RangeInclusive<u32> = 100..=10_000_000;

/// The thresholds, each an atomic.
#[derive(Debug)]
pub struct Thresholds {
    evict_used_pct: AtomicU8,
    stop_writes_used_pct: AtomicU8,
    stop_writes_avail_pct: AtomicU8,
    evict_tenths_pct: AtomicU32,
    evict_hist_buckets: AtomicU32,
}

impl Thresholds {
    /// The percentages given, eviction's pace at the defaults.
    pub fn new(evict_used_pct: u8, stop_writes_used_pct: u8, stop_writes_avail_pct: u8) -> Self {
        Thresholds {
            evict_used_pct: AtomicU8::new(evict_used_pct.min(100)),
            stop_writes_used_pct: AtomicU8::new(stop_writes_used_pct.min(100)),
            stop_writes_avail_pct: AtomicU8::new(stop_writes_avail_pct.min(100)),
            evict_tenths_pct: AtomicU32::new(EVICT_TENTHS_PCT_DEFAULT),
            evict_hist_buckets: AtomicU32::new(EVICT_HIST_BUCKETS_DEFAULT),
        }
    }

    /// `evict-used-pct` (0: never evict).
    pub fn evict_used_pct(&self) -> u8 {
        self.evict_used_pct.load(Ordering::Relaxed)
    }

    /// `stop-writes-used-pct` (0: never by use).
    pub fn stop_writes_used_pct(&self) -> u8 {
        self.stop_writes_used_pct.load(Ordering::Relaxed)
    }

    /// `stop-writes-avail-pct` (0: never by free space).
    pub fn stop_writes_avail_pct(&self) -> u8 {
        self.stop_writes_avail_pct.load(Ordering::Relaxed)
    }

    /// `evict-tenths-pct`: the most records one eviction pass removes, in
    /// tenths of a percent of the namespace's records.
    pub fn evict_tenths_pct(&self) -> u32 {
        self.evict_tenths_pct.load(Ordering::Relaxed)
    }

    /// `evict-hist-buckets`: buckets of an eviction pass's void-time
    /// histogram.
    pub fn evict_hist_buckets(&self) -> u32 {
        self.evict_hist_buckets.load(Ordering::Relaxed)
    }

    /// Sets `evict-used-pct`; `None` (nothing changed) above 100.
    pub fn set_evict_used_pct(&self, pct: u8) -> Option<()> {
        store_pct(&self.evict_used_pct, pct)
    }

    /// Sets `stop-writes-used-pct`; `None` (nothing changed) above 100.
    pub fn set_stop_writes_used_pct(&self, pct: u8) -> Option<()> {
        store_pct(&self.stop_writes_used_pct, pct)
    }

    /// Sets `stop-writes-avail-pct`; `None` (nothing changed) above 100.
    pub fn set_stop_writes_avail_pct(&self, pct: u8) -> Option<()> {
        store_pct(&self.stop_writes_avail_pct, pct)
    }

    /// Sets `evict-tenths-pct` (any value: above 1000 a pass may evict
    /// every record with a void time, as the reference).
    pub fn set_evict_tenths_pct(&self, tenths: u32) {
        self.evict_tenths_pct.store(tenths, Ordering::Relaxed);
    }

    /// Sets `evict-hist-buckets`; `None` (nothing changed) outside
    /// [`EVICT_HIST_BUCKETS_RANGE`].
    pub fn set_evict_hist_buckets(&self, buckets: u32) -> Option<()> {
        EVICT_HIST_BUCKETS_RANGE.contains(&buckets).then(|| {
            self.evict_hist_buckets.store(buckets, Ordering::Relaxed);
        })
    }

    /// The most records one eviction pass may remove out of `objects`
    /// (`evict-tenths-pct` tenths of a percent of them, rounded down).
    pub fn evict_max_objects(&self, objects: u64) -> u64 {
        let tenths = u128::from(self.evict_tenths_pct());
        (u128::from(objects) * tenths / 1000).min(u128::from(u64::MAX)) as u64
    }
}

fn store_pct(cell: &AtomicU8, pct: u8) -> Option<()> {
    (pct <= 100).then(|| cell.store(pct, Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_refuse_impossible_values_and_keep_the_old_one() {
        let thresholds = Thresholds::new(0, 70, 5);
        assert_eq!(thresholds.set_evict_used_pct(101), None);
        assert_eq!(thresholds.evict_used_pct(), 0);
        assert_eq!(thresholds.set_stop_writes_used_pct(100), Some(()));
        assert_eq!(thresholds.stop_writes_used_pct(), 100);
        assert_eq!(thresholds.set_evict_hist_buckets(99), None);
        assert_eq!(thresholds.set_evict_hist_buckets(10_000_001), None);
        assert_eq!(thresholds.evict_hist_buckets(), EVICT_HIST_BUCKETS_DEFAULT);
        assert_eq!(thresholds.set_evict_hist_buckets(100), Some(()));
    }

    #[test]
    fn evict_max_objects_is_tenths_of_a_percent() {
        let thresholds = Thresholds::new(0, 70, 5);
        assert_eq!(thresholds.evict_max_objects(1_000_000), 5_000);
        assert_eq!(thresholds.evict_max_objects(199), 0);
        thresholds.set_evict_tenths_pct(u32::MAX);
        assert_eq!(thresholds.evict_max_objects(u64::MAX), u64::MAX);
    }
}
