//! Index checkpoints: a restart after a crash (kill -9, power cut) without
//! a full cold scan.
//!
//! A checkpoint is not a copy of the index. It is what a cold scan of a
//! set of write blocks would find: for every digest, the newest copy (its
//! sequence number, address and metadata, tombstones included) among the
//! records of the blocks it *covers*, each named with its incarnation. A
//! sealed block never changes while it keeps its incarnation (writes are
//! copy-on-write; a block is rewritten only after it was freed and opened
//! again under a new incarnation), so what a checkpoint says stays true for
//! as long as its blocks keep their incarnations, however old it is.
//!
//! Writing one ([`DeviceEngine::write_checkpoint`], from a background
//! thread, writes never stop): the blocks sealed now are chosen, every
//! device is synced (so they are durable before anything claims them),
//! the blocks sealed since the previous checkpoint are read (from the
//! post-write queue when they are still there) and their records merged,
//! newest sequence first, with the previous checkpoint's entries streamed
//! from its file; entries in blocks freed since are dropped. The result
//! goes to a temporary file, is synced, renamed over the previous one, and
//! the directory is synced: a crash leaves the old or the new checkpoint,
//! whole. A block read while defrag frees it is left out (it is then
//! replayed at restart if it is still in use).
//!
//! Restarting from one ([`DeviceEngine::checkpoint_restart`]): the file is
//! read and checked whole (magic, version, instance, geometry, CRC-32C,
//! every entry's address and device) before anything reaches the index;
//! any failure is an `Err` and the caller cold-starts. Then, per device,
//! every block header is read: a block in use whose incarnation the
//! checkpoint covers is taken as is; every other block in use was written
//! after it (or was open then) and is replayed in write order with the
//! cold scan's rules ([`super::scan`]). A checkpoint entry whose block no
//! longer carries its incarnation is dropped; for a digest also found in
//! the replay the higher sequence wins (the replayed copy on a tie). The
//! winners are resolved as the cold scan resolves them (tombstones stay,
//! expired records become tombstones, truncated ones are dead).
//!
//! Why this equals the cold scan: the cold scan keeps, per digest, the
//! copy with the highest sequence over all blocks in use; the restart keeps
//! the highest over (the checkpoint's winner, if its block is intact) and
//! the replayed blocks. They differ only if the checkpoint's winner was in
//! a block freed since while an older copy survives in a covered block; a
//! block is freed only when its copies are dead or moved, and the move or
//! the newer copy or tombstone that killed it was synced first — it is in
//! a replayed block (or, freed in turn, the same holds of it), and a
//! tombstone is dropped only once every block older than it is free. So
//! no record deleted or truncated comes back, and a record synced before
//! its acknowledgement (commit-to-device) is in a covered or a replayed
//! block.
//!
//! Invariants: nothing is handed to the index from a checkpoint that failed
//! a check; a checkpoint names only blocks that were synced before it was
//! written; nothing in a checkpoint file can make this panic.

use super::format::{self, RBLOCK};
use super::io::BlockIo;
use super::persist::{sync_parent, HeaderFields};
use super::scan::{BlockScan, Candidate, Candidates, Resolver, SetTable, Sink};
use super::{BlockState, ColdStartReport, Device, DeviceEngine};
use crate::DeviceAddress;
use citrine_types::{Digest, PARTITIONS};
use std::borrow::Cow;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::sync::atomic::Ordering;

const CHECKPOINT_MAGIC: &[u8; 8] = b"CITRCKP\0";
/// Version of the checkpoint file; any other is refused (cold start).
pub const CHECKPOINT_VERSION: u32 = 1;
/// Bytes of one entry: digest 20, sequence 8, address 8, generation 2,
/// life 2, void time 4, last-update time 8, set id 2, flags 1.
const ENTRY_BYTES: usize = 55;
/// Flags of the entry that ends a device's entries.
const END_OF_DEVICE: u8 = 0xFF;

/// No block sealed for this long: writes paused, a checkpoint is due if
/// anything is uncovered (a kill after a load then replays almost nothing).
pub const QUIET: std::time::Duration = std::time::Duration::from_secs(2);

/// Per device, per block: the incarnation covered (0: not covered).
pub(super) type Covered = Vec<Vec<u64>>;

/// What writing a checkpoint did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckpointReport {
    /// Entries written (live records and tombstones).
    pub entries: u64,
    /// Blocks covered.
    pub blocks_covered: u64,
    /// Blocks read because they were sealed since the previous checkpoint.
    pub blocks_read: u64,
    /// Bytes of the file.
    pub bytes: u64,
    /// The previous checkpoint was missing or unusable: every block read.
    pub rebuilt: bool,
}

/// The header of a checkpoint file.
struct Header {
    /// The engine's next sequence number when it was written.
    sequence: u64,
    sets: Vec<Vec<u8>>,
    covered: Covered,
}

impl<R: Read> super::persist::HeaderFields for CrcReader<R> {
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }
}

/// Reads a checkpoint, computing its CRC and counting bytes as it goes.
struct CrcReader<R: Read> {
    inner: R,
    crc: u32,
    at: u64,
}

impl<R: Read> CrcReader<R> {
    fn new(inner: R) -> CrcReader<R> {
        CrcReader {
            inner,
            crc: 0,
            at: 0,
        }
    }

    fn fill(&mut self, out: &mut [u8]) -> Result<(), String> {
        self.inner.read_exact(out).map_err(|error| {
            format!(
                "checkpoint truncated or unreadable at byte {}: {error}",
                self.at
            )
        })?;
        self.crc = format::crc32c_append(self.crc, out);
        self.at += out.len() as u64;
        Ok(())
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut out = [0u8; N];
        self.fill(&mut out)?;
        Ok(out)
    }

    /// Reads the trailing CRC (not part of the sum) and checks it.
    fn finish(mut self) -> Result<(), String> {
        let computed = self.crc;
        let mut stored = [0u8; 4];
        self.inner
            .read_exact(&mut stored)
            .map_err(|_| "checkpoint truncated before its checksum".to_string())?;
        if u32::from_le_bytes(stored) != computed {
            return Err("checkpoint checksum mismatch".into());
        }
        let mut rest = [0u8; 1];
        match self.inner.read(&mut rest) {
            Ok(0) => Ok(()),
            _ => Err("checkpoint has trailing bytes".into()),
        }
    }
}

/// Writes a checkpoint, computing its CRC.
struct CrcWriter<W: Write> {
    inner: W,
    crc: u32,
    bytes: u64,
}

impl<W: Write> CrcWriter<W> {
    fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.crc = format::crc32c_append(self.crc, bytes);
        self.bytes += bytes.len() as u64;
        self.inner.write_all(bytes)
    }

    fn finish(mut self) -> std::io::Result<W> {
        let crc = self.crc;
        self.inner.write_all(&crc.to_le_bytes())?;
        Ok(self.inner)
    }
}

fn encode_entry(digest: &Digest, candidate: &Candidate) -> [u8; ENTRY_BYTES] {
    let mut out = [0u8; ENTRY_BYTES];
    out[..20].copy_from_slice(&digest.0);
    out[20..28].copy_from_slice(&candidate.sequence.to_le_bytes());
    out[28..36].copy_from_slice(&candidate.address.0.to_le_bytes());
    out[36..38].copy_from_slice(&candidate.generation.to_le_bytes());
    out[38..40].copy_from_slice(&candidate.life.to_le_bytes());
    out[40..44].copy_from_slice(&candidate.void_time.to_le_bytes());
    out[44..52].copy_from_slice(&candidate.last_update_ms.to_le_bytes());
    out[52..54].copy_from_slice(&candidate.set.to_le_bytes());
    out[54] = u8::from(candidate.tombstone);
    out
}

/// Decodes an entry (`None`: the end of a device's entries).
fn decode_entry(bytes: &[u8; ENTRY_BYTES]) -> Result<Option<(Digest, Candidate)>, String> {
    let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
    let u32_at =
        |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let u64_at = |at: usize| {
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(word)
    };
    let tombstone = match bytes[54] {
        0 => false,
        1 => true,
        END_OF_DEVICE => return Ok(None),
        other => return Err(format!("checkpoint entry with flags {other:#x}")),
    };
    let mut digest = [0u8; 20];
    digest.copy_from_slice(&bytes[..20]);
    let address = DeviceAddress::from_bits(u64_at(28))
        .ok_or_else(|| format!("checkpoint entry address {:#x} impossible", u64_at(28)))?;
    Ok(Some((
        Digest(digest),
        Candidate {
            sequence: u64_at(20),
            address,
            generation: u16_at(36),
            life: u16_at(38),
            void_time: u32_at(40),
            last_update_ms: u64_at(44),
            set: u16_at(52),
            tombstone,
        },
    )))
}

/// The byte offsets of a device's entries in partition order (a counting
/// sort on the digest's partition): the index then fills one partition's
/// table after another instead of all of them at random. Files written by
/// this version are in that order already (offsets ascending); the sort
/// only matters for one that is not.
fn by_partition(section: &[u8]) -> Vec<usize> {
    let partition =
        |chunk: &[u8]| usize::from(u16::from_le_bytes([chunk[0], chunk[1]])) % PARTITIONS;
    let mut starts = vec![0usize; PARTITIONS + 1];
    for chunk in section.chunks_exact(ENTRY_BYTES) {
        starts[partition(chunk) + 1] += 1;
    }
    for index in 1..starts.len() {
        starts[index] += starts[index - 1];
    }
    let mut order = vec![0usize; section.len() / ENTRY_BYTES];
    for (index, chunk) in section.chunks_exact(ENTRY_BYTES).enumerate() {
        let slot = &mut starts[partition(chunk)];
        order[*slot] = index * ENTRY_BYTES;
        *slot += 1;
    }
    order
}

/// The previous checkpoint as the next one reads it: its header and a
/// reader at its first entry.
type Previous = (Header, CrcReader<BufReader<std::fs::File>>);

/// A whole checkpoint, checked, ready to apply: its header and, per
/// device, the byte range of its entries in `bytes`.
struct Loaded {
    header: Header,
    bytes: Vec<u8>,
    sections: Vec<std::ops::Range<usize>>,
}

impl DeviceEngine {
    // ------------------------------------------------------------ the file

    fn write_header<W: Write>(
        &self,
        out: &mut CrcWriter<W>,
        header: &Header,
    ) -> std::io::Result<()> {
        out.put(CHECKPOINT_MAGIC)?;
        out.put(&CHECKPOINT_VERSION.to_le_bytes())?;
        out.put(&self.instance_id.to_le_bytes())?;
        out.put(&header.sequence.to_le_bytes())?;
        out.put(&self.config.write_block_size.to_le_bytes())?;
        out.put(&(self.devices.len() as u32).to_le_bytes())?;
        for device in &self.devices {
            out.put(&device.block_count.to_le_bytes())?;
        }
        out.put(&(header.sets.len() as u32).to_le_bytes())?;
        for name in &header.sets {
            let length = name.len().min(format::SET_NAME_MAX);
            out.put(&[length as u8])?;
            out.put(&name[..length])?;
        }
        for covered in &header.covered {
            let blocks: Vec<(u32, u64)> = covered
                .iter()
                .enumerate()
                .filter(|(_, incarnation)| **incarnation != 0)
                .map(|(block, incarnation)| (block as u32, *incarnation))
                .collect();
            out.put(&(blocks.len() as u32).to_le_bytes())?;
            for (block, incarnation) in blocks {
                out.put(&block.to_le_bytes())?;
                out.put(&incarnation.to_le_bytes())?;
            }
        }
        Ok(())
    }

    /// Reads and checks a checkpoint header against this engine.
    fn read_header<R: Read>(&self, input: &mut CrcReader<R>) -> Result<Header, String> {
        if &input.array::<8>()? != CHECKPOINT_MAGIC {
            return Err("not an index checkpoint".into());
        }
        let version = input.u32()?;
        if version != CHECKPOINT_VERSION {
            return Err(format!(
                "checkpoint version {version}, this build reads {CHECKPOINT_VERSION}"
            ));
        }
        let sequence = self.read_identity(input, "checkpoint")?;
        let set_count = input.u32()? as usize;
        if set_count > usize::from(u16::MAX) + 1 {
            return Err("checkpoint set count impossible".into());
        }
        let mut sets = Vec::with_capacity(set_count);
        for _ in 0..set_count {
            let [length] = input.array::<1>()?;
            let mut name = vec![0u8; usize::from(length)];
            input.fill(&mut name)?;
            sets.push(name);
        }
        let mut covered = Vec::with_capacity(self.devices.len());
        for device in &self.devices {
            let mut blocks = vec![0u64; device.block_count as usize];
            let count = input.u32()?;
            if count > device.block_count {
                return Err("checkpoint covers more blocks than the device has".into());
            }
            for _ in 0..count {
                let block = input.u32()? as usize;
                let incarnation = input.u64()?;
                let slot = blocks
                    .get_mut(block)
                    .ok_or("checkpoint covers a block outside the device")?;
                if incarnation == 0 || *slot != 0 {
                    return Err("checkpoint covers a block twice or with no incarnation".into());
                }
                *slot = incarnation;
            }
            covered.push(blocks);
        }
        Ok(Header {
            sequence,
            sets,
            covered,
        })
    }

    /// Checks an entry of device `device` against the geometry and the
    /// covered blocks: an entry outside a covered block is a defect.
    fn check_entry(
        &self,
        device: usize,
        header: &Header,
        digest: &Digest,
        candidate: &Candidate,
    ) -> Result<(), String> {
        let address = candidate.address;
        let (block, _) = self
            .locate(address)
            .ok_or_else(|| format!("checkpoint entry at {:#x}, outside the devices", address.0))?;
        if address.device() != device || self.device_of(digest) != device {
            return Err("checkpoint entry on the wrong device".into());
        }
        if header.covered[device][block as usize] == 0 {
            return Err(format!(
                "checkpoint entry in block {block}, which it does not cover"
            ));
        }
        if usize::from(candidate.set) >= header.sets.len().max(1) {
            return Err("checkpoint entry with an unknown set".into());
        }
        Ok(())
    }

    /// Reads the whole file at `path` and checks all of it.
    fn load_checkpoint(&self, path: &Path) -> Result<Option<Loaded>, String> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => {
                return Err(format!(
                    "cannot read checkpoint {}: {error}",
                    path.display()
                ))
            }
        };
        if self.devices.iter().any(|device| device.fresh) {
            return Err("a device was formatted by this start".into());
        }
        // The checksum first: damage anywhere is named as such.
        if bytes.len() < CHECKPOINT_MAGIC.len() + 8 {
            return Err("checkpoint truncated".into());
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]) != format::crc32c(body) {
            return Err("checkpoint checksum mismatch (damaged or truncated)".into());
        }
        let mut input = CrcReader::new(bytes.as_slice());
        let header = self.read_header(&mut input)?;
        let mut sections = Vec::with_capacity(self.devices.len());
        for device in 0..self.devices.len() {
            let start = input.at as usize;
            loop {
                let entry = input.array::<ENTRY_BYTES>()?;
                match decode_entry(&entry)? {
                    Some((digest, candidate)) => {
                        self.check_entry(device, &header, &digest, &candidate)?
                    }
                    None => break,
                }
            }
            sections.push(start..input.at as usize - ENTRY_BYTES);
        }
        input.finish()?;
        Ok(Some(Loaded {
            header,
            bytes,
            sections,
        }))
    }

    // ------------------------------------------------------------ restart

    /// Rebuilds the block map, the tombstones and (through `sink`) the index
    /// from the checkpoint at `path` and the blocks written after it.
    /// `Ok(None)`: no checkpoint. `Err`: a checkpoint that failed a check
    /// (the reason is for the log); nothing was handed to `sink`, and the
    /// caller cold-starts.
    pub fn checkpoint_restart(
        &self,
        path: &Path,
        sink: &Sink<'_>,
    ) -> Result<Option<ColdStartReport>, String> {
        let Some(loaded) = self.load_checkpoint(path)? else {
            return Ok(None);
        };
        let report = self.per_device(|device| {
            let section = &loaded.bytes[loaded.sections[device.index].clone()];
            self.restart_device(device, &loaded.header, section, sink)
        });
        let mut state = self.checkpoint.lock();
        state.covered = loaded.header.covered;
        state.written_at = None;
        drop(state);
        Ok(Some(report))
    }

    /// One device's restart from its checkpoint entries.
    fn restart_device(
        &self,
        device: &Device,
        header: &Header,
        section: &[u8],
        sink: &Sink<'_>,
    ) -> ColdStartReport {
        let mut report = ColdStartReport::default();
        let covered = &header.covered[device.index];
        let mut blocks = BlockScan::new(device.block_count);
        let mut replay = Candidates::default();
        for (block, incarnation) in self.blocks_to_replay(device, covered, &mut blocks, &mut report)
        {
            self.replay_block(
                device,
                block,
                incarnation,
                &mut blocks,
                &mut replay,
                &mut report,
            );
        }
        let mut resolver = Resolver::new(self, device);
        for at in by_partition(section) {
            let mut entry = [0u8; ENTRY_BYTES];
            entry.copy_from_slice(&section[at..at + ENTRY_BYTES]);
            // Checked when loaded.
            let Ok(Some((digest, candidate))) = decode_entry(&entry) else {
                continue;
            };
            report.checkpoint_entries += 1;
            self.merge_entry(
                digest,
                candidate,
                header,
                covered,
                &blocks,
                &mut replay,
                &mut resolver,
                sink,
                &mut report,
            );
        }
        for (digest, candidate) in &replay.map {
            let set_name = replay.sets.name(candidate.set);
            resolver.resolve(*digest, candidate, set_name, sink, &mut report);
        }
        let max_sequence = replay.max_sequence.max(header.sequence.saturating_sub(1));
        self.finish_restart(device, blocks, resolver, max_sequence, &report);
        report
    }

    /// Reads every block header: covered blocks that keep their
    /// incarnation are marked in use; the other blocks in use are returned
    /// in write order (incarnation) for a replay.
    fn blocks_to_replay(
        &self,
        device: &Device,
        covered: &[u64],
        blocks: &mut BlockScan,
        report: &mut ColdStartReport,
    ) -> Vec<(u32, u64)> {
        let mut replay = Vec::new();
        for block in 0..device.block_count {
            let data = match device.io.read_at(self.block_offset(block), RBLOCK) {
                Ok(data) => data,
                Err(error) => {
                    tracing::error!(device = %device.path, block, "cannot read write block header: {error}; block skipped");
                    report.corrupt_blocks += 1;
                    continue;
                }
            };
            let Some(block_header) = self.block_in_use(device, block, &data, report) else {
                continue;
            };
            if covered[block as usize] == block_header.incarnation {
                blocks.in_use(block, block_header.incarnation);
                report.blocks_in_use += 1;
            } else {
                replay.push((block, block_header.incarnation));
            }
        }
        replay.sort_by_key(|(_, incarnation)| *incarnation);
        replay
    }

    /// Reads a block written after the checkpoint whole and offers its
    /// records, as the cold scan does.
    fn replay_block(
        &self,
        device: &Device,
        block: u32,
        incarnation: u64,
        blocks: &mut BlockScan,
        replay: &mut Candidates,
        report: &mut ColdStartReport,
    ) {
        let Some(data) = self.read_whole_block(device, block, report) else {
            return;
        };
        match self.block_in_use(device, block, &data, report) {
            Some(header) if header.incarnation == incarnation => {
                blocks.in_use(block, incarnation);
                report.blocks_in_use += 1;
                report.blocks_replayed += 1;
                self.scan_records(device, block, incarnation, &data, replay, report);
            }
            _ => {
                tracing::warn!(device = %device.path, block, "write block changed between its header read and its replay; block skipped");
                report.corrupt_blocks += 1;
            }
        }
    }

    /// Merges one checkpoint entry with the replay: dropped if its block no
    /// longer carries the covered incarnation; against a replayed copy the
    /// higher sequence wins (the replayed one on a tie); alone, resolved.
    #[allow(clippy::too_many_arguments)]
    fn merge_entry(
        &self,
        digest: Digest,
        mut candidate: Candidate,
        header: &Header,
        covered: &[u64],
        blocks: &BlockScan,
        replay: &mut Candidates,
        resolver: &mut Resolver<'_>,
        sink: &Sink<'_>,
        report: &mut ColdStartReport,
    ) {
        let Some((block, _)) = self.locate(candidate.address) else {
            return;
        };
        let block = block as usize;
        let intact =
            blocks.states[block] == BlockState::Full && blocks.open_seq[block] == covered[block];
        if !intact {
            return;
        }
        let set_name = header
            .sets
            .get(usize::from(candidate.set))
            .map_or(&[][..], Vec::as_slice);
        match replay.map.get(&digest) {
            Some(replayed) if replayed.sequence >= candidate.sequence => {}
            Some(_) => {
                candidate.set = replay.sets.id(set_name);
                replay.map.insert(digest, candidate);
            }
            None => resolver.resolve(digest, &candidate, set_name, sink, report),
        }
    }

    // ------------------------------------------------------------ writing

    /// Per device, per block: the incarnation of each sealed block (0 for
    /// free, open and emptied blocks).
    pub(super) fn covered_now(&self) -> Covered {
        self.devices
            .iter()
            .map(|device| {
                let map = device.blocks.lock();
                map.state
                    .iter()
                    .zip(&map.open_seq)
                    .map(|(state, incarnation)| match state {
                        BlockState::Full | BlockState::Defrag => *incarnation,
                        _ => 0,
                    })
                    .collect()
            })
            .collect()
    }

    fn remember_covered(&self, covered: Covered) {
        let mut state = self.checkpoint.lock();
        state.covered = covered;
        state.written_at = Some(std::time::Instant::now());
    }

    /// Whether a checkpoint is worth writing now: blocks were sealed since
    /// the last one and they are a quarter of what it covers, or no block
    /// was sealed for [`QUIET`] (writes paused: a load finished), or it is
    /// older than `period`; or blocks it covers were freed and it is older
    /// than `period`. Cheap (one pass over the block maps).
    pub fn checkpoint_due(&self, period: std::time::Duration) -> bool {
        if self.failed() {
            return false;
        }
        let now = self.covered_now();
        let mut state = self.checkpoint.lock();
        let quiet = self.writes_quiet(&mut state);
        let old = state.written_at.is_none_or(|at| at.elapsed() >= period);
        let (mut new, mut gone, mut kept) = (0u64, 0u64, 0u64);
        for (now, then) in now.iter().zip(&state.covered) {
            for (now, then) in now.iter().zip(then) {
                match (*now, *then) {
                    (0, 0) => {}
                    (now, then) if now == then => kept += 1,
                    (0, _) => gone += 1,
                    (_, 0) => new += 1,
                    _ => {
                        new += 1;
                        gone += 1;
                    }
                }
            }
        }
        if state.covered.is_empty() {
            new = now
                .iter()
                .flatten()
                .filter(|incarnation| **incarnation != 0)
                .count() as u64;
        }
        (new > 0 && (new * 4 >= kept || old || quiet)) || (gone > 0 && old)
    }

    /// True when no block was sealed for [`QUIET`].
    fn writes_quiet(&self, state: &mut super::CheckpointState) -> bool {
        let sealed = self.stats.blocks_written.load(Ordering::Relaxed);
        if sealed != state.sealed_seen || state.sealed_since.is_none() {
            state.sealed_seen = sealed;
            state.sealed_since = Some(std::time::Instant::now());
            return false;
        }
        state
            .sealed_since
            .is_some_and(|since| since.elapsed() >= QUIET)
    }

    /// Writes a checkpoint to `path` (see the module doc): merges the
    /// previous one there with the blocks sealed since. Runs beside client
    /// writes; one caller at a time.
    pub fn write_checkpoint(&self, path: &Path) -> Result<CheckpointReport, String> {
        if self.failed() {
            return Err("the device failed: no checkpoint".into());
        }
        let sequence = self.sequence.load(Ordering::Relaxed);
        let mut covered = self.covered_now();
        for device in &self.devices {
            self.device_sync(device, "sync before an index checkpoint")
                .map_err(|error| error.to_string())?;
        }
        let previous = match self.open_previous(path) {
            Ok(previous) => previous,
            Err(why) => {
                tracing::warn!(namespace = %self.config.namespace, "previous index checkpoint unusable ({why}): rebuilding it from every sealed block");
                None
            }
        };
        let result = self.merge_into(path, sequence, &mut covered, previous);
        let result = match result {
            Err(why) if why.starts_with("previous:") => {
                tracing::warn!(namespace = %self.config.namespace, "previous index checkpoint unusable ({why}): rebuilding it from every sealed block");
                covered = self.covered_now();
                self.merge_into(path, sequence, &mut covered, None)
            }
            other => other,
        };
        let report = result?;
        self.remember_covered(covered);
        Ok(report)
    }

    /// The previous checkpoint's header and a reader at its entries.
    fn open_previous(&self, path: &Path) -> Result<Option<Previous>, String> {
        let file = match std::fs::File::open(path) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(error.to_string()),
        };
        let mut input = CrcReader::new(BufReader::with_capacity(1 << 20, file));
        let header = self.read_header(&mut input)?;
        Ok(Some((header, input)))
    }

    /// Reads the newly sealed blocks, then streams the previous entries
    /// and the new ones into a temporary file renamed over `path`.
    fn merge_into(
        &self,
        path: &Path,
        sequence: u64,
        covered: &mut Covered,
        previous: Option<Previous>,
    ) -> Result<CheckpointReport, String> {
        let mut report = CheckpointReport {
            rebuilt: previous.is_none(),
            ..CheckpointReport::default()
        };
        let (old_header, mut old_input) = match previous {
            Some((header, input)) => (Some(header), Some(input)),
            None => (None, None),
        };
        let mut fresh = Candidates {
            sets: SetTable::from_names(
                old_header
                    .as_ref()
                    .map_or(Vec::new(), |header| header.sets.clone()),
            ),
            ..Candidates::default()
        };
        let mut per_device: Vec<Candidates> = Vec::with_capacity(self.devices.len());
        for device in &self.devices {
            let old_covered = old_header
                .as_ref()
                .map(|header| header.covered[device.index].as_slice());
            let mut candidates = Candidates {
                sets: std::mem::take(&mut fresh.sets),
                ..Candidates::default()
            };
            report.blocks_read += self.read_sealed_since(
                device,
                old_covered,
                &mut covered[device.index],
                &mut candidates,
            );
            fresh.sets = std::mem::take(&mut candidates.sets);
            per_device.push(candidates);
        }
        let header = Header {
            sequence,
            sets: fresh.sets.names().to_vec(),
            covered: covered.clone(),
        };
        let temporary = path.with_extension("checkpoint-tmp");
        let written = self.stream_file(
            &temporary,
            &header,
            old_header.as_ref(),
            old_input.as_mut(),
            per_device,
            &mut report,
        );
        let written = written.and_then(|()| match old_input {
            Some(input) => input.finish().map_err(|why| format!("previous: {why}")),
            None => Ok(()),
        });
        if let Err(why) = written {
            let _ = std::fs::remove_file(&temporary);
            return Err(why);
        }
        std::fs::rename(&temporary, path).map_err(|error| {
            format!("cannot rename checkpoint into {}: {error}", path.display())
        })?;
        sync_parent(path);
        report.blocks_covered = covered
            .iter()
            .flatten()
            .filter(|incarnation| **incarnation != 0)
            .count() as u64;
        Ok(report)
    }

    /// Offers the records of the blocks sealed since the previous
    /// checkpoint (every sealed block without one). A block that changed
    /// while it was read is left uncovered. Returns how many were read.
    fn read_sealed_since(
        &self,
        device: &Device,
        old: Option<&[u64]>,
        covered: &mut [u64],
        candidates: &mut Candidates,
    ) -> u64 {
        let mut read = 0;
        let mut report = ColdStartReport::default();
        for block in 0..device.block_count {
            let incarnation = covered[block as usize];
            if incarnation == 0 || old.is_some_and(|old| old[block as usize] == incarnation) {
                continue;
            }
            read += 1;
            let cached = device.pwq.lock().blocks.get(&block).cloned();
            let data: Cow<'_, [u8]> = match &cached {
                Some(buffer) => Cow::Borrowed(buffer.as_slice()),
                None => match device.io.read_at(self.block_offset(block), self.wblock()) {
                    Ok(bytes) => Cow::Owned(bytes),
                    Err(_) => {
                        covered[block as usize] = 0;
                        continue;
                    }
                },
            };
            let same = matches!(format::BlockHeader::decode(&data), format::BlockHeaderState::Valid(header) if header.incarnation == incarnation && header.instance_id == self.instance_id);
            if same {
                self.scan_records(device, block, incarnation, &data, candidates, &mut report);
            }
            let map = device.blocks.lock();
            let still = matches!(
                map.state[block as usize],
                BlockState::Full | BlockState::Defrag
            ) && map.open_seq[block as usize] == incarnation;
            if !(same && still) {
                covered[block as usize] = 0;
            }
        }
        read
    }

    /// Writes the file: header, then per device the previous entries still
    /// covered (unless a newer copy was read) and the new ones, an end
    /// marker, and the CRC; synced.
    fn stream_file(
        &self,
        temporary: &Path,
        header: &Header,
        old_header: Option<&Header>,
        mut old_input: Option<&mut CrcReader<BufReader<std::fs::File>>>,
        per_device: Vec<Candidates>,
        report: &mut CheckpointReport,
    ) -> Result<(), String> {
        let io = |error: std::io::Error| {
            format!("cannot write checkpoint {}: {error}", temporary.display())
        };
        let file = std::fs::File::create(temporary).map_err(io)?;
        let mut out = CrcWriter {
            inner: BufWriter::with_capacity(1 << 20, file),
            crc: 0,
            bytes: 0,
        };
        self.write_header(&mut out, header).map_err(io)?;
        for (device, fresh) in per_device.into_iter().enumerate() {
            let old = old_header.zip(old_input.as_deref_mut());
            self.merge_device(device, header, old, fresh, &mut out, report)
                .map_err(|why| match why {
                    MergeError::Previous(why) => format!("previous: {why}"),
                    MergeError::Io(error) => io(error),
                })?;
            let mut end = [0u8; ENTRY_BYTES];
            end[54] = END_OF_DEVICE;
            out.put(&end).map_err(io)?;
        }
        report.bytes = out.bytes + 4;
        let writer = out.finish().map_err(io)?;
        let file = writer
            .into_inner()
            .map_err(|error| io(error.into_error()))?;
        file.sync_all().map_err(io)
    }

    /// One device's entries, in partition order: the previous checkpoint's
    /// (already in that order, checked) joined with the new ones (sorted);
    /// for a digest in both the higher sequence is kept (the new copy on a
    /// tie); previous entries whose block is no longer covered, and new
    /// ones from a block that changed while it was read, are left out.
    fn merge_device<W: Write>(
        &self,
        device: usize,
        header: &Header,
        old: Option<(&Header, &mut CrcReader<BufReader<std::fs::File>>)>,
        fresh: Candidates,
        out: &mut CrcWriter<W>,
        report: &mut CheckpointReport,
    ) -> Result<(), MergeError> {
        let covered = |candidate: &Candidate| {
            self.locate(candidate.address)
                .is_some_and(|(block, _)| header.covered[device][block as usize] != 0)
        };
        let mut fresh: Vec<(Digest, Candidate)> = fresh
            .map
            .into_iter()
            .filter(|(_, candidate)| covered(candidate))
            .collect();
        fresh.sort_unstable_by_key(|(digest, _)| order_key(digest));
        let mut fresh = fresh.into_iter().peekable();
        let mut put = |digest: &Digest, candidate: &Candidate| {
            report.entries += 1;
            out.put(&encode_entry(digest, candidate))
                .map_err(MergeError::Io)
        };
        if let Some((old_header, input)) = old {
            let mut last = None;
            while let Some((digest, candidate)) = self.next_previous(device, old_header, input)? {
                let key = order_key(&digest);
                if last.is_some_and(|last| last >= key) {
                    return Err(MergeError::Previous(
                        "entries not in partition order".into(),
                    ));
                }
                last = Some(key);
                while let Some((next, newer)) = fresh.next_if(|(next, _)| order_key(next) < key) {
                    put(&next, &newer)?;
                }
                let still = self.locate(candidate.address).is_some_and(|(block, _)| {
                    header.covered[device][block as usize]
                        == old_header.covered[device][block as usize]
                });
                match fresh.next_if(|(next, _)| *next == digest) {
                    Some((next, newer)) if !still || newer.sequence >= candidate.sequence => {
                        put(&next, &newer)?
                    }
                    _ if still => put(&digest, &candidate)?,
                    _ => {}
                }
            }
        }
        for (digest, candidate) in fresh {
            put(&digest, &candidate)?;
        }
        Ok(())
    }

    /// The previous checkpoint's next entry of `device` (`None` at its end
    /// marker), checked.
    fn next_previous(
        &self,
        device: usize,
        old_header: &Header,
        input: &mut CrcReader<BufReader<std::fs::File>>,
    ) -> Result<Option<(Digest, Candidate)>, MergeError> {
        let entry = input.array::<ENTRY_BYTES>().map_err(MergeError::Previous)?;
        let Some((digest, candidate)) = decode_entry(&entry).map_err(MergeError::Previous)? else {
            return Ok(None);
        };
        self.check_entry(device, old_header, &digest, &candidate)
            .map_err(MergeError::Previous)?;
        Ok(Some((digest, candidate)))
    }
}

/// Why merging with the previous checkpoint stopped.
enum MergeError {
    /// The previous file failed a check: rebuild without it.
    Previous(String),
    Io(std::io::Error),
}

/// The order of a checkpoint's entries: partition, then digest.
fn order_key(digest: &Digest) -> (u16, [u8; 20]) {
    (digest.partition().get(), digest.0)
}
