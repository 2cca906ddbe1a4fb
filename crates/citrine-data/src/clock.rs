//! Time as the data layer sees it: a [`Clock`] its caller passes (the
//! server's wall clock, a simulator's fake one, a test's [`ManualClock`]),
//! and [`Now`], one reading of it in the two units records use.
//!
//! Invariant: nothing in this crate reads the system's clocks; every time
//! comes through a `Clock` (clippy's `disallowed-methods` keeps it so).

use std::sync::atomic::{AtomicU64, Ordering};

/// A source of wall-clock time, injected so tests and the simulator can
/// move time.
pub trait Clock: Send + Sync + 'static {
    /// Unix time in milliseconds.
    fn now_unix_ms(&self) -> u64;
}

/// A clock tests set by hand.
#[derive(Debug, Default)]
pub struct ManualClock {
    unix_ms: AtomicU64,
}

impl ManualClock {
    pub fn new(unix_ms: u64) -> ManualClock {
        ManualClock {
            unix_ms: AtomicU64::new(unix_ms),
        }
    }
    pub fn advance_ms(&self, milliseconds: u64) {
        self.unix_ms.fetch_add(milliseconds, Ordering::Relaxed);
    }
    /// Steps the clock back, as a wall clock corrected by NTP can be.
    pub fn rewind_ms(&self, milliseconds: u64) {
        self.unix_ms.fetch_sub(milliseconds, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_unix_ms(&self) -> u64 {
        self.unix_ms.load(Ordering::Relaxed)
    }
}

/// The time a transaction runs at: Unix milliseconds, and seconds since
/// the citrusleaf epoch (what void times count in).
#[derive(Clone, Copy, Debug)]
pub struct Now {
    pub unix_ms: u64,
    pub citrusleaf_seconds: u32,
}

impl Now {
    pub fn from_unix_ms(unix_ms: u64) -> Now {
        Now {
            unix_ms,
            citrusleaf_seconds: citrine_types::citrusleaf_epoch_seconds(unix_ms),
        }
    }

    /// The clock's current reading.
    pub fn of(clock: &dyn Clock) -> Now {
        Now::from_unix_ms(clock.now_unix_ms())
    }
}
