//! The protocol half of one client connection: its buffers, the request in
//! progress, and the state machine that turns received frames into
//! replies. It is the same for every I/O backend; the backend
//! ([`super::service_thread::Backend`]) only moves bytes between these
//! buffers and the socket.
//!
//! A request's frame: the 8-byte proto header is checked first
//! (`ProtoHeader::decode`: version 2, or 0 for admin; a known type; a size
//! of at most 128 MiB — anything else closes the connection), then the
//! connection waits for more bytes until the whole frame is buffered, and
//! hands the frame to [`citrine_service::Service::handle_guarded`] (which checks
//! the connection's login when security is on).
//!
//! Invariants:
//! - at most one request per connection is in progress, and replies leave
//!   in request order; the next frame is looked at only when the previous
//!   reply (every chunk of it) is written;
//! - a frame whose header cannot be trusted closes that connection with a
//!   log line (rate limited, see [`super::log_limit`]); every other
//!   connection keeps being served;
//! - the input buffer grows only as bytes arrive (at most doubling when it
//!   is full, or to the bytes a backend hands over at once if that is
//!   more), never to a size a frame merely announces;
//! - a panic in the service closes only the connection that caused it;
//! - a streamed reply (batch, scan) is produced chunk by chunk: after each
//!   chunk is written the connection goes to the back of the line, so one
//!   big scan neither builds one giant buffer nor starves the others;
//! - a scan throttled by RECS_PER_SEC that is ahead of its rate is held
//!   (`Next::Later`) until its next chunk is due; the thread serves the
//!   other connections meanwhile;
//! - fabric work (proxy, replication, batch rows in a cluster) is a future
//!   the service thread polls; nothing else is read on that connection
//!   until it completes.

use super::log_limit;
use citrine_service::{Continuation, Service};
use citrine_wire::frame::{MessageType, ProtoHeader, PROTO_HEADER_SIZE};
use citrine_wire::DecodeError;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Read buffer per connection: one syscall brings in a typical request.
pub(super) const READ_BUFFER_BYTES: usize = 16 * 1024;
/// Buffers grown past this by a large request are shrunk back afterwards.
const BUFFER_KEEP_BYTES: usize = 1024 * 1024;

pub(super) type RemoteFuture = Pin<Box<dyn Future<Output = (Vec<u8>, Option<Continuation>)>>>;

pub(super) enum State {
    /// Between requests (or inside one that needs more bytes).
    Idle,
    /// The rest of a streamed reply, produced after the written chunk.
    Streaming(Continuation),
    /// Fabric work before the reply (or the next chunk) is final.
    Remote(RemoteFuture),
}

/// A connection's buffers and request state.
pub(super) struct Conn {
    pub(super) peer: SocketAddr,
    /// Received bytes live in `input[start..end]`; the rest is free space.
    /// A backend may hold the buffer while a receive is in flight
    /// ([`Transport::input_here`] is then false); `start` and `end` keep
    /// their meaning for when it comes back.
    pub(super) input: Vec<u8>,
    pub(super) start: usize,
    pub(super) end: usize,
    /// The reply being written; `out[written..]` is still to go.
    pub(super) out: Vec<u8>,
    pub(super) written: usize,
    pub(super) state: State,
    /// The peer closed its side.
    pub(super) eof: bool,
    /// Served a request in the current balance window.
    pub(super) active: bool,
    /// The connection's login (security on only) and user agent.
    pub(super) session: citrine_service::session::Session,
}

impl Conn {
    /// A connection with `input[start..end]` received and not yet handled;
    /// `out` is an empty buffer to reuse for replies.
    pub(super) fn new(
        peer: SocketAddr,
        (input, start, end, out): (Vec<u8>, usize, usize, Vec<u8>),
        session: citrine_service::session::Session,
    ) -> Conn {
        debug_assert!(start <= end && end <= input.len());
        debug_assert!(out.is_empty());
        Conn {
            peer,
            input,
            start,
            end,
            out,
            written: 0,
            state: State::Idle,
            eof: false,
            active: true,
            session,
        }
    }

    /// Between requests: no reply left to write and no work pending, so
    /// the connection may move to another thread.
    pub(super) fn between_requests(&self) -> bool {
        matches!(self.state, State::Idle) && self.written == self.out.len() && !self.eof
    }

    /// The body of the AS_MSG frame at `input[start..]`, when the
    /// connection is between requests and holds all of it (for lookahead
    /// only: the frame is decoded and checked again when it runs).
    pub(super) fn buffered_message(&self) -> Option<&[u8]> {
        if !matches!(self.state, State::Idle) {
            return None;
        }
        let header = self.buffered_header()?.ok()?;
        if header.message_type != MessageType::Message {
            return None;
        }
        let body = self.start + PROTO_HEADER_SIZE;
        let end = body.checked_add(usize::try_from(header.size).ok()?)?;
        if end > self.end {
            return None;
        }
        self.input.get(body..end)
    }

    /// The proto header at `input[start..]`; `None` until its 8 bytes are
    /// buffered.
    fn buffered_header(&self) -> Option<Result<ProtoHeader, DecodeError>> {
        let bytes: &[u8; PROTO_HEADER_SIZE] = self
            .input
            .get(self.start..self.end)?
            .get(..PROTO_HEADER_SIZE)?
            .try_into()
            .ok()?;
        Some(ProtoHeader::decode(bytes))
    }

    /// Makes free space at `input[end..]` for the rest of a frame of
    /// `total` bytes: moves the buffered bytes to the front, else grows the
    /// buffer (at most doubling it, and not past `total` unless one more
    /// byte is needed). Afterwards `end < input.len()`, which every
    /// backend's `fill` relies on.
    fn make_room(&mut self, total: u64) {
        if self.end < self.input.len() {
            return;
        }
        if self.start > 0 {
            self.compact();
            return;
        }
        let wanted = usize::try_from(total).unwrap_or(usize::MAX);
        let grown = self
            .input
            .len()
            .saturating_mul(2)
            .min(wanted)
            .max(self.input.len() + 1);
        self.input.resize(grown, 0);
    }

    /// Appends bytes a backend received elsewhere (a multishot receive's
    /// provided buffer): moves the buffered bytes to the front when that
    /// makes room, else grows the buffer (at least doubling it).
    pub(super) fn receive(&mut self, bytes: &[u8]) {
        if self.input.len() - self.end < bytes.len() {
            self.compact();
        }
        let end = self.end + bytes.len();
        if end > self.input.len() {
            let grown = self.input.len().saturating_mul(2).max(end);
            self.input.resize(grown, 0);
        }
        self.input[self.end..end].copy_from_slice(bytes);
        self.end = end;
    }

    /// Whether the connection has room for more input: it holds less than
    /// its current frame (as far as its header is buffered) plus `ahead`
    /// bytes.
    pub(super) fn wants_input(&self, ahead: usize) -> bool {
        let frame = match self.buffered_header() {
            Some(Ok(header)) => usize::try_from(header.size)
                .unwrap_or(usize::MAX)
                .saturating_add(PROTO_HEADER_SIZE),
            _ => 0,
        };
        self.end - self.start < frame.saturating_add(ahead)
    }

    /// Moves the buffered bytes to the front of `input`.
    fn compact(&mut self) {
        if self.start > 0 {
            self.input.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }

    /// Whether `input[end..]` has room for a read.
    pub(super) fn has_room(&self) -> bool {
        self.end < self.input.len()
    }

    /// Logs a peer that hung up in the middle of a frame.
    pub(super) fn log_eof(&self) {
        if self.end > self.start {
            if let Some(note) = log_limit::CLOSED_MID_FRAME.admit() {
                tracing::warn!(peer = %self.peer, buffered = self.end - self.start, "closing connection: peer closed inside a frame{note}");
            }
        }
    }
}

/// What the service thread does with a connection after driving it.
pub(super) enum Next {
    /// Waits for I/O or a fabric wake-up.
    Wait,
    /// Has more work now, after the other ready connections.
    Again,
    Close,
    /// Fabric work was just started.
    Started,
    /// Has more work after this pause (a throttled scan), and nothing
    /// before it.
    Later(std::time::Duration),
}

/// How the state machine moves bytes: implemented by each backend, for
/// its per-connection socket state.
pub(super) trait Transport {
    type Socket;
    /// Writes (or starts writing) `out[written..]`. `Ok(true)`: all of it
    /// is written; `Ok(false)`: wait for I/O; `Err`: the connection is over.
    fn flush(&mut self, socket: &mut Self::Socket, conn: &mut Conn) -> Result<bool, ()>;
    /// Brings in more bytes after `input[..end]`. `Ok(true)`: bytes arrived
    /// now; `Ok(false)`: wait for I/O; `Err`: the connection is over.
    fn fill(&mut self, socket: &mut Self::Socket, conn: &mut Conn) -> Result<bool, ()>;
    /// Whether `input` is here to be parsed (not lent to the kernel).
    fn input_here(&self, socket: &Self::Socket) -> bool;
}

/// Runs a connection as far as it goes without waiting; what it reads
/// may have waited since `waiting_since_ms` (a stall) and was received in
/// the turn that began at `turn_began`.
pub(super) fn drive<T: Transport>(
    service: &Arc<Service>,
    (waiting_since_ms, turn_began): (Option<u64>, std::time::Instant),
    io: &mut T,
    socket: &mut T::Socket,
    conn: &mut Conn,
) -> Next {
    loop {
        // 1. The reply in progress goes out first.
        match io.flush(socket, conn) {
            Ok(true) => {}
            Ok(false) => return Next::Wait,
            Err(()) => return Next::Close,
        }
        match std::mem::replace(&mut conn.state, State::Idle) {
            State::Remote(future) => {
                conn.state = State::Remote(future);
                return Next::Wait;
            }
            State::Streaming(continuation) => {
                if !conn.out.is_empty() && conn.written == conn.out.len() {
                    // A chunk just went out: let the others run first.
                    conn.out.clear();
                    conn.written = 0;
                    conn.state = State::Streaming(continuation);
                    return Next::Again;
                }
                conn.out.clear();
                conn.written = 0;
                if let Some(pause) = service.pause_of(&continuation) {
                    // A throttled scan ahead of its rate.
                    conn.state = State::Streaming(continuation);
                    return Next::Later(pause);
                }
                if continuation.is_remote() {
                    start_remote(service, conn, continuation);
                    return Next::Started;
                }
                let resumed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    service.resume(continuation, &mut conn.out)
                }));
                match resumed {
                    Ok(Some(next)) => conn.state = State::Streaming(next),
                    Ok(None) => {}
                    Err(_) => {
                        tracing::error!(peer = %conn.peer, "streamed reply panicked; closing this connection, the node keeps serving");
                        service.report_failed_partitions();
                        return Next::Close;
                    }
                }
                continue;
            }
            State::Idle => {}
        }
        // 2. Between requests: shed grown buffers, then the next frame.
        if conn.out.capacity() > BUFFER_KEEP_BYTES {
            conn.out = Vec::with_capacity(READ_BUFFER_BYTES);
        }
        conn.out.clear();
        conn.written = 0;
        if !io.input_here(socket) {
            return Next::Wait;
        }
        match next_frame(service, conn) {
            Frame::Ready(header) => {
                if let Some(next) = handle(service, conn, header, (waiting_since_ms, turn_began)) {
                    return next;
                }
            }
            Frame::NeedBytes => match io.fill(socket, conn) {
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

fn next_frame(service: &Service, conn: &mut Conn) -> Frame {
    let buffered = conn.end - conn.start;
    let header = match conn.buffered_header() {
        None => {
            conn.make_room(PROTO_HEADER_SIZE as u64);
            return Frame::NeedBytes;
        }
        Some(Ok(header)) => header,
        Some(Err(error)) => {
            service.stats.proto_errors.fetch_add(1, Ordering::Relaxed);
            if let Some(note) = log_limit::BAD_FRAME.admit() {
                let header_bytes = &conn.input[conn.start..conn.start + PROTO_HEADER_SIZE];
                tracing::warn!(peer = %conn.peer, header = ?header_bytes, "closing connection: bad proto header: {error}{note}");
            }
            return Frame::Bad;
        }
    };
    let total = PROTO_HEADER_SIZE as u64 + header.size;
    if (buffered as u64) < total {
        conn.make_room(total);
        return Frame::NeedBytes;
    }
    Frame::Ready(header)
}

/// Runs the frame at `input[start..]` (which may have waited since
/// `waiting_since_ms`, see [`Service::handle_streaming_since`], and was
/// received in the turn that began at `turn_began`); `Some` when the
/// connection must stop here.
fn handle(
    service: &Arc<Service>,
    conn: &mut Conn,
    header: ProtoHeader,
    (waiting_since_ms, turn_began): (Option<u64>, std::time::Instant),
) -> Option<Next> {
    conn.active = true;
    let body_start = conn.start + PROTO_HEADER_SIZE;
    // Fits: `next_frame` saw the whole frame buffered.
    let body_end = body_start + header.size as usize;
    let handled = {
        let body = &conn.input[body_start..body_end];
        let out = &mut conn.out;
        let session = &mut conn.session;
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let arrival = citrine_service::Arrival {
                waiting_since_ms,
                from: Some(conn.peer),
                received: Some(turn_began),
            };
            service.handle_guarded(header, body, out, arrival, session)
        }))
    };
    conn.start = body_end;
    if conn.start == conn.end {
        conn.start = 0;
        conn.end = 0;
        if conn.input.len() > BUFFER_KEEP_BYTES {
            conn.input = vec![0; READ_BUFFER_BYTES];
        }
    }
    match handled {
        Ok(Ok(None)) => None,
        Ok(Ok(Some(continuation))) if continuation.is_remote() => {
            start_remote(service, conn, continuation);
            Some(Next::Started)
        }
        Ok(Ok(Some(continuation))) => {
            conn.state = State::Streaming(continuation);
            None
        }
        Ok(Err(close)) => {
            if let Some(note) = log_limit::BAD_FRAME.admit() {
                tracing::warn!(peer = %conn.peer, "closing connection: {}{note}", close.0);
            }
            Some(Next::Close)
        }
        Err(_) => {
            tracing::error!(peer = %conn.peer, "request handling panicked; closing this connection, the node keeps serving");
            // A change the panic cut short stops its partition (staged
            // changes leave nothing to stop): say which, now.
            service.report_failed_partitions();
            Some(Next::Close)
        }
    }
}

/// Turns fabric work into the connection's pending future. The reply
/// built so far (earlier batch rows) travels with it and comes back with
/// the rows the fabric completes appended.
fn start_remote(service: &Arc<Service>, conn: &mut Conn, continuation: Continuation) {
    let service = service.clone();
    let mut out = std::mem::take(&mut conn.out);
    conn.written = 0;
    conn.state = State::Remote(Box::pin(async move {
        let next = service.complete_remote(continuation, &mut out).await;
        (out, next)
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn() -> Conn {
        let peer = SocketAddr::from(([127, 0, 0, 1], 1));
        Conn::new(peer, (vec![0; 8], 0, 0, Vec::new()), Default::default())
    }

    #[test]
    fn received_bytes_are_appended_after_compacting_or_growing() {
        let mut conn = conn();
        conn.receive(b"abcdef");
        assert_eq!((conn.start, conn.end, conn.input.len()), (0, 6, 8));
        // Consumed bytes make room: moved to the front, not grown.
        conn.start = 4;
        conn.receive(b"ghij");
        assert_eq!(&conn.input[conn.start..conn.end], b"efghij");
        assert_eq!((conn.start, conn.input.len()), (0, 8));
        // Still no room: at least doubled.
        conn.receive(b"klmnopqrstu");
        assert_eq!(&conn.input[conn.start..conn.end], b"efghijklmnopqrstu");
        assert_eq!(conn.input.len(), 17);
        conn.receive(b"v");
        assert_eq!(conn.input.len(), 34);
        assert_eq!(&conn.input[..conn.end], b"efghijklmnopqrstuv");
    }

    #[test]
    fn input_is_wanted_up_to_the_frame_plus_the_read_ahead() {
        let mut conn = conn();
        assert!(conn.wants_input(4));
        conn.receive(b"abc");
        assert!(conn.wants_input(4));
        conn.receive(b"d");
        // No header buffered yet counts as a frame of 0 bytes.
        assert!(!conn.wants_input(4));
        // A header announcing a 20-byte body: 28 bytes plus 4 ahead.
        let mut conn = super::tests::conn();
        conn.receive(&ProtoHeader::encode(MessageType::Message, 20));
        conn.receive(&[0; 23]);
        assert!(conn.wants_input(4));
        conn.receive(&[0]);
        assert!(!conn.wants_input(4));
    }
}
