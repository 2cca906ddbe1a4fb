//! One TCP connection to a node and the per-node connection pool.
//!
//! Owns the request/response exchange on a socket: write one frame, read one
//! complete answer frame (inflating type-4 answers), under a deadline. A
//! connection whose exchange failed in any way is never put back into the
//! pool (its stream may hold half an answer); [`Pooled::discard`] enforces it.
//!
//! Pool invariant: at most `limit` connections to a node exist at once (idle
//! plus in use), enforced by a semaphore whose permit travels with the
//! connection while it is in use.

use crate::error::{Error, Result};
use citrine_wire::frame::{self, MessageType, ProtoHeader, PROTO_HEADER_SIZE};
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, SemaphorePermit};

/// A connection to one node.
#[derive(Debug)]
pub struct Connection {
    stream: TcpStream,
    address: SocketAddr,
    /// Bytes read from the socket; the current frame is `buffer[..consumed]`
    /// and anything after it belongs to the next frame of a stream.
    buffer: Vec<u8>,
    consumed: usize,
    /// Inflated body of the current frame when it came compressed.
    body: Vec<u8>,
    last_used: Instant,
}

/// Runs `future` under an optional deadline.
async fn with_deadline<T>(
    deadline: Option<Instant>,
    what: &'static str,
    future: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match deadline {
        None => future.await,
        Some(deadline) => match tokio::time::timeout_at(deadline.into(), future).await {
            Ok(result) => result,
            Err(_) => Err(Error::Timeout {
                what,
                iterations: 1,
                in_doubt: false,
            }),
        },
    }
}

/// Like [`with_deadline`], for a step after which the server may have
/// acted on the request: a timeout is in doubt.
async fn with_deadline_in_doubt<T>(
    deadline: Option<Instant>,
    future: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    with_deadline(deadline, "socket", future)
        .await
        .map_err(|mut error| {
            if matches!(error, Error::Timeout { .. }) {
                error.set_in_doubt(true);
            }
            error
        })
}

/// A network error on `address`; in doubt, because it happened once the
/// request may have reached the server.
fn network_error(address: SocketAddr, stage: &str, error: std::io::Error) -> Error {
    Error::Network {
        address: address.to_string(),
        message: format!("{stage}: {error}"),
        in_doubt: true,
    }
}

/// Appends what the socket has to `buffer`; the peer closing is an error.
async fn read_more(
    stream: &mut TcpStream,
    buffer: &mut Vec<u8>,
    address: SocketAddr,
) -> Result<()> {
    match stream.read_buf(buffer).await {
        Ok(0) => Err(network_error(
            address,
            "receive",
            std::io::ErrorKind::UnexpectedEof.into(),
        )),
        Ok(_) => Ok(()),
        Err(error) => Err(network_error(address, "receive", error)),
    }
}

impl Connection {
    /// Connects, with a deadline.
    pub async fn connect(address: SocketAddr, deadline: Option<Instant>) -> Result<Connection> {
        let stream = with_deadline(deadline, "connect", async {
            TcpStream::connect(address)
                .await
                .map_err(|error| Error::Network {
                    address: address.to_string(),
                    message: format!("connect: {error}"),
                    in_doubt: false,
                })
        })
        .await?;
        let _ = stream.set_nodelay(true);
        Ok(Connection {
            stream,
            address,
            buffer: Vec::with_capacity(4096),
            consumed: 0,
            body: Vec::new(),
            last_used: Instant::now(),
        })
    }

    /// The peer address.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Sends `request` (a complete frame) and reads one complete answer
    /// frame. Returns its type and body. Errors after the first byte was
    /// written are marked in doubt (the server may have applied a write).
    /// Bytes after the answer frame are a protocol error: a single-record
    /// answer is exactly one frame.
    pub async fn exchange(
        &mut self,
        request: &[u8],
        deadline: Option<Instant>,
    ) -> Result<(MessageType, &[u8])> {
        // One deadline (one timer) for the round trip.
        let (message_type, compressed) = with_deadline_in_doubt(deadline, async {
            self.write_request(request).await?;
            self.read_frame().await
        })
        .await?;
        if self.buffer.len() > self.consumed {
            return Err(Error::Protocol {
                address: self.address.to_string(),
                message: "server sent more bytes than one answer frame".into(),
            });
        }
        Ok((message_type, self.frame_body(compressed)))
    }

    /// Sends `request` (a complete frame) and forgets any unread bytes of
    /// earlier answers. The start of a streamed command (batch, scan,
    /// query); read its answer frames with [`Connection::receive`].
    pub async fn send(&mut self, request: &[u8], deadline: Option<Instant>) -> Result<()> {
        with_deadline_in_doubt(deadline, self.write_request(request)).await
    }

    /// Reads the next complete answer frame of a streamed command. Returns
    /// its type and body (inflated when the frame was compressed).
    pub async fn receive(&mut self, deadline: Option<Instant>) -> Result<(MessageType, &[u8])> {
        let (message_type, compressed) =
            with_deadline_in_doubt(deadline, self.read_frame()).await?;
        Ok((message_type, self.frame_body(compressed)))
    }

    /// The body of the frame [`Connection::read_frame`] just read.
    fn frame_body(&self, compressed: bool) -> &[u8] {
        if compressed {
            &self.body
        } else {
            self.buffer
                .get(PROTO_HEADER_SIZE..self.consumed)
                .unwrap_or_default()
        }
    }

    /// Writes a request, first forgetting unread bytes of earlier answers.
    async fn write_request(&mut self, request: &[u8]) -> Result<()> {
        self.buffer.clear();
        self.consumed = 0;
        let address = self.address;
        self.stream
            .write_all(request)
            .await
            .map_err(|error| network_error(address, "send", error))?;
        self.last_used = Instant::now();
        Ok(())
    }

    /// Reads one frame into `buffer[..consumed]` (dropping the previous
    /// frame's bytes first, keeping whatever followed them), inflating a
    /// compressed frame into `body`. Returns the (inner) message type and
    /// whether the body is in `body` rather than in `buffer`.
    async fn read_frame(&mut self) -> Result<(MessageType, bool)> {
        let address = self.address;
        if self.consumed > 0 {
            self.buffer.drain(..self.consumed);
            self.consumed = 0;
        }
        let Connection {
            stream,
            buffer,
            body,
            consumed,
            last_used,
            ..
        } = self;
        // Read at least the header; often the whole answer comes in one read.
        while buffer.len() < PROTO_HEADER_SIZE {
            read_more(stream, buffer, address).await?;
        }
        let mut header_bytes = [0u8; PROTO_HEADER_SIZE];
        header_bytes.copy_from_slice(&buffer[..PROTO_HEADER_SIZE]);
        let header = ProtoHeader::decode(&header_bytes).map_err(|error| Error::Protocol {
            address: address.to_string(),
            message: format!("bad proto header: {error}"),
        })?;
        // PROTO_SIZE_MAX bounds the size, so this cannot overflow.
        let total = PROTO_HEADER_SIZE + header.size as usize;
        if buffer.len() < total {
            buffer.reserve(total - buffer.len());
        }
        while buffer.len() < total {
            read_more(stream, buffer, address).await?;
        }
        *consumed = total;
        *last_used = Instant::now();
        if header.message_type == MessageType::Compressed {
            let (inner, inflated) =
                frame::inflate(&buffer[PROTO_HEADER_SIZE..total]).map_err(|error| {
                    Error::Protocol {
                        address: address.to_string(),
                        message: format!("bad compressed answer: {error}"),
                    }
                })?;
            *body = inflated;
            Ok((inner.message_type, true))
        } else {
            Ok((header.message_type, false))
        }
    }

    /// Runs info commands and returns (command, value) pairs in answer order.
    pub async fn info(
        &mut self,
        commands: &[&str],
        deadline: Option<Instant>,
    ) -> Result<Vec<(String, String)>> {
        let request = citrine_wire::info::request_frame(commands);
        let address = self.address;
        let (message_type, body) =
            self.exchange(&request, deadline)
                .await
                .map_err(|mut error| {
                    error.set_in_doubt(false);
                    error
                })?;
        if message_type != MessageType::Info {
            return Err(Error::Protocol {
                address: address.to_string(),
                message: format!("info answered with type {message_type:?}"),
            });
        }
        let text = String::from_utf8_lossy(body);
        if text.starts_with("ERROR:") || text.starts_with("FAIL:") {
            let (code, message) = parse_info_error(text.trim_end());
            return Err(Error::Info {
                node: address.to_string(),
                command: commands.join(","),
                code,
                message,
            });
        }
        Ok(citrine_wire::info::parse_response(body))
    }
}

/// If `value` is an info error (`ERROR:<code>:<msg>`, `FAIL:<code>:<msg>`),
/// returns its code (1 when missing or 0) and message.
pub fn parse_info_error(value: &str) -> (u8, String) {
    let rest = value
        .strip_prefix("ERROR:")
        .or_else(|| value.strip_prefix("FAIL:"))
        .unwrap_or(value);
    let (code_text, message) = rest.split_once(':').unwrap_or((rest, ""));
    let code = code_text
        .trim()
        .parse::<u8>()
        .ok()
        .filter(|code| *code != 0)
        .unwrap_or(1);
    (code, message.to_owned())
}

/// Whether an info value is an error answer.
pub fn is_info_error(value: &str) -> bool {
    value.starts_with("ERROR:") || value.starts_with("FAIL:")
}

/// A bounded pool of connections to one address.
#[derive(Debug)]
pub struct Pool {
    address: SocketAddr,
    idle: Mutex<Vec<Connection>>,
    permits: Semaphore,
    idle_timeout: Duration,
}

/// A connection checked out of a [`Pool`]; returns itself on drop unless discarded.
#[derive(Debug)]
pub struct Pooled<'a> {
    connection: Option<Connection>,
    pool: &'a Pool,
    _permit: SemaphorePermit<'a>,
}

impl Pool {
    pub fn new(address: SocketAddr, limit: usize, idle_timeout: Duration) -> Pool {
        Pool {
            address,
            idle: Mutex::new(Vec::new()),
            permits: Semaphore::new(limit.max(1)),
            idle_timeout,
        }
    }

    /// Checks out an idle connection or opens a new one, waiting for a free
    /// slot until `deadline`.
    pub async fn get(&self, deadline: Option<Instant>) -> Result<Pooled<'_>> {
        let acquire = async { self.permits.acquire().await.map_err(|_| Error::Closed) };
        let permit = with_deadline(deadline, "waiting for a pooled connection", acquire).await?;
        let reused = {
            let mut idle = self.idle.lock();
            let mut found = None;
            while let Some(connection) = idle.pop() {
                if connection.last_used.elapsed() < self.idle_timeout {
                    found = Some(connection);
                    break;
                }
            }
            found
        };
        let connection = match reused {
            Some(connection) => connection,
            None => Connection::connect(self.address, deadline).await?,
        };
        Ok(Pooled {
            connection: Some(connection),
            pool: self,
            _permit: permit,
        })
    }

    /// Hands a connection opened elsewhere (validation) to the pool.
    pub fn put_idle(&self, connection: Connection) {
        self.idle.lock().push(connection);
    }

    /// Closes every idle connection (after a network error: they are likely dead too).
    pub fn clear_idle(&self) {
        self.idle.lock().clear();
    }

    /// Refuses further checkouts and drops idle connections.
    pub fn close(&self) {
        self.permits.close();
        self.clear_idle();
    }

    /// Number of idle connections.
    pub fn idle_count(&self) -> usize {
        self.idle.lock().len()
    }
}

impl Pooled<'_> {
    /// The connection (always present until dropped or discarded).
    pub fn connection(&mut self) -> Option<&mut Connection> {
        self.connection.as_mut()
    }

    /// Returns the connection to the pool. Call it only when the socket is
    /// at a message boundary: the whole answer (a stream's LAST message
    /// included) has been read and nothing more is coming.
    pub fn release(mut self) {
        if let Some(connection) = self.connection.take() {
            self.pool.idle.lock().push(connection);
        }
    }

    /// Closes the connection instead of returning it to the pool (what
    /// dropping it does too).
    pub fn discard(mut self) {
        self.connection = None;
    }
}

/// Dropping a checked-out connection closes it: a command cancelled while
/// it waited for its answer (a dropped stream, a timeout around the call)
/// leaves the server's answer in flight, and the next command on that
/// socket would read it as its own.
impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        self.connection = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_errors() {
        assert_eq!(
            parse_info_error("ERROR:4:unrecognized command"),
            (4, "unrecognized command".into())
        );
        assert_eq!(parse_info_error("ERROR::boom"), (1, "boom".into()));
        assert_eq!(parse_info_error("FAIL:200:exists"), (200, "exists".into()));
        assert_eq!(parse_info_error("ERROR:0:x"), (1, "x".into()));
        assert!(is_info_error("ERROR:25:enterprise only"));
        assert!(!is_info_error("ok"));
    }

    #[tokio::test]
    async fn pool_limits_and_reuses() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let accepted = tokio::spawn(async move {
            let mut streams = Vec::new();
            for _ in 0..2 {
                if let Ok((stream, _)) = listener.accept().await {
                    streams.push(stream);
                }
            }
            streams
        });
        let pool = Pool::new(address, 2, Duration::from_secs(60));
        let first = pool.get(None).await.expect("first");
        let second = pool.get(None).await.expect("second");
        let soon = Some(Instant::now() + Duration::from_millis(50));
        assert!(
            matches!(pool.get(soon).await, Err(Error::Timeout { .. })),
            "third must wait for a slot"
        );
        first.release();
        assert_eq!(pool.idle_count(), 1);
        let again = pool.get(None).await.expect("reused");
        assert_eq!(pool.idle_count(), 0);
        again.discard();
        drop(second);
        assert_eq!(pool.idle_count(), 0, "dropped connections are closed");
        let streams = accepted.await.expect("join");
        assert_eq!(streams.len(), 2, "only two sockets were ever opened");
    }
}
