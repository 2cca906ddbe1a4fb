//! The real medium: positioned reads and writes on a regular file or a raw
//! block device, either through the page cache (`pread`/`pwrite`) or with
//! `O_DIRECT`; syncs are `fdatasync`. A device may also be opened with
//! `O_DSYNC` ([`DeviceFile::open_dsync`]: each write returns once its bytes
//! are durable), which `citrine act` uses to model the reference's default
//! (its `disable-odsync` is `false`); the engine itself syncs with
//! `fdatasync` after its flushes.
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
        DeviceFile::open_dsync(path, file_size, mode, false)
    }

    /// [`DeviceFile::open`], with `O_DSYNC` when `dsync` is set: every
    /// write is durable when it returns.
    pub fn open_dsync(
        path: &Path,
        file_size: u64,
        mode: IoMode,
        dsync: bool,
    ) -> std::io::Result<DeviceFile> {
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
        let mut flags = 0;
        if mode == IoMode::Direct {
            flags |= libc::O_DIRECT;
        }
        if dsync {
            flags |= libc::O_DSYNC;
        }
        options.custom_flags(flags);
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::os::fd::AsRawFd;

    /// The descriptor's status flags, as the kernel shows them in
    /// `/proc/self/fdinfo` (octal).
    fn status_flags(device: &DeviceFile) -> i32 {
        let fd = device.file.as_raw_fd();
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap();
        let line = info
            .lines()
            .find(|line| line.starts_with("flags:"))
            .unwrap();
        i32::from_str_radix(line["flags:".len()..].trim(), 8).unwrap()
    }

    #[test]
    fn dsync_is_set_only_when_asked() {
        let dir = std::env::temp_dir().join(format!("citrine-dsync-{}", std::process::id()));
        let path = dir.join("device.dat");
        let plain = DeviceFile::open(&path, 1 << 20, IoMode::Buffered).unwrap();
        assert_eq!(status_flags(&plain) & libc::O_DSYNC, 0);
        let synced = DeviceFile::open_dsync(&path, 1 << 20, IoMode::Buffered, true).unwrap();
        assert_eq!(status_flags(&synced) & libc::O_DSYNC, libc::O_DSYNC);
        synced.write_at(4096, &[5u8; 10]).unwrap();
        assert_eq!(plain.read_at(4096, 10).unwrap(), vec![5u8; 10]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
