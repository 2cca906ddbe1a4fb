//! ACT's latency histograms: power-of-two buckets of milliseconds (or
//! microseconds with `microsecond-histograms`), counted since the start of
//! the run and printed in ACT's format so its `act_latency.py` can read the
//! output.
//!
//! Bucket 0 holds latencies under one unit; bucket `b ≥ 1` holds those in
//! `[2^(b-1), 2^b)` units (a latency's bucket is the bit length of its whole
//! units). So "over 2^k units" is the sum of buckets `k+1` and above.
//!
//! Invariants: counts only grow ([`Histogram`] is shared by the I/O threads,
//! one atomic add per latency); a [`Counts`] is a snapshot, and the
//! difference of two snapshots of one histogram (later minus earlier) is the
//! latencies of the time between them.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// Buckets: 0 and the bit lengths 1..=64 of a `u64`.
pub const BUCKETS: usize = 65;

/// The unit of a histogram's buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    Millis,
    Micros,
}

impl Scale {
    fn nanos_per_unit(self) -> u64 {
        match self {
            Scale::Millis => 1_000_000,
            Scale::Micros => 1_000,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Scale::Millis => "ms",
            Scale::Micros => "us",
        }
    }
}

/// The bucket of a latency of `nanos` nanoseconds.
pub fn bucket_of(nanos: u64, scale: Scale) -> usize {
    let units = nanos / scale.nanos_per_unit();
    (u64::BITS - units.leading_zeros()) as usize
}

/// The first bucket whose latencies all exceed `threshold` units (a power
/// of two): latencies `≥ threshold`, ACT's "over `threshold`".
pub fn first_bucket_over(threshold: u64) -> usize {
    (u64::BITS - threshold.max(1).leading_zeros()) as usize
}

/// A histogram the I/O threads add to.
pub struct Histogram {
    scale: Scale,
    counts: [AtomicU64; BUCKETS],
}

impl Histogram {
    pub fn new(scale: Scale) -> Histogram {
        Histogram {
            scale,
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Counts one latency.
    pub fn insert(&self, nanos: u64) {
        self.counts[bucket_of(nanos, self.scale)].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far.
    pub fn snapshot(&self) -> Counts {
        Counts {
            scale: self.scale,
            buckets: std::array::from_fn(|b| self.counts[b].load(Ordering::Relaxed)),
        }
    }
}

/// Bucket counts at one moment (or between two moments).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counts {
    pub scale: Scale,
    pub buckets: [u64; BUCKETS],
}

impl Counts {
    pub fn empty(scale: Scale) -> Counts {
        Counts {
            scale,
            buckets: [0; BUCKETS],
        }
    }

    pub fn total(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// The latencies counted since `earlier` (a snapshot of the same histogram).
    pub fn since(&self, earlier: &Counts) -> Counts {
        Counts {
            scale: self.scale,
            buckets: std::array::from_fn(|b| self.buckets[b].saturating_sub(earlier.buckets[b])),
        }
    }

    /// Percentage of latencies at or over `threshold` units (a power of
    /// two); `None` when nothing was counted.
    pub fn percent_over(&self, threshold: u64) -> Option<f64> {
        let total = self.total();
        if total == 0 {
            return None;
        }
        let over: u64 = self.buckets[first_bucket_over(threshold)..].iter().sum();
        Some(over as f64 * 100.0 / total as f64)
    }

    /// ACT's dump: `TAG (N total)`, then the non-zero buckets as
    /// ` (BB: NNNNNNNNNN)`, four to a line.
    pub fn dump(&self, tag: &str) -> String {
        let mut out = format!("{tag} ({} total)\n", self.total());
        let nonzero: Vec<(usize, u64)> = self
            .buckets
            .iter()
            .enumerate()
            .filter(|(_, count)| **count != 0)
            .map(|(bucket, count)| (bucket, *count))
            .collect();
        for line in nonzero.chunks(4) {
            for (bucket, count) in line {
                let _ = write!(out, " ({bucket:02}: {count:010})");
            }
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn buckets_are_bit_lengths_of_whole_units() {
        let ms = |nanos| bucket_of(nanos, Scale::Millis);
        assert_eq!(ms(0), 0);
        assert_eq!(ms(MS - 1), 0);
        assert_eq!(ms(MS), 1);
        assert_eq!(ms(2 * MS - 1), 1);
        assert_eq!(ms(2 * MS), 2);
        assert_eq!(ms(7 * MS + MS / 2), 3);
        assert_eq!(ms(8 * MS), 4);
        assert_eq!(ms(64 * MS), 7);
        assert_eq!(ms(u64::MAX), 45);
        assert_eq!(bucket_of(1_500, Scale::Micros), 1);
        assert_eq!(bucket_of(999, Scale::Micros), 0);
        assert_eq!(bucket_of(u64::MAX, Scale::Micros), 55);
    }

    #[test]
    fn over_a_threshold_starts_at_its_bucket() {
        assert_eq!(first_bucket_over(1), 1);
        assert_eq!(first_bucket_over(2), 2);
        assert_eq!(first_bucket_over(8), 4);
        assert_eq!(first_bucket_over(64), 7);
    }

    #[test]
    fn percentages_and_differences() {
        let histogram = Histogram::new(Scale::Millis);
        for _ in 0..90 {
            histogram.insert(MS / 2);
        }
        let first = histogram.snapshot();
        assert_eq!(first.percent_over(1), Some(0.0));
        for _ in 0..6 {
            histogram.insert(MS + 1);
        }
        for _ in 0..3 {
            histogram.insert(9 * MS);
        }
        histogram.insert(100 * MS);
        let second = histogram.snapshot();
        assert_eq!(second.total(), 100);
        assert_eq!(second.percent_over(1), Some(10.0));
        assert_eq!(second.percent_over(2), Some(4.0));
        assert_eq!(second.percent_over(8), Some(4.0));
        assert_eq!(second.percent_over(16), Some(1.0));
        assert_eq!(second.percent_over(64), Some(1.0));
        let between = second.since(&first);
        assert_eq!(between.total(), 10);
        assert_eq!(between.percent_over(1), Some(100.0));
        assert_eq!(between.percent_over(8), Some(40.0));
        assert_eq!(Counts::empty(Scale::Millis).percent_over(1), None);
    }

    #[test]
    fn dump_is_acts_format() {
        let histogram = Histogram::new(Scale::Millis);
        assert_eq!(histogram.snapshot().dump("reads"), "reads (0 total)\n");
        for (bucket_ms, times) in [(0u64, 1990u64), (1, 7), (2, 1), (4, 1), (8, 1)] {
            for _ in 0..times {
                histogram.insert(bucket_ms * MS);
            }
        }
        assert_eq!(
            histogram.snapshot().dump("reads"),
            "reads (2000 total)\n \
             (00: 0000001990) (01: 0000000007) (02: 0000000001) (03: 0000000001)\n \
             (04: 0000000001)\n"
        );
    }
}
