//! A namespace's validated configuration. Parsing (TOML, flags) is the
//! server binary's job; these structs only hold values already checked.

pub use citrine_storage::compress::{Algorithm as CompressionAlgorithm, Compression};
pub use citrine_storage::device::{
    DeviceConfig, IoMode, POST_WRITE_QUEUE_DEFAULT_BYTES, WRITE_BLOCK_MAX,
};
pub use citrine_storage::thresholds::{
    Thresholds, EVICT_HIST_BUCKETS_DEFAULT, EVICT_HIST_BUCKETS_RANGE, EVICT_TENTHS_PCT_DEFAULT,
};

/// Most devices one namespace may stripe over.
pub const DEVICES_MAX: usize = citrine_storage::DeviceAddress::MAX_DEVICES;

/// Storage engine of a namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageEngineConfig {
    /// Records in process memory.
    Memory {
        /// Memory budget for index and data, in bytes.
        data_size: u64,
        /// Evict soonest-expiring records above this percentage of the budget (0 = never).
        evict_used_pct: u8,
        /// Refuse writes (result 8) above this percentage of the budget.
        stop_writes_used_pct: u8,
    },
    /// Records in log-structured write blocks on files or raw devices,
    /// the index in memory.
    Device {
        /// The engine's settings (device paths already resolved).
        engine: citrine_storage::device::DeviceConfig,
        /// Most milliseconds a written record waits in a write buffer
        /// before the flusher writes it out (the loss window without
        /// commit-to-device).
        flush_max_ms: u32,
        /// Where a clean shutdown saves the index for a fast restart
        /// (`None`: always cold start).
        index_image: Option<std::path::PathBuf>,
    },
}

/// Which of two copies of a record wins when a replica write, a migrated
/// record or a duplicate-resolution answer meets the local copy (Aerospike's
/// `conflict-resolution-policy`). Decided by
/// [`crate::namespace::compare_versions`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConflictResolutionPolicy {
    /// The higher generation wins (wrapping: generations count 1..=65535
    /// and start again at 1); on a tie the later last-update time.
    #[default]
    Generation,
    /// The later last-update time wins; on a tie the higher generation.
    LastUpdateTime,
}

impl ConflictResolutionPolicy {
    /// Every policy, in the order the config option lists them.
    pub const ALL: [ConflictResolutionPolicy; 2] = [
        ConflictResolutionPolicy::Generation,
        ConflictResolutionPolicy::LastUpdateTime,
    ];

    /// The option's value: `generation` or `last-update-time`.
    pub fn name(self) -> &'static str {
        match self {
            ConflictResolutionPolicy::Generation => "generation",
            ConflictResolutionPolicy::LastUpdateTime => "last-update-time",
        }
    }

    /// The policy named `name` (as [`Self::name`] spells it).
    pub fn from_name(name: &str) -> Option<ConflictResolutionPolicy> {
        Self::ALL.into_iter().find(|policy| policy.name() == name)
    }
}

/// One namespace's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceConfig {
    pub name: String,
    pub replication_factor: u8,
    /// TTL (seconds) applied when a write asks for the default (0 = never expire).
    pub default_ttl: u32,
    /// Seconds between expiry/eviction passes (0 = no passes).
    pub nsup_period: u32,
    /// Allow TTLs even when `nsup_period` is 0.
    pub allow_ttl_without_nsup: bool,
    /// Largest stored record body, in bytes.
    pub max_record_size: u32,
    /// Which copy of a record wins when two meet.
    pub conflict_resolution_policy: ConflictResolutionPolicy,
    /// Seconds a deleted record's tombstone is kept (older ones are purged
    /// by nsup passes).
    pub tomb_raider_eligible_age: u32,
    /// `evict-tenths-pct`: one eviction pass removes at most this many
    /// tenths of a percent of the records (default 5: 0.5 %).
    pub evict_tenths_pct: u32,
    /// `evict-hist-buckets`: buckets of an eviction pass's void-time
    /// histogram (100 to 10 000 000, default 10 000).
    pub evict_hist_buckets: u32,
    pub storage_engine: StorageEngineConfig,
    /// Strong consistency (`strong-consistency` and its options).
    pub sc: ScConfig,
    /// Transactions: `mrt-duration`, `disable-mrt-writes`.
    pub mrt: MrtConfig,
    /// Citrine's own `prefer-minimal-migration` (AP namespaces, off by
    /// default): the partition map is the stable placement the view's
    /// principal decides from the previous one, so a join or a leave moves
    /// close to the minimum (docs/partition-balance.md). Takes effect only
    /// when every member of a view has it on.
    pub prefer_minimal_migration: bool,
}

/// A namespace's strong-consistency options, with the reference's names:
/// `strong-consistency`, `strong-consistency-allow-expunge`, `auto-revive`
/// and `active-rack` (0: none). Off by default (an AP namespace).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScConfig {
    pub strong_consistency: bool,
    pub allow_expunge: bool,
    pub auto_revive: bool,
    pub active_rack: u32,
    /// Citrine's own (`strong-consistency-serve-data`, on by default):
    /// whether the SC data path serves data requests on the available
    /// partitions. Off, every data request on the namespace answers 11 —
    /// an operator's switch to close an SC namespace to clients while its
    /// roster and regimes keep working.
    pub serve_data: bool,
}

impl Default for ScConfig {
    fn default() -> ScConfig {
        ScConfig {
            strong_consistency: false,
            allow_expunge: false,
            auto_revive: false,
            active_rack: 0,
            serve_data: true,
        }
    }
}

/// A namespace's transaction settings: `mrt-duration` (seconds, 1-120,
/// default 10: a transaction's deadline when its client sets no timeout)
/// and `disable-mrt-writes` (refuse transactions' writes). Meaningful on
/// strong-consistency namespaces only, as the reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MrtConfig {
    pub duration_seconds: u32,
    pub writes_disabled: bool,
}

impl Default for MrtConfig {
    fn default() -> MrtConfig {
        MrtConfig {
            duration_seconds: crate::txn::DURATION_DEFAULT,
            writes_disabled: false,
        }
    }
}

/// Default `tomb-raider-eligible-age`: one day, as Aerospike.
pub const TOMB_RAIDER_ELIGIBLE_AGE_DEFAULT: u32 = 86_400;

impl NamespaceConfig {
    /// The embedded default for a namespace named `name`: in memory, 1 GiB
    /// budget, replication factor 2, never-expire default TTL.
    pub fn in_memory(name: &str) -> NamespaceConfig {
        NamespaceConfig {
            name: name.to_owned(),
            replication_factor: 2,
            default_ttl: 0,
            nsup_period: 120,
            allow_ttl_without_nsup: false,
            max_record_size: 1024 * 1024,
            conflict_resolution_policy: ConflictResolutionPolicy::Generation,
            tomb_raider_eligible_age: TOMB_RAIDER_ELIGIBLE_AGE_DEFAULT,
            evict_tenths_pct: EVICT_TENTHS_PCT_DEFAULT,
            evict_hist_buckets: EVICT_HIST_BUCKETS_DEFAULT,
            storage_engine: StorageEngineConfig::Memory {
                data_size: 1 << 30,
                evict_used_pct: 0,
                stop_writes_used_pct: 90,
            },
            sc: ScConfig::default(),
            mrt: MrtConfig::default(),
            prefer_minimal_migration: false,
        }
    }
}
