//! Device I/O: the one boundary through which the device engine touches a
//! medium. Everything the engine does to a device — positioned reads and
//! writes, syncs, its size — goes through [`BlockIo`]; nothing else in the
//! engine opens, reads, writes or syncs a device.
//!
//! Three media implement it:
//! - [`DeviceFile`] ([`file`]): a regular file or a raw block device,
//!   through the page cache (`pread`/`pwrite`, `fdatasync`) or `O_DIRECT`;
//! - [`SimDisk`] ([`sim`]): a faulty disk in memory for tests and the
//!   simulator. It keeps written-but-unsynced bytes apart from synced ones,
//!   loses (or tears) the unsynced ones at a simulated power cut, and fails
//!   chosen operations, all deterministically from a seed;
//! - [`Shadowed`] ([`shadow`]): either of the two paired with a shadow
//!   that takes every write (paper 001 §5.1).
//!
//! The engine holds a [`DeviceIo`], an enum over the two: every call is a
//! match and a direct (inlinable) call, with no allocation and no virtual
//! call on the read path. The set of media is closed on purpose: a new
//! medium is a new variant, so the engine stays one concrete type.
//!
//! Also here: [`AlignedBuf`] (aligned buffers for `O_DIRECT` without
//! `unsafe`) and [`IoMode`].
//!
//! Invariants: a medium's `size` does not change while it is open; a
//! `read_at` returns exactly the bytes of the last completed `write_at` to
//! each position (zeros where nothing was written), whether or not they
//! were synced; a `sync` that returns `Ok` made every `write_at` completed
//! before it durable; after a `sync` that failed, nothing is known of the
//! writes since the previous successful one (the engine then stops
//! writing, see the sticky failed state in [`super`]).

pub mod file;
pub mod shadow;
pub mod shadow_queue;
pub mod sim;

pub use file::DeviceFile;
pub use shadow::{Leveled, Shadowed};
pub use sim::{Fault, IoOp, PowerCut, SimDisk, Trigger};

use std::path::Path;

/// Alignment used for direct I/O (covers 512 B and 4 KiB logical blocks).
pub const DIRECT_ALIGN: usize = 4096;

/// What the engine needs of a medium.
pub trait BlockIo: Send + Sync {
    /// Reads `len` bytes at `offset` (all of them, or an error).
    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>>;
    /// Writes all of `bytes` at `offset`. In direct mode an unaligned
    /// range costs a read-modify-write of the covering aligned range.
    fn write_at(&self, offset: u64, bytes: &[u8]) -> std::io::Result<()>;
    /// Makes every completed write durable (`fdatasync`).
    fn sync(&self) -> std::io::Result<()>;
    /// Bytes the medium offers.
    fn size(&self) -> u64;
    /// How the medium is accessed (decides the engine's flush alignment).
    fn mode(&self) -> IoMode;
}

/// A byte buffer whose usable window starts at a `DIRECT_ALIGN`-aligned address.
pub struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// A zeroed aligned buffer of `len` bytes.
    pub fn zeroed(len: usize) -> AlignedBuf {
        let storage = vec![0u8; len + DIRECT_ALIGN];
        let address = storage.as_ptr() as usize;
        let start = (DIRECT_ALIGN - address % DIRECT_ALIGN) % DIRECT_ALIGN;
        debug_assert!(start + len <= storage.len());
        AlignedBuf {
            storage,
            start,
            len,
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// How a device is accessed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoMode {
    /// Through the page cache.
    Buffered,
    /// `O_DIRECT`: bypassing the page cache.
    Direct,
}

/// What the devices of a namespace are.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Media {
    /// The files or raw devices named by the configured paths.
    #[default]
    Files,
    /// Simulated disks, one per configured path (the paths only name them
    /// in log lines).
    Simulated(Vec<SimDisk>),
}

/// One open medium of the engine.
pub enum DeviceIo {
    File(DeviceFile),
    Simulated(SimDisk),
    /// A primary with its shadow ([`shadow`]): writes to both, reads from
    /// the primary.
    Shadowed(Box<Shadowed>),
}

impl DeviceIo {
    /// Opens device `index` of `media`: the file or raw device at `path`
    /// (created with `file_size` bytes if it is a missing or shorter
    /// regular file), or the `index`th simulated disk.
    pub fn open(
        media: &Media,
        index: usize,
        path: &Path,
        file_size: u64,
        mode: IoMode,
    ) -> std::io::Result<DeviceIo> {
        match media {
            Media::Files => DeviceFile::open(path, file_size, mode).map(DeviceIo::File),
            Media::Simulated(disks) => disks
                .get(index)
                .map(|disk| DeviceIo::Simulated(disk.clone()))
                .ok_or_else(|| {
                    std::io::Error::other(format!("no simulated disk for device {index}"))
                }),
        }
    }
}

impl BlockIo for DeviceIo {
    #[inline]
    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        match self {
            DeviceIo::File(file) => file.read_at(offset, len),
            DeviceIo::Simulated(disk) => disk.read_at(offset, len),
            DeviceIo::Shadowed(pair) => pair.read_at(offset, len),
        }
    }

    #[inline]
    fn write_at(&self, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            DeviceIo::File(file) => file.write_at(offset, bytes),
            DeviceIo::Simulated(disk) => disk.write_at(offset, bytes),
            DeviceIo::Shadowed(pair) => pair.write_at(offset, bytes),
        }
    }

    #[inline]
    fn sync(&self) -> std::io::Result<()> {
        match self {
            DeviceIo::File(file) => file.sync(),
            DeviceIo::Simulated(disk) => disk.sync(),
            DeviceIo::Shadowed(pair) => pair.sync(),
        }
    }

    #[inline]
    fn size(&self) -> u64 {
        match self {
            DeviceIo::File(file) => file.size(),
            DeviceIo::Simulated(disk) => disk.size(),
            DeviceIo::Shadowed(pair) => pair.size(),
        }
    }

    #[inline]
    fn mode(&self) -> IoMode {
        match self {
            DeviceIo::File(file) => file.mode(),
            DeviceIo::Simulated(disk) => disk.mode(),
            DeviceIo::Shadowed(pair) => pair.mode(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn aligned_buffer_is_aligned() {
        for len in [0usize, 1, 4096, 10_000] {
            let buffer = AlignedBuf::zeroed(len);
            assert_eq!(buffer.as_slice().as_ptr() as usize % DIRECT_ALIGN, 0);
            assert_eq!(buffer.len(), len);
        }
    }

    /// The contract every medium keeps: reads see the last write (synced or
    /// not), unwritten bytes read as zeros, reads past the end fail.
    fn keeps_the_contract(io: &dyn BlockIo) {
        let size = io.size();
        assert!(size >= 64 << 10);
        assert_eq!(io.read_at(8192, 16).unwrap(), vec![0u8; 16]);
        let mut page = AlignedBuf::zeroed(DIRECT_ALIGN);
        page.as_mut_slice().fill(7);
        io.write_at(8192, page.as_slice()).unwrap();
        assert_eq!(io.read_at(8192 + 100, 3).unwrap(), vec![7u8; 3]);
        io.sync().unwrap();
        io.write_at(8192 + 1, &[9, 9]).unwrap();
        assert_eq!(io.read_at(8192, 4).unwrap(), vec![7, 9, 9, 7]);
        assert!(
            io.read_at(size - 2, 4).is_err(),
            "a read past the end fails"
        );
    }

    #[test]
    fn files_and_simulated_disks_keep_the_contract() {
        let dir = std::env::temp_dir().join(format!("citrine-io-contract-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for mode in [IoMode::Buffered, IoMode::Direct] {
            let path = dir.join(format!("{mode:?}.dat"));
            match DeviceIo::open(&Media::Files, 0, &path, 1 << 20, mode) {
                Ok(file) => keeps_the_contract(&file),
                // Some filesystems (tmpfs) refuse O_DIRECT.
                Err(error) if mode == IoMode::Direct => {
                    eprintln!("O_DIRECT not available here: {error}")
                }
                Err(error) => panic!("{error}"),
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        let disk = SimDisk::new(1 << 20, 1);
        let simulated = Media::Simulated(vec![disk]);
        keeps_the_contract(
            &DeviceIo::open(&simulated, 0, Path::new("sim"), 0, IoMode::Buffered).unwrap(),
        );
        assert!(DeviceIo::open(&simulated, 1, Path::new("sim"), 0, IoMode::Buffered).is_err());
    }
}
