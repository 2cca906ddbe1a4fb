//! The ACT configuration: the `act_storage` settings by their ACT names,
//! read from an ACT-style file (`name: value` lines, `#` comments) and/or
//! command-line flags (flags win), checked, and the rates ACT derives from
//! them.
//!
//! Derived load (as ACT's README states it): reads of `record-bytes` at
//! `read-reqs-per-sec + write-reqs-per-sec × update-pct / 100` (updates read
//! the record first); large-block writes, and as many large-block reads (the
//! defragmenter reads each block it re-packs), at
//! `write-reqs-per-sec × replication-factor × stored-bytes /
//! large-block-bytes × 100 / (100 − defrag-lwm-pct)`, where a record's
//! stored size is `record-bytes` rounded up to 16 bytes. All rates are
//! totals over the devices.
//!
//! Invariants: a [`ActConfig`] that [`resolve`] returns has at least one
//! device, a non-zero duration and report interval, a read or a write rate
//! that is not zero, `record-bytes` within a large block, a power-of-two
//! large block, percentages in range and at least one service thread.

use std::path::PathBuf;

/// The 1x load per device: reads and writes per second.
pub const ONE_X_READS: u64 = 2_000;
pub const ONE_X_WRITES: u64 = 1_000;

/// Settings as given (file or flags); `None` = not given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    pub device_names: Option<Vec<PathBuf>>,
    pub file_size_mbytes: Option<u64>,
    pub test_duration_sec: Option<u64>,
    pub report_interval_sec: Option<u64>,
    pub microsecond_histograms: Option<bool>,
    pub read_reqs_per_sec: Option<u64>,
    pub write_reqs_per_sec: Option<u64>,
    pub record_bytes: Option<u32>,
    pub large_block_op_kbytes: Option<u32>,
    pub replication_factor: Option<u32>,
    pub update_pct: Option<u32>,
    pub defrag_lwm_pct: Option<u32>,
    pub compress_pct: Option<u32>,
    pub disable_odsync: Option<bool>,
    pub service_threads: Option<u32>,
    pub max_lag_sec: Option<u64>,
}

/// A checked configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActConfig {
    pub device_names: Vec<PathBuf>,
    /// Size of a file created (or extended) for the test; 0 = use the
    /// existing file or raw device as it is.
    pub file_size_bytes: u64,
    pub test_duration_sec: u64,
    pub report_interval_sec: u64,
    pub microsecond_histograms: bool,
    pub read_reqs_per_sec: u64,
    pub write_reqs_per_sec: u64,
    pub record_bytes: u32,
    pub large_block_bytes: u32,
    pub replication_factor: u32,
    pub update_pct: u32,
    pub defrag_lwm_pct: u32,
    pub compress_pct: u32,
    pub disable_odsync: bool,
    pub service_threads: u32,
    /// How far behind its schedule an I/O thread may fall before the test
    /// stops (0 = never stop).
    pub max_lag_sec: u64,
}

/// The rates ACT derives from a configuration (totals over the devices).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Derived {
    pub internal_read_reqs_per_sec: f64,
    pub record_stored_bytes: u32,
    pub defrag_write_amplification: f64,
    pub large_block_reads_per_sec: f64,
    pub large_block_writes_per_sec: f64,
}

impl Settings {
    /// `self` with every setting `over` gives replaced by it.
    pub fn overridden_by(self, over: Settings) -> Settings {
        Settings {
            device_names: over.device_names.or(self.device_names),
            file_size_mbytes: over.file_size_mbytes.or(self.file_size_mbytes),
            test_duration_sec: over.test_duration_sec.or(self.test_duration_sec),
            report_interval_sec: over.report_interval_sec.or(self.report_interval_sec),
            microsecond_histograms: over.microsecond_histograms.or(self.microsecond_histograms),
            read_reqs_per_sec: over.read_reqs_per_sec.or(self.read_reqs_per_sec),
            write_reqs_per_sec: over.write_reqs_per_sec.or(self.write_reqs_per_sec),
            record_bytes: over.record_bytes.or(self.record_bytes),
            large_block_op_kbytes: over.large_block_op_kbytes.or(self.large_block_op_kbytes),
            replication_factor: over.replication_factor.or(self.replication_factor),
            update_pct: over.update_pct.or(self.update_pct),
            defrag_lwm_pct: over.defrag_lwm_pct.or(self.defrag_lwm_pct),
            compress_pct: over.compress_pct.or(self.compress_pct),
            disable_odsync: over.disable_odsync.or(self.disable_odsync),
            service_threads: over.service_threads.or(self.service_threads),
            max_lag_sec: over.max_lag_sec.or(self.max_lag_sec),
        }
    }
}

/// Parses an ACT-style config file's text.
pub fn parse_file(text: &str) -> Result<Settings, String> {
    let mut settings = Settings::default();
    for (index, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| format!("line {}: expected `name: value`, got `{raw}`", index + 1))?;
        set(&mut settings, name.trim(), value.trim())
            .map_err(|message| format!("line {}: {message}", index + 1))?;
    }
    Ok(settings)
}

fn set(settings: &mut Settings, name: &str, value: &str) -> Result<(), String> {
    let s = settings;
    match name {
        "device-names" => s.device_names = Some(device_list(value)),
        "file-size-mbytes" => s.file_size_mbytes = Some(number(name, value)?),
        "test-duration-sec" => s.test_duration_sec = Some(number(name, value)?),
        "report-interval-sec" => s.report_interval_sec = Some(number(name, value)?),
        "microsecond-histograms" => s.microsecond_histograms = Some(yes_no(name, value)?),
        "read-reqs-per-sec" => s.read_reqs_per_sec = Some(number(name, value)?),
        "write-reqs-per-sec" => s.write_reqs_per_sec = Some(number(name, value)?),
        "record-bytes" => s.record_bytes = Some(number(name, value)?),
        "large-block-op-kbytes" => s.large_block_op_kbytes = Some(number(name, value)?),
        "replication-factor" => s.replication_factor = Some(number(name, value)?),
        "update-pct" => s.update_pct = Some(number(name, value)?),
        "defrag-lwm-pct" => s.defrag_lwm_pct = Some(number(name, value)?),
        "compress-pct" => s.compress_pct = Some(number(name, value)?),
        "disable-odsync" => s.disable_odsync = Some(yes_no(name, value)?),
        "service-threads" => s.service_threads = Some(number(name, value)?),
        "max-lag-sec" => s.max_lag_sec = Some(number(name, value)?),
        "scheduler-mode" | "max-reqs-queued" => {} // accepted, no effect here
        _ => return Err(format!("unknown or unsupported ACT setting `{name}`")),
    }
    Ok(())
}

/// A comma-separated list of device paths.
pub fn device_list(value: &str) -> Vec<PathBuf> {
    value
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(PathBuf::from)
        .collect()
}

fn number<T: std::str::FromStr>(name: &str, value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("{name}: `{value}` is not a decimal integer in range"))
}

fn yes_no(name: &str, value: &str) -> Result<bool, String> {
    match value {
        "yes" | "true" => Ok(true),
        "no" | "false" => Ok(false),
        _ => Err(format!("{name}: expected yes or no, got `{value}`")),
    }
}

/// Fills the defaults (ACT's; rates default to 1x per device) and checks.
pub fn resolve(s: Settings, cpus: u32) -> Result<ActConfig, String> {
    let device_names = s.device_names.unwrap_or_default();
    let devices = device_names.len() as u64;
    let config = ActConfig {
        file_size_bytes: s.file_size_mbytes.unwrap_or(0).saturating_mul(1 << 20),
        test_duration_sec: s.test_duration_sec.unwrap_or(86_400),
        report_interval_sec: s.report_interval_sec.unwrap_or(1),
        microsecond_histograms: s.microsecond_histograms.unwrap_or(false),
        read_reqs_per_sec: s.read_reqs_per_sec.unwrap_or(ONE_X_READS * devices),
        write_reqs_per_sec: s.write_reqs_per_sec.unwrap_or(ONE_X_WRITES * devices),
        record_bytes: s.record_bytes.unwrap_or(1536),
        large_block_bytes: s.large_block_op_kbytes.unwrap_or(128).saturating_mul(1024),
        replication_factor: s.replication_factor.unwrap_or(1),
        update_pct: s.update_pct.unwrap_or(0),
        defrag_lwm_pct: s.defrag_lwm_pct.unwrap_or(50),
        compress_pct: s.compress_pct.unwrap_or(100),
        disable_odsync: s.disable_odsync.unwrap_or(false),
        service_threads: s.service_threads.unwrap_or(5 * cpus.max(1)),
        max_lag_sec: s.max_lag_sec.unwrap_or(10),
        device_names,
    };
    check(&config)?;
    Ok(config)
}

fn check(c: &ActConfig) -> Result<(), String> {
    let fail = |name: &str, why: &str| Err(format!("{name}: {why}"));
    if c.device_names.is_empty() {
        return fail("device-names", "name at least one file or raw device");
    }
    if c.test_duration_sec == 0 {
        return fail("test-duration-sec", "must be at least 1");
    }
    if c.report_interval_sec == 0 {
        return fail("report-interval-sec", "must be at least 1");
    }
    if c.read_reqs_per_sec == 0 && c.write_reqs_per_sec == 0 {
        return fail(
            "read-reqs-per-sec",
            "read-reqs-per-sec and write-reqs-per-sec are both 0: nothing to test \
             (1x is 2000 reads/s and 1000 writes/s per device)",
        );
    }
    if c.record_bytes == 0 || c.record_bytes > c.large_block_bytes {
        return fail("record-bytes", "must be 1 .. large-block-op-kbytes × 1024");
    }
    if c.large_block_bytes < 4096 || !c.large_block_bytes.is_power_of_two() {
        return fail(
            "large-block-op-kbytes",
            "must be a power of two, at least 4",
        );
    }
    if c.replication_factor == 0 {
        return fail("replication-factor", "must be at least 1");
    }
    if c.update_pct > 100 {
        return fail("update-pct", "must be 0 .. 100");
    }
    if c.defrag_lwm_pct >= 100 {
        return fail("defrag-lwm-pct", "must be 0 .. 99");
    }
    if c.compress_pct == 0 || c.compress_pct > 100 {
        return fail("compress-pct", "must be 1 .. 100");
    }
    if c.service_threads == 0 {
        return fail("service-threads", "must be at least 1");
    }
    Ok(())
}

impl ActConfig {
    /// The rates ACT derives (see the module doc).
    pub fn derived(&self) -> Derived {
        let internal_read_reqs_per_sec = self.read_reqs_per_sec as f64
            + (self.write_reqs_per_sec * u64::from(self.update_pct)) as f64 / 100.0;
        let record_stored_bytes = self.record_bytes.div_ceil(16) * 16;
        let written_bytes_per_sec = self.write_reqs_per_sec as f64
            * f64::from(self.replication_factor)
            * f64::from(record_stored_bytes);
        let original = written_bytes_per_sec / f64::from(self.large_block_bytes);
        let defrag_write_amplification = 100.0 / f64::from(100 - self.defrag_lwm_pct);
        let large_block = original * defrag_write_amplification;
        Derived {
            internal_read_reqs_per_sec,
            record_stored_bytes,
            defrag_write_amplification,
            large_block_reads_per_sec: large_block,
            large_block_writes_per_sec: large_block,
        }
    }

    /// This configuration with its request rates multiplied by `factor`.
    pub fn scaled(&self, factor: u64) -> ActConfig {
        ActConfig {
            read_reqs_per_sec: self.read_reqs_per_sec.saturating_mul(factor),
            write_reqs_per_sec: self.write_reqs_per_sec.saturating_mul(factor),
            ..self.clone()
        }
    }

    /// ACT's echo of its configuration.
    pub fn echo(&self) -> String {
        let names: Vec<String> = self
            .device_names
            .iter()
            .map(|path| path.display().to_string())
            .collect();
        let yes_no = |flag: bool| if flag { "yes" } else { "no" };
        let d = self.derived();
        format!(
            "ACT_STORAGE CONFIGURATION (citrine act)\n\
             device-names: {}\nnum-devices: {}\nservice-threads: {}\n\
             test-duration-sec: {}\nreport-interval-sec: {}\nmicrosecond-histograms: {}\n\
             read-reqs-per-sec: {}\nwrite-reqs-per-sec: {}\nrecord-bytes: {}\n\
             large-block-op-kbytes: {}\nreplication-factor: {}\nupdate-pct: {}\n\
             defrag-lwm-pct: {}\ncompress-pct: {}\ndisable-odsync: {}\nmax-lag-sec: {}\n\
             file-size-mbytes: {}\n\n\
             DERIVED CONFIGURATION\n\
             internal read requests per sec: {:.0}\nbytes per stored record: {}\n\
             defrag write amplification: {:.2}\n\
             large block reads per sec: {:.2}\nlarge block writes per sec: {:.2}\n",
            names.join(","),
            self.device_names.len(),
            self.service_threads,
            self.test_duration_sec,
            self.report_interval_sec,
            yes_no(self.microsecond_histograms),
            self.read_reqs_per_sec,
            self.write_reqs_per_sec,
            self.record_bytes,
            self.large_block_bytes / 1024,
            self.replication_factor,
            self.update_pct,
            self.defrag_lwm_pct,
            self.compress_pct,
            yes_no(self.disable_odsync),
            self.max_lag_sec,
            self.file_size_bytes >> 20,
            d.internal_read_reqs_per_sec,
            d.record_stored_bytes,
            d.defrag_write_amplification,
            d.large_block_reads_per_sec,
            d.large_block_writes_per_sec,
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn one_device() -> Settings {
        Settings {
            device_names: Some(vec![PathBuf::from("/dev/null")]),
            ..Settings::default()
        }
    }

    #[test]
    fn one_x_is_acts_one_x() {
        let config = resolve(one_device(), 2).unwrap();
        assert_eq!(
            (config.read_reqs_per_sec, config.write_reqs_per_sec),
            (2000, 1000)
        );
        assert_eq!(config.service_threads, 10);
        assert_eq!(config.large_block_bytes, 128 << 10);
        let d = config.derived();
        assert_eq!(d.internal_read_reqs_per_sec, 2000.0);
        // 1000 × 1536 / 131072 × 2 = 23.4375.
        assert_eq!(d.large_block_writes_per_sec, 23.4375);
        assert_eq!(d.large_block_reads_per_sec, 23.4375);
        let two = Settings {
            device_names: Some(vec!["/a".into(), "/b".into()]),
            ..Settings::default()
        };
        let config = resolve(two, 2).unwrap();
        assert_eq!(
            (config.read_reqs_per_sec, config.write_reqs_per_sec),
            (4000, 2000)
        );
        let tripled = config.scaled(3);
        assert_eq!(
            (tripled.read_reqs_per_sec, tripled.write_reqs_per_sec),
            (12000, 6000)
        );
        assert_eq!(tripled.derived().large_block_writes_per_sec, 6.0 * 23.4375);
        assert_eq!(config.scaled(u64::MAX).read_reqs_per_sec, u64::MAX);
    }

    #[test]
    fn readme_example_of_the_large_block_rate() {
        // ACT's README: record-bytes 1500 → 1504 stored, 1000 writes/s,
        // 128 KiB blocks: 11.4746 blocks/s, doubled by defrag-lwm-pct 50.
        let settings = Settings {
            record_bytes: Some(1500),
            write_reqs_per_sec: Some(1000),
            ..one_device()
        };
        let d = resolve(settings, 1).unwrap().derived();
        assert_eq!(d.record_stored_bytes, 1504);
        assert!((d.large_block_writes_per_sec - 22.949).abs() < 0.001);
    }

    #[test]
    fn replication_update_and_lwm_scale_the_load() {
        let settings = Settings {
            replication_factor: Some(2),
            update_pct: Some(50),
            defrag_lwm_pct: Some(60),
            ..one_device()
        };
        let d = resolve(settings, 1).unwrap().derived();
        assert_eq!(d.internal_read_reqs_per_sec, 2500.0);
        assert_eq!(d.defrag_write_amplification, 2.5);
        assert!(
            (d.large_block_writes_per_sec - 1000.0 * 2.0 * 1536.0 / 131072.0 * 2.5).abs() < 1e-9
        );
    }

    #[test]
    fn the_file_parses_and_flags_win() {
        let text =
            "# 1x\ndevice-names: /dev/sdb, /dev/sdc\nread-reqs-per-sec: 4000 # two devices\n\
                    write-reqs-per-sec: 2000\nmicrosecond-histograms: yes\nscheduler-mode: noop\n";
        let file = parse_file(text).unwrap();
        assert_eq!(file.device_names.as_ref().unwrap().len(), 2);
        assert_eq!(file.read_reqs_per_sec, Some(4000));
        assert_eq!(file.microsecond_histograms, Some(true));
        let flags = Settings {
            read_reqs_per_sec: Some(100),
            ..Settings::default()
        };
        let merged = file.overridden_by(flags);
        assert_eq!(merged.read_reqs_per_sec, Some(100));
        assert_eq!(merged.write_reqs_per_sec, Some(2000));
        assert!(parse_file("record-bytes 1536\n")
            .unwrap_err()
            .contains("line 1"));
        assert!(parse_file("bogus: 1\n").unwrap_err().contains("bogus"));
        assert!(parse_file("record-bytes: 1.5k\n")
            .unwrap_err()
            .contains("record-bytes"));
    }

    #[test]
    fn bad_settings_are_refused_by_name() {
        let refused = |settings: Settings| resolve(settings, 2).unwrap_err();
        assert!(refused(Settings::default()).contains("device-names"));
        let zero = Settings {
            read_reqs_per_sec: Some(0),
            write_reqs_per_sec: Some(0),
            ..one_device()
        };
        assert!(refused(zero).contains("both 0"));
        for (settings, name) in [
            (
                Settings {
                    large_block_op_kbytes: Some(100),
                    ..one_device()
                },
                "large-block-op-kbytes",
            ),
            (
                Settings {
                    record_bytes: Some(0),
                    ..one_device()
                },
                "record-bytes",
            ),
            (
                Settings {
                    defrag_lwm_pct: Some(100),
                    ..one_device()
                },
                "defrag-lwm-pct",
            ),
            (
                Settings {
                    update_pct: Some(101),
                    ..one_device()
                },
                "update-pct",
            ),
            (
                Settings {
                    test_duration_sec: Some(0),
                    ..one_device()
                },
                "test-duration-sec",
            ),
            (
                Settings {
                    service_threads: Some(0),
                    ..one_device()
                },
                "service-threads",
            ),
            (
                Settings {
                    compress_pct: Some(0),
                    ..one_device()
                },
                "compress-pct",
            ),
        ] {
            assert!(refused(settings).starts_with(name), "{name}");
        }
        // A read-only or a write-only load is fine.
        let read_only = Settings {
            write_reqs_per_sec: Some(0),
            ..one_device()
        };
        assert_eq!(
            resolve(read_only, 1)
                .unwrap()
                .derived()
                .large_block_writes_per_sec,
            0.0
        );
    }
}
