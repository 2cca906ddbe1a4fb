//! One service thread: a loop that owns a set of client connections and
//! runs each request to completion on this thread. The loop is the same
//! for every I/O backend ([`Backend`]: io_uring or epoll); the backend
//! waits for I/O and says which connections are ready, and the protocol
//! state machine ([`super::conn`]) does the rest. Before it runs the
//! connections one wake-up made ready, the thread looks ahead
//! (`look_ahead`, [`citrine_service::lookahead`]): for every whole
//! single-record frame already buffered it reads the namespace and digest
//! and starts the cache misses of their index lookups in three waves, so
//! the misses of the batch overlap; nothing else changes.
//!
//! Invariants (beyond the per-connection ones in [`super::conn`]):
//! - fabric work (proxy, replication, batch rows in a cluster) runs as a
//!   future polled by this loop and woken through the thread's waker; no
//!   lock is held across it. Its timers live on the listener's runtime,
//!   whose context this thread enters for its whole life;
//! - a connection moves to another thread only between requests (nothing
//!   buffered to write, no stream or fabric work pending, no I/O in
//!   flight), with its input buffer, so no byte is lost or reordered by a
//!   move;
//! - a connection's slot (token) is reused only after the backend has let
//!   go of it; the backend tells a late completion for an old connection
//!   from one for the slot's new owner;
//! - a turn that starts more than [`STALL_SLACK`] later than the previous
//!   one and its wait allowed (the process was stopped, paused or starved
//!   of a CPU) tells the service that what the first turn to read anything
//!   after it (within [`STALL_SLACK`]) reads may have waited since the
//!   previous turn began ([`Service::handle_streaming_since`]): a request
//!   whose client timed out meanwhile is refused, not run late;
//! - a connection on which nothing moved for `proto-fd-idle-ms` (no
//!   completion or readiness from its socket, no work of the server's own
//!   on it) is closed by the thread's idle sweep (`reap_idle`, at most
//!   every [`SWEEP_MAX`], from the turn's clock: no timer of its own),
//!   between requests or inside a frame; inside a frame (or a reply) it is
//!   closed after [`MID_FRAME_IDLE`] at most, even when `proto-fd-idle-ms`
//!   is 0; one waiting for the server (fabric work, which has its own
//!   timeouts, or a throttled scan's next chunk) is not;
//! - with access control on, the same sweep closes a connection that has
//!   not logged in `login-timeout-ms` after it opened, busy or not
//!   ([`Service::login_overdue`]); both count in `reaped_fds`.

use super::balance::{self, LoadMeter, Rebalance, SpillGate};
use super::conn::{self, Conn, Next, State, Transport, READ_BUFFER_BYTES};
use super::tls::{TlsOver, TlsSession};
use super::{log_limit, Arrival, Parked, Shared};
use citrine_service::lookahead::Lookup;
use citrine_service::Service;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::io;
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll as TaskPoll, Wake, Waker};
use std::time::{Duration, Instant};

/// How often a thread measures its load and considers rebalancing.
const BALANCE_WINDOW: Duration = Duration::from_millis(100);

/// How long a connection stalled inside an exchange (part of a frame
/// received, or part of a reply not taken) may stay idle when
/// `proto-fd-idle-ms` is 0 or longer. A connection between requests waits
/// for its client as long as `proto-fd-idle-ms` says, forever when it is 0
/// (the reference's default: the clients' pools then keep idle sockets,
/// and one reaped under them fails a write), but no client stops in the
/// middle of a frame for this long.
const MID_FRAME_IDLE: Duration = Duration::from_secs(60);

/// How long a connection may stay idle under `proto-fd-idle-ms` =
/// `idle_ms`, `inside` an exchange or between requests; `None`: forever.
fn idle_limit(idle_ms: u32, inside: bool) -> Option<Duration> {
    let idle = (idle_ms > 0).then(|| Duration::from_millis(u64::from(idle_ms)));
    match (idle, inside) {
        (Some(idle), true) => Some(idle.min(MID_FRAME_IDLE)),
        (None, true) => Some(MID_FRAME_IDLE),
        (idle, false) => idle,
    }
}

/// The longest time between two idle sweeps (shorter for a short
/// `proto-fd-idle-ms`: a quarter of it, at least [`SWEEP_MIN`]).
const SWEEP_MAX: Duration = Duration::from_secs(1);
const SWEEP_MIN: Duration = Duration::from_millis(10);

/// How much later than its wait allowed a turn may start before the thread
/// counts itself stalled. Past that, requests it reads are taken to have
/// waited since the previous turn began, the earliest they can have
/// arrived. A stall shorter than this goes unnoticed: a request held that
/// long whose client timeout is shorter still runs after its client gave up.
const STALL_SLACK: Duration = Duration::from_millis(250);

/// How long what a turn reads may have waited, when the thread stalled
/// (stopped, paused, starved of a CPU) since the previous turn began:
/// `None` when it did not. The previous turn began at `last_woke` and ended
/// at `last_done`, then the wait was allowed `timeout`; this turn began at
/// `woke`. It stalled when this turn began more than [`STALL_SLACK`] later
/// than the wait allowed, or when the previous turn itself ran longer than
/// that: a stop that lands inside a turn (after its replies were sent)
/// makes the turn end late, not the next one begin late. Either way, what
/// this turn reads arrived after `last_woke` at the earliest.
fn stalled_for(
    last_woke: Instant,
    last_done: Instant,
    timeout: Duration,
    woke: Instant,
) -> Option<Duration> {
    let late = woke > last_done + timeout + STALL_SLACK;
    let long_turn = last_done.saturating_duration_since(last_woke) > STALL_SLACK;
    (late || long_turn).then(|| woke.saturating_duration_since(last_woke))
}

/// One connection as a service thread holds it.
pub(super) struct Connection<S> {
    pub(super) conn: Conn,
    pub(super) socket: S,
    /// The thread it was chosen to move to, once its I/O has stopped.
    moving_to: Option<usize>,
    /// Wakes this thread for the connection's fabric work; made at its
    /// first fabric wait and kept for the connection's life here.
    waker: Option<Waker>,
    /// After a stall, until the connection is next read (or the stall's
    /// slack ends): since when (unix ms) what it reads may have waited.
    held_since_ms: Option<u64>,
    /// The start of the last turn that drove it: when something last
    /// moved on it (for `proto-fd-idle-ms`).
    last_moved: Instant,
    /// A TLS connection's session: `conn` then holds plaintext, and the
    /// backend's I/O goes through the session's ciphertext buffers.
    pub(super) tls: Option<Box<TlsSession>>,
}

impl<S> Connection<S> {
    /// The socket and the buffers the backend reads into and sends from:
    /// `conn` itself, or a TLS connection's ciphertext buffers.
    pub(super) fn wire(&mut self) -> (&mut S, &mut Conn) {
        match &mut self.tls {
            None => (&mut self.socket, &mut self.conn),
            Some(tls) => (&mut self.socket, &mut tls.cipher),
        }
    }
}

/// The I/O half of a service thread.
pub(super) trait Backend: Transport {
    /// Takes over a connection's socket, known by `token` on this thread.
    fn attach(&mut self, token: usize, stream: TcpStream) -> io::Result<Self::Socket>;
    /// Gives a socket with no I/O in flight back, to move it elsewhere.
    fn detach(&mut self, socket: Self::Socket) -> io::Result<TcpStream>;
    /// Closes a connection (any I/O still in flight is abandoned safely).
    fn release(&mut self, socket: Self::Socket);
    /// Stops the I/O in flight so the connection can leave; it is driven
    /// again when that has happened.
    fn quiesce(&mut self, socket: &mut Self::Socket);
    /// Whether no I/O is in flight.
    fn quiet(&self, socket: &Self::Socket) -> bool;
    /// Whether part of a reply is in flight, lent to the kernel (a backend
    /// that writes from `out` directly says false: `out` shows it).
    fn writing(&self, _socket: &Self::Socket) -> bool {
        false
    }
    /// Waits up to `timeout` for I/O, applies what happened to the
    /// connections and lists those that can make progress in `ready`.
    /// `Ok(true)`: the thread's waker fired.
    fn wait(
        &mut self,
        timeout: Duration,
        connections: &mut [Option<Connection<Self::Socket>>],
        ready: &mut Vec<usize>,
    ) -> io::Result<bool>;
    /// Receives stopped since the last call because a connection held more
    /// than its current frame plus the read-ahead (0 for a backend that
    /// reads only when a frame needs bytes).
    fn take_read_ahead_pauses(&mut self) -> u64 {
        0
    }
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
        slot.waker.wake(self.thread);
    }
}

pub(super) struct ServiceThread<B: Backend> {
    index: usize,
    backend: B,
    shared: Arc<Shared>,
    service: Arc<Service>,
    connections: Vec<Option<Connection<B::Socket>>>,
    free: Vec<usize>,
    /// Connections with work to do without waiting for I/O.
    runnable: VecDeque<usize>,
    /// Connections held until a moment (throttled scans), earliest first.
    /// An entry can outlive its connection; its token then drives whatever
    /// holds the slot, which finds nothing to do or does what it would
    /// have done anyway.
    paced: BinaryHeap<Reverse<(Instant, usize)>>,
    /// The lookahead of the current turn (kept to reuse its allocation).
    lookups: Vec<Lookup>,
    /// When this thread may spill (hot windows in a row, back-off).
    spill_gate: SpillGate,
    /// In the turns after a stall: since when (unix ms, the service's
    /// clock) what they read may have waited; `None` in turns on time.
    /// Every connection held then, and every one that arrives until
    /// `stall_until`, is marked with it (`Connection::held_since_ms`) until
    /// it is next read: the kernel hands over what came during a stop
    /// over several waits, not always in the first.
    stall_since_ms: Option<u64>,
    /// Until when the last stall's marks hold on connections not read
    /// since.
    stall_until: Option<Instant>,
    /// When the current turn began (its wait for I/O returned): when the
    /// requests it reads were received, for their latency histograms.
    turn_began: Instant,
    /// When the next idle sweep is due.
    next_sweep: Instant,
}

impl<B: Backend> ServiceThread<B> {
    pub(super) fn new(
        index: usize,
        backend: B,
        shared: Arc<Shared>,
        service: Arc<Service>,
    ) -> ServiceThread<B> {
        ServiceThread {
            index,
            backend,
            shared,
            service,
            connections: Vec::new(),
            free: Vec::new(),
            runnable: VecDeque::new(),
            paced: BinaryHeap::new(),
            lookups: Vec::new(),
            spill_gate: SpillGate::default(),
            stall_since_ms: None,
            stall_until: None,
            turn_began: Instant::now(),
            next_sweep: Instant::now(),
        }
    }

    /// Serves until the listener stops. Each turn: wait for I/O (no longer
    /// than the balance window or the next paced connection allows), note
    /// a stall, take the wake-ups and arrivals, release paced connections,
    /// serve the ready and runnable ones, then measure the load.
    pub(super) fn run(mut self) {
        let mut meter = LoadMeter::new();
        let mut ready: Vec<usize> = Vec::new();
        let mut woken: Vec<usize> = Vec::new();
        let mut arrivals: Vec<Arrival> = Vec::new();
        // When the last turn ended: close enough to now for the timeout.
        let mut last_done = Instant::now();
        // When the last turn began.
        let mut last_woke = last_done;
        loop {
            let window_end = meter.window_end(BALANCE_WINDOW);
            let timeout = self.wait_timeout(window_end, last_done);
            ready.clear();
            let Some(waker_fired) = self.wait_for_io(timeout, &mut ready) else {
                continue;
            };
            let woke = Instant::now();
            // The wall-clock fallback of the load meter needs the start.
            let busy_from = (!meter.counts_cpu()).then_some(woke);
            self.note_stall(last_woke, last_done, timeout, woke);
            last_woke = woke;
            self.turn_began = woke;
            if self.shared.stopping.load(Ordering::Acquire) {
                break;
            }
            if waker_fired {
                self.take_wakeups(&mut woken, &mut arrivals);
            }
            if !self.paced.is_empty() {
                // Only then: no clock read on a turn with nothing held.
                self.release_paced(Instant::now());
            }
            self.serve_ready(&ready);
            if woke >= self.next_sweep {
                self.sweep(woke);
            }
            let done = Instant::now();
            if let Some(busy_from) = busy_from {
                meter.add_busy(done.saturating_duration_since(busy_from));
            }
            if done >= window_end {
                self.balance(&mut meter, done);
            }
            last_done = done;
        }
        for token in 0..self.connections.len() {
            self.close(token);
        }
    }

    /// How long the turn may wait for I/O: not at all with connections
    /// runnable, else until the balance window ends or the first paced
    /// connection is due.
    fn wait_timeout(&self, window_end: Instant, last_done: Instant) -> Duration {
        if !self.runnable.is_empty() {
            return Duration::ZERO;
        }
        let until = match self.paced.peek() {
            Some(Reverse((due, _))) => window_end.min(*due),
            None => window_end,
        };
        until.saturating_duration_since(last_done)
    }

    /// Waits for I/O, listing the ready connections in `ready`: whether the
    /// thread's waker fired, or `None` when the wait failed (logged, and
    /// the thread pauses a moment before the next turn).
    fn wait_for_io(&mut self, timeout: Duration, ready: &mut Vec<usize>) -> Option<bool> {
        match self.backend.wait(timeout, &mut self.connections, ready) {
            Ok(fired) => Some(fired),
            Err(error) => {
                tracing::error!(
                    "service thread {}: waiting for I/O failed: {error}",
                    self.index
                );
                std::thread::sleep(Duration::from_millis(10));
                None
            }
        }
    }

    /// Marks the connections when the turn beginning at `woke` follows a
    /// stall, or ends the last stall's marks once its slack is over.
    fn note_stall(
        &mut self,
        last_woke: Instant,
        last_done: Instant,
        timeout: Duration,
        woke: Instant,
    ) {
        if let Some(since_ms) = self.stall_before(last_woke, last_done, timeout, woke) {
            self.mark_stall(since_ms, woke + STALL_SLACK);
        } else if self.stall_until.is_some_and(|until| woke > until) {
            self.end_stall();
        }
    }

    /// Takes what woke the thread: connections handed to it (accepted or
    /// moved here) and connections whose fabric work can progress.
    /// `woken` and `arrivals` are kept to reuse their allocations.
    fn take_wakeups(&mut self, woken: &mut Vec<usize>, arrivals: &mut Vec<Arrival>) {
        let slot = &self.shared.threads[self.index];
        slot.waker.clear();
        std::mem::swap(woken, &mut *super::lock(&slot.woken));
        std::mem::swap(arrivals, &mut *super::lock(&slot.inbox));
        for arrival in arrivals.drain(..) {
            self.arrive(arrival);
        }
        for token in woken.drain(..) {
            self.poll_remote(token);
        }
    }

    /// Drives the ready connections (their index lookups started together
    /// first), then those that yielded: each once this turn.
    fn serve_ready(&mut self, ready: &[usize]) {
        self.look_ahead(ready);
        for &token in ready {
            self.drive(token);
            if let Some(Some(connection)) = self.connections.get_mut(token) {
                // What waited through the stall has been read.
                connection.held_since_ms = None;
            }
        }
        // Connections that yielded (streamed chunks, arrivals) run
        // after the ready ones; those that yield again wait a turn.
        for _ in 0..self.runnable.len() {
            if let Some(token) = self.runnable.pop_front() {
                self.drive(token);
            }
        }
    }

    /// Marks every connection held now, and those that arrive until
    /// `until`, as read after a stall that began at `since_ms` (unix ms).
    fn mark_stall(&mut self, since_ms: u64, until: Instant) {
        self.stall_since_ms = Some(since_ms);
        self.stall_until = Some(until);
        for connection in self.connections.iter_mut().flatten() {
            connection.held_since_ms = Some(since_ms);
        }
    }

    /// The stall's slack is over: what is read from now on came after it.
    fn end_stall(&mut self) {
        self.stall_since_ms = None;
        self.stall_until = None;
        for connection in self.connections.iter_mut().flatten() {
            connection.held_since_ms = None;
        }
    }

    /// Whether what the turn beginning at `woke` reads may have waited
    /// through a stall (see [`stalled_for`]): since when (unix ms).
    fn stall_before(
        &self,
        last_woke: Instant,
        last_done: Instant,
        timeout: Duration,
        woke: Instant,
    ) -> Option<u64> {
        let waited = stalled_for(last_woke, last_done, timeout, woke)?;
        let waited_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
        self.service
            .stats
            .service_stalls
            .fetch_add(1, Ordering::Relaxed);
        Some(self.service.now().unix_ms.saturating_sub(waited_ms))
    }

    /// Starts the index cache misses of every request the ready
    /// connections hold, so they overlap instead of stalling one request
    /// after another (`citrine_service::lookahead`). With io_uring the
    /// bytes are already here when the wait returns; with epoll they are
    /// read inside `drive`, so this finds only pipelined frames.
    fn look_ahead(&mut self, ready: &[usize]) {
        if ready.len() < 2 {
            return;
        }
        self.lookups.clear();
        for &token in ready {
            let body = match self.connections.get(token) {
                Some(Some(connection)) => connection.conn.buffered_message(),
                _ => None,
            };
            if let Some(lookup) = body.and_then(|body| self.service.lookup_of(body)) {
                self.lookups.push(lookup);
            }
        }
        if self.lookups.len() > 1 {
            self.service.prefetch(&self.lookups);
        }
    }

    /// A connection handed to this thread: accepted or moved here.
    fn arrive(&mut self, arrival: Arrival) {
        let mut tls = None;
        let parked = match arrival {
            Arrival::AcceptedTls(stream, peer, start) => {
                tls = Some(Box::new(TlsSession::new(*start, peer)));
                self.accepted(stream, peer)
            }
            Arrival::Accepted(stream, peer) => self.accepted(stream, peer),
            Arrival::Moved(parked) => {
                self.spill_gate.took_back();
                *parked
            }
        };
        self.attach(parked, tls);
    }

    /// Accounts for a connection just accepted and gives it its buffers.
    fn accepted(&self, stream: TcpStream, peer: std::net::SocketAddr) -> Parked {
        let _ = stream.set_nodelay(true);
        let stats = &self.service.stats;
        stats.client_connections.fetch_add(1, Ordering::Relaxed);
        stats
            .client_connections_opened
            .fetch_add(1, Ordering::Relaxed);
        Parked {
            stream,
            peer,
            input: vec![0; READ_BUFFER_BYTES],
            start: 0,
            end: 0,
            out: Vec::with_capacity(READ_BUFFER_BYTES),
            session: Default::default(),
        }
    }

    /// Gives the connection a slot and its socket to the backend.
    fn attach(&mut self, parked: Parked, tls: Option<Box<TlsSession>>) {
        let token = self.free.pop().unwrap_or_else(|| {
            self.connections.push(None);
            self.connections.len() - 1
        });
        let socket = match self.backend.attach(token, parked.stream) {
            Ok(socket) => socket,
            Err(error) => {
                tracing::warn!(peer = %parked.peer, "cannot serve connection: {error}");
                self.free.push(token);
                self.closed();
                return;
            }
        };
        let mut out = parked.out;
        out.clear();
        self.connections[token] = Some(Connection {
            conn: Conn::new(
                parked.peer,
                (parked.input, parked.start, parked.end, out),
                parked.session,
            ),
            socket,
            moving_to: None,
            waker: None,
            held_since_ms: self.stall_since_ms,
            last_moved: self.turn_began,
            tls,
        });
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
            if let Some(connection) = slot.take() {
                self.backend.release(connection.socket);
                self.free.push(token);
                self.closed();
            }
        }
    }

    fn drive(&mut self, token: usize) {
        let Some(Some(connection)) = self.connections.get_mut(token) else {
            return;
        };
        connection.last_moved = self.turn_began;
        if let Some(to) = connection.moving_to {
            if connection.conn.between_requests() {
                if self.backend.quiet(&connection.socket) {
                    if let Some(parked) = self.move_out(token, to) {
                        self.shared.hand_over(to, vec![Arrival::Moved(parked)]);
                    }
                }
                // Otherwise it moves when its I/O has stopped.
                return;
            }
            connection.moving_to = None;
        }
        let timing = (connection.held_since_ms, self.turn_began);
        let next = match connection.tls.as_deref_mut() {
            None => conn::drive(
                &self.service,
                timing,
                &mut self.backend,
                &mut connection.socket,
                &mut connection.conn,
            ),
            Some(session) => conn::drive(
                &self.service,
                timing,
                &mut TlsOver {
                    backend: &mut self.backend,
                    session,
                },
                &mut connection.socket,
                &mut connection.conn,
            ),
        };
        match next {
            Next::Wait => {}
            Next::Again => self.runnable.push_back(token),
            Next::Close => self.close(token),
            // Poll it once now so it sends its messages.
            Next::Started => self.poll_remote(token),
            Next::Later(pause) => self.paced.push(Reverse((Instant::now() + pause, token))),
        }
    }

    /// The periodic sweep at `now`: closes idle connections, reports the
    /// log lines suppressed (thread 0), and sets when the next is due.
    fn sweep(&mut self, now: Instant) {
        let idle_ms = self
            .service
            .client_limits
            .proto_fd_idle_ms
            .load(Ordering::Relaxed);
        self.reap_idle(now, idle_ms);
        if self.index == 0 {
            log_limit::report_quiet(now);
        }
        let period = idle_limit(idle_ms, true).unwrap_or(SWEEP_MAX) / 4;
        self.next_sweep = now + period.clamp(SWEEP_MIN, SWEEP_MAX);
    }

    /// Closes every connection on which nothing moved for longer than
    /// [`idle_limit`] allows before `now`, unless it waits for the server.
    fn reap_idle(&mut self, now: Instant, idle_ms: u32) {
        for token in 0..self.connections.len() {
            let Some(connection) = &self.connections[token] else {
                continue;
            };
            let conn = &connection.conn;
            if self.service.login_overdue(&conn.session, now) {
                tracing::debug!(peer = %conn.peer, "closing connection not logged in within login-timeout-ms");
                self.service
                    .stats
                    .reaped_fds
                    .fetch_add(1, Ordering::Relaxed);
                self.close(token);
                continue;
            }
            let inside = conn.end > conn.start
                || conn.written < conn.out.len()
                || self.backend.writing(&connection.socket);
            let Some(limit) = idle_limit(idle_ms, inside) else {
                continue;
            };
            // Fabric work, or a throttled scan paused until its next chunk
            // is due: the server's turn, not the client's.
            let server_busy = match conn.state {
                State::Remote(_) => true,
                State::Streaming(_) => !inside,
                State::Idle => false,
            };
            if server_busy || now.saturating_duration_since(connection.last_moved) < limit {
                continue;
            }
            tracing::debug!(
                peer = %connection.conn.peer,
                buffered = connection.conn.end - connection.conn.start,
                "closing connection idle past proto-fd-idle-ms"
            );
            self.service
                .stats
                .reaped_fds
                .fetch_add(1, Ordering::Relaxed);
            self.close(token);
        }
    }

    /// Moves the held connections whose moment has come to the runnable
    /// ones.
    fn release_paced(&mut self, now: Instant) {
        while let Some(Reverse((due, token))) = self.paced.peek().copied() {
            if due > now {
                break;
            }
            self.paced.pop();
            self.runnable.push_back(token);
        }
    }

    /// Polls a connection's fabric work; on completion, carries on with
    /// the connection.
    fn poll_remote(&mut self, token: usize) {
        let Some(Some(connection)) = self.connections.get_mut(token) else {
            return;
        };
        let State::Remote(future) = &mut connection.conn.state else {
            return;
        };
        let waker = connection.waker.get_or_insert_with(|| {
            Waker::from(Arc::new(RemoteWaker {
                token,
                shared: self.shared.clone(),
                thread: self.index,
            }))
        });
        let mut context = Context::from_waker(waker);
        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            future.as_mut().poll(&mut context)
        }));
        match polled {
            Ok(TaskPoll::Pending) => {}
            Ok(TaskPoll::Ready((out, next))) => {
                let conn = &mut connection.conn;
                conn.out = out;
                conn.written = 0;
                conn.state = match next {
                    Some(continuation) => State::Streaming(continuation),
                    None => State::Idle,
                };
                self.drive(token);
            }
            Err(_) => {
                tracing::error!(peer = %connection.conn.peer, "fabric work panicked; closing this connection, the node keeps serving");
                self.service.report_failed_partitions();
                self.close(token);
            }
        }
    }

    /// Measures this thread's load, publishes it, and moves connections if
    /// the policy says so.
    fn balance(&mut self, meter: &mut LoadMeter, now: Instant) {
        let load = meter.close_window(now);
        let pauses = self.backend.take_read_ahead_pauses();
        if pauses > 0 {
            self.service
                .stats
                .client_read_ahead_pauses
                .fetch_add(pauses, Ordering::Relaxed);
        }
        let threads = &self.shared.threads;
        threads[self.index]
            .load_permille
            .store(load.cpu, Ordering::Relaxed);
        let thresholds = self.shared.thresholds;
        self.spill_gate.observe(load, thresholds);
        let loads = self.shared.loads();
        let active = self
            .connections
            .iter()
            .flatten()
            .filter(|connection| connection.conn.active)
            .count();
        let decision = balance::rebalance(
            self.index,
            &loads,
            load,
            self.spill_gate.ready(),
            active,
            thresholds,
        );
        match decision {
            Rebalance::Stay => {}
            Rebalance::Spill { to, count } => {
                self.spill_gate.spilled();
                tracing::debug!(
                    thread = self.index,
                    to,
                    count,
                    next_spill_after_windows = self.spill_gate.spill_after(),
                    "service thread saturated: spilling connections"
                );
                self.choose_leavers(to, count);
            }
            Rebalance::Merge { to, count } => self.choose_leavers(to, count),
        }
        for connection in self.connections.iter_mut().flatten() {
            connection.conn.active = false;
        }
    }

    /// Picks up to `count` active connections that sit between requests to
    /// move to thread `to`: at once if their I/O is quiet, else as soon as
    /// it has stopped.
    fn choose_leavers(&mut self, to: usize, count: usize) {
        debug_assert_ne!(to, self.index);
        let mut chosen = 0;
        let mut moved = Vec::new();
        for token in 0..self.connections.len() {
            if chosen == count {
                break;
            }
            let Some(connection) = self.connections[token].as_mut() else {
                continue;
            };
            // A TLS session stays on its thread.
            if !connection.conn.active
                || connection.tls.is_some()
                || !connection.conn.between_requests()
                || connection.moving_to.is_some()
            {
                continue;
            }
            chosen += 1;
            connection.moving_to = Some(to);
            if self.backend.quiet(&connection.socket) {
                moved.extend(self.move_out(token, to).map(Arrival::Moved));
            } else {
                self.backend.quiesce(&mut connection.socket);
            }
        }
        if !moved.is_empty() {
            self.shared.hand_over(to, moved);
        }
    }

    /// Takes a connection that is between requests and quiet off this
    /// thread, to be handed to thread `to`.
    fn move_out(&mut self, token: usize, to: usize) -> Option<Box<Parked>> {
        let connection = self.connections[token].take()?;
        self.free.push(token);
        let Connection { conn, socket, .. } = connection;
        debug_assert!(conn.between_requests());
        let stream = match self.backend.detach(socket) {
            Ok(stream) => stream,
            Err(error) => {
                tracing::warn!(peer = %conn.peer, "cannot move connection: {error}");
                self.closed();
                return None;
            }
        };
        self.service
            .stats
            .client_connections_moved
            .fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            from = self.index,
            to,
            peer = %conn.peer,
            "moving a connection between service threads"
        );
        Some(Box::new(Parked {
            stream,
            peer: conn.peer,
            input: conn.input,
            start: conn.start,
            end: conn.end,
            out: conn.out,
            session: conn.session,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_connections_wait_as_long_as_proto_fd_idle_ms_says_but_not_mid_frame() {
        let ms = Duration::from_millis;
        // 0: between requests forever (the reference's default), inside
        // a frame a minute.
        assert_eq!(idle_limit(0, false), None);
        assert_eq!(idle_limit(0, true), Some(MID_FRAME_IDLE));
        assert_eq!(idle_limit(500, false), Some(ms(500)));
        assert_eq!(idle_limit(500, true), Some(ms(500)));
        assert_eq!(idle_limit(600_000, false), Some(ms(600_000)));
        assert_eq!(idle_limit(600_000, true), Some(MID_FRAME_IDLE));
    }

    /// A stall shows whether it delays the next turn or lands inside a
    /// turn (the process stopped after a turn's replies were sent, so the
    /// turn ends late and the next wait returns at once).
    #[test]
    fn a_stall_is_seen_before_a_turn_or_inside_the_previous_one() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let timeout = Duration::from_millis(100);
        // An ordinary turn and wait: no stall.
        assert_eq!(stalled_for(at(0), at(1), timeout, at(101)), None);
        // The next turn began 1.2 s late: a stall since the last turn began.
        assert_eq!(
            stalled_for(at(0), at(1), timeout, at(1_300)),
            Some(Duration::from_millis(1_300))
        );
        // Stopped inside the turn for 1.2 s, the wait then returning at once.
        assert_eq!(
            stalled_for(at(0), at(1_200), timeout, at(1_201)),
            Some(Duration::from_millis(1_201))
        );
        // A turn just under the slack is not a stall.
        assert_eq!(stalled_for(at(0), at(250), timeout, at(251)), None);
    }
}
