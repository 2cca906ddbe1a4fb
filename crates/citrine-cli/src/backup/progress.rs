//! Progress and the closing summary of a backup or restore.
//!
//! [`Counters`] are shared by every worker (atomics, no lock on the record
//! path); outcomes other than success are counted by reason. On a
//! terminal, [`Ticker`] redraws one status line on stderr four times a
//! second (records, records/s, MB/s, percent and ETA when the total is
//! known); otherwise it prints a plain line every `plain_every`. The
//! summary goes to stdout so scripts can read it.

use std::collections::BTreeMap;
use std::io::{IsTerminal as _, Write as _};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a run has done so far.
#[derive(Default)]
pub struct Counters {
    /// Records backed up, or restored.
    pub records: AtomicU64,
    /// Bytes of backup text written, or of the file read.
    pub bytes: Arc<AtomicU64>,
    /// The amount `bytes` or `records` grows to, when known (for the ETA).
    pub total: AtomicU64,
    /// Whether `total` counts bytes (restore) rather than records (backup).
    pub total_is_bytes: AtomicBool,
    skipped: Mutex<BTreeMap<String, u64>>,
    failed: Mutex<BTreeMap<String, u64>>,
}

impl Counters {
    pub fn skip(&self, reason: impl Into<String>) {
        bump(&self.skipped, reason.into());
    }

    pub fn fail(&self, reason: impl Into<String>) {
        bump(&self.failed, reason.into());
    }

    pub fn skipped(&self) -> BTreeMap<String, u64> {
        self.skipped
            .lock()
            .map(|map| map.clone())
            .unwrap_or_default()
    }

    pub fn failed(&self) -> BTreeMap<String, u64> {
        self.failed
            .lock()
            .map(|map| map.clone())
            .unwrap_or_default()
    }
}

fn bump(map: &Mutex<BTreeMap<String, u64>>, reason: String) {
    if let Ok(mut map) = map.lock() {
        *map.entry(reason).or_insert(0) += 1;
    }
}

/// `N (reason: n, reason: n)`.
pub fn by_reason(map: &BTreeMap<String, u64>) -> String {
    let total: u64 = map.values().sum();
    if map.is_empty() {
        return "0".into();
    }
    let reasons: Vec<String> = map
        .iter()
        .map(|(reason, count)| format!("{reason}: {count}"))
        .collect();
    format!("{total} ({})", reasons.join(", "))
}

/// The status line's rates over the whole run.
pub fn rates(counters: &Counters, elapsed: Duration) -> String {
    let seconds = elapsed.as_secs_f64().max(1e-3);
    let records = counters.records.load(Ordering::Relaxed);
    let bytes = counters.bytes.load(Ordering::Relaxed);
    format!(
        "{records} records, {:.0} records/s, {:.1} MB/s",
        records as f64 / seconds,
        bytes as f64 / seconds / 1e6
    )
}

fn status_line(counters: &Counters, start: Instant) -> String {
    let elapsed = start.elapsed();
    let mut line = rates(counters, elapsed);
    let total = counters.total.load(Ordering::Relaxed);
    let done = if counters.total_is_bytes.load(Ordering::Relaxed) {
        counters.bytes.load(Ordering::Relaxed)
    } else {
        counters.records.load(Ordering::Relaxed)
    };
    if total > 0 && done > 0 {
        let fraction = (done as f64 / total as f64).min(1.0);
        let remaining = elapsed.as_secs_f64() * (1.0 - fraction) / fraction;
        line.push_str(&format!(
            ", {:.0}% done, ETA {}",
            fraction * 100.0,
            clock(remaining)
        ));
    }
    line
}

fn clock(seconds: f64) -> String {
    let seconds = seconds.round() as u64;
    format!(
        "{}:{:02}:{:02}",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60
    )
}

/// Prints progress until dropped.
pub struct Ticker {
    task: tokio::task::JoinHandle<()>,
    terminal: bool,
}

impl Ticker {
    pub fn start(counters: Arc<Counters>, what: &'static str, plain_every: Duration) -> Ticker {
        let terminal = std::io::stderr().is_terminal();
        let start = Instant::now();
        let period = if terminal {
            Duration::from_millis(250)
        } else {
            plain_every.max(Duration::from_millis(100))
        };
        let task = tokio::spawn(async move {
            let mut interval = tokio::time::interval(period);
            interval.tick().await;
            loop {
                interval.tick().await;
                let line = status_line(&counters, start);
                let mut err = std::io::stderr().lock();
                let _ = if terminal {
                    write!(err, "\r\x1b[2K{what}: {line}")
                } else {
                    writeln!(err, "{what}: {line}")
                };
                let _ = err.flush();
            }
        });
        Ticker { task, terminal }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.task.abort();
        if self.terminal {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}
