//! Storage engines: where record bodies live.
//!
//! The primary index (crate `citrine-index`) maps a digest to metadata and a
//! [`Location`]; a [`StorageEngine`] turns a body into a location and back.
//! The transaction service only speaks to the trait, so the device engine
//! (log-structured write blocks, issue 6) slots in beside [`MemoryEngine`]
//! without touching the read and write paths.
//!
//! Invariants: an engine's `used_bytes` equals the sum of the sizes of the
//! bodies it holds (written and not yet released); every `Location` handed
//! out is released exactly once (the index owns it in between).

#![forbid(unsafe_code)]

mod memory;

pub use memory::MemoryEngine;

use citrine_types::Digest;
use std::borrow::Cow;

/// Where one record body is stored. Owned by the index entry that points to it.
#[derive(Debug, PartialEq, Eq)]
pub enum Location {
    /// The body itself, in process memory.
    Memory(Box<[u8]>),
}

impl Location {
    /// The stored size of the body, in bytes.
    pub fn size(&self) -> usize {
        match self {
            Location::Memory(body) => body.len(),
        }
    }
}

/// Why a storage operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageError {
    /// The engine is out of space (maps to result code 8).
    OutOfSpace,
    /// The body could not be read back intact.
    Corrupt(String),
    /// An I/O error from the medium.
    Io(String),
}

impl std::fmt::Display for StorageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StorageError::OutOfSpace => write!(f, "storage out of space"),
            StorageError::Corrupt(why) => write!(f, "corrupt record body: {why}"),
            StorageError::Io(why) => write!(f, "storage i/o error: {why}"),
        }
    }
}

impl std::error::Error for StorageError {}

/// A storage engine. Implementations are shared by all service threads.
pub trait StorageEngine: Send + Sync + 'static {
    /// Short engine name for info answers (`memory`, `device`).
    fn name(&self) -> &'static str;

    /// Stores a new body for `digest` and returns where it lives. The old
    /// body of an updated record is released separately (copy-on-write).
    fn write(&self, digest: &Digest, body: Vec<u8>) -> Result<Location, StorageError>;

    /// Reads a body back.
    fn read<'a>(&self, location: &'a Location) -> Result<Cow<'a, [u8]>, StorageError>;

    /// Releases a body that is no longer referenced.
    fn release(&self, location: Location);

    /// Bytes of record data currently held.
    fn used_bytes(&self) -> u64;
}
