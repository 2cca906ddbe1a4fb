//! Batch-index and partition-scan streams over a real `citrined` process and
//! real sockets, encoded and decoded with the wire codec.

#![allow(clippy::unwrap_used)]

mod common;

use citrine_wire::digest::{of_key, UserKey};
use citrine_wire::msg::{field_type, info1, info2, info3, op_type, MessageWriter, MsgHeader};
use common::stream::read_stream;
use common::*;
use std::collections::BTreeSet;
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn put(stream: &mut TcpStream, key: &str, value: Vec<u8>) {
    let frame = record_request(
        "test",
        key,
        MsgHeader {
            info2: info2::WRITE,
            ..MsgHeader::default()
        },
        &[(op_type::WRITE, 4, "b", value)],
    );
    let (_, body) = round_trip(stream, &frame).unwrap();
    assert_eq!(decode_reply(&body).0.result_code, 0);
}

/// A legacy read row (type 0x00) or a REPEAT of the previous row.
fn read_row(out: &mut Vec<u8>, index: u32, key: &str, info1_bits: Option<u8>) {
    out.extend_from_slice(&index.to_be_bytes());
    out.extend_from_slice(&of_key("demo", &UserKey::String(key.into())).0);
    match info1_bits {
        None => out.push(0x01),
        Some(bits) => {
            out.push(0x00);
            out.push(bits);
            out.extend_from_slice(&2u16.to_be_bytes());
            out.extend_from_slice(&0u16.to_be_bytes());
            for (kind, data) in [
                (field_type::NAMESPACE, &b"test"[..]),
                (field_type::SET, b"demo"),
            ] {
                out.extend_from_slice(&(data.len() as u32 + 1).to_be_bytes());
                out.push(kind);
                out.extend_from_slice(data);
            }
        }
    }
}

fn batch_frame(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let header = MsgHeader {
        info1: info1::BATCH | info1::READ,
        ..MsgHeader::default()
    };
    let mut writer = MessageWriter::begin(&mut out, &header);
    writer.field(field_type::BATCH_INDEX, payload);
    writer.finish();
    out
}

fn scan_frame(pids: Option<&[u16]>, max_records: Option<u64>) -> Vec<u8> {
    scan_frame_with(pids, max_records, None)
}

fn scan_frame_with(
    pids: Option<&[u16]>,
    max_records: Option<u64>,
    records_per_second: Option<u32>,
) -> Vec<u8> {
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
        .field(field_type::TASK_ID, &7u64.to_be_bytes());
    if let Some(pids) = pids {
        let bytes: Vec<u8> = pids.iter().flat_map(|pid| pid.to_le_bytes()).collect();
        writer.field(field_type::PID_ARRAY, &bytes);
    }
    if let Some(limit) = max_records {
        writer.field(field_type::MAX_RECORDS, &limit.to_be_bytes());
    }
    if let Some(rate) = records_per_second {
        writer.field(field_type::RECORDS_PER_SECOND, &rate.to_be_bytes());
    }
    writer.finish();
    out
}

fn one_thread_server() -> Server {
    one_thread_server_with(io_uring_or_auto())
}

fn one_thread_server_with(service_io: &str) -> Server {
    // One file per call: the tests run in parallel and each removes its own.
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!(
        "citrine-scan-batch-{}-{call}.toml",
        std::process::id()
    ));
    std::fs::write(
        &path,
        format!("[service]\nservice-threads = 1\nservice-io = \"{service_io}\"\n\n[[namespace]]\nname = \"test\"\n"),
    )
    .unwrap();
    let server = start(&["--config", path.to_str().unwrap()]);
    let _ = std::fs::remove_file(&path);
    server
}

#[test]
fn batch_and_scan_streams_over_a_socket() {
    let server = one_thread_server();
    let mut stream = connect(server.port);
    let records = 3000;
    for key in 0..records {
        put(&mut stream, &format!("k{key}"), vec![key as u8; 1000]);
    }

    // Batch: legacy full row, repeats (one missing), an exists row.
    let mut payload = 4u32.to_be_bytes().to_vec();
    payload.push(0x08);
    read_row(&mut payload, 10, "k1", Some(info1::READ | info1::GET_ALL));
    read_row(&mut payload, 11, "k2", None);
    read_row(&mut payload, 12, "missing", None);
    read_row(
        &mut payload,
        13,
        "k3",
        Some(info1::READ | info1::GET_NO_BINS),
    );
    stream.write_all(&batch_frame(&payload)).unwrap();
    let (messages, _) = read_stream(&mut stream);
    assert_eq!(messages.len(), 5);
    let rows: Vec<(u32, u8, usize)> = messages[..4]
        .iter()
        .map(|m| (m.header.transaction_ttl, m.header.result_code, m.bins.len()))
        .collect();
    assert_eq!(rows, vec![(10, 0, 1), (11, 0, 1), (12, 2, 0), (13, 0, 0)]);
    assert_eq!(messages[1].bins[0].1, vec![2u8; 1000]);
    assert_eq!(messages[4].header.result_code, 0);

    // Zero rows → a single LAST with 4; the connection stays usable.
    stream.write_all(&batch_frame(&[0, 0, 0, 0, 0])).unwrap();
    let (messages, _) = read_stream(&mut stream);
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].header.result_code, 4);

    // A full scan: ~3 MB, several frames, every record exactly once.
    stream.write_all(&scan_frame(None, None)).unwrap();
    let (messages, frames) = read_stream(&mut stream);
    assert!(frames >= 3, "{frames} frames");
    assert_eq!(messages.len(), records + 1);
    assert_eq!(messages[records].header.result_code, 0);
    let digests: BTreeSet<Vec<u8>> = messages[..records]
        .iter()
        .map(|m| m.field(field_type::DIGEST).unwrap().to_vec())
        .collect();
    assert_eq!(digests.len(), records);
    assert!(messages[..records]
        .iter()
        .all(|m| m.field(field_type::SET) == Some(&b"demo"[..]) && m.bins.len() == 1));

    // A PID subset and a record limit.
    let k1 = of_key("demo", &UserKey::String("k1".into()))
        .partition()
        .get();
    stream.write_all(&scan_frame(Some(&[k1]), None)).unwrap();
    let (messages, _) = read_stream(&mut stream);
    assert!(messages.len() >= 2);
    stream.write_all(&scan_frame(None, Some(10))).unwrap();
    let (messages, _) = read_stream(&mut stream);
    assert_eq!(messages.len(), 11);

    // The connection still serves single-record requests.
    let get = record_request(
        "test",
        "k5",
        MsgHeader {
            info1: info1::READ | info1::GET_ALL,
            ..MsgHeader::default()
        },
        &[],
    );
    let (_, body) = round_trip(&mut stream, &get).unwrap();
    assert_eq!(decode_reply(&body).0.result_code, 0);
}

#[test]
fn a_stalled_scan_does_not_block_its_service_thread() {
    let server = one_thread_server();
    let mut writer = connect(server.port);
    for key in 0..2000 {
        put(&mut writer, &format!("big{key}"), vec![1u8; 10_000]);
    }
    // ~20 MB scan whose client never reads: the server fills the socket
    // buffers and must park this stream, not the whole thread.
    let mut stalled = connect(server.port);
    stalled.write_all(&scan_frame(None, None)).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let mut other = connect(server.port);
    let get = record_request(
        "test",
        "big7",
        MsgHeader {
            info1: info1::READ | info1::GET_ALL,
            ..MsgHeader::default()
        },
        &[],
    );
    let started = Instant::now();
    let (_, body) = round_trip(&mut other, &get).unwrap();
    assert_eq!(decode_reply(&body).0.result_code, 0);
    assert!(started.elapsed() < Duration::from_secs(2));
    // The stalled client can still read its whole stream afterwards.
    let (messages, _) = read_stream(&mut stalled);
    assert_eq!(messages.len(), 2001);
}

/// RECS_PER_SEC over a socket: 60 records at 20 a second take about 3 s
/// (two records a step, each step due 100 ms after the one before), and
/// the one service thread serves another connection meanwhile.
#[test]
fn a_throttled_scan_keeps_its_rate_and_its_thread_serves_others() {
    throttled_scan_with(io_uring_or_auto());
}

#[test]
fn a_throttled_scan_keeps_its_rate_and_its_thread_serves_others_on_epoll() {
    throttled_scan_with("epoll");
}

fn throttled_scan_with(service_io: &str) {
    let server = one_thread_server_with(service_io);
    let mut writer = connect(server.port);
    for key in 0..60 {
        put(&mut writer, &format!("slow{key}"), vec![3u8; 100]);
    }
    let mut scanner = connect(server.port);
    let started = Instant::now();
    scanner
        .write_all(&scan_frame_with(None, None, Some(20)))
        .unwrap();
    let scan = std::thread::spawn(move || {
        let (messages, _) = read_stream(&mut scanner);
        (messages.len(), started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(300));
    let get = get_all_request("test", "slow7");
    for _ in 0..20 {
        let (_, body) = round_trip(&mut writer, &get).unwrap();
        assert_eq!(decode_reply(&body).0.result_code, 0);
    }
    let served_by = started.elapsed();
    let (messages, took) = scan.join().unwrap();
    assert_eq!(messages, 61, "every record and the LAST message");
    // The 59th and 60th records are due 2.9 s after the first step.
    assert!(
        took >= Duration::from_millis(2900),
        "the scan took {took:?}"
    );
    assert!(
        served_by < took,
        "the other connection waited for the scan: {served_by:?} against {took:?}"
    );
}
