//! Cold start: rebuild the index by reading every write block of every
//! device, one scoped thread per device.
//!
//! For each digest the copy with the highest sequence number wins (sequence
//! numbers are handed out under the record's partition lock, so they order
//! the writes of one record exactly as generation and last-update time do,
//! and they also order a delete against a later re-create). The winner is
//! then: a tombstone (kept as a tombstone; the record stays deleted), or a
//! record offered to the caller's sink, which answers whether it is live,
//! expired (kept as its own tombstone so no older copy returns) or
//! truncated.
//!
//! A block whose header is torn or corrupt is skipped with a log line; a
//! record whose header is damaged skips to the next valid header of its
//! block, one whose body fails its checksum is skipped. Nothing on a device
//! can make this panic.
//!
//! The steps (block read and header check, record walk, candidate offer,
//! resolution, install) are shared with the restart from an index
//! checkpoint ([`super::checkpoint`]), which replays only the blocks
//! written after its checkpoint with exactly these rules.

use super::format::{self, BlockHeaderState, RecordError, BLOCK_HEADER_BYTES, RBLOCK};
use super::io::BlockIo;
use super::{BlockState, Device, DeviceEngine, Tomb};
use crate::DeviceAddress;
use citrine_types::Digest;
use std::collections::HashMap;
use std::sync::atomic::Ordering;

/// A record found by a restart, offered to the index.
#[derive(Debug, Clone, Copy)]
pub struct RecoveredRecord<'a> {
    pub generation: u16,
    pub life: u16,
    pub void_time: u32,
    pub last_update_ms: u64,
    pub set_name: &'a [u8],
    pub address: DeviceAddress,
}

/// The index's verdict on a recovered record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovered {
    /// Inserted into the index.
    Live,
    /// Past its void time: not inserted; kept as a tombstone.
    Expired,
    /// Truncated: not inserted; its bytes are dead.
    Truncated,
}

/// Progress of one device's scan, reported after every block.
#[derive(Debug, Clone, Copy)]
pub struct ScanProgress {
    pub device: usize,
    pub blocks_scanned: u32,
    pub block_count: u32,
    pub records_read: u64,
}

/// What a restart found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ColdStartReport {
    pub records_read: u64,
    pub live: u64,
    pub tombstones: u64,
    pub expired: u64,
    pub truncated: u64,
    pub corrupt_records: u64,
    pub corrupt_blocks: u64,
    pub blocks_in_use: u64,
    /// Restart from a checkpoint: blocks read whole (written after it).
    pub blocks_replayed: u64,
    /// Restart from a checkpoint: the checkpoint's entries.
    pub checkpoint_entries: u64,
}

impl ColdStartReport {
    fn add(&mut self, other: &ColdStartReport) {
        self.records_read += other.records_read;
        self.live += other.live;
        self.tombstones += other.tombstones;
        self.expired += other.expired;
        self.truncated += other.truncated;
        self.corrupt_records += other.corrupt_records;
        self.corrupt_blocks += other.corrupt_blocks;
        self.blocks_in_use += other.blocks_in_use;
        self.blocks_replayed += other.blocks_replayed;
        self.checkpoint_entries += other.checkpoint_entries;
    }
}

/// The newest copy of a digest found so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Candidate {
    pub sequence: u64,
    pub address: DeviceAddress,
    pub generation: u16,
    pub life: u16,
    pub void_time: u32,
    pub last_update_ms: u64,
    /// Id in the scan's [`SetTable`].
    pub set: u16,
    pub tombstone: bool,
}

/// Set names met by a scan, numbered from 0 in order of first sight.
#[derive(Default)]
pub(super) struct SetTable {
    names: Vec<Vec<u8>>,
    ids: HashMap<Vec<u8>, u16>,
}

impl SetTable {
    /// A table holding `names` with their positions as ids.
    pub fn from_names(names: Vec<Vec<u8>>) -> SetTable {
        let ids = names
            .iter()
            .enumerate()
            .map(|(id, name)| (name.clone(), id as u16))
            .collect();
        SetTable { names, ids }
    }

    /// The id of `name`, added if new.
    pub fn id(&mut self, name: &[u8]) -> u16 {
        if let Some(id) = self.ids.get(name) {
            return *id;
        }
        let id = self.names.len() as u16;
        self.names.push(name.to_vec());
        self.ids.insert(name.to_vec(), id);
        id
    }

    /// The name of `id` (empty for an unknown id).
    pub fn name(&self, id: u16) -> &[u8] {
        self.names.get(usize::from(id)).map_or(&[], Vec::as_slice)
    }

    pub fn names(&self) -> &[Vec<u8>] {
        &self.names
    }
}

/// The newest copy of each digest among the records scanned, and the
/// highest sequence number met (records and block incarnations).
#[derive(Default)]
pub(super) struct Candidates {
    pub map: HashMap<Digest, Candidate>,
    pub sets: SetTable,
    pub max_sequence: u64,
}

impl Candidates {
    /// Keeps `candidate` if it is newer than the copy held (the first one
    /// met wins a tie).
    pub fn offer(&mut self, digest: Digest, candidate: Candidate) {
        let newer = self
            .map
            .get(&digest)
            .is_none_or(|existing| candidate.sequence > existing.sequence);
        if newer {
            self.map.insert(digest, candidate);
        }
    }
}

/// What a scan of one device learnt about its blocks.
pub(super) struct BlockScan {
    pub states: Vec<BlockState>,
    pub open_seq: Vec<u64>,
}

impl BlockScan {
    pub fn new(block_count: u32) -> BlockScan {
        BlockScan {
            states: vec![BlockState::Free; block_count as usize],
            open_seq: vec![0; block_count as usize],
        }
    }

    /// Marks a block in use (sealed) with its incarnation.
    pub fn in_use(&mut self, block: u32, incarnation: u64) {
        self.states[block as usize] = BlockState::Full;
        self.open_seq[block as usize] = incarnation;
    }
}

/// Turns the winning copies into the block map's live bytes, the
/// tombstone table and the index (through the sink).
pub(super) struct Resolver<'e> {
    engine: &'e DeviceEngine,
    pub live: Vec<u32>,
    pub tombs: HashMap<Digest, Tomb>,
    pub used: u64,
}

/// The caller's verdict function.
pub type Sink<'s> = dyn Fn(&Digest, &RecoveredRecord<'_>) -> Recovered + Sync + 's;

impl<'e> Resolver<'e> {
    pub fn new(engine: &'e DeviceEngine, device: &Device) -> Resolver<'e> {
        Resolver {
            engine,
            live: vec![0; device.block_count as usize],
            tombs: HashMap::new(),
            used: 0,
        }
    }

    /// Resolves the winning copy of `digest`: a tombstone stays one, a
    /// record goes to the sink, which decides live, expired (kept as a
    /// tombstone so no older copy returns) or truncated (dead).
    pub fn resolve(
        &mut self,
        digest: Digest,
        candidate: &Candidate,
        set_name: &[u8],
        sink: &Sink<'_>,
        report: &mut ColdStartReport,
    ) {
        if candidate.tombstone {
            report.tombstones += 1;
            self.keep_tomb(digest, candidate);
            return;
        }
        let record = RecoveredRecord {
            generation: candidate.generation,
            life: candidate.life,
            void_time: candidate.void_time,
            last_update_ms: candidate.last_update_ms,
            set_name,
            address: candidate.address,
        };
        match sink(&digest, &record) {
            Recovered::Live => {
                report.live += 1;
                self.count_live(candidate.address);
            }
            Recovered::Expired => {
                report.expired += 1;
                self.keep_tomb(digest, candidate);
            }
            Recovered::Truncated => report.truncated += 1,
        }
    }

    fn keep_tomb(&mut self, digest: Digest, candidate: &Candidate) {
        self.count_live(candidate.address);
        self.tombs.insert(
            digest,
            Tomb {
                address: candidate.address,
                sequence: candidate.sequence,
            },
        );
    }

    fn count_live(&mut self, address: DeviceAddress) {
        if let Some((block, _)) = self.engine.locate(address) {
            self.live[block as usize] += address.bytes() as u32;
            self.used += address.bytes();
        }
    }
}

impl DeviceEngine {
    /// Rebuilds the engine's block map and tombstones from the devices and
    /// hands every newest live copy to `sink`. `progress` is called after
    /// each block (from the scanning threads).
    pub fn cold_start(
        &self,
        sink: &Sink<'_>,
        progress: &(dyn Fn(ScanProgress) + Sync),
    ) -> ColdStartReport {
        self.per_device(|device| self.scan_device(device, sink, progress))
    }

    /// Runs `work` on every device, one scoped thread each, and adds up
    /// their reports.
    pub(super) fn per_device(
        &self,
        work: impl Fn(&Device) -> ColdStartReport + Sync,
    ) -> ColdStartReport {
        let work = &work;
        let reports: Vec<ColdStartReport> = std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .devices
                .iter()
                .map(|device| {
                    std::thread::Builder::new()
                        .name(format!("citrine-scan-{}", device.index))
                        .spawn_scoped(scope, move || work(device))
                })
                .collect();
            handles
                .into_iter()
                .map(|handle| match handle {
                    Ok(handle) => handle.join().unwrap_or_else(|_| {
                        tracing::error!("a device scan thread panicked");
                        ColdStartReport::default()
                    }),
                    Err(error) => {
                        tracing::error!("cannot start a device scan thread: {error}");
                        ColdStartReport::default()
                    }
                })
                .collect()
        });
        let mut total = ColdStartReport::default();
        for report in &reports {
            total.add(report);
        }
        total
    }

    /// The cold scan of one device: every block read, every record offered
    /// as a candidate, then the winners resolved and installed.
    fn scan_device(
        &self,
        device: &Device,
        sink: &Sink<'_>,
        progress: &(dyn Fn(ScanProgress) + Sync),
    ) -> ColdStartReport {
        let mut report = ColdStartReport::default();
        let mut candidates = Candidates::default();
        let mut blocks = BlockScan::new(device.block_count);
        let blocks_to_scan = if device.fresh { 0 } else { device.block_count };
        for block in 0..blocks_to_scan {
            self.scan_block(device, block, &mut blocks, &mut candidates, &mut report);
            progress(ScanProgress {
                device: device.index,
                blocks_scanned: block + 1,
                block_count: device.block_count,
                records_read: report.records_read,
            });
        }
        let mut resolver = Resolver::new(self, device);
        for (digest, candidate) in &candidates.map {
            let set_name = candidates.sets.name(candidate.set);
            resolver.resolve(*digest, candidate, set_name, sink, &mut report);
        }
        self.finish_restart(device, blocks, resolver, candidates.max_sequence, &report);
        report
    }

    /// Reads one whole block at start; a block that cannot be read is
    /// logged, counted corrupt and skipped (`None`).
    pub(super) fn read_whole_block(
        &self,
        device: &Device,
        block: u32,
        report: &mut ColdStartReport,
    ) -> Option<Vec<u8>> {
        match device.io.read_at(self.block_offset(block), self.wblock()) {
            Ok(data) => Some(data),
            Err(error) => {
                tracing::error!(device = %device.path, block, "cannot read write block: {error}; block skipped");
                report.corrupt_blocks += 1;
                None
            }
        }
    }

    /// Reads one whole block and, if its header says it is in use, offers
    /// its records.
    pub(super) fn scan_block(
        &self,
        device: &Device,
        block: u32,
        blocks: &mut BlockScan,
        candidates: &mut Candidates,
        report: &mut ColdStartReport,
    ) {
        let Some(data) = self.read_whole_block(device, block, report) else {
            return;
        };
        if let Some(header) = self.block_in_use(device, block, &data, report) {
            blocks.in_use(block, header.incarnation);
            report.blocks_in_use += 1;
            self.scan_records(device, block, header.incarnation, &data, candidates, report);
        }
    }

    /// The header of a block in use, or `None` for a free block and (with
    /// a log line) a torn, corrupt or foreign one.
    pub(super) fn block_in_use(
        &self,
        device: &Device,
        block: u32,
        data: &[u8],
        report: &mut ColdStartReport,
    ) -> Option<format::BlockHeader> {
        let header = match format::BlockHeader::decode(data) {
            BlockHeaderState::Free => return None,
            BlockHeaderState::Corrupt => {
                tracing::warn!(device = %device.path, block, "write block header is torn or corrupt (checksum); block skipped");
                report.corrupt_blocks += 1;
                return None;
            }
            BlockHeaderState::Valid(header) => header,
        };
        if header.instance_id != self.instance_id || header.block_index != block {
            tracing::warn!(device = %device.path, block, "write block header belongs to another device or position; block skipped");
            report.corrupt_blocks += 1;
            return None;
        }
        Some(header)
    }

    /// Walks the records of a block of `incarnation`, offering each intact
    /// one: a damaged header skips to the next valid one, a damaged body
    /// skips the record, a stale or empty slot ends the block.
    pub(super) fn scan_records(
        &self,
        device: &Device,
        block: u32,
        incarnation: u64,
        data: &[u8],
        candidates: &mut Candidates,
        report: &mut ColdStartReport,
    ) {
        candidates.max_sequence = candidates.max_sequence.max(incarnation);
        let wblock = self.wblock().min(data.len());
        let mut offset = BLOCK_HEADER_BYTES;
        while offset + format::RECORD_HEADER_BYTES <= wblock {
            match format::decode_record(&data[offset..wblock], Some(incarnation)) {
                Ok(record) => {
                    let rblocks = record.header.rblocks();
                    report.records_read += 1;
                    self.offer_record(device, block, offset, &record, candidates, report);
                    offset += rblocks * RBLOCK;
                }
                Err(RecordError::End) | Err(RecordError::Stale) => break,
                Err(RecordError::BadBody { rblocks }) => {
                    report.corrupt_records += 1;
                    tracing::warn!(device = %device.path, block, offset, "record body fails its checksum (torn or corrupt write); record skipped");
                    offset += rblocks.max(1) * RBLOCK;
                }
                Err(RecordError::BadHeader(why)) => {
                    report.corrupt_records += 1;
                    let next = format::resync(&data[..wblock], offset + RBLOCK, incarnation);
                    tracing::warn!(device = %device.path, block, offset, skipped_bytes = next - offset, "{why} (torn or corrupt write); skipped to the next valid record header");
                    offset = next;
                }
            }
        }
    }

    /// Offers one intact record as its digest's candidate, unless it lies
    /// on the wrong device or outside it.
    fn offer_record(
        &self,
        device: &Device,
        block: u32,
        offset: usize,
        record: &format::DecodedRecord<'_>,
        candidates: &mut Candidates,
        report: &mut ColdStartReport,
    ) {
        let header = &record.header;
        candidates.max_sequence = candidates.max_sequence.max(header.sequence);
        let address = self.address(device.index, block, offset, header.rblocks());
        match address {
            Some(address) if self.device_of(&header.digest) == device.index => {
                let set = candidates.sets.id(record.set);
                candidates.offer(
                    header.digest,
                    Candidate {
                        sequence: header.sequence,
                        address,
                        generation: header.generation,
                        life: header.life,
                        void_time: header.void_time,
                        last_update_ms: header.last_update_ms,
                        set,
                        tombstone: header.is_tombstone(),
                    },
                );
            }
            _ => {
                report.corrupt_records += 1;
                tracing::warn!(device = %device.path, block, offset, "record on the wrong device or outside it; skipped");
            }
        }
    }

    /// The last step of every restart that read the devices: counts,
    /// sequence, block map, tombstones and used bytes installed.
    pub(super) fn finish_restart(
        &self,
        device: &Device,
        blocks: BlockScan,
        resolver: Resolver<'_>,
        max_sequence: u64,
        report: &ColdStartReport,
    ) {
        self.stats
            .corrupt_records_skipped
            .fetch_add(report.corrupt_records, Ordering::Relaxed);
        self.sequence.fetch_max(max_sequence + 1, Ordering::Relaxed);
        self.install(
            device,
            blocks.states,
            resolver.live,
            blocks.open_seq,
            resolver.tombs,
        );
        self.used_bytes.fetch_add(resolver.used, Ordering::Relaxed);
    }

    /// Installs a rebuilt block map and tombstone table for a device.
    pub(super) fn install(
        &self,
        device: &Device,
        states: Vec<BlockState>,
        live: Vec<u32>,
        open_seq: Vec<u64>,
        tombs: HashMap<Digest, Tomb>,
    ) {
        let mut map = device.blocks.lock();
        map.free.clear();
        map.defrag_queue.clear();
        map.pending_free.clear();
        map.live = live;
        map.open_seq = open_seq;
        map.state = states;
        let mut free = 0u32;
        for block in 0..device.block_count {
            if map.state[block as usize] == BlockState::Free {
                assert_eq!(map.live[block as usize], 0, "free block {block} holds data");
                map.free.push_back(block);
                free += 1;
            } else {
                self.queue_if_sparse(&mut map, block);
            }
        }
        device.free_blocks.store(free, Ordering::Relaxed);
        drop(map);
        *device.tombs.lock() = tombs;
    }
}
