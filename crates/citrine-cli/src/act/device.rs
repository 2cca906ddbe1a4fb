//! The devices under test, opened through the device engine's own I/O path
//! ([`citrine_storage::device::io::DeviceFile`] and its [`BlockIo`] reads and
//! writes, `O_DIRECT` as the engine does them, `O_DSYNC` unless
//! `disable-odsync`), and their preparation: a file created or extended
//! for the test is salted (written with random large blocks end to end, as
//! ACT's `act_prep` does) so that every read lands on written data.
//!
//! Invariants: a [`Target`] holds at least [`MIN_LARGE_BLOCKS`] large
//! blocks; the test touches only its first `large_blocks × large-block`
//! bytes; a path that does not exist is created only when a file size is
//! given, and never in a directory that does not exist.

use super::config::ActConfig;
use super::rng::Rng;
use citrine_storage::device::io::{AlignedBuf, BlockIo, DeviceFile, IoMode};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The smallest device the test runs on, in large blocks.
pub const MIN_LARGE_BLOCKS: u64 = 8;

/// One open device.
pub struct Target {
    pub name: String,
    path: PathBuf,
    mode: IoMode,
    pub io: DeviceFile,
    /// Large blocks the test uses.
    pub large_blocks: u64,
    /// Whether this run created or extended the file (so it needs salting).
    pub fresh: bool,
}

impl Target {
    /// Bytes the test uses.
    pub fn usable_bytes(&self, config: &ActConfig) -> u64 {
        self.large_blocks * u64::from(config.large_block_bytes)
    }
}

/// Opens every device of `config`.
pub fn open_all(config: &ActConfig, mode: IoMode) -> Result<Vec<Target>, String> {
    config
        .device_names
        .iter()
        .map(|path| open(path, config, mode))
        .collect()
}

fn open(path: &Path, config: &ActConfig, mode: IoMode) -> Result<Target, String> {
    let name = path.display().to_string();
    let fresh = check_path(path, &name, config.file_size_bytes)?;
    let io = DeviceFile::open_dsync(path, config.file_size_bytes, mode, !config.disable_odsync)
        .map_err(|error| open_error(&name, mode, &error))?;
    let large_block = u64::from(config.large_block_bytes);
    let large_blocks = io.size() / large_block;
    if large_blocks < MIN_LARGE_BLOCKS {
        return Err(format!(
            "{name}: {} bytes is too small: the test needs at least {} bytes \
             ({MIN_LARGE_BLOCKS} large blocks of {} KiB); raise file-size-mbytes",
            io.size(),
            MIN_LARGE_BLOCKS * large_block,
            large_block / 1024
        ));
    }
    Ok(Target {
        name,
        path: path.to_path_buf(),
        mode,
        io,
        large_blocks,
        fresh,
    })
}

/// Checks what is at `path` before the engine opens it; returns whether the
/// test creates or extends a regular file there.
fn check_path(path: &Path, name: &str, file_size: u64) -> Result<bool, String> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.file_type().is_block_device() => Ok(false),
        Ok(meta) if meta.is_file() => Ok(meta.len() < file_size),
        Ok(_) => Err(format!("{name}: not a regular file or a block device")),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let parent = path
                .parent()
                .filter(|parent| !parent.as_os_str().is_empty());
            if let Some(parent) = parent.filter(|parent| !parent.is_dir()) {
                return Err(format!(
                    "{name}: cannot create it: directory {} does not exist",
                    parent.display()
                ));
            }
            if file_size == 0 {
                return Err(format!(
                    "{name}: does not exist; give file-size-mbytes to create a file of that size"
                ));
            }
            Ok(true)
        }
        Err(error) => Err(format!("{name}: cannot open it: {error}")),
    }
}

fn open_error(name: &str, mode: IoMode, error: &std::io::Error) -> String {
    let hint = if mode == IoMode::Direct && error.raw_os_error() == Some(libc::EINVAL) {
        " (this filesystem refuses O_DIRECT, e.g. tmpfs: use a file on a disk, or --buffered)"
    } else {
        ""
    };
    format!("{name}: cannot open it: {error}{hint}")
}

/// Bytes a salting write covers (a whole number of large blocks).
const SALT_CHUNK: u64 = 1 << 20;

/// Writes random data over the whole usable part of `target`, then syncs;
/// returns the seconds it took. It writes through a second descriptor
/// without `O_DSYNC` in chunks of at least [`SALT_CHUNK`] (preparation,
/// not measured), with one sync at the end.
pub fn salt(target: &Target, config: &ActConfig, rng: &mut Rng) -> Result<f64, String> {
    let started = Instant::now();
    let fail =
        |what: String, error: std::io::Error| format!("{}: salting: {what}: {error}", target.name);
    let io = DeviceFile::open(&target.path, 0, target.mode)
        .map_err(|error| fail("open".into(), error))?;
    let usable = target.usable_bytes(config);
    let chunk = SALT_CHUNK
        .max(u64::from(config.large_block_bytes))
        .min(usable);
    let mut buffer = AlignedBuf::zeroed(chunk as usize);
    let mut offset = 0;
    while offset < usable {
        let length = chunk.min(usable - offset) as usize;
        rng.fill(&mut buffer.as_mut_slice()[..length]);
        io.write_at(offset, &buffer.as_slice()[..length])
            .map_err(|error| fail(format!("write at {offset}"), error))?;
        offset += length as u64;
    }
    io.sync().map_err(|error| fail("sync".into(), error))?;
    Ok(started.elapsed().as_secs_f64())
}

/// Fills a large-block write buffer: in each KiB, the first `compress_pct`
/// percent random bytes and the rest zeros, so the block compresses to
/// about that share of its size (ACT's `compress-pct`).
pub fn fill_block(buffer: &mut [u8], compress_pct: u32, rng: &mut Rng) {
    let random_per_kib = 1024 * compress_pct.min(100) as usize / 100;
    for chunk in buffer.chunks_mut(1024) {
        let random = random_per_kib.min(chunk.len());
        rng.fill(&mut chunk[..random]);
        chunk[random..].fill(0);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn compress_pct_leaves_that_share_random() {
        let mut rng = Rng::new(7);
        let mut block = vec![0xAAu8; 128 << 10];
        fill_block(&mut block, 25, &mut rng);
        let zeros = block.iter().filter(|byte| **byte == 0).count();
        // 768 of each 1024 bytes are zeros, plus the random zeros (~1/256).
        let expected = 128 * 768;
        assert!(
            zeros >= expected && zeros < expected + 128 * 256 / 128,
            "{zeros}"
        );
        assert!(block[..256].iter().any(|byte| *byte != 0));
        assert!(block[256..1024].iter().all(|byte| *byte == 0));
        fill_block(&mut block, 100, &mut rng);
        assert!(block.iter().filter(|byte| **byte == 0).count() < 2048);
    }
}
