//! The memory engine: record bodies live in process memory, one allocation
//! per body, owned by the index entry through [`Location::Memory`]. Reads
//! borrow the body in place (no copy until the reply is written).

use crate::{Location, StorageEngine, StorageError, StoreMeta};
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
        self.used_bytes
            .fetch_add(body.len() as u64, Ordering::Relaxed);
        Ok(Location::Memory(body.into_boxed_slice()))
    }

    fn read<'a>(&self, location: &'a Location) -> Result<Cow<'a, [u8]>, StorageError> {
        match location {
            Location::Memory(body) => Ok(Cow::Borrowed(body)),
            Location::Device(_) => Err(StorageError::Corrupt(
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
