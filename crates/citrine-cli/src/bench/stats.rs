//! Latency and throughput accounting of the benchmark.
//!
//! Owns [`OpStats`] (an HDR histogram of microsecond latencies plus error
//! counters for one op type) and the percentile summary printed each second
//! and at the end. Invariants: latencies are recorded in µs with 3
//! significant digits (relative error ≤ 0.1 %), values above the histogram's
//! top (60 s) are clamped, and merging two `OpStats` gives exactly the stats
//! of the union of their samples.

use hdrhistogram::Histogram;
use std::collections::BTreeMap;

/// Highest latency tracked, in µs (60 s).
pub const MAX_LATENCY_US: u64 = 60_000_000;

/// Samples of one op type.
#[derive(Clone, Debug)]
pub struct OpStats {
    pub histogram: Histogram<u64>,
    /// Failed commands (any error).
    pub errors: u64,
    /// Of which client timeouts.
    pub timeouts: u64,
    /// Reads of missing records (success, counted apart).
    pub not_found: u64,
    /// Generation conflicts (read-modify-write).
    pub conflicts: u64,
    /// Errors by kind (`code 8`, `timeout`, `network`, ...).
    pub error_kinds: BTreeMap<String, u64>,
}

impl Default for OpStats {
    fn default() -> OpStats {
        OpStats::new()
    }
}

impl OpStats {
    pub fn new() -> OpStats {
        OpStats {
            histogram: new_histogram(),
            errors: 0,
            timeouts: 0,
            not_found: 0,
            conflicts: 0,
            error_kinds: BTreeMap::new(),
        }
    }

    /// Records one successful command's latency.
    pub fn record_us(&mut self, latency_us: u64) {
        self.histogram
            .saturating_record(latency_us.clamp(1, MAX_LATENCY_US));
    }

    /// Number of successful commands recorded.
    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    /// Adds another set of samples.
    pub fn merge(&mut self, other: &OpStats) {
        let _ = self.histogram.add(&other.histogram);
        self.errors += other.errors;
        self.timeouts += other.timeouts;
        self.not_found += other.not_found;
        self.conflicts += other.conflicts;
        for (kind, count) in &other.error_kinds {
            *self.error_kinds.entry(kind.clone()).or_default() += count;
        }
    }

    /// Counts one failed command of `kind`.
    pub fn record_error(&mut self, kind: &str, is_timeout: bool) {
        self.errors += 1;
        if is_timeout {
            self.timeouts += 1;
        }
        *self.error_kinds.entry(kind.to_owned()).or_default() += 1;
    }

    /// Latency at quantile `q` (0..=1), in ms.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        if self.histogram.is_empty() {
            return 0.0;
        }
        self.histogram.value_at_quantile(q) as f64 / 1000.0
    }

    /// Percentile summary.
    pub fn summary(&self, seconds: f64) -> Summary {
        let count = self.count();
        Summary {
            count,
            ops_per_sec: if seconds > 0.0 {
                count as f64 / seconds
            } else {
                0.0
            },
            mean_ms: if count == 0 {
                0.0
            } else {
                self.histogram.mean() / 1000.0
            },
            p50_ms: self.quantile_ms(0.50),
            p90_ms: self.quantile_ms(0.90),
            p99_ms: self.quantile_ms(0.99),
            p999_ms: self.quantile_ms(0.999),
            p9999_ms: self.quantile_ms(0.9999),
            max_ms: if count == 0 {
                0.0
            } else {
                self.histogram.max() as f64 / 1000.0
            },
            errors: self.errors,
            timeouts: self.timeouts,
            not_found: self.not_found,
            conflicts: self.conflicts,
            error_kinds: self.error_kinds.clone(),
        }
    }
}

/// A µs histogram from 1 µs to [`MAX_LATENCY_US`], 3 significant digits.
fn new_histogram() -> Histogram<u64> {
    // These bounds are valid constants, so the first constructor cannot fail;
    // the auto-resizing fallback keeps the code free of unwraps anyway.
    match Histogram::new_with_bounds(1, MAX_LATENCY_US, 3) {
        Ok(histogram) => histogram,
        Err(_) => match Histogram::new(2) {
            Ok(histogram) => histogram,
            Err(_) => std::process::abort(),
        },
    }
}

/// Figures of one op type over an interval.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub count: u64,
    pub ops_per_sec: f64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub p9999_ms: f64,
    pub max_ms: f64,
    pub errors: u64,
    pub timeouts: u64,
    pub not_found: u64,
    pub conflicts: u64,
    pub error_kinds: BTreeMap<String, u64>,
}

impl Summary {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "count": self.count,
            "ops_per_sec": round3(self.ops_per_sec),
            "mean_ms": round3(self.mean_ms),
            "p50_ms": round3(self.p50_ms),
            "p90_ms": round3(self.p90_ms),
            "p99_ms": round3(self.p99_ms),
            "p99_9_ms": round3(self.p999_ms),
            "p99_99_ms": round3(self.p9999_ms),
            "max_ms": round3(self.max_ms),
            "errors": self.errors,
            "timeouts": self.timeouts,
            "not_found": self.not_found,
            "generation_conflicts": self.conflicts,
            "error_kinds": self.error_kinds,
        })
    }
}

/// Rounds to 3 decimals for reports.
pub fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(actual: f64, expected: f64) -> bool {
        (actual - expected).abs() <= expected * 0.002 + 1e-9
    }

    #[test]
    fn percentiles_of_a_known_sequence() {
        let mut stats = OpStats::new();
        for us in 1..=10_000 {
            stats.record_us(us);
        }
        let summary = stats.summary(2.0);
        assert_eq!(summary.count, 10_000);
        assert!(close(summary.ops_per_sec, 5000.0));
        assert!(close(summary.p50_ms, 5.0), "{}", summary.p50_ms);
        assert!(close(summary.p90_ms, 9.0), "{}", summary.p90_ms);
        assert!(close(summary.p99_ms, 9.9), "{}", summary.p99_ms);
        assert!(close(summary.p999_ms, 9.99), "{}", summary.p999_ms);
        assert!(close(summary.max_ms, 10.0), "{}", summary.max_ms);
        assert!(close(summary.mean_ms, 5.0005), "{}", summary.mean_ms);
    }

    #[test]
    fn tail_is_seen_by_high_percentiles_only() {
        let mut stats = OpStats::new();
        for _ in 0..999 {
            stats.record_us(100);
        }
        stats.record_us(50_000);
        assert!(close(stats.quantile_ms(0.5), 0.1));
        assert!(close(stats.quantile_ms(0.99), 0.1));
        assert!(close(stats.quantile_ms(0.9999), 50.0));
    }

    #[test]
    fn merging_equals_recording_everything() {
        let mut a = OpStats::new();
        let mut b = OpStats::new();
        let mut all = OpStats::new();
        for us in 1..=1000u64 {
            let target = if us % 3 == 0 { &mut a } else { &mut b };
            target.record_us(us * 7);
            all.record_us(us * 7);
        }
        a.record_error("code 8", false);
        a.record_error("code 8", false);
        b.record_error("timeout", true);
        a.merge(&b);
        assert_eq!(a.error_kinds.get("code 8"), Some(&2));
        assert_eq!(a.error_kinds.get("timeout"), Some(&1));
        assert_eq!(a.count(), all.count());
        for q in [0.5, 0.9, 0.99, 0.999] {
            assert_eq!(a.quantile_ms(q), all.quantile_ms(q));
        }
        assert_eq!((a.errors, a.timeouts), (3, 1));
    }

    #[test]
    fn clamps_and_empty() {
        let mut stats = OpStats::new();
        assert_eq!(stats.summary(1.0).p99_ms, 0.0);
        stats.record_us(0);
        stats.record_us(u64::MAX);
        assert_eq!(stats.count(), 2);
        assert!(stats.quantile_ms(1.0) >= 59_000.0);
    }
}
