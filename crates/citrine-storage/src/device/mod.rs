//! The device engine: records in log-structured write blocks on one or more
//! files or raw block devices (papers: 001 §5, 002).
//!
//! Layout (byte by byte in `docs/storage.md`, code in [`format`]): each
//! device starts with a 1 MiB reserved area (device header, metadata slots)
//! followed by write blocks of `write-block-size` bytes. A record lives in
//! exactly one device, chosen by its digest, and is addressed by its first
//! 128-byte read block and its length ([`DeviceAddress`]).
//!
//! Writes are copy-on-write: a record is appended to the device's client
//! write buffer (one write block in memory); the buffer is written out when
//! full, when the server's flusher ticks (every `flush-max-ms`), or at once
//! with `commit-to-device`. Sealed buffers stay in memory in the post-write
//! queue so recent records are read without I/O. Defragmentation moves the
//! live records of blocks whose live bytes fall below `defrag-lwm-pct` into
//! a separate defrag write buffer (never mixed with client writes) and
//! frees the block.
//!
//! Every byte the engine reads from or writes to a device goes through
//! [`io::BlockIo`] ([`io`]): files and raw devices in production, the
//! faulty [`io::SimDisk`] in tests and the simulator ([`DeviceConfig::media`]).
//!
//! The failed state. When a write or a sync of any device of the namespace
//! fails, the engine cannot know what its devices hold since its last
//! successful sync: after a failed `fdatasync` a kernel may have dropped the
//! dirty pages and report the next sync as a success, so carrying on (the
//! flusher retrying, defrag freeing a block whose moved records were in the
//! lost writes) would acknowledge durability that is not there. So the
//! first failure puts the engine in a sticky failed state, with one
//! error-level log line: every later write and tombstone is refused with
//! [`StorageError::DeviceFailed`], nothing is written to or synced on any
//! of its devices again (no flush, no defrag, no free marker, no metadata),
//! and reads are still served from the buffers, the post-write queue and
//! the devices. `device_failed` (and `device_writes_refused`) in the
//! namespace statistics show it. Only a restart clears it: the devices are
//! then read back as they are (a cold start, since the shutdown could not
//! save an index image). The reference has no such state — it stops the
//! process on a failed device write (`cf_crash` "DEVICE FAILED write") —
//! so there is no reference result code to copy; the service answers 1
//! (`AS_ERR_UNKNOWN`, the clients' SERVER_ERROR): a failure of the server,
//! never in doubt (the write was refused before anything was applied) and
//! never retried by the clients against a device that will not recover;
//! not 8 (the namespace is not full) nor 18 (device overload, which the
//! clients retry as transient). A node keeps serving reads and the
//! replicas of its partitions keep their copies, so nothing is lost and an
//! operator restarts it when the device is fixed. A write that discovered
//! the failure (its own `commit-to-device` sync failed) is refused too,
//! but its bytes may already be on the device.
//!
//! Invariants:
//! - once the engine failed, no device write or sync is issued again;
//! - `live[b]` of a block equals the bytes of the records in it that the
//!   index or the tombstone table points at (asserted at fast restart);
//! - a block's bytes are destroyed (free marker written, block reusable) only
//!   after every write issued before it was freed is on the device and
//!   synced: a crash can lose a recent write, never the older copy of a
//!   record whose newer copy had not reached the device;
//! - a record's newest copy is the one with the highest sequence number; a
//!   tombstone or an expired copy stays (moved by defrag if needed) until no
//!   block that could hold an older copy of its digest remains in use;
//! - a block moves Free → Open → Full → (PendingFree →) Free, holding no
//!   live bytes when freed and never releasing more than it holds: checked
//!   by `assert!` in release builds too, at each transition (a block's
//!   state is what keeps a live record from being overwritten).

mod checkpoint;
pub mod format;
pub mod io;
mod persist;
mod scan;

pub use checkpoint::{CheckpointReport, CHECKPOINT_VERSION};
pub use io::{IoMode, Media};
pub use persist::SavedEntry;
pub use scan::{ColdStartReport, Recovered, RecoveredRecord, ScanProgress};

use crate::compress::{Compression, CompressionSetting, CompressionStats};
use crate::thresholds::Thresholds;
use crate::{DeviceAddress, Location, StorageEngine, StorageError, StoreMeta, Stored};
use citrine_types::Digest;
use format::{BlockHeader, BlockKind, RecordHeader, BLOCK_HEADER_BYTES, RBLOCK, RESERVED_BYTES};
use io::{AlignedBuf, BlockIo, DeviceIo, DIRECT_ALIGN};
use parking_lot::Mutex;
use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Largest write block. A record lives in one write block, so this bounds
/// a device record (128 MiB, as the largest client message); the engine
/// holds two write buffers of this size per device, and the post-write
/// queue's blocks.
pub const WRITE_BLOCK_MAX: usize = 128 << 20;
/// Memory the post-write queue of a device takes by default: with big
/// write blocks the default queue is shortened to fit it.
pub const POST_WRITE_QUEUE_DEFAULT_BYTES: u64 = 256 << 20;

/// Default [`DeviceConfig::shadow_queue_bytes`].
pub const SHADOW_QUEUE_DEFAULT_BYTES: u64 = 64 << 20;

/// Settings of a device namespace, already validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceConfig {
    pub namespace: String,
    /// Files or raw block devices, in order (device i = `paths[i]`).
    pub paths: Vec<PathBuf>,
    /// Size of each file created (ignored for raw devices).
    pub file_size: u64,
    pub write_block_size: u32,
    pub defrag_lwm_pct: u8,
    /// `stop-writes-avail-pct` (formerly `min-avail-pct`): client writes
    /// stop while a device's free write blocks are below this percentage.
    pub stop_writes_avail_pct: u8,
    /// `stop-writes-used-pct`: client writes stop while live bytes are at
    /// or above this percentage of the devices' write blocks (0 = never).
    pub stop_writes_used_pct: u8,
    /// `evict-used-pct`: nsup evicts the records soonest to expire while
    /// live bytes are above this percentage (0 = never). These three are
    /// the values at open: [`DeviceEngine::thresholds`] holds the live
    /// ones (`set-config` changes them).
    pub evict_used_pct: u8,
    pub commit_to_device: bool,
    /// Sealed write blocks kept in memory per device.
    pub post_write_queue: u32,
    pub io_mode: IoMode,
    /// Files (the paths) or simulated disks.
    pub media: Media,
    /// Storage compression at open (changed later with
    /// [`DeviceEngine::set_compression`]).
    pub compression: Compression,
    /// Seconds after which an index checkpoint is written even if few
    /// blocks were sealed since the last one (0: no checkpoints).
    pub checkpoint_period_s: u32,
    /// Each device's shadow (paper 001 §5.1: every write also goes there,
    /// reads never do; a blank device is rebuilt from it at open): empty
    /// for none, else one entry per path. Simulated media take a shadow's
    /// disk at index `paths.len() + i`.
    pub shadows: Vec<Option<PathBuf>>,
    /// Most bytes of writes waiting for each asynchronous shadow (a write
    /// that does not fit waits); 0: shadows are written synchronously,
    /// before a write counts. Default 64 MiB (the reference's
    /// `max-write-cache`).
    pub shadow_queue_bytes: u64,
}

impl DeviceConfig {
    /// Defaults for `namespace` over `paths`.
    pub fn new(namespace: &str, paths: Vec<PathBuf>, file_size: u64) -> DeviceConfig {
        DeviceConfig {
            namespace: namespace.to_owned(),
            paths,
            file_size,
            write_block_size: 1 << 20,
            defrag_lwm_pct: 50,
            stop_writes_avail_pct: 5,
            stop_writes_used_pct: 70,
            evict_used_pct: 0,
            commit_to_device: false,
            post_write_queue: 16,
            io_mode: IoMode::Buffered,
            media: Media::Files,
            compression: Compression::default(),
            checkpoint_period_s: 60,
            shadows: Vec::new(),
            shadow_queue_bytes: SHADOW_QUEUE_DEFAULT_BYTES,
        }
    }
}

/// Where a block is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockState {
    /// Empty (free marker on the device), on the free list.
    Free,
    /// The current client or defrag write buffer.
    Open,
    /// Sealed on the device.
    Full,
    /// Queued for, or under, defragmentation.
    Defrag,
    /// Emptied by defrag; becomes free after the next flush and sync.
    PendingFree,
}

struct BlockMap {
    live: Vec<u32>,
    state: Vec<BlockState>,
    /// Sequence number when the block was opened (its incarnation).
    open_seq: Vec<u64>,
    free: VecDeque<u32>,
    defrag_queue: VecDeque<u32>,
    pending_free: Vec<u32>,
}

/// A delete tombstone read back from its device ([`DeviceEngine::held_tombstones`]):
/// its header's metadata, as the delete wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldTombstone {
    pub digest: Digest,
    pub generation: u16,
    pub life: u16,
    /// What the writer put there (the engine never reads it).
    pub void_time: u32,
    pub last_update_ms: u64,
    pub set_name: Vec<u8>,
}

/// A tombstone: a delete record, or an expired record kept as its own tombstone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tomb {
    address: DeviceAddress,
    sequence: u64,
}

/// Who asks for a new write block (decides how much of the reserve it may use).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteClass {
    Client,
    Tombstone,
    Defrag,
}

/// A write block being filled in memory.
struct WriteBuffer {
    kind: BlockKind,
    block: Option<u32>,
    incarnation: u64,
    data: AlignedBuf,
    /// Bytes filled (header included).
    fill: usize,
    /// Bytes already written to the device.
    flushed: usize,
}

#[derive(Default)]
struct PostWriteQueue {
    blocks: HashMap<u32, Arc<AlignedBuf>>,
    order: VecDeque<u32>,
}

struct Device {
    index: usize,
    /// Formatted by this open: every block is free, no scan needed.
    fresh: bool,
    io: DeviceIo,
    /// The configured path, for log lines.
    path: String,
    block_count: u32,
    blocks: Mutex<BlockMap>,
    free_blocks: AtomicU32,
    client: Mutex<WriteBuffer>,
    defrag: Mutex<WriteBuffer>,
    pwq: Mutex<PostWriteQueue>,
    tombs: Mutex<HashMap<Digest, Tomb>>,
    /// Client appends so far (a ticket per write, taken under the client
    /// buffer lock) and how many of them are known synced: group commit.
    appended: AtomicU64,
    synced: AtomicU64,
    committer: Mutex<()>,
}

/// A client body as the device stores it.
struct StoredBody {
    bytes: Vec<u8>,
    /// Uncompressed length.
    original: usize,
    /// `FLAG_LZ4`, `FLAG_ZSTD` or 0 (raw).
    flag: u8,
}

/// The blocks the last index checkpoint covered and when it was written
/// (`None`: none written by this process).
#[derive(Default)]
struct CheckpointState {
    covered: checkpoint::Covered,
    written_at: Option<std::time::Instant>,
    /// Blocks sealed so far when last looked at, and since when that count
    /// has not moved (writes went quiet).
    sealed_seen: u64,
    sealed_since: Option<std::time::Instant>,
}

/// Counters of the device engine (all monotonic unless noted).
#[derive(Debug, Default)]
pub struct DeviceStats {
    pub writes: AtomicU64,
    pub reads_from_buffer: AtomicU64,
    pub reads_from_pwq: AtomicU64,
    pub reads_from_device: AtomicU64,
    pub read_errors: AtomicU64,
    pub blocks_written: AtomicU64,
    pub partial_flushes: AtomicU64,
    pub defrag_blocks: AtomicU64,
    pub defrag_records_moved: AtomicU64,
    pub tombstones_written: AtomicU64,
    pub tombstones_collected: AtomicU64,
    pub corrupt_records_skipped: AtomicU64,
    pub out_of_space: AtomicU64,
    /// Writes and tombstones refused because the engine failed.
    pub writes_refused: AtomicU64,
}

/// Something defrag asks to move a live record: the index.
pub trait Relocator: Sync {
    /// Defrag found a record of `digest` at `from`. If the index still points
    /// there, call `copy` (which writes the record into the defrag buffer and
    /// returns its new location) while holding the record's lock, store the
    /// new location in the index and return true; otherwise return false.
    fn relocate(
        &self,
        digest: &Digest,
        from: &Location,
        copy: &mut dyn FnMut() -> Result<Location, StorageError>,
    ) -> bool;
}

/// What one defrag step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DefragStep {
    /// A block was processed.
    pub worked: bool,
    pub moved: u64,
}

/// The device storage engine.
pub struct DeviceEngine {
    config: DeviceConfig,
    instance_id: u64,
    devices: Vec<Device>,
    /// Next sequence number (record writes and block incarnations).
    sequence: AtomicU64,
    used_bytes: AtomicU64,
    metadata: Mutex<format::Metadata>,
    defrag_cursor: AtomicUsize,
    /// Sticky: a write or a sync of a device failed. No device is written
    /// or synced again until the process restarts (see the module doc).
    failed: AtomicBool,
    /// Set by [`DeviceEngine::close_writes`] at a clean shutdown: every
    /// later record write is refused, so none is acknowledged after the
    /// final flush.
    closed: AtomicBool,
    /// The current compression of new client writes.
    compression: CompressionSetting,
    /// Bytes of write blocks over all devices (fixed at open: every
    /// write's stop-writes check reads it).
    total_bytes: u64,
    /// Stop-writes and eviction thresholds (from the configuration, then
    /// as `set-config` changes them; shared with the namespace).
    thresholds: Arc<Thresholds>,
    /// What the last index checkpoint covered, for [`DeviceEngine::checkpoint_due`].
    checkpoint: Mutex<CheckpointState>,
    pub stats: DeviceStats,
    pub compression_stats: CompressionStats,
    /// `enable-benchmarks-storage` ([`crate::bench`]).
    benchmarks: crate::bench::BenchSlot,
}

fn io_error(error: std::io::Error) -> StorageError {
    StorageError::Io(error.to_string())
}

fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.finish() | 1
}

impl DeviceEngine {
    /// Opens the devices of a namespace: formats blank ones, checks the
    /// headers of formatted ones (same instance, same geometry). The index is
    /// not rebuilt here: call [`DeviceEngine::fast_restart`] or
    /// [`DeviceEngine::cold_start`] next.
    pub fn open(config: DeviceConfig) -> Result<DeviceEngine, String> {
        let wblock = config.write_block_size as usize;
        if !wblock.is_power_of_two() || !(DIRECT_ALIGN * 4..=WRITE_BLOCK_MAX).contains(&wblock) {
            return Err(format!(
                "write-block-size {wblock} must be a power of two from 16K to 128M"
            ));
        }
        if config.paths.is_empty() || config.paths.len() > DeviceAddress::MAX_DEVICES {
            return Err(format!(
                "a device namespace needs 1 to {} devices",
                DeviceAddress::MAX_DEVICES
            ));
        }
        let count = config.paths.len();
        let mut opened = Vec::with_capacity(count);
        if !config.shadows.is_empty() && config.shadows.len() != count {
            return Err(
                "a device namespace's shadows must pair one to one with its devices".into(),
            );
        }
        for (index, path) in config.paths.iter().enumerate() {
            let (io, header) = Self::open_medium(&config, index, path)?;
            let shadow = config.shadows.get(index).and_then(Option::as_ref);
            let (io, header) = match shadow {
                Some(shadow) => Self::pair_shadow(&config, (io, header), (count + index, shadow))?,
                None => (io, header),
            };
            opened.push((io, path.display().to_string(), header));
        }
        let instance_id = match opened.iter().find_map(|(_, _, header)| header.as_ref()) {
            Some(header) => header.instance_id,
            None => random_u64(),
        };
        let mut devices = Vec::with_capacity(count);
        for (index, (io, path, header)) in opened.into_iter().enumerate() {
            let fresh = header.is_none();
            let device_bytes = match header {
                Some(header) => {
                    Self::check_header(&config, &header, &io, &path, index, count, instance_id)?
                }
                None => Self::format(&config, &io, &path, index, count, instance_id)?,
            };
            devices.push(Self::device(&config, index, fresh, io, path, device_bytes)?);
        }
        let metadata = Self::read_metadata(&devices[0].io);
        let total_bytes = devices
            .iter()
            .map(|device| u64::from(device.block_count) * u64::from(config.write_block_size))
            .sum();
        Ok(DeviceEngine {
            instance_id,
            total_bytes,
            devices,
            sequence: AtomicU64::new(1),
            used_bytes: AtomicU64::new(0),
            metadata: Mutex::new(metadata),
            defrag_cursor: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            compression: CompressionSetting::new(config.compression),
            thresholds: Arc::new(Thresholds::new(
                config.evict_used_pct,
                config.stop_writes_used_pct,
                config.stop_writes_avail_pct,
            )),
            checkpoint: Mutex::new(CheckpointState::default()),
            config,
            stats: DeviceStats::default(),
            compression_stats: CompressionStats::default(),
            benchmarks: Default::default(),
        })
    }

    /// Opens medium `index` of the configuration's media (a device, or a
    /// shadow at `count + index`) at `path` and reads its header.
    fn open_medium(
        config: &DeviceConfig,
        index: usize,
        path: &std::path::Path,
    ) -> Result<(DeviceIo, Option<format::DeviceHeader>), String> {
        let io = DeviceIo::open(&config.media, index, path, config.file_size, config.io_mode)
            .map_err(|error| format!("cannot open device {}: {error}", path.display()))?;
        let bytes = io
            .read_at(0, format::DEVICE_HEADER_BYTES)
            .map_err(|error| format!("cannot read device {}: {error}", path.display()))?;
        let header = format::DeviceHeader::decode(&bytes)
            .map_err(|why| format!("device {}: {why}", path.display()))?;
        Ok((io, header))
    }

    /// Pairs an opened device with its shadow (medium `media_index` at
    /// `path`), leveling them first (see [`io::shadow`]): a blank primary
    /// is rebuilt from a formatted shadow, a blank shadow filled from a
    /// formatted primary; two formatted sides must be the same device.
    /// Answers the pair and the device's header.
    fn pair_shadow(
        config: &DeviceConfig,
        (primary, header): (DeviceIo, Option<format::DeviceHeader>),
        (media_index, path): (usize, &std::path::Path),
    ) -> Result<(DeviceIo, Option<format::DeviceHeader>), String> {
        let (shadow, shadow_header) = Self::open_medium(config, media_index, path)?;
        if let (Some(mine), Some(theirs)) = (&header, &shadow_header) {
            if (mine.instance_id, mine.device_index) != (theirs.instance_id, theirs.device_index) {
                return Err(format!(
                    "shadow {} holds another device (instance {:x}, device {}) than its primary (instance {:x}, device {}): erase the shadow to have it filled again",
                    path.display(), theirs.instance_id, theirs.device_index, mine.instance_id, mine.device_index
                ));
            }
        }
        let used = header
            .as_ref()
            .or(shadow_header.as_ref())
            .map_or(0, |h| h.device_bytes);
        let formatted = (header.is_some(), shadow_header.is_some());
        let queue_bytes = usize::try_from(config.shadow_queue_bytes).unwrap_or(usize::MAX);
        let (pair, leveled) = io::shadow::pair(primary, shadow, formatted, used, queue_bytes)
            .map_err(|error| format!("shadow {}: {error}", path.display()))?;
        match leveled {
            io::Leveled::FromShadow => {
                tracing::warn!(namespace = %config.namespace, shadow = %path.display(), bytes = used, "rebuilt a blank device from its shadow")
            }
            io::Leveled::FromPrimary => {
                tracing::info!(namespace = %config.namespace, shadow = %path.display(), bytes = used, "filled a blank shadow from its device")
            }
            io::Leveled::Already => {}
        }
        Ok((DeviceIo::Shadowed(Box::new(pair)), header.or(shadow_header)))
    }

    /// Checks a formatted device's header against the configuration and
    /// the set; returns its usable bytes.
    fn check_header(
        config: &DeviceConfig,
        header: &format::DeviceHeader,
        io: &DeviceIo,
        path: &str,
        index: usize,
        count: usize,
        instance_id: u64,
    ) -> Result<u64, String> {
        if header.instance_id != instance_id
            || header.device_index as usize != index
            || header.device_count as usize != count
        {
            return Err(format!(
                "device {path} belongs to another device set (instance {:x}, device {} of {}), expected device {index} of {count} of instance {instance_id:x}; the device list changed — restore it or erase the devices",
                header.instance_id, header.device_index, header.device_count
            ));
        }
        if header.write_block_size != config.write_block_size {
            return Err(format!(
                "device {path} was formatted with write-block-size {}, configured {}",
                header.write_block_size, config.write_block_size
            ));
        }
        if header.namespace != config.namespace {
            return Err(format!(
                "device {path} belongs to namespace {:?}",
                header.namespace
            ));
        }
        if header.device_bytes > io.size() {
            return Err(format!(
                "device {path} is smaller ({} bytes) than when it was formatted ({})",
                io.size(),
                header.device_bytes
            ));
        }
        Ok(header.device_bytes)
    }

    /// Writes (and syncs) the header of a blank device; returns its usable
    /// bytes.
    fn format(
        config: &DeviceConfig,
        io: &DeviceIo,
        path: &str,
        index: usize,
        count: usize,
        instance_id: u64,
    ) -> Result<u64, String> {
        let wblock = u64::from(config.write_block_size);
        let blocks = io.size().saturating_sub(RESERVED_BYTES) / wblock;
        let device_bytes = RESERVED_BYTES + blocks * wblock;
        let header = format::DeviceHeader {
            instance_id,
            device_index: index as u32,
            device_count: count as u32,
            write_block_size: config.write_block_size,
            device_bytes,
            namespace: config.namespace.clone(),
        };
        let mut area = AlignedBuf::zeroed(DIRECT_ALIGN);
        area.as_mut_slice()[..format::DEVICE_HEADER_BYTES].copy_from_slice(&header.encode());
        io.write_at(0, area.as_slice())
            .and_then(|()| io.sync())
            .map_err(|error| format!("cannot format device {path}: {error}"))?;
        tracing::info!(namespace = %config.namespace, device = %path, blocks, "formatted device");
        Ok(device_bytes)
    }

    /// The in-memory state of one opened device (every block free until a
    /// restart fills it in).
    fn device(
        config: &DeviceConfig,
        index: usize,
        fresh: bool,
        io: DeviceIo,
        path: String,
        device_bytes: u64,
    ) -> Result<Device, String> {
        let wblock = config.write_block_size as usize;
        let block_count = ((device_bytes - RESERVED_BYTES) / wblock as u64) as u32;
        if block_count < 8 {
            return Err(format!("device {path} holds {block_count} write blocks; at least 8 are needed (filesize ≥ 1M + 8 × write-block-size)"));
        }
        if (device_bytes / RBLOCK as u64) > DeviceAddress::MAX_RBLOCK {
            return Err(format!(
                "device {path} is larger than the 2 TiB a device can address"
            ));
        }
        Ok(Device {
            index,
            fresh,
            io,
            path,
            block_count,
            blocks: Mutex::new(BlockMap {
                live: vec![0; block_count as usize],
                state: vec![BlockState::Free; block_count as usize],
                open_seq: vec![0; block_count as usize],
                free: VecDeque::new(),
                defrag_queue: VecDeque::new(),
                pending_free: Vec::new(),
            }),
            free_blocks: AtomicU32::new(0),
            client: Mutex::new(WriteBuffer::new(BlockKind::Client, wblock)),
            defrag: Mutex::new(WriteBuffer::new(BlockKind::Defrag, wblock)),
            pwq: Mutex::new(PostWriteQueue::default()),
            tombs: Mutex::new(HashMap::new()),
            appended: AtomicU64::new(0),
            synced: AtomicU64::new(0),
            committer: Mutex::new(()),
        })
    }

    fn read_metadata(io: &DeviceIo) -> format::Metadata {
        let mut best: Option<format::Metadata> = None;
        for offset in format::META_SLOT_OFFSETS {
            if let Ok(bytes) = io.read_at(offset, format::META_SLOT_BYTES) {
                if let Some(meta) = format::Metadata::decode(&bytes) {
                    if best
                        .as_ref()
                        .is_none_or(|current| meta.sequence > current.sequence)
                    {
                        best = Some(meta);
                    }
                }
            }
        }
        best.unwrap_or_default()
    }

    /// Whether a device of the set was blank when the engine opened (this
    /// start formatted it): what the node knew of its copies before is
    /// not on it.
    pub fn formatted_at_open(&self) -> bool {
        self.devices.iter().any(|device| device.fresh)
    }

    pub fn config(&self) -> &DeviceConfig {
        &self.config
    }

    /// Truncation times persisted on the devices: (namespace-wide, per set).
    pub fn truncations(&self) -> (u64, Vec<(Vec<u8>, u64)>) {
        let metadata = self.metadata.lock();
        (metadata.truncate_lut_ms, metadata.set_truncations.clone())
    }

    /// Persists a truncation threshold (`set = None`: the whole
    /// namespace's) durably, before the caller applies it: `lut_ms`
    /// replaces the one recorded, raised or lowered (an undone truncation),
    /// and 0 removes it (a cold start then loads what it covered again).
    pub fn persist_truncation(&self, set: Option<&[u8]>, lut_ms: u64) -> Result<(), StorageError> {
        let mut metadata = self.metadata.lock();
        let mut next = metadata.clone();
        next.sequence += 1;
        match set {
            None => next.truncate_lut_ms = lut_ms,
            Some(name) => {
                next.set_truncations
                    .retain(|(existing, _)| existing != name);
                if lut_ms > 0 {
                    next.set_truncations.push((name.to_vec(), lut_ms));
                }
            }
        }
        let encoded = next.encode();
        if encoded.len() > format::META_SLOT_BYTES {
            return Err(StorageError::Io(
                "too many set truncations to persist".into(),
            ));
        }
        let slot = format::META_SLOT_OFFSETS[(next.sequence % 2) as usize];
        let mut area = AlignedBuf::zeroed(encoded.len().div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN);
        area.as_mut_slice()[..encoded.len()].copy_from_slice(&encoded);
        let device = &self.devices[0];
        self.device_write(device, slot, area.as_slice(), "metadata write")?;
        self.device_sync(device, "sync of the metadata")?;
        *metadata = next;
        Ok(())
    }

    fn wblock(&self) -> usize {
        self.config.write_block_size as usize
    }

    fn device_of(&self, digest: &Digest) -> usize {
        let word = u32::from_le_bytes([digest.0[12], digest.0[13], digest.0[14], digest.0[15]]);
        word as usize % self.devices.len()
    }

    fn block_offset(&self, block: u32) -> u64 {
        RESERVED_BYTES + u64::from(block) * self.wblock() as u64
    }

    /// (block, offset within block) of an address.
    fn locate(&self, address: DeviceAddress) -> Option<(u32, usize)> {
        let byte = address.rblock() * RBLOCK as u64;
        let relative = byte.checked_sub(RESERVED_BYTES)?;
        let block = u32::try_from(relative / self.wblock() as u64).ok()?;
        let offset = (relative % self.wblock() as u64) as usize;
        let device = self.devices.get(address.device())?;
        if block >= device.block_count
            || offset < BLOCK_HEADER_BYTES
            || offset + address.bytes() as usize > self.wblock()
        {
            return None;
        }
        Some((block, offset))
    }

    fn address(
        &self,
        device: usize,
        block: u32,
        offset: usize,
        rblocks: usize,
    ) -> Option<DeviceAddress> {
        let byte = self.block_offset(block) + offset as u64;
        DeviceAddress::new(device, byte / RBLOCK as u64, u32::try_from(rblocks).ok()?)
    }

    fn next_sequence(&self) -> u64 {
        self.sequence.fetch_add(1, Ordering::Relaxed)
    }

    /// Free blocks kept back: client writes leave twice this many free,
    /// tombstones this many, and defragmentation may use them all, so that
    /// deletes work at stop-writes and defrag can always make room.
    fn reserve_blocks(device: &Device) -> u32 {
        (device.block_count / 100).max(2)
    }

    /// Percentage of write blocks free, the lowest over the devices.
    pub fn available_pct(&self) -> u8 {
        self.devices
            .iter()
            .map(|device| {
                (u64::from(device.free_blocks.load(Ordering::Relaxed)) * 100
                    / u64::from(device.block_count.max(1))) as u8
            })
            .min()
            .unwrap_or(0)
    }

    /// Live bytes as a percentage of the write blocks (`data_used_pct`).
    pub fn used_pct(&self) -> u8 {
        let used = self.used_bytes.load(Ordering::Relaxed);
        (used.saturating_mul(100) / self.total_bytes().max(1)).min(100) as u8
    }

    /// True when client writes must stop: free blocks below
    /// `stop-writes-avail-pct`, or live bytes at `stop-writes-used-pct`.
    pub fn stop_writes(&self) -> bool {
        let used_limit = self.thresholds.stop_writes_used_pct();
        self.available_pct() < self.thresholds.stop_writes_avail_pct()
            || (used_limit > 0 && self.used_pct() >= used_limit)
    }

    /// The stop-writes and eviction thresholds in force.
    pub fn thresholds(&self) -> &Arc<Thresholds> {
        &self.thresholds
    }

    /// Live bytes above which nsup evicts (`evict-used-pct`), if set.
    pub fn evict_threshold_bytes(&self) -> Option<u64> {
        let pct = u64::from(self.thresholds.evict_used_pct());
        (pct > 0).then(|| self.total_bytes() / 100 * pct)
    }

    /// Total bytes of write blocks over all devices.
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    /// Number of tombstones held.
    pub fn tombstones(&self) -> usize {
        self.devices
            .iter()
            .map(|device| device.tombs.lock().len())
            .sum()
    }

    /// Blocks waiting for defragmentation.
    pub fn defrag_queue_len(&self) -> usize {
        self.devices
            .iter()
            .map(|device| device.blocks.lock().defrag_queue.len())
            .sum()
    }

    /// Statistics for info answers.
    pub fn info_pairs(&self) -> Vec<(String, String)> {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed).to_string();
        let stats = &self.stats;
        let free: u64 = self
            .devices
            .iter()
            .map(|device| u64::from(device.free_blocks.load(Ordering::Relaxed)))
            .sum();
        vec![
            ("device_total_bytes".into(), self.total_bytes().to_string()),
            (
                "device_used_bytes".into(),
                self.used_bytes.load(Ordering::Relaxed).to_string(),
            ),
            (
                "device_available_pct".into(),
                self.available_pct().to_string(),
            ),
            ("device_free_wblocks".into(), free.to_string()),
            ("device_tombstones".into(), self.tombstones().to_string()),
            ("defrag_q".into(), self.defrag_queue_len().to_string()),
            ("defrag_reads".into(), load(&stats.defrag_blocks)),
            (
                "defrag_records_moved".into(),
                load(&stats.defrag_records_moved),
            ),
            ("device_writes".into(), load(&stats.writes)),
            ("device_wblocks_written".into(), load(&stats.blocks_written)),
            (
                "device_partial_flushes".into(),
                load(&stats.partial_flushes),
            ),
            ("device_reads_buffer".into(), load(&stats.reads_from_buffer)),
            ("device_reads_pwq".into(), load(&stats.reads_from_pwq)),
            ("device_reads_device".into(), load(&stats.reads_from_device)),
            ("device_read_errors".into(), load(&stats.read_errors)),
            (
                "device_corrupt_records_skipped".into(),
                load(&stats.corrupt_records_skipped),
            ),
            ("device_out_of_space".into(), load(&stats.out_of_space)),
            ("device_failed".into(), self.failed().to_string()),
            ("device_writes_refused".into(), load(&stats.writes_refused)),
            (
                "device_tombstones_written".into(),
                load(&stats.tombstones_written),
            ),
            (
                "device_tombstones_collected".into(),
                load(&stats.tombstones_collected),
            ),
        ]
    }

    // ------------------------------------------------------------ the failed state

    /// True once a write or a sync of a device failed: writes and
    /// tombstones are refused ([`StorageError::DeviceFailed`]) until the
    /// process restarts; reads are served.
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Enters the failed state (logged once, at error level).
    fn fail(&self, device: &Device, what: &str, error: &std::io::Error) {
        if !self.failed.swap(true, Ordering::AcqRel) {
            tracing::error!(
                namespace = %self.config.namespace,
                device = %device.path,
                "{what} failed: {error}; what was written since the last successful sync may not be on the device, so the namespace now refuses every write and delete (result code 1) and writes nothing more to its devices until the node restarts; reads are still served"
            );
        }
    }

    /// Refuses a write when the engine failed or was closed, counting it.
    fn refuse_if_failed(&self) -> Result<(), StorageError> {
        if self.failed() || self.closed.load(Ordering::Acquire) {
            self.stats.writes_refused.fetch_add(1, Ordering::Relaxed);
            return Err(StorageError::DeviceFailed);
        }
        Ok(())
    }

    /// Writes to a device, unless the engine failed; a failure fails it.
    fn device_write(
        &self,
        device: &Device,
        offset: u64,
        bytes: &[u8],
        what: &str,
    ) -> Result<(), StorageError> {
        if self.failed() {
            return Err(StorageError::DeviceFailed);
        }
        device.io.write_at(offset, bytes).map_err(|error| {
            self.fail(device, what, &error);
            StorageError::DeviceFailed
        })
    }

    /// Syncs a device, unless the engine failed; a failure fails it.
    fn device_sync(&self, device: &Device, what: &str) -> Result<(), StorageError> {
        if self.failed() {
            return Err(StorageError::DeviceFailed);
        }
        device.io.sync().map_err(|error| {
            self.fail(device, what, &error);
            StorageError::DeviceFailed
        })
    }

    // ------------------------------------------------------------ block accounting

    fn queue_if_sparse(&self, map: &mut BlockMap, block: u32) {
        let index = block as usize;
        let threshold = self.wblock() as u64 * u64::from(self.config.defrag_lwm_pct) / 100;
        if map.state[index] == BlockState::Full && u64::from(map.live[index]) < threshold {
            map.state[index] = BlockState::Defrag;
            map.defrag_queue.push_back(block);
        }
    }

    /// Marks the bytes at `address` dead.
    fn release_address(&self, address: DeviceAddress) {
        let Some((block, _)) = self.locate(address) else {
            tracing::error!(
                address = address.0,
                "release of an address outside the devices"
            );
            return;
        };
        let bytes = address.bytes();
        let Some(device) = self.devices.get(address.device()) else {
            return;
        };
        let mut map = device.blocks.lock();
        let live = &mut map.live[block as usize];
        assert!(
            u64::from(*live) >= bytes,
            "block {block} releases more than it holds"
        );
        *live = live.saturating_sub(bytes as u32);
        self.queue_if_sparse(&mut map, block);
        drop(map);
        self.used_bytes.fetch_sub(
            bytes.min(self.used_bytes.load(Ordering::Relaxed)),
            Ordering::Relaxed,
        );
    }

    fn add_live(&self, device: &Device, block: u32, bytes: u64) {
        device.blocks.lock().live[block as usize] += bytes as u32;
        self.used_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    // ------------------------------------------------------------ write buffers

    /// Writes the unflushed part of a buffer to its block.
    fn flush_buffer(&self, device: &Device, buffer: &mut WriteBuffer) -> Result<(), StorageError> {
        let Some(block) = buffer.block else {
            return Ok(());
        };
        if buffer.fill == buffer.flushed {
            return Ok(());
        }
        let align = match device.io.mode() {
            IoMode::Direct => DIRECT_ALIGN,
            IoMode::Buffered => RBLOCK,
        };
        let start = buffer.flushed / align * align;
        let end = (buffer.fill.div_ceil(align) * align).min(buffer.data.len());
        let started = self.benchmarks.start();
        self.device_write(
            device,
            self.block_offset(block) + start as u64,
            &buffer.data.as_slice()[start..end],
            "write-block write",
        )?;
        self.benchmarks
            .device_io(started, device.index, crate::bench::IoKind::Write);
        buffer.flushed = buffer.fill;
        self.stats.partial_flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Writes out and closes a buffer's block; it joins the post-write queue.
    fn seal(&self, device: &Device, buffer: &mut WriteBuffer) -> Result<(), StorageError> {
        let Some(block) = buffer.block else {
            return Ok(());
        };
        self.flush_buffer(device, buffer)?;
        self.stats.blocks_written.fetch_add(1, Ordering::Relaxed);
        let full = std::mem::replace(&mut buffer.data, AlignedBuf::zeroed(self.wblock()));
        if self.config.post_write_queue > 0 {
            let mut pwq = device.pwq.lock();
            pwq.blocks.insert(block, Arc::new(full));
            pwq.order.push_back(block);
            while pwq.order.len() > self.config.post_write_queue as usize {
                if let Some(oldest) = pwq.order.pop_front() {
                    // The same block may be queued twice only if it was freed
                    // and reused; free removes it, so this is the oldest copy.
                    pwq.blocks.remove(&oldest);
                }
            }
        }
        buffer.block = None;
        buffer.fill = 0;
        buffer.flushed = 0;
        let mut map = device.blocks.lock();
        assert_eq!(map.state[block as usize], BlockState::Open);
        map.state[block as usize] = BlockState::Full;
        self.queue_if_sparse(&mut map, block);
        Ok(())
    }

    /// Opens a free block for `buffer`.
    fn open_block(
        &self,
        device: &Device,
        buffer: &mut WriteBuffer,
        class: WriteClass,
    ) -> Result<(), StorageError> {
        debug_assert!(buffer.block.is_none());
        let mut map = device.blocks.lock();
        let floor = match class {
            WriteClass::Client => Self::reserve_blocks(device) * 2,
            WriteClass::Tombstone => Self::reserve_blocks(device),
            WriteClass::Defrag => 0,
        };
        if map.free.len() as u32 <= floor {
            self.stats.out_of_space.fetch_add(1, Ordering::Relaxed);
            return Err(StorageError::OutOfSpace);
        }
        let Some(block) = map.free.pop_front() else {
            return Err(StorageError::OutOfSpace);
        };
        device.free_blocks.fetch_sub(1, Ordering::Relaxed);
        let incarnation = self.next_sequence();
        assert_eq!(map.state[block as usize], BlockState::Free);
        assert_eq!(map.live[block as usize], 0);
        map.state[block as usize] = BlockState::Open;
        map.open_seq[block as usize] = incarnation;
        drop(map);
        device.pwq.lock().blocks.remove(&block);
        buffer.data.as_mut_slice().fill(0);
        let header = BlockHeader {
            kind: buffer.kind,
            instance_id: self.instance_id,
            block_index: block,
            incarnation,
        };
        buffer.data.as_mut_slice()[..BLOCK_HEADER_BYTES].copy_from_slice(&header.encode());
        buffer.block = Some(block);
        buffer.incarnation = incarnation;
        buffer.fill = BLOCK_HEADER_BYTES;
        buffer.flushed = 0;
        Ok(())
    }

    /// Appends a record of `rblocks` to a buffer, `encode` filling its bytes
    /// given the block incarnation. Returns the new address.
    fn append(
        &self,
        device: &Device,
        buffer: &mut WriteBuffer,
        rblocks: usize,
        class: WriteClass,
        encode: impl FnOnce(&mut [u8], u64),
    ) -> Result<DeviceAddress, StorageError> {
        let bytes = rblocks * RBLOCK;
        if bytes > self.wblock() - BLOCK_HEADER_BYTES {
            return Err(StorageError::TooBig);
        }
        if buffer.block.is_some() && buffer.fill + bytes > self.wblock() {
            self.seal(device, buffer)?;
        }
        if buffer.block.is_none() {
            self.open_block(device, buffer, class)?;
        }
        let Some(block) = buffer.block else {
            return Err(StorageError::OutOfSpace);
        };
        let offset = buffer.fill;
        debug_assert_eq!(offset % RBLOCK, 0);
        encode(
            &mut buffer.data.as_mut_slice()[offset..offset + bytes],
            buffer.incarnation,
        );
        buffer.fill += bytes;
        let address = self
            .address(device.index, block, offset, rblocks)
            .ok_or_else(|| StorageError::Io("address does not fit".into()))?;
        self.add_live(device, block, bytes as u64);
        Ok(address)
    }

    /// The current compression of client writes.
    pub fn compression(&self) -> Compression {
        self.compression.get()
    }

    /// Changes the compression of later client writes; records already
    /// written stay as they are (each says how it is stored).
    pub fn set_compression(&self, compression: Compression) {
        self.compression.set(compression)
    }

    /// A client body as it will be stored: compressed only when that
    /// saves read blocks on the device, else raw (flag 0).
    fn compress_body(&self, set_len: usize, body: Vec<u8>) -> StoredBody {
        let setting = self.compression.get();
        let original = body.len();
        match crate::compress::compress(setting, &body) {
            Some(compressed)
                if format::rblocks_for(set_len, compressed.len())
                    < format::rblocks_for(set_len, original) =>
            {
                StoredBody {
                    bytes: compressed,
                    original,
                    flag: format::compression_flag(setting.algorithm),
                }
            }
            _ => StoredBody {
                bytes: body,
                original,
                flag: 0,
            },
        }
    }

    /// The body of a decoded record: its stored bytes, decompressed if its
    /// flags say so (bounded by the write block: no record is larger).
    fn record_body(&self, record: &format::DecodedRecord<'_>) -> Result<Vec<u8>, String> {
        match format::compression_of(record.header.flags)? {
            crate::compress::Algorithm::None => Ok(record.body.to_vec()),
            algorithm => crate::compress::decompress(algorithm, record.body, self.wblock()),
        }
    }

    /// Writes a record (client write or tombstone).
    fn write_record(
        &self,
        digest: &Digest,
        meta: &StoreMeta<'_>,
        body: &[u8],
        flags: u8,
    ) -> Result<DeviceAddress, StorageError> {
        let set = &meta.set_name[..meta.set_name.len().min(format::SET_NAME_MAX)];
        let rblocks = format::rblocks_for(set.len(), body.len());
        let device = &self.devices[self.device_of(digest)];
        let tombstone = flags & format::FLAG_TOMBSTONE != 0;
        let mut buffer = device.client.lock();
        // Under the buffer lock: no append follows a failure's flush.
        self.refuse_if_failed()?;
        let sequence = self.next_sequence();
        let header = RecordHeader {
            flags,
            generation: meta.generation,
            life: meta.life,
            digest: *digest,
            void_time: meta.void_time,
            last_update_ms: meta.last_update_ms,
            sequence,
            incarnation: 0,
            body_len: body.len() as u32,
            set_len: set.len() as u8,
        };
        let class = if tombstone {
            WriteClass::Tombstone
        } else {
            WriteClass::Client
        };
        let address = self.append(device, &mut buffer, rblocks, class, |out, incarnation| {
            format::encode_record(
                out,
                &RecordHeader {
                    incarnation,
                    ..header
                },
                set,
                body,
            )
        })?;
        let ticket = device.appended.fetch_add(1, Ordering::Relaxed) + 1;
        drop(buffer);
        if self.config.commit_to_device {
            if let Err(error) = self.commit_through(device, ticket) {
                self.release_address(address);
                return Err(error);
            }
        }
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        // A newer copy exists now: an older tombstone of this digest is no
        // longer needed (its bytes are destroyed only after this write is
        // durable, see `flush_tick`).
        let mut tombs = device.tombs.lock();
        if tombstone {
            if let Some(old) = tombs.insert(*digest, Tomb { address, sequence }) {
                self.release_address(old.address);
            }
        } else if let Some(old) = tombs.remove(digest) {
            self.release_address(old.address);
        }
        Ok(address)
    }

    /// Group commit: makes every client append up to `ticket` durable. One
    /// writer at a time writes the buffer out and syncs, for itself and for
    /// every writer that appended before it took the buffer lock; the others
    /// find their ticket covered and return without a sync of their own.
    fn commit_through(&self, device: &Device, ticket: u64) -> Result<(), StorageError> {
        if device.synced.load(Ordering::Acquire) >= ticket {
            return Ok(());
        }
        let _committer = device.committer.lock();
        if device.synced.load(Ordering::Acquire) >= ticket {
            return Ok(());
        }
        let covered = {
            let mut buffer = device.client.lock();
            // Appends of sealed blocks were written at seal; the open block's
            // are written now: everything up to `covered` is on its way.
            self.flush_buffer(device, &mut buffer)?;
            device.appended.load(Ordering::Relaxed)
        };
        self.device_sync(device, "sync of a committed write")?;
        device.synced.fetch_max(covered, Ordering::Release);
        debug_assert!(covered >= ticket);
        Ok(())
    }

    /// Reads the bytes of a record at `address` (from a buffer, the
    /// post-write queue or the device) and returns its body, checked.
    fn read_address(&self, address: DeviceAddress) -> Result<Vec<u8>, StorageError> {
        self.read_raw(address, usize::MAX, |bytes, (path, block, offset)| {
            let record = format::decode_record(bytes, None).map_err(|error| {
                self.stats.read_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(device = %path, block, offset, ?error, "record failed its checksum on read");
                StorageError::Corrupt(format!("{error:?}"))
            })?;
            self.record_body(&record).map_err(|error| {
                self.stats.read_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(device = %path, block, offset, %error, "record body does not decompress");
                StorageError::Corrupt(error)
            })
        })
    }

    /// `decode` of the bytes of the record at `address` (at most its first
    /// `limit`), from its write buffer (under the buffer's lock, without a
    /// copy), the post-write queue or the device; `decode` also gets the
    /// device's path, the block and the offset, for its messages.
    fn read_raw<R>(
        &self,
        address: DeviceAddress,
        limit: usize,
        decode: impl FnOnce(&[u8], (&str, u32, usize)) -> Result<R, StorageError>,
    ) -> Result<R, StorageError> {
        let (block, offset) = self.locate(address).ok_or_else(|| {
            StorageError::Corrupt(format!("address {:#x} outside the devices", address.0))
        })?;
        let device = &self.devices[address.device()];
        let length = (address.bytes() as usize).min(limit);
        let at = (device.path.as_str(), block, offset);
        for buffer in [&device.client, &device.defrag] {
            let buffer = buffer.lock();
            if buffer.block == Some(block) {
                self.stats.reads_from_buffer.fetch_add(1, Ordering::Relaxed);
                return decode(&buffer.data.as_slice()[offset..offset + length], at);
            }
        }
        let cached = device.pwq.lock().blocks.get(&block).cloned();
        if let Some(data) = cached {
            self.stats.reads_from_pwq.fetch_add(1, Ordering::Relaxed);
            return decode(&data.as_slice()[offset..offset + length], at);
        }
        self.stats.reads_from_device.fetch_add(1, Ordering::Relaxed);
        let started = self.benchmarks.start();
        let bytes = device
            .io
            .read_at(self.block_offset(block) + offset as u64, length)
            .map_err(io_error)?;
        self.benchmarks
            .device_io(started, device.index, crate::bench::IoKind::Read);
        self.benchmarks.record_size(false, length);
        decode(&bytes, at)
    }

    /// The delete tombstones the engine holds (not the expired copies it
    /// keeps as theirs), each read back from its device (an expired copy
    /// only as far as its header and set name): what a restart gives the
    /// index back. One that cannot be read is left out with a log line.
    pub fn held_tombstones(&self) -> Vec<HeldTombstone> {
        let prefix = format::RECORD_HEADER_BYTES + format::SET_NAME_MAX;
        let mut held = Vec::new();
        for device in &self.devices {
            let tombs: Vec<(Digest, DeviceAddress)> = device
                .tombs
                .lock()
                .iter()
                .map(|(digest, tomb)| (*digest, tomb.address))
                .collect();
            for (digest, address) in tombs {
                let read = self.read_raw(address, prefix, |bytes, _| {
                    let corrupt = |error| StorageError::Corrupt(format!("{error:?}"));
                    let header = format::decode_record_header(bytes, None).map_err(corrupt)?;
                    if !header.is_tombstone() {
                        return Ok((header, Vec::new()));
                    }
                    // A tombstone has no body: all of it is in the prefix.
                    format::decode_record(bytes, None)
                        .map(|record| (record.header, record.set.to_vec()))
                        .map_err(corrupt)
                });
                match read {
                    Ok((header, set_name)) if header.is_tombstone() => held.push(HeldTombstone {
                        digest,
                        generation: header.generation,
                        life: header.life,
                        void_time: header.void_time,
                        last_update_ms: header.last_update_ms,
                        set_name,
                    }),
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(device = %device.path, "a tombstone cannot be read back: {error}")
                    }
                }
            }
        }
        held
    }

    // ------------------------------------------------------------ background work

    /// The flusher's tick (every `flush-max-ms`): writes every buffer's
    /// unflushed records, syncs, then frees the blocks defrag emptied before
    /// the tick began (their moved records are now durable). Once the
    /// engine failed it does nothing and says so.
    pub fn flush_tick(&self) -> Result<(), StorageError> {
        if self.failed() {
            return Err(StorageError::DeviceFailed);
        }
        let pending: Vec<Vec<u32>> = self
            .devices
            .iter()
            .map(|device| std::mem::take(&mut device.blocks.lock().pending_free))
            .collect();
        let flushed = self
            .devices
            .iter()
            .try_for_each(|device| self.flush_device(device, !pending[device.index].is_empty()));
        if let Err(error) = flushed {
            // Keep the emptied blocks pending: their moves may not be durable.
            for (device, blocks) in self.devices.iter().zip(pending) {
                device.blocks.lock().pending_free.extend(blocks);
            }
            return Err(error);
        }
        let mut result = Ok(());
        for (device, blocks) in self.devices.iter().zip(pending) {
            if let Err(error) = self.free_pending(device, blocks) {
                result = Err(error);
            }
        }
        result
    }

    /// Writes out a device's client and defrag buffers and syncs it if
    /// anything was written or `must_sync`.
    fn flush_device(&self, device: &Device, must_sync: bool) -> Result<(), StorageError> {
        let mut dirty = must_sync;
        for buffer in [&device.client, &device.defrag] {
            let mut buffer = buffer.lock();
            dirty |= buffer.fill != buffer.flushed;
            self.flush_buffer(device, &mut buffer)?;
        }
        if dirty {
            self.device_sync(device, "sync of flushed write blocks")?;
        }
        Ok(())
    }

    /// Writes and syncs the free markers of emptied blocks, then makes them
    /// reusable. On failure they stay pending: a marker may or may not be
    /// on the device, and the engine reuses nothing once failed.
    fn free_pending(&self, device: &Device, blocks: Vec<u32>) -> Result<(), StorageError> {
        if blocks.is_empty() {
            return Ok(());
        }
        let marker = AlignedBuf::zeroed(DIRECT_ALIGN);
        let written = blocks
            .iter()
            .try_for_each(|block| {
                self.device_write(
                    device,
                    self.block_offset(*block),
                    marker.as_slice(),
                    "free-marker write",
                )
            })
            .and_then(|()| self.device_sync(device, "sync of free markers"));
        if let Err(error) = written {
            device.blocks.lock().pending_free.extend(blocks);
            return Err(error);
        }
        let mut pwq = device.pwq.lock();
        for block in &blocks {
            pwq.blocks.remove(block);
        }
        drop(pwq);
        let mut map = device.blocks.lock();
        for block in &blocks {
            let index = *block as usize;
            assert_eq!(map.state[index], BlockState::PendingFree);
            assert_eq!(map.live[index], 0);
            map.state[index] = BlockState::Free;
            map.free.push_back(*block);
        }
        drop(map);
        device
            .free_blocks
            .fetch_add(blocks.len() as u32, Ordering::Relaxed);
        Ok(())
    }

    /// How long the defrag thread should pause after a step: no pause when
    /// free blocks run short, longer pauses the more free blocks there are
    /// (001 §5.1.2: the rate adapts to the space writes can consume).
    pub fn defrag_pause(&self, step: DefragStep) -> std::time::Duration {
        if !step.worked {
            return std::time::Duration::from_millis(20);
        }
        let available = u64::from(self.available_pct());
        let floor = u64::from(self.thresholds.stop_writes_avail_pct()).max(1);
        let micros = if available <= floor * 2 {
            0
        } else if available < 50 {
            available * 20
        } else {
            available * 100
        };
        std::time::Duration::from_micros(micros)
    }

    /// Defragments one queued block: moves its live records (asking
    /// `relocator` for each) and tombstones to the defrag buffer and leaves
    /// the block pending free.
    pub fn defrag_step(&self, relocator: &dyn Relocator) -> DefragStep {
        if self.failed() {
            // Moving records needs writes; the blocks stay as they are.
            return DefragStep::default();
        }
        let count = self.devices.len();
        let start = self.defrag_cursor.fetch_add(1, Ordering::Relaxed);
        for attempt in 0..count {
            let device = &self.devices[(start + attempt) % count];
            let block = device.blocks.lock().defrag_queue.pop_front();
            if let Some(block) = block {
                let moved = self.defrag_block(device, block, relocator);
                self.stats.defrag_blocks.fetch_add(1, Ordering::Relaxed);
                return DefragStep {
                    worked: true,
                    moved,
                };
            }
        }
        DefragStep::default()
    }

    /// Reads a whole write block for defragmentation (timed as the
    /// reference's `large-block-read` when the storage benchmarks are on).
    fn read_large_block(&self, device: &Device, block: u32) -> std::io::Result<Vec<u8>> {
        let started = self.benchmarks.start();
        let bytes = device.io.read_at(self.block_offset(block), self.wblock())?;
        let kind = crate::bench::IoKind::LargeBlockRead;
        self.benchmarks.device_io(started, device.index, kind);
        Ok(bytes)
    }

    fn defrag_block(&self, device: &Device, block: u32, relocator: &dyn Relocator) -> u64 {
        let wblock = self.wblock();
        let (incarnation, live) = {
            let map = device.blocks.lock();
            (map.open_seq[block as usize], map.live[block as usize])
        };
        let mut moved = 0u64;
        if live > 0 {
            let cached = device.pwq.lock().blocks.get(&block).cloned();
            let data: Cow<'_, [u8]> = match &cached {
                Some(buffer) => Cow::Borrowed(buffer.as_slice()),
                None => match self.read_large_block(device, block) {
                    Ok(bytes) => Cow::Owned(bytes),
                    Err(error) => {
                        tracing::error!(device = %device.path, block, "defrag cannot read block: {error}");
                        let mut map = device.blocks.lock();
                        map.state[block as usize] = BlockState::Full;
                        return 0;
                    }
                },
            };
            let mut offset = BLOCK_HEADER_BYTES;
            while offset + format::RECORD_HEADER_BYTES <= wblock {
                match format::decode_record(&data[offset..], Some(incarnation)) {
                    Ok(record) => {
                        let rblocks = record.header.rblocks();
                        let raw = &data[offset..offset + rblocks * RBLOCK];
                        if let Some(address) = self.address(device.index, block, offset, rblocks) {
                            if self.defrag_record(
                                device,
                                &record.header.digest,
                                address,
                                raw,
                                relocator,
                            ) {
                                moved += 1;
                            }
                        }
                        offset += rblocks * RBLOCK;
                    }
                    Err(format::RecordError::End) | Err(format::RecordError::Stale) => break,
                    Err(format::RecordError::BadBody { rblocks }) => {
                        self.stats
                            .corrupt_records_skipped
                            .fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(device = %device.path, block, offset, "defrag: record body fails its checksum; skipped");
                        offset += rblocks.max(1) * RBLOCK;
                    }
                    Err(format::RecordError::BadHeader(why)) => {
                        self.stats
                            .corrupt_records_skipped
                            .fetch_add(1, Ordering::Relaxed);
                        let next = format::resync(&data, offset + RBLOCK, incarnation);
                        tracing::warn!(device = %device.path, block, offset, "defrag: {why}; skipped to the next valid record header");
                        offset = next;
                    }
                }
            }
        }
        self.stats
            .defrag_records_moved
            .fetch_add(moved, Ordering::Relaxed);
        let mut map = device.blocks.lock();
        let index = block as usize;
        if map.live[index] == 0 {
            map.state[index] = BlockState::PendingFree;
            map.pending_free.push(block);
        } else {
            // Either a release is in flight (a writer replaced a record and
            // is about to release the old copy: that release re-queues the
            // block), or something could not be moved (logged above). The
            // block stays and is retried when more of it dies.
            tracing::debug!(device = %device.path, block, live = map.live[index], "defrag left live bytes in block");
            map.state[index] = BlockState::Full;
        }
        moved
    }

    /// Moves one record found by defrag if it is still referenced.
    fn defrag_record(
        &self,
        device: &Device,
        digest: &Digest,
        address: DeviceAddress,
        raw: &[u8],
        relocator: &dyn Relocator,
    ) -> bool {
        let copy = |engine: &DeviceEngine| -> Result<DeviceAddress, StorageError> {
            let mut buffer = device.defrag.lock();
            let rblocks = raw.len() / RBLOCK;
            engine.append(
                device,
                &mut buffer,
                rblocks,
                WriteClass::Defrag,
                |out, incarnation| {
                    out.copy_from_slice(raw);
                    format::set_record_incarnation(out, incarnation);
                },
            )
        };
        {
            let mut tombs = device.tombs.lock();
            if let Some(tomb) = tombs.get_mut(digest) {
                if tomb.address == address {
                    return match copy(self) {
                        Ok(new_address) => {
                            tomb.address = new_address;
                            drop(tombs);
                            self.release_address(address);
                            true
                        }
                        Err(error) => {
                            tracing::warn!("defrag cannot move a tombstone: {error}");
                            false
                        }
                    };
                }
            }
        }
        let from = Location::device(address);
        let mut failure = None;
        let moved = relocator.relocate(digest, &from, &mut || match copy(self) {
            Ok(new_address) => Ok(Location::device(new_address)),
            Err(error) => {
                failure = Some(error.clone());
                Err(error)
            }
        });
        if let Some(error) = failure {
            tracing::warn!("defrag cannot move a record: {error}");
        }
        if moved {
            self.release_address(address);
        }
        moved
    }

    /// Drops tombstones that can no longer hide anything: every block that
    /// was in use when the tombstone was written has since been freed, so no
    /// older copy of its digest remains. Returns how many were dropped.
    pub fn collect_tombstones(&self) -> usize {
        let mut dropped = 0;
        for device in &self.devices {
            let oldest_in_use = {
                let map = device.blocks.lock();
                map.state
                    .iter()
                    .zip(&map.open_seq)
                    .filter(|(state, _)| **state != BlockState::Free)
                    .map(|(_, seq)| *seq)
                    .min()
                    .unwrap_or(u64::MAX)
            };
            // Released under the tombstone lock, so defrag never sees a
            // tombstone gone from the table but still counted live.
            device.tombs.lock().retain(|_, tomb| {
                if tomb.sequence < oldest_in_use {
                    self.release_address(tomb.address);
                    dropped += 1;
                    false
                } else {
                    true
                }
            });
        }
        self.stats
            .tombstones_collected
            .fetch_add(dropped as u64, Ordering::Relaxed);
        dropped
    }

    /// Closes the engine to record writes (clean shutdown, before
    /// [`DeviceEngine::flush_all`]): each device's client buffer lock is
    /// taken once, so every write that appended before has finished its
    /// append and every later one is refused ([`StorageError::DeviceFailed`]).
    pub fn close_writes(&self) {
        self.closed.store(true, Ordering::Release);
        for device in &self.devices {
            drop(device.client.lock());
        }
    }

    /// Seals every open buffer, frees pending blocks and syncs: the devices
    /// then hold everything acknowledged. Used at shutdown.
    pub fn flush_all(&self) -> Result<(), StorageError> {
        if self.failed() {
            return Err(StorageError::DeviceFailed);
        }
        for device in &self.devices {
            for buffer in [&device.client, &device.defrag] {
                let mut buffer = buffer.lock();
                self.seal(device, &mut buffer)?;
            }
        }
        self.flush_tick()?;
        for device in &self.devices {
            self.device_sync(device, "sync at shutdown")?;
        }
        Ok(())
    }
}

impl WriteBuffer {
    fn new(kind: BlockKind, wblock: usize) -> WriteBuffer {
        WriteBuffer {
            kind,
            block: None,
            incarnation: 0,
            data: AlignedBuf::zeroed(wblock),
            fill: 0,
            flushed: 0,
        }
    }
}

impl StorageEngine for DeviceEngine {
    fn name(&self) -> &'static str {
        "device"
    }

    fn benchmarks(&self) -> &crate::bench::BenchSlot {
        &self.benchmarks
    }

    fn write(
        &self,
        digest: &Digest,
        meta: &StoreMeta<'_>,
        body: Vec<u8>,
    ) -> Result<Location, StorageError> {
        let set_len = meta.set_name.len().min(format::SET_NAME_MAX);
        // The uncompressed size counts for the size check (as the
        // reference): every record fits a write block stored raw too.
        if format::rblocks_for(set_len, body.len()) * RBLOCK > self.wblock() - BLOCK_HEADER_BYTES {
            return Err(StorageError::TooBig);
        }
        let stored = self.compress_body(set_len, body);
        let address = self.write_record(digest, meta, &stored.bytes, stored.flag)?;
        self.benchmarks.record_size(true, address.bytes() as usize);
        self.compression_stats
            .count(stored.original, stored.bytes.len(), stored.flag != 0);
        Ok(Location::device(address))
    }

    fn read<'a>(&self, location: &'a Location) -> Result<Cow<'a, [u8]>, StorageError> {
        match location.get() {
            Stored::Device(address) => self.read_address(address).map(Cow::Owned),
            Stored::Memory(_) => Err(StorageError::Corrupt(
                "a memory location given to the device engine".into(),
            )),
        }
    }

    fn release(&self, location: Location) {
        match location.device_address() {
            Some(address) => self.release_address(address),
            None => {
                tracing::error!("a memory location released to the device engine")
            }
        }
    }

    fn write_tombstone(&self, digest: &Digest, meta: &StoreMeta<'_>) -> Result<(), StorageError> {
        self.write_record(digest, meta, &[], format::FLAG_TOMBSTONE)?;
        self.stats
            .tombstones_written
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn retire(&self, digest: &Digest, location: Location) {
        let Some(address) = location.device_address() else {
            return self.release(location);
        };
        let device = &self.devices[self.device_of(digest)];
        // The expired copy is the newest one: it hides the older copies as a
        // tombstone would. Its sequence is only known on the device, so the
        // conservative choice is "now".
        let sequence = self.sequence.load(Ordering::Relaxed);
        let mut tombs = device.tombs.lock();
        if let Some(old) = tombs.insert(*digest, Tomb { address, sequence }) {
            self.release_address(old.address);
        }
    }

    fn used_bytes(&self) -> u64 {
        self.used_bytes.load(Ordering::Relaxed)
    }

    fn device(&self) -> Option<&DeviceEngine> {
        Some(self)
    }

    fn compression(&self) -> Option<&CompressionSetting> {
        Some(&self.compression)
    }

    fn compression_stats(&self) -> Option<&CompressionStats> {
        Some(&self.compression_stats)
    }
}

#[cfg(test)]
mod checkpoint_tests;
#[cfg(test)]
mod compress_tests;
#[cfg(test)]
mod fault_tests;
#[cfg(test)]
mod shadow_tests;
#[cfg(test)]
mod tests;
