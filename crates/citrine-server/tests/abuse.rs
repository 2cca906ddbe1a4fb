//! Abuse a node must withstand, over real `citrined` processes: connections
//! that stall inside a frame or between requests are closed after
//! `proto-fd-idle-ms` (the service keeps serving others), the setting
//! changes at run time, and a burst of bad connections writes a handful of
//! log lines, not one per connection.

#![allow(clippy::unwrap_used)]

mod common;

use citrine_wire::frame::{MessageType, ProtoHeader};
use citrine_wire::msg::{field_type, info1, info2, info3, op_type, MessageWriter, MsgHeader};
use common::stream::read_stream;
use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A directory of this test's own.
fn tempdir() -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "citrine-abuse-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&path).unwrap();
    path
}

/// Starts citrined with these `[service]` lines, namespace `test`,
/// `--service-io service_io`, its log (stderr) going to `log`.
fn start_logging_to(service: &str, service_io: &str, log: &std::path::Path) -> Server {
    let directory = tempdir();
    let config = directory.join("citrine.toml");
    std::fs::write(
        &config,
        format!("[service]\n{service}\n\n[[namespace]]\nname = \"test\"\n"),
    )
    .unwrap();
    let port = free_port();
    let ports: Vec<String> = [port, free_port(), free_port()]
        .iter()
        .map(u16::to_string)
        .collect();
    let child = Command::new(binary())
        .args(["--config", config.to_str().unwrap()])
        .args(["--service-io", service_io, "--log-level", "info"])
        .args(["--port", &ports[0]])
        .args(["--fabric-port", &ports[1], "--heartbeat-port", &ports[2]])
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let mut server = Server { child, port };
    wait_until_serving(&mut server.child, port, Duration::from_secs(20));
    let _ = std::fs::remove_dir_all(&directory);
    server
}

/// The directory of a server's log, removed when the test is done.
struct LogDir(PathBuf);

impl LogDir {
    fn log(&self) -> PathBuf {
        self.0.join("citrined.log")
    }
}

impl Drop for LogDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn start_with(service: &str, service_io: &str) -> (Server, LogDir) {
    let directory = LogDir(tempdir());
    let server = start_logging_to(service, service_io, &directory.log());
    (server, directory)
}

/// Waits for the server to close `stream` (a read returns 0) and how long
/// that took; panics if it is still open after `within` or sends bytes.
fn closed_within(stream: &mut TcpStream, within: Duration) -> Duration {
    let began = Instant::now();
    stream.set_read_timeout(Some(within)).unwrap();
    let mut buffer = [0u8; 64];
    match stream.read(&mut buffer) {
        Ok(0) => began.elapsed(),
        Ok(read) => panic!("{read} unexpected bytes"),
        // A reset also means the server let go of it.
        Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => began.elapsed(),
        Err(error) => panic!("still open after {:?}: {error}", began.elapsed()),
    }
}

/// Half of a proto header.
const HALF_HEADER: [u8; 4] = [2, 3, 0, 0];

/// A header announcing 100 bytes, and 10 of them.
fn part_of_a_body() -> Vec<u8> {
    let mut frame = ProtoHeader::encode(MessageType::Message, 100).to_vec();
    frame.extend_from_slice(&[0; 10]);
    frame
}

#[test]
fn stalled_connections_are_closed_after_proto_fd_idle_ms() {
    stalled_connections_are_closed_with(io_uring_or_auto());
}

#[test]
fn stalled_connections_are_closed_after_proto_fd_idle_ms_on_epoll() {
    stalled_connections_are_closed_with("epoll");
}

fn stalled_connections_are_closed_with(service_io: &str) {
    let (server, _log) = start_with("proto-fd-idle-ms = 500\nservice-threads = 2", service_io);
    let mut stalled: Vec<TcpStream> = (0..50)
        .map(|index| {
            let mut stream = connect(server.port);
            if index % 2 == 0 {
                stream.write_all(&HALF_HEADER).unwrap();
            } else {
                stream.write_all(&part_of_a_body()).unwrap();
            }
            stream
        })
        .collect();
    // Idle between requests, after one answered request.
    let mut idle = connect(server.port);
    assert_eq!(info(&mut idle, &["status"])[0].1, "ok");
    stalled.push(idle);
    let sent = Instant::now();
    // A client that keeps asking is never idle that long.
    let mut busy = connect(server.port);
    while sent.elapsed() < Duration::from_millis(1_200) {
        assert_eq!(info(&mut busy, &["status"])[0].1, "ok");
        std::thread::sleep(Duration::from_millis(100));
    }
    for stream in &mut stalled {
        closed_within(stream, Duration::from_secs(3));
    }
    let all_closed = sent.elapsed();
    // Idle 500 ms, swept every 125 ms: closed well within 3 s.
    assert!(all_closed < Duration::from_secs(3), "{all_closed:?}");
    assert_eq!(
        info(&mut busy, &["status"])[0].1,
        "ok",
        "the busy client kept"
    );
    let mut fresh = connect(server.port);
    assert_eq!(info(&mut fresh, &["status"])[0].1, "ok");
    assert_eq!(statistic(&mut fresh, "reaped_fds"), 51);
    assert_eq!(statistic(&mut fresh, "client_connections"), 2);
    assert!(statistic(&mut fresh, "client_connections_closed") >= 51);
}

#[test]
fn proto_fd_idle_ms_changes_at_run_time() {
    let (server, _log) = start_with("", io_uring_or_auto());
    let mut admin = connect(server.port);
    let config = |admin: &mut TcpStream| info(admin, &["get-config:context=service"])[0].1.clone();
    assert!(config(&mut admin).contains("proto-fd-idle-ms=0;"));
    assert!(config(&mut admin).contains("proto-fd-max=15000;"));
    let set = |admin: &mut TcpStream, value: &str| {
        let command = format!("set-config:context=service;proto-fd-idle-ms={value}");
        info(admin, &[&command])[0].1.clone()
    };
    // 0 (the default): idle between requests forever; stalled inside a
    // frame, a minute at most (not within these 1.5 s).
    let mut idle = connect(server.port);
    assert_eq!(info(&mut idle, &["status"])[0].1, "ok");
    let mut stalled = connect(server.port);
    stalled.write_all(&HALF_HEADER).unwrap();
    std::thread::sleep(Duration::from_millis(1_500));
    for stream in [&mut idle, &mut stalled] {
        stream.set_nonblocking(true).unwrap();
        let mut buffer = [0u8; 8];
        let error = stream.read(&mut buffer).expect_err("still open");
        assert_eq!(error.kind(), std::io::ErrorKind::WouldBlock, "{error}");
        stream.set_nonblocking(false).unwrap();
    }
    // 300 ms: both closed soon after (idle for 1.5 s already).
    assert_eq!(set(&mut admin, "300"), "ok");
    assert!(config(&mut admin).contains("proto-fd-idle-ms=300;"));
    closed_within(&mut stalled, Duration::from_secs(2));
    closed_within(&mut idle, Duration::from_secs(1));
    // The admin connection has been idle too.
    closed_within(&mut admin, Duration::from_secs(1));
    let mut admin = connect(server.port);
    assert_eq!(
        set(&mut admin, "-1"),
        "ERROR:4:proto-fd-idle-ms must be a non-negative integer"
    );
    assert_eq!(info(&mut admin, &["status"])[0].1, "ok");
}

#[test]
fn a_burst_of_bad_connections_writes_a_few_log_lines() {
    let (server, log_dir) = start_with("", io_uring_or_auto());
    for _ in 0..200 {
        let mut bad = connect(server.port);
        bad.write_all(&[9, 3, 0, 0, 0, 0, 0, 4, 1, 2, 3, 4])
            .unwrap();
        closed_within(&mut bad, Duration::from_secs(5));
    }
    let mut healthy = connect(server.port);
    assert_eq!(info(&mut healthy, &["status"])[0].1, "ok");
    assert_eq!(statistic(&mut healthy, "proto_errors"), 200);
    let text = std::fs::read_to_string(log_dir.log()).unwrap();
    let lines = text
        .lines()
        .filter(|line| line.contains("bad proto header"))
        .count();
    // The first few of the 10 s window; the other 195 are counted.
    assert_eq!(lines, 5, "{text}");
}

#[test]
fn connections_over_proto_fd_max_are_refused_and_counted() {
    let (server, _log) = start_with("proto-fd-max = 10", io_uring_or_auto());
    let mut admin = connect(server.port);
    assert!(info(&mut admin, &["get-config:context=service"])[0]
        .1
        .contains("proto-fd-max=10;"));
    let mut held: Vec<TcpStream> = (0..9).map(|_| connect(server.port)).collect();
    for stream in &mut held {
        assert_eq!(info(stream, &["status"])[0].1, "ok");
    }
    // Ten are open: the next three are closed at accept.
    for _ in 0..3 {
        let mut over = connect(server.port);
        closed_within(&mut over, Duration::from_secs(2));
    }
    assert_eq!(statistic(&mut admin, "proto_fd_max_refused"), 3);
    assert_eq!(statistic(&mut admin, "client_connections"), 10);
    // One closes: one more is served.
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(2);
    while statistic(&mut admin, "client_connections") > 9 {
        assert!(
            Instant::now() < deadline,
            "the closed connection still counts"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut next = connect(server.port);
    assert_eq!(info(&mut next, &["status"])[0].1, "ok");
}

/// A partition scan of namespace `test`, set `demo`, at `rate` records a
/// second.
fn throttled_scan(rate: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let header = MsgHeader {
        info1: info1::READ,
        info3: info3::PARTITION_DONE,
        ..MsgHeader::default()
    };
    let mut writer = MessageWriter::begin(&mut out, &header);
    writer
        .field(field_type::NAMESPACE, b"test")
        .field(field_type::SET, b"demo")
        .field(field_type::TASK_ID, &7u64.to_be_bytes())
        .field(field_type::RECORDS_PER_SECOND, &rate.to_be_bytes());
    writer.finish();
    out
}

/// A scan throttled to 2 records a second pauses 500 ms between records,
/// longer than proto-fd-idle-ms: its connection waits for the server, not
/// for its client, and is not closed.
#[test]
fn a_throttled_scan_slower_than_proto_fd_idle_ms_is_not_closed() {
    let (server, _log) = start_with(
        "proto-fd-idle-ms = 200\nservice-threads = 1",
        io_uring_or_auto(),
    );
    let mut writer = connect(server.port);
    for key in 0..4 {
        let frame = record_request(
            "test",
            &format!("slow{key}"),
            MsgHeader {
                info2: info2::WRITE,
                ..MsgHeader::default()
            },
            &[(op_type::WRITE, 4, "b", vec![1; 10])],
        );
        let (_, body) = round_trip(&mut writer, &frame).unwrap();
        assert_eq!(decode_reply(&body).0.result_code, 0);
    }
    let mut scanner = connect(server.port);
    let started = Instant::now();
    scanner.write_all(&throttled_scan(2)).unwrap();
    let (messages, _) = read_stream(&mut scanner);
    assert_eq!(messages.len(), 5, "every record and the LAST message");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(1_400), "{took:?}");
    let mut fresh = connect(server.port);
    assert_eq!(statistic(&mut fresh, "reaped_fds"), 1, "only the writer");
}

/// A client that asks for a scan of 10 MB and reads none of it stalls the
/// stream: closed after proto-fd-idle-ms like any idle connection.
#[test]
fn a_client_that_does_not_read_its_scan_is_closed() {
    a_client_that_does_not_read_its_scan_is_closed_with(io_uring_or_auto());
}

#[test]
fn a_client_that_does_not_read_its_scan_is_closed_on_epoll() {
    a_client_that_does_not_read_its_scan_is_closed_with("epoll");
}

fn a_client_that_does_not_read_its_scan_is_closed_with(service_io: &str) {
    let (server, _log) = start_with("proto-fd-idle-ms = 300", service_io);
    let mut writer = connect(server.port);
    for key in 0..100 {
        let frame = record_request(
            "test",
            &format!("big{key}"),
            MsgHeader {
                info2: info2::WRITE,
                ..MsgHeader::default()
            },
            &[(op_type::WRITE, 4, "b", vec![7; 100 * 1024])],
        );
        let (_, body) = round_trip(&mut writer, &frame).unwrap();
        assert_eq!(decode_reply(&body).0.result_code, 0);
    }
    let mut scanner = connect(server.port);
    scanner.write_all(&throttled_scan(1_000_000)).unwrap();
    let mut fresh = connect(server.port);
    let deadline = Instant::now() + Duration::from_secs(3);
    // The writer (idle) and the scanner (not reading) are closed.
    while statistic(&mut fresh, "reaped_fds") < 2 {
        assert!(Instant::now() < deadline, "the stalled scan is still open");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(statistic(&mut fresh, "client_connections"), 1);
}
