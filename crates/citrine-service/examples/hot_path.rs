//! Microbenchmark of the single-record hot path without the network: reads
//! and updates of one integer bin (what the Go benchmark tool's `-o I`
//! sends) run through [`Service::handle`] on random keys of an in-memory
//! namespace, by one thread and then by several at once.
//!
//!   cargo run --release -p citrine-service --example hot_path -- \
//!       [--keys N] [--threads 1,2] [--secs S] [--rounds R] [--workload update|read|ru50]
//!
//! What it answers: what a request costs the server's own code (no
//! sockets, no io_uring), and whether that cost grows when several
//! service threads run requests at the same time. The baseline in the same
//! run is one thread: with T threads on T free cores, each thread's
//! nanoseconds per request should stay where one thread's are; what they
//! rise by is what the threads pay for sharing (cache lines that every
//! request writes, locks every request takes). Thread counts alternate
//! for `--rounds` rounds so the machine's drift hits each alike; the
//! table gives the median and range per count.
//!
//! `--turn N`: requests are handed over as citrined's service threads
//! hand them, with the time their turn began ([`citrine_service::Arrival`]),
//! one clock read per N requests, instead of through `Service::handle`
//! (which reads the clock for each request's latency itself).
//!
//! `--benchmarks off,on`: each phase runs with the namespace's
//! `enable-benchmarks-read` and `-write` groups off, then on (the order
//! alternating by round), so the detail histograms' cost is measured in
//! one run; the table then has a row per thread count and setting
//! (`--benchmarks on`: on only, for callgrind).
//!
//! Under `valgrind --tool=callgrind` (use `--secs 0 --ops N`), the phases
//! are separate functions (`run_phase`), so instructions per request can
//! be read off exactly: see `scripts/hot-path.sh`.

use citrine_service::config::{NamespaceConfig, ServiceConfig};
use citrine_service::{Service, SystemClock};
use citrine_wire::digest::{of_key, UserKey};
use citrine_wire::frame::{ProtoHeader, PROTO_HEADER_SIZE};
use citrine_wire::msg::{field_type, info1, info2, op_type, MessageWriter, MsgHeader};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// The particle type of a 64-bit integer.
const PARTICLE_INTEGER: u8 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Workload {
    Read,
    Update,
    /// Half reads, half updates, chosen per request.
    Mixed,
}

struct Args {
    keys: u64,
    threads: Vec<usize>,
    secs: f64,
    ops: u64,
    rounds: usize,
    workload: Workload,
    /// Requests per turn handed over with their turn's start; 0: through
    /// `Service::handle`.
    turn: u64,
    /// The benchmark groups' settings each phase runs with (empty: off,
    /// not reported).
    benchmarks: Vec<bool>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        keys: 1_000_000,
        threads: vec![1, 2],
        secs: 3.0,
        ops: 0,
        rounds: 3,
        workload: Workload::Update,
        turn: 0,
        benchmarks: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--keys" => args.keys = value()?.parse().map_err(|e| format!("--keys: {e}"))?,
            "--secs" => args.secs = value()?.parse().map_err(|e| format!("--secs: {e}"))?,
            "--ops" => args.ops = value()?.parse().map_err(|e| format!("--ops: {e}"))?,
            "--rounds" => args.rounds = value()?.parse().map_err(|e| format!("--rounds: {e}"))?,
            "--benchmarks" => {
                args.benchmarks = value()?
                    .split(',')
                    .map(|setting| match setting.trim() {
                        "on" => Ok(true),
                        "off" => Ok(false),
                        other => Err(format!("--benchmarks: on or off, not {other}")),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--turn" => args.turn = value()?.parse().map_err(|e| format!("--turn: {e}"))?,
            "--threads" => {
                args.threads = value()?
                    .split(',')
                    .map(|n| n.trim().parse::<usize>())
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("--threads: {e}"))?
            }
            "--workload" => {
                args.workload = match value()?.as_str() {
                    "read" => Workload::Read,
                    "update" => Workload::Update,
                    "ru50" => Workload::Mixed,
                    other => return Err(format!("--workload: read, update or ru50, not {other}")),
                }
            }
            "--help" | "-h" => {
                return Err(
                    "usage: hot_path [--keys N] [--threads 1,2] [--secs S] [--ops N] \
                            [--rounds R] [--workload update|read|ru50] [--turn N] [--benchmarks off,on]"
                        .into(),
                )
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if args.keys == 0 || args.threads.is_empty() || args.threads.contains(&0) {
        return Err("--keys and every --threads count must be at least 1".into());
    }
    if args.secs <= 0.0 && args.ops == 0 {
        return Err("give --secs or --ops".into());
    }
    Ok(args)
}

/// A request frame for `key`'s digest, and where the digest sits in it (so
/// one frame serves every key: the benchmark patches the 20 bytes).
fn template(header: MsgHeader, write: bool) -> (Vec<u8>, usize) {
    let marker = [0xA5u8; 20];
    let mut frame = Vec::new();
    let mut writer = MessageWriter::begin(&mut frame, &header);
    writer
        .field(field_type::NAMESPACE, b"test")
        .field(field_type::SET, b"testset")
        .field(field_type::DIGEST, &marker);
    if write {
        writer.op(
            op_type::WRITE,
            PARTICLE_INTEGER,
            b"bin",
            &7i64.to_be_bytes(),
        );
    } else {
        writer.op(op_type::READ, 0, b"bin", &[]);
    }
    writer.finish();
    let at = frame
        .windows(marker.len())
        .position(|window| window == marker)
        .expect("the digest is in the frame");
    (frame, at)
}

struct Frames {
    read: (Vec<u8>, usize),
    update: (Vec<u8>, usize),
}

fn frames() -> Frames {
    Frames {
        read: template(
            MsgHeader {
                info1: info1::READ,
                ..MsgHeader::default()
            },
            false,
        ),
        update: template(
            MsgHeader {
                info2: info2::WRITE,
                ..MsgHeader::default()
            },
            true,
        ),
    }
}

/// Runs `frame` with `digest` patched in (received at `received`, when
/// given: as a service thread hands it over); panics unless it succeeded.
#[inline]
fn run_one(
    service: &Service,
    frame: &mut [u8],
    at: usize,
    digest: &[u8; 20],
    out: &mut Vec<u8>,
    received: Option<Instant>,
) {
    frame[at..at + 20].copy_from_slice(digest);
    let header_bytes: [u8; PROTO_HEADER_SIZE] = frame[..PROTO_HEADER_SIZE]
        .try_into()
        .expect("a proto header");
    let header = ProtoHeader::decode(&header_bytes).expect("a valid proto header");
    out.clear();
    let body = &frame[PROTO_HEADER_SIZE..];
    match received {
        None => service.handle(header, body, out),
        Some(received) => {
            let arrival = citrine_service::Arrival {
                received: Some(received),
                ..citrine_service::Arrival::default()
            };
            let rest = service.handle_streaming_from(header, body, out, arrival);
            rest.map(|rest| assert!(rest.is_none(), "a single-record request is one reply"))
        }
    }
    .expect("the request is handled");
    // Byte 5 of the AS_MSG header, after the proto header: the result code.
    assert_eq!(out[PROTO_HEADER_SIZE + 5], 0, "the request succeeds");
}

/// xorshift64*: a cheap, repeatable key choice per thread.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// One thread's share of a phase: requests until `stop` (or `ops` of
/// them); returns the count and the wall time it ran.
#[inline(never)]
fn run_phase(
    service: &Service,
    digests: &[[u8; 20]],
    workload: Workload,
    seed: u64,
    ops: u64,
    stop: &AtomicBool,
    turn: u64,
) -> (u64, Duration) {
    let mut frames = frames();
    let mut out = Vec::with_capacity(1024);
    let mut rng = Rng(seed | 1);
    let started = Instant::now();
    let mut turn_began = started;
    let mut done = 0u64;
    loop {
        if turn != 0 && done.is_multiple_of(turn) {
            turn_began = Instant::now();
        }
        // Check the clock-driven stop only every 256 requests.
        if done.is_multiple_of(256) && stop.load(Ordering::Relaxed) {
            break;
        }
        if ops != 0 && done == ops {
            break;
        }
        let pick = rng.next();
        let digest = &digests[(pick % digests.len() as u64) as usize];
        let read = match workload {
            Workload::Read => true,
            Workload::Update => false,
            Workload::Mixed => pick >> 63 == 0,
        };
        let (frame, at) = if read {
            &mut frames.read
        } else {
            &mut frames.update
        };
        let received = (turn != 0).then_some(turn_began);
        run_one(service, frame, *at, digest, &mut out, received);
        done += 1;
    }
    (done, started.elapsed())
}

/// Runs `threads` threads at once for the phase; returns total requests a
/// second and the mean nanoseconds per request per thread.
fn phase(
    service: &Arc<Service>,
    digests: &Arc<Vec<[u8; 20]>>,
    args: &Args,
    threads: usize,
    round: usize,
) -> (f64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (service, digests, stop, start) = (
                service.clone(),
                digests.clone(),
                stop.clone(),
                start.clone(),
            );
            let (workload, ops, turn) = (args.workload, args.ops, args.turn);
            let seed = 0x9E37_79B9_7F4A_7C15u64
                .wrapping_mul((round * 64 + t + 1) as u64)
                .rotate_left(17);
            std::thread::spawn(move || {
                start.wait();
                run_phase(&service, &digests, workload, seed, ops, &stop, turn)
            })
        })
        .collect();
    start.wait();
    if args.ops == 0 {
        std::thread::sleep(Duration::from_secs_f64(args.secs));
        stop.store(true, Ordering::Relaxed);
    }
    let mut total = 0u64;
    let mut longest = Duration::ZERO;
    let mut ns_per_op = 0.0;
    for handle in handles {
        let (done, took) = handle.join().expect("a benchmark thread");
        total += done;
        longest = longest.max(took);
        ns_per_op += took.as_nanos() as f64 / done.max(1) as f64;
    }
    (
        total as f64 / longest.as_secs_f64(),
        ns_per_op / threads as f64,
    )
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("hot_path: {message}");
            std::process::exit(2);
        }
    };
    let config = ServiceConfig::local(1, vec![NamespaceConfig::in_memory("test")]);
    let service = Arc::new(Service::new(config, Arc::new(SystemClock)));
    let digests: Arc<Vec<[u8; 20]>> = Arc::new(
        (0..args.keys)
            .map(|key| of_key("testset", &UserKey::Integer(key as i64)).0)
            .collect(),
    );
    // Load every key once (an update of a missing record creates it).
    let loaded = Instant::now();
    {
        let mut frames = frames();
        let mut out = Vec::with_capacity(1024);
        let (frame, at) = &mut frames.update;
        for digest in digests.iter() {
            run_one(&service, frame, *at, digest, &mut out, None);
        }
    }
    println!(
        "loaded {} keys in {:.1} s; workload {:?}, {} per phase, threads {:?}, {} rounds",
        args.keys,
        loaded.elapsed().as_secs_f64(),
        args.workload,
        if args.ops == 0 {
            format!("{} s", args.secs)
        } else {
            format!("{} requests per thread", args.ops)
        },
        args.threads,
        args.rounds
    );
    // Each (thread count, benchmark setting) pair's results.
    let reported = !args.benchmarks.is_empty();
    let settings: Vec<bool> = if reported {
        args.benchmarks.clone()
    } else {
        vec![false]
    };
    let runs: Vec<(usize, bool)> = (0..args.threads.len())
        .flat_map(|i| settings.iter().map(move |&on| (i, on)))
        .collect();
    let mut results: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); runs.len()];
    for round in 0..args.rounds {
        // Alternate the order of the runs from round to round.
        let order: Vec<usize> = if round % 2 == 0 {
            (0..runs.len()).collect()
        } else {
            (0..runs.len()).rev().collect()
        };
        for run in order {
            let (i, on) = runs[run];
            set_benchmarks(&service, on);
            let threads = args.threads[i];
            let (rate, ns) = phase(&service, &digests, &args, threads, round);
            let setting = if reported {
                if on {
                    " benchmarks on "
                } else {
                    " benchmarks off"
                }
            } else {
                ""
            };
            println!(
                "round {round} threads {threads}{setting}: {rate:>12.0} requests/s, {ns:>7.1} ns per request per thread"
            );
            results[run].0.push(rate);
            results[run].1.push(ns);
        }
    }
    println!("\nthreads  benchmarks  requests/s (median)  ns/request/thread (median [range])  vs 1 thread, off");
    let base = runs
        .iter()
        .position(|&(i, on)| args.threads[i] == 1 && !on)
        .map(|run| median(&mut results[run].1.clone()));
    for (run, &(i, on)) in runs.iter().enumerate() {
        let (rates, ns) = &mut results[run];
        let (low, high) = ns
            .iter()
            .fold((f64::MAX, f64::MIN), |(l, h), &v| (l.min(v), h.max(v)));
        let ns_median = median(ns);
        let versus = base.map_or(String::from("-"), |b| {
            format!("{:+.1} %", (ns_median / b - 1.0) * 100.0)
        });
        println!(
            "{:>7}  {:>10}  {:>20.0}  {ns_median:>12.1} [{low:.1}-{high:.1}]  {versus:>16}",
            args.threads[i],
            if on { "on" } else { "off" },
            median(rates)
        );
    }
}

/// Turns namespace `test`'s `enable-benchmarks-read` and `-write` on or
/// off, as an operator would (`set-config`).
fn set_benchmarks(service: &Service, on: bool) {
    for group in ["read", "write"] {
        let command =
            format!("set-config:context=namespace;id=test;enable-benchmarks-{group}={on}\n");
        let mut out = Vec::new();
        citrine_service::info::handle(service, command.as_bytes(), &mut out);
        assert!(
            out.ends_with(b"\tok\n"),
            "{}",
            String::from_utf8_lossy(&out)
        );
    }
}
