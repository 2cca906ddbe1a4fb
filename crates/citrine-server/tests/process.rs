//! Integration tests over real `citrined` processes and real sockets.

#![allow(clippy::unwrap_used)]

mod common;

use citrine_types::ResultCode;
use citrine_wire::frame::{MessageType, ProtoHeader};
use citrine_wire::msg::{info1, op_type, MsgHeader};
use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn embedded_default_serves_test_and_bar() {
    let server = start(&[]);
    let mut stream = connect(server.port);
    let answers = info(
        &mut stream,
        &["namespaces", "build", "partitions", "cluster-name"],
    );
    assert_eq!(answers[0].1, "test;bar");
    assert_eq!(answers[1].1, "8.1.2.0");
    assert_eq!(answers[2].1, "4096");
    assert_eq!(answers[3].1, "citrine");
    let put = write_request("bar", "k", &[(op_type::WRITE, 3, "s", b"v".to_vec())]);
    let (_, body) = round_trip(&mut stream, &put).unwrap();
    assert_eq!(decode_reply(&body).0.result_code, 0);
}

/// `--noop` (the benchmark ceiling): info answers as usual, every data
/// request gets a success, and nothing is stored.
#[test]
fn noop_mode_answers_success_and_stores_nothing() {
    let server = start(&["--noop"]);
    let mut stream = connect(server.port);
    let answers = info(&mut stream, &["namespaces", "partitions"]);
    assert_eq!(answers[0].1, "test;bar");
    assert_eq!(answers[1].1, "4096");
    let put = write_request(
        "test",
        "k",
        &[(op_type::WRITE, 1, "n", 5i64.to_be_bytes().to_vec())],
    );
    for _ in 0..3 {
        let (_, body) = round_trip(&mut stream, &put).unwrap();
        let (header, bins) = decode_reply(&body);
        assert_eq!(header.result_code, 0);
        assert_eq!(
            header.generation, 1,
            "no-op writes do not count generations"
        );
        assert!(bins.is_empty());
    }
    let (_, body) = round_trip(&mut stream, &get_all_request("test", "k")).unwrap();
    let (header, bins) = decode_reply(&body);
    assert_eq!(header.result_code, 0);
    assert!(
        bins.is_empty(),
        "nothing was stored, so a read returns no bins"
    );
    // A scan (no digest) gets an empty stream: its LAST message at once.
    let scan = {
        let mut out = Vec::new();
        let header = MsgHeader {
            info1: info1::READ,
            ..MsgHeader::default()
        };
        let mut writer = citrine_wire::msg::MessageWriter::begin(&mut out, &header);
        writer.field(citrine_wire::msg::field_type::NAMESPACE, b"test");
        writer.finish();
        out
    };
    let (_, body) = round_trip(&mut stream, &scan).unwrap();
    let (header, bins) = decode_reply(&body);
    assert_eq!(header.result_code, 0);
    assert_ne!(header.info3 & citrine_wire::msg::info3::LAST, 0);
    assert!(bins.is_empty());
    // Without --noop, the same write is kept and read back.
    drop(stream);
    drop(server);
    let server = start(&[]);
    let mut stream = connect(server.port);
    round_trip(&mut stream, &put).unwrap();
    let (_, body) = round_trip(&mut stream, &get_all_request("test", "k")).unwrap();
    assert_eq!(decode_reply(&body).1.len(), 1);
}

#[test]
fn every_example_config_starts() {
    let examples = workspace_root().join("examples");
    let mut started = 0;
    for entry in std::fs::read_dir(&examples).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|extension| extension.to_str()) != Some("toml") {
            continue;
        }
        // Cluster examples are started by the cluster tests with their own flags.
        if path
            .file_stem()
            .and_then(|stem| stem.to_str())
            .is_some_and(|stem| stem.starts_with("cluster"))
        {
            continue;
        }
        let data_dir = tempdir();
        let mut args = vec![
            "--config".to_owned(),
            path.to_str().unwrap().to_owned(),
            "--data-dir".to_owned(),
            data_dir.to_str().unwrap().to_owned(),
        ];
        if std::fs::read_to_string(&path).unwrap().contains("tls-port") {
            // Its certificates are read from tls/ under the data directory.
            common::tls::write_certs(&data_dir.join("tls"));
            args.extend(["--tls-port".to_owned(), free_port().to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let server = start(&args);
        let mut stream = connect(server.port);
        if std::fs::read_to_string(&path)
            .unwrap()
            .contains("[security]")
        {
            // Access control on: it serves, and asks for a login first
            // (`tests/compat/test_security.py` logs in and reads).
            let answer = raw_info(&mut stream, "namespaces");
            assert!(
                answer.contains("ERROR:80:"),
                "{} answers {answer:?} without a login",
                path.display()
            );
            started += 1;
            drop(server);
            continue;
        }
        let answers = info(&mut stream, &["namespaces"]);
        assert!(
            !answers[0].1.is_empty(),
            "{} serves no namespace",
            path.display()
        );
        started += 1;
        drop(server);
        let _ = std::fs::remove_dir_all(&data_dir);
    }
    assert!(
        started >= 1,
        "no example config found in {}",
        examples.display()
    );
}

/// Two service threads that hand connections to each other whenever one
/// is busier: connections move all the time.
const SPILL_ALWAYS: &str =
    "service-threads = 2\nservice-thread-spill-pct = 1\nservice-thread-contended-pct = 100";

/// Starts citrined with these `[service]` lines, namespace `test` and
/// `--service-io service_io`.
fn start_with(service: &str, service_io: &str) -> Server {
    let directory = tempdir();
    let config = directory.join("citrine.toml");
    std::fs::write(
        &config,
        format!("[service]\n{service}\n\n[[namespace]]\nname = \"test\"\n"),
    )
    .unwrap();
    let server = start(&[
        "--config",
        config.to_str().unwrap(),
        "--service-io",
        service_io,
    ]);
    // Read at start only.
    let _ = std::fs::remove_dir_all(&directory);
    server
}

fn tempdir() -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "citrine-test-{}-{}",
        std::process::id(),
        common::free_port()
    ));
    std::fs::create_dir_all(&path).unwrap();
    path
}

#[test]
fn bad_config_stops_the_start_with_a_clear_message() {
    let directory = tempdir();
    let cases = [
        ("[service]\nprot = 3000\n", "prot"),
        ("[service]\nport = \"many\"\n", "port"),
        ("[[namespace]]\nname = \"x\"\n[namespace.storage-engine]\ntype = \"memory\"\nstop-writes-used-pct = 250\n", "stop-writes-used-pct = 250"),
    ];
    for (index, (text, expected)) in cases.iter().enumerate() {
        let path = directory.join(format!("bad{index}.toml"));
        std::fs::write(&path, text).unwrap();
        let output = Command::new(binary())
            .args(["--config", path.to_str().unwrap()])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(
            output.status.code(),
            Some(2),
            "case {index} should fail to start"
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "case {index}: {stderr}");
        assert!(
            stderr.contains(path.to_str().unwrap()),
            "case {index} must name the file: {stderr}"
        );
    }
    let output = Command::new(binary())
        .args(["--port", "0"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--port"));
    let _ = std::fs::remove_dir_all(&directory);
}

/// A service port another process holds stops the start with a message
/// naming it and a failing exit status: the node never half-starts.
#[test]
fn a_taken_service_port_stops_the_start_with_a_clear_message() {
    let port = free_port();
    let holder = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let (fabric, heartbeat) = (free_port().to_string(), free_port().to_string());
    for service_io in ["epoll", io_uring_or_auto()] {
        let output = Command::new(binary())
            .args(["--address", "127.0.0.1", "--port", &port.to_string()])
            .args(["--fabric-port", &fabric, "--heartbeat-port", &heartbeat])
            .args(["--service-io", service_io])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            !output.status.success(),
            "{service_io}: {:?}",
            output.status
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(&format!("cannot listen on 127.0.0.1:{port}")),
            "{service_io}: {stderr}"
        );
    }
    drop(holder);
}

/// Malformed input closes or answers only the offending connection; every
/// other connection keeps being served.
#[test]
fn bad_input_never_stops_the_node() {
    bad_input_never_stops_the_node_with(io_uring_or_auto());
}

#[test]
fn bad_input_never_stops_the_node_on_epoll() {
    bad_input_never_stops_the_node_with("epoll");
}

fn bad_input_never_stops_the_node_with(service_io: &str) {
    let server = start(&["--service-io", service_io]);
    let mut healthy = connect(server.port);
    assert_eq!(info(&mut healthy, &["status"])[0].1, "ok");

    let closes_connection: Vec<Vec<u8>> = vec![
        vec![9, 3, 0, 0, 0, 0, 0, 4, 1, 2, 3, 4], // bad version
        vec![2, 42, 0, 0, 0, 0, 0, 0],            // unknown type
        vec![2, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], // size over 128 MiB
        vec![22, 3, 1, 0, 0, 0, 1, 0, 0],         // TLS ClientHello on the plain port
        vec![2, 4, 0, 0, 0, 0, 0, 12, 0, 0, 0, 0, 0, 0, 0, 40, 1, 2, 3, 4], // bad compressed data
    ];
    for frame in &closes_connection {
        let mut bad = connect(server.port);
        bad.write_all(frame).unwrap();
        let mut buffer = [0u8; 64];
        let read = bad.read(&mut buffer).unwrap_or(0);
        assert_eq!(read, 0, "connection should be closed for {frame:?}");
    }

    // A sound frame with a garbage AS_MSG body: result 4, connection kept.
    let mut garbage = connect(server.port);
    let mut frame = ProtoHeader::encode(MessageType::Message, 30).to_vec();
    frame.extend_from_slice(&[
        22, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 1, 2, 3, 4, 5, 6,
        7, 8,
    ]);
    let (_, body) = round_trip(&mut garbage, &frame).unwrap();
    assert_eq!(
        decode_reply(&body).0.result_code,
        ResultCode::Parameter.code()
    );
    assert_eq!(
        info(&mut garbage, &["status"])[0].1,
        "ok",
        "connection still usable"
    );

    // Unknown op and unknown particle: proper result codes.
    let unknown_op = write_request("test", "k", &[(77, 1, "a", vec![0; 8])]);
    let (_, body) = round_trip(&mut garbage, &unknown_op).unwrap();
    assert_eq!(
        decode_reply(&body).0.result_code,
        ResultCode::Parameter.code()
    );
    let unknown_namespace = get_all_request("nosuch", "k");
    let (_, body) = round_trip(&mut garbage, &unknown_namespace).unwrap();
    assert_eq!(
        decode_reply(&body).0.result_code,
        ResultCode::Namespace.code()
    );

    // A peer that announces a large body and hangs up mid-frame.
    let mut liar = connect(server.port);
    liar.write_all(&ProtoHeader::encode(
        MessageType::Message,
        100 * 1024 * 1024,
    ))
    .unwrap();
    liar.write_all(&[0u8; 1000]).unwrap();
    drop(liar);

    assert_eq!(
        info(&mut healthy, &["status"])[0].1,
        "ok",
        "the node kept serving"
    );
    let mut fresh = connect(server.port);
    assert_eq!(info(&mut fresh, &["status"])[0].1, "ok");
}

/// Many connections increment one counter; the total is exact.
#[test]
fn concurrent_increments_from_many_connections() {
    concurrent_increments_with(io_uring_or_auto());
}

#[test]
fn concurrent_increments_from_many_connections_on_epoll() {
    concurrent_increments_with("epoll");
}

fn concurrent_increments_with(service_io: &str) {
    let server = start(&["--service-io", service_io]);
    let connections = 16;
    let increments = 500;
    let threads: Vec<_> = (0..connections)
        .map(|_| {
            let port = server.port;
            std::thread::spawn(move || {
                let mut stream = connect(port);
                let frame = write_request(
                    "test",
                    "counter",
                    &[(op_type::INCR, 1, "n", 1i64.to_be_bytes().to_vec())],
                );
                for _ in 0..increments {
                    let (_, body) = round_trip(&mut stream, &frame).unwrap();
                    assert_eq!(decode_reply(&body).0.result_code, 0);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let mut stream = connect(server.port);
    let get = get_all_request("test", "counter");
    let (_, body) = round_trip(&mut stream, &get).unwrap();
    let (header, bins) = decode_reply(&body);
    assert_eq!(
        header.generation,
        (connections * increments) as u32 & 0xFFFF
    );
    assert_eq!(
        bins[0].2,
        ((connections * increments) as i64).to_be_bytes().to_vec()
    );
}

/// More connections than a service thread's io_uring has queue entries
/// (1024; 1200 where the descriptor limit allows), each with a request in
/// flight at once: every one is answered with its own record. In a debug build the ring's registered file table
/// has 512 slots, so this also runs registered and plain sockets side by
/// side.
#[test]
fn many_connections_with_requests_in_flight_at_once() {
    many_connections_with(io_uring_or_auto());
}

#[test]
fn many_connections_with_requests_in_flight_at_once_on_epoll() {
    many_connections_with("epoll");
}

fn many_connections_with(service_io: &str) {
    // Stay inside this process's descriptor limit (and the server's).
    let limit = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|limits| {
            limits
                .lines()
                .find(|line| line.starts_with("Max open files"))
                .and_then(|line| line.split_whitespace().nth(3)?.parse::<usize>().ok())
        })
        .unwrap_or(1024);
    let count = 1200.min(limit.saturating_sub(100));
    let server = start_with("service-threads = 1", service_io);
    let mut streams: Vec<TcpStream> = (0..count).map(|_| connect(server.port)).collect();
    for (index, stream) in streams.iter_mut().enumerate() {
        let put = write_request(
            "test",
            &format!("many-{index}"),
            &[(
                op_type::WRITE,
                1,
                "v",
                (index as i64).to_be_bytes().to_vec(),
            )],
        );
        stream.write_all(&put).unwrap();
    }
    for stream in streams.iter_mut() {
        let (_, body) = read_frame(stream).unwrap();
        assert_eq!(decode_reply(&body).0.result_code, 0);
    }
    for (index, stream) in streams.iter_mut().enumerate() {
        stream
            .write_all(&get_all_request("test", &format!("many-{index}")))
            .unwrap();
    }
    for (index, stream) in streams.iter_mut().enumerate() {
        let (_, body) = read_frame(stream).unwrap();
        assert_eq!(
            decode_reply(&body).1[0].2,
            (index as i64).to_be_bytes().to_vec(),
            "connection {index}"
        );
    }
}

/// Several requests written back to back on one socket are answered in order.
#[test]
fn pipelined_requests_are_answered_in_order() {
    pipelined_requests_with(io_uring_or_auto());
}

#[test]
fn pipelined_requests_are_answered_in_order_on_epoll() {
    pipelined_requests_with("epoll");
}

fn pipelined_requests_with(service_io: &str) {
    let server = start(&["--service-io", service_io]);
    let mut stream = connect(server.port);
    let mut batch = Vec::new();
    for index in 0..50i64 {
        batch.extend(write_request(
            "test",
            &format!("p{index}"),
            &[(op_type::WRITE, 1, "v", index.to_be_bytes().to_vec())],
        ));
        batch.extend(get_all_request("test", &format!("p{index}")));
    }
    stream.write_all(&batch).unwrap();
    for index in 0..50i64 {
        let (_, put_body) = read_frame(&mut stream).unwrap();
        assert_eq!(decode_reply(&put_body).0.result_code, 0);
        let (_, get_body) = read_frame(&mut stream).unwrap();
        assert_eq!(decode_reply(&get_body).1[0].2, index.to_be_bytes().to_vec());
    }
}

/// A client that writes far more requests than the server reads ahead
/// (hundreds of kilobytes, while it reads no reply for a while) is held
/// back by TCP and still gets every reply, in order.
#[test]
fn a_client_far_ahead_of_its_replies_gets_them_all_in_order() {
    far_ahead_with(io_uring_or_auto());
}

#[test]
fn a_client_far_ahead_of_its_replies_gets_them_all_in_order_on_epoll() {
    far_ahead_with("epoll");
}

fn far_ahead_with(service_io: &str) {
    let server = start(&["--service-io", service_io]);
    // Three connections, so that in debug builds (whose io_uring backend
    // uses multishot receives on even slots only) both kinds are covered.
    let clients: Vec<_> = (0..3)
        .map(|client| {
            let port = server.port;
            std::thread::spawn(move || far_ahead_client(port, client))
        })
        .collect();
    for client in clients {
        client.join().unwrap();
    }
}

fn far_ahead_client(port: u16, client: usize) {
    let mut stream = connect(port);
    let count = 4000i64;
    let key = |index: i64| format!("ahead-{client}-{}", index % 100);
    let mut requests = Vec::new();
    for index in 0..count {
        requests.extend(write_request(
            "test",
            &key(index),
            &[(op_type::WRITE, 1, "v", index.to_be_bytes().to_vec())],
        ));
        requests.extend(get_all_request("test", &key(index)));
    }
    assert!(requests.len() > 400_000, "{} bytes", requests.len());
    let mut writer = stream.try_clone().unwrap();
    let sender = std::thread::spawn(move || writer.write_all(&requests));
    std::thread::sleep(Duration::from_millis(500));
    for index in 0..count {
        let (_, put_body) = read_frame(&mut stream).unwrap();
        assert_eq!(decode_reply(&put_body).0.result_code, 0, "write {index}");
        let (_, get_body) = read_frame(&mut stream).unwrap();
        assert_eq!(
            decode_reply(&get_body).1[0].2,
            index.to_be_bytes().to_vec(),
            "client {client}, read {index}"
        );
    }
    sender.join().unwrap().unwrap();
}

/// While clients take none of their replies, the server stops receiving
/// from each once it holds more than the frame at hand plus the read-ahead
/// (io_uring's multishot receive is cancelled, which
/// `client_read_ahead_pauses` counts), so TCP holds the clients back; when
/// they read, every reply arrives, in order.
#[test]
fn receives_pause_at_the_read_ahead_while_replies_back_up() {
    let service_io = io_uring_or_auto();
    let server = start(&["--service-io", service_io]);
    let mut stream = connect(server.port);
    let blob = vec![7u8; 20_000];
    let put = write_request("test", "big", &[(op_type::WRITE, 4, "b", blob.clone())]);
    let (_, reply) = round_trip(&mut stream, &put).unwrap();
    assert_eq!(decode_reply(&reply).0.result_code, 0);
    // Each reply is 20 KB: the sockets' buffers hold a few hundred of
    // them, so most of the 3 000 requests (180 KB, far past the 64 KB
    // read-ahead) wait at the server until the client reads. In debug
    // builds only even connection slots use multishot receives: four
    // connections cover both.
    let count = 3_000;
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let mut stream = connect(server.port);
            let requests = get_all_request("test", "big").repeat(count);
            assert!(requests.len() > 150_000, "{} bytes", requests.len());
            let mut writer = stream.try_clone().unwrap();
            let blob = blob.clone();
            std::thread::spawn(move || {
                let sender = std::thread::spawn(move || writer.write_all(&requests));
                std::thread::sleep(Duration::from_millis(500));
                for index in 0..count {
                    let (_, body) = read_frame(&mut stream).unwrap();
                    let (header, bins) = decode_reply(&body);
                    assert_eq!(header.result_code, 0, "read {index}");
                    assert_eq!(bins[0].2, blob, "read {index}");
                }
                sender.join().unwrap().unwrap();
            })
        })
        .collect();
    for client in clients {
        client.join().unwrap();
    }
    // Service threads report at the end of their 100-ms balance window.
    std::thread::sleep(Duration::from_millis(400));
    let pauses = statistic(&mut stream, "client_read_ahead_pauses");
    eprintln!("{pauses} read-ahead pauses over {service_io}");
    // Where io_uring may be missing (`auto` fell back to epoll, which reads
    // only when a frame needs bytes) there is nothing to pause.
    if service_io == "io_uring" {
        assert!(pauses > 0, "no receive paused at the read-ahead");
    }
}

/// Connections handed between service threads mid-load lose, repeat and
/// reorder nothing. With `service-thread-spill-pct = 1` any busy thread
/// gives connections to a less busy one, so the connections of this test
/// move while they pipeline increments and reads, and while they send and
/// fetch values larger than the read buffer (partial reads and writes).
#[test]
fn connections_move_between_service_threads_without_losing_a_request() {
    connections_move_with(io_uring_or_auto());
}

#[test]
fn connections_move_between_service_threads_without_losing_a_request_on_epoll() {
    connections_move_with("epoll");
}

fn connections_move_with(service_io: &str) {
    let server = start_with(SPILL_ALWAYS, service_io);
    let connections = 8;
    let deadline = Instant::now() + Duration::from_secs(3);
    let threads: Vec<_> = (0..connections)
        .map(|client| {
            let port = server.port;
            std::thread::spawn(move || {
                let mut stream = connect(port);
                // The connection's session (here its user agent; a login
                // alike) must move with it between service threads.
                let agent = "user-agent-set:value=MSxjLTcuMS4wLG1vdmluZw==";
                assert_eq!(info(&mut stream, &[agent])[0].1, "ok");
                let key = format!("moving-{client}");
                let increment = write_request(
                    "test",
                    &key,
                    &[(op_type::INCR, 1, "n", 1i64.to_be_bytes().to_vec())],
                );
                let read = record_request(
                    "test",
                    &key,
                    MsgHeader {
                        info1: info1::READ,
                        ..MsgHeader::default()
                    },
                    &[(op_type::READ, 0, "n", Vec::new())],
                );
                let mut pipelined = increment.clone();
                pipelined.extend_from_slice(&read);
                let mut count = 0i64;
                while Instant::now() < deadline {
                    stream.write_all(&pipelined).unwrap();
                    count += 1;
                    let (_, body) = read_frame(&mut stream).unwrap();
                    assert_eq!(decode_reply(&body).0.result_code, 0);
                    let (_, body) = read_frame(&mut stream).unwrap();
                    let (header, bins) = decode_reply(&body);
                    assert_eq!(header.result_code, 0);
                    assert_eq!(bins[0].2, count.to_be_bytes().to_vec(), "client {client}");
                    if count % 25 == 0 {
                        let blob: Vec<u8> = (0..200_000u32)
                            .map(|i| (i as u8) ^ (count as u8) ^ (client as u8))
                            .collect();
                        let blob_key = format!("moving-blob-{client}");
                        let put = write_request(
                            "test",
                            &blob_key,
                            &[(op_type::WRITE, 4, "b", blob.clone())],
                        );
                        let (_, body) = round_trip(&mut stream, &put).unwrap();
                        assert_eq!(decode_reply(&body).0.result_code, 0);
                        let get = get_all_request("test", &blob_key);
                        let (_, body) = round_trip(&mut stream, &get).unwrap();
                        assert!(
                            decode_reply(&body).1[0].2 == blob,
                            "client {client}: blob differs"
                        );
                    }
                }
                assert_eq!(
                    info(&mut stream, &[agent])[0].1,
                    "ERROR:4:already set",
                    "client {client}: its session was lost in a move"
                );
                count
            })
        })
        .collect();
    let mut total = 0;
    for thread in threads {
        total += thread.join().unwrap();
    }
    let mut stream = connect(server.port);
    let moved = statistic(&mut stream, "client_connections_moved");
    eprintln!("{total} increment+read pairs, {moved} connection moves");
    assert!(moved > 0, "no connection moved between service threads");
    assert_eq!(info(&mut stream, &["status"])[0].1, "ok");
}

/// Seeded clients that misbehave in every way a network allows: frames
/// split at random points with pauses between the pieces, bursts of
/// pipelined requests, hang-ups in the middle of a frame, values larger
/// than the read buffer, all while connections move between the two
/// service threads (`service-thread-spill-pct = 1`). Every reply that
/// comes back must be the right one, and when the clients are gone the
/// node holds no connection of theirs.
#[test]
fn chaotic_clients_get_exact_replies_and_leave_no_connection_behind() {
    chaotic_clients_with(io_uring_or_auto());
}

#[test]
fn chaotic_clients_get_exact_replies_and_leave_no_connection_behind_on_epoll() {
    chaotic_clients_with("epoll");
}

/// xorshift64*: a small deterministic generator for the client schedules.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

fn chaotic_clients_with(service_io: &str) {
    let mut server = start_with(SPILL_ALWAYS, service_io);
    let read = get_all_request("test", "chaos-0");
    let deadline = Instant::now() + Duration::from_secs(3);
    let clients: Vec<_> = (0..10u64)
        .map(|client| {
            let port = server.port;
            std::thread::spawn(move || {
                let mut rng =
                    Rng(0x9E37_79B9_7F4A_7C15 ^ (client + 1).wrapping_mul(0xD6E8_FEB8_6659_FD93));
                let key = format!("chaos-{client}");
                let increment = write_request(
                    "test",
                    &key,
                    &[(op_type::INCR, 1, "n", 1i64.to_be_bytes().to_vec())],
                );
                let read = get_all_request("test", &key);
                let mut stream = connect(port);
                let mut count = 0i64;
                let mut actions = 0u32;
                while Instant::now() < deadline {
                    actions += 1;
                    match rng.below(10) {
                        // One increment, written in random pieces.
                        0..=3 => {
                            let mut at = 0;
                            while at < increment.len() {
                                let piece =
                                    1 + rng.below(increment.len() as u64 - at as u64) as usize;
                                stream.write_all(&increment[at..at + piece]).unwrap();
                                at += piece;
                                if rng.below(3) == 0 {
                                    std::thread::sleep(Duration::from_micros(rng.below(2000)));
                                }
                            }
                            let (_, body) = read_frame(&mut stream).unwrap();
                            assert_eq!(decode_reply(&body).0.result_code, 0, "client {client}");
                            count += 1;
                        }
                        // A burst: increments and a read, pipelined.
                        4..=6 => {
                            let burst = 1 + rng.below(20) as i64;
                            let mut frames = Vec::new();
                            for _ in 0..burst {
                                frames.extend_from_slice(&increment);
                            }
                            frames.extend_from_slice(&read);
                            stream.write_all(&frames).unwrap();
                            for _ in 0..burst {
                                let (_, body) = read_frame(&mut stream).unwrap();
                                assert_eq!(decode_reply(&body).0.result_code, 0, "client {client}");
                            }
                            count += burst;
                            let (_, body) = read_frame(&mut stream).unwrap();
                            let (header, bins) = decode_reply(&body);
                            assert_eq!(header.result_code, 0, "client {client}");
                            assert_eq!(bins[0].2, count.to_be_bytes().to_vec(), "client {client}");
                        }
                        // Hang up inside a frame (maybe after a whole
                        // request, whose reply is never read), reconnect.
                        7 => {
                            let mut partial = if rng.below(2) == 0 {
                                increment.clone()
                            } else {
                                Vec::new()
                            };
                            let cut = 1 + rng.below(increment.len() as u64 - 1) as usize;
                            partial.extend_from_slice(&increment[..cut]);
                            stream.write_all(&partial).unwrap();
                            if partial.len() > cut {
                                // The whole one counts once it is answered.
                                let (_, body) = read_frame(&mut stream).unwrap();
                                assert_eq!(decode_reply(&body).0.result_code, 0, "client {client}");
                                count += 1;
                            }
                            drop(stream);
                            stream = connect(port);
                        }
                        // A value larger than the read buffer, and back.
                        _ => {
                            let size = 20_000 + rng.below(280_000) as usize;
                            let fill = rng.next() as u8;
                            let blob: Vec<u8> =
                                (0..size).map(|i| (i as u8).wrapping_add(fill)).collect();
                            let blob_key = format!("chaos-blob-{client}");
                            let put = write_request(
                                "test",
                                &blob_key,
                                &[(op_type::WRITE, 4, "b", blob.clone())],
                            );
                            let (_, body) = round_trip(&mut stream, &put).unwrap();
                            assert_eq!(decode_reply(&body).0.result_code, 0, "client {client}");
                            let (_, body) =
                                round_trip(&mut stream, &get_all_request("test", &blob_key))
                                    .unwrap();
                            assert!(
                                decode_reply(&body).1[0].2 == blob,
                                "client {client}: blob differs"
                            );
                        }
                    }
                }
                // The counter saw every answered increment, and nothing else.
                let (_, body) = round_trip(&mut stream, &read).unwrap();
                assert_eq!(
                    decode_reply(&body).1[0].2,
                    count.to_be_bytes().to_vec(),
                    "client {client}"
                );
                actions
            })
        })
        .collect();
    let actions: u32 = clients
        .into_iter()
        .map(|client| client.join().unwrap())
        .sum();
    assert!(actions > 100, "only {actions} client actions ran");

    // Only the connection asking is left (closes are noticed promptly).
    let mut stream = connect(server.port);
    let counter = |stream: &mut TcpStream, name: &str| -> u64 {
        info(stream, &["statistics"])[0]
            .1
            .split(';')
            .find_map(|pair| pair.strip_prefix(&format!("{name}=")).map(str::to_owned))
            .unwrap()
            .parse()
            .unwrap()
    };
    let wait_until = Instant::now() + Duration::from_secs(5);
    while counter(&mut stream, "client_connections") != 1 {
        assert!(
            Instant::now() < wait_until,
            "{} client connections still open after the clients left",
            counter(&mut stream, "client_connections")
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // And the sockets are really closed, not just counted so: none of the
    // node's is left in CLOSE-WAIT (the peer gone, the node not closing).
    let wait_until = Instant::now() + Duration::from_secs(5);
    while close_wait_sockets(server.port) > 0 {
        assert!(
            Instant::now() < wait_until,
            "{} of the node's sockets stay in CLOSE-WAIT",
            close_wait_sockets(server.port)
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // A clean stop with I/O in flight: an idle connection (a receive
    // waiting), one inside a frame, one whose big replies it does not read.
    let mut inside = connect(server.port);
    inside.write_all(&read[..read.len() / 2]).unwrap();
    let mut unread = connect(server.port);
    let blob = vec![5u8; 900_000];
    let (_, body) = round_trip(
        &mut unread,
        &write_request("test", "chaos-big", &[(op_type::WRITE, 4, "b", blob)]),
    )
    .unwrap();
    assert_eq!(decode_reply(&body).0.result_code, 0);
    // Replies far beyond the socket buffers: the server's send waits.
    for _ in 0..8 {
        unread
            .write_all(&get_all_request("test", "chaos-big"))
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    let status = server.terminate(Duration::from_secs(10));
    assert!(status.success(), "unclean exit: {status}");
}

/// The node's sockets on `port` in CLOSE-WAIT (from /proc/net/tcp).
fn close_wait_sockets(port: u16) -> usize {
    const CLOSE_WAIT: &str = "08";
    let local = format!(":{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap()
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.len() > 3 && fields[1].ends_with(&local) && fields[3] == CLOSE_WAIT
        })
        .count()
}

#[test]
fn a_write_held_in_a_stopped_node_past_its_timeout_is_refused() {
    held_write_with(io_uring_or_auto());
}

#[test]
fn a_write_held_in_a_stopped_node_past_its_timeout_is_refused_on_epoll() {
    held_write_with("epoll");
}

/// A write that reaches a node while its process is stopped waits in the
/// socket. Its client gives up after its timeout (and may write the record
/// again elsewhere); when the node carries on, the service thread sees it
/// was stalled and refuses the write with 9 instead of running it late. A
/// write with no client timeout, held as long, still runs; and so does one
/// sent once the node runs again.
fn held_write_with(service_io: &str) {
    let server = start(&["--service-io", service_io]);
    let mut stream = connect(server.port);
    let write = |key: &str, value: i64, transaction_ttl: u32| {
        record_request(
            "test",
            key,
            MsgHeader {
                info2: citrine_wire::msg::info2::WRITE,
                transaction_ttl,
                ..MsgHeader::default()
            },
            &[(op_type::WRITE, 1, "v", value.to_be_bytes().to_vec())],
        )
    };
    // Warm: the thread has served a request and waits for the next.
    let (_, body) = round_trip(&mut stream, &write("held", 1, 1000)).unwrap();
    assert_eq!(decode_reply(&body).0.result_code, 0);
    let mut untimed = connect(server.port);
    let pid = server.child.id();
    freeze_process(pid, true);
    stream.write_all(&write("held", 2, 300)).unwrap();
    untimed.write_all(&write("untimed", 3, 0)).unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    freeze_process(pid, false);
    let (_, body) = read_frame(&mut stream).unwrap();
    assert_eq!(
        decode_reply(&body).0.result_code,
        ResultCode::Timeout.code(),
        "the held write runs after its client's timeout"
    );
    let (_, body) = read_frame(&mut untimed).unwrap();
    assert_eq!(decode_reply(&body).0.result_code, 0);
    let (_, body) = round_trip(&mut stream, &get_all_request("test", "held")).unwrap();
    let (header, bins) = decode_reply(&body);
    assert_eq!(header.result_code, 0);
    assert_eq!(
        bins[0].2,
        1i64.to_be_bytes().to_vec(),
        "the refused write left no trace"
    );
    let (_, body) = round_trip(&mut stream, &write("held", 4, 300)).unwrap();
    assert_eq!(decode_reply(&body).0.result_code, 0, "on time again");
    assert!(statistic(&mut stream, "expired_refusals") >= 1);
    assert!(statistic(&mut stream, "service_stalls") >= 1);
}

/// One info request's whole answer text (no `name\tvalue` parsing).
fn raw_info(stream: &mut std::net::TcpStream, command: &str) -> String {
    use std::io::{Read, Write};
    let body = format!("{command}\n");
    let header = (2u64 << 56) | (1u64 << 48) | body.len() as u64;
    stream.write_all(&header.to_be_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
    let mut head = [0u8; 8];
    stream.read_exact(&mut head).unwrap();
    let size = (u64::from_be_bytes(head) & 0xffff_ffff_ffff) as usize;
    let mut answer = vec![0u8; size];
    stream.read_exact(&mut answer).unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// `user-agent-set` is kept per connection and `user-agents` counts the
/// open connections of each value (what the Prometheus exporter asks; it
/// failed on Citrine's old `ERROR:4:unrecognized command`); a closed
/// connection's agent leaves the count.
#[test]
fn user_agents_count_the_open_connections() {
    let server = start(&[]);
    let agent = "MSxjLTcuMS4wLG15YXBw"; // "1,c-7.1.0,myapp"
    let set = format!("user-agent-set:value={agent}");
    let mut a = connect(server.port);
    let mut b = connect(server.port);
    let mut tool = connect(server.port);
    assert_eq!(info(&mut a, &[&set])[0].1, "ok");
    assert_eq!(info(&mut a, &[&set])[0].1, "ERROR:4:already set");
    assert_eq!(info(&mut b, &[&set])[0].1, "ok");
    let listed = |tool: &mut TcpStream| info(tool, &["user-agents"])[0].1.clone();
    assert_eq!(listed(&mut tool), format!("user-agent={agent}:count=2;"));
    drop(b);
    let deadline = Instant::now() + Duration::from_secs(5);
    while listed(&mut tool) != format!("user-agent={agent}:count=1;") {
        assert!(Instant::now() < deadline, "{}", listed(&mut tool));
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(a);
    while !listed(&mut tool).is_empty() {
        assert!(Instant::now() < deadline, "{}", listed(&mut tool));
        std::thread::sleep(Duration::from_millis(20));
    }
}
