//! `citrine act`: the ACT device test (Aerospike Certification Tool's
//! `act_storage`, paper 002) on Citrine's device engine I/O path.
//!
//! It models the I/O a node puts on a device: small reads of records
//! (`record-bytes`, 1.5 KiB by default) at random addresses of written data,
//! and the large-block (128 KiB) writes of the write buffers with, as many,
//! the defragmenter's large-block reads, all at the configured rates (1x =
//! 2 000 reads/s and 1 000 writes/s per device; writes become large blocks
//! amplified by `defrag-lwm-pct`, see [`config`]) for the configured time.
//! Per report interval it prints ACT's histograms and the share of reads
//! over 1 .. 64 ms; at the end `act_latency`'s table and a verdict against
//! the pass criteria ([`analysis`]). `--ramp` raises the load step by step
//! until the 95th percentile of reads exceeds 2 ms and reports the highest
//! load that stayed within.
//!
//! The I/O is the engine's own: devices are opened with
//! `DeviceFile::open_dsync` and read and written through its `BlockIo`
//! (`read_at`, `write_at`, `O_DIRECT` with aligned buffers as the engine
//! does them), so a record read costs what it costs the engine (the
//! covering 4 KiB-aligned range). Only the addresses and rates are ACT's.
//!
//! Module map: [`config`] (settings, checks, derived rates), [`hist`]
//! (ACT histograms), [`analysis`] (shares, slices, verdict, ramp rule),
//! [`schedule`] (rate control), [`device`] (opening, salting),
//! [`run`] (threads and reports), [`rng`].
//!
//! Invariants: bad input (no device, a path that cannot be opened, a
//! device too small, zero rates, out-of-range settings) is refused before
//! any I/O with a message naming the setting; exit status 0 = passed,
//! 2 = did not pass (or no ramp step passed), 1 = error.

mod analysis;
mod config;
mod device;
mod hist;
mod rng;
mod run;
mod schedule;

use crate::CliResult;
use analysis::{RampStep, Slice};
use citrine_storage::device::io::IoMode;
use config::{ActConfig, Settings};
use hist::Counts;
use run::{Outcome, Report, Shared};
use std::path::PathBuf;
use std::process::ExitCode;

pub const LONG_ABOUT: &str = "\
Run the ACT device test (Aerospike Certification Tool, act_storage) on files or raw devices,
through Citrine's device engine I/O path (O_DIRECT, O_DSYNC unless --disable-odsync).

The load: record-bytes reads at random addresses of written data, on service-threads threads,
and per device one thread of large-block writes and one of large-block reads (defragmentation)
at write-reqs-per-sec x replication-factor x record size / large block x 100/(100-defrag-lwm-pct).
1x is 2000 reads/s and 1000 writes/s per device (the default rates).
A file that does not exist (or is shorter) is created with file-size-mbytes and first salted
with random data. THE TEST OVERWRITES THE DEVICES: never point it at a device holding data.

Every report-interval-sec it prints ACT's histograms (bucket NN = under 2^NN ms, or us) and the
share of reads over 1, 2, 4 .. 64 ms in that interval; at the end act_latency's table and the
verdict. Pass criteria (ACT): in every hour (slice), fewer than 5 % of reads over 1 ms,
fewer than 1 % over 8 ms and fewer than 0.1 % over 64 ms. --ramp raises the load (1x, 2x, 3x..
or 1x, 2x, 4x..) until the 95th percentile of reads exceeds 2 ms (paper 002) and reports the
highest load within it.

Settings use ACT's names, as flags or in an ACT-style --config file (`name: value` lines,
`#` comments); flags win. Exit status: 0 passed, 2 did not pass, 1 error.

Examples:
  citrine act --device-names /work/act.dat --file-size-mbytes 4096 --test-duration-sec 60
  citrine act --device-names /dev/nvme1n1 --load 30 --test-duration-sec 86400
  citrine act --config actconfig.txt
  citrine act --device-names /work/act.dat --file-size-mbytes 1024 --test-duration-sec 30 --ramp";

/// `citrine act` options: ACT's settings by their names, and Citrine's own.
#[derive(clap::Args, Debug)]
pub struct ActArgs {
    /// ACT-style config file (`name: value` lines); flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Files or raw block devices to test, comma-separated.
    #[arg(long, value_name = "PATH[,PATH..]")]
    pub device_names: Option<String>,
    /// Size of a file to create (or extend) for the test, in MiB.
    #[arg(long, value_name = "MIB")]
    pub file_size_mbytes: Option<u64>,
    /// Length of the test (ACT's default: 86400).
    #[arg(long, value_name = "SEC")]
    pub test_duration_sec: Option<u64>,
    /// Seconds between reports (default 1).
    #[arg(long, value_name = "SEC")]
    pub report_interval_sec: Option<u64>,
    /// Histograms in microseconds instead of milliseconds (yes/no).
    #[arg(long, value_name = "yes|no", num_args = 0..=1, default_missing_value = "yes", value_parser = yes_no)]
    pub microsecond_histograms: Option<bool>,
    /// Client reads per second, over all devices (default 2000 per device).
    #[arg(long, value_name = "N")]
    pub read_reqs_per_sec: Option<u64>,
    /// Client writes per second, over all devices (default 1000 per device).
    #[arg(long, value_name = "N")]
    pub write_reqs_per_sec: Option<u64>,
    /// Sets both rates to N times 1x for the devices named.
    #[arg(long, value_name = "N", conflicts_with_all = ["read_reqs_per_sec", "write_reqs_per_sec"])]
    pub load: Option<u64>,
    /// Record size: the size of each read (default 1536).
    #[arg(long, value_name = "BYTES")]
    pub record_bytes: Option<u32>,
    /// Size of each large-block read and write (default 128).
    #[arg(long, value_name = "KIB")]
    pub large_block_op_kbytes: Option<u32>,
    /// Writes count this many times (replica writes; default 1).
    #[arg(long, value_name = "N")]
    pub replication_factor: Option<u32>,
    /// Share of writes that are updates, which read the record first (default 0).
    #[arg(long, value_name = "PCT")]
    pub update_pct: Option<u32>,
    /// Defragmentation threshold: write amplification 100/(100-PCT) (default 50).
    #[arg(long, value_name = "PCT")]
    pub defrag_lwm_pct: Option<u32>,
    /// Share of each written block that is random, the rest zeros (default 100).
    #[arg(long, value_name = "PCT")]
    pub compress_pct: Option<u32>,
    /// Open the devices without O_DSYNC (yes/no).
    #[arg(long, value_name = "yes|no", num_args = 0..=1, default_missing_value = "yes", value_parser = yes_no)]
    pub disable_odsync: Option<bool>,
    /// Threads issuing the reads (default 5 per CPU).
    #[arg(long, value_name = "N")]
    pub service_threads: Option<u32>,
    /// Stop when a thread falls this far behind its schedule; 0 = never (default 10).
    #[arg(long, value_name = "SEC")]
    pub max_lag_sec: Option<u64>,
    /// Raise the load until p95 of reads exceeds 2 ms (steps of test-duration-sec).
    #[arg(long, value_name = "STEP", num_args = 0..=1, default_missing_value = "linear")]
    pub ramp: Option<RampStep>,
    /// Highest load multiple the ramp tries.
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub ramp_max: u64,
    /// Length of a slice of the final analysis (act_latency's -t).
    #[arg(long, value_name = "SEC", default_value_t = 3600)]
    pub slice_sec: u64,
    /// Salt (fill with random data) the devices first even if not created here.
    #[arg(long)]
    pub prep: bool,
    /// Through the page cache instead of O_DIRECT (not ACT: for filesystems
    /// that refuse O_DIRECT).
    #[arg(long)]
    pub buffered: bool,
    /// Seed of the random addresses (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
}

fn yes_no(value: &str) -> Result<bool, String> {
    match value {
        "yes" | "true" => Ok(true),
        "no" | "false" => Ok(false),
        _ => Err(format!("expected yes or no, got `{value}`")),
    }
}

/// Runs `citrine act`.
pub fn run(args: ActArgs) -> CliResult {
    let config = configuration(&args)?;
    let mode = if args.buffered {
        IoMode::Buffered
    } else {
        IoMode::Direct
    };
    if args.ramp.is_some() && config.read_reqs_per_sec == 0 {
        return Err("act: --ramp judges read latency: read-reqs-per-sec must not be 0".into());
    }
    let seed = args.seed.unwrap_or_else(clock_seed);
    outln!("{}", config.echo());
    outln!("io: {mode:?}, seed: {seed}\n");
    let targets = device::open_all(&config, mode).map_err(|error| format!("act: {error}"))?;
    prepare(&targets, &config, args.prep, seed)?;
    match args.ramp {
        Some(step) => ramp(&config, &targets, &args, step, seed),
        None => single(&config, &targets, args.slice_sec, seed),
    }
}

/// The file's settings overridden by the flags, resolved and checked.
fn configuration(args: &ActArgs) -> Result<ActConfig, String> {
    let from_file = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|error| format!("act: cannot read {}: {error}", path.display()))?;
            config::parse_file(&text)
                .map_err(|error| format!("act: {}: {error}", path.display()))?
        }
        None => Settings::default(),
    };
    let mut settings = from_file.overridden_by(flag_settings(args));
    if let Some(load) = args.load {
        let devices = settings.device_names.as_ref().map_or(0, Vec::len) as u64;
        let per_device = |one_x: u64| load.saturating_mul(one_x).saturating_mul(devices);
        settings.read_reqs_per_sec = Some(per_device(config::ONE_X_READS));
        settings.write_reqs_per_sec = Some(per_device(config::ONE_X_WRITES));
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    config::resolve(settings, cpus).map_err(|error| format!("act: {error}"))
}

fn flag_settings(args: &ActArgs) -> Settings {
    Settings {
        device_names: args.device_names.as_deref().map(config::device_list),
        file_size_mbytes: args.file_size_mbytes,
        test_duration_sec: args.test_duration_sec,
        report_interval_sec: args.report_interval_sec,
        microsecond_histograms: args.microsecond_histograms,
        read_reqs_per_sec: args.read_reqs_per_sec,
        write_reqs_per_sec: args.write_reqs_per_sec,
        record_bytes: args.record_bytes,
        large_block_op_kbytes: args.large_block_op_kbytes,
        replication_factor: args.replication_factor,
        update_pct: args.update_pct,
        defrag_lwm_pct: args.defrag_lwm_pct,
        compress_pct: args.compress_pct,
        disable_odsync: args.disable_odsync,
        service_threads: args.service_threads,
        max_lag_sec: args.max_lag_sec,
    }
}

fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |elapsed| elapsed.as_nanos() as u64)
}

/// Salts the devices this run created (or all with `--prep`).
fn prepare(
    targets: &[device::Target],
    config: &ActConfig,
    all: bool,
    seed: u64,
) -> Result<(), String> {
    let mut rng = rng::Rng::new(seed ^ 0x5A17);
    for target in targets.iter().filter(|target| all || target.fresh) {
        let bytes = target.usable_bytes(config);
        let seconds =
            device::salt(target, config, &mut rng).map_err(|error| format!("act: {error}"))?;
        outln!(
            "salted {}: {} MiB of random data in {seconds:.1} s ({:.0} MiB/s)",
            target.name,
            bytes >> 20,
            (bytes >> 20) as f64 / seconds.max(1e-9)
        );
    }
    Ok(())
}

/// One test: reports, the analysis and the verdict.
fn single(config: &ActConfig, targets: &[device::Target], slice_sec: u64, seed: u64) -> CliResult {
    print_histogram_names(config, targets);
    let outcome = run::run(config, targets, seed, printer(config))
        .map_err(|error| format!("act: {error}"))?;
    let summary = summarize(config, &outcome, slice_sec);
    let passed = summary.verdict.passed && outcome.stopped_early.is_none();
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}

fn print_histogram_names(config: &ActConfig, targets: &[device::Target]) {
    outln!("HISTOGRAM NAMES");
    if config.derived().internal_read_reqs_per_sec > 0.0 {
        outln!("reads");
        for target in targets {
            outln!("{}-reads", target.name);
        }
    }
    if config.write_reqs_per_sec != 0 {
        outln!("large-block-reads\nlarge-block-writes");
    }
    outln!();
}

/// Prints each report as ACT does, plus the interval's shares of reads.
fn printer(config: &ActConfig) -> impl FnMut(&Shared, &Report) + '_ {
    let mut previous_reads = Counts::empty(hist::Scale::Millis);
    let reads_on = config.derived().internal_read_reqs_per_sec > 0.0;
    let writes_on = config.write_reqs_per_sec != 0;
    move |shared, report| {
        let counts = if config.microsecond_histograms {
            &report.us
        } else {
            &report.ms
        };
        let mut text = format!("after {} sec:\n", report.sec);
        for (recorder, counts) in shared.recorders().iter().zip(counts) {
            let is_large_block = recorder.tag.starts_with("large-block-");
            if (is_large_block && writes_on) || (!is_large_block && reads_on) {
                text.push_str(&counts.dump(&recorder.tag));
            }
        }
        let interval = report.ms[0].since(&previous_reads);
        text.push_str(&format!(
            "reads %>(ms) in this interval:{}\n",
            analysis::shares_line(&interval)
        ));
        previous_reads = report.ms[0].clone();
        outln!("{text}");
    }
}

struct Summary {
    verdict: analysis::Verdict,
    reads_ms: Counts,
}

/// Prints the rates achieved, act_latency's table and the verdict.
fn summarize(config: &ActConfig, outcome: &Outcome, slice_sec: u64) -> Summary {
    let last = outcome.reports.last();
    // The rates over the test's time, or until the last operation when the
    // threads ran late (every operation due in the test's time is issued).
    let seconds = (last.map_or(1, |report| report.sec) as f64).max(outcome.elapsed.as_secs_f64());
    let total = |index: usize| last.map_or(0, |report| report.ms[index].total());
    let histograms = last.map_or(0, |report| report.ms.len());
    outln!(
        "SUMMARY: last operation done at {:.2} s; largest lag behind the schedule: {}; \
         achieved reads {:.1}/s, large-block reads {:.2}/s, large-block writes {:.2}/s \
         (configured {:.1}, {:.2}, {:.2})",
        outcome.elapsed.as_secs_f64(),
        lags_text(outcome),
        total(0) as f64 / seconds,
        total(histograms.saturating_sub(2)) as f64 / seconds,
        total(histograms.saturating_sub(1)) as f64 / seconds,
        config.derived().internal_read_reqs_per_sec,
        config.derived().large_block_reads_per_sec,
        config.derived().large_block_writes_per_sec,
    );
    if let Some(reason) = &outcome.stopped_early {
        outln!("STOPPED EARLY: {reason}");
    }
    let reads_ms: Vec<(u64, Counts)> = outcome
        .reports
        .iter()
        .map(|r| (r.sec, r.ms[0].clone()))
        .collect();
    let slices_ms = analysis::slices(&reads_ms, slice_sec);
    let shown: Vec<Slice> = if config.microsecond_histograms {
        let reads_us: Vec<(u64, Counts)> = outcome
            .reports
            .iter()
            .map(|r| (r.sec, r.us[0].clone()))
            .collect();
        analysis::slices(&reads_us, slice_sec)
    } else {
        slices_ms.clone()
    };
    outln!(
        "\nslices of {slice_sec} s:\n{}",
        analysis::table("reads", &shown)
    );
    let verdict = analysis::verdict(&slices_ms);
    outln!("{}", verdict.describe());
    let reads = last.map_or(Counts::empty(hist::Scale::Millis), |report| {
        report.ms[0].clone()
    });
    outln!(
        "p95 of reads within 2 ms (paper 002's limit): {}",
        match analysis::within_p95_limit(&reads) {
            Some(true) => "yes",
            Some(false) => "no",
            None => "no reads",
        }
    );
    outln!(
        "note: ACT certifies a device on runs of 24 h or more; this verdict covers the {:.0} s measured.",
        seconds
    );
    Summary {
        verdict,
        reads_ms: reads,
    }
}

/// The ramp: 1x, 2x, ... (or doubling) until p95 of reads exceeds 2 ms.
fn ramp(
    config: &ActConfig,
    targets: &[device::Target],
    args: &ActArgs,
    step: RampStep,
    seed: u64,
) -> CliResult {
    let mut steps: Vec<(u64, bool)> = Vec::new();
    let mut lines = Vec::new();
    for load in analysis::ramp_loads(step, args.ramp_max.max(1)) {
        let scaled = config.scaled(load);
        outln!(
            "RAMP STEP {load}x: read-reqs-per-sec {}, write-reqs-per-sec {}\n",
            scaled.read_reqs_per_sec,
            scaled.write_reqs_per_sec
        );
        print_histogram_names(&scaled, targets);
        let outcome = run::run(&scaled, targets, seed ^ load, printer(&scaled))
            .map_err(|error| format!("act: {error}"))?;
        let summary = summarize(&scaled, &outcome, args.slice_sec);
        let (status, passed) = step_status(&outcome, &summary, scaled.report_interval_sec);
        lines.push(ramp_line(load, &scaled, &summary, &outcome, status));
        steps.push((load, passed));
        outln!(
            "ramp step {load}x: {status}{}\n",
            if passed { "" } else { ": the ramp stops" }
        );
        if !passed {
            break;
        }
    }
    outln!("RAMP SUMMARY (reads % at or over N ms, whole step)");
    outln!(
        "load  reads/s  writes/s     >1ms     >2ms     >8ms    >64ms  lag (ms)  step                   ACT criteria"
    );
    for line in &lines {
        outln!("{line}");
    }
    match analysis::highest_passing(&steps) {
        Some(load) => {
            let best = config.scaled(load);
            outln!(
                "RAMP RESULT: highest load with p95 of reads within 2 ms: {load}x ({} reads/s, {} writes/s)",
                best.read_reqs_per_sec,
                best.write_reqs_per_sec
            );
            Ok(ExitCode::SUCCESS)
        }
        None => {
            outln!("RAMP RESULT: no load passed (1x already over the limit)");
            Ok(ExitCode::from(2))
        }
    }
}

/// Whether a ramp step passed: p95 of reads within 2 ms, with the load
/// delivered (not stopped, and no operation more than one report interval
/// behind its due time, else the devices saw less than the step's load).
fn step_status(outcome: &Outcome, summary: &Summary, interval_sec: u64) -> (&'static str, bool) {
    if outcome.stopped_early.is_some() {
        return ("stopped (max-lag-sec)", false);
    }
    if outcome.max_lag() > std::time::Duration::from_secs(interval_sec) {
        return ("behind schedule", false);
    }
    match analysis::within_p95_limit(&summary.reads_ms) {
        Some(true) => ("p95 <= 2 ms", true),
        _ => ("p95 > 2 ms", false),
    }
}

/// One row of the ramp's summary.
fn ramp_line(
    load: u64,
    scaled: &ActConfig,
    summary: &Summary,
    outcome: &Outcome,
    status: &str,
) -> String {
    let over = |threshold| summary.reads_ms.percent_over(threshold).unwrap_or(0.0);
    format!(
        "{load:>4}x {:>9} {:>9} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>9.1}  {status:<21}  {}",
        scaled.read_reqs_per_sec,
        scaled.write_reqs_per_sec,
        over(1),
        over(2),
        over(8),
        over(64),
        outcome.max_lag().as_secs_f64() * 1e3,
        if summary.verdict.passed {
            "ACT pass"
        } else {
            "ACT fail"
        },
    )
}

/// The largest lag of each stream, e.g. `reads 2.1 ms, large-block reads 0.3 ms, ...`.
fn lags_text(outcome: &Outcome) -> String {
    let parts: Vec<String> = run::Stream::ALL
        .iter()
        .map(|stream| {
            let lag = outcome.lags[*stream as usize].as_secs_f64() * 1e3;
            format!("{} {lag:.1} ms", stream.name())
        })
        .collect();
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn outcome(lag_ms: u64, stopped: bool) -> Outcome {
        Outcome {
            reports: Vec::new(),
            stopped_early: stopped.then(|| "reads fell behind".to_string()),
            elapsed: Duration::from_secs(20),
            lags: [
                Duration::from_millis(lag_ms),
                Duration::ZERO,
                Duration::ZERO,
            ],
        }
    }

    /// Reads with `slow` of 100 at 3 ms, the rest under 1 ms.
    fn summary(slow: u64) -> Summary {
        let histogram = hist::Histogram::new(hist::Scale::Millis);
        (0..100 - slow).for_each(|_| histogram.insert(100_000));
        (0..slow).for_each(|_| histogram.insert(3_000_000));
        let reads_ms = histogram.snapshot();
        let slice = Slice {
            end_sec: 20,
            counts: reads_ms.clone(),
        };
        Summary {
            verdict: analysis::verdict(&[slice]),
            reads_ms,
        }
    }

    #[test]
    fn a_ramp_step_passes_only_on_time_and_within_p95() {
        assert_eq!(
            step_status(&outcome(900, false), &summary(5), 1),
            ("p95 <= 2 ms", true)
        );
        assert_eq!(
            step_status(&outcome(10, false), &summary(6), 1),
            ("p95 > 2 ms", false)
        );
        // Low latencies do not count when the load was not delivered on time.
        assert_eq!(
            step_status(&outcome(1_100, false), &summary(0), 1),
            ("behind schedule", false)
        );
        assert_eq!(
            step_status(&outcome(1_100, false), &summary(0), 2),
            ("p95 <= 2 ms", true)
        );
        assert_eq!(
            step_status(&outcome(0, true), &summary(0), 1),
            ("stopped (max-lag-sec)", false)
        );
        let line = ramp_line(
            4,
            &test_config(),
            &summary(5),
            &outcome(1_100, false),
            "behind schedule",
        );
        assert!(line.starts_with("   4x      2000      1000     5.00     5.00     0.00     0.00    1100.0  behind schedule"), "{line}");
    }

    fn test_config() -> ActConfig {
        let settings = Settings {
            device_names: Some(vec![PathBuf::from("/dev/null")]),
            ..Settings::default()
        };
        config::resolve(settings, 1).expect("a valid configuration")
    }
}
