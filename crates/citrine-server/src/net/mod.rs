//! The client listener: accepts connections on the service port and hands
//! each to a service thread ([`service_thread`]), which reads its frames,
//! runs them through the service and writes the replies.
//!
//! Threading: `service-threads` threads (default one per core), each an
//! epoll loop that owns its connections and runs every request to
//! completion without crossing threads. Connections are packed onto as
//! few threads as carry the load ([`balance`]): one thread serving many
//! connections finds several ready at each wake-up and costs less CPU per
//! request than several threads each waking for a few; a thread that uses
//! more than `service-thread-spill-pct` of a core hands some of its
//! connections to the least loaded thread, and a nearly idle thread hands
//! its connections back. The acceptor, signal handling and the timers of
//! fabric work run on a small tokio runtime of their own.
//!
//! Invariants:
//! - a connection is owned by exactly one service thread at a time; it
//!   moves only between requests, through the receiving thread's inbox;
//! - `proto-fd-max` bounds the open client connections: one over it is
//!   closed at accept with a log line;
//! - see [`service_thread`] for the per-connection invariants (order,
//!   bounded buffers, panics, streamed replies, fabric work).

mod balance;
mod service_thread;

use crate::config::ServerConfig;
use citrine_service::Service;
use service_thread::{ServiceThread, WAKE_TOKEN};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::net::TcpListener;

/// A connection handed to a service thread.
enum Arrival {
    Accepted(std::net::TcpStream, SocketAddr),
    /// Moved from another service thread between requests.
    Moved(Box<Parked>),
}

/// A connection between requests, in transit between service threads.
struct Parked {
    stream: mio::net::TcpStream,
    peer: SocketAddr,
    input: Vec<u8>,
    start: usize,
    end: usize,
    out: Vec<u8>,
}

/// What the service threads and the acceptor share about one thread.
struct ThreadSlot {
    waker: mio::Waker,
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
    spill_permille: u32,
}

impl Shared {
    /// Queues connections for thread `to` and wakes it.
    fn hand_over(&self, to: usize, arrivals: Vec<Arrival>) {
        let slot = &self.threads[to];
        lock(&slot.inbox).extend(arrivals);
        if let Err(error) = slot.waker.wake() {
            tracing::error!("cannot wake service thread {to}: {error}");
        }
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
pub fn run(service: Arc<Service>, config: ServerConfig) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("citrine-listener")
        .enable_all()
        .build()
        .map_err(|error| format!("cannot start the listener runtime: {error}"))?;
    let bind = format!("{}:{}", config.address, config.port);
    let listener = runtime
        .block_on(TcpListener::bind(&bind))
        .map_err(|error| format!("cannot listen on {bind} (--address/--port): {error}"))?;

    let count = config.service_threads.max(1);
    let mut polls = Vec::with_capacity(count);
    let mut slots = Vec::with_capacity(count);
    for index in 0..count {
        let poll = mio::Poll::new()
            .map_err(|error| format!("cannot create service thread {index}'s poll: {error}"))?;
        let waker = mio::Waker::new(poll.registry(), WAKE_TOKEN)
            .map_err(|error| format!("cannot create service thread {index}'s waker: {error}"))?;
        polls.push(poll);
        slots.push(ThreadSlot {
            waker,
            inbox: Mutex::new(Vec::new()),
            woken: Mutex::new(Vec::new()),
            load_permille: AtomicU32::new(0),
        });
    }
    let shared = Arc::new(Shared {
        threads: slots,
        stopping: AtomicBool::new(false),
        open: AtomicU32::new(0),
        spill_permille: config.service_thread_spill_pct * 10,
    });
    let mut workers = Vec::with_capacity(count);
    for (index, poll) in polls.into_iter().enumerate() {
        let handle = runtime.handle().clone();
        let (thread_shared, thread_service) = (shared.clone(), service.clone());
        let worker = std::thread::Builder::new()
            .name(format!("citrine-service-{index}"))
            .spawn(move || {
                // Fabric work's timers register with the listener runtime.
                let _context = handle.enter();
                ServiceThread::new(index, poll, thread_shared, thread_service).run();
            })
            .map_err(|error| format!("cannot start service thread {index}: {error}"));
        match worker {
            Ok(worker) => workers.push(worker),
            Err(error) => {
                stop_threads(&shared, workers);
                return Err(error);
            }
        }
    }
    let result = runtime.block_on(accept_loop(&service, &config, listener, &shared));
    stop_threads(&shared, workers);
    result
}

fn stop_threads(shared: &Shared, workers: Vec<std::thread::JoinHandle<()>>) {
    shared.stopping.store(true, Ordering::Release);
    for slot in &shared.threads {
        let _ = slot.waker.wake();
    }
    for worker in workers {
        let _ = worker.join();
    }
}

async fn accept_loop(
    service: &Service,
    config: &ServerConfig,
    listener: TcpListener,
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
    loop {
        tokio::select! {
            _ = &mut shutdown => {
                tracing::info!("shutdown requested");
                return Ok(());
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    if shared.open.load(Ordering::Relaxed) >= config.proto_fd_max {
                        tracing::warn!(%peer, limit = config.proto_fd_max, "refusing connection: proto-fd-max reached");
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
                    let to = balance::place(&shared.loads(), shared.spill_permille);
                    shared.hand_over(to, vec![Arrival::Accepted(stream, peer)]);
                }
                Err(error) => {
                    // Typically EMFILE: back off briefly instead of spinning.
                    tracing::warn!("accept failed: {error}");
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
