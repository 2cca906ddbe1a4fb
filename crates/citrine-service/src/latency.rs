//! Latency histograms: how long this node took to answer each kind of
//! request, per namespace, in power-of-two buckets — and the `latencies:`
//! info command that reports them in the reference's format
//! (`shared/protocol/08-sc-xdr-ops.md` §7), which asadm's
//! `show latencies` reads.
//!
//! The histograms, in the order `latencies:` lists them: `batch-index`
//! (a whole batch request, first row to LAST), then per namespace
//! `{NS}-read`, `{NS}-write` (deletes included), `{NS}-udf` (record UDFs),
//! `{NS}-batch-sub-read`, `{NS}-batch-sub-write`, `{NS}-batch-sub-udf` (one
//! batch row each), `{NS}-pi-query` and `{NS}-si-query` (a client's short
//! scan or secondary-index query, `info1 SHORT_QUERY`, start to LAST: the
//! reference times only those). A background job's record writes
//! (`udf-sub`, `ops-sub`) count in none of them, only in their benchmark
//! groups ([`crate::benchmarks`]), as in the reference.
//!
//! Recording is the hot path: [`Histogram::record`] adds 1 to one bucket
//! and the elapsed nanoseconds to a sum, both relaxed atomic adds on the
//! calling thread's stripe (`citrine_types::stripes`), so service threads on
//! different cores never write the same cache line and no lock is taken.
//! Bucket `b` counts latencies in `[2^(b-1), 2^b)` ticks (bucket 0: below
//! one tick), a tick being 1/1024 of the unit — a millisecond, or a
//! microsecond with the reference's `microsecond-histograms` — so the
//! unit's powers of two (the thresholds `latencies:` reports) are bucket
//! bounds, and below one unit there are ten finer buckets for Prometheus.
//!
//! Reporting is the ticker's: every `ticker-interval` the server calls
//! [`Latencies::tick`], which sums the stripes and keeps, per histogram,
//! the line `latencies:` answers for the interval just ended — operations
//! per second, then the share of them above 1, 2, 4, … 65536 units. A
//! histogram that never counted anything answers an empty line, as the
//! reference's do until their first operation. The Prometheus endpoint reads
//! the cumulative counts ([`Histogram::snapshot`]) instead.
//!
//! Invariants: a bucket index is below [`BUCKETS`]; counts only grow; the
//! unit is fixed before the node serves ([`Latencies::set_unit`]), so every
//! count of a histogram is in the same unit.

use crate::benchmarks::{Benchmarks, Group, Stage};
use citrine_types::stripes::{stripe, STRIPES};
use citrine_wire::info::InfoCommand;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Buckets per histogram: bucket `b` holds `[2^(b-1), 2^b)` ticks, the last
/// one everything longer.
pub const BUCKETS: usize = 64;

/// A tick is 1/2^`TICK_BITS` of the unit: bucket `TICK_BITS + 1 + k` is
/// `[2^k, 2^(k+1))` units.
pub const TICK_BITS: usize = 10;

/// Thresholds `latencies:` reports the share above: 2^0 … 2^16 units.
pub const COLUMNS: usize = 17;

/// The unit a node's histograms count in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Milliseconds,
    /// The reference's `microsecond-histograms true`.
    Microseconds,
}

impl Unit {
    /// Nanoseconds in one unit.
    pub fn nanos(self) -> u64 {
        match self {
            Unit::Milliseconds => 1_000_000,
            Unit::Microseconds => 1_000,
        }
    }

    /// How `latencies:` names it.
    pub fn info_name(self) -> &'static str {
        match self {
            Unit::Milliseconds => "msec",
            Unit::Microseconds => "usec",
        }
    }

    /// How Prometheus metric names end with it (`_ms`, `_us`).
    pub fn metric_suffix(self) -> &'static str {
        match self {
            Unit::Milliseconds => "ms",
            Unit::Microseconds => "us",
        }
    }
}

/// One thread group's counts, on cache lines of its own.
#[repr(align(128))]
struct Stripe {
    counts: [AtomicU64; BUCKETS],
    sum_nanos: AtomicU64,
}

impl Default for Stripe {
    fn default() -> Stripe {
        Stripe {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_nanos: AtomicU64::new(0),
        }
    }
}

/// The cumulative counts of a histogram at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub counts: [u64; BUCKETS],
    /// Every recorded latency added up, in nanoseconds.
    pub sum_nanos: u64,
}

impl Default for Snapshot {
    fn default() -> Snapshot {
        Snapshot {
            counts: [0; BUCKETS],
            sum_nanos: 0,
        }
    }
}

impl Snapshot {
    /// Operations counted.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// A latency histogram (see the module doc).
pub struct Histogram {
    /// As `latencies:` names it: `batch-index`, `{test}-read`, …
    name: String,
    /// The namespace it belongs to (none for `batch-index`).
    namespace: Option<String>,
    /// What it measures, as Prometheus names it: `read`, `batch_sub_read`.
    kind: &'static str,
    stripes: Box<[Stripe; STRIPES]>,
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(&self.name)
    }
}

impl Histogram {
    pub(crate) fn new(name: String, namespace: Option<String>, kind: &'static str) -> Histogram {
        Histogram {
            name,
            namespace,
            kind,
            stripes: Box::new(std::array::from_fn(|_| Stripe::default())),
        }
    }

    /// As `latencies:` names it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace it belongs to (`None`: node-wide).
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// What it measures, as Prometheus names it (`read`, `batch_index`).
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// Counts one operation that took `elapsed`, in a unit of
    /// `unit_nanos` nanoseconds: two relaxed adds on the calling thread's
    /// stripe.
    #[inline]
    pub(crate) fn record_in(&self, elapsed: Duration, unit_nanos: u64) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let ticks = nanos.saturating_mul(1 << TICK_BITS) / unit_nanos.max(1);
        let bucket = bucket_of(ticks);
        let stripe = &self.stripes[stripe() % STRIPES];
        stripe.counts[bucket].fetch_add(1, Ordering::Relaxed);
        stripe.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Counts one value of `bytes` (a size histogram's): bucket `b` of
    /// the dump holds `[2^(b-1), 2^b)` bytes.
    #[inline]
    pub(crate) fn record_bytes(&self, bytes: u64) {
        self.record_in(Duration::from_nanos(bytes), 1);
    }

    /// The cumulative counts: the stripes summed.
    pub fn snapshot(&self) -> Snapshot {
        let mut snapshot = Snapshot::default();
        for stripe in self.stripes.iter() {
            for (sum, count) in snapshot.counts.iter_mut().zip(&stripe.counts) {
                *sum = sum.wrapping_add(count.load(Ordering::Relaxed));
            }
            snapshot.sum_nanos = snapshot
                .sum_nanos
                .wrapping_add(stripe.sum_nanos.load(Ordering::Relaxed));
        }
        snapshot
    }
}

/// The bucket of a latency of `ticks` whole ticks: 0 below one tick, else
/// one more than the position of its highest set bit (`[2^(b-1), 2^b)`).
#[inline]
pub fn bucket_of(ticks: u64) -> usize {
    let bucket = (u64::BITS - ticks.leading_zeros()) as usize;
    debug_assert!(bucket <= 64);
    bucket.min(BUCKETS - 1)
}

/// What a single-record request or a batch row was, for its histogram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read = 0,
    Write,
    Udf,
    BatchSubRead,
    BatchSubWrite,
    BatchSubUdf,
    PiQuery,
    SiQuery,
    /// A background UDF job's record UDF (the reference's `udf-sub`):
    /// no `latencies:` histogram, only its benchmark group.
    UdfSub,
    /// A background ops job's record write (`ops-sub`): likewise.
    OpsSub,
}

/// Each namespace's histograms, in `latencies:` order: (name suffix,
/// Prometheus kind).
const PER_NAMESPACE: [(&str, &str); 8] = [
    ("read", "read"),
    ("write", "write"),
    ("udf", "udf"),
    ("batch-sub-read", "batch_sub_read"),
    ("batch-sub-write", "batch_sub_write"),
    ("batch-sub-udf", "batch_sub_udf"),
    ("pi-query", "pi_query"),
    ("si-query", "si_query"),
];

impl Op {
    /// The benchmark group it counts in, and the kind of run it is (a
    /// batch row's `read`, `write` or `udf`); none for queries.
    #[inline]
    pub fn benchmark_group(self) -> Option<(Group, Group)> {
        match self {
            Op::Read => Some((Group::Read, Group::Read)),
            Op::Write => Some((Group::Write, Group::Write)),
            Op::Udf => Some((Group::Udf, Group::Udf)),
            Op::BatchSubRead => Some((Group::BatchSub, Group::Read)),
            Op::BatchSubWrite => Some((Group::BatchSub, Group::Write)),
            Op::BatchSubUdf => Some((Group::BatchSub, Group::Udf)),
            Op::UdfSub => Some((Group::UdfSub, Group::Udf)),
            Op::OpsSub => Some((Group::OpsSub, Group::Write)),
            Op::PiQuery | Op::SiQuery => None,
        }
    }

    /// Whether it has a `latencies:` histogram (a background job's
    /// sub-transaction has not: the reference counts those only in the
    /// `udf-sub` and `ops-sub` benchmark groups).
    #[inline]
    pub fn in_latencies(self) -> bool {
        (self as usize) < PER_NAMESPACE.len()
    }

    /// The op of a request with this header (`udf`: it calls a record
    /// UDF), run on its own or as a batch row: writes and deletes are
    /// writes.
    #[inline]
    pub fn of(info2: u8, udf: bool, batch_row: bool) -> Op {
        let write = info2 & citrine_wire::msg::info2::WRITE != 0;
        match (udf, write, batch_row) {
            (true, _, false) => Op::Udf,
            (true, _, true) => Op::BatchSubUdf,
            (false, true, false) => Op::Write,
            (false, true, true) => Op::BatchSubWrite,
            (false, false, false) => Op::Read,
            (false, false, true) => Op::BatchSubRead,
        }
    }
}

/// A request's latency in the making: when it started, whether it is a
/// batch row, and — once the request named one of the node's namespaces —
/// that namespace's position and the histogram's op; with its namespace's
/// `enable-benchmarks-*` group on, when its last stage ended
/// ([`crate::benchmarks`]).
#[derive(Clone, Copy, Debug)]
pub struct Timed {
    started: Instant,
    batch_row: bool,
    /// A background job's sub-transaction ([`Op::UdfSub`], [`Op::OpsSub`]).
    sub: bool,
    histogram: Option<(usize, Op)>,
    /// May count in the detail histograms (not a request counted
    /// elsewhere).
    benchable: bool,
    /// The end of its last timed stage, while its group is on.
    stage_end: Option<Instant>,
}

impl Timed {
    /// Starts timing a request (`batch_row`: a batch's row).
    #[inline]
    pub fn start(batch_row: bool) -> Timed {
        Timed {
            started: Instant::now(),
            batch_row,
            sub: false,
            histogram: None,
            benchable: true,
            stage_end: None,
        }
    }

    /// A request whose latency is counted elsewhere (where it started):
    /// it learns its histogram and counts nowhere.
    pub fn counted_elsewhere() -> Timed {
        Timed {
            benchable: false,
            ..Timed::start(false)
        }
    }

    /// Starts timing a background job's write of one record: a
    /// sub-transaction, `udf-sub` when it calls a record UDF, else
    /// `ops-sub`.
    pub fn sub() -> Timed {
        Timed {
            sub: true,
            ..Timed::start(false)
        }
    }

    /// Whether it times a background job's sub-transaction.
    #[inline]
    pub fn is_sub(&self) -> bool {
        self.sub
    }

    /// Times a client's request received at `received`.
    #[inline]
    pub fn since(received: Instant) -> Timed {
        Timed {
            started: received,
            batch_row: false,
            sub: false,
            histogram: None,
            benchable: true,
            stage_end: None,
        }
    }

    /// The request is for the namespace at position `namespace`, with
    /// this header's `info2`, calling a record UDF or not.
    #[inline]
    pub fn found(&mut self, namespace: usize, info2: u8, udf: bool) {
        let op = match (self.sub, udf) {
            (false, _) => Op::of(info2, udf, self.batch_row),
            (true, true) => Op::UdfSub,
            (true, false) => Op::OpsSub,
        };
        self.histogram = Some((namespace, op));
    }
}

/// What the ticker keeps between ticks.
#[derive(Default)]
struct Ticks {
    /// When the last tick ran.
    last: Option<Instant>,
    /// Each histogram's counts at the last tick.
    previous: Vec<Snapshot>,
    /// Each histogram's `latencies:` value for the interval the last tick
    /// ended; empty until the histogram first counted an operation.
    lines: Vec<String>,
}

/// A node's latency histograms (see the module doc).
pub struct Latencies {
    /// `batch-index`, then [`PER_NAMESPACE`] for each namespace in
    /// configuration order.
    histograms: Vec<Histogram>,
    /// The `enable-benchmarks-*` detail histograms.
    benchmarks: Benchmarks,
    /// Nanoseconds per unit (a [`Unit`]); fixed before the node serves.
    unit_nanos: AtomicU64,
    ticks: Mutex<Ticks>,
}

impl std::fmt::Debug for Latencies {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Latencies")
            .field("histograms", &self.histograms.len())
            .finish()
    }
}

impl Latencies {
    /// The histograms of a node with these namespaces, in milliseconds.
    pub fn new<'n>(namespaces: impl IntoIterator<Item = &'n str>) -> Latencies {
        let namespaces: Vec<&str> = namespaces.into_iter().collect();
        let mut histograms = vec![Histogram::new("batch-index".into(), None, "batch_index")];
        for &namespace in &namespaces {
            for (suffix, kind) in PER_NAMESPACE {
                let name = format!("{{{namespace}}}-{suffix}");
                histograms.push(Histogram::new(name, Some(namespace.to_owned()), kind));
            }
        }
        let count = histograms.len();
        Latencies {
            histograms,
            benchmarks: Benchmarks::new(namespaces),
            unit_nanos: AtomicU64::new(Unit::Milliseconds.nanos()),
            ticks: Mutex::new(Ticks {
                last: None,
                previous: vec![Snapshot::default(); count],
                lines: vec![String::new(); count],
            }),
        }
    }

    /// Sets the unit (`microsecond-histograms`): once, before the node
    /// serves.
    pub fn set_unit(&self, unit: Unit) {
        self.unit_nanos.store(unit.nanos(), Ordering::Relaxed);
    }

    /// The unit the histograms count in.
    pub fn unit(&self) -> Unit {
        if self.unit_nanos.load(Ordering::Relaxed) == Unit::Microseconds.nanos() {
            Unit::Microseconds
        } else {
            Unit::Milliseconds
        }
    }

    /// The `enable-benchmarks-*` detail histograms.
    pub fn benchmarks(&self) -> &Benchmarks {
        &self.benchmarks
    }

    /// A timed request named the namespace at position `namespace` (see
    /// [`Timed::found`]); with that namespace's benchmark group for its
    /// kind on, its `start` stage ends here. Off, this adds one relaxed
    /// load to [`Timed::found`]; the rest is out of line.
    #[inline]
    pub fn found(&self, timed: &mut Timed, namespace: usize, info2: u8, udf: bool) {
        timed.found(namespace, info2, udf);
        if !timed.benchable {
            return;
        }
        let Some((_, op)) = timed.histogram else {
            return;
        };
        if let Some((group, _)) = op.benchmark_group() {
            if self.benchmarks.on(namespace, group) {
                self.begin_stages(timed);
            }
        }
    }

    /// Ends a stage of a timed request whose benchmark group is on (else
    /// nothing: one branch).
    #[inline]
    pub fn stage(&self, timed: &mut Timed, stage: Stage) {
        if timed.stage_end.is_some() {
            self.end_stage(timed, stage);
        }
    }

    /// Starts timing a request's stages: its `start` ends now.
    #[cold]
    #[inline(never)]
    fn begin_stages(&self, timed: &mut Timed) {
        timed.stage_end = Some(timed.started);
        self.end_stage(timed, Stage::Start);
    }

    /// Counts the stage that ends now in its detail histogram.
    #[inline(never)]
    fn end_stage(&self, timed: &mut Timed, stage: Stage) {
        let (Some(last), Some((namespace, op))) = (timed.stage_end, timed.histogram) else {
            return;
        };
        let Some(groups) = op.benchmark_group() else {
            return;
        };
        let now = Instant::now();
        let unit = self.unit_nanos.load(Ordering::Relaxed);
        let elapsed = now.saturating_duration_since(last);
        self.benchmarks
            .record(namespace, groups, stage, elapsed, unit);
        timed.stage_end = Some(now);
    }

    /// Every histogram, in `latencies:` order.
    pub fn histograms(&self) -> &[Histogram] {
        &self.histograms
    }

    /// Counts a whole batch request that started at `started`.
    #[inline]
    pub fn record_batch(&self, started: Instant) {
        self.record_at(0, started.elapsed());
    }

    /// Counts an `op` of the namespace at position `namespace` (in
    /// configuration order) that started at `started` (nothing for a
    /// sub-transaction: see [`Op::in_latencies`]).
    #[inline]
    pub fn record(&self, namespace: usize, op: Op, started: Instant) {
        if !op.in_latencies() {
            return;
        }
        self.record_at(
            1 + namespace * PER_NAMESPACE.len() + op as usize,
            started.elapsed(),
        );
    }

    /// Counts a timed request, when it named a namespace.
    #[inline]
    pub fn record_timed(&self, mut timed: Timed) {
        self.stage(&mut timed, Stage::Response);
        if let Some((namespace, op)) = timed.histogram {
            self.record(namespace, op, timed.started);
        }
    }

    #[inline]
    fn record_at(&self, index: usize, elapsed: Duration) {
        if let Some(histogram) = self.histograms.get(index) {
            histogram.record_in(elapsed, self.unit_nanos.load(Ordering::Relaxed));
        }
    }

    /// Ends an interval (the server's ticker, every `ticker-interval`):
    /// each histogram's `latencies:` line becomes that of the operations
    /// it counted since the last tick.
    pub fn tick(&self, now: Instant) {
        let Ok(mut ticks) = self.ticks.lock() else {
            return;
        };
        let seconds = ticks.last.map_or(0.0, |last| {
            now.saturating_duration_since(last).as_secs_f64()
        });
        ticks.last = Some(now);
        let unit = self.unit().info_name();
        for (index, histogram) in self.histograms.iter().enumerate() {
            let current = histogram.snapshot();
            let ever = current.total() > 0;
            if ever {
                let line = interval_line(unit, &ticks.previous[index], &current, seconds);
                ticks.lines[index] = line;
            }
            ticks.previous[index] = current;
        }
    }

    /// The `latencies:` info command: every histogram, or the one named
    /// by `hist=` (`ERROR:4:bad hist name` when there is none so named,
    /// `ERROR:4:missing 'hist' value` for an empty name), as the reference
    /// answers; other parameters are ignored.
    pub fn info(&self, command: &InfoCommand<'_>) -> String {
        let Ok(ticks) = self.ticks.lock() else {
            return "ERROR:1:latencies unavailable".to_owned();
        };
        let entry =
            |index: usize| format!("{}:{}", self.histograms[index].name, ticks.lines[index]);
        match command.param("hist") {
            Some("") => "ERROR:4:missing 'hist' value".to_owned(),
            Some(wanted) => match self.histograms.iter().position(|h| h.name == wanted) {
                Some(index) => entry(index),
                None => "ERROR:4:bad hist name".to_owned(),
            },
            None => (0..self.histograms.len())
                .map(entry)
                .collect::<Vec<_>>()
                .join(";"),
        }
    }
}

/// The `latencies:` value of one interval: `UNIT,OPS_PER_SEC,PCT>1,…`, the
/// operations counted between `previous` and `current` over `seconds`
/// (no rate before the first interval is whole: 0.0).
fn interval_line(unit: &str, previous: &Snapshot, current: &Snapshot, seconds: f64) -> String {
    let mut counts = [0u64; BUCKETS];
    for (bucket, count) in counts.iter_mut().enumerate() {
        *count = current.counts[bucket].wrapping_sub(previous.counts[bucket]);
    }
    let total: u64 = counts.iter().sum();
    let rate = if seconds > 0.0 {
        total as f64 / seconds
    } else {
        0.0
    };
    let mut line = format!("{unit},{rate:.1}");
    // Above 2^k units: every bucket from TICK_BITS + k + 1 on.
    let mut above: u64 = total - counts[..TICK_BITS].iter().sum::<u64>();
    for threshold in 0..COLUMNS {
        above -= counts[TICK_BITS + threshold];
        let share = if total == 0 {
            0.0
        } else {
            100.0 * above as f64 / total as f64
        };
        let _ = write!(line, ",{share:.2}");
    }
    line
}

/// The histograms that counted something: (name, operations), in
/// `latencies:` order.
#[cfg(test)]
pub(crate) fn totals(latencies: &Latencies) -> Vec<(String, u64)> {
    latencies
        .histograms()
        .iter()
        .map(|histogram| (histogram.name().to_owned(), histogram.snapshot().total()))
        .filter(|(_, total)| *total > 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1), 1);
        assert_eq!(bucket_of(2), 2);
        assert_eq!(bucket_of(3), 2);
        assert_eq!(bucket_of(4), 3);
        assert_eq!(bucket_of(1023), 10);
        assert_eq!(bucket_of(1024), 11);
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn a_histogram_answers_empty_until_it_counts() {
        let latencies = Latencies::new(["test"]);
        latencies.tick(Instant::now());
        let answer = latencies.info(&InfoCommand::parse("latencies:"));
        assert!(
            answer.starts_with("batch-index:;{test}-read:;{test}-write:;"),
            "{answer}"
        );
        assert_eq!(answer.split(';').count(), 9);
        assert_eq!(
            latencies.info(&InfoCommand::parse("latencies:hist={test}-nothing")),
            "ERROR:4:bad hist name"
        );
        assert_eq!(
            latencies.info(&InfoCommand::parse("latencies:hist=")),
            "ERROR:4:missing 'hist' value"
        );
        assert_eq!(
            latencies.info(&InfoCommand::parse("latencies:hist=batch-index;foo=bar")),
            "batch-index:"
        );
    }

    #[test]
    fn an_interval_reports_its_rate_and_the_shares_above_each_threshold() {
        let latencies = Latencies::new(["test"]);
        let start = Instant::now();
        latencies.tick(start);
        let read = &latencies.histograms()[1];
        let unit = Unit::Milliseconds.nanos();
        // 6 under 1 ms, 2 in [1, 2) ms, 1 in [4, 8) ms, 1 in [64, 128) ms.
        for _ in 0..6 {
            read.record_in(Duration::from_micros(300), unit);
        }
        for _ in 0..2 {
            read.record_in(Duration::from_micros(1500), unit);
        }
        read.record_in(Duration::from_millis(5), unit);
        read.record_in(Duration::from_millis(100), unit);
        latencies.tick(start + Duration::from_secs(10));
        let answer = latencies.info(&InfoCommand::parse("latencies:hist={test}-read"));
        assert_eq!(
            answer,
            "{test}-read:msec,1.0,40.00,20.00,20.00,10.00,10.00,10.00,10.00,0.00,0.00,0.00,0.00,0.00,0.00,0.00,0.00,0.00,0.00"
        );
        // The next interval counted nothing: a zero rate, the line stays.
        latencies.tick(start + Duration::from_secs(20));
        let answer = latencies.info(&InfoCommand::parse("latencies:hist={test}-read"));
        assert!(answer.starts_with("{test}-read:msec,0.0,0.00,"), "{answer}");
        let snapshot = read.snapshot();
        assert_eq!(snapshot.total(), 10);
        // 300 µs = 307.2 ticks: [256, 512); 100 ms = 102 400 ticks.
        assert_eq!(snapshot.counts[9], 6);
        assert_eq!(snapshot.counts[TICK_BITS + 7], 1);
    }

    #[test]
    fn ops_land_in_their_namespace_histogram() {
        let latencies = Latencies::new(["test", "bar"]);
        let started = Instant::now();
        latencies.record(1, Op::Write, started);
        latencies.record(0, Op::BatchSubUdf, started);
        latencies.record_batch(started);
        let totals: Vec<(&str, u64)> = latencies
            .histograms()
            .iter()
            .map(|histogram| (histogram.name(), histogram.snapshot().total()))
            .filter(|(_, total)| *total > 0)
            .collect();
        assert_eq!(
            totals,
            [
                ("batch-index", 1),
                ("{test}-batch-sub-udf", 1),
                ("{bar}-write", 1)
            ]
        );
        assert_eq!(Op::of(0, false, false), Op::Read);
        assert_eq!(
            Op::of(citrine_wire::msg::info2::WRITE, false, true),
            Op::BatchSubWrite
        );
        assert_eq!(Op::of(0, true, false), Op::Udf);
    }
}
