//! The client listener: accepts connections on the service port and runs one
//! task per connection that reads a frame, hands it to the service, and
//! writes the reply, strictly in order.
//!
//! Invariants:
//! - at most one request per connection is in progress (replies come back in
//!   request order, as clients require);
//! - a frame whose header cannot be trusted (bad version, type or size over
//!   128 MiB) closes that connection with a log line; every other connection
//!   keeps being served;
//! - a body is read as it arrives, never pre-allocated from the announced
//!   size, so a lying length cannot make the node allocate 128 MiB up front;
//! - a panic inside the service is caught, logged, and closes only the
//!   connection that caused it;
//! - a streamed reply (batch, scan) is written chunk by chunk: after each
//!   chunk the task yields to its event loop before asking the service for
//!   the next, so one big scan neither builds one giant buffer nor starves
//!   the other connections of its service thread; the next request is read
//!   only after the stream's last chunk;
//! - a request the service must forward to its master or replicate
//!   (`Continuation::is_remote`) is awaited on this event loop; the service
//!   holds no lock across that wait, and the reply is written after it. A
//!   batch whose rows wait for the fabric (in a cluster) continues the
//!   same way: its rows' answers are awaited, written, and the rest of the
//!   batch resumes.

use crate::config::ServerConfig;
use citrine_service::Service;
use citrine_wire::frame::{ProtoHeader, PROTO_HEADER_SIZE};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// Read buffer per connection: one syscall brings in a typical request.
const READ_BUFFER_BYTES: usize = 16 * 1024;
/// Buffers grown past this by a large request are shrunk back afterwards.
const BUFFER_KEEP_BYTES: usize = 1024 * 1024;

/// Serves clients until SIGINT or SIGTERM.
///
/// Threading: one service thread per core, each running its own
/// single-threaded event loop (a tokio current-thread runtime). The acceptor
/// hands each new connection to the next service thread, round robin, and
/// from then on the connection lives on that one thread: a request is read,
/// executed and answered there without crossing threads, so there are no
/// per-request wake-ups of other threads (measured: the multi-threaded
/// work-stealing scheduler spent a tenth of the server's time in context
/// switches under the 95/5 load).
///
/// Per request: one `recvfrom`, one `sendto`, and a share of an
/// `epoll_wait`. What is left is the thread's sleep and wake-up when it runs
/// out of ready connections; fewer threads wake less often per request, so
/// on a small machine that also runs the clients `service-threads = 1` is
/// cheaper, while one per core stays the default for clients on other
/// machines. Spinning before sleeping and yielding the core before sleeping
/// were measured and not kept (bench/RESULTS.md, 2026-11-22 05:40).
pub fn run(service: Arc<Service>, config: ServerConfig) -> Result<(), String> {
    let mut workers = Vec::with_capacity(config.service_threads);
    let mut handles = Vec::with_capacity(config.service_threads);
    let (stop_sender, stop_receiver) = tokio::sync::watch::channel(false);
    for index in 0..config.service_threads {
        let (handle_sender, handle_receiver) = std::sync::mpsc::channel();
        let mut stop = stop_receiver.clone();
        let worker = std::thread::Builder::new()
            .name(format!("citrine-service-{index}"))
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        let _ = handle_sender.send(Err(error.to_string()));
                        return;
                    }
                };
                let _ = handle_sender.send(Ok(runtime.handle().clone()));
                runtime.block_on(async move {
                    let _ = stop.wait_for(|stopping| *stopping).await;
                });
            })
            .map_err(|error| format!("cannot start service thread {index}: {error}"))?;
        let handle = handle_receiver
            .recv()
            .map_err(|_| format!("service thread {index} died at start"))??;
        workers.push(worker);
        handles.push(handle);
    }
    let acceptor = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| format!("cannot start the acceptor: {error}"))?;
    let result = acceptor.block_on(accept_loop(service, config, handles));
    let _ = stop_sender.send(true);
    for worker in workers {
        let _ = worker.join();
    }
    result
}

async fn accept_loop(
    service: Arc<Service>,
    config: ServerConfig,
    workers: Vec<tokio::runtime::Handle>,
) -> Result<(), String> {
    let bind = format!("{}:{}", config.address, config.port);
    let listener = TcpListener::bind(&bind)
        .await
        .map_err(|error| format!("cannot listen on {bind} (--address/--port): {error}"))?;
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
        workers.len()
    );
    let open = Arc::new(AtomicU32::new(0));
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    let mut next_worker = 0usize;
    loop {
        tokio::select! {
            _ = &mut shutdown => {
                tracing::info!("shutdown requested");
                return Ok(());
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    if open.load(Ordering::Relaxed) >= config.proto_fd_max {
                        tracing::warn!(%peer, limit = config.proto_fd_max, "refusing connection: proto-fd-max reached");
                        drop(stream);
                        continue;
                    }
                    // Move the socket to its service thread's event loop.
                    let stream = match stream.into_std() {
                        Ok(stream) => stream,
                        Err(error) => {
                            tracing::warn!(%peer, "cannot hand connection to a service thread: {error}");
                            continue;
                        }
                    };
                    open.fetch_add(1, Ordering::Relaxed);
                    let service = service.clone();
                    let open = open.clone();
                    let worker = &workers[next_worker % workers.len()];
                    next_worker = next_worker.wrapping_add(1);
                    worker.spawn(async move {
                        service.stats.client_connections.fetch_add(1, Ordering::Relaxed);
                        service.stats.client_connections_opened.fetch_add(1, Ordering::Relaxed);
                        match TcpStream::from_std(stream) {
                            Ok(stream) => connection(&service, stream, peer).await,
                            Err(error) => tracing::warn!(%peer, "cannot register connection: {error}"),
                        }
                        service.stats.client_connections.fetch_sub(1, Ordering::Relaxed);
                        service.stats.client_connections_closed.fetch_add(1, Ordering::Relaxed);
                        open.fetch_sub(1, Ordering::Relaxed);
                    });
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

async fn connection(service: &Service, stream: TcpStream, peer: SocketAddr) {
    let _ = stream.set_nodelay(true);
    let (reader, mut writer) = stream.into_split();
    let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, reader);
    let mut body: Vec<u8> = Vec::with_capacity(READ_BUFFER_BYTES);
    let mut out: Vec<u8> = Vec::with_capacity(READ_BUFFER_BYTES);
    loop {
        let mut header_bytes = [0u8; PROTO_HEADER_SIZE];
        if let Err(error) = reader.read_exact(&mut header_bytes).await {
            if error.kind() != std::io::ErrorKind::UnexpectedEof {
                tracing::debug!(%peer, "connection read error: {error}");
            }
            return;
        }
        let header = match ProtoHeader::decode(&header_bytes) {
            Ok(header) => header,
            Err(error) => {
                service.stats.proto_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%peer, header = ?header_bytes, "closing connection: bad proto header: {error}");
                return;
            }
        };
        body.clear();
        match (&mut reader).take(header.size).read_to_end(&mut body).await {
            Ok(read) if read as u64 == header.size => {}
            Ok(read) => {
                tracing::warn!(%peer, announced = header.size, read, "closing connection: peer closed inside a frame");
                return;
            }
            Err(error) => {
                tracing::debug!(%peer, "connection read error inside a frame: {error}");
                return;
            }
        }
        out.clear();
        let handled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            service.handle_streaming(header, &body, &mut out)
        }));
        let mut pending = match handled {
            // Proxy or replication: await the fabric (no lock is held),
            // then write the final reply.
            Ok(Ok(Some(continuation))) if continuation.is_remote() => {
                service.complete_remote(continuation, &mut out).await
            }
            Ok(Ok(pending)) => pending,
            Ok(Err(close)) => {
                tracing::warn!(%peer, "closing connection: {}", close.0);
                return;
            }
            Err(_) => {
                tracing::error!(%peer, "request handling panicked; closing this connection, the node keeps serving");
                return;
            }
        };
        if let Err(error) = writer.write_all(&out).await {
            tracing::debug!(%peer, "connection write error: {error}");
            return;
        }
        // A streamed reply: write chunk after chunk, letting the other
        // connections of this thread run in between.
        while let Some(continuation) = pending {
            tokio::task::yield_now().await;
            out.clear();
            if continuation.is_remote() {
                // Batch rows waiting for the fabric (no lock is held).
                pending = service.complete_remote(continuation, &mut out).await;
                if let Err(error) = writer.write_all(&out).await {
                    tracing::debug!(%peer, "connection write error: {error}");
                    return;
                }
                continue;
            }
            let resumed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                service.resume(continuation, &mut out)
            }));
            pending = match resumed {
                Ok(next) => next,
                Err(_) => {
                    tracing::error!(%peer, "streamed reply panicked; closing this connection, the node keeps serving");
                    return;
                }
            };
            if let Err(error) = writer.write_all(&out).await {
                tracing::debug!(%peer, "connection write error: {error}");
                return;
            }
        }
        if body.capacity() > BUFFER_KEEP_BYTES {
            body = Vec::with_capacity(READ_BUFFER_BYTES);
        }
        if out.capacity() > BUFFER_KEEP_BYTES {
            out = Vec::with_capacity(READ_BUFFER_BYTES);
        }
    }
}
