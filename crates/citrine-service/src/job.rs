//! Background scans and queries (protocol 04 §3.4): a scan or query sent
//! with `info2 WRITE` and write ops applies those ops to every record it
//! selects, on the server, after answering the client at once. Clients
//! then poll `query-show` until the job is done.
//!
//! Owns: [`submit`] (from [`crate::scan::start`]), running a job
//! ([`Service::run_background_jobs`] on the server's `citrine-jobs` thread,
//! or inline where no such thread runs), and [`monitor`]: what
//! `query-show` shows of every job, foreground or background, and the
//! `query-show` / `query-abort` / `query-abort-all` info commands.
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
//! is `done` once its cursor ends or it notices an abort, and stays visible
//! to `query-show` until [`MAX_DONE`] later jobs finish.
//!
//! A UDF job (UDF_OP 2 with a module and function, no ops) sends each
//! record's write with the UDF fields instead of ops: the record UDF runs
//! through the same path as a client's `execute` ([`crate::udf`]).

pub(crate) mod monitor;

use crate::namespace::Namespace;
use crate::scan::ScanCursor;
use crate::work::WorkQueue;
use crate::Service;
use citrine_types::{Digest, ResultCode};
use citrine_wire::frame::ProtoHeader;
use citrine_wire::info::InfoCommand;
use citrine_wire::msg::{field_type, info2, info3, op_type, Message, MessageWriter, MsgHeader};
use monitor::{Counts, JobType, Monitor, Reason};
pub use monitor::{Origin, MAX_ACTIVE, MAX_DONE};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Jobs the runner takes turns between.
pub const MAX_RUNNING: usize = 8;

/// Writes one job makes in a turn before the runner moves on.
const WRITES_PER_TURN: usize = 256;

/// How soon a job whose partitions left are all still filling here looks
/// again.
const FILLING_RECHECK: Duration = Duration::from_millis(100);

/// One background job.
pub struct Job {
    /// What `query-show` shows of it: its task id, status and counts.
    monitor: Arc<Monitor>,
    namespace: String,
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
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("monitor", &self.monitor)
            .field("namespace", &self.namespace)
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

impl Progress {
    /// How much of the job is done, in hundredths of a percent: the walk's
    /// share of its partitions, less the share of what it selected that
    /// is not written yet.
    fn done_hundredths(&self) -> u64 {
        let walked = self.cursor.progress_hundredths();
        let pending = self.pending.len() as u64;
        match self.attempted + pending {
            0 => walked,
            selected => walked * self.attempted / selected,
        }
    }
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

/// Jobs waiting for the runner, and what `query-show` knows of every job.
#[derive(Default)]
pub(crate) struct Jobs {
    queue: WorkQueue<Arc<Job>>,
    pub(crate) monitors: monitor::Monitors,
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

/// Registers a background job for `message` (its walk `cursor`, sent by
/// `from`) and starts it; answers its monitor, or `None` for a job sent
/// again with a task id already registered (a client retrying a
/// submission whose answer it lost: it runs once). Refused with 211 when
/// [`MAX_ACTIVE`] jobs are active already.
pub(crate) fn submit(
    service: &Service,
    message: &Message<'_>,
    namespace: &Namespace,
    cursor: Box<ScanCursor>,
    from: Option<std::net::SocketAddr>,
) -> Result<Option<Arc<Monitor>>, ResultCode> {
    let udf: Vec<(u8, Vec<u8>)> = [
        field_type::UDF_FILENAME,
        field_type::UDF_FUNCTION,
        field_type::UDF_ARGLIST,
    ]
    .into_iter()
    .filter_map(|kind| Some((kind, message.field(kind)?.to_vec())))
    .collect();
    let job_type = match udf.is_empty() {
        true => JobType::BackgroundOps,
        false => JobType::BackgroundUdf,
    };
    let monitor = Monitor::new(
        message,
        job_type,
        &namespace.config.name,
        cursor.index_name(),
        from,
        service.now().unix_ms,
    );
    let Some(monitor) = service.jobs.monitors.add_background(monitor)? else {
        return Ok(None);
    };
    let job = Arc::new(Job {
        monitor: Arc::clone(&monitor),
        namespace: namespace.config.name.clone(),
        header: message.header,
        rate: message
            .field(field_type::RECORDS_PER_SECOND)
            .and_then(|bytes| <[u8; 4]>::try_from(bytes).ok())
            .map_or(0, u32::from_be_bytes),
        filter: message
            .field(field_type::FILTER_EXPRESSION)
            .map(<[u8]>::to_vec),
        udf,
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
    });
    if !service.jobs.queue.push(job) {
        service.run_pending_background_jobs();
    }
    Ok(Some(monitor))
}

impl Job {
    fn finish(&self, service: &Service, reason: Reason) {
        self.monitor.finish(reason, service.now().unix_ms);
    }

    /// One turn: up to [`WRITES_PER_TURN`] writes (stepping the cursor
    /// when nothing selected is left to write), until the job ends or its
    /// next write is not yet due.
    fn turn(&self, service: &Service) -> Turn {
        let mut guard = self.progress.lock();
        let Some(progress) = guard.as_mut() else {
            self.finish(service, Reason::Ok);
            return Turn::Finished;
        };
        let started = *progress.started.get_or_insert_with(Instant::now);
        for _ in 0..WRITES_PER_TURN {
            if self.monitor.abort_requested() {
                *guard = None;
                service.dist().drop_released_copies();
                self.finish(service, Reason::UserAborted);
                return Turn::Finished;
            }
            let Some(digest) = progress.pending.front().copied() else {
                if progress.exhausted {
                    *guard = None;
                    service.dist().drop_released_copies();
                    self.finish(service, Reason::Ok);
                    return Turn::Finished;
                }
                progress.scratch.clear();
                progress.exhausted =
                    progress
                        .cursor
                        .advance(service, service.now(), &mut progress.scratch);
                progress.pending.extend(progress.cursor.take_collected());
                self.monitor.add_counts(Counts {
                    filtered: progress.cursor.take_filtered(),
                    ..Counts::default()
                });
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
            let code = {
                let _under_way = self.monitor.write_under_way();
                self.apply(service, &digest, &mut progress.frame, &mut progress.reply)
            };
            let throttled = u64::from(self.rate > 0);
            let counts = match code {
                0 => Counts {
                    succeeded: 1,
                    throttled,
                    ..Counts::default()
                },
                27 => Counts {
                    filtered: 1,
                    ..Counts::default()
                },
                // Deleted since it was selected: nothing to do.
                2 => continue,
                _ => Counts {
                    failed: 1,
                    throttled,
                    ..Counts::default()
                },
            };
            self.monitor.add_counts(counts);
            self.monitor.set_progress(progress.done_hundredths());
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
}

/// `query-show[:id=ID]` (also `trid=`): see [`monitor`].
pub(crate) fn show(service: &Service, command: &InfoCommand<'_>) -> String {
    monitor::show(&service.jobs.monitors, command, service.now().unix_ms)
}

/// `query-abort:id=ID` (also `trid=`).
pub(crate) fn abort(service: &Service, command: &InfoCommand<'_>) -> String {
    monitor::abort(&service.jobs.monitors, command)
}

/// `query-abort-all`.
pub(crate) fn abort_all(service: &Service) -> String {
    monitor::abort_all(&service.jobs.monitors)
}

#[cfg(test)]
mod tests;
