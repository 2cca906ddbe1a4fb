//! The io_uring backend of a service thread (the default where the kernel
//! allows it).
//!
//! Each connection has at most one receive and one send in flight. A
//! request costs no system call of its own: its receive completes inside
//! the kernel when the bytes arrive, and the reply's send is queued and
//! handed over with every other queued operation in the one
//! `io_uring_enter` that also waits for the next completions. On this
//! machine kind that saves about a microsecond of server CPU per request
//! against epoll (see `bench/RESULTS.md`).
//!
//! A connection's receive is a multishot receive into the ring's provided
//! buffers where the kernel has them (6.0 and later): it is armed once and
//! completes whenever bytes arrive, and the bytes are copied from the
//! provided buffer to the connection's `input`. A request then costs no
//! receive attempt of its own, and no re-arming of the socket's poll. On
//! older kernels (and, in debug builds, on every other slot, so the tests
//! run both) it is a single receive straight into `input`, started again
//! after each completion. A multishot receive paused for read-ahead (see
//! below) counts in the `client_read_ahead_pauses` statistic.
//!
//! Invariants:
//! - while a single receive is in flight the ring owns `input` (and the
//!   connection's `input_here` is false); while a send is in flight it
//!   owns `out`; both come back with their completions;
//! - a multishot receive never holds `input`; it is cancelled once the
//!   connection holds more than its current frame plus `READ_AHEAD_BYTES`
//!   (a client that sends faster than it reads is held back by TCP, as
//!   with single receives), and started again when the connection needs
//!   bytes;
//! - every provided buffer a completion names is given back to the ring
//!   right after its bytes are copied, whether or not its connection
//!   still exists;
//! - a completion is applied only to the connection it was started for:
//!   its tag carries the slot and the connection's generation, and a
//!   completion for a connection closed since is dropped;
//! - a socket with operations in flight is shut down (after every queued
//!   operation has reached the kernel) before it is closed, so its
//!   operations finish and no queued operation can reach a reused
//!   descriptor;
//! - a connection's socket sits in its ring's registered file table (slot
//!   = the connection's token, while the table has room), and it leaves
//!   the table whenever the connection leaves the thread or closes: the
//!   table holds its own reference to the file, so a socket left in it
//!   would never close;
//! - sockets are in blocking mode: io_uring tries each operation without
//!   blocking and, when it would block, waits for readiness itself.

use super::conn::{Conn, Transport};
use super::log_limit;
use super::ring::{Completion, OpId, OpKind, Ring, Target};
use super::service_thread::{Backend, Connection};
use std::io::{self, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Submission queue entries per ring (it is flushed early when full).
const RING_ENTRIES: u32 = 1024;
/// Slots in each ring's registered file table: connections in slots
/// (tokens) past it use plain descriptors. Debug builds (the tests') keep
/// it small, so that the 1200-connection test runs both kinds at once.
#[cfg(not(debug_assertions))]
const FIXED_FILES: u32 = 4096;
#[cfg(debug_assertions)]
const FIXED_FILES: u32 = 512;
/// The tag of the waker's receive.
const WAKE_TAG: u64 = u64::MAX;
/// Provided buffers per ring for multishot receives: a power of two.
/// They are given back at every wake-up, so they run out only when more
/// than this many receives complete between two.
const PROVIDED_BUFFERS: u16 = 256;
/// Bytes per provided buffer (a larger arrival takes several).
const PROVIDED_BUFFER_BYTES: u32 = 16 * 1024;
/// How far past its current frame a connection's multishot receive may
/// read before it is paused.
const READ_AHEAD_BYTES: usize = 64 * 1024;

/// Wakes a service thread whose backend is io_uring: a byte on a socket
/// pair whose other end the thread keeps a receive on.
pub(super) struct RingWaker {
    signalled: AtomicBool,
    tx: UnixStream,
}

impl RingWaker {
    /// The waker and the end the service thread listens on.
    pub(super) fn pair() -> io::Result<(RingWaker, UnixStream)> {
        let (tx, rx) = UnixStream::pair()?;
        tx.set_nonblocking(true)?;
        Ok((
            RingWaker {
                signalled: AtomicBool::new(false),
                tx,
            },
            rx,
        ))
    }

    pub(super) fn wake(&self) -> io::Result<()> {
        if self.signalled.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        match (&self.tx).write(&[1]) {
            Ok(_) => Ok(()),
            // Full of wake-ups already: one is pending.
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Called by the woken thread before it looks at what woke it.
    pub(super) fn clear(&self) {
        self.signalled.store(false, Ordering::Release);
    }
}

pub(super) struct Uring {
    ring: Ring,
    completions: Vec<Completion>,
    wake_rx: UnixStream,
    /// The waker's receive buffer while no receive is in flight on it.
    wake_buf: Option<Vec<u8>>,
    /// Gives each attached connection a tag no earlier one had.
    generation: u32,
    /// Multishot receives cancelled at the read-ahead, not yet reported.
    read_ahead_pauses: u64,
}

impl Uring {
    /// Must run on the service thread that will use it.
    pub(super) fn new(wake_rx: UnixStream) -> io::Result<Uring> {
        wake_rx.set_nonblocking(false)?;
        let mut ring = Ring::new(RING_ENTRIES, FIXED_FILES)?;
        if let Err(error) = ring.provide_buffers(PROVIDED_BUFFERS, PROVIDED_BUFFER_BYTES) {
            tracing::debug!("no provided buffers ({error}): single receives");
        }
        Ok(Uring {
            ring,
            completions: Vec::new(),
            wake_rx,
            wake_buf: Some(vec![0; 64]),
            generation: 0,
            read_ahead_pauses: 0,
        })
    }

    /// Whether io_uring works here at all (kernel, seccomp, sysctl).
    pub(super) fn available() -> io::Result<()> {
        Ring::new(8, 0).map(drop)
    }

    /// Takes a socket out of the registered file table, if it is in it.
    fn unregister(&mut self, socket: &mut UringSocket) {
        if let Some(slot) = socket.fixed.take() {
            if let Err(error) = self.ring.remove(slot) {
                tracing::error!("cannot remove a socket from the io_uring file table: {error}");
            }
        }
    }

    fn arm_waker(&mut self) -> io::Result<()> {
        if let Some(buf) = self.wake_buf.take() {
            if let Err((error, buf)) =
                self.ring
                    .recv(Target::Fd(self.wake_rx.as_fd()), WAKE_TAG, buf, 0)
            {
                self.wake_buf = Some(buf);
                return Err(error);
            }
        }
        Ok(())
    }
}

pub(super) struct UringSocket {
    stream: TcpStream,
    /// Its slot in the ring's registered file table, if it has one.
    fixed: Option<u32>,
    /// Slot and generation, in every operation's tag.
    tag: u64,
    /// The receive in flight (single: `input` is lent to the ring).
    recv: Option<OpId>,
    /// The receive in flight is multishot (`input` stays here).
    multishot: bool,
    /// A cancel was queued for the receive in flight.
    cancelling: bool,
    /// Receives on this socket are multishot.
    use_multishot: bool,
    /// A send is in flight (`out` is lent to the ring).
    sending: bool,
    /// An I/O error ended the connection.
    failed: bool,
}

impl UringSocket {
    fn target(&self) -> Target<'_> {
        match self.fixed {
            Some(slot) => Target::Fixed(slot),
            None => Target::Fd(self.stream.as_fd()),
        }
    }

    /// Asks the kernel to stop the receive in flight (once); true when
    /// this call queued the cancel.
    fn cancel_recv(&mut self, ring: &mut Ring) -> bool {
        if let (Some(op), false) = (self.recv, self.cancelling) {
            match ring.cancel(op) {
                Ok(()) => {
                    self.cancelling = true;
                    return true;
                }
                Err(error) => tracing::warn!("cannot cancel a receive: {error}"),
            }
        }
        false
    }

    /// The receive in flight has ended.
    fn recv_ended(&mut self) {
        self.recv = None;
        self.multishot = false;
        self.cancelling = false;
    }
}

impl Transport for Uring {
    type Socket = UringSocket;

    fn flush(&mut self, socket: &mut UringSocket, conn: &mut Conn) -> Result<bool, ()> {
        if socket.failed {
            return Err(());
        }
        if socket.sending {
            return Ok(false);
        }
        if conn.written >= conn.out.len() {
            return Ok(true);
        }
        let out = std::mem::take(&mut conn.out);
        match self
            .ring
            .send(socket.target(), socket.tag, out, conn.written)
        {
            Ok(_) => {
                socket.sending = true;
                Ok(false)
            }
            Err((error, out)) => {
                conn.out = out;
                tracing::warn!(peer = %conn.peer, "cannot queue a send: {error}");
                Err(())
            }
        }
    }

    fn fill(&mut self, socket: &mut UringSocket, conn: &mut Conn) -> Result<bool, ()> {
        if conn.eof {
            conn.log_eof();
            return Err(());
        }
        if socket.failed {
            return Err(());
        }
        if socket.recv.is_some() {
            return Ok(false);
        }
        if socket.use_multishot {
            return match self.ring.recv_multishot(socket.target(), socket.tag) {
                Ok(op) => {
                    socket.recv = Some(op);
                    socket.multishot = true;
                    Ok(false)
                }
                Err(error) => {
                    tracing::warn!(peer = %conn.peer, "cannot queue a receive: {error}");
                    Err(())
                }
            };
        }
        debug_assert!(conn.has_room(), "next_frame makes room before a fill");
        let input = std::mem::take(&mut conn.input);
        match self.ring.recv(socket.target(), socket.tag, input, conn.end) {
            Ok(op) => {
                socket.recv = Some(op);
                Ok(false)
            }
            Err((error, input)) => {
                conn.input = input;
                tracing::warn!(peer = %conn.peer, "cannot queue a receive: {error}");
                Err(())
            }
        }
    }

    fn input_here(&self, socket: &UringSocket) -> bool {
        socket.recv.is_none() || socket.multishot
    }
}

impl Backend for Uring {
    fn take_read_ahead_pauses(&mut self) -> u64 {
        std::mem::take(&mut self.read_ahead_pauses)
    }

    fn attach(&mut self, token: usize, stream: TcpStream) -> io::Result<UringSocket> {
        stream.set_nonblocking(false)?;
        let token = u32::try_from(token)
            .map_err(|_| io::Error::other("more connections than slots on one thread"))?;
        self.generation = self.generation.wrapping_add(1);
        let fixed = (token < self.ring.fixed_slots())
            .then(|| self.ring.install(token, stream.as_fd()))
            .and_then(|installed| match installed {
                Ok(()) => Some(token),
                Err(error) => {
                    tracing::debug!("socket not in the io_uring file table: {error}");
                    None
                }
            });
        // Debug builds (the tests') use single receives on odd slots, so
        // both kinds are exercised.
        let use_multishot =
            self.ring.has_provided_buffers() && (!cfg!(debug_assertions) || token % 2 == 0);
        Ok(UringSocket {
            stream,
            fixed,
            tag: u64::from(self.generation) << 32 | u64::from(token),
            recv: None,
            multishot: false,
            cancelling: false,
            use_multishot,
            sending: false,
            failed: false,
        })
    }

    fn detach(&mut self, mut socket: UringSocket) -> io::Result<TcpStream> {
        debug_assert!(self.quiet(&socket));
        self.unregister(&mut socket);
        Ok(socket.stream)
    }

    fn release(&mut self, mut socket: UringSocket) {
        if !self.quiet(&socket) {
            // Queued operations name the descriptor (or the table slot) by
            // number: they must reach the kernel before it is closed (or
            // emptied) and maybe reused.
            if let Err(error) = self.ring.submit() {
                tracing::warn!("cannot submit before closing a connection: {error}");
            }
            let _ = socket.stream.shutdown(Shutdown::Both);
        }
        self.unregister(&mut socket);
    }

    fn quiesce(&mut self, socket: &mut UringSocket) {
        let _ = socket.cancel_recv(&mut self.ring);
    }

    fn quiet(&self, socket: &UringSocket) -> bool {
        socket.recv.is_none() && !socket.sending
    }

    fn writing(&self, socket: &UringSocket) -> bool {
        socket.sending
    }

    fn wait(
        &mut self,
        timeout: Duration,
        connections: &mut [Option<Connection<UringSocket>>],
        ready: &mut Vec<usize>,
    ) -> io::Result<bool> {
        self.arm_waker()?;
        self.ring.wait(timeout)?;
        self.ring.reap(&mut self.completions);
        let mut woken = false;
        for done in self.completions.drain(..) {
            let provided = done.provided;
            if done.tag == WAKE_TAG {
                woken = true;
                if done.result > 0 {
                    self.wake_buf = Some(done.buf);
                } else {
                    // The pair broke (it cannot while the listener lives):
                    // stop listening on it rather than spin.
                    tracing::error!(
                        "service thread waker failed ({}); it is no longer watched",
                        done.result
                    );
                }
            } else {
                self.read_ahead_pauses += apply(&mut self.ring, done, connections, ready);
            }
            if let Some(id) = provided {
                self.ring.give_back(id);
            }
        }
        Ok(woken)
    }
}

/// Applies a connection's completion to it and lists it as ready; a
/// completion for a connection closed since is dropped. Returns 1 when it
/// cancelled a multishot receive at the read-ahead, else 0.
fn apply(
    ring: &mut Ring,
    done: Completion,
    connections: &mut [Option<Connection<UringSocket>>],
    ready: &mut Vec<usize>,
) -> u64 {
    let token = (done.tag & u64::from(u32::MAX)) as usize;
    let Some(Some(connection)) = connections.get_mut(token) else {
        return 0;
    };
    if connection.socket.tag != done.tag {
        // For a connection closed since; its buffer just goes.
        return 0;
    }
    let paused = match done.kind {
        OpKind::Recv | OpKind::RecvMulti => apply_receive(ring, done, connection),
        OpKind::Send => {
            apply_send(done, connection);
            0
        }
    };
    ready.push(token);
    paused
}

/// A receive's completion: a single receive gives `input` back with the
/// bytes in it; a multishot one's bytes are copied from its provided
/// buffer ([`take_provided`]). Returns 1 when the read-ahead paused it.
fn apply_receive(
    ring: &mut Ring,
    done: Completion,
    connection: &mut Connection<UringSocket>,
) -> u64 {
    let (socket, conn) = connection.wire();
    let single = done.kind == OpKind::Recv;
    if single {
        conn.input = done.buf;
    }
    if single || !done.more {
        socket.recv_ended();
    }
    match Outcome::of(done.result) {
        Outcome::Moved(read) if single => {
            conn.end += read;
            // The kernel wrote into `input` past `end`, no further.
            assert!(conn.end <= conn.input.len(), "a receive within its buffer");
            0
        }
        Outcome::Moved(read) => take_provided(ring, done.provided, read, socket, conn),
        Outcome::End => {
            conn.eof = true;
            0
        }
        // Cancelled, interrupted, or (multishot) out of provided
        // buffers: started again when the connection needs bytes.
        Outcome::Again => 0,
        Outcome::Failed => {
            log_io_error(conn, "read", done.result);
            socket.failed = true;
            0
        }
    }
}

/// Copies a multishot receive's `read` bytes from its provided buffer to
/// the connection, and cancels the receive once the connection holds more
/// than its frame plus the read-ahead. Returns 1 when it cancelled.
fn take_provided(
    ring: &mut Ring,
    provided: Option<u16>,
    read: usize,
    socket: &mut UringSocket,
    conn: &mut Conn,
) -> u64 {
    match provided.and_then(|id| ring.provided(id, read)) {
        Some(bytes) => conn.receive(bytes),
        None => {
            // A bug, not the peer's doing: bytes were taken
            // off the socket that cannot be read here, so the
            // connection cannot go on.
            tracing::error!(peer = %conn.peer, read, buffer = ?provided, "closing connection: a receive's provided buffer is not readable");
            debug_assert!(false, "unreadable provided buffer");
            socket.failed = true;
        }
    }
    // Counted once per cancel, not per completion that
    // arrives before the cancel takes effect.
    let cancelled =
        socket.recv.is_some() && !conn.wants_input(READ_AHEAD_BYTES) && socket.cancel_recv(ring);
    u64::from(cancelled)
}

/// A send's completion: `out` comes back with how much of it went.
fn apply_send(done: Completion, connection: &mut Connection<UringSocket>) {
    let (socket, conn) = connection.wire();
    socket.sending = false;
    conn.out = done.buf;
    match Outcome::of(done.result) {
        Outcome::Moved(sent) => {
            conn.written += sent;
            // The kernel sent from `out`, no further than its end.
            assert!(conn.written <= conn.out.len(), "a send within its buffer");
        }
        Outcome::Again => {}
        Outcome::End | Outcome::Failed => {
            log_io_error(conn, "write", done.result);
            socket.failed = true;
        }
    }
}

/// What a completed receive or send did.
enum Outcome {
    /// Moved this many bytes.
    Moved(usize),
    /// Moved nothing: the peer closed (a receive).
    End,
    /// Cancelled, interrupted, or (a multishot receive) out of provided
    /// buffers: nothing happened, the state machine asks again.
    Again,
    Failed,
}

impl Outcome {
    fn of(result: i32) -> Outcome {
        match result {
            moved if moved > 0 => Outcome::Moved(moved as usize),
            0 => Outcome::End,
            error
                if error == -libc::ECANCELED
                    || error == -libc::EINTR
                    || error == -libc::ENOBUFS =>
            {
                Outcome::Again
            }
            _ => Outcome::Failed,
        }
    }
}

/// Logs the failed operation that ends a connection: a peer hanging up is
/// routine, anything else is worth a warning.
fn log_io_error(conn: &Conn, what: &str, result: i32) {
    let error = io::Error::from_raw_os_error(-result);
    match -result {
        libc::ECONNRESET | libc::EPIPE | libc::ETIMEDOUT => {
            tracing::debug!(peer = %conn.peer, "connection {what} error: {error}");
        }
        _ => {
            if let Some(note) = log_limit::IO_ERROR.admit() {
                tracing::warn!(peer = %conn.peer, "closing connection after a {what} error: {error} ({result}){note}")
            }
        }
    }
}
