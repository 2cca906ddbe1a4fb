//! One ACT test run: the threads as ACT has them, the per-interval report
//! and the collected snapshots.
//!
//! Threads: `service-threads` service threads issue the reads (each its own
//! interleaved slot of the read schedule, at a random device and a random
//! 128-byte-aligned address — a record's read-block address in the engine —
//! of `record-bytes`, read with the engine's `read_at`, which in direct mode
//! reads the covering 4 KiB-aligned range); per device one large-block
//! reader (the defragmenter's reads) and one large-block writer (the write
//! buffer flushes), each at the device's share of the derived large-block
//! rate, at random large-block-aligned addresses. A latency is the time of
//! the I/O call alone, as ACT measures it; how far behind its schedule a
//! thread runs is checked against `max-lag-sec`.
//!
//! Invariants: every operation due before the test's end is issued (unless
//! the run stops early), none due at or after it; the final report is
//! taken after every thread has finished, so it counts every operation; the first I/O error stops the run and is
//! returned as an error.

use super::config::ActConfig;
use super::device::{fill_block, Target};
use super::hist::{Counts, Histogram, Scale};
use super::rng::Rng;
use super::schedule::{sleep_until, Schedule};
use citrine_storage::device::io::{AlignedBuf, BlockIo};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use stop::Stop;

/// A record's address granularity in the engine (its read block).
const RBLOCK: u64 = 128;

/// A latency histogram kept in milliseconds (for the criteria) and, when
/// asked, in microseconds (for the output).
pub struct Recorder {
    pub tag: String,
    ms: Histogram,
    us: Histogram,
}

impl Recorder {
    fn new(tag: String) -> Recorder {
        Recorder {
            tag,
            ms: Histogram::new(Scale::Millis),
            us: Histogram::new(Scale::Micros),
        }
    }

    fn insert(&self, nanos: u64) {
        self.ms.insert(nanos);
        self.us.insert(nanos);
    }
}

/// Everything the threads share.
pub struct Shared {
    pub stop: Stop,
    /// The largest lag of an operation behind its due time, in
    /// nanoseconds, per [`Stream`].
    pub max_lag_nanos: [AtomicU64; 3],
    pub reads: Recorder,
    pub device_reads: Vec<Recorder>,
    pub large_block_reads: Recorder,
    pub large_block_writes: Recorder,
}

/// One report: the second it stands for and the cumulative counts of each
/// histogram, in the order [`Shared::recorders`] gives.
pub struct Report {
    pub sec: u64,
    pub ms: Vec<Counts>,
    pub us: Vec<Counts>,
}

/// How a run ended.
pub struct Outcome {
    pub reports: Vec<Report>,
    /// Why the run stopped before its time (the threads could not keep up).
    pub stopped_early: Option<String>,
    pub elapsed: Duration,
    /// The largest lag of an operation behind its due time, per [`Stream`].
    pub lags: [Duration; 3],
}

impl Outcome {
    /// The largest lag of any operation.
    pub fn max_lag(&self) -> Duration {
        self.lags.iter().copied().max().unwrap_or_default()
    }
}

/// The kinds of operation streams, in the order of [`Outcome::lags`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Reads = 0,
    LargeBlockReads = 1,
    LargeBlockWrites = 2,
}

impl Stream {
    pub const ALL: [Stream; 3] = [
        Stream::Reads,
        Stream::LargeBlockReads,
        Stream::LargeBlockWrites,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stream::Reads => "reads",
            Stream::LargeBlockReads => "large-block reads",
            Stream::LargeBlockWrites => "large-block writes",
        }
    }
}

impl Shared {
    fn new(targets: &[Target]) -> Shared {
        Shared {
            stop: Stop::default(),
            max_lag_nanos: std::array::from_fn(|_| AtomicU64::new(0)),
            reads: Recorder::new("reads".into()),
            device_reads: targets
                .iter()
                .map(|target| Recorder::new(format!("{}-reads", target.name)))
                .collect(),
            large_block_reads: Recorder::new("large-block-reads".into()),
            large_block_writes: Recorder::new("large-block-writes".into()),
        }
    }

    /// The histograms in report order: reads, each device's reads, then the
    /// large-block reads and writes.
    pub fn recorders(&self) -> Vec<&Recorder> {
        let mut all = vec![&self.reads];
        all.extend(self.device_reads.iter());
        all.push(&self.large_block_reads);
        all.push(&self.large_block_writes);
        all
    }

    fn report(&self, sec: u64) -> Report {
        let recorders = self.recorders();
        Report {
            sec,
            ms: recorders.iter().map(|r| r.ms.snapshot()).collect(),
            us: recorders.iter().map(|r| r.us.snapshot()).collect(),
        }
    }
}

/// Runs the test of `config` on `targets`; `print` gets each report.
pub fn run(
    config: &ActConfig,
    targets: &[Target],
    seed: u64,
    mut print: impl FnMut(&Shared, &Report),
) -> Result<Outcome, String> {
    let shared = Shared::new(targets);
    let duration = Duration::from_secs(config.test_duration_sec);
    let start = Instant::now();
    let mut reports = Vec::new();
    let context = Context {
        config,
        targets,
        shared: &shared,
        start,
        duration,
    };
    let context = &context;
    std::thread::scope(|scope| {
        for index in 0..u64::from(config.service_threads) {
            scope.spawn(move || context.serve_reads(index, seed));
        }
        for device in 0..targets.len() {
            scope.spawn(move || context.large_block_reads(device, seed));
            scope.spawn(move || context.large_block_writes(device, seed));
        }
        report_intervals(context, &mut reports, &mut print);
        // Leaving the scope joins every thread.
    });
    let elapsed = start.elapsed();
    let sec = match shared.stop.flag.load(Ordering::Relaxed) {
        true => elapsed.as_secs().clamp(1, config.test_duration_sec),
        false => config.test_duration_sec,
    };
    let last = shared.report(sec);
    print(&shared, &last);
    reports.push(last);
    if let Some(error) = shared.stop.error() {
        return Err(error);
    }
    Ok(Outcome {
        reports,
        stopped_early: shared.stop.lag(),
        elapsed,
        lags: std::array::from_fn(|index| {
            Duration::from_nanos(shared.max_lag_nanos[index].load(Ordering::Relaxed))
        }),
    })
}

/// Reports at each interval until the end (the last one after the join).
fn report_intervals(
    context: &Context,
    reports: &mut Vec<Report>,
    print: &mut impl FnMut(&Shared, &Report),
) {
    let interval = context.config.report_interval_sec;
    let mut sec = interval;
    while sec < context.config.test_duration_sec {
        let at = context.start + Duration::from_secs(sec);
        if !sleep_until(at, &context.shared.stop.flag) {
            return;
        }
        let report = context.shared.report(sec);
        print(context.shared, &report);
        reports.push(report);
        sec += interval;
    }
    let _ = sleep_until(context.start + context.duration, &context.shared.stop.flag);
    // The threads end by themselves once their next operation is due at or
    // after the end (a late one still issues what was due before it).
}

struct Context<'a> {
    config: &'a ActConfig,
    targets: &'a [Target],
    shared: &'a Shared,
    start: Instant,
    duration: Duration,
}

impl Context<'_> {
    /// Waits for operation `k` of `schedule`; false when the stream is done
    /// (its next operation is due at or after the end, or the run stopped).
    fn wait_turn(&self, schedule: &Schedule, k: u64, stream: Stream) -> bool {
        let due = schedule.due(k);
        if due >= self.duration || !sleep_until(self.start + due, &self.shared.stop.flag) {
            return false;
        }
        let lag = self.start.elapsed().saturating_sub(due);
        self.shared.max_lag_nanos[stream as usize]
            .fetch_max(lag.as_nanos() as u64, Ordering::Relaxed);
        let max_lag = Duration::from_secs(self.config.max_lag_sec);
        if self.config.max_lag_sec != 0 && lag > max_lag {
            self.shared.stop.lagged(format!(
                "{} fell {:.1} s behind their schedule (max-lag-sec {}): \
                 the load is more than the {} can do",
                stream.name(),
                lag.as_secs_f64(),
                self.config.max_lag_sec,
                if stream == Stream::Reads {
                    "service threads (or the devices)"
                } else {
                    "devices"
                }
            ));
            return false;
        }
        true
    }

    fn serve_reads(&self, index: u64, seed: u64) {
        let rate = self.config.derived().internal_read_reqs_per_sec;
        if rate <= 0.0 {
            return;
        }
        let schedule = Schedule::interleaved(rate, index, u64::from(self.config.service_threads));
        let mut rng = Rng::new(seed ^ (index + 1).wrapping_mul(0x1000_0001));
        let length = self.config.record_bytes as usize;
        let mut k = 0;
        while self.wait_turn(&schedule, k, Stream::Reads) {
            let device = rng.below(self.targets.len() as u64) as usize;
            let target = &self.targets[device];
            let slots = (target.usable_bytes(self.config) - length as u64) / RBLOCK + 1;
            let offset = rng.below(slots) * RBLOCK;
            let began = Instant::now();
            if let Err(error) = target.io.read_at(offset, length) {
                let message = format!("{}: read of {length} B at {offset}: {error}", target.name);
                return self.shared.stop.failed(message);
            }
            let nanos = began.elapsed().as_nanos() as u64;
            self.shared.reads.insert(nanos);
            self.shared.device_reads[device].insert(nanos);
            k += 1;
        }
    }

    fn large_block_reads(&self, device: usize, seed: u64) {
        let Some(schedule) =
            self.large_block_schedule(self.config.derived().large_block_reads_per_sec)
        else {
            return;
        };
        let target = &self.targets[device];
        let mut rng = Rng::new(seed ^ 0xB10C_0000 ^ device as u64);
        let length = self.config.large_block_bytes as usize;
        let mut k = 0;
        while self.wait_turn(&schedule, k, Stream::LargeBlockReads) {
            let offset = rng.below(target.large_blocks) * length as u64;
            let began = Instant::now();
            if let Err(error) = target.io.read_at(offset, length) {
                let message = format!("{}: large-block read at {offset}: {error}", target.name);
                return self.shared.stop.failed(message);
            }
            self.shared
                .large_block_reads
                .insert(began.elapsed().as_nanos() as u64);
            k += 1;
        }
    }

    fn large_block_writes(&self, device: usize, seed: u64) {
        let Some(schedule) =
            self.large_block_schedule(self.config.derived().large_block_writes_per_sec)
        else {
            return;
        };
        let target = &self.targets[device];
        let mut rng = Rng::new(seed ^ 0x3717_E000 ^ device as u64);
        let mut buffer = AlignedBuf::zeroed(self.config.large_block_bytes as usize);
        let mut k = 0;
        while self.wait_turn(&schedule, k, Stream::LargeBlockWrites) {
            fill_block(buffer.as_mut_slice(), self.config.compress_pct, &mut rng);
            let offset = rng.below(target.large_blocks) * u64::from(self.config.large_block_bytes);
            let began = Instant::now();
            if let Err(error) = target.io.write_at(offset, buffer.as_slice()) {
                let message = format!("{}: large-block write at {offset}: {error}", target.name);
                return self.shared.stop.failed(message);
            }
            self.shared
                .large_block_writes
                .insert(began.elapsed().as_nanos() as u64);
            k += 1;
        }
    }

    /// A device's share of a total large-block rate (none when it is 0).
    fn large_block_schedule(&self, total: f64) -> Option<Schedule> {
        (total > 0.0).then(|| Schedule::new(total / self.targets.len() as f64))
    }
}

/// How a run is told to stop, and why it stopped.
mod stop {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Mutex, MutexGuard};

    /// A poisoned lock still holds a usable reason.
    fn lock(slot: &Mutex<Option<String>>) -> MutexGuard<'_, Option<String>> {
        slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    #[derive(Default)]
    pub struct Stop {
        pub flag: AtomicBool,
        error: Mutex<Option<String>>,
        lag: Mutex<Option<String>>,
    }

    impl Stop {
        /// An I/O error: the first one is kept and stops the run.
        pub fn failed(&self, message: String) {
            lock(&self.error).get_or_insert(message);
            self.flag.store(true, Ordering::Relaxed);
        }

        /// A thread fell too far behind: the first reason is kept.
        pub fn lagged(&self, message: String) {
            lock(&self.lag).get_or_insert(message);
            self.flag.store(true, Ordering::Relaxed);
        }

        pub fn error(&self) -> Option<String> {
            lock(&self.error).clone()
        }

        pub fn lag(&self) -> Option<String> {
            lock(&self.lag).clone()
        }
    }
}
