//! Fast restart: the index image written at a clean shutdown and read back
//! instead of scanning the devices.
//!
//! The image is one file (format in `docs/storage.md`): a header tying it to
//! the device set (instance id, geometry, sequence), the set names, the
//! block map, every index entry, every tombstone, and a CRC-32C over all of
//! it. It is written to a temporary name, synced and renamed into place
//! after every buffer was sealed and synced. At startup it is read and
//! **deleted before anything else happens** (the deletion is synced): the
//! file's existence is the clean-shutdown marker, so a node that crashes
//! after starting can never reuse a stale image and falls back to the cold
//! start. Before the image is trusted it is checked: checksum, geometry,
//! every address inside its device and in a block in use, live bytes per
//! block recomputed from the entries and equal to the saved map, and the
//! on-device header of every block in use carrying the saved incarnation.

use super::format::{self, BlockHeaderState, RBLOCK};
use super::io::BlockIo;
use super::{BlockState, DeviceEngine, Recovered, RecoveredRecord, Tomb};
use crate::DeviceAddress;
use citrine_types::Digest;
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::Ordering;

const INDEX_MAGIC: &[u8; 8] = b"CITRIDX\0";
/// 2: entries carry the record's life (version 1 images are refused, so
/// the start falls back to a cold scan).
const INDEX_VERSION: u32 = 2;

/// One index entry as saved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SavedEntry {
    pub digest: Digest,
    pub generation: u16,
    pub life: u16,
    pub void_time: u32,
    pub last_update_ms: u64,
    /// Index into the set-name table passed to `save_index`.
    pub set: u16,
    pub address: DeviceAddress,
}

/// The fixed-width fields the index image and the index checkpoint both
/// start with (read from a slice or a checksummed stream).
pub(super) trait HeaderFields {
    fn u32(&mut self) -> Result<u32, String>;
    fn u64(&mut self) -> Result<u64, String>;
}

impl DeviceEngine {
    /// Reads and checks the identity part shared by the index image and
    /// the checkpoint headers — the device set's instance id, then the
    /// sequence, then the geometry (write-block size, device count, each
    /// device's block count) — and returns the sequence. `what` names the
    /// file in the errors.
    pub(super) fn read_identity(
        &self,
        fields: &mut impl HeaderFields,
        what: &str,
    ) -> Result<u64, String> {
        if fields.u64()? != self.instance_id {
            return Err(format!("{what} belongs to another device set"));
        }
        let sequence = fields.u64()?;
        if fields.u32()? != self.config.write_block_size
            || fields.u32()? as usize != self.devices.len()
        {
            return Err(format!("{what} geometry differs from the configuration"));
        }
        for device in &self.devices {
            if fields.u32()? != device.block_count {
                return Err(format!("{what} block count differs"));
            }
        }
        Ok(sequence)
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl HeaderFields for Reader<'_> {
    fn u32(&mut self) -> Result<u32, String> {
        let bytes = self.take(4)?;
        Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }
    fn u64(&mut self) -> Result<u64, String> {
        let mut word = [0u8; 8];
        word.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(word))
    }
}

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(count)
            .filter(|end| *end <= self.bytes.len())
            .ok_or("index image truncated")?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        let bytes = self.take(2)?;
        Ok(u16::from_le_bytes([bytes[0], bytes[1]]))
    }
    fn digest(&mut self) -> Result<Digest, String> {
        let mut digest = [0u8; 20];
        digest.copy_from_slice(self.take(20)?);
        Ok(Digest(digest))
    }
}

/// Syncs the directory holding `path`, so a rename into it is durable
/// (best effort: a directory that cannot be opened is left as is).
pub(super) fn sync_parent(path: &Path) {
    if let Some(parent) = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        if let Ok(directory) = std::fs::File::open(parent) {
            let _ = directory.sync_all();
        }
    }
}

impl DeviceEngine {
    /// Seals and syncs everything, then writes the index image to `path`.
    /// Call only when no transaction runs any more.
    pub fn save_index(
        &self,
        path: &Path,
        sets: &[Vec<u8>],
        entries: &[SavedEntry],
    ) -> Result<(), String> {
        self.flush_all().map_err(|error| error.to_string())?;
        let mut out: Vec<u8> = Vec::with_capacity(64 + entries.len() * 46);
        out.extend_from_slice(INDEX_MAGIC);
        out.extend_from_slice(&INDEX_VERSION.to_le_bytes());
        out.extend_from_slice(&self.instance_id.to_le_bytes());
        out.extend_from_slice(&self.sequence.load(Ordering::Relaxed).to_le_bytes());
        out.extend_from_slice(&self.config.write_block_size.to_le_bytes());
        out.extend_from_slice(&(self.devices.len() as u32).to_le_bytes());
        for device in &self.devices {
            out.extend_from_slice(&device.block_count.to_le_bytes());
        }
        out.extend_from_slice(&(sets.len() as u32).to_le_bytes());
        for name in sets {
            let length = name.len().min(format::SET_NAME_MAX);
            out.push(length as u8);
            out.extend_from_slice(&name[..length]);
        }
        for device in &self.devices {
            let map = device.blocks.lock();
            for block in 0..device.block_count as usize {
                let state = match map.state[block] {
                    BlockState::Free => 0u8,
                    BlockState::Full | BlockState::Defrag => 1,
                    BlockState::Open | BlockState::PendingFree => {
                        return Err(format!("block {block} still open or pending at shutdown"))
                    }
                };
                out.push(state);
                out.extend_from_slice(&map.live[block].to_le_bytes());
                out.extend_from_slice(&map.open_seq[block].to_le_bytes());
            }
        }
        out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        for entry in entries {
            out.extend_from_slice(&entry.digest.0);
            out.extend_from_slice(&entry.generation.to_le_bytes());
            out.extend_from_slice(&entry.life.to_le_bytes());
            out.extend_from_slice(&entry.void_time.to_le_bytes());
            out.extend_from_slice(&entry.last_update_ms.to_le_bytes());
            out.extend_from_slice(&entry.set.to_le_bytes());
            out.extend_from_slice(&entry.address.0.to_le_bytes());
        }
        let tombs: Vec<(Digest, Tomb)> = self
            .devices
            .iter()
            .flat_map(|device| {
                device
                    .tombs
                    .lock()
                    .iter()
                    .map(|(digest, tomb)| (*digest, *tomb))
                    .collect::<Vec<_>>()
            })
            .collect();
        out.extend_from_slice(&(tombs.len() as u64).to_le_bytes());
        for (digest, tomb) in &tombs {
            out.extend_from_slice(&digest.0);
            out.extend_from_slice(&tomb.address.0.to_le_bytes());
            out.extend_from_slice(&tomb.sequence.to_le_bytes());
        }
        let crc = format::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        let temporary = path.with_extension("tmp");
        let write = || -> std::io::Result<()> {
            let mut file = std::fs::File::create(&temporary)?;
            file.write_all(&out)?;
            file.sync_all()?;
            std::fs::rename(&temporary, path)?;
            sync_parent(path);
            Ok(())
        };
        write().map_err(|error| format!("cannot write index image {}: {error}", path.display()))
    }

    /// Reattaches the index from the image at `path`, if a clean shutdown
    /// left one that passes every check. The image is deleted first in all
    /// cases. `Ok(None)`: no image (cold start needed). `Err`: an image that
    /// failed a check (cold start needed; the reason is for the log).
    /// Nothing is handed to `sink` unless every check passed.
    pub fn fast_restart(
        &self,
        path: &Path,
        sink: &mut dyn FnMut(&Digest, &RecoveredRecord<'_>) -> Recovered,
    ) -> Result<Option<super::ColdStartReport>, String> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => {
                return Err(format!(
                    "cannot read index image {}: {error}",
                    path.display()
                ))
            }
        };
        std::fs::remove_file(path).map_err(|error| {
            format!(
                "cannot remove index image {} (needed to mark the start): {error}",
                path.display()
            )
        })?;
        sync_parent(path);
        let image = self.parse_image(&bytes)?;
        self.check_image(&image)?;
        // Every check passed: install.
        self.sequence.fetch_max(image.sequence, Ordering::Relaxed);
        let mut tombs_by_device: Vec<HashMap<Digest, Tomb>> =
            (0..self.devices.len()).map(|_| HashMap::new()).collect();
        for (digest, tomb) in &image.tombs {
            tombs_by_device[tomb.address.device()].insert(*digest, *tomb);
        }
        let mut report = super::ColdStartReport {
            tombstones: image.tombs.len() as u64,
            ..super::ColdStartReport::default()
        };
        let mut used = image
            .tombs
            .iter()
            .map(|(_, tomb)| tomb.address.bytes())
            .sum::<u64>();
        let mut live = image.live.clone();
        let empty: &[u8] = &[];
        let now_sequence = self.sequence.load(Ordering::Relaxed);
        for entry in &image.entries {
            let set_name = image
                .sets
                .get(usize::from(entry.set))
                .map_or(empty, Vec::as_slice);
            let record = RecoveredRecord {
                generation: entry.generation,
                life: entry.life,
                void_time: entry.void_time,
                last_update_ms: entry.last_update_ms,
                set_name,
                address: entry.address,
            };
            report.records_read += 1;
            match sink(&entry.digest, &record) {
                Recovered::Live => {
                    report.live += 1;
                    used += entry.address.bytes();
                }
                Recovered::Expired => {
                    report.expired += 1;
                    used += entry.address.bytes();
                    tombs_by_device[entry.address.device()].insert(
                        entry.digest,
                        Tomb {
                            address: entry.address,
                            sequence: now_sequence,
                        },
                    );
                }
                Recovered::Truncated => {
                    report.truncated += 1;
                    if let Some((block, _)) = self.locate(entry.address) {
                        let live_bytes = &mut live[entry.address.device()][block as usize];
                        *live_bytes = live_bytes.saturating_sub(entry.address.bytes() as u32);
                    }
                }
            }
        }
        for (((device, states), live), (open_seq, tombs)) in self
            .devices
            .iter()
            .zip(image.states)
            .zip(live)
            .zip(image.open_seq.into_iter().zip(tombs_by_device))
        {
            report.blocks_in_use += states
                .iter()
                .filter(|state| **state != BlockState::Free)
                .count() as u64;
            self.install(device, states, live, open_seq, tombs);
        }
        self.used_bytes.fetch_add(used, Ordering::Relaxed);
        Ok(Some(report))
    }

    fn parse_image(&self, bytes: &[u8]) -> Result<Image, String> {
        if bytes.len() < 12 || &bytes[..8] != INDEX_MAGIC {
            return Err("not an index image".into());
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]) != format::crc32c(body) {
            return Err("index image checksum mismatch".into());
        }
        let mut reader = Reader { bytes: body, at: 8 };
        if reader.u32()? != INDEX_VERSION {
            return Err("index image version differs".into());
        }
        let sequence = self.read_identity(&mut reader, "index image")?;
        let set_count = reader.u32()? as usize;
        let mut sets = Vec::with_capacity(set_count.min(1024));
        for _ in 0..set_count {
            let length = usize::from(reader.u8()?);
            sets.push(reader.take(length)?.to_vec());
        }
        let mut states = Vec::new();
        let mut live = Vec::new();
        let mut open_seq = Vec::new();
        for device in &self.devices {
            let count = device.block_count as usize;
            let (mut device_states, mut device_live, mut device_seq) = (
                Vec::with_capacity(count),
                Vec::with_capacity(count),
                Vec::with_capacity(count),
            );
            for _ in 0..count {
                device_states.push(match reader.u8()? {
                    0 => BlockState::Free,
                    1 => BlockState::Full,
                    other => return Err(format!("bad block state {other}")),
                });
                device_live.push(reader.u32()?);
                device_seq.push(reader.u64()?);
            }
            states.push(device_states);
            live.push(device_live);
            open_seq.push(device_seq);
        }
        let entry_count = reader.u64()? as usize;
        if entry_count > body.len() / 46 {
            return Err("index image entry count impossible".into());
        }
        let mut entries = Vec::with_capacity(entry_count);
        for _ in 0..entry_count {
            entries.push(SavedEntry {
                digest: reader.digest()?,
                generation: reader.u16()?,
                life: reader.u16()?,
                void_time: reader.u32()?,
                last_update_ms: reader.u64()?,
                set: reader.u16()?,
                address: saved_address(reader.u64()?)?,
            });
        }
        let tomb_count = reader.u64()? as usize;
        if tomb_count > body.len() / 36 {
            return Err("index image tombstone count impossible".into());
        }
        let mut tombs = Vec::with_capacity(tomb_count);
        for _ in 0..tomb_count {
            let digest = reader.digest()?;
            tombs.push((
                digest,
                Tomb {
                    address: saved_address(reader.u64()?)?,
                    sequence: reader.u64()?,
                },
            ));
        }
        if reader.at != body.len() {
            return Err("index image has trailing bytes".into());
        }
        Ok(Image {
            sequence,
            sets,
            states,
            live,
            open_seq,
            entries,
            tombs,
        })
    }

    fn check_image(&self, image: &Image) -> Result<(), String> {
        let mut live: Vec<Vec<u32>> = self
            .devices
            .iter()
            .map(|device| vec![0u32; device.block_count as usize])
            .collect();
        let addresses = image
            .entries
            .iter()
            .map(|entry| (&entry.digest, entry.address))
            .chain(
                image
                    .tombs
                    .iter()
                    .map(|(digest, tomb)| (digest, tomb.address)),
            );
        for (digest, address) in addresses {
            let (block, _) = self
                .locate(address)
                .ok_or_else(|| format!("address {:#x} outside the devices", address.0))?;
            if self.device_of(digest) != address.device() {
                return Err("an entry is on the wrong device".into());
            }
            if image.states[address.device()][block as usize] == BlockState::Free {
                return Err(format!("an entry points into free block {block}"));
            }
            let bytes = &mut live[address.device()][block as usize];
            *bytes = bytes
                .checked_add(address.bytes() as u32)
                .ok_or("live bytes overflow")?;
        }
        if live != image.live {
            return Err("live bytes per block do not match the entries".into());
        }
        for (device, (states, open_seq)) in self
            .devices
            .iter()
            .zip(image.states.iter().zip(&image.open_seq))
        {
            for block in 0..device.block_count {
                let expected = match states[block as usize] {
                    BlockState::Free => continue,
                    _ => open_seq[block as usize],
                };
                let header = device
                    .io
                    .read_at(self.block_offset(block), RBLOCK)
                    .map_err(|error| format!("cannot read block header: {error}"))?;
                match format::BlockHeader::decode(&header) {
                    BlockHeaderState::Valid(header)
                        if header.incarnation == expected
                            && header.instance_id == self.instance_id => {}
                    _ => {
                        return Err(format!(
                            "device {} block {block} does not carry the saved incarnation",
                            device.path
                        ))
                    }
                }
            }
        }
        Ok(())
    }
}

struct Image {
    sequence: u64,
    sets: Vec<Vec<u8>>,
    states: Vec<Vec<BlockState>>,
    live: Vec<Vec<u32>>,
    open_seq: Vec<Vec<u64>>,
    entries: Vec<SavedEntry>,
    tombs: Vec<(Digest, Tomb)>,
}

/// A device address read from an index image, refused when out of range
/// (a corrupt image must not reach the index: see `DeviceAddress::from_bits`).
fn saved_address(bits: u64) -> Result<DeviceAddress, String> {
    DeviceAddress::from_bits(bits)
        .ok_or_else(|| format!("index image address {bits:#x} impossible"))
}
