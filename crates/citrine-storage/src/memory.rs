//! The memory engine: record bodies live in process memory, one allocation
//! per body (length-prefixed, see [`Location::memory`]), owned by the index
//! entry through its [`Location`]. Reads borrow the body in place (no copy
//! until the reply is written).

use crate::{Location, StorageEngine, StorageError, StoreMeta, Stored};
use citrine_types::stripes::Gauge;
use citrine_types::Digest;
use std::borrow::Cow;

/// Smallest and largest drift of one thread's share of the bytes count
/// before it is added to the shared total (see [`Gauge`]).
const MIN_QUANTUM: u64 = 4 << 10;
const MAX_QUANTUM: u64 = 1 << 20;

/// In-memory storage engine.
#[derive(Debug)]
pub struct MemoryEngine {
    /// Bytes of the bodies held. Every write and release changes it, from
    /// every service thread: striped, so they do not share a cache line.
    used_bytes: Gauge,
    /// `enable-benchmarks-storage`: the size of every record stored.
    benchmarks: crate::bench::BenchSlot,
}

impl Default for MemoryEngine {
    fn default() -> MemoryEngine {
        MemoryEngine::new()
    }
}

impl MemoryEngine {
    /// An engine whose cheap bytes figure ([`StorageEngine::used_bytes_approx`])
    /// is off by at most 1 MiB per stripe.
    pub fn new() -> MemoryEngine {
        MemoryEngine::with_budget(u64::MAX)
    }

    /// An engine for a budget of `budget` bytes: the cheap bytes figure is
    /// off by at most `budget / 2048` per stripe (0.8 % of the budget in
    /// all), between 4 KiB and 1 MiB per stripe.
    pub fn with_budget(budget: u64) -> MemoryEngine {
        MemoryEngine {
            used_bytes: Gauge::new((budget / 2048).clamp(MIN_QUANTUM, MAX_QUANTUM)),
            benchmarks: Default::default(),
        }
    }
}

impl StorageEngine for MemoryEngine {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn benchmarks(&self) -> &crate::bench::BenchSlot {
        &self.benchmarks
    }

    fn write(
        &self,
        _digest: &Digest,
        _meta: &StoreMeta<'_>,
        body: Vec<u8>,
    ) -> Result<Location, StorageError> {
        let len = body.len() as i64;
        self.benchmarks.record_size(true, body.len());
        let location = Location::memory_from_vec(body).ok_or(StorageError::TooBig)?;
        self.used_bytes.add(len);
        Ok(location)
    }

    fn read<'a>(&self, location: &'a Location) -> Result<Cow<'a, [u8]>, StorageError> {
        match location.get() {
            Stored::Memory(body) => Ok(Cow::Borrowed(body)),
            Stored::Device(_) => Err(StorageError::Corrupt(
                "a device location given to the memory engine".into(),
            )),
        }
    }

    fn release(&self, location: Location) {
        self.used_bytes.add(-(location.size() as i64));
    }

    fn used_bytes(&self) -> u64 {
        // Below 0 only for the instant a thread moves its share of the
        // count to the total (see `Gauge::exact`).
        self.used_bytes.exact().max(0) as u64
    }

    fn used_bytes_approx(&self) -> u64 {
        self.used_bytes.approx().max(0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts_bytes() {
        let engine = MemoryEngine::new();
        let location = engine
            .write(&Digest::default(), &StoreMeta::default(), vec![1, 2, 3])
            .expect("writes");
        assert_eq!(engine.used_bytes(), 3);
        assert_eq!(engine.read(&location).expect("reads").as_ref(), &[1, 2, 3]);
        engine.release(location);
        assert_eq!(engine.used_bytes(), 0);
    }
}
