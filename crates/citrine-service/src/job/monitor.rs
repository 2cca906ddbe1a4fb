//! `query-show`'s view of scans and queries: one [`Monitor`] for each
//! foreground scan, query or aggregation a client sends (from its
//! acceptance to its LAST message) and for each background job, kept in
//! the node's registry ([`Monitors`]) while active and among the last
//! [`MAX_DONE`] finished; and the info commands that read and stop them
//! (`query-show`, `query-abort`, `query-abort-all`).
//!
//! Formats follow the reference (CE 8.1.2): one line a job, newest first,
//! lines joined by `;`:
//! `trid=ID:ns=NS[:set=SET][:sindex-name=INDEX]` then, for a plain scan or
//! query, `:n-pids-requested=N:n-keyds-requested=N`, then
//! `:rps=N:active-threads=N:status=S:job-progress=P.PP:run-time=MS:time-since-done=MS:recs-throttled=N:recs-filtered-meta=N:recs-filtered-bins=N:recs-succeeded=N:recs-failed=N[:from=IP+PORT]:job-type=T:net-io-bytes=N`
//! and `:net-io-time=MS:socket-timeout=MS` (`basic`, `aggregation`),
//! `:socket-timeout=MS:ops-active=N` (`background-ops`) or
//! `:socket-timeout=MS:udf-filename=M:udf-function=F:udf-active=N`
//! (`background-udf`). The status is `active(ok)`, `active(user-aborted)`
//! until the job notices an abort, `done(ok)`, `done(user-aborted)`,
//! `done(abandoned-response-error)` (a client that went away mid-stream)
//! or `done(abandoned-unknown)` (an aggregation whose UDF failed); a done
//! job's progress is 100.00. `net-io-time` is the time a job waited on its
//! client's socket: always 0 here, as a walk never waits on the network
//! (the connection loop writes each chunk, then asks for the next).
//!
//! Invariants: a task id names at most one active job (a foreground
//! request reusing an active one's is refused with 4, as the reference
//! refuses it); a background job whose task id a registered background job
//! has, active or among the last finished, is refused with 4 and starts
//! nothing (as the reference's); a job is finished once, and its status
//! and run time stop then.

use citrine_types::ResultCode;
use citrine_wire::info::InfoCommand;
use citrine_wire::msg::{field_type, Message};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// Finished jobs `query-show` still answers for.
pub const MAX_DONE: usize = 100;

/// Background jobs active at once (running or waiting for a turn); more
/// are refused.
pub const MAX_ACTIVE: usize = 256;

/// The socket timeout `query-show` gives a job whose request names none,
/// and every background job (the reference's, which sends a background
/// job's client nothing after its acceptance).
pub const DEFAULT_SOCKET_TIMEOUT_MS: u32 = 10_000;

/// What kind of job a monitor shows (`job-type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JobType {
    /// A foreground scan or query.
    Basic,
    /// A foreground query with a stream UDF.
    Aggregation,
    /// A background job writing ops.
    BackgroundOps,
    /// A background job running a record UDF.
    BackgroundUdf,
}

impl JobType {
    fn name(self) -> &'static str {
        match self {
            JobType::Basic => "basic",
            JobType::Aggregation => "aggregation",
            JobType::BackgroundOps => "background-ops",
            JobType::BackgroundUdf => "background-udf",
        }
    }

    fn is_background(self) -> bool {
        matches!(self, JobType::BackgroundOps | JobType::BackgroundUdf)
    }
}

/// Why a job ended (or, once aborted, will end): the status in brackets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Reason {
    Ok = 0,
    UserAborted = 1,
    /// Its client went away before the stream ended.
    ResponseError = 2,
    /// It failed on the server (an aggregation's UDF error).
    Unknown = 3,
}

impl Reason {
    fn from_u8(value: u8) -> Reason {
        match value {
            0 => Reason::Ok,
            1 => Reason::UserAborted,
            2 => Reason::ResponseError,
            _ => Reason::Unknown,
        }
    }

    fn text(self) -> &'static str {
        match self {
            Reason::Ok => "ok",
            Reason::UserAborted => "user-aborted",
            Reason::ResponseError => "abandoned-response-error",
            Reason::Unknown => "abandoned-unknown",
        }
    }
}

/// Who sent a scan or query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A client, at this address when the caller knows it.
    Client(Option<SocketAddr>),
    /// A peer running its part of a client's aggregation here: the job is
    /// the client's node's, not this one's.
    Peer,
}

/// Record counts a job reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub succeeded: u64,
    pub failed: u64,
    pub filtered: u64,
    pub throttled: u64,
}

/// One job as `query-show` shows it.
pub(crate) struct Monitor {
    trid: u64,
    job_type: JobType,
    namespace: String,
    set: String,
    index: Option<String>,
    /// A plain scan's or query's partitions requested (PID_ARRAY and
    /// DIGEST_ARRAY entries) and resume digests (DIGEST_ARRAY entries).
    requested: Option<(usize, usize)>,
    rate: u32,
    from: Option<SocketAddr>,
    socket_timeout: u32,
    /// A UDF job's module and function.
    udf: Option<(String, String)>,
    started_ms: u64,
    done: AtomicBool,
    reason: AtomicU8,
    abort: AtomicBool,
    /// Hundredths of a percent.
    progress: AtomicU64,
    finished_ms: AtomicU64,
    succeeded: AtomicU64,
    failed: AtomicU64,
    filtered: AtomicU64,
    throttled: AtomicU64,
    net_io_bytes: AtomicU64,
    /// Background writes (or UDF calls) under way.
    in_flight: AtomicU64,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor")
            .field("trid", &self.trid)
            .field("job_type", &self.job_type)
            .field("done", &self.done.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// The length of a field holding fixed-size entries, in entries.
fn entries(message: &Message<'_>, kind: u8, size: usize) -> usize {
    message.field(kind).map_or(0, |bytes| bytes.len() / size)
}

impl Monitor {
    /// The monitor of a request of `job_type` on `namespace` (its task
    /// id, or `trid` when it names none) that started at `now_ms`.
    pub(crate) fn new(
        message: &Message<'_>,
        job_type: JobType,
        namespace: &str,
        index: Option<String>,
        from: Option<SocketAddr>,
        now_ms: u64,
    ) -> Monitor {
        let text = |kind| {
            message
                .field(kind)
                .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
        };
        let u32_field = |kind| {
            message
                .field(kind)
                .and_then(|bytes| <[u8; 4]>::try_from(bytes).ok())
                .map(u32::from_be_bytes)
        };
        let requested = (job_type == JobType::Basic).then(|| {
            let digests = entries(
                message,
                field_type::DIGEST_ARRAY,
                citrine_types::DIGEST_SIZE,
            );
            (
                entries(message, field_type::PID_ARRAY, 2) + digests,
                digests,
            )
        });
        let socket_timeout = match job_type.is_background() {
            true => DEFAULT_SOCKET_TIMEOUT_MS,
            false => u32_field(field_type::SOCKET_TIMEOUT).unwrap_or(DEFAULT_SOCKET_TIMEOUT_MS),
        };
        Monitor {
            trid: task_id(message).unwrap_or(0),
            job_type,
            namespace: namespace.to_owned(),
            set: text(field_type::SET).unwrap_or_default(),
            index,
            requested,
            rate: u32_field(field_type::RECORDS_PER_SECOND).unwrap_or(0),
            from,
            socket_timeout,
            udf: (job_type == JobType::BackgroundUdf).then(|| {
                let module = text(field_type::UDF_FILENAME).unwrap_or_default();
                (module, text(field_type::UDF_FUNCTION).unwrap_or_default())
            }),
            started_ms: now_ms,
            done: AtomicBool::new(false),
            reason: AtomicU8::new(Reason::Ok as u8),
            abort: AtomicBool::new(false),
            progress: AtomicU64::new(0),
            finished_ms: AtomicU64::new(0),
            succeeded: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            filtered: AtomicU64::new(0),
            throttled: AtomicU64::new(0),
            net_io_bytes: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
        }
    }

    pub(crate) fn is_active(&self) -> bool {
        !self.done.load(Ordering::Acquire)
    }

    /// Whether a `query-abort` asked the job to stop.
    pub(crate) fn abort_requested(&self) -> bool {
        self.abort.load(Ordering::Relaxed)
    }

    /// Asks an active job to stop (it reports `active(user-aborted)` until
    /// it notices); false when it is done already.
    fn request_abort(&self) -> bool {
        if !self.is_active() {
            return false;
        }
        self.reason
            .store(Reason::UserAborted as u8, Ordering::Relaxed);
        self.abort.store(true, Ordering::Relaxed);
        true
    }

    /// Ends the job at `now_ms`, for `reason` (once: a later call changes
    /// nothing).
    pub(crate) fn finish(&self, reason: Reason, now_ms: u64) {
        if self.done.swap(true, Ordering::AcqRel) {
            return;
        }
        // A job asked to stop that ends before it noticed ends aborted.
        let reason = match reason {
            Reason::Ok if self.abort_requested() => Reason::UserAborted,
            reason => reason,
        };
        self.finished_ms.store(now_ms, Ordering::Relaxed);
        self.progress.store(10_000, Ordering::Relaxed);
        self.reason.store(reason as u8, Ordering::Release);
    }

    /// The job's counts so far (a foreground walk's totals).
    pub(crate) fn set_counts(&self, counts: Counts, progress_hundredths: u64) {
        self.succeeded.store(counts.succeeded, Ordering::Relaxed);
        self.failed.store(counts.failed, Ordering::Relaxed);
        self.filtered.store(counts.filtered, Ordering::Relaxed);
        self.throttled.store(counts.throttled, Ordering::Relaxed);
        if self.is_active() {
            self.progress.store(progress_hundredths, Ordering::Relaxed);
        }
    }

    /// Adds to the job's counts (a background job's writes).
    pub(crate) fn add_counts(&self, counts: Counts) {
        self.succeeded
            .fetch_add(counts.succeeded, Ordering::Relaxed);
        self.failed.fetch_add(counts.failed, Ordering::Relaxed);
        self.filtered.fetch_add(counts.filtered, Ordering::Relaxed);
        self.throttled
            .fetch_add(counts.throttled, Ordering::Relaxed);
    }

    pub(crate) fn set_progress(&self, progress_hundredths: u64) {
        if self.is_active() {
            self.progress.store(progress_hundredths, Ordering::Relaxed);
        }
    }

    /// Bytes sent to the job's client.
    pub(crate) fn add_net_io(&self, bytes: usize) {
        self.net_io_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Marks one background write under way until the guard goes.
    pub(crate) fn write_under_way(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self)
    }

    /// The `query-show` line at `now_ms`.
    fn show(&self, now_ms: u64) -> String {
        let done = !self.is_active();
        let reason = Reason::from_u8(self.reason.load(Ordering::Acquire));
        let finished = self.finished_ms.load(Ordering::Relaxed);
        let (run_time, since_done) = match done {
            false => (now_ms.saturating_sub(self.started_ms), 0),
            true => (
                finished.saturating_sub(self.started_ms),
                now_ms.saturating_sub(finished),
            ),
        };
        let progress = self.progress.load(Ordering::Relaxed);
        let mut line = format!("trid={}:ns={}", self.trid, self.namespace);
        if !self.set.is_empty() {
            line.push_str(&format!(":set={}", self.set));
        }
        if let Some(index) = &self.index {
            line.push_str(&format!(":sindex-name={index}"));
        }
        if let Some((pids, digests)) = self.requested {
            line.push_str(&format!(
                ":n-pids-requested={pids}:n-keyds-requested={digests}"
            ));
        }
        line.push_str(&format!(
            ":rps={}:active-threads={}:status={}({}):job-progress={}.{:02}:run-time={run_time}:time-since-done={since_done}:recs-throttled={}:recs-filtered-meta=0:recs-filtered-bins={}:recs-succeeded={}:recs-failed={}",
            self.rate,
            u8::from(!done),
            if done { "done" } else { "active" },
            reason.text(),
            progress / 100,
            progress % 100,
            self.throttled.load(Ordering::Relaxed),
            self.filtered.load(Ordering::Relaxed),
            self.succeeded.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        ));
        if let Some(from) = self.from {
            line.push_str(&format!(":from={}+{}", from.ip(), from.port()));
        }
        line.push_str(&format!(
            ":job-type={}:net-io-bytes={}",
            self.job_type.name(),
            self.net_io_bytes.load(Ordering::Relaxed)
        ));
        self.push_tail(&mut line);
        line
    }

    /// The line's type-specific end.
    fn push_tail(&self, line: &mut String) {
        let in_flight = self.in_flight.load(Ordering::Relaxed);
        match (&self.udf, self.job_type) {
            (_, JobType::Basic | JobType::Aggregation) => line.push_str(&format!(
                ":net-io-time=0:socket-timeout={}",
                self.socket_timeout
            )),
            (Some((module, function)), _) => line.push_str(&format!(
                ":socket-timeout={}:udf-filename={module}:udf-function={function}:udf-active={in_flight}",
                self.socket_timeout
            )),
            (None, _) => line.push_str(&format!(
                ":socket-timeout={}:ops-active={in_flight}",
                self.socket_timeout
            )),
        }
    }
}

/// A background write counted in `ops-active` / `udf-active` while it
/// lives.
pub(crate) struct InFlight<'a>(&'a Monitor);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A foreground job's monitor, held by its walk: a walk dropped before it
/// finished (its client went away, its connection closed) ends the job as
/// `abandoned-response-error`.
pub(crate) struct Watch {
    pub monitor: Arc<Monitor>,
    clock: Arc<dyn crate::Clock>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.monitor.fmt(f)
    }
}

impl Watch {
    pub(crate) fn finish(&self, reason: Reason) {
        self.monitor.finish(reason, self.clock.now_unix_ms());
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.finish(Reason::ResponseError);
    }
}

/// The request's task id (TASK_ID, field 7), if it names one.
pub(crate) fn task_id(message: &Message<'_>) -> Option<u64> {
    message
        .field(field_type::TASK_ID)
        .and_then(|bytes| <[u8; 8]>::try_from(bytes).ok())
        .map(u64::from_be_bytes)
        .filter(|trid| *trid != 0)
}

/// The node's jobs as `query-show` knows them.
#[derive(Default)]
pub(crate) struct Monitors {
    /// Every job not yet forgotten, oldest first.
    entries: Mutex<VecDeque<Arc<Monitor>>>,
    /// The last task id given to a request that named none.
    unnamed: AtomicU64,
}

impl Monitors {
    /// Registers a foreground job (given a task id of the node's own when
    /// its request named none); refused with 4 while an active job has its
    /// task id.
    pub(crate) fn add_foreground(
        &self,
        mut monitor: Monitor,
        clock: Arc<dyn crate::Clock>,
    ) -> Result<Watch, ResultCode> {
        if monitor.trid == 0 {
            monitor.trid = self.unnamed.fetch_add(1, Ordering::Relaxed) + 1;
        }
        let monitor = Arc::new(monitor);
        let mut entries = self.entries.lock();
        if entries
            .iter()
            .any(|known| known.trid == monitor.trid && known.is_active())
        {
            return Err(ResultCode::Parameter);
        }
        entries.push_back(Arc::clone(&monitor));
        forget_past_limit(&mut entries);
        Ok(Watch { monitor, clock })
    }

    /// A watch over a client's short query (`info1 SHORT_QUERY`), which the
    /// reference does not track: timed and finished as any job's, but kept
    /// out of the registry, so `query-show` never lists it.
    pub(crate) fn unlisted(monitor: Monitor, clock: Arc<dyn crate::Clock>) -> Watch {
        Watch {
            monitor: Arc::new(monitor),
            clock,
        }
    }

    /// Registers a background job; refused with 4 when a background job
    /// with its task id is registered already (active or among the last
    /// finished: the reference refuses a known id, a retry included), and
    /// with 211 while [`MAX_ACTIVE`] background jobs are active.
    pub(crate) fn add_background(&self, mut monitor: Monitor) -> Result<Arc<Monitor>, ResultCode> {
        let mut entries = self.entries.lock();
        if monitor.trid != 0
            && entries
                .iter()
                .any(|known| known.trid == monitor.trid && known.job_type.is_background())
        {
            return Err(ResultCode::Parameter);
        }
        let active = entries
            .iter()
            .filter(|known| known.job_type.is_background() && known.is_active())
            .count();
        if active >= MAX_ACTIVE {
            return Err(ResultCode::QueryQueueFull);
        }
        if monitor.trid == 0 {
            monitor.trid = self.unnamed.fetch_add(1, Ordering::Relaxed) + 1;
        }
        let monitor = Arc::new(monitor);
        entries.push_back(Arc::clone(&monitor));
        forget_past_limit(&mut entries);
        Ok(monitor)
    }

    /// The newest job with task id `trid`.
    fn find(&self, trid: u64) -> Option<Arc<Monitor>> {
        self.entries
            .lock()
            .iter()
            .rev()
            .find(|monitor| monitor.trid == trid)
            .cloned()
    }
}

/// Forgets the oldest finished jobs past [`MAX_DONE`].
fn forget_past_limit(entries: &mut VecDeque<Arc<Monitor>>) {
    let done = entries.iter().filter(|job| !job.is_active()).count();
    let mut excess = done.saturating_sub(MAX_DONE);
    entries.retain(|job| {
        if excess > 0 && !job.is_active() {
            excess -= 1;
            return false;
        }
        true
    });
}

/// Why a command's task id is refused: the answer to give.
#[derive(Debug, PartialEq, Eq)]
enum BadId {
    /// `id=` (or `trid=`) with nothing after it.
    Empty,
    /// Not a task id (see [`parse_task_id`]).
    Malformed,
}

impl BadId {
    fn answer(&self) -> String {
        match self {
            BadId::Empty => "ERROR:4:missing 'id' value".to_owned(),
            BadId::Malformed => "ERROR:4:bad id".to_owned(),
        }
    }
}

/// The task id an info command names: `id=`, else the older `trid=` (an
/// `id=` given wins, even empty); `None` without either.
fn id_param(command: &InfoCommand<'_>) -> Option<Result<u64, BadId>> {
    let text = command.param("id").or_else(|| command.param("trid"))?;
    Some(match text {
        "" => Err(BadId::Empty),
        text => parse_task_id(text).ok_or(BadId::Malformed),
    })
}

/// A task id as the reference reads one: the whole text a number in C's
/// base-0 notation (decimal; `0x`/`0X` hexadecimal; octal after a leading
/// `0`), an optional sign first and nothing else (no space), within 64
/// bits; a negative one wraps (`-1` is 2^64 - 1). 0 is no task id.
fn parse_task_id(text: &str) -> Option<u64> {
    let (negative, unsigned) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let (radix, digits) = match unsigned.get(..2) {
        Some("0x" | "0X") => (16, &unsigned[2..]),
        _ if unsigned.len() > 1 && unsigned.starts_with('0') => (8, &unsigned[1..]),
        _ => (10, unsigned),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let value = u64::from_str_radix(digits, radix).ok()?;
    let value = if negative {
        value.wrapping_neg()
    } else {
        value
    };
    (value != 0).then_some(value)
}

/// `query-show[:id=ID]` (also `trid=`): the job's line,
/// or every job's, newest first.
pub(crate) fn show(monitors: &Monitors, command: &InfoCommand<'_>, now_ms: u64) -> String {
    match id_param(command) {
        Some(Ok(trid)) => match monitors.find(trid) {
            Some(monitor) => monitor.show(now_ms),
            None => "ERROR:2:job not found".to_owned(),
        },
        Some(Err(bad)) => bad.answer(),
        None => monitors
            .entries
            .lock()
            .iter()
            .rev()
            .map(|monitor| monitor.show(now_ms))
            .collect::<Vec<_>>()
            .join(";"),
    }
}

/// `query-abort:id=ID` (also `trid=`).
pub(crate) fn abort(monitors: &Monitors, command: &InfoCommand<'_>) -> String {
    match id_param(command) {
        Some(Ok(trid)) => match monitors.find(trid) {
            Some(monitor) if monitor.request_abort() => "ok".to_owned(),
            _ => "ERROR:2:id not active".to_owned(),
        },
        Some(Err(bad)) => bad.answer(),
        None => "ERROR:4:missing 'id'".to_owned(),
    }
}

/// `query-abort-all`: asks every active job to stop.
pub(crate) fn abort_all(monitors: &Monitors) -> String {
    let killed = monitors
        .entries
        .lock()
        .iter()
        .filter(|monitor| monitor.request_abort())
        .count();
    format!("number-of-queries-killed:{killed}")
}
