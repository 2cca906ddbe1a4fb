//! What ACT's `act_latency.py` does with ACT's output, and the pass
//! criteria: the share of reads over 1, 2, 4, ... 64 ms, per report interval
//! and per slice (an hour by default), with the slices' average and maximum;
//! the verdict (in every slice fewer than 5 % of reads over 1 ms, 1 % over
//! 8 ms and 0.1 % over 64 ms); and the ramp's rule (paper 002: raise the
//! load until the 95th percentile of reads exceeds 2 ms, i.e. more than 5 %
//! of reads take 2 ms or more).
//!
//! Invariants: pure functions of snapshots (cumulative counts taken at the
//! end of each interval, in time order); a slice with no reads counts as
//! meeting the criteria and shows `-`.

use super::hist::Counts;
use std::fmt::Write as _;

/// The thresholds ACT's analysis shows, in histogram units.
pub const THRESHOLDS: [u64; 7] = [1, 2, 4, 8, 16, 32, 64];

/// The pass criteria: (threshold in ms, the share of reads that must stay
/// below it, in percent).
pub const CRITERIA: [(u64, f64); 3] = [(1, 5.0), (8, 1.0), (64, 0.1)];

/// The ramp's limit: p95 over 2 ms = more than 5 % of reads at or over 2 ms.
pub const RAMP_THRESHOLD_MS: u64 = 2;
pub const RAMP_MAX_SHARE_PCT: f64 = 5.0;

/// Shares over each of [`THRESHOLDS`] (None when nothing was counted).
pub fn shares(counts: &Counts) -> [Option<f64>; 7] {
    THRESHOLDS.map(|threshold| counts.percent_over(threshold))
}

/// One line of shares: `1: 0.35  2: 0.10 ...`.
pub fn shares_line(counts: &Counts) -> String {
    let mut out = String::new();
    for (threshold, share) in THRESHOLDS.iter().zip(shares(counts)) {
        let _ = match share {
            Some(share) => write!(out, " {threshold}: {share:.2}"),
            None => write!(out, " {threshold}: -"),
        };
    }
    out
}

/// One slice of the run: its last second and its counts.
#[derive(Debug, Clone, PartialEq)]
pub struct Slice {
    pub end_sec: u64,
    pub counts: Counts,
}

/// Cuts the run into slices of `slice_sec` from its cumulative snapshots
/// `(second, counts)`: a slice ends at the first snapshot at or past each
/// multiple of `slice_sec`, and the last snapshot ends the last slice.
pub fn slices(snapshots: &[(u64, Counts)], slice_sec: u64) -> Vec<Slice> {
    let mut out = Vec::new();
    let Some((_, first)) = snapshots.first() else {
        return out;
    };
    let mut previous = Counts::empty(first.scale);
    let mut boundary = slice_sec.max(1);
    for (index, (sec, counts)) in snapshots.iter().enumerate() {
        let last = index + 1 == snapshots.len();
        if *sec >= boundary || last {
            out.push(Slice {
                end_sec: *sec,
                counts: counts.since(&previous),
            });
            previous = counts.clone();
            while boundary <= *sec {
                boundary += slice_sec.max(1);
            }
        }
    }
    out
}

/// act_latency's table: a row of shares per slice, then `avg` and `max`.
pub fn table(name: &str, slices: &[Slice]) -> String {
    let unit = slices
        .first()
        .map_or("ms", |slice| slice.counts.scale.name());
    let mut out = format!("        {name}\n        %>({unit})\nslice  ");
    let rule = "-----  ".to_string() + &" ------".repeat(THRESHOLDS.len()) + "\n";
    for threshold in THRESHOLDS {
        let _ = write!(out, " {threshold:>6}");
    }
    out.push('\n');
    out.push_str(&rule);
    let rows: Vec<[Option<f64>; 7]> = slices.iter().map(|slice| shares(&slice.counts)).collect();
    for (index, row) in rows.iter().enumerate() {
        out.push_str(&row_line(&(index + 1).to_string(), row));
    }
    out.push_str(&rule);
    out.push_str(&row_line(
        "avg",
        &column(&rows, |values| {
            values.iter().sum::<f64>() / values.len() as f64
        }),
    ));
    out.push_str(&row_line(
        "max",
        &column(&rows, |values| values.iter().copied().fold(0.0, f64::max)),
    ));
    out
}

fn column(rows: &[[Option<f64>; 7]], reduce: impl Fn(&[f64]) -> f64) -> [Option<f64>; 7] {
    std::array::from_fn(|index| {
        let values: Vec<f64> = rows.iter().filter_map(|row| row[index]).collect();
        (!values.is_empty()).then(|| reduce(&values))
    })
}

fn row_line(label: &str, row: &[Option<f64>; 7]) -> String {
    let mut out = format!("{label:>5}  ");
    for share in row {
        let _ = match share {
            Some(share) => write!(out, " {share:>6.2}"),
            None => write!(out, " {:>6}", "-"),
        };
    }
    out.push('\n');
    out
}

/// The verdict of a run against the pass criteria.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub passed: bool,
    /// Per criterion: (threshold ms, limit %, the worst slice's share).
    pub worst: Vec<(u64, f64, f64)>,
}

/// Judges the read slices (millisecond counts) against [`CRITERIA`].
pub fn verdict(slices: &[Slice]) -> Verdict {
    let worst: Vec<(u64, f64, f64)> = CRITERIA
        .iter()
        .map(|(threshold, limit)| {
            let worst = slices
                .iter()
                .filter_map(|slice| slice.counts.percent_over(*threshold))
                .fold(0.0, f64::max);
            (*threshold, *limit, worst)
        })
        .collect();
    let passed = worst.iter().all(|(_, limit, share)| share < limit);
    Verdict { passed, worst }
}

impl Verdict {
    pub fn describe(&self) -> String {
        let parts: Vec<String> = self
            .worst
            .iter()
            .map(|(threshold, limit, share)| {
                let mark = if share < limit { "ok" } else { "FAILED" };
                format!("over {threshold} ms {share:.2} % (< {limit}: {mark})")
            })
            .collect();
        let word = if self.passed { "PASS" } else { "FAIL" };
        format!("VERDICT: {word} — worst slice: {}", parts.join(", "))
    }
}

/// Whether a step of the ramp stays within the paper's limit (p95 of reads
/// ≤ 2 ms); `None` when it did no reads.
pub fn within_p95_limit(reads_ms: &Counts) -> Option<bool> {
    reads_ms
        .percent_over(RAMP_THRESHOLD_MS)
        .map(|share| share <= RAMP_MAX_SHARE_PCT)
}

/// How the ramp raises the load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RampStep {
    /// 1x, 2x, 3x, ...
    Linear,
    /// 1x, 2x, 4x, 8x, ...
    Double,
}

/// The load multiples of a ramp, up to `max`.
pub fn ramp_loads(step: RampStep, max: u64) -> Vec<u64> {
    let mut loads = Vec::new();
    let mut load = 1;
    while load <= max {
        loads.push(load);
        load = match step {
            RampStep::Linear => load + 1,
            RampStep::Double => load * 2,
        };
    }
    loads
}

/// The highest load that passed before the first that did not (steps in
/// order: (load, passed)).
pub fn highest_passing(steps: &[(u64, bool)]) -> Option<u64> {
    steps
        .iter()
        .take_while(|(_, passed)| *passed)
        .map(|(load, _)| *load)
        .last()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::super::hist::{Histogram, Scale};
    use super::*;

    const MS: u64 = 1_000_000;

    /// Counts with `fast` reads under 1 ms and `slow` of `slow_ms` each.
    fn counts(fast: u64, slow: u64, slow_ms: u64) -> Counts {
        let histogram = Histogram::new(Scale::Millis);
        (0..fast).for_each(|_| histogram.insert(MS / 10));
        (0..slow).for_each(|_| histogram.insert(slow_ms * MS));
        histogram.snapshot()
    }

    fn add(a: &Counts, b: &Counts) -> Counts {
        Counts {
            scale: a.scale,
            buckets: std::array::from_fn(|i| a.buckets[i] + b.buckets[i]),
        }
    }

    #[test]
    fn shares_per_threshold() {
        let line = shares_line(&counts(96, 4, 3));
        assert_eq!(
            line,
            " 1: 4.00 2: 4.00 4: 0.00 8: 0.00 16: 0.00 32: 0.00 64: 0.00"
        );
        assert_eq!(
            shares_line(&Counts::empty(Scale::Millis)),
            " 1: - 2: - 4: - 8: - 16: - 32: - 64: -"
        );
    }

    #[test]
    fn slices_cut_the_cumulative_snapshots() {
        let a = counts(100, 0, 0);
        let b = add(&a, &counts(90, 10, 1));
        let c = add(&b, &counts(50, 50, 9));
        let snapshots = vec![(1, a.clone()), (2, b.clone()), (3, c.clone())];
        let per_second = slices(&snapshots, 1);
        assert_eq!(per_second.len(), 3);
        assert_eq!(per_second[1].counts.percent_over(1), Some(10.0));
        assert_eq!(per_second[2].counts.percent_over(8), Some(50.0));
        let two = slices(&snapshots, 2);
        assert_eq!(
            two.iter().map(|slice| slice.end_sec).collect::<Vec<_>>(),
            vec![2, 3]
        );
        assert_eq!(two[0].counts.total(), 200);
        assert_eq!(two[0].counts.percent_over(1), Some(5.0));
        let hour = slices(&snapshots, 3600);
        assert_eq!(hour.len(), 1);
        assert_eq!(hour[0].counts, c);
        let table = table("reads", &two);
        assert!(table.contains("\n    1     5.00   0.00   0.00"), "{table}");
        assert!(
            table.contains("\n  max    50.00  50.00  50.00  50.00   0.00"),
            "{table}"
        );
        assert!(table.contains("\n  avg    27.50  25.00"), "{table}");
    }

    #[test]
    fn verdict_holds_each_criterion_strictly() {
        let slice = |counts: Counts| Slice { end_sec: 1, counts };
        // 4.99 % over 1 ms: pass; exactly 5 %: fail ("fewer than 5 %").
        assert!(verdict(&[slice(counts(9501, 499, 1))]).passed);
        let at_five = verdict(&[slice(counts(95, 5, 1))]);
        assert!(!at_five.passed);
        assert!(
            at_five
                .describe()
                .contains("over 1 ms 5.00 % (< 5: FAILED)"),
            "{}",
            at_five.describe()
        );
        // 1 % over 8 ms fails even though under 5 % over 1 ms.
        assert!(!verdict(&[slice(counts(99, 1, 8))]).passed);
        // 0.1 % over 64 ms fails; 0.09 % passes.
        assert!(!verdict(&[slice(counts(999, 1, 64))]).passed);
        assert!(verdict(&[slice(counts(9991, 9, 64))]).passed);
        // The worst slice decides: one bad hour among good ones fails.
        let good = slice(counts(100, 0, 0));
        assert!(!verdict(&[good.clone(), slice(counts(90, 10, 1)), good]).passed);
        // No reads at all: nothing over any threshold.
        assert!(verdict(&[slice(Counts::empty(Scale::Millis))]).passed);
    }

    #[test]
    fn ramp_limit_and_steps() {
        assert_eq!(within_p95_limit(&counts(95, 5, 2)), Some(true));
        assert_eq!(within_p95_limit(&counts(94, 6, 3)), Some(false));
        // Reads of 1.x ms are under 2 ms: still within.
        assert_eq!(within_p95_limit(&counts(50, 50, 1)), Some(true));
        assert_eq!(within_p95_limit(&Counts::empty(Scale::Millis)), None);
        assert_eq!(ramp_loads(RampStep::Linear, 4), vec![1, 2, 3, 4]);
        assert_eq!(ramp_loads(RampStep::Double, 20), vec![1, 2, 4, 8, 16]);
        assert_eq!(
            highest_passing(&[(1, true), (2, true), (3, false), (4, true)]),
            Some(2)
        );
        assert_eq!(highest_passing(&[(1, false)]), None);
        assert_eq!(highest_passing(&[(1, true), (2, true)]), Some(2));
    }
}
