//! Connections that never log in, against a real citrined with access
//! control on: each request is answered 80 and the connection stays open
//! (as the reference keeps it), until `login-timeout-ms` after it opened,
//! when the node closes it, whether it kept sending or sent nothing; a
//! logged-in connection opened at the same time keeps being served.

#![allow(clippy::unwrap_used)]

mod common;

use citrine_client::admin::{hash_password, request};
use citrine_wire::admin::{command, field};
use common::{connect, info, round_trip, start, statistic, write_request};
use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, Instant};

const TIMEOUT_MS: u64 = 700;

fn config() -> String {
    format!("[security]\nlogin-timeout-ms = {TIMEOUT_MS}\n[[namespace]]\nname = \"test\"\n")
}

fn login(stream: &mut TcpStream) -> u8 {
    let credential = hash_password("admin").unwrap();
    let frame = request(
        command::LOGIN,
        &[(field::USER, b"admin"), (field::CREDENTIAL, &credential)],
    );
    round_trip(stream, &frame).unwrap().1[1]
}

/// Whether the node closed `stream` (a read sees the end) before `limit`.
fn closed_within(stream: &mut TcpStream, limit: Duration) -> bool {
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let deadline = Instant::now() + limit;
    let mut byte = [0u8; 1];
    while Instant::now() < deadline {
        match stream.read(&mut byte) {
            Ok(0) => return true,
            Ok(_) => panic!("unexpected bytes from the node"),
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => {}
        }
    }
    false
}

#[test]
fn a_connection_that_never_logs_in_is_closed_after_the_login_timeout() {
    let directory = std::env::temp_dir().join(format!(
        "citrine-login-timeout-{}-{}",
        std::process::id(),
        common::free_port()
    ));
    std::fs::create_dir_all(&directory).unwrap();
    let path = directory.join("citrine.toml");
    std::fs::write(&path, config()).unwrap();
    let server = start(&[
        "--config",
        path.to_str().unwrap(),
        "--data-dir",
        directory.to_str().unwrap(),
    ]);
    let opened = Instant::now();
    let mut busy = connect(server.port);
    let mut silent = connect(server.port);
    let mut client = connect(server.port);
    assert_eq!(login(&mut client), 0);

    // Not logged in: 80 for a write and for an info request, and the
    // connection is still there to answer the next one.
    let write = write_request("test", "k", &[(2, 3, "b", b"v".to_vec())]);
    let (_, body) = round_trip(&mut busy, &write).unwrap();
    assert_eq!(body[5], 80);
    let answer = info(&mut busy, &["build"]);
    assert!(format!("{answer:?}").contains("ERROR:80"), "{answer:?}");
    let (_, body) = round_trip(&mut busy, &write).unwrap();
    assert_eq!(body[5], 80);
    assert!(opened.elapsed() < Duration::from_millis(TIMEOUT_MS));

    // One that keeps sending is closed at the timeout, not before.
    let limit = Duration::from_millis(TIMEOUT_MS + 3_000);
    while let Ok((_, body)) = round_trip(&mut busy, &write) {
        assert_eq!(body[5], 80);
        assert!(opened.elapsed() < limit, "still open after {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(opened.elapsed() >= Duration::from_millis(TIMEOUT_MS));
    // So is one that sent nothing.
    assert!(closed_within(&mut silent, limit), "a silent connection");

    // The logged-in one opened with them is still served.
    let (_, body) = round_trip(&mut client, &write).unwrap();
    assert_eq!(body[5], 0);
    assert!(statistic(&mut client, "reaped_fds") >= 2);
    drop(server);
    let _ = std::fs::remove_dir_all(&directory);
}
