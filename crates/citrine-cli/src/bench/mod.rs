//! `citrine bench`: a closed-loop (optionally rate-limited) load generator
//! on top of the smart client, and the `--noop-server` responder.
//!
//! Owns the worker loop, the once-a-second report, the final HDR percentile
//! table and the JSON summary. Each of the `-c` workers is one tokio task
//! issuing one command at a time; each has its own [`stats::OpStats`] per
//! op type behind an uncontended mutex that the reporter swaps out every
//! second, so the hot path never shares a histogram.
//!
//! The `udf` and `udf-read` workloads first register the bench's own Lua
//! module ([`UDF_SOURCE`], file `citrine_bench.lua`) unless every node
//! already lists it with the same source.
//!
//! Invariants: a command's latency is measured from just before the client
//! call to just after it returns (retries included); failed commands are
//! counted, not timed; `--ops N` issues exactly N commands (an RMW counts as
//! one); the run ends at `-d` seconds or `--ops`, whichever comes first, and
//! an insert also ends once every key of the range has been written.

pub mod spec;
pub mod stats;
pub mod zipf;

use crate::{noop, CliResult};
use citrine_client::{
    udf_hash, BatchPolicy, Bins, Client, ClientConfig, Error, GenerationPolicy, IndexCollection,
    IndexFilter, IndexType, Key, ReadPolicy, RecordExistsAction, ScanPolicy, Statement, Value,
    WritePolicy,
};
use spec::{ObjectSpec, Workload};
use stats::{round3, OpStats, Summary};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zipf::{KeyDistribution, SplitMix64, Zipf};

#[derive(clap::Args, Debug)]
#[command(
    disable_help_flag = true,
    after_help = "Examples:\n  citrine bench --noop-server 3999                      run the no-op responder\n  \
                  citrine bench -h 127.0.0.1:3000 -k 1000000 -o 10*S:10 -w insert\n  \
                  citrine bench -k 1000000 -o 10*S:10 -w ru,95 -c 32 -d 20 --json out.json\n  \
                  citrine bench -w rmw --zipf 0.99 --rate 5000 --server-pid $(pidof citrined)\n  \
                  citrine bench -k 100000 -o I -w insert -s counters && citrine bench -k 100000 -s counters -w udf\n\n\
                  The udf workloads register the Lua module citrine_bench.lua (function incr: read the first\n\
                  integer bin of -o, add 1, aerospike:update, return the new value; function get: return that\n\
                  bin, nothing written) and call one of them on a random key each operation."
)]
pub struct BenchArgs {
    /// Seed node as HOST:PORT.
    #[arg(
        short = 'h',
        long = "host",
        default_value = "127.0.0.1:3000",
        value_name = "HOST:PORT"
    )]
    pub host: String,
    /// Namespace (comma-separated list with --noop-server: namespaces it serves besides test and bar).
    #[arg(short = 'n', long = "namespace", default_value = "test")]
    pub namespace: String,
    /// Set.
    #[arg(short = 's', long = "set", default_value = "bench")]
    pub set: String,
    /// Number of keys.
    #[arg(short = 'k', long = "keys", default_value_t = 100_000)]
    pub keys: u64,
    /// First key (integer keys key-start .. key-start+keys).
    #[arg(long = "key-start", default_value_t = 0)]
    pub key_start: i64,
    /// Object spec: I, D, S:<len>, B:<len>, with N* repeats, comma-separated (e.g. 10*S:10).
    #[arg(
        short = 'o',
        long = "object-spec",
        default_value = "I",
        value_name = "SPEC"
    )]
    pub object: String,
    /// Workload: ru,READ_PCT (read/update), insert, rmw (read-modify-write
    /// with generation check), query (the records of one group, needs a G:N
    /// bin), udf (a record UDF adding 1 to the first integer bin and
    /// updating the record, on the server) or udf-read (a record UDF
    /// returning that bin: read-only).
    #[arg(short = 'w', long = "workload", default_value = "ru,50")]
    pub workload: String,
    /// Zipfian key choice with this theta in (0,1) (default uniform).
    #[arg(long = "zipf", value_name = "THETA")]
    pub zipf: Option<f64>,
    /// Concurrent commands in flight.
    #[arg(short = 'c', long = "concurrency", default_value_t = 32)]
    pub concurrency: usize,
    /// Duration in seconds (default: 10, or until every key is written for `-w insert`, or until --ops).
    #[arg(short = 'd', long = "duration", value_name = "SECONDS")]
    pub duration: Option<f64>,
    /// Stop after this many commands.
    #[arg(long = "ops", value_name = "N")]
    pub ops: Option<u64>,
    /// Target throughput over all workers (default: as fast as possible).
    #[arg(long = "rate", value_name = "OPS_PER_SEC")]
    pub rate: Option<f64>,
    /// ru workloads: each read is a batch read of this many keys (one
    /// request per node); latency and ops/s count batches, and the summary
    /// adds keys read a second. 1: single-record reads.
    #[arg(long = "batch-size", default_value_t = 1, value_name = "KEYS")]
    pub batch_size: usize,
    /// Write the JSON summary to this file.
    #[arg(long = "json", value_name = "FILE")]
    pub json: Option<String>,
    /// Server process id: report server CPU time per operation from /proc/PID/stat.
    #[arg(long = "server-pid", value_name = "PID")]
    pub server_pid: Option<u32>,
    /// Total timeout of each command in ms.
    #[arg(long = "timeout", default_value_t = 1000, value_name = "MS")]
    pub timeout_ms: u64,
    /// Retries of each command.
    #[arg(long = "retries", default_value_t = 2)]
    pub retries: u32,
    /// Send every command with the filter expression BIN >= VALUE (an
    /// integer bin): what a filter costs the server. Records that fail it
    /// answer FILTERED_OUT and count as errors.
    #[arg(long = "filter-int-ge", value_name = "BIN:VALUE")]
    pub filter_int_ge: Option<String>,
    /// Label stored in the JSON summary.
    #[arg(long = "label", default_value = "")]
    pub label: String,
    /// Reads of a strong-consistency namespace: session, linearize,
    /// allow-replica or allow-unavailable (AP namespaces ignore it).
    #[arg(long = "read-mode", default_value = "session", value_parser = crate::verify_cmd::parse_read_mode)]
    pub read_mode: citrine_client::ReadModeSc,
    /// Do not print the per-second lines.
    #[arg(short = 'q', long = "quiet")]
    pub quiet: bool,
    /// Run the no-op responder on this port instead of benchmarking (0 = any
    /// free port): a stand-in server for trying the client without citrined.
    /// The benchmark ceiling is `citrined --noop`, which is cheaper.
    #[arg(long = "noop-server", value_name = "PORT")]
    pub noop_server: Option<u16>,
    /// Address the no-op responder binds.
    #[arg(long = "noop-address", default_value = "127.0.0.1")]
    pub noop_address: String,
    /// Print help.
    #[arg(long = "help", action = clap::ArgAction::Help)]
    pub help: Option<bool>,
}

/// The expression `[GE, [BIN, INT, name], value]` (protocol 05 §4) from
/// `NAME:VALUE`.
fn int_ge_filter(spec: &str) -> Result<Vec<u8>, String> {
    let usage = || format!("--filter-int-ge wants BIN:VALUE (an integer), not {spec:?}");
    let (name, value) = spec.rsplit_once(':').ok_or_else(usage)?;
    let value: i64 = value.trim().parse().map_err(|_| usage())?;
    if name.is_empty() || name.len() > citrine_types::BIN_NAME_MAX {
        return Err(format!(
            "--filter-int-ge: bin name {name:?} must be 1 to 15 bytes"
        ));
    }
    // GE = 4, BIN = 81, expression type INT = 2.
    let mut out = vec![0x93, 0x04, 0x93, 0x51, 0x02, 0xa0 | name.len() as u8];
    out.extend_from_slice(name.as_bytes());
    out.push(0xd3);
    out.extend_from_slice(&value.to_be_bytes());
    Ok(out)
}

/// Op types tracked separately.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpKind {
    Read = 0,
    Write = 1,
    Rmw = 2,
    /// A batch read of `--batch-size` keys.
    Batch = 3,
    /// A secondary-index query for one group.
    Query = 4,
    /// A record UDF that updates the record (`citrine_bench.incr`).
    Udf = 5,
    /// A read-only record UDF (`citrine_bench.get`).
    UdfRead = 6,
}
const OP_NAMES: [&str; OP_KINDS] = ["read", "write", "rmw", "batch", "query", "udf", "udf-read"];
const OP_KINDS: usize = 7;

/// File name of the bench's Lua module; calls name it [`UDF_MODULE`].
pub const UDF_FILE: &str = "citrine_bench.lua";
/// The module name the `udf` workloads call.
pub const UDF_MODULE: &str = "citrine_bench";
/// The bench's Lua module: `incr(rec, bin)` adds 1 to an integer bin
/// (missing: 0) and updates the record (creating it when missing),
/// returning the new value: a read-modify-write done on the server.
/// `get(rec, bin)` only returns the bin (nil when the record is missing).
pub const UDF_SOURCE: &str = "\
-- citrine bench: the record UDFs of the udf and udf-read workloads.
function incr(rec, bin)
  local value = (rec[bin] or 0) + 1
  rec[bin] = value
  aerospike:update(rec)
  return value
end

function get(rec, bin)
  if not aerospike:exists(rec) then
    return nil
  end
  return rec[bin]
end
";

type WorkerStats = [OpStats; OP_KINDS];

struct Shared {
    client: Client,
    spec: ObjectSpec,
    names: Vec<String>,
    workload: Workload,
    distribution: KeyDistribution,
    args_namespace: String,
    set: String,
    key_start: i64,
    keys: u64,
    stop: AtomicBool,
    issued: AtomicU64,
    ops_limit: Option<u64>,
    next_insert: AtomicU64,
    read_policy: ReadPolicy,
    write_policy: WritePolicy,
    batch_policy: BatchPolicy,
    batch_size: usize,
    /// The query workload: its policy, the group bin's name and group count.
    query_policy: ScanPolicy,
    query_bin: Option<(String, u64)>,
    /// Records the queries returned.
    query_records: AtomicU64,
    /// The udf workloads: the function's argument list (the bin's name).
    udf_args: Vec<Value>,
    per_worker_interval: Option<Duration>,
}

/// Server CPU time (utime + stime) of a process, in µs.
pub fn process_cpu_us(pid: u32) -> Result<u64, String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| format!("cannot read /proc/{pid}/stat: {e} (is --server-pid right?)"))?;
    parse_stat_cpu_ticks(&text)
        .map(|ticks| ticks * 1_000_000 / clock_ticks_per_second())
        .ok_or_else(|| format!("unexpected /proc/{pid}/stat format"))
}

/// utime + stime in clock ticks from a /proc/PID/stat line.
pub fn parse_stat_cpu_ticks(text: &str) -> Option<u64> {
    // The command name (field 2) may contain spaces: fields resume after the last ')'.
    let after = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After ')' field 3 (state) is index 0, so utime (14) is 11 and stime (15) is 12.
    let utime = fields.get(11)?.parse::<u64>().ok()?;
    let stime = fields.get(12)?.parse::<u64>().ok()?;
    Some(utime + stime)
}

fn clock_ticks_per_second() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| {
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse::<u64>()
                .ok()
        })
        .filter(|ticks| *ticks > 0)
        .unwrap_or(100)
}

pub async fn run(args: BenchArgs) -> CliResult {
    if let Some(port) = args.noop_server {
        return serve_noop(&args, port).await;
    }
    let plan = Plan::of(&args)?;
    let client = connect(&args).await?;
    let shared = Arc::new(prepare(&args, &plan, &client).await?);
    let before = Readings::take(&args, &client)?;
    let udf_call = announce(&args, &plan, &shared);
    let mut workers = Workers::spawn(&shared, args.concurrency);
    let totals = workers.report(&args, &shared, plan.duration).await;
    let elapsed = workers.started.elapsed().as_secs_f64();
    let after = Readings::take(&args, &client)?;
    client.close();
    let ended = Ended {
        totals,
        elapsed,
        retries: after.retries - before.retries,
        server_cpu_us_per_op: None,
        client_cpu_us_per_op: None,
    }
    .with_cpu(&before, &after);
    let ops_json = print_op_table(&ended.totals, elapsed);
    let rates = print_totals(&args, &shared, &ended);
    let summary = summary_json(&args, &plan, &shared, &ended, (rates, udf_call, ops_json));
    outln!("JSON {summary}");
    if let Some(path) = &args.json {
        std::fs::write(path, format!("{summary:#}\n"))
            .map_err(|e| format!("cannot write --json {path}: {e}"))?;
    }
    Ok(if ended.total_ops() == 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// `--noop-server`: the no-op responder, serving test, bar and the
/// namespaces `-n` lists.
async fn serve_noop(args: &BenchArgs, port: u16) -> CliResult {
    let mut namespaces = vec!["test".to_owned(), "bar".to_owned()];
    for ns in args
        .namespace
        .split(',')
        .map(str::trim)
        .filter(|ns| !ns.is_empty())
    {
        if !namespaces.iter().any(|known| known == ns) {
            namespaces.push(ns.to_owned());
        }
    }
    noop::serve(&args.noop_address, port, namespaces)
        .await
        .map_err(|e| format!("no-op responder on {}:{port}: {e} (port in use? pick another with --noop-server PORT)", args.noop_address))?;
    Ok(ExitCode::SUCCESS)
}

/// What the arguments ask for, checked before anything connects.
struct Plan {
    spec: ObjectSpec,
    workload: Workload,
    distribution: KeyDistribution,
    /// How long the run lasts (`None`: until `--ops`, or every key of an
    /// insert, is done).
    duration: Option<Duration>,
    /// Each worker's pace under `--rate`.
    per_worker_interval: Option<Duration>,
}

impl Plan {
    fn of(args: &BenchArgs) -> Result<Plan, String> {
        let spec = ObjectSpec::parse(&args.object)?;
        let workload = Workload::parse(&args.workload)?;
        if args.keys == 0 {
            return Err("-k KEYS must be at least 1".into());
        }
        if args.concurrency == 0 {
            return Err("-c CONCURRENCY must be at least 1".into());
        }
        if args.batch_size == 0 {
            return Err("--batch-size must be at least 1".into());
        }
        if args.batch_size > 1 && !matches!(workload, Workload::ReadUpdate { .. }) {
            return Err("--batch-size applies to the reads of ru,READ_PCT workloads".into());
        }
        let distribution = match args.zipf {
            Some(theta) => KeyDistribution::Zipf(Zipf::new(args.keys, theta)?),
            None => KeyDistribution::Uniform { n: args.keys },
        };
        let duration = match (args.duration, args.ops) {
            (Some(d), _) if !(d > 0.0 && d.is_finite()) => {
                return Err("-d SECONDS must be positive".into())
            }
            (Some(d), _) => Some(Duration::from_secs_f64(d)),
            (None, Some(_)) => None,
            // An insert ends when every key is written; the others default to 10 s.
            (None, None) if workload == Workload::Insert => None,
            (None, None) => Some(Duration::from_secs(10)),
        };
        let per_worker_interval = match args.rate {
            Some(rate) if !(rate > 0.0 && rate.is_finite()) => {
                return Err("--rate must be a positive number of ops per second".into())
            }
            Some(rate) => Some(Duration::from_secs_f64(args.concurrency as f64 / rate)),
            None => None,
        };
        Ok(Plan {
            spec,
            workload,
            distribution,
            duration,
            per_worker_interval,
        })
    }
}

/// The client, with connections enough for `-c` commands in flight.
async fn connect(args: &BenchArgs) -> Result<Client, String> {
    let mut config = ClientConfig::new([args.host.clone()]);
    config.max_connections_per_node = args.concurrency.max(16) * 2;
    Client::connect(config)
        .await
        .map_err(|e| format!("cannot connect to {}: {e}\n  hint: start citrined (`citrined --noop` for the benchmark ceiling), or `citrine bench --noop-server PORT` for a stand-in responder", args.host))
}

/// What the workers share: the policies, and what the workload needs on
/// the server (the query's index, the udf's module) made sure of.
async fn prepare(args: &BenchArgs, plan: &Plan, client: &Client) -> Result<Shared, String> {
    let mut read_policy = ReadPolicy {
        read_mode_sc: args.read_mode,
        ..ReadPolicy::default()
    };
    read_policy.base.total_timeout = Duration::from_millis(args.timeout_ms);
    read_policy.base.max_retries = args.retries;
    if let Some(spec) = &args.filter_int_ge {
        read_policy.base.filter = Some(int_ge_filter(spec)?.into());
    }
    let write_policy = WritePolicy {
        base: read_policy.base.clone(),
        ..WritePolicy::default()
    };

    let batch_policy = BatchPolicy {
        base: read_policy.base.clone(),
        ..BatchPolicy::default()
    };
    let names = plan.spec.names();
    let query_bin = query_bin(args, plan, client, &names).await?;
    let udf_bin = udf_bin(plan, client, &names).await?;
    let mut query_policy = ScanPolicy::default();
    query_policy.base.socket_timeout = Duration::from_millis(args.timeout_ms);
    query_policy.base.max_retries = args.retries;
    Ok(Shared {
        client: client.clone(),
        spec: plan.spec.clone(),
        names,
        workload: plan.workload,
        distribution: plan.distribution.clone(),
        args_namespace: args.namespace.clone(),
        set: args.set.clone(),
        key_start: args.key_start,
        keys: args.keys,
        stop: AtomicBool::new(false),
        issued: AtomicU64::new(0),
        ops_limit: args.ops,
        next_insert: AtomicU64::new(0),
        read_policy,
        write_policy,
        batch_policy,
        batch_size: args.batch_size,
        query_policy,
        query_bin,
        query_records: AtomicU64::new(0),
        udf_args: udf_bin.into_iter().map(Value::String).collect(),
        per_worker_interval: plan.per_worker_interval,
    })
}

/// The query workload's group bin and group count, its index made sure
/// of; `None` for the other workloads.
async fn query_bin(
    args: &BenchArgs,
    plan: &Plan,
    client: &Client,
    names: &[String],
) -> Result<Option<(String, u64)>, String> {
    match (plan.workload, plan.spec.group_bin()) {
        (Workload::Query, None) => Err(
            "the query workload selects by a group bin: give -o a G:N item (e.g. -o G:10000,10*S:10) and load the keys with -w insert and the same -o".into(),
        ),
        (Workload::Query, Some((at, groups))) => {
            let bin = names[at].clone();
            ensure_index(client, &args.namespace, &args.set, &bin).await?;
            Ok(Some((bin, groups)))
        }
        _ => Ok(None),
    }
}

/// The bin the udf workloads' function takes, their module made sure of;
/// `None` for the other workloads.
async fn udf_bin(plan: &Plan, client: &Client, names: &[String]) -> Result<Option<String>, String> {
    match plan.workload {
        Workload::Udf { read_only } => {
            // udf-read returns any bin; udf adds 1 to an integer one.
            let at = plan.spec.int_bin().or(read_only.then_some(0)).ok_or(
                "the udf workload adds 1 to an integer bin: give -o an I item (the default -o I), and load the keys with -w insert and the same -o",
            )?;
            ensure_udf_module(client).await?;
            Ok(Some(names[at].clone()))
        }
        _ => Ok(None),
    }
}

/// Prints the run's header line (and, for the udf workloads, the call
/// each operation makes); returns that call as the summary names it.
fn announce(args: &BenchArgs, plan: &Plan, shared: &Shared) -> Option<String> {
    let spec = &plan.spec;
    outln!(
        "bench: {} {} against {} ns={} set={} keys={} start={} object={} ({} B) concurrency={} {}{}",
        plan.workload.label(),
        shared.distribution.label(),
        args.host,
        args.namespace,
        args.set,
        args.keys,
        args.key_start,
        spec.text,
        spec.payload_bytes(),
        args.concurrency,
        match plan.duration {
            Some(d) => format!("duration={}s", d.as_secs_f64()),
            None => String::new(),
        },
        args.ops.map(|n| format!(" ops={n}")).unwrap_or_default(),
    );
    let bin = match &shared.udf_args[..] {
        [Value::String(bin)] => Some(bin),
        _ => None,
    };
    match (plan.workload, bin) {
        (Workload::Udf { read_only }, Some(bin)) => {
            let call = format!("{UDF_MODULE}.{}", udf_function(read_only));
            outln!("bench: each operation calls {call}(rec, {bin:?}) ({UDF_FILE})");
            Some(format!("{call}({bin})"))
        }
        _ => None,
    }
}

/// The readings taken before and after the run: the server's and this
/// process's CPU time, and the client's retries.
struct Readings {
    server_cpu_us: Option<u64>,
    client_cpu_us: Option<u64>,
    retries: u64,
}

impl Readings {
    fn take(args: &BenchArgs, client: &Client) -> Result<Readings, String> {
        let server_cpu_us = match args.server_pid {
            Some(pid) => Some(process_cpu_us(pid)?),
            None => None,
        };
        Ok(Readings {
            server_cpu_us,
            retries: client.stats().retries,
            client_cpu_us: process_cpu_us(std::process::id()).ok(),
        })
    }
}

/// The running workers: their tasks and the stats each fills.
struct Workers {
    stats: Vec<Arc<Mutex<WorkerStats>>>,
    handles: Vec<tokio::task::JoinHandle<()>>,
    started: Instant,
}

impl Workers {
    /// Starts `concurrency` workers, each with a seed of its own.
    fn spawn(shared: &Arc<Shared>, concurrency: usize) -> Workers {
        let worker_stats: Vec<Arc<Mutex<WorkerStats>>> = (0..concurrency)
            .map(|_| Arc::new(Mutex::new(Default::default())))
            .collect();
        let started = Instant::now();
        let mut handles = Vec::new();
        for (index, stats) in worker_stats.iter().enumerate() {
            let shared = shared.clone();
            let stats = stats.clone();
            let seed = 0x5EED_0000
                ^ ((index as u64 + 1) * 0x9E37_79B9)
                ^ (started.elapsed().as_nanos() as u64);
            handles.push(tokio::spawn(
                async move { worker(shared, stats, seed).await },
            ));
        }
        Workers {
            stats: worker_stats,
            handles,
            started,
        }
    }

    /// The reporter: once a second, swaps each worker's stats out, merges
    /// them and prints the second's line, until the time is up or every
    /// worker is done; then stops the workers and returns the totals
    /// (with the late samples of commands in flight at the stop).
    async fn report(
        &mut self,
        args: &BenchArgs,
        shared: &Shared,
        duration: Option<Duration>,
    ) -> WorkerStats {
        let started = self.started;
        let mut totals: WorkerStats = Default::default();
        let deadline = duration.map(|d| started + d);
        let mut last = started;
        loop {
            let next_tick = last + Duration::from_secs(1);
            let wake = match deadline {
                Some(deadline) => next_tick.min(deadline),
                None => next_tick,
            };
            tokio::time::sleep_until(wake.into()).await;
            let all_done = self.handles.iter().all(|h| h.is_finished());
            let time_up = deadline.is_some_and(|d| Instant::now() >= d);
            if time_up {
                shared.stop.store(true, Ordering::Relaxed);
            }
            let mut interval: WorkerStats = Default::default();
            self.take_into(&mut interval);
            let now = Instant::now();
            let seconds = now.duration_since(last).as_secs_f64();
            last = now;
            if !args.quiet && interval.iter().any(|s| s.count() + s.errors > 0) {
                outln!(
                    "{}",
                    interval_line(started.elapsed().as_secs_f64(), &interval, seconds)
                );
            }
            merge(&mut totals, &interval);
            if time_up || all_done {
                break;
            }
        }
        shared.stop.store(true, Ordering::Relaxed);
        for handle in std::mem::take(&mut self.handles) {
            let _ = handle.await;
        }
        // Late samples of commands that were in flight at the stop.
        self.take_into(&mut totals);
        totals
    }

    /// Swaps each worker's stats out and merges them into `into`.
    fn take_into(&self, into: &mut WorkerStats) {
        for stats in &self.stats {
            let taken = match stats.lock() {
                Ok(mut guard) => std::mem::take(&mut *guard),
                Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
            };
            merge(into, &taken);
        }
    }
}

/// Adds each op type's stats in `from` to `into`'s.
fn merge(into: &mut WorkerStats, from: &WorkerStats) {
    for kind in 0..OP_KINDS {
        into[kind].merge(&from[kind]);
    }
}

/// What the run did, once it ended.
struct Ended {
    totals: WorkerStats,
    /// Seconds the run lasted.
    elapsed: f64,
    /// The client's retries during the run.
    retries: u64,
    server_cpu_us_per_op: Option<f64>,
    client_cpu_us_per_op: Option<f64>,
}

impl Ended {
    /// With the CPU time per command between the readings.
    fn with_cpu(self, before: &Readings, after: &Readings) -> Ended {
        // A failed command costs CPU too (the server answered it with an error
        // code, or worked on it past the client's timeout), so CPU is divided by
        // every command the run finished, not only the successful ones.
        let commands = self.commands();
        Ended {
            server_cpu_us_per_op: cpu_us_per_command(
                before.server_cpu_us,
                after.server_cpu_us,
                commands,
            ),
            client_cpu_us_per_op: cpu_us_per_command(
                before.client_cpu_us,
                after.client_cpu_us,
                commands,
            ),
            ..self
        }
    }

    /// Commands that succeeded.
    fn total_ops(&self) -> u64 {
        self.totals.iter().map(OpStats::count).sum()
    }

    /// Commands that failed.
    fn total_errors(&self) -> u64 {
        self.totals.iter().map(|s| s.errors).sum()
    }

    /// Every command the run finished.
    fn commands(&self) -> u64 {
        self.total_ops() + self.total_errors()
    }
}

/// Prints the percentile table, one row per op type the run issued;
/// returns each row's summary for the JSON.
fn print_op_table(
    totals: &WorkerStats,
    elapsed: f64,
) -> serde_json::Map<String, serde_json::Value> {
    outln!();
    outln!(
        "{:<8} {:>10} {:>12} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>7}",
        "op",
        "count",
        "ops/s",
        "p50",
        "p90",
        "p99",
        "p99.9",
        "p99.99",
        "max",
        "mean",
        "errors"
    );
    let mut ops_json = serde_json::Map::new();
    for (kind, stats) in totals.iter().enumerate() {
        if stats.count() + stats.errors == 0 {
            continue;
        }
        let summary = stats.summary(elapsed);
        print_op_row(OP_NAMES[kind], &summary);
        ops_json.insert(OP_NAMES[kind].to_owned(), summary.to_json());
    }
    outln!("(latencies in ms; HDR histogram, 3 significant digits)");
    ops_json
}

/// One row of the percentile table, and the lines on its errors.
fn print_op_row(name: &str, summary: &Summary) {
    outln!(
        "{:<8} {:>10} {:>12.0} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>9.3} {:>9.3} {:>7}",
        name,
        summary.count,
        summary.ops_per_sec,
        summary.p50_ms,
        summary.p90_ms,
        summary.p99_ms,
        summary.p999_ms,
        summary.p9999_ms,
        summary.max_ms,
        summary.mean_ms,
        summary.errors
    );
    if !summary.error_kinds.is_empty() {
        let kinds: Vec<String> = summary
            .error_kinds
            .iter()
            .map(|(kind, count)| format!("{kind}: {count}"))
            .collect();
        outln!("         errors by kind: {}", kinds.join(", "));
    }
    if summary.not_found > 0 || summary.conflicts > 0 || summary.timeouts > 0 {
        outln!(
            "         not found: {}  generation conflicts: {}  timeouts: {}",
            summary.not_found,
            summary.conflicts,
            summary.timeouts
        );
    }
}

/// The rates the summary carries besides the table's.
struct Rates {
    throughput: f64,
    batch_keys_per_sec: Option<f64>,
    query_records_per_sec: Option<f64>,
}

/// Prints the totals: throughput, batch keys and query records a second,
/// and CPU per operation.
fn print_totals(args: &BenchArgs, shared: &Shared, ended: &Ended) -> Rates {
    let (elapsed, retries) = (ended.elapsed, ended.retries);
    let (total_ops, total_errors) = (ended.total_ops(), ended.total_errors());
    let throughput = total_ops as f64 / elapsed;
    outln!("total: {total_ops} ops in {elapsed:.2}s = {throughput:.0} ops/s, {total_errors} errors, {retries} client retries");
    let batches = ended.totals[OpKind::Batch as usize].count();
    let batch_keys_per_sec =
        (batches > 0).then(|| (batches * args.batch_size as u64) as f64 / elapsed);
    if let Some(keys) = batch_keys_per_sec {
        outln!(
            "batch reads: {batches} batches of {} keys = {keys:.0} keys/s",
            args.batch_size
        );
    }
    let queries = ended.totals[OpKind::Query as usize].count();
    let query_records = shared.query_records.load(Ordering::Relaxed);
    let query_records_per_sec = (queries > 0).then(|| query_records as f64 / elapsed);
    if let Some(rate) = query_records_per_sec {
        outln!(
            "queries: {queries}, {query_records} records ({:.1} a query) = {rate:.0} records/s",
            query_records as f64 / queries as f64
        );
    }
    let failed_part = if total_errors > 0 {
        format!(
            ", over {} commands of which {total_errors} failed",
            ended.commands()
        )
    } else {
        String::new()
    };
    if let Some(cpu) = ended.server_cpu_us_per_op {
        outln!("server CPU: {cpu:.2} µs per operation{failed_part}");
    }
    if let Some(cpu) = ended.client_cpu_us_per_op {
        outln!("client CPU: {cpu:.2} µs per operation (this process, all threads){failed_part}");
    }
    Rates {
        throughput,
        batch_keys_per_sec,
        query_records_per_sec,
    }
}

/// The JSON summary of the run.
fn summary_json(
    args: &BenchArgs,
    plan: &Plan,
    shared: &Shared,
    ended: &Ended,
    (rates, udf_call, ops_json): (
        Rates,
        Option<String>,
        serde_json::Map<String, serde_json::Value>,
    ),
) -> serde_json::Value {
    serde_json::json!({
        "label": args.label,
        "target": args.host,
        "workload": plan.workload.label(),
        "object_spec": plan.spec.text,
        "payload_bytes": plan.spec.payload_bytes(),
        "namespace": args.namespace,
        "set": args.set,
        "keys": args.keys,
        "key_start": args.key_start,
        "distribution": shared.distribution.label(),
        "concurrency": args.concurrency,
        "rate_target": args.rate,
        "batch_size": args.batch_size,
        "batch_keys_per_sec": rates.batch_keys_per_sec.map(round3),
        "query_records_per_sec": rates.query_records_per_sec.map(round3),
        "udf": udf_call,
        "duration_s": round3(ended.elapsed),
        "total_ops": ended.total_ops(),
        "throughput_ops_s": round3(rates.throughput),
        "errors": ended.total_errors(),
        "client_retries": ended.retries,
        "server_cpu_us_per_op": ended.server_cpu_us_per_op.map(round3),
        "client_cpu_us_per_op": ended.client_cpu_us_per_op.map(round3),
        "ops": ops_json,
    })
}

fn interval_line(at: f64, interval: &WorkerStats, seconds: f64) -> String {
    let mut parts = Vec::new();
    for (kind, stats) in interval.iter().enumerate() {
        if stats.count() + stats.errors == 0 {
            continue;
        }
        let s: Summary = stats.summary(seconds);
        let mut part = format!(
            "{} {:>8.0}/s p50 {:.3} p99 {:.3} p99.9 {:.3} ms",
            OP_NAMES[kind], s.ops_per_sec, s.p50_ms, s.p99_ms, s.p999_ms
        );
        if s.errors > 0 {
            part.push_str(&format!(" err {}", s.errors));
        }
        parts.push(part);
    }
    format!("[{at:>6.1}s] {}", parts.join(" | "))
}

/// CPU time spent between two `/proc` readings (µs), per command finished
/// (successful or failed); `None` without both readings or without commands.
fn cpu_us_per_command(before: Option<u64>, after: Option<u64>, commands: u64) -> Option<f64> {
    match (before, after) {
        (Some(before), Some(after)) if commands > 0 => {
            Some(after.saturating_sub(before) as f64 / commands as f64)
        }
        _ => None,
    }
}

fn record_error(stats: &mut OpStats, error: &Error) {
    let kind = match error {
        Error::Server { code, .. } => format!("code {code}"),
        Error::Timeout { .. } => "timeout".to_owned(),
        Error::Network { .. } => "network".to_owned(),
        Error::NoNode { .. } => "no node".to_owned(),
        // The function failed (raised an error, or no such module or function).
        Error::Udf { .. } => "code 100 (udf)".to_owned(),
        other => other.to_string().chars().take(40).collect(),
    };
    stats.record_error(&kind, matches!(error, Error::Timeout { .. }));
}

async fn worker(shared: Arc<Shared>, stats: Arc<Mutex<WorkerStats>>, seed: u64) {
    let mut rng = SplitMix64::new(seed);
    let mut next_slot = Instant::now();
    loop {
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        if let Some(limit) = shared.ops_limit {
            if shared.issued.fetch_add(1, Ordering::Relaxed) >= limit {
                break;
            }
        }
        if let Some(interval) = shared.per_worker_interval {
            pace(&mut next_slot, interval).await;
        }
        let index = match shared.workload {
            Workload::Insert => {
                let index = shared.next_insert.fetch_add(1, Ordering::Relaxed);
                if index >= shared.keys {
                    break;
                }
                index
            }
            _ => shared.distribution.sample(&mut rng),
        };
        let (kind, outcome) = issue(&shared, index, &mut rng).await;
        let mut guard = match stats.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        record_outcome(&mut guard[kind as usize], outcome);
    }
}

/// Waits for the worker's next slot under `--rate` (each `interval`).
async fn pace(next_slot: &mut Instant, interval: Duration) {
    *next_slot += interval;
    let now = Instant::now();
    if *next_slot > now {
        tokio::time::sleep_until((*next_slot).into()).await;
    } else if now.duration_since(*next_slot) > interval * 10 {
        // Far behind (server slower than the target): do not burst to catch up.
        *next_slot = now;
    }
}

/// Issues one command of the workload on key number `index`: its op type,
/// and its outcome with its latency in µs.
async fn issue(
    shared: &Shared,
    index: u64,
    rng: &mut SplitMix64,
) -> (OpKind, (Result<Outcome, Error>, u64)) {
    let key = Key::new(
        shared.args_namespace.clone(),
        shared.set.clone(),
        shared.key_start.wrapping_add(index as i64),
    );
    match shared.workload {
        Workload::Insert => (
            OpKind::Write,
            timed(put(shared, &key, index, rng, &shared.write_policy)).await,
        ),
        Workload::Query => (OpKind::Query, timed(query(shared, rng)).await),
        Workload::ReadUpdate { read_pct } => {
            if rng.below(100) < u64::from(read_pct) {
                if shared.batch_size > 1 {
                    (OpKind::Batch, timed(batch_read(shared, key, rng)).await)
                } else {
                    (OpKind::Read, timed(read(shared, &key)).await)
                }
            } else {
                (
                    OpKind::Write,
                    timed(put(shared, &key, index, rng, &shared.write_policy)).await,
                )
            }
        }
        Workload::ReadModifyWrite => (OpKind::Rmw, timed(rmw(shared, &key, index, rng)).await),
        Workload::Udf { read_only } => (
            if read_only {
                OpKind::UdfRead
            } else {
                OpKind::Udf
            },
            timed(udf(shared, &key, read_only)).await,
        ),
    }
}

/// Counts one command's outcome in its op type's stats: timed when it
/// succeeded, counted by kind when it failed.
fn record_outcome(slot: &mut OpStats, outcome: (Result<Outcome, Error>, u64)) {
    match outcome {
        (Ok(Outcome::Done), us) => slot.record_us(us),
        (Ok(Outcome::NotFound), us) => {
            slot.record_us(us);
            slot.not_found += 1;
        }
        (Ok(Outcome::Conflict), us) => {
            slot.record_us(us);
            slot.conflicts += 1;
        }
        (Err(error), _) => record_error(slot, &error),
    }
}

enum Outcome {
    Done,
    NotFound,
    Conflict,
}

async fn timed<F: std::future::Future<Output = Result<Outcome, Error>>>(
    future: F,
) -> (Result<Outcome, Error>, u64) {
    let start = Instant::now();
    let result = future.await;
    (result, start.elapsed().as_micros() as u64)
}

async fn read(shared: &Shared, key: &Key) -> Result<Outcome, Error> {
    match shared
        .client
        .get(&shared.read_policy, key, Bins::All)
        .await?
    {
        Some(_) => Ok(Outcome::Done),
        None => Ok(Outcome::NotFound),
    }
}

/// Every record of one random group, through the group bin's index.
async fn query(shared: &Shared, rng: &mut SplitMix64) -> Result<Outcome, Error> {
    let Some((bin, groups)) = &shared.query_bin else {
        return Err(Error::InvalidArgument("no group bin to query".into()));
    };
    let group = rng.below(*groups) as i64;
    let statement = Statement::new(shared.args_namespace.clone(), shared.set.clone())
        .filter(IndexFilter::equal(bin.clone(), group));
    let mut stream = shared.client.query(&shared.query_policy, &statement)?;
    let mut records = 0;
    while let Some(record) = stream.next().await {
        record?;
        records += 1;
    }
    shared.query_records.fetch_add(records, Ordering::Relaxed);
    Ok(if records == 0 {
        Outcome::NotFound
    } else {
        Outcome::Done
    })
}

/// The function of the bench's module a udf workload calls.
fn udf_function(read_only: bool) -> &'static str {
    if read_only {
        "get"
    } else {
        "incr"
    }
}

/// Registers the bench's Lua module unless every node already lists it with
/// this source (registering again would only make each service thread
/// reload its modules at the start of the run).
async fn ensure_udf_module(client: &Client) -> Result<(), String> {
    let hash = udf_hash(UDF_SOURCE.as_bytes());
    let settled = client
        .wait_for_udf(UDF_FILE, Some(&hash), Duration::ZERO)
        .await
        .is_ok();
    if settled {
        return Ok(());
    }
    client
        .register_udf(UDF_FILE, UDF_SOURCE.as_bytes())
        .await
        .map_err(|error| format!("cannot register the udf workload's module {UDF_FILE}: {error}"))
}

/// One call of the bench's UDF on `key`: a nil answer (the read-only
/// function on a missing record) counts as not found.
async fn udf(shared: &Shared, key: &Key, read_only: bool) -> Result<Outcome, Error> {
    let value = shared
        .client
        .execute_udf(
            &shared.write_policy,
            key,
            UDF_MODULE,
            udf_function(read_only),
            &shared.udf_args,
        )
        .await?;
    Ok(if value == Value::Nil {
        Outcome::NotFound
    } else {
        Outcome::Done
    })
}

/// Creates the numeric index the query workload uses on `bin` (unless it
/// exists) and waits until every node has built it.
async fn ensure_index(
    client: &Client,
    namespace: &str,
    set: &str,
    bin: &str,
) -> Result<(), String> {
    let name = format!("bench_{set}_{bin}");
    match client
        .create_index(
            namespace,
            set,
            &name,
            bin,
            IndexType::Numeric,
            IndexCollection::Default,
            None,
        )
        .await
    {
        Ok(()) | Err(Error::Info { code: 200, .. }) => {}
        Err(error) => {
            return Err(format!(
                "cannot create index {name} for the query workload: {error}"
            ))
        }
    }
    client
        .wait_for_index(namespace, &name, Duration::from_secs(600))
        .await
        .map_err(|error| format!("index {name} was not built: {error}"))
}

/// A batch read of `key` and `batch_size - 1` more keys from the distribution.
async fn batch_read(shared: &Shared, key: Key, rng: &mut SplitMix64) -> Result<Outcome, Error> {
    let mut keys = Vec::with_capacity(shared.batch_size);
    keys.push(key);
    while keys.len() < shared.batch_size {
        let index = shared.distribution.sample(rng);
        keys.push(Key::new(
            shared.args_namespace.clone(),
            shared.set.clone(),
            shared.key_start.wrapping_add(index as i64),
        ));
    }
    let records = shared
        .client
        .batch_get(&shared.batch_policy, &keys, Bins::All)
        .await?;
    Ok(if records.iter().all(Option::is_some) {
        Outcome::Done
    } else {
        Outcome::NotFound
    })
}

async fn put(
    shared: &Shared,
    key: &Key,
    index: u64,
    rng: &mut SplitMix64,
    policy: &WritePolicy,
) -> Result<Outcome, Error> {
    let bins = shared.spec.generate(&shared.names, index, rng);
    shared.client.put(policy, key, &bins).await?;
    Ok(Outcome::Done)
}

async fn rmw(
    shared: &Shared,
    key: &Key,
    index: u64,
    rng: &mut SplitMix64,
) -> Result<Outcome, Error> {
    let record = shared
        .client
        .get(&shared.read_policy, key, Bins::All)
        .await?;
    let mut policy = shared.write_policy.clone();
    match record {
        Some(record) => policy.generation = GenerationPolicy::ExpectEqual(record.generation),
        None => policy.record_exists = RecordExistsAction::CreateOnly,
    }
    match put(shared, key, index, rng, &policy).await {
        Ok(outcome) => Ok(outcome),
        // Lost the race with another writer: generation mismatch (3) or created meanwhile (5).
        Err(error) if matches!(error.raw_code(), Some(3) | Some(5)) => Ok(Outcome::Conflict),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_parsing() {
        let line = "1234 (citrined worker) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 100 1000 10 18446744073709551615";
        assert_eq!(parse_stat_cpu_ticks(line), Some(300));
        assert_eq!(parse_stat_cpu_ticks("garbage"), None);
        assert_eq!(parse_stat_cpu_ticks("1 (x) S 1 2"), None);
    }

    #[test]
    fn cpu_is_divided_by_every_finished_command() {
        // 3 ms of CPU over 1000 successes and 500 failures: 2 µs a command.
        assert_eq!(
            cpu_us_per_command(Some(7_000), Some(10_000), 1_500),
            Some(2.0)
        );
        assert_eq!(cpu_us_per_command(Some(7_000), Some(10_000), 0), None);
        assert_eq!(cpu_us_per_command(None, Some(10_000), 10), None);
        assert_eq!(cpu_us_per_command(Some(7_000), None, 10), None);
        // A counter that went backwards (another process behind the PID) is
        // not a negative cost.
        assert_eq!(cpu_us_per_command(Some(10_000), Some(7_000), 10), Some(0.0));
    }

    /// A record with one integer bin "bin" (8 bytes big-endian), for
    /// evaluating the filter.
    struct OneBin([u8; 8]);

    fn one_bin(value: i64) -> OneBin {
        OneBin(value.to_be_bytes())
    }

    impl citrine_exp::Record for OneBin {
        fn bin(&self, name: &[u8]) -> Option<(u8, &[u8])> {
            (name == b"bin").then_some((1, &self.0[..]))
        }
        fn key(&self) -> Option<(u8, &[u8])> {
            None
        }
        fn digest(&self) -> &[u8; 20] {
            &[0; 20]
        }
        fn set_name(&self) -> &[u8] {
            b""
        }
        fn last_update_ms(&self) -> u64 {
            0
        }
        fn void_time_s(&self) -> Option<u64> {
            None
        }
        fn record_size(&self) -> u64 {
            0
        }
        fn is_tombstone(&self) -> bool {
            false
        }
        fn exists(&self) -> bool {
            true
        }
    }

    #[test]
    fn the_int_ge_filter_is_an_expression_the_server_evaluates() {
        use citrine_exp::{Expression, Truth};
        let filter = Expression::parse(&int_ge_filter("bin:-5").expect("valid")).expect("parses");
        assert_eq!(filter.filter(&one_bin(-5), 0), Truth::True);
        assert_eq!(filter.filter(&one_bin(7), 0), Truth::True);
        assert_eq!(filter.filter(&one_bin(-6), 0), Truth::False);
        let other = Expression::parse(&int_ge_filter("other:0").expect("valid")).expect("parses");
        assert_eq!(other.filter(&one_bin(1), 0), Truth::Unknown);
        assert!(int_ge_filter("bin").is_err());
        assert!(int_ge_filter("bin:x").is_err());
        assert!(int_ge_filter(":1").is_err());
        assert!(int_ge_filter("a-very-long-bin-name:1").is_err());
    }

    #[test]
    fn the_bench_module_names_its_functions() {
        for read_only in [false, true] {
            let function = udf_function(read_only);
            assert!(
                UDF_SOURCE.contains(&format!("function {function}(rec, bin)")),
                "{function}"
            );
        }
        assert_eq!(UDF_FILE, format!("{UDF_MODULE}.lua"));
    }

    #[test]
    fn own_process_cpu_is_readable() {
        let pid = std::process::id();
        assert!(process_cpu_us(pid).is_ok());
        assert!(process_cpu_us(u32::MAX).is_err());
    }
}
