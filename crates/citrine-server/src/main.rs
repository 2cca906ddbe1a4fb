//! `citrined`: the Citrine server.
//!
//! Owns the process: parses flags and the config file, sets up logging,
//! builds the [`citrine_service::Service`], runs the client listener
//! ([`net`]: one event loop per core), the cluster runtime ([`cluster`]:
//! heartbeat and fabric channels driving the sans-I/O cluster state
//! machine), the namespace supervisor (expiry and eviction) and the device
//! engines' flusher and defragmenter threads.
//!
//! Threads: the listener's small runtime (`citrine-listener`: acceptor,
//! signals, the timers of fabric work), the service threads
//! (`citrine-service-N`, [`net`]), `citrine-cluster` (heartbeats, Paxos,
//! view publication) and `citrine-fabric` (serving fabric calls)
//! ([`cluster`]), `citrine-migrate` ([`migrate`]), `citrine-nsup`,
//! `citrine-sindex` (index builds and definition pushes,
//! `Service::run_sindex_builds`), `citrine-jobs` (background scans and
//! queries, `Service::run_background_jobs`) and `citrine-txn` (the roll of
//! expired transactions, `Service::run_txn_recovery`) — each of these three entering a
//! one-worker tokio runtime for the timers of the fabric calls it waits on
//! —, `citrine-truncate` (removing what a peer's truncation covers),
//! `citrine-xdr` ([`xdr`]: shipping to other clusters, one
//! current-thread runtime), `citrine-ticker` (ends the latency histograms' intervals every
//! `ticker-interval`), `citrine-http` ([`http`], when `[http] port` is
//! set) and each device namespace's `citrine-flush-NS` and
//! `citrine-defrag-NS`.
//! [`event_loop`] starts the single-event-loop threads. The only other
//! threads are the service's own `citrine-agg-*` (an aggregation part run
//! off the fabric's serving thread) and the device engine's scoped
//! cold-start scan.

mod audit;
mod cluster;
mod cluster_tls;
mod config;
mod console;
mod console_auth;
mod event_loop;
mod http;
mod ldap_config;
mod migrate;
mod net;
mod network_info;
mod tls_config;
mod xdr;

use citrine_service::{Service, SystemClock};
use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Citrine server: an Aerospike-compatible real-time database node.
///
/// With no arguments it serves the Aerospike protocol on 127.0.0.1:3000 with
/// in-memory namespaces `test` and `bar`.
#[derive(Parser, Debug)]
#[command(name = "citrined", version, about, long_about = None, disable_help_flag = false)]
struct Args {
    /// TOML configuration file (see examples/).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Service (client) port. Overrides service.port.
    #[arg(long, value_name = "PORT")]
    port: Option<u16>,
    /// Address to listen on. Overrides service.address.
    #[arg(long, value_name = "IP")]
    address: Option<String>,
    /// Work directory for the node's files. Overrides service.work-directory.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Node id, hexadecimal. Overrides service.node-id.
    #[arg(long, value_name = "HEX")]
    node_id: Option<String>,
    /// Cluster name. Overrides service.cluster-name.
    #[arg(long, value_name = "NAME")]
    cluster_name: Option<String>,
    /// Log level: error, warn, info, debug or trace. Overrides logging.level.
    #[arg(long, value_name = "LEVEL")]
    log_level: Option<String>,
    /// Heartbeat port (default: service port + 2; none with heartbeat.tls-port). Overrides heartbeat.port.
    #[arg(long, value_name = "PORT")]
    heartbeat_port: Option<u16>,
    /// Fabric port (default: service port + 1; none with fabric.tls-port). Overrides fabric.port.
    #[arg(long, value_name = "PORT")]
    fabric_port: Option<u16>,
    /// Another node's heartbeat address to join; repeatable. Adds to heartbeat.seeds (to
    /// heartbeat.tls-mesh-seed-address-port with heartbeat.tls-port).
    #[arg(long = "seed", value_name = "HOST:PORT")]
    seeds: Vec<String>,
    /// This node's rack. Overrides service.rack-id.
    #[arg(long, value_name = "ID")]
    rack_id: Option<u32>,
    /// Socket I/O of the service threads: auto, io_uring or epoll.
    /// Overrides service.service-io.
    #[arg(long, value_name = "KIND")]
    service_io: Option<String>,
    /// TLS service port, beside the plain one. Overrides service.tls-port
    /// (the certificate comes from the `[[tls]]` named by service.tls-name).
    #[arg(long, value_name = "PORT")]
    tls_port: Option<u16>,
    /// Benchmark ceiling: answer every data request with success and store
    /// nothing (reads return no bins). Info commands work as usual. For
    /// measuring the client and network path; never for real data.
    #[arg(long)]
    noop: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let noop = args.noop;
    let server_config = match resolve_config(args) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("citrined: configuration error: {error}");
            return ExitCode::from(2);
        }
    };
    init_logging(&server_config.log_level);
    match serve(&server_config, noop) {
        Ok(()) => {
            tracing::info!("citrined stopped");
            ExitCode::SUCCESS
        }
        Err(failure) => {
            eprintln!("citrined: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

/// Why the server did not start or serve: what it prints after
/// `citrined: ` and its exit code (2 for the configuration, the files and
/// the ports, 1 for a thread that could not start or a listener that
/// failed).
struct Failure {
    message: String,
    code: u8,
}

impl Failure {
    fn new(message: impl Into<String>, code: u8) -> Failure {
        Failure {
            message: message.into(),
            code,
        }
    }
}

/// The configuration: the file given (or the embedded default) with the
/// flags over it.
fn resolve_config(args: Args) -> Result<config::ServerConfig, config::ConfigError> {
    let overrides = config::Overrides {
        address: args.address,
        port: args.port,
        data_dir: args.data_dir,
        node_id: args.node_id,
        cluster_name: args.cluster_name,
        log_level: args.log_level,
        heartbeat_port: args.heartbeat_port,
        fabric_port: args.fabric_port,
        seeds: args.seeds,
        rack_id: args.rack_id,
        service_io: args.service_io,
        tls_port: args.tls_port,
    };
    match &args.config {
        Some(path) => config::read_file(path)
            .and_then(|file| config::resolve(file, &path.display().to_string(), &overrides)),
        None => config::resolve(config::embedded_default(), "embedded default", &overrides),
    }
}

/// Logs to stderr at `level` (`RUST_LOG` wins when set), in colour on a
/// terminal.
fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// Runs the node: opens the namespaces, starts the work, storage, cluster
/// and migration threads, serves clients until a stop signal, then stops
/// every thread and shuts the storage down cleanly.
fn serve(config: &config::ServerConfig, noop: bool) -> Result<(), Failure> {
    if let Some(directory) = &config.work_directory {
        std::fs::create_dir_all(directory).map_err(|error| {
            Failure::new(format!("cannot create the work directory {} (--data-dir or service.work-directory): {error}", directory.display()), 2)
        })?;
    }
    let service = open_service(config, noop)?;
    let stopping = Arc::new(AtomicBool::new(false));
    start_monitoring(&service, &config.monitoring, &stopping)
        .map_err(|error| Failure::new(error, 2))?;
    let work_threads = start_work_threads(&service, &stopping)?;
    if let Some(directory) = &config.work_directory {
        keep_definitions(&service, directory).map_err(|error| Failure::new(error, 2))?;
    }
    let storage_threads = spawn_device_threads(&service, &stopping);
    let cluster_thread = cluster::start(service.clone(), config, stopping.clone())
        .map_err(|error| Failure::new(error, 2))?;
    set_migration_limits(&service, &config.cluster);
    // Not joined at shutdown: it only reads records and waits on the fabric.
    migrate::start(service.clone(), stopping.clone()).map_err(|error| Failure::new(error, 2))?;
    let xdr_thread = start_xdr(&service, config, &stopping)?;

    let result = net::run(service.clone(), config.clone());
    stopping.store(true, Ordering::Relaxed);
    for thread in work_threads {
        let _ = thread.join();
    }
    let _ = cluster_thread.join();
    let _ = xdr_thread.join();
    for thread in storage_threads {
        let _ = thread.join();
    }
    shut_down_storage(&service);
    result.map_err(|error| Failure::new(error, 1))
}

/// XDR: the DCs of `[xdr]`, the info commands, the `citrine-xdr` thread.
fn start_xdr(
    service: &Arc<Service>,
    config: &config::ServerConfig,
    stopping: &Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<()>, Failure> {
    let xdr = xdr::Xdr::new(service.clone(), config.work_directory.clone(), &config.xdr);
    service.set_xdr(xdr.clone());
    xdr::run::start(xdr, stopping.clone())
        .map_err(|error| Failure::new(format!("cannot start the xdr thread: {error}"), 1))
}

/// Opens the namespaces (device namespaces rebuild their index here: fast
/// or cold start) and sets the service up to be shared by the threads.
fn open_service(config: &config::ServerConfig, noop: bool) -> Result<Arc<Service>, Failure> {
    let service = Service::open(config.service.clone(), Arc::new(SystemClock))
        .map(Arc::new)
        .map_err(|error| Failure::new(format!("cannot open the namespaces: {error}"), 2))?;
    service.set_shared();
    service.set_network_config(network_info::pairs(config));
    // Long work the distribution layer hands over (the removal of what a
    // peer's truncation covers, which arrives on the fabric's serving
    // path) runs on a thread of its own.
    service
        .dist()
        .set_background_runner(Box::new(run_on_a_thread_of_its_own));
    if let Some(security) = &config.security {
        service.enable_security(security.clone());
        tracing::info!("security on: clients must log in (default user admin)");
        if let Some(audit) = &config.audit {
            let sink = audit::start(audit).map_err(|error| Failure::new(error, 2))?;
            service.set_audit(audit.settings.clone(), Box::new(sink));
        }
        if let Some(ldap) = &config.ldap {
            service
                .enable_ldap(ldap.clone())
                .map_err(|error| Failure::new(format!("security.ldap: {error}"), 2))?;
            tracing::info!("LDAP logins on: {}", ldap.server);
        }
    }
    if noop {
        service.set_noop();
        tracing::warn!("--noop: every data request is answered with success and nothing is stored (benchmark ceiling; never for real data)");
    }
    Ok(service)
}

/// Starts the namespace supervisor, then the background-job and
/// secondary-index threads; all run until `stopping`.
fn start_work_threads(
    service: &Arc<Service>,
    stopping: &Arc<AtomicBool>,
) -> Result<Vec<std::thread::JoinHandle<()>>, Failure> {
    let supervisor = spawn_nsup(service.clone(), stopping.clone())
        .map_err(|error| Failure::new(format!("cannot start the nsup thread: {error}"), 1))?;
    let mut threads = vec![supervisor];
    for (name, work) in [
        (
            "citrine-jobs",
            Service::run_background_jobs as fn(&Service, &AtomicBool),
        ),
        ("citrine-sindex", Service::run_sindex_builds),
        ("citrine-txn", Service::run_txn_recovery),
    ] {
        let thread = spawn_named(name, service.clone(), stopping.clone(), work)
            .map_err(|error| Failure::new(format!("cannot start the {name} thread: {error}"), 1))?;
        threads.push(thread);
    }
    Ok(threads)
}

/// What the node keeps in its work directory: secondary-index
/// definitions (restored, and rebuilt from the records just loaded), UDF
/// modules, truncations, strong-consistency rosters and partition versions,
/// and the regime of its partition copies, each kept up to date from now on.
fn keep_definitions(service: &Service, directory: &std::path::Path) -> Result<(), String> {
    service.keep_sindex_definitions(directory)?;
    service.keep_udf_modules(directory)?;
    service.keep_security(directory)?;
    service.dist().keep_truncations(directory)?;
    service.dist().keep_rosters(directory)?;
    service.dist().keep_sc_versions(directory)?;
    service.dist().keep_partition_lineage(directory)
}

/// The migration throttles the configuration sets (`set-config` changes
/// them at run time).
fn set_migration_limits(service: &Service, cluster: &config::ClusterSettings) {
    let migrations = service.migrations();
    migrations
        .max_partitions
        .store(cluster.migrate_max_partitions, Ordering::Relaxed);
    migrations
        .sleep_us
        .store(cluster.migrate_sleep_us, Ordering::Relaxed);
    migrations
        .max_records_per_sec
        .store(cluster.migrate_max_records_per_sec, Ordering::Relaxed);
}

/// Clean shutdown: no transaction runs any more; close device namespaces
/// to writes, write every buffer out and save their indexes for a fast
/// restart. Only when all of that succeeded is the work directory marked
/// clean for strong consistency (the next start keeps the copies then).
fn shut_down_storage(service: &Service) {
    let mut clean = true;
    for namespace in service.namespaces() {
        if let Err(error) = citrine_service::device::shutdown(namespace, service.clock()) {
            clean = false;
            tracing::error!(namespace = %namespace.config.name, "clean shutdown of the storage failed (the next start will be a cold start): {error}");
        }
    }
    if clean {
        if let Err(error) = service.dist().mark_clean_shutdown() {
            tracing::error!("{error}: the next start takes this shutdown for a crash");
        }
    }
}

/// Starts, per device namespace, the flusher (writes buffered records out
/// every `flush-max-ms`, frees emptied blocks, collects tombstones), the
/// defragmenter (paced by the engine by the number of free blocks) and the
/// checkpointer (an index checkpoint when one is due, checked every second).
fn spawn_device_threads(
    service: &Arc<Service>,
    stopping: &Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<()>> {
    let mut threads = Vec::new();
    for (index, namespace) in service.namespaces().enumerate() {
        let Some(period) = citrine_service::device::flush_period(namespace) else {
            continue;
        };
        let name = namespace.config.name.clone();
        let (flusher_service, flusher_stopping) = (service.clone(), stopping.clone());
        let flusher = std::thread::Builder::new().name(format!("citrine-flush-{name}")).spawn(move || {
            let Some(namespace) = flusher_service.namespaces().nth(index) else { return };
            let mut last_collect = std::time::Instant::now();
            while !flusher_stopping.load(Ordering::Relaxed) {
                let tick = std::time::Instant::now();
                while tick.elapsed() < period && !flusher_stopping.load(Ordering::Relaxed) {
                    std::thread::sleep(period.saturating_sub(tick.elapsed()).min(std::time::Duration::from_millis(20)));
                }
                citrine_service::device::flush_tick(namespace);
                if last_collect.elapsed() >= std::time::Duration::from_secs(5) {
                    last_collect = std::time::Instant::now();
                    let dropped = citrine_service::device::collect_tombstones(namespace);
                    if dropped > 0 {
                        tracing::debug!(namespace = %namespace.config.name, dropped, "tombstones collected");
                    }
                }
            }
        });
        let (defrag_service, defrag_stopping) = (service.clone(), stopping.clone());
        let defragger = std::thread::Builder::new()
            .name(format!("citrine-defrag-{name}"))
            .spawn(move || {
                let Some(namespace) = defrag_service.namespaces().nth(index) else {
                    return;
                };
                while !defrag_stopping.load(Ordering::Relaxed) {
                    match citrine_service::device::defrag_step(namespace) {
                        Some(pause) if !pause.is_zero() => std::thread::sleep(pause),
                        Some(_) => {}
                        None => return,
                    }
                }
            });
        let (checkpoint_service, checkpoint_stopping) = (service.clone(), stopping.clone());
        let checkpointer = std::thread::Builder::new()
            .name(format!("citrine-ckpt-{name}"))
            .spawn(move || {
                let Some(namespace) = checkpoint_service.namespaces().nth(index) else {
                    return;
                };
                while !checkpoint_stopping.load(Ordering::Relaxed) {
                    citrine_service::device::checkpoint_tick(namespace, checkpoint_service.clock());
                    for _ in 0..50 {
                        if checkpoint_stopping.load(Ordering::Relaxed) {
                            break;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                }
            });
        for thread in [flusher, defragger, checkpointer] {
            match thread {
                Ok(handle) => threads.push(handle),
                Err(error) => {
                    tracing::error!(namespace = %name, "cannot start a storage thread: {error}")
                }
            }
        }
    }
    threads
}

/// Fixes the latency histograms' unit, starts `citrine-ticker` (ends
/// their interval every `ticker-interval`) and, when `[http] port` is set,
/// the HTTP endpoint ([`http`]). Neither thread is joined: they only read
/// statistics.
fn start_monitoring(
    service: &Arc<Service>,
    monitoring: &config::Monitoring,
    stopping: &Arc<AtomicBool>,
) -> Result<(), String> {
    if monitoring.microsecond_histograms {
        service
            .latencies()
            .set_unit(citrine_service::latency::Unit::Microseconds);
    }
    let interval = std::time::Duration::from_secs(u64::from(monitoring.ticker_interval_s));
    let (ticker_service, ticker_stopping) = (service.clone(), stopping.clone());
    std::thread::Builder::new()
        .name("citrine-ticker".into())
        .spawn(move || {
            let mut last = std::time::Instant::now();
            ticker_service.latencies().tick(last);
            while !ticker_stopping.load(Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_millis(100));
                if last.elapsed() >= interval {
                    last = std::time::Instant::now();
                    ticker_service.latencies().tick(last);
                    let latencies = ticker_service.latencies();
                    for line in latencies.benchmarks().dump(latencies.unit()) {
                        tracing::info!("{line}");
                    }
                }
            }
        })
        .map_err(|error| format!("cannot start the citrine-ticker thread: {error}"))?;
    match &monitoring.http {
        Some((address, port)) => http::start(service.clone(), address, *port),
        None => Ok(()),
    }
}

/// Starts one of the service's work threads: `citrine-sindex` builds new
/// secondary indexes from the records already stored and pushes their
/// definitions to the other members (`Service::run_sindex_builds`),
/// `citrine-jobs` runs background scans and queries
/// (`Service::run_background_jobs`); each runs until `stopping`.
///
/// Their work waits on fabric calls (pushes, replica writes) with the
/// service's blocking `block_on`: the calls' timers need a tokio runtime
/// driven by another thread, so each work thread enters a one-worker
/// runtime of its own.
fn spawn_named(
    name: &str,
    service: Arc<Service>,
    stopping: Arc<AtomicBool>,
    work: fn(&Service, &AtomicBool),
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(format!("{name}-timers"))
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let _context = runtime.enter();
            work(&service, &stopping);
        })
}

/// Runs each namespace's nsup pass every `nsup-period` seconds.
fn spawn_nsup(
    service: Arc<Service>,
    stopping: Arc<AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("citrine-nsup".into())
        .spawn(move || {
            let mut last_pass: Vec<u64> = service.namespaces().map(|_| 0).collect();
            while !stopping.load(Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_millis(200));
                let now = service.now();
                for (index, namespace) in service.namespaces().enumerate() {
                    let period_ms = u64::from(namespace.config.nsup_period) * 1000;
                    if period_ms == 0 || now.unix_ms.saturating_sub(last_pass[index]) < period_ms {
                        continue;
                    }
                    last_pass[index] = now.unix_ms;
                    let started = std::time::Instant::now();
                    let report = citrine_service::nsup::run_pass(namespace, now);
                    tracing::debug!(namespace = %namespace.config.name, expired = report.expired, evicted = report.evicted, took_ms = started.elapsed().as_millis() as u64, "nsup pass");
                }
            }
        })
}

/// Runs `work` on a `citrine-truncate` thread (inline, with a warning, when
/// no thread can be started).
fn run_on_a_thread_of_its_own(work: Box<dyn FnOnce() + Send>) {
    let pending = Arc::new(std::sync::Mutex::new(Some(work)));
    let shared = Arc::clone(&pending);
    let started = std::thread::Builder::new()
        .name("citrine-truncate".to_owned())
        .spawn(move || {
            let work = shared.lock().ok().and_then(|mut work| work.take());
            if let Some(work) = work {
                work();
            }
        });
    if let Err(error) = started {
        tracing::warn!("running inline: cannot start a thread: {error}");
        let work = pending.lock().ok().and_then(|mut work| work.take());
        if let Some(work) = work {
            work();
        }
    }
}
