//! Background scans and queries (protocol 04 §3.4): a scan or query sent
//! with `info2 WRITE` and write ops applies those ops to every record it
//! selects, on the server, after answering the client at once. Clients
//! then poll `query-show` until the job is done.
//!
//! Owns: [`start`] (dispatch sends it the requests
//! [`crate::scan::is_background`] says are jobs; it checks them with the
//! scan's own checks, builds the cursor over the partitions this node
//! masters and answers one LAST/0 at once; over a set never written,
//! LAST/0 and no job, as the reference answers), running a job ([`Runner::run`] on the server's
//! `citrine-jobs` thread, or inline where no such thread runs), and
//! [`monitor`]: what `query-show` shows of every job, foreground or
//! background, and the `query-show` / `query-abort` / `query-abort-all`
//! info commands.
//!
//! What it reaches: a [`Runner`] — the two layers ([`crate::Layers`]),
//! this node's [`Jobs`], and the service's request path as a narrow
//! [`WritePath`] (a job's writes are whole requests: the service runs
//! them as it runs a client's) — plus, to start a job, the UDF modules
//! and the namespace's secondary indexes. Never the service itself.
//!
//! A job walks its records with the same [`ScanCursor`] a foreground scan
//! or query uses (partitions this node masters, set, index range, filter
//! expression), collecting digests a step at a time; in a cluster, a
//! partition this node masters but is still filling (a migration towards
//! it) is walked only once it is whole, the others first, so no record of
//! it is missed; the partitions a job keeps are pinned until walked
//! ([`crate::migration::JobPins`]): a view that moves one away (to a node
//! that joined after the job started, so never got it) defers the drop of
//! this node's copy until the job has walked it. It applies the ops
//! to each through the ordinary write path ([`WritePath`], the service's
//! single-record path: partition lock, replication, statistics; timed
//! as a `udf-sub` or `ops-sub` sub-transaction), as a single-record write of the
//! record's digest with the request's write flags, its filter expression
//! (checked again under the lock) and `UPDATE_ONLY`, so a record deleted
//! meanwhile is not brought back.
//!
//! The runner interleaves jobs: up to [`MAX_RUNNING`] at once, each taking
//! a turn of at most `WRITES_PER_TURN` writes, so a job paced by
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
use crate::scan::{self, IndexesOf, ScanCursor};
use crate::transaction;
use crate::work::WorkQueue;
use crate::{CloseConnection, Layers};
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

/// The request path a job's record writes go through: the service's own
/// single-record path (refusals, partition lock, routing, replication,
/// statistics; timed as a sub-transaction), which the service implements this for. It is
/// all a job reaches of the service.
pub(crate) trait WritePath: Sync {
    /// Handles one request frame (`header`, `body`) as a client's and
    /// appends its whole reply to `reply`; `Err` when the frame is one a
    /// connection would be closed for.
    fn run(
        &self,
        header: ProtoHeader,
        body: &[u8],
        reply: &mut Vec<u8>,
    ) -> Result<(), CloseConnection>;
}

/// What starts and runs jobs: the two layers, this node's jobs, and the
/// path their writes take.
#[derive(Clone, Copy)]
pub(crate) struct Runner<'s> {
    pub(crate) layers: Layers<'s>,
    pub(crate) jobs: &'s Jobs,
    pub(crate) writes: &'s dyn WritePath,
}

/// Starts a background scan or query (see [`crate::scan::is_background`]):
/// checks it as a scan is checked, its ops as a job's
/// ([`check_ops`], with the UDF `modules`), parses its walk (with the
/// namespace's secondary `indexes`) and answers at once: accepted (0)
/// and submitted, or refused.
pub(crate) fn start(
    runner: Runner<'_>,
    modules: &citrine_udf::Registry,
    indexes: IndexesOf<'_>,
    message: &Message<'_>,
    out: &mut Vec<u8>,
    origin: Origin,
) {
    let layers = runner.layers;
    let parsed = scan::check_request(layers, message, true).and_then(|namespace| {
        check_ops(message, modules)?;
        let cursor = scan::parse(message, Arc::clone(&namespace), indexes(&namespace), true)?;
        Ok((namespace, cursor))
    });
    let (namespace, mut cursor) = match parsed {
        Err(code) => {
            scan::refuse(layers, out, code);
            return;
        }
        Ok((_, None)) => {
            // A set never written: accepted, with nothing to do and no
            // job to show (`query-show` answers "job not found", as the
            // reference's does).
            transaction::write_stream_end(out, ResultCode::Ok);
            return;
        }
        Ok((namespace, Some(cursor))) => (namespace, cursor),
    };
    if layers.dist.routes() {
        // Partitions another node masters are its work.
        cursor.keep_mastered_partitions(layers);
    }
    let from = match origin {
        Origin::Client(from) => from,
        Origin::Peer => None,
    };
    let start = out.len();
    match submit(runner, message, &namespace, Box::new(cursor), from) {
        Ok(monitor) => {
            transaction::write_stream_end(out, ResultCode::Ok);
            monitor.add_net_io(out.len() - start);
        }
        Err(code) => transaction::write_stream_end(out, code),
    }
}

/// Registers a background job for `message` (its walk `cursor`, sent by
/// `from`) and starts it; answers its monitor. Refused with 4 when a
/// background job with its task id is registered already, and with 211
/// when [`MAX_ACTIVE`] jobs are active already.
fn submit(
    runner: Runner<'_>,
    message: &Message<'_>,
    namespace: &Namespace,
    cursor: Box<ScanCursor>,
    from: Option<std::net::SocketAddr>,
) -> Result<Arc<Monitor>, ResultCode> {
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
        runner.layers.now().unix_ms,
    );
    let monitor = runner.jobs.monitors.add_background(monitor)?;
    let job = Arc::new(Job::new(
        Arc::clone(&monitor),
        message,
        namespace,
        udf,
        cursor,
    ));
    if !runner.jobs.queue.push(job) {
        runner.run_pending();
    }
    Ok(monitor)
}

impl Job {
    /// The job `monitor` shows: `message`'s writes (or its `udf` call) on
    /// each record of `namespace` that `cursor` selects.
    fn new(
        monitor: Arc<Monitor>,
        message: &Message<'_>,
        namespace: &Namespace,
        udf: Vec<(u8, Vec<u8>)>,
        cursor: Box<ScanCursor>,
    ) -> Job {
        Job {
            monitor,
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
        }
    }

    fn finish(&self, layers: Layers<'_>, reason: Reason) {
        self.monitor.finish(reason, layers.now().unix_ms);
    }

    /// Ends the job (done or aborted): its walk goes, with the pins that
    /// held copies for it.
    fn end(&self, progress: &mut Option<Progress>, layers: Layers<'_>, reason: Reason) -> Turn {
        *progress = None;
        layers.dist.drop_released_copies();
        self.finish(layers, reason);
        Turn::Finished
    }

    /// One turn: up to [`WRITES_PER_TURN`] writes (stepping the cursor
    /// when nothing selected is left to write), until the job ends or its
    /// next write is not yet due.
    fn turn(&self, runner: Runner<'_>) -> Turn {
        let layers = runner.layers;
        let mut guard = self.progress.lock();
        let Some(progress) = guard.as_mut() else {
            self.finish(layers, Reason::Ok);
            return Turn::Finished;
        };
        let started = *progress.started.get_or_insert_with(Instant::now);
        for _ in 0..WRITES_PER_TURN {
            if self.monitor.abort_requested() {
                return self.end(&mut guard, layers, Reason::UserAborted);
            }
            let Some(digest) = progress.pending.front().copied() else {
                if progress.exhausted {
                    return self.end(&mut guard, layers, Reason::Ok);
                }
                if let Some(wait) = self.select_more(progress, layers) {
                    return wait;
                }
                continue;
            };
            if let Some(due) = self.due_later(started, progress.attempted) {
                return Turn::WaitUntil(due);
            }
            progress.pending.pop_front();
            progress.attempted += 1;
            let code = {
                let _under_way = self.monitor.write_under_way();
                self.apply(
                    runner.writes,
                    &digest,
                    &mut progress.frame,
                    &mut progress.reply,
                )
            };
            self.count_write(code, progress);
        }
        Turn::More
    }

    /// Steps the walk for more records to write. `Some` (look again soon)
    /// when it selected none because every partition left is still
    /// filling here.
    fn select_more(&self, progress: &mut Progress, layers: Layers<'_>) -> Option<Turn> {
        progress.scratch.clear();
        progress.exhausted = progress
            .cursor
            .advance(layers, layers.now(), &mut progress.scratch);
        progress.pending.extend(progress.cursor.take_collected());
        let filtered = progress.cursor.take_filtered();
        self.monitor.add_counts(Counts {
            filtered,
            ..Counts::default()
        });
        // Turned away by the walk, they count as the reference counts the
        // sub-transactions its filter turns away.
        if let Some(namespace) = layers.namespace(self.namespace.as_bytes()) {
            let udf = !self.udf.is_empty();
            namespace.stats.sub.count_filtered(udf, filtered);
        }
        (progress.pending.is_empty() && progress.cursor.blocked())
            .then(|| Turn::WaitUntil(Instant::now() + FILLING_RECHECK))
    }

    /// When write number `attempted` is due under RECS_PER_SEC, counted
    /// from the job's first turn at `started`; `None` when it is due now
    /// (or the job has no rate).
    fn due_later(&self, started: Instant, attempted: u64) -> Option<Instant> {
        if self.rate == 0 {
            return None;
        }
        let due = started + Duration::from_micros(attempted * 1_000_000 / u64::from(self.rate));
        (due > Instant::now()).then_some(due)
    }

    /// Counts one write by its result `code`, and the job's progress.
    fn count_write(&self, code: u8, progress: &Progress) {
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
            2 => return,
            _ => Counts {
                failed: 1,
                throttled,
                ..Counts::default()
            },
        };
        self.monitor.add_counts(counts);
        self.monitor.set_progress(progress.done_hundredths());
    }

    /// Runs the job to its end (or its abort) on this thread.
    fn run_to_end(&self, runner: Runner<'_>) {
        loop {
            match self.turn(runner) {
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
        writes: &dyn WritePath,
        digest: &Digest,
        frame: &mut Vec<u8>,
        reply: &mut Vec<u8>,
    ) -> u8 {
        let server_error = ResultCode::ServerError.code();
        self.record_request(digest, frame);
        let Some(Ok(proto)) = frame
            .get(..8)
            .and_then(|bytes| <[u8; 8]>::try_from(bytes).ok())
            .map(|bytes| ProtoHeader::decode(&bytes))
        else {
            return server_error;
        };
        reply.clear();
        if writes.run(proto, &frame[8..], reply).is_err() {
            return server_error;
        }
        reply
            .get(8..)
            .and_then(|body| Message::decode(body).ok())
            .map_or(server_error, |message| message.header.result_code)
    }

    /// The single-record write (a whole frame, in `frame`) the job makes
    /// of one record: its digest, the request's write flags made
    /// `UPDATE_ONLY` (or `REPLACE_ONLY`) so a record deleted meanwhile is
    /// not brought back, its filter expression, and its ops or UDF call.
    fn record_request(&self, digest: &Digest, frame: &mut Vec<u8>) {
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
    }
}

impl Runner<'_> {
    /// Runs background jobs until `stopping` is set (the server's
    /// `citrine-jobs` thread). While it runs, jobs are queued here instead
    /// of running inline in the request that started them.
    pub(crate) fn run(self, stopping: &AtomicBool) {
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
    pub(crate) fn run_pending(self) {
        while let Some(job) = self.jobs.queue.pop() {
            job.run_to_end(self);
        }
    }
}

/// `query-show[:id=ID]` (also `trid=`): see [`monitor`].
pub(crate) fn show(jobs: &Jobs, layers: Layers<'_>, command: &InfoCommand<'_>) -> String {
    monitor::show(&jobs.monitors, command, layers.now().unix_ms)
}

/// `query-abort:id=ID` (also `trid=`).
pub(crate) fn abort(jobs: &Jobs, command: &InfoCommand<'_>) -> String {
    monitor::abort(&jobs.monitors, command)
}

/// `query-abort-all`.
pub(crate) fn abort_all(jobs: &Jobs) -> String {
    monitor::abort_all(&jobs.monitors)
}

#[cfg(test)]
mod tests;
