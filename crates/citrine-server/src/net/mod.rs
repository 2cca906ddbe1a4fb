//! The client listener: accepts connections on the service port and hands
//! each to a service thread ([`service_thread`]), which reads its frames,
//! runs them through the service and writes the replies.
//!
//! Threading: `service-threads` threads (default one per core), each a
//! loop that owns its connections and runs every request to completion
//! without crossing threads. The loop's I/O is io_uring where the kernel
//! allows it ([`uring`], batched submissions: no system call per request
//! of its own), else epoll ([`epoll`]); `service-io` chooses.
//! Connections are packed onto as few threads as carry the load
//! ([`balance`]): one thread serving many connections finds several ready
//! at each wake-up and costs less CPU per request than several threads
//! each waking for a few; a thread that uses more than
//! `service-thread-spill-pct` of a core hands some of its connections to
//! the least loaded thread, unless it waits for a CPU
//! `service-thread-contended-pct` of the time or more (the CPUs are taken:
//! another thread would only time-slice with it), and two threads that
//! would fit in one merge.
//! The acceptor, signal handling and the timers of fabric work run on a
//! small tokio runtime of their own. The port is bound only once every
//! service thread has its I/O backend (with `service-io = "auto"`, a
//! thread that cannot get an io_uring ring makes them all use epoll), so a
//! listening node is a serving one. With a `tls-port`, a second listener
//! accepts TLS connections, which the same service threads serve
//! ([`tls`]); they count toward `proto-fd-max` like plain ones.
//!
//! Invariants:
//! - a connection is owned by exactly one service thread at a time; it
//!   moves only between requests, through the receiving thread's inbox;
//! - `proto-fd-max` bounds the open client connections: one over it is
//!   closed at accept with a log line (rate limited, [`log_limit`]) and
//!   counted (`proto_fd_max_refused`); `set-config` cannot change it, the
//!   accept loop reads it from the service's
//!   [`ClientLimits`](citrine_service::client_limits::ClientLimits);
//! - a connection idle for `proto-fd-idle-ms` is closed by its service
//!   thread's sweep and counted (`reaped_fds`);
//! - see [`conn`] for the per-connection invariants (order, bounded
//!   buffers, panics, streamed replies, fabric work), [`service_thread`]
//!   for moves, and [`ring`] for the ownership of in-flight buffers.

mod balance;
mod conn;
mod epoll;
mod log_limit;
mod ring;
mod service_thread;
pub(crate) mod tls;
mod uring;

use crate::config::{ServerConfig, ServiceIo};
use citrine_service::Service;
use service_thread::ServiceThread;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::net::TcpListener;

/// A connection handed to a service thread.
enum Arrival {
    Accepted(std::net::TcpStream, SocketAddr),
    /// Accepted on the TLS port, with its server session.
    AcceptedTls(std::net::TcpStream, SocketAddr, Box<tls::TlsStart>),
    /// Moved from another service thread between requests.
    Moved(Box<Parked>),
}

/// A connection between requests, in transit between service threads,
/// with everything that is its own: buffers and session (its login and
/// user agent), which a move must not lose.
struct Parked {
    stream: std::net::TcpStream,
    peer: SocketAddr,
    input: Vec<u8>,
    start: usize,
    end: usize,
    out: Vec<u8>,
    session: citrine_service::session::Session,
}

/// Wakes a service thread from another thread.
enum ThreadWaker {
    Epoll(mio::Waker),
    Uring(uring::RingWaker),
}

impl ThreadWaker {
    fn wake(&self, thread: usize) {
        let woken = match self {
            ThreadWaker::Epoll(waker) => waker.wake(),
            ThreadWaker::Uring(waker) => waker.wake(),
        };
        if let Err(error) = woken {
            tracing::error!("cannot wake service thread {thread}: {error}");
        }
    }

    /// Called by the woken thread before it looks at its inbox.
    fn clear(&self) {
        if let ThreadWaker::Uring(waker) = self {
            waker.clear();
        }
    }
}

/// What the service threads and the acceptor share about one thread.
struct ThreadSlot {
    waker: ThreadWaker,
    inbox: Mutex<Vec<Arrival>>,
    /// Tokens of connections whose fabric work was woken.
    woken: Mutex<Vec<usize>>,
    /// CPU use over the last balance window, per-mille of one core.
    load_permille: AtomicU32,
}

struct Shared {
    threads: Vec<ThreadSlot>,
    stopping: AtomicBool,
    /// Open client connections (for `proto-fd-max`).
    open: AtomicU32,
    /// When a thread spills, and when it counts as contended.
    thresholds: balance::Thresholds,
}

impl Shared {
    /// Queues connections for thread `to` and wakes it.
    fn hand_over(&self, to: usize, arrivals: Vec<Arrival>) {
        let slot = &self.threads[to];
        lock(&slot.inbox).extend(arrivals);
        slot.waker.wake(to);
    }

    fn loads(&self) -> Vec<u32> {
        self.threads
            .iter()
            .map(|thread| thread.load_permille.load(Ordering::Relaxed))
            .collect()
    }
}

/// Locks a mutex whose data stays valid even if a holder panicked.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Serves clients until SIGINT or SIGTERM.
///
/// The port is bound only once every service thread is up, so a node that
/// listens is a node that serves: a failed start never shows a listening
/// socket that then vanishes.
pub fn run(service: Arc<Service>, config: ServerConfig) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("citrine-listener")
        .enable_all()
        .build()
        .map_err(|error| format!("cannot start the listener runtime: {error}"))?;
    let limits = &service.client_limits;
    limits
        .proto_fd_max
        .store(config.proto_fd_max, Ordering::Relaxed);
    limits
        .proto_fd_idle_ms
        .store(config.proto_fd_idle_ms, Ordering::Relaxed);
    let tls = match config.tls.clone() {
        Some(settings) => Some(tls::TlsAcceptor::new(settings)?),
        None => None,
    };
    let io = choose_io(config.service_io)?;
    let (shared, workers) = match start_threads(io, &runtime, &service, &config) {
        Ok(started) => started,
        // "auto" found io_uring usable, but a thread could not get its ring
        // (memory accounting, limits): epoll serves just as correctly.
        Err(error) if io == Io::Uring && config.service_io == ServiceIo::Auto => {
            tracing::warn!("{error}; service threads use epoll instead");
            start_threads(Io::Epoll, &runtime, &service, &config)?
        }
        Err(error) => return Err(error),
    };
    let bind = format!("{}:{}", config.address, config.port);
    let listener = match runtime.block_on(TcpListener::bind(&bind)) {
        Ok(listener) => listener,
        Err(error) => {
            stop_threads(&shared, workers);
            return Err(format!(
                "cannot listen on {bind} (--address/--port): {error}"
            ));
        }
    };
    let tls = match tls.map(|acceptor| bind_tls(&runtime, &config, acceptor)) {
        Some(Err(error)) => {
            stop_threads(&shared, workers);
            return Err(error);
        }
        Some(Ok(tls)) => Some(tls),
        None => None,
    };
    let result = runtime.block_on(accept_loop(&service, &config, listener, tls, &shared));
    stop_threads(&shared, workers);
    result
}

/// Starts the service threads, each with its `io` backend, and waits until
/// every one has set it up. On failure the threads already started are
/// stopped and the first error is returned.
fn start_threads(
    io: Io,
    runtime: &tokio::runtime::Runtime,
    service: &Arc<Service>,
    config: &ServerConfig,
) -> Result<(Arc<Shared>, Vec<std::thread::JoinHandle<()>>), String> {
    let count = config.service_threads.max(1);
    tracing::info!(
        "service threads do their socket I/O with {}",
        match io {
            Io::Uring => "io_uring",
            Io::Epoll => "epoll",
        }
    );
    let (seeds, slots) = thread_seeds(io, count)?;
    let shared = Arc::new(Shared {
        threads: slots,
        stopping: AtomicBool::new(false),
        open: AtomicU32::new(0),
        thresholds: balance::Thresholds {
            spill_permille: config.service_thread_spill_pct * 10,
            contended_permille: config.service_thread_contended_pct * 10,
        },
    });
    let mut workers = Vec::with_capacity(count);
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    for (index, seed) in seeds.into_iter().enumerate() {
        let thread = ThreadStart {
            index,
            seed,
            runtime: runtime.handle().clone(),
            shared: shared.clone(),
            service: service.clone(),
            started: started_tx.clone(),
        };
        match thread.spawn() {
            Ok(worker) => workers.push(worker),
            Err(error) => {
                stop_threads(&shared, workers);
                return Err(error);
            }
        }
    }
    drop(started_tx);
    if let Err(error) = wait_started(count, &started_rx) {
        stop_threads(&shared, workers);
        return Err(error);
    }
    Ok((shared, workers))
}

/// What each of `count` service threads needs made before it starts: the
/// seed of its backend (each backend is built on its own thread: an
/// io_uring ring belongs to the thread that submits to it) and its slot,
/// with the waker that reaches it.
fn thread_seeds(io: Io, count: usize) -> Result<(Vec<BackendSeed>, Vec<ThreadSlot>), String> {
    let mut seeds = Vec::with_capacity(count);
    let mut slots = Vec::with_capacity(count);
    for index in 0..count {
        let cannot =
            |error: std::io::Error| format!("cannot set up service thread {index}: {error}");
        let (seed, waker) = match io {
            Io::Uring => {
                let (waker, rx) = uring::RingWaker::pair().map_err(cannot)?;
                (BackendSeed::Uring(rx), ThreadWaker::Uring(waker))
            }
            Io::Epoll => {
                let (epoll, waker) = epoll::Epoll::new().map_err(cannot)?;
                (BackendSeed::Epoll(epoll), ThreadWaker::Epoll(waker))
            }
        };
        seeds.push(seed);
        slots.push(ThreadSlot {
            waker,
            inbox: Mutex::new(Vec::new()),
            woken: Mutex::new(Vec::new()),
            load_permille: AtomicU32::new(0),
        });
    }
    Ok((seeds, slots))
}

/// Waits for every one of `count` service threads to report its start;
/// the first failure.
fn wait_started(
    count: usize,
    started: &std::sync::mpsc::Receiver<Result<(), String>>,
) -> Result<(), String> {
    for _ in 0..count {
        started
            .recv()
            .unwrap_or_else(|_| Err("a service thread ended while starting".to_owned()))?;
    }
    Ok(())
}

/// One service thread about to start.
struct ThreadStart {
    index: usize,
    seed: BackendSeed,
    /// The listener runtime, whose context the thread enters.
    runtime: tokio::runtime::Handle,
    shared: Arc<Shared>,
    service: Arc<Service>,
    /// Where it reports that its backend is set up, or why not.
    started: std::sync::mpsc::Sender<Result<(), String>>,
}

impl ThreadStart {
    fn spawn(self) -> Result<std::thread::JoinHandle<()>, String> {
        let index = self.index;
        std::thread::Builder::new()
            .name(format!("citrine-service-{index}"))
            .spawn(move || self.serve())
            .map_err(|error| format!("cannot start service thread {index}: {error}"))
    }

    /// The thread's life: build the backend, report, serve.
    fn serve(self) {
        // Fabric work's timers register with the listener runtime.
        let _context = self.runtime.enter();
        let (index, started) = (self.index, self.started);
        match self.seed {
            BackendSeed::Epoll(epoll) => {
                let _ = started.send(Ok(()));
                ServiceThread::new(index, epoll, self.shared, self.service).run();
            }
            BackendSeed::Uring(rx) => match uring::Uring::new(rx) {
                Ok(backend) => {
                    let _ = started.send(Ok(()));
                    ServiceThread::new(index, backend, self.shared, self.service).run();
                }
                Err(error) => {
                    let _ = started.send(Err(format!(
                        "service thread {index} cannot set up io_uring: {error} (service-io = \"epoll\" avoids it)"
                    )));
                }
            },
        }
    }
}

/// The I/O backend all service threads use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Io {
    Uring,
    Epoll,
}

/// What a service thread builds its backend from.
enum BackendSeed {
    Epoll(epoll::Epoll),
    /// The receiving end of the thread's waker.
    Uring(std::os::unix::net::UnixStream),
}

fn choose_io(wanted: ServiceIo) -> Result<Io, String> {
    match wanted {
        ServiceIo::Epoll => Ok(Io::Epoll),
        ServiceIo::IoUring => uring::Uring::available()
            .map(|()| Io::Uring)
            .map_err(|error| {
                format!("service-io = \"io_uring\" but io_uring cannot be used here: {error}")
            }),
        ServiceIo::Auto => match uring::Uring::available() {
            Ok(()) => Ok(Io::Uring),
            Err(error) => {
                tracing::info!("io_uring cannot be used here ({error}); service threads use epoll");
                Ok(Io::Epoll)
            }
        },
    }
}

fn stop_threads(shared: &Shared, workers: Vec<std::thread::JoinHandle<()>>) {
    shared.stopping.store(true, Ordering::Release);
    for (index, slot) in shared.threads.iter().enumerate() {
        slot.waker.wake(index);
    }
    for worker in workers {
        let _ = worker.join();
    }
}

/// The TLS service port's listener and what makes its sessions.
struct TlsListener {
    listener: TcpListener,
    acceptor: tls::TlsAcceptor,
}

fn bind_tls(
    runtime: &tokio::runtime::Runtime,
    config: &ServerConfig,
    acceptor: tls::TlsAcceptor,
) -> Result<TlsListener, String> {
    let bind = format!("{}:{}", config.address, acceptor.port());
    match runtime.block_on(TcpListener::bind(&bind)) {
        Ok(listener) => {
            tracing::info!("TLS service listening on {bind}");
            Ok(TlsListener { listener, acceptor })
        }
        Err(error) => Err(format!("cannot listen on {bind} (tls-port): {error}")),
    }
}

/// A connection accepted on the TLS port: checked against `proto-fd-max`
/// like a plain one, given its session and handed to a service thread.
fn admit_tls(
    shared: &Shared,
    config: &ServerConfig,
    tls: &TlsListener,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
) {
    if shared.open.load(Ordering::Relaxed) >= config.proto_fd_max {
        tracing::warn!(%peer, limit = config.proto_fd_max, "refusing TLS connection: proto-fd-max reached");
        return;
    }
    let session = match tls.acceptor.session() {
        Ok(session) => session,
        Err(error) => {
            tracing::warn!(%peer, "cannot start a TLS session: {error}");
            return;
        }
    };
    let stream = match stream.into_std() {
        Ok(stream) => stream,
        Err(error) => {
            tracing::warn!(%peer, "cannot hand connection to a service thread: {error}");
            return;
        }
    };
    let session = tls::TlsStart {
        server: session,
        names: tls.acceptor.client_names(),
    };
    shared.open.fetch_add(1, Ordering::Relaxed);
    let to = balance::place(&shared.loads(), shared.thresholds.spill_permille);
    shared.hand_over(
        to,
        vec![Arrival::AcceptedTls(stream, peer, Box::new(session))],
    );
}

/// Accepts on the TLS port (never, without one).
async fn accept_tls(
    tls: Option<&TlsListener>,
) -> std::io::Result<(tokio::net::TcpStream, SocketAddr)> {
    match tls {
        Some(tls) => tls.listener.accept().await,
        None => std::future::pending().await,
    }
}

async fn accept_loop(
    service: &Service,
    config: &ServerConfig,
    listener: TcpListener,
    tls: Option<TlsListener>,
    shared: &Shared,
) -> Result<(), String> {
    let bind = format!("{}:{}", config.address, config.port);
    let namespaces: Vec<&str> = service
        .namespaces()
        .map(|namespace| namespace.config.name.as_str())
        .collect();
    tracing::info!(
        "citrined {} listening on {bind}: node {}, cluster {:?}, namespaces {}, {} service threads",
        env!("CARGO_PKG_VERSION"),
        service.node_id,
        service.config.cluster_name,
        namespaces.join(","),
        shared.threads.len()
    );
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    let mut refresh = tokio::time::interval(tls::REFRESH_PERIOD);
    loop {
        tokio::select! {
            _ = refresh.tick(), if tls.is_some() => {
                if let Some(tls) = &tls {
                    tls.acceptor.refresh();
                }
            }
            accepted = accept_tls(tls.as_ref()) => match (accepted, &tls) {
                (Ok((stream, peer)), Some(tls)) => admit_tls(shared, config, tls, stream, peer),
                (Ok(_), None) => {}
                (Err(error), _) => {
                    tracing::warn!("TLS accept failed: {error}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            _ = &mut shutdown => {
                tracing::info!("shutdown requested");
                return Ok(());
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let limit = service.client_limits.proto_fd_max.load(Ordering::Relaxed);
                    if shared.open.load(Ordering::Relaxed) >= limit {
                        service.stats.proto_fd_max_refused.fetch_add(1, Ordering::Relaxed);
                        if let Some(note) = log_limit::REFUSED.admit() {
                            tracing::warn!(%peer, limit, "refusing connection: proto-fd-max reached{note}");
                        }
                        drop(stream);
                        continue;
                    }
                    let stream = match stream.into_std() {
                        Ok(stream) => stream,
                        Err(error) => {
                            tracing::warn!(%peer, "cannot hand connection to a service thread: {error}");
                            continue;
                        }
                    };
                    shared.open.fetch_add(1, Ordering::Relaxed);
                    let to = balance::place(&shared.loads(), shared.thresholds.spill_permille);
                    shared.hand_over(to, vec![Arrival::Accepted(stream, peer)]);
                }
                Err(error) => {
                    // Typically EMFILE: back off briefly instead of spinning.
                    if let Some(note) = log_limit::REFUSED.admit() {
                        tracing::warn!("accept failed: {error}{note}");
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(_) => {
                    let _ = interrupt.await;
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}
