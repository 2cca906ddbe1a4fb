//! Background scans and queries (protocol 04 §3.4): a scan or query sent
//! with `info2 WRITE` and write ops applies those ops to every record it
//! selects, on the server, after answering the client at once. Clients
//! then poll `query-show` until the job is done.
//!
//! Owns: the job registry (active jobs and the last [`MAX_DONE`] finished
//! ones, by transaction id), [`submit`] (from [`crate::scan::start`]),
//! running a job ([`Service::run_background_jobs`] on the server's
//! `citrine-jobs` thread, or inline where no such thread runs), and the
//! `query-show` / `scan-show` / `query-abort` info commands.
//!
//! A job walks its records with the same [`ScanCursor`] a foreground scan
//! or query uses (partitions this node masters, set, index range, filter
//! expression), collecting digests a step at a time; in a cluster, a
//! partition this node masters but is still filling (a migration towards
//! it) is walked only once it is whole, the others first, so no record of
//! it is missed, and applies the ops
//! to each through the ordinary write path ([`Service::handle`]: partition
//! lock, replication, statistics), as a single-record write of the
//! record's digest with the request's write flags, its filter expression
//! (checked again under the lock) and `UPDATE_ONLY`, so a record deleted
//! meanwhile is not brought back.
//!
//! The runner interleaves jobs: up to [`MAX_RUNNING`] at once, each taking
//! a turn of at most [`WRITES_PER_TURN`] writes, so a job paced by
//! RECS_PER_SEC (it waits for its next write's turn without holding the
//! thread) or a long one does not hold up the others; later jobs wait in
//! order. At most [`MAX_ACTIVE`] jobs are active (running or waiting); one
//! more is refused with 211 (query queue full).
//!
//! Invariants: a job's ops are write ops only (a read op answers 4 before
//! the job starts); every selected record gets one write attempt; a job
//! is `done` once its cursor ends or it is aborted, and stays visible to
//! `query-show` until [`MAX_DONE`] later jobs finish.
//!
//! A UDF job (UDF_OP 2 with a module and function, no ops) sends each
//! record's write with the UDF fields instead of ops: the record UDF runs
//! through the same path as a client's `execute` ([`crate::udf`]).

use crate::namespace::Namespace;
use crate::scan::ScanCursor;
use crate::work::WorkQueue;
use crate::Service;
use citrine_types::{Digest, ResultCode};
use citrine_wire::frame::ProtoHeader;
use citrine_wire::info::InfoCommand;
use citrine_wire::msg::{field_type, info2, info3, op_type, Message, MessageWriter, MsgHeader};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Finished jobs `query-show` still answers for.
pub const MAX_DONE: usize = 100;

/// Jobs the runner takes turns between.
pub const MAX_RUNNING: usize = 8;

/// Jobs active at once (running or waiting for a turn); more are refused.
pub const MAX_ACTIVE: usize = 256;

/// Writes one job makes in a turn before the runner moves on.
const WRITES_PER_TURN: usize = 256;

/// How soon a job whose partitions left are all still filling here looks
/// again.
const FILLING_RECHECK: Duration = Duration::from_millis(100);

/// Where a job stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Status {
    Active = 0,
    Done = 1,
    Aborted = 2,
}

/// One background job.
pub struct Job {
    pub trid: u64,
    namespace: String,
    set: String,
    /// The index a query job uses.
    index: Option<String>,
    /// The request's header, filter expression and ops, for the
    /// per-record writes.
    header: MsgHeader,
    filter: Option<Vec<u8>>,
    ops: Vec<JobOp>,
    /// A UDF job's module, function and argument fields (UDF_FILENAME,
    /// UDF_FUNCTION, UDF_ARGLIST), sent with each record's write instead
    /// of ops.
    udf: Vec<(u8, Vec<u8>)>,
    /// RECS_PER_SEC: writes a second, 0 = as fast as they go.
    rate: u32,
    /// The walk and its place, used by whoever runs the job; `None` once
    /// the job is over.
    progress: Mutex<Option<Progress>>,
    status: AtomicU8,
    abort: AtomicBool,
    progress_pct: AtomicU64,
    succeeded: AtomicU64,
    failed: AtomicU64,
    filtered: AtomicU64,
    started_ms: u64,
    finished_ms: AtomicU64,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("trid", &self.trid)
            .field("namespace", &self.namespace)
            .field("status", &self.status.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Where a job is in its walk.
struct Progress {
    cursor: Box<ScanCursor>,
    /// Selected records not yet written, in walk order.
    pending: VecDeque<Digest>,
    /// The cursor has nothing more to select.
    exhausted: bool,
    /// Pacing is in real time (a monotonic clock), whatever the service's
    /// clock says: write n is due `n / rate` seconds after `started`, the
    /// job's first turn (time spent waiting for a turn is not paced
    /// time).
    started: Option<Instant>,
    attempted: u64,
    scratch: Vec<u8>,
    frame: Vec<u8>,
    reply: Vec<u8>,
}

/// What a job's turn ended with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Turn {
    /// Done or aborted: the runner drops it.
    Finished,
    /// It has more to do now.
    More,
    /// Its next write is due at this instant (RECS_PER_SEC).
    WaitUntil(Instant),
}

/// One op of a job, owned.
struct JobOp {
    op_type: u8,
    particle_type: u8,
    name: Vec<u8>,
    value: Vec<u8>,
}

/// Jobs waiting for the runner, and the registry.
#[derive(Default)]
pub(crate) struct Jobs {
    queue: WorkQueue<Arc<Job>>,
    /// Every job not yet forgotten, oldest first.
    registry: Mutex<VecDeque<Arc<Job>>>,
}

/// Checks a background request's ops: at least one, and only ops that
/// write (reads have nowhere to go: 4, as the reference answers).
pub(crate) fn check_ops(
    message: &Message<'_>,
    modules: &citrine_udf::Registry,
) -> Result<(), ResultCode> {
    if message.field(field_type::UDF_OP).is_some() {
        // A UDF job: the module and function instead of ops. A module this
        // node does not have is no reason to refuse it: the job runs and
        // each record's call fails (`recs-failed`), as the reference's does.
        return match crate::udf::call_of(modules, message)? {
            Some(_) => Ok(()),
            None => Err(ResultCode::Parameter),
        };
    }
    let mut count = 0;
    for op in message.ops() {
        count += 1;
        let writes = matches!(
            op.op_type,
            op_type::WRITE
                | op_type::INCR
                | op_type::APPEND
                | op_type::PREPEND
                | op_type::TOUCH
                | op_type::DELETE_ALL
                | op_type::CDT_MODIFY
                | op_type::BITS_MODIFY
                | op_type::HLL_MODIFY
                | op_type::EXP_MODIFY
        );
        if !writes {
            return Err(ResultCode::Parameter);
        }
    }
    if count == 0 {
        return Err(ResultCode::Parameter);
    }
    Ok(())
}

/// Registers a background job for `message` (its walk `cursor`) and starts
/// it; refused with 211 when [`MAX_ACTIVE`] jobs are active already.
pub(crate) fn submit(
    service: &Service,
    message: &Message<'_>,
    namespace: &Namespace,
    cursor: Box<ScanCursor>,
) -> Result<(), ResultCode> {
    let text = |kind| {
        message
            .field(kind)
            .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
    };
    let trid = message
        .field(field_type::TASK_ID)
        .and_then(|bytes| <[u8; 8]>::try_from(bytes).ok())
        .map_or(0, u64::from_be_bytes);
    let index = cursor.index_name();
    let job = Arc::new(Job {
        trid,
        namespace: namespace.config.name.clone(),
        set: text(field_type::SET).unwrap_or_default(),
        index,
        header: message.header,
        rate: message
            .field(field_type::RECORDS_PER_SECOND)
            .and_then(|bytes| <[u8; 4]>::try_from(bytes).ok())
            .map_or(0, u32::from_be_bytes),
        filter: message
            .field(field_type::FILTER_EXPRESSION)
            .map(<[u8]>::to_vec),
        udf: [
            field_type::UDF_FILENAME,
            field_type::UDF_FUNCTION,
            field_type::UDF_ARGLIST,
        ]
        .into_iter()
        .filter_map(|kind| Some((kind, message.field(kind)?.to_vec())))
        .collect(),
        ops: message
            .ops()
            .map(|op| JobOp {
                op_type: op.op_type,
                particle_type: op.particle_type,
                name: op.name.to_vec(),
                value: op.value.to_vec(),
            })
            .collect(),
        progress: Mutex::new(Some(Progress {
            cursor,
            pending: VecDeque::new(),
            exhausted: false,
            started: None,
            attempted: 0,
            scratch: Vec::new(),
            frame: Vec::new(),
            reply: Vec::new(),
        })),
        status: AtomicU8::new(Status::Active as u8),
        abort: AtomicBool::new(false),
        progress_pct: AtomicU64::new(0),
        succeeded: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        filtered: AtomicU64::new(0),
        started_ms: service.now().unix_ms,
        finished_ms: AtomicU64::new(0),
    });
    let jobs = &service.jobs;
    {
        // The count and the registration under one lock: concurrent
        // submissions cannot all pass the limit.
        let mut registry = jobs.registry.lock();
        if trid != 0 && registry.iter().any(|known| known.trid == trid) {
            // The same job sent again (a client retrying a submission whose
            // answer it lost): it runs once.
            return Ok(());
        }
        let active = registry
            .iter()
            .filter(|job| job.status() == Status::Active)
            .count();
        if active >= MAX_ACTIVE {
            return Err(ResultCode::QueryQueueFull);
        }
        registry.push_back(Arc::clone(&job));
        // Forget the oldest finished jobs past the limit.
        let done = registry
            .iter()
            .filter(|job| job.status() != Status::Active)
            .count();
        let mut excess = done.saturating_sub(MAX_DONE);
        registry.retain(|job| {
            if excess > 0 && job.status() != Status::Active {
                excess -= 1;
                return false;
            }
            true
        });
    }
    if !jobs.queue.push(job) {
        service.run_pending_background_jobs();
    }
    Ok(())
}

impl Job {
    fn status(&self) -> Status {
        match self.status.load(Ordering::Acquire) {
            0 => Status::Active,
            1 => Status::Done,
            _ => Status::Aborted,
        }
    }

    fn finish(&self, service: &Service, status: Status) {
        self.finished_ms
            .store(service.now().unix_ms, Ordering::Relaxed);
        if status == Status::Done {
            self.progress_pct.store(100, Ordering::Relaxed);
        }
        self.status.store(status as u8, Ordering::Release);
    }

    /// One turn: up to [`WRITES_PER_TURN`] writes (stepping the cursor
    /// when nothing selected is left to write), until the job ends or its
    /// next write is not yet due.
    fn turn(&self, service: &Service) -> Turn {
        let mut guard = self.progress.lock();
        let Some(progress) = guard.as_mut() else {
            if self.status() == Status::Active {
                self.finish(service, Status::Done);
            }
            return Turn::Finished;
        };
        let started = *progress.started.get_or_insert_with(Instant::now);
        for _ in 0..WRITES_PER_TURN {
            if self.abort.load(Ordering::Relaxed) {
                *guard = None;
                service.drop_released_copies();
                self.finish(service, Status::Aborted);
                return Turn::Finished;
            }
            let Some(digest) = progress.pending.front().copied() else {
                if progress.exhausted {
                    *guard = None;
                    service.drop_released_copies();
                    self.finish(service, Status::Done);
                    return Turn::Finished;
                }
                progress.scratch.clear();
                progress.exhausted =
                    progress
                        .cursor
                        .advance(service, service.now(), &mut progress.scratch);
                progress.pending.extend(progress.cursor.take_collected());
                self.progress_pct
                    .store(progress.cursor.progress_pct(), Ordering::Relaxed);
                if progress.pending.is_empty() && progress.cursor.blocked() {
                    // Every partition left is still filling here.
                    return Turn::WaitUntil(Instant::now() + FILLING_RECHECK);
                }
                continue;
            };
            if self.rate > 0 {
                // RECS_PER_SEC: this write's turn.
                let due = started
                    + Duration::from_micros(progress.attempted * 1_000_000 / u64::from(self.rate));
                if due > Instant::now() {
                    return Turn::WaitUntil(due);
                }
            }
            progress.pending.pop_front();
            progress.attempted += 1;
            let code = self.apply(service, &digest, &mut progress.frame, &mut progress.reply);
            let counter = match code {
                0 => &self.succeeded,
                27 => &self.filtered,
                // Deleted since it was selected: nothing to do.
                2 => continue,
                _ => &self.failed,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        Turn::More
    }

    /// Runs the job to its end (or its abort) on this thread.
    fn run_to_end(&self, service: &Service) {
        loop {
            match self.turn(service) {
                Turn::Finished => return,
                Turn::More => {}
                Turn::WaitUntil(due) => {
                    std::thread::sleep(due.saturating_duration_since(Instant::now()))
                }
            }
        }
    }

    /// Applies the job's ops to one record through the write path; answers
    /// the write's result code.
    fn apply(
        &self,
        service: &Service,
        digest: &Digest,
        frame: &mut Vec<u8>,
        reply: &mut Vec<u8>,
    ) -> u8 {
        let server_error = ResultCode::ServerError.code();
        let original = self.header;
        let mut info3_bits = original.info3 & !(info3::PARTITION_DONE | info3::LAST);
        if info3_bits & info3::CREATE_OR_REPLACE != 0 {
            info3_bits = (info3_bits & !info3::CREATE_OR_REPLACE) | info3::REPLACE_ONLY;
        } else if info3_bits & info3::REPLACE_ONLY == 0 {
            info3_bits |= info3::UPDATE_ONLY;
        }
        // A UDF job's record writes are writes whatever its header said.
        let udf_write = if self.udf.is_empty() { 0 } else { info2::WRITE };
        let header = MsgHeader {
            info1: 0,
            info2: original.info2 | udf_write,
            info3: info3_bits,
            record_ttl: original.record_ttl,
            transaction_ttl: 1000,
            ..MsgHeader::default()
        };
        frame.clear();
        let mut writer = MessageWriter::begin(frame, &header);
        writer
            .field(field_type::NAMESPACE, self.namespace.as_bytes())
            .field(field_type::DIGEST, &digest.0);
        if let Some(filter) = &self.filter {
            writer.field(field_type::FILTER_EXPRESSION, filter);
        }
        for (kind, data) in &self.udf {
            writer.field(*kind, data);
        }
        for op in &self.ops {
            writer.op(op.op_type, op.particle_type, &op.name, &op.value);
        }
        writer.finish();
        let Some(Ok(proto)) = frame
            .get(..8)
            .and_then(|bytes| <[u8; 8]>::try_from(bytes).ok())
            .map(|bytes| ProtoHeader::decode(&bytes))
        else {
            return server_error;
        };
        reply.clear();
        if service.handle(proto, &frame[8..], reply).is_err() {
            return server_error;
        }
        reply
            .get(8..)
            .and_then(|body| Message::decode(body).ok())
            .map_or(server_error, |message| message.header.result_code)
    }

    /// The `query-show` line.
    fn show(&self, now_ms: u64) -> String {
        let status = match self.status() {
            Status::Active => "active(ok)",
            Status::Done => "done(ok)",
            Status::Aborted => "done(abandoned-user-aborted)",
        };
        let finished = self.finished_ms.load(Ordering::Relaxed);
        let (run_time, since_done) = if finished == 0 {
            (now_ms.saturating_sub(self.started_ms), 0)
        } else {
            (
                finished.saturating_sub(self.started_ms),
                now_ms.saturating_sub(finished),
            )
        };
        let mut line = format!(
            "trid={}:job-type=background:ns={}",
            self.trid, self.namespace
        );
        if !self.set.is_empty() {
            line.push_str(&format!(":set={}", self.set));
        }
        if let Some(index) = &self.index {
            line.push_str(&format!(":sindex-name={index}"));
        }
        line.push_str(&format!(
            ":status={status}:job-progress={}:run-time={run_time}:time-since-done={since_done}:recs-throttled=0:recs-filtered-meta=0:recs-filtered-bins={}:recs-succeeded={}:recs-failed={}:",
            self.progress_pct.load(Ordering::Relaxed),
            self.filtered.load(Ordering::Relaxed),
            self.succeeded.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        ));
        line
    }
}

impl Service {
    /// Runs background jobs until `stopping` is set (the server's
    /// `citrine-jobs` thread). While it runs, jobs are queued here instead
    /// of running inline in the request that started them.
    pub fn run_background_jobs(&self, stopping: &AtomicBool) {
        let mut running: Vec<Arc<Job>> = Vec::new();
        let mut waiting: VecDeque<Arc<Job>> = VecDeque::new();
        self.jobs.queue.serve_turns(stopping, |new| {
            waiting.extend(new);
            while running.len() < MAX_RUNNING {
                let Some(job) = waiting.pop_front() else {
                    break;
                };
                running.push(job);
            }
            let mut busy = false;
            let mut next_due: Option<Instant> = None;
            running.retain(|job| match job.turn(self) {
                Turn::Finished => false,
                Turn::More => {
                    busy = true;
                    true
                }
                Turn::WaitUntil(due) => {
                    next_due = Some(next_due.map_or(due, |next| next.min(due)));
                    true
                }
            });
            if busy || (running.len() < MAX_RUNNING && !waiting.is_empty()) {
                Some(Duration::ZERO)
            } else {
                // Idle, or every running job waits for its pace.
                next_due.map(|due| due.saturating_duration_since(Instant::now()))
            }
        });
    }

    /// Runs every queued job now, to its end, on this thread.
    pub fn run_pending_background_jobs(&self) {
        while let Some(job) = self.jobs.queue.pop() {
            job.run_to_end(self);
        }
    }

    fn job(&self, trid: u64) -> Option<Arc<Job>> {
        self.jobs
            .registry
            .lock()
            .iter()
            .rev()
            .find(|job| job.trid == trid)
            .cloned()
    }
}

fn trid_param(command: &InfoCommand<'_>) -> Option<u64> {
    command
        .param("trid")
        .or_else(|| command.param("id"))
        .and_then(|text| text.parse().ok())
}

/// `query-show:trid=ID` (also `id=`, and `scan-show`): the job's status
/// line; `ERROR:2:job not found` for a job this node does not know.
pub(crate) fn show(service: &Service, command: &InfoCommand<'_>) -> String {
    let now_ms = service.now().unix_ms;
    match trid_param(command) {
        Some(trid) => match service.job(trid) {
            Some(job) => job.show(now_ms),
            None => "ERROR:2:job not found".to_owned(),
        },
        // Every job this node knows.
        None => service
            .jobs
            .registry
            .lock()
            .iter()
            .map(|job| job.show(now_ms))
            .collect::<Vec<_>>()
            .join(";"),
    }
}

/// `query-abort:trid=ID` (also `id=`, and `scan-abort`).
pub(crate) fn abort(service: &Service, command: &InfoCommand<'_>) -> String {
    match trid_param(command).and_then(|trid| service.job(trid)) {
        Some(job) if job.status() == Status::Active => {
            job.abort.store(true, Ordering::Relaxed);
            // Reported aborted now, also while it waits for a turn (the
            // runner drops it at its next turn; a turn under way stops
            // before its next write).
            job.finish(service, Status::Aborted);
            "OK".to_owned()
        }
        Some(_) => "ERROR:2:job already finished".to_owned(),
        None => "ERROR:2:job not found".to_owned(),
    }
}

#[cfg(test)]
mod tests;
