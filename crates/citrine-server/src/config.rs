//! Configuration: the TOML file (`--config`), the command-line flags that
//! override it, and the embedded default used when neither is given.
//!
//! Option names follow Aerospike's where they exist (`cluster-name`,
//! `replication-factor`, `default-ttl`, `nsup-period`, `max-record-size`,
//! `conflict-resolution-policy`, `tomb-raider-eligible-age`, `evict-tenths-pct`, `evict-hist-buckets`, `storage-engine`, `data-size`, `evict-used-pct`, `stop-writes-used-pct`, `stop-writes-avail-pct`,
//! `strong-consistency`, `strong-consistency-allow-expunge`, `auto-revive`, `active-rack`).
//! An unknown option, a wrong type or an impossible value stops the start
//! with a message naming the option and where it was given (file and line,
//! or the flag).

use citrine_service::config::{
    ConflictResolutionPolicy, MrtConfig, NamespaceConfig, ScConfig, ServiceConfig,
    StorageEngineConfig,
};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The whole file.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    #[serde(default)]
    pub service: ServiceSection,
    #[serde(default)]
    pub logging: LoggingSection,
    /// Present: access control is on (as the reference's `security` context).
    pub security: Option<SecuritySection>,
    #[serde(default)]
    pub heartbeat: HeartbeatSection,
    #[serde(default)]
    pub fabric: FabricSection,
    #[serde(default)]
    pub http: HttpSection,
    #[serde(default, rename = "namespace")]
    pub namespaces: Vec<NamespaceSection>,
    /// `[xdr]`: read by [`crate::xdr::config`].
    #[serde(default)]
    pub xdr: Option<toml::Table>,
    /// `[[tls]]`: named TLS configurations (the reference's `tls <name>`).
    #[serde(default)]
    pub tls: Vec<crate::tls_config::TlsSection>,
}

/// `[service]`.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ServiceSection {
    pub address: Option<String>,
    pub port: Option<u16>,
    pub access_address: Option<String>,
    pub cluster_name: Option<String>,
    pub node_id: Option<String>,
    pub work_directory: Option<PathBuf>,
    pub proto_fd_max: Option<u32>,
    /// Milliseconds a client connection may stay idle (nothing received,
    /// nothing sent) before it is closed; 0 (the default): never between
    /// requests, a minute inside a frame.
    pub proto_fd_idle_ms: Option<u32>,
    pub service_threads: Option<u16>,
    /// Share of one core (percent, 1 to 100, default 85) above which a
    /// service thread hands connections to a less loaded one.
    pub service_thread_spill_pct: Option<u32>,
    /// Share of the time (percent, 1 to 100, default 10) a service thread
    /// may wait for a CPU and still spill: one that waits more finds the
    /// CPUs taken, so it keeps its connections (and merges with any thread
    /// it fits in one core with). 100: waits are ignored.
    pub service_thread_contended_pct: Option<u32>,
    /// How service threads do socket I/O: "auto" (default: io_uring
    /// where the kernel allows it, else epoll), "io_uring" or "epoll".
    pub service_io: Option<String>,
    pub rack_id: Option<u32>,
    /// Most partitions this node migrates at once (default 4, 1 to 64).
    pub migrate_max_partitions: Option<u32>,
    /// Microseconds a migration pauses after each acknowledged batch
    /// (default 0, at most 1000000).
    pub migrate_sleep: Option<u32>,
    /// Most records this node migrates per second (default 0: no limit).
    pub migrate_max_records_per_sec: Option<u64>,
    /// Seconds between the intervals `latencies:` reports (default 10).
    pub ticker_interval: Option<u32>,
    /// Latency histograms count microseconds, not milliseconds (default
    /// false).
    pub microsecond_histograms: Option<bool>,
    /// The TLS service port (none: no TLS listener).
    pub tls_port: Option<u16>,
    /// The `[[tls]]` configuration the TLS port uses (the name clients
    /// verify the certificate against).
    pub tls_name: Option<String>,
    /// "false" (default), "any", or the names a client certificate must
    /// carry (space-separated).
    pub tls_authenticate_client: Option<String>,
}

/// `[http]`: the HTTP endpoint (`/metrics`, Prometheus's text format).
/// Off unless `port` is given.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct HttpSection {
    /// Listen address (default: the service address).
    pub address: Option<String>,
    /// Listen port (the Prometheus exporter's is 9145); none: no endpoint.
    pub port: Option<u16>,
}

/// `[heartbeat]`: mesh heartbeats between the nodes of a cluster.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct HeartbeatSection {
    /// Listen address (default: the service address).
    pub address: Option<String>,
    /// Listen port (default: service port + 2, i.e. 3002).
    pub port: Option<u16>,
    /// Other nodes' heartbeat addresses, `host:port` (Aerospike's mesh-seed-address-port).
    #[serde(default)]
    pub seeds: Vec<String>,
    /// Milliseconds between heartbeats (default 150).
    pub interval: Option<u64>,
    /// Intervals without a heartbeat before a node is gone (default 10).
    pub timeout: Option<u64>,
    /// TLS heartbeat port: with it, heartbeats go over TLS only and the
    /// plain port is opened only when given explicitly.
    pub tls_port: Option<u16>,
    /// The `[[tls]]` entry of the TLS heartbeat.
    pub tls_name: Option<String>,
    /// Listen address of the TLS port (default: `address`).
    pub tls_address: Option<String>,
    /// Other nodes' TLS heartbeat addresses, `host:port`.
    #[serde(default)]
    pub tls_mesh_seed_address_port: Vec<String>,
}

/// `[fabric]`: the node-to-node data channel.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FabricSection {
    /// Listen address (default: the service address).
    pub address: Option<String>,
    /// Listen port (default: service port + 1, i.e. 3001; with
    /// `tls-port`, none unless given).
    pub port: Option<u16>,
    /// TLS fabric port: nodes that both offer fabric TLS talk over it.
    pub tls_port: Option<u16>,
    /// The `[[tls]]` entry of the TLS fabric.
    pub tls_name: Option<String>,
    /// Listen address of the TLS port (default: `address`).
    pub tls_address: Option<String>,
}

/// `[security]`: its presence turns access control on.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SecuritySection {
    /// Seconds a login's session token is valid (default 86400, 120 to 864000).
    pub session_ttl: Option<u32>,
    /// Enforce roles' read/write quotas (default false).
    pub enable_quotas: Option<bool>,
    /// Milliseconds a client connection may stay open without logging in
    /// (default 10000, 100 to 3600000; Citrine's own).
    pub login_timeout_ms: Option<u64>,
    /// `[security.log]`: the audit trail's file and its reports.
    pub log: Option<AuditSection>,
    /// `[security.syslog]`: audit lines also to syslog (`local` facility).
    pub syslog: Option<AuditSection>,
    /// `[security.ldap]`: external users log in against a directory.
    pub ldap: Option<crate::ldap_config::LdapSection>,
}

/// `[security.log]` / `[security.syslog]`: the reference's `report-*`
/// switches (`report-data-op` entries are `"NS"` or `"NS SET"`), with
/// `file` (log only; relative to the work directory) or `local` (syslog
/// only: the facility local0 to local7).
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct AuditSection {
    pub file: Option<PathBuf>,
    pub local: Option<u8>,
    pub report_authentication: Option<bool>,
    #[serde(default)]
    pub report_data_op: Vec<String>,
    #[serde(default)]
    pub report_data_op_role: Vec<String>,
    #[serde(default)]
    pub report_data_op_user: Vec<String>,
    pub report_sys_admin: Option<bool>,
    pub report_user_admin: Option<bool>,
    pub report_violation: Option<bool>,
}

/// The audit trail the server writes (see [`crate::audit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditConfig {
    pub settings: citrine_service::security::audit::AuditSettings,
    /// The audit log file; `None`: audit lines go to the node's log.
    pub file: Option<PathBuf>,
    /// The syslog facility (local0 to local7), when `[security.syslog]` is given.
    pub syslog_local: Option<u8>,
}

/// `[logging]`.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct LoggingSection {
    pub level: Option<String>,
}

/// `[[namespace]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct NamespaceSection {
    pub name: String,
    pub replication_factor: Option<u8>,
    pub default_ttl: Option<Duration>,
    pub nsup_period: Option<Duration>,
    pub allow_ttl_without_nsup: Option<bool>,
    pub max_record_size: Option<Size>,
    /// `generation` (default) or `last-update-time`.
    pub conflict_resolution_policy: Option<String>,
    /// How long deleted records' tombstones are kept (default 1 day).
    pub tomb_raider_eligible_age: Option<Duration>,
    /// Most records one eviction pass removes, in tenths of a percent
    /// (default 5).
    pub evict_tenths_pct: Option<u32>,
    /// Buckets of an eviction pass's void-time histogram (100 to
    /// 10 000 000, default 10 000).
    pub evict_hist_buckets: Option<u32>,
    pub storage_engine: Option<StorageEngineSection>,
    /// Strong consistency (issue 39): the namespace is kept safe — every
    /// read and write answers 11 until its data paths exist.
    pub strong_consistency: Option<bool>,
    pub strong_consistency_allow_expunge: Option<bool>,
    pub auto_revive: Option<bool>,
    pub active_rack: Option<u32>,
    /// Citrine's own: `false` closes an SC namespace's data path (see
    /// `citrine_data::config::ScConfig::serve_data`; default true).
    pub strong_consistency_serve_data: Option<bool>,
    /// Transactions (issue 40; strong-consistency namespaces only): their
    /// default duration (1 to 120 s, default 10) and whether their
    /// writes are refused.
    pub mrt_duration: Option<Duration>,
    pub disable_mrt_writes: Option<bool>,
    /// Citrine's own: the stable partition placement (issue 45).
    pub prefer_minimal_migration: Option<bool>,
}

/// `[namespace.storage-engine]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", tag = "type")]
pub enum StorageEngineSection {
    #[serde(rename = "memory", rename_all = "kebab-case")]
    Memory {
        data_size: Option<Size>,
        evict_used_pct: Option<u8>,
        stop_writes_used_pct: Option<u8>,
    },
    /// Records on files or raw block devices (log-structured write blocks).
    #[serde(rename = "device", rename_all = "kebab-case")]
    Device {
        /// One file (relative paths: under the work directory).
        file: Option<PathBuf>,
        /// Several files, records striped across them by digest.
        files: Option<Vec<PathBuf>>,
        /// Raw block devices (whole devices; they are formatted).
        devices: Option<Vec<PathBuf>>,
        /// Size of each file (created sparse); default 1G.
        filesize: Option<Size>,
        write_block_size: Option<Size>,
        flush_max_ms: Option<u32>,
        defrag_lwm_pct: Option<u8>,
        /// Writes stop below this share of free write blocks (the
        /// reference's name since 7.0).
        stop_writes_avail_pct: Option<u8>,
        /// The same, by its older name (`min-avail-pct`); not both.
        min_avail_pct: Option<u8>,
        /// Writes stop at this share of live bytes (default 70).
        stop_writes_used_pct: Option<u8>,
        /// nsup evicts above this share of live bytes (default 0: never).
        evict_used_pct: Option<u8>,
        commit_to_device: Option<bool>,
        /// Sealed write blocks kept in memory per device for reads.
        post_write_queue: Option<u32>,
        /// O_DIRECT instead of the page cache.
        direct_io: Option<bool>,
        /// Save the index at a clean shutdown and reattach it at start;
        /// also keep the index checkpoint for a restart after a crash.
        fast_restart: Option<bool>,
        /// Seconds after which an index checkpoint is written even if few
        /// blocks were sealed since the last one (0: none; default 60).
        index_checkpoint_period: Option<u32>,
        /// Storage compression: `none` (default), `lz4` or `zstd`.
        compression: Option<String>,
        /// zstd level, 1 to 9 (0 or absent: zstd's default).
        compression_level: Option<u8>,
    },
}

/// A byte size: an integer, or a string with a K, M, G or T suffix (powers of 1024).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(try_from = "SizeOrText")]
pub struct Size(pub u64);

/// A duration in seconds: an integer, or a string with s, m, h or d suffix.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(try_from = "SizeOrText")]
pub struct Duration(pub u64);

#[derive(Deserialize)]
#[serde(untagged)]
enum SizeOrText {
    Number(i64),
    Text(String),
}

fn parse_suffixed(input: SizeOrText, units: &[(char, u64)], what: &str) -> Result<u64, String> {
    match input {
        SizeOrText::Number(value) => {
            u64::try_from(value).map_err(|_| format!("{what} must not be negative, got {value}"))
        }
        SizeOrText::Text(text) => {
            let trimmed = text.trim();
            let (digits, multiplier) = match trimmed.chars().last() {
                Some(last) if last.is_ascii_alphabetic() => {
                    let unit = units
                        .iter()
                        .find(|(suffix, _)| suffix.eq_ignore_ascii_case(&last))
                        .map(|(_, factor)| *factor);
                    match unit {
                        Some(factor) => (&trimmed[..trimmed.len() - 1], factor),
                        None => {
                            return Err(format!(
                                "{what} {text:?} has an unknown unit (use one of {})",
                                units
                                    .iter()
                                    .map(|(s, _)| s.to_string())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ))
                        }
                    }
                }
                _ => (trimmed, 1),
            };
            let number: u64 = digits
                .trim()
                .parse()
                .map_err(|_| format!("{what} {text:?} is not a number with an optional unit"))?;
            number
                .checked_mul(multiplier)
                .ok_or_else(|| format!("{what} {text:?} is too large"))
        }
    }
}

impl TryFrom<SizeOrText> for Size {
    type Error = String;
    fn try_from(input: SizeOrText) -> Result<Size, String> {
        parse_suffixed(
            input,
            &[
                ('K', 1 << 10),
                ('M', 1 << 20),
                ('G', 1 << 30),
                ('T', 1 << 40),
            ],
            "size",
        )
        .map(Size)
    }
}

impl TryFrom<SizeOrText> for Duration {
    type Error = String;
    fn try_from(input: SizeOrText) -> Result<Duration, String> {
        parse_suffixed(
            input,
            &[('S', 1), ('M', 60), ('H', 3600), ('D', 86_400)],
            "duration",
        )
        .map(Duration)
    }
}

/// Command-line overrides.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub address: Option<String>,
    pub port: Option<u16>,
    pub data_dir: Option<PathBuf>,
    pub node_id: Option<String>,
    pub cluster_name: Option<String>,
    pub log_level: Option<String>,
    pub heartbeat_port: Option<u16>,
    pub fabric_port: Option<u16>,
    pub seeds: Vec<String>,
    pub rack_id: Option<u32>,
    pub service_io: Option<String>,
    pub tls_port: Option<u16>,
}

/// Where and how this node talks to the other nodes of its cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSettings {
    pub heartbeat_address: String,
    /// The plain heartbeat port (none: heartbeats over TLS only).
    pub heartbeat_port: Option<u16>,
    pub fabric_address: String,
    /// The plain fabric port (none: fabric over TLS only).
    pub fabric_port: Option<u16>,
    /// TLS on the heartbeat channel: every heartbeat connection is TLS.
    pub heartbeat_tls: Option<crate::tls_config::ChannelTls>,
    /// TLS on the fabric channel.
    pub fabric_tls: Option<crate::tls_config::ChannelTls>,
    /// Other nodes' heartbeat endpoints, `host:port` (TLS ones when
    /// `heartbeat_tls` is set).
    pub seeds: Vec<String>,
    pub heartbeat_interval_ms: u64,
    pub heartbeat_timeout_ms: u64,
    pub rack_id: u32,
    /// `service.migrate-max-partitions`.
    pub migrate_max_partitions: u32,
    /// `service.migrate-sleep`, microseconds.
    pub migrate_sleep_us: u32,
    /// `service.migrate-max-records-per-sec`, 0 = no limit.
    pub migrate_max_records_per_sec: u64,
}

/// Everything the server needs to start.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub service: ServiceConfig,
    pub address: String,
    pub port: u16,
    pub work_directory: Option<PathBuf>,
    pub proto_fd_max: u32,
    /// `service.proto-fd-idle-ms`, 0 = never between requests.
    pub proto_fd_idle_ms: u32,
    pub service_threads: usize,
    /// `service.service-thread-spill-pct`.
    pub service_thread_spill_pct: u32,
    /// `service.service-thread-contended-pct`.
    pub service_thread_contended_pct: u32,
    /// `service.service-io`.
    pub service_io: ServiceIo,
    pub log_level: String,
    pub cluster: ClusterSettings,
    pub monitoring: Monitoring,
    /// `[xdr]`: the destinations, by name.
    pub xdr: std::collections::BTreeMap<String, citrine_xdr::DcConfig>,
    /// `[security]`: access control on; `None`: off.
    pub security: Option<citrine_security::SecurityConfig>,
    /// `[security.log]` / `[security.syslog]`: the audit trail.
    pub audit: Option<AuditConfig>,
    /// `[security.ldap]`: LDAP logins.
    pub ldap: Option<citrine_ldap::LdapConfig>,
    /// The TLS service port's settings; `None`: no TLS listener.
    pub tls: Option<crate::tls_config::TlsSettings>,
}

/// Latency histograms and the HTTP endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Monitoring {
    /// `service.ticker-interval`: seconds between `latencies:` intervals.
    pub ticker_interval_s: u32,
    /// `service.microsecond-histograms`.
    pub microsecond_histograms: bool,
    /// `[http]` address and port of the endpoint; `None`: off.
    pub http: Option<(String, u16)>,
}

/// How service threads do socket I/O (`service.service-io`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceIo {
    /// io_uring where the kernel allows it, else epoll.
    Auto,
    IoUring,
    Epoll,
}

/// A configuration error, already phrased for the operator.
#[derive(Debug)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Reads and parses a config file.
pub fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|error| {
        ConfigError(format!(
            "cannot read config file {}: {error}",
            path.display()
        ))
    })?;
    parse_text(&text, &path.display().to_string())
}

/// Parses config text; `origin` names where it came from in messages.
pub fn parse_text(text: &str, origin: &str) -> Result<FileConfig, ConfigError> {
    toml::from_str(text).map_err(|error| ConfigError(format!("{origin}: {error}")))
}

/// The embedded default: namespaces `test` and `bar`, in memory.
pub fn embedded_default() -> FileConfig {
    let namespace = |name: &str| NamespaceSection {
        name: name.to_owned(),
        replication_factor: None,
        default_ttl: None,
        nsup_period: None,
        allow_ttl_without_nsup: None,
        max_record_size: None,
        conflict_resolution_policy: None,
        tomb_raider_eligible_age: None,
        evict_tenths_pct: None,
        evict_hist_buckets: None,
        storage_engine: None,
        strong_consistency: None,
        strong_consistency_allow_expunge: None,
        auto_revive: None,
        active_rack: None,
        strong_consistency_serve_data: None,
        mrt_duration: None,
        disable_mrt_writes: None,
        prefer_minimal_migration: None,
    };
    FileConfig {
        namespaces: vec![namespace("test"), namespace("bar")],
        ..FileConfig::default()
    }
}

/// Stable default node id: FNV-1a of the host name and the service port, so
/// a restarted node keeps its identity.
fn default_node_id(port: u16) -> u64 {
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_else(|_| "localhost".to_owned());
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in host
        .trim()
        .as_bytes()
        .iter()
        .chain(port.to_be_bytes().iter())
    {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // Keep ids in the same shape as Aerospike's (48-bit MAC + 16-bit port).
    (hash & 0x0000_FFFF_FFFF_FFFF) << 16 | u64::from(port)
}

/// Merges file and flags, validates, and produces the server configuration.
/// Each part is resolved in turn — the service's port, address, cluster
/// name, node id and threads, the namespaces, the log level, the cluster
/// channels — and the first impossible value stops it.
pub fn resolve(
    file: FileConfig,
    origin: &str,
    overrides: &Overrides,
) -> Result<ServerConfig, ConfigError> {
    let service = &file.service;
    let port = resolve_port(service, origin, overrides)?;
    let address = resolve_address(service, origin, overrides)?;
    let cluster_name = resolve_cluster_name(service, origin, overrides)?;
    let node_id = resolve_node_id(service, origin, overrides, port)?;
    let client_address = access_address(service, &address, port);
    let threads = resolve_threads(service, origin, overrides)?;
    let work_directory = overrides
        .data_dir
        .clone()
        .or_else(|| service.work_directory.clone());
    let namespaces = resolve_namespaces(&file, origin, work_directory.as_deref())?;
    let log_level = resolve_log_level(&file, overrides)?;
    let cluster = resolve_cluster(
        &file,
        origin,
        overrides,
        &address,
        port,
        work_directory.as_deref(),
    )?;
    let monitoring = resolve_monitoring(&file, origin, &address, port)?;
    let xdr = crate::xdr::config::resolve(file.xdr.as_ref())
        .map_err(|error| ConfigError(format!("{origin}: [xdr]: {error}")))?;
    let security = resolve_security(&file, origin)?;
    let audit = resolve_audit(&file, origin, work_directory.as_deref())?;
    let ldap = crate::ldap_config::resolve(&file, origin, work_directory.as_deref())?;
    let tls =
        crate::tls_config::resolve(&file, origin, overrides, work_directory.as_deref(), port)?;
    let tls_access_address = tls.as_ref().map_or_else(String::new, |tls| {
        access_address(service, &address, tls.port)
    });
    Ok(ServerConfig {
        service: ServiceConfig {
            node_id,
            rack_id: cluster.rack_id,
            cluster_name,
            access_address: client_address,
            port,
            tls_access_address,
            namespaces,
        },
        address,
        port,
        work_directory,
        proto_fd_max: threads.proto_fd_max,
        proto_fd_idle_ms: threads.proto_fd_idle_ms,
        service_threads: threads.service_threads,
        service_thread_spill_pct: threads.spill_pct,
        service_thread_contended_pct: threads.contended_pct,
        service_io: threads.service_io,
        log_level,
        cluster,
        monitoring,
        xdr,
        security,
        audit,
        ldap,
        tls,
    })
}

/// `[security.log]` and `[security.syslog]`, checked; `None` when neither
/// is given.
fn resolve_audit(
    file: &FileConfig,
    origin: &str,
    work_directory: Option<&Path>,
) -> Result<Option<AuditConfig>, ConfigError> {
    let Some(section) = &file.security else {
        return Ok(None);
    };
    if section.log.is_none() && section.syslog.is_none() {
        return Ok(None);
    }
    let empty = AuditSection::default();
    let log = section.log.as_ref().unwrap_or(&empty);
    let syslog = section.syslog.as_ref().unwrap_or(&empty);
    if log.local.is_some() {
        return Err(ConfigError(format!(
            "{origin}: security.log.local: only [security.syslog] has a facility"
        )));
    }
    if syslog.file.is_some() {
        return Err(ConfigError(format!(
            "{origin}: security.syslog.file: only [security.log] has a file"
        )));
    }
    let local = syslog.local.unwrap_or(0);
    if local > 7 {
        return Err(ConfigError(format!(
            "{origin}: security.syslog.local = {local} is impossible (0 to 7: local0 to local7)"
        )));
    }
    let path = log.file.as_ref().map(|path| match work_directory {
        Some(directory) if path.is_relative() => directory.join(path),
        _ => path.clone(),
    });
    Ok(Some(AuditConfig {
        settings: citrine_service::security::audit::AuditSettings {
            log: audit_reports(log, origin, "log")?,
            syslog: audit_reports(syslog, origin, "syslog")?,
        },
        file: path,
        syslog_local: section.syslog.as_ref().map(|_| local),
    }))
}

fn audit_reports(
    section: &AuditSection,
    origin: &str,
    sink: &str,
) -> Result<citrine_service::security::audit::Reports, ConfigError> {
    let mut data_op = Vec::new();
    for entry in &section.report_data_op {
        let words: Vec<&str> = entry.split_whitespace().collect();
        match words[..] {
            [ns] => data_op.push((ns.to_owned(), None)),
            [ns, set] => data_op.push((ns.to_owned(), Some(set.to_owned()))),
            _ => {
                return Err(ConfigError(format!(
                    "{origin}: security.{sink}.report-data-op = {entry:?}: \"NAMESPACE\" or \"NAMESPACE SET\""
                )))
            }
        }
    }
    Ok(citrine_service::security::audit::Reports {
        authentication: section.report_authentication.unwrap_or(false),
        data_op,
        data_op_role: section.report_data_op_role.clone(),
        data_op_user: section.report_data_op_user.clone(),
        sys_admin: section.report_sys_admin.unwrap_or(false),
        user_admin: section.report_user_admin.unwrap_or(false),
        violation: section.report_violation.unwrap_or(false),
    })
}

/// The `[security]` section, checked; `None` when absent (security off).
fn resolve_security(
    file: &FileConfig,
    origin: &str,
) -> Result<Option<citrine_security::SecurityConfig>, ConfigError> {
    let Some(section) = &file.security else {
        return Ok(None);
    };
    let defaults = citrine_security::SecurityConfig::default();
    let session_ttl_s = section.session_ttl.unwrap_or(defaults.session_ttl_s);
    if !(120..=864_000).contains(&session_ttl_s) {
        return Err(ConfigError(format!(
            "{origin}: security.session-ttl = {session_ttl_s} is impossible (120 to 864000 seconds)"
        )));
    }
    let login_timeout_ms = section
        .login_timeout_ms
        .unwrap_or(defaults.login_timeout_ms);
    if !(100..=3_600_000).contains(&login_timeout_ms) {
        return Err(ConfigError(format!(
            "{origin}: security.login-timeout-ms = {login_timeout_ms} is impossible (100 to 3600000)"
        )));
    }
    Ok(Some(citrine_security::SecurityConfig {
        session_ttl_s,
        enable_quotas: section.enable_quotas.unwrap_or(false),
        login_timeout_ms,
        ..defaults
    }))
}

/// The service port (default 3000); 0 is refused.
fn resolve_port(
    service: &ServiceSection,
    origin: &str,
    overrides: &Overrides,
) -> Result<u16, ConfigError> {
    let port = overrides.port.or(service.port).unwrap_or(3000);
    if port == 0 {
        let place = if overrides.port.is_some() {
            "--port".to_owned()
        } else {
            format!("{origin}: service.port")
        };
        return Err(ConfigError(format!(
            "{place} = 0 is impossible: the service needs a fixed port (1-65535)"
        )));
    }
    Ok(port)
}

/// The service's listen address (default 127.0.0.1): an IP address or
/// `localhost`.
fn resolve_address(
    service: &ServiceSection,
    origin: &str,
    overrides: &Overrides,
) -> Result<String, ConfigError> {
    let address = overrides
        .address
        .clone()
        .or_else(|| service.address.clone())
        .unwrap_or_else(|| "127.0.0.1".to_owned());
    if address.parse::<std::net::IpAddr>().is_err() && address != "localhost" {
        let place = if overrides.address.is_some() {
            "--address".to_owned()
        } else {
            format!("{origin}: service.address")
        };
        return Err(ConfigError(format!(
            "{place} = {address:?} is not an IP address"
        )));
    }
    Ok(address)
}

/// The cluster name (default `citrine`), 1 to 63 bytes.
fn resolve_cluster_name(
    service: &ServiceSection,
    origin: &str,
    overrides: &Overrides,
) -> Result<String, ConfigError> {
    let cluster_name = overrides
        .cluster_name
        .clone()
        .or_else(|| service.cluster_name.clone())
        .unwrap_or_else(|| "citrine".to_owned());
    if cluster_name.is_empty() || cluster_name.len() > 63 {
        return Err(ConfigError(format!(
            "{origin}: service.cluster-name must be 1 to 63 bytes, got {:?}",
            cluster_name
        )));
    }
    Ok(cluster_name)
}

/// The node id: the flag's or the file's (non-zero hexadecimal), else
/// derived from the host name and `port` ([`default_node_id`]).
fn resolve_node_id(
    service: &ServiceSection,
    origin: &str,
    overrides: &Overrides,
    port: u16,
) -> Result<u64, ConfigError> {
    let given = overrides
        .node_id
        .as_ref()
        .map(|text| ("--node-id".to_owned(), text))
        .or_else(|| {
            service
                .node_id
                .as_ref()
                .map(|text| (format!("{origin}: service.node-id"), text))
        });
    match given {
        Some((place, text)) => match u64::from_str_radix(text, 16) {
            Ok(0) | Err(_) => Err(ConfigError(format!(
                "{place} = {text:?} must be a non-zero hexadecimal number"
            ))),
            Ok(id) => Ok(id),
        },
        None => Ok(default_node_id(port)),
    }
}

/// Where clients reach this node (`host:port`): `service.access-address`,
/// else the listen address (127.0.0.1 for a wildcard one).
fn access_address(service: &ServiceSection, address: &str, port: u16) -> String {
    let access_host = match service.access_address.clone() {
        Some(host) => host,
        None if address == "0.0.0.0" || address == "::" => "127.0.0.1".to_owned(),
        None => address.to_owned(),
    };
    if access_host.contains(':') {
        format!("[{access_host}]:{port}")
    } else {
        format!("{access_host}:{port}")
    }
}

/// The client connections and service threads' settings.
struct ThreadSettings {
    proto_fd_max: u32,
    proto_fd_idle_ms: u32,
    service_threads: usize,
    spill_pct: u32,
    contended_pct: u32,
    service_io: ServiceIo,
}

/// `proto-fd-max`, `proto-fd-idle-ms`, `service-threads` (0 or none: one per core), the
/// spill and contention thresholds (percent, 1 to 100) and `service-io`.
fn resolve_threads(
    service: &ServiceSection,
    origin: &str,
    overrides: &Overrides,
) -> Result<ThreadSettings, ConfigError> {
    let proto_fd_max = service
        .proto_fd_max
        .unwrap_or(citrine_service::client_limits::PROTO_FD_MAX_DEFAULT);
    let proto_fd_idle_ms = service
        .proto_fd_idle_ms
        .unwrap_or(citrine_service::client_limits::PROTO_FD_IDLE_MS_DEFAULT);
    if proto_fd_max == 0 {
        return Err(ConfigError(format!(
            "{origin}: service.proto-fd-max = 0 is impossible: no client could connect"
        )));
    }
    let service_threads = match service.service_threads {
        Some(0) | None => std::thread::available_parallelism()
            .map(|count| count.get())
            .unwrap_or(1),
        Some(count) => usize::from(count),
    };
    let spill_pct = service.service_thread_spill_pct.unwrap_or(85);
    if !(1..=100).contains(&spill_pct) {
        return Err(ConfigError(format!(
            "{origin}: service.service-thread-spill-pct = {spill_pct} is out of range: use 1 to 100 (percent of one core)"
        )));
    }
    let contended_pct = service.service_thread_contended_pct.unwrap_or(10);
    if !(1..=100).contains(&contended_pct) {
        return Err(ConfigError(format!(
            "{origin}: service.service-thread-contended-pct = {contended_pct} is out of range: use 1 to 100 (percent of the time waiting for a CPU; 100 ignores waits)"
        )));
    }
    let service_io = match overrides
        .service_io
        .as_deref()
        .or(service.service_io.as_deref())
    {
        None | Some("auto") => ServiceIo::Auto,
        Some("io_uring") => ServiceIo::IoUring,
        Some("epoll") => ServiceIo::Epoll,
        Some(other) => {
            return Err(ConfigError(format!(
                "{origin}: service.service-io = {other:?} is not one of \"auto\", \"io_uring\", \"epoll\""
            )))
        }
    };
    Ok(ThreadSettings {
        proto_fd_max,
        proto_fd_idle_ms,
        service_threads,
        spill_pct,
        contended_pct,
        service_io,
    })
}

/// Every `[[namespace]]` (at least one, names unique), with device files'
/// relative paths placed under `work_directory`.
fn resolve_namespaces(
    file: &FileConfig,
    origin: &str,
    work_directory: Option<&Path>,
) -> Result<Vec<NamespaceConfig>, ConfigError> {
    if file.namespaces.is_empty() {
        return Err(ConfigError(format!(
            "{origin}: no [[namespace]] defined; a node needs at least one"
        )));
    }
    let mut namespaces = Vec::new();
    for (index, section) in file.namespaces.iter().enumerate() {
        let place = format!(
            "{origin}: namespace {:?} (the [[namespace]] number {})",
            section.name,
            index + 1
        );
        namespaces.push(resolve_namespace(section, &place)?);
        if file.namespaces[..index]
            .iter()
            .any(|other| other.name == section.name)
        {
            return Err(ConfigError(format!("{place}: the name is used twice")));
        }
    }
    for namespace in &mut namespaces {
        place_device_files(namespace, work_directory);
    }
    Ok(namespaces)
}

/// The log level (default `info`).
fn resolve_log_level(file: &FileConfig, overrides: &Overrides) -> Result<String, ConfigError> {
    let log_level = overrides
        .log_level
        .clone()
        .or_else(|| file.logging.level.clone())
        .unwrap_or_else(|| "info".to_owned());
    if !["error", "warn", "info", "debug", "trace"].contains(&log_level.as_str()) {
        return Err(ConfigError(format!(
            "logging.level = {log_level:?} must be one of error, warn, info, debug, trace"
        )));
    }
    Ok(log_level)
}

/// Resolves the latency ticker and the HTTP endpoint's settings.
fn resolve_monitoring(
    file: &FileConfig,
    origin: &str,
    address: &str,
    port: u16,
) -> Result<Monitoring, ConfigError> {
    let ticker_interval_s = file.service.ticker_interval.unwrap_or(10);
    if !(1..=86_400).contains(&ticker_interval_s) {
        return Err(ConfigError(format!(
            "{origin}: service.ticker-interval = {ticker_interval_s} is impossible (1 to 86400 seconds)"
        )));
    }
    let http = match file.http.port {
        None => None,
        Some(0) => {
            return Err(ConfigError(format!(
                "{origin}: http.port = 0 is impossible: give a fixed port (1-65535), or no http.port for no endpoint"
            )))
        }
        Some(http_port) if http_port == port => {
            return Err(ConfigError(format!(
                "{origin}: http.port = {http_port} is the service port; give another"
            )))
        }
        Some(http_port) => {
            let listen = file.http.address.clone().unwrap_or_else(|| address.to_owned());
            if listen.parse::<std::net::IpAddr>().is_err() && listen != "localhost" {
                return Err(ConfigError(format!(
                    "{origin}: http.address = {listen:?} is not an IP address"
                )));
            }
            Some((listen, http_port))
        }
    };
    Ok(Monitoring {
        ticker_interval_s,
        microsecond_histograms: file.service.microsecond_histograms.unwrap_or(false),
        http,
    })
}

/// Resolves the heartbeat and fabric settings: ports, TLS, seeds,
/// heartbeat timing, migration throttles and rack.
fn resolve_cluster(
    file: &FileConfig,
    origin: &str,
    overrides: &Overrides,
    address: &str,
    port: u16,
    work_directory: Option<&Path>,
) -> Result<ClusterSettings, ConfigError> {
    let listen =
        |configured: &Option<String>| configured.clone().unwrap_or_else(|| address.to_owned());
    let heartbeat_address = listen(&file.heartbeat.address);
    let fabric_address = listen(&file.fabric.address);
    let (heartbeat_tls, fabric_tls) = channel_tls(
        file,
        origin,
        &heartbeat_address,
        &fabric_address,
        work_directory,
    )?;
    let (heartbeat_port, fabric_port) = cluster_ports(
        file,
        overrides,
        port,
        (heartbeat_tls.is_some(), fabric_tls.is_some()),
    )?;
    let mut all_ports = vec![
        ("service", Some(port)),
        ("service TLS", overrides.tls_port.or(file.service.tls_port)),
    ];
    all_ports.extend([
        ("heartbeat", heartbeat_port),
        ("fabric", fabric_port),
        (
            "heartbeat TLS",
            heartbeat_tls.as_ref().map(|tls| tls.settings.port),
        ),
        (
            "fabric TLS",
            fabric_tls.as_ref().map(|tls| tls.settings.port),
        ),
    ]);
    ports_differ(&all_ports)?;
    let seeds = resolve_seeds(file, origin, overrides, heartbeat_tls.is_some())?;
    let (interval, timeout_intervals) = heartbeat_timing(file, origin)?;
    let (migrate_max_partitions, migrate_sleep_us) = migration_throttles(file, origin)?;
    Ok(ClusterSettings {
        migrate_max_partitions,
        migrate_sleep_us,
        migrate_max_records_per_sec: file.service.migrate_max_records_per_sec.unwrap_or(0),
        heartbeat_address,
        heartbeat_port,
        fabric_address,
        fabric_port,
        heartbeat_tls,
        fabric_tls,
        seeds,
        heartbeat_interval_ms: interval,
        heartbeat_timeout_ms: interval * timeout_intervals,
        rack_id: overrides.rack_id.or(file.service.rack_id).unwrap_or(0),
    })
}

type ChannelsTls = (
    Option<crate::tls_config::ChannelTls>,
    Option<crate::tls_config::ChannelTls>,
);

/// The heartbeat's and the fabric's TLS settings.
fn channel_tls(
    file: &FileConfig,
    origin: &str,
    heartbeat_address: &str,
    fabric_address: &str,
    work_directory: Option<&Path>,
) -> Result<ChannelsTls, ConfigError> {
    use crate::tls_config::{resolve_channel, ChannelTlsOptions};
    let heartbeat = ChannelTlsOptions {
        channel: "heartbeat",
        tls_port: file.heartbeat.tls_port,
        tls_name: file.heartbeat.tls_name.as_deref(),
        tls_address: file.heartbeat.tls_address.as_deref(),
        address: heartbeat_address,
    };
    let fabric = ChannelTlsOptions {
        channel: "fabric",
        tls_port: file.fabric.tls_port,
        tls_name: file.fabric.tls_name.as_deref(),
        tls_address: file.fabric.tls_address.as_deref(),
        address: fabric_address,
    };
    Ok((
        resolve_channel(file, origin, &heartbeat, work_directory)?,
        resolve_channel(file, origin, &fabric, work_directory)?,
    ))
}

/// The plain heartbeat and fabric ports: given, or the service port + 2
/// and + 1 — unless the channel has a TLS port, which makes the plain one
/// opt-in (as in the reference, where only configured ports are opened).
fn cluster_ports(
    file: &FileConfig,
    overrides: &Overrides,
    port: u16,
    (heartbeat_tls, fabric_tls): (bool, bool),
) -> Result<(Option<u16>, Option<u16>), ConfigError> {
    let derived = |offset: u16, what: &str, tls: bool| {
        if tls {
            return Ok(None);
        }
        port.checked_add(offset).map(Some).ok_or_else(|| {
            ConfigError(format!("{what} defaults to the service port + {offset}, which is past 65535: give --{what} explicitly"))
        })
    };
    let heartbeat_port = match overrides.heartbeat_port.or(file.heartbeat.port) {
        Some(port) => Some(port),
        None => derived(2, "heartbeat-port", heartbeat_tls)?,
    };
    let fabric_port = match overrides.fabric_port.or(file.fabric.port) {
        Some(port) => Some(port),
        None => derived(1, "fabric-port", fabric_tls)?,
    };
    if heartbeat_port == Some(0) || fabric_port == Some(0) {
        return Err(ConfigError(
            "--heartbeat-port / --fabric-port (heartbeat.port / fabric.port) must be 1-65535"
                .into(),
        ));
    }
    Ok((heartbeat_port, fabric_port))
}

/// Every port the node listens on is a different one.
fn ports_differ(ports: &[(&str, Option<u16>)]) -> Result<(), ConfigError> {
    for (at, (what, port)) in ports.iter().enumerate() {
        let Some(port) = port else { continue };
        if let Some((other, _)) = ports[..at].iter().find(|(_, other)| *other == Some(*port)) {
            let all: Vec<String> = ports
                .iter()
                .filter_map(|(what, port)| port.map(|port| format!("{what} {port}")))
                .collect();
            return Err(ConfigError(format!(
                "the {other} and {what} ports are both {port}: the service, fabric and heartbeat ports (plain and TLS) must differ ({})",
                all.join(", ")
            )));
        }
    }
    Ok(())
}

/// The seeds, each `HOST:PORT`, sorted without repeats: the file's
/// (`heartbeat.seeds`, or `tls-mesh-seed-address-port` when heartbeats go
/// over TLS) and the flags' (`--seed`, of the kind the node uses).
fn resolve_seeds(
    file: &FileConfig,
    origin: &str,
    overrides: &Overrides,
    heartbeat_tls: bool,
) -> Result<Vec<String>, ConfigError> {
    let heartbeat = &file.heartbeat;
    let (listed, key) = if heartbeat_tls {
        if !heartbeat.seeds.is_empty() {
            return Err(ConfigError(format!(
                "{origin}: heartbeat.seeds is set but heartbeats go over TLS (heartbeat.tls-port): give the seeds' TLS heartbeat addresses as heartbeat.tls-mesh-seed-address-port"
            )));
        }
        (
            &heartbeat.tls_mesh_seed_address_port,
            "heartbeat.tls-mesh-seed-address-port",
        )
    } else {
        if !heartbeat.tls_mesh_seed_address_port.is_empty() {
            return Err(ConfigError(format!(
                "{origin}: heartbeat.tls-mesh-seed-address-port needs heartbeat.tls-port (this node connects to TLS seeds only when it offers TLS heartbeats)"
            )));
        }
        (&heartbeat.seeds, "heartbeat.seeds")
    };
    let mut seeds: Vec<String> = listed
        .iter()
        .map(|seed| (seed.clone(), format!("{origin}: {key}")))
        .chain(
            overrides
                .seeds
                .iter()
                .map(|seed| (seed.clone(), "--seed".to_owned())),
        )
        .map(|(seed, place)| match seed.rsplit_once(':') {
            Some((host, port))
                if !host.is_empty() && port.parse::<u16>().is_ok_and(|port| port != 0) =>
            {
                Ok(seed)
            }
            _ => Err(ConfigError(format!(
                "{place} = {seed:?} must be HOST:PORT (another node's heartbeat address)"
            ))),
        })
        .collect::<Result<_, _>>()?;
    seeds.sort();
    seeds.dedup();
    Ok(seeds)
}

/// The heartbeat interval (ms, default 150) and timeout (intervals,
/// default 10).
fn heartbeat_timing(file: &FileConfig, origin: &str) -> Result<(u64, u64), ConfigError> {
    let interval = file.heartbeat.interval.unwrap_or(150);
    if !(10..=10_000).contains(&interval) {
        return Err(ConfigError(format!(
            "{origin}: heartbeat.interval = {interval} ms is impossible (10 to 10000)"
        )));
    }
    let timeout_intervals = file.heartbeat.timeout.unwrap_or(10);
    if !(3..=1000).contains(&timeout_intervals) {
        return Err(ConfigError(format!(
            "{origin}: heartbeat.timeout = {timeout_intervals} intervals is impossible (3 to 1000)"
        )));
    }
    Ok((interval, timeout_intervals))
}

/// `migrate-max-partitions` (1 to 64) and `migrate-sleep` (microseconds,
/// at most 1000000).
fn migration_throttles(file: &FileConfig, origin: &str) -> Result<(u32, u32), ConfigError> {
    let migrate_max_partitions = file
        .service
        .migrate_max_partitions
        .unwrap_or(citrine_service::migration::MAX_PARTITIONS_DEFAULT);
    if !(1..=64).contains(&migrate_max_partitions) {
        return Err(ConfigError(format!(
            "{origin}: service.migrate-max-partitions = {migrate_max_partitions} is impossible (1 to 64)"
        )));
    }
    let migrate_sleep_us = file.service.migrate_sleep.unwrap_or(0);
    if migrate_sleep_us > 1_000_000 {
        return Err(ConfigError(format!(
            "{origin}: service.migrate-sleep = {migrate_sleep_us} microseconds is impossible (at most 1000000)"
        )));
    }
    Ok((migrate_max_partitions, migrate_sleep_us))
}

/// One `[[namespace]]`: its name, record limits, expiry, conflict
/// resolution and storage engine, checked in that order.
fn resolve_namespace(
    section: &NamespaceSection,
    place: &str,
) -> Result<NamespaceConfig, ConfigError> {
    let name = &section.name;
    if name.is_empty()
        || name.len() > citrine_types::NAMESPACE_NAME_MAX
        || name.contains([':', ';', ',', '/'])
    {
        return Err(ConfigError(format!(
            "{place}: name must be 1 to 31 bytes without ':', ';', ',' or '/'"
        )));
    }
    let mut config = NamespaceConfig::in_memory(name);
    config.sc = resolve_sc(section);
    config.mrt = resolve_mrt(section, place)?;
    config.prefer_minimal_migration = resolve_minimal_migration(section, place)?;
    if let Some(factor) = section.replication_factor {
        if !(1..=128).contains(&factor) {
            return Err(ConfigError(format!(
                "{place}: replication-factor = {factor} is impossible (1 to 128)"
            )));
        }
        config.replication_factor = factor;
    }
    resolve_expiry(section, &mut config, place)?;
    resolve_record_limits(section, &mut config, place)?;
    match &section.storage_engine {
        Some(StorageEngineSection::Memory {
            data_size,
            evict_used_pct,
            stop_writes_used_pct,
        }) => {
            let sizes = (*data_size, *evict_used_pct, *stop_writes_used_pct);
            resolve_memory(sizes, &mut config, place)?;
        }
        Some(StorageEngineSection::Device { .. }) => resolve_device(section, &mut config, place)?,
        None => {}
    }
    Ok(config)
}

/// `default-ttl` (at most ten years), `nsup-period` and
/// `allow-ttl-without-nsup`: a default TTL needs a supervisor to remove
/// what expires, unless allowed without.
fn resolve_expiry(
    section: &NamespaceSection,
    config: &mut NamespaceConfig,
    place: &str,
) -> Result<(), ConfigError> {
    if let Some(Duration(seconds)) = section.default_ttl {
        if seconds > u64::from(citrine_service::transaction::TTL_MAX_SECONDS) {
            return Err(ConfigError(format!(
                "{place}: default-ttl = {seconds} s is more than ten years"
            )));
        }
        config.default_ttl = seconds as u32;
    }
    if let Some(Duration(seconds)) = section.nsup_period {
        config.nsup_period = u32::try_from(seconds)
            .map_err(|_| ConfigError(format!("{place}: nsup-period = {seconds} is too large")))?;
    }
    if let Some(allow) = section.allow_ttl_without_nsup {
        config.allow_ttl_without_nsup = allow;
    }
    if config.default_ttl != 0 && config.nsup_period == 0 && !config.allow_ttl_without_nsup {
        return Err(ConfigError(format!("{place}: default-ttl is set but nsup-period is 0: records would never be removed (set nsup-period, or allow-ttl-without-nsup = true)")));
    }
    Ok(())
}

/// `max-record-size` (1 KiB to 128 MiB), `tomb-raider-eligible-age` (1 s
/// to ten years), `conflict-resolution-policy` and eviction's pace
/// (`evict-tenths-pct`, `evict-hist-buckets`).
fn resolve_record_limits(
    section: &NamespaceSection,
    config: &mut NamespaceConfig,
    place: &str,
) -> Result<(), ConfigError> {
    if let Some(Size(bytes)) = section.max_record_size {
        if !(1024..=128 * 1024 * 1024).contains(&bytes) {
            return Err(ConfigError(format!(
                "{place}: max-record-size = {bytes} is impossible (1 KiB to 128 MiB)"
            )));
        }
        config.max_record_size = bytes as u32;
    }
    if let Some(Duration(seconds)) = section.tomb_raider_eligible_age {
        if !(1..=10 * 365 * 86_400).contains(&seconds) {
            return Err(ConfigError(format!(
                "{place}: tomb-raider-eligible-age = {seconds} s is impossible (1 s to ten years)"
            )));
        }
        config.tomb_raider_eligible_age = seconds as u32;
    }
    resolve_eviction_pace(section, config, place)?;
    if let Some(name) = &section.conflict_resolution_policy {
        config.conflict_resolution_policy =
            ConflictResolutionPolicy::from_name(name).ok_or_else(|| {
                let known: Vec<&str> = ConflictResolutionPolicy::ALL
                    .iter()
                    .map(|policy| policy.name())
                    .collect();
                ConfigError(format!(
                    "{place}: conflict-resolution-policy = {name:?} is not a policy (one of: {})",
                    known.join(", ")
                ))
            })?;
    }
    Ok(())
}

/// The strong-consistency options (`strong-consistency`,
/// `strong-consistency-allow-expunge`, `auto-revive`, `active-rack`); the
/// last three are kept but mean nothing without `strong-consistency`.
/// `prefer-minimal-migration`: AP namespaces only (a strong-consistency
/// namespace's map follows its roster).
fn resolve_minimal_migration(section: &NamespaceSection, place: &str) -> Result<bool, ConfigError> {
    let on = section.prefer_minimal_migration.unwrap_or(false);
    if on && section.strong_consistency.unwrap_or(false) {
        return Err(ConfigError(format!(
            "{place}: 'prefer-minimal-migration' is not applicable with 'strong-consistency'"
        )));
    }
    Ok(on)
}

fn resolve_sc(section: &NamespaceSection) -> ScConfig {
    ScConfig {
        strong_consistency: section.strong_consistency.unwrap_or(false),
        allow_expunge: section.strong_consistency_allow_expunge.unwrap_or(false),
        auto_revive: section.auto_revive.unwrap_or(false),
        active_rack: section.active_rack.unwrap_or(0),
        serve_data: section.strong_consistency_serve_data.unwrap_or(true),
    }
}

/// The transaction options, as the reference checks them: each only with
/// `strong-consistency`, `mrt-duration` within 1 to 120 seconds.
fn resolve_mrt(section: &NamespaceSection, place: &str) -> Result<MrtConfig, ConfigError> {
    let mut mrt = MrtConfig::default();
    let sc = section.strong_consistency.unwrap_or(false);
    if let Some(Duration(seconds)) = section.mrt_duration {
        if !sc {
            return Err(ConfigError(format!(
                "{place}: 'mrt-duration' is only applicable with 'strong-consistency'"
            )));
        }
        use citrine_data::txn::{DURATION_MAX, DURATION_MIN};
        let bounds = u64::from(DURATION_MIN)..=u64::from(DURATION_MAX);
        if !bounds.contains(&seconds) {
            return Err(ConfigError(format!(
                "{place}: mrt-duration must be in time units between 1 and 120 seconds"
            )));
        }
        mrt.duration_seconds = seconds as u32;
    }
    if let Some(disabled) = section.disable_mrt_writes {
        if !sc {
            return Err(ConfigError(format!(
                "{place}: 'disable-mrt-writes' is only applicable with 'strong-consistency'"
            )));
        }
        mrt.writes_disabled = disabled;
    }
    Ok(mrt)
}

/// `evict-tenths-pct` (any count) and `evict-hist-buckets` (100 to
/// 10 000 000, as the reference).
fn resolve_eviction_pace(
    section: &NamespaceSection,
    config: &mut NamespaceConfig,
    place: &str,
) -> Result<(), ConfigError> {
    if let Some(tenths) = section.evict_tenths_pct {
        config.evict_tenths_pct = tenths;
    }
    if let Some(buckets) = section.evict_hist_buckets {
        let range = citrine_service::config::EVICT_HIST_BUCKETS_RANGE;
        if !range.contains(&buckets) {
            return Err(ConfigError(format!(
                "{place}: evict-hist-buckets = {buckets} is impossible (100 to 10000000)"
            )));
        }
        config.evict_hist_buckets = buckets;
    }
    Ok(())
}

/// `evict-used-pct` and `stop-writes-used-pct` (memory and device
/// engines): each 0 to 100, eviction below stop-writes when both are set.
fn check_used_thresholds(evict: u8, stop: u8, place: &str) -> Result<(), ConfigError> {
    if evict > 100 {
        return Err(ConfigError(format!(
            "{place}: storage-engine.evict-used-pct = {evict} is impossible (0 to 100)"
        )));
    }
    if stop > 100 {
        return Err(ConfigError(format!(
            "{place}: storage-engine.stop-writes-used-pct = {stop} is impossible (0 to 100)"
        )));
    }
    if evict != 0 && stop != 0 && evict >= stop {
        return Err(ConfigError(format!("{place}: storage-engine.evict-used-pct ({evict}) must be below stop-writes-used-pct ({stop}), or eviction could never act before writes stop")));
    }
    Ok(())
}

/// `[namespace.storage-engine] type = "memory"`: its data size (at least
/// 1M), eviction and stop-writes thresholds (percent; eviction below
/// stop-writes), over the memory engine's defaults.
fn resolve_memory(
    (data_size, evict_used_pct, stop_writes_used_pct): (Option<Size>, Option<u8>, Option<u8>),
    config: &mut NamespaceConfig,
    place: &str,
) -> Result<(), ConfigError> {
    let StorageEngineConfig::Memory {
        data_size: default_size,
        evict_used_pct: default_evict,
        stop_writes_used_pct: default_stop,
    } = config.storage_engine
    else {
        return Err(ConfigError(format!(
            "{place}: internal: the default storage engine is not memory"
        )));
    };
    let data_size = data_size.map_or(default_size, |Size(bytes)| bytes);
    if data_size < 1 << 20 {
        return Err(ConfigError(format!(
            "{place}: storage-engine.data-size = {data_size} is impossible (at least 1M)"
        )));
    }
    let evict = evict_used_pct.unwrap_or(default_evict);
    let stop = stop_writes_used_pct.unwrap_or(default_stop);
    check_used_thresholds(evict, stop, place)?;
    config.storage_engine = StorageEngineConfig::Memory {
        data_size,
        evict_used_pct: evict,
        stop_writes_used_pct: stop,
    };
    Ok(())
}

/// `[namespace.storage-engine] type = "device"`. Relative paths are made
/// absolute later, by [`place_device_files`], once the work directory is
/// known. Steps: the files or devices, the engine's block sizes, its
/// tuning, then the largest record a write block holds.
fn resolve_device(
    section: &NamespaceSection,
    config: &mut NamespaceConfig,
    place: &str,
) -> Result<(), ConfigError> {
    let Some(StorageEngineSection::Device {
        file,
        files,
        devices,
        filesize,
        write_block_size,
        flush_max_ms,
        defrag_lwm_pct,
        stop_writes_avail_pct,
        min_avail_pct,
        stop_writes_used_pct,
        evict_used_pct,
        commit_to_device,
        post_write_queue,
        direct_io,
        fast_restart,
        index_checkpoint_period,
        compression,
        compression_level,
    }) = &section.storage_engine
    else {
        return Ok(());
    };
    let (paths, shadows) = split_shadows(device_paths(file, files, devices, place)?, place)?;
    let mut engine = citrine_service::config::DeviceConfig::new(
        &config.name,
        paths,
        filesize.map_or(1 << 30, |Size(bytes)| bytes),
    );
    engine.shadows = shadows;
    device_block_sizes(&mut engine, *write_block_size, place)?;
    let flush_max_ms = flush_max_ms.unwrap_or(1000);
    if !(1..=60_000).contains(&flush_max_ms) {
        return Err(ConfigError(format!(
            "{place}: storage-engine.flush-max-ms = {flush_max_ms} is impossible (1 to 60000)"
        )));
    }
    let tuning = DeviceTuning {
        defrag_lwm_pct: *defrag_lwm_pct,
        stop_writes_avail_pct: one_of_names(*stop_writes_avail_pct, *min_avail_pct, place)?,
        stop_writes_used_pct: *stop_writes_used_pct,
        evict_used_pct: *evict_used_pct,
        commit_to_device: *commit_to_device,
        post_write_queue: *post_write_queue,
        direct_io: *direct_io,
    };
    tuning.apply(&mut engine, place)?;
    engine.compression = storage_compression(compression, *compression_level, place)?;
    match index_checkpoint_period {
        Some(seconds) if *seconds > 86_400 => {
            return Err(ConfigError(format!(
                "{place}: storage-engine.index-checkpoint-period = {seconds} is impossible (0 to 86400 seconds)"
            )))
        }
        Some(seconds) => engine.checkpoint_period_s = *seconds,
        None => {}
    }
    fit_records_in_blocks(section, config, &engine, place)?;
    // The image path is placed with the files; a marker for "enabled" here.
    let index_image = fast_restart
        .unwrap_or(true)
        .then(|| PathBuf::from(format!("{}.index", config.name)));
    config.storage_engine = StorageEngineConfig::Device {
        engine,
        flush_max_ms,
        index_image,
    };
    Ok(())
}

/// Each configured device entry is a path, or as the reference's
/// `device PRIMARY SHADOW` line two paths separated by white space: the
/// device and its shadow (every write also goes to the shadow; a blank
/// device is rebuilt from it at start). Answers the devices and, when any
/// has one, every device's shadow; no path may appear twice.
fn split_shadows(
    entries: Vec<PathBuf>,
    place: &str,
) -> Result<(Vec<PathBuf>, Vec<Option<PathBuf>>), ConfigError> {
    let mut paths = Vec::with_capacity(entries.len());
    let mut shadows = Vec::with_capacity(entries.len());
    for entry in entries {
        let text = entry.to_string_lossy().into_owned();
        let parts: Vec<&str> = text.split_whitespace().collect();
        match parts.as_slice() {
            [_] => {
                paths.push(entry);
                shadows.push(None);
            }
            [primary, shadow] => {
                paths.push(PathBuf::from(primary));
                shadows.push(Some(PathBuf::from(shadow)));
            }
            _ => {
                return Err(ConfigError(format!(
                    "{place}: storage-engine device {text:?} must be a path, or a path and its shadow's"
                )))
            }
        }
    }
    let mut seen: Vec<&PathBuf> = paths.iter().chain(shadows.iter().flatten()).collect();
    seen.sort();
    if let Some(twice) = seen.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(ConfigError(format!(
            "{place}: storage-engine lists {} twice",
            twice[0].display()
        )));
    }
    if shadows.iter().all(Option::is_none) {
        shadows.clear();
    }
    Ok((paths, shadows))
}

/// A device engine's paths, `file` then `files` then `devices`: at least
/// one, at most `DEVICES_MAX`, none twice.
fn device_paths(
    file: &Option<PathBuf>,
    files: &Option<Vec<PathBuf>>,
    devices: &Option<Vec<PathBuf>>,
    place: &str,
) -> Result<Vec<PathBuf>, ConfigError> {
    let mut paths: Vec<PathBuf> = Vec::new();
    paths.extend(file.iter().cloned());
    paths.extend(files.iter().flatten().cloned());
    paths.extend(devices.iter().flatten().cloned());
    if paths.is_empty() {
        return Err(ConfigError(format!(
            "{place}: a device storage-engine needs file, files or devices"
        )));
    }
    if paths.len() > citrine_service::config::DEVICES_MAX {
        return Err(ConfigError(format!(
            "{place}: storage-engine lists {} devices, at most {} are supported",
            paths.len(),
            citrine_service::config::DEVICES_MAX
        )));
    }
    for (index, path) in paths.iter().enumerate() {
        if paths[..index].contains(path) {
            return Err(ConfigError(format!(
                "{place}: storage-engine lists {} twice",
                path.display()
            )));
        }
    }
    Ok(paths)
}

/// `write-block-size` (a power of two from 16K to 128M), then the file size
/// it needs (at least 1M and eight write blocks).
fn device_block_sizes(
    engine: &mut citrine_service::config::DeviceConfig,
    write_block_size: Option<Size>,
    place: &str,
) -> Result<(), ConfigError> {
    if let Some(Size(bytes)) = write_block_size {
        let largest = citrine_service::config::WRITE_BLOCK_MAX as u64;
        if !bytes.is_power_of_two() || !(16 * 1024..=largest).contains(&bytes) {
            return Err(ConfigError(format!("{place}: storage-engine.write-block-size = {bytes} is impossible (a power of two from 16K to 128M)")));
        }
        engine.write_block_size = bytes as u32;
    }
    let minimum_size = (1u64 << 20) + 8 * u64::from(engine.write_block_size);
    if engine.file_size < minimum_size {
        return Err(ConfigError(format!("{place}: storage-engine.filesize = {} is too small (at least {minimum_size}: 1M + 8 write blocks)", engine.file_size)));
    }
    Ok(())
}

/// `storage-engine.compression` and `compression-level`, checked.
fn storage_compression(
    algorithm: &Option<String>,
    level: Option<u8>,
    place: &str,
) -> Result<citrine_service::config::Compression, ConfigError> {
    use citrine_service::config::{Compression, CompressionAlgorithm};
    let algorithm = match algorithm.as_deref() {
        None => CompressionAlgorithm::None,
        Some(name) => CompressionAlgorithm::from_name(name).ok_or_else(|| {
            ConfigError(format!(
                "{place}: storage-engine.compression = {name:?} is not one of none, lz4, zstd"
            ))
        })?,
    };
    let level = level.unwrap_or(0);
    let level = Compression::valid_level(u64::from(level)).ok_or_else(|| {
        ConfigError(format!(
            "{place}: storage-engine.compression-level = {level} is impossible (1 to 9)"
        ))
    })?;
    Ok(Compression { algorithm, level })
}

/// A device engine's optional tuning, as the file gives it.
struct DeviceTuning {
    defrag_lwm_pct: Option<u8>,
    stop_writes_avail_pct: Option<u8>,
    stop_writes_used_pct: Option<u8>,
    evict_used_pct: Option<u8>,
    commit_to_device: Option<bool>,
    post_write_queue: Option<u32>,
    direct_io: Option<bool>,
}

/// `stop-writes-avail-pct` given by its name or by its older one
/// (`min-avail-pct`), refused when given by both.
fn one_of_names(
    current: Option<u8>,
    older: Option<u8>,
    place: &str,
) -> Result<Option<u8>, ConfigError> {
    match (current, older) {
        (Some(_), Some(_)) => Err(ConfigError(format!(
            "{place}: storage-engine.min-avail-pct is the older name of stop-writes-avail-pct: give one"
        ))),
        (current, older) => Ok(current.or(older)),
    }
}

impl DeviceTuning {
    /// Checks and applies it: `defrag-lwm-pct` 1 to 99,
    /// `stop-writes-avail-pct` at most 50, `evict-used-pct` below
    /// `stop-writes-used-pct`, `post-write-queue` at most 4096 blocks.
    fn apply(
        &self,
        engine: &mut citrine_service::config::DeviceConfig,
        place: &str,
    ) -> Result<(), ConfigError> {
        if let Some(pct) = self.defrag_lwm_pct {
            if !(1..=99).contains(&pct) {
                return Err(ConfigError(format!(
                    "{place}: storage-engine.defrag-lwm-pct = {pct} is impossible (1 to 99)"
                )));
            }
            engine.defrag_lwm_pct = pct;
        }
        if let Some(pct) = self.stop_writes_avail_pct {
            if pct > 50 {
                return Err(ConfigError(format!(
                    "{place}: storage-engine.stop-writes-avail-pct = {pct} is impossible (0 to 50)"
                )));
            }
            engine.stop_writes_avail_pct = pct;
        }
        engine.evict_used_pct = self.evict_used_pct.unwrap_or(engine.evict_used_pct);
        engine.stop_writes_used_pct = self
            .stop_writes_used_pct
            .unwrap_or(engine.stop_writes_used_pct);
        check_used_thresholds(engine.evict_used_pct, engine.stop_writes_used_pct, place)?;
        engine.commit_to_device = self.commit_to_device.unwrap_or(false);
        // By default the queue holds at most 256 MiB (fewer big blocks).
        let default_queue = (citrine_service::config::POST_WRITE_QUEUE_DEFAULT_BYTES
            / u64::from(engine.write_block_size))
        .clamp(1, u64::from(engine.post_write_queue)) as u32;
        engine.post_write_queue = self.post_write_queue.unwrap_or(default_queue);
        if engine.post_write_queue > 4096 {
            return Err(ConfigError(format!(
                "{place}: storage-engine.post-write-queue = {} is too large (at most 4096 blocks)",
                engine.post_write_queue
            )));
        }
        if self.direct_io.unwrap_or(false) {
            engine.io_mode = citrine_service::config::IoMode::Direct;
        }
        Ok(())
    }
}

/// A record and its headers must fit in one write block: a
/// `max-record-size` given larger is refused, the default is lowered.
fn fit_records_in_blocks(
    section: &NamespaceSection,
    config: &mut NamespaceConfig,
    engine: &citrine_service::config::DeviceConfig,
    place: &str,
) -> Result<(), ConfigError> {
    let largest = engine.write_block_size.saturating_sub(1024);
    if section.max_record_size.is_some() && config.max_record_size > largest {
        return Err(ConfigError(format!(
            "{place}: max-record-size = {} does not fit a write block of {} (at most {largest})",
            config.max_record_size, engine.write_block_size
        )));
    }
    config.max_record_size = config.max_record_size.min(largest);
    Ok(())
}

/// Makes a device namespace's relative paths (files, index image) relative
/// to the work directory.
fn place_device_files(namespace: &mut NamespaceConfig, work_directory: Option<&Path>) {
    let Some(directory) = work_directory else {
        return;
    };
    if let StorageEngineConfig::Device {
        engine,
        index_image,
        ..
    } = &mut namespace.storage_engine
    {
        for path in engine
            .paths
            .iter_mut()
            .chain(engine.shadows.iter_mut().flatten())
        {
            if path.is_relative() {
                *path = directory.join(&*path);
            }
        }
        if let Some(image) = index_image {
            if image.is_relative() {
                *image = directory.join(&*image);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve_text(text: &str) -> Result<ServerConfig, ConfigError> {
        resolve(
            parse_text(text, "test.toml")?,
            "test.toml",
            &Overrides::default(),
        )
    }

    const NODE_TLS: &str = "[[tls]]\nname = \"node\"\ncert-file = \"tls/node.pem\"\n\
                            key-file = \"tls/node.key\"\nca-file = \"tls/ca.pem\"\n\
                            [[namespace]]\nname = \"test\"\n";

    #[test]
    fn fabric_and_heartbeat_tls_take_the_reference_options() {
        let text = format!(
            "[service]\nport = 3000\nwork-directory = \"/data\"\n\
             [fabric]\ntls-port = 3011\ntls-name = \"node\"\n\
             [heartbeat]\ntls-port = 3012\ntls-name = \"node\"\ntls-address = \"127.0.0.2\"\n\
             tls-mesh-seed-address-port = [\"10.0.0.2:3012\"]\n{NODE_TLS}"
        );
        let cluster = resolve_text(&text).expect("valid").cluster;
        // With a TLS port the plain one is opened only when given.
        assert_eq!((cluster.fabric_port, cluster.heartbeat_port), (None, None));
        let fabric = cluster.fabric_tls.expect("fabric TLS");
        assert_eq!(
            (fabric.settings.port, fabric.address.as_str()),
            (3011, "127.0.0.1")
        );
        assert_eq!(
            fabric.settings.ca_file,
            Some(PathBuf::from("/data/tls/ca.pem"))
        );
        assert_eq!(
            fabric.settings.client_auth,
            crate::tls_config::ClientAuth::Names(vec!["node".to_owned()])
        );
        let heartbeat = cluster.heartbeat_tls.expect("heartbeat TLS");
        assert_eq!(
            (heartbeat.settings.port, heartbeat.address.as_str()),
            (3012, "127.0.0.2")
        );
        assert_eq!(cluster.seeds, vec!["10.0.0.2:3012".to_owned()]);
        // Both ports: a plain one beside the TLS one.
        let both = text.replace("tls-port = 3011", "port = 3001\ntls-port = 3011");
        let cluster = resolve_text(&both).expect("valid").cluster;
        assert_eq!(
            (cluster.fabric_port, cluster.heartbeat_port),
            (Some(3001), None)
        );
        // Without TLS nothing changes: plain ports at +1 and +2.
        let plain = resolve_text(NODE_TLS).expect("valid").cluster;
        assert_eq!(
            (plain.fabric_port, plain.heartbeat_port),
            (Some(3001), Some(3002))
        );
        assert!(plain.fabric_tls.is_none() && plain.heartbeat_tls.is_none());
    }

    #[test]
    fn impossible_cluster_channel_settings_are_refused_with_the_option_named() {
        let cases = [
            ("[fabric]\ntls-port = 3011\n", "fabric.tls-name is not"),
            ("[fabric]\ntls-port = 3011\ntls-name = \"other\"\n", "names no [[tls]]"),
            ("[fabric]\ntls-name = \"node\"\n", "need fabric.tls-port"),
            ("[fabric]\ntls-port = 0\ntls-name = \"node\"\n", "fabric.tls-port must be"),
            ("[fabric]\ntls-port = 3000\ntls-name = \"node\"\n", "service and fabric TLS ports are both 3000"),
            ("[fabric]\ntls-port = 3002\ntls-name = \"node\"\n", "heartbeat and fabric TLS ports are both 3002"),
            ("[fabric]\nport = 3002\n", "heartbeat and fabric ports are both 3002"),
            ("[heartbeat]\ntls-port = 3012\ntls-name = \"node\"\nseeds = [\"a:3002\"]\n", "tls-mesh-seed-address-port"),
            ("[heartbeat]\ntls-mesh-seed-address-port = [\"a:3012\"]\n", "needs heartbeat.tls-port"),
            ("[heartbeat]\ntls-port = 3012\ntls-name = \"node\"\ntls-mesh-seed-address-port = [\"a\"]\n", "must be HOST:PORT"),
        ];
        for (section, expected) in cases {
            let error = resolve_text(&format!("{section}{NODE_TLS}")).expect_err(section);
            assert!(error.0.contains(expected), "{section}: {}", error.0);
        }
        let no_ca = NODE_TLS.replace("ca-file = \"tls/ca.pem\"\n", "");
        let error = resolve_text(&format!(
            "[heartbeat]\ntls-port = 3012\ntls-name = \"node\"\n{no_ca}"
        ))
        .expect_err("no CA");
        assert!(
            error.0.contains("heartbeat TLS needs ca-file"),
            "{}",
            error.0
        );
    }

    #[test]
    fn a_security_section_turns_access_control_on() {
        let ns = "[[namespace]]\nname = \"test\"\n";
        let with = |text: &str| resolve_text(&format!("{text}{ns}"));
        assert_eq!(with("").expect("valid").security, None);
        let on = with("[security]\n").expect("valid").security.expect("on");
        assert_eq!((on.session_ttl_s, on.enable_quotas), (86_400, false));
        let tuned = with("[security]\nsession-ttl = 600\nenable-quotas = true\n")
            .expect("valid")
            .security
            .expect("on");
        assert_eq!((tuned.session_ttl_s, tuned.enable_quotas), (600, true));
        let error = with("[security]\nsession-ttl = 5\n").expect_err("too short");
        assert!(error.0.contains("security.session-ttl"), "{}", error.0);
        assert_eq!(on.login_timeout_ms, 10_000);
        let quick = with("[security]\nlogin-timeout-ms = 500\n").expect("valid");
        assert_eq!(quick.security.expect("on").login_timeout_ms, 500);
        let error = with("[security]\nlogin-timeout-ms = 0\n").expect_err("no bound");
        assert!(error.0.contains("security.login-timeout-ms"), "{}", error.0);
        assert!(with("[security]\nenable-security = true\n").is_err());
        let example = resolve_text(include_str!("../../../examples/secure.toml")).expect("example");
        assert!(example.security.is_some());
    }

    #[test]
    fn security_log_and_syslog_set_the_audit_trail() {
        let ns = "[[namespace]]\nname = \"test\"\n";
        let with = |text: &str| resolve_text(&format!("{text}{ns}"));
        assert_eq!(with("[security]\n").expect("valid").audit, None);
        let text = "[security.log]\nfile = \"/var/audit.log\"\nreport-violation = true\n\
                    report-data-op = [\"test\", \"bar cards\"]\nreport-data-op-role = [\"app\"]\n\
                    [security.syslog]\nlocal = 3\nreport-authentication = true\n";
        let audit = with(text).expect("valid").audit.expect("audit");
        assert_eq!(audit.file, Some(PathBuf::from("/var/audit.log")));
        assert_eq!(audit.syslog_local, Some(3));
        assert!(audit.settings.log.violation && !audit.settings.log.authentication);
        assert!(audit.settings.syslog.authentication && !audit.settings.syslog.violation);
        assert_eq!(
            audit.settings.log.data_op,
            vec![
                ("test".to_owned(), None),
                ("bar".to_owned(), Some("cards".to_owned()))
            ]
        );
        assert_eq!(audit.settings.log.data_op_role, vec!["app".to_owned()]);
        let only_log = with("[security.log]\nreport-user-admin = true\n").expect("valid");
        let only_log = only_log.audit.expect("audit");
        assert_eq!((only_log.file, only_log.syslog_local), (None, None));
        for wrong in [
            "[security.syslog]\nlocal = 8\n",
            "[security.syslog]\nfile = \"x\"\n",
            "[security.log]\nlocal = 1\n",
            "[security.log]\nreport-data-op = [\"a b c\"]\n",
            "[security.log]\nreport-everything = true\n",
        ] {
            assert!(with(wrong).is_err(), "{wrong}");
        }
    }

    #[test]
    fn embedded_default_has_test_and_bar() {
        let config = resolve(
            embedded_default(),
            "embedded default",
            &Overrides::default(),
        )
        .expect("valid");
        assert_eq!(config.port, 3000);
        assert_eq!(config.address, "127.0.0.1");
        let names: Vec<&str> = config
            .service
            .namespaces
            .iter()
            .map(|namespace| namespace.name.as_str())
            .collect();
        assert_eq!(names, ["test", "bar"]);
    }

    #[test]
    fn parses_a_full_file() {
        let config = resolve_text(
            r#"
            [service]
            port = 3100
            cluster-name = "prod"
            node-id = "A1B2"
            [[namespace]]
            name = "users"
            default-ttl = "30d"
            nsup-period = "2m"
            max-record-size = "256K"
            [namespace.storage-engine]
            type = "memory"
            data-size = "2G"
            evict-used-pct = 60
            stop-writes-used-pct = 70
            "#,
        )
        .expect("valid");
        assert_eq!(config.port, 3100);
        assert_eq!(config.service.node_id, 0xA1B2);
        let namespace = &config.service.namespaces[0];
        assert_eq!(namespace.default_ttl, 30 * 86_400);
        assert_eq!(namespace.nsup_period, 120);
        assert_eq!(namespace.max_record_size, 256 * 1024);
        assert_eq!(
            namespace.storage_engine,
            StorageEngineConfig::Memory {
                data_size: 2 << 30,
                evict_used_pct: 60,
                stop_writes_used_pct: 70
            }
        );
    }

    #[test]
    fn service_io_is_chosen_by_file_or_flag() {
        let resolve_with = |text: &str, flag: Option<&str>| {
            resolve(
                parse_text(text, "io.toml").expect("parses"),
                "io.toml",
                &Overrides {
                    service_io: flag.map(str::to_owned),
                    ..Overrides::default()
                },
            )
        };
        let namespace = "[[namespace]]\nname = \"test\"\n";
        let epoll = format!("[service]\nservice-io = \"epoll\"\n{namespace}");
        assert_eq!(
            resolve_with(namespace, None).expect("valid").service_io,
            ServiceIo::Auto
        );
        assert_eq!(
            resolve_with(&epoll, None).expect("valid").service_io,
            ServiceIo::Epoll
        );
        assert_eq!(
            resolve_with(&epoll, Some("io_uring"))
                .expect("valid")
                .service_io,
            ServiceIo::IoUring
        );
        let bad = resolve_with(namespace, Some("kqueue")).expect_err("kqueue");
        assert!(bad.0.contains("service-io = \"kqueue\""), "{}", bad.0);
    }

    #[test]
    fn device_engine_options_and_paths() {
        let text = "[[namespace]]\nname = \"d\"\n[namespace.storage-engine]\ntype = \"device\"\nfiles = [\"a.dat\", \"/abs/b.dat\"]\nfilesize = \"64M\"\nwrite-block-size = \"128K\"\nflush-max-ms = 250\ndefrag-lwm-pct = 40\nmin-avail-pct = 7\ncommit-to-device = true\npost-write-queue = 4\n";
        let overrides = Overrides {
            data_dir: Some(PathBuf::from("/data")),
            ..Overrides::default()
        };
        let config = resolve(
            parse_text(text, "test.toml").expect("parses"),
            "test.toml",
            &overrides,
        )
        .expect("valid");
        let namespace = &config.service.namespaces[0];
        let StorageEngineConfig::Device {
            engine,
            flush_max_ms,
            index_image,
        } = &namespace.storage_engine
        else {
            panic!("not a device namespace: {:?}", namespace.storage_engine);
        };
        assert_eq!(
            engine.paths,
            [PathBuf::from("/data/a.dat"), PathBuf::from("/abs/b.dat")]
        );
        assert_eq!(
            (engine.file_size, engine.write_block_size, *flush_max_ms),
            (64 << 20, 128 << 10, 250)
        );
        assert_eq!(
            (
                engine.defrag_lwm_pct,
                engine.stop_writes_avail_pct,
                engine.commit_to_device,
                engine.post_write_queue
            ),
            (40, 7, true, 4)
        );
        assert_eq!(index_image.as_deref(), Some(Path::new("/data/d.index")));
        assert!(
            namespace.max_record_size < 128 << 10,
            "a record must fit a write block"
        );
        let no_file = resolve_text(
            "[[namespace]]\nname = \"d\"\n[namespace.storage-engine]\ntype = \"device\"\n",
        )
        .expect_err("no file");
        assert!(no_file.0.contains("file"), "{}", no_file.0);
        let bad_block = resolve_text("[[namespace]]\nname = \"d\"\n[namespace.storage-engine]\ntype = \"device\"\nfile = \"x\"\nwrite-block-size = 1000\n").expect_err("bad block");
        assert!(
            bad_block.0.contains("write-block-size = 1000"),
            "{}",
            bad_block.0
        );
    }

    #[test]
    fn a_device_entry_may_name_its_shadow_as_the_references_line_does() {
        let text = "[[namespace]]\nname = \"d\"\n[namespace.storage-engine]\ntype = \"device\"\nfiles = [\"a.dat /net/a-shadow.dat\", \"b.dat\"]\nfilesize = \"64M\"\n";
        let overrides = Overrides {
            data_dir: Some(PathBuf::from("/data")),
            ..Overrides::default()
        };
        let config = resolve(
            parse_text(text, "t.toml").expect("parses"),
            "t.toml",
            &overrides,
        )
        .expect("valid");
        let StorageEngineConfig::Device { engine, .. } =
            &config.service.namespaces[0].storage_engine
        else {
            panic!("not a device namespace");
        };
        assert_eq!(
            engine.paths,
            [PathBuf::from("/data/a.dat"), PathBuf::from("/data/b.dat")]
        );
        assert_eq!(
            engine.shadows,
            [Some(PathBuf::from("/net/a-shadow.dat")), None]
        );
        let device = |entry: &str| {
            resolve_text(&format!("[[namespace]]\nname = \"d\"\n[namespace.storage-engine]\ntype = \"device\"\nfiles = [{entry}]\n"))
        };
        let three = device("\"a b c\"").expect_err("three paths");
        assert!(three.0.contains("a path and its shadow"), "{}", three.0);
        let twice = device("\"a b\", \"b\"").expect_err("a shadow also a device");
        assert!(twice.0.contains("lists b twice"), "{}", twice.0);
        let plain = device("\"a\"").expect("no shadow");
        let StorageEngineConfig::Device { engine, .. } =
            &plain.service.namespaces[0].storage_engine
        else {
            panic!("not a device namespace");
        };
        assert!(engine.shadows.is_empty());
    }

    #[test]
    fn device_eviction_and_stop_writes_by_the_reference_names() {
        let device = |extra: &str| {
            resolve_text(&format!("[[namespace]]\nname = \"d\"\n[namespace.storage-engine]\ntype = \"device\"\nfile = \"x\"\n{extra}"))
        };
        let thresholds = |extra: &str| match &device(extra).expect("valid").service.namespaces[0]
            .storage_engine
        {
            StorageEngineConfig::Device { engine, .. } => (
                engine.evict_used_pct,
                engine.stop_writes_used_pct,
                engine.stop_writes_avail_pct,
            ),
            other => panic!("not a device namespace: {other:?}"),
        };
        assert_eq!(thresholds(""), (0, 70, 5), "the reference's defaults");
        assert_eq!(
            thresholds(
                "evict-used-pct = 40\nstop-writes-used-pct = 60\nstop-writes-avail-pct = 12\n"
            ),
            (40, 60, 12)
        );
        assert_eq!(thresholds("min-avail-pct = 9\n").2, 9, "the older name");
        let both = device("min-avail-pct = 9\nstop-writes-avail-pct = 9\n").expect_err("both");
        assert!(both.0.contains("min-avail-pct"), "{}", both.0);
        let inverted = device("evict-used-pct = 80\n").expect_err("evict over stop");
        assert!(inverted.0.contains("evict-used-pct (80)"), "{}", inverted.0);
    }

    #[test]
    fn write_blocks_up_to_128m_with_a_bounded_default_queue() {
        let device = |extra: &str| {
            resolve_text(&format!("[[namespace]]\nname = \"d\"\n[namespace.storage-engine]\ntype = \"device\"\nfile = \"x\"\nfilesize = \"2G\"\n{extra}"))
        };
        let engine_of = |extra: &str| {
            let config = device(extra).expect("valid");
            let namespace = &config.service.namespaces[0];
            match &namespace.storage_engine {
                StorageEngineConfig::Device { engine, .. } => (
                    engine.write_block_size,
                    engine.post_write_queue,
                    namespace.max_record_size,
                ),
                other => panic!("not a device namespace: {other:?}"),
            }
        };
        assert_eq!(
            engine_of("write-block-size = \"128M\"\n"),
            (128 << 20, 2, 1 << 20),
            "256 MiB of post-write queue by default"
        );
        assert_eq!(
            engine_of("write-block-size = \"1M\"\n").1,
            16,
            "unchanged for small blocks"
        );
        assert_eq!(
            engine_of("write-block-size = \"128M\"\npost-write-queue = 4\n").1,
            4
        );
        let records = resolve_text("[[namespace]]\nname = \"d\"\nmax-record-size = \"127M\"\n[namespace.storage-engine]\ntype = \"device\"\nfile = \"x\"\nfilesize = \"2G\"\nwrite-block-size = \"128M\"\n");
        assert_eq!(
            records.expect("fits").service.namespaces[0].max_record_size,
            127 << 20
        );
        let too_big = device("write-block-size = \"256M\"\n").expect_err("256M");
        assert!(too_big.0.contains("16K to 128M"), "{}", too_big.0);
    }

    #[test]
    fn index_checkpoint_period_is_read_and_bounded() {
        let period_of = |extra: &str| {
            resolve_text(&format!("[[namespace]]\nname = \"d\"\n[namespace.storage-engine]\ntype = \"device\"\nfile = \"x\"\n{extra}")).map(|config| {
                match &config.service.namespaces[0].storage_engine {
                    StorageEngineConfig::Device { engine, .. } => engine.checkpoint_period_s,
                    other => panic!("not a device namespace: {other:?}"),
                }
            })
        };
        assert_eq!(period_of("").expect("valid"), 60);
        assert_eq!(
            period_of("index-checkpoint-period = 0\n").expect("valid"),
            0
        );
        assert_eq!(
            period_of("index-checkpoint-period = 5\n").expect("valid"),
            5
        );
        let error = period_of("index-checkpoint-period = 90000\n").expect_err("too long");
        assert!(error.0.contains("0 to 86400"), "{}", error.0);
    }

    #[test]
    fn strong_consistency_options_are_read() {
        let sc_of = |extra: &str| {
            resolve_text(&format!("[[namespace]]\nname = \"s\"\n{extra}"))
                .map(|config| config.service.namespaces[0].sc)
        };
        assert_eq!(sc_of("").expect("valid"), ScConfig::default());
        let sc = sc_of("strong-consistency = true\nstrong-consistency-allow-expunge = true\nauto-revive = true\nactive-rack = 2\n")
            .expect("valid");
        assert_eq!(
            sc,
            ScConfig {
                strong_consistency: true,
                allow_expunge: true,
                auto_revive: true,
                active_rack: 2,
                serve_data: true,
            }
        );
        assert!(sc_of("strong-consistency = 1\n").is_err(), "a boolean");
    }

    #[test]
    fn transaction_options_need_strong_consistency_and_bounds() {
        let mrt_of = |extra: &str| {
            resolve_text(&format!("[[namespace]]\nname = \"s\"\n{extra}"))
                .map(|config| config.service.namespaces[0].mrt)
        };
        assert_eq!(mrt_of("").expect("valid"), MrtConfig::default());
        assert_eq!(MrtConfig::default().duration_seconds, 10);
        let sc = "strong-consistency = true\n";
        let set = mrt_of(&format!(
            "{sc}mrt-duration = 30\ndisable-mrt-writes = true\n"
        ));
        assert_eq!(
            set.expect("valid"),
            MrtConfig {
                duration_seconds: 30,
                writes_disabled: true
            }
        );
        let ap = mrt_of("mrt-duration = 30\n").expect_err("AP");
        assert!(
            ap.0.contains("only applicable with 'strong-consistency'"),
            "{}",
            ap.0
        );
        assert!(mrt_of("disable-mrt-writes = false\n").is_err());
        for bad in ["0", "121"] {
            let refused = mrt_of(&format!("{sc}mrt-duration = {bad}\n")).expect_err(bad);
            assert!(refused.0.contains("between 1 and 120"), "{}", refused.0);
        }
    }

    #[test]
    fn prefer_minimal_migration_is_off_by_default_and_ap_only() {
        let of = |extra: &str| {
            resolve_text(&format!("[[namespace]]\nname = \"s\"\n{extra}"))
                .map(|config| config.service.namespaces[0].prefer_minimal_migration)
        };
        assert!(!of("").expect("valid"));
        assert!(of("prefer-minimal-migration = true\n").expect("valid"));
        let sc = of("strong-consistency = true\nprefer-minimal-migration = true\n");
        let refused = sc.expect_err("SC");
        assert!(
            refused
                .0
                .contains("not applicable with 'strong-consistency'"),
            "{}",
            refused.0
        );
        assert!(of("strong-consistency = true\nprefer-minimal-migration = false\n").is_ok());
    }

    #[test]
    fn device_compression_is_checked() {
        use citrine_service::config::{Compression, CompressionAlgorithm};
        let device = |extra: &str| {
            resolve_text(&format!("[[namespace]]\nname = \"d\"\n[namespace.storage-engine]\ntype = \"device\"\nfile = \"x\"\n{extra}"))
        };
        let compression_of = |extra: &str| match device(extra).expect("valid").service.namespaces[0]
            .storage_engine
            .clone()
        {
            StorageEngineConfig::Device { engine, .. } => engine.compression,
            other => panic!("not a device namespace: {other:?}"),
        };
        assert_eq!(compression_of(""), Compression::default());
        assert_eq!(
            compression_of("compression = \"zstd\"\ncompression-level = 9\n"),
            Compression {
                algorithm: CompressionAlgorithm::Zstd,
                level: 9
            }
        );
        assert_eq!(
            compression_of("compression = \"lz4\"\n").algorithm,
            CompressionAlgorithm::Lz4
        );
        let snappy = device("compression = \"snappy\"\n").expect_err("snappy");
        assert!(
            snappy.0.contains("compression = \"snappy\""),
            "{}",
            snappy.0
        );
        let level = device("compression = \"zstd\"\ncompression-level = 10\n").expect_err("10");
        assert!(level.0.contains("compression-level = 10"), "{}", level.0);
    }

    #[test]
    fn errors_name_the_option_and_the_place() {
        let unknown = resolve_text("[service]\nprot = 3000\n[[namespace]]\nname = \"a\"\n")
            .expect_err("unknown option");
        assert!(
            unknown.0.contains("test.toml")
                && unknown.0.contains("prot")
                && unknown.0.contains("line 2"),
            "{}",
            unknown.0
        );
        let wrong_type = resolve_text("[service]\nport = \"x\"\n").expect_err("wrong type");
        assert!(wrong_type.0.contains("port"), "{}", wrong_type.0);
        let impossible = resolve_text("[[namespace]]\nname = \"a\"\n[namespace.storage-engine]\ntype = \"memory\"\nevict-used-pct = 150\n").expect_err("impossible");
        assert!(
            impossible.0.contains("evict-used-pct = 150") && impossible.0.contains("\"a\""),
            "{}",
            impossible.0
        );
        let bad_unit = resolve_text("[[namespace]]\nname = \"a\"\nmax-record-size = \"10Q\"\n")
            .expect_err("bad unit");
        assert!(
            bad_unit.0.contains("max-record-size") || bad_unit.0.contains("10Q"),
            "{}",
            bad_unit.0
        );
        let port_flag = resolve(
            embedded_default(),
            "embedded default",
            &Overrides {
                port: Some(0),
                ..Overrides::default()
            },
        )
        .expect_err("port 0");
        assert!(port_flag.0.contains("--port"), "{}", port_flag.0);
        let no_namespace = resolve_text("[service]\nport = 3000\n").expect_err("no namespace");
        assert!(no_namespace.0.contains("namespace"));
    }

    #[test]
    fn service_thread_balance_thresholds() {
        let namespace = "[[namespace]]\nname = \"a\"\n";
        let default = resolve_text(namespace).expect("defaults");
        assert_eq!(default.service_thread_spill_pct, 85);
        assert_eq!(default.service_thread_contended_pct, 10);
        let set = resolve_text(&format!(
            "[service]\nservice-thread-spill-pct = 60\nservice-thread-contended-pct = 100\n{namespace}"
        ))
        .expect("both set");
        assert_eq!(set.service_thread_spill_pct, 60);
        assert_eq!(set.service_thread_contended_pct, 100);
        for bad in [0, 101] {
            let error = resolve_text(&format!(
                "[service]\nservice-thread-contended-pct = {bad}\n{namespace}"
            ))
            .expect_err("out of range");
            assert!(
                error
                    .0
                    .contains(&format!("service-thread-contended-pct = {bad}")),
                "{}",
                error.0
            );
        }
    }

    #[test]
    fn eviction_pace() {
        let config = resolve_text("[[namespace]]\nname = \"a\"\n").expect("default");
        assert_eq!(config.service.namespaces[0].evict_tenths_pct, 5);
        assert_eq!(config.service.namespaces[0].evict_hist_buckets, 10_000);
        let config = resolve_text(
            "[[namespace]]\nname = \"a\"\nevict-tenths-pct = 20\nevict-hist-buckets = 100\n",
        )
        .expect("set");
        assert_eq!(config.service.namespaces[0].evict_tenths_pct, 20);
        assert_eq!(config.service.namespaces[0].evict_hist_buckets, 100);
        let error = resolve_text("[[namespace]]\nname = \"a\"\nevict-hist-buckets = 99\n")
            .expect_err("too few buckets");
        assert!(error.0.contains("evict-hist-buckets = 99"), "{}", error.0);
    }

    #[test]
    fn tomb_raider_eligible_age() {
        let config = resolve_text("[[namespace]]\nname = \"a\"\n").expect("default");
        assert_eq!(
            config.service.namespaces[0].tomb_raider_eligible_age,
            citrine_service::config::TOMB_RAIDER_ELIGIBLE_AGE_DEFAULT
        );
        let config =
            resolve_text("[[namespace]]\nname = \"a\"\ntomb-raider-eligible-age = \"2h\"\n")
                .expect("set");
        assert_eq!(config.service.namespaces[0].tomb_raider_eligible_age, 7200);
        let wrong = resolve_text("[[namespace]]\nname = \"a\"\ntomb-raider-eligible-age = 0\n")
            .expect_err("zero");
        assert!(wrong.0.contains("tomb-raider-eligible-age"), "{}", wrong.0);
    }

    #[test]
    fn conflict_resolution_policy() {
        let config = resolve_text("[[namespace]]\nname = \"a\"\n").expect("default");
        assert_eq!(
            config.service.namespaces[0].conflict_resolution_policy,
            ConflictResolutionPolicy::Generation
        );
        for (text, policy) in [
            ("generation", ConflictResolutionPolicy::Generation),
            ("last-update-time", ConflictResolutionPolicy::LastUpdateTime),
        ] {
            let config = resolve_text(&format!(
                "[[namespace]]\nname = \"a\"\nconflict-resolution-policy = \"{text}\"\n"
            ))
            .expect("valid");
            assert_eq!(
                config.service.namespaces[0].conflict_resolution_policy,
                policy
            );
        }
        let wrong =
            resolve_text("[[namespace]]\nname = \"a\"\nconflict-resolution-policy = \"newest\"\n")
                .expect_err("unknown policy");
        assert!(
            wrong.0.contains("conflict-resolution-policy = \"newest\"")
                && wrong.0.contains("\"a\"")
                && wrong.0.contains("generation, last-update-time"),
            "{}",
            wrong.0
        );
        let wrong_type =
            resolve_text("[[namespace]]\nname = \"a\"\nconflict-resolution-policy = 1\n")
                .expect_err("not a string");
        assert!(
            wrong_type.0.contains("conflict-resolution-policy"),
            "{}",
            wrong_type.0
        );
    }

    #[test]
    fn migration_throttles() {
        let config = resolve_text("[[namespace]]\nname = \"a\"\n").expect("defaults");
        assert_eq!(
            (
                config.cluster.migrate_max_partitions,
                config.cluster.migrate_sleep_us
            ),
            (citrine_service::migration::MAX_PARTITIONS_DEFAULT, 0)
        );
        let config = resolve_text(
            "[service]\nmigrate-max-partitions = 2\nmigrate-sleep = 500\nmigrate-max-records-per-sec = 20000\n[[namespace]]\nname = \"a\"\n",
        )
        .expect("set");
        assert_eq!(
            (
                config.cluster.migrate_max_partitions,
                config.cluster.migrate_sleep_us,
                config.cluster.migrate_max_records_per_sec
            ),
            (2, 500, 20_000)
        );
        for bad in ["migrate-max-partitions = 0", "migrate-sleep = 2000000"] {
            let error = resolve_text(&format!("[service]\n{bad}\n[[namespace]]\nname = \"a\"\n"))
                .expect_err(bad);
            assert!(
                error.0.contains(bad.split(' ').next().unwrap_or_default()),
                "{}",
                error.0
            );
        }
    }

    #[test]
    fn latency_ticker_and_http_endpoint() {
        let config = resolve_text("[[namespace]]\nname = \"a\"\n").expect("defaults");
        assert_eq!(
            config.monitoring,
            Monitoring {
                ticker_interval_s: 10,
                microsecond_histograms: false,
                http: None,
            },
            "no endpoint unless [http] port is set"
        );
        let config = resolve_text(
            "[service]\naddress = \"127.0.0.1\"\nticker-interval = 2\nmicrosecond-histograms = true\n[http]\nport = 9145\n[[namespace]]\nname = \"a\"\n",
        )
        .expect("set");
        assert_eq!(
            config.monitoring,
            Monitoring {
                ticker_interval_s: 2,
                microsecond_histograms: true,
                http: Some(("127.0.0.1".to_owned(), 9145)),
            }
        );
        for (bad, named) in [
            ("[service]\nticker-interval = 0", "service.ticker-interval"),
            ("[http]\nport = 0", "http.port"),
            ("[http]\nport = 3000", "http.port"),
            ("[http]\nport = 9145\naddress = \"nowhere\"", "http.address"),
        ] {
            let error =
                resolve_text(&format!("{bad}\n[[namespace]]\nname = \"a\"\n")).expect_err(bad);
            assert!(error.0.contains(named), "{}", error.0);
        }
    }
}
