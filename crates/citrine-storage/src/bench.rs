//! The storage benchmark hook (`enable-benchmarks-storage`, the
//! reference's per-namespace storage detail histograms): an engine reports
//! the size of every record it stores and every record it reads from a
//! device, and a device engine the time of its device I/O — a record read
//! from a device, a whole block read by defragmentation (the reference's
//! `large-block-read`), a write block written out (`write`). The
//! histograms themselves belong to the layer that reports them
//! ([`StorageBenchmarks`] is what it implements); an engine only holds a
//! [`BenchSlot`].
//!
//! Cost: off, one relaxed load per record write or device read (and no
//! clock read).
//!
//! Invariants: nothing is reported while the slot is off; a sink, once
//! installed, stays (turning the benchmarks off and on again keeps its
//! counts).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// A timed device operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoKind {
    /// A record read from the device (not from a buffer or the post-write
    /// queue).
    Read,
    /// A whole write block read by defragmentation.
    LargeBlockRead,
    /// A write buffer written out to its block.
    Write,
}

/// Where an engine reports (implemented by the layer holding the
/// histograms).
pub trait StorageBenchmarks: Send + Sync {
    /// A record of `bytes` stored (`write`) or read from a device.
    fn record_size(&self, write: bool, bytes: u64);
    /// A device operation of the device at `device` (configuration order)
    /// that took `elapsed`.
    fn device_io(&self, device: usize, kind: IoKind, elapsed: Duration);
}

/// An engine's switch and sink.
#[derive(Default)]
pub struct BenchSlot {
    on: AtomicBool,
    sink: OnceLock<Arc<dyn StorageBenchmarks>>,
}

impl std::fmt::Debug for BenchSlot {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "BenchSlot(on: {})", self.is_on())
    }
}

impl BenchSlot {
    /// Installs `sink` (the first one given stays) and turns reporting on
    /// or off.
    pub fn set(&self, sink: impl FnOnce() -> Arc<dyn StorageBenchmarks>, on: bool) {
        if on {
            self.sink.get_or_init(sink);
        }
        self.on.store(on, Ordering::Relaxed);
    }

    /// Whether reporting is on.
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// The sink, while reporting is on.
    #[inline]
    pub fn sink(&self) -> Option<&dyn StorageBenchmarks> {
        if self.on.load(Ordering::Relaxed) {
            self.sink.get().map(|sink| sink.as_ref())
        } else {
            None
        }
    }

    /// Reports a record's size, if on.
    #[inline]
    pub fn record_size(&self, write: bool, bytes: usize) {
        if let Some(sink) = self.sink() {
            sink.record_size(write, bytes as u64);
        }
    }

    /// When reporting is on: the start of a device operation to time.
    #[inline]
    pub fn start(&self) -> Option<Instant> {
        self.sink().map(|_| Instant::now())
    }

    /// Reports a device operation begun at `started` (from
    /// [`BenchSlot::start`]).
    #[inline]
    pub fn device_io(&self, started: Option<Instant>, device: usize, kind: IoKind) {
        if let (Some(started), Some(sink)) = (started, self.sink()) {
            sink.device_io(device, kind, started.elapsed());
        }
    }
}
