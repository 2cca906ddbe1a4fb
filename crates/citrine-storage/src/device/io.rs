//! Device I/O: positioned reads and writes on a regular file or a raw block
//! device, either through the page cache (`pread`/`pwrite`) or with
//! `O_DIRECT`.
//!
//! `O_DIRECT` needs the buffer address, the file offset and the length all
//! aligned to the device's logical block size. [`AlignedBuf`] gets an aligned
//! buffer without `unsafe` by over-allocating a `Vec` and working on the
//! aligned window inside it. Reads of a record in direct mode read the
//! covering aligned range and copy the record out.
//!
//! Invariant: in direct mode every `write_at` is given an aligned offset and
//! an aligned length from an aligned buffer (checked, an error otherwise).

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Alignment used for direct I/O (covers 512 B and 4 KiB logical blocks).
pub const DIRECT_ALIGN: usize = 4096;

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

/// One open device.
pub struct DeviceFile {
    file: File,
    pub path: PathBuf,
    pub mode: IoMode,
    /// Bytes the device offers.
    pub size: u64,
}

impl DeviceFile {
    /// Opens (creating a regular file of `file_size` bytes if it does not
    /// exist or is shorter) the device at `path`.
    pub fn open(path: &Path, file_size: u64, mode: IoMode) -> std::io::Result<DeviceFile> {
        let is_block_device = std::fs::metadata(path)
            .map(|meta| meta.file_type().is_block_device())
            .unwrap_or(false);
        if !is_block_device {
            if let Some(parent) = path
                .parent()
                .filter(|parent| !parent.as_os_str().is_empty())
            {
                std::fs::create_dir_all(parent)?;
            }
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)?;
            if file.metadata()?.len() < file_size {
                file.set_len(file_size)?;
            }
        }
        let mut options = OpenOptions::new();
        options.read(true).write(true);
        if mode == IoMode::Direct {
            options.custom_flags(libc::O_DIRECT);
        }
        let mut file = options.open(path)?;
        let size = if is_block_device {
            file.seek(SeekFrom::End(0))?
        } else {
            file.metadata()?.len()
        };
        Ok(DeviceFile {
            file,
            path: path.to_path_buf(),
            mode,
            size,
        })
    }

    /// Reads `len` bytes at `offset`.
    pub fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        match self.mode {
            IoMode::Buffered => {
                let mut out = vec![0u8; len];
                self.file.read_exact_at(&mut out, offset)?;
                Ok(out)
            }
            IoMode::Direct => {
                let align = DIRECT_ALIGN as u64;
                let first = offset / align * align;
                let end = (offset + len as u64).div_ceil(align) * align;
                let mut buffer = AlignedBuf::zeroed((end - first) as usize);
                self.file.read_exact_at(buffer.as_mut_slice(), first)?;
                let skip = (offset - first) as usize;
                Ok(buffer.as_slice()[skip..skip + len].to_vec())
            }
        }
    }

    /// Writes `bytes` at `offset`. In direct mode offset, length and the
    /// buffer address must be aligned.
    pub fn write_at(&self, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
        if self.mode == IoMode::Direct {
            let aligned = offset & (DIRECT_ALIGN as u64 - 1) == 0
                && bytes.len() & (DIRECT_ALIGN - 1) == 0
                && (bytes.as_ptr() as usize) & (DIRECT_ALIGN - 1) == 0;
            if !aligned {
                // Copy into an aligned buffer covering the range (read-modify-write).
                let align = DIRECT_ALIGN as u64;
                let first = offset / align * align;
                let end = (offset + bytes.len() as u64).div_ceil(align) * align;
                let mut buffer = AlignedBuf::zeroed((end - first) as usize);
                self.file.read_exact_at(buffer.as_mut_slice(), first)?;
                let skip = (offset - first) as usize;
                buffer.as_mut_slice()[skip..skip + bytes.len()].copy_from_slice(bytes);
                return self.file.write_all_at(buffer.as_slice(), first);
            }
        }
        self.file.write_all_at(bytes, offset)
    }

    /// Makes every completed write durable (`fdatasync`).
    pub fn sync(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffer_is_aligned() {
        for len in [0usize, 1, 4096, 10_000] {
            let buffer = AlignedBuf::zeroed(len);
            assert_eq!(buffer.as_slice().as_ptr() as usize % DIRECT_ALIGN, 0);
            assert_eq!(buffer.len(), len);
        }
    }
}
