//! The real medium: positioned reads and writes on a regular file or a raw
//! block device, either through the page cache (`pread`/`pwrite`) or with
//! `O_DIRECT`; syncs are `fdatasync`.
//!
//! `O_DIRECT` needs the buffer address, the file offset and the length all
//! aligned to the device's logical block size. [`AlignedBuf`] gets an aligned
//! buffer without `unsafe` by over-allocating a `Vec` and working on the
//! aligned window inside it. Reads of a record in direct mode read the
//! covering aligned range and copy the record out.
//!
//! Invariant: in direct mode every request that reaches the file is aligned
//! (offset, length and buffer address): an unaligned write becomes a
//! read-modify-write of the covering aligned range.

use super::{AlignedBuf, BlockIo, IoMode, DIRECT_ALIGN};
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// One open device.
pub struct DeviceFile {
    file: File,
    path: PathBuf,
    mode: IoMode,
    /// Bytes the device offers.
    size: u64,
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

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl BlockIo for DeviceFile {
    #[inline]
    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
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

    fn write_at(&self, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
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

    fn sync(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn mode(&self) -> IoMode {
        self.mode
    }
}
