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
//! record whose header is damaged ends the walk of its block, one whose body
//! fails its checksum is skipped. Nothing on a device can make this panic.

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
    }
}

struct Candidate {
    sequence: u64,
    address: DeviceAddress,
    generation: u16,
    life: u16,
    void_time: u32,
    last_update_ms: u64,
    set: u16,
    tombstone: bool,
}

/// The caller's verdict function.
pub type Sink<'s> = dyn Fn(&Digest, &RecoveredRecord<'_>) -> Recovered + Sync + 's;

impl DeviceEngine {
    /// Rebuilds the engine's block map and tombstones from the devices and
    /// hands every newest live copy to `sink`. `progress` is called after
    /// each block (from the scanning threads).
    pub fn cold_start(
        &self,
        sink: &Sink<'_>,
        progress: &(dyn Fn(ScanProgress) + Sync),
    ) -> ColdStartReport {
        let reports: Vec<ColdStartReport> = std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .devices
                .iter()
                .map(|device| {
                    std::thread::Builder::new()
                        .name(format!("citrine-scan-{}", device.index))
                        .spawn_scoped(scope, move || self.scan_device(device, sink, progress))
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

    fn scan_device(
        &self,
        device: &Device,
        sink: &Sink<'_>,
        progress: &(dyn Fn(ScanProgress) + Sync),
    ) -> ColdStartReport {
        let wblock = self.wblock();
        let path = device.path.clone();
        let mut report = ColdStartReport::default();
        let mut candidates: HashMap<Digest, Candidate> = HashMap::new();
        let mut sets: Vec<Vec<u8>> = Vec::new();
        let mut set_ids: HashMap<Vec<u8>, u16> = HashMap::new();
        let mut states = vec![BlockState::Free; device.block_count as usize];
        let mut open_seq = vec![0u64; device.block_count as usize];
        let mut max_sequence = 0u64;
        let blocks_to_scan = if device.fresh { 0 } else { device.block_count };
        for block in 0..blocks_to_scan {
            let data = match device.io.read_at(self.block_offset(block), wblock) {
                Ok(data) => data,
                Err(error) => {
                    tracing::error!(device = %path, block, "cannot read write block: {error}; block skipped");
                    report.corrupt_blocks += 1;
                    continue;
                }
            };
            let header = match format::BlockHeader::decode(&data) {
                BlockHeaderState::Free => {
                    progress(ScanProgress {
                        device: device.index,
                        blocks_scanned: block + 1,
                        block_count: device.block_count,
                        records_read: report.records_read,
                    });
                    continue;
                }
                BlockHeaderState::Corrupt => {
                    tracing::warn!(device = %path, block, "write block header is torn or corrupt (checksum); block skipped");
                    report.corrupt_blocks += 1;
                    continue;
                }
                BlockHeaderState::Valid(header) => header,
            };
            if header.instance_id != self.instance_id || header.block_index != block {
                tracing::warn!(device = %path, block, "write block header belongs to another device or position; block skipped");
                report.corrupt_blocks += 1;
                continue;
            }
            states[block as usize] = BlockState::Full;
            open_seq[block as usize] = header.incarnation;
            max_sequence = max_sequence.max(header.incarnation);
            report.blocks_in_use += 1;
            let mut offset = BLOCK_HEADER_BYTES;
            while offset + format::RECORD_HEADER_BYTES <= wblock {
                match format::decode_record(&data[offset..], Some(header.incarnation)) {
                    Ok(record) => {
                        let rblocks = record.header.rblocks();
                        report.records_read += 1;
                        max_sequence = max_sequence.max(record.header.sequence);
                        let digest = record.header.digest;
                        let address = self.address(device.index, block, offset, rblocks);
                        match address {
                            Some(address) if self.device_of(&digest) == device.index => {
                                let newer = candidates.get(&digest).is_none_or(|existing| {
                                    record.header.sequence > existing.sequence
                                });
                                if newer {
                                    let set = match set_ids.get(record.set) {
                                        Some(id) => *id,
                                        None => {
                                            let id = sets.len() as u16;
                                            sets.push(record.set.to_vec());
                                            set_ids.insert(record.set.to_vec(), id);
                                            id
                                        }
                                    };
                                    candidates.insert(
                                        digest,
                                        Candidate {
                                            sequence: record.header.sequence,
                                            address,
                                            generation: record.header.generation,
                                            life: record.header.life,
                                            void_time: record.header.void_time,
                                            last_update_ms: record.header.last_update_ms,
                                            set,
                                            tombstone: record.header.is_tombstone(),
                                        },
                                    );
                                }
                            }
                            _ => {
                                report.corrupt_records += 1;
                                tracing::warn!(device = %path, block, offset, "record on the wrong device or outside it; skipped");
                            }
                        }
                        offset += rblocks * RBLOCK;
                    }
                    Err(RecordError::End) | Err(RecordError::Stale) => break,
                    Err(RecordError::BadBody { rblocks }) => {
                        report.corrupt_records += 1;
                        tracing::warn!(device = %path, block, offset, "record body fails its checksum (torn or corrupt write); record skipped");
                        offset += rblocks.max(1) * RBLOCK;
                    }
                    Err(RecordError::BadHeader(why)) => {
                        report.corrupt_records += 1;
                        let next = format::resync(&data, offset + RBLOCK, header.incarnation);
                        tracing::warn!(device = %path, block, offset, skipped_bytes = next - offset, "{why} (torn or corrupt write); skipped to the next valid record header");
                        offset = next;
                    }
                }
            }
            progress(ScanProgress {
                device: device.index,
                blocks_scanned: block + 1,
                block_count: device.block_count,
                records_read: report.records_read,
            });
        }
        self.stats
            .corrupt_records_skipped
            .fetch_add(report.corrupt_records, Ordering::Relaxed);
        self.sequence.fetch_max(max_sequence + 1, Ordering::Relaxed);

        // Resolve: tombstones stay, records go to the index.
        let mut live = vec![0u32; device.block_count as usize];
        let mut tombs = HashMap::new();
        let mut used = 0u64;
        let empty: &[u8] = &[];
        for (digest, candidate) in candidates {
            let keep_as_tomb = if candidate.tombstone {
                report.tombstones += 1;
                true
            } else {
                let set_name = sets
                    .get(usize::from(candidate.set))
                    .map_or(empty, Vec::as_slice);
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
                        if let Some((block, _)) = self.locate(candidate.address) {
                            live[block as usize] += candidate.address.bytes() as u32;
                            used += candidate.address.bytes();
                        }
                        false
                    }
                    Recovered::Expired => {
                        report.expired += 1;
                        true
                    }
                    Recovered::Truncated => {
                        report.truncated += 1;
                        false
                    }
                }
            };
            if keep_as_tomb {
                if let Some((block, _)) = self.locate(candidate.address) {
                    live[block as usize] += candidate.address.bytes() as u32;
                    used += candidate.address.bytes();
                }
                tombs.insert(
                    digest,
                    Tomb {
                        address: candidate.address,
                        sequence: candidate.sequence,
                    },
                );
            }
        }
        self.install(device, states, live, open_seq, tombs);
        self.used_bytes.fetch_add(used, Ordering::Relaxed);
        report
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
