//! The memory engine: record bodies live in process memory, one allocation
//! per body (length-prefixed, see [`Location::memory`]), owned by the index
//! entry through its [`Location`]. Reads borrow the body in place (no copy
//! until the reply is written).

use crate::{Location, StorageEngine, StorageError, StoreMeta, Stored};
use citrine_types::Digest;
use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};

/// In-memory storage engine.
#[derive(Debug, Default)]
pub struct MemoryEngine {
    used_bytes: AtomicU64,
}

impl MemoryEngine {
    pub fn new() -> MemoryEngine {
        MemoryEngine::default()
    }
}

impl StorageEngine for MemoryEngine {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn write(
        &self,
        _digest: &Digest,
        _meta: &StoreMeta<'_>,
        body: Vec<u8>,
    ) -> Result<Location, StorageError> {
        let len = body.len() as u64;
        let location = Location::memory_from_vec(body).ok_or(StorageError::TooBig)?;
        self.used_bytes.fetch_add(len, Ordering::Relaxed);
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
        let size = location.size() as u64;
        let previous = self.used_bytes.fetch_sub(size, Ordering::Relaxed);
        debug_assert!(previous >= size, "memory engine released more than it held");
    }

    fn used_bytes(&self) -> u64 {
        self.used_bytes.load(Ordering::Relaxed)
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
