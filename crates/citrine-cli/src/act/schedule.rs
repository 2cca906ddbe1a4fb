//! Rate control by a fixed schedule: operation `k` of a stream is due at a
//! time computed from the start of the run, never from when the previous
//! one finished, so a slow operation does not shift the ones after it
//! (they are issued late, and the lag is measured) and the achieved rate is
//! the configured one whenever the device keeps up. Threads sleep until
//! each due time (no busy-wait); a sleep is cut into pieces of at most
//! [`MAX_NAP`] so a stop request is seen promptly.
//!
//! Invariants: due times strictly increase with `k`; `n` interleaved
//! streams of one [`Schedule::interleaved`] family together issue
//! `rate` operations per second, each at its own slot `i, i+n, i+2n, ...`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Longest single sleep, so that a stop is noticed within it.
pub const MAX_NAP: Duration = Duration::from_millis(50);

/// The due times of one stream of operations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    /// Nanoseconds between two slots of the whole family.
    slot_nanos: f64,
    /// This stream's first slot and its distance to its next.
    first: u64,
    stride: u64,
}

impl Schedule {
    /// One stream of `rate` operations per second.
    pub fn new(rate: f64) -> Schedule {
        Schedule::interleaved(rate, 0, 1)
    }

    /// Stream `index` of `streams` that share `rate` operations per second.
    pub fn interleaved(rate: f64, index: u64, streams: u64) -> Schedule {
        Schedule {
            slot_nanos: 1e9 / rate,
            first: index,
            stride: streams.max(1),
        }
    }

    /// When operation `k` is due, from the start.
    pub fn due(&self, k: u64) -> Duration {
        let slot = self.first + k * self.stride;
        Duration::from_nanos((slot as f64 * self.slot_nanos) as u64)
    }
}

/// Sleeps until `at`, or until `stop` is set; returns false on a stop.
pub fn sleep_until(at: Instant, stop: &AtomicBool) -> bool {
    loop {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        let now = Instant::now();
        if now >= at {
            return true;
        }
        std::thread::sleep((at - now).min(MAX_NAP));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_times_follow_the_rate() {
        let schedule = Schedule::new(2000.0);
        assert_eq!(schedule.due(0), Duration::ZERO);
        assert_eq!(schedule.due(1), Duration::from_micros(500));
        assert_eq!(schedule.due(2000), Duration::from_secs(1));
        // 23.4375 large blocks a second: the 24th is due just after 1 s.
        let blocks = Schedule::new(23.4375);
        assert!(blocks.due(23) < Duration::from_secs(1));
        assert!(blocks.due(24) > Duration::from_secs(1));
    }

    #[test]
    fn interleaved_streams_share_the_rate() {
        let streams: Vec<Schedule> = (0..4)
            .map(|i| Schedule::interleaved(1000.0, i, 4))
            .collect();
        let mut all: Vec<Duration> = streams
            .iter()
            .flat_map(|stream| (0..250).map(|k| stream.due(k)))
            .collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 1000, "every slot once");
        assert_eq!(all[999], Duration::from_millis(999));
        assert_eq!(streams[3].due(0), Duration::from_millis(3));
        assert_eq!(streams[3].due(1), Duration::from_millis(7));
    }

    #[test]
    fn sleeping_stops_on_request() {
        let stop = AtomicBool::new(false);
        let start = Instant::now();
        assert!(sleep_until(start + Duration::from_millis(20), &stop));
        assert!(start.elapsed() >= Duration::from_millis(20));
        stop.store(true, Ordering::Relaxed);
        let start = Instant::now();
        assert!(!sleep_until(start + Duration::from_secs(60), &stop));
        assert!(start.elapsed() < Duration::from_secs(1));
    }
}
