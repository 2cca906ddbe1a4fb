//! Shadow devices (paper 001 §5.1): a device paired with a second medium —
//! typically a network-attached disk that survives the instance — that
//! receives every write the primary does, so a lost primary can be rebuilt
//! from it. Reads go to the primary only. By default the shadow is written
//! asynchronously, as the reference writes it ([`super::shadow_queue`]):
//! a write counts once the primary took it; a sync waits for the shadow.
//!
//! Owns: [`Shadowed`] (the pair as one [`BlockIo`]) and [`pair`], which
//! opens the pair and brings the two sides level before the engine reads
//! either: a blank primary beside a formatted shadow is rebuilt from the
//! shadow (the lost-primary case), a blank shadow beside a formatted
//! primary is filled from the primary (a shadow added to a running set).
//!
//! Invariants:
//! - a `sync` returns `Ok` only once both sides are durable: whatever the
//!   engine counts as synced (flushed blocks, commit-to-device writes,
//!   checkpoints) is on the shadow too, so a rebuild loses nothing the
//!   engine synced; a synchronous pair's `write_at` also waits for both;
//! - a failure on either side fails the call (for an asynchronous shadow:
//!   the next write or sync after it), and the engine then stops writing
//!   (its sticky failed state), never a silent half-write;
//! - the shadow is at least as large as the primary, checked at open; the
//!   pair's size is the primary's.

use super::shadow_queue::ShadowQueue;
use super::{BlockIo, DeviceIo, IoMode};

/// How many bytes one copy step moves while leveling a pair.
const COPY_CHUNK: usize = 1 << 20;

/// A primary device and its shadow.
pub struct Shadowed {
    primary: DeviceIo,
    shadow: Shadow,
}

/// How the shadow is written.
enum Shadow {
    /// In the caller's thread, after the primary.
    Sync(DeviceIo),
    /// From a bounded queue, by the pair's own thread.
    Async(ShadowQueue),
}

/// Which side a [`pair`] copied from, if it had to level them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leveled {
    /// Both sides were formatted (or both blank): nothing copied.
    Already,
    /// The blank primary was rebuilt from the shadow.
    FromShadow,
    /// The blank shadow was filled from the primary.
    FromPrimary,
}

/// Pairs `primary` with `shadow`, copying `used` bytes (the formatted
/// side's device bytes) from the formatted side to a blank one first.
/// `formatted` says which sides carry a device header; `queue_bytes` is
/// the most bytes waiting for an asynchronous shadow (0: the shadow is
/// written synchronously).
pub fn pair(
    primary: DeviceIo,
    shadow: DeviceIo,
    formatted: (bool, bool),
    used: u64,
    queue_bytes: usize,
) -> std::io::Result<(Shadowed, Leveled)> {
    if shadow.size() < primary.size() {
        return Err(std::io::Error::other(format!(
            "the shadow ({} bytes) is smaller than its primary ({} bytes)",
            shadow.size(),
            primary.size()
        )));
    }
    let leveled = match formatted {
        (false, true) => {
            copy(&shadow, &primary, used)?;
            Leveled::FromShadow
        }
        (true, false) => {
            copy(&primary, &shadow, used)?;
            Leveled::FromPrimary
        }
        _ => Leveled::Already,
    };
    let shadow = match queue_bytes {
        0 => Shadow::Sync(shadow),
        bytes => Shadow::Async(ShadowQueue::start(shadow, bytes)?),
    };
    Ok((Shadowed { primary, shadow }, leveled))
}

impl Shadowed {
    /// Bytes waiting to be written to an asynchronous shadow (0 for a
    /// synchronous one).
    pub fn queued_bytes(&self) -> usize {
        match &self.shadow {
            Shadow::Sync(_) => 0,
            Shadow::Async(queue) => queue.queued_bytes(),
        }
    }
}

fn shadow_error(error: std::io::Error) -> std::io::Error {
    std::io::Error::new(error.kind(), format!("shadow: {error}"))
}

/// Copies the first `len` bytes of `from` to `to` and syncs `to`.
fn copy(from: &DeviceIo, to: &DeviceIo, len: u64) -> std::io::Result<()> {
    let len = len.min(from.size()).min(to.size());
    let mut offset = 0u64;
    while offset < len {
        let step = (len - offset).min(COPY_CHUNK as u64) as usize;
        let bytes = from.read_at(offset, step)?;
        write_aligned(to, offset, &bytes)?;
        offset += step as u64;
    }
    to.sync()
}

/// Writes `bytes` at `offset` through an aligned buffer (a direct-I/O
/// medium needs one; `offset` and the length are multiples of the
/// alignment, as the copy's chunks and device sizes are).
fn write_aligned(to: &DeviceIo, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
    let mut buffer = super::AlignedBuf::zeroed(bytes.len());
    buffer.as_mut_slice().copy_from_slice(bytes);
    to.write_at(offset, buffer.as_slice())
}

impl BlockIo for Shadowed {
    #[inline]
    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        self.primary.read_at(offset, len)
    }

    fn write_at(&self, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
        self.primary.write_at(offset, bytes)?;
        match &self.shadow {
            Shadow::Sync(shadow) => shadow.write_at(offset, bytes),
            Shadow::Async(queue) => queue.push(offset, bytes),
        }
        .map_err(shadow_error)
    }

    fn sync(&self) -> std::io::Result<()> {
        self.primary.sync()?;
        match &self.shadow {
            Shadow::Sync(shadow) => shadow.sync(),
            Shadow::Async(queue) => queue.sync(),
        }
        .map_err(shadow_error)
    }

    fn size(&self) -> u64 {
        self.primary.size()
    }

    fn mode(&self) -> IoMode {
        self.primary.mode()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::device::io::{Fault, IoOp, SimDisk, Trigger};

    fn disk(size: u64) -> (SimDisk, DeviceIo) {
        let disk = SimDisk::new(size, 7);
        (disk.clone(), DeviceIo::Simulated(disk))
    }

    #[test]
    fn writes_and_syncs_reach_both_sides_and_reads_only_the_primary() {
        let (primary_disk, primary) = disk(1 << 20);
        let (shadow_disk, shadow) = disk(1 << 20);
        let (pair, leveled) = pair(primary, shadow, (false, false), 0, 0).unwrap();
        assert_eq!(leveled, Leveled::Already);
        pair.write_at(8192, &[5u8; 4096]).unwrap();
        pair.sync().unwrap();
        assert_eq!(primary_disk.read_at(8192, 4).unwrap(), vec![5; 4]);
        assert_eq!(shadow_disk.read_at(8192, 4).unwrap(), vec![5; 4]);
        // A byte only the shadow has is never read.
        shadow_disk.write_at(0, &[9u8; 4096]).unwrap();
        assert_eq!(pair.read_at(0, 2).unwrap(), vec![0, 0]);
    }

    #[test]
    fn a_blank_primary_is_rebuilt_from_its_shadow_and_a_blank_shadow_filled() {
        let (_, primary) = disk(4 << 20);
        let (shadow_disk, shadow) = disk(4 << 20);
        let pattern: Vec<u8> = (0..(3u32 << 20)).map(|i| (i % 251) as u8).collect();
        shadow_disk.write_at(0, &pattern).unwrap();
        let (rebuilt, leveled) = pair(primary, shadow, (false, true), 3 << 20, 0).unwrap();
        assert_eq!(leveled, Leveled::FromShadow);
        assert_eq!(rebuilt.read_at(0, 3 << 20).unwrap(), pattern);
        let (primary_disk, primary) = disk(4 << 20);
        primary_disk.write_at(0, &pattern).unwrap();
        let (shadow_disk, shadow) = disk(4 << 20);
        let (_, leveled) = pair(primary, shadow, (true, false), 3 << 20, 0).unwrap();
        assert_eq!(leveled, Leveled::FromPrimary);
        assert_eq!(shadow_disk.read_at(0, 3 << 20).unwrap(), pattern);
    }

    #[test]
    fn a_failing_shadow_fails_the_write_and_the_sync() {
        let (_, primary) = disk(1 << 20);
        let shadow_disk = SimDisk::new(1 << 20, 7);
        shadow_disk.inject(Fault {
            op: IoOp::Write,
            trigger: Trigger::Always,
        });
        let (pair, _) = pair(
            primary,
            DeviceIo::Simulated(shadow_disk.clone()),
            (true, true),
            0,
            0,
        )
        .unwrap();
        let error = pair.write_at(8192, &[1u8; 4096]).unwrap_err();
        assert!(error.to_string().contains("shadow"), "{error}");
    }

    #[test]
    fn a_shadow_smaller_than_its_primary_is_refused() {
        let (_, primary) = disk(4 << 20);
        let (_, shadow) = disk(1 << 20);
        assert!(pair(primary, shadow, (true, true), 4 << 20, 0).is_err());
    }

    /// Asynchronous: a write counts once the primary has it, whatever the
    /// shadow does; a sync waits until the shadow has everything.
    #[test]
    fn an_asynchronous_shadow_has_every_write_once_synced() {
        let (primary_disk, primary) = disk(4 << 20);
        let (shadow_disk, shadow) = disk(4 << 20);
        let (pair, _) = pair(primary, shadow, (false, false), 0, 16 << 10).unwrap();
        for block in 0..64u64 {
            pair.write_at(block * 4096, &[block as u8 + 1; 4096])
                .unwrap();
        }
        assert!(pair.queued_bytes() <= 16 << 10);
        pair.sync().unwrap();
        assert_eq!(pair.queued_bytes(), 0);
        for block in 0..64u64 {
            let expected = vec![block as u8 + 1; 4096];
            assert_eq!(shadow_disk.read_at(block * 4096, 4096).unwrap(), expected);
            assert_eq!(primary_disk.read_at(block * 4096, 4096).unwrap(), expected);
        }
        assert_eq!(shadow_disk.unsynced_bytes(), 0);
    }

    /// Asynchronous: the write a failing shadow could not take still
    /// counts on the primary (nothing is lost), and the failure is
    /// answered by the next sync and every later write: never dropped
    /// silently.
    #[test]
    fn an_asynchronous_shadow_failure_fails_the_next_sync_and_writes() {
        let (primary_disk, primary) = disk(1 << 20);
        let shadow_disk = SimDisk::new(1 << 20, 7);
        shadow_disk.inject(Fault {
            op: IoOp::Write,
            trigger: Trigger::Always,
        });
        let shadow = DeviceIo::Simulated(shadow_disk);
        let (pair, _) = pair(primary, shadow, (true, true), 0, 1 << 20).unwrap();
        pair.write_at(8192, &[1u8; 4096]).unwrap();
        assert_eq!(primary_disk.read_at(8192, 2).unwrap(), vec![1, 1]);
        let error = pair.sync().unwrap_err();
        assert!(error.to_string().contains("shadow"), "{error}");
        let error = pair.write_at(12288, &[2u8; 4096]).unwrap_err();
        assert!(error.to_string().contains("shadow"), "{error}");
    }
}
