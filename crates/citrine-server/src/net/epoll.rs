//! The epoll backend of a service thread (mio), for kernels where io_uring
//! is unavailable or disabled (`service-io = "epoll"`).
//!
//! Per request it does one `recvfrom`, one `sendto` and a share of one
//! `epoll_wait`: sockets are registered once, edge-triggered, for reading
//! and writing; a read shorter than the free buffer means the socket is
//! drained (the next data raises a new edge), so no read is spent learning
//! `EAGAIN`. The exception is a peer that has hung up: its last bytes and
//! its end of stream can arrive under one edge, and no edge follows, so
//! once the event says the read side is closed the socket is read until a
//! read returns 0.
//!
//! Invariant: a socket is registered with this thread's poll exactly while
//! the thread holds its connection; nothing is ever in flight between
//! calls, so every connection is always quiet and free to move.

use super::conn::{Conn, Transport};
use super::service_thread::{Backend, Connection};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use std::io::{self, ErrorKind, Read, Write};
use std::time::Duration;

/// The token of the thread's waker (arrivals, fabric completions, stop).
pub(super) const WAKE_TOKEN: Token = Token(usize::MAX);

pub(super) struct Epoll {
    poll: Poll,
    events: Events,
}

impl Epoll {
    /// A poll and the waker other threads use to wake it.
    pub(super) fn new() -> io::Result<(Epoll, mio::Waker)> {
        let poll = Poll::new()?;
        let waker = mio::Waker::new(poll.registry(), WAKE_TOKEN)?;
        Ok((
            Epoll {
                poll,
                events: Events::with_capacity(1024),
            },
            waker,
        ))
    }
}

pub(super) struct EpollSocket {
    stream: TcpStream,
    /// The socket may have unread bytes (an edge arrived and no short read
    /// or `EAGAIN` has been seen since).
    readable: bool,
    /// The peer closed its side (or the socket failed): read until 0.
    hung_up: bool,
}

impl Backend for Epoll {
    fn attach(&mut self, token: usize, stream: std::net::TcpStream) -> io::Result<EpollSocket> {
        stream.set_nonblocking(true)?;
        let mut stream = TcpStream::from_std(stream);
        self.poll.registry().register(
            &mut stream,
            Token(token),
            Interest::READABLE | Interest::WRITABLE,
        )?;
        Ok(EpollSocket {
            stream,
            readable: true,
            hung_up: false,
        })
    }

    fn detach(&mut self, mut socket: EpollSocket) -> io::Result<std::net::TcpStream> {
        self.poll.registry().deregister(&mut socket.stream)?;
        Ok(socket.stream.into())
    }

    fn release(&mut self, mut socket: EpollSocket) {
        let _ = self.poll.registry().deregister(&mut socket.stream);
    }

    fn quiesce(&mut self, _socket: &mut EpollSocket) {}

    fn quiet(&self, _socket: &EpollSocket) -> bool {
        true
    }

    fn wait(
        &mut self,
        timeout: Duration,
        connections: &mut [Option<Connection<EpollSocket>>],
        ready: &mut Vec<usize>,
    ) -> io::Result<bool> {
        match self.poll.poll(&mut self.events, Some(timeout)) {
            Ok(()) => {}
            Err(error) if error.kind() == ErrorKind::Interrupted => return Ok(false),
            Err(error) => return Err(error),
        }
        let mut woken = false;
        for event in self.events.iter() {
            if event.token() == WAKE_TOKEN {
                woken = true;
                continue;
            }
            let token = event.token().0;
            if let Some(Some(connection)) = connections.get_mut(token) {
                let socket = &mut connection.socket;
                if event.is_read_closed() || event.is_error() {
                    socket.hung_up = true;
                }
                if event.is_readable() || socket.hung_up {
                    socket.readable = true;
                }
                ready.push(token);
            }
        }
        Ok(woken)
    }
}

impl Transport for Epoll {
    type Socket = EpollSocket;

    fn flush(&mut self, socket: &mut EpollSocket, conn: &mut Conn) -> Result<bool, ()> {
        while conn.written < conn.out.len() {
            match socket.stream.write(&conn.out[conn.written..]) {
                Ok(0) => return Err(()),
                Ok(written) => conn.written += written,
                Err(error) if error.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(error) if error.kind() == ErrorKind::Interrupted => {}
                Err(error) => {
                    tracing::debug!(peer = %conn.peer, "connection write error: {error}");
                    return Err(());
                }
            }
        }
        Ok(true)
    }

    fn fill(&mut self, socket: &mut EpollSocket, conn: &mut Conn) -> Result<bool, ()> {
        if conn.eof {
            conn.log_eof();
            return Err(());
        }
        if !socket.readable {
            return Ok(false);
        }
        debug_assert!(conn.has_room(), "next_frame makes room before a fill");
        loop {
            let free = conn.input.len() - conn.end;
            match socket.stream.read(&mut conn.input[conn.end..]) {
                Ok(0) => {
                    conn.eof = true;
                    socket.readable = false;
                    conn.log_eof();
                    return Err(());
                }
                Ok(read) => {
                    conn.end += read;
                    if read < free && !socket.hung_up {
                        socket.readable = false;
                    }
                    return Ok(true);
                }
                Err(error) if error.kind() == ErrorKind::WouldBlock => {
                    socket.readable = false;
                    return Ok(false);
                }
                Err(error) if error.kind() == ErrorKind::Interrupted => {}
                Err(error) => {
                    tracing::debug!(peer = %conn.peer, "connection read error: {error}");
                    return Err(());
                }
            }
        }
    }

    fn input_here(&self, _socket: &EpollSocket) -> bool {
        true
    }
}
