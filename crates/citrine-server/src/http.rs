//! The HTTP endpoint (`[http] port`, off by default): `GET /metrics`
//! answers every statistic of the node in Prometheus's text format
//! ([`citrine_service::prometheus`]), so Prometheus scrapes a node with no
//! exporter beside it.
//!
//! A minimal HTTP/1.1 responder on a thread of its own (`citrine-http`),
//! serving one connection at a time (a scrape every few seconds, and an
//! open console's poll every 2 s, are its load; a console state takes at
//! most [`crate::console::PEER_TIMEOUT`] a round of peer questions): it
//! reads the request head, answers, and closes the connection.
//! - `GET /metrics` (or `HEAD`) → 200, `text/plain; version=0.0.4`;
//! - `GET /console` → the web console's page, `GET /console/state.json`
//!   → the cluster as JSON ([`crate::console`]);
//! - `GET /` → 200, a line naming `/metrics` and `/console`;
//! - another path → 404; another method → 405;
//! - with security on, `/metrics` and the console → 401 with a
//!   `WWW-Authenticate: Basic` challenge unless the request carries the
//!   credentials of a user this node logs in ([`crate::console_auth`]);
//! - a head that is not an HTTP/1.x request line, or longer than
//!   [`HEAD_MAX`] → 400.
//!
//! Invariants: a client never stops the endpoint or the node — its head is
//! bounded in size ([`HEAD_MAX`]) and time ([`READ_TIMEOUT`] a read,
//! [`HEAD_DEADLINE`] in all), and a failed
//! connection is dropped and the next one accepted; the endpoint never
//! touches the service's request path (it reads statistics only).

use crate::console::Console;
use crate::console_auth::{self, AskError, Hashes, Login};
use citrine_service::Service;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

/// Longest request head read (request line and headers).
pub const HEAD_MAX: usize = 8 * 1024;
/// How long one read of the head may wait.
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a client may take to send its whole head (a client sending
/// it a byte at a time holds the endpoint no longer than this).
pub const HEAD_DEADLINE: Duration = Duration::from_secs(5);
/// How long a client may take to take the answer.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds `address:port` and serves it on the `citrine-http` thread (not
/// joined: it only reads statistics). An error names the address.
pub fn start(service: Arc<Service>, address: &str, port: u16) -> Result<(), String> {
    let listener = TcpListener::bind((address, port)).map_err(|error| {
        format!("cannot listen for HTTP on {address}:{port} ([http] port): {error}")
    })?;
    std::thread::Builder::new()
        .name("citrine-http".into())
        .spawn(move || {
            let mut console = crate::console::Console::new(service.clone());
            let mut hashes = Hashes::default();
            for stream in listener.incoming() {
                match stream {
                    Ok(stream) => serve(&service, (&mut console, &mut hashes), stream),
                    Err(error) => tracing::debug!("http accept failed: {error}"),
                }
            }
        })
        .map_err(|error| format!("cannot start the citrine-http thread: {error}"))?;
    tracing::info!("serving /metrics and /console on http://{address}:{port}");
    Ok(())
}

/// Answers one connection, then closes it.
fn serve(service: &Service, state: (&mut Console, &mut Hashes), mut stream: TcpStream) {
    let _ = stream.set_read_timeout(Some(READ_TIMEOUT));
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let deadline = std::time::Instant::now() + HEAD_DEADLINE;
    let response = match read_head(&mut stream, deadline) {
        Ok(head) => respond(service, state, &head),
        Err(Failure::Closed) => return,
        Err(Failure::Bad) => Response::text(400, "Bad Request", "bad request\n"),
    };
    if let Err(error) = response.write_to(&mut stream) {
        tracing::debug!("http answer not sent: {error}");
    }
}

/// Why no request head was read.
#[derive(Debug, PartialEq, Eq)]
enum Failure {
    /// The client went away (or sent nothing in time): nothing to answer.
    Closed,
    /// Not a request head: answered 400.
    Bad,
}

/// Reads up to the blank line ending the head (`\r\n\r\n`, or `\n\n`),
/// before `deadline`.
fn read_head(stream: &mut impl Read, deadline: std::time::Instant) -> Result<Vec<u8>, Failure> {
    let mut head = Vec::with_capacity(512);
    let mut buffer = [0u8; 1024];
    loop {
        if std::time::Instant::now() >= deadline {
            return Err(Failure::Bad);
        }
        let read = match stream.read(&mut buffer) {
            Ok(0) if head.is_empty() => return Err(Failure::Closed),
            Ok(0) => return Err(Failure::Bad),
            Ok(read) => read,
            Err(_) if head.is_empty() => return Err(Failure::Closed),
            Err(_) => return Err(Failure::Bad),
        };
        head.extend_from_slice(&buffer[..read]);
        if let Some(end) = head_end(&head) {
            head.truncate(end);
            return Ok(head);
        }
        if head.len() > HEAD_MAX {
            return Err(Failure::Bad);
        }
    }
}

/// Where the head ends (its blank line), if it does yet.
fn head_end(bytes: &[u8]) -> Option<usize> {
    let crlf = bytes.windows(4).position(|window| window == b"\r\n\r\n");
    let lf = bytes.windows(2).position(|window| window == b"\n\n");
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// An answer: status, reason, content type, body (left out for `HEAD`).
struct Response {
    status: u16,
    reason: &'static str,
    content_type: &'static str,
    body: String,
    head_only: bool,
    /// A `WWW-Authenticate` challenge (401).
    challenge: bool,
}

impl Response {
    fn text(status: u16, reason: &'static str, body: &str) -> Response {
        Response {
            status,
            reason,
            content_type: "text/plain; charset=utf-8",
            body: body.to_owned(),
            head_only: false,
            challenge: false,
        }
    }

    /// 401: who may see it, and why this request may not.
    fn denied(reason: &str) -> Response {
        Response {
            challenge: true,
            ..Response::text(401, "Unauthorized", &console_auth::denied_text(reason))
        }
    }

    fn write_to(&self, stream: &mut impl Write) -> std::io::Result<()> {
        let challenge = match self.challenge {
            true => "WWW-Authenticate: Basic realm=\"citrine\", charset=\"UTF-8\"\r\n",
            false => "",
        };
        let head = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{challenge}Connection: close\r\n\r\n",
            self.status,
            self.reason,
            self.content_type,
            self.body.len()
        );
        stream.write_all(head.as_bytes())?;
        if !self.head_only {
            stream.write_all(self.body.as_bytes())?;
        }
        stream.flush()
    }
}

/// The answer to a request head.
fn respond(
    service: &Service,
    (console, hashes): (&mut Console, &mut Hashes),
    head: &[u8],
) -> Response {
    let Some((method, path)) = request_line(head) else {
        return Response::text(400, "Bad Request", "bad request\n");
    };
    if method != "GET" && method != "HEAD" {
        return Response::text(405, "Method Not Allowed", "only GET and HEAD\n");
    }
    let path = path.split('?').next().unwrap_or_default();
    let guarded = matches!(
        path,
        "/metrics" | "/console" | "/console/" | "/console/state.json"
    );
    let login = match service.security().is_some() && guarded {
        false => None,
        true => match signed_in(console, hashes, head, path != "/console/state.json") {
            Ok(login) => Some(login),
            Err(denied) => return denied,
        },
    };
    let mut response = match path {
        "/metrics" => Response {
            content_type: "text/plain; version=0.0.4; charset=utf-8",
            ..Response::text(200, "OK", &citrine_service::prometheus::exposition(service))
        },
        "/console" | "/console/" => Response {
            content_type: "text/html; charset=utf-8",
            ..Response::text(200, "OK", crate::console::PAGE)
        },
        "/console/state.json" => match console.state_json(login.as_ref()) {
            Ok(json) => Response {
                content_type: "application/json",
                ..Response::text(200, "OK", &json)
            },
            Err(error @ AskError::Refused(_)) => Response::denied(&error.to_string()),
            Err(error) => Response::text(503, "Service Unavailable", &format!("{error}\n")),
        },
        "/" => Response::text(
            200,
            "OK",
            "citrined: statistics at /metrics, the web console at /console\n",
        ),
        _ => Response::text(404, "Not Found", "not found; statistics are at /metrics\n"),
    };
    response.head_only = method == "HEAD";
    response
}

/// The login of a request to a guarded path with security on: its basic
/// credentials, checked by a login on this node when `verify` (the
/// console's state is gathered logged in as them, which checks them);
/// else the 401 to answer.
fn signed_in(
    console: &Console,
    hashes: &mut Hashes,
    head: &[u8],
    verify: bool,
) -> Result<Login, Response> {
    let Some((user, password)) = console_auth::basic_credentials(head) else {
        return Err(Response::denied("No credentials were sent."));
    };
    let Some(login) = hashes.login(&user, &password) else {
        return Err(Response::denied("The password cannot be used."));
    };
    match verify.then(|| console.verify(&login)) {
        None | Some(Ok(())) => Ok(login),
        Some(Err(error @ AskError::Refused(_))) => Err(Response::denied(&error.to_string())),
        Some(Err(error)) => Err(Response::text(
            503,
            "Service Unavailable",
            &format!("cannot check the credentials: {error}\n"),
        )),
    }
}

/// The method and path of a request line `METHOD PATH HTTP/1.x`; `None`
/// when the first line is not one.
fn request_line(head: &[u8]) -> Option<(&str, &str)> {
    let text = std::str::from_utf8(head).ok()?;
    let line = text.lines().next()?;
    let mut parts = line.split(' ');
    let (method, path, version) = (parts.next()?, parts.next()?, parts.next()?);
    let valid = parts.next().is_none()
        && !method.is_empty()
        && method.bytes().all(|byte| byte.is_ascii_uppercase())
        && path.starts_with('/')
        && (version == "HTTP/1.1" || version == "HTTP/1.0");
    valid.then_some((method, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines_are_checked() {
        assert_eq!(
            request_line(b"GET /metrics HTTP/1.1\r\nHost: x"),
            Some(("GET", "/metrics"))
        );
        assert_eq!(request_line(b"GET /metrics"), None);
        assert_eq!(request_line(b"get /metrics HTTP/1.1"), None);
        assert_eq!(request_line(b"GET metrics HTTP/1.1"), None);
        assert_eq!(request_line(b"GET /metrics HTTP/2.0"), None);
        assert_eq!(request_line(b"\xff\xfe / HTTP/1.1"), None);
    }

    #[test]
    fn a_head_ends_at_its_blank_line_and_is_bounded() {
        let later = std::time::Instant::now() + Duration::from_secs(60);
        let mut whole: &[u8] = b"GET / HTTP/1.1\r\nHost: a\r\n\r\nrest";
        assert_eq!(
            read_head(&mut whole, later),
            Ok(b"GET / HTTP/1.1\r\nHost: a".to_vec())
        );
        let mut cut: &[u8] = b"GET / HTTP/1.1\r\nHost";
        assert_eq!(read_head(&mut cut, later), Err(Failure::Bad));
        let mut nothing: &[u8] = b"";
        assert_eq!(read_head(&mut nothing, later), Err(Failure::Closed));
        let endless = vec![b'a'; HEAD_MAX + 2048];
        assert_eq!(read_head(&mut &endless[..], later), Err(Failure::Bad));
    }

    /// A client that sends its head a byte at a time is cut off at the
    /// deadline, however short each wait.
    #[test]
    fn a_trickling_head_is_cut_off_at_the_deadline() {
        struct Trickle;
        impl Read for Trickle {
            fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
                std::thread::sleep(Duration::from_millis(5));
                buffer[0] = b'a';
                Ok(1)
            }
        }
        let started = std::time::Instant::now();
        let deadline = started + Duration::from_millis(100);
        assert_eq!(read_head(&mut Trickle, deadline), Err(Failure::Bad));
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
