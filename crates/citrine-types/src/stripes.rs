//! Statistics that every request updates, spread over cache lines so that
//! service threads on different cores do not write the same line.
//!
//! A plain `AtomicU64` that every request increments is one cache line
//! that every core writes: each increment waits for the line to come from
//! the core that wrote it last. Measured on the 2-vCPU machines of
//! `bench/RESULTS.md` (`crates/citrine-service/examples/hot_path.rs`),
//! such shared lines made an update cost 51 % more per thread with two
//! threads than with one over 1 M records, and 2.7 times as much over
//! 20 000 (records in cache, so the shared lines are all that is left).
//!
//! - [`Counter`]: a count that only grows, kept as [`STRIPES`] partial
//!   counts on lines of their own; a thread adds to the stripe it was given
//!   at its first use, and a reader sums the stripes.
//! - [`Gauge`]: a signed amount that goes up and down (bytes in use,
//!   records held), kept as a shared total plus per-stripe amounts not yet
//!   added to it; a stripe is added to the total once it has moved by a
//!   *quantum*, so the total is read cheaply and is off by less than
//!   `STRIPES × quantum`, and [`Gauge::exact`] sums everything.
//! - [`Padded`]: a value alone on its cache lines (a figure every request
//!   reads, kept away from the figures requests write).
//!
//! Invariants: a stripe index is below [`STRIPES`]; [`Counter::load`] sees
//! every update that happened before the call (the stripes are read one
//! after the other, so updates racing with the call may or may not be
//! seen, as with any relaxed counter); [`Gauge::exact`] does too once no
//! stripe is being added to the total — while one is, that stripe's amount
//! (less than a quantum more than its last update) may be missing from the
//! sum for that instant.

use std::cell::Cell;
use std::ops::Deref;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};

/// Partial counts per striped statistic. Threads beyond this many share
/// stripes (round robin), which costs contention, never correctness.
pub const STRIPES: usize = 16;

/// A value on cache lines of its own: 128 bytes, since x86 cores fetch
/// lines in adjacent pairs.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct Padded<T>(pub T);

impl<T> Deref for Padded<T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        &self.0
    }
}

/// The stripe of the calling thread: given round robin at its first use
/// (for striped statistics kept elsewhere, e.g. latency histograms).
#[inline]
pub fn stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    STRIPE.with(|cell| {
        let mut index = cell.get();
        if index == usize::MAX {
            index = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
            cell.set(index);
        }
        debug_assert!(index < STRIPES);
        index
    })
}

/// A count that only grows, striped (see the module doc).
#[derive(Debug, Default)]
pub struct Counter {
    stripes: [Padded<AtomicU64>; STRIPES],
}

impl Counter {
    /// Adds `n` on the calling thread's stripe. The ordering is accepted
    /// for `AtomicU64` compatibility; statistics need no more than relaxed.
    #[inline]
    pub fn fetch_add(&self, n: u64, _ordering: Ordering) {
        self.stripes[stripe()].fetch_add(n, Ordering::Relaxed);
    }

    /// The count: the sum of the stripes.
    pub fn load(&self, _ordering: Ordering) -> u64 {
        self.stripes.iter().fold(0u64, |sum, stripe| {
            sum.wrapping_add(stripe.load(Ordering::Relaxed))
        })
    }
}

/// A signed amount that goes up and down, with a cheap approximate read
/// (see the module doc).
#[derive(Debug)]
pub struct Gauge {
    /// The stripes' amounts added so far.
    total: Padded<AtomicI64>,
    /// Amounts not added to `total` yet, per stripe.
    pending: [Padded<AtomicI64>; STRIPES],
    /// How far a stripe may drift before it is added to `total`.
    quantum: i64,
}

/// Quantum of [`Gauge::default`]: a gauge of counts (records held), off by
/// less than a thousand.
pub const DEFAULT_GAUGE_QUANTUM: u64 = 64;

impl Default for Gauge {
    fn default() -> Gauge {
        Gauge::new(DEFAULT_GAUGE_QUANTUM)
    }
}

impl Gauge {
    /// A gauge at 0 whose stripes are added to the total every `quantum`
    /// (at least 1).
    pub fn new(quantum: u64) -> Gauge {
        Gauge {
            total: Padded(AtomicI64::new(0)),
            pending: Default::default(),
            quantum: i64::try_from(quantum).unwrap_or(i64::MAX).max(1),
        }
    }

    /// Adds `delta` (negative to take away).
    #[inline]
    pub fn add(&self, delta: i64) {
        if delta == 0 {
            return;
        }
        let stripe = &self.pending[stripe()];
        let pending = stripe
            .fetch_add(delta, Ordering::Relaxed)
            .wrapping_add(delta);
        if pending.unsigned_abs() >= self.quantum.unsigned_abs() {
            // Whatever the stripe holds now (other threads sharing it may
            // have added meanwhile) moves to the total in one piece.
            let moved = stripe.swap(0, Ordering::Relaxed);
            self.total.fetch_add(moved, Ordering::Relaxed);
        }
    }

    /// The amount, off by less than `STRIPES × quantum` either way (each
    /// stripe holds back less than a quantum, or for an instant a quantum
    /// plus the change that crossed it): one load of a line that changes
    /// once a stripe drifted by a quantum.
    #[inline]
    pub fn approx(&self) -> i64 {
        self.total.load(Ordering::Relaxed)
    }

    /// The amount: the total plus every stripe's pending part (see the
    /// module doc for the instant a stripe is being moved to the total).
    pub fn exact(&self) -> i64 {
        self.pending
            .iter()
            .fold(self.total.load(Ordering::Relaxed), |sum, stripe| {
                sum.wrapping_add(stripe.load(Ordering::Relaxed))
            })
    }

    /// The largest error of [`Gauge::approx`].
    pub fn approx_error(&self) -> u64 {
        self.quantum.unsigned_abs().saturating_mul(STRIPES as u64)
    }

    /// [`Gauge::add`] under `AtomicI64`'s name (the ordering is accepted
    /// for compatibility; a gauge is relaxed).
    #[inline]
    pub fn fetch_add(&self, delta: i64, _ordering: Ordering) {
        self.add(delta);
    }

    /// Takes `delta` away.
    #[inline]
    pub fn fetch_sub(&self, delta: i64, _ordering: Ordering) {
        self.add(delta.wrapping_neg());
    }

    /// [`Gauge::exact`] under `AtomicI64`'s name: it reads every stripe.
    pub fn load(&self, _ordering: Ordering) -> i64 {
        self.exact()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn padded_values_sit_on_lines_of_their_own() {
        assert_eq!(std::mem::align_of::<Padded<AtomicU64>>(), 128);
        assert_eq!(std::mem::size_of::<Padded<AtomicU64>>(), 128);
        assert_eq!(std::mem::size_of::<Counter>(), 128 * STRIPES);
    }

    #[test]
    fn counters_sum_every_threads_adds() {
        let counter = Arc::new(Counter::default());
        let threads: Vec<_> = (0..STRIPES + 3)
            .map(|t| {
                let counter = counter.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        counter.fetch_add(t as u64 + 1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("a counting thread");
        }
        let expected: u64 = (1..=STRIPES as u64 + 3).map(|n| n * 1000).sum();
        assert_eq!(counter.load(Ordering::Relaxed), expected);
    }

    #[test]
    fn a_gauge_is_exact_when_summed_and_close_when_approximated() {
        let gauge = Arc::new(Gauge::new(100));
        // Below a quantum nothing reaches the total.
        gauge.add(99);
        assert_eq!((gauge.approx(), gauge.exact()), (0, 99));
        gauge.add(1);
        assert_eq!((gauge.approx(), gauge.exact()), (100, 100));
        gauge.add(-250);
        assert_eq!((gauge.approx(), gauge.exact()), (-150, -150));
        gauge.add(0);
        // Many threads adding and taking away: exact at the end, and the
        // approximation within its bound.
        let threads: Vec<_> = (0..STRIPES + 5)
            .map(|t| {
                let gauge = gauge.clone();
                std::thread::spawn(move || {
                    for i in 0..10_000i64 {
                        gauge.add(if (i + t as i64) % 3 == 0 { -7 } else { 5 });
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("a gauge thread");
        }
        let per_thread: Vec<i64> = (0..STRIPES as i64 + 5)
            .map(|t| {
                (0..10_000i64)
                    .map(|i| if (i + t) % 3 == 0 { -7 } else { 5 })
                    .sum()
            })
            .collect();
        let expected = -150 + per_thread.iter().sum::<i64>();
        assert_eq!(gauge.exact(), expected);
        assert!(
            (gauge.approx() - expected).unsigned_abs() < gauge.approx_error(),
            "{} vs {expected}",
            gauge.approx()
        );
    }
}
