//! `citrine verify`: runs a Jepsen-style workload (register, counter, set)
//! against a live cluster from many clients, then checks the history with
//! `citrine-verify`'s checkers and prints a plain verdict.
//!
//! Owns the command line (durations as `60s`, `2m`, `500ms`), the progress
//! lines (one per second while the clients run) and the verdict's text.
//! Exit status: 0 valid, 1 anomaly, 2 unknown or could not run.

use crate::{CliResult, HostArgs};
use citrine_client::ReadModeSc;
use citrine_verify::linear::Limits;
use citrine_verify::workload::{self, Progress};
use citrine_verify::{Report, Status, Workload, WorkloadConfig};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(clap::Args, Debug)]
#[command(
    disable_help_flag = true,
    after_help = "Workloads (Jepsen's Aerospike tests):\n  \
                  register  reads, writes, generation-checked compare-and-sets; checked for linearizability per key\n  \
                  counter   increments and reads; no acknowledged increment lost, no read beyond every attempt\n  \
                  set       appends of unique elements to a list bin and a final read; no acknowledged element lost\n\
                  Exit status: 0 valid, 1 anomaly found, 2 undecided (a checker bound was hit) or could not run.\n\
                  Example:\n  citrine verify -h 127.0.0.1:3000 -n test --workload register --time 60s"
)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub host: HostArgs,
    /// Namespace.
    #[arg(short = 'n', long = "namespace", default_value = "test")]
    pub namespace: String,
    /// register, counter or set.
    #[arg(long = "workload", default_value = "register")]
    pub workload: Workload,
    /// How long the clients run (e.g. 60s, 2m, 500ms).
    #[arg(long = "time", default_value = "60s", value_parser = parse_duration)]
    pub time: Duration,
    /// Concurrent clients.
    #[arg(long = "clients", default_value_t = 10)]
    pub clients: usize,
    /// Keys in use at a time.
    #[arg(long = "keys", default_value_t = 5)]
    pub keys: usize,
    /// Register and set: operations on a key before the clients move to a
    /// fresh one (default 200 register, 1000 set).
    #[arg(long = "ops-per-key")]
    pub ops_per_key: Option<u64>,
    /// Set the records go in (default: verify-<unix time>, fresh each run).
    #[arg(short = 's', long = "set")]
    pub set: Option<String>,
    /// Time the checker may take before answering undecided.
    #[arg(long = "check-time", default_value = "60s", value_parser = parse_duration)]
    pub check_time: Duration,
    /// Memory the linearizability search may use, in MiB, before answering undecided.
    #[arg(long = "check-memory", default_value_t = 1024, value_name = "MIB")]
    pub check_memory_mib: usize,
    /// Seed of the clients' random choices.
    #[arg(long = "seed", default_value_t = 1)]
    pub seed: u64,
    /// Reads of a strong-consistency namespace: linearize, session,
    /// allow-replica or allow-unavailable (AP namespaces ignore it).
    #[arg(long = "read-mode", default_value = "linearize", value_parser = parse_read_mode)]
    pub read_mode: ReadModeSc,
}

/// The `--read-mode` names (the official clients' `ReadModeSC` values).
pub fn parse_read_mode(text: &str) -> Result<ReadModeSc, String> {
    match text {
        "linearize" => Ok(ReadModeSc::Linearize),
        "session" => Ok(ReadModeSc::Session),
        "allow-replica" => Ok(ReadModeSc::AllowReplica),
        "allow-unavailable" => Ok(ReadModeSc::AllowUnavailable),
        other => Err(format!(
            "unknown read mode {other:?} (linearize, session, allow-replica, allow-unavailable)"
        )),
    }
}

/// Parses `60s`, `2m`, `1h`, `500ms`, or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration: use e.g. 60s, 2m, 500ms"))?;
    let seconds = match unit {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?}: use ms, s, m or h"
            ))
        }
    };
    Duration::try_from_secs_f64(seconds).map_err(|error| format!("{text:?}: {error}"))
}

pub async fn run(args: VerifyArgs) -> CliResult {
    let config = config_of(&args);
    outln!(
        "verify: {} workload on {} namespace {} set {}: {} clients, {} keys, {:?}",
        args.workload.name(),
        args.host.host,
        config.namespace,
        config.set,
        config.clients,
        config.keys,
        config.duration
    );
    let history = match workload::run(&config, print_progress).await {
        Ok(history) => history,
        Err(message) => {
            outln!("verdict: COULD NOT RUN: {message}");
            return Ok(ExitCode::from(Status::Unknown.exit_code()));
        }
    };
    outln!("checking {} events...", history.events.len());
    let started = Instant::now();
    let limits = Limits {
        deadline: started + args.check_time,
        memory_bytes: args.check_memory_mib.saturating_mul(1 << 20),
    };
    let report = citrine_verify::check(args.workload, &history, &limits);
    print_report(&report, started.elapsed());
    Ok(ExitCode::from(report.status.exit_code()))
}

fn config_of(args: &VerifyArgs) -> WorkloadConfig {
    let mut config = WorkloadConfig::new(&args.host.host, &args.namespace, args.workload);
    config.set = args.set.clone().unwrap_or_else(|| {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        format!("verify-{}", now.as_secs())
    });
    config.duration = args.time;
    config.clients = args.clients.max(1);
    config.keys = args.keys.clamp(1, config.clients);
    if let Some(ops) = args.ops_per_key {
        config.ops_per_key = ops.max(1);
    }
    config.timeout = Duration::from_millis(args.host.timeout_ms.max(1));
    config.seed = args.seed;
    config.read_mode_sc = args.read_mode;
    config
}

fn print_progress(progress: &Progress) {
    let total = progress.ok + progress.fail + progress.info;
    let rate = total as f64 / progress.elapsed.as_secs_f64().max(1e-3);
    outln!(
        "[{:>5.1}s] {total} ops ({rate:.0}/s): {} ok, {} failed, {} in doubt",
        progress.elapsed.as_secs_f64(),
        progress.ok,
        progress.fail,
        progress.info
    );
}

/// How many anomalies (and undecided keys) the verdict prints in full.
const SHOWN: usize = 10;

fn print_report(report: &Report, took: Duration) {
    for line in &report.summary {
        outln!("{line}");
    }
    for anomaly in report.anomalies.iter().take(SHOWN) {
        outln!("ANOMALY {anomaly}");
    }
    if report.anomalies.len() > SHOWN {
        outln!("... and {} more anomalies", report.anomalies.len() - SHOWN);
    }
    for reason in report.unknown.iter().take(SHOWN) {
        outln!("undecided: {reason}");
    }
    if report.unknown.len() > SHOWN {
        outln!(
            "... and {} more undecided keys",
            report.unknown.len() - SHOWN
        );
    }
    let verdict = match report.status {
        Status::Valid => "VALID: no anomaly found",
        Status::Anomaly => "ANOMALY: the history breaks the workload's guarantees (see above)",
        Status::Unknown => "UNKNOWN: the checker could not decide every key (see above)",
    };
    outln!("checked in {:.2}s", took.as_secs_f64());
    outln!("verdict: {verdict}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_their_units() {
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5d").is_err());
    }
}
