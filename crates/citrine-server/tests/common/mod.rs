//! Test support: start real `citrined` processes and talk to them over real
//! sockets with the wire codec.

#![allow(dead_code, clippy::unwrap_used)]

pub mod cluster;
pub mod netns;
pub mod stream;
pub mod tls;
pub mod xdr;

use citrine_wire::digest::{of_key, UserKey};
use citrine_wire::frame::{ProtoHeader, PROTO_HEADER_SIZE};
use citrine_wire::msg::{field_type, Message, MessageWriter, MsgHeader};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running citrined, killed on drop.
pub struct Server {
    pub child: Child,
    pub port: u16,
}

impl Server {
    /// SIGTERM, then waits up to `within` for the exit; its status.
    pub fn terminate(&mut self, within: Duration) -> std::process::ExitStatus {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -TERM failed");
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "citrined did not stop within {within:?} of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Freezes (SIGSTOP, `stop`) or thaws (SIGCONT) process `pid`. A stop
/// returns only once every thread of the process is stopped: `kill`
/// returning means the signal was sent, not that it took effect, and on a
/// loaded machine a thread of the process may run on for a while and serve
/// what a test sends "to a stopped node".
pub fn freeze_process(pid: u32, stop: bool) {
    let signal = if stop { "-STOP" } else { "-CONT" };
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {pid}");
    if !stop {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !every_thread_stopped(pid) {
        assert!(Instant::now() < deadline, "{pid} did not stop within 10 s");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// True when every thread of `pid` is in the stopped state (`T` in its
/// `/proc/PID/task/TID/stat`).
fn every_thread_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
            // The state follows the command name's closing parenthesis.
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|state| state == "T")
        })
    })
}

/// A free loopback port.
pub use citrine_testsupport::{free_port, wait_until_serving};

/// The `citrined` under test: this build's, or `$CITRINED_BIN` (e.g. a
/// release build, for timings).
pub fn binary() -> &'static str {
    static BINARY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BINARY.get_or_init(|| {
        std::env::var("CITRINED_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_citrined").to_owned())
    })
}

/// The `--service-io` the listener tests run with besides `epoll`:
/// `io_uring` where the test run requires it (`CITRINE_REQUIRE_IO_URING=1`,
/// as `scripts/test.sh` sets), else `auto`.
pub fn io_uring_or_auto() -> &'static str {
    if std::env::var("CITRINE_REQUIRE_IO_URING").as_deref() == Ok("1") {
        "io_uring"
    } else {
        "auto"
    }
}

/// Starts citrined with `args` plus `--port`, waiting until it answers.
pub fn start(args: &[&str]) -> Server {
    let port = free_port();
    let port_text = port.to_string();
    let (fabric, heartbeat) = (free_port().to_string(), free_port().to_string());
    let mut all: Vec<&str> = args.to_vec();
    all.extend([
        "--port",
        &port_text,
        "--fabric-port",
        &fabric,
        "--heartbeat-port",
        &heartbeat,
    ]);
    let child = Command::new(binary())
        .args(&all)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut server = Server { child, port };
    wait_until_serving(&mut server.child, port, Duration::from_secs(20));
    server
}

pub fn connect(port: u16) -> TcpStream {
    let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.set_nodelay(true).unwrap();
    stream
}

/// Sends a frame and reads one reply frame (header and body).
pub fn round_trip(stream: &mut TcpStream, frame: &[u8]) -> std::io::Result<(ProtoHeader, Vec<u8>)> {
    stream.write_all(frame)?;
    read_frame(stream)
}

pub fn read_frame(stream: &mut TcpStream) -> std::io::Result<(ProtoHeader, Vec<u8>)> {
    let mut header_bytes = [0u8; PROTO_HEADER_SIZE];
    stream.read_exact(&mut header_bytes)?;
    let header = ProtoHeader::decode(&header_bytes)
        .map_err(|error| std::io::Error::other(error.to_string()))?;
    let mut body = vec![0u8; header.size as usize];
    stream.read_exact(&mut body)?;
    Ok((header, body))
}

/// Info request → (line, value) pairs.
pub fn info(stream: &mut TcpStream, commands: &[&str]) -> Vec<(String, String)> {
    let (_, body) = round_trip(stream, &citrine_wire::info::request_frame(commands)).unwrap();
    citrine_wire::info::parse_response(&body)
}

/// One counter of the node's `statistics` answer.
pub fn statistic(stream: &mut TcpStream, name: &str) -> u64 {
    let stats = info(stream, &["statistics"]);
    let prefix = format!("{name}=");
    let value = stats[0]
        .1
        .split(';')
        .find_map(|pair| pair.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no statistic {name}"));
    value.parse().unwrap_or_else(|_| panic!("{name}={value}"))
}

/// Builds a single-record request on namespace `namespace`, set "demo".
pub fn record_request(
    namespace: &str,
    key: &str,
    header: MsgHeader,
    ops: &[(u8, u8, &str, Vec<u8>)],
) -> Vec<u8> {
    let digest = of_key("demo", &UserKey::String(key.into()));
    let mut out = Vec::new();
    let mut writer = MessageWriter::begin(&mut out, &header);
    writer
        .field(field_type::NAMESPACE, namespace.as_bytes())
        .field(field_type::SET, b"demo")
        .field(field_type::DIGEST, &digest.0);
    for (op, particle, name, value) in ops {
        writer.op(*op, *particle, name.as_bytes(), value);
    }
    writer.finish();
    out
}

/// A read of every bin of `key` (set "demo").
pub fn get_all_request(namespace: &str, key: &str) -> Vec<u8> {
    record_request(
        namespace,
        key,
        MsgHeader {
            info1: citrine_wire::msg::info1::READ | citrine_wire::msg::info1::GET_ALL,
            ..MsgHeader::default()
        },
        &[],
    )
}

/// A write of `ops` to `key` (set "demo").
pub fn write_request(namespace: &str, key: &str, ops: &[(u8, u8, &str, Vec<u8>)]) -> Vec<u8> {
    record_request(
        namespace,
        key,
        MsgHeader {
            info2: citrine_wire::msg::info2::WRITE,
            ..MsgHeader::default()
        },
        ops,
    )
}

/// A reply bin: name, particle type, value.
pub type ReplyBin = (Vec<u8>, u8, Vec<u8>);

/// The reply's header and its bins.
pub fn decode_reply(body: &[u8]) -> (MsgHeader, Vec<ReplyBin>) {
    let message = Message::decode(body).unwrap();
    (
        message.header,
        message
            .ops()
            .map(|op| (op.name.to_vec(), op.particle_type, op.value.to_vec()))
            .collect(),
    )
}

pub fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .parent()
        .unwrap()
}
