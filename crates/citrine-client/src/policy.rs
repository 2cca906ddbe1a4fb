//! Command policies: timeouts, retries, replica choice, and the write
//! options that map onto AS_MSG header bits (02 §6).
//!
//! Invariant: policies are plain data; nothing here does I/O. Defaults follow
//! the official clients (total 1 s, socket 30 s capped by total, 2 retries
//! for reads and 0 for writes would be the C defaults; Citrine retries writes
//! too by default because the typical failure it sees is a refused
//! connection, where nothing was sent — see [`Policy::max_retries`]).

use std::time::Duration;

/// Which replica a read goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Replica {
    /// Always the master.
    #[default]
    Master,
    /// Master first, then replica 1, 2, ... on each retry.
    Sequence,
    /// Round-robin over master and replicas for successive commands.
    Any,
    /// A replica (or master) on the client's rack first (`ClientConfig::rack_id`),
    /// then the sequence order.
    PreferRack,
}

/// Settings shared by every command.
#[derive(Clone, Debug)]
pub struct Policy {
    /// Deadline of the whole command including retries; zero = none.
    pub total_timeout: Duration,
    /// Deadline of one attempt (connect + send + receive); zero = none.
    pub socket_timeout: Duration,
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// First backoff between attempts; doubles each time up to `max_backoff`.
    pub backoff: Duration,
    /// Ceiling of the backoff.
    pub max_backoff: Duration,
    /// Where reads go. Writes always go to the master.
    pub replica: Replica,
    /// Send the user key with the command (field 2) so the server stores it.
    pub send_key: bool,
    /// A filter expression (field 43): its msgpack bytes as protocol 05 §4
    /// lays them out. A record it does not decide true is left alone and
    /// the command fails with FILTERED_OUT (27).
    pub filter: Option<std::sync::Arc<[u8]>>,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            total_timeout: Duration::from_millis(1000),
            socket_timeout: Duration::from_millis(30_000),
            max_retries: 2,
            backoff: Duration::from_millis(5),
            max_backoff: Duration::from_millis(250),
            replica: Replica::Master,
            send_key: false,
            filter: None,
        }
    }
}

impl Policy {
    /// The server-side timeout placed in `transaction_ttl` (ms): the socket
    /// timeout capped by the total timeout, 0 when neither is set.
    pub fn server_timeout_ms(&self) -> u32 {
        let chosen = match (self.socket_timeout.is_zero(), self.total_timeout.is_zero()) {
            (true, true) => Duration::ZERO,
            (false, true) => self.socket_timeout,
            (true, false) => self.total_timeout,
            (false, false) => self.socket_timeout.min(self.total_timeout),
        };
        u32::try_from(chosen.as_millis()).unwrap_or(u32::MAX)
    }

    /// The total deadline of a command started at `start` (`None` without
    /// a total timeout).
    pub fn total_deadline(&self, start: std::time::Instant) -> Option<std::time::Instant> {
        (!self.total_timeout.is_zero()).then(|| start + self.total_timeout)
    }

    /// The deadline of one attempt (or one read of a stream) starting now:
    /// the socket timeout, capped by the total deadline.
    pub fn socket_deadline(&self, total: Option<std::time::Instant>) -> Option<std::time::Instant> {
        match (self.socket_timeout.is_zero(), total) {
            (true, total) => total,
            (false, None) => Some(std::time::Instant::now() + self.socket_timeout),
            (false, Some(total)) => {
                Some((std::time::Instant::now() + self.socket_timeout).min(total))
            }
        }
    }

    /// The backoff before retry number `retry` (1-based), with up to 50 %
    /// jitter taken from `jitter` (any 64-bit random value).
    pub fn backoff_for(&self, retry: u32, jitter: u64) -> Duration {
        let shift = retry.saturating_sub(1).min(16);
        let base = self
            .backoff
            .saturating_mul(1u32 << shift)
            .min(self.max_backoff);
        let base_us = u64::try_from(base.as_micros()).unwrap_or(u64::MAX);
        if base_us == 0 {
            return Duration::ZERO;
        }
        let jitter_us = jitter % (base_us / 2 + 1);
        Duration::from_micros(base_us / 2 + jitter_us)
    }
}

/// Expiration of a written record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Expiration {
    /// The namespace (or set) default TTL.
    #[default]
    NamespaceDefault,
    /// Never expire.
    Never,
    /// Keep the record's current TTL.
    DontUpdate,
    /// Expire after this many seconds.
    Seconds(u32),
}

impl Expiration {
    /// Value of the `record_ttl` header field.
    pub fn wire(self) -> u32 {
        match self {
            Expiration::NamespaceDefault => 0,
            Expiration::Never => u32::MAX,
            Expiration::DontUpdate => u32::MAX - 1,
            Expiration::Seconds(seconds) => seconds,
        }
    }
}

/// Generation check of a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GenerationPolicy {
    #[default]
    None,
    /// Apply only if the record's generation equals this.
    ExpectEqual(u32),
    /// Apply only if this is greater than the record's generation.
    ExpectGreater(u32),
}

/// What a write does depending on whether the record exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RecordExistsAction {
    /// Create or merge bins (default).
    #[default]
    Update,
    /// Record must exist; bins merged.
    UpdateOnly,
    /// Create, or replace every bin of an existing record.
    Replace,
    /// Record must exist; all bins replaced.
    ReplaceOnly,
    /// Record must not exist.
    CreateOnly,
}

/// How a read of a strong-consistency namespace is served (the official
/// clients' `ReadModeSC`; ignored by AP namespaces).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ReadModeSc {
    /// Never older than this client's own earlier reads and writes.
    #[default]
    Session,
    /// Linearizable: the master confirms its regime with the replicas.
    Linearize,
    /// A replica may answer.
    AllowReplica,
    /// An unavailable partition's copy may answer.
    AllowUnavailable,
}

impl ReadModeSc {
    /// The request's `info3` bits for this mode.
    pub fn info3_bits(self) -> u8 {
        use citrine_wire::msg::info3;
        match self {
            ReadModeSc::Session => 0,
            ReadModeSc::Linearize => info3::SC_READ_TYPE,
            ReadModeSc::AllowReplica => info3::SC_READ_RELAX,
            ReadModeSc::AllowUnavailable => info3::SC_READ_TYPE | info3::SC_READ_RELAX,
        }
    }
}

/// Policy of reads.
#[derive(Clone, Debug, Default)]
pub struct ReadPolicy {
    pub base: Policy,
    /// Strong-consistency namespaces: the read mode.
    pub read_mode_sc: ReadModeSc,
}

/// Policy of writes (put, delete, touch, operate with writes).
#[derive(Clone, Debug, Default)]
pub struct WritePolicy {
    pub base: Policy,
    pub expiration: Expiration,
    pub generation: GenerationPolicy,
    pub record_exists: RecordExistsAction,
    /// Leave a tombstone on delete (Enterprise servers; CE answers 25).
    pub durable_delete: bool,
    /// Commit on the master only instead of all replicas.
    pub commit_master: bool,
}

impl WritePolicy {
    /// Header bits (info2, info3) and the generation value for this policy.
    pub fn header_bits(&self) -> (u8, u8, u32) {
        use citrine_wire::msg::{info2, info3};
        let mut bits2 = info2::WRITE;
        let mut bits3 = 0;
        let mut generation = 0;
        match self.generation {
            GenerationPolicy::None => {}
            GenerationPolicy::ExpectEqual(value) => {
                bits2 |= info2::GENERATION;
                generation = value;
            }
            GenerationPolicy::ExpectGreater(value) => {
                bits2 |= info2::GENERATION_GT;
                generation = value;
            }
        }
        match self.record_exists {
            RecordExistsAction::Update => {}
            RecordExistsAction::UpdateOnly => bits3 |= info3::UPDATE_ONLY,
            RecordExistsAction::Replace => bits3 |= info3::CREATE_OR_REPLACE,
            RecordExistsAction::ReplaceOnly => bits3 |= info3::REPLACE_ONLY,
            RecordExistsAction::CreateOnly => bits2 |= info2::CREATE_ONLY,
        }
        if self.durable_delete {
            bits2 |= info2::DURABLE_DELETE;
        }
        if self.commit_master {
            bits3 |= info3::COMMIT_MASTER;
        }
        (bits2, bits3, generation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_timeout() {
        let mut policy = Policy::default();
        assert_eq!(policy.server_timeout_ms(), 1000);
        policy.total_timeout = Duration::ZERO;
        assert_eq!(policy.server_timeout_ms(), 30_000);
        policy.socket_timeout = Duration::ZERO;
        assert_eq!(policy.server_timeout_ms(), 0);
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let policy = Policy {
            backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(40),
            ..Policy::default()
        };
        assert_eq!(policy.backoff_for(1, 0), Duration::from_millis(5));
        assert!(policy.backoff_for(1, u64::MAX) <= Duration::from_millis(10));
        assert_eq!(policy.backoff_for(2, 0), Duration::from_millis(10));
        assert_eq!(policy.backoff_for(3, 0), Duration::from_millis(20));
        assert_eq!(policy.backoff_for(30, 0), Duration::from_millis(20));
        for jitter in [1, 77, 12345, u64::MAX] {
            let wait = policy.backoff_for(30, jitter);
            assert!(
                wait >= Duration::from_millis(20) && wait <= Duration::from_millis(40),
                "{wait:?}"
            );
        }
        let zero = Policy {
            backoff: Duration::ZERO,
            ..Policy::default()
        };
        assert_eq!(zero.backoff_for(3, 5), Duration::ZERO);
    }

    /// The official clients' `ReadModeSC` bits: linearize sets
    /// `SC_READ_TYPE`, allow-replica `SC_READ_RELAX`, allow-unavailable
    /// both; a read policy's default is session (none).
    #[test]
    fn sc_read_mode_bits() {
        use citrine_wire::msg::info3;
        assert_eq!(ReadPolicy::default().read_mode_sc.info3_bits(), 0);
        assert_eq!(ReadModeSc::Linearize.info3_bits(), info3::SC_READ_TYPE);
        assert_eq!(ReadModeSc::AllowReplica.info3_bits(), info3::SC_READ_RELAX);
        assert_eq!(
            ReadModeSc::AllowUnavailable.info3_bits(),
            info3::SC_READ_TYPE | info3::SC_READ_RELAX
        );
    }

    #[test]
    fn write_bits() {
        use citrine_wire::msg::{info2, info3};
        let mut policy = WritePolicy::default();
        assert_eq!(policy.header_bits(), (info2::WRITE, 0, 0));
        policy.generation = GenerationPolicy::ExpectEqual(7);
        policy.record_exists = RecordExistsAction::CreateOnly;
        assert_eq!(
            policy.header_bits(),
            (info2::WRITE | info2::GENERATION | info2::CREATE_ONLY, 0, 7)
        );
        policy.generation = GenerationPolicy::ExpectGreater(9);
        policy.record_exists = RecordExistsAction::ReplaceOnly;
        assert_eq!(
            policy.header_bits(),
            (info2::WRITE | info2::GENERATION_GT, info3::REPLACE_ONLY, 9)
        );
        assert_eq!(Expiration::Never.wire(), 0xFFFF_FFFF);
        assert_eq!(Expiration::DontUpdate.wire(), 0xFFFF_FFFE);
    }
}
