//! A faulty disk in memory, for engine tests and the simulator.
//!
//! The disk holds two images of its bytes: what the host sees (`current`:
//! every completed write, as a page cache or a drive's volatile cache
//! shows it) and what survives a power cut (`durable`). A write changes
//! `current` and joins the pending writes; a successful sync moves every
//! pending write into `durable`. A [`SimDisk::power_cut`] then decides what
//! the pending writes left on the medium ([`PowerCut`]): nothing, all of
//! them, or, sector by sector, one of the versions the sector went through
//! — so an unsynced write may be lost, kept, or torn at a sector boundary,
//! and later writes may persist while earlier ones do not, as a drive
//! writing back its cache in any order does.
//!
//! Faults ([`Fault`]) fail chosen operations: the nth write, every sync
//! from the nth, reads of a byte range, each operation with a probability.
//! A failed read or write changes nothing. A failed sync is the worst case
//! a kernel allows ("fsyncgate"): the pending writes are dropped from the
//! way to the medium — still read back until the power cut, never made
//! durable by a later sync that succeeds — so a caller that retries the
//! sync and carries on is wrong, which is what the engine's sticky failed
//! state is for.
//!
//! Invariants: every choice (probabilistic faults, what a power cut keeps)
//! comes from the disk's own generator seeded at creation, so a run is a
//! function of the seed and the sequence of calls; `durable` changes only
//! by a successful sync or a power cut; a handle from before a power cut
//! fails every operation (a process that died does no more I/O), so only
//! the handle `power_cut` returns reaches the disk.

use super::{BlockIo, IoMode};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Default sector: the unit a power cut keeps or loses whole.
pub const SECTOR_BYTES: usize = 512;

/// The kinds of operations a fault can hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOp {
    Read,
    Write,
    Sync,
}

impl IoOp {
    fn index(self) -> usize {
        match self {
            IoOp::Read => 0,
            IoOp::Write => 1,
            IoOp::Sync => 2,
        }
    }
}

/// Which operations of a kind fail. Operations are counted per kind from 1
/// since the disk was created (power cuts do not reset the counts).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Trigger {
    /// The nth operation only.
    Nth(u64),
    /// The nth operation and every later one.
    From(u64),
    /// Every operation from now on.
    Always,
    /// Reads or writes touching a byte of `start..end` (never a sync).
    Range { start: u64, end: u64 },
    /// Each operation with this probability, drawn from the disk's seed.
    Chance(f64),
}

/// One injected fault.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fault {
    pub op: IoOp,
    pub trigger: Trigger,
}

/// What a power cut leaves of the writes not yet synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerCut {
    /// Nothing: the medium holds exactly what the last successful sync
    /// covered.
    LoseUnsynced,
    /// Every sector an unsynced write touched keeps one of its versions,
    /// drawn: as synced, after the last write to it, or after any write in
    /// between (a torn, reordered write-back).
    Scramble,
    /// Everything: the writes had drained just before the cut.
    KeepUnsynced,
}

/// A simulated disk; clones share the disk.
#[derive(Clone)]
pub struct SimDisk {
    shared: Arc<Mutex<Disk>>,
    /// The power cycle this handle belongs to.
    epoch: u64,
    size: u64,
}

struct Disk {
    sector: usize,
    current: Vec<u8>,
    durable: Vec<u8>,
    /// Writes a successful sync would make durable, in issue order.
    pending: Vec<(u64, Vec<u8>)>,
    /// Ranges where `current` may differ from `durable`: pending writes
    /// and writes a failed sync dropped.
    volatile: Vec<(u64, usize)>,
    /// A failed sync dropped writes since the last power cut.
    dropped: bool,
    faults: Vec<Fault>,
    counts: [u64; 3],
    failures: u64,
    rng: u64,
    epoch: u64,
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A draw in `[0, 1)`.
fn unit(state: &mut u64) -> f64 {
    (splitmix(state) >> 11) as f64 / (1u64 << 53) as f64
}

impl Disk {
    /// Counts an operation and fails it if a fault says so.
    fn admit(&mut self, op: IoOp, range: Option<(u64, u64)>) -> std::io::Result<()> {
        self.counts[op.index()] += 1;
        let count = self.counts[op.index()];
        let mut hit = false;
        for fault in self.faults.iter().filter(|fault| fault.op == op) {
            hit |= match fault.trigger {
                Trigger::Nth(n) => count == n,
                Trigger::From(n) => count >= n,
                Trigger::Always => true,
                Trigger::Range { start, end } => {
                    range.is_some_and(|(first, last)| first < end && start < last)
                }
                Trigger::Chance(p) => unit(&mut self.rng) < p,
            };
        }
        if hit {
            self.failures += 1;
            return Err(std::io::Error::other(format!(
                "simulated {op:?} failure (operation {count})"
            )));
        }
        Ok(())
    }

    fn bounds(&self, offset: u64, len: usize) -> std::io::Result<std::ops::Range<usize>> {
        let end = offset
            .checked_add(len as u64)
            .filter(|end| *end <= self.current.len() as u64);
        match end {
            Some(end) => Ok(offset as usize..end as usize),
            None => Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("simulated disk: {len} bytes at {offset} pass its end"),
            )),
        }
    }

    /// Applies, sector by sector, a drawn prefix of the pending writes
    /// touching each sector to `durable`.
    fn scramble(&mut self) {
        let sector = self.sector as u64;
        let mut touched: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        for (index, (offset, bytes)) in self.pending.iter().enumerate() {
            if bytes.is_empty() {
                continue;
            }
            let last = offset + bytes.len() as u64 - 1;
            for number in offset / sector..=last / sector {
                touched.entry(number).or_default().push(index);
            }
        }
        let Disk {
            pending,
            durable,
            rng,
            ..
        } = self;
        for (number, writes) in touched {
            let keep = (splitmix(rng) % (writes.len() as u64 + 1)) as usize;
            let (low, high) = (number * sector, (number + 1) * sector);
            for &index in &writes[..keep] {
                let (offset, bytes) = &pending[index];
                let start = low.max(*offset);
                let end = high.min(offset + bytes.len() as u64);
                durable[start as usize..end as usize]
                    .copy_from_slice(&bytes[(start - offset) as usize..(end - offset) as usize]);
            }
        }
    }
}

impl SimDisk {
    /// A blank (all zeros) disk of `size` bytes with 512-byte sectors.
    pub fn new(size: u64, seed: u64) -> SimDisk {
        let bytes = size as usize;
        SimDisk {
            shared: Arc::new(Mutex::new(Disk {
                sector: SECTOR_BYTES,
                current: vec![0; bytes],
                durable: vec![0; bytes],
                pending: Vec::new(),
                volatile: Vec::new(),
                dropped: false,
                faults: Vec::new(),
                counts: [0; 3],
                failures: 0,
                rng: seed,
                epoch: 0,
            })),
            epoch: 0,
            size,
        }
    }

    /// The same disk with sectors of `bytes` (a power of two): a power cut
    /// tears writes at this granularity.
    pub fn with_sector_bytes(self, bytes: usize) -> SimDisk {
        self.shared.lock().sector = bytes.max(1).next_power_of_two();
        self
    }

    /// Adds a fault (kept across power cuts until cleared).
    pub fn inject(&self, fault: Fault) {
        self.shared.lock().faults.push(fault);
    }

    pub fn clear_faults(&self) {
        self.shared.lock().faults.clear();
    }

    /// Operations that failed by a fault so far.
    pub fn failures(&self) -> u64 {
        self.shared.lock().failures
    }

    /// Operations of a kind so far (the count faults are triggered by).
    pub fn operations(&self, op: IoOp) -> u64 {
        self.shared.lock().counts[op.index()]
    }

    /// Bytes written and not yet covered by a successful sync.
    pub fn unsynced_bytes(&self) -> usize {
        self.shared
            .lock()
            .pending
            .iter()
            .map(|(_, bytes)| bytes.len())
            .sum()
    }

    /// Cuts the power: `cut` decides what the unsynced writes leave, the
    /// host's view becomes the medium's, and this handle and every other
    /// one from before the cut stop working. Returns the handle to reopen
    /// the disk with.
    pub fn power_cut(&self, cut: PowerCut) -> SimDisk {
        let mut disk = self.shared.lock();
        match cut {
            PowerCut::LoseUnsynced => {}
            PowerCut::KeepUnsynced => {
                let Disk {
                    pending, durable, ..
                } = &mut *disk;
                for (offset, bytes) in pending.iter() {
                    let start = *offset as usize;
                    durable[start..start + bytes.len()].copy_from_slice(bytes);
                }
            }
            PowerCut::Scramble => disk.scramble(),
        }
        let Disk {
            current,
            durable,
            volatile,
            ..
        } = &mut *disk;
        for (offset, len) in volatile.drain(..) {
            let range = offset as usize..offset as usize + len;
            current[range.clone()].copy_from_slice(&durable[range]);
        }
        disk.pending.clear();
        disk.dropped = false;
        disk.epoch += 1;
        SimDisk {
            shared: self.shared.clone(),
            epoch: disk.epoch,
            size: self.size,
        }
    }

    fn lock(&self) -> std::io::Result<parking_lot::MutexGuard<'_, Disk>> {
        let disk = self.shared.lock();
        if disk.epoch != self.epoch {
            return Err(std::io::Error::other(
                "simulated disk: this handle died with a power cut",
            ));
        }
        Ok(disk)
    }
}

impl BlockIo for SimDisk {
    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let mut disk = self.lock()?;
        disk.admit(
            IoOp::Read,
            Some((offset, offset.saturating_add(len as u64))),
        )?;
        let range = disk.bounds(offset, len)?;
        Ok(disk.current[range].to_vec())
    }

    fn write_at(&self, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
        let mut disk = self.lock()?;
        let end = offset.saturating_add(bytes.len() as u64);
        disk.admit(IoOp::Write, Some((offset, end)))?;
        let range = disk.bounds(offset, bytes.len())?;
        disk.current[range].copy_from_slice(bytes);
        disk.pending.push((offset, bytes.to_vec()));
        disk.volatile.push((offset, bytes.len()));
        Ok(())
    }

    fn sync(&self) -> std::io::Result<()> {
        let mut disk = self.lock()?;
        if let Err(error) = disk.admit(IoOp::Sync, None) {
            // fsyncgate: the writes are off the way to the medium.
            disk.dropped |= !disk.pending.is_empty();
            disk.pending.clear();
            return Err(error);
        }
        let Disk {
            pending, durable, ..
        } = &mut *disk;
        for (offset, bytes) in pending.drain(..) {
            let start = offset as usize;
            durable[start..start + bytes.len()].copy_from_slice(&bytes);
        }
        if !disk.dropped {
            // `current` equals `durable` again everywhere.
            disk.volatile.clear();
        }
        Ok(())
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn mode(&self) -> IoMode {
        IoMode::Buffered
    }
}

impl std::fmt::Debug for SimDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimDisk")
            .field("size", &self.size)
            .field("epoch", &self.epoch)
            .finish()
    }
}

impl PartialEq for SimDisk {
    /// The same disk in the same power cycle.
    fn eq(&self, other: &SimDisk) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared) && self.epoch == other.epoch
    }
}

impl Eq for SimDisk {}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn read(disk: &SimDisk, offset: u64, len: usize) -> Vec<u8> {
        disk.read_at(offset, len).unwrap()
    }

    #[test]
    fn a_power_cut_loses_exactly_the_unsynced_writes() {
        let disk = SimDisk::new(8192, 1);
        disk.write_at(0, &[1; 600]).unwrap();
        disk.sync().unwrap();
        disk.write_at(100, &[2; 10]).unwrap();
        disk.write_at(4000, &[3; 1000]).unwrap();
        assert_eq!(
            read(&disk, 95, 20)[5..15],
            [2; 10],
            "reads see unsynced writes"
        );
        assert_eq!(disk.unsynced_bytes(), 1010);
        let disk = disk.power_cut(PowerCut::LoseUnsynced);
        assert_eq!(read(&disk, 0, 600), vec![1; 600]);
        assert_eq!(read(&disk, 4000, 1000), vec![0; 1000]);
        assert_eq!(disk.unsynced_bytes(), 0);
    }

    #[test]
    fn a_handle_from_before_a_power_cut_does_nothing_more() {
        let old = SimDisk::new(4096, 1);
        let new = old.power_cut(PowerCut::LoseUnsynced);
        assert!(old.write_at(0, &[1]).is_err());
        assert!(old.read_at(0, 1).is_err());
        assert!(old.sync().is_err());
        assert_eq!(read(&new, 0, 1), vec![0]);
        assert_ne!(old, new);
    }

    #[test]
    fn keep_unsynced_keeps_everything() {
        let disk = SimDisk::new(4096, 1);
        disk.write_at(10, &[5; 100]).unwrap();
        let disk = disk.power_cut(PowerCut::KeepUnsynced);
        assert_eq!(read(&disk, 10, 100), vec![5; 100]);
    }

    /// Every sector holds one of its versions; some seed tears a write
    /// (part of it kept, part lost) and some keeps a later write while an
    /// earlier one to another sector is lost.
    #[test]
    fn a_scrambled_power_cut_keeps_a_version_of_each_sector_and_tears_writes() {
        let (mut torn, mut reordered) = (false, false);
        for seed in 0..64 {
            let disk = SimDisk::new(4096, seed);
            disk.write_at(0, &[1; 1024]).unwrap(); // sectors 0, 1
            disk.write_at(1024, &[2; 512]).unwrap(); // sector 2
            disk.write_at(0, &[3; 512]).unwrap(); // sector 0 again
            let disk = disk.power_cut(PowerCut::Scramble);
            let sectors: Vec<u8> = (0..3).map(|s| read(&disk, s * 512, 512)[0]).collect();
            for (s, versions) in [[0u8, 1, 3].as_slice(), &[0, 1], &[0, 2]]
                .iter()
                .enumerate()
            {
                let sector = read(&disk, s as u64 * 512, 512);
                assert!(sector.iter().all(|b| *b == sector[0]), "a sector is whole");
                assert!(
                    versions.contains(&sector[0]),
                    "seed {seed}: sector {s} = {}",
                    sector[0]
                );
            }
            torn |= (sectors[0] == 1) != (sectors[1] == 1) && sectors[0] != 3;
            reordered |= sectors[2] == 2 && sectors[1] == 0;
        }
        assert!(torn && reordered, "64 seeds never tore or reordered");
    }

    #[test]
    fn sector_size_sets_the_tear_granularity() {
        let mut torn = false;
        for seed in 0..32 {
            let disk = SimDisk::new(4096, seed).with_sector_bytes(128);
            disk.write_at(0, &[9; 512]).unwrap();
            let disk = disk.power_cut(PowerCut::Scramble);
            let bytes = read(&disk, 0, 512);
            for chunk in bytes.chunks(128) {
                assert!(chunk.iter().all(|b| *b == chunk[0]));
            }
            torn |= bytes.chunks(128).any(|c| c[0] == 9) && bytes.chunks(128).any(|c| c[0] == 0);
        }
        assert!(torn);
    }

    #[test]
    fn faults_hit_the_chosen_operations() {
        let disk = SimDisk::new(4096, 1);
        disk.inject(Fault {
            op: IoOp::Write,
            trigger: Trigger::Nth(2),
        });
        disk.inject(Fault {
            op: IoOp::Read,
            trigger: Trigger::Range {
                start: 1000,
                end: 1010,
            },
        });
        disk.write_at(0, &[1]).unwrap();
        assert!(disk.write_at(1, &[1]).is_err(), "the second write fails");
        disk.write_at(2, &[1]).unwrap();
        assert_eq!(
            read(&disk, 0, 3),
            vec![1, 0, 1],
            "a failed write changes nothing"
        );
        assert!(disk.read_at(995, 6).is_err());
        assert!(disk.read_at(1009, 1).is_err());
        disk.read_at(990, 10).unwrap();
        disk.read_at(1010, 10).unwrap();
        disk.inject(Fault {
            op: IoOp::Sync,
            trigger: Trigger::From(2),
        });
        disk.sync().unwrap();
        assert!(disk.sync().is_err() && disk.sync().is_err());
        assert_eq!(disk.failures(), 5);
        assert_eq!(disk.operations(IoOp::Sync), 3);
        disk.clear_faults();
        disk.sync().unwrap();
    }

    #[test]
    fn chance_faults_follow_the_seed() {
        let pattern = |seed| {
            let disk = SimDisk::new(4096, seed);
            disk.inject(Fault {
                op: IoOp::Write,
                trigger: Trigger::Chance(0.5),
            });
            (0..64)
                .map(|i| disk.write_at(i, &[1]).is_ok())
                .collect::<Vec<_>>()
        };
        assert_eq!(pattern(7), pattern(7));
        assert_ne!(pattern(7), pattern(8));
        assert!(pattern(7).iter().any(|ok| *ok) && pattern(7).iter().any(|ok| !ok));
    }

    /// After a failed sync the pending writes never reach the medium, even
    /// when a later sync succeeds; later writes do.
    #[test]
    fn a_failed_sync_drops_the_pending_writes_for_good() {
        let disk = SimDisk::new(4096, 1);
        disk.inject(Fault {
            op: IoOp::Sync,
            trigger: Trigger::Nth(1),
        });
        disk.write_at(0, &[1; 512]).unwrap();
        assert!(disk.sync().is_err());
        assert_eq!(read(&disk, 0, 1), vec![1], "still read back");
        disk.write_at(512, &[2; 512]).unwrap();
        disk.sync().unwrap();
        let disk = disk.power_cut(PowerCut::KeepUnsynced);
        assert_eq!(read(&disk, 0, 1), vec![0], "the dropped write is gone");
        assert_eq!(read(&disk, 512, 1), vec![2], "the later synced write stays");
    }

    #[test]
    fn out_of_range_operations_fail() {
        let disk = SimDisk::new(4096, 1);
        assert!(disk.read_at(4090, 10).is_err());
        assert!(disk.write_at(4096, &[1]).is_err());
        assert!(disk.read_at(u64::MAX, 2).is_err());
    }
}
