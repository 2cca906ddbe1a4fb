//! Storage engines: where record bodies live.
//!
//! The primary index (crate `citrine-index`) maps a digest to metadata and a
//! [`Location`]; a [`StorageEngine`] turns a body into a location and back.
//! The transaction service only speaks to the trait: the [`MemoryEngine`]
//! keeps bodies in process memory, the [`DeviceEngine`] keeps them in
//! log-structured write blocks on files or raw devices (module [`device`]).
//!
//! Invariants: an engine's `used_bytes` equals the sum of the sizes of the
//! bodies it holds (written and not yet released); every `Location` handed
//! out is released (or retired) exactly once (the index owns it in between).
//!
//! This crate does device I/O (the device engine's devices, only through
//! `device::io::BlockIo`: files and raw devices, or the simulated disk of
//! the tests and the simulator) but owns no sockets, and no long-lived
//! threads but one per asynchronous shadow device (its writer, ended when
//! the engine is dropped): the server drives the device engine's
//! background work (flushing, defragmentation) from its own threads. The
//! cold-start scan uses scoped threads, one per device, and returns.

#![deny(unsafe_code)]

pub mod bench;
pub mod compress;
pub mod device;
mod location;
mod memory;
pub mod thresholds;

pub use device::DeviceEngine;
pub use location::{Location, Stored, MEMORY_BODY_SPARE};
pub use memory::MemoryEngine;

use citrine_types::Digest;
use std::borrow::Cow;

/// Where a record lives on a device: device number (6 bits), first 128-byte
/// read block (34 bits: 2 TiB per device) and length in read blocks (24
/// bits, of which an address uses 23: records up to 1 GiB), packed in one
/// `u64`. A [`Location`] holds it in the 63 bits of its word below the kind
/// bit, which is why the count stops at 23 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceAddress(pub u64);

impl DeviceAddress {
    pub const MAX_DEVICES: usize = 64;
    pub const MAX_RBLOCK: u64 = (1 << 34) - 1;
    pub const MAX_RBLOCKS: u32 = (1 << 23) - 1;

    /// Packs; `None` when a field does not fit.
    pub fn new(device: usize, rblock: u64, rblocks: u32) -> Option<DeviceAddress> {
        if device >= Self::MAX_DEVICES
            || rblock > Self::MAX_RBLOCK
            || rblocks > Self::MAX_RBLOCKS
            || rblocks == 0
        {
            return None;
        }
        Some(DeviceAddress(
            (device as u64) << 58 | rblock << 24 | u64::from(rblocks),
        ))
    }

    /// An address read back from its `u64` form (a saved index); `None`
    /// when a field is out of range, as [`DeviceAddress::new`] refuses.
    pub fn from_bits(bits: u64) -> Option<DeviceAddress> {
        let address = DeviceAddress(bits);
        let rblocks = bits & ((1 << 24) - 1);
        if rblocks == 0 || rblocks > u64::from(Self::MAX_RBLOCKS) {
            return None;
        }
        Some(address)
    }

    pub fn device(self) -> usize {
        (self.0 >> 58) as usize
    }

    pub fn rblock(self) -> u64 {
        (self.0 >> 24) & Self::MAX_RBLOCK
    }

    pub fn rblocks(self) -> u32 {
        (self.0 & u64::from(Self::MAX_RBLOCKS)) as u32
    }

    /// Bytes the record occupies on the device.
    pub fn bytes(self) -> u64 {
        u64::from(self.rblocks()) * device::format::RBLOCK as u64
    }
}

/// The record metadata an engine stores beside the body (the device engine
/// writes it into the record header so a cold start can rebuild the index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreMeta<'a> {
    pub generation: u16,
    /// The record's life (see `citrine_index::RecordMeta::life`), `< 1024`.
    pub life: u16,
    pub void_time: u32,
    pub last_update_ms: u64,
    /// Set name (empty = no set).
    pub set_name: &'a [u8],
}

/// Why a storage operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageError {
    /// The engine is out of space (maps to result code 8).
    OutOfSpace,
    /// The record cannot be stored in one write block (result code 13).
    TooBig,
    /// The body could not be read back intact.
    Corrupt(String),
    /// An I/O error from the medium (a read: nothing is refused after it).
    Io(String),
    /// A write or a sync of a device failed earlier: the engine no longer
    /// knows what its devices hold since its last successful sync, so it
    /// refuses every write until the process restarts (the service answers
    /// result code 1, see `device`'s module doc).
    DeviceFailed,
}

impl std::fmt::Display for StorageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StorageError::OutOfSpace => write!(f, "storage out of space"),
            StorageError::TooBig => write!(f, "record larger than a write block"),
            StorageError::Corrupt(why) => write!(f, "corrupt record body: {why}"),
            StorageError::Io(why) => write!(f, "storage i/o error: {why}"),
            StorageError::DeviceFailed => write!(
                f,
                "a device write or sync failed: writes refused until restart"
            ),
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
    /// Called under the record's partition write lock.
    fn write(
        &self,
        digest: &Digest,
        meta: &StoreMeta<'_>,
        body: Vec<u8>,
    ) -> Result<Location, StorageError>;

    /// Reads a body back.
    fn read<'a>(&self, location: &'a Location) -> Result<Cow<'a, [u8]>, StorageError>;

    /// Releases a body that is no longer referenced because a newer copy
    /// replaced it, or because it was truncated (truncation is durable by
    /// its own record).
    fn release(&self, location: Location);

    /// Makes the removal of `digest` durable (delete, eviction): an engine
    /// that persists records writes a tombstone so that no older copy comes
    /// back after a restart. Called under the partition write lock, before
    /// the entry is removed; on error the record must stay.
    fn write_tombstone(&self, _digest: &Digest, _meta: &StoreMeta<'_>) -> Result<(), StorageError> {
        Ok(())
    }

    /// Releases the body of a record that expired: its stored void time
    /// proves it dead, so a persisting engine keeps its bytes as the
    /// record's tombstone instead of releasing them.
    fn retire(&self, _digest: &Digest, location: Location) {
        self.release(location)
    }

    /// Bytes of record data currently held.
    fn used_bytes(&self) -> u64;

    /// [`StorageEngine::used_bytes`], approximately and cheaply: what every
    /// write may read (stop-writes). An engine whose exact figure costs
    /// more than a load says by how much it may be off in its docs.
    fn used_bytes_approx(&self) -> u64 {
        self.used_bytes()
    }

    /// Its storage benchmark switch (`enable-benchmarks-storage`, see
    /// [`bench`]).
    fn benchmarks(&self) -> &bench::BenchSlot;

    /// The device engine, for the server's background work and statistics.
    fn device(&self) -> Option<&DeviceEngine> {
        None
    }

    /// The engine's storage compression, changeable at run time (`None`:
    /// this engine does not compress).
    fn compression(&self) -> Option<&compress::CompressionSetting> {
        None
    }

    /// Bytes written before and after compression (`None`: this engine
    /// does not compress).
    fn compression_stats(&self) -> Option<&compress::CompressionStats> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_packing() {
        let address = DeviceAddress::new(63, DeviceAddress::MAX_RBLOCK, 5).expect("fits");
        assert_eq!(
            (address.device(), address.rblock(), address.rblocks()),
            (63, DeviceAddress::MAX_RBLOCK, 5)
        );
        assert_eq!(address.bytes(), 640);
        assert!(DeviceAddress::new(64, 0, 1).is_none());
        assert!(DeviceAddress::new(0, 0, 0).is_none());
    }
}
