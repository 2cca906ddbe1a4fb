//! One service thread: an epoll loop (mio) that owns a set of client
//! connections and runs each request to completion on this thread.
//!
//! Per request the loop does one `recvfrom`, one `sendto` and a share of
//! one `epoll_wait`: sockets are registered once, edge-triggered, for
//! reading and writing; a read shorter than the free buffer means the
//! socket is drained (the next data raises a new edge), so no read is spent
//! learning `EAGAIN`.
//!
//! Invariants:
//! - at most one request per connection is in progress, and replies leave
//!   in request order; the next frame is looked at only when the previous
//!   reply (every chunk of it) is written;
//! - a frame whose header cannot be trusted closes that connection with a
//!   log line; every other connection keeps being served;
//! - the input buffer grows only as bytes arrive (at most doubling when it
//!   is full), never to a size a frame merely announces;
//! - a panic in the service closes only the connection that caused it;
//! - a streamed reply (batch, scan) is produced chunk by chunk: after each
//!   chunk is written the connection goes to the back of the line, so one
//!   big scan neither builds one giant buffer nor starves the others;
//! - fabric work (proxy, replication, batch rows in a cluster) runs as a
//!   future polled by this loop and woken through the thread's waker; no
//!   lock is held across it, and nothing else is read on that connection
//!   until it completes. Its timers live on the listener's runtime, whose
//!   context this thread enters for its whole life;
//! - a connection moves to another thread only between requests (nothing
//!   buffered to write, no stream or fabric work pending), with its input
//!   buffer, so no byte is lost or reordered by a move.

use super::balance::{self, LoadMeter, Rebalance};
use super::{Arrival, Parked, Shared};
use citrine_service::{Continuation, Service};
use citrine_wire::frame::{ProtoHeader, PROTO_HEADER_SIZE};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use std::collections::VecDeque;
use std::future::Future;
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll as TaskPoll, Wake, Waker};
use std::time::{Duration, Instant};

/// Read buffer per connection: one syscall brings in a typical request.
pub(super) const READ_BUFFER_BYTES: usize = 16 * 1024;
/// Buffers grown past this by a large request are shrunk back afterwards.
const BUFFER_KEEP_BYTES: usize = 1024 * 1024;
/// The token of the thread's waker (arrivals, fabric completions, stop).
pub(super) const WAKE_TOKEN: Token = Token(usize::MAX);
/// How often a thread measures its load and considers rebalancing.
const BALANCE_WINDOW: Duration = Duration::from_millis(100);

type RemoteFuture = Pin<Box<dyn Future<Output = (Vec<u8>, Option<Continuation>)>>>;

enum State {
    /// Between requests (or inside one that needs more bytes).
    Idle,
    /// The rest of a streamed reply, produced after the written chunk.
    Streaming(Continuation),
    /// Fabric work before the reply (or the next chunk) is final.
    Remote(RemoteFuture),
}

struct Connection {
    stream: TcpStream,
    peer: SocketAddr,
    /// Received bytes live in `input[start..end]`; the rest is free space.
    input: Vec<u8>,
    start: usize,
    end: usize,
    /// The reply being written; `out[written..]` is still to go.
    out: Vec<u8>,
    written: usize,
    state: State,
    /// The socket may have unread bytes (an edge arrived and no short read
    /// or `EAGAIN` has been seen since).
    readable: bool,
    /// The peer closed its side.
    eof: bool,
    /// Served a request in the current balance window.
    active: bool,
}

/// What the loop does with a connection after driving it.
enum Next {
    /// Waits for an event (readable, writable or a fabric wake-up).
    Wait,
    /// Has more work now, after the other ready connections.
    Again,
    Close,
    /// Fabric work was just started.
    Started,
}

/// Wakes the thread when a connection's fabric work can make progress.
struct RemoteWaker {
    token: usize,
    shared: Arc<Shared>,
    thread: usize,
}

impl Wake for RemoteWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let slot = &self.shared.threads[self.thread];
        super::lock(&slot.woken).push(self.token);
        if let Err(error) = slot.waker.wake() {
            tracing::error!("cannot wake service thread {}: {error}", self.thread);
        }
    }
}

pub(super) struct ServiceThread {
    index: usize,
    poll: Poll,
    shared: Arc<Shared>,
    service: Arc<Service>,
    connections: Vec<Option<Connection>>,
    free: Vec<usize>,
    /// Connections with work to do without waiting for an event.
    runnable: VecDeque<usize>,
}

impl ServiceThread {
    pub(super) fn new(
        index: usize,
        poll: Poll,
        shared: Arc<Shared>,
        service: Arc<Service>,
    ) -> ServiceThread {
        ServiceThread {
            index,
            poll,
            shared,
            service,
            connections: Vec::new(),
            free: Vec::new(),
            runnable: VecDeque::new(),
        }
    }

    /// Serves until the listener stops.
    pub(super) fn run(mut self) {
        let mut events = Events::with_capacity(1024);
        let mut meter = LoadMeter::new();
        let mut woken: Vec<usize> = Vec::new();
        let mut arrivals: Vec<Arrival> = Vec::new();
        // When the last turn ended: close enough to now for the timeout.
        let mut last_done = Instant::now();
        loop {
            let window_end = meter.window_end(BALANCE_WINDOW);
            let timeout = if self.runnable.is_empty() {
                window_end.saturating_duration_since(last_done)
            } else {
                Duration::ZERO
            };
            if let Err(error) = self.poll.poll(&mut events, Some(timeout)) {
                if error.kind() != ErrorKind::Interrupted {
                    tracing::error!("service thread {}: poll failed: {error}", self.index);
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
            let busy_from = Instant::now();
            if self.shared.stopping.load(Ordering::Acquire) {
                break;
            }
            for event in events.iter() {
                let token = event.token();
                if token == WAKE_TOKEN {
                    std::mem::swap(
                        &mut woken,
                        &mut *super::lock(&self.shared.threads[self.index].woken),
                    );
                    std::mem::swap(
                        &mut arrivals,
                        &mut *super::lock(&self.shared.threads[self.index].inbox),
                    );
                    for arrival in arrivals.drain(..) {
                        self.arrive(arrival);
                    }
                    for token in woken.drain(..) {
                        self.poll_remote(token);
                    }
                    continue;
                }
                let token = token.0;
                if let Some(Some(connection)) = self.connections.get_mut(token) {
                    if event.is_readable() || event.is_read_closed() || event.is_error() {
                        connection.readable = true;
                    }
                    self.drive(token);
                }
            }
            // Connections that yielded (streamed chunks, arrivals) run
            // after the ready ones; those that yield again wait a turn.
            for _ in 0..self.runnable.len() {
                if let Some(token) = self.runnable.pop_front() {
                    self.drive(token);
                }
            }
            let done = Instant::now();
            meter.add_busy(done.saturating_duration_since(busy_from));
            if done >= window_end {
                self.balance(&mut meter, done);
            }
            last_done = done;
        }
        let open: Vec<Connection> = self.connections.drain(..).flatten().collect();
        for connection in open {
            drop(connection);
            self.closed();
        }
    }

    /// A connection handed to this thread: accepted or moved here.
    fn arrive(&mut self, arrival: Arrival) {
        let parked = match arrival {
            Arrival::Accepted(stream, peer) => {
                if let Err(error) = stream.set_nonblocking(true) {
                    tracing::warn!(%peer, "cannot make the connection non-blocking: {error}");
                    self.shared.open.fetch_sub(1, Ordering::Relaxed);
                    return;
                }
                let _ = stream.set_nodelay(true);
                let stats = &self.service.stats;
                stats.client_connections.fetch_add(1, Ordering::Relaxed);
                stats
                    .client_connections_opened
                    .fetch_add(1, Ordering::Relaxed);
                Parked {
                    stream: TcpStream::from_std(stream),
                    peer,
                    input: vec![0; READ_BUFFER_BYTES],
                    start: 0,
                    end: 0,
                    out: Vec::with_capacity(READ_BUFFER_BYTES),
                }
            }
            Arrival::Moved(parked) => *parked,
        };
        let token = self.free.pop().unwrap_or_else(|| {
            self.connections.push(None);
            self.connections.len() - 1
        });
        let mut connection = Connection {
            stream: parked.stream,
            peer: parked.peer,
            input: parked.input,
            start: parked.start,
            end: parked.end,
            out: parked.out,
            written: 0,
            state: State::Idle,
            readable: true,
            eof: false,
            active: true,
        };
        connection.out.clear();
        if let Err(error) = self.poll.registry().register(
            &mut connection.stream,
            Token(token),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            tracing::warn!(peer = %connection.peer, "cannot register connection: {error}");
            self.free.push(token);
            drop(connection);
            self.closed();
            return;
        }
        self.connections[token] = Some(connection);
        // It may hold a whole request already (moved between requests).
        self.runnable.push_back(token);
    }

    /// Accounts for one closed connection.
    fn closed(&self) {
        let stats = &self.service.stats;
        stats.client_connections.fetch_sub(1, Ordering::Relaxed);
        stats
            .client_connections_closed
            .fetch_add(1, Ordering::Relaxed);
        self.shared.open.fetch_sub(1, Ordering::Relaxed);
    }

    fn close(&mut self, token: usize) {
        if let Some(slot) = self.connections.get_mut(token) {
            if let Some(mut connection) = slot.take() {
                let _ = self.poll.registry().deregister(&mut connection.stream);
                drop(connection);
                self.free.push(token);
                self.closed();
            }
        }
    }

    fn drive(&mut self, token: usize) {
        let next = match self.connections.get_mut(token) {
            Some(Some(connection)) => drive_connection(&self.service, connection),
            _ => return,
        };
        match next {
            Next::Wait => {}
            Next::Again => self.runnable.push_back(token),
            Next::Close => self.close(token),
            // Poll it once now so it sends its messages.
            Next::Started => self.poll_remote(token),
        }
    }

    /// Polls a connection's fabric work; on completion, carries on with
    /// the connection.
    fn poll_remote(&mut self, token: usize) {
        let Some(Some(connection)) = self.connections.get_mut(token) else {
            return;
        };
        let State::Remote(future) = &mut connection.state else {
            return;
        };
        let waker = Waker::from(Arc::new(RemoteWaker {
            token,
            shared: self.shared.clone(),
            thread: self.index,
        }));
        let mut context = Context::from_waker(&waker);
        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            future.as_mut().poll(&mut context)
        }));
        match polled {
            Ok(TaskPoll::Pending) => {}
            Ok(TaskPoll::Ready((out, next))) => {
                connection.out = out;
                connection.written = 0;
                connection.state = match next {
                    Some(continuation) => State::Streaming(continuation),
                    None => State::Idle,
                };
                self.drive(token);
            }
            Err(_) => {
                tracing::error!(peer = %connection.peer, "fabric work panicked; closing this connection, the node keeps serving");
                self.close(token);
            }
        }
    }

    /// Measures this thread's load, publishes it, and moves connections if
    /// the policy says so.
    fn balance(&mut self, meter: &mut LoadMeter, now: Instant) {
        let load = meter.close_window(now);
        let threads = &self.shared.threads;
        threads[self.index]
            .load_permille
            .store(load, Ordering::Relaxed);
        let loads: Vec<u32> = threads
            .iter()
            .map(|thread| thread.load_permille.load(Ordering::Relaxed))
            .collect();
        let active = self
            .connections
            .iter()
            .flatten()
            .filter(|connection| connection.active)
            .count();
        let decision = balance::rebalance(self.index, &loads, active, self.shared.spill_permille);
        if let Rebalance::Move { to, count } = decision {
            self.move_connections(to, count);
        }
        for connection in self.connections.iter_mut().flatten() {
            connection.active = false;
        }
    }

    /// Hands up to `count` active connections that sit between requests
    /// to thread `to`.
    fn move_connections(&mut self, to: usize, count: usize) {
        debug_assert_ne!(to, self.index);
        let mut moved = Vec::new();
        for token in 0..self.connections.len() {
            if moved.len() == count {
                break;
            }
            let movable = matches!(
                &self.connections[token],
                Some(connection) if connection.active
                    && matches!(connection.state, State::Idle)
                    && connection.written == connection.out.len()
                    && !connection.eof
            );
            if !movable {
                continue;
            }
            let Some(mut connection) = self.connections[token].take() else {
                continue;
            };
            self.free.push(token);
            if let Err(error) = self.poll.registry().deregister(&mut connection.stream) {
                tracing::warn!(peer = %connection.peer, "cannot move connection: {error}");
                drop(connection);
                self.closed();
                continue;
            }
            moved.push(Arrival::Moved(Box::new(Parked {
                stream: connection.stream,
                peer: connection.peer,
                input: connection.input,
                start: connection.start,
                end: connection.end,
                out: connection.out,
            })));
        }
        if moved.is_empty() {
            return;
        }
        self.service
            .stats
            .client_connections_moved
            .fetch_add(moved.len() as u64, Ordering::Relaxed);
        tracing::debug!(
            from = self.index,
            to,
            connections = moved.len(),
            "moving connections between service threads"
        );
        self.shared.hand_over(to, moved);
    }
}

/// Runs a connection as far as it goes without waiting.
fn drive_connection(service: &Arc<Service>, connection: &mut Connection) -> Next {
    loop {
        // 1. The reply in progress goes out first.
        match flush(connection) {
            Ok(true) => {}
            Ok(false) => return Next::Wait,
            Err(()) => return Next::Close,
        }
        match std::mem::replace(&mut connection.state, State::Idle) {
            State::Remote(future) => {
                connection.state = State::Remote(future);
                return Next::Wait;
            }
            State::Streaming(continuation) => {
                if !connection.out.is_empty() && connection.written == connection.out.len() {
                    // A chunk just went out: let the others run first.
                    connection.out.clear();
                    connection.written = 0;
                    connection.state = State::Streaming(continuation);
                    return Next::Again;
                }
                connection.out.clear();
                connection.written = 0;
                if continuation.is_remote() {
                    start_remote(service, connection, continuation);
                    return Next::Started;
                }
                let resumed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    service.resume(continuation, &mut connection.out)
                }));
                match resumed {
                    Ok(Some(next)) => connection.state = State::Streaming(next),
                    Ok(None) => {}
                    Err(_) => {
                        tracing::error!(peer = %connection.peer, "streamed reply panicked; closing this connection, the node keeps serving");
                        return Next::Close;
                    }
                }
                continue;
            }
            State::Idle => {}
        }
        // 2. Between requests: shed grown buffers, then the next frame.
        if connection.out.capacity() > BUFFER_KEEP_BYTES {
            connection.out = Vec::with_capacity(READ_BUFFER_BYTES);
        }
        connection.out.clear();
        connection.written = 0;
        match next_frame(service, connection) {
            Frame::Ready(header) => {
                if let Some(next) = handle(service, connection, header) {
                    return next;
                }
            }
            Frame::NeedBytes => match fill(connection) {
                Ok(true) => {}
                Ok(false) => return Next::Wait,
                Err(()) => return Next::Close,
            },
            Frame::Bad => return Next::Close,
        }
    }
}

enum Frame {
    /// A whole frame is at `input[start..]`.
    Ready(ProtoHeader),
    NeedBytes,
    Bad,
}

fn next_frame(service: &Service, connection: &mut Connection) -> Frame {
    let buffered = connection.end - connection.start;
    if buffered < PROTO_HEADER_SIZE {
        return Frame::NeedBytes;
    }
    let mut header_bytes = [0u8; PROTO_HEADER_SIZE];
    header_bytes
        .copy_from_slice(&connection.input[connection.start..connection.start + PROTO_HEADER_SIZE]);
    let header = match ProtoHeader::decode(&header_bytes) {
        Ok(header) => header,
        Err(error) => {
            service.stats.proto_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(peer = %connection.peer, header = ?header_bytes, "closing connection: bad proto header: {error}");
            return Frame::Bad;
        }
    };
    let total = PROTO_HEADER_SIZE as u64 + header.size;
    if (buffered as u64) < total {
        make_room(connection, total);
        return Frame::NeedBytes;
    }
    Frame::Ready(header)
}

/// Makes free space after the buffered bytes of a frame of `total` bytes:
/// moves them to the front, then at most doubles the buffer.
fn make_room(connection: &mut Connection, total: u64) {
    if connection.end < connection.input.len() {
        return;
    }
    if connection.start > 0 {
        connection
            .input
            .copy_within(connection.start..connection.end, 0);
        connection.end -= connection.start;
        connection.start = 0;
        return;
    }
    let wanted = usize::try_from(total).unwrap_or(usize::MAX);
    let grown = connection.input.len().saturating_mul(2).min(wanted);
    if grown > connection.input.len() {
        connection.input.resize(grown, 0);
    }
}

/// Runs the frame at `input[start..]`; `Some` when the connection must
/// stop here.
fn handle(
    service: &Arc<Service>,
    connection: &mut Connection,
    header: ProtoHeader,
) -> Option<Next> {
    connection.active = true;
    let body_start = connection.start + PROTO_HEADER_SIZE;
    // Fits: `next_frame` saw the whole frame buffered.
    let body_end = body_start + header.size as usize;
    let handled = {
        let body = &connection.input[body_start..body_end];
        let out = &mut connection.out;
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            service.handle_streaming(header, body, out)
        }))
    };
    connection.start = body_end;
    if connection.start == connection.end {
        connection.start = 0;
        connection.end = 0;
        if connection.input.len() > BUFFER_KEEP_BYTES {
            connection.input = vec![0; READ_BUFFER_BYTES];
        }
    }
    match handled {
        Ok(Ok(None)) => None,
        Ok(Ok(Some(continuation))) if continuation.is_remote() => {
            start_remote(service, connection, continuation);
            Some(Next::Started)
        }
        Ok(Ok(Some(continuation))) => {
            connection.state = State::Streaming(continuation);
            None
        }
        Ok(Err(close)) => {
            tracing::warn!(peer = %connection.peer, "closing connection: {}", close.0);
            Some(Next::Close)
        }
        Err(_) => {
            tracing::error!(peer = %connection.peer, "request handling panicked; closing this connection, the node keeps serving");
            Some(Next::Close)
        }
    }
}

/// Turns fabric work into the connection's pending future. The reply
/// built so far (earlier batch rows) travels with it and comes back with
/// the rows the fabric completes appended.
fn start_remote(service: &Arc<Service>, connection: &mut Connection, continuation: Continuation) {
    let service = service.clone();
    let mut out = std::mem::take(&mut connection.out);
    connection.written = 0;
    connection.state = State::Remote(Box::pin(async move {
        let next = service.complete_remote(continuation, &mut out).await;
        (out, next)
    }));
}

/// Writes what is left of the reply. `Ok(true)`: all written.
fn flush(connection: &mut Connection) -> Result<bool, ()> {
    while connection.written < connection.out.len() {
        match connection
            .stream
            .write(&connection.out[connection.written..])
        {
            Ok(0) => return Err(()),
            Ok(written) => connection.written += written,
            Err(error) if error.kind() == ErrorKind::WouldBlock => return Ok(false),
            Err(error) if error.kind() == ErrorKind::Interrupted => {}
            Err(error) => {
                tracing::debug!(peer = %connection.peer, "connection write error: {error}");
                return Err(());
            }
        }
    }
    Ok(true)
}

/// Reads what the socket has. `Ok(true)`: bytes arrived; `Ok(false)`:
/// nothing until the next edge; `Err`: the connection is over.
fn fill(connection: &mut Connection) -> Result<bool, ()> {
    if connection.eof {
        if connection.end > connection.start {
            tracing::warn!(peer = %connection.peer, buffered = connection.end - connection.start, "closing connection: peer closed inside a frame");
        }
        return Err(());
    }
    if !connection.readable {
        return Ok(false);
    }
    if connection.end == connection.input.len() {
        // `make_room` leaves space unless a header is still incomplete at
        // the very end of the buffer.
        connection
            .input
            .copy_within(connection.start..connection.end, 0);
        connection.end -= connection.start;
        connection.start = 0;
        if connection.end == connection.input.len() {
            let grown = connection.input.len() + READ_BUFFER_BYTES;
            connection.input.resize(grown, 0);
        }
    }
    loop {
        let free = connection.input.len() - connection.end;
        match connection
            .stream
            .read(&mut connection.input[connection.end..])
        {
            Ok(0) => {
                connection.eof = true;
                connection.readable = false;
                if connection.end > connection.start {
                    tracing::warn!(peer = %connection.peer, buffered = connection.end - connection.start, "closing connection: peer closed inside a frame");
                }
                return Err(());
            }
            Ok(read) => {
                connection.end += read;
                if read < free {
                    connection.readable = false;
                }
                return Ok(true);
            }
            Err(error) if error.kind() == ErrorKind::WouldBlock => {
                connection.readable = false;
                return Ok(false);
            }
            Err(error) if error.kind() == ErrorKind::Interrupted => {}
            Err(error) => {
                tracing::debug!(peer = %connection.peer, "connection read error: {error}");
                return Err(());
            }
        }
    }
}
